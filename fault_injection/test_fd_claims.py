"""Issue 22, defects 2 and 5: descriptor shortage never loses a key; the pool holds no fd per slot."""

from __future__ import annotations

import errno
import uuid

import pytest

from shmring.fault_injection import fdclaims
from shmring.fault_injection.kit.seams import FaultyOs
from shmring.impl.connector import Connector, GetStatus, Route
from shmring.impl.errors import ResourceExhaustedError


@pytest.mark.parametrize("hold", [False, True], ids=["owned", "holding_borrowed"])
@pytest.mark.parametrize("limit", [16, 24])
def test_a_reader_short_of_descriptors_never_loses_a_pooled_key(hold: bool, limit: int) -> None:
    """Issue 22: 60 pooled keys, a reader under RLIMIT_NOFILE retrying ResourceExhaustedError.

    Holding its borrowed payloads, with every descriptor taken after its
    first key, the reader ran out: before the fix each key that failed was
    consumed by the failure (its carrier frame pinned, then DONE) and never
    delivered to anyone (at 24: 46 of 60 lost). Now a failed claim rolls
    back completely, and since the slot mappings hold no descriptor of
    their own (defect 5) a shed frees enough for the next claim: each key
    is delivered exactly once, by the limited reader. (The seam test below
    forces the shortage through to a ResourceExhaustedError.)
    """
    report = fdclaims.reader_probe(f"fc{uuid.uuid4().hex[:8]}", keys=60, limit=limit, hold=hold)
    assert report["pool_puts"] == 60, report
    assert report["bare"] == {} and report["wrong"] == 0, report
    assert report["lost"] == [] and report["twice"] == [], report
    assert report["delivered"] == 60, report


def test_a_borrowed_pool_claim_that_runs_out_of_descriptors_leaves_the_key_deliverable(
    scope: str,
) -> None:
    """Through the seam: EMFILE at every open while a borrowed get maps the key's slot."""
    faulty = FaultyOs()
    with (
        Connector(scope, ring_capacity=4096, **fdclaims.pool_options(2)) as producer,
        Connector(scope, ring_capacity=4096, pool_budget_bytes=0, os_facade=faulty) as reader,
    ):
        payload = fdclaims._payload("k")
        producer.put(fdclaims.EDGE, "small", {"v": 1})
        producer.put(fdclaims.EDGE, "k", payload)
        assert reader.get(fdclaims.EDGE, "small").status is GetStatus.DELIVERED  # ring mapped
        faulty.fail_every("open", errno.EMFILE)  # the slot file's open, and every retry
        for _ in range(3):
            with pytest.raises(ResourceExhaustedError):
                reader.get(fdclaims.EDGE, "k", borrow=True)
        faulty.disarm()
        with reader.get(fdclaims.EDGE, "k", borrow=True) as got:
            assert got.status is GetStatus.DELIVERED and got.route is Route.POOL, got
            assert bytes(got.value["fill"]) == payload["fill"]
        assert reader.get(fdclaims.EDGE, "k").status is GetStatus.NOT_FOUND  # exactly once


@pytest.mark.parametrize("limit", [64])
def test_300_outstanding_large_puts_take_the_pool_at_ulimit_64(limit: int) -> None:
    """Issue 22, defect 5: at ``ulimit -n 64`` only 26 (here 27) of 300 outstanding puts succeeded.

    Each slot held two descriptors (ours and the dup `mmap.mmap` keeps). Now
    a slot file is mapped (`OsFacade.map_shared`, no dup) and its descriptor
    closed at once: all 300 take the pool and the producer's descriptors
    stay at its fixed working set (docs/performance.md, "Descriptors").
    """
    report = fdclaims.producer_probe(f"fc{uuid.uuid4().hex[:8]}", puts=300, limit=limit)
    assert report["bare"] == {} and report["typed"] == {}, report
    assert report["ok"] == 300 and report["pool_puts"] == 300, report
    assert report["pool_slots"] == 300 and report["fallbacks"] == 0, report
    assert report["open_fds"] <= 16, report


def _mapped(path: str) -> bool:
    with open("/proc/self/maps") as maps:
        return any(path in line for line in maps)


def test_map_shared_holds_no_descriptor_and_unmaps_with_its_last_view(scope: str) -> None:
    """`OsFacade.map_shared`: the fd may be closed at once; the pages go with the last reference."""
    import gc
    import os

    import numpy as np

    from shmring.impl.os_seam import DEFAULT_OS

    path = f"/dev/shm/shmring-test-{scope}"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.ftruncate(fd, 1 << 16)
        before = len(os.listdir("/proc/self/fd"))
        mapping = DEFAULT_OS.map_shared(fd, 1 << 16)
        assert len(os.listdir("/proc/self/fd")) == before  # no dup kept
    finally:
        os.close(fd)
    try:
        view = memoryview(mapping).cast("B")
        view[10:15] = b"hello"
        with open(path, "rb") as again:
            assert again.read(15)[10:] == b"hello"  # shared with the file
        kept = np.frombuffer(view[8:24], np.uint8)  # a borrowed array outlives the rest
        del mapping
        view.release()
        gc.collect()
        assert _mapped(path) and bytes(kept[2:7]) == b"hello"
        del kept
        gc.collect()
        assert not _mapped(path)
    finally:
        os.unlink(path)
