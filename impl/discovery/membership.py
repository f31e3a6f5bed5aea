"""Membership and markers: who is in a deployment, and which producers are ready.

Design rationale. The directory, the stamp and the ``members`` file belong
to nobody in particular. Every member (a connector, a transfer sender or
registry: `shmring.impl.registered.member`) holds a shared `flock` on
``members`` for as long as it is open (`Membership`). Leaving, a member
drops its lock and tries an exclusive one without waiting: only the last
member gets it, and only if the directory then holds nothing but ``stamp``
and ``members`` does it remove them and the directory, as a protocol
(`shmring.impl.discovery.gc.teardown_if_empty`: under the directory's
teardown lock, by its parent's descriptor after checking the inode; issue
22, defect 8). A process joining meanwhile waits for that short exclusive
hold, finds the file unlinked under its lock (``st_nlink == 0``) or the
directory removed (ENOENT through its descriptor) and starts over, joining
the surviving directory or making a fresh one, so no member ever holds a
stamp that was torn down.

A producer's `Registrar` keeps its markers: an empty file
``marker.<src>.<dst>.<pid>.<start time>.<instance>`` created (O_EXCL, 0600,
O_NOFOLLOW) only after its ring on the edge is ready, then a stamp bump
(the marker half of `spec.discovery.process_put` for a newly ready ring);
removed, then a bump, when it closes (the marker half of
`spec.discovery.process_close`).

Every system call goes through the `OsFacade` the caller gives.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import time
from collections.abc import Callable, Iterable
from typing import Final

from ..directory import DeploymentDirectory, Directory, as_directory
from ..errors import BrokenError, DirectoryReplacedError, ShmringError
from ..names import MEMBERS_FILE_NAME, Edge, marker_file_name
from ..os_seam import FILE_MODE, OPEN_FLAGS_CREATE, OPEN_FLAGS_EXISTING, OsFacade
from .gc import remove_dead_files, teardown_if_empty
from .stamp import Stamp

# Joining waits (sleeping, never spinning) only for a concurrent teardown,
# which holds its exclusive lock for a handful of system calls.
_JOIN_RETRY_SLEEP: Final = 0.0005
_JOIN_TIMEOUT: Final = 10.0

logger = logging.getLogger("shmring.discovery")


class Membership:
    """A shared lock on the directory's ``members`` file, held while a connector is open."""

    _fd: int = -1

    def __init__(self, directory: Directory, os_facade: OsFacade) -> None:
        self.directory = directory  # where we joined: a verified descriptor for connectors
        self.path = directory.join(MEMBERS_FILE_NAME)
        self._os = os_facade

    @classmethod
    def join(
        cls,
        directory: str | Directory | None,
        os_facade: OsFacade,
        ensure_directory: Callable[[], Directory] | None = None,
    ) -> Membership:
        """Take a shared lock on ``members`` (creating it), retrying across a teardown.

        `ensure_directory`, when given, is called (no arguments) to open the
        directory (creating it) when `directory` is None, again if a teardown
        removed it meanwhile, and again if the path no longer names the
        directory joined: the answer's `directory` is where the lock is held.
        Directories it opened and left are closed here; on failure nothing
        it opened stays open.
        """
        deadline = time.monotonic() + _JOIN_TIMEOUT
        opened: Directory | None = None  # what `ensure_directory` gave us and we hold

        def again(reason: BaseException | None) -> Directory:
            nonlocal opened
            if ensure_directory is None:
                assert reason is not None
                raise reason
            if isinstance(opened, DeploymentDirectory):
                opened.close()
            opened = None
            while True:
                if time.monotonic() > deadline:
                    raise BrokenError(
                        f"deployment directory keeps changing while joining: scope directory "
                        f"{where_path!r}"
                    ) from reason
                try:
                    opened = ensure_directory()
                    return opened
                except DirectoryReplacedError as error:
                    reason = error
                    time.sleep(_JOIN_RETRY_SLEEP)

        where_path = "" if directory is None else as_directory(directory, os_facade).path
        try:
            where = again(None) if directory is None else as_directory(directory, os_facade)
            where_path = where.path
            return cls._join(where, os_facade, ensure_directory, deadline, again)
        except BaseException:
            if isinstance(opened, DeploymentDirectory):
                opened.close()
            raise

    @classmethod
    def _join(
        cls,
        where: Directory,
        os_facade: OsFacade,
        ensure_directory: Callable[[], Directory] | None,
        deadline: float,
        again: Callable[[BaseException | None], Directory],
    ) -> Membership:
        while True:
            try:
                # Relative to the directory's descriptor: a directory removed
                # by a teardown answers ENOENT, one re-created at the path by
                # someone else is never reached.
                fd = where.open(MEMBERS_FILE_NAME, OPEN_FLAGS_EXISTING | os.O_CREAT, FILE_MODE)
            except FileNotFoundError as error:
                where = again(error)
                continue
            try:
                try:
                    os_facade.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                except BlockingIOError:
                    os_facade.close(fd)
                    fd = -1
                    if time.monotonic() > deadline:
                        raise BrokenError(
                            f"deployment directory stays locked by a teardown: path={where.path!r}"
                        ) from None
                    time.sleep(_JOIN_RETRY_SLEEP)
                    continue
                if os_facade.fstat(fd).st_nlink == 0:  # torn down under us: start over
                    os_facade.close(fd)
                    fd = -1
                    continue
                if ensure_directory is not None:
                    # Joined the directory our descriptor names; others find
                    # it by path, so the path must still name it.
                    try:
                        where.verify()
                    except DirectoryReplacedError as error:
                        os_facade.close(fd)
                        fd = -1
                        where = again(error)
                        continue
            except BaseException:
                if fd >= 0:
                    os_facade.close(fd)
                raise
            member = cls(where, os_facade)
            member._fd = fd
            return member

    @property
    def joined(self) -> bool:
        return self._fd >= 0

    def abandon(self) -> None:
        """Drop our lock, tearing nothing down: the directory was removed under us. Idempotent."""
        fd, self._fd = self._fd, -1
        if fd >= 0:
            self._os.close(fd)

    def leave(self) -> bool:
        """Drop the shared lock; the last member removes an empty directory. Idempotent.

        Answers whether this call removed the directory.
        """
        fd, self._fd = self._fd, -1
        if fd < 0:
            return False
        try:
            self._os.flock(fd, fcntl.LOCK_UN)
            try:
                self._os.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False  # another member is still here
            # The last one out also removes what killed producers left, so
            # nothing stays behind once the survivors have closed.
            with contextlib.suppress(OSError, ShmringError):
                remove_dead_files(self.directory, self._os, None)
            try:
                return teardown_if_empty(self.directory, self._os, fd)
            except OSError as error:  # issue 22: leaving never raises for the OS
                logger.warning(
                    "shmring: could not remove the empty deployment directory %s: %s; "
                    "remedy: the next member to leave, or `shmring gc`, removes it",
                    self.directory.path,
                    error,
                )
                return False
        finally:
            self._os.close(fd)


class Registrar:
    """A producer's markers: added after a ring is ready, removed at close."""

    def __init__(
        self,
        directory: str | Directory,
        os_facade: OsFacade,
        stamp: Stamp,
        producer: tuple[int, ...],
    ) -> None:
        self.directory = as_directory(directory, os_facade)
        self._os = os_facade
        self._stamp = stamp
        self.producer = producer
        self.edges: set[Edge] = set()  # edges with a marker of ours

    def register(self, edge: Edge) -> None:
        """Create the edge's marker, then bump the stamp; on failure nothing is left.

        `spec.discovery.process_put` for a ring newly ready on `edge`.
        """
        name = marker_file_name(edge, self.producer)
        # Named before it exists (issue 24): whatever exception stops us, close removes it.
        self.edges.add(edge)
        try:
            fd = self.directory.open(name, OPEN_FLAGS_CREATE, FILE_MODE)
            self._os.close(fd)
            self._stamp.bump()
        except BaseException:
            try:
                self.directory.unlink(name)
            except FileNotFoundError:
                self.edges.discard(edge)
            except OSError:
                pass  # kept in `edges`: close removes it
            else:
                self.edges.discard(edge)
            raise

    def unregister(self, edges: Iterable[Edge]) -> int:
        """Remove the markers of `edges` and bump once if any was removed; answer how many.

        The marker half of `spec.discovery.process_close`.
        """
        removed = 0
        for edge in sorted(set(edges) & self.edges):
            with contextlib.suppress(FileNotFoundError):
                self.directory.unlink(marker_file_name(edge, self.producer))
                removed += 1
            self.edges.discard(edge)
        if removed:
            self._stamp.bump()
        return removed

    def unregister_all(self) -> int:
        return self.unregister(list(self.edges))


__all__ = ["Membership", "Registrar"]
