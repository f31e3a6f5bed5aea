"""Interrupted operations in the interleaving explorer (issue 24).

Every stop point of every actor of the three interrupt scenarios raises
`Interrupt` once (one per run, every non-preemptive order of the actors),
and the failures found are exactly the open findings `KNOWN_OPEN` lists:
a new one fails, and so does one that no longer happens (remove it there
and in docs/interleavings.md). Deliberately broken readers and a reverted
`PoolClaim.release` show that each check can fail.
"""

from __future__ import annotations

from typing import Any

import pytest

from shmring.fault_injection import interleave
from shmring.fault_injection import interleave_interrupts as interrupts
from shmring.fault_injection.interleave import (
    Interrupt,
    Interruption,
    explore_interrupts,
    replay,
    run_schedule,
)
from shmring.impl import frame_io
from shmring.impl.pool import consumer
from shmring.impl.pool.slots import (
    load_slot_generation,
    load_slot_state_acquire,
    store_slot_state_release,
)
from shmring.impl.ring.producer import RingChannel
from shmring.impl.ring.reader import RingReader
from shmring.spec.layout import (
    FRAME_STATE_RETIRED,
    POOL_SLOT_CLAIMED,
    POOL_SLOT_DONE,
    RING_HEADER_LENGTH,
)


def _explore(scenario: interleave.Scenario, **options: Any) -> interleave.Report:
    return explore_interrupts(scenario, keep_going=True, **options)


@pytest.mark.parametrize("scenario", interrupts.INTERRUPT_SCENARIOS, ids=lambda s: s.name)
def test_every_stop_point_interrupted_finds_only_the_known_open_findings(
    scenario: interleave.Scenario,
) -> None:
    report = _explore(scenario)
    assert report.stop_points > 40, report.stop_points  # both actors, every point
    found = interrupts.findings(report)
    known = interrupts.KNOWN_OPEN[scenario.name]
    new = {key: found[key] for key in set(found) - known}
    assert not new, "new failures of interrupted operations:\n" + "\n\n".join(new.values())
    fixed = known - set(found)
    assert not fixed, f"no longer found (remove them from KNOWN_OPEN and the docs): {fixed}"


def test_an_interrupted_run_without_findings_is_clean_end_to_end() -> None:
    """The clean run raises nothing, counts stop points, and passes every end check."""
    for scenario in interrupts.INTERRUPT_SCENARIOS:
        clean = run_schedule(scenario)
        assert clean.failure is None, clean.failure
        assert clean.interrupted is None
        assert set(clean.stop_labels) == {"P", "R0"}
        # The stop points right after a call that took something are there too.
        assert any(label == "after lock" for label in clean.stop_labels["R0"])


def test_a_finding_prints_a_reproducer_that_replays() -> None:
    scenario = interrupts.interrupt_ring()
    report = explore_interrupts(scenario)  # stops at the first failure
    assert report.failure is not None and report.interruption is not None
    assert f"--interrupt {report.interruption}" in report.failure
    assert report.reproducer is not None
    again = replay("interrupt_ring", report.reproducer, report.interruption)
    assert again.failure is not None and again.interrupted is not None
    assert interrupts.classify(again.failure) == interrupts.classify(
        report.failure.split(": ", 1)[1]
    )
    # The same schedule without the interrupt passes: the interrupt is what broke it.
    assert replay("interrupt_ring", report.reproducer).failure is None
    # And from the command line.
    assert (
        interleave.main(
            [
                "--scenario",
                "interrupt_ring",
                "--schedule",
                report.reproducer,
                "--interrupt",
                report.interruption,
            ]
        )
        == 1
    )


def test_interruption_encodes_as_printed() -> None:
    assert Interruption.decode("R0@17") == Interruption("R0", 17)
    assert Interruption("P", 3).encode() == "P@3"


# -- the checks can fail ---------------------------------------------------------------


class EscapingReader(RingReader):
    """Lets an internal error out where the interrupt struck (as the storm's BufferError)."""

    def get(self, *args: Any, **options: Any) -> Any:
        try:
            return super().get(*args, **options)
        except Interrupt as error:
            raise BufferError("cannot close exported pointers exist") from error


class SwallowingReader(RingReader):
    """Swallows the interrupt and answers as if nothing happened (tries the get again)."""

    def get(self, *args: Any, **options: Any) -> Any:
        try:
            return super().get(*args, **options)
        except Interrupt:
            return super().get(*args, **options)


def test_an_internal_error_escaping_an_interrupted_get_is_found() -> None:
    report = explore_interrupts(interrupts.interrupt_ring(EscapingReader), actors=["R0"])
    assert report.failure is not None
    assert "let an internal error escape" in report.failure and "BufferError" in report.failure
    assert f"interrupt={report.interruption!r}" in report.failure  # the Python rerun


def test_a_swallowed_interrupt_is_found() -> None:
    report = explore_interrupts(interrupts.interrupt_ring(SwallowingReader), actors=["R0"])
    assert report.failure is not None
    assert "swallowed the interrupt" in report.failure


class RollsBackPublishedChannel(RingChannel):
    """On an interrupt, retires the frame the put wrote: a published put then leaves nothing."""

    def put(self, key: str, payload: Any) -> Any:
        before = frame_io.load_head_acquire(self._words)
        try:
            return super().put(key, payload)
        except Interrupt:
            if frame_io.load_head_acquire(self._words) > before:
                offset = RING_HEADER_LENGTH + before % self.capacity
                frame_io.store_frame_state_release(self._words, offset, FRAME_STATE_RETIRED)
            raise


def test_an_interrupted_put_that_loses_what_it_published_is_found() -> None:
    report = _explore(interrupts.interrupt_ring(channel_class=RollsBackPublishedChannel))
    failures = [failure for _, _, failure, _ in report.failures]
    assert any("was never delivered" in failure for failure in failures), failures


def _release_marked_first(self: Any) -> None:
    """`PoolClaim.release` before issue 24's fix: marked released before DONE is stored."""
    if self._released:
        return
    self._released = True
    words, self._words = self._words, None
    if words is None:
        return
    if (
        load_slot_generation(words) == self.generation
        and load_slot_state_acquire(words) == POOL_SLOT_CLAIMED
    ):
        store_slot_state_release(words, POOL_SLOT_DONE)
    words.release()


def test_a_pool_claim_release_that_an_interrupt_can_lose_is_found(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The fixed bug: an interrupted release left the slot CLAIMED for good (pool exhausted)."""
    monkeypatch.setattr(consumer.PoolClaim, "release", _release_marked_first)
    report = _explore(interrupts.interrupt_pool(), actors=["R0"])
    found = interrupts.findings(report)
    new = set(found) - interrupts.KNOWN_OPEN["interrupt_pool"]
    assert any("pool put after the interrupt failed" in kind for _, _, kind in new), found


def test_the_lock_check_sees_a_lock_held_at_the_end() -> None:
    """The end's flock probe (not only the scheduler's deadlock) reports a held lock."""
    report = _explore(interrupts.interrupt_ring(), actors=["R0"])
    failures = [failure for _, _, failure, _ in report.failures]
    assert any("a lock stays held on 'ring'" in failure for failure in failures), failures


@pytest.mark.slow
@pytest.mark.parametrize("scenario", interrupts.INTERRUPT_SCENARIOS, ids=lambda s: s.name)
def test_every_stop_point_under_one_preemption(scenario: interleave.Scenario) -> None:
    report = _explore(scenario, preemptions=1)
    found = interrupts.findings(report)
    known = interrupts.KNOWN_OPEN[scenario.name] | interrupts.KNOWN_OPEN_PREEMPTED[scenario.name]
    new = {key: found[key] for key in set(found) - known}
    assert not new, "new failures of interrupted operations:\n" + "\n\n".join(new.values())


def test_the_check_section_fails_on_a_finding_it_does_not_know(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`explore_environment` (the check section's part) raises on a finding not in KNOWN_OPEN."""
    monkeypatch.setattr(interrupts, "KNOWN_OPEN", {name: set() for name in interrupts.KNOWN_OPEN})
    with pytest.raises(interleave.InterleavingFailure, match="interrupt_ring"):
        interleave.explore_environment("quick", 0)
