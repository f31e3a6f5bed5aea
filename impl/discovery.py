"""Discovery and liveness: how receivers find the producers of an edge.

Design rationale. The model (`shmring.spec.discovery`) keeps a set of
markers and a stamp that strictly increases with every change of the set; a
receiver rescans only when the stamp moved, and records the stamp it read
*before* scanning. This module is that, over files in the deployment
directory:

* A marker is an empty file ``marker.<src>.<dst>.<pid>.<start time>.<instance>``,
  created (O_EXCL, 0600, O_NOFOLLOW) by a producer only after its ring on
  the edge is ready, and removed when it closes.
* The stamp is a u64 counter in the small file ``stamp``. Writers (a
  producer registering or leaving, a receiver pruning) change it under an
  exclusive `flock` of that file with read, add one, store. Readers map the
  file and load the counter with one aligned 8-byte load: an unchanged poll
  costs no system call, no lock and no directory scan. A counter, unlike a
  directory mtime, moves even when the clock does not.
* Every change of the markers is followed by a bump, so a receiver that read
  stamp s before its scan and sees s again afterwards knows the marker set
  it scanned is still current; a producer that registered during the scan
  bumped past s, and the next refresh rescans.

Liveness. A producer's identity is (pid, start time, instance); liveness
belongs to the process part (pid, start time), so every instance of a killed
process is dead at once. `Liveness` opens a
pidfd for a producer once, checks ``/proc/<pid>/stat`` field 22 against the
recorded start time *after* opening it (so the pidfd is known to name that
process and not a later one reusing the pid), and from then on asks the
pidfd, which becomes readable when the process exits. Where pidfds are not
available it reads the start time and state from /proc on every check
(a zombie counts as dead).

Membership and teardown. The directory, the stamp and the ``members`` file
belong to nobody in particular. Every connector holds a shared `flock` on
``members`` for as long as it is open. Leaving, a connector drops its lock
and tries an exclusive one without waiting: only the last member gets it,
and only if the directory then holds nothing but ``stamp`` and ``members``
does it remove them and the directory. A process joining meanwhile waits for
that short exclusive hold, finds the file unlinked under its lock
(``st_nlink == 0``) and starts over, so no member ever holds a stamp that
was torn down. Files left by a killed producer keep the directory; the
receivers prune dead producers' markers, and `collect_orphans` removes the
rest.

Every system call goes through the `OsFacade` the caller gives.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import mmap
import os
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Final

from shmring.impl import futex
from shmring.impl.errors import (
    BrokenError,
    DirectoryReplacedError,
    ResourceExhaustedError,
    ShmringError,
    is_exhaustion,
)
from shmring.impl.futex import FutexWord
from shmring.impl.naming import (
    NAME_SEPARATOR,
    ConnectorIdentity,
    DeploymentDirectory,
    Directory,
    ProducerIdentity,
    as_directory,
    check_private_file,
    parse_ring_file_name,
    parse_start_time,
    parse_transfer_file_owner,
    process_of,
    validate_stage_name,
)
from shmring.impl.os_seam import (
    FILE_MODE,
    OPEN_FLAGS_CREATE,
    OPEN_FLAGS_EXISTING,
    OPEN_FLAGS_READONLY,
    OsFacade,
)
from shmring.spec.layout import FRAME_HOLDER_NONE

Edge = tuple[str, str]  # (source stage, destination stage)

STAMP_FILE_NAME: Final = "stamp"
MEMBERS_FILE_NAME: Final = "members"
MARKER_FILE_PREFIX: Final = "marker"
LIVE_FILE_PREFIX: Final = "live"

# The stamp file, one cache line long: the u64 stamp at offset 0, then the
# u32 doorbell every connector rings when it publishes (see `Stamp.ring`).
STAMP_OFFSET: Final = 0
DOORBELL_OFFSET: Final = STAMP_OFFSET + 8
STAMP_FILE_LENGTH: Final = 64
_STAMP_WORD: Final = STAMP_OFFSET // 8  # the stamp's index in the file's u64 words

_MARKER_PATTERN: Final = re.compile(
    r"marker\.([A-Za-z0-9_-]+)\.([A-Za-z0-9_-]+)\.([0-9]+)\.([0-9]+)(?:\.([0-9]+))?"
)
_LIVE_PATTERN: Final = re.compile(r"live\.([0-9]+)\.([0-9]+)(?:\.([0-9]+))?")
_PROC_STAT_READ_LENGTH: Final = 4096
_DEAD_PROCESS_STATES: Final = (b"Z", b"X", b"x")

# Joining waits (sleeping, never spinning) only for a concurrent teardown,
# which holds its exclusive lock for a handful of system calls.
_JOIN_RETRY_SLEEP: Final = 0.0005
_JOIN_TIMEOUT: Final = 10.0


# -- names ---------------------------------------------------------------------


def marker_file_name(edge: Edge, producer: tuple[int, ...]) -> str:
    """``marker.<src>.<dst>.<pid>.<start time>[.<instance>]`` for validated stage names."""
    source, destination = edge
    validate_stage_name(source)
    validate_stage_name(destination)
    return NAME_SEPARATOR.join((MARKER_FILE_PREFIX, source, destination, *map(str, producer)))


def parse_marker_file_name(name: str) -> tuple[Edge, ConnectorIdentity] | None:
    """(edge, producer (pid, start time, instance)) of a marker file name, or None."""
    match = _MARKER_PATTERN.fullmatch(name)
    if match is None:
        return None
    source, destination, pid, start_time, instance = match.groups()
    return (source, destination), (int(pid), int(start_time), int(instance) if instance else 0)


def live_file_name(producer: tuple[int, ...]) -> str:
    """``live.<pid>.<start time>[.<instance>]``: that producer's connector is open (not closed)."""
    return NAME_SEPARATOR.join((LIVE_FILE_PREFIX, *map(str, producer)))


def parse_live_file_name(name: str) -> ProducerIdentity | None:
    """The process (pid, start time) a live file belongs to, or None."""
    match = _LIVE_PATTERN.fullmatch(name)
    if match is None:
        return None
    return int(match.group(1)), int(match.group(2))


# -- liveness ------------------------------------------------------------------


def read_process_status(pid: int, os_facade: OsFacade) -> tuple[int, bytes] | None:
    """(start time, state letter) of process `pid` from /proc, or None when there is none."""
    try:
        fd = os_facade.open(f"/proc/{pid}/stat", OPEN_FLAGS_READONLY)
    except (FileNotFoundError, ProcessLookupError):
        return None
    try:
        line = os_facade.read(fd, _PROC_STAT_READ_LENGTH)
    except ProcessLookupError:  # exited between open and read
        return None
    finally:
        os_facade.close(fd)
    close = line.rfind(b")")
    if close < 0 or not line:
        return None
    state = line[close + 2 : close + 3]
    return parse_start_time(line), state


def is_holder_alive(pid: int, os_facade: OsFacade) -> bool:
    """Whether the lease holder `pid` may still run; False only when it surely does not.

    A pidfd answers first (ProcessLookupError: no such process; readable: it
    exited, a zombie included), /proc when pidfds are unavailable. The pid is
    all a frame records, so a reused pid makes a dead holder look alive: the
    frame's reclaim waits for that process too, which is late but never
    unsafe. An unknown holder (0) and any OS error answer alive for the same
    reason: a wrong "dead" would hand a live view's bytes to the producer.
    """
    if pid == FRAME_HOLDER_NONE or pid == os.getpid():
        return True
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


class Liveness:
    """Which producers are still running, by (pid, start time).

    Not thread-safe; the owning connector serializes calls. Holds one pidfd
    per live producer it was asked about; `forget` and `close` release them.
    """

    _closed: bool = False

    def __init__(
        self,
        os_facade: OsFacade,
        own_identity: tuple[int, ...] | None = None,
        on_exhausted: Callable[[], int] | None = None,
    ) -> None:
        self._os = os_facade
        self._own = process_of(own_identity) if own_identity is not None else None
        # Called when /proc cannot be opened for want of descriptors: the
        # owner releases what it caches and answers how many it released.
        self.on_exhausted = on_exhausted
        self._pidfds: dict[ProducerIdentity, int] = {}  # in least recently opened order
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
        pidfd = self._pidfds.get(producer)
        if pidfd is not None:
            try:
                alive = self._os.pidfd_alive(pidfd)
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
            if not self._proc_alive(producer):
                return False
            if pidfd >= 0:
                try:
                    polled = self._os.pidfd_alive(pidfd)
                except OSError:
                    polled = True  # /proc just said it runs
                if not polled:
                    return False
        except BaseException:
            if pidfd >= 0:
                self._os.close(pidfd)
            raise
        if pidfd >= 0:
            if self._pidfd_cap is not None and len(self._pidfds) >= self._pidfd_cap:
                self._os.close(pidfd)  # short of descriptors: /proc answers for this one
            else:
                self._pidfds[producer] = pidfd
        return True

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
        pidfd = self._pidfds.pop(process_of(producer), None)
        if pidfd is not None:
            self._os.close(pidfd)

    def close(self) -> None:
        """Close every pidfd. Idempotent."""
        self._closed = True
        while self._pidfds:
            _, pidfd = self._pidfds.popitem()
            with contextlib.suppress(OSError):
                self._os.close(pidfd)


# -- the stamp -----------------------------------------------------------------


class Stamp:
    """The deployment's strictly increasing directory stamp, mapped.

    `load` is one shared-memory load. `bump` and `prune_and_bump` take the
    stamp file's exclusive lock; `bump` waits for it (producers), the
    receiver's `prune_and_bump` does not.

    The same file holds the deployment's *doorbell*: a futex word every
    connector rings after it publishes (ring frame, fallback segment, retire,
    new producer), so a blocked receive sleeps in the kernel instead of
    polling and wakes as soon as anything may have arrived (`doorbell`,
    `wait`, `ring`).
    """

    _fd: int = -1
    _mapping: mmap.mmap | None = None
    _buf: memoryview | None = None
    _doorbell: FutexWord | None = None

    def __init__(self, path: str, os_facade: OsFacade) -> None:
        self.path = path
        self._os = os_facade

    @classmethod
    def open(cls, directory: str | Directory, os_facade: OsFacade) -> Stamp:
        """Open (creating if needed) the stamp file of `directory` and map it."""
        directory = as_directory(directory, os_facade)
        stamp = cls(directory.join(STAMP_FILE_NAME), os_facade)
        try:
            stamp._fd = directory.open(STAMP_FILE_NAME, OPEN_FLAGS_EXISTING | os.O_CREAT, FILE_MODE)
            info = os_facade.fstat(stamp._fd)
            problem = check_private_file(stamp.path, info)
            if problem is not None:
                raise BrokenError(f"stamp file is not trusted: {problem}")
            if info.st_size < STAMP_FILE_LENGTH:
                # Whoever creates it sizes it; a concurrent opener doing the
                # same extends with zeros too, so the counter starts at 0.
                os_facade.ftruncate(stamp._fd, STAMP_FILE_LENGTH)
            stamp._mapping = os_facade.mmap(stamp._fd, STAMP_FILE_LENGTH)
            with memoryview(stamp._mapping) as raw:
                # u64 items: one load or store each (struct would zero-fill, then write bytes)
                stamp._buf = raw.cast("Q")
            if futex.AVAILABLE:
                stamp._doorbell = FutexWord(stamp._mapping, DOORBELL_OFFSET)
        except BaseException:
            stamp.close()
            raise
        return stamp

    def load(self) -> int:
        """The current stamp (acquire); no system call."""
        buf = self._buf
        if buf is None:
            raise BrokenError(f"stamp is closed: path={self.path!r}")
        value: int = buf[_STAMP_WORD]
        return value

    def bump(self) -> int:
        """Advance the stamp by one under its lock; answer the new value."""
        buf = self._buf
        if buf is None:
            raise BrokenError(f"stamp is closed: path={self.path!r}")
        self._os.flock(self._fd, fcntl.LOCK_EX)
        try:
            value: int = buf[_STAMP_WORD] + 1
            buf[_STAMP_WORD] = value
        finally:
            self._os.flock(self._fd, fcntl.LOCK_UN)
        self.ring()
        return value

    def doorbell(self) -> int | None:
        """The doorbell's value (None without futexes); read it *before* looking for work."""
        doorbell = self._doorbell
        return doorbell.load() if doorbell is not None else None

    def ring(self) -> None:
        """Wake every receiver blocked in `wait` on this deployment."""
        doorbell = self._doorbell
        if doorbell is not None:
            doorbell.bump_and_wake()

    def waker(self) -> Callable[[], None] | None:
        """`ring` as one bound call for a hot path (None without futexes); a no-op once closed."""
        doorbell = self._doorbell
        return doorbell.bump_and_wake if doorbell is not None else None

    def wait(self, seen: int | None, timeout: float) -> None:
        """Sleep until the doorbell moves past `seen`, or `timeout` seconds.

        Without futexes (`seen` is None), sleeps `timeout`; callers keep the
        timeout short then.
        """
        doorbell = self._doorbell
        if doorbell is None or seen is None:
            time.sleep(max(timeout, 0.0))
            return
        doorbell.wait(seen, timeout)

    def prune_and_bump(
        self, directory: str | Directory, names: Iterable[str], scanned_at: int
    ) -> int | None:
        """Unlink stale marker `names` and bump once, without waiting for the lock.

        Answers the stamp a receiver may cache afterwards: the new value when
        nothing else changed since `scanned_at` (the stamp it read before
        scanning), otherwise `scanned_at` itself, so that the next refresh
        rescans. None when the lock was busy (nothing pruned; retried at a
        later scan).
        """
        buf = self._buf
        if buf is None:
            raise BrokenError(f"stamp is closed: path={self.path!r}")
        try:
            self._os.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return None
        where = as_directory(directory, self._os)
        try:
            before: int = buf[_STAMP_WORD]
            for name in names:
                with contextlib.suppress(FileNotFoundError):
                    where.unlink(name)
            value = before + 1
            buf[_STAMP_WORD] = value
        finally:
            self._os.flock(self._fd, fcntl.LOCK_UN)
        self.ring()
        return value if before == scanned_at else scanned_at

    def close(self) -> None:
        """Unmap and close. Idempotent; never unlinks (see `Membership.leave`)."""
        doorbell, self._doorbell = self._doorbell, None
        if doorbell is not None:
            doorbell.close()
        buf, self._buf = self._buf, None
        if buf is not None:
            buf.release()
        mapping, self._mapping = self._mapping, None
        if mapping is not None:
            mapping.close()
        fd, self._fd = self._fd, -1
        if fd >= 0:
            self._os.close(fd)


# -- membership ------------------------------------------------------------------


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
                _remove_dead_files(self.directory, self._os, None)
            return _teardown_if_empty(self.directory, self._os)
        finally:
            self._os.close(fd)


def _teardown_if_empty(directory: str | Directory, os_facade: OsFacade) -> bool:
    """With ``members`` locked exclusively: remove stamp, members and the directory if nothing else is there."""
    where = as_directory(directory, os_facade)
    try:
        names = set(where.names())
    except FileNotFoundError:
        return False
    if not names <= {STAMP_FILE_NAME, MEMBERS_FILE_NAME}:
        return False
    for name in (STAMP_FILE_NAME, MEMBERS_FILE_NAME):
        if name in names:
            with contextlib.suppress(FileNotFoundError):
                where.unlink(name)
    if isinstance(where, DeploymentDirectory):
        try:
            where.verify()  # rmdir goes by path: only if the path is still ours
        except DirectoryReplacedError:
            return False
    try:
        os_facade.rmdir(where.path)
    except FileNotFoundError:
        return False
    except OSError as error:
        if error.errno in (errno.ENOTEMPTY, errno.EEXIST):
            return False  # something appeared meanwhile; its owner cleans up
        raise
    return True


# -- producer side ---------------------------------------------------------------


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
        """Create the edge's marker, then bump the stamp; on failure nothing is left."""
        name = marker_file_name(edge, self.producer)
        fd = self.directory.open(name, OPEN_FLAGS_CREATE, FILE_MODE)
        try:
            self._os.close(fd)
            self._stamp.bump()
        except BaseException:
            with contextlib.suppress(OSError):
                self.directory.unlink(name)
            raise
        self.edges.add(edge)

    def unregister(self, edges: Iterable[Edge]) -> int:
        """Remove the markers of `edges` and bump once if any was removed; answer how many."""
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


# -- receiver side ---------------------------------------------------------------


@dataclass(frozen=True)
class DiscoveryStatistics:
    """What one receiver's discovery did."""

    scans: int  # directory scans; grows only when the stamp moved (or no stamp is available)
    pruned: int  # stale markers of dead producers this receiver removed
    seen_stamp: int | None  # the stamp cached at the last scan; None before the first
    producers: int  # (edge, producer) pairs known from the last scan and not released
    reclaimed: int = 0  # other files of dead producers (rings, live, segments, spares) it removed


class DiscoveryCache:
    """One receiver's view of the markers: rescanned only when the stamp moved.

    `stamp` may be None (the stamp file could not be opened): then every
    refresh scans, which is slower but never misses a producer.
    """

    def __init__(
        self,
        directory: str | Directory,
        os_facade: OsFacade,
        liveness: Liveness,
        stamp: Stamp | None,
    ) -> None:
        self.directory = as_directory(directory, os_facade)
        self._os = os_facade
        self._liveness = liveness
        self._stamp = stamp
        self.seen_stamp: int | None = None  # stamp read before the last scan (after own pruning)
        self.scans = 0
        self.pruned = 0
        self.reclaimed = 0  # files of dead producers this receiver removed at its scans
        # Rescan at least this often even when the stamp did not move (None: never);
        # set by the owner. The lockstep machines turn it off: the model has no clock.
        self.rescan_seconds: float | None = None
        self._scanned_at = 0.0  # monotonic time of the last scan
        self.reclaim_errors = 0  # reclaims that failed (retried at the next scan)
        self.last_reclaim_error: str | None = None
        # Producers with a live marker at the last scan, per edge; entries are
        # dropped (`release`) once a producer is found closed or dead.
        self.producers: dict[Edge, set[ConnectorIdentity]] = {}

    def refresh(self) -> bool:
        """Rescan if the stamp moved (or `rescan_seconds` passed); answer whether it scanned.

        A killed producer moves no stamp; the periodic rescan is what bounds
        how long its files stay when nothing else changes in the deployment
        (issue 12). It costs one directory scan per `rescan_seconds` of a
        receiver that keeps polling; an unchanged poll in between costs one load.
        """
        stamp = self._stamp
        if stamp is not None:
            current = stamp.load()
            if current == self.seen_stamp and not self._rescan_due():
                return False
        else:
            current = -1
        self._scan(current)
        return True

    def _rescan_due(self) -> bool:
        period = self.rescan_seconds
        return period is not None and time.monotonic() - self._scanned_at >= period

    def _scan(self, scanned_at: int) -> None:
        self.scans += 1
        self._scanned_at = time.monotonic()
        found: dict[Edge, set[ConnectorIdentity]] = {}
        stale: list[str] = []
        names = self.directory.names()
        for name in names:
            parsed = parse_marker_file_name(name)
            if parsed is None:
                continue
            edge, producer = parsed
            try:
                alive = self._liveness.is_alive(producer)
            except ResourceExhaustedError:
                alive = True  # cannot tell now: never prune on a doubt
            if alive:
                found.setdefault(edge, set()).add(producer)
            else:
                stale.append(name)
        # What dead producers left besides markers goes now (`spec.discovery.
        # process_reclaim`), from this scan's own listing: no extra scan.
        try:
            self.reclaimed += reclaim_dead_files(self.directory, names, self._os, self._liveness)
        except (OSError, ShmringError) as error:  # retried at the next scan
            self.reclaim_errors += 1
            self.last_reclaim_error = repr(error)
        seen: int | None = scanned_at
        stamp = self._stamp
        if stamp is None:
            seen = None
        elif stale:
            pruned_at = stamp.prune_and_bump(self.directory, stale, scanned_at)
            if pruned_at is not None:
                self.pruned += len(stale)
                seen = pruned_at
        self.seen_stamp = seen
        self.producers = found

    def producers_of(self, edge: Edge) -> list[ConnectorIdentity]:
        """Producers of `edge` known from the last scan, in a stable order."""
        known = self.producers.get(edge)
        return sorted(known) if known else []

    def release(self, edge: Edge, producer: ConnectorIdentity) -> None:
        """Forget `producer` on `edge` (it closed or exited) until a scan shows it again."""
        known = self.producers.get(edge)
        if known is not None:
            known.discard(producer)
            if not known:
                del self.producers[edge]

    def statistics(self) -> DiscoveryStatistics:
        return DiscoveryStatistics(
            scans=self.scans,
            pruned=self.pruned,
            reclaimed=self.reclaimed,
            seen_stamp=self.seen_stamp,
            producers=sum(len(v) for v in self.producers.values()),
        )


# -- orphan collection -------------------------------------------------------------


def file_owner(name: str) -> ProducerIdentity | None:
    """The producer a deployment file belongs to, read from its name.

    Rings, markers, live files, fallback temporaries and handed-back spares
    carry their owner in the name; fallback segments carry it in their header
    (None here).
    """
    from shmring.impl import fallback  # fallback imports this module

    marker = parse_marker_file_name(name)
    if marker is not None:
        return process_of(marker[1])
    ring = parse_ring_file_name(name)
    if ring is not None:
        return ring.producer
    return (
        parse_live_file_name(name)
        or fallback.parse_temp_file_name(name)
        or fallback.parse_spare_file_name(name)
        or parse_transfer_file_owner(name)
    )


def collect_orphans(
    directory: str | Directory, os_facade: OsFacade, liveness: Liveness | None = None
) -> int:
    """Remove what dead producers left in `directory`; answer how many files went.

    Markers, rings, live files and fallback files (segments and their
    temporaries) of producers that are not running are removed; then, if no
    connector is a member any more and nothing else is left, the stamp, the
    members file and the directory go too.
    """
    removed = _remove_dead_files(directory, os_facade, liveness)
    return removed + _remove_unused_directory(directory, os_facade)


def reclaim_dead_files(
    directory: Directory, names: Iterable[str], os_facade: OsFacade, liveness: Liveness
) -> int:
    """Remove the files among `names` of producers found dead, markers aside; answer how many.

    Markers are the scan's to prune (they move the stamp). Files named for
    their owner (rings, live files, temporaries, spares, transfer files) go
    when that owner is not running; fallback segments carry their owner in
    their header, so they are read (under their lock) only when some owner
    was found dead. Identity is (pid, start time) checked through a pidfd
    (`Liveness`), so a live producer, or a restarted one reusing a pid, is
    never touched: the safe direction of every doubt is "alive".
    """
    from shmring.impl import fallback  # fallback imports this module

    removed = 0
    dead: set[ProducerIdentity] = set()
    segments: list[str] = []
    for name in names:
        if parse_marker_file_name(name) is not None:
            continue
        owner = file_owner(name)
        if owner is None:
            if fallback.is_segment_file_name(name):
                segments.append(name)
            continue
        try:
            if liveness.is_alive(owner):
                continue
        except ResourceExhaustedError:
            continue  # cannot tell now: never remove on a doubt
        dead.add(owner)
        with contextlib.suppress(FileNotFoundError):
            directory.unlink(name)
            removed += 1
    if dead:
        for name in segments:
            removed += fallback.remove_if_orphaned(
                directory, name, os_facade, lambda owner: owner not in dead
            )
    return removed


def _remove_dead_files(
    directory: str | Directory, os_facade: OsFacade, liveness: Liveness | None
) -> int:
    """Markers, rings, live files and fallback files of producers not running; answers how many went."""
    from shmring.impl import fallback  # fallback imports this module

    where = as_directory(directory, os_facade)
    own = liveness is None
    if liveness is None:
        liveness = Liveness(os_facade)
    removed = 0
    try:
        try:
            names = where.names()
        except FileNotFoundError:
            return 0
        for name in names:
            owner = file_owner(name)
            if owner is not None:
                if not liveness.is_alive(owner):
                    with contextlib.suppress(FileNotFoundError):
                        where.unlink(name)
                        removed += 1
            elif fallback.is_segment_file_name(name):
                removed += fallback.remove_if_orphaned(where, name, os_facade, liveness.is_alive)
    finally:
        if own:
            liveness.close()
    return removed


def _remove_unused_directory(directory: str | Directory, os_facade: OsFacade) -> int:
    """Tear the directory down if no member holds ``members``; answer files removed (0 or 2)."""
    where = as_directory(directory, os_facade)
    try:
        fd = where.open(MEMBERS_FILE_NAME, OPEN_FLAGS_EXISTING)
    except FileNotFoundError:
        fd = -1
    try:
        if fd >= 0:
            try:
                os_facade.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return 0
        return 2 if _teardown_if_empty(where, os_facade) else 0
    finally:
        if fd >= 0:
            os_facade.close(fd)


__all__ = [
    "LIVE_FILE_PREFIX",
    "MARKER_FILE_PREFIX",
    "MEMBERS_FILE_NAME",
    "STAMP_FILE_NAME",
    "DiscoveryCache",
    "DiscoveryStatistics",
    "Edge",
    "Liveness",
    "Membership",
    "Registrar",
    "Stamp",
    "collect_orphans",
    "file_owner",
    "live_file_name",
    "marker_file_name",
    "parse_live_file_name",
    "parse_marker_file_name",
    "is_holder_alive",
    "read_process_status",
    "reclaim_dead_files",
]
