"""Lockstep: the pool model (`spec.pool`) and the real pool agree, and every labelled state is reached."""

from __future__ import annotations

import pytest

from shmring.model_tests import pool_machine
from shmring.model_tests.machine_runs import MachineRun, missing_labels, report, run_machine
from shmring.model_tests.pool_machine import (
    CI_PROFILE,
    EVENT_LABELS,
    LONG_PROFILE,
    PoolLockstepMachine,
)


@pytest.fixture(scope="module")
def ci_run() -> MachineRun:
    return run_machine(pool_machine, PoolLockstepMachine, CI_PROFILE)


def test_pool_agrees_with_model(ci_run: MachineRun) -> None:
    report("pool lockstep", ci_run)


def test_every_pool_event_label_is_reached(ci_run: MachineRun) -> None:
    missing, events = missing_labels(
        pool_machine, PoolLockstepMachine, CI_PROFILE, EVENT_LABELS, ci_run
    )
    assert not missing, f"labels never reached: {missing}; reached: {dict(events)}"


@pytest.mark.slow
def test_pool_agrees_with_model_long() -> None:
    report("pool lockstep (long)", run_machine(pool_machine, PoolLockstepMachine, LONG_PROFILE))
