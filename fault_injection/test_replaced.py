"""Cells of the fault kind "the directory was replaced between two calls" (issue 12)."""

from __future__ import annotations

import errno
import uuid

import pytest

from shmring.fault_injection import replaced
from shmring.fault_injection.plans import FaultPlan
from shmring.fault_injection.sites import (
    DIRECTORY_REPLACED,
    DIRECTORY_SITES,
    MODE_TRANSIENT,
)


def test_directory_replaced_plans_print_parse_back_and_fit_only_directory_sites() -> None:
    plan = FaultPlan("open", 3, MODE_TRANSIENT, DIRECTORY_REPLACED)
    assert str(plan) == "open#3:DIRECTORY_REPLACED:transient"
    assert FaultPlan.parse(str(plan)) == plan
    with pytest.raises(ValueError, match="directory-relative"):
        FaultPlan("mmap", 1, MODE_TRANSIENT, DIRECTORY_REPLACED)
    assert errno.errorcode.get(DIRECTORY_REPLACED) is None  # never a real errno


def test_every_directory_call_replaced_creates_nothing_in_the_stranger_and_stays_typed() -> None:
    prefix = f"rp{uuid.uuid4().hex[:6]}"
    calls = replaced.calls_per_site(f"{prefix}c")
    assert all(calls[name] for name in DIRECTORY_SITES), calls  # every site is reached
    cells = replaced.run_all(prefix)
    assert {cell.plan.site for cell in cells} == set(DIRECTORY_SITES)
    assert sum(cell.replaced for cell in cells) >= len(cells) // 2  # the fault did happen
    failed = [f"{cell.plan}: {'; '.join(cell.problems)}" for cell in cells if cell.problems]
    assert failed == [], "\n".join(failed[:10])
    # a connector joining after the replacement is refused, typed
    assert any("late put: ConfigurationError" in cell.errors for cell in cells)
