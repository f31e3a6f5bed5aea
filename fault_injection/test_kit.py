"""The test kit keeps its promises: the seams fail exactly what was armed, payloads name their tag."""

from __future__ import annotations

import errno
import fcntl
import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from shmring.fault_injection.kit.machines import bounded_shrinking
from shmring.fault_injection.kit.payloads import TAG_BYTES, payload_tag, tagged_payload
from shmring.fault_injection.kit.processes import ForkedChild, killed_by_sigkill, lock_holder
from shmring.fault_injection.kit.seams import CountingOs, FaultyOs
from shmring.fault_injection.plans import FaultPlan
from shmring.fault_injection.sites import MODE_TRANSIENT
from shmring.impl.os_seam import OPEN_FLAGS_EXISTING, SITE_FLOCK, SITE_OPEN, SITE_STAT


def test_fail_next_fails_the_nth_call_from_now_once(tmp_path: Path) -> None:
    seam = FaultyOs()
    fd = os.open(tmp_path, os.O_RDONLY)
    try:
        seam.fstat(fd)  # a call before arming does not count down
        seam.fail_next(SITE_STAT, errno.EIO, nth=2)
        seam.fstat(fd)
        with pytest.raises(OSError) as raised:
            seam.fstat(fd)
        assert raised.value.errno == errno.EIO
        seam.fstat(fd)  # once only
        assert seam.fired[SITE_STAT] == 1 and seam.calls[SITE_STAT] == 4
        assert not seam.armed
    finally:
        os.close(fd)


def test_fail_every_fails_until_disarmed_and_an_unlock_never_fails(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"x")
    seam = FaultyOs()
    fd = seam.open(str(path), OPEN_FLAGS_EXISTING)
    try:
        seam.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        seam.fail_every(SITE_FLOCK, errno.ENOLCK)
        seam.flock(fd, fcntl.LOCK_UN)  # never failed
        for _ in range(2):
            with pytest.raises(OSError, match="injected"):
                seam.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        seam.disarm()
        seam.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        # calls counts the unlock; a plan's count does not
        assert seam.calls[SITE_FLOCK] == 5 and seam.counts[SITE_FLOCK] == 4
    finally:
        os.close(fd)


def test_fail_open_matches_a_name_prefix_and_a_failed_open_is_not_counted(tmp_path: Path) -> None:
    for name in ("ring.a", "other"):
        (tmp_path / name).write_bytes(b"x")
    seam = FaultyOs()
    seam.fail_open("ring.", errno.ENOSPC)
    fd = seam.open(str(tmp_path / "other"), OPEN_FLAGS_EXISTING)
    os.close(fd)
    with pytest.raises(OSError) as raised:
        seam.open(str(tmp_path / "ring.a"), OPEN_FLAGS_EXISTING)
    assert raised.value.errno == errno.ENOSPC
    assert seam.calls[SITE_OPEN] == 1 and seam.opened == ["other"]
    assert seam.fired["open ring."] == 1


def test_a_plan_fires_at_its_call_and_stops_when_disarmed(tmp_path: Path) -> None:
    seam = FaultyOs(FaultPlan(SITE_STAT, 2, MODE_TRANSIENT, errno.EACCES))
    fd = os.open(tmp_path, os.O_RDONLY)
    try:
        seam.fstat(fd)
        with pytest.raises(PermissionError):
            seam.fstat(fd)
        assert seam.hits == 1 and seam.injected == [(SITE_STAT, 2, errno.EACCES)]
        seam.armed = False
        seam.fstat(fd)
        assert seam.counts[SITE_STAT] == 3
    finally:
        os.close(fd)


def test_counting_os_counts_every_call_and_fails_none(tmp_path: Path) -> None:
    seam = CountingOs()
    fd = os.open(tmp_path, os.O_RDONLY)
    try:
        seam.fstat(fd)
        seam.fstat(fd)
    finally:
        os.close(fd)
    assert seam.calls == {SITE_STAT: 2} and seam.total() == 2


@given(st.one_of(st.integers(0, 2**64 - 1), st.text(max_size=20)), st.integers(0, 5000))
def test_a_tagged_payload_has_its_size_and_names_its_tag(tag: int | str, size: int) -> None:
    payload = tagged_payload(tag, size)
    assert len(payload) == size and payload == tagged_payload(tag, size)
    if isinstance(tag, int) and size >= TAG_BYTES:
        assert payload_tag(payload) == tag


def test_two_tags_differ_everywhere_in_the_body() -> None:
    first, second = tagged_payload(1, 4096), tagged_payload(2, 4096)
    assert all(first[i : i + 64] != second[i : i + 64] for i in range(8, 4096 - 64, 64))


def test_a_forked_child_reports_and_its_death_is_seen() -> None:
    def work(report: object) -> None:
        report({"hello": 1})  # type: ignore[operator]
        os.kill(os.getpid(), 9)

    status, reports = ForkedChild(work).reap()  # type: ignore[arg-type]
    assert killed_by_sigkill(status) and reports == [{"hello": 1}]


def test_a_lock_holder_holds_the_lock_until_the_block_ends(tmp_path: Path) -> None:
    path = tmp_path / "locked"
    path.write_bytes(b"x")
    fd = os.open(path, os.O_RDONLY)
    try:
        with lock_holder(str(path)), pytest.raises(BlockingIOError):
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        os.close(fd)


# -- the campaign's bound on shrinking (issue 29) ---------------------------------------------------


def _failing_test(pause: float) -> Callable[[], None]:
    @settings(database=None, derandomize=True, deadline=None, phases=[Phase.generate, Phase.shrink])
    @given(st.lists(st.integers(0, 1000), min_size=1))
    def sum_is_small(values: list[int]) -> None:
        time.sleep(pause)  # what each example costs (a lockstep step maps files)
        assert sum(values) <= 10

    return sum_is_small


def test_bounded_shrinking_cuts_a_slow_shrink_restores_the_bound_and_says_so() -> None:
    from hypothesis.internal.conjecture import engine

    bound_before = engine.MAX_SHRINKING_SECONDS
    started = time.perf_counter()
    with pytest.raises(AssertionError) as raised, bounded_shrinking(0.2) as bound:
        _failing_test(0.02)()
    assert bound.cut
    assert time.perf_counter() - started < 10  # the bound, not the shrinker, ended it
    notes = getattr(raised.value, "__notes__", [])
    assert any(note.startswith("shrinking was cut after 0.2 s") for note in notes), notes
    assert (engine.MAX_SHRINKING_SECONDS, bound.seconds) == (bound_before, 0.2)


def test_bounded_shrinking_leaves_a_finished_shrink_alone() -> None:
    with pytest.raises(AssertionError) as raised, bounded_shrinking(60) as bound:
        _failing_test(0)()
    assert not bound.cut
    assert not any("shrinking was cut" in note for note in getattr(raised.value, "__notes__", []))
    assert "values=[11]" in "\n".join(getattr(raised.value, "__notes__", []))  # fully shrunk
