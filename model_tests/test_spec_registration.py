"""Example tests of `spec.registration` and `spec.leases`, the model alone.

`test_registration_lockstep.py` pins the same rules on the implementation;
these pin them on the model itself, step by step: the driver's answers and
fault schedule, the segment lifecycle, retain-and-poison, all-or-none
transfers, close; then the lease table (a lease lives while any view does)
and its tie to the ring (a lease's end is the frame's release).
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest

from shmring.spec import invariants
from shmring.spec import leases as leases_spec
from shmring.spec import registration as spec
from shmring.spec import ring as ring_spec
from shmring.spec.leases import LeaseTable
from shmring.spec.registration import (
    CALL_COPY_TO_HOST,
    CALL_HOST_REGISTER,
    CALL_HOST_UNREGISTER,
    CALL_SYNCHRONIZE,
    CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED,
    CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED,
    CUDA_ERROR_INVALID_VALUE,
    CUDA_ERROR_MEMORY_ALLOCATION,
    CUDA_ERROR_UNKNOWN,
    CUDA_SUCCESS,
    FAULT_EVERY,
    SEGMENT_ALLOCATED,
    SEGMENT_COPIED,
    SEGMENT_PUBLISHED,
    SEGMENT_REGISTERED,
    SEGMENT_REMOVED,
    SEGMENT_RETAINED,
    SEGMENT_UNREGISTERED,
    UNREGISTER_ATTEMPTS,
    DriverState,
    RegistryState,
    StepResult,
    StepStatus,
    TransferResult,
    TransferStatus,
)
from shmring.spec.ring import ConsumeMode

# -- the driver ---------------------------------------------------------------------------------


def test_register_of_an_overlapping_range_answers_already_registered() -> None:
    driver = DriverState()
    assert spec.process_host_register(driver, 0x10000, 0x2000) == CUDA_SUCCESS
    assert (
        spec.process_host_register(driver, 0x11000, 0x1000)
        == CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED
    )
    assert spec.process_host_register(driver, 0x12000, 0x1000) == CUDA_SUCCESS  # adjacent
    assert driver.ranges == {0x10000: 0x2000, 0x12000: 0x1000}


def test_unregister_of_an_address_that_is_not_a_base_answers_not_registered() -> None:
    driver = DriverState()
    spec.process_host_register(driver, 0x10000, 0x2000)
    assert spec.process_host_unregister(driver, 0x11000) == CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED
    assert spec.process_host_unregister(driver, 0x10000) == CUDA_SUCCESS
    assert spec.process_host_unregister(driver, 0x10000) == CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED
    assert driver.ranges == {}


def test_register_of_an_empty_range_answers_invalid_value() -> None:
    driver = DriverState()
    assert spec.process_host_register(driver, 0x10000, 0) == CUDA_ERROR_INVALID_VALUE
    assert spec.process_host_register(driver, 0, 4096) == CUDA_ERROR_INVALID_VALUE
    assert driver.ranges == {}


def test_nth_fault_fires_once_then_is_spent() -> None:
    driver = DriverState()
    spec.process_arm_fault(driver, CALL_SYNCHRONIZE, CUDA_ERROR_UNKNOWN, 2)
    answers = [spec.process_synchronize(driver) for _ in range(3)]
    assert answers == [CUDA_SUCCESS, CUDA_ERROR_UNKNOWN, CUDA_SUCCESS]
    assert driver.faults[0].spent and driver.calls == 3


def test_every_fault_fires_at_each_matching_call_and_changes_no_range() -> None:
    driver = DriverState()
    spec.process_arm_fault(driver, CALL_HOST_REGISTER, CUDA_ERROR_MEMORY_ALLOCATION, FAULT_EVERY)
    for address in (0x1000, 0x9000):
        assert spec.process_host_register(driver, address, 4096) == CUDA_ERROR_MEMORY_ALLOCATION
    assert driver.ranges == {}
    assert spec.process_copy_to_host(driver) == CUDA_SUCCESS  # another call: not matched
    spec.process_clear_faults(driver)
    assert spec.process_host_register(driver, 0x1000, 4096) == CUDA_SUCCESS


def test_fault_on_every_call_matches_any_call() -> None:
    driver = DriverState()
    spec.process_arm_fault(driver, None, CUDA_ERROR_UNKNOWN, 1)
    assert spec.process_copy_to_host(driver) == CUDA_ERROR_UNKNOWN
    assert spec.process_synchronize(driver) == CUDA_SUCCESS


def test_every_matching_fault_counts_the_call_and_the_first_firing_wins() -> None:
    driver = DriverState()
    spec.process_arm_fault(driver, CALL_COPY_TO_HOST, CUDA_ERROR_UNKNOWN, 1)
    spec.process_arm_fault(driver, None, CUDA_ERROR_MEMORY_ALLOCATION, 1)
    assert spec.process_copy_to_host(driver) == CUDA_ERROR_UNKNOWN
    assert [(f.seen, f.spent) for f in driver.faults] == [(1, True), (1, True)]
    assert spec.process_copy_to_host(driver) == CUDA_SUCCESS


# -- the lifecycle, step by step --------------------------------------------------------------


def checked(registry: RegistryState, result: StepResult) -> StepResult:
    invariants.check_registration(registry)
    return result


def test_lifecycle_walks_allocated_registered_copied_unregistered_published() -> None:
    registry = spec.initialize_registry()
    allocated = checked(registry, spec.process_allocate(registry, 4096))
    assert allocated == StepResult(StepStatus.OK, segment_id=0)
    segment = registry.segments[0]
    assert (segment.state, segment.address) == (SEGMENT_ALLOCATED, spec.ADDRESS_BASE)
    checked(registry, spec.process_register(registry, 0))
    assert (segment.state, segment.registered) == (SEGMENT_REGISTERED, True)
    assert registry.driver.ranges == {segment.address: 4096}
    checked(registry, spec.process_copy(registry, 0))
    assert (segment.state, segment.copied) == (SEGMENT_COPIED, True)
    checked(registry, spec.process_unregister(registry, 0))
    assert (segment.state, segment.registered, registry.driver.ranges) == (
        SEGMENT_UNREGISTERED,
        False,
        {},
    )
    spec.process_publish(registry, [0])
    assert (segment.state, segment.mapped, segment.linked) == (SEGMENT_PUBLISHED, False, True)
    spec.process_receive(registry, 0)
    assert segment.linked is False
    invariants.check_registration(registry)


def test_failed_allocation_leaves_nothing() -> None:
    registry = spec.initialize_registry()
    assert spec.process_allocate(registry, 4096, "ENOSPC") == StepResult(
        StepStatus.FAILED, error="ENOSPC"
    )
    assert registry.segments == {} and registry.next_segment_id == 0


def test_bookkeeping_cleared_only_after_a_successful_unregister() -> None:
    registry = spec.initialize_registry()
    spec.process_allocate(registry, 4096)
    spec.process_register(registry, 0)
    spec.process_arm_fault(registry.driver, CALL_HOST_UNREGISTER, CUDA_ERROR_UNKNOWN, 1)
    result = checked(registry, spec.process_unregister(registry, 0))
    assert result == StepResult(StepStatus.OK, segment_id=0)  # the retry succeeded
    assert registry.driver.calls == 3  # register, failed unregister, retried unregister
    assert (registry.segments[0].registered, registry.poisoned) == (False, False)


def test_unregister_failing_twice_retains_the_mapping_and_poisons_the_registry() -> None:
    registry = spec.initialize_registry()
    spec.process_allocate(registry, 4096)
    spec.process_register(registry, 0)
    spec.process_copy(registry, 0)
    spec.process_arm_fault(registry.driver, CALL_HOST_UNREGISTER, CUDA_ERROR_UNKNOWN, FAULT_EVERY)
    calls_before = registry.driver.calls
    result = checked(registry, spec.process_unregister(registry, 0))
    assert result == StepResult(StepStatus.RETAINED, error=CUDA_ERROR_UNKNOWN, segment_id=0)
    assert registry.driver.calls - calls_before == UNREGISTER_ATTEMPTS == 2
    segment = registry.segments[0]
    assert (segment.state, segment.registered, segment.mapped, segment.linked) == (
        SEGMENT_RETAINED,
        True,
        True,
        True,
    )
    assert registry.poisoned and spec.is_driver_holding(registry.driver, segment.address)


def test_poisoned_registry_refuses_every_new_registration() -> None:
    registry = spec.initialize_registry()
    spec.process_arm_fault(registry.driver, CALL_HOST_UNREGISTER, CUDA_ERROR_UNKNOWN, FAULT_EVERY)
    assert spec.process_transfer(registry, [4096]).status is TransferStatus.POISONED
    spec.process_clear_faults(registry.driver)  # the driver would work again: still refused
    assert spec.process_allocate(registry, 4096) == StepResult(StepStatus.REFUSED)
    assert spec.process_transfer(registry, [4096]) == TransferResult(TransferStatus.REFUSED)
    assert registry.next_segment_id == 1  # nothing was allocated
    restarted = spec.initialize_registry()  # a new process starts clean
    assert spec.process_transfer(restarted, [4096]).status is TransferStatus.PUBLISHED


def test_register_of_a_segment_allocated_before_the_poison_is_refused() -> None:
    registry = spec.initialize_registry()
    spec.process_allocate(registry, 4096)  # segment 0, before the poison
    spec.process_arm_fault(registry.driver, CALL_HOST_UNREGISTER, CUDA_ERROR_UNKNOWN, FAULT_EVERY)
    spec.process_transfer(registry, [4096])  # segment 1: retained, poison
    assert spec.process_register(registry, 0) == StepResult(StepStatus.REFUSED, segment_id=0)
    assert registry.segments[0].state == SEGMENT_ALLOCATED


@pytest.mark.parametrize("call", [CALL_HOST_REGISTER, CALL_COPY_TO_HOST, CALL_SYNCHRONIZE])
def test_register_or_copy_failure_removes_the_segment_and_publishes_nothing(call: str) -> None:
    registry = spec.initialize_registry()
    spec.process_arm_fault(registry.driver, call, CUDA_ERROR_MEMORY_ALLOCATION, 1)
    result = spec.process_transfer(registry, [4096])
    step = "register" if call == CALL_HOST_REGISTER else "copy"
    assert result == TransferResult(TransferStatus.FAILED, (0,), CUDA_ERROR_MEMORY_ALLOCATION, step)
    segment = registry.segments[0]
    assert (segment.state, segment.registered, segment.mapped, segment.linked) == (
        SEGMENT_REMOVED,
        False,
        False,
        False,
    )
    assert registry.driver.ranges == {} and not registry.poisoned
    invariants.check_registration(registry)


def test_allocation_failure_fails_the_transfer_at_allocate() -> None:
    registry = spec.initialize_registry()
    result = spec.process_transfer(registry, [4096, 8192], {1: "ENOSPC"})
    assert result == TransferResult(TransferStatus.FAILED, (0,), "ENOSPC", "allocate")
    assert registry.segments[0].state == SEGMENT_REMOVED and registry.driver.ranges == {}


def test_multi_field_transfer_publishes_all_or_none() -> None:
    registry = spec.initialize_registry()
    spec.process_arm_fault(registry.driver, CALL_COPY_TO_HOST, CUDA_ERROR_UNKNOWN, 3)
    failed = spec.process_transfer(registry, [4096, 4096, 4096])
    assert failed == TransferResult(TransferStatus.FAILED, (0, 1, 2), CUDA_ERROR_UNKNOWN, "copy")
    assert [s.state for s in registry.segments.values()] == [SEGMENT_REMOVED] * 3
    published = spec.process_transfer(registry, [4096, 8192])
    assert published == TransferResult(TransferStatus.PUBLISHED, (3, 4))
    assert [registry.segments[i].state for i in (3, 4)] == [SEGMENT_PUBLISHED] * 2
    invariants.check_registration(registry)


def test_unregister_failure_while_aborting_poisons_and_publishes_nothing() -> None:
    registry = spec.initialize_registry()
    spec.process_arm_fault(registry.driver, CALL_SYNCHRONIZE, CUDA_ERROR_UNKNOWN, 1)
    spec.process_arm_fault(registry.driver, CALL_HOST_UNREGISTER, CUDA_ERROR_UNKNOWN, FAULT_EVERY)
    result = spec.process_transfer(registry, [4096])
    assert result == TransferResult(TransferStatus.POISONED, (0,), CUDA_ERROR_UNKNOWN, "copy")
    assert registry.segments[0].state == SEGMENT_RETAINED and registry.poisoned
    invariants.check_registration(registry)


def test_unregister_failure_of_one_field_retains_it_and_removes_the_others() -> None:
    registry = spec.initialize_registry()
    # Field 0's unregister fails twice; field 1's succeeds.
    spec.process_arm_fault(registry.driver, CALL_HOST_UNREGISTER, CUDA_ERROR_UNKNOWN, 1)
    spec.process_arm_fault(registry.driver, CALL_HOST_UNREGISTER, CUDA_ERROR_UNKNOWN, 2)
    result = spec.process_transfer(registry, [4096, 4096])
    assert result == TransferResult(
        TransferStatus.POISONED, (0, 1), CUDA_ERROR_UNKNOWN, "unregister"
    )
    assert [registry.segments[i].state for i in (0, 1)] == [SEGMENT_RETAINED, SEGMENT_REMOVED]
    invariants.check_registration(registry)


def test_out_of_band_unregister_makes_the_own_unregister_fail_and_poison() -> None:
    registry = spec.initialize_registry()
    spec.process_allocate(registry, 4096)
    spec.process_register(registry, 0)
    assert spec.process_out_of_band_unregister(registry, 0) == CUDA_SUCCESS
    result = spec.process_unregister(registry, 0)
    assert result == StepResult(StepStatus.RETAINED, CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED, 0)
    assert registry.segments[0].mapped and registry.poisoned
    invariants.check_registration(registry)


# -- close ---------------------------------------------------------------------------------------


def test_close_unlinks_names_no_receiver_took_and_is_idempotent() -> None:
    registry = spec.initialize_registry()
    spec.process_transfer(registry, [4096])
    spec.process_transfer(registry, [4096])
    spec.process_receive(registry, 0)
    spec.process_allocate(registry, 4096)  # segment 2, never registered
    assert spec.process_close(registry) == 0
    assert [(s.state, s.linked, s.mapped) for s in registry.segments.values()] == [
        (SEGMENT_PUBLISHED, False, False),
        (SEGMENT_PUBLISHED, False, False),
        (SEGMENT_REMOVED, False, False),
    ]
    before = copy.deepcopy(registry)
    assert spec.process_close(registry) == 0
    assert registry == before
    invariants.check_registration(registry)


def test_close_unregisters_what_is_still_registered() -> None:
    registry = spec.initialize_registry()
    spec.process_allocate(registry, 4096)
    spec.process_register(registry, 0)
    assert spec.process_close(registry) == 0
    assert registry.segments[0].state == SEGMENT_REMOVED and registry.driver.ranges == {}


def test_close_gives_a_retained_segment_one_more_unregister() -> None:
    registry = spec.initialize_registry()
    spec.process_arm_fault(registry.driver, CALL_HOST_UNREGISTER, CUDA_ERROR_UNKNOWN, 2)
    spec.process_arm_fault(registry.driver, CALL_HOST_UNREGISTER, CUDA_ERROR_UNKNOWN, 1)
    spec.process_transfer(registry, [4096])  # both attempts fail: retained
    assert registry.segments[0].state == SEGMENT_RETAINED
    assert spec.process_close(registry) == 0  # the late unregister succeeds
    segment = registry.segments[0]
    assert (segment.state, segment.registered, segment.mapped, segment.linked) == (
        SEGMENT_REMOVED,
        False,
        False,
        False,
    )
    assert registry.driver.ranges == {}
    invariants.check_registration(registry)


def test_close_keeps_a_retained_segment_when_the_late_unregister_fails() -> None:
    registry = spec.initialize_registry()
    spec.process_arm_fault(registry.driver, CALL_HOST_UNREGISTER, CUDA_ERROR_UNKNOWN, FAULT_EVERY)
    spec.process_transfer(registry, [4096])
    assert spec.process_close(registry) == 1
    segment = registry.segments[0]
    assert (segment.state, segment.mapped, segment.linked) == (SEGMENT_RETAINED, True, True)
    assert spec.process_close(registry) == 1
    invariants.check_registration(registry)


def test_closed_registry_refuses() -> None:
    registry = spec.initialize_registry()
    spec.process_close(registry)
    assert spec.process_allocate(registry, 4096) == StepResult(StepStatus.CLOSED)
    assert spec.process_transfer(registry, [4096]) == TransferResult(TransferStatus.CLOSED)


# -- registration preconditions -------------------------------------------------------------------


def _registry_with_each_state() -> RegistryState:
    """Segment 0 allocated, 1 registered, 2 published."""
    registry = spec.initialize_registry()
    spec.process_allocate(registry, 4096)
    spec.process_allocate(registry, 4096)
    spec.process_register(registry, 1)
    spec.process_transfer(registry, [4096])
    return registry


REGISTRATION_INVALID_CALLS: dict[str, Callable[[RegistryState], object]] = {
    "allocate zero bytes": lambda r: spec.process_allocate(r, 0),
    "register twice": lambda r: spec.process_register(r, 1),
    "copy before register": lambda r: spec.process_copy(r, 0),
    "unregister of an unregistered segment": lambda r: spec.process_unregister(r, 0),
    "remove a registered segment": lambda r: spec.process_remove(r, 1),
    "publish an uncopied segment": lambda r: spec.process_publish(r, [0]),
    "receive an unpublished segment": lambda r: spec.process_receive(r, 1),
    "step on an unknown segment": lambda r: spec.process_register(r, 9),
    "transfer of no field": lambda r: spec.process_transfer(r, []),
    "fault that answers success": lambda r: spec.process_arm_fault(r.driver, None, CUDA_SUCCESS, 1),
}


@pytest.mark.parametrize("name", sorted(REGISTRATION_INVALID_CALLS))
def test_invalid_call_leaves_state_untouched(name: str) -> None:
    registry = _registry_with_each_state()
    before = copy.deepcopy(registry)
    with pytest.raises(AssertionError):
        REGISTRATION_INVALID_CALLS[name](registry)
    assert registry == before


# -- leases ----------------------------------------------------------------------------------------


def test_lease_stays_live_while_any_derived_view_lives() -> None:
    table = LeaseTable()
    lease, root = leases_spec.process_borrow(table, leases_spec.SOURCE_ARENA_FRAME, 512)
    sliced = leases_spec.process_derive(table, root, leases_spec.VIEW_SLICE)
    tensor = leases_spec.process_derive(table, sliced, leases_spec.VIEW_TORCH)
    frame = leases_spec.process_derive(table, root, leases_spec.VIEW_PYAV_FRAME)
    for view in (root, sliced, frame):
        assert leases_spec.process_drop(table, view) == leases_spec.DropResult(False, lease, None)
        assert leases_spec.is_live_lease(table, lease)
        invariants.check_leases(table)
    assert leases_spec.get_live_views(table, lease) == [tensor]
    assert leases_spec.process_drop(table, tensor) == leases_spec.DropResult(True, lease, 512)
    assert not leases_spec.is_live_lease(table, lease) and table.released_order == [lease]
    invariants.check_leases(table)


def test_a_view_derived_from_a_dead_parents_child_still_holds_the_lease() -> None:
    table = LeaseTable()
    lease, root = leases_spec.process_borrow(table, leases_spec.SOURCE_SEGMENT, None)
    child = leases_spec.process_derive(table, root, leases_spec.VIEW_ASARRAY)
    leases_spec.process_drop(table, root)
    grandchild = leases_spec.process_derive(table, child, leases_spec.VIEW_DTYPE)
    leases_spec.process_drop(table, child)
    assert leases_spec.get_lease_of(table, grandchild).lease_id == lease
    result = leases_spec.process_drop(table, grandchild)
    assert result == leases_spec.DropResult(True, lease, None)  # a segment has no position


def test_leases_end_in_any_order_each_exactly_once() -> None:
    table = LeaseTable()
    roots = [
        leases_spec.process_borrow(table, leases_spec.SOURCE_ARENA_FRAME, p) for p in (0, 256, 512)
    ]
    for _, root in (roots[2], roots[0], roots[1]):
        assert leases_spec.process_drop(table, root).released
    assert table.released_order == [2, 0, 1]
    assert leases_spec.get_live_leases(table) == []
    invariants.check_leases(table)


def test_an_arena_frame_is_leased_at_most_once_at_a_time() -> None:
    table = LeaseTable()
    _, root = leases_spec.process_borrow(table, leases_spec.SOURCE_ARENA_FRAME, 256)
    before = copy.deepcopy(table)
    with pytest.raises(AssertionError):
        leases_spec.process_borrow(table, leases_spec.SOURCE_ARENA_FRAME, 256)
    assert table == before
    leases_spec.process_drop(table, root)
    again, _ = leases_spec.process_borrow(table, leases_spec.SOURCE_ARENA_FRAME, 256)
    assert again == 1  # ids are never reused


def test_lease_end_releases_the_claimed_ring_frame() -> None:
    ring = ring_spec.initialize_ring(4096)
    table = LeaseTable()
    for key in ("a", "b"):
        ring_spec.process_put(ring, key, 100, key)
        got = ring_spec.process_get(ring, key, mode=ConsumeMode.LEASE)
        assert got.position is not None
        leases_spec.process_borrow(table, leases_spec.SOURCE_ARENA_FRAME, got.position)
    invariants.check_leases_against_ring(table, ring)
    dropped = leases_spec.process_drop(table, 1)  # "b" first: out of order
    assert dropped.position == 144
    ring_spec.process_release(ring, dropped.position)
    invariants.check_leases_against_ring(table, ring)
    assert ring_spec.process_reclaim(ring) == 0
    first = leases_spec.process_drop(table, 0)
    assert first.position == 0
    ring_spec.process_release(ring, first.position)
    assert ring_spec.process_reclaim(ring) == 288
    invariants.check_leases_against_ring(table, ring)


def test_a_dead_holders_leases_end_with_it_and_free_their_frames() -> None:
    ring = ring_spec.initialize_ring(4096)
    table = LeaseTable()
    for key, holder in (("a", 7), ("b", 8), ("c", 7)):
        ring_spec.process_put(ring, key, 100, key)
        got = ring_spec.process_get(ring, key, mode=ConsumeMode.LEASE)
        assert got.position is not None
        _, root = leases_spec.process_borrow(
            table, leases_spec.SOURCE_ARENA_FRAME, got.position, holder=holder
        )
        leases_spec.process_derive(table, root, leases_spec.VIEW_TORCH)
    assert ring_spec.process_reclaim(ring) == 0  # every frame claimed
    released = leases_spec.process_holder_exit(table, 7)
    assert [(r.lease_id, r.position) for r in released] == [(0, 0), (2, 288)]
    assert [lease.lease_id for lease in leases_spec.get_live_leases(table)] == [1]
    assert leases_spec.process_holder_exit(table, 7) == []  # released once
    for result in released:
        assert result.position is not None
        ring_spec.process_release(ring, result.position)
    invariants.check_leases(table)
    invariants.check_leases_against_ring(table, ring)
    assert ring_spec.process_reclaim(ring) == 144  # stops at holder 8's live lease


LEASE_INVALID_CALLS: dict[str, Callable[[LeaseTable], object]] = {
    "unknown source": lambda t: leases_spec.process_borrow(t, "gpu", None),
    "arena frame without a position": lambda t: leases_spec.process_borrow(
        t, leases_spec.SOURCE_ARENA_FRAME, None
    ),
    "segment with a position": lambda t: leases_spec.process_borrow(
        t, leases_spec.SOURCE_SEGMENT, 0
    ),
    "derive from a dead view": lambda t: leases_spec.process_derive(t, 0, leases_spec.VIEW_SLICE),
    "derive a root": lambda t: leases_spec.process_derive(t, 1, leases_spec.VIEW_ROOT),
    "drop a dead view": lambda t: leases_spec.process_drop(t, 0),
}


@pytest.mark.parametrize("name", sorted(LEASE_INVALID_CALLS))
def test_invalid_lease_call_leaves_state_untouched(name: str) -> None:
    table = LeaseTable()
    _, root = leases_spec.process_borrow(table, leases_spec.SOURCE_ARENA_FRAME, 0)
    leases_spec.process_derive(table, root, leases_spec.VIEW_SLICE)
    leases_spec.process_drop(table, root)  # view 0 is dead, view 1 lives
    before = copy.deepcopy(table)
    with pytest.raises(AssertionError):
        LEASE_INVALID_CALLS[name](table)
    assert table == before
