"""The doorbell's ring against a receiver falling asleep, explored with a store buffer (issue 23)."""

from __future__ import annotations

from typing import Any

from shmring.fault_injection.interleave import Scenario, Scheduler, explore_bounded
from shmring.fault_injection.interleave_doorbell import DoorbellWorld, doorbell_ring
from shmring.impl.discovery.stamp import Stamp
from shmring.impl.futex import fresh_value, full_fence


class UnfencedStamp(Stamp):
    """Rings without the fence between its store and the waiter count's load."""

    _fence = staticmethod(lambda: None)


class CountFirstStamp(Stamp):
    """Reads the waiter count before it stores the new value (the steps in the wrong order)."""

    def ring(self) -> None:
        doorbell, waiters = self._doorbell, self._waiters
        assert doorbell is not None and waiters is not None
        sleeping = waiters.load()
        doorbell.store(fresh_value(doorbell.load()))
        self._fence()
        if sleeping:
            doorbell.wake()


def test_the_production_stamp_fences_with_the_full_fence() -> None:
    assert Stamp._fence is full_fence


def test_every_schedule_with_two_preemptions_wakes_or_never_sleeps() -> None:
    worlds: list[DoorbellWorld] = []
    base = doorbell_ring()

    def build(scheduler: Scheduler) -> Any:
        world = base.build(scheduler)
        worlds.append(world)
        return world

    report = explore_bounded(Scenario(base.name, build), preemptions=2)
    assert report.failure is None, report.failure
    assert report.exhaustive and report.schedules > 10
    # Both outcomes are reached: R saw the ring before sleeping, and R slept and was woken.
    assert any(world.sleeps == 0 for world in worlds)
    assert any(world.sleeps and world.wakes for world in worlds)


def test_without_the_fence_the_explorer_finds_the_lost_wake_up() -> None:
    report = explore_bounded(doorbell_ring(UnfencedStamp), preemptions=2)
    assert report.failure is not None
    assert "lost wake-up: R asleep on doorbell" in report.failure
    assert "doorbell_ring[UnfencedStamp]" in report.failure


def test_reading_the_count_before_the_store_loses_a_wake_up_even_with_the_fence() -> None:
    report = explore_bounded(doorbell_ring(CountFirstStamp), preemptions=2)
    assert report.failure is not None and "lost wake-up" in report.failure


class UncountedWaitStamp(Stamp):
    """Sleeps without counting itself among the waiters (a producer never wakes it)."""

    def wait(self, seen: int | None, timeout: float) -> None:
        doorbell = self._doorbell
        assert doorbell is not None and seen is not None
        doorbell.wait(seen, timeout)


def test_a_receiver_that_sleeps_uncounted_is_found_asleep_for_good() -> None:
    report = explore_bounded(doorbell_ring(UncountedWaitStamp), preemptions=1)
    assert report.failure is not None and "lost wake-up" in report.failure
