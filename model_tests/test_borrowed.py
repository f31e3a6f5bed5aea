"""Borrowed gets (issue 13): `Connector.get(..., borrow=True)` and `get_with_deadline(..., borrow=True)`.

A borrowed value's large leaves are read-only views of the claimed ring
frame (or fallback segment mapping); the frame stays CLAIMED until the last
view dies (`spec.borrowing`). Each test names the claim it checks; the
dead-borrower test forks a real child and kills it with SIGKILL.
"""

from __future__ import annotations

import gc
import os
import signal
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch

from shmring.fault_injection.kit.processes import watchdog
from shmring.impl.codec import BORROWED_BYTES_MIN, SHARED_LEAF_LIMIT
from shmring.impl.connector import (
    Connector,
    FallbackDescriptor,
    GetStatus,
    RingDescriptor,
    Route,
)
from shmring.impl.ring.borrow import lease_statistics

EDGE = ("enc", "dec")
CAPACITY = 1024 * 1024  # admits frames up to 256 KiB: `_tree` (about 197 KiB) travels on it
LEAF_FLOATS = SHARED_LEAF_LIMIT // 4  # a float32 array of exactly the own-area threshold


def _tree(seed: int) -> dict[str, Any]:
    """A tree with one large leaf of each kind, and small ones that are copied."""
    return {
        "array": np.arange(LEAF_FLOATS, dtype=np.float32) + seed,
        "tensor": torch.full((LEAF_FLOATS // 2,), float(seed), dtype=torch.float64),
        "blob": bytes([seed % 251]) * BORROWED_BYTES_MIN,
        "small": {"bytes": b"tiny", "array": np.ones(3, dtype=np.int16), "n": seed},
    }


def _same(value: Any, sent: dict[str, Any]) -> bool:
    return (
        np.array_equal(value["array"], sent["array"])
        and torch.equal(value["tensor"], sent["tensor"])
        and bytes(value["blob"]) == sent["blob"]
        and value["small"]["bytes"] == sent["small"]["bytes"]
        and value["small"]["n"] == sent["small"]["n"]
    )


def _claimed(producer: Connector) -> int:
    ring = producer.ring(EDGE)
    assert ring is not None
    return ring.statistics().claimed_frames


@pytest.fixture
def pair(scope: str) -> Iterator[tuple[Connector, Connector]]:
    with Connector(scope, ring_capacity=CAPACITY) as producer, Connector(scope) as receiver:
        yield producer, receiver
    gc.collect()
    assert not os.path.exists(producer.directory)


def test_borrowed_leaves_are_views_that_keep_the_frame_claimed(
    pair: tuple[Connector, Connector],
) -> None:
    producer, receiver = pair
    sent = _tree(7)
    assert isinstance(producer.put(EDGE, "k", sent), RingDescriptor)
    before = lease_statistics()
    got = receiver.get(EDGE, "k", borrow=True)
    assert got.status is GetStatus.DELIVERED and got.route is Route.RING and got.borrowed
    value = got.value
    assert _same(value, sent)
    # Large leaves borrowed (views), small ones copied.
    assert isinstance(value["blob"], memoryview) and value["blob"].readonly
    assert not value["array"].flags.owndata and not value["array"].flags.writeable
    assert isinstance(value["small"]["bytes"], bytes)
    assert _claimed(producer) == 1
    health = receiver.health()
    assert (health.borrowed_gets, health.borrowed_live, health.borrowed_ring_frames) == (1, 1, 1)
    assert lease_statistics().live == before.live + 1
    leaves = [value["array"], value["tensor"][5:], value["blob"]]
    del value, got
    for _ in range(len(leaves)):  # each kind of leaf alone holds the frame
        assert _claimed(producer) == 1
        leaves.pop()
    assert _claimed(producer) == 0  # the last view died: DONE
    health = receiver.health()
    assert (health.borrowed_gets, health.borrowed_live, health.borrowed_ring_frames) == (1, 0, 0)
    assert lease_statistics().live == before.live


def test_writes_to_borrowed_arrays_and_bytes_raise(pair: tuple[Connector, Connector]) -> None:
    producer, receiver = pair
    producer.put(EDGE, "k", _tree(1))
    with receiver.get(EDGE, "k", borrow=True) as got:
        array, blob = got.value["array"], got.value["blob"]
        with pytest.raises(ValueError, match="read-only"):
            array[0] = 5.0
        with pytest.raises(ValueError):
            array.flags.writeable = True  # the base is read-only: it cannot be turned back
        with pytest.raises(ValueError):
            np.asarray(array).reshape(-1)[:4].view(np.uint8)[0] = 1  # derived views too
        with pytest.raises(TypeError, match="read-only"):
            blob[0] = 0
        with pytest.raises(TypeError):
            memoryview(blob).cast("B")[0] = 0
        assert array[0] == 1.0 and blob[0] == 1
        del array, blob


def test_borrowed_views_outlive_close_and_unlink(scope: str) -> None:
    producer = Connector(scope, ring_capacity=CAPACITY)
    receiver = Connector(scope)
    try:
        sent = _tree(3)
        producer.put(EDGE, "k", sent)
        got = receiver.get(EDGE, "k", borrow=True)
        value = got.value
        del got
    finally:
        receiver.close()
        producer.close()  # unlinks the ring file and the deployment directory
    assert not os.path.exists(producer.directory)
    assert _same(value, sent)  # the mapping lives on under the views
    tensor = value["tensor"] * 2  # views still compute
    assert float(tensor[0]) == 6.0
    before = lease_statistics().live
    del value
    assert lease_statistics().live == before - 1


def test_a_held_borrow_stops_reclaim_then_release_recovers_the_ring(
    pair: tuple[Connector, Connector],
) -> None:
    producer, receiver = pair
    producer.put(EDGE, "held", _tree(0))
    held = receiver.get(EDGE, "held", borrow=True)
    assert held.borrowed
    routes = []
    for index in range(12):  # consumed at once: only the claimed frame pins the ring
        routes.append(producer.put(EDGE, f"k{index}", _tree(index)).route)
        assert receiver.get(EDGE, f"k{index}").delivered
    assert Route.FALLBACK in routes, routes  # the ring filled up behind the claimed frame
    assert receiver.health().borrowed_ring_frames == 1
    assert _same(held.value, _tree(0))  # never overwritten while claimed
    assert held.release()
    assert receiver.health().borrowed_ring_frames == 0
    recovered = [producer.put(EDGE, f"r{index}", _tree(index)) for index in range(3)]
    assert all(isinstance(descriptor, RingDescriptor) for descriptor in recovered)
    for index in range(3):
        assert receiver.get(EDGE, f"r{index}").delivered


def test_eager_release_gives_the_frame_back_at_once(pair: tuple[Connector, Connector]) -> None:
    producer, receiver = pair
    producer.put(EDGE, "k", _tree(2))
    with receiver.get(EDGE, "k", borrow=True) as got:
        assert _claimed(producer) == 1
        assert float(got.value["tensor"][0]) == 2.0
    assert got.value is None and not got.borrowed
    assert _claimed(producer) == 0
    assert got.release()  # idempotent


def test_a_leaf_kept_past_an_eager_release_keeps_its_frame_and_bytes(
    pair: tuple[Connector, Connector],
) -> None:
    producer, receiver = pair
    sent = _tree(5)
    producer.put(EDGE, "k", sent)
    got = receiver.get(EDGE, "k", borrow=True)
    kept = got.value["array"][10:]  # a derived view the caller keeps
    assert not got.release()  # the value is dropped, the kept leaf holds the frame
    assert got.value is None and got.borrowed
    for index in range(12):  # the producer writes on: never over the kept frame
        producer.put(EDGE, f"k{index}", _tree(100 + index))
        receiver.get(EDGE, f"k{index}")
    assert _claimed(producer) == 1
    assert np.array_equal(kept, sent["array"][10:])
    del kept
    assert _claimed(producer) == 0 and not got.borrowed


def test_a_value_without_large_leaves_holds_nothing(pair: tuple[Connector, Connector]) -> None:
    producer, receiver = pair
    producer.put(EDGE, "k", {"x": 1, "a": np.ones(8), "b": b"small"})
    got = receiver.get(EDGE, "k", borrow=True)
    assert got.delivered and not got.borrowed
    assert got.value["x"] == 1 and got.value["b"] == b"small"
    assert _claimed(producer) == 0
    assert receiver.health().borrowed_gets == 0


def test_borrow_with_a_descriptor_and_with_a_deadline(pair: tuple[Connector, Connector]) -> None:
    producer, receiver = pair
    descriptor = producer.put(EDGE, "d", _tree(4))
    got = receiver.get(*EDGE, "d", descriptor=descriptor, borrow=True)  # (src, dst, key) form
    assert got.borrowed and _same(got.value, _tree(4))
    assert receiver.get(EDGE, "d", descriptor=descriptor, borrow=True).status is GetStatus.STALE
    producer.put(EDGE, "w", _tree(6))
    waited = receiver.get_with_deadline(*EDGE, "w", timeout=5.0, borrow=True)
    assert waited.borrowed and _same(waited.value, _tree(6))
    assert _claimed(producer) == 2
    assert receiver.health().borrowed_live == 2
    del got, waited
    assert _claimed(producer) == 0


def test_a_borrowed_fallback_segment_keeps_its_mapping_not_its_name(scope: str) -> None:
    # Spares on: the producer asks for the file back; a borrowed claim unlinks it instead.
    with (
        Connector(
            scope, ring_capacity=CAPACITY, fallback_spare_min_bytes=4096, pool_budget_bytes=0
        ) as producer,
        Connector(scope) as receiver,
    ):
        sent = {"big": np.arange(4 * LEAF_FLOATS, dtype=np.float32), "blob": b"q" * 300_000}
        assert isinstance(producer.put(EDGE, "big", sent), FallbackDescriptor)
        got = receiver.get(EDGE, "big", borrow=True)
        assert got.route is Route.FALLBACK and got.borrowed
        assert receiver.health().borrowed_live == 1
        assert receiver.health().borrowed_ring_frames == 0
        names = os.listdir(producer.directory)
        assert not [name for name in names if name.startswith(("fb.", "fbspare."))], names
        value = got.value
        del got
        assert producer.put(EDGE, "big", {"big": np.zeros(4 * LEAF_FLOATS, np.float32)})
        assert np.array_equal(value["big"], sent["big"]) and bytes(value["blob"]) == sent["blob"]
        again = receiver.get(EDGE, "big")  # owned, as by default
        assert not again.value["big"].any()
        del value, again
        assert receiver.health().borrowed_live == 0


def test_owned_gets_are_the_default_and_hold_nothing(pair: tuple[Connector, Connector]) -> None:
    producer, receiver = pair
    producer.put(EDGE, "k", _tree(8))
    got = receiver.get(EDGE, "k")
    assert got.lease is None and not got.borrowed
    assert got.value["array"].flags.owndata or got.value["array"].base is not None
    assert isinstance(got.value["blob"], bytes)
    assert _claimed(producer) == 0


def test_a_sigkilled_borrower_does_not_wedge_the_ring(scope: str) -> None:
    """The dead-holder rule: a put that finds the ring full frees the killed holder's frame."""
    with Connector(scope, ring_capacity=CAPACITY) as producer:
        producer.put(EDGE, "held", _tree(9))
        ready_read, ready_write = os.pipe()
        child = os.fork()
        if child == 0:  # the borrower: claims the frame, says so, then waits to be killed
            code = 1
            try:
                os.close(ready_read)
                with Connector(scope) as borrower:
                    got = borrower.get(EDGE, "held", borrow=True)
                    os.write(ready_write, b"1" if got.borrowed else b"0")
                    signal.pause()
            finally:
                os._exit(code)
        os.close(ready_write)
        try:
            with watchdog(30):
                assert os.read(ready_read, 1) == b"1"
            assert _claimed(producer) == 1
        finally:
            os.kill(child, signal.SIGKILL)
            os.waitpid(child, 0)
            os.close(ready_read)
        with Connector(scope) as receiver:
            routes = []
            for index in range(12):  # more than the ring holds behind the dead holder's frame
                routes.append(producer.put(EDGE, f"k{index}", _tree(index)).route)
                assert receiver.get(EDGE, f"k{index}").delivered
            assert routes == [Route.RING] * 12, routes
        ring = producer.ring(EDGE)
        assert ring is not None
        assert ring.statistics().reclaimed_from_dead_holders == 1
        assert _claimed(producer) == 0


def test_a_borrowed_pool_payload_holds_its_slot_not_the_ring(scope: str) -> None:
    # The ring (1 MiB) refuses a 1 MiB array: the pool carries it, the ring holds a reference.
    sent = {"big": np.arange(256 * 1024, dtype=np.float32), "n": 3}
    with Connector(scope, ring_capacity=CAPACITY) as producer, Connector(scope) as receiver:
        assert producer.put(EDGE, "p", sent).route is Route.POOL
        got = receiver.get(EDGE, "p", borrow=True)
        assert got.route is Route.POOL and got.borrowed
        big = got.value["big"]
        assert not big.flags.writeable and not big.flags.owndata
        assert np.array_equal(big, sent["big"]) and got.value["n"] == 3
        assert _claimed(producer) == 0  # the carrier frame went back at once
        health = receiver.health()
        assert health.borrowed_live == 1 and health.borrowed_ring_frames == 0
        # The slot is CLAIMED while the view lives: the next payload of its class needs another.
        producer.put(EDGE, "q", {"big": np.zeros(256 * 1024, dtype=np.float32), "n": 4})
        assert producer.health().pool_slots_created == 2
        assert np.array_equal(big, sent["big"])  # still the borrowed bytes
        other = receiver.get(EDGE, "q")
        assert other.route is Route.POOL and not other.borrowed
        del got, big
        gc.collect()
        assert receiver.health().borrowed_live == 0
        # Both slots are free again: two more puts reuse them, none is created.
        for key in ("r", "s"):
            producer.put(EDGE, key, sent)
            assert np.array_equal(receiver.get(EDGE, key).value["big"], sent["big"])
        assert producer.health().pool_slots_created == 2
        assert producer.health().pool_slots_reused >= 2
