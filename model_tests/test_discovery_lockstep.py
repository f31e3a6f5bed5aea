"""Lockstep (c) discovery and (d) producer restart: model and real processes agree.

Each machine runs once per module under its derandomized CI profile; one
test fails if model and implementation ever disagree, another if a labelled
state was never reached. Long profiles run behind the `slow` marker.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass

import pytest
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, run_state_machine_as_test

from shmring.model_tests import discovery_machine
from shmring.model_tests.connector_support import watchdog
from shmring.model_tests.discovery_machine import (
    CI_PROFILE,
    EVENT_LABELS,
    LONG_PROFILE,
    RESTART_CI_PROFILE,
    RESTART_EVENT_LABELS,
    RESTART_LONG_PROFILE,
    DiscoveryLockstepMachine,
    RestartLockstepMachine,
)

# A guard against a hung worker or a receive that blocks, not a timing claim.
WATCHDOG_SECONDS = 600


@dataclass(frozen=True)
class MachineRun:
    events: Counter[str]  # labelled states reached, with counts
    steps: int  # rules run
    seconds: float  # wall time of the run
    error: BaseException | None  # what the run raised, if anything


def _run(machine: type[RuleBasedStateMachine], profile: str) -> MachineRun:
    discovery_machine.EVENTS_SEEN.clear()
    discovery_machine.STEPS.clear()
    started = time.perf_counter()
    error: BaseException | None = None
    try:
        with watchdog(WATCHDOG_SECONDS):
            run_state_machine_as_test(machine, settings=settings.get_profile(profile))
    except BaseException as raised:  # reported by the tests below
        error = raised
    seconds = time.perf_counter() - started
    return MachineRun(
        Counter(discovery_machine.EVENTS_SEEN),
        sum(discovery_machine.STEPS.values()),
        seconds,
        error,
    )


def _report(name: str, run: MachineRun) -> None:
    if run.error is not None:
        raise run.error
    print(
        f"\n{name}: {run.steps} steps in {run.seconds:.1f} s "
        f"({run.steps / run.seconds:.0f} steps/s); events {dict(run.events)}"
    )


@pytest.fixture(scope="module")
def discovery_run() -> MachineRun:
    return _run(DiscoveryLockstepMachine, CI_PROFILE)


@pytest.fixture(scope="module")
def restart_run() -> MachineRun:
    return _run(RestartLockstepMachine, RESTART_CI_PROFILE)


def test_discovery_agrees_with_model(discovery_run: MachineRun) -> None:
    _report("discovery lockstep", discovery_run)


def test_every_discovery_event_label_is_reached(discovery_run: MachineRun) -> None:
    missing = [label for label in EVENT_LABELS if discovery_run.events[label] == 0]
    assert not missing, f"labels never reached: {missing}; reached: {dict(discovery_run.events)}"


def test_restarted_producer_agrees_with_model(restart_run: MachineRun) -> None:
    _report("restart lockstep", restart_run)


def test_every_restart_event_label_is_reached(restart_run: MachineRun) -> None:
    missing = [label for label in RESTART_EVENT_LABELS if restart_run.events[label] == 0]
    assert not missing, f"labels never reached: {missing}; reached: {dict(restart_run.events)}"


@pytest.mark.slow
def test_discovery_agrees_with_model_long() -> None:
    _report("discovery lockstep (long)", _run(DiscoveryLockstepMachine, LONG_PROFILE))


@pytest.mark.slow
def test_restarted_producer_agrees_with_model_long() -> None:
    _report("restart lockstep (long)", _run(RestartLockstepMachine, RESTART_LONG_PROFILE))
