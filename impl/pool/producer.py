"""The producer's pool: slots in size classes, reused without a new file on the steady path.

`spec.pool` step by step: `acquire` is `process_pool_acquire` (reuse, else
create within the budget after evicting reusable slots of other classes),
`publish` is `process_pool_publish` (the carrier follows on the ring),
`abandon` is `process_pool_abandon`, `close` is `process_pool_close`.
`process_pool_carrier_gone` needs no call: the producer asks a slot's
carrier (a callable from the ring route: is my frame at that position
still PUBLISHED or CLAIMED?) when it looks for a reusable slot, then loads
the slot's state. That order is the safety argument: a consumer stores
CLAIMED on the slot before it finishes the carrier, so once the carrier is
seen gone, the state loaded after it is the consumer's last word (DONE, or
CLAIMED while its lease lives), and a PUBLISHED one was never claimed and
never will be. A CLAIMED slot is reusable only when its holder is surely
dead (`liveness.is_holder_alive`).

Not thread-safe (the connector's lock serializes it).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass

from xxhash import xxh3_64_intdigest

from ...spec.layout import (
    POOL_FLAG_CHECKSUM,
    POOL_MAX_SLOT_INDEX,
    POOL_SLOT_CLAIMED,
    POOL_SLOT_DONE,
    POOL_SLOT_FREE,
    POOL_SLOT_HEADER_LENGTH,
    POOL_SLOT_PUBLISHED,
    compute_slot_capacity,
)
from ...spec.pool import compute_class, compute_slot_charge
from ..directory import Directory
from ..lifecycle import signals_deferred
from ..liveness import is_holder_alive
from ..names import ConnectorIdentity, pool_slot_file_name
from ..os_seam import OPEN_FLAGS_EXISTING, OsFacade
from .refs import encode_ref
from .slots import (
    SlotMapping,
    create_slot_file,
    load_slot_holder_pid,
    load_slot_state_acquire,
    store_slot_publish_fields,
    store_slot_state_release,
)

# Answers whether the ring frame carrying a slot's reference may still be claimed.
Carrier = Callable[[], bool]


@dataclass(frozen=True)
class PoolStatistics:
    """Counters of one producer's pool."""

    slots: int  # slot files now
    used_bytes: int  # their charge (file pages); <= budget
    created: int  # slot files created
    reused: int  # acquires that took an existing slot (no file created)
    evicted: int  # slot files removed to make room for another class
    exhausted: int  # acquires with no slot to be had (the put fell back)
    create_failures: int  # slot creations the OS refused (ENOSPC, EMFILE, ...)


class OwnedSlot:
    """One slot file of our pool, mapped once: `size_class` + headroom payload bytes."""

    def __init__(self, index: int, size_class: int, name: str, mapping: SlotMapping) -> None:
        self.index = index
        self.size_class = size_class
        self.capacity = compute_slot_capacity(size_class)  # the header's capacity field
        self.name = name
        self.charge = compute_slot_charge(size_class)
        self.mapping = mapping
        self.carrier: Carrier | None = None  # set while its carrier frame may be claimed

    def payload_view(self, nbytes: int) -> memoryview:
        """A writable view of the first `nbytes` payload bytes (release it before the next step)."""
        return self.mapping.buf[POOL_SLOT_HEADER_LENGTH : POOL_SLOT_HEADER_LENGTH + nbytes]


class PoolProducer:
    """`spec.pool.PoolState` of one connector (see the module docstring)."""

    _closed: bool = False

    def __init__(
        self,
        directory: Directory,
        identity: ConnectorIdentity,
        os_facade: OsFacade,
        *,
        min_class: int,
        max_class: int,
        budget: int,
        checksum: bool,
    ) -> None:
        self._dir = directory
        self._identity = identity
        self._os = os_facade
        self.min_class = min_class
        self.max_class = max_class
        self.budget = budget
        self.checksum = checksum
        self.slots: dict[int, OwnedSlot] = {}  # by index, ascending (indices only grow)
        # Slot files being created: named here before they exist (issue 24), so close
        # removes one whose creation an exception stopped before `slots` recorded it.
        self._creating: set[str] = set()
        self.used_bytes = 0
        self._next_index = 0
        self._next_generation = 1
        self.created = self.reused = self.evicted = self.exhausted = self.create_failures = 0
        self.last_error: BaseException | None = None  # the last creation failure
        self.lost = 0  # slot files a neighbour truncated or unlinked (removed, issue 22)
        self._lost: list[OwnedSlot] = []  # found lost by the acquire under way

    def _file_lost(self, slot: OwnedSlot) -> bool:
        """Whether a neighbour truncated (touching it is SIGBUS) or unlinked the slot's file.

        One stat of the name through the directory descriptor, before the
        slot's mapping is touched (issue 22, defect 3).
        """
        try:
            info = self._dir.stat(slot.name)
        except FileNotFoundError:
            return True  # unlinked: no reader could open it
        except OSError:
            return False  # cannot tell (an injected fault): the slot is used as before
        return info.st_size < slot.mapping.file_length

    # -- reuse --------------------------------------------------------------------------

    def _is_reusable(self, slot: OwnedSlot) -> bool:
        """`spec.pool.is_reusable`: the carrier first, then the state (module docstring).

        A slot whose file a neighbour truncated or unlinked is never reusable
        (`_file_lost`); `acquire` removes it.
        """
        if self._file_lost(slot):
            self._lost.append(slot)
            return False
        carrier = slot.carrier
        if carrier is not None:
            if carrier():
                return False
            slot.carrier = None
        words = slot.mapping.words
        assert words is not None  # open
        if load_slot_state_acquire(words) != POOL_SLOT_CLAIMED:
            return True
        return not is_holder_alive(load_slot_holder_pid(words), self._os, self._dir)

    @signals_deferred
    def acquire(self, nbytes: int) -> OwnedSlot | None:
        """`spec.pool.process_pool_acquire`: a FREE slot to write, or None (the put falls back).

        None for TOO_LARGE, EXHAUSTED and a creation the OS refused
        (`last_error` keeps it; nothing is left behind).
        """
        if self._closed or self.budget == 0:
            return None
        size_class = compute_class(self.min_class, self.max_class, nbytes)
        if size_class is None:
            return None
        try:
            return self._acquire(size_class)
        finally:
            lost, self._lost = self._lost, []
            for slot in lost:
                self.lost += 1
                self._remove(slot)  # never touched again; its carrier's frame names a gone file

    def _acquire(self, size_class: int) -> OwnedSlot | None:
        for slot in self.slots.values():
            if slot.size_class == size_class and self._is_reusable(slot):
                self._make_free(slot)
                self.reused += 1
                return slot
        charge = compute_slot_charge(size_class)
        evict: list[OwnedSlot] = []
        freed = 0
        for slot in self.slots.values():
            if self.used_bytes - freed + charge <= self.budget:
                break
            if slot.size_class != size_class and self._is_reusable(slot):
                evict.append(slot)
                freed += slot.charge
        if self.used_bytes - freed + charge > self.budget or self._next_index > POOL_MAX_SLOT_INDEX:
            self.exhausted += 1
            return None
        for slot in evict:
            self._remove(slot)
            self.evicted += 1
        index = self._next_index
        self._next_index += 1  # consumed also by a failed creation: a name is made once
        name = pool_slot_file_name(self._identity, index)
        self._creating.add(name)
        try:
            mapping = create_slot_file(
                self._dir, name, self._identity, index, compute_slot_capacity(size_class), self._os
            )
        except OSError as error:  # NoSpaceError, EMFILE, ...: the put falls back
            self.create_failures += 1
            self.last_error = error
            return None
        slot = OwnedSlot(index, size_class, name, mapping)
        self.slots[index] = slot
        self._creating.discard(name)
        self.used_bytes += charge
        self.created += 1
        return slot

    def _make_free(self, slot: OwnedSlot) -> None:
        words = slot.mapping.words
        assert words is not None
        slot.carrier = None
        store_slot_state_release(words, POOL_SLOT_FREE)

    # -- publish ------------------------------------------------------------------------

    def publish(self, slot: OwnedSlot, nbytes: int) -> bytes:
        """`spec.pool.process_pool_publish`: fields, then PUBLISHED; answers the reference bytes.

        The payload is already in `payload_view(nbytes)`. The caller puts the
        reference on the ring, then `carried(slot, carrier)` (or `abandon`).
        """
        words = slot.mapping.words
        assert words is not None and 0 <= nbytes <= slot.capacity
        generation = self._next_generation
        self._next_generation += 1
        checksum = flags = 0
        if self.checksum:
            with slot.payload_view(nbytes) as payload:
                checksum = xxh3_64_intdigest(payload)
            flags = POOL_FLAG_CHECKSUM
        store_slot_publish_fields(words, generation, nbytes, checksum, flags)
        store_slot_state_release(words, POOL_SLOT_PUBLISHED)  # last
        return encode_ref(slot.index, generation, nbytes, checksum, flags)

    def carried(self, slot: OwnedSlot, carrier: Carrier) -> None:
        """The ring published the reference: the slot waits for its carrier to go."""
        slot.carrier = carrier

    @signals_deferred
    def abandon(self, slot: OwnedSlot) -> None:
        """`spec.pool.process_pool_abandon`: the ring refused the carrier; FREE again."""
        self._make_free(slot)

    # -- removal ------------------------------------------------------------------------

    def _remove(self, slot: OwnedSlot) -> None:
        """Unlink, then forget: a slot whose unlink failed stays (a retried close removes it)."""
        with contextlib.suppress(FileNotFoundError):
            self._dir.unlink(slot.name)
        del self.slots[slot.index]
        self.used_bytes -= slot.charge
        slot.mapping.close()

    @signals_deferred
    def close(self) -> int:
        """`spec.pool.process_pool_close`: unlink every slot file; answers how many. Idempotent.

        A slot no reader holds or may still claim (FREE or DONE) is emptied
        first (ftruncate to 0), so its pages go now even where an idle
        reader still maps the file (issue 22: 261 MiB of deleted slots stayed
        pinned until the reader's next get); readers fstat a slot before
        touching it (`consumer.PoolReader._shrink_problem`). A CLAIMED slot
        (a borrowed view may live) or a PUBLISHED one is only unlinked.
        """
        self._closed = True
        removed = 0
        for slot in list(self.slots.values()):
            self._empty_if_unheld(slot)
            self._remove(slot)
            removed += 1
        for name in sorted(self._creating):  # creations an exception stopped part way
            with contextlib.suppress(OSError):
                self._dir.unlink(name)
                removed += 1
            self._creating.discard(name)
        return removed

    def _empty_if_unheld(self, slot: OwnedSlot) -> None:
        words, fd = slot.mapping.words, slot.mapping.fd
        if words is None or self._file_lost(slot):
            return
        if load_slot_state_acquire(words) not in (POOL_SLOT_FREE, POOL_SLOT_DONE):
            return
        with contextlib.suppress(OSError):
            if fd >= 0:
                self._os.ftruncate(fd, 0)
                return
            # A slot keeps no descriptor (mapped, then closed: issue 22 defect 5):
            # open it by name through the directory descriptor just to empty it.
            fd = self._dir.open(slot.name, OPEN_FLAGS_EXISTING)
            try:
                self._os.ftruncate(fd, 0)
            finally:
                self._os.close(fd)

    def statistics(self) -> PoolStatistics:
        return PoolStatistics(
            slots=len(self.slots),
            used_bytes=self.used_bytes,
            created=self.created,
            reused=self.reused,
            evicted=self.evicted,
            exhausted=self.exhausted,
            create_failures=self.create_failures,
        )
