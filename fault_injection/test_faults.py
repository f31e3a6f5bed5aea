"""The fault-cell campaign: every site of every scenario, both modes, call N for N = 1, 2, ...

The per-scenario tests run exactly what `shmring check --only faults` runs
with the quick budget, and check that the number of cells equals what the
site registry enumerates, so a new site or a new call cannot go untested.
"""

from __future__ import annotations

import errno
import fcntl
import os
import uuid

import pytest

from shmring.fault_injection import fault_cells
from shmring.fault_injection.identities import borrowed_identities
from shmring.fault_injection.kit.seams import FaultyOs
from shmring.fault_injection.plans import FaultPlan, FaultyCudaDriver
from shmring.fault_injection.scenarios import SCENARIOS
from shmring.fault_injection.sites import (
    CUDA_CATALOGUE,
    MODE_PERSISTENT,
    MODE_TRANSIENT,
    OS_CATALOGUE,
    UNREACHED,
    all_sites,
)
from shmring.impl import os_seam
from shmring.impl.errors import RegistrationError
from shmring.spec import registration as registration_spec


def _prefix() -> str:
    return f"ft{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def reached() -> dict[str, dict[str, int]]:
    """Calls per site of each scenario's fault-free run."""
    identities = fault_cells._prepare()
    with fault_cells.quiet_logs():
        return {
            name: fault_cells.baseline(name, identities, f"{_prefix()}b{index}")
            for index, name in enumerate(SCENARIOS)
        }


def test_every_seam_site_has_a_catalogue_entry() -> None:
    names = [site.name for site in all_sites()]
    assert names == [*os_seam.SITES, *registration_spec.DRIVER_CALLS]
    assert set(OS_CATALOGUE) == set(os_seam.SITES)
    assert set(CUDA_CATALOGUE) == set(registration_spec.DRIVER_CALLS)
    assert all(site.errors for site in all_sites())


def test_every_reachable_site_is_reached_by_some_scenario(
    reached: dict[str, dict[str, int]],
) -> None:
    hit = {site for calls in reached.values() for site, count in calls.items() if count}
    expected = {site.name for site in all_sites()} - UNREACHED
    assert expected - hit == set(), f"sites no scenario reaches: {sorted(expected - hit)}"
    assert UNREACHED & hit == set(), (
        f"sites listed as unreached are now used; give them scenarios and remove them "
        f"from UNREACHED: {sorted(UNREACHED & hit)}"
    )


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_fault_cells_of_every_site_keep_the_promises(scenario: str) -> None:
    identities = borrowed_identities()
    with fault_cells.quiet_logs():
        slots = fault_cells.enumerate_slots("quick", identities, _prefix(), [scenario])
    expected = fault_cells.enumerate_cells(slots)
    assert {slot.site for slot in slots}, f"{scenario} reaches no site"
    progress: list[tuple[int, int | None]] = []
    counts = fault_cells.run_faults(
        "quick", 0, lambda done, total: progress.append((done, total)), [scenario]
    )
    assert counts["cells"] == expected, (
        f"ran {counts['cells']} cells, the registry enumerates {expected}"
    )
    assert counts["cells_failed"] == 0
    assert counts["faults_fired"] == expected - len(slots)  # every cell but each slot's last fires
    assert progress[-1] == (expected, expected)


# -- the seams themselves -------------------------------------------------------------------------


def test_plans_print_and_parse_back() -> None:
    for plan in (
        FaultPlan("open", 3, MODE_TRANSIENT, errno.ENOSPC),
        FaultPlan("flock", 1, MODE_PERSISTENT, errno.ENOLCK),
        FaultPlan("host_unregister", 2, MODE_PERSISTENT, "cudaErrorUnknown"),
    ):
        assert FaultPlan.parse(str(plan)) == plan
    with pytest.raises(ValueError, match="nth=0"):
        FaultPlan("open", 0, MODE_TRANSIENT, errno.EIO)
    with pytest.raises(ValueError, match="does not fit"):
        FaultPlan("open", 1, MODE_TRANSIENT, "cudaErrorUnknown")
    with pytest.raises(KeyError, match="nosuch"):
        FaultPlan("nosuch", 1, MODE_TRANSIENT, errno.EIO)


def test_transient_plan_fails_only_the_nth_call(tmp_path: object) -> None:
    seam = FaultyOs(FaultPlan("stat", 2, MODE_TRANSIENT, errno.EIO))
    seam.stat("/")
    with pytest.raises(OSError) as raised:
        seam.stat("/")
    assert raised.value.errno == errno.EIO and "stat#2:EIO:transient" in str(raised.value)
    seam.stat("/")
    assert (seam.counts["stat"], seam.hits) == (3, 1)


def test_persistent_plan_fails_every_call_from_the_nth() -> None:
    seam = FaultyOs(FaultPlan("stat", 2, MODE_PERSISTENT, errno.EACCES))
    seam.stat("/")
    for _ in range(3):
        with pytest.raises(PermissionError):
            seam.stat("/")
    seam.armed = False
    seam.stat("/")
    assert seam.hits == 3


def test_planned_close_error_releases_the_descriptor_and_is_absorbed() -> None:
    seam = FaultyOs(FaultPlan("close", 1, MODE_PERSISTENT, errno.EIO))
    fd = os.open("/dev/null", os.O_RDONLY)
    seam.close(fd)  # close(2) semantics: released, error not raised
    with pytest.raises(OSError) as raised:
        os.fstat(fd)
    assert raised.value.errno == errno.EBADF and seam.hits == 1


def test_unlocking_is_never_failed_and_eagain_never_fails_a_blocking_lock() -> None:
    seam = FaultyOs(FaultPlan("flock", 1, MODE_TRANSIENT, errno.EAGAIN))
    fd = os.open("/dev/null", os.O_RDONLY)
    try:
        seam.flock(fd, fcntl.LOCK_EX)  # a blocking lock waits; it never answers EWOULDBLOCK
        seam.flock(fd, fcntl.LOCK_UN)  # not counted, never failed
        assert (seam.counts["flock"], seam.hits) == (1, 1)
        seam.plan = FaultPlan("flock", 2, MODE_TRANSIENT, errno.EAGAIN)
        with pytest.raises(BlockingIOError):
            seam.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # the lock is "held elsewhere"
    finally:
        os.close(fd)


def test_driver_plan_fails_from_the_nth_call_and_changes_nothing() -> None:
    driver = FaultyCudaDriver(
        FaultPlan("host_register", 2, MODE_PERSISTENT, "cudaErrorMemoryAllocation")
    )
    driver.host_register(4096, 4096)
    for address in (1 << 20, 1 << 21):
        with pytest.raises(RegistrationError) as raised:
            driver.host_register(address, 4096)
        assert raised.value.cuda_error == "cudaErrorMemoryAllocation"
    assert driver.registered_ranges() == {4096: 4096}
    driver.host_unregister(4096)
    assert driver.hits == 2


def test_a_failing_cell_names_its_plan_and_how_to_rerun_it() -> None:
    result = fault_cells.CellResult(
        FaultPlan("open", 3, MODE_TRANSIENT, errno.ENOSPC), "ring_wrap", True, ("leak",), None
    )
    text = result.describe()
    assert "ring_wrap open#3:ENOSPC:transient" in text
    assert "--scenario ring_wrap --plan open#3:ENOSPC:transient" in text


# -- the after-cell descriptor check counts the cell's own descriptors (issue 29) ------------------


def _scenario_outcome(name: str) -> fault_cells.Outcome:
    return fault_cells.Outcome(name, 0, 0, 0, 0, (), ())


def test_cell_leak_check_ignores_descriptors_the_rest_of_the_process_closes_meanwhile(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Under xdist another test's descriptors (a multiprocessing queue's pipe) are
    # closed by gc in the middle of a cell: the process's count drops, the cell
    # opened and closed everything it should.
    outside = [os.open("/dev/null", os.O_RDONLY) for _ in range(2)]

    def churn(env: fault_cells.Env) -> fault_cells.Outcome:
        fd = env.os.open("/dev/null", os.O_RDONLY)
        env.os.close(fd)
        for other in outside:
            os.close(other)  # someone else's, closed during the cell
        return _scenario_outcome("churn")

    monkeypatch.setitem(SCENARIOS, "churn", churn)
    result = fault_cells.run_cell("churn", None, borrowed_identities(), _prefix())
    assert result.problems == ()


def test_cell_leak_check_names_a_descriptor_the_cell_kept_even_when_the_process_count_is_even(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The leak is masked by a process-wide count: the cell keeps one
    # descriptor while another test's descriptor is closed meanwhile.
    outside = os.open("/dev/null", os.O_RDONLY)
    kept: list[int] = []

    def leaky(env: fault_cells.Env) -> fault_cells.Outcome:
        kept.append(env.os.open("/dev/null", os.O_RDONLY))
        os.close(outside)
        return _scenario_outcome("leaky")

    monkeypatch.setitem(SCENARIOS, "leaky", leaky)
    try:
        result = fault_cells.run_cell("leaky", None, borrowed_identities(), _prefix())
    finally:
        for fd in kept:
            os.close(fd)
    assert len(result.problems) == 1, result.problems
    assert result.problems[0] == (
        f"descriptors opened through the seam left open: {kept[0]} (/dev/null)"
    )


def test_counting_seam_holds_only_descriptors_still_open_on_the_file_it_opened(
    tmp_path: os.PathLike[str],
) -> None:
    seam = FaultyOs()
    first = seam.open(os.path.join(tmp_path, "a"), os.O_RDWR | os.O_CREAT)
    second = seam.open_directory(os.fspath(tmp_path))
    assert seam.held_descriptors() == sorted([first, second])
    seam.close(second)
    assert seam.held_descriptors() == [first]
    os.close(first)  # closed behind the seam's back ...
    reused = os.open(os.path.join(tmp_path, "b"), os.O_RDWR | os.O_CREAT)
    try:
        assert reused == first  # ... and the number reused for another file
        assert seam.held_descriptors() == []
    finally:
        os.close(reused)
