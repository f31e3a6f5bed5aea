"""Lockstep machine: the pool model (`spec.pool`) next to a real `PoolProducer` and `PoolReader`.

The ring is not here: each published slot's carrier frame is a cell the
machine flips (pending, or gone: claimed, retired, reclaimed), which is all
the producer asks of its ring (`PoolProducer.carried`). Rules acquire and
publish (the ring taking the carrier or not), claim a pending reference
owned (copy, release, carrier gone) or borrowed (carrier gone, the claim
kept), release a kept claim, let a holder die holding its claim (its holder
word is rewritten to a pid that no process has) or die before finishing the
carrier (the next claim takes over), and retire a carrier unclaimed. After
every step the model's invariants hold (`check_pool`, `check_pool_step`:
nothing a consumer may still read is rewritten) and the implementation
agrees: slot files on disk, each slot's shared state and generation, and
the counters.
"""

from __future__ import annotations

import copy
import itertools
import os
import shutil
import tempfile
from typing import Any

from hypothesis import HealthCheck, note
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    initialize,
    invariant,
    multiple,
    rule,
)

from ..fault_injection.kit.machines import Tally, register_profiles
from ..impl.directory import PathDirectory
from ..impl.errors import CorruptFrameError
from ..impl.names import current_producer_identity, parse_pool_slot_file_name
from ..impl.os_seam import DEFAULT_OS
from ..impl.pool import PoolClaim, PoolProducer, PoolReader
from ..impl.pool.slots import (
    load_slot_generation,
    load_slot_state_acquire,
    store_slot_holder_pid,
)
from ..spec import invariants
from ..spec import pool as pool_spec
from ..spec.layout import (
    POOL_SLOT_CLAIMED,
    POOL_SLOT_DONE,
    POOL_SLOT_FREE,
    POOL_SLOT_PUBLISHED,
    compute_slot_capacity,
)
from ..spec.pool import AcquireStatus, ClaimStatus, SlotState, compute_slot_charge

MIN_CLASS = 4096
MAX_CLASS = 16384
BUDGETS = (0, 3 * compute_slot_charge(MIN_CLASS), compute_slot_charge(MAX_CLASS) + 8192, 1 << 20)
# A class holds class + headroom bytes: sizes up to the smallest class's
# capacity, those that need a larger class, and those no class holds.
_SMALLEST, _LARGEST = compute_slot_capacity(MIN_CLASS), compute_slot_capacity(MAX_CLASS)
SIZES = st.one_of(
    st.integers(0, _SMALLEST),
    st.integers(_SMALLEST + 1, _LARGEST),
    st.sampled_from((_LARGEST + 1, _LARGEST + 40000)),
)
# A pid no process has (above the kernel's largest pid_max): "the holder died".
DEAD_PID = 4_194_305

_STATES = {
    SlotState.FREE: POOL_SLOT_FREE,
    SlotState.PUBLISHED: POOL_SLOT_PUBLISHED,
    SlotState.CLAIMED: POOL_SLOT_CLAIMED,
    SlotState.DONE: POOL_SLOT_DONE,
}

EVENT_LABELS = (
    "created",
    "reused",
    "evicted",
    "exhausted",
    "too large",
    "carrier refused",
    "claimed owned",
    "claimed borrowed",
    "released",
    "holder died",
    "took over a dead holder's claim",
    "dead holder's slot reused",
    "carrier retired",
)
TALLY = Tally()

CI_PROFILE = "pool-ci"
LONG_PROFILE = "pool-long"
register_profiles(
    CI_PROFILE,
    LONG_PROFILE,
    ci={"max_examples": 80, "stateful_step_count": 40},
    long={"max_examples": 1000, "stateful_step_count": 80},
    health_checks=(HealthCheck.too_slow, HealthCheck.filter_too_much),
)


def _payload(tag: int, nbytes: int) -> bytes:
    return (tag.to_bytes(4, "little") * (nbytes // 4 + 1))[:nbytes]


class PoolLockstepMachine(RuleBasedStateMachine):
    """`spec.pool` and one real pool (producer and consumer), step for step."""

    refs = Bundle("refs")  # (index, generation, reference bytes, payload)
    claims = Bundle("claims")  # (index, model holder, PoolClaim)

    def __init__(self) -> None:
        super().__init__()
        self.path = tempfile.mkdtemp(prefix="shmring-pooltest-", dir="/dev/shm")
        self.directory = PathDirectory(self.path, DEFAULT_OS)
        self.identity = (*current_producer_identity(), 0)
        self.producer: PoolProducer | None = None
        self.reader = PoolReader(self.directory, DEFAULT_OS)
        self.model: pool_spec.PoolState | None = None
        self.pending: dict[int, bool] = {}  # slot index -> its carrier may be claimed
        self.tags = itertools.count(1)
        self.holders = itertools.count(1)
        self.before: pool_spec.PoolState | None = None
        # Acquires the model answered EXHAUSTED: the producer counts them too (not in spec.pool).
        self.exhausted = 0

    @initialize(budget=st.sampled_from(BUDGETS))
    def setup(self, budget: int) -> None:
        note(f"pool(min={MIN_CLASS}, max={MAX_CLASS}, budget={budget})")
        self.producer = PoolProducer(
            self.directory,
            self.identity,
            DEFAULT_OS,
            min_class=MIN_CLASS,
            max_class=MAX_CLASS,
            budget=budget,
            checksum=budget % 2 == 0,
        )
        self.model = pool_spec.initialize_pool(MIN_CLASS, MAX_CLASS, budget)

    def teardown(self) -> None:
        try:
            if self.producer is not None:
                assert self.model is not None
                assert self.producer.close() == pool_spec.process_pool_close(self.model)
            self.reader.close()
            assert os.listdir(self.path) == [], f"close left {os.listdir(self.path)}"
        finally:
            shutil.rmtree(self.path, ignore_errors=True)

    def _pair(self) -> tuple[PoolProducer, pool_spec.PoolState]:
        assert self.producer is not None and self.model is not None
        self.before = copy.deepcopy(self.model)
        return self.producer, self.model

    def _carrier(self, index: int) -> Any:
        return lambda: self.pending.get(index, False)

    # -- producer ---------------------------------------------------------------------

    @rule(target=refs, nbytes=SIZES, carried=st.booleans(), carried_too=st.booleans())
    def put(self, nbytes: int, carried: bool, carried_too: bool) -> Any:
        TALLY.step("put")
        producer, model = self._pair()
        carried = carried or carried_too  # the ring takes most carriers
        expected = pool_spec.process_pool_acquire(model, nbytes)
        slot = producer.acquire(nbytes)
        note(f"acquire({nbytes}) -> model {expected}, impl {slot and slot.index}")
        if expected.index is None:
            assert slot is None, f"model {expected.status}, implementation slot {slot.index}"
            label = "too large" if expected.status is AcquireStatus.TOO_LARGE else "exhausted"
            self.exhausted += expected.status is AcquireStatus.EXHAUSTED
            TALLY.label(label)
            return multiple()
        assert slot is not None and slot.index == expected.index, (
            f"model {expected}, implementation {slot and slot.index}"
        )
        TALLY.label("created" if expected.status is AcquireStatus.CREATED else "reused")
        if expected.evicted:
            TALLY.label("evicted")
        before = self.before
        if (
            expected.status is AcquireStatus.REUSED
            and before is not None
            and before.slots[expected.index].state is SlotState.CLAIMED
        ):
            TALLY.label("dead holder's slot reused")
        for index in expected.evicted:
            self.pending.pop(index, None)
        payload = _payload(next(self.tags), nbytes)
        with slot.payload_view(nbytes) as view:
            view[:] = payload
        generation = pool_spec.process_pool_publish(model, slot.index, nbytes, payload)
        ref = producer.publish(slot, nbytes)
        if not carried:
            pool_spec.process_pool_abandon(model, slot.index)
            producer.abandon(slot)
            TALLY.label("carrier refused")
            return multiple()
        self.pending[slot.index] = True
        producer.carried(slot, self._carrier(slot.index))
        return (slot.index, generation, ref, payload)

    @rule(ref=refs)
    def retire_carrier(self, ref: tuple[int, int, bytes, bytes]) -> None:
        """The carrier frame was retired (re-put, cancel) or reclaimed unclaimed."""
        TALLY.step("retire_carrier")
        _, model = self._pair()
        index, generation = ref[0], ref[1]
        slot = model.slots.get(index)
        if slot is None or slot.generation != generation or not slot.carrier_pending:
            return
        note(f"retire carrier of slot={index} generation={generation}")
        pool_spec.process_pool_carrier_gone(model, index)
        self.pending[index] = False
        TALLY.label("carrier retired")

    # -- consumer ---------------------------------------------------------------------

    def _claimable(self, ref: tuple[int, int, bytes, bytes]) -> bool:
        assert self.model is not None
        slot = self.model.slots.get(ref[0])
        # Only the consumer holding the carrier's ring claim claims (the carrier is pending).
        return slot is not None and slot.generation == ref[1] and slot.carrier_pending

    @rule(target=claims, ref=refs, borrowed=st.booleans(), dies=st.integers(0, 5))
    def claim(self, ref: tuple[int, int, bytes, bytes], borrowed: bool, dies: int) -> Any:
        TALLY.step("claim")
        _, model = self._pair()
        if not self._claimable(ref):
            return multiple()
        index, generation, data, payload = ref
        holder = next(self.holders)
        took_over = model.slots[index].state is not SlotState.PUBLISHED
        expected = pool_spec.process_pool_claim(model, index, generation, holder)
        note(f"claim(slot={index}, generation={generation}) -> model {expected.status}")
        try:
            claim = self.reader.claim(self.identity, data)
        except CorruptFrameError as error:
            raise AssertionError(f"model {expected.status}, implementation {error}") from error
        assert expected.status is ClaimStatus.DELIVERED
        assert claim.view.tobytes() == payload == expected.payload
        if took_over:
            TALLY.label("took over a dead holder's claim")
        if dies == 0:
            # The holder dies before it finished the carrier: the carrier stays pending.
            pool_spec.process_pool_holder_exit(model, holder)
            self._kill(claim)
            TALLY.label("holder died")
            return multiple()
        pool_spec.process_pool_carrier_gone(model, index)  # the ring frame is DONE now
        self.pending[index] = False
        if not borrowed:
            pool_spec.process_pool_release(model, index)
            claim.view.release()
            claim.release()
            TALLY.label("claimed owned")
            return multiple()
        TALLY.label("claimed borrowed")
        return (index, holder, claim)

    def _kill(self, claim: PoolClaim) -> None:
        """What a SIGKILL of the holder leaves: its pid in the holder word, no release ever."""
        words = claim._words
        assert words is not None
        store_slot_holder_pid(words, DEAD_PID)
        claim.view.release()
        claim._words = None  # a dead process releases nothing: no DONE is stored
        claim._released = True
        words.release()

    @rule(held=consumes(claims))
    def release(self, held: tuple[int, int, PoolClaim]) -> None:
        TALLY.step("release")
        _, model = self._pair()
        index, _, claim = held
        pool_spec.process_pool_release(model, index)
        claim.view.release()
        claim.release()
        claim.release()  # idempotent
        TALLY.label("released")

    @rule(held=consumes(claims))
    def holder_exit(self, held: tuple[int, int, PoolClaim]) -> None:
        """The borrowing process is killed holding its claim."""
        TALLY.step("holder_exit")
        _, model = self._pair()
        _, holder, claim = held
        pool_spec.process_pool_holder_exit(model, holder)
        self._kill(claim)
        TALLY.label("holder died")

    # -- invariants --------------------------------------------------------------------

    @invariant()
    def agrees_with_model(self) -> None:
        if self.model is None or self.producer is None:
            return
        model, producer = self.model, self.producer
        invariants.check_pool(model)
        if self.before is not None:
            invariants.check_pool_step(self.before, model)
        stats = producer.statistics()
        assert (stats.slots, stats.used_bytes, stats.created, stats.reused, stats.evicted) == (
            len(model.slots),
            model.used_bytes,
            model.created,
            model.reused,
            model.evicted,
        ), f"model {model}, implementation {stats}"
        assert stats.exhausted == self.exhausted, (stats.exhausted, self.exhausted)
        on_disk = sorted(
            parsed[1]
            for name in os.listdir(self.path)
            if (parsed := parse_pool_slot_file_name(name)) is not None
        )
        assert on_disk == sorted(model.slots), f"files {on_disk}, model {sorted(model.slots)}"
        for index, slot in model.slots.items():
            words = producer.slots[index].mapping.words
            assert words is not None
            state = load_slot_state_acquire(words)
            assert state == _STATES[slot.state], (
                f"slot={index}: model {slot.state}, implementation state {state}"
            )
            assert load_slot_generation(words) == slot.generation


__all__ = ["CI_PROFILE", "EVENT_LABELS", "LONG_PROFILE", "TALLY", "PoolLockstepMachine"]
