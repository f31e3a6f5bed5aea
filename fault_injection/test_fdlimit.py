"""Out of descriptors: typed errors and partial service (issue 12, part 3)."""

from __future__ import annotations

import errno
import uuid

import pytest

from shmring.fault_injection import fault_cells, fdlimit
from shmring.fault_injection.fault_cells import Slot
from shmring.fault_injection.identities import borrowed_identities
from shmring.fault_injection.kit.seams import FaultyOs
from shmring.fault_injection.sites import (
    DESCRIPTOR_SITES,
    EXHAUSTION_ERRORS,
    MODE_PERSISTENT,
    MODE_TRANSIENT,
)
from shmring.impl.connector import Connector, GetStatus
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

    Out of descriptors mid-claim it sheds (its rings, segments, pidfds and
    its slot mappings) and retries: never a bare EMFILE, never a lost or
    wrong payload, and every key served, also at 24 (before the slot
    mappings were shed, 1 of 38 keys there was a typed error, delivered
    only later by a reader without the limit).
    """
    report = fdlimit.run_probe(
        f"fd{uuid.uuid4().hex[:8]}", producers=producers, limit=limit, pool=True
    )
    assert report["pool_puts"] == (producers + 3) // 4, report
    assert report["bare"] == {}, report
    assert report["wrong"] == 0, report
    assert report["delivered"] > 0, report
    assert report["delivered"] == report["keys"], report
    assert report["typed"] == {}, report


def test_a_pool_reader_sheds_its_slot_mappings_when_an_open_runs_out_of_descriptors() -> None:
    """Through the OS seam: EMFILE at a slot's open sheds the reader's older slot mappings.

    Three producers' payloads in their pool slots; the reader has mapped
    two slots when the third slot's open answers EMFILE. The shortage
    handler releases half of what the connector caches, slot mappings
    included (least recently used first), and the claim is tried again.
    """
    scope = f"fd{uuid.uuid4().hex[:8]}"
    faulty = FaultyOs()
    producers = [Connector(scope, ring_capacity=4096, **fdlimit._POOL) for _ in range(3)]
    reader = Connector(scope, ring_capacity=4096, pool_budget_bytes=0, os_facade=faulty)
    try:
        for index, producer in enumerate(producers):
            producer.put(fdlimit.EDGE, f"big{index}", {"fill": bytes([index]) * fdlimit._LARGE})
        for index in range(2):
            assert reader.get(fdlimit.EDGE, f"big{index}").status is GetStatus.DELIVERED
        pool = reader._ring_route.pool
        assert pool is not None and pool.mapped == 2 and pool.shed_slots == 0
        faulty.fail_open("pool.", errno.EMFILE)
        got = reader.get(fdlimit.EDGE, "big2")
        assert faulty.fired["open pool."] == 1
        assert got.status is GetStatus.DELIVERED, got
        assert bytes(got.value["fill"]) == b"\x02" * fdlimit._LARGE
        assert pool.shed_slots == 1 and pool.mapped == 2  # the oldest went, the new one came
        assert sum(producer.health().pool_puts for producer in producers) == 3
    finally:
        reader.close()
        for producer in producers:
            producer.close()


@pytest.mark.parametrize("scenario", ["discovery", "fallback_traffic", "restart", "pool_traffic"])
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


def test_a_borrowed_pool_payload_outlives_the_shed_of_its_slot_mapping() -> None:
    """A shed while a borrowed view lives: the view reads on, its release frees the slot.

    The producer's pool holds one slot: a later put of the same size takes
    the pool again (no new slot file, no fallback) only if the borrowed
    claim's release stored DONE through its own header words after the
    reader unmapped the slot.
    """
    scope = f"fd{uuid.uuid4().hex[:8]}"
    sent = bytes(range(256)) * 256  # 64 KiB: borrowed, and within the smallest class
    with (
        Connector(scope, ring_capacity=4096, **fdlimit._POOL) as producer,
        Connector(scope, ring_capacity=4096, pool_budget_bytes=0) as reader,
    ):
        producer.put(fdlimit.EDGE, "k0", {"fill": sent})
        with reader.get(fdlimit.EDGE, "k0", borrow=True) as got:
            assert got.status is GetStatus.DELIVERED and got.borrowed, got
            pool = reader._ring_route.pool  # joined now
            assert pool is not None and pool.shed() == 1 and pool.mapped == 0
            assert bytes(got.value["fill"]) == sent  # the mapping lives on under the view
        producer.put(fdlimit.EDGE, "k1", {"fill": sent})
        health = producer.health()
        assert (health.pool_puts, health.pool_slots_created, health.pool_fallbacks) == (2, 1, 0)
        again = reader.get(fdlimit.EDGE, "k1")
        assert again.status is GetStatus.DELIVERED and bytes(again.value["fill"]) == sent
        assert pool.mapped == 1  # mapped again
