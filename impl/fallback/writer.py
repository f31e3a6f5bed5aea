"""The producer's side of the fallback: writing segments, and keeping files for reuse.

Design rationale (the package docstring has the whole story). A put writes
a private temporary file (O_CREAT|O_EXCL|O_NOFOLLOW, 0600), reserves its
space with fallocate (ENOSPC surfaces here as `NoSpaceError`, never later as
SIGBUS), fills it through a mapping, and only then renames it onto the
segment name under the lock of whatever file is there
(`shmring.impl.fallback.segment.open_locked`): a reader sees either no
file or a complete one. The budget is `spec.connector`'s
(`compute_fallback_charge`, `compute_budget_allows`): the put is
`spec.connector.process_put` taking the fallback route, `retire*` its
retire of a key's fallback version. A file of at least `spare_min` bytes
stays mapped after its publication (a spare): the reader that claims it
hands it back by renaming it to the spare name, and a later put of the same
size writes into it again without a fresh page.

Waits are bounded (issue 27, `impl.locks`): a retire whose segment another
process keeps locked past `PRODUCER_LOCK_WAIT_SECONDS` marks the segment
retired in its frame state without the lock (a reader that claims it
afterwards finds it retired and removes it) and leaves the unlink for
later; so does a retire whose unlink fails (EPERM, EIO, ...). Those files
are removed by `reap` (the connector's `reap_consumed()`, its next
producer call, close), retried with a back-off, never raised, counted in
`statistics()`. A re-put that must replace a segment held locked past the
bound fails (`BrokenError`) before anything changed.

The steps that keep files for reuse live in `spares.py` (`SpareStock`), the
retires and the deferred removals in `retiring.py` (`Retiring`); both are
mixins of `FallbackWriter`, which owns their state.

Every system call goes through the `OsFacade` the caller gives.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import mmap
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, Protocol

from ...spec.connector import (
    compute_budget_allows,
    compute_fallback_charge,
    compute_fallback_length,
)
from ...spec.layout import (
    FRAME_KEY_OFFSET,
    FRAME_STATE_PUBLISHED,
    RING_HEADER_LENGTH,
    RING_STATE_OPEN,
    RING_STATE_SPARE_WANTED,
    compute_ring_file_length,
)
from ..directory import Directory, as_directory
from ..errors import BackPressureError, BrokenError, ClosedError, NoSpaceError
from ..frame_io import (
    SharedWords,
    compute_checksum,
    store_frame_length_release,
    write_data_frame_fields,
    write_ring_header,
)
from ..lifecycle import signals_deferred
from ..locks import PRODUCER_LOCK_WAIT_SECONDS
from ..names import (
    Edge,
    fallback_segment_path,
    fallback_spare_file_name,
    fallback_temp_file_name,
)
from ..os_seam import FILE_MODE, OPEN_FLAGS_CREATE, OsFacade
from .retiring import Deferred, Retiring
from .segment import (
    BUSY,
    DEFAULT_SPARE_BYTES,
    SPARE_MIN_FILE_LENGTH,
    close_locked,
    open_locked,
)
from .spares import Spare, SpareStock

_NO_SPACE_ERRNOS: Final = (errno.ENOSPC, errno.EDQUOT)

# Generations are unique within a process, so a descriptor of one connector
# can never name another connector's segment of the same process.
_generations: Final = itertools.count(1)


class PayloadPlan(Protocol):
    """What the fallback copies from: an encoding of known size (`codec.EncodePlan`)."""

    nbytes: int

    def write_into(self, buf: Any) -> int: ...


def _no_space(error: OSError, what: str) -> NoSpaceError:
    return NoSpaceError(
        f"no space for {what}: {os.strerror(error.errno or 0)}", error.errno or errno.ENOSPC
    )


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
    deferred: int = 0  # retired segments whose file is still there (removed by `reap`)
    deferred_bytes: int = 0  # their charged bytes (outside the budget: they are retired)
    deferred_total: int = 0  # retires whose removal was deferred (busy lock, failed unlink)
    unlink_failures: int = 0  # unlinks that failed (each kept and retried)
    unlink_retries: int = 0  # removals tried again by `reap`


class FallbackWriter(SpareStock, Retiring):
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
        self._spares: dict[int, Spare] = {}  # generation -> file kept for reuse
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
        self._deferred: dict[str, Deferred] = {}  # path -> retired segment still to remove
        self._deferred_total = 0
        self._unlink_failures = 0
        self._unlink_retries = 0

    # -- budget ------------------------------------------------------------------

    @signals_deferred
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

    @signals_deferred
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
            raise ClosedError(f"fallback writer is closed: directory={self.directory!r}")
        path = fallback_segment_path(self.directory, edge, key)
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
        temp = os.path.join(self.directory, fallback_temp_file_name(self.producer, generation))
        file_length = compute_ring_file_length(length)
        # The temporary is recorded before it can exist (issue 24): an exception raised
        # anywhere below (a signal handler's too) leaves it findable by close, and its
        # name carries our identity for survivors' reclaim and gc once we are dead.
        self._leftovers.add(temp)
        spare: Spare | None = None
        keep = False
        try:
            spare = self._take_spare(file_length, temp)
            keep = spare is not None
            if spare is None:
                spare = self._create_temp(temp, key, file_length)
                keep = self._may_keep(file_length)
            self._fill(spare.mapping, key, plan, length, generation, keep)
            if not keep:
                self._discard(spare)
            replaced = self._publish(temp, path, before_publish)
        except BaseException:
            # Cleanup never replaces what is propagating (issue 24: a BufferError from a
            # mapping still exported by the interrupted frame did, and left the file).
            if spare is not None:
                self._discard_quietly(spare)
            self._remove_temp(temp)
            raise
        self._leftovers.discard(temp)  # renamed onto the segment name: nothing at `temp` now
        if keep:
            spare.generation = generation
            spare.path = os.path.join(
                self.directory, fallback_spare_file_name(self.producer, generation)
            )
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

    def _create_temp(self, temp: str, key: str, file_length: int) -> Spare:
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
        return Spare(fd, mapping, file_length, (info.st_dev, info.st_ino))

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

    def _publish(
        self, temp: str, path: str, before_publish: Callable[[], object] | None
    ) -> tuple[int, int] | None:
        """Rename `temp` onto `path`, under the lock of whatever file is there.

        `before_publish` runs once the lock is held, just before the rename.
        Answers the (st_dev, st_ino) of the file the rename replaced, if
        any. BrokenError, with nothing changed, when another process keeps
        that file locked past the producer's bound.
        """
        held = open_locked(self._dir, path, self._os, wait=True)
        if held is BUSY:  # no call before the try (issue 24): a lock never leaks
            raise BrokenError(
                f"fallback segment locked by another process for more than "
                f"{PRODUCER_LOCK_WAIT_SECONDS}s; nothing published: path={path!r}"
            )
        try:
            replaced = None
            if held is not None:
                info = self._os.fstat(held)
                replaced = (info.st_dev, info.st_ino)
            if before_publish is not None:
                before_publish()
            self._dir.rename(temp, path)
            deferred = self._deferred.get(path)
            if deferred is not None and deferred.inode == replaced:
                del self._deferred[path]  # the rename took its name away
            return replaced
        finally:
            if held is not None:
                close_locked(self._os, held)

    def has(self, edge: Edge, key: str) -> bool:
        """Whether we hold a segment for the key (it may have been claimed since)."""
        return (edge, key) in self._segments

    @signals_deferred
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
            try:
                self._dir.unlink(temp)
            except FileNotFoundError:
                pass
            except OSError:
                self._unlink_failures += 1
                continue  # kept: the next close retries it
            self._leftovers.discard(temp)
        self.reap(force=True)  # what is still locked or failing stays for the next close
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
            deferred=len(self._deferred),
            deferred_bytes=sum(deferred.length for deferred in self._deferred.values()),
            deferred_total=self._deferred_total,
            unlink_failures=self._unlink_failures,
            unlink_retries=self._unlink_retries,
        )


__all__ = ["FallbackStatistics", "FallbackWriter", "PayloadPlan", "SegmentRecord"]
