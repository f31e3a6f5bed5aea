"""The pool: one producer's slots for the payloads its rings do not admit.

A payload the ring does not admit (frame > capacity / 4) travels in a
*slot*: a file of the producer's pool holding one payload. A slot has a
*class*, a power of two between `min_class` and `max_class`, and holds up
to class + `layout.POOL_CLASS_HEADROOM` payload bytes (its *capacity*,
`layout.compute_slot_capacity`): a 2^k-byte tensor plus the codec's header
and a few small leaves takes class 2^k, not 2^(k+1). `max_class` bounds the
class, so the largest payload the pool takes is `max_class` + headroom and
the largest slot file header + `max_class` + headroom. The ring still
carries the message: a small *reference* frame for the key names the slot
(index) and the publish (generation), so every key rule (one deliverable
version, retire on re-put, cancel, close, dead producers) stays the ring's.

The rules, as the transitions below apply them:

1. Acquire (`process_pool_acquire`): a *reusable* slot of the payload's
   class (`compute_class`: the smallest whose capacity holds it) is taken
   (lowest index first). Else a new slot file is created if
   the pool's bytes stay within `budget` (a slot is charged its file's
   pages), after evicting reusable slots of *other* classes (lowest index
   first) only when that makes it fit. Else the pool is exhausted and
   nothing changes (the put takes the per-key fallback).
2. Reusable: the slot's carrier frame can no longer be claimed (it was
   claimed, retired, cancelled or reclaimed: `process_pool_carrier_gone`)
   and the slot is not CLAIMED by a live holder. So a slot is never
   rewritten while a consumer may still read it.
3. Publish (`process_pool_publish`): payload, length, a new generation,
   then PUBLISHED; the carrier frame follows on the ring. If the ring does
   not take the carrier, `process_pool_abandon` makes the slot FREE again.
4. Claim (`process_pool_claim`), by the consumer that holds the carrier's
   ring claim (exclusive already, so no compare-and-swap on the slot): the
   generation must match and the slot read PUBLISHED, or CLAIMED / DONE by a
   holder that died before it finished the carrier; anything else is a
   corrupt reference. Holder, then CLAIMED; `process_pool_release` (the
   copy is done, or the last borrowed view died) stores DONE.
5. A dead holder (`process_pool_holder_exit`) no longer keeps its slot.
6. Close (`process_pool_close`) removes every slot file.

Generations strictly increase per pool and slot indices are never reused,
so a reference names exactly one publish.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from . import status
from .layout import (
    MAX_POOL_CLASS,
    MIN_POOL_CLASS,
    compute_file_footprint,
    compute_slot_capacity,
    compute_slot_file_length,
)

# -- state -------------------------------------------------------------------


class SlotState(enum.Enum):
    FREE = "free"  # holds nothing a consumer may read
    PUBLISHED = "published"  # holds a payload; its carrier frame names it
    CLAIMED = "claimed"  # a consumer is reading it (copying out, or a lease)
    DONE = "done"  # the consumer finished; reusable once the carrier is gone


@dataclass
class Slot:
    """One slot file of the pool."""

    index: int  # the file's number; unique in the pool's life (never reused)
    size_class: int  # a power of two in [min_class, max_class]; never changes
    state: SlotState = SlotState.FREE
    generation: int = 0  # of its last publish; 0 before the first; < pool.next_generation
    payload_length: int = 0  # bytes of the last publish; <= compute_slot_capacity(size_class)
    payload: object = None  # opaque payload token of the last publish
    carrier_pending: bool = False  # its carrier frame may still be claimed; False when FREE
    holder: int | None = None  # pid of the consumer that claimed it (CLAIMED, DONE)


@dataclass
class PoolState:
    """One producer's pool."""

    min_class: int  # smallest class; a power of two >= MIN_POOL_CLASS
    max_class: int  # largest class; a power of two, min_class <= max_class <= MAX_POOL_CLASS
    budget: int  # most bytes of slot files; >= 0 (0: the pool takes nothing)
    slots: dict[int, Slot] = field(default_factory=dict)  # by index
    used_bytes: int = 0  # == sum of compute_slot_charge over slots; <= budget
    next_index: int = 0  # larger than every index issued so far
    next_generation: int = 1  # larger than every generation issued so far
    dead_holders: set[int] = field(default_factory=set)  # consumer pids known to have exited
    created: int = 0  # slot files created
    reused: int = 0  # acquires that took an existing slot
    evicted: int = 0  # slot files removed to make room for another class
    closed: bool = False  # set by close; no slots afterwards


class AcquireStatus(enum.Enum):
    REUSED = "reused"  # an existing slot of the class
    CREATED = "created"  # a new slot file
    TOO_LARGE = "too large"  # no class holds the payload, or the pool is disabled
    EXHAUSTED = "exhausted"  # no reusable slot and the budget allows no new one


@dataclass(frozen=True)
class AcquireResult:
    status: AcquireStatus
    index: int | None = None  # the slot to write (REUSED, CREATED)
    evicted: tuple[int, ...] = ()  # slots removed to make room (CREATED)


ClaimStatus = status.GetStatus  # DELIVERED, CORRUPT


@dataclass(frozen=True)
class ClaimResult:
    status: ClaimStatus
    payload: object = None
    payload_length: int = 0


# -- predicates and pure helpers --------------------------------------------


def is_power_of_two(value: int) -> bool:
    return value > 0 and value & (value - 1) == 0


def is_valid_classes(min_class: int, max_class: int) -> bool:
    """Class bounds: powers of two with MIN_POOL_CLASS <= min_class <= max_class <= MAX_POOL_CLASS."""
    return (
        is_power_of_two(min_class)
        and is_power_of_two(max_class)
        and MIN_POOL_CLASS <= min_class <= max_class <= MAX_POOL_CLASS
    )


def compute_class(min_class: int, max_class: int, nbytes: int) -> int | None:
    """The smallest class whose capacity (class + headroom) holds `nbytes`, or None."""
    # Verify the bounds and the byte count
    assert is_valid_classes(min_class, max_class)
    assert nbytes >= 0
    if nbytes > compute_slot_capacity(max_class):
        return None
    size_class = min_class
    while compute_slot_capacity(size_class) < nbytes:
        size_class *= 2
    return size_class


def compute_slot_charge(size_class: int) -> int:
    """Bytes a slot of class `size_class` is charged to the budget: its file's pages."""
    # Verify the class is not negative
    assert size_class >= 0
    return compute_file_footprint(compute_slot_file_length(compute_slot_capacity(size_class)))


def is_holder_alive(pool: PoolState, pid: int | None) -> bool:
    return pid is not None and pid not in pool.dead_holders


def is_reusable(pool: PoolState, slot: Slot) -> bool:
    """No consumer may still read the slot: carrier gone, not held by a live holder."""
    if slot.carrier_pending:
        return False
    return slot.state is not SlotState.CLAIMED or not is_holder_alive(pool, slot.holder)


def is_claimable(pool: PoolState, slot: Slot, generation: int) -> bool:
    """Whether the consumer holding the carrier's claim may claim the slot."""
    if slot.generation != generation or not slot.carrier_pending:
        return False
    if slot.state is SlotState.PUBLISHED:
        return True
    # A holder that died between claiming the slot and finishing the carrier:
    # the carrier is still deliverable, so the next consumer takes over.
    return slot.state in (SlotState.CLAIMED, SlotState.DONE) and not is_holder_alive(
        pool, slot.holder
    )


# -- transitions -------------------------------------------------------------


def initialize_pool(min_class: int, max_class: int, budget: int) -> PoolState:
    # Verify the configuration (the implementation reports a ConfigurationError first)
    assert is_valid_classes(min_class, max_class)
    assert budget >= 0
    return PoolState(min_class=min_class, max_class=max_class, budget=budget)


def process_pool_acquire(pool: PoolState, nbytes: int) -> AcquireResult:
    """A slot to write `nbytes` into (rule 1); nothing changes unless one is found."""
    # Verify the pool is open and the byte count is one
    assert not pool.closed
    assert nbytes >= 0
    size_class = compute_class(pool.min_class, pool.max_class, nbytes)
    if size_class is None or pool.budget == 0:
        return AcquireResult(AcquireStatus.TOO_LARGE)
    for index in sorted(pool.slots):
        slot = pool.slots[index]
        if slot.size_class == size_class and is_reusable(pool, slot):
            _make_free(slot)
            pool.reused += 1
            return AcquireResult(AcquireStatus.REUSED, index)
    charge = compute_slot_charge(size_class)
    evict: list[int] = []
    freed = 0
    for index in sorted(pool.slots):
        if pool.used_bytes - freed + charge <= pool.budget:
            break
        slot = pool.slots[index]
        if slot.size_class != size_class and is_reusable(pool, slot):
            evict.append(index)
            freed += compute_slot_charge(slot.size_class)
    if pool.used_bytes - freed + charge > pool.budget:
        return AcquireResult(AcquireStatus.EXHAUSTED)
    for index in evict:
        del pool.slots[index]
    pool.used_bytes -= freed
    pool.evicted += len(evict)
    index = pool.next_index
    pool.next_index += 1
    pool.slots[index] = Slot(index, size_class)
    pool.used_bytes += charge
    pool.created += 1
    return AcquireResult(AcquireStatus.CREATED, index, tuple(evict))


def _make_free(slot: Slot) -> None:
    slot.state = SlotState.FREE
    slot.payload = None
    slot.payload_length = 0
    slot.holder = None
    slot.carrier_pending = False


def process_pool_publish(pool: PoolState, index: int, nbytes: int, payload: object) -> int:
    """Write the payload into an acquired slot and publish it (rule 3); answers the generation."""
    # Verify the slot was just acquired and the payload fits its class
    assert index in pool.slots and pool.slots[index].state is SlotState.FREE
    assert 0 <= nbytes <= compute_slot_capacity(pool.slots[index].size_class)
    slot = pool.slots[index]
    generation = pool.next_generation
    pool.next_generation += 1
    slot.generation = generation
    slot.payload_length = nbytes
    slot.payload = payload
    slot.holder = None
    slot.carrier_pending = True
    slot.state = SlotState.PUBLISHED
    return generation


def process_pool_abandon(pool: PoolState, index: int) -> None:
    """The ring did not take the carrier: the slot is FREE again (rule 3)."""
    # Verify the slot was just published (its carrier never showed)
    assert index in pool.slots and pool.slots[index].state is SlotState.PUBLISHED
    _make_free(pool.slots[index])


def process_pool_carrier_gone(pool: PoolState, index: int) -> None:
    """The slot's carrier frame was claimed, retired or reclaimed: it is claimable no more."""
    slot = pool.slots.get(index)
    if slot is not None:
        slot.carrier_pending = False


def process_pool_claim(pool: PoolState, index: int, generation: int, holder: int) -> ClaimResult:
    """The consumer holding the carrier's claim claims the slot (rule 4)."""
    # Verify the holder is a pid
    assert holder > 0
    slot = pool.slots.get(index)
    if slot is None or not is_claimable(pool, slot, generation):
        return ClaimResult(ClaimStatus.CORRUPT)
    slot.holder = holder
    slot.state = SlotState.CLAIMED
    return ClaimResult(ClaimStatus.DELIVERED, slot.payload, slot.payload_length)


def process_pool_release(pool: PoolState, index: int) -> None:
    """The claim ended (owned copy made, or the last borrowed view died): DONE."""
    slot = pool.slots.get(index)
    if slot is not None and slot.state is SlotState.CLAIMED:
        slot.state = SlotState.DONE


def process_pool_holder_exit(pool: PoolState, pid: int) -> None:
    """A consumer process exited (rule 5): its claims no longer keep slots."""
    pool.dead_holders.add(pid)


def process_pool_close(pool: PoolState) -> int:
    """Remove every slot file (rule 6); answers how many. Idempotent."""
    removed = len(pool.slots)
    pool.slots.clear()
    pool.used_bytes = 0
    pool.closed = True
    return removed


__all__ = [
    "AcquireResult",
    "AcquireStatus",
    "ClaimResult",
    "ClaimStatus",
    "PoolState",
    "Slot",
    "SlotState",
    "compute_class",
    "compute_slot_charge",
    "initialize_pool",
    "is_claimable",
    "is_power_of_two",
    "is_reusable",
    "is_valid_classes",
    "process_pool_abandon",
    "process_pool_acquire",
    "process_pool_carrier_gone",
    "process_pool_claim",
    "process_pool_close",
    "process_pool_holder_exit",
    "process_pool_publish",
    "process_pool_release",
]
