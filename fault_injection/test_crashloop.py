"""Dead producers' files do not pile up in a crash loop (issue 12, part 2)."""

from __future__ import annotations

import uuid

import pytest

from shmring.fault_injection import crashloop

# One dead producer's files (ring, marker, live file, two segments) may still be
# there between its kill and the receiver's next scan; nothing else may grow.
ONE_DEAD_PRODUCER = 5


def _check(report: crashloop.CrashLoopReport) -> None:
    assert report.lost == (), report
    assert report.delivered == report.kills, report
    bound = report.live_files + ONE_DEAD_PRODUCER
    assert max(report.files_after_kill) <= bound, report
    assert report.reclaimed >= report.kills, report  # every kill was reclaimed by the receiver


def test_crash_loop_a_dead_producers_files_are_reclaimed_by_the_next_scan() -> None:
    _check(crashloop.run_crash_loop(f"cl{uuid.uuid4().hex[:8]}", kills=3))


@pytest.mark.slow
def test_crash_loop_of_40_kills_keeps_dev_shm_within_the_live_producers_files() -> None:
    report = crashloop.run_crash_loop(f"cl{uuid.uuid4().hex[:8]}", kills=40)
    _check(report)
    assert report.files_after_kill[-1] <= report.files_after_kill[0], report
