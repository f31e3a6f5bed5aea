"""Dead producers' files do not pile up in a crash loop (issue 12, part 2)."""

from __future__ import annotations

import os
import time
import uuid

import pytest

from shmring.fault_injection import crashloop
from shmring.fault_injection.kit.processes import ForkedChild
from shmring.impl.connector import Connector
from shmring.impl.liveness import liveness_file_name
from shmring.impl.names import current_producer_identity

# One dead producer's files (ring, marker, live file, two segments) may still be
# there between its kill and the receiver's next scan; nothing else may grow.
ONE_DEAD_PRODUCER = 5


def _check(report: crashloop.CrashLoopReport) -> None:
    assert report.lost == (), report
    assert report.delivered == report.kills, report
    bound = report.live_files + ONE_DEAD_PRODUCER
    assert max(report.files_after_kill) <= bound, report
    # Every kill's files were reclaimed, by the receiver's scan or (issue 26)
    # first by the restarted producer's join: the bound on files above.


def test_crash_loop_a_dead_producers_files_are_reclaimed_by_the_next_scan() -> None:
    _check(crashloop.run_crash_loop(f"cl{uuid.uuid4().hex[:8]}", kills=3))


def test_crash_loop_of_a_pool_producer_killed_mid_put_and_restarted_loses_nothing() -> None:
    """Issue 13: the pool in the crash loop, one kill at each publish stage of a pool put.

    Every incarnation's committed pool payload is delivered from that
    incarnation (a restart is told apart from the one before), nothing of
    a dead incarnation afterwards, every live payload (every third by the
    pool) intact, the dead slot files reclaimed by the next scan, and none
    left after gc.
    """
    kills = len(crashloop.CRASH_STAGES)
    report = crashloop.run_crash_loop(f"cl{uuid.uuid4().hex[:8]}", kills=kills, pool=True)
    _check(report)
    assert report.pool_puts == (kills + 2) // 3, report  # tags 0, 3, ...
    assert report.restarts_seen == kills, report
    assert report.stale_slot_files == (0,) * kills, report  # reclaimed by the next scan
    assert report.dead_files_after_gc == (), report


@pytest.mark.slow
def test_crash_loop_of_40_pool_kills_keeps_dev_shm_within_the_live_producers_files() -> None:
    report = crashloop.run_crash_loop(f"cl{uuid.uuid4().hex[:8]}", kills=40, pool=True)
    _check(report)
    assert report.restarts_seen == 40 and report.dead_files_after_gc == (), report
    assert report.stale_slot_files == (0,) * 40, report
    assert report.files_after_kill[-1] <= report.files_after_kill[0], report


@pytest.mark.slow
def test_crash_loop_of_40_kills_keeps_dev_shm_within_the_live_producers_files() -> None:
    report = crashloop.run_crash_loop(f"cl{uuid.uuid4().hex[:8]}", kills=40)
    _check(report)
    assert report.files_after_kill[-1] <= report.files_after_kill[0], report


def test_a_killed_producers_files_go_at_the_periodic_rescan_without_any_stamp_move() -> None:
    """A death moves no stamp: the receiver's periodic rescan bounds how long its files stay."""
    scope = f"cl{uuid.uuid4().hex[:8]}"
    with Connector(
        scope, ring_capacity=crashloop.RING_CAPACITY, pool_budget_bytes=0, rescan_seconds=0.2
    ) as receiver:
        receiver.get(crashloop.EDGE, "join")
        doomed = ForkedChild(lambda report: crashloop._doomed(scope, 0, report))
        try:
            assert doomed.next_report() == {"ready": 0}
            receiver.get(crashloop.DEAD_EDGE, "nothing")  # scans: the producer is alive
        finally:
            doomed.kill()
        # The receiver's own liveness file (this process) stays with stamp and members.
        own = {"stamp", "members", liveness_file_name(current_producer_identity())}
        assert set(os.listdir(receiver.directory)) > own  # the dead producer's files
        receiver.get(crashloop.DEAD_EDGE, "nothing")  # within the period: no scan, still there
        time.sleep(0.3)
        receiver.get(crashloop.DEAD_EDGE, "nothing")  # the period passed: rescan, reclaim
        assert set(os.listdir(receiver.directory)) == own
        assert receiver.health().reclaimed_files >= 4
