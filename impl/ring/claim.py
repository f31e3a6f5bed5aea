"""The claim step of a ring reader's get: one frame taken once, under the ring lock.

`RingReader.get` finds the frame (its index's entry, or a descriptor's
position) and hands it to `ReaderClaim._claim`, which takes it in these
steps, each a method here:

1. a lock-free look at the frame's state: a frame another reader claimed
   is skipped without the lock (`_claimed_elsewhere`, issue 12);
2. the ring lock with LOCK_NB, taken inside the `try` whose `finally`
   drops it (BUSY when another process holds it);
3. under the lock, the frame header read again and checked
   (`_check_under_lock`: the tail, the state, the key at the position);
4. still under it, the payload checked against its checksum and delivered
   in the get's mode (`_deliver`: a copy, a decode in place, a `Lease`
   (`_lease`), or a borrowed payload (`_lend`));
5. after the unlock, the index's entry dropped and the get counted.

The same system calls in the same order as one method would make: the
steps only name the parts.
"""

from __future__ import annotations

import ctypes
import os
import sys
import traceback
from collections.abc import Callable
from typing import Any, Final

from ...spec.layout import (
    DATA_FRAME_TYPE,
    FRAME_KEY_OFFSET,
    FRAME_STATE_CLAIMED,
    FRAME_STATE_DONE,
    FRAME_STATE_PUBLISHED,
    FRAME_STATE_RETIRED,
    RING_HEADER_LENGTH,
)
from ...spec.ring import (
    ConsumeMode,
)
from ..errors import (
    CorruptFrameError,
    UnsupportedPayloadError,
)
from ..frame_io import (
    SharedWords,
    compute_checksum,
    load_frame_header_fields,
    load_frame_state_acquire,
    load_tail_acquire,
    store_frame_holder_pid,
    store_frame_state_release,
)
from .borrow import (
    BorrowedPayload,
    Lease,
    call_with_view,
    mark_frame_done,
)
from .frames import corrupt_frame
from .mapping import (
    _KNOWN_STATES,
    _TRY_LOCK,
    _UNLOCK,
    FrameFields,
    _new_outcome,
    _RingFile,
)
from .results import (
    _BUSY,
    _DELIVERED,
    _NOT_FOUND,
    Received,
)

# What a decoder raises for a payload that will never decode (issue 27: consumed, not kept).
_UNDECODABLE: Final = (CorruptFrameError, UnsupportedPayloadError)


class ReaderClaim(_RingFile):
    """The claim half of `RingReader` (see the module docstring): one frame, claimed once."""

    # The reader's index and counters (`RingReader.__init__` sets them).
    _index: dict[bytes, int]
    _gets: int
    _busy: int
    _skipped: int

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
        # The lock is taken inside the `try` whose `finally` drops it: an exception a
        # signal handler raises the moment flock returns still unlocks (issue 24's
        # explorer). Unlocking on BUSY is a no-op (the lock is the other holder's).
        try:
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
            fields = self._check_under_lock(buf, words, key_bytes, position, offset, by_key)
            if fields is None:
                return miss
            value = self._deliver(buf, words, key_bytes, position, offset, fields, mode, decode)
        finally:
            self._os.flock(self._fd, _UNLOCK)
        if by_key:
            del self._index[key_bytes]  # the entry named this frame (checked above, under the lock)
        self._gets += 1
        return _new_outcome(Received, (_DELIVERED, position, value))

    def _check_under_lock(
        self,
        buf: memoryview,
        words: SharedWords | None,
        key_bytes: bytes,
        position: int,
        offset: int,
        by_key: bool,
    ) -> FrameFields | None:
        """Under the lock: the header at `offset`, if it is still `key_bytes`'s PUBLISHED frame at `position`.

        None is a miss (a get by key forgets its entry); a bad state, or a
        header that changed since a scan indexed it (the frame retired), is
        CorruptFrameError.
        """
        # Under the lock only this process moves the frame out of
        # PUBLISHED, and while the tail has not passed it the producer
        # changes nothing in it but its state (a retire): read the header,
        # the state, then the tail (a frame the tail passed may be rewritten).
        fields = load_frame_header_fields(buf, offset)
        state = load_frame_state_acquire(words, offset)
        if load_tail_acquire(words) > position:
            if by_key:
                self._forget(key_bytes, position)  # reclaimed (and maybe rewritten) under us
            return None
        if state != FRAME_STATE_PUBLISHED:
            if state not in _KNOWN_STATES:
                raise corrupt_frame(position, f"bad frame state={state}", self.path)
            if by_key:
                self._forget(key_bytes, position)
            return None
        # PUBLISHED under the lock: neither reclaimed nor retired while we hold it.
        if not self._header_names(buf, offset, key_bytes, position, fields):
            if not by_key:
                return None  # the descriptor names no frame of this key: STALE
            # The scan saw a frame of this key here, and nothing but the
            # state of a frame changes before the tail passes it.
            self._forget(key_bytes, position)
            store_frame_state_release(words, offset, FRAME_STATE_RETIRED)
            raise corrupt_frame(
                position, f"frame header changed since it was indexed: {fields}", self.path
            )
        return fields

    def _deliver(
        self,
        buf: memoryview,
        words: SharedWords | None,
        key_bytes: bytes,
        position: int,
        offset: int,
        fields: FrameFields,
        mode: ConsumeMode,
        decode: Callable[[memoryview], Any] | None,
    ) -> Any:
        """Under the lock: the payload of the frame `_check_under_lock` passed, checked and handed over in `mode`.

        Answers the get's value. A checksum mismatch retires the frame
        (CorruptFrameError); see `RingReader.get` for what each mode leaves
        in the frame's state.
        """
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
            value = self._lease(words, offset, payload_start, payload_end, position)
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
                    on_kept=lambda: store_frame_state_release(words, offset, FRAME_STATE_CLAIMED),
                )
            except _UNDECODABLE:
                self._retire_undecodable(key_bytes, position, offset)
                raise
            if kept:
                raise BufferError(
                    f"decode kept a view of ring storage; frame pinned at position={position}"
                )
            store_frame_state_release(words, offset, FRAME_STATE_DONE)
        return value

    def _lease(
        self,
        words: SharedWords | None,
        offset: int,
        payload_start: int,
        payload_end: int,
        position: int,
    ) -> Lease:
        """LEASE without a decoder, under the lock: a `Lease` of the payload in place, the frame CLAIMED."""
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
        return lease

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
