"""A neighbour's unlink and truncation in the interleaving explorer (issue 22).

`neighbour_unlink` unlinks the ring at every stop point of the producer and
the reader in turn; `neighbour_truncate` truncates it at every stop point
between operations. The promised `spec.environment.Outcome` holds on
today's code; a producer that never notices an unlinked file, and an
evacuation that moves frames without the claim lock, show that the checks
can fail.
"""

from __future__ import annotations

import pytest

from shmring.fault_injection.interleave import Interruption, explore_bounded, replay
from shmring.fault_injection.interleave_neighbours import (
    explore_neighbour,
    neighbour_truncate,
    neighbour_unlink,
)
from shmring.fault_injection.test_interleave import _reordered
from shmring.impl.ring.producer import RingChannel


class IgnoresUnlinkChannel(RingChannel):
    """Notices a shrunk file but not an unlinked one (defect 4 of issue 22 again)."""

    def file_problem(self) -> str | None:
        problem = super().file_problem()
        return None if problem is not None and "unlinked" in problem else problem


class UnlockedEvacuationChannel(RingChannel):
    """Moves the unclaimed frames without taking the claim lock (a claim under way races it)."""

    evacuate = _reordered(
        RingChannel.evacuate,
        [
            (
                "            if not published or not lock_exclusive_within(\n"
                "                self._os, self._fd, PRODUCER_LOCK_WAIT_SECONDS\n"
                "            ):\n",
                "            if not published:\n",
            ),
        ],
    )


def test_an_unlinked_ring_loses_nothing_at_any_stop_point() -> None:
    report = explore_neighbour(neighbour_unlink(), keep_going=True)
    assert report.failure is None, report.failure
    assert report.stop_points > 60, report.stop_points


def test_a_truncated_ring_between_operations_is_typed_and_replaced() -> None:
    report = explore_neighbour(neighbour_truncate(), preemptions=1, keep_going=True)
    assert report.failure is None, report.failure
    assert report.stop_points >= 6, report.stop_points


def test_a_producer_that_never_notices_the_unlink_is_found() -> None:
    report = explore_neighbour(neighbour_unlink(IgnoresUnlinkChannel))
    assert report.failure is not None, report.schedules
    assert "the producer re-created the ring 0 times" in report.failure
    assert report.reproducer is not None and report.interruption is not None
    again = replay(neighbour_unlink(IgnoresUnlinkChannel), report.reproducer, report.interruption)
    assert again.failure is not None
    # The real producer, unlinked at the same stop point, passes every order of the actors.
    real = explore_bounded(
        neighbour_unlink(), 0, interruption=Interruption.decode(report.interruption)
    )
    assert real.failure is None, real.failure


def test_an_evacuation_without_the_claim_lock_is_found() -> None:
    report = explore_neighbour(neighbour_unlink(UnlockedEvacuationChannel), preemptions=1)
    assert report.failure is not None, report.schedules
    assert "twice" in report.failure, report.failure


@pytest.mark.slow
def test_an_unlinked_ring_under_one_preemption() -> None:
    report = explore_neighbour(neighbour_unlink(), preemptions=1, keep_going=True)
    assert report.failure is None, report.failure
