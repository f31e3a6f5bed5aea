"""Suite-wide fixtures: unique scopes, and /dev/shm left as each test found it."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

SHM_ROOT = "/dev/shm"
SCOPED_CHECK = "SHMRING_SHM_CHECK"  # "scope": count only the test's scope (shared machines)


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
