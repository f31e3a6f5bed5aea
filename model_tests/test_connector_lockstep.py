"""Lockstep (b): the connector model and a real connector agree, and every labelled state is reached.

One derandomized run of the "connector-ci" profile serves both tests: the
first fails if model and implementation ever disagree, the second if the
run never reached one of the labelled states (fallback, back-pressure, stale
descriptor, re-put across routes, prefix cleanup, ring setup failure, ...),
so a change that makes one unreachable cannot pass unnoticed. The long
profile runs behind the `slow` marker.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass

import pytest
from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test

from shmring.model_tests import connector_machine
from shmring.model_tests.connector_machine import (
    CI_PROFILE,
    EVENT_LABELS,
    LONG_PROFILE,
    ConnectorLockstepMachine,
)


@dataclass(frozen=True)
class MachineRun:
    events: Counter[str]  # labelled states reached, with counts
    steps: int  # rules run
    seconds: float  # wall time of the run
    error: BaseException | None  # what the run raised, if anything


def _run(profile: str) -> MachineRun:
    connector_machine.EVENTS_SEEN.clear()
    connector_machine.STEPS.clear()
    started = time.perf_counter()
    error: BaseException | None = None
    try:
        run_state_machine_as_test(ConnectorLockstepMachine, settings=settings.get_profile(profile))
    except BaseException as raised:  # reported by the tests below
        error = raised
    seconds = time.perf_counter() - started
    return MachineRun(
        Counter(connector_machine.EVENTS_SEEN),
        sum(connector_machine.STEPS.values()),
        seconds,
        error,
    )


@pytest.fixture(scope="module")
def ci_run() -> MachineRun:
    return _run(CI_PROFILE)


def test_connector_agrees_with_model(ci_run: MachineRun) -> None:
    if ci_run.error is not None:
        raise ci_run.error
    print(
        f"\nconnector lockstep: {ci_run.steps} steps in {ci_run.seconds:.1f} s "
        f"({ci_run.steps / ci_run.seconds:.0f} steps/s); events {dict(ci_run.events)}"
    )


def test_every_connector_event_label_is_reached(ci_run: MachineRun) -> None:
    missing = [label for label in EVENT_LABELS if ci_run.events[label] == 0]
    assert not missing, f"labels never reached: {missing}; reached: {dict(ci_run.events)}"


@pytest.mark.slow
def test_connector_agrees_with_model_long() -> None:
    run = _run(LONG_PROFILE)
    if run.error is not None:
        raise run.error
    print(
        f"\nconnector lockstep (long): {run.steps} steps in {run.seconds:.1f} s "
        f"({run.steps / run.seconds:.0f} steps/s); events {dict(run.events)}"
    )
