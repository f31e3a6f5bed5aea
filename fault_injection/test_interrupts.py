"""Exceptions raised inside put/get: the interrupt storm (issue 24)."""

from __future__ import annotations

import uuid

import pytest

from shmring.fault_injection import interrupts


@pytest.mark.parametrize("seed", [0, 1])
def test_an_interrupt_storm_leaves_no_untyped_error_no_wrong_data_and_no_temporary(
    seed: int,
) -> None:
    """Issue 24: a handler raising every 0.15-1 ms inside put/get.

    Before: 119-165 `BufferError`s and 1-3 `IndexError`s escaped put/get in
    8 s, 344-483 files (mostly ``fbtmp.*``) stayed after every close, and an
    interrupted ring put or pool get made 1-2,579 later gets fail with
    `CorruptFrameError`.
    """
    report = interrupts.run_storm(f"st{uuid.uuid4().hex[:10]}", seconds=3.0, seed=seed)
    assert report.interrupted_puts > 100 and report.interrupted_gets > 100, report
    assert report.untyped == {}, report
    assert report.wrong == 0, report
    assert report.typed == {}, report
    assert report.close_errors == {}, report
    assert report.after_ok, report
    # What close removes by name: no temporary, pool slot, ring, marker or live file stays.
    # (A segment whose lock a stopped call still holds can stay: docs/faults.md.)
    assert set(report.left_kinds) <= {"fb", "members", "stamp"}, report
