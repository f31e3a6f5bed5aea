"""The producer engine: one ring's producer half of `spec.ring`, over shared memory.

Both producers of the ring layout run on it: the host ring (`RingChannel`,
`producer.py`) and the registered arena (`RegisteredArena`, `impl/registered/arena.py`).
Each owner maps its file and hands the engine four things: `_words` (the
mapping's `frame_io.SharedWords`), `_buf` (a writable view of the whole
mapping), `_capacity` and `_os`; the engine keeps the rest, the producer's
own record of the ring: its copies of head and tail (it is their only
writer) and the frames between them (position, length, key; None for
padding), so it never trusts a length read back from shared memory.

A put is three steps, each a method here, in the publication order of the
rationale in `shmring.impl.ring` (the crash points in parentheses are the
HOOK_* stages a test's publish hook is called at):

1. `_reserve`: reclaim, the room check, the dead-holder policy when short of
   room, the padding; the slot's length is zeroed (HOOK_RESERVED).
2. The owner writes the bytes: key, payload, zero fill (HOOK_PAYLOAD_WRITTEN).
   The host ring copies or lets a writer fill them; the arena's device copy
   lands there between `reserve` and `commit`.
3. `_commit`: the padding frame, the retire of the key's older version, the
   header fields (HOOK_FIELDS_WRITTEN), the length (release;
   HOOK_LENGTH_STORED), the head (release), the wake-up sequence.

Nothing a reader trusts changes before step 3's head store, so abandoning a
reservation (a writer that raised, the arena's `abort`) needs no undo: the
zeroed length lies in free space above head.

The instance attributes `_words` and `_buf` keep these names: the
interleaving explorer (`fault_injection.interleave.install_words`) swaps an
owner's `_words` for scheduled words, and the engine reads them from the
owner at every step. Not thread-safe, as its owners.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Final

from ...spec.layout import (
    DATA_FRAME_TYPE,
    FRAME_STATE_CLAIMED,
    FRAME_STATE_DONE,
    FRAME_STATE_PUBLISHED,
    FRAME_STATE_RETIRED,
    RING_HEADER_LENGTH,
)
from ...spec.ring import compute_free_space, compute_padding
from ..frame_io import (
    SharedWords,
    bump_wakeup_sequence_release,
    load_frame_holder_pid,
    load_frame_state_acquire,
    load_head_acquire,
    load_tail_acquire,
    store_frame_length_release,
    store_frame_state_release,
    store_head_release,
    store_tail_release,
    write_data_frame_fields,
    write_padding_frame_fields,
)
from ..lifecycle import signals_deferred
from ..liveness import is_holder_alive
from ..locks import PRODUCER_LOCK_WAIT_SECONDS, lock_exclusive_within
from ..os_seam import OsFacade

if TYPE_CHECKING:
    from ..directory import Directory
from .frames import walk_frames
from .mapping import _UNLOCK, _data_offset, _FrameShapes

PublishHook = Callable[[str], None]
# Stages a publish hook is called at (tests stop or kill the producer there).
HOOK_RESERVED: Final = "reserved"  # room decided, the slot reads "unpublished"; nothing written yet
HOOK_PAYLOAD_WRITTEN: Final = "payload written"  # key, payload, zero fill; no header yet
HOOK_FIELDS_WRITTEN: Final = "fields written"  # every header field but length
HOOK_LENGTH_STORED: Final = "length stored"  # frame complete; head not yet advanced


class RingProducer:
    """The producer's half of one ring: reserve, commit, reclaim, retire.

    A base class of its owners (so the hot path pays no indirection); an
    owner calls `_start_producer` once its mapping is in place.
    """

    # Set by the owner.
    _words: SharedWords | None = None
    _buf: memoryview | None = None
    _capacity: int = 0
    _os: OsFacade
    # Where holders' liveness files are (the host ring's directory): a holder of
    # another pid namespace is judged by them (`liveness.is_holder_alive`).
    _dir: Directory | None = None
    _fd: int = -1  # the ring file, locked while retiring (only the host ring retires)
    _locks: int = 0
    _publish_hook: PublishHook | None = None
    _closed: bool = False  # the owner closed the ring (`spec.ring.RingState.closed`)
    # Frames a replacement moved (closed rings only): old position -> (new ring, position).
    forwarded: dict[int, tuple[RingProducer, int]] = {}  # noqa: RUF012 - replaced, never mutated
    # When the dead-holder policy runs at a reserve. False: only when the put is
    # short of room (the host ring: a live holder costs no system call on puts
    # that fit). True: at every reclaim (the arena, whose `reclaim` promises it).
    _FREE_DEAD_HOLDERS_AT_EVERY_RECLAIM: bool = False

    def _start_producer(self, capacity: int) -> None:
        """An empty ring: `spec.ring.initialize_ring`."""
        self._capacity = capacity
        self._head = 0  # our copy of head (we are its only writer)
        self._tail = 0  # our copy of tail (we are its only writer)
        # Frames between tail and head in position order: (position, length, key or None for padding).
        self._frames: deque[tuple[int, int, str | None]] = deque()
        # key -> position of the key's newest frame that may still be PUBLISHED.
        self._published: dict[str, int] = {}
        # (key length, payload length) -> frame length, minus it when not admitted
        # (`spec.ring.is_admitted`): the admission step of `process_put`.
        self._shapes = _FrameShapes(capacity)
        self._puts = 0
        self._refused_not_admitted = 0
        self._refused_full = 0
        self._retired = 0
        self._reclaimed_from_dead_holders = 0
        # Frames a retire could not lock (another process held the ring lock past
        # `locks.PRODUCER_LOCK_WAIT_SECONDS`): (key, position), retired later (`_retry_deferred`).
        self._deferred: list[tuple[str, int]] = []
        self._deferred_retires = 0  # retires deferred so far (health)

    # -- inspection ------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def head(self) -> int:
        """Where the next frame starts (our copy; the mapping's head is stored from it)."""
        return self._head

    @property
    def tail(self) -> int:
        """The oldest unreclaimed frame's position (our copy, as `head`)."""
        return self._tail

    def frame_pending(self, position: int) -> bool:
        """Whether our frame at `position` may still be claimed or is held (PUBLISHED, CLAIMED).

        False once it was claimed (DONE), retired or reclaimed, or the ring
        closed: what the pool asks of a slot's carrier (`impl.pool.producer`).
        """
        words = self._words
        if self._closed or words is None or position < self._tail or position >= self._head:
            forwarded = self.forwarded.get(position) if self._closed else None
            # A frame moved to the ring that replaced this one (issue 22): ask there.
            return forwarded is not None and forwarded[0].frame_pending(forwarded[1])
        state = load_frame_state_acquire(words, _data_offset(position, self._capacity))
        return state in (FRAME_STATE_PUBLISHED, FRAME_STATE_CLAIMED)

    def frame_state(self, position: int) -> int:
        """The state stored in the shared header of the frame at `position` (one in the lap).

        What the lockstep machines compare with the model, for the host ring
        and the arena alike (`model_tests/engine_machine.py`).
        """
        return load_frame_state_acquire(self._words, _data_offset(position, self._capacity))

    def admits(self, key_length: int, payload_length: int) -> bool:
        """`spec.ring.is_admitted` for a frame of this shape (never a question of free space)."""
        return self._shapes[key_length, payload_length] >= 0

    # -- put -------------------------------------------------------------------

    def _reserve(self, head: int, frame_length: int) -> int:
        """Room for an admitted frame at `head`: the padding before it, or -1 (FULL).

        `spec.ring.process_put` from its `process_reclaim` to `compute_padding`:
        reclaim, then the room check (`compute_has_space` as the model
        defines it, padding plus frame against `compute_free_space`, with the
        padding computed once: two helper calls a put, not four). The
        dead-holder policy (`_reclaim(free_dead_holders=True)`) runs with the
        reclaim where the owner says so (`_FREE_DEAD_HOLDERS_AT_EVERY_RECLAIM`),
        else only when the check says no, and then the check again. On room,
        the slot's length is zeroed (it reads "nothing here") and
        HOOK_RESERVED is called; head does not move. `head` is where the
        frame would go: the arena reserves after its pending reservations.
        """
        every_reclaim = self._FREE_DEAD_HOLDERS_AT_EVERY_RECLAIM
        if self._deferred:
            self._retry_deferred()
        if self._frames:
            self._reclaim(every_reclaim)
        capacity = self._capacity
        padding = compute_padding(capacity, head, frame_length)
        needed = padding + frame_length
        if needed > compute_free_space(capacity, head, self._tail) and (
            every_reclaim
            or not self._reclaim(True)
            or needed > compute_free_space(capacity, head, self._tail)
        ):
            self._refused_full += 1
            return -1
        words = self._words
        assert words is not None  # open while the owner is
        store_frame_length_release(words, RING_HEADER_LENGTH + (head + padding) % capacity, 0)
        hook = self._publish_hook
        if hook is not None:
            hook(HOOK_RESERVED)
        return padding

    def _commit(
        self,
        position: int,
        padding: int,
        frame_length: int,
        key: str,
        key_length: int,
        payload_length: int,
        checksum: int,
        wake: bool,
    ) -> int:
        """Publish the reserved frame whose bytes are written; answer how many it retired.

        `spec.ring.process_put` from the padding on: the padding frame before
        it (DONE, its length last), `process_cancel` of the key's older
        version (before the new one is visible), the header fields
        (HOOK_FIELDS_WRITTEN), the length (release; HOOK_LENGTH_STORED), the
        head (release) and, when `wake`, the wake-up sequence. Then the
        record: head, the frames, the key's newest position.
        """
        buf = self._buf
        words = self._words
        assert buf is not None and words is not None  # open while the owner is
        capacity = self._capacity
        hook = self._publish_hook
        offset = RING_HEADER_LENGTH + position % capacity
        head = position - padding
        if padding:
            padding_offset = RING_HEADER_LENGTH + head % capacity
            write_padding_frame_fields(buf, padding_offset, FRAME_STATE_DONE)
            store_frame_length_release(words, padding_offset, padding)
        published = self._published
        retired = self._retire_key(key) if key in published else 0
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
        if wake:
            bump_wakeup_sequence_release(words)
        self._head = new_head
        frames = self._frames
        if padding:
            frames.append((head, padding, None))
        frames.append((position, frame_length, key))
        published[key] = position
        self._puts += 1
        return retired

    # -- settling after an interrupted put -------------------------------------

    def _settle(self, path: str) -> None:
        """Rebuild our copy of head, tail and the frame record from the ring itself (issue 24).

        An exception raised inside a put (a signal handler's) can stop it
        between a shared store and our record of it: head stored but not
        recorded, a frame recorded but head not stored, a reclaimed frame
        dropped from the record before the tail moved. The ring is the
        truth (we are the only writer of head and tail, and a frame is
        published exactly when head passes it), so the record is read back
        from it: what head passed is published, what it did not is nothing.
        """
        words, buf = self._words, self._buf
        assert words is not None and buf is not None  # open while the owner is
        tail, head = load_tail_acquire(words), load_head_acquire(words)
        walked, _, _ = walk_frames(buf, words, self._capacity, self._shapes, tail, head, path)
        frames: deque[tuple[int, int, str | None]] = deque()
        published: dict[str, int] = {}
        for position, _, fields, key_bytes in walked:
            if fields[1] != DATA_FRAME_TYPE:
                frames.append((position, fields[0], None))
                continue
            key = key_bytes.decode("utf-8")
            frames.append((position, fields[0], key))
            if fields[2] in (FRAME_STATE_PUBLISHED, FRAME_STATE_CLAIMED):
                published[key] = position
        self._frames, self._published = frames, published
        self._head, self._tail = head, tail

    # -- reclaim ---------------------------------------------------------------

    def _reclaim(self, free_dead_holders: bool = False) -> int:
        """Advance the tail over DONE, RETIRED and padding frames; answer the bytes freed.

        `spec.ring.process_reclaim`, over the producer's own record. With
        `free_dead_holders`, the dead-holder policy too: a CLAIMED frame
        whose holder is surely dead (`discovery.is_holder_alive`; the holder
        stores its pid before CLAIMED) had its views die with it, so it is
        marked DONE and passed, as `spec.leases.process_holder_exit` releases
        a dead holder's leases. Stops at the first frame PUBLISHED or held by
        a live holder. The tail is stored before any byte of the space it
        frees is rewritten.
        """
        frames = self._frames
        words = self._words
        assert words is not None  # open while the owner is
        capacity = self._capacity
        published = self._published
        tail = self._tail
        while frames:
            position, length, key = frames[0]
            if key is not None:
                offset = RING_HEADER_LENGTH + position % capacity
                state = load_frame_state_acquire(words, offset)
                if state != FRAME_STATE_DONE and state != FRAME_STATE_RETIRED:
                    if (
                        not free_dead_holders
                        or state != FRAME_STATE_CLAIMED
                        or is_holder_alive(
                            load_frame_holder_pid(words, offset), self._os, self._dir
                        )
                    ):
                        break
                    store_frame_state_release(words, offset, FRAME_STATE_DONE)
                    self._reclaimed_from_dead_holders += 1
                if key in published and published[key] == position:
                    del published[key]
            frames.popleft()
            tail += length
        freed = tail - self._tail
        if freed:
            self._tail = tail
            store_tail_release(words, tail)  # before any byte of the freed space is rewritten
        return freed

    # -- retire ----------------------------------------------------------------

    def _retire_key(self, key: str) -> int:
        """`spec.ring.process_cancel`: retire the key's unclaimed frame; answer 0 or 1."""
        position = self._published.get(key)
        if position is None:
            return 0
        return self._retire_positions([(key, position)])

    @signals_deferred  # its lock and unlock: no handler between them (issue 24)
    def _retire_positions(self, candidates: list[tuple[str, int]], closing: bool = False) -> int:
        """Retire those of `candidates` still PUBLISHED, under the ring lock.

        The retire step of `process_cancel`, `process_cancel_prefix` and
        `process_close`. A state other than PUBLISHED is final, so it is read
        without the lock first and the lock is taken only when something may
        need retiring. The arena never gets here: its keys are unique
        sequence numbers, so no put has an older version to retire.

        The lock is waited for at most `locks.PRODUCER_LOCK_WAIT_SECONDS`
        (another process holds it). Past that the frames stay PUBLISHED, are
        not counted, and are retired at a later producer call
        (`_retry_deferred`); a re-put's older frame is hidden meanwhile by
        the newer one (readers index a key's newest frame). `closing` (the
        ring is CLOSED already, which no claim passes): what is still
        PUBLISHED then counts as retired, unlocked.
        """
        words = self._words
        assert words is not None  # open while the owner is
        capacity = self._capacity
        published = self._published
        live = []
        for key, position in candidates:
            if load_frame_state_acquire(words, _data_offset(position, capacity)) == (
                FRAME_STATE_PUBLISHED
            ):
                live.append((key, position))
            elif published.get(key) == position:
                del published[key]  # claimed by a reader: nothing to retire
        if not live:
            return 0
        retired = 0
        if not lock_exclusive_within(self._os, self._fd, PRODUCER_LOCK_WAIT_SECONDS):
            for key, position in live:
                if published.get(key) == position:
                    del published[key]
            if closing:
                # CLOSED is stored: no claim starts any more; a claim the holder has
                # under way may still complete (it began before the close).
                retired = sum(
                    load_frame_state_acquire(words, _data_offset(position, capacity))
                    == FRAME_STATE_PUBLISHED
                    for _key, position in live
                )
                self._retired += retired
                return retired
            self._deferred.extend(live)
            self._deferred_retires += len(live)
            return 0
        self._locks += 1
        try:
            for key, position in live:
                offset = _data_offset(position, capacity)
                if load_frame_state_acquire(words, offset) == FRAME_STATE_PUBLISHED:
                    store_frame_state_release(words, offset, FRAME_STATE_RETIRED)
                    retired += 1
                if published.get(key) == position:
                    del published[key]
        finally:
            self._os.flock(self._fd, _UNLOCK)
        self._retired += retired
        return retired

    @signals_deferred  # its lock and unlock: no handler between them (issue 24)
    def _retry_deferred(self) -> int:
        """Retire the frames a busy lock made us leave, if the lock is free now; answer how many.

        Never waits: the lock is tried once (a later call tries again).
        Frames claimed since (or reclaimed) are dropped from the list.
        """
        words = self._words
        deferred = self._deferred
        if words is None or not deferred:
            return 0
        capacity = self._capacity
        live = [
            (key, position)
            for key, position in deferred
            if position >= self._tail
            and load_frame_state_acquire(words, _data_offset(position, capacity))
            == FRAME_STATE_PUBLISHED
        ]
        if not live:
            deferred.clear()
            return 0
        if not lock_exclusive_within(self._os, self._fd, 0.0):
            deferred[:] = live
            return 0
        self._locks += 1
        retired = 0
        try:
            for _key, position in live:
                offset = _data_offset(position, capacity)
                if load_frame_state_acquire(words, offset) == FRAME_STATE_PUBLISHED:
                    store_frame_state_release(words, offset, FRAME_STATE_RETIRED)
                    retired += 1
        finally:
            self._os.flock(self._fd, _UNLOCK)
        deferred.clear()
        self._retired += retired
        return retired

    @property
    def deferred_retires(self) -> tuple[int, int]:
        """(retires deferred so far, frames waiting to be retired now)."""
        return self._deferred_retires, len(self._deferred)

    # -- inspection --------------------------------------------------------------

    def _count_unreclaimed(self) -> tuple[int, int]:
        """(PUBLISHED, CLAIMED) data frames between tail and head, as loaded now."""
        words = self._words
        published = claimed = 0
        if words is not None:
            for position, _length, key in self._frames:
                if key is None:
                    continue
                state = load_frame_state_acquire(words, _data_offset(position, self._capacity))
                published += state == FRAME_STATE_PUBLISHED
                claimed += state == FRAME_STATE_CLAIMED
        return published, claimed


__all__ = [
    "HOOK_FIELDS_WRITTEN",
    "HOOK_LENGTH_STORED",
    "HOOK_PAYLOAD_WRITTEN",
    "HOOK_RESERVED",
    "PublishHook",
    "RingProducer",
]
