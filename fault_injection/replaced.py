"""Fault cells of the kind "the deployment directory was replaced between two calls".

Design rationale. The capture race (`fault_injection.capture`) needs root
and another uid; this is the same hazard through the seam, on any machine:
a `FaultPlan` with error `sites.DIRECTORY_REPLACED` at call N of a
directory-relative site makes `FaultyOs` move the deployment directory
aside and put a directory open to everyone at its path just before the next
directory-relative call. The descriptor a connector holds then names the
moved directory (still ours) while the path names a stranger's.

The scenario: a producer and a receiver join, carry ring frames, pool
slots (the producer's slot create, the receiver's slot open) and fallback
segments, a third connector joins late, all close. The promises a
cell checks differ from the lockstep scenarios' (a late joiner *must* be
refused here), so these cells run on their own:

* nothing is ever created in the directory now at the path;
* every error that reaches a caller is a documented shmring error
  (`ShmringError`; no bare `OSError`);
* whatever is delivered is exactly what was put (no other bytes);
* after close, no descriptor of ours is left open.

The moved-aside directory may keep the stamp and members file (the last
member never removes a directory its path no longer names); the cell
removes both directories afterwards.
"""

from __future__ import annotations

import contextlib
import gc
import os
import shutil
from dataclasses import dataclass
from typing import Final

from ..impl.connector import Connector
from ..impl.errors import ShmringError
from ..impl.names import DEFAULT_SHM_ROOT, deployment_directory
from ..spec.layout import MIN_POOL_CLASS, compute_slot_capacity
from ..spec.pool import compute_slot_charge
from .kit.seams import FaultyOs
from .plans import FaultPlan
from .sites import DIRECTORY_REPLACED, DIRECTORY_SITES, MODE_TRANSIENT

EDGE: Final = ("enc", "dec")
LATE_EDGE: Final = ("late", "dec")
_SMALL: Final = b"s" * 100  # a ring frame
_POOLED: Final = b"P" * 3000  # larger than a quarter of the 4 KiB ring: a pool slot
# Larger than what the pool's one class holds (its capacity: class + headroom): a fallback segment.
_LARGE: Final = b"L" * (compute_slot_capacity(MIN_POOL_CLASS) + 1000)
# The producer's pool: one class of the smallest slot, room for two slots.
_POOL: Final = {
    "pool_min_bytes": MIN_POOL_CLASS,
    "pool_max_bytes": MIN_POOL_CLASS,
    "pool_budget_bytes": 2 * compute_slot_charge(MIN_POOL_CLASS),
}


@dataclass(frozen=True)
class ReplacedCell:
    """What one cell saw."""

    plan: FaultPlan
    replaced: bool  # the directory was in fact replaced during the run
    problems: tuple[str, ...]  # broken promises; empty when the cell passed
    errors: tuple[str, ...]  # documented errors callers got, "operation: ErrorType"


def _scenario(scope: str, seam: FaultyOs, shm_root: str, errors: list[str]) -> list[str]:
    problems: list[str] = []

    def attempt(what: str, action: object) -> object:
        try:
            return action()  # type: ignore[operator]
        except ShmringError as error:
            errors.append(f"{what}: {type(error).__name__}")
        except OSError as error:
            problems.append(f"bare {type(error).__name__} at {what}: {error}")
        return None

    def check(what: str, got: object, sent: bytes) -> None:
        value = getattr(got, "value", None)
        if value is not None and value != {"v": sent}:
            problems.append(f"{what} delivered other bytes: {str(value)[:80]}")

    producer = Connector(scope, ring_capacity=4096, shm_root=shm_root, os_facade=seam, **_POOL)
    receiver = Connector(
        scope, ring_capacity=4096, pool_budget_bytes=0, shm_root=shm_root, os_facade=seam
    )
    try:
        for round_ in range(2):
            for name, payload in (("small", _SMALL), ("pooled", _POOLED), ("large", _LARGE)):
                key = f"{name}{round_}"
                attempt(f"put {key}", lambda k=key, p=payload: producer.put(EDGE, k, {"v": p}))
                got = attempt(f"get {key}", lambda k=key: receiver.get(EDGE, k))
                check(f"get {key}", got, payload)
        late = Connector(
            scope, ring_capacity=4096, pool_budget_bytes=0, shm_root=shm_root, os_facade=seam
        )
        try:
            # another edge: a second connector of this process may not own the same ring
            attempt("late put", lambda: late.put(LATE_EDGE, "late", {"v": _SMALL}))
            got = attempt("late get", lambda: receiver.get(LATE_EDGE, "late"))
            check("late get", got, _SMALL)
        finally:
            attempt("late close", late.close)
    finally:
        attempt("producer close", producer.close)
        attempt("receiver close", receiver.close)
    return problems


def run_cell(plan: FaultPlan, scope: str, shm_root: str = DEFAULT_SHM_ROOT) -> ReplacedCell:
    """Run the scenario under `plan` and check the promises (see the module docstring)."""
    seam = FaultyOs(plan)
    errors: list[str] = []
    problems = _scenario(scope, seam, shm_root, errors)
    seam.armed = False
    path = deployment_directory(scope, shm_root)
    for at, _aside in seam.replaced:
        with contextlib.suppress(FileNotFoundError):
            left = os.listdir(at)
            if left:
                problems.append(f"files created in the replacement directory: {sorted(left)}")
    left_open = seam.held_descriptors()  # what this cell opened, not the process
    if left_open:
        gc.collect()  # a cycle may hold the last reference
        left_open = seam.held_descriptors()
    if left_open:
        problems.append(f"{len(left_open)} descriptors left open")
    for _at, aside in seam.replaced:
        shutil.rmtree(aside, ignore_errors=True)
    if seam.replaced or os.path.lexists(path):
        if not seam.replaced and os.listdir(path):
            problems.append(f"deployment directory left with {sorted(os.listdir(path))}")
        shutil.rmtree(path, ignore_errors=True)
    return ReplacedCell(plan, bool(seam.replaced), tuple(problems), tuple(errors))


def calls_per_site(scope: str, shm_root: str = DEFAULT_SHM_ROOT) -> dict[str, int]:
    """Calls per directory site a fault-free run makes (how many cells each site needs)."""
    seam = FaultyOs()
    problems = _scenario(scope, seam, shm_root, [])
    if problems:
        raise AssertionError(f"the scenario fails without a fault: {problems}")
    return {name: seam.counts[name] for name in DIRECTORY_SITES}


def run_all(prefix: str, shm_root: str = DEFAULT_SHM_ROOT) -> list[ReplacedCell]:
    """One cell per call of every directory site (transient: the directory is replaced once)."""
    calls = calls_per_site(f"{prefix}b", shm_root)
    cells = []
    for site_name in DIRECTORY_SITES:
        for nth in range(1, calls[site_name] + 1):
            plan = FaultPlan(site_name, nth, MODE_TRANSIENT, DIRECTORY_REPLACED)
            cells.append(run_cell(plan, f"{prefix}{site_name[:2]}{nth}", shm_root))
    return cells


__all__ = ["ReplacedCell", "calls_per_site", "run_all", "run_cell"]
