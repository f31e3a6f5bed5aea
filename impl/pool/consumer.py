"""The consumer's side of the pool: validate a reference, claim its slot, copy out or borrow.

`spec.pool.process_pool_claim` and `process_pool_release`. A consumer runs
`claim` only while it holds the claim of the ring frame carrying the
reference (the ring route's decode callback, under the ring's lock with the
frame PUBLISHED), so the claim needs no compare-and-swap on the slot: only
a consumer holding the carrier moves a slot out of PUBLISHED. It checks the
reference (`refs.decode_ref`), maps the slot file of the *ring's* producer
that the index names (once; mappings are kept, least recently used out),
checks the file is ours and its header (`slots.slot_problem`: magic,
version, capacity within the file, producer and index), the generation,
the state (PUBLISHED; or CLAIMED / DONE by a holder that died before it
finished the carrier, whose claim this one takes over), the length within
the capacity and, when the reference has one, the payload checksum. Any
failure is CorruptFrameError and reads nothing outside the mapping. Then
holder pid, then CLAIMED.

`PoolClaim` is the hook a borrowed get builds on: `.view` is a read-only
memoryview of the payload, borrowed from the slot's mapping, valid until
`.release()` (idempotent), which stores DONE; the slot's bytes are the
producer's and are not rewritten before then (`spec.pool.is_reusable`). The
owned path (`decode_owned`) decodes a copy, then releases.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, Final

from xxhash import xxh3_64_intdigest

from ...spec.layout import (
    POOL_SLOT_CLAIMED,
    POOL_SLOT_DONE,
    POOL_SLOT_HEADER_LENGTH,
    POOL_SLOT_PUBLISHED,
)
from ..directory import Directory, check_private_file
from ..errors import CorruptFrameError
from ..frame_io import SharedWords
from ..lifecycle import deferred_signals, signals_deferred
from ..liveness import is_holder_alive
from ..names import ConnectorIdentity, pool_slot_file_name
from ..os_seam import OPEN_FLAGS_EXISTING, OsFacade
from .refs import PoolRef, decode_ref
from .slots import (
    SlotMapping,
    load_slot_generation,
    load_slot_holder_pid,
    load_slot_payload_fields,
    load_slot_state_acquire,
    read_slot_identity,
    slot_problem,
    state_name,
    store_slot_holder_pid,
    store_slot_state_release,
)

# Slot files a consumer keeps mapped (one descriptor each), least recently used out.
MAX_MAPPED_SLOTS: Final = 256
# And the bytes they map: a mapping of a file its producer unlinked pins the
# file's pages until it goes (issue 22), so the cache is bounded in bytes too
# (twice the default pool budget of one producer); the newest always stays.
MAX_MAPPED_SLOT_BYTES: Final = 4 << 30


class _Slot:
    """A slot file of some producer, mapped by this consumer."""

    def __init__(self, mapping: SlotMapping, capacity: int, identity: tuple[int, int]) -> None:
        self.mapping = mapping
        self.capacity = capacity
        self.identity = identity  # (st_dev, st_ino) of the file mapped


class PoolClaim:
    """One claimed slot payload (see the module docstring for who owns the memory).

    `view` is read-only and borrowed from the producer's slot file; it stays
    valid (the mapping stays alive) for as long as it or anything made from
    it lives, but the producer may rewrite the bytes once `release()` ran.
    Writes are refused (read-only view).
    """

    _released: bool = False
    _words: SharedWords | None = None

    def __init__(self, slot: _Slot, ref: PoolRef) -> None:
        self._slot = slot
        self.generation = ref.generation
        self.nbytes = ref.payload_length
        buf = slot.mapping.buf
        # Its own header words: the reader may unmap the slot (least recently
        # used out) while a borrowed claim lives; the mapping then stays until
        # these and the view are released, and `release` still stores DONE.
        self._words = SharedWords(buf[:POOL_SLOT_HEADER_LENGTH])
        start = POOL_SLOT_HEADER_LENGTH
        self.view: memoryview = buf[start : start + ref.payload_length].toreadonly()

    @property
    def released(self) -> bool:
        return self._released

    def release(self) -> None:
        """`spec.pool.process_pool_release`: DONE (when the slot is still this claim's). Idempotent."""
        if self._released:
            return
        words = self._words
        if words is None:
            self._released = True
            return
        # Marked released only once DONE is stored: an exception a signal
        # handler raises before that leaves the claim releasable (by a retry,
        # or the borrowed payload's finalizer), never a slot CLAIMED for good
        # by a live holder (issue 24's interleaving explorer).
        if (
            load_slot_generation(words) == self.generation
            and load_slot_state_acquire(words) == POOL_SLOT_CLAIMED
        ):
            store_slot_state_release(words, POOL_SLOT_DONE)
        self._released = True
        self._words = None
        words.release()

    def undo(self) -> None:
        """The owned decode failed: PUBLISHED again (the carrier stays deliverable)."""
        self._released = True
        words, self._words = self._words, None
        if words is not None:
            store_slot_state_release(words, POOL_SLOT_PUBLISHED)
            words.release()


class PoolReader:
    """A consumer's mapped slots of every producer it reads (see the module docstring)."""

    def __init__(self, directory: Directory, os_facade: OsFacade) -> None:
        self._dir = directory
        self._os = os_facade
        self._slots: dict[tuple[ConnectorIdentity, int], _Slot] = {}  # LRU first
        self.claims = 0
        self.hits = 0  # claims that found the slot already mapped
        self.shed_slots = 0  # slot mappings released because descriptors ran short
        self._pid = os.getpid()

    # -- mapping ------------------------------------------------------------------------

    def _slot(self, producer: ConnectorIdentity, index: int) -> _Slot:
        key = (producer, index)
        slots = self._slots
        slot = slots.get(key)
        if slot is not None:
            shrunk = self._shrink_problem(pool_slot_file_name(producer, index), slot)
            if shrunk is not None:
                with deferred_signals():
                    del slots[key]
                    slot.mapping.close()  # never touched again; the next claim maps it afresh
                raise CorruptFrameError(shrunk)
            # Most recently used last: `del` then store, no call in between (issue 24).
            del slots[key]
            slots[key] = slot
            self.hits += 1
            return slot
        with deferred_signals():  # a descriptor and a mapping, kept (`lifecycle`)
            return self._attach(key, producer, index)

    def _attach(
        self, key: tuple[ConnectorIdentity, int], producer: ConnectorIdentity, index: int
    ) -> _Slot:
        """Map the slot file of a miss and keep it (one `deferred_signals` section: `_slot`)."""
        self._sweep(producer)  # a miss: the producer made slots, so it may have removed some
        name = pool_slot_file_name(producer, index)
        try:
            fd = self._dir.open(name, OPEN_FLAGS_EXISTING)
        except FileNotFoundError as error:
            raise CorruptFrameError(
                f"pool reference names a missing slot file: name={name!r}"
            ) from error
        try:
            info = self._os.fstat(fd)
            untrusted = check_private_file(name, info)
            if untrusted is not None:
                raise CorruptFrameError(f"pool slot not trusted: {untrusted}")
            if info.st_size < POOL_SLOT_HEADER_LENGTH:
                raise CorruptFrameError(
                    f"pool slot file of {info.st_size} bytes has no header: name={name!r}"
                )
            # No dup kept by the mapping: one descriptor per mapped slot (ours,
            # kept to see the file unlinked), not two (issue 22, defect 5).
            mapping = self._os.map_shared(fd, info.st_size)
        except BaseException:
            self._os.close(fd)
            raise
        slot_mapping = SlotMapping(fd, mapping, info.st_size, self._os)
        identity = read_slot_identity(slot_mapping.buf)
        problem = slot_problem(identity, info.st_size, producer, index)
        if problem is not None:
            slot_mapping.close()
            raise CorruptFrameError(f"{problem}: name={name!r}")
        slot = _Slot(slot_mapping, identity.capacity, (info.st_dev, info.st_ino))
        if len(self._slots) >= MAX_MAPPED_SLOTS:
            oldest = next(iter(self._slots))
            self._slots.pop(oldest).mapping.close()
        mapped = slot.mapping.file_length + self.mapped_bytes
        while self._slots and mapped > MAX_MAPPED_SLOT_BYTES:
            oldest = next(iter(self._slots))
            evicted = self._slots.pop(oldest).mapping
            mapped -= evicted.file_length
            evicted.close()
        self._slots[key] = slot
        return slot

    @property
    def mapped_bytes(self) -> int:
        """The bytes of every slot file this consumer maps now (at most `MAX_MAPPED_SLOT_BYTES`,
        or the one newest slot's)."""
        return sum(slot.mapping.file_length for slot in self._slots.values())

    def _shrink_problem(self, name: str, slot: _Slot) -> str | None:
        """Why the mapped slot may not be touched: its file shrank (issue 22, defect 3), or None.

        Touching a mapped page past the end of a file a same-uid neighbour
        truncated is SIGBUS; one stat of the name (through the directory
        descriptor) before the claim touches the mapping refuses it typed.
        With the slot's own descriptor the fstat is exact (also for a file
        unlinked after its producer emptied it at close, `PoolProducer.close`);
        by name, a file no longer at its name cannot be truncated by name
        any more. A truncation between this check and the copy still faults
        (docs/threat-model.md, "The window that stays open").
        """
        fd = slot.mapping.fd
        try:
            info = self._os.fstat(fd) if fd >= 0 else self._dir.stat(name)
        except OSError:
            return None  # gone from its name, or cannot tell (an injected fault): as before
        if fd < 0 and (info.st_dev, info.st_ino) != slot.identity:
            return None  # replaced: the file mapped here is unlinked
        if info.st_size < slot.mapping.file_length:
            return (
                f"pool slot file shrank under its mapping (a neighbour truncated it): "
                f"size={info.st_size} mapped={slot.mapping.file_length} name={name!r}"
            )
        return None

    @signals_deferred
    def _sweep(self, producer: ConnectorIdentity) -> None:
        """Unmap this producer's slots whose files are gone (evicted: no reference names them)."""
        for key in [key for key in self._slots if key[0] == producer]:
            slot = self._slots[key]
            try:
                gone = self._os.fstat(slot.mapping.fd).st_nlink == 0
            except OSError:
                gone = True
            if gone:
                self._slots.pop(key).mapping.close()

    # -- claim --------------------------------------------------------------------------

    def claim(self, producer: ConnectorIdentity, data: memoryview | bytes) -> PoolClaim:
        """`spec.pool.process_pool_claim` for the reference `data` on `producer`'s ring.

        Only while holding the carrier frame's ring claim. CorruptFrameError
        for a malformed reference or slot; nothing is claimed then.
        """
        ref = decode_ref(data)
        slot = self._slot(producer, ref.index)
        words = slot.mapping.words
        assert words is not None  # mapped
        # The creation fields again: a file changed under our mapping is not trusted.
        problem = slot_problem(
            read_slot_identity(slot.mapping.buf), slot.mapping.file_length, producer, ref.index
        )
        if problem is not None:
            raise CorruptFrameError(problem)
        generation = load_slot_generation(words)
        if generation != ref.generation:
            raise CorruptFrameError(
                f"pool slot={ref.index} holds generation={generation}, "
                f"the reference names generation={ref.generation}"
            )
        state = load_slot_state_acquire(words)
        # Past PUBLISHED under a carrier we now hold deliverable: its holder died, or it is
        # us, an earlier claim of ours that an exception (a signal handler's, issue 24)
        # stopped after the slot's store and before the carrier's. The slot is not reused
        # while its carrier is pending, so its bytes are the reference's still.
        if state != POOL_SLOT_PUBLISHED and not (
            state in (POOL_SLOT_CLAIMED, POOL_SLOT_DONE)
            and (
                load_slot_holder_pid(words) == self._pid
                or not is_holder_alive(load_slot_holder_pid(words), self._os)
            )
        ):
            raise CorruptFrameError(
                f"pool slot={ref.index} generation={generation} is {state_name(state)}, "
                "not published, under a deliverable reference"
            )
        length, checksum, flags = load_slot_payload_fields(words)
        if length != ref.payload_length or length > slot.capacity:
            raise CorruptFrameError(
                f"pool slot={ref.index} payload length={length}, reference says "
                f"{ref.payload_length}, capacity={slot.capacity}"
            )
        if (checksum, flags) != (ref.checksum, ref.flags):
            raise CorruptFrameError(
                f"pool slot={ref.index} checksum/flags {checksum:#x}/{flags} differ from "
                f"the reference's {ref.checksum:#x}/{ref.flags}"
            )
        claim = PoolClaim(slot, ref)
        if ref.checked and xxh3_64_intdigest(claim.view) != ref.checksum:
            claim.view.release()
            raise CorruptFrameError(
                f"pool slot={ref.index} payload checksum mismatch: checksum={ref.checksum:#x}"
            )
        store_slot_holder_pid(words, self._pid)  # the holder first, then CLAIMED
        store_slot_state_release(words, POOL_SLOT_CLAIMED)
        self.claims += 1
        return claim

    def decode_owned(
        self,
        producer: ConnectorIdentity,
        data: memoryview | bytes,
        decode: Callable[[memoryview], Any],
    ) -> tuple[int, Any]:
        """The owned path: claim, `decode` the payload into owned memory, release (DONE).

        If `decode` raises, the claim is undone (PUBLISHED again: the carrier
        stays deliverable, as a ring frame whose decode raised). BufferError,
        and the slot stays CLAIMED (its bytes are never rewritten under what
        was kept), when `decode` kept a view of the slot.
        """
        claim = self.claim(producer, data)
        view = claim.view
        try:
            value = decode(view)
        except BaseException:
            claim.undo()
            raise
        finally:
            view.release()  # BufferError if decode kept something made from it
        claim.release()
        self._forget_if_unlinked(producer, claim)
        return claim.nbytes, value

    def _forget_if_unlinked(self, producer: ConnectorIdentity, claim: PoolClaim) -> None:
        """After an owned get: no mapping of a slot whose file is gone stays (it would pin its pages)."""
        slot = claim._slot
        fd = slot.mapping.fd
        try:
            if fd < 0 or self._os.fstat(fd).st_nlink != 0:
                return
        except OSError:
            return
        for key, kept in list(self._slots.items()):
            if kept is slot:
                del self._slots[key]
        slot.mapping.close()

    # -- forgetting -----------------------------------------------------------------------

    @signals_deferred
    def release_producer(self, producer: tuple[int, ...]) -> None:
        """Unmap every slot of a producer that closed or exited."""
        for key in [key for key in self._slots if key[0] == tuple(producer)]:
            self._slots.pop(key).mapping.close()

    @signals_deferred
    def shed(self) -> int:
        """Out of descriptors: unmap half the mapped slots, least recently used first.

        `spec.pool` has unbounded descriptors; this is `connector.shortage`'s
        business. Each mapped slot holds one descriptor (ours; the mapping
        itself holds none, `OsFacade.map_shared`), so the entry goes. A
        borrowed claim of a shed slot keeps its own views, so that mapping
        lives on until they die (`frame_io.release_mapping`) and its release
        still stores DONE; the next claim of the slot maps it again. A shed
        runs only between tries of a failed call (`retry_short_of_descriptors`),
        never inside `claim`, so no claim loses the slot it runs on. Answers
        how many were unmapped.
        """
        count = (len(self._slots) + 1) // 2
        for key in list(self._slots)[:count]:
            self._slots.pop(key).mapping.close()
        self.shed_slots += count
        return count

    @property
    def mapped(self) -> int:
        return len(self._slots)

    @signals_deferred
    def close(self) -> None:
        for key in list(self._slots):
            self._slots.pop(key).mapping.close()
