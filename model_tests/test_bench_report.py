"""bench_ring.py's arithmetic: issue 13's target verdicts and the free-space check.

The smoke test (`test_bench_smoke.py`) shows that a real run fills every
row; these tests feed made-up figures to the pure functions, so a wrong
ratio, a flipped comparison or a wrong baseline is caught exactly. The
benchmark helpers are scripts, not a package: they are loaded from their
files.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
MIB = 1 << 20
GIB = 1 << 30


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCHMARKS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses and annotations look their module up
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[spec.name]
    return module


@pytest.fixture(scope="module")
def report() -> ModuleType:
    return _load("_report")


@pytest.fixture(scope="module")
def space() -> ModuleType:
    return _load("_space")


def _cell(median: float, p99: float | None = None) -> dict[str, float]:
    cell = {"median": median, "worst": median / 2, "runs": 1, "n": 1}
    if p99 is not None:
        cell["p99"] = p99
    return cell


def _result(**overrides: Any) -> dict[str, Any]:
    result: dict[str, Any] = {
        "latency_us": {
            "64 B": {
                "connector": _cell(10.5, 20.0),
                "connector/poll": _cell(12.0, 18.0),
                "ring": _cell(10.0, 10.0),
                "iceoryx2": _cell(5.0, 8.0),
            }
        },
        "throughput_mib_s": {
            "16 MiB": {"connector": _cell(7000.0), "iceoryx2": _cell(7500.0)},
            "256 MiB": {"connector": _cell(1500.0), "iceoryx2": _cell(2000.0)},
            "16 MiB x64 burst": {
                "connector": _cell(3000.0),
                "iceoryx2": _cell(2000.0),
                "connector/borrow": _cell(4600.0),
            },
        },
        "copy_mib_s": {"16 MiB": {"warm": _cell(5000.0), "fresh": _cell(900.0)}},
        "wake_us": {
            "futex round trip": _cell(50.0, 100.0),
            "get_with_deadline wake": _cell(60.0, 300.0),
        },
        "idle_cpu_fraction": 0.01,
        "ring_lockstep": {
            "profile": "ring-ci",
            "steps": 5000,
            "seconds": 2.0,
            "steps_per_s": 2500.0,
        },
        "unavailable": {},
        "not_run": {},
        "routes": {},
    }
    result.update(overrides)
    return result


def _rows(report: ModuleType, result: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(row["target"], row["ours"]): row for row in report.targets(result)}


def test_latency_targets_compare_with_ring_iceoryx2_and_the_seed(report: ModuleType) -> None:
    rows = _rows(report, _result())
    ring = rows[("64 B one-way latency <= raw ring + 10%", "connector")]
    assert ring["ratio"] == pytest.approx(1.05) and ring["met"] is True
    assert ring["p99_ratio"] == pytest.approx(2.0)
    poll = rows[("64 B one-way latency <= raw ring + 10%", "connector/poll")]
    assert poll["ratio"] == pytest.approx(1.2) and poll["met"] is False
    iceoryx2 = rows[("64 B one-way latency <= iceoryx2", "connector")]
    assert iceoryx2["ratio"] == pytest.approx(2.1) and iceoryx2["met"] is False
    seed = rows[("64 B one-way latency <= 0.6x the seed's ring", "connector")]
    assert seed["ratio"] == pytest.approx(10.5 / 25.0) and seed["met"] is True
    assert seed["source"] == report.EXTERNAL_SOURCE
    # Not measured in this run: no ratio, no verdict.
    tree = rows[("tree one-way latency <= raw ring + 10%", "connector")]
    assert tree["ratio"] is None and tree["met"] is None


def test_throughput_targets_pick_the_right_baselines(report: ModuleType) -> None:
    rows = _rows(report, _result())
    owned = rows[("16 MiB throughput (owned) >= iceoryx2", "connector")]
    assert owned["ratio"] == pytest.approx(7000 / 7500) and owned["met"] is False
    vllm = rows[("16 MiB throughput (owned) >= vLLM's queue", "connector")]
    assert vllm["ratio"] == pytest.approx(7000 / (6200e6 / MIB)) and vllm["met"] is True
    # At 256 MiB the best peer is whichever is faster: here iceoryx2, side by side.
    best = rows[("256 MiB throughput (owned) >= the best peer", "connector")]
    assert best["baseline"].startswith("iceoryx2") and best["source"] == "side by side"
    assert best["ratio"] == pytest.approx(0.75) and best["met"] is False
    burst = rows[("16 MiB x64 burst throughput (owned, all in flight) >= iceoryx2", "connector")]
    assert burst["ratio"] == pytest.approx(1.5) and burst["met"] is True
    borrowed = rows[
        (
            "16 MiB x64 burst throughput (borrowed) >= 0.9x the producer's single-thread copy",
            "connector/borrow",
        )
    ]
    assert borrowed["ratio"] == pytest.approx(0.92) and borrowed["met"] is True


def test_a_burst_compares_with_its_rotating_copy_where_measured(report: ModuleType) -> None:
    """The burst writes 64 buffers, not one: its baseline is the rotating set's copy."""
    copies = {"16 MiB": {"warm": _cell(5000.0), "rotating x64": _cell(4000.0)}}
    rows = _rows(report, _result(copy_mib_s=copies))
    target = "throughput (borrowed) >= 0.9x the producer's single-thread copy"
    burst = rows[(f"16 MiB x64 burst {target}", "connector/borrow")]
    assert burst["ratio"] == pytest.approx(4600 / 4000)
    assert "64 rotating" in burst["baseline"]


def test_best_peer_at_256_mib_falls_back_to_vllm_when_faster(report: ModuleType) -> None:
    result = _result()
    result["throughput_mib_s"]["256 MiB"]["iceoryx2"] = _cell(1000.0)
    best = _rows(report, result)[("256 MiB throughput (owned) >= the best peer", "connector")]
    assert best["baseline"].startswith("vLLM") and best["source"] == report.EXTERNAL_SOURCE
    assert best["ratio"] == pytest.approx(1500 / (1430e6 / MIB))


def test_wake_idle_and_lockstep_targets(report: ModuleType) -> None:
    rows = _rows(report, _result())
    wake = rows[("get_with_deadline wake-up p99 <= 2x a futex round trip p99", "connector")]
    assert wake["ratio"] == pytest.approx(3.0) and wake["met"] is False
    assert wake["p50_ratio"] == pytest.approx(1.2)
    (idle,) = [row for (target, _), row in rows.items() if "idle-cheap" in target]
    assert idle["ratio"] == pytest.approx(0.01) and idle["met"] is True
    (lockstep,) = [row for (target, _), row in rows.items() if "lockstep" in target]
    assert lockstep["ratio"] == pytest.approx(2500.0) and lockstep["met"] is True
    slow = _result(ring_lockstep={"profile": "p", "steps": 10, "seconds": 1.0, "steps_per_s": 10.0})
    (lockstep,) = [r for (t, _), r in _rows(report, slow).items() if "lockstep" in t]
    assert lockstep["met"] is False
    busy = _rows(report, _result(idle_cpu_fraction=0.9))
    (idle,) = [row for (target, _), row in busy.items() if "idle-cheap" in target]
    assert idle["met"] is False


def test_rows_that_did_not_run_say_why(report: ModuleType) -> None:
    result = _result(
        unavailable={"connector/borrow": "no borrow parameter"},
        ring_lockstep={"not_run": "no hypothesis"},
    )
    del result["throughput_mib_s"]["16 MiB x64 burst"]["connector/borrow"]
    rows = report.targets(result)
    borrowed = [row for row in rows if row["ours"] == "connector/borrow"]
    assert len(borrowed) == 2  # 16 MiB and its burst: the sizes with a copy baseline
    assert all(row["met"] is None and row["not_run"] == "no borrow parameter" for row in borrowed)
    (lockstep,) = [row for row in rows if "lockstep" in row["target"]]
    assert lockstep["met"] is None and lockstep["not_run"] == "no hypothesis"
    result["targets"] = rows
    text = report.markdown(result, ["connector", "connector/poll", "ring", "iceoryx2"])
    for row in rows:
        assert row["target"] in text
    assert "| not run |" in text and "**missed**" in text and "| met |" in text


def test_connector_ratios_against_the_raw_ring_and_iceoryx2(report: ModuleType) -> None:
    """Issue 23: Connector / raw ring and Connector / iceoryx2 from the one run, per case."""
    found = report.ratios(_result())
    latency = found["latency"]["64 B"]
    assert latency["connector / ring"] == pytest.approx(1.05)
    assert latency["connector / iceoryx2"] == pytest.approx(2.1)
    assert latency["connector/poll / ring"] == pytest.approx(1.2)
    throughput = found["throughput"]["16 MiB"]
    assert throughput == {"connector / iceoryx2": pytest.approx(7000 / 7500)}  # no raw ring there
    result = _result()
    result["targets"] = report.targets(result)
    text = report.markdown(result, ["connector", "connector/poll", "ring", "iceoryx2"])
    assert "| 64 B one-way p50 | 1.05x | 2.10x | 1.20x | 2.40x |" in text


def test_space_shortfall_skips_cases_that_do_not_fit(space: ModuleType) -> None:
    assert space.compute_shortfall(space.CHECK_FROM - 1, 0, 0) is None  # small: never checked
    need = 3 * GIB
    plenty = need + space.SHM_MARGIN + space.MEMORY_MARGIN
    assert space.compute_shortfall(need, plenty, plenty) is None
    assert space.compute_shortfall(need, plenty, None) is None  # no /proc/meminfo
    short_shm = space.compute_shortfall(need, need + space.SHM_MARGIN - 1, plenty)
    assert short_shm is not None and "/dev/shm" in short_shm and "3.00 GiB" in short_shm
    short_memory = space.compute_shortfall(need, plenty, need + space.MEMORY_MARGIN - 1)
    assert short_memory is not None and "memory available" in short_memory


def test_lockstep_note_gives_the_rate_per_cpu_second_when_measured(report: ModuleType) -> None:
    # The machine is shared: the rate per CPU second is the same run less
    # the time other processes held the core (issue 13).
    measured = _result(
        ring_lockstep={
            "profile": "ring-ci",
            "steps": 5000,
            "seconds": 2.5,
            "steps_per_s": 2000.0,
            "cpu_seconds": 2.0,
            "steps_per_cpu_s": 2500.0,
        }
    )
    older = _result()
    for result in (measured, older):
        result["targets"] = report.targets(result)
    (note,) = [line for line in report._notes(measured) if "lockstep" in line]
    assert "2,500 steps per CPU second" in note
    (note,) = [line for line in report._notes(older) if "lockstep" in line]
    assert "CPU" not in note
