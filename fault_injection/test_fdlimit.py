"""Out of descriptors: typed errors and partial service (issue 12, part 3)."""

from __future__ import annotations

import uuid

import pytest

from shmring.fault_injection import fault_cells, fdlimit
from shmring.fault_injection.fault_cells import Slot
from shmring.fault_injection.identities import borrowed_identities
from shmring.fault_injection.sites import (
    DESCRIPTOR_SITES,
    EXHAUSTION_ERRORS,
    MODE_PERSISTENT,
    MODE_TRANSIENT,
)
from shmring.impl.errors import ResourceExhaustedError, ShmringError


def test_resource_exhausted_error_is_a_shmring_error_and_an_oserror() -> None:
    error = ResourceExhaustedError("out of descriptors for a ring mapping")
    assert isinstance(error, ShmringError) and isinstance(error, OSError)
    assert error.errno == 24  # EMFILE


def test_a_reader_under_ulimit_64_serves_all_80_producers() -> None:
    """Issue 12: 80 producers, ulimit -n 64: every get was a bare EMFILE, nothing served."""
    report = fdlimit.run_probe(f"fd{uuid.uuid4().hex[:8]}", producers=80, limit=64)
    assert report["bare"] == {}, report
    assert report["wrong"] == 0, report
    assert report["delivered"] == report["keys"], report


def test_a_reader_under_ulimit_24_fails_typed_and_serves_what_it_can() -> None:
    report = fdlimit.run_probe(f"fd{uuid.uuid4().hex[:8]}", producers=30, limit=24)
    assert report["bare"] == {}, report
    assert report["wrong"] == 0, report
    assert report["delivered"] > 0, report
    assert report["delivered"] + report["recovered"] == report["keys"], report


@pytest.mark.parametrize(("producers", "limit"), [(80, 64), (30, 24)])
def test_a_reader_short_of_descriptors_claims_pool_payloads_typed_and_loses_none(
    producers: int, limit: int
) -> None:
    """Every fourth producer's large payload in its pool slot: the reader maps those slots too.

    Out of descriptors mid-claim it sheds and retries, else a typed error
    with the carrier left deliverable (a later reader gets it); never a
    bare EMFILE, never a lost or wrong payload. (Under 64 every key is served.)
    """
    report = fdlimit.run_probe(
        f"fd{uuid.uuid4().hex[:8]}", producers=producers, limit=limit, pool=True
    )
    assert report["pool_puts"] == (producers + 3) // 4, report
    assert report["bare"] == {}, report
    assert report["wrong"] == 0, report
    assert report["delivered"] > 0, report
    assert report["delivered"] + report["recovered"] == report["keys"], report
    if limit == 64:
        assert report["delivered"] == report["keys"], report


@pytest.mark.parametrize("scenario", ["discovery", "fallback_traffic", "restart"])
def test_emfile_and_enfile_at_every_descriptor_site_keep_the_promises(scenario: str) -> None:
    """Fault cells: EMFILE / ENFILE at every open, mmap and pidfd call of the scenario."""
    identities = borrowed_identities()
    prefix = f"fe{uuid.uuid4().hex[:6]}"
    with fault_cells.quiet_logs():
        reached = fault_cells.baseline(scenario, identities, f"{prefix}b")
        failed: list[str] = []
        cells = 0
        for index, site in enumerate(DESCRIPTOR_SITES):
            calls = reached.get(site, 0)
            assert calls, f"{scenario} makes no {site} call"
            for error in EXHAUSTION_ERRORS:
                for mode in (MODE_TRANSIENT, MODE_PERSISTENT):
                    slot = Slot(scenario, site, error, mode, calls)

                    def on_cell(result: fault_cells.CellResult) -> None:
                        if result.problems:
                            failed.append(result.describe())

                    cells += fault_cells.run_slot(
                        slot, identities, f"{prefix}{index}{error}{mode[0]}", on_cell
                    )
    assert cells > 0
    assert failed == [], "\n".join(failed[:8])
