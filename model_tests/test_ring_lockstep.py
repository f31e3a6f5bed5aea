"""The ring lockstep machine as a test: model and real channel agree, and every
interesting state is reached.

One derandomized run of the "ring-ci" profile serves both tests: the first
fails if model and implementation ever disagree, the second if the run
never reached one of the labelled states (so a change that makes, say,
wraparound unreachable cannot pass unnoticed).
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass

import pytest
from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test

from shmring.model_tests import ring_machine
from shmring.model_tests.ring_machine import CI_PROFILE, EVENT_LABELS, RingLockstepMachine


@dataclass(frozen=True)
class MachineRun:
    events: Counter[str]  # labelled states reached, with counts
    steps: int  # rules run
    seconds: float  # wall time of the run
    error: BaseException | None  # what the run raised, if anything


@pytest.fixture(scope="module")
def ci_run() -> MachineRun:
    ring_machine.EVENTS_SEEN.clear()
    ring_machine.STEPS.clear()
    started = time.perf_counter()
    error: BaseException | None = None
    try:
        run_state_machine_as_test(RingLockstepMachine, settings=settings.get_profile(CI_PROFILE))
    except BaseException as raised:  # reported by the tests below
        error = raised
    seconds = time.perf_counter() - started
    return MachineRun(
        Counter(ring_machine.EVENTS_SEEN), sum(ring_machine.STEPS.values()), seconds, error
    )


def test_ring_channel_agrees_with_model(ci_run: MachineRun) -> None:
    if ci_run.error is not None:
        raise ci_run.error
    print(
        f"\nring lockstep: {ci_run.steps} steps in {ci_run.seconds:.1f} s "
        f"({ci_run.steps / ci_run.seconds:.0f} steps/s); events {dict(ci_run.events)}"
    )


def test_every_event_label_is_reached(ci_run: MachineRun) -> None:
    missing = [label for label in EVENT_LABELS if ci_run.events[label] == 0]
    assert not missing, f"labels never reached: {missing}; reached: {dict(ci_run.events)}"
