"""The shared engine machine (`engine_machine.py`), run once per engine.

The host ring and the registered arena pass the same rules against the same
model. A rule added there is checked on both, and so is every engine added
to `ENGINE_MACHINES`.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test

from shmring.model_tests.engine_machine import (
    ENGINE_MACHINES,
    ArenaEngine,
    ArenaEngineMachine,
    EngineLockstepMachine,
    RingEngine,
    RingEngineMachine,
)
from shmring.model_tests.registration_machine import profile
from shmring.spec.ring import ConsumeMode

for _machine in ENGINE_MACHINES:
    _machine.TestCase.settings = profile(max_examples=40, stateful_step_count=40)

TestRingEngine = RingEngineMachine.TestCase
TestArenaEngine = ArenaEngineMachine.TestCase


def test_every_engine_runs_the_shared_machine() -> None:
    """Each engine machine runs here: one that joins `ENGINE_MACHINES` gets a TestCase above."""
    assert set(ENGINE_MACHINES) == {RingEngineMachine, ArenaEngineMachine}


class _ArenaKeepingLeases(ArenaEngine):
    """An arena whose leases are never let go (a view leaked): frames stay CLAIMED."""

    kept: list[Any] = []

    def release(self, handle: Any) -> None:
        self.kept.append(handle.view)
        handle.view = None


class _RingCopyingAsLease(RingEngine):
    """A ring whose copy-out leaves the frame claimed (a lease nobody releases)."""

    def copy_out(self, key: str, position: int) -> bytes:
        got = self.reader.get(key, position, mode=ConsumeMode.LEASE)
        self.kept = getattr(self, "kept", []) + [got.payload]
        return bytes(got.payload.view)


@pytest.mark.parametrize("engine", [_ArenaKeepingLeases, _RingCopyingAsLease])
def test_an_engine_that_leaves_frames_claimed_fails_the_machine(engine: type) -> None:
    machine = type("Broken", (EngineLockstepMachine,), {"engine_type": engine})
    quick = settings(max_examples=50, stateful_step_count=20, database=None, deadline=None)
    try:
        with pytest.raises(AssertionError, match="shared=2, model=3"):
            run_state_machine_as_test(machine, settings=quick)
    finally:
        _ArenaKeepingLeases.kept.clear()
