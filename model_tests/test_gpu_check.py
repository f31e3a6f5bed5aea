"""The GPU check's scripts, on a CPU (issue 21): what comes back, what the bench runs first,
and the figures docs/registered.md shows.

`.ci/gpu_check` runs only on a GPU machine (or as a dry run by hand); these
tests hold the parts that decide what a cut or failed run still tells: the
report's readers, the bench's shape order and budget, and the doc block.
"""

from __future__ import annotations

import importlib.util
import io
import json
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent


def load(path: str, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, ROOT / path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while it is being made
    spec.loader.exec_module(module)
    return module


gpu_report = load(".ci/gpu_report.py", "gpu_report")

SKIPPED_ON_GPU = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" errors="0" failures="1" skipped="1" tests="4" time="12.5">
<testcase classname="model_tests.test_cuda_real" name="test_a" time="1"/>
<testcase classname="model_tests.test_cuda_real" name="test_b" time="1"/>
<testcase classname="model_tests.test_cuda_real" name="test_c" time="1"><failure message="boom"/></testcase>
<testcase classname="model_tests.test_cuda_real" name="test_gpu_video_pipeline_matches_cpu_encoding"
 time="0"><skipped type="pytest.skip" message="could not import 'av': No module named 'av'"/></testcase>
</testsuite></testsuites>
"""

PYTEST_LOG = """============================= test session starts ==============================
collected 4 items
model_tests/test_cuda_real.py ..Fs
=========================== short test summary info ============================
FAILED model_tests/test_cuda_real.py::test_c - boom
SKIPPED [1] model_tests/test_cuda_real.py:203: could not import 'av'
=================== 1 failed, 2 passed, 1 skipped in 12.50s ====================
"""


def test_a_cuda_test_skipped_on_a_gpu_is_named_with_its_reason() -> None:
    assert gpu_report.junit_cases(SKIPPED_ON_GPU, "skipped") == [
        "model_tests.test_cuda_real::test_gpu_video_pipeline_matches_cpu_encoding "
        "(could not import 'av': No module named 'av')"
    ]
    assert gpu_report.junit_cases(SKIPPED_ON_GPU, "failure") == [
        "model_tests.test_cuda_real::test_c (boom)"
    ]
    counts = gpu_report.junit_counts(SKIPPED_ON_GPU)
    assert (counts["tests"], counts["passed"], counts["failed"], counts["skipped"]) == (4, 2, 1, 1)
    assert gpu_report.junit_counts(SKIPPED_ON_GPU[:120]) is None  # cut while pytest wrote it


def test_pytest_short_summary_is_copied_with_its_closing_line() -> None:
    assert gpu_report.pytest_summary(PYTEST_LOG) == [
        "FAILED model_tests/test_cuda_real.py::test_c - boom",
        "SKIPPED [1] model_tests/test_cuda_real.py:203: could not import 'av'",
        "1 failed, 2 passed, 1 skipped in 12.50s",
    ]


def make_results(where: Path, cpu_xml: str) -> Path:
    """A finished run's RESULTS as gpu_check leaves it: summary.txt and logs.tar.gz."""
    results = where / "results"
    results.mkdir()
    (results / "summary.txt").write_text(
        "gpu_check: started 2026-12-01T10:00:00Z, results in /out, budget 360s (...)\n"
        "probe: python 3.12.3 (/usr/bin/python3), Linux\n"
        "probe: torch 2.11.0+cu130 (CUDA build 13.0), CUDA available: True\n"
        "probe: device 0 of 1: NVIDIA H200, capability 9.0, 139.8 GiB\n"
        "overall: PASS after 300 s\n"
    )
    files = {
        "logs/cpu-tests.xml": cpu_xml,
        "logs/cuda-tests.xml": SKIPPED_ON_GPU,
        "logs/carried.txt": "gpu_prepare: wheels ... (2026-12-01T09:00:00Z, commit abc1234)\n"
        "carried: working tree 2.7 MiB + wheels 34.4 MiB = 37.0 MiB (device limit 64 MiB)\n",
    }
    with tarfile.open(results / "logs.tar.gz", "w:gz") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return results


def test_doc_figures_come_from_the_run_and_replace_only_the_block(tmp_path: Path) -> None:
    cpu_xml = SKIPPED_ON_GPU.replace(
        'failures="1" skipped="1" tests="4"', 'failures="0" skipped="0" tests="81"'
    )
    results = make_results(tmp_path, cpu_xml)
    doc = tmp_path / "doc.md"
    doc.write_text(
        f"before\n\n{gpu_report.DOC_BEGIN}{{}} -->\nold\n{gpu_report.DOC_END}\n\nafter\n"
    )
    gpu_report.main(["doc", str(doc), str(results)])
    text = doc.read_text()
    assert text.startswith("before\n\n") and text.endswith("\n\nafter\n") and "old" not in text
    start, end, values = gpu_report.doc_block(text)
    assert values["cpu_tests"]["passed"] == 81 and values["cuda_tests"]["skipped"] == 1
    assert values["carried"].startswith("working tree 2.7 MiB + wheels 34.4 MiB = 37.0 MiB")
    assert (values["commit"], values["device"], values["seconds"]) == (
        "abc1234",
        "NVIDIA H200, capability 9.0, 139.8 GiB",
        300,
    )
    assert "- CPU tests of the check's files: 81 passed of 81 (0 skipped)" in text
    assert "- CUDA tests: 2 passed of 4 (1 skipped)" in text


def test_a_run_that_did_not_finish_is_not_written_into_the_doc(tmp_path: Path) -> None:
    results = make_results(tmp_path, SKIPPED_ON_GPU)
    summary = results / "summary.txt"
    summary.write_text(summary.read_text().replace("overall: PASS after 300 s\n", ""))
    doc = tmp_path / "doc.md"
    doc.write_text(f"{gpu_report.DOC_BEGIN}{{}} -->\n{gpu_report.DOC_END}\n")
    with pytest.raises(SystemExit, match="did not finish"):
        gpu_report.main(["doc", str(doc), str(results)])


def test_registered_md_figures_are_the_scripts_rendering_of_a_run() -> None:
    """docs/registered.md's figures block is what gpu_report.py rendered from the values it
    records (a figure typed by hand there fails this)."""
    text = (ROOT / "docs" / "registered.md").read_text()
    found = gpu_report.doc_block(text)
    assert found is not None, "docs/registered.md has no generated gpu-figures block"
    start, end, values = found
    assert text[start:end] == gpu_report.render_doc_block(values)
    assert values["overall"] is not None and values["cpu_tests"] and values["carried"]


def test_gpu_check_writes_only_its_three_results() -> None:
    """The device returns at most 8 files: the check writes summary.txt, report.md and
    logs.tar.gz (through a temporary name) into RESULTS, nothing else."""
    script = (ROOT / ".ci" / "gpu_check").read_text()
    written = set(re.findall(r"\$RESULTS/([\w.-]+)", script))
    assert written == {"summary.txt", "report.md", "logs.tar.gz", "logs.tar.gz.tmp"}
    assert "-rfEs" in script


bench = load("benchmarks/bench_video.py", "bench_video_under_test")


def test_bench_shapes_run_smallest_first_and_shrink_to_fit() -> None:
    seed = list(bench.SHAPES)
    ordered = bench.order_shapes(list(reversed(seed)))
    assert ordered[-1] == "1344x768x362" and ordered[0] == "448x256x4"
    arena = bench.ARENA_MIB * 2**20
    available = 300 * 2**20
    kept, left_out, shrunk = bench.fit_shapes(seed, arena, available)
    assert "1344x768x122" not in kept and "1344x768x58" in kept
    assert shrunk["1344x768x58"].startswith("shrunk from 1344x768x122")
    assert all(bench.shm_needed(shape, arena) <= available for shape in kept)
    assert set(left_out) == {"1344x768x362"}  # its shrunk form is 1344x768x58 as well
    kept, left_out, shrunk = bench.fit_shapes(["1344x768x1"], arena, arena)
    assert (kept, list(left_out), shrunk) == ([], ["1344x768x1"], {})  # not one frame fits


def test_bench_gives_every_shape_its_a_e_pair_before_the_budget_stops_it(tmp_path: Path) -> None:
    """Pass 1 runs one A/E pair per shape, smallest first, and writes each shape as it ends;
    a budget spent by then stops pass 2 and says where."""
    pytest.importorskip("av", reason="the bench encodes with PyAV")
    progress, result = tmp_path / "progress.txt", tmp_path / "bench.json"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_video.py"), "--device", "cpu",
         "--shapes", "64x48x1,32x24x2", "--repeats", "2", "--budget-s", "0.001",
         "--arena-mib", "1", "--progress", str(progress), "--json", str(result)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = progress.read_text().splitlines()
    assert [line.split(" (at")[0].split(":")[1].strip() for line in lines[:2]] == [
        "32x24x2 pass 1 (A/E pair)",
        "64x48x1 pass 1 (A/E pair)",
    ]
    assert lines[2].startswith("bench: pass 2 stopped before 32x24x2 warm-up")
    data = json.loads(result.read_text())
    assert data["complete"] and data["shape_order"] == ["32x24x2", "64x48x1"]
    assert set(data["e_over_a"]) == {"32x24x2", "64x48x1"} and data["routes_ok"]
    assert data["budget_stop"].startswith("pass 2 stopped")
    assert all(set(by) == {"A", "E"} for by in data["medians"].values())
