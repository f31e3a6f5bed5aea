"""The stats run's collection guard (`model_tests/gc_guard.py`), in a pytest of its own.

The inner suite sets off CPython gh-148891 the way mutmut's stats run did.
A finalizer sets a context variable, and a collection begins inside a
`ContextVar.set`. On CPython 3.11.7 that kills the process with SIGSEGV
unless the guard is on. The inner suite also checks two more things. A
test that turns collection back on does not leave it on for the next test.
And the garbage a test leaves is finalized before the next test starts.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

_CONFTEST = """
from shmring.model_tests.gc_guard import register_in_stats_run

def pytest_configure(config):
    register_in_stats_run(config)
"""

_INNER_TESTS = """
import contextvars
import gc

var = contextvars.ContextVar("v", default=0)
for number in range(40):  # a root node with many entries, as in a real run's context
    contextvars.ContextVar(f"other{number}", default=0).set(1)
finalized = []
left = {}


class Cyclic:
    def __init__(self):
        self.me = self  # a cycle: only a collection frees it

    def __del__(self):
        finalized.append(1)
        var.set(-1)  # what a trampolined finalizer does in the stats run


def test_a_test_that_turns_collection_back_on():
    gc.enable()


def test_no_collection_starts_inside_a_context_variable_set():
    assert not gc.isenabled()
    for allocations in range(1, 6):
        for _ in range(50):
            gc.collect()
            Cyclic()
            # The next collection would start at the set's own allocations.
            gc.set_threshold(gc.get_count()[0] + allocations)
            var.set(allocations)
    gc.set_threshold(700)


def test_a_test_that_leaves_a_cycle():
    left["finalized"] = len(finalized)
    Cyclic()


def test_the_cycle_left_was_finalized_before_this_test():
    assert len(finalized) == left["finalized"] + 1
"""


def _run_inner(tmp_path: Path, mutant_under_test: str | None) -> subprocess.CompletedProcess[str]:
    (tmp_path / "conftest.py").write_text(_CONFTEST)
    (tmp_path / "test_inner.py").write_text(_INNER_TESTS)
    env = {k: v for k, v in os.environ.items() if k != "MUTANT_UNDER_TEST"}
    if mutant_under_test is not None:
        env["MUTANT_UNDER_TEST"] = mutant_under_test
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", "-p", "no:xdist"]
    command += ["-p", "no:cacheprovider", "test_inner.py"]
    return subprocess.run(
        command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )


def test_the_stats_run_collects_between_tests_and_never_inside_a_set(tmp_path: Path) -> None:
    result = _run_inner(tmp_path, "stats")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "4 passed" in result.stdout


def test_the_guard_is_off_outside_the_stats_run(tmp_path: Path) -> None:
    """A mutant's run and plain pytest keep automatic collection: the inner suite's first check fails."""
    result = _run_inner(tmp_path, "shmring.impl.futex.x_fresh_value__mutmut_1")
    assert result.returncode != 0
    assert "assert not gc.isenabled()" in result.stdout, result.stdout + result.stderr
