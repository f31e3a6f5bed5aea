"""The host ring channel: one producer's mmap ring of frames on one edge.

Design rationale. The model (`shmring.spec.ring`) says *what* a ring does;
this module does it over a POSIX shared-memory file that several processes
map. The producer (`RingChannel`) creates and owns the file; readers
(`RingReader`) map it without owning it. Layout numbers come from
`shmring.spec.layout`, decisions (admission, padding, space, prefix match)
from the model's pure helpers, and every header load/store from
`shmring.impl.frame_io`, so the model and this file cannot drift apart on a
number.

Who writes what
---------------
* Only the producer writes frame bytes, head, tail, the wake-up sequence and
  the ring state. It keeps its own record of the frames between tail and
  head (position, length, key), so it never trusts lengths read back from
  shared memory.
* A frame's *state* is the one field several processes write. States only
  move forward: PUBLISHED -> CLAIMED -> DONE, PUBLISHED -> DONE, PUBLISHED ->
  RETIRED; DONE and RETIRED are final. Every change *out of* PUBLISHED (a
  reader's claim, the producer's retire) happens under an exclusive `flock`
  of the ring file, so a frame is claimed or retired exactly once. CLAIMED ->
  DONE is made only by the lease holder and needs no lock.
* Readers take the lock with LOCK_NB and answer BUSY when it is held: a
  receive never waits for another process. The producer may block briefly
  (a reader holds the lock only to check a header and copy one payload).

Publication (why a reader never sees a torn frame, even after SIGKILL)
-----------------------------------------------------------------------
A put writes, in this order: the slot's length field is zeroed; key and
payload bytes (and zero fill); the header fields other than length; the
length (`store_frame_length_release`); then head (`store_head_release`);
then the wake-up sequence. Readers trust only frames that start below the
head they loaded (acquire) *and* have a non-zero, self-consistent length.

* Killed before the head store: head still ends before the new frame, so no
  reader looks at it, whatever state its bytes are in. The zeroed length is
  a second guard for anyone who walks past head: it reads "nothing here".
* Killed after the head store: the frame (and any padding before it) was
  complete, because head is stored after the last byte of both.
* Padding and the frame it precedes are covered by one head store.
Stores become visible in program order (x86-64 TSO; see `frame_io` for the
aarch64 argument), which is all the argument needs.

Reclaim and overwrite (why a lock-free scan never reads recycled bytes)
-----------------------------------------------------------------------
Reclaim advances the tail over DONE, RETIRED and padding frames and stores
the tail *before* the put writes into the space it freed. Any byte of the
frame at position p can only be rewritten as part of position p + capacity
or later, which requires tail > p first. So a reader that reads a frame at
p and *then* loads tail <= p knows no overwrite had begun when it read:
the tail acts as a sequence lock. Readers re-check the tail after every
header they read without the lock and after every header they check under
it; a frame that moved under them is STALE / NOT_FOUND (or the scan restarts
at the new tail), never a false corruption report and never a torn value.
A PUBLISHED or CLAIMED frame is never reclaimed, so once a reader has seen
it PUBLISHED under the lock its bytes stay put until the reader marks it.

Cheap empty polls
-----------------
A reader keeps an index key -> position of the frames it saw PUBLISHED,
built by an incremental lock-free scan from where it stopped last time up to
the head. When head has not moved, a get answers NOT_FOUND or STALE from the
index with one shared-memory load: no lock, no system call. The lock is
taken only to claim a frame the index names.

Validation
----------
Everything read from shared memory (ring header, head and tail, frame
length, type, state, key length, payload length, position, checksum) is
checked before use, and every offset is bounded by the capacity, so a
corrupted file gives `CorruptFrameError` and never a read outside the
mapping. A frame whose checksum fails is retired (so the ring keeps
flowing) and reported.

A channel or reader object is not thread-safe; use one per thread.
"""

from __future__ import annotations

import contextlib
import ctypes
import enum
import errno
import fcntl
import mmap
import os
import stat
import sys
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, NamedTuple

from shmring.impl.directory import Directory, PathDirectory, check_private_file
from shmring.impl.errors import (
    ClosedError,
    ConfigurationError,
    CorruptFrameError,
    NoSpaceError,
    ProducerGoneError,
)
from shmring.impl.frame_io import (
    SharedWords,
    bump_wakeup_sequence_release,
    compute_checksum,
    load_frame_header_fields,
    load_frame_holder_pid,
    load_frame_prefix,
    load_frame_state_acquire,
    load_head_acquire,
    load_ring_state_acquire,
    load_tail_acquire,
    load_wakeup_sequence_acquire,
    read_ring_header,
    release_mapping,
    store_frame_holder_pid,
    store_frame_length_release,
    store_frame_state_in_header,
    store_frame_state_release,
    store_head_release,
    store_ring_state_release,
    store_tail_release,
    write_data_frame_fields,
    write_padding_frame_fields,
    write_ring_header,
)
from shmring.impl.liveness import is_holder_alive
from shmring.impl.names import current_producer_identity, instance_of
from shmring.impl.os_seam import (
    DEFAULT_OS,
    FILE_MODE,
    OPEN_FLAGS_CREATE,
    OPEN_FLAGS_EXISTING,
    OsFacade,
)
from shmring.spec.layout import (
    DATA_FRAME_TYPE,
    FRAME_ALIGNMENT,
    FRAME_HEADER_LENGTH,
    FRAME_KEY_OFFSET,
    FRAME_STATE_CLAIMED,
    FRAME_STATE_DONE,
    FRAME_STATE_PUBLISHED,
    FRAME_STATE_RETIRED,
    PADDING_FRAME_TYPE,
    RING_CAPACITY_DISABLED,
    RING_HEADER_LENGTH,
    RING_MAGIC,
    RING_STATE_CLOSED,
    RING_STATE_OPEN,
    RING_VERSION,
    compute_frame_length,
    compute_ring_file_length,
)
from shmring.spec.ring import (
    ConsumeMode,
    GetStatus,
    PutStatus,
    compute_capacity_error,
    compute_has_space,
    compute_padding,
    is_admitted,
    is_prefix_match,
    is_valid_capacity,
)

Buffer = bytes | bytearray | memoryview  # what put copies from (any C-contiguous buffer)
# (length, type, state, key length, payload length, position, checksum) of a frame header
FrameFields = tuple[int, int, int, int, int, int, int]
# A reader's index entry: (position, mapping offset, payload start, payload end, checksum).
_IndexEntry = tuple[int, int, int, int, int]

_PAGE_SIZE: Final = mmap.PAGESIZE
_LOCK: Final = fcntl.LOCK_EX
_TRY_LOCK: Final = fcntl.LOCK_EX | fcntl.LOCK_NB
_UNLOCK: Final = fcntl.LOCK_UN
_ZERO_FILL: Final = bytes(FRAME_ALIGNMENT)
_KNOWN_STATES: Final = frozenset(
    (FRAME_STATE_PUBLISHED, FRAME_STATE_CLAIMED, FRAME_STATE_DONE, FRAME_STATE_RETIRED)
)
# Bounded retries of a lock-free read that raced with the producer.
_MAX_RACE_RETRIES: Final = 64

PublishHook = Callable[[str], None]
# Stages a publish hook is called at (tests stop or kill the producer there).
HOOK_RESERVED: Final = "reserved"  # room decided, the slot reads "unpublished"; nothing written yet
HOOK_PAYLOAD_WRITTEN: Final = "payload written"  # key, payload, zero fill; no header yet
HOOK_FIELDS_WRITTEN: Final = "fields written"  # every header field but length
HOOK_LENGTH_STORED: Final = "length stored"  # frame complete; head not yet advanced


# -- results -------------------------------------------------------------------


class PutOutcome(NamedTuple):
    """What a put did; field for field `shmring.spec.ring.PutResult`."""

    status: PutStatus
    position: int | None = None  # the descriptor: where the frame was published
    frame_length: int = 0  # bytes the frame occupies (also when refused)
    padding: int = 0  # bytes of padding written before the frame
    retired: int = 0  # older versions of the key retired by this put (0 or 1)


class ReceiveStatus(enum.Enum):
    """What a get found. The first three mean what `spec.ring.GetStatus` means."""

    DELIVERED = GetStatus.DELIVERED.value  # claimed by this get; payload holds it
    NOT_FOUND = GetStatus.NOT_FOUND.value  # no deliverable frame for the key
    STALE = GetStatus.STALE.value  # the descriptor's frame is no longer deliverable
    BUSY = "busy"  # another process holds the ring lock; nothing changed, retry later


class Received(NamedTuple):
    """What a get answered."""

    status: ReceiveStatus
    position: int | None = None  # position of the claimed frame
    payload: Any = None  # copy-out: the decoded, independently owned value; lease: a `Lease`


_DELIVERED: Final = ReceiveStatus.DELIVERED
_PUT_CLOSED: Final = PutOutcome(PutStatus.CLOSED)
_NOT_FOUND: Final = Received(ReceiveStatus.NOT_FOUND)
_STALE: Final = Received(ReceiveStatus.STALE)
_BUSY: Final = Received(ReceiveStatus.BUSY)


@dataclass(frozen=True)
class RingStatistics:
    """A snapshot of one ring, as one producer or one reader sees it."""

    capacity: int  # data region bytes; never changes
    head: int  # position where the next frame starts
    tail: int  # position of the oldest unreclaimed frame
    used_bytes: int  # head - tail: bytes held by unreclaimed frames (padding included)
    free_bytes: int  # capacity - used_bytes
    published_frames: int  # deliverable frames between tail and head
    claimed_frames: int  # frames leased and not yet released
    closed: bool  # the producer closed the ring
    puts: int  # frames this object published (producer; 0 for a reader)
    refused_not_admitted: int  # puts refused as too large (producer)
    refused_full: int  # puts refused for lack of space now (producer)
    retired: int  # frames this object retired: re-put, cancel, close (producer)
    gets: int  # frames this object claimed (reader; 0 for a producer)
    busy: int  # gets answered BUSY because another process held the lock (reader)
    locks: int  # ring locks this object took
    reclaimed_from_dead_holders: int = (
        0  # claimed frames freed because their lease holder died (producer)
    )
    skipped: int = 0  # gets that saw, without the lock, the frame claimed by another reader


# -- shared pieces -------------------------------------------------------------


# Builds a NamedTuple from all its fields without its Python-level __new__ (hot paths).
_new_outcome: Final = tuple.__new__


def _data_offset(position: int, capacity: int) -> int:
    """Offset in the mapping of the byte at logical `position`."""
    return RING_HEADER_LENGTH + position % capacity


class _FrameShapes(dict[tuple[int, int], int]):
    """(key length, payload length) -> frame length when this ring admits it, else minus it.

    The numbers come from the model's helpers (`compute_frame_length`,
    `is_admitted`) on the first sight of a shape; afterwards a lookup is one
    dict probe, which is what the per-message paths pay. Bounded: forgotten
    wholesale past `_LIMIT` shapes.
    """

    __slots__ = ("capacity",)
    _LIMIT: Final = 4096

    def __init__(self, capacity: int) -> None:
        super().__init__()
        self.capacity = capacity

    def __missing__(self, shape: tuple[int, int]) -> int:
        key_length, payload_length = shape
        frame_length = compute_frame_length(key_length, payload_length)
        value = (
            frame_length if is_admitted(self.capacity, key_length, frame_length) else -frame_length
        )
        if len(self) >= self._LIMIT:
            self.clear()
        self[shape] = value
        return value


def _corrupt(message: str) -> CorruptFrameError:
    return CorruptFrameError(message)


class Lease:
    """A claimed frame whose payload is read in place.

    `view` is a read-only memoryview *borrowed* from the reader's mapping of
    the ring file. The ring (not the caller) owns the memory; it stays valid
    and unchanged until the lease is released, because a CLAIMED frame is
    never reclaimed. `release()` marks the frame DONE so the producer may
    reuse the space. Every view made from `view` (slices, `memoryview()`,
    numpy.frombuffer, torch.frombuffer) keeps the lease's private exporter
    alive; while one lives, `release()` raises BufferError and the frame stays
    CLAIMED: call it again once they are gone. An unreleased lease pins the
    ring at its position: release it, or use it as a context manager. The
    views stay valid after the reader is closed (the mapping lives on until
    the last of them dies).
    """

    __slots__ = ("_exporter", "_header", "_view", "position")

    def __init__(
        self, header: memoryview, exporter: ctypes.Array[ctypes.c_char], position: int
    ) -> None:
        self._header = header  # writable slice over the frame header (state field)
        # A ctypes array over the payload bytes: the one exporter every view of
        # the payload derives from, so its reference count tells whether any lives.
        self._exporter: ctypes.Array[ctypes.c_char] | None = exporter
        self._view: memoryview | None = memoryview(exporter).cast("B").toreadonly()
        self.position = position  # the frame's position (its descriptor)

    @property
    def view(self) -> memoryview:
        view = self._view
        if view is None:
            raise ClosedError(f"lease already released: position={self.position}")
        return view

    @property
    def released(self) -> bool:
        return self._exporter is None

    def release(self) -> None:
        """Give the frame back (DONE). Idempotent; BufferError while views of it live."""
        view, self._view = self._view, None
        if view is not None:
            view.release()
        exporter = self._exporter
        if exporter is None:
            return
        # References: our slot, the local, getrefcount's argument; any more is a live view.
        if sys.getrefcount(exporter) > 3:
            raise BufferError(
                f"views of the lease's payload still live; frame stays claimed: position={self.position}"
            )
        self._exporter = None
        del exporter
        store_frame_state_in_header(self._header, FRAME_STATE_DONE)
        self._header.release()

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()

    def __repr__(self) -> str:
        state = "released" if self._exporter is None else f"{len(self._exporter)} bytes"
        return f"Lease(position={self.position}, {state})"


class _RingFile:
    """What producer and reader share: a mapped ring file and its lock."""

    # Class-level defaults make close() idempotent, also after a failed setup.
    _fd: int = -1
    _mapping: mmap.mmap | None = None
    _buf: memoryview | None = None  # writable view of the whole mapping
    _words: SharedWords | None = None  # the mapping's shared fields (once its size is known good)
    _capacity: int = 0
    _locks: int = 0
    _shapes: _FrameShapes  # per ring, set once the capacity is known

    def __init__(self, path: str, os_facade: OsFacade, directory: Directory | None = None) -> None:
        self.path = path
        self._os = os_facade
        # Every file operation goes through the directory (a verified
        # descriptor for a connector's rings; by path for a standalone ring).
        self._dir = (
            directory if directory is not None else PathDirectory(os.path.dirname(path), os_facade)
        )

    @property
    def capacity(self) -> int:
        return self._capacity

    def _require_buf(self) -> memoryview:
        buf = self._buf
        if buf is None:
            raise ClosedError(f"ring channel is closed: path={self.path!r}")
        return buf

    def _require_words(self) -> SharedWords:
        words = self._words
        if words is None or self._buf is None:
            raise ClosedError(f"ring channel is closed: path={self.path!r}")
        return words

    def _release_mapping(self) -> None:
        """Unmap and close the descriptor; keep the mapping if views of it still live."""
        words, self._words = self._words, None
        buf, self._buf = self._buf, None
        mapping, self._mapping = self._mapping, None
        release_mapping(words, buf, mapping)
        fd, self._fd = self._fd, -1
        if fd >= 0:
            self._os.close(fd)


# -- producer ------------------------------------------------------------------


class RingChannel(_RingFile):
    """The producer side of one ring: creates, publishes into, and owns the file.

    Create with `RingChannel.create`. `put` / `put_with_writer` follow
    `spec.ring.process_put` step for step; `cancel`, `cancel_prefix` and
    `close` follow `process_cancel`, `process_cancel_prefix` and
    `process_close`. Only this object unlinks the file.
    """

    _closed: bool = False
    _unlink_pending: bool = False

    def __init__(
        self,
        path: str,
        capacity: int,
        os_facade: OsFacade,
        producer: tuple[int, ...],
        publish_hook: PublishHook | None,
        directory: Directory | None = None,
    ) -> None:
        super().__init__(path, os_facade, directory)
        self._capacity = capacity
        # (pid, start time) or (pid, start time, instance), written in the ring header
        self.producer = producer
        self._publish_hook = publish_hook
        self._head = 0  # our copy of head (we are its only writer)
        self._tail = 0  # our copy of tail (we are its only writer)
        # Frames between tail and head in position order: (position, length, key or None for padding).
        self._frames: deque[tuple[int, int, str | None]] = deque()
        # key -> position of the key's newest frame that may still be PUBLISHED.
        self._published: dict[str, int] = {}
        self._shapes = _FrameShapes(capacity)
        self._puts = 0
        self._refused_not_admitted = 0
        self._refused_full = 0
        self._retired = 0
        self._reclaimed_from_dead_holders = 0

    # -- setup -----------------------------------------------------------------

    @classmethod
    def create(
        cls,
        path: str,
        capacity: int,
        *,
        os_facade: OsFacade = DEFAULT_OS,
        producer: tuple[int, ...] | None = None,
        publish_hook: PublishHook | None = None,
        directory: Directory | None = None,
    ) -> RingChannel:
        """Create the ring file at `path` (it must not exist) and map it.

        The file is made with O_CREAT|O_EXCL|O_NOFOLLOW and mode 0600, so a
        symlink or an existing file at `path` is refused (FileExistsError).
        Its space is reserved with fallocate (ENOSPC shows here as
        NoSpaceError, not later as SIGBUS) and every page is touched once, so
        puts never page-fault. On any failure nothing is left behind.

        `producer` is the (pid, start time[, instance]) written into the
        header; the default is this process (`names.current_producer_identity`),
        instance 0.
        `publish_hook` is a test seam called at the HOOK_* stages of each put;
        production passes None. `directory` (a connector's verified deployment
        directory) is where `path` is created and unlinked, by descriptor.
        """
        error = compute_capacity_error(capacity)
        if error is not None:
            raise ConfigurationError(error)
        if capacity == RING_CAPACITY_DISABLED:
            raise ConfigurationError(f"a disabled ring has no channel: capacity={capacity}")
        if producer is None:
            producer = current_producer_identity(os_facade)
        channel = cls(path, capacity, os_facade, producer, publish_hook, directory)
        file_length = compute_ring_file_length(capacity)
        channel._fd = channel._dir.open(path, OPEN_FLAGS_CREATE, FILE_MODE)
        channel._unlink_pending = True
        try:
            os_facade.ftruncate(channel._fd, file_length)
            try:
                os_facade.fallocate(channel._fd, file_length)
            except OSError as error_:
                if error_.errno in (errno.ENOSPC, errno.EDQUOT):
                    raise NoSpaceError(
                        f"no space for a ring file: capacity={capacity} path={path!r}", error_.errno
                    ) from error_
                raise
            channel._mapping = os_facade.mmap(channel._fd, file_length)
            buf = channel._buf = memoryview(channel._mapping)
            channel._words = SharedWords(buf)
            # Fault every page in once, here, rather than on the put path.
            buf[::_PAGE_SIZE] = bytes(len(range(0, file_length, _PAGE_SIZE)))
            write_ring_header(
                buf, capacity, producer[0], producer[1], RING_STATE_OPEN, instance_of(producer)
            )
        except BaseException:
            channel._closed = True
            channel._teardown()
            raise
        return channel

    # -- put -------------------------------------------------------------------

    def put(self, key: str, payload: Buffer) -> PutOutcome:
        """Publish a copy of `payload` (bytes-like) under `key`; see `spec.ring.process_put`.

        The caller may reuse `payload` as soon as put returns.
        """
        data = payload if isinstance(payload, bytes) else memoryview(payload).cast("B")
        return self._put(key, len(data), data, None)

    def put_with_writer(
        self, key: str, payload_length: int, writer: Callable[[memoryview], None]
    ) -> PutOutcome:
        """Publish `payload_length` bytes that `writer` fills in place.

        `writer` gets a writable memoryview of exactly `payload_length` bytes
        *borrowed* from the ring mapping; it is valid only during the call
        and nothing made from it may be kept (BufferError if something is:
        nothing is published). If `writer` raises, nothing is published.
        Lets a codec encode straight into shared memory with no intermediate
        copy.
        """
        if payload_length < 0:
            raise ValueError(
                f"payload length must not be negative: payload_length={payload_length}"
            )
        return self._put(key, payload_length, None, writer)

    def _put(
        self,
        key: str,
        payload_length: int,
        payload: bytes | memoryview | None,
        writer: Callable[[memoryview], None] | None,
    ) -> PutOutcome:
        if self._closed:
            return _PUT_CLOSED
        capacity = self._capacity
        key_bytes = key.encode("utf-8")
        key_length = len(key_bytes)
        frame_length = self._shapes[key_length, payload_length]
        if frame_length < 0:  # the model's is_admitted said no
            self._refused_not_admitted += 1
            return PutOutcome(PutStatus.NOT_ADMITTED, None, -frame_length)
        if self._frames:
            self._reclaim()
        head = self._head
        if not compute_has_space(capacity, head, self._tail, frame_length) and (
            not self._free_dead_holders()
            or not compute_has_space(capacity, head, self._tail, frame_length)
        ):
            self._refused_full += 1
            return PutOutcome(PutStatus.FULL, None, frame_length)
        padding = compute_padding(capacity, head, frame_length)
        position = head + padding
        buf = self._buf
        words = self._words
        assert buf is not None  # open while not closed
        hook = self._publish_hook

        # 1. Body: the slot reads "unpublished" first, then key, payload, zero fill.
        offset = RING_HEADER_LENGTH + position % capacity
        store_frame_length_release(words, offset, 0)
        if hook is not None:
            hook(HOOK_RESERVED)
        key_start = offset + FRAME_KEY_OFFSET
        payload_start = key_start + key_length
        payload_end = payload_start + payload_length
        buf[key_start:payload_start] = key_bytes
        if writer is None:
            assert payload is not None
            buf[payload_start:payload_end] = payload
            checksum = compute_checksum(key_bytes, payload)
        else:
            # A fresh export of the mapping: a view the writer keeps (a slice,
            # an array) holds one more reference to the mapping while it lives.
            mapping = self._mapping
            baseline = sys.getrefcount(mapping)
            whole = memoryview(mapping)  # type: ignore[arg-type]
            view = whole[payload_start:payload_end]
            whole.release()
            try:
                writer(view)
            finally:
                view.release()
            if sys.getrefcount(mapping) > baseline:
                raise BufferError(
                    f"writer kept a view of ring storage; nothing published: key={key!r}"
                )
            checksum = compute_checksum(key_bytes, buf[payload_start:payload_end])
        fill = offset + frame_length - payload_end
        if fill:
            buf[payload_end : payload_end + fill] = _ZERO_FILL[:fill]
        if hook is not None:
            hook(HOOK_PAYLOAD_WRITTEN)

        # 2. Padding before it, if the frame did not fit before the end.
        if padding:
            padding_offset = RING_HEADER_LENGTH + head % capacity
            write_padding_frame_fields(buf, padding_offset, FRAME_STATE_DONE)
            store_frame_length_release(words, padding_offset, padding)

        # 3. Retire the older version (before the new one becomes visible).
        published = self._published
        retired = self._retire_key(key) if key in published else 0

        # 4. Header fields, then length, then head, then the wake-up sequence.
        write_data_frame_fields(
            buf,
            offset,
            state=FRAME_STATE_PUBLISHED,
            key_length=key_length,
            payload_length=payload_length,
            position=position,
            checksum=checksum,
        )
        if hook is not None:
            hook(HOOK_FIELDS_WRITTEN)
        store_frame_length_release(words, offset, frame_length)
        if hook is not None:
            hook(HOOK_LENGTH_STORED)
        new_head = position + frame_length
        store_head_release(words, new_head)
        bump_wakeup_sequence_release(words)

        self._head = new_head
        frames = self._frames
        if padding:
            frames.append((head, padding, None))
        frames.append((position, frame_length, key))
        published[key] = position
        self._puts += 1
        return _new_outcome(
            PutOutcome, (PutStatus.PUBLISHED, position, frame_length, padding, retired)
        )

    def _reclaim(self) -> None:
        """Advance the tail over DONE, RETIRED and padding frames; see `process_reclaim`."""
        frames = self._frames
        if not frames:
            return
        buf = self._buf
        words = self._words
        assert buf is not None
        capacity = self._capacity
        published = self._published
        tail = self._tail
        while frames:
            position, length, key = frames[0]
            if key is not None:
                state = load_frame_state_acquire(words, _data_offset(position, capacity))
                if state != FRAME_STATE_DONE and state != FRAME_STATE_RETIRED:
                    break
                if published.get(key) == position:
                    del published[key]
            frames.popleft()
            tail += length
        if tail != self._tail:
            self._tail = tail
            store_tail_release(words, tail)  # before any byte of the freed space is rewritten

    def _free_dead_holders(self) -> bool:
        """Free the frames at the tail that lease holders claimed and then died with.

        A lease holder stores its pid before it stores CLAIMED; a holder that
        is surely dead (`liveness.is_holder_alive`) had its views die with
        it, so its frame is marked DONE, as `spec.leases.process_holder_exit`
        releases a dead holder's leases. Only the frames blocking the tail are
        looked at, and only when a put found no space, so a live holder costs
        no system call on puts that fit. Answers whether the tail moved.
        """
        buf = self._buf
        words = self._words
        assert buf is not None
        capacity = self._capacity
        freed = False
        for position, _length, key in self._frames:
            if key is None:
                continue  # padding
            offset = RING_HEADER_LENGTH + position % capacity
            state = load_frame_state_acquire(words, offset)
            if state in (FRAME_STATE_DONE, FRAME_STATE_RETIRED):
                continue
            if state != FRAME_STATE_CLAIMED or is_holder_alive(
                load_frame_holder_pid(words, offset), self._os
            ):
                break
            store_frame_state_release(words, offset, FRAME_STATE_DONE)
            self._reclaimed_from_dead_holders += 1
            freed = True
        if freed:
            self._reclaim()
        return freed

    # -- retire ----------------------------------------------------------------

    def _retire_key(self, key: str) -> int:
        position = self._published.get(key)
        if position is None:
            return 0
        return self._retire_positions([(key, position)])

    def _retire_positions(self, candidates: list[tuple[str, int]]) -> int:
        """Retire those of `candidates` still PUBLISHED, under the ring lock.

        A state other than PUBLISHED is final, so it is read without the lock
        first and the lock is taken only when something may need retiring.
        """
        buf = self._buf
        words = self._words
        assert buf is not None
        capacity = self._capacity
        published = self._published
        live = []
        for key, position in candidates:
            if (
                load_frame_state_acquire(words, _data_offset(position, capacity))
                == FRAME_STATE_PUBLISHED
            ):
                live.append((key, position))
            else:
                del published[key]  # claimed by a reader: nothing to retire
        if not live:
            return 0
        retired = 0
        self._os.flock(self._fd, _LOCK)
        self._locks += 1
        try:
            for key, position in live:
                offset = _data_offset(position, capacity)
                if load_frame_state_acquire(words, offset) == FRAME_STATE_PUBLISHED:
                    store_frame_state_release(words, offset, FRAME_STATE_RETIRED)
                    retired += 1
                del published[key]
        finally:
            self._os.flock(self._fd, _UNLOCK)
        self._retired += retired
        return retired

    def cancel(self, key: str) -> int:
        """Retire the key's unclaimed frame; answer how many (0 or 1). See `process_cancel`."""
        if self._closed:
            return 0
        return self._retire_key(key)

    def cancel_prefix(self, prefix: str) -> int:
        """Retire every unclaimed frame whose key is `prefix` + digits. See `process_cancel_prefix`."""
        if self._closed:
            return 0
        candidates = [(k, p) for k, p in self._published.items() if is_prefix_match(prefix, k)]
        if not candidates:
            return 0
        return self._retire_positions(candidates)

    # -- close -----------------------------------------------------------------

    def close(self) -> int:
        """Mark the ring CLOSED, retire everything unclaimed, unmap, unlink.

        Answers how many frames it retired (0 when already closed), like
        `process_close`. The CLOSED mark comes first, so readers stop
        claiming even if retiring fails (a fault in the lock, say); a reader
        already holding the lock finishes its claim first, which orders that
        claim before the close. Idempotent; a failed unlink is retried by the
        next close. Readers keep their own mappings and see a CLOSED ring.
        """
        if self._closed:
            self._teardown()
            return 0
        self._closed = True
        retired = 0
        try:
            buf = self._buf
            words = self._words
            if buf is not None:
                store_ring_state_release(words, RING_STATE_CLOSED)
                bump_wakeup_sequence_release(words)
                retired = self._retire_positions(list(self._published.items()))
        finally:
            self._published.clear()
            self._teardown()
        return retired

    def _teardown(self) -> None:
        try:
            self._release_mapping()
        finally:
            if self._unlink_pending:
                with contextlib.suppress(FileNotFoundError):
                    self._dir.unlink(self.path)
                self._unlink_pending = False

    def __enter__(self) -> RingChannel:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- inspection --------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def head(self) -> int:
        return self._head

    @property
    def tail(self) -> int:
        return self._tail

    def statistics(self) -> RingStatistics:
        buf = self._buf
        words = self._words
        published = claimed = 0
        if buf is not None:
            for position, _length, key in self._frames:
                if key is None:
                    continue
                state = load_frame_state_acquire(words, _data_offset(position, self._capacity))
                published += state == FRAME_STATE_PUBLISHED
                claimed += state == FRAME_STATE_CLAIMED
        used = self._head - self._tail
        return RingStatistics(
            capacity=self._capacity,
            head=self._head,
            tail=self._tail,
            used_bytes=used,
            free_bytes=self._capacity - used,
            published_frames=published,
            claimed_frames=claimed,
            closed=self._closed,
            puts=self._puts,
            refused_not_admitted=self._refused_not_admitted,
            refused_full=self._refused_full,
            retired=self._retired,
            reclaimed_from_dead_holders=self._reclaimed_from_dead_holders,
            gets=0,
            busy=0,
            locks=self._locks,
        )

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"head={self._head} tail={self._tail}"
        return f"RingChannel(path={self.path!r}, capacity={self._capacity}, {state})"


# -- reader --------------------------------------------------------------------


class RingReader(_RingFile):
    """The reader side of one ring: maps an existing ring file without owning it.

    Attach with `RingReader.attach`. Never unlinks the file and never touches
    Python's resource tracker (it uses plain open/mmap, not
    `multiprocessing.shared_memory`). `get` follows `spec.ring.process_get`,
    plus BUSY when another process holds the ring lock.
    """

    def __init__(self, path: str, os_facade: OsFacade, directory: Directory | None = None) -> None:
        super().__init__(path, os_facade, directory)
        self.producer: tuple[int, int] = (0, 0)  # (pid, start time) from the ring header
        self.instance = 0  # the producer's connector instance, from the ring header
        self._seen_head = 0  # head at the last scan
        self._scanned_to = 0  # a frame boundary; frames below it are in the index (if published)
        # key bytes -> the frame seen PUBLISHED at the last scan, its header
        # already validated: (position, offset, payload start, payload end, checksum).
        # Those fields never change while the frame is unreclaimed, so a claim
        # re-reads only the state and the tail.
        self._index: dict[bytes, _IndexEntry] = {}
        # (position, key bytes) in scan order, to prune index entries the tail passed.
        self._index_order: deque[tuple[int, bytes]] = deque()
        self._gets = 0
        self._busy = 0
        self._skipped = 0

    @classmethod
    def attach(
        cls, path: str, *, os_facade: OsFacade = DEFAULT_OS, directory: Directory | None = None
    ) -> RingReader:
        """Map the ring file at `path` read-write and validate its header.

        CorruptFrameError: not a regular file of ours (a symlink included),
        or the header is not a valid ring header. ProducerGoneError: the file
        is gone, or its producer closed the ring.
        """
        reader = cls(path, os_facade, directory)
        try:
            reader._fd = reader._dir.open(path, OPEN_FLAGS_EXISTING)
        except FileNotFoundError as error:
            raise ProducerGoneError(f"ring file is gone: path={path!r}") from error
        except OSError as error:
            if error.errno == errno.ELOOP:
                raise CorruptFrameError(f"ring path is a symlink: path={path!r}") from error
            raise
        try:
            reader._map_and_validate()
        except BaseException:
            reader._release_mapping()
            raise
        return reader

    def _map_and_validate(self) -> None:
        path = self.path
        info = self._os.fstat(self._fd)
        if not stat.S_ISREG(info.st_mode):
            raise CorruptFrameError(f"ring path is not a regular file: path={path!r}")
        untrusted = check_private_file(path, info)  # ours, 0600: before any byte is read
        if untrusted is not None:
            raise CorruptFrameError(f"ring file is not trusted: {untrusted}")
        size = info.st_size
        if size < RING_HEADER_LENGTH:
            raise CorruptFrameError(f"ring file shorter than its header: size={size} path={path!r}")
        self._mapping = self._os.mmap(self._fd, size)
        buf = self._buf = memoryview(self._mapping)
        header = read_ring_header(buf)
        if header.magic != RING_MAGIC:
            raise CorruptFrameError(f"bad ring magic: magic={header.magic:#x} path={path!r}")
        if header.version != RING_VERSION:
            raise CorruptFrameError(
                f"unsupported ring version: version={header.version} path={path!r}"
            )
        if header.header_length != RING_HEADER_LENGTH:
            raise CorruptFrameError(
                f"bad ring header length: header_length={header.header_length} path={path!r}"
            )
        capacity = header.capacity
        if capacity == RING_CAPACITY_DISABLED or not is_valid_capacity(capacity):
            raise CorruptFrameError(f"bad ring capacity: capacity={capacity} path={path!r}")
        if size != compute_ring_file_length(capacity):
            raise CorruptFrameError(
                f"ring file size does not match its capacity: size={size} capacity={capacity} path={path!r}"
            )
        if header.state == RING_STATE_CLOSED:
            raise ProducerGoneError(f"ring closed by its producer: path={path!r}")
        if header.state != RING_STATE_OPEN:
            raise CorruptFrameError(f"bad ring state: state={header.state} path={path!r}")
        self._words = SharedWords(buf)  # the size is a header plus an aligned capacity
        self._capacity = capacity
        self._shapes = _FrameShapes(capacity)
        self.producer = (header.producer_pid, header.producer_start_time)
        self.instance = header.producer_instance
        bytes(buf[::_PAGE_SIZE])  # fault every page in once, not on the receive path
        tail, _head = self._load_positions()
        self._scanned_to = tail
        self._seen_head = tail  # forces a scan on the first get that sees a frame

    # -- positions -------------------------------------------------------------

    def _load_positions(self) -> tuple[int, int]:
        """(tail, head), consistent with each other, validated."""
        words = self._require_words()
        capacity = self._capacity
        for _ in range(_MAX_RACE_RETRIES):
            tail = load_tail_acquire(words)
            head = load_head_acquire(words)
            if load_tail_acquire(words) != tail:
                continue  # the producer reclaimed meanwhile; head may be past tail + capacity
            if (
                tail <= head <= tail + capacity
                and tail % FRAME_ALIGNMENT == 0
                and head % FRAME_ALIGNMENT == 0
            ):
                return tail, head
            raise _corrupt(
                f"ring positions corrupted: head={head} tail={tail} capacity={capacity} path={self.path!r}"
            )
        raise _corrupt(f"ring tail keeps moving while read: path={self.path!r}")  # pragma: no cover

    # -- scan ------------------------------------------------------------------

    def _load_fields(self, buf: memoryview, offset: int) -> FrameFields:
        """The header fields at mapping `offset`, never reading past the data region.

        Where fewer than FRAME_HEADER_LENGTH bytes remain only a padding frame
        fits, so only its (length, type, state) are read; the rest read as 0.
        """
        if RING_HEADER_LENGTH + self._capacity - offset >= FRAME_HEADER_LENGTH:
            return load_frame_header_fields(buf, offset)
        length, frame_type, state = load_frame_prefix(buf, offset)
        return (length, frame_type, state, 0, 0, 0, 0)

    def _check_frame(self, position: int, head: int, fields: FrameFields) -> str | None:
        """Why the header `fields` read at `position` are not a valid frame, or None."""
        length, frame_type, state, key_length, payload_length, frame_position, _ = fields
        capacity = self._capacity
        offset = position % capacity
        if (
            length == 0
            or length % FRAME_ALIGNMENT
            or offset + length > capacity
            or position + length > head
        ):
            return f"bad frame length={length}"
        if frame_type == PADDING_FRAME_TYPE:
            if offset + length != capacity or state != FRAME_STATE_DONE:
                return f"bad padding frame: length={length} state={state}"
            return None
        if frame_type != DATA_FRAME_TYPE:
            return f"bad frame type={frame_type}"
        if state not in _KNOWN_STATES:
            return f"bad frame state={state}"
        if frame_position != position:
            return f"frame position field={frame_position}"
        if self._shapes[key_length, payload_length] != length:
            return f"bad lengths: length={length} key_length={key_length} payload_length={payload_length}"
        return None

    def _scan(self) -> None:
        """Index the frames published since the last scan, without the lock."""
        buf = self._require_buf()
        words = self._words
        capacity = self._capacity
        tail, head = self._load_positions()
        index = self._index
        order = self._index_order
        while order and order[0][0] < tail:
            old_position, old_key = order.popleft()
            entry = index.get(old_key)
            if entry is not None and entry[0] == old_position:
                del index[old_key]
        shapes = self._shapes
        region_end = RING_HEADER_LENGTH + capacity
        position = max(self._scanned_to, tail)
        retries = 0
        while position < head:
            offset = RING_HEADER_LENGTH + position % capacity
            fields = self._load_fields(buf, offset)
            length, frame_type, state, key_length, payload_length, frame_position, checksum = fields
            if (
                frame_type == DATA_FRAME_TYPE
                and length == shapes[key_length, payload_length]
                and frame_position == position
                and offset + length <= region_end
                and position + length <= head
                and state in _KNOWN_STATES
            ):
                problem = None  # the common case of _check_frame, without the call
            else:
                problem = self._check_frame(position, head, fields)
            key = b""
            if problem is None and frame_type == DATA_FRAME_TYPE:
                key_start = offset + FRAME_KEY_OFFSET
                key = bytes(buf[key_start : key_start + key_length])
            if problem is not None or frame_type == DATA_FRAME_TYPE:
                now_tail = load_tail_acquire(words)
                if now_tail > position:  # reclaimed and possibly rewritten under us
                    retries += 1
                    if retries > _MAX_RACE_RETRIES:  # pragma: no cover - lapped endlessly
                        self._scanned_to = now_tail
                        return  # head not recorded as seen: the next get scans again
                    position = now_tail
                    continue
            if problem is not None:
                raise _corrupt(
                    f"corrupted frame at position={position}: {problem}; path={self.path!r}"
                )
            if frame_type == DATA_FRAME_TYPE:
                if state == FRAME_STATE_PUBLISHED:
                    index.pop(key, None)  # keep dict order = position order
                    payload_start = offset + FRAME_KEY_OFFSET + key_length
                    index[key] = (
                        position,
                        offset,
                        payload_start,
                        payload_start + payload_length,
                        checksum,
                    )
                    order.append((position, key))
                else:
                    entry = index.get(key)
                    if entry is not None and entry[0] < position:
                        del index[
                            key
                        ]  # an older entry cannot be deliverable once a newer frame exists
            position += length
        self._scanned_to = position
        self._seen_head = head

    # -- get -------------------------------------------------------------------

    def get(
        self,
        key: str,
        position: int | None = None,
        *,
        mode: ConsumeMode = ConsumeMode.COPY_OUT,
        decode: Callable[[memoryview], Any] | None = None,
    ) -> Received:
        """Claim the key's deliverable frame (or the descriptor's exact frame), once.

        COPY_OUT: the payload is copied before the frame is marked DONE; the
        answer holds `bytes`, or what `decode(view)` returned. `decode` gets a
        read-only memoryview *borrowed* from the mapping for the duration of
        the call and must return independently owned memory. If anything made
        from the view (a slice, `memoryview()`, numpy.frombuffer,
        torch.frombuffer) outlives the call, the get raises BufferError and
        the frame stays CLAIMED, so the ring never rewrites what it shows. If
        `decode` raises, the frame stays deliverable.

        LEASE: the answer's payload is a `Lease` borrowing the payload in
        place; the frame is DONE when the lease is released.

        With `position` (a descriptor) only that exact frame may be claimed;
        anything else answers STALE. BUSY: another process holds the ring
        lock; nothing changed. A get on an unchanged channel whose index has
        nothing for the key makes no system call and takes no lock.
        """
        buf = self._buf
        words = self._words
        if buf is None:
            raise ClosedError(f"ring reader is closed: path={self.path!r}")
        if load_head_acquire(words) != self._seen_head:
            self._scan()
        key_bytes = key.encode("utf-8")
        entry = self._index.get(key_bytes)
        if position is None:
            if entry is None:
                return _NOT_FOUND
            miss = _NOT_FOUND
        else:
            if entry is None or entry[0] != position:
                return _STALE
            miss = _STALE
        ring_state = load_ring_state_acquire(words)
        if ring_state != RING_STATE_OPEN:
            if ring_state == RING_STATE_CLOSED:
                return miss  # a closed ring delivers nothing; its producer retires the rest
            raise _corrupt(f"bad ring state: state={ring_state} path={self.path!r}")
        return self._claim(buf, key_bytes, entry, mode, decode, miss)

    def _claim(
        self,
        buf: memoryview,
        key_bytes: bytes,
        entry: _IndexEntry,
        mode: ConsumeMode,
        decode: Callable[[memoryview], Any] | None,
        miss: Received,
    ) -> Received:
        position, offset, payload_start, payload_end, checksum = entry
        words = self._words
        # A frame another reader claimed since our scan is skipped without the
        # lock (issue 12: competing readers answered BUSY 249,570 times in a
        # soak, mostly retrying frames the other one had already taken). Only
        # a hint: the claim below re-reads the state under the lock, so
        # "exactly once" rests on the lock as before.
        if self._claimed_elsewhere(words, key_bytes, position, offset):
            self._skipped += 1
            return miss
        try:
            self._os.flock(self._fd, _TRY_LOCK)
        except BlockingIOError:
            if self._claimed_elsewhere(words, key_bytes, position, offset):
                self._skipped += 1  # lost the race for this very frame: not BUSY, gone
                return miss
            self._busy += 1
            return _BUSY
        self._locks += 1
        try:
            # The scan validated this frame's header; while the frame is not
            # reclaimed only its state can change, so the state is all there is
            # to re-read, then the tail (a frame the tail passed may be rewritten).
            state = load_frame_state_acquire(words, offset)
            if load_tail_acquire(words) > position:
                self._forget(key_bytes, position)  # reclaimed (and maybe rewritten) under us
                return miss
            if state != FRAME_STATE_PUBLISHED:
                if state not in _KNOWN_STATES:
                    raise _corrupt(
                        f"corrupted frame at position={position}: bad frame state={state}; "
                        f"path={self.path!r}"
                    )
                self._forget(key_bytes, position)
                return miss
            # From here the frame is ours to claim: PUBLISHED frames are not
            # reclaimed, and only lock holders move a frame out of PUBLISHED.
            if decode is None and mode is ConsumeMode.COPY_OUT:
                # Copy first, then check the private copy: one pass over memory
                # another core wrote instead of two. Same bytes: under the lock a
                # PUBLISHED frame does not change (anything else is corruption,
                # which the check then reports).
                value: Any = buf[payload_start:payload_end].tobytes()
                checked: bytes | memoryview = value
            else:
                checked = buf[payload_start:payload_end]
            if compute_checksum(key_bytes, checked) != checksum:
                store_frame_state_release(words, offset, FRAME_STATE_RETIRED)
                self._forget(key_bytes, position)
                raise _corrupt(
                    f"frame checksum mismatch at position={position}: checksum={checksum:#010x}; "
                    f"frame retired; path={self.path!r}"
                )
            if mode is ConsumeMode.LEASE:
                exporter = (ctypes.c_char * (payload_end - payload_start)).from_buffer(
                    self._mapping,  # type: ignore[arg-type]
                    payload_start,
                )
                lease = Lease(buf[offset : offset + FRAME_HEADER_LENGTH], exporter, position)
                # The holder first, then CLAIMED (release): a producer that loads
                # CLAIMED reads this process as the holder (`_free_dead_holders`).
                store_frame_holder_pid(words, offset, os.getpid())
                store_frame_state_release(words, offset, FRAME_STATE_CLAIMED)
                value = lease
            elif decode is None:
                store_frame_state_release(words, offset, FRAME_STATE_DONE)
            else:
                value = self._decode_in_place(
                    buf, offset, payload_start, payload_end, decode, position
                )
                store_frame_state_release(words, offset, FRAME_STATE_DONE)
        finally:
            self._os.flock(self._fd, _UNLOCK)
        del self._index[key_bytes]  # the entry named this frame (checked above, under no change)
        self._gets += 1
        return _new_outcome(Received, (_DELIVERED, position, value))

    def _claimed_elsewhere(
        self, words: SharedWords | None, key_bytes: bytes, position: int, offset: int
    ) -> bool:
        """Whether the indexed frame is surely no longer ours to claim (lock-free look).

        True only for a frame still in the lap (the tail has not passed it,
        checked after the state: a reclaimed slot may hold a newer frame)
        whose state is a known one past PUBLISHED; its index entry is dropped.
        """
        assert words is not None
        state = load_frame_state_acquire(words, offset)
        if state == FRAME_STATE_PUBLISHED or state not in _KNOWN_STATES:
            return False  # claimable, or corrupt: the locked path decides and reports
        if load_tail_acquire(words) > position:
            return False  # reclaimed meanwhile: the locked path forgets it
        self._forget(key_bytes, position)
        return True

    def _decode_in_place(
        self,
        buf: memoryview,
        offset: int,
        payload_start: int,
        payload_end: int,
        decode: Callable[[memoryview], Any],
        position: int,
    ) -> Any:
        # A fresh export of the mapping, so that every view derived from what
        # decode gets holds one more reference to the mapping while it lives.
        mapping = self._mapping
        baseline = sys.getrefcount(mapping)
        whole = memoryview(mapping)  # type: ignore[arg-type]
        view = whole.toreadonly()[payload_start:payload_end]
        whole.release()
        try:
            value = decode(view)
        finally:
            try:
                view.release()
                kept = sys.getrefcount(mapping) > baseline
            except BufferError:
                kept = True
            if kept:
                # The decoder kept a view of ring storage: pin the frame (CLAIMED,
                # never reclaimed) so the ring never rewrites what it shows.
                store_frame_state_release(self._words, offset, FRAME_STATE_CLAIMED)
        if kept:
            raise BufferError(
                f"decode kept a view of ring storage; frame pinned at position={position}"
            )
        return value

    def _forget(self, key_bytes: bytes, position: int) -> None:
        entry = self._index.get(key_bytes)
        if entry is not None and entry[0] == position:
            del self._index[key_bytes]

    def release(self, position: int) -> None:
        """Mark the CLAIMED frame at `position` DONE (for a lease object that was lost).

        Prefer `Lease.release()`, which also drops the borrowed view.
        """
        buf = self._require_buf()
        words = self._words
        tail, head = self._load_positions()
        offset = _data_offset(position, self._capacity)
        fields = self._load_fields(buf, offset)
        length, frame_type, state, key_length, payload_length, _, _ = fields
        problem = self._check_frame(position, head, fields)
        if not tail <= position < head or problem is not None or state != FRAME_STATE_CLAIMED:
            raise CorruptFrameError(
                f"no claimed frame to release at position={position}: state={state} "
                f"problem={problem}; path={self.path!r}"
            )
        store_frame_state_release(words, offset, FRAME_STATE_DONE)

    # -- inspection --------------------------------------------------------------

    @property
    def producer_closed(self) -> bool:
        """The producer closed the ring: nothing on it will be delivered."""
        return load_ring_state_acquire(self._require_words()) == RING_STATE_CLOSED

    @property
    def wakeup_sequence(self) -> int:
        """Bumped by the producer after every publication (and at close)."""
        return load_wakeup_sequence_acquire(self._require_words())

    def statistics(self) -> RingStatistics:
        """A lock-free walk of the ring; frames moving meanwhile may be counted in either state."""
        buf = self._require_buf()
        words = self._words
        capacity = self._capacity
        tail, head = self._load_positions()
        published = claimed = 0
        position = tail
        while position < head:
            offset = _data_offset(position, capacity)
            fields = self._load_fields(buf, offset)
            length, frame_type, state, key_length, payload_length, _, _ = fields
            problem = self._check_frame(position, head, fields)
            if load_tail_acquire(words) > position:
                position = load_tail_acquire(words)
                continue
            if problem is not None:
                raise _corrupt(
                    f"corrupted frame at position={position}: {problem}; path={self.path!r}"
                )
            if frame_type == DATA_FRAME_TYPE:
                published += state == FRAME_STATE_PUBLISHED
                claimed += state == FRAME_STATE_CLAIMED
            position += length
        used = head - tail
        return RingStatistics(
            capacity=capacity,
            head=head,
            tail=tail,
            used_bytes=used,
            free_bytes=capacity - used,
            published_frames=published,
            claimed_frames=claimed,
            closed=load_ring_state_acquire(words) == RING_STATE_CLOSED,
            puts=0,
            refused_not_admitted=0,
            refused_full=0,
            retired=0,
            gets=self._gets,
            busy=self._busy,
            locks=self._locks,
            skipped=self._skipped,
        )

    def close(self) -> None:
        """Drop the mapping and descriptor; never unlinks. Idempotent.

        Leases still held keep their frames CLAIMED and their views valid: the
        mapping is unmapped when the last borrowed view dies.
        """
        self._release_mapping()

    def __enter__(self) -> RingReader:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"RingReader(path={self.path!r}, capacity={self._capacity}, producer={self.producer})"
        )


__all__ = [
    "HOOK_FIELDS_WRITTEN",
    "HOOK_LENGTH_STORED",
    "HOOK_PAYLOAD_WRITTEN",
    "HOOK_RESERVED",
    "Lease",
    "PutOutcome",
    "Received",
    "ReceiveStatus",
    "RingChannel",
    "RingReader",
    "RingStatistics",
]
