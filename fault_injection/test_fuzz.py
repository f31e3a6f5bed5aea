"""Corrupted bytes and forged input: typed errors or nothing, never a crash, never outside the mapping.

CI runs each target with the quick budget's case counts (a fixed seed, so a
failure reproduces); `-m slow` runs the long profile (>= 10,000 cases).
"""

from __future__ import annotations

import pytest

from shmring.fault_injection import fuzz

QUICK = fuzz.BUDGET_CASES["quick"]


@pytest.mark.parametrize("target", sorted(fuzz.TARGETS))
def test_corrupted_or_forged_input_gives_typed_errors_only(target: str) -> None:
    ran: list[int] = []
    fuzz.TARGETS[target](QUICK[target], 0, lambda: ran.append(1))
    assert len(ran) == QUICK[target]


def test_forged_names_symlinks_other_uids_and_bad_headers_are_refused_clearly(scope: str) -> None:
    assert fuzz.forged_battery(scope) >= 12


def test_mutations_apply_as_planned() -> None:
    template = bytes(range(16))
    assert fuzz.apply(template, [fuzz.Mutation("flip", 0, value=1)])[0] == 2
    assert fuzz.apply(template, [fuzz.Mutation("field", 4, 4, 0xFFFFFFFF)])[4:8] == b"\xff" * 4
    assert fuzz.apply(template, [fuzz.Mutation("truncate", 5)]) == template[:5]
    assert len(fuzz.apply(template, [fuzz.Mutation("extend", 0, value=7)])) == 23
    assert fuzz.apply(template, [fuzz.Mutation("write", 14, data=b"abcd")]) == template[:14] + b"ab"


@pytest.mark.slow
def test_long_fuzz_profile_runs_at_least_ten_thousand_cases() -> None:
    counts = fuzz.run_fuzz("deep", 1, lambda done, total: None)
    assert counts["fuzz_cases"] >= 10_000
