"""Lockstep (c) discovery and (d) producer restart: model and real processes agree.

Each machine runs once per module under its derandomized CI profile; one
test fails if model and implementation ever disagree, another if a labelled
state was never reached. Long profiles run behind the `slow` marker.
"""

from __future__ import annotations

import pytest
from hypothesis.stateful import RuleBasedStateMachine

from shmring.model_tests import discovery_machine
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
from shmring.model_tests.machine_runs import MachineRun, missing_labels, report, run_machine

# A guard against a hung worker or a receive that blocks, not a timing claim.
WATCHDOG_SECONDS = 600


def _run(machine: type[RuleBasedStateMachine], profile: str) -> MachineRun:
    return run_machine(discovery_machine, machine, profile, WATCHDOG_SECONDS)


@pytest.fixture(scope="module")
def discovery_run() -> MachineRun:
    return _run(DiscoveryLockstepMachine, CI_PROFILE)


@pytest.fixture(scope="module")
def restart_run() -> MachineRun:
    return _run(RestartLockstepMachine, RESTART_CI_PROFILE)


def test_discovery_agrees_with_model(discovery_run: MachineRun) -> None:
    report("discovery lockstep", discovery_run)


def test_every_discovery_event_label_is_reached(discovery_run: MachineRun) -> None:
    missing, events = missing_labels(
        discovery_machine,
        DiscoveryLockstepMachine,
        CI_PROFILE,
        EVENT_LABELS,
        discovery_run,
        WATCHDOG_SECONDS,
    )
    assert not missing, f"labels never reached: {missing}; reached: {dict(events)}"


def test_restarted_producer_agrees_with_model(restart_run: MachineRun) -> None:
    report("restart lockstep", restart_run)


def test_every_restart_event_label_is_reached(restart_run: MachineRun) -> None:
    missing, events = missing_labels(
        discovery_machine,
        RestartLockstepMachine,
        RESTART_CI_PROFILE,
        RESTART_EVENT_LABELS,
        restart_run,
        WATCHDOG_SECONDS,
    )
    assert not missing, f"labels never reached: {missing}; reached: {dict(events)}"


@pytest.mark.slow
def test_discovery_agrees_with_model_long() -> None:
    report("discovery lockstep (long)", _run(DiscoveryLockstepMachine, LONG_PROFILE))


@pytest.mark.slow
def test_restarted_producer_agrees_with_model_long() -> None:
    report("restart lockstep (long)", _run(RestartLockstepMachine, RESTART_LONG_PROFILE))
