"""The readers' side of the fallback: claiming a segment exactly once, and the gc's removal.

Design rationale (the package docstring has the whole story). A reader opens
the segment name, takes the lock *without waiting* (held: BUSY, a receive
never waits for another process), validates the frame, checks the owner is
alive and the generation (for a descriptor), decodes the payload into owned
memory, and only then takes the name away (`_commit`): that one step is the
commit, so a reader killed mid-claim leaves the segment claimable by the
next one. `claim_segment` is the fallback half of `spec.connector.process_get`
(and of a descriptor's get in `spec.discovery`); `remove_if_orphaned` is the
segment half of `spec.discovery.process_reclaim`. A reader keeps the
mappings of files handed back for reuse (`SegmentMappings`).

Readers never register anything with Python's resource tracker: plain
open/mmap, never `multiprocessing.shared_memory`. Every system call goes
through the `OsFacade` the caller gives.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import mmap
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from ...spec import status as _status
from ...spec.layout import (
    CODEC_FRAMED_MARKER,
    COHORT_ENVELOPE_LENGTH,
    COHORT_ENVELOPE_VERSION,
    FRAME_HEADER_LENGTH,
    FRAME_KEY_OFFSET,
    FRAME_STATE_RETIRED,
    RING_HEADER_LENGTH,
    RING_STATE_OPEN,
    RING_STATE_SPARE_WANTED,
)
from ..directory import Directory, as_directory, check_private_file
from ..errors import CorruptFrameError, UnsupportedPayloadError
from ..frame_io import compute_checksum, read_frame_header
from ..lifecycle import signals_deferred
from ..names import (
    Edge,
    fallback_segment_path,
    fallback_spare_file_name,
    parse_segment_owner,
)
from ..os_seam import OsFacade
from ..ring.borrow import BorrowedPayload
from ..ring.frames import segment_problem
from .segment import BUSY, DEFAULT_SPARE_BYTES, MAX_SPARES, close_locked, open_locked

_SEGMENT_HEADER_LENGTH: Final = RING_HEADER_LENGTH + FRAME_HEADER_LENGTH


ClaimStatus = (
    _status.GetStatus
)  # DELIVERED, NOT_FOUND, STALE, BUSY, PRODUCER_GONE (`spec.status`: one vocabulary)


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

    def __init__(self, limit: int = MAX_SPARES, limit_bytes: int = DEFAULT_SPARE_BYTES) -> None:
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


@signals_deferred  # open, lock, copy, unlink, unlock, close: one section (`lifecycle`)
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
    borrow: Callable[[BorrowedPayload], Any] | None = None,
    member: Callable[[tuple[int, ...], memoryview], Any] | None = None,
) -> Claim:
    """Claim the key's segment on `edge`, exactly once among all readers.

    `member(owner, payload)` decodes a publication cohort's member (a
    payload behind a cohort envelope, `spec.layout`) in place of `decode` /
    `borrow`; while its cohort is not committed it raises, and the segment
    is left exactly as it was (the connector's `cohort.CohortPending`).

    `borrow` (a connector's borrowed get) replaces `decode`: it gets the
    payload in place as a `BorrowedPayload` over the segment's mapping. If
    what it returned holds the payload, the mapping becomes the payload's
    (closed when the last view dies) and the segment is unlinked, never
    handed back for reuse, so nobody writes the pages the views read;
    otherwise the claim ends as a decoding one does.

    `mappings` (optional) keeps this reader's mappings of files their
    producer reuses, so a claim of a handed-back file maps nothing.

    With `owner` and `generation` (a descriptor) only that exact segment is
    claimed; another one there answers STALE and is left alone. A segment
    whose producer is not running is removed and never delivered
    (PRODUCER_GONE). `decode` gets a read-only view *borrowed* from the mapping
    for the duration of the call and must return independently owned
    memory. A corrupt segment is removed and reported (CorruptFrameError).
    """
    where = as_directory(directory, os_facade)
    path = fallback_segment_path(where, edge, key)
    held = open_locked(where, path, os_facade, wait=False)
    if held is None:
        return _NOT_FOUND
    if held is BUSY:  # no call between open_locked and the try (issue 24): a lock never leaks
        return _BUSY_CLAIM
    try:
        return _claim_locked(
            where,
            path,
            held,
            key,
            os_facade,
            is_alive,
            decode,
            owner,
            generation,
            mappings,
            borrow,
            member,
        )
    finally:
        # A kept mapping holds a duplicate of this open file description, and so
        # does a mapping an interrupted claim's frame still holds: unlock, then close.
        # Inline and retried (issue 24): a signal handler's exception can come at the
        # entry of any call, and a descriptor lost here keeps the lock for good.
        pending: BaseException | None = None
        tries = 3
        while tries:
            tries -= 1
            try:
                _unlock_and_close(held, os_facade)
                break
            except BaseException as error:  # noqa: BLE001 - raised below, once it is released
                if pending is None:
                    pending = error
        if pending is not None:
            try:
                raise pending
            finally:
                pending = None  # no frame -> exception -> traceback -> frame cycle


def _unlock_and_close(fd: int, os_facade: OsFacade) -> None:
    """Drop the segment's lock and close `fd`; again after an interrupted try (EBADF: done)."""
    try:
        os_facade.flock(fd, fcntl.LOCK_UN)
    except OSError as error:
        if error.errno == errno.EBADF:
            return  # an interrupted earlier try closed it
        raise
    os_facade.close(fd)


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
    borrow: Callable[[BorrowedPayload], Any] | None = None,
    member: Callable[[tuple[int, ...], memoryview], Any] | None = None,
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
    lender = None if borrow is None else _Lender(mapping, borrow, path)
    if lender is not None:
        decode = lender  # lends the payload in place instead of decoding a copy
    try:
        with memoryview(mapping) as buf:
            if read_frame_header(buf, RING_HEADER_LENGTH).state == FRAME_STATE_RETIRED:
                # Its producer retired it without the lock (held past its bound) or
                # could not unlink it: gone for every get; removed here, under our lock.
                with contextlib.suppress(OSError):
                    where.unlink(path)
                return _NOT_FOUND
            key_bytes = key.encode("utf-8")
            # The ring's header and frame checks (`ring.frames.segment_problem`): a
            # segment is a ring header whose capacity is its one frame's length.
            problem, header, fields = segment_problem(buf, size, key_bytes)
            if problem is not None:
                where.unlink(path)
                raise CorruptFrameError(
                    f"corrupted fallback segment: {problem}; removed; path={path!r}"
                )
            assert fields is not None  # no problem: its frame was read
            producer = (header.producer_pid, header.producer_start_time, header.producer_instance)
            _, _, _, _, payload_length, frame_generation, checksum = fields
            state = header.state
            if (owner is not None and producer != owner) or (
                generation is not None and frame_generation != generation
            ):
                return Claim(ClaimStatus.STALE, owner=producer, generation=frame_generation)
            if not is_alive(producer):
                where.unlink(path)
                return Claim(ClaimStatus.PRODUCER_GONE, owner=producer, generation=frame_generation)
            payload_start = RING_HEADER_LENGTH + FRAME_KEY_OFFSET + len(key_bytes)
            with buf[payload_start : payload_start + payload_length] as payload:
                if compute_checksum(key_bytes, payload) != checksum:
                    where.unlink(path)
                    raise CorruptFrameError(
                        f"fallback segment checksum mismatch: checksum={checksum:#010x}; "
                        f"removed; path={path!r}"
                    )
                if member is not None and _is_member(payload):
                    decode = functools.partial(member, producer)  # owned: nothing of it lent
                try:
                    value = decode(payload)
                except (CorruptFrameError, UnsupportedPayloadError):
                    # It never decodes: consumed, file and all (vllm-omni removes it too);
                    # the error reaches the caller.
                    where.unlink(path)
                    raise
            if lender is not None and lender.lent:
                state = RING_STATE_OPEN  # unlinked, never handed back: its pages are the views'
            handed_back = _commit(where, path, state, producer, frame_generation)
    finally:
        if lender is not None and lender.lent:
            pass  # the payload closes the mapping when its last view dies
        elif handed_back and mappings is not None:
            mappings.keep(mapping_key, mapping)  # its producer will send it again
        else:
            # BufferError: a failed borrow left views, whose payload closes it after them.
            with contextlib.suppress(BufferError):
                mapping.close()
    return Claim(ClaimStatus.DELIVERED, value, payload_length, producer, frame_generation)


def _is_member(payload: memoryview) -> bool:
    """Whether a segment's payload starts with a publication cohort's envelope."""
    return (
        len(payload) >= COHORT_ENVELOPE_LENGTH
        and payload[0] == CODEC_FRAMED_MARKER
        and payload[1] == COHORT_ENVELOPE_VERSION
    )


class _Lender:
    """A claim's `decode` for a borrowed get: `borrow` of the payload in place, over the mapping.

    `lent`: what `borrow` returned holds the payload; the mapping is then the
    payload's (closed when the last view dies), no longer the claim's.
    """

    def __init__(
        self, mapping: mmap.mmap, borrow: Callable[[BorrowedPayload], Any], path: str
    ) -> None:
        self.mapping = mapping
        self.borrow = borrow
        self.path = path
        self.lent = False

    def __call__(self, view: memoryview) -> Any:
        import numpy  # a borrowed get decodes with numpy anyway (`codec.decode_borrowed`)

        # `view` is the payload's place in the mapping (released when the claim's
        # block ends); what the payload pins is an export of the mapping itself.
        keep = numpy.frombuffer(self.mapping, numpy.uint8)  # read-only: the segment is mapped so
        payload = BorrowedPayload(
            keep,
            int(numpy.frombuffer(view, numpy.uint8).ctypes.data),
            view.nbytes,
            mapping_to_close=self.mapping,
            label=self.path,
        )
        del keep
        baseline = sys.getrefcount(payload)
        try:
            value = self.borrow(payload)
        except BaseException:
            self.lent = sys.getrefcount(payload) > baseline  # views outlive the failure
            if not self.lent:
                payload.disown()
            raise
        self.lent = sys.getrefcount(payload) > baseline
        if not self.lent:
            payload.disown()  # nothing borrowed: the claim ends as a decoding one does
        return value


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
            where.rename(path, fallback_spare_file_name(producer, generation))
            return True
        except OSError:
            pass  # unlinked below instead; the producer forgets the file
    where.unlink(path)
    return False


@signals_deferred
def remove_if_orphaned(
    directory: str | Directory,
    path: str,
    os_facade: OsFacade,
    is_alive: Callable[[tuple[int, ...]], bool],
) -> int:
    """Remove the segment `path` (a name in `directory`) if its owner is not running; 0 or 1."""
    where = as_directory(directory, os_facade)
    held = open_locked(where, path, os_facade, wait=False)
    if held is None or held is BUSY:  # no call before the try (issue 24)
        return 0
    try:
        header = os_facade.read(held, RING_HEADER_LENGTH)
        if len(header) < RING_HEADER_LENGTH:
            return 0
        owner = parse_segment_owner(header)  # None: not a ring's magic, nobody's
        if owner is not None and is_alive(owner):
            return 0
        where.unlink(path)
        return 1
    finally:
        close_locked(os_facade, held)


__all__ = [
    "Claim",
    "ClaimStatus",
    "MappingKey",
    "SegmentMappings",
    "claim_segment",
    "remove_if_orphaned",
]
