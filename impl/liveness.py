"""Liveness: whether a producer process, or a frame's lease holder, still runs.

Design rationale. A producer's identity is (pid, start time, instance);
liveness belongs to the process part (pid, start time), so every instance of
a killed process is dead at once. `Liveness` opens a pidfd for a producer
once, checks ``/proc/<pid>/stat`` field 22 against the recorded start time
*after* opening it (so the pidfd is known to name that process and not a
later one reusing the pid), and from then on asks the pidfd, which becomes
readable when the process exits. Where pidfds are not available it reads the
start time and state from /proc on every check (a zombie counts as dead).

The safe direction of every doubt is "alive": a producer wrongly found dead
would have its files removed under it, a lease holder wrongly found dead
would have a live view's bytes handed back to the producer. So
`is_holder_alive` answers alive on any OS error, discovery and the garbage
collector read a check that ran out of descriptors (ResourceExhaustedError)
as alive, and only a process surely gone is dead (then for good).

Across pid namespaces. Containers sharing one ``/dev/shm`` (a pod's
containers on one memory-backed emptyDir, docker's ``--ipc=container:``) each
have their own pid namespace, where a recorded (pid, start time) names
another process or none: a pid verdict would find a live producer dead. So
every process that joins a deployment holds, for as long as it is a member,
an open-file-description lock (``F_OFD_SETLK``) on its own *liveness file*
``live.<pid>.<start time>`` (`hold_liveness_file`), which records the pid
namespace it was made in (``pidns <st_dev>:<st_ino>`` of
``/proc/self/ns/pid``). The kernel drops that lock when the process dies,
in every namespace, so an observer anywhere sharing the files tests it
(``F_OFD_GETLK``, which takes nothing): held is alive, free is dead. Where
the observer is in the recorded pid namespace, (pid, start time) through a
pidfd stays the verdict (the fast path, as before). A producer with no
liveness file (a bare `RingChannel`, or one of an older version) is judged
by its pid alone: supported within one pid namespace only.

Used by discovery (`spec.discovery`: which markers are stale, whose files
the garbage collector reclaims), the fallback claim (PRODUCER_GONE), and the
ring engine's dead-holder policy (`is_holder_alive`,
`spec.leases.process_holder_exit`). Every system call goes through the
`OsFacade` the caller gives. The liveness file itself (its name, hold and
release, the fork rule) is `impl.liveness_file`, re-exported here.
"""

from __future__ import annotations

import contextlib
import errno
import os
import select
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Final

from ..spec.layout import FRAME_HOLDER_NONE
from .errors import ConfigurationError, ResourceExhaustedError, is_exhaustion
from .liveness_file import (  # the liveness file's calls are this module's too (__all__)
    _MAX_LIVENESS_FILE,
    LIVENESS_FILE_GRACE_SECONDS,
    Namespace,
    _parse_namespace,
    hold_liveness_file,
    holds_liveness_file,
    is_liveness_file_name,
    liveness_file_name,
    liveness_files_last,
    own_pid_namespace,
    release_liveness_file,
)
from .names import (
    ProducerIdentity,
    parse_start_time,
    process_of,
    read_proc_stat,
)
from .os_seam import (
    OPEN_FLAGS_READONLY,
    OsFacade,
)

if TYPE_CHECKING:
    from .directory import Directory

_DEAD_PROCESS_STATES: Final = (b"Z", b"X", b"x")


def read_process_status(pid: int, os_facade: OsFacade) -> tuple[int, bytes] | None:
    """(start time, state letter) of process `pid` from /proc, or None when there is none."""
    line = read_proc_stat(pid, os_facade)
    if line is None:
        return None
    close = line.rfind(b")")
    if close < 0:
        return None
    state = line[close + 2 : close + 3]
    return parse_start_time(line), state


def is_holder_alive(pid: int, os_facade: OsFacade, directory: Directory | None = None) -> bool:
    """Whether the lease holder `pid` may still run; False only when it surely does not.

    A pidfd answers first (ProcessLookupError: no such process; readable: it
    exited, a zombie included), /proc when pidfds are unavailable. The pid is
    all a frame records, so a reused pid makes a dead holder look alive: the
    frame's reclaim waits for that process too, which is late but never
    unsafe. An unknown holder (0) and any OS error answer alive for the same
    reason: a wrong "dead" would hand a live view's bytes to the producer.

    Across pid namespaces (issue 26), a holder records its pid as its own
    namespace numbers it, which names another process or none here. So
    with the deployment's `directory`, a pid this namespace finds dead is
    still alive while any member of *another* pid namespace with that pid
    number holds its liveness file's lock (`holder_elsewhere`): a frame or
    slot is freed only when no live member anywhere could be its holder.
    Late where two namespaces' members share a pid number, never unsafe.
    """
    if pid == FRAME_HOLDER_NONE or pid == os.getpid():
        return True
    if _pid_alive_here(pid, os_facade):
        return True
    return directory is not None and holder_elsewhere(pid, directory, os_facade)


def holder_elsewhere(pid: int, directory: Directory, os_facade: OsFacade) -> bool:
    """Whether a live member of another pid namespace numbers itself `pid` (doubt: True).

    Reads the liveness files ``live.<pid>.*`` of `directory`: one recorded
    in another namespace (or not written yet) whose lock is held, or any
    error on the way, answers True. Called only where the pid verdict found
    the holder dead (a full ring's dead-holder rule, a slot's reuse), never
    on a per-message path.
    """
    prefix = f"live.{pid}."
    try:
        names = [name for name in directory.names() if name.startswith(prefix)]
        if not names:
            return False
        ours = own_pid_namespace(os_facade)
    except (OSError, ConfigurationError):
        return True
    for name in names:
        if not is_liveness_file_name(name):
            continue  # a connector's live file (instance part): its process's file decides
        try:
            fd = directory.open(name, OPEN_FLAGS_READONLY)
        except FileNotFoundError:
            continue
        except OSError:
            return True
        try:
            if _parse_namespace(os_facade.read(fd, _MAX_LIVENESS_FILE)) == ours:
                continue  # our namespace's member with that pid: the pid verdict was its
            if os_facade.ofd_lock_held(fd):
                return True
        except OSError:
            return True
        finally:
            with contextlib.suppress(OSError):
                os_facade.close(fd)
    return False


def _pid_alive_here(pid: int, os_facade: OsFacade) -> bool:
    """`is_holder_alive`'s verdict in this pid namespace alone."""
    try:
        pidfd = os_facade.pidfd_open(pid)
    except ProcessLookupError:
        return False
    except OSError:  # ENOSYS, EMFILE, ...: /proc answers
        pidfd = -1
    if pidfd >= 0:
        try:
            return os_facade.pidfd_alive(pidfd)
        except OSError:
            return True
        finally:
            with contextlib.suppress(OSError):
                os_facade.close(pidfd)
    try:
        status = read_process_status(pid, os_facade)
    except OSError:
        return True
    return status is not None and status[1] not in _DEAD_PROCESS_STATES


# What the first look at a producer's liveness file found (`Liveness._files`).
_FAST_PATH: Final = -1  # none, or made in our pid namespace: (pid, start time) answers


class Liveness:
    """Which producers are still running: the kernel's lock verdict, or (pid, start time).

    With a `directory`, a producer whose liveness file there was made in
    another pid namespace is alive exactly while that file's lock is held
    (the descriptor is kept, so each later question is one F_OFD_GETLK);
    otherwise, and without a directory, (pid, start time) answers.

    Not thread-safe; the owning connector serializes calls. Holds one pidfd
    (or liveness file descriptor) per live producer it was asked about;
    `forget` and `close` release them.
    """

    _closed: bool = False

    def __init__(
        self,
        os_facade: OsFacade,
        own_identity: tuple[int, ...] | None = None,
        on_exhausted: Callable[[], int] | None = None,
        directory: Directory | None = None,
    ) -> None:
        self._os = os_facade
        self._own = process_of(own_identity) if own_identity is not None else None
        self._directory = directory
        # Per producer: a kept liveness file descriptor (another pid namespace),
        # or _FAST_PATH. In least recently opened order, like the pidfds.
        self._files: dict[ProducerIdentity, int] = {}
        self._namespace: Namespace | None = None
        # Called when /proc cannot be opened for want of descriptors: the
        # owner releases what it caches and answers how many it released.
        self.on_exhausted = on_exhausted
        self._pidfds: dict[ProducerIdentity, int] = {}  # in least recently opened order
        # A kept poll object per pidfd (`OsFacade.pidfd_poller`), dropped with its pidfd.
        self._pollers: dict[ProducerIdentity, select.poll] = {}
        self._pidfd_cap: int | None = None  # after EMFILE: hold at most this many pidfds
        self._dead: set[ProducerIdentity] = set()
        self._pidfd_supported = hasattr(os, "pidfd_open")
        self.checks = 0  # liveness questions answered (statistics)

    def is_alive(self, producer: tuple[int, ...]) -> bool:
        """Whether the process (pid, start time) is running; False once is False forever.

        `producer` may be a producer's (pid, start time, instance): only its
        process part matters, so all instances of a process live and die together.
        """
        self.checks += 1
        producer = process_of(producer)
        if producer == self._own:
            return True
        if producer in self._dead:
            return False
        if self._directory is not None:
            verdict = self._lock_verdict(producer)
            if verdict is not None:
                if not verdict:
                    self._mark_dead(producer)
                return verdict
        pidfd = self._pidfds.get(producer)
        if pidfd is not None:
            try:
                poller = self._pollers.get(producer)
                if poller is None:
                    poller = self._pollers[producer] = self._os.pidfd_poller(pidfd)
                alive = self._os.pidfd_alive(pidfd, poller)
            except OSError:
                # Cannot poll the pidfd now: ask /proc. A get asks after it
                # claimed a frame, and an error here would lose the frame.
                alive = self._proc_alive(producer)
            if alive:
                return True
            self._mark_dead(producer)
            return False
        alive = self._first_check(producer)
        if not alive:
            self._mark_dead(producer)
        return alive

    def _first_check(self, producer: ProducerIdentity) -> bool:
        pid, start_time = producer
        if pid <= 0:
            return False
        pidfd = -1
        if self._pidfd_supported:
            try:
                pidfd = self._os.pidfd_open(pid)
            except ProcessLookupError:
                return False
            except OSError as error:
                if error.errno in (errno.ENOSYS, errno.EPERM, errno.EINVAL):
                    self._pidfd_supported = False
                elif is_exhaustion(error):
                    # Out of descriptors: hold fewer pidfds from now on (each
                    # producer costs one); /proc answers for the others.
                    self.shed(len(self._pidfds) // 2 + 1)
                    self._pidfd_cap = len(self._pidfds)
                # Otherwise (ENOMEM, ...) /proc answers this time;
                # the next question tries a pidfd again.
        try:
            # The pidfd was opened first: if the start time matches now, the
            # pidfd names this very process, not a later one with its pid.
            alive = self._proc_alive(producer)
            if alive and pidfd >= 0:
                try:
                    alive = self._os.pidfd_alive(pidfd)
                except OSError:
                    alive = True  # /proc just said it runs
        except BaseException:
            if pidfd >= 0:
                self._os.close(pidfd)
            raise
        if not alive:
            # Dead, or the pid is another process's now (a same-pid successor:
            # its pidfd was open and is ours to close, the `pid_reuse` fault cell).
            if pidfd >= 0:
                self._os.close(pidfd)
            return False
        if pidfd >= 0:
            if self._pidfd_cap is not None and len(self._pidfds) >= self._pidfd_cap:
                self._os.close(pidfd)  # short of descriptors: /proc answers for this one
            else:
                self._pidfds[producer] = pidfd
        return True

    def _lock_verdict(self, producer: ProducerIdentity, look_again: bool = True) -> bool | None:
        """The liveness file's answer, or None where (pid, start time) answers.

        Every doubt (an OS error, a file being made, one replaced twice while
        asked) answers alive.
        """
        fd = self._files.get(producer)
        if fd is None:
            fd = self._open_liveness_file(producer)
            if fd is None:
                return True  # cannot tell now (asked again next time)
            if fd == _FAST_PATH:
                self._files[producer] = _FAST_PATH
                return None
            self._files[producer] = fd
        elif fd == _FAST_PATH:
            return None
        try:
            if self._os.ofd_lock_held(fd):
                return True
            # Free: its holder died, or is between creating and locking it
            # (then the file is still empty, and young).
            info = self._os.fstat(fd)
            if info.st_size == 0 and time.time() - info.st_mtime < LIVENESS_FILE_GRACE_SECONDS:
                return True
            # A member locks its file before it writes it, so a written file
            # was locked before the fstat above; the test before it may have
            # run just before the lock was taken (the interleaving explorer's
            # liveness_rejoin: a join's lock and write between the two calls
            # read as dead). Asked again, a live member's lock is held.
            if self._os.ofd_lock_held(fd):
                return True
            if not self._still_named(producer, info):
                if not look_again:
                    return True
                # The member left (its file unlinked with the lock dropped),
                # and may have joined again (a new file): the kept inode's
                # free lock says nothing. Look again by name.
                self._files.pop(producer, None)
                self._os.close(fd)
                return self._lock_verdict(producer, look_again=False)
        except OSError:
            return True
        return False

    def _still_named(self, producer: ProducerIdentity, info: os.stat_result) -> bool:
        """Whether the producer's liveness file name still names the inode `info` describes."""
        assert self._directory is not None
        try:
            named = self._directory.stat(liveness_file_name(producer))
        except FileNotFoundError:
            return False
        return (named.st_dev, named.st_ino) == (info.st_dev, info.st_ino)

    def _open_liveness_file(self, producer: ProducerIdentity) -> int | None:
        """A kept descriptor of a liveness file made in another pid namespace,
        _FAST_PATH (none there, or made in ours), or None (cannot tell now)."""
        assert self._directory is not None
        try:
            if self._namespace is None:
                self._namespace = own_pid_namespace(self._os)
            fd = self._directory.open(liveness_file_name(producer), OPEN_FLAGS_READONLY)
        except FileNotFoundError:
            return _FAST_PATH
        except OSError as error:
            if is_exhaustion(error):
                self.shed(len(self._pidfds) + len(self._files) // 2 + 1)
            return None
        try:
            content = self._os.read(fd, _MAX_LIVENESS_FILE)
        except OSError:
            self._os.close(fd)
            return None
        if _parse_namespace(content) == self._namespace:
            self._os.close(fd)
            return _FAST_PATH
        return fd  # another namespace's, or not written yet: its lock answers

    @property
    def pidfd_count(self) -> int:
        """Pidfds held now (each is a descriptor)."""
        return len(self._pidfds)

    def shed(self, count: int) -> int:
        """Close up to `count` pidfds, least recently opened first; answer how many.

        Verdicts are kept: a producer found dead stays dead, a live one is
        asked again through /proc or a new pidfd.
        """
        closed = 0
        while self._pidfds and closed < count:
            producer = next(iter(self._pidfds))
            self.forget(producer)
            closed += 1
        for producer in [p for p, fd in self._files.items() if fd != _FAST_PATH]:
            if closed >= count:
                break
            self.forget(producer)
            closed += 1
        return closed

    def _proc_alive(self, producer: ProducerIdentity) -> bool:
        """/proc's answer: the pid runs, with this start time, and is not a zombie.

        Out of descriptors, our pidfds go first, then what the owner caches
        (`on_exhausted`); ResourceExhaustedError when nothing could be freed.
        """
        pid, start_time = producer
        for _ in range(3):
            try:
                status = read_process_status(pid, self._os)
                break
            except OSError as error:
                if not is_exhaustion(error):
                    raise
                freed = self.shed(len(self._pidfds))
                if not freed and self.on_exhausted is not None:
                    freed = self.on_exhausted()
                if not freed:
                    raise ResourceExhaustedError(
                        f"no descriptor to read /proc/{pid}/stat: {error}", error.errno or 0
                    ) from error
        else:
            raise ResourceExhaustedError(f"no descriptor to read /proc/{pid}/stat")
        return (
            status is not None and status[0] == start_time and status[1] not in _DEAD_PROCESS_STATES
        )

    def _mark_dead(self, producer: ProducerIdentity) -> None:
        self._dead.add(producer)
        self.forget(producer)

    def forget(self, producer: tuple[int, ...]) -> None:
        """Drop the pidfd of `producer`'s process (its verdict, if dead, is kept)."""
        process = process_of(producer)
        self._pollers.pop(process, None)  # it watches the descriptor closed below
        pidfd = self._pidfds.pop(process, None)
        if pidfd is not None:
            self._os.close(pidfd)
        fd = self._files.pop(process, None)
        if fd is not None and fd != _FAST_PATH:
            self._os.close(fd)

    def close(self) -> None:
        """Close every pidfd. Idempotent."""
        self._closed = True
        self._pollers.clear()
        while self._pidfds:
            _, pidfd = self._pidfds.popitem()
            with contextlib.suppress(OSError):
                self._os.close(pidfd)
        while self._files:
            _, fd = self._files.popitem()
            if fd != _FAST_PATH:
                with contextlib.suppress(OSError):
                    self._os.close(fd)


__all__ = [
    "LIVENESS_FILE_GRACE_SECONDS",
    "Liveness",
    "hold_liveness_file",
    "holds_liveness_file",
    "holder_elsewhere",
    "is_holder_alive",
    "is_liveness_file_name",
    "liveness_file_name",
    "liveness_files_last",
    "own_pid_namespace",
    "read_process_status",
    "release_liveness_file",
]
