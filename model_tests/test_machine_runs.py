"""`missing_labels`: a label is missing only if no run of a bounded set reaches it."""

from __future__ import annotations

import sys
from collections import Counter

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, rule

from shmring.fault_injection.kit.machines import Tally
from shmring.model_tests.machine_runs import FURTHER_SEEDS, MachineRun, missing_labels

TALLY = Tally()  # this module is the machine module `run_machine` reads
PROFILE = "machine-runs-tiny"
settings.register_profile(
    PROFILE, max_examples=3, stateful_step_count=3, derandomize=True, database=None, deadline=None
)
MODULE = sys.modules[__name__]
made: Counter[str] = Counter()  # machines made, by class name


class Tiny(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        made[type(self).__name__] += 1

    @rule(value=st.integers(0, 3))
    def step(self, value: int) -> None:
        TALLY.step("step")
        TALLY.label("stepped")


class Disagrees(Tiny):
    @rule()
    def fail(self) -> None:
        raise AssertionError("planted disagreement")


def _a_run_that_reached_none() -> MachineRun:
    """A run that reached only an unlisted label."""
    return MachineRun(Counter({"other": 1}), 1, 1.0, 1.0, None)


def test_nothing_missing_makes_no_further_run() -> None:
    made.clear()
    run = MachineRun(Counter({"stepped": 2}), 2, 1.0, 1.0, None)
    assert missing_labels(MODULE, Tiny, PROFILE, ("stepped",), run) == ([], Counter({"stepped": 2}))
    assert not made


def test_a_label_the_first_run_missed_is_found_by_a_further_run() -> None:
    made.clear()
    missing, events = missing_labels(
        MODULE, Tiny, PROFILE, ("stepped",), _a_run_that_reached_none()
    )
    assert missing == [] and events["stepped"] > 0 and events["other"] == 1
    assert list(made) == ["TinySeed1"], made  # one further run was enough


def test_an_unreachable_label_is_missing_after_every_further_seed() -> None:
    made.clear()
    missing, events = missing_labels(
        MODULE, Tiny, PROFILE, ("stepped", "never"), _a_run_that_reached_none()
    )
    assert missing == ["never"] and events["stepped"] > 0
    assert sorted(made) == sorted(f"TinySeed{number}" for number in FURTHER_SEEDS)


def test_a_further_run_that_disagrees_raises() -> None:
    with pytest.raises(AssertionError, match="planted disagreement"):
        missing_labels(MODULE, Disagrees, PROFILE, ("never",), _a_run_that_reached_none())
