"""The host-ring benchmark still runs: every transport, every kind of case, smallest sizes.

Not a timing test: nothing here looks at a number except to check that it
was measured. It runs `benchmarks/bench_ring.py --smoke` (one repeat, a few
round trips of the tree and of 64 B, one small 64 KiB batch, one small burst,
the PNG plot) in a child
process, so a change to the ring, the connector or the codec that breaks
the benchmark scripts fails CI instead of being found at the next
measurement. Transports whose package is missing are reported by the script
as not run, and skipped here too.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_ring.py"
TIMEOUT_S = 300  # a watchdog against a hung worker, not a performance bound
ICEORYX2_CONFIG_DIR = Path("/tmp/iceoryx2")


@pytest.fixture
def iceoryx2_leaves_nothing() -> Iterator[None]:
    """iceoryx2 keeps a global management file in /dev/shm and folders in /tmp;
    remove the ones this test's run created, so the suite leaves both as it found them."""
    shm = Path("/dev/shm")
    before = {p.name for p in shm.glob("iox2_*")}
    had_config_dir = ICEORYX2_CONFIG_DIR.exists()
    yield
    for path in shm.glob("iox2_*"):
        if path.name not in before:
            path.unlink(missing_ok=True)
    if not had_config_dir:
        shutil.rmtree(ICEORYX2_CONFIG_DIR, ignore_errors=True)


@pytest.mark.usefixtures("iceoryx2_leaves_nothing")
def test_bench_ring_smoke_runs_every_case(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    completed = subprocess.run(
        [sys.executable, str(BENCH), "--smoke", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        cwd=BENCH.parent.parent,
        env={**os.environ, "PYTHONWARNINGS": "error::ResourceWarning"},
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr
    result = json.loads(out.read_text())

    transports = result["transports"]
    assert {"ring", "connector", "connector/poll", "shm-per-key", "mp.Pipe", "mp.Queue"} <= set(
        transports
    )
    assert set(transports) | set(result["unavailable"]) == {
        "ring",
        "connector",
        "connector/poll",
        "shm-per-key",
        "shm-per-key+lock",
        "shm-per-key/pickle",
        "mp.Pipe",
        "mp.Queue",
        "zmq-ipc",
        "iceoryx2",
    }
    plan = result["plan"]
    tree_only = {"shm-per-key/pickle"}
    for label in ("tree", "64 B"):
        measured = result["latency_us"][label]
        expected = set(transports) if label == "tree" else set(transports) - tree_only
        assert set(measured) == expected, label
        for name, summary in measured.items():
            assert summary["n"] == plan["latency_count"], (label, name)
            assert 0 < summary["median"] <= summary["p99"], (label, name)
    rates = result["throughput_mib_s"]["64 KiB"]
    assert set(rates) == set(transports) - tree_only
    assert all(cell["runs"] == 1 and cell["median"] > 0 for cell in rates.values())
    # The connector's 64 KiB frames fit its ring, and it says so.
    assert result["routes"]["throughput 64 KiB"]["connector"] == ["ring"]
    # The burst: every transport that can buffer a whole batch ran it; the Pipe cannot.
    (burst,) = [label for label in result["throughput_mib_s"] if "burst" in label]
    bursts = result["throughput_mib_s"][burst]
    assert set(bursts) == set(transports) - tree_only - {"mp.Pipe"}
    assert all(cell["runs"] == 1 and cell["median"] > 0 for cell in bursts.values())
    assert "mp.Pipe" in result["not_run"][burst]
    assert any(row["target"].startswith("tree one-way latency") for row in result["targets"])
    assert "One-way latency" in completed.stdout and "Throughput" in completed.stdout
    # The plot lies next to the JSON.
    assert (tmp_path / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_ring_steps_smoke_measures_every_step(tmp_path: Path) -> None:
    out = tmp_path / "steps.json"
    completed = subprocess.run(
        [
            sys.executable,
            str(BENCH.parent / "ring_steps.py"),
            "--messages",
            "20",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        cwd=BENCH.parent.parent,
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr
    steps = json.loads(out.read_text())["median_us"]
    for step in ("ring get(tree, decode)", "connector put(tree)", "zlib.crc32(1 MiB)"):
        assert steps[step] > 0, step
