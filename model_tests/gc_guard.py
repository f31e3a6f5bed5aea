"""Cyclic garbage collected between tests, never inside one, in mutmut's stats run.

Why (found 2026-12-04, issue 29): every fresh sample on the final code
died in mutmut's stats run with SIGSEGV in
`test_conformance_cleanup_retry.py`, always at the same call, and never
under plain pytest. The core dump showed CPython 3.11's
`hamt_node_bitmap_assoc` walking a node that was already freed: CPython
gh-148891. `ContextVar.set` allocates HAMT nodes; an allocation can start
a collection; a finalizer that collection runs may set a context variable
itself, and that inner set frees the HAMT the outer one is still walking.

In the stats run, each call of a mutated function sets a context variable
(mutmut's trampoline records who called whom). Our finalizers are mutated
functions too: a pool mapping's `weakref.finalize`, a released lease's
`mark_frame_done`, and others. So any collection that starts inside a
trampoline's set can crash the run. Plain pytest and mutmut's mutant runs
set no context variables, so they never hit it.

`CollectBetweenTests` turns automatic collection off for each test. It
collects the young generations after the test body and again after the
teardown, and all of them every `FULL_EVERY` tests. A finalizer
then runs at a point where no set is under way, and its calls are counted
for the test that made the garbage. It is registered only for the stats run
(`MUTANT_UNDER_TEST=stats`, see the root conftest).
`test_mutation_runner.py` checks that the guard works.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Iterator

import pytest

STATS_RUN_VALUE = "stats"  # what mutmut sets MUTANT_UNDER_TEST to for its stats run


def in_stats_run() -> bool:
    """Whether this process is running mutmut's stats run."""
    return os.environ.get("MUTANT_UNDER_TEST") == STATS_RUN_VALUE


class CollectBetweenTests:
    """A pytest plugin: no automatic collection during a test; explicit ones around it.

    With automatic collection off, whatever a test allocated stays in the
    young generations until a collection runs, so collecting those two
    (0.02 ms) frees the test's cycles. A full collection (30 ms and more
    with torch loaded) runs every `FULL_EVERY` tests, for garbage that
    reaches back into old objects: a full one at every test added minutes
    to a stats run of 1,400 tests.
    """

    FULL_EVERY = 50

    def __init__(self) -> None:
        self.tests = 0

    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        # Done for every test: a test that turns collection back on when it
        # finishes (test_connector's leak test does) must not leave it on
        # for the tests after it.
        gc.disable()

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Iterator[None]:
        yield
        gc.collect(1)  # the test body's garbage, counted for this test

    @pytest.hookimpl(trylast=True)
    def pytest_runtest_teardown(self, item: pytest.Item, nextitem: pytest.Item | None) -> None:
        self.tests += 1
        gc.collect(2 if self.tests % self.FULL_EVERY == 0 else 1)  # what the teardown left


PLUGIN_NAME = "shmring-collect-between-tests"


def register_in_stats_run(config: pytest.Config) -> bool:
    """Register `CollectBetweenTests` when this is mutmut's stats run; answer whether it is now."""
    if not in_stats_run():
        return False
    if not config.pluginmanager.has_plugin(PLUGIN_NAME):
        config.pluginmanager.register(CollectBetweenTests(), PLUGIN_NAME)
    return True
