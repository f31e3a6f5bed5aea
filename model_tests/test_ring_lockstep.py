"""The ring lockstep machine as a test: model and real channel agree, and every
interesting state is reached.

One derandomized run of the "ring-ci" profile serves both tests: the first
fails if model and implementation ever disagree, the second if the run
never reached one of the labelled states (so a change that makes, say,
wraparound unreachable cannot pass unnoticed).
"""

from __future__ import annotations

import pytest

from shmring.model_tests import ring_machine
from shmring.model_tests.machine_runs import MachineRun, report, run_machine
from shmring.model_tests.ring_machine import CI_PROFILE, EVENT_LABELS, RingLockstepMachine


@pytest.fixture(scope="module")
def ci_run() -> MachineRun:
    return run_machine(ring_machine, RingLockstepMachine, CI_PROFILE)


def test_ring_channel_agrees_with_model(ci_run: MachineRun) -> None:
    report("ring lockstep", ci_run)


def test_every_event_label_is_reached(ci_run: MachineRun) -> None:
    missing = [label for label in EVENT_LABELS if ci_run.events[label] == 0]
    assert not missing, f"labels never reached: {missing}; reached: {dict(ci_run.events)}"
