"""SIGKILL at the named crash points of a put, a close and a read, in each ring state."""

from __future__ import annotations

import errno
import os
import subprocess
import sys

import pytest
import torch

from shmring.fault_injection import crash
from shmring.fault_injection.kit.processes import ForkedChild, die, killed_by_sigkill
from shmring.fault_injection.kit.seams import FaultyOs
from shmring.fault_injection.plans import FaultyCudaDriver
from shmring.impl.os_seam import DEFAULT_OS, SITE_OPEN, SITE_PIDFD
from shmring.impl.registered.arena import (
    ArenaFrameDescriptor,
    ArenaReader,
    RegisteredArena,
    is_holder_alive,
)
from shmring.impl.registered.registration import Registry
from shmring.spec.layout import FRAME_STATE_CLAIMED

CELLS = crash.enumerate_crash_cells("quick")


def test_every_point_is_crashed_in_every_ring_state() -> None:
    points = {(cell.point, cell.state) for cell in CELLS}
    for point in crash.PRODUCER_POINTS:
        assert {(point, state) for state in crash.RING_STATES} <= points
    for point in ("reader mid-copy", "reader lease", "pool claimed"):
        assert {(point, state) for state in crash.RING_STATES} <= points
    assert len(CELLS) == len(points)


@pytest.mark.parametrize("cell", CELLS, ids=str)
def test_crash_point_keeps_the_promises(cell: crash.CrashCell, scope: str) -> None:
    crash.run_crash_cell(cell, scope)


def test_run_crash_counts_its_cells() -> None:
    progress: list[tuple[int, int | None]] = []
    counts = crash.run_crash("quick", 0, lambda done, total: progress.append((done, total)))
    assert counts == {"crash_points": len(CELLS), "crash_failed": 0}
    assert progress[-1] == (len(CELLS), len(CELLS))


def test_killed_lease_holders_arena_frame_is_reclaimed_once_its_death_is_detected(
    scope: str,
) -> None:
    driver = FaultyCudaDriver()
    with Registry(scope, driver) as registry:
        arena = RegisteredArena(registry, 4096)
        try:
            descriptor = arena.put(torch.arange(64, dtype=torch.uint8))
            assert isinstance(descriptor, ArenaFrameDescriptor)

            def hold(report: object) -> None:
                reader = ArenaReader(registry.directory, arena.name)
                view = reader.borrow(descriptor, "uint8", (64,))
                report({"held": int(view[1])})  # type: ignore[operator]
                die()

            status, reports = ForkedChild(hold).reap()  # type: ignore[arg-type]
            assert killed_by_sigkill(status) and reports == [{"held": 1}]
            assert arena.frame_state(descriptor.position) == FRAME_STATE_CLAIMED
            arena.reclaim()
            assert arena.tail > descriptor.position, "the dead holder's frame was not reclaimed"
            assert arena.statistics().reclaimed_from_dead_holders == 1
        finally:
            arena.close()


def _no_liveness_answers() -> FaultyOs:
    """Every pidfd call and every open fails with EMFILE: the OS cannot say."""
    seam = FaultyOs()
    for site in (SITE_PIDFD, SITE_OPEN):
        seam.fail_every(site, errno.EMFILE)
    return seam


def test_a_holder_is_dead_only_when_the_os_says_so() -> None:
    with subprocess.Popen([sys.executable, "-c", "pass"]) as exited:
        assert exited.wait(timeout=120) == 0
    dead_pid = exited.pid  # reaped
    assert not is_holder_alive(dead_pid, DEFAULT_OS)
    assert is_holder_alive(os.getpid(), DEFAULT_OS)
    assert is_holder_alive(os.getppid(), DEFAULT_OS)
    assert is_holder_alive(0, DEFAULT_OS)  # no holder recorded: never freed
    # Neither a pidfd nor /proc answers: the holder counts as alive (late, never unsafe).
    assert is_holder_alive(dead_pid, _no_liveness_answers())
