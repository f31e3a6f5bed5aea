"""Per-key fallback segments: one POSIX shared-memory file per (edge, key).

Design rationale. Frames the ring does not take (too large, or the ring is
full, disabled or failed) travel in a file of their own in the deployment
directory, named for the edge and a digest of the key::

    fb.<source stage>.<destination stage>.<blake2b-128 of the key, hex>

A receiver finds a key's segment by name (no directory scan). The file has
the ring's layout, so it is read and validated by the same code paths: a
ring header (magic, version, capacity = the frame's length, and the *owner's*
producer identity) followed by exactly one data frame whose `position`
field holds the segment's generation (the descriptor names it) and whose
length is stored last::

    0                    RING_HEADER_LENGTH                      file end
    +--- ring header ----+--- one data frame (key, payload, fill) ---+

Writing. The producer creates a private temporary file (O_CREAT|O_EXCL|
O_NOFOLLOW, 0600), reserves its space with fallocate (ENOSPC surfaces here
as `NoSpaceError`, never later as SIGBUS; the temporary is removed, so
nothing half-written is left), fills it through a mapping, and only then
renames it onto the segment name. A reader therefore sees either no file or
a complete one.

Claiming: flock, not rename. Exactly one reader must claim a segment, a
stale descriptor must be able to look at a segment *without* taking it, and
a producer must be able to retire or replace its own unclaimed version
exactly once. The rule that gives all three:

    The segment name is changed (unlinked, renamed away, or replaced by a
    rename) only by a process that holds the exclusive `flock` of the file
    the name currently points at, and has checked under that lock that the
    file is still *at the name* (`stat` of the name shows the inode that
    `fstat` of its descriptor shows).

A reader opens the name, takes the lock *without waiting* (held: answer
BUSY, a receive never waits for another process), validates the frame,
checks the owner is alive, the generation (for a descriptor), decodes the
payload into owned memory, and only then takes the name away: that one step
is the commit, so a reader killed mid-claim leaves the segment claimable by
the next one. A stale descriptor reads the header under the lock and
leaves. The producer's re-put renames onto the name and its retire unlinks
it, each under the lock of the file there (waiting: readers hold it for one
copy), and a file found no longer at the name under the lock means a reader
claimed it first. With rename-to-claim instead, a reader holding a stale
descriptor would have to take the newer segment away before it could see
its generation, and putting it back races with the producer's own retire.

Reuse (hand-back). Making a large file is most of a large put's cost on
tmpfs: fallocate zeroes every page and the first write faults each one into
the new mapping (about 12 ms of a 16 MiB put here), and the reader's unlink
frees them again. So a producer keeps a file of at least `spare_min` bytes
mapped after publishing it (up to `spare_bytes` of them) and writes
RING_STATE_SPARE_WANTED into its header. The reader that claims such a
segment commits by renaming it to the producer's spare name
(``fbspare.<pid>.<start time>.<generation>``) instead of unlinking it (if
that rename fails it unlinks, and the producer forgets the file). A later
put of the same file size renames a spare back to a temporary name (one
process wins that rename), checks it is the inode it kept, and writes into
the mapping it still has: no fallocate, no fresh page. The producer writes
only into a file it took back, and a file leaves a reader's hands only at
its commit, after its last read, so nobody reads what is being rewritten.
A file the producer's own re-put or retire unlinks is forgotten at once;
close removes the spares. Spare names carry the owner, so `shmring gc` and
the last member's close remove those of a killed producer.

Readers never register anything with Python's resource tracker: this module
uses plain open/mmap, never `multiprocessing.shared_memory`.

Budget. A segment is charged `compute_fallback_charge(key, payload_length)`
bytes: what its file occupies on tmpfs, a ring header plus one frame in
whole pages (issue 12: payload bytes undercounted a 1 KiB message 3x), and
a put is admitted exactly when `compute_budget_allows(used, replaced,
charge, budget)` holds, as in
`shmring.spec.connector`. Readers free bytes in another process, so the
producer's `used` can only be too high; before refusing it drops segments a
reader claimed (`refresh`, one stat per segment) and asks again, so it
refuses exactly when the model would.

Every system call goes through the `OsFacade` the caller gives.
"""

from __future__ import annotations

import contextlib
import enum
import errno
import fcntl
import functools
import hashlib
import itertools
import mmap
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, Protocol

from shmring.impl.errors import BackPressureError, BrokenError, CorruptFrameError, NoSpaceError
from shmring.impl.frame_io import (
    SharedWords,
    compute_checksum,
    read_frame_header,
    read_ring_header,
    store_frame_length_release,
    write_data_frame_fields,
    write_ring_header,
)
from shmring.impl.naming import (
    Directory,
    ProducerIdentity,
    as_directory,
    check_private_file,
    validate_stage_name,
)
from shmring.impl.os_seam import FILE_MODE, OPEN_FLAGS_CREATE, OPEN_FLAGS_READONLY, OsFacade
from shmring.spec.connector import (
    compute_budget_allows,
    compute_fallback_charge,
    compute_fallback_length,
)
from shmring.spec.layout import (
    DATA_FRAME_TYPE,
    FRAME_HEADER_LENGTH,
    FRAME_KEY_OFFSET,
    FRAME_STATE_PUBLISHED,
    RING_HEADER_LENGTH,
    RING_MAGIC,
    RING_STATE_OPEN,
    RING_STATE_SPARE_WANTED,
    RING_VERSION,
    compute_frame_length,
    compute_ring_file_length,
)
from shmring.spec.ring import is_prefix_match

Edge = tuple[str, str]  # (source stage, destination stage)

SEGMENT_FILE_PREFIX: Final = "fb"
TEMP_FILE_PREFIX: Final = "fbtmp"
SPARE_FILE_PREFIX: Final = "fbspare"
# Segments of at least this many bytes are kept for reuse (below it a fresh
# file costs less than the bookkeeping), up to the writer's spare budget.
SPARE_MIN_FILE_LENGTH: Final = 1024 * 1024
DEFAULT_SPARE_BYTES: Final = 256 * 1024 * 1024
# The most files kept for reuse at once (each holds a descriptor and a mapping).
_MAX_SPARES: Final = 16
NAME_SEPARATOR: Final = "."
KEY_DIGEST_SIZE: Final = 16  # bytes of blake2b in a segment name

_SEGMENT_PATTERN: Final = re.compile(r"fb\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[0-9a-f]{32}")
_TEMP_PATTERN: Final = re.compile(r"fbtmp\.([0-9]+)\.([0-9]+)\.([0-9]+)")
_SPARE_PATTERN: Final = re.compile(r"fbspare\.([0-9]+)\.([0-9]+)\.([0-9]+)")
_SEGMENT_HEADER_LENGTH: Final = RING_HEADER_LENGTH + FRAME_HEADER_LENGTH
_NO_SPACE_ERRNOS: Final = (errno.ENOSPC, errno.EDQUOT)
# Bounded retries of an open+lock that found the file replaced under it.
_MAX_REOPENS: Final = 16
# The producer waits for a reader's lock (one copy) in short sleeps.
_LOCK_RETRY_SLEEP: Final = 0.0002
_LOCK_WAIT_LIMIT: Final = 30.0

# Generations are unique within a process, so a descriptor of one connector
# can never name another connector's segment of the same process.
_generations: Final = itertools.count(1)


class PayloadPlan(Protocol):
    """What the fallback copies from: an encoding of known size (`codec.EncodePlan`)."""

    nbytes: int

    def write_into(self, buf: Any) -> int: ...


# -- names ---------------------------------------------------------------------


@functools.lru_cache(maxsize=4096)
def segment_file_name(edge: Edge, key: str) -> str:
    """``fb.<src>.<dst>.<digest of key>`` for validated stage names."""
    source, destination = edge
    validate_stage_name(source)
    validate_stage_name(destination)
    digest = hashlib.blake2b(key.encode("utf-8"), digest_size=KEY_DIGEST_SIZE).hexdigest()
    return NAME_SEPARATOR.join((SEGMENT_FILE_PREFIX, source, destination, digest))


def segment_path(directory: str | Directory, edge: Edge, key: str) -> str:
    base = directory.path if isinstance(directory, Directory) else directory
    return os.path.join(base, segment_file_name(edge, key))


def is_segment_file_name(name: str) -> bool:
    return _SEGMENT_PATTERN.fullmatch(name) is not None


def temp_file_name(producer: tuple[int, ...], generation: int) -> str:
    pid, start_time = producer[:2]  # generations are unique per process
    return NAME_SEPARATOR.join((TEMP_FILE_PREFIX, str(pid), str(start_time), str(generation)))


def parse_temp_file_name(name: str) -> ProducerIdentity | None:
    """The producer that made temporary file `name`, or None when it is not one."""
    match = _TEMP_PATTERN.fullmatch(name)
    if match is None:
        return None
    return int(match.group(1)), int(match.group(2))


def spare_file_name(producer: tuple[int, ...], generation: int) -> str:
    """Where a reader hands back the producer's segment of `generation` for reuse."""
    pid, start_time = producer[:2]  # generations are unique per process
    return NAME_SEPARATOR.join((SPARE_FILE_PREFIX, str(pid), str(start_time), str(generation)))


def parse_spare_file_name(name: str) -> ProducerIdentity | None:
    """The producer a handed-back segment `name` belongs to, or None when it is not one."""
    match = _SPARE_PATTERN.fullmatch(name)
    if match is None:
        return None
    return int(match.group(1)), int(match.group(2))


# -- the lock rule -------------------------------------------------------------


class _Busy:
    """Another process holds the segment's lock (a reader answers BUSY)."""


_BUSY: Final = _Busy()


def _open_locked(
    where: Directory, path: str, os_facade: OsFacade, *, wait: bool
) -> int | None | _Busy:
    """Open the file at `path` and hold its exclusive lock, checked still linked.

    None: no file at `path`. `_BUSY`: locked by someone else and `wait` is
    False. Otherwise the descriptor; closing it drops the lock.
    """
    deadline = 0.0
    for _ in range(_MAX_REOPENS):
        try:
            fd = where.open(path, OPEN_FLAGS_READONLY)
        except FileNotFoundError:
            return None
        except OSError as error:
            if error.errno != errno.ELOOP:
                raise
            # Someone planted a symlink at the segment name; it is never followed.
            with contextlib.suppress(FileNotFoundError):
                where.unlink(path)
            raise CorruptFrameError(
                f"fallback segment path is a symlink; removed: path={path!r}"
            ) from error
        try:
            while True:
                try:
                    os_facade.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if not wait:
                        os_facade.close(fd)
                        return _BUSY
                    now = time.monotonic()
                    if not deadline:
                        deadline = now + _LOCK_WAIT_LIMIT
                    elif now > deadline:
                        raise BrokenError(
                            f"fallback segment stays locked: path={path!r} "
                            f"waited={_LOCK_WAIT_LIMIT}s"
                        ) from None
                    time.sleep(_LOCK_RETRY_SLEEP)
            if _is_at(where, path, os_facade.fstat(fd)):
                return fd
        except BaseException:
            os_facade.close(fd)
            raise
        os_facade.close(fd)  # unlinked or replaced under us: look again
    return _BUSY


def _is_at(where: Directory, path: str, info: os.stat_result) -> bool:
    """Whether the file `info` describes is the one linked at `path` now."""
    if info.st_nlink == 0:
        return False
    try:
        here = where.stat(path)
    except FileNotFoundError:
        return False
    return (here.st_dev, here.st_ino) == (info.st_dev, info.st_ino)


def _no_space(error: OSError, what: str) -> NoSpaceError:
    return NoSpaceError(
        f"no space for {what}: {os.strerror(error.errno or 0)}", error.errno or errno.ENOSPC
    )


# -- producer side ---------------------------------------------------------------


@dataclass(frozen=True)
class SegmentRecord:
    """The producer's record of one live segment."""

    edge: Edge
    key: str
    generation: int  # the descriptor's generation, unique in this process
    length: int  # bytes charged to the budget: compute_fallback_charge(key, payload_length)
    payload_length: int  # encoded payload bytes
    path: str  # the segment name
    inode: tuple[int, int]  # (st_dev, st_ino) of our file, to tell it from a later one


class _Spare:
    """A segment file the producer keeps mapped for reuse once a reader hands it back."""

    __slots__ = ("fd", "file_length", "generation", "inode", "mapping", "path", "segment_path")

    def __init__(
        self, fd: int, mapping: mmap.mmap, file_length: int, inode: tuple[int, int]
    ) -> None:
        self.fd = fd
        self.mapping = mapping
        self.file_length = file_length
        self.inode = inode
        self.generation = 0  # of the segment it carries now
        self.path = ""  # its spare name for that generation
        self.segment_path = ""  # the segment name it was published under


@dataclass(frozen=True)
class FallbackStatistics:
    """One producer's fallback, as of its last look."""

    segments: int  # live segments as far as the producer knows (claimed ones drop at refresh)
    used_bytes: int  # bytes charged for them; never above `budget`
    budget: int  # the most live bytes; never changes
    puts: int  # segments published
    refusals: int  # puts refused with BackPressureError
    no_space: int  # puts refused with NoSpaceError
    retired: int  # unclaimed segments this producer removed (re-put, cleanup, close)
    claimed: int  # segments found claimed by readers at refresh or retire
    spares: int = 0  # files kept for reuse (published, or handed back by a reader)
    spare_bytes: int = 0  # their file bytes; never above the writer's spare budget
    reused: int = 0  # puts that wrote into a handed-back file instead of a new one


class FallbackWriter:
    """A producer's fallback segments in one deployment directory.

    Not thread-safe; the owning connector serializes calls. Only this object
    (or a reader's claim) unlinks the segments it published.
    """

    _closed: bool = False

    def __init__(
        self,
        directory: str | Directory,
        producer: tuple[int, ...],
        budget: int,
        os_facade: OsFacade,
        spare_bytes: int = DEFAULT_SPARE_BYTES,
        spare_min: int = SPARE_MIN_FILE_LENGTH,
    ) -> None:
        self._dir = as_directory(directory, os_facade)
        self.directory = self._dir.path
        self.producer = producer
        self.budget = budget
        self.spare_budget = spare_bytes  # the most file bytes kept for reuse
        self.spare_min = spare_min  # smaller files are not kept
        self._os = os_facade
        self._spares: dict[int, _Spare] = {}  # generation -> file kept for reuse
        self._spare_bytes = 0  # == sum of their file lengths
        self._reused = 0
        self._segments: dict[tuple[Edge, str], SegmentRecord] = {}
        self._used = 0  # == sum of record lengths; may include segments readers already claimed
        self._leftovers: set[str] = set()  # temporaries whose unlink failed; retried at close
        self._puts = 0
        self._refusals = 0
        self._no_space = 0
        self._retired = 0
        self._claimed = 0

    # -- budget ------------------------------------------------------------------

    def refresh(self) -> int:
        """Forget segments readers claimed; answer the bytes that freed."""
        freed = 0
        for slot, record in list(self._segments.items()):
            try:
                info = self._dir.stat(record.path)
            except FileNotFoundError:
                info = None
            if info is None or (info.st_dev, info.st_ino) != record.inode:
                del self._segments[slot]
                self._used -= record.length
                self._claimed += 1
                freed += record.length
        return freed

    def used_bytes(self) -> int:
        """Live fallback bytes, after a refresh (what the model calls `fallback_bytes`)."""
        self.refresh()
        return self._used

    def admits(self, edge: Edge, key: str, payload_length: int) -> bool:
        """Whether a put of this size would pass the budget now (refreshing if needed)."""
        charge = compute_fallback_charge(key, payload_length)
        if self._budget_allows(edge, key, charge):
            return True
        self.refresh()
        return self._budget_allows(edge, key, charge)

    def _budget_allows(self, edge: Edge, key: str, length: int) -> bool:
        old = self._segments.get((edge, key))
        replaced = old.length if old is not None else 0
        return compute_budget_allows(self._used, replaced, length, self.budget)

    # -- put -------------------------------------------------------------------

    def put(
        self,
        edge: Edge,
        key: str,
        plan: PayloadPlan,
        before_publish: Callable[[], object] | None = None,
    ) -> SegmentRecord:
        """Publish `plan` as the key's segment, replacing our older one atomically.

        BackPressureError: the budget would be exceeded; nothing changed.
        NoSpaceError: the OS has no room; nothing changed, nothing left.
        `before_publish` runs after the file is complete and before it
        becomes visible (the connector retires the key's ring version there).
        """
        if self._closed:
            raise BrokenError(f"fallback writer is closed: directory={self.directory!r}")
        path = segment_path(self.directory, edge, key)
        payload_length = plan.nbytes
        length = compute_fallback_length(key, payload_length)  # the frame
        charge = compute_fallback_charge(key, payload_length)  # the file's pages
        if not self.admits(edge, key, payload_length):
            self._refusals += 1
            raise BackPressureError(
                f"fallback budget spent: used={self._used} charge={charge} "
                f"budget={self.budget} key={key!r}"
            )
        generation = next(_generations)
        temp = os.path.join(self.directory, temp_file_name(self.producer, generation))
        file_length = compute_ring_file_length(length)
        spare = self._take_spare(file_length, temp)
        keep = spare is not None
        if spare is None:
            spare = self._create_temp(temp, key, file_length)
            keep = self._may_keep(file_length)
        try:
            self._fill(spare.mapping, key, plan, length, generation, keep)
            if not keep:
                self._discard(spare)
        except BaseException:
            self._discard(spare)
            self._remove_temp(temp)
            raise
        try:
            if before_publish is not None:
                before_publish()
            replaced = self._publish(temp, path)
        except BaseException:
            if keep:
                self._discard(spare)
            self._remove_temp(temp)
            raise
        if keep:
            spare.generation = generation
            spare.path = os.path.join(self.directory, spare_file_name(self.producer, generation))
            spare.segment_path = path
            self._spares[generation] = spare
            self._spare_bytes += spare.file_length
        record = SegmentRecord(edge, key, generation, charge, payload_length, path, spare.inode)
        old = self._segments.pop((edge, key), None)
        if old is not None:
            self._used -= old.length
            self._retired += 1
            if replaced == old.inode:  # our rename unlinked it: nobody hands it back
                self._forget_spare(old.generation)
        self._segments[(edge, key)] = record
        self._used += charge
        self._puts += 1
        return record

    # -- files ---------------------------------------------------------------------

    def _may_keep(self, file_length: int) -> bool:
        """Whether a new file of `file_length` bytes is kept for reuse (within the spare budget)."""
        return (
            file_length >= self.spare_min
            and len(self._spares) < _MAX_SPARES
            and self._spare_bytes + file_length <= self.spare_budget
        )

    def _take_spare(self, file_length: int, temp: str) -> _Spare | None:
        """A kept file of `file_length` bytes that a reader handed back, now linked at `temp`.

        A reader hands a claimed segment back by renaming it to its spare
        name; renaming it from there to `temp` takes it back (one process
        wins). Not handed back yet: skipped. Claimed and unlinked instead (a
        reader that could not rename): forgotten.
        """
        for generation, spare in list(self._spares.items()):
            if spare.file_length != file_length:
                continue
            try:
                self._take_back(spare, temp)
            except FileNotFoundError:
                continue  # still published, or claimed and unlinked (then forgotten)
            except OSError:
                continue  # try again at a later put
            del self._spares[generation]
            self._spare_bytes -= spare.file_length
            try:
                here = self._dir.stat(temp)
                ours = (here.st_dev, here.st_ino) == spare.inode
            except OSError:
                ours = False
            if not ours:  # something else was at the spare name: never write into it
                self._discard(spare)
                self._remove_temp(temp)
                continue
            self._reused += 1
            return spare
        return None

    def _take_back(self, spare: _Spare, temp: str) -> None:
        """Rename the spare's handed-back file to `temp`; FileNotFoundError when it is not there.

        A reader's commit is one rename or one unlink, so once the segment
        name is gone the spare name either exists already or never will: one
        more try after seeing the segment gone settles it, and a file
        claimed and unlinked is forgotten.
        """
        try:
            self._dir.rename(spare.path, temp)
            return
        except FileNotFoundError:
            if self._still_out(spare):
                raise
        try:
            self._dir.rename(spare.path, temp)
        except FileNotFoundError:
            self._forget_spare(spare.generation)
            raise

    def _still_out(self, spare: _Spare) -> bool:
        """Whether the spare's file is still published under its segment name (not yet claimed)."""
        try:
            info = self._dir.stat(spare.segment_path)
        except FileNotFoundError:
            return False
        except OSError:
            return True  # cannot tell: keep it rather than orphan a handed-back file
        return (info.st_dev, info.st_ino) == spare.inode

    def _forget_spare(self, generation: int) -> None:
        """Stop keeping the file of `generation` (its segment is gone for good)."""
        spare = self._spares.pop(generation, None)
        if spare is not None:
            self._spare_bytes -= spare.file_length
            self._discard(spare)

    def _discard(self, spare: _Spare) -> None:
        """Unmap and close a file we stop keeping (its names are the caller's business)."""
        mapping, fd = spare.mapping, spare.fd
        spare.fd = -1
        if not mapping.closed:
            mapping.close()
        if fd >= 0:
            with contextlib.suppress(OSError):
                self._os.close(fd)

    def _create_temp(self, temp: str, key: str, file_length: int) -> _Spare:
        """Create, size and map the temporary file; on failure remove it and raise."""
        os_facade = self._os
        try:
            fd = self._dir.open(temp, OPEN_FLAGS_CREATE, FILE_MODE)
        except OSError as error:
            if error.errno in _NO_SPACE_ERRNOS:
                self._no_space += 1
                raise _no_space(error, f"a fallback segment: path={temp!r}") from error
            raise
        try:
            try:
                os_facade.fallocate(fd, file_length)
            except OSError as error:
                if error.errno in _NO_SPACE_ERRNOS:
                    self._no_space += 1
                    raise _no_space(
                        error, f"a fallback segment of {file_length} bytes: key={key!r}"
                    ) from error
                raise
            mapping = os_facade.mmap(fd, file_length)
            try:
                info = os_facade.fstat(fd)
            except BaseException:
                mapping.close()
                raise
        except BaseException:
            with contextlib.suppress(OSError):
                os_facade.close(fd)
            self._remove_temp(temp)
            raise
        return _Spare(fd, mapping, file_length, (info.st_dev, info.st_ino))

    def _fill(
        self,
        mapping: mmap.mmap,
        key: str,
        plan: PayloadPlan,
        length: int,
        generation: int,
        keep: bool,
    ) -> None:
        """Write the segment: header, key, payload, frame fields, the frame length last."""
        key_bytes = key.encode("utf-8")
        payload_length = plan.nbytes
        with memoryview(mapping) as buf:
            words = SharedWords(buf)
            try:
                frame = RING_HEADER_LENGTH
                key_start = frame + FRAME_KEY_OFFSET
                payload_start = key_start + len(key_bytes)
                payload_end = payload_start + payload_length
                store_frame_length_release(
                    words, frame, 0
                )  # a reused file reads "unpublished" first
                buf[key_start:payload_start] = key_bytes
                with buf[payload_start:payload_end] as payload:
                    plan.write_into(payload)
                    checksum = compute_checksum(key_bytes, payload)
                write_ring_header(
                    buf,
                    length,
                    self.producer[0],
                    self.producer[1],
                    RING_STATE_SPARE_WANTED if keep else RING_STATE_OPEN,
                    self.producer[2] if len(self.producer) > 2 else 0,
                )
                write_data_frame_fields(
                    buf,
                    frame,
                    state=FRAME_STATE_PUBLISHED,
                    key_length=len(key_bytes),
                    payload_length=payload_length,
                    position=generation,
                    checksum=checksum,
                )
                store_frame_length_release(words, frame, length)
            finally:
                words.release()

    def _held(self, path: str) -> int | None:
        """The locked file at `path` (None: nothing there), waiting for readers."""
        held = _open_locked(self._dir, path, self._os, wait=True)
        if isinstance(held, _Busy):  # replaced under us again and again: not our key alone
            raise BrokenError(f"fallback segment keeps changing under its producer: path={path!r}")
        return held

    def _publish(self, temp: str, path: str) -> tuple[int, int] | None:
        """Rename `temp` onto `path`, under the lock of whatever file is there.

        Answers the (st_dev, st_ino) of the file the rename replaced, if any.
        """
        held = self._held(path)
        try:
            replaced = None
            if held is not None:
                info = self._os.fstat(held)
                replaced = (info.st_dev, info.st_ino)
            self._dir.rename(temp, path)
            return replaced
        finally:
            if held is not None:
                self._os.close(held)

    def _remove_temp(self, temp: str) -> None:
        try:
            self._dir.unlink(temp)
        except FileNotFoundError:
            pass
        except OSError:
            self._leftovers.add(temp)

    # -- retire ------------------------------------------------------------------

    def _retire(self, slot: tuple[Edge, str]) -> int:
        """Remove our unclaimed segment of `slot`; 0 when a reader claimed it first."""
        record = self._segments.get(slot)
        if record is None:
            return 0
        held = self._held(record.path)
        retired = 0
        if held is not None:
            try:
                info = self._os.fstat(held)
                if (info.st_dev, info.st_ino) == record.inode:
                    self._dir.unlink(record.path)  # a failure keeps the record: retried later
                    retired = 1
                    self._forget_spare(record.generation)
            finally:
                self._os.close(held)
        del self._segments[slot]
        self._used -= record.length
        if retired:
            self._retired += 1
        else:
            self._claimed += 1
        return retired

    def retire(self, edge: Edge, key: str) -> int:
        """Retire the key's unclaimed segment on `edge`; answer 0 or 1."""
        return self._retire((edge, key))

    def retire_key(self, key: str) -> int:
        """Retire the key's unclaimed segments on every edge."""
        return sum(self._retire(slot) for slot in sorted(self._segments) if slot[1] == key)

    def retire_prefix(self, prefix: str) -> int:
        """Retire every unclaimed segment whose key is `prefix` + digits, on every edge."""
        slots = [slot for slot in sorted(self._segments) if is_prefix_match(prefix, slot[1])]
        return sum(self._retire(slot) for slot in slots)

    def has(self, edge: Edge, key: str) -> bool:
        """Whether we hold a segment for the key (it may have been claimed since)."""
        return (edge, key) in self._segments

    def close(self) -> int:
        """Retire every unclaimed segment and drop leftovers. Idempotent; answers how many."""
        retired = 0
        for slot in sorted(self._segments):
            retired += self._retire(slot)
        for generation in sorted(self._spares):
            spare = self._spares[generation]
            self._forget_spare(generation)
            self._remove_temp(spare.path)  # handed back: remove it (a failure is retried below)
        for temp in sorted(self._leftovers):
            with contextlib.suppress(FileNotFoundError):
                self._dir.unlink(temp)
            self._leftovers.discard(temp)
        self._closed = True
        return retired

    def statistics(self) -> FallbackStatistics:
        return FallbackStatistics(
            segments=len(self._segments),
            used_bytes=self._used,
            budget=self.budget,
            puts=self._puts,
            refusals=self._refusals,
            no_space=self._no_space,
            retired=self._retired,
            claimed=self._claimed,
            spares=len(self._spares),
            spare_bytes=self._spare_bytes,
            reused=self._reused,
        )


# -- reader side -----------------------------------------------------------------


class ClaimStatus(enum.Enum):
    DELIVERED = "delivered"  # claimed by this reader; the segment is gone
    NOT_FOUND = "not found"  # no segment for the key
    STALE = "stale"  # a segment is there, but not the descriptor's (owner or generation)
    BUSY = "busy"  # another process holds its lock; nothing changed, retry later
    OWNER_GONE = "owner gone"  # its producer is not running; the segment was removed


@dataclass(frozen=True)
class Claim:
    status: ClaimStatus
    value: Any = None  # the decoded, independently owned payload (DELIVERED)
    payload_length: int = 0  # encoded payload bytes (DELIVERED)
    owner: tuple[int, ...] | None = None  # producer identity recorded in the segment
    generation: int = 0  # the segment's generation


_NOT_FOUND: Final = Claim(ClaimStatus.NOT_FOUND)
_BUSY_CLAIM: Final = Claim(ClaimStatus.BUSY)

MappingKey = tuple[int, int, int]  # (st_dev, st_ino, st_size) of a segment file


class SegmentMappings:
    """A reader's mappings of handed-back segment files, kept between its claims.

    A file its producer reuses comes back under another segment name with
    new contents; mapping it afresh would fault every page in again (about
    1 ms per 16 MiB here) and unmapping it costs half that. While this
    object holds a mapping its inode cannot be freed, so (st_dev, st_ino,
    size) names the same file for as long as the entry lives; contents are
    validated under the lock at every claim as usual. Bounded like a
    producer's spares (16 mappings, 256 MiB by default), least recently used
    evicted: they map the same pages as the producer's kept files, but pin
    those of files the producer has since dropped until evicted or
    `close()` (the connector's close). Not thread-safe.
    """

    def __init__(self, limit: int = _MAX_SPARES, limit_bytes: int = DEFAULT_SPARE_BYTES) -> None:
        self.limit = limit
        self.limit_bytes = limit_bytes
        self._entries: dict[MappingKey, mmap.mmap] = {}  # in use order, oldest first
        self._bytes = 0
        self.hits = 0

    def take(self, key: MappingKey) -> mmap.mmap | None:
        """The mapping of `key`, removed from the cache (give it back with `keep`)."""
        mapping = self._entries.pop(key, None)
        if mapping is not None:
            self._bytes -= key[2]
            self.hits += 1
        return mapping

    def keep(self, key: MappingKey, mapping: mmap.mmap) -> None:
        """Hold `mapping` for the next claim of the same file (or close it: too big)."""
        if key[2] > self.limit_bytes or self.limit <= 0:
            mapping.close()
            return
        while self._entries and (
            len(self._entries) >= self.limit or self._bytes + key[2] > self.limit_bytes
        ):
            oldest = next(iter(self._entries))
            self._bytes -= oldest[2]
            self._entries.pop(oldest).close()
        self._entries[key] = mapping
        self._bytes += key[2]

    def __len__(self) -> int:
        return len(self._entries)

    def close(self) -> None:
        """Unmap everything. Idempotent."""
        while self._entries:
            _, mapping = self._entries.popitem()
            mapping.close()
        self._bytes = 0


def claim_segment(
    directory: str | Directory,
    edge: Edge,
    key: str,
    *,
    os_facade: OsFacade,
    is_alive: Callable[[tuple[int, ...]], bool],
    decode: Callable[[memoryview], Any],
    owner: tuple[int, ...] | None = None,
    generation: int | None = None,
    mappings: SegmentMappings | None = None,
) -> Claim:
    """Claim the key's segment on `edge`, exactly once among all readers.

    `mappings` (optional) keeps this reader's mappings of files their
    producer reuses, so a claim of a handed-back file maps nothing.

    With `owner` and `generation` (a descriptor) only that exact segment is
    claimed; another one there answers STALE and is left alone. A segment
    whose producer is not running is removed and never delivered
    (OWNER_GONE). `decode` gets a read-only view *borrowed* from the mapping
    for the duration of the call and must return independently owned
    memory. A corrupt segment is removed and reported (CorruptFrameError).
    """
    where = as_directory(directory, os_facade)
    path = segment_path(where, edge, key)
    held = _open_locked(where, path, os_facade, wait=False)
    if held is None:
        return _NOT_FOUND
    if isinstance(held, _Busy):
        return _BUSY_CLAIM
    try:
        return _claim_locked(
            where, path, held, key, os_facade, is_alive, decode, owner, generation, mappings
        )
    finally:
        if mappings is not None:
            # A kept mapping holds a duplicate of this open file description,
            # which would keep the lock held after the close below.
            os_facade.flock(held, fcntl.LOCK_UN)
        os_facade.close(held)  # drops the lock


def _claim_locked(
    where: Directory,
    path: str,
    fd: int,
    key: str,
    os_facade: OsFacade,
    is_alive: Callable[[tuple[int, ...]], bool],
    decode: Callable[[memoryview], Any],
    owner: tuple[int, ...] | None,
    generation: int | None,
    mappings: SegmentMappings | None,
) -> Claim:
    info = os_facade.fstat(fd)
    untrusted = check_private_file(path, info)
    if untrusted is not None:
        # Not made by us (another uid planted it, or its mode was changed):
        # its bytes are never read. Removed if we may; never delivered.
        with contextlib.suppress(OSError):
            where.unlink(path)
        raise CorruptFrameError(f"fallback segment is not trusted: {untrusted}")
    size = info.st_size
    if size < _SEGMENT_HEADER_LENGTH:
        where.unlink(path)
        raise CorruptFrameError(
            f"fallback segment shorter than its headers: size={size} path={path!r}"
        )
    mapping_key = (info.st_dev, info.st_ino, size)
    mapping = mappings.take(mapping_key) if mappings is not None else None
    if mapping is None:
        mapping = os_facade.mmap(fd, size, writable=False)
    handed_back = False
    try:
        with memoryview(mapping) as buf:
            key_bytes = key.encode("utf-8")
            problem, producer, frame_generation, payload_length, checksum, state = _check_segment(
                buf, size, key_bytes
            )
            if problem is not None:
                where.unlink(path)
                raise CorruptFrameError(
                    f"corrupted fallback segment: {problem}; removed; path={path!r}"
                )
            if (owner is not None and producer != owner) or (
                generation is not None and frame_generation != generation
            ):
                return Claim(ClaimStatus.STALE, owner=producer, generation=frame_generation)
            if not is_alive(producer):
                where.unlink(path)
                return Claim(ClaimStatus.OWNER_GONE, owner=producer, generation=frame_generation)
            payload_start = RING_HEADER_LENGTH + FRAME_KEY_OFFSET + len(key_bytes)
            with buf[payload_start : payload_start + payload_length] as payload:
                if compute_checksum(key_bytes, payload) != checksum:
                    where.unlink(path)
                    raise CorruptFrameError(
                        f"fallback segment checksum mismatch: checksum={checksum:#010x}; "
                        f"removed; path={path!r}"
                    )
                try:
                    value = decode(payload)
                except CorruptFrameError:
                    where.unlink(path)
                    raise
            handed_back = _commit(where, path, state, producer, frame_generation)
    finally:
        if handed_back and mappings is not None:
            mappings.keep(mapping_key, mapping)  # its producer will send it again
        else:
            mapping.close()
    return Claim(ClaimStatus.DELIVERED, value, payload_length, producer, frame_generation)


def _commit(
    where: Directory, path: str, state: int, producer: tuple[int, ...], generation: int
) -> bool:
    """Take the segment name away: from here the claimed segment is this reader's alone.

    A segment whose producer keeps it (RING_STATE_SPARE_WANTED) is handed
    back by renaming it to the producer's spare name; any other, or one
    whose rename fails, is unlinked. Either is one atomic step, done after
    the payload was copied out, so a reader killed before it leaves the
    segment claimable by the next one. Answers whether it was handed back.
    """
    if state == RING_STATE_SPARE_WANTED:
        try:
            where.rename(path, spare_file_name(producer, generation))
            return True
        except OSError:
            pass  # unlinked below instead; the producer forgets the file
    where.unlink(path)
    return False


def _check_segment(
    buf: memoryview, size: int, key_bytes: bytes
) -> tuple[str | None, tuple[int, ...], int, int, int, int]:
    """(problem or None, owner, generation, payload length, checksum, ring state) of a segment."""
    header = read_ring_header(buf)
    owner = (header.producer_pid, header.producer_start_time, header.producer_instance)
    if header.magic != RING_MAGIC:
        return f"bad magic={header.magic:#x}", owner, 0, 0, 0, 0
    if header.version != RING_VERSION or header.header_length != RING_HEADER_LENGTH:
        return (
            f"bad version={header.version} header_length={header.header_length}",
            owner,
            0,
            0,
            0,
            0,
        )
    if compute_ring_file_length(header.capacity) != size:
        return f"size={size} does not match frame length={header.capacity}", owner, 0, 0, 0, 0
    frame = read_frame_header(buf, RING_HEADER_LENGTH)
    if frame.length != header.capacity:
        return (
            f"frame length={frame.length} differs from capacity={header.capacity}",
            owner,
            0,
            0,
            0,
            0,
        )
    if frame.frame_type != DATA_FRAME_TYPE or frame.state != FRAME_STATE_PUBLISHED:
        return f"bad frame type={frame.frame_type} state={frame.state}", owner, 0, 0, 0, 0
    if compute_frame_length(frame.key_length, frame.payload_length) != frame.length:
        return (
            f"lengths disagree: length={frame.length} key_length={frame.key_length} "
            f"payload_length={frame.payload_length}",
            owner,
            0,
            0,
            0,
            0,
        )
    key_start = RING_HEADER_LENGTH + FRAME_KEY_OFFSET
    if (
        frame.key_length != len(key_bytes)
        or buf[key_start : key_start + frame.key_length] != key_bytes
    ):
        return "the segment holds another key", owner, 0, 0, 0, 0
    return None, owner, frame.position, frame.payload_length, frame.checksum, header.state


def remove_if_orphaned(
    directory: str | Directory,
    path: str,
    os_facade: OsFacade,
    is_alive: Callable[[tuple[int, ...]], bool],
) -> int:
    """Remove the segment `path` (a name in `directory`) if its owner is not running; 0 or 1."""
    where = as_directory(directory, os_facade)
    held = _open_locked(where, path, os_facade, wait=False)
    if not isinstance(held, int):
        return 0
    try:
        header = os_facade.read(held, RING_HEADER_LENGTH)
        if len(header) < RING_HEADER_LENGTH:
            return 0
        ring_header = read_ring_header(memoryview(header))
        if ring_header.magic == RING_MAGIC and is_alive(
            (ring_header.producer_pid, ring_header.producer_start_time)
        ):
            return 0
        where.unlink(path)
        return 1
    finally:
        os_facade.close(held)


def charged_length(key: str, payload_length: int) -> int:
    """Bytes a segment is charged (the model's `compute_fallback_charge`: its file's pages)."""
    return compute_fallback_charge(key, payload_length)


__all__ = [
    "DEFAULT_SPARE_BYTES",
    "SEGMENT_FILE_PREFIX",
    "SPARE_FILE_PREFIX",
    "TEMP_FILE_PREFIX",
    "Claim",
    "ClaimStatus",
    "FallbackStatistics",
    "FallbackWriter",
    "PayloadPlan",
    "SegmentMappings",
    "SegmentRecord",
    "charged_length",
    "claim_segment",
    "is_segment_file_name",
    "parse_spare_file_name",
    "parse_temp_file_name",
    "remove_if_orphaned",
    "segment_file_name",
    "segment_path",
    "spare_file_name",
    "temp_file_name",
]
