"""The ring lockstep machine as a test: model and real channel agree, and every
interesting state is reached.

One derandomized run of the "ring-ci" profile serves both tests: the first
fails if model and implementation ever disagree, the second if the run
never reached one of the labelled states (so a change that makes, say,
wraparound unreachable cannot pass unnoticed).
"""

from __future__ import annotations

import gc

import pytest
from hypothesis import settings
from hypothesis.stateful import invariant

from shmring.model_tests import ring_machine
from shmring.model_tests.machine_runs import MachineRun, missing_labels, report, run_machine
from shmring.model_tests.ring_machine import CI_PROFILE, EVENT_LABELS, RingLockstepMachine

# A few examples of the CI profile, for the tests of the run itself.
FEW_PROFILE = f"{CI_PROFILE}-few"
settings.register_profile(FEW_PROFILE, settings.get_profile(CI_PROFILE), max_examples=5)


@pytest.fixture(scope="module")
def ci_run() -> MachineRun:
    return run_machine(ring_machine, RingLockstepMachine, CI_PROFILE)


def test_ring_channel_agrees_with_model(ci_run: MachineRun) -> None:
    report("ring lockstep", ci_run)


def test_every_event_label_is_reached(ci_run: MachineRun) -> None:
    missing, events = missing_labels(
        ring_machine, RingLockstepMachine, CI_PROFILE, EVENT_LABELS, ci_run
    )
    assert not missing, f"labels never reached: {missing}; reached: {dict(events)}"


class PlantedFailure(RingLockstepMachine):
    """The ring machine with one more invariant that fails once anything was put."""

    @invariant()
    def nothing_put_yet(self) -> None:
        assert self.model is None or self.model.head == 0, "planted: something was put"


def test_a_failing_run_still_reports_every_step_with_its_notes() -> None:
    # The rules format their notes only when Hypothesis shows them (the final
    # replay of the failing example): the report must still have them.
    run = run_machine(ring_machine, PlantedFailure, FEW_PROFILE)
    assert isinstance(run.error, AssertionError) and "planted" in str(run.error)
    notes = "\n".join(getattr(run.error, "__notes__", []))
    assert "ring of capacity=" in notes, notes
    assert "bytes) at head=0 tail=0" in notes, notes
    assert "  -> PutOutcome(status=<PutStatus.PUBLISHED" in notes, notes


@pytest.mark.parametrize("frozen_by_caller", [False, True])
def test_a_run_leaves_the_collector_as_it_found_it(frozen_by_caller: bool) -> None:
    # run_machine freezes the objects that predate the run and unfreezes them
    # after, unless the caller had frozen some: that freeze is the caller's.
    if frozen_by_caller:
        gc.freeze()
    try:
        frozen_before = gc.get_freeze_count() > 0
        run = run_machine(ring_machine, RingLockstepMachine, FEW_PROFILE)
        assert run.error is None and run.steps > 0
        assert frozen_before is frozen_by_caller
        # (whether any are frozen: a frozen object may still be freed)
        assert (gc.get_freeze_count() > 0) is frozen_by_caller
    finally:
        gc.unfreeze()
