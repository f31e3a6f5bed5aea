"""The interleaving explorer: it finds planted re-orderings, and the real code passes it.

The two mutants are the issue's: a reader that copies a copy-out frame's
bytes just after it releases the claim lock, and a producer that publishes
the head before the frame's length. Each is the real method's source with
the statements moved (`_reordered`), so it tracks the code it breaks; they
live here, never in `impl`. The pool's (a reuse check that ignores the
slot's CLAIMED state, and one that loads the state before the carrier) are
`PoolProducer` subclasses.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable
from typing import Any

import pytest

from shmring.check import sections
from shmring.fault_injection import interleave
from shmring.fault_injection import interleave_scenarios as scenarios
from shmring.fault_injection.interleave import (
    Schedule,
    ScheduledWords,
    Scheduler,
    SchedulingOs,
    explore_bounded,
    explore_random,
    install_words,
    replay,
    run_schedule,
)
from shmring.impl.fallback import claim as fallback_module
from shmring.impl.frame_io import SharedWords
from shmring.impl.liveness import is_holder_alive
from shmring.impl.pool import OwnedSlot, PoolProducer
from shmring.impl.pool.slots import load_slot_holder_pid, load_slot_state_acquire
from shmring.impl.registered import arena as arena_module
from shmring.impl.ring.engine import RingProducer
from shmring.impl.ring.producer import RingChannel
from shmring.impl.ring.reader import RingReader
from shmring.spec.layout import POOL_SLOT_CLAIMED

# -- mutants -------------------------------------------------------------------------


def _reordered(
    function: Callable[..., Any],
    edits: list[tuple[str, str]],
    overrides: dict[str, Any] | None = None,
) -> Any:
    """`function` recompiled with each `old` text replaced by `new` (each found once).

    It runs in a copy of its module's globals with `overrides` in it, so a
    mutant can call another mutant; the module itself is never touched.
    """
    function = inspect.unwrap(function)  # a decorated method: its own code and module
    source = inspect.getsource(function)
    for old, new in edits:
        assert source.count(old) == 1, f"the mutant no longer matches the code: {old!r}"
        source = source.replace(old, new)
    if source[0].isspace():  # a method: compile its indented block under `if True:`
        source = "if True:\n" + source
    namespace = {**function.__globals__, **(overrides or {})}
    exec(compile(source, f"<mutant of {function.__qualname__}>", "exec"), namespace)
    return namespace[function.__name__]


class CopyAfterUnlockReader(RingReader):
    """Copies a copy-out payload after releasing the claim lock ("to keep the hold short")."""

    # The delivery under the lock answers a view of the payload, not a copy ...
    _deliver = _reordered(
        RingReader._deliver,
        [
            (
                "            value: Any = buf[payload_start:payload_end].tobytes()\n"
                "            checked: bytes | memoryview = value\n",
                "            value = checked = buf[payload_start:payload_end]\n",
            ),
        ],
    )
    # ... and the claim copies it once the lock is released.
    _claim = _reordered(
        RingReader._claim,
        [
            (
                "        if by_key:\n            del self._index[key_bytes]",
                "        if isinstance(value, memoryview):\n"
                "            value = value.tobytes()\n"
                "        if by_key:\n            del self._index[key_bytes]",
            ),
        ],
    )


class TrustingIndexReader(RingReader):
    """Claims through its index entry without loading the tail again under the lock."""

    _check_under_lock = _reordered(
        RingReader._check_under_lock,
        [("        if load_tail_acquire(words) > position:\n", "        if False:\n")],
    )


# The producer engine's commit with the head stored before the frame's length.
_commit_head_before_length = _reordered(
    RingProducer._commit,
    [
        (
            "        store_frame_length_release(words, offset, frame_length)\n",
            "",
        ),
        (
            "        store_head_release(words, new_head)\n",
            "        store_head_release(words, new_head)\n"
            "        store_frame_length_release(words, offset, frame_length)\n",
        ),
    ],
)


class HeadBeforeLengthChannel(RingChannel):
    """Stores the head before the frame's length."""

    _commit = _commit_head_before_length


class HeadBeforeLengthArena(arena_module.RegisteredArena):
    """The arena on the same broken engine commit."""

    _commit = _commit_head_before_length


class ClaimedFramesReclaimedArena(arena_module.RegisteredArena):
    """Reclaims over frames a receiver still holds (CLAIMED) as if they were done."""

    _reclaim = _reordered(
        RingProducer._reclaim,
        [
            (
                "                if state != FRAME_STATE_DONE and state != FRAME_STATE_RETIRED:\n",
                "                if state == FRAME_STATE_PUBLISHED:\n",
            )
        ],
    )


# A reader that takes the segment's name away (hands the file back) before it decodes.
_claim_locked_commit_first = _reordered(
    fallback_module._claim_locked,
    [
        (
            "            handed_back = _commit(where, path, state, producer, frame_generation)\n",
            "",
        ),
        (
            "                try:\n                    value = decode(payload)\n",
            "                handed_back = _commit(where, path, state, producer, frame_generation)\n"
            "                try:\n                    value = decode(payload)\n",
        ),
    ],
)


# ... and `claim_segment` calling it.
commit_before_decode_claim = _reordered(
    fallback_module.claim_segment, [], {"_claim_locked": _claim_locked_commit_first}
)


class IgnoresClaimedPoolProducer(PoolProducer):
    """Reuses a slot once its carrier is gone, never looking at the slot's state (CLAIMED)."""

    def _is_reusable(self, slot: OwnedSlot) -> bool:
        carrier = slot.carrier
        if carrier is not None:
            if carrier():
                return False
            slot.carrier = None
        return True


class StateBeforeCarrierPoolProducer(PoolProducer):
    """The reuse check in the wrong order: the slot's state, then its carrier.

    A claim that lands between the two loads (slot CLAIMED, then the carrier
    DONE) is missed: the state it loaded said PUBLISHED, the carrier says gone.
    """

    def _is_reusable(self, slot: OwnedSlot) -> bool:
        words = slot.mapping.words
        assert words is not None
        state = load_slot_state_acquire(words)
        carrier = slot.carrier
        if carrier is not None:
            if carrier():
                return False
            slot.carrier = None
        if state != POOL_SLOT_CLAIMED:
            return True
        return not is_holder_alive(load_slot_holder_pid(words), self._os)


def _assert_found(report: interleave.Report) -> None:
    assert report.failure is not None, f"{report.mode}: {report.schedules} schedules, none failed"
    assert report.reproducer is not None
    # A mutant is no registered scenario: the rerun line is the Python call.
    assert f"replay(<scenario>, {report.reproducer!r})" in report.failure


# -- the planted re-orderings are found ---------------------------------------------------


def test_copy_after_unlock_reader_is_found_with_a_reproducer() -> None:
    scenario = scenarios.ring_wrap_reclaim(reader_class=CopyAfterUnlockReader)
    report = explore_bounded(scenario, preemptions=1)
    _assert_found(report)
    assert "no version put under it" in report.failure  # it delivered k4's bytes for k0
    for _ in range(2):  # the reproducer reruns the same failure, deterministically
        again = replay(scenario, report.reproducer)
        assert again.failure is not None and "no version put under it" in again.failure
    assert replay(scenarios.ring_wrap_reclaim(), report.reproducer).failure is None


def test_a_claim_through_a_stale_index_entry_is_found() -> None:
    """Issue 25: the index race, with a claim that trusts its entry: a reclaimed slot is read."""
    scenario = scenarios.ring_index_race(reader_class=TrustingIndexReader)
    report = explore_bounded(scenario, preemptions=1)
    _assert_found(report)
    assert "frame header changed since it was indexed" in report.failure
    plain = replay(scenarios.ring_index_race(), report.reproducer).failure
    assert plain is None or plain.startswith("schedule diverged"), plain  # no promise broken


def test_head_before_length_producer_is_found_with_a_reproducer() -> None:
    scenario = scenarios.ring_publish(channel_class=HeadBeforeLengthChannel)
    report = explore_bounded(scenario, preemptions=1)
    _assert_found(report)
    # Found by the invariants at the schedule point between the two stores (a frame
    # below head that is not published), not only when a reader trips over it later.
    assert "invariant broken at P store" in report.failure
    assert "frame length=0" in report.failure
    again = replay(scenario, report.reproducer)
    assert again.failure is not None and "frame length=0" in again.failure


def test_head_before_length_arena_is_found() -> None:
    # The arena publishes through the same engine commit: the same break is seen there.
    report = explore_bounded(scenarios.arena_out_of_order(HeadBeforeLengthArena), preemptions=1)
    _assert_found(report)
    assert "invariant broken at P store" in report.failure
    assert "frame length=0" in report.failure


def test_arena_reclaiming_a_claimed_frame_is_found() -> None:
    scenario = scenarios.arena_out_of_order(ClaimedFramesReclaimedArena)
    report = explore_bounded(scenario, preemptions=1)
    _assert_found(report)
    # The check of live views at every point sees the overwrite as it happens.
    assert "invariant broken at" in report.failure
    assert "the bytes of a live borrowed frame changed" in report.failure


def test_fallback_commit_before_decode_is_found() -> None:
    scenario = scenarios.fallback_claim_race(commit_before_decode_claim)
    report = explore_bounded(scenario, preemptions=2)
    _assert_found(report)
    again = replay(scenario, report.reproducer)
    assert again.failure is not None


def test_a_pool_producer_reusing_a_claimed_slot_is_found() -> None:
    scenario = scenarios.pool_reuse_race(IgnoresClaimedPoolProducer)
    report = explore_bounded(scenario, preemptions=1)
    _assert_found(report)
    # Seen at the point after the overwrite, while the borrowed claim still holds the slot.
    assert "invariant broken at P" in report.failure
    assert "the bytes of a claimed slot changed under its holder" in report.failure
    again = replay(scenario, report.reproducer)
    assert again.failure is not None and "changed under its holder" in again.failure
    assert replay(scenarios.pool_reuse_race(), report.reproducer).failure is None
    assert explore_random(scenario, 200, depth=3, seed=1).failure is not None


# What the k = 2 search below found (its 1,534th schedule): P loads slot 0's state
# (PUBLISHED) and is switched out at its carrier's load; R0 claims v0 borrowed (slot
# CLAIMED, carrier DONE) and is switched out before its release; P sees the carrier
# gone and reuses the slot under the claim.
STATE_BEFORE_CARRIER_SCHEDULE = (
    "P*3 R0*26 P*2"  # the reader stats the slot before touching it (issue 22)
)


def test_a_pool_reuse_check_that_loads_the_state_before_the_carrier_fails_its_schedule() -> None:
    # The order is the safety argument of `PoolProducer._is_reusable`: a claim between
    # the two loads is missed. It takes a switch into the check and one out of the claim,
    # so no schedule with one preemption shows it.
    scenario = scenarios.pool_reuse_race(StateBeforeCarrierPoolProducer)
    assert explore_bounded(scenario, preemptions=1).failure is None
    broken = replay(scenario, STATE_BEFORE_CARRIER_SCHEDULE)
    assert broken.failure is not None and "changed under its holder" in broken.failure
    assert replay(scenarios.pool_reuse_race(), STATE_BEFORE_CARRIER_SCHEDULE).failure is None


@pytest.mark.slow
def test_a_pool_reuse_check_that_loads_the_state_before_the_carrier_is_found() -> None:
    scenario = scenarios.pool_reuse_race(StateBeforeCarrierPoolProducer)
    report = explore_bounded(scenario, preemptions=2)  # about 16 s
    _assert_found(report)
    assert "changed under its holder" in report.failure
    assert replay(scenarios.pool_reuse_race(), report.reproducer).failure is None


def test_the_pool_scenario_reuses_slots() -> None:
    """Not vacuous: the re-puts take a slot back (no new file) in the schedules explored."""
    reused: list[int] = []

    def build(scheduler: Scheduler) -> Any:
        world = scenarios.pool_reuse_race().build(scheduler)
        check_end = world.check_end

        def counted() -> None:
            reused.append(world.producer.reused)
            check_end()

        world.check_end = counted
        return world

    report = explore_bounded(interleave.Scenario("pool_reuse_race", build), preemptions=1)
    assert report.failure is None and report.schedules == len(reused) > 1
    assert all(reused), reused


def test_random_schedules_find_the_copy_after_unlock_reader_too() -> None:
    scenario = scenarios.ring_wrap_reclaim(reader_class=CopyAfterUnlockReader)
    report = explore_random(scenario, 400, depth=2, seed=1)
    _assert_found(report)


# -- the current code holds ---------------------------------------------------------------


@pytest.mark.parametrize("scenario", scenarios.SCENARIOS, ids=lambda s: s.name)
def test_every_schedule_with_one_preemption_keeps_every_promise(
    scenario: interleave.Scenario,
) -> None:
    report = explore_bounded(scenario, preemptions=1)
    assert report.failure is None, report.failure
    assert report.exhaustive and report.schedules > 1


@pytest.mark.parametrize("scenario", scenarios.SCENARIOS, ids=lambda s: s.name)
def test_every_scenario_delivers_through_its_actors(scenario: interleave.Scenario) -> None:
    """Not vacuous: in some schedule the actors themselves deliver (or borrow), not only
    the end's drain, so the end check compares what they took with what was put."""
    taken: list[int] = []  # per schedule run to its end check: what the actors took

    def build(scheduler: Scheduler) -> Any:
        world = scenario.build(scheduler)
        check_end = world.check_end

        def counted() -> None:
            if isinstance(world, scenarios.ArenaWorld):  # three frames borrowed, two put
                published = sum(d is not None for d in world.descriptors)
                taken.append(len(world.views) if published >= 4 else 0)
            else:
                taken.append(sum(who != "drain" for who, _, _ in world.log.delivered))
            check_end()

        world.check_end = counted
        return world

    report = explore_bounded(interleave.Scenario(scenario.name, build), preemptions=0)
    assert report.failure is None and report.schedules == len(taken) > 1
    assert any(taken), f"only the drain delivered, in every schedule: {taken}"


# -- the machinery itself ----------------------------------------------------------------


def test_the_check_section_counts_schedules_and_fails_with_the_reproducer() -> None:
    assert "interleavings" in sections.SECTIONS and "interleavings" in sections.RUNNERS
    seen: list[tuple[int, int | None]] = []
    counts = interleave.explore_scenarios(
        [scenarios.ring_publish()], "quick", 0, lambda done, total: seen.append((done, total))
    )
    assert counts["schedules"] == counts["ring_publish schedules"] > 1
    assert counts["scenarios exhaustive to k=1"] == 1 and counts["schedules/s"] > 0
    assert seen[-1] == (1, 1)
    broken = scenarios.ring_publish(channel_class=HeadBeforeLengthChannel)
    with pytest.raises(interleave.InterleavingFailure, match=r"schedule: P\*"):
        interleave.explore_scenarios([broken], "quick", 0, lambda done, total: None)


def test_a_registered_scenario_prints_the_command_that_reruns_it() -> None:
    scenario = interleave.scenario_named("ring_wrap_reclaim")
    result = run_schedule(scenario)
    result.failure = "planted"  # as if a check had failed: only the report's text is tested
    message, text = interleave._describe(scenario, result, interleave._actor_names(scenario))
    assert (
        f"python -m shmring.fault_injection.interleave --scenario ring_wrap_reclaim "
        f"--schedule '{text}'" in message
    )
    assert interleave.main(["--scenario", "ring_wrap_reclaim", "--schedule", text]) == 0


def test_a_schedule_reruns_to_the_same_decisions() -> None:
    scenario = scenarios.ring_claim_race()
    first = run_schedule(scenario, [1, 1, 1, 2, 2, 0])
    text = Schedule(
        tuple(interleave._actor_names(scenario)[d.chosen] for d in first.decisions)
    ).encode()
    again = replay(scenario, text)
    assert [d.chosen for d in again.decisions] == [d.chosen for d in first.decisions]
    assert [d.label for d in again.decisions] == [d.label for d in first.decisions]
    assert Schedule.decode(text).encode() == text


def test_bounded_exploration_grows_with_the_preemption_bound() -> None:
    scenario = scenarios.ring_wrap_reclaim()
    counts = [explore_bounded(scenario, k).schedules for k in (0, 1, 2)]
    # k=0: who starts, and nothing else; each more preemption allows more schedules.
    assert counts[0] == 2 and counts[0] < counts[1] < counts[2]


def test_scheduled_words_read_and_write_the_same_memory() -> None:
    buffer = bytearray(64)
    with memoryview(buffer) as view:
        words = SharedWords(view)
        scheduler = Scheduler()
        holder = type("Holder", (), {})()
        holder._words = words
        install_words(holder, scheduler)
        assert isinstance(holder._words, ScheduledWords)
        holder._words.u64[1] = 7
        holder._words.u16[1] = 3
        assert words.u64[1] == 7 and holder._words.u16[1] == 3
        holder._words.release()


def test_a_schedule_point_outside_a_run_is_a_no_op() -> None:
    scheduler = Scheduler()
    scheduler.point("anything")
    facade = SchedulingOs(scheduler)
    fd = facade.open("/dev/null", os.O_RDONLY)
    facade.close(fd)
    assert scheduler.steps == 0 and scheduler.decisions == []
