"""Lockstep (b): the connector model and a real connector agree, and every labelled state is reached.

One derandomized run of the "connector-ci" profile serves both tests: the
first fails if model and implementation ever disagree, the second if the
run never reached one of the labelled states (fallback, back-pressure, stale
descriptor, re-put across routes, prefix cleanup, ring setup failure, ...),
so a change that makes one unreachable cannot pass unnoticed. The long
profile runs behind the `slow` marker.
"""

from __future__ import annotations

import pytest

from shmring.model_tests import connector_machine
from shmring.model_tests.connector_machine import (
    CI_PROFILE,
    EVENT_LABELS,
    LONG_PROFILE,
    ConnectorLockstepMachine,
)
from shmring.model_tests.machine_runs import MachineRun, missing_labels, report, run_machine


def _run(profile: str) -> MachineRun:
    return run_machine(connector_machine, ConnectorLockstepMachine, profile)


@pytest.fixture(scope="module")
def ci_run() -> MachineRun:
    return _run(CI_PROFILE)


def test_connector_agrees_with_model(ci_run: MachineRun) -> None:
    report("connector lockstep", ci_run)


def test_every_connector_event_label_is_reached(ci_run: MachineRun) -> None:
    missing, events = missing_labels(
        connector_machine, ConnectorLockstepMachine, CI_PROFILE, EVENT_LABELS, ci_run
    )
    assert not missing, f"labels never reached: {missing}; reached: {dict(events)}"


@pytest.mark.slow
def test_connector_agrees_with_model_long() -> None:
    report("connector lockstep (long)", _run(LONG_PROFILE))
