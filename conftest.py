"""Suite-wide fixtures: unique scopes, /dev/shm left as each test found it, impl's logs exact."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

# impl's log records held to the one table of its messages (the fixtures live there)
from shmring.model_tests.log_messages import impl_logs_known_messages, impl_records  # noqa: F401

SHM_ROOT = "/dev/shm"
SCOPED_CHECK = "SHMRING_SHM_CHECK"  # "scope": count only the test's scope (shared machines)


def pytest_configure(config: pytest.Config) -> None:
    """In mutmut's stats run only: cyclic garbage collected between tests (`model_tests/gc_guard.py`)."""
    from shmring.model_tests.gc_guard import register_in_stats_run

    register_in_stats_run(config)


def _shm_entries() -> set[str]:
    """Every path below /dev/shm (two levels deep) that belongs to this uid."""
    found: set[str] = set()
    uid = os.getuid()
    try:
        top = list(os.scandir(SHM_ROOT))
    except FileNotFoundError:
        return found
    for entry in top:
        try:
            if entry.stat(follow_symlinks=False).st_uid != uid:
                continue
        except FileNotFoundError:
            continue
        found.add(entry.path)
        if entry.is_dir(follow_symlinks=False):
            for root, dirs, files in os.walk(entry.path):
                for name in dirs + files:
                    found.add(os.path.join(root, name))
    return found


@pytest.fixture
def scope(request: pytest.FixtureRequest) -> str:
    """A deployment scope no other test (or worker) uses."""
    return f"t{uuid.uuid4().hex[:12]}"


@pytest.fixture(autouse=True)
def dev_shm_unchanged(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fail a test that leaves files of its own in /dev/shm.

    Under pytest-xdist other workers create files concurrently, so there only
    the entries that name this test's scope count; run alone, any new entry
    counts, unless SHMRING_SHM_CHECK=scope says other processes share the
    machine's /dev/shm (`model_tests/mutation.py` sets it: its runs are
    plain pytest, and another user's test files appearing meanwhile failed
    every mutant's run, clean or not).
    """
    before = _shm_entries()
    yield
    after = _shm_entries()
    added = after - before
    if os.environ.get("PYTEST_XDIST_WORKER") or os.environ.get(SCOPED_CHECK) == "scope":
        test_scope = (
            request.node.funcargs.get("scope") if hasattr(request.node, "funcargs") else None
        )
        added = {path for path in added if test_scope and test_scope in path}
    # Python's own SharedMemory names, hypothesis or torch may create files
    # that are not ours; shmring's names all carry "shmring".
    ours = sorted(path for path in added if "shmring" in path or "psm_" in path)
    assert not ours, f"test left files in /dev/shm: {ours}"


def _flock_count() -> int:
    """flock locks this process holds now (/proc/locks; 0 where it cannot be read)."""
    pid = str(os.getpid())
    try:
        with open("/proc/locks", encoding="ascii") as locks:
            return sum(1 for line in locks if line.split()[4:5] == [pid] and "FLOCK" in line)
    except OSError:
        return 0


@pytest.fixture(autouse=True)
def no_flock_left(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fail a test that leaves this process holding more flock locks than before it.

    A lock a test leaves (an object that closed without releasing its
    descriptor) is dropped whenever the garbage collector gets to it: the
    fault cells count this process's locks around each cell, so under
    xdist a later cell of another test failed with "flock locks 2 -> 1"
    (2026-12-04). Counted per process, so it holds under xdist as well: one
    worker runs one test at a time. Fewer locks than before is a leftover
    of an earlier test being collected, not this test's doing.
    """
    before = _flock_count()
    yield
    after = _flock_count()
    if after > before:
        import gc

        gc.collect()  # a cycle may hold the last reference
        after = _flock_count()
    assert after <= before, f"test left {after - before} flock lock(s) held by this process"
