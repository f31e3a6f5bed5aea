"""The host ring's reader, `RingReader` (see `shmring.impl.ring` for the rationale)."""

from __future__ import annotations

import ctypes
import errno
import os
import stat
import sys
import traceback
from collections import deque
from collections.abc import Callable
from typing import Any, Final

from ...spec.index import ReaderIndex
from ...spec.layout import (
    DATA_FRAME_TYPE,
    FRAME_ALIGNMENT,
    FRAME_HEADER_LENGTH,
    FRAME_KEY_OFFSET,
    FRAME_STATE_CLAIMED,
    FRAME_STATE_DONE,
    FRAME_STATE_PUBLISHED,
    FRAME_STATE_RETIRED,
    RING_HEADER_LENGTH,
    RING_STATE_CLOSED,
    RING_STATE_OPEN,
)
from ...spec.ring import (
    ConsumeMode,
)
from ..directory import Directory, check_private_file
from ..errors import (
    ClosedError,
    CorruptFrameError,
    ProducerGoneError,
    UnsupportedPayloadError,
)
from ..frame_io import (
    SharedWords,
    compute_checksum,
    load_frame_header_fields,
    load_frame_state_acquire,
    load_head_acquire,
    load_ring_state_acquire,
    load_tail_acquire,
    load_wakeup_sequence_acquire,
    store_frame_holder_pid,
    store_frame_state_release,
)
from ..lifecycle import signals_deferred
from ..os_seam import (
    DEFAULT_OS,
    OPEN_FLAGS_EXISTING,
    OsFacade,
)
from .borrow import (
    BorrowedPayload,
    Lease,
    call_with_view,
    mark_frame_done,
)
from .frames import (
    RING_FILE,
    corrupt_frame,
    frame_problem,
    load_frame_fields,
    load_positions,
    read_checked_ring_header,
    walk_frames,
)
from .mapping import (
    _KNOWN_STATES,
    _PAGE_SIZE,
    _TRY_LOCK,
    _UNLOCK,
    FrameFields,
    _data_offset,
    _FrameShapes,
    _new_outcome,
    _RingFile,
)
from .results import (
    _BUSY,
    _DELIVERED,
    _NOT_FOUND,
    _STALE,
    Received,
    RingStatistics,
)

# -- reader --------------------------------------------------------------------


# What a decoder raises for a payload that will never decode (issue 27: consumed, not kept).
_UNDECODABLE: Final = (CorruptFrameError, UnsupportedPayloadError)


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
        # The index, `spec.index.ReaderIndex` (docs/protocol.md, "Finding a key").
        self._seen_head = 0  # head at the last complete scan: a get scans only when head moved
        self._scanned_to = 0  # a frame boundary; every frame below it was seen by a scan
        # key bytes -> position of the newest frame of the key a scan saw PUBLISHED.
        # Only a candidate: a claim reads the frame header there and checks it.
        self._index: dict[bytes, int] = {}
        # The entries in scan order, to drop those the tail passed (two deques, no tuples).
        self._order_positions: deque[int] = deque()
        self._order_keys: deque[bytes] = deque()
        self._gets = 0
        self._busy = 0
        self._skipped = 0
        # Why this reader dropped its mapping: the file shrank under it (issue 22).
        self.shrunk: str | None = None
        self.identity: tuple[int, int] = (0, 0)  # (st_dev, st_ino) of the file mapped

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
        self._file_length = size
        self.identity = (info.st_dev, info.st_ino)
        self._mapping = self._os.mmap(self._fd, size)
        buf = self._buf = memoryview(self._mapping)
        header, problem = read_checked_ring_header(buf, size, RING_FILE)
        if problem is not None:
            raise CorruptFrameError(f"{problem} path={path!r}")
        capacity = header.capacity
        if header.state == RING_STATE_CLOSED:
            raise ProducerGoneError(f"ring closed by its producer: path={path!r}")
        if header.state != RING_STATE_OPEN:
            raise CorruptFrameError(f"bad ring state: state={header.state} path={path!r}")
        self._words = SharedWords(buf)  # the size is a header plus an aligned capacity
        self._capacity = capacity
        self._shapes = _FrameShapes(capacity)
        self.producer = (header.producer_pid, header.producer_start_time)
        self.instance = header.producer_instance
        shrunk = self._shrink_problem()  # truncated since the fstat above: never fault it in
        if shrunk is not None:
            raise CorruptFrameError(shrunk)
        bytes(buf[::_PAGE_SIZE])  # fault every page in once, not on the receive path
        tail, _head = self._load_positions()
        self._scanned_to = tail
        self._seen_head = tail  # forces a scan on the first get that sees a frame

    # -- scan ------------------------------------------------------------------

    def _load_positions(self) -> tuple[int, int]:
        """(tail, head), consistent with each other, validated."""
        return load_positions(self._require_words(), self._capacity, self.path)

    def _scan(self, buf: memoryview, words: SharedWords) -> None:
        """`spec.index.process_index_scan`: index the frames published since the last scan.

        Without the lock (`frames.walk_frames`). Entries the tail passed go
        first; then each frame from where the last scan ended (or the tail)
        up to the head: a data frame seen PUBLISHED becomes its key's entry,
        one seen in another state drops an older entry of its key.
        """
        capacity = self._capacity
        tail, head = load_positions(words, capacity, self.path)
        index = self._index
        positions = self._order_positions
        keys = self._order_keys
        if len(positions) != len(keys):
            # An exception raised between the two deques' updates (a signal handler's,
            # issue 24): start the index again from the tail rather than pair them wrongly.
            positions.clear()
            keys.clear()
            index.clear()
            self._scanned_to = tail
        while positions and positions[0] < tail:
            old_position = positions.popleft()
            old_key = keys.popleft()
            if index.get(old_key) == old_position:
                del index[old_key]
        frames, end, complete = walk_frames(
            buf, words, capacity, self._shapes, max(self._scanned_to, tail), head, self.path
        )
        for position, _, fields, key in frames:
            if fields[1] == DATA_FRAME_TYPE:
                if fields[2] == FRAME_STATE_PUBLISHED:
                    index[key] = position
                    positions.append(position)
                    keys.append(key)
                else:
                    older = index.get(key)
                    if older is not None and older < position:
                        del index[key]  # a newer version exists: the older one is not deliverable
        self._scanned_to = end
        if complete:
            self._seen_head = head  # else the next get scans again

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
        place; the frame is DONE when the lease is released. LEASE with
        `decode` (a connector's borrowed get): `decode` gets the payload as
        a `borrow.BorrowedPayload` and the answer holds what it returned;
        the frame is CLAIMED (this process its holder) until the last view
        made from the payload dies, then DONE. If `decode` raises, the frame
        stays deliverable (unless something made from it outlives the
        failure: then it is claimed until that dies).

        With `position` (a descriptor) only that exact frame may be claimed;
        anything else answers STALE. BUSY: another process holds the ring
        lock; nothing changed.

        A get by key finds the frame through the reader's index
        (`spec.index.process_indexed_get`): it indexes the frames published
        since its last scan only when the head moved, then claims the
        index's candidate after checking the frame header there (key,
        position, state), so a stale entry costs a miss, never a wrong
        frame. A get with a descriptor checks the exact frame it names, and
        answers STALE when the index (caught up like a get by key's) holds
        a newer frame of the key. A get on an unchanged channel
        whose index has nothing for the key takes no lock and makes one
        system call: the fstat that refuses a ring file a neighbour
        truncated (CorruptFrameError, and the mapping is dropped) before a
        byte of it is touched, where touching it would be SIGBUS.
        """
        buf = self._buf
        words = self._words
        if buf is None:
            if self.shrunk is not None:
                raise CorruptFrameError(self.shrunk)
            raise ClosedError(f"ring reader is closed: path={self.path!r}")
        # The one system call of a poll: a file a neighbour truncated is never touched.
        if self._shrunk_now():
            self._drop_shrunk()
        key_bytes = key.encode("utf-8")
        if position is None:
            if load_head_acquire(words) != self._seen_head:
                self._scan(buf, words)
            found = self._index.get(key_bytes)
            if found is None:
                return _NOT_FOUND
            miss = _NOT_FOUND
        else:
            if not self._names_frame(buf, words, key_bytes, position):
                return _STALE
            # A newer frame of the key supersedes this one even while its
            # producer could not retire it (a busy lock defers the retire:
            # `engine._retire_positions`), so the index catches up first.
            if load_head_acquire(words) != self._seen_head:
                self._scan(buf, words)
            newest = self._index.get(key_bytes)
            if newest is not None and newest != position:
                return _STALE
            found = position
            miss = _STALE
        ring_state = load_ring_state_acquire(words)
        if ring_state != RING_STATE_OPEN:
            if ring_state == RING_STATE_CLOSED:
                return miss  # a closed ring delivers nothing; its producer retires the rest
            raise CorruptFrameError(f"bad ring state: state={ring_state} path={self.path!r}")
        return self._claim(buf, key_bytes, found, mode, decode, miss)

    def is_replaced(self) -> bool:
        """Whether the ring's name now names another file (its producer re-created the ring)."""
        try:
            here = self._dir.stat(self.path)
        except FileNotFoundError:
            return False
        return (here.st_dev, here.st_ino) != self.identity

    def _drop_shrunk(self) -> None:
        """The file shrank (`_shrink_problem`): unmap it and raise CorruptFrameError, now and at every later get."""
        self.shrunk = self._shrink_problem() or f"ring file shrank: path={self.path!r}"
        self._release_mapping()
        raise CorruptFrameError(self.shrunk)

    def _names_frame(
        self, buf: memoryview, words: SharedWords | None, key_bytes: bytes, position: int
    ) -> bool:
        """Whether a descriptor's `position` holds a frame of `key_bytes` now, by a lock-free look.

        Aligned, in [tail, head), far enough from the end of the data region
        for a data frame's header, and that header (read before the tail is
        loaded again: a frame the tail passed may be rewritten) names this
        key at this position. The claim checks it all again under the lock.
        """
        assert words is not None
        capacity = self._capacity
        if position % FRAME_ALIGNMENT:
            return False
        tail, head = load_positions(words, capacity, self.path)
        if not tail <= position < head or position % capacity + FRAME_HEADER_LENGTH > capacity:
            return False
        offset = RING_HEADER_LENGTH + position % capacity
        if not self._header_names(buf, offset, key_bytes, position):
            return False
        return load_tail_acquire(words) <= position

    def _header_names(
        self,
        buf: memoryview,
        offset: int,
        key_bytes: bytes,
        position: int,
        fields: FrameFields | None = None,
    ) -> bool:
        """Whether the frame header at mapping `offset` is a data frame of `key_bytes` at `position`.

        `fields`: the header as the caller already read it (else read here).
        """
        length, frame_type, _, key_length, payload_length, frame_position, _ = (
            fields if fields is not None else load_frame_header_fields(buf, offset)
        )
        key_start = offset + FRAME_KEY_OFFSET
        return (
            frame_position == position
            and frame_type == DATA_FRAME_TYPE
            and key_length == len(key_bytes)
            and self._shapes[key_length, payload_length] == length
            and offset + length <= RING_HEADER_LENGTH + self._capacity
            and buf[key_start : key_start + key_length] == key_bytes
        )

    def _claim(
        self,
        buf: memoryview,
        key_bytes: bytes,
        position: int,
        mode: ConsumeMode,
        decode: Callable[[memoryview], Any] | None,
        miss: Received,
    ) -> Received:
        """Claim the frame at `position` for `key_bytes` once, after checking its header there.

        `miss` says which get this is: NOT_FOUND for a get by key (`position`
        is the index's entry, dropped when the frame is no longer
        deliverable), STALE for a get with a descriptor (the index is not
        touched).
        """
        by_key = miss is _NOT_FOUND
        words = self._words
        offset = RING_HEADER_LENGTH + position % self._capacity
        # A frame another reader claimed since our scan is skipped without the
        # lock (issue 12: competing readers answered BUSY 249,570 times in a
        # soak, mostly retrying frames the other one had already taken). Only
        # a hint: the claim below re-reads the state under the lock, so
        # "exactly once" rests on the lock as before.
        state = load_frame_state_acquire(words, offset)
        if state != FRAME_STATE_PUBLISHED and self._claimed_elsewhere(words, position, state):
            if by_key:
                self._forget(key_bytes, position)
            self._skipped += 1
            return miss
        try:
            self._os.flock(self._fd, _TRY_LOCK)
        except BlockingIOError:
            state = load_frame_state_acquire(words, offset)
            if self._claimed_elsewhere(words, position, state):
                if by_key:
                    self._forget(key_bytes, position)
                self._skipped += 1  # lost the race for this very frame: not BUSY, gone
                return miss
            self._busy += 1
            return _BUSY
        self._locks += 1
        try:
            # Under the lock only this process moves the frame out of
            # PUBLISHED, and while the tail has not passed it the producer
            # changes nothing in it but its state (a retire): read the header,
            # the state, then the tail (a frame the tail passed may be rewritten).
            fields = load_frame_header_fields(buf, offset)
            state = load_frame_state_acquire(words, offset)
            if load_tail_acquire(words) > position:
                if by_key:
                    self._forget(key_bytes, position)  # reclaimed (and maybe rewritten) under us
                return miss
            if state != FRAME_STATE_PUBLISHED:
                if state not in _KNOWN_STATES:
                    raise corrupt_frame(position, f"bad frame state={state}", self.path)
                if by_key:
                    self._forget(key_bytes, position)
                return miss
            # PUBLISHED under the lock: neither reclaimed nor retired while we hold it.
            if not self._header_names(buf, offset, key_bytes, position, fields):
                if not by_key:
                    return miss  # the descriptor names no frame of this key: STALE
                # The scan saw a frame of this key here, and nothing but the
                # state of a frame changes before the tail passes it.
                self._forget(key_bytes, position)
                store_frame_state_release(words, offset, FRAME_STATE_RETIRED)
                raise corrupt_frame(
                    position, f"frame header changed since it was indexed: {fields}", self.path
                )
            _, _, _, key_length, payload_length, _, checksum = fields
            payload_start = offset + FRAME_KEY_OFFSET + key_length
            payload_end = payload_start + payload_length
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
                raise CorruptFrameError(
                    f"frame checksum mismatch at position={position}: checksum={checksum:#010x}; "
                    f"frame retired; path={self.path!r}"
                )
            if mode is ConsumeMode.LEASE and decode is not None:
                try:
                    value = self._lend(words, offset, payload_start, payload_end, position, decode)
                except _UNDECODABLE:
                    self._retire_undecodable(key_bytes, position, offset)
                    raise
            elif mode is ConsumeMode.LEASE:
                # The lease's export covers the whole frame: its release stores
                # DONE in this header (`borrow.mark_frame_done`).
                keep = (ctypes.c_char * (payload_end - offset)).from_buffer(
                    self._mapping,  # type: ignore[arg-type]
                    offset,
                )
                lease = Lease(keep, payload_start - offset, position=position)
                # The holder first, then CLAIMED (release): a producer that loads
                # CLAIMED reads this process as the holder (`engine.RingProducer._reclaim` frees dead holders).
                store_frame_holder_pid(words, offset, os.getpid())
                store_frame_state_release(words, offset, FRAME_STATE_CLAIMED)
                value = lease
            elif decode is None:
                store_frame_state_release(words, offset, FRAME_STATE_DONE)
            else:
                # decode reads in place; a view of ring storage it keeps pins the
                # frame (CLAIMED, never reclaimed) so the ring never rewrites it.
                try:
                    value, kept = call_with_view(
                        self._mapping,  # type: ignore[arg-type]
                        payload_start,
                        payload_end,
                        decode,
                        writable=False,
                        on_kept=lambda: store_frame_state_release(
                            words, offset, FRAME_STATE_CLAIMED
                        ),
                    )
                except _UNDECODABLE:
                    self._retire_undecodable(key_bytes, position, offset)
                    raise
                if kept:
                    raise BufferError(
                        f"decode kept a view of ring storage; frame pinned at position={position}"
                    )
                store_frame_state_release(words, offset, FRAME_STATE_DONE)
        finally:
            self._os.flock(self._fd, _UNLOCK)
        if by_key:
            del self._index[key_bytes]  # the entry named this frame (checked above, under the lock)
        self._gets += 1
        return _new_outcome(Received, (_DELIVERED, position, value))

    def _retire_undecodable(self, key_bytes: bytes, position: int, offset: int) -> None:
        """Under the lock: a payload that does not decode is consumed (RETIRED), as vllm-omni does.

        Left PUBLISHED it would fail every later get (and pin the ring);
        its error still reaches the caller. A frame a kept view pinned
        (CLAIMED) stays so.
        """
        words = self._words
        assert words is not None
        if load_frame_state_acquire(words, offset) == FRAME_STATE_PUBLISHED:
            store_frame_state_release(words, offset, FRAME_STATE_RETIRED)
            self._forget(key_bytes, position)

    def _lend(
        self,
        words: SharedWords | None,
        offset: int,
        payload_start: int,
        payload_end: int,
        position: int,
        decode: Callable[[BorrowedPayload], Any],
    ) -> Any:
        """LEASE with a decoder, under the lock: `decode` borrows the payload in place.

        The payload's export starts at the frame, so its release stores DONE
        in this header (`borrow.mark_frame_done`), armed only once the frame
        is CLAIMED: a decode that raises gives back nothing it did not take.
        """
        assert words is not None
        keep = (ctypes.c_char * (payload_end - offset)).from_buffer(
            self._mapping,  # type: ignore[arg-type]
            offset,
        )
        payload = BorrowedPayload(
            keep,
            ctypes.addressof(keep) + (payload_start - offset),
            payload_end - payload_start,
            label=self.path,
            position=position,
        )
        del keep
        baseline = sys.getrefcount(payload)
        try:
            value = decode(payload)
        except BaseException as error:
            # The finished frames of the traceback still name `payload` as a
            # local: only a reference from elsewhere is a view that outlives
            # the failure. Counting those frames pinned (and so consumed) every
            # key whose pool slot could not be mapped for want of descriptors
            # (issue 22, defect 2: a failed claim rolls back completely).
            traceback.clear_frames(error.__traceback__)
            if sys.getrefcount(payload) > baseline:  # a view outlives the failure: pin the frame
                self._hold(words, offset, payload)
            raise
        self._hold(words, offset, payload)
        return value  # `payload` dies here when nothing was borrowed: DONE at once

    @staticmethod
    def _hold(words: SharedWords, offset: int, payload: BorrowedPayload) -> None:
        # The holder first, then CLAIMED (release), as for a `Lease`; then the
        # release is armed: DONE once the last view of the payload dies.
        store_frame_holder_pid(words, offset, os.getpid())
        store_frame_state_release(words, offset, FRAME_STATE_CLAIMED)
        payload.arm(mark_frame_done)

    def _claimed_elsewhere(self, words: SharedWords | None, position: int, state: int) -> bool:
        """Whether the frame at `position`, whose state was just loaded, is surely no longer ours.

        A lock-free look. True only for a frame still in the lap (the tail has
        not passed it, checked after the state: a reclaimed slot may hold a
        newer frame) whose state is a known one past PUBLISHED.
        """
        assert words is not None
        if state == FRAME_STATE_PUBLISHED or state not in _KNOWN_STATES:
            return False  # claimable, or corrupt: the locked path decides and reports
        return load_tail_acquire(words) <= position  # else reclaimed meanwhile: the locked path

    def _forget(self, key_bytes: bytes, position: int) -> None:
        """`spec.index.process_index_forget`: drop the key's entry if it still names `position`."""
        if self._index.get(key_bytes) == position:
            del self._index[key_bytes]

    def release(self, position: int) -> None:
        """Mark the CLAIMED frame at `position` DONE (for a lease object that was lost).

        Prefer `Lease.release()`, which also drops the borrowed view.
        """
        buf = self._require_buf()
        words = self._words
        if self._shrunk_now():
            self._drop_shrunk()
        capacity = self._capacity
        tail, head = self._load_positions()
        offset = _data_offset(position, capacity)
        fields = load_frame_fields(buf, offset, capacity)
        state = fields[2]
        problem = frame_problem(position, head, fields, capacity, self._shapes)
        if not tail <= position < head or problem is not None or state != FRAME_STATE_CLAIMED:
            raise CorruptFrameError(
                f"no claimed frame to release at position={position}: state={state} "
                f"problem={problem}; path={self.path!r}"
            )
        store_frame_state_release(words, offset, FRAME_STATE_DONE)

    # -- inspection --------------------------------------------------------------

    def index_snapshot(self) -> ReaderIndex:
        """A copy of this reader's index in the model's terms (`spec.index.ReaderIndex`).

        What `spec.invariants.check_reader_index` checks against the ring: the
        position every frame below `scanned_to` was seen at, key by key. For
        inspection (the lockstep machines, the interleaving explorer); a get
        never reads it.
        """
        return ReaderIndex(
            scanned_to=self._scanned_to,
            entries={
                key.decode("utf-8", "surrogateescape"): position
                for key, position in self._index.items()
            },
        )

    @property
    def producer_closed(self) -> bool:
        """The producer closed the ring: nothing on it will be delivered.

        Asked after every miss of a connector's get on each of the edge's
        rings, so it loads the word itself (ClosedError once this reader is closed).
        """
        words = self._words
        if words is None:
            if self.shrunk is not None:
                return True  # unmapped: nothing on it will be delivered
            raise ClosedError(f"ring channel is closed: path={self.path!r}")
        return load_ring_state_acquire(words) == RING_STATE_CLOSED

    @property
    def wakeup_sequence(self) -> int:
        """Bumped by the producer after every publication (and at close).

        CorruptFrameError (and unmapped) once the file shrank.
        """
        words = self._require_words()
        if self._shrunk_now():
            self._drop_shrunk()
        return load_wakeup_sequence_acquire(words)

    def statistics(self) -> RingStatistics:
        """A lock-free walk of the ring (`frames.walk_frames`); frames moving meanwhile may be counted in either state."""
        buf = self._require_buf()
        words = self._words
        assert words is not None
        if self._shrunk_now():
            self._drop_shrunk()
        capacity = self._capacity
        tail, head = self._load_positions()
        published = claimed = 0
        frames, _, _ = walk_frames(buf, words, capacity, self._shapes, tail, head, self.path)
        for _, _, fields, _ in frames:
            if fields[1] == DATA_FRAME_TYPE:
                published += fields[2] == FRAME_STATE_PUBLISHED
                claimed += fields[2] == FRAME_STATE_CLAIMED
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

    @signals_deferred
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
