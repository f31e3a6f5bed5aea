"""A process's liveness file: a lock held for a member's whole life.

``live.<pid>.<start time>`` in a deployment directory, created (O_EXCL,
0600), locked (F_OFD_SETLK) and written with the holder's pid namespace;
held once per directory per process (counted), dropped by a fork's child,
removed by the last release. `impl.liveness` reads these files to tell a
dead producer from a live one in another pid namespace; the package
docstring of `impl.liveness` has the whole story.
"""

from __future__ import annotations

import contextlib
import os
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from .errors import ConfigurationError
from .names import current_producer_identity, live_file_name, process_of
from .os_seam import FILE_MODE, OPEN_FLAGS_CREATE, OPEN_FLAGS_EXISTING, OsFacade

if TYPE_CHECKING:
    from .directory import Directory

# -- the liveness file: a lock held for a member's whole life ----------------------

_NAMESPACE_PREFIX: Final = b"pidns "
# A liveness file is created, then locked, then written: one found unlocked
# and still empty is being made for this long (then its maker died making it).
LIVENESS_FILE_GRACE_SECONDS: Final = 5.0
_MAX_LIVENESS_FILE: Final = 256

Namespace = tuple[int, int]  # (st_dev, st_ino) of /proc/self/ns/pid

_namespace_cache: tuple[int, Namespace] | None = None


def own_pid_namespace(os_facade: OsFacade) -> Namespace:
    """(st_dev, st_ino) of this process's pid namespace (recomputed after a fork).

    ConfigurationError when /proc is not this namespace's (a pid namespace
    made without mounting its own /proc): /proc/<pid> then names another
    process, and no start time read from it could be trusted.
    """
    global _namespace_cache
    pid = os.getpid()
    cached = _namespace_cache
    if cached is not None and cached[0] == pid:
        return cached[1]
    # The namespace file's own inode (the link followed): not a file of a
    # deployment, so not a fault site of the seam.
    info = os.stat("/proc/self/ns/pid")
    try:
        seen = int(os.readlink("/proc/self"))
    except (OSError, ValueError):
        seen = pid
    if seen != pid:
        raise ConfigurationError(
            f"/proc is not mounted for this pid namespace (/proc/self is {seen}, our pid is "
            f"{pid}); remedy: mount a /proc of the container's own pid namespace (unshare "
            f"--mount-proc, or the container runtime's default)"
        )
    namespace = (info.st_dev, info.st_ino)
    _namespace_cache = (pid, namespace)
    return namespace


def liveness_file_name(process: tuple[int, ...]) -> str:
    """``live.<pid>.<start time>``: the process's liveness file (no instance part)."""
    return live_file_name(process_of(process))


def is_liveness_file_name(name: str) -> bool:
    """Whether `name` is a process's liveness file (a connector's live file has an instance)."""
    parts = name.split(".")
    return len(parts) == 3 and parts[0] == "live" and parts[1].isdigit() and parts[2].isdigit()


def liveness_files_last(names: list[str]) -> list[str]:
    """`names` with the liveness files last: a dead owner's other files go before its verdict."""
    return sorted(names, key=is_liveness_file_name)


@dataclass
class _Held:
    fd: int
    name: str
    count: int
    directory: Directory


_held_lock = threading.Lock()
_held: dict[tuple[int, int], _Held] = {}  # by the directory's (st_dev, st_ino)
_held_pid = os.getpid()


def _forget_held_after_fork() -> None:
    # A child's copy of the descriptor would keep its parent's lock (the same
    # open file description) held after the parent died: close it. The
    # parent's own descriptor keeps the parent's lock.
    global _held_pid
    for held in _held.values():
        with contextlib.suppress(OSError):
            os.close(held.fd)
    _held.clear()
    _held_pid = os.getpid()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_held_after_fork)


def _directory_key(directory: Directory, os_facade: OsFacade) -> tuple[int, int]:
    identity = getattr(directory, "identity", None)
    if identity is not None:
        return identity  # type: ignore[no-any-return]
    info = os_facade.stat(directory.path)
    return (info.st_dev, info.st_ino)


def hold_liveness_file(directory: Directory, os_facade: OsFacade) -> None:
    """Hold this process's liveness file in `directory` (counted: `release_liveness_file`).

    Created (O_EXCL, 0600), locked (F_OFD_SETLK, exclusive), then written
    with our pid namespace. A file of that name whose lock another open
    file description holds belongs to another process with our (pid, start
    time): one in another pid namespace started in the same clock tick.
    That is refused (ConfigurationError) rather than shared.
    """
    namespace = own_pid_namespace(os_facade)
    name = liveness_file_name(current_producer_identity(os_facade))
    key = _directory_key(directory, os_facade)
    with _held_lock:
        held = _held.get(key)
        if held is not None:
            held.count += 1
            return
        try:
            fd = directory.open(name, OPEN_FLAGS_CREATE, FILE_MODE)
        except FileExistsError:  # ours, left by a release that failed
            fd = directory.open(name, OPEN_FLAGS_EXISTING, FILE_MODE)
        try:
            try:
                os_facade.ofd_lock(fd)
            except BlockingIOError:
                # Really held by another process (F_OFD_GETLK), or a refusal
                # that passed (then taking it again works)?
                if os_facade.ofd_lock_held(fd):
                    os_facade.close(fd)
                    fd = -1  # the file is the other process's: never unlinked here
                    raise ConfigurationError(
                        f"another process holds the liveness file {name!r} of our identity "
                        f"(pid, start time): a process in another pid namespace started in the "
                        f"same clock tick; remedy: restart one of them"
                    ) from None
                os_facade.ofd_lock(fd)
            os_facade.ftruncate(fd, 0)
            os_facade.write(fd, _NAMESPACE_PREFIX + b"%d:%d\n" % namespace)
        except BaseException:
            if fd >= 0:
                os_facade.close(fd)
                with contextlib.suppress(OSError):
                    directory.unlink(name)
            raise
        _held[key] = _Held(fd, name, 1, directory)


def release_liveness_file(directory: Directory, os_facade: OsFacade) -> None:
    """Drop one hold; the last removes the file, then closes it (releasing the lock)."""
    try:
        key = _directory_key(directory, os_facade)
    except OSError:
        return
    with _held_lock:
        held = _held.get(key)
        if held is None:
            return
        held.count -= 1
        if held.count > 0:
            return
        del _held[key]
        try:
            with contextlib.suppress(FileNotFoundError):
                directory.unlink(held.name)
        finally:
            with contextlib.suppress(OSError):
                os_facade.close(held.fd)


def holds_liveness_file(directory: Directory, os_facade: OsFacade) -> bool:
    """Whether this process holds its liveness file in `directory` (tests and stat)."""
    with _held_lock:
        return _directory_key(directory, os_facade) in _held


def _parse_namespace(content: bytes) -> Namespace | None:
    if not content.startswith(_NAMESPACE_PREFIX) or not content.endswith(b"\n"):
        return None
    dev, _, ino = content[len(_NAMESPACE_PREFIX) : -1].partition(b":")
    try:
        return (int(dev), int(ino))
    except ValueError:
        return None
