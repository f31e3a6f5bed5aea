"""The three faults the mission names, each as a readable test.

* A failed unregister: transient (the retry succeeds) and persistent (the
  mapping is retained, the registry refuses until restart, nothing is
  unlinked).
* ENOSPC: at ring setup (the edge falls back), at fallback segment creation
  (a typed error, nothing half-written), in the registered arena (it is
  disabled, per-transfer segments carry). Injected here; `test_tmpfs.py`
  does it for real.
* Locked readers: another *process* holds a ring's or a segment's lock; the
  receiver answers BUSY without waiting (also through `get_with_deadline`),
  the producer behaves as the model says, and the frame is delivered once
  the lock is released.

The pool (issue 13) meets two of the three. ENOSPC at a slot file's
creation (its fallocate): no slot file is left, the put falls back to a
per-key segment, the next put with space takes the pool. A lock: slot files
take no lock of their own (a consumer claims a slot only while it holds the
carrier ring frame's claim, under that *ring's* lock, `impl.pool.consumer`),
so the locked-reader fault on the pool path is a held ring lock with a pool
reference on the ring; a lock held on a slot file changes nothing, which
`test_a_lock_held_on_a_pool_slot_file_blocks_nothing` checks. A failed
unregister does not apply: slot files are never page-locked with the CUDA
driver (only the registered transfer path calls `host_register`).
"""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Iterator

import pytest
import torch

from shmring.fault_injection.kit.processes import LockHolder
from shmring.fault_injection.kit.processes import watchdog as bounded
from shmring.fault_injection.kit.seams import FaultyOs
from shmring.fault_injection.plans import FaultPlan, FaultyCudaDriver
from shmring.fault_injection.sites import MODE_PERSISTENT, MODE_TRANSIENT
from shmring.impl import codec
from shmring.impl.connector import Connector, GetStatus, RingDescriptor, Route
from shmring.impl.errors import NoSpaceError, RegistryPoisonedError
from shmring.impl.names import fallback_segment_path, parse_pool_slot_file_name
from shmring.impl.registered.registration import Registry
from shmring.impl.registered.transfer import TransferOptions, TransferReceiver, TransferSender
from shmring.spec import connector as connector_spec
from shmring.spec.connector import ConnectorPutStatus
from shmring.spec.layout import ADMISSION_DIVISOR, MIN_POOL_CLASS, compute_slot_capacity
from shmring.spec.pool import compute_slot_charge
from shmring.spec.registration import CALL_HOST_UNREGISTER, CUDA_ERROR_UNKNOWN

EDGE = ("enc", "dec")
CAPACITY = 4096


# A pool of two slots of the smallest class, and a payload only a slot takes:
# above what the 4 KiB ring admits, within the class's capacity (class + headroom).
POOL = {
    "pool_min_bytes": MIN_POOL_CLASS,
    "pool_max_bytes": MIN_POOL_CLASS,
    "pool_budget_bytes": 2 * compute_slot_charge(MIN_POOL_CLASS),
}
LARGE = b"L" * (MIN_POOL_CLASS + 1000)
assert CAPACITY // ADMISSION_DIVISOR < len(LARGE) < compute_slot_capacity(MIN_POOL_CLASS)


def _slot_files(directory: str) -> list[str]:
    return sorted(name for name in os.listdir(directory) if parse_pool_slot_file_name(name))


def _size(payload: bytes) -> int:
    """Encoded payload bytes, as the model counts them."""
    return codec.prepare(payload).nbytes


def _tensor(tag: int) -> torch.Tensor:
    return torch.arange(32, dtype=torch.float32) + tag


# -- failed unregister -------------------------------------------------------------------------


def test_transient_unregister_failure_is_retried_and_the_transfer_publishes(scope: str) -> None:
    driver = FaultyCudaDriver(
        FaultPlan(CALL_HOST_UNREGISTER, 1, MODE_TRANSIENT, CUDA_ERROR_UNKNOWN)
    )
    with Registry(scope, driver) as registry:
        published = registry.transfer([_tensor(1)])
        stats = registry.statistics()
        assert len(published) == 1 and driver.hits == 1
        assert stats.unregister_retries == 1 and not stats.poisoned and stats.segments_retained == 0
        assert driver.registered_ranges() == {}
        registry.transfer([_tensor(2)])  # still usable


def test_persistent_unregister_failure_retains_the_mapping_and_poisons_until_restart(
    scope: str,
) -> None:
    driver = FaultyCudaDriver(
        FaultPlan(CALL_HOST_UNREGISTER, 1, MODE_PERSISTENT, CUDA_ERROR_UNKNOWN)
    )
    registry = Registry(scope, driver)
    try:
        with pytest.raises(RegistryPoisonedError) as raised:
            registry.transfer([_tensor(1)])
        assert raised.value.cuda_error == CUDA_ERROR_UNKNOWN
        (segment,) = registry.segments()
        # Retained: still registered with the driver, still mapped, name still there.
        assert segment.registered and segment.mapped and segment.linked
        assert os.path.exists(segment.path)
        assert driver.is_registered(segment.address)
        with pytest.raises(RegistryPoisonedError):
            registry.transfer([_tensor(2)])  # refused until the process restarts
        assert len(driver.registered_ranges()) == 1  # nothing new was registered
        driver.armed = False  # the driver recovers: the close's last unregister succeeds
        assert registry.close() == 0
        assert not os.path.exists(segment.path) and driver.registered_ranges() == {}
    finally:
        driver.armed = False
        registry.close()
    with Registry(scope, driver) as restarted:  # a new process's registry starts clean
        assert len(restarted.transfer([_tensor(4)])) == 1


# -- ENOSPC ------------------------------------------------------------------------------------


def test_enospc_at_ring_setup_falls_back_for_that_edge(scope: str) -> None:
    seam = FaultyOs(FaultPlan("fallocate", 1, MODE_TRANSIENT, errno.ENOSPC))
    model = connector_spec.initialize_connector(CAPACITY, 1 << 20)
    with (
        Connector(scope, ring_capacity=CAPACITY, pool_budget_bytes=0, os_facade=seam) as producer,
        Connector(scope) as receiver,
    ):
        descriptor = producer.put(EDGE, "k", b"x" * 100)
        expected = connector_spec.process_put(
            model, EDGE, "k", _size(b"x" * 100), b"x", ring_setup_ok=False
        )
        assert seam.hits == 1
        assert (
            descriptor.route is Route.FALLBACK and expected.route is connector_spec.Route.FALLBACK
        )
        assert isinstance(producer.failed_edges()[EDGE], NoSpaceError)
        assert producer.put(EDGE, "k2", b"y").route is Route.FALLBACK  # disabled once, for good
        assert not [n for n in os.listdir(producer.directory) if n.startswith(("ring.", "marker."))]
        assert receiver.get(EDGE, "k").value == b"x" * 100


def test_enospc_at_segment_creation_is_a_typed_refusal_with_nothing_half_written(
    scope: str,
) -> None:
    seam = FaultyOs()
    with (
        Connector(scope, ring_capacity=0, os_facade=seam) as producer,
        Connector(scope) as receiver,
    ):
        producer.put(EDGE, "kept", b"k" * 500)
        before = sorted(os.listdir(producer.directory))
        seam.plan, seam.armed = (
            FaultPlan("fallocate", seam.counts["fallocate"] + 1, MODE_TRANSIENT, errno.ENOSPC),
            True,
        )
        with pytest.raises(NoSpaceError) as raised:
            producer.put(EDGE, "new", b"n" * 500)
        assert raised.value.errno == errno.ENOSPC and isinstance(raised.value, OSError)
        assert sorted(os.listdir(producer.directory)) == before  # no temporary, no segment
        assert producer.health().puts == 1 and producer.health().refusals == 0
        assert receiver.get(EDGE, "new").status is GetStatus.NOT_FOUND
        assert receiver.get(EDGE, "kept").value == b"k" * 500
        assert producer.put(EDGE, "new", b"n" * 500).route is Route.FALLBACK  # space again


def test_enospc_at_a_pool_slot_creation_leaves_no_slot_and_the_put_falls_back(
    scope: str,
) -> None:
    seam = FaultyOs()
    with (
        Connector(scope, ring_capacity=CAPACITY, os_facade=seam, **POOL) as producer,
        Connector(scope) as receiver,
    ):
        producer.put(EDGE, "small", b"s")  # the ring is set up (its fallocate)
        seam.plan, seam.armed = (
            FaultPlan("fallocate", seam.counts["fallocate"] + 1, MODE_TRANSIENT, errno.ENOSPC),
            True,
        )
        assert producer.put(EDGE, "big", LARGE).route is Route.FALLBACK
        health = producer.health()
        assert seam.hits == 1 and health.pool_create_failures == 1 and health.pool_fallbacks == 1
        assert health.pool_slots == 0 and _slot_files(producer.directory) == []
        got = receiver.get(EDGE, "big")
        assert got.route is Route.FALLBACK and got.value == LARGE
        assert producer.put(EDGE, "big2", LARGE).route is Route.POOL  # space again: a slot
        assert len(_slot_files(producer.directory)) == 1
        got = receiver.get(EDGE, "big2")
        assert got.route is Route.POOL and got.value == LARGE


def test_enospc_in_the_arena_disables_it_and_segments_carry(scope: str) -> None:
    seam = FaultyOs(FaultPlan("fallocate", 1, MODE_TRANSIENT, errno.ENOSPC))  # the arena's file
    driver = FaultyCudaDriver()
    options = TransferOptions(enable_registered_shm=True, arena_capacity=CAPACITY)
    with (
        TransferSender(scope, options, driver=driver, os_facade=seam) as sender,
        TransferReceiver(scope, options) as receiver,
    ):
        descriptor = sender.send({"x": _tensor(5)})
        stats = sender.statistics()
        assert stats.arena_disabled is not None and "No space left" in stats.arena_disabled
        assert stats.fields_in_segments == 1 and stats.fields_in_arena == 0
        assert torch.equal(receiver.receive_tensors(descriptor)["x"], _tensor(5))
        assert not [n for n in os.listdir(sender.directory) if n.startswith("arena.")]
        # ENOSPC at a segment: NoSpaceError, nothing left, nothing registered.
        seam.plan, seam.armed = (
            FaultPlan("fallocate", seam.counts["fallocate"] + 1, MODE_TRANSIENT, errno.ENOSPC),
            True,
        )
        before = sorted(os.listdir(sender.directory))
        with pytest.raises(NoSpaceError):
            sender.send({"y": _tensor(6)})
        assert sorted(os.listdir(sender.directory)) == before and driver.registered_ranges() == {}
    assert driver.registered_ranges() == {}


# -- locked readers ----------------------------------------------------------------------------


@pytest.fixture
def watchdog() -> Iterator[None]:
    """A locked-reader test that hangs fails after a minute instead."""
    with bounded(60):
        yield


def test_another_process_holding_the_ring_lock_makes_receivers_busy_not_wait(
    scope: str, watchdog: None
) -> None:
    with (
        Connector(scope, ring_capacity=CAPACITY, pool_budget_bytes=0) as producer,
        Connector(scope) as receiver,
    ):
        producer.put(EDGE, "warm", b"w")
        assert receiver.get(EDGE, "warm").delivered
        ring = producer.ring(EDGE)
        assert ring is not None
        holder = LockHolder(ring.path)
        try:
            # The producer publishes a new key without the lock, as the model says.
            model = connector_spec.initialize_connector(CAPACITY, 1 << 20)
            connector_spec.process_put(model, EDGE, "warm", _size(b"w"), b"w")
            expected = connector_spec.process_put(model, EDGE, "k", _size(b"k" * 100), b"k" * 100)
            descriptor = producer.put(EDGE, "k", b"k" * 100)
            assert expected.status is ConnectorPutStatus.ACCEPTED
            assert isinstance(descriptor, RingDescriptor)
            assert isinstance(expected.descriptor, connector_spec.RingDescriptor)
            assert descriptor.position == expected.descriptor.position
            assert receiver.get(EDGE, "k").status is GetStatus.BUSY
            assert receiver.get_with_deadline(EDGE, "k", timeout=0.05).status is GetStatus.BUSY
            assert receiver.get(EDGE, "k", descriptor=descriptor).status is GetStatus.BUSY
        finally:
            holder.release()
        got = receiver.get(EDGE, "k")
        assert got.delivered and got.value == b"k" * 100
        assert receiver.get(EDGE, "k").status is GetStatus.NOT_FOUND  # once


def test_a_killed_lock_holder_releases_the_ring(scope: str, watchdog: None) -> None:
    with (
        Connector(scope, ring_capacity=CAPACITY, pool_budget_bytes=0) as producer,
        Connector(scope) as receiver,
    ):
        producer.put(EDGE, "k", b"v")
        ring = producer.ring(EDGE)
        assert ring is not None
        holder = LockHolder(ring.path)
        try:
            assert receiver.get(EDGE, "k").status is GetStatus.BUSY
        finally:
            holder.kill()
        assert receiver.get(EDGE, "k").value == b"v"


def test_another_process_holding_a_segment_lock_makes_receivers_busy_and_the_producer_wait(
    scope: str, watchdog: None
) -> None:
    with Connector(scope, ring_capacity=0) as producer, Connector(scope) as receiver:
        producer.put(EDGE, "seg", b"old" * 100)
        holder = LockHolder(fallback_segment_path(producer.directory, EDGE, "seg"))
        replaced: list[object] = []
        try:
            assert receiver.get(EDGE, "seg").status is GetStatus.BUSY
            assert receiver.get_with_deadline(EDGE, "seg", timeout=0.05).status is GetStatus.BUSY
            # The producer's re-put replaces the segment under its lock: it waits for the reader.
            putter = threading.Thread(
                target=lambda: replaced.append(producer.put(EDGE, "seg", b"new" * 100))
            )
            putter.start()
        finally:
            holder.release()
        putter.join(30)
        assert not putter.is_alive() and len(replaced) == 1
        assert replaced[0].route is Route.FALLBACK  # type: ignore[attr-defined]
        got = receiver.get(EDGE, "seg")
        assert got.delivered and got.value == b"new" * 100  # the newer version, once
        assert receiver.get(EDGE, "seg").status is GetStatus.NOT_FOUND


def test_another_process_holding_the_ring_lock_makes_pool_gets_busy_and_leaves_the_slot(
    scope: str, watchdog: None
) -> None:
    """A pool reference on a locked ring: BUSY, the slot not claimed, the producer not waiting."""
    with (
        Connector(scope, ring_capacity=CAPACITY, **POOL) as producer,
        Connector(scope) as receiver,
    ):
        producer.put(EDGE, "warm", b"w")
        assert receiver.get(EDGE, "warm").delivered
        assert producer.put(EDGE, "big", LARGE).route is Route.POOL
        ring = producer.ring(EDGE)
        assert ring is not None
        holder = LockHolder(ring.path)
        try:
            assert receiver.get(EDGE, "big").status is GetStatus.BUSY
            assert receiver.get_with_deadline(EDGE, "big", timeout=0.05).status is GetStatus.BUSY
            # The slot is still PUBLISHED (never claimed): the next pool put takes the
            # other slot, and a third finds none free (the per-key segment carries it).
            assert producer.put(EDGE, "big2", LARGE).route is Route.POOL
            assert producer.put(EDGE, "big3", LARGE).route is Route.FALLBACK
            health = producer.health()
            assert (health.pool_slots, health.pool_slots_reused, health.pool_fallbacks) == (2, 0, 1)
        finally:
            holder.release()
        for key in ("big", "big2", "big3"):
            got = receiver.get(EDGE, key)
            assert got.delivered and got.value == LARGE, (key, got.status)
            assert receiver.get(EDGE, key).status is GetStatus.NOT_FOUND  # once
        assert producer.put(EDGE, "big4", LARGE).route is Route.POOL  # the slots are free again
        assert producer.health().pool_slots_reused == 1


def test_a_lock_held_on_a_pool_slot_file_blocks_nothing(scope: str, watchdog: None) -> None:
    """Slots take no locks: another process's flock on a slot file is not a fault of the pool."""
    with (
        Connector(scope, ring_capacity=CAPACITY, **POOL) as producer,
        Connector(scope) as receiver,
    ):
        assert producer.put(EDGE, "big", LARGE).route is Route.POOL
        (slot,) = _slot_files(producer.directory)
        holder = LockHolder(os.path.join(producer.directory, slot))
        try:
            got = receiver.get(EDGE, "big")
            assert got.route is Route.POOL and got.value == LARGE
            assert producer.put(EDGE, "again", LARGE).route is Route.POOL  # reused, no wait
            assert producer.health().pool_slots_reused == 1
            assert receiver.get(EDGE, "again").value == LARGE
        finally:
            holder.release()
