"""CUDA host registration of shared-memory segments, as a state machine.

Read this module to learn what the registered transfer path promises about
registration. Two parts:

* The **driver** (`DriverState`): what `cudaHostRegister` /
  `cudaHostUnregister` do to the set of registered host ranges. Ranges never
  overlap; registering an overlapping range answers
  `cudaErrorHostMemoryAlreadyRegistered`, unregistering an address that is not
  the base of a registered range answers `cudaErrorHostMemoryNotRegistered`.
  The environment may make any call fail (a *fault*: the first, the nth or
  every matching call answers a given error name and changes nothing). The
  simulated driver of the implementation follows this part exactly.

* The **registry** (`RegistryState`): the per-transfer segments of one
  process and their lifecycle::

      allocated -> registered -> copied -> unregistered -> published
          |            |           |            |
          +------------+-----------+------------+--> removed   (a step failed)
                       |           |
                       +-----------+--> retained  (unregister failed twice)

  - The registry's "registered" bookkeeping is cleared only after a
    successful unregister; a mapping is never unmapped nor its name unlinked
    while the bookkeeping says the driver may hold it.
  - A failed unregister is retried once (UNREGISTER_ATTEMPTS in all). If it
    still fails the segment is *retained* (mapping and name kept) and the
    registry is *poisoned*: it refuses every further registration until the
    process restarts.
  - A register, copy or synchronize failure unregisters what was registered
    and removes the segment: nothing is published, nothing leaks.
  - A multi-field transfer publishes all of its segments or none.
  - A published segment's name is unlinked as soon as the receiver mapped it;
    closing the registry unlinks the names no receiver took.

Outcomes are return values (CUDA error names, `StepStatus`); asserts are for
calls the caller must never make (a step out of lifecycle order).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Final

# -- constants ---------------------------------------------------------------

# Driver calls, named as the driver port names its methods.
CALL_HOST_REGISTER: Final = "host_register"
CALL_HOST_UNREGISTER: Final = "host_unregister"
CALL_COPY_TO_HOST: Final = "copy_to_host"
CALL_SYNCHRONIZE: Final = "synchronize"
DRIVER_CALLS: Final = (
    CALL_HOST_REGISTER,
    CALL_HOST_UNREGISTER,
    CALL_COPY_TO_HOST,
    CALL_SYNCHRONIZE,
)

# CUDA runtime error names (cudaError_t member names), as the real driver answers them.
CUDA_SUCCESS: Final = "cudaSuccess"
CUDA_ERROR_INVALID_VALUE: Final = "cudaErrorInvalidValue"
CUDA_ERROR_MEMORY_ALLOCATION: Final = "cudaErrorMemoryAllocation"
CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED: Final = "cudaErrorHostMemoryAlreadyRegistered"
CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED: Final = "cudaErrorHostMemoryNotRegistered"
CUDA_ERROR_UNKNOWN: Final = "cudaErrorUnknown"

# A fault with nth == FAULT_EVERY fires at every matching call.
FAULT_EVERY: Final = 0
# One try plus one retry.
UNREGISTER_ATTEMPTS: Final = 2

# Segment states along the lifecycle.
SEGMENT_ALLOCATED: Final = "allocated"
SEGMENT_REGISTERED: Final = "registered"
SEGMENT_COPIED: Final = "copied"
SEGMENT_UNREGISTERED: Final = "unregistered"
SEGMENT_PUBLISHED: Final = "published"
SEGMENT_REMOVED: Final = "removed"
SEGMENT_RETAINED: Final = "retained"
SEGMENT_STATES: Final = (
    SEGMENT_ALLOCATED,
    SEGMENT_REGISTERED,
    SEGMENT_COPIED,
    SEGMENT_UNREGISTERED,
    SEGMENT_PUBLISHED,
    SEGMENT_REMOVED,
    SEGMENT_RETAINED,
)
# States in which the registry's bookkeeping may say "registered".
REGISTERED_STATES: Final = (SEGMENT_REGISTERED, SEGMENT_COPIED, SEGMENT_RETAINED)

# Model addresses: segment n lives at ADDRESS_BASE + n * ADDRESS_STRIDE, so
# two segments never overlap (lengths stay below the stride).
ADDRESS_BASE: Final = 1 << 32
ADDRESS_STRIDE: Final = 1 << 40


# -- state -------------------------------------------------------------------


@dataclass
class DriverFault:
    """A planned failure: the matching call answers `error` and changes nothing."""

    call: str | None  # one of DRIVER_CALLS, or None for every driver call
    error: str  # the CUDA error name the failing call answers; never CUDA_SUCCESS
    nth: int  # fire at the nth matching call after arming (1 = first); FAULT_EVERY = every one
    seen: int = 0  # matching calls since arming; only grows
    spent: bool = False  # an nth fault fires once, then is spent for good


@dataclass
class DriverState:
    """What the CUDA driver holds, and the faults the environment planned."""

    # Registered ranges: base address -> length. Lengths > 0; ranges never overlap.
    ranges: dict[int, int] = field(default_factory=dict)
    faults: list[DriverFault] = field(default_factory=list)  # armed in order; first firing wins
    calls: int = 0  # driver calls made so far, failed ones included; only grows


@dataclass
class Segment:
    """One per-transfer shared-memory segment on the producer side."""

    segment_id: int  # unique in the registry, never reused
    address: int  # base address of the producer's mapping; what the driver registers
    length: int  # bytes, > 0
    state: str  # one of SEGMENT_STATES; moves only along the lifecycle diagram
    # Registry bookkeeping: True from a successful register until a successful
    # unregister, never cleared otherwise. Implies mapped and linked.
    registered: bool = False
    copied: bool = False  # the device-to-host copy completed; only copied segments are published
    mapped: bool = True  # the producer's mapping is open; closed only when not registered
    linked: bool = True  # the name exists; unlinked only when not registered


@dataclass
class RegistryState:
    """One process's registry of per-transfer segments."""

    driver: DriverState
    segments: dict[int, Segment] = field(default_factory=dict)  # every segment ever allocated
    # Set when an unregister failed UNREGISTER_ATTEMPTS times; never cleared
    # (only a new process starts clean). Equivalent to: some segment is retained.
    poisoned: bool = False
    closed: bool = False  # set by close; a closed registry allocates nothing
    next_segment_id: int = 0  # id of the next segment; only grows


class StepStatus(enum.Enum):
    OK = "ok"  # the step happened
    FAILED = "failed"  # the driver or the OS answered an error; see `error`
    REFUSED = "refused"  # the registry is poisoned: no new registration
    CLOSED = "closed"  # the registry was closed by its owner
    RETAINED = "retained"  # unregister failed twice: segment retained, registry poisoned


@dataclass(frozen=True)
class StepResult:
    status: StepStatus
    error: str | None = None  # CUDA error name or errno name when the step did not happen
    segment_id: int | None = None  # the segment the step made (allocate) or acted on


class TransferStatus(enum.Enum):
    PUBLISHED = "published"  # every segment published
    FAILED = "failed"  # nothing published; everything removed
    POISONED = "poisoned"  # nothing published; some segment retained, registry poisoned
    REFUSED = "refused"  # poisoned before the transfer started: nothing allocated
    CLOSED = "closed"  # the registry was closed


@dataclass(frozen=True)
class TransferResult:
    status: TransferStatus
    segment_ids: tuple[int, ...] = ()  # every segment this transfer allocated, in field order
    error: str | None = None  # the first failure's error name
    step: str | None = (
        None  # the step that failed first: "allocate", "register", "copy", "unregister"
    )


# -- predicates --------------------------------------------------------------


def is_overlapping(start_a: int, length_a: int, start_b: int, length_b: int) -> bool:
    """Whether [start_a, start_a + length_a) and [start_b, start_b + length_b) share a byte."""
    # Verify both ranges are non-empty
    assert length_a > 0 and length_b > 0
    return start_a < start_b + length_b and start_b < start_a + length_a


def is_fault_matching(fault: DriverFault, call: str) -> bool:
    return not fault.spent and (fault.call is None or fault.call == call)


def is_driver_holding(driver: DriverState, address: int) -> bool:
    """The driver holds a range based at `address`."""
    return address in driver.ranges


# -- accessors ---------------------------------------------------------------


def get_segment(registry: RegistryState, segment_id: int) -> Segment:
    # Verify the segment exists
    assert segment_id in registry.segments
    return registry.segments[segment_id]


def get_segments_in(registry: RegistryState, state: str) -> list[Segment]:
    return [s for s in registry.segments.values() if s.state == state]


def get_retained(registry: RegistryState) -> list[Segment]:
    return get_segments_in(registry, SEGMENT_RETAINED)


# -- pure helpers ------------------------------------------------------------


def compute_segment_address(segment_id: int) -> int:
    """The model address of a segment (the implementation uses its real mapping address)."""
    # Verify the id is not negative
    assert segment_id >= 0
    return ADDRESS_BASE + segment_id * ADDRESS_STRIDE


def compute_register_error(driver: DriverState, address: int, length: int) -> str | None:
    """What a real cudaHostRegister answers, with no fault planned; None on success."""
    if length <= 0 or address <= 0:
        return CUDA_ERROR_INVALID_VALUE
    for start, held in driver.ranges.items():
        if is_overlapping(address, length, start, held):
            return CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED
    return None


def compute_unregister_error(driver: DriverState, address: int) -> str | None:
    """What a real cudaHostUnregister answers, with no fault planned; None on success."""
    if address not in driver.ranges:
        return CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED
    return None


# -- driver transitions ------------------------------------------------------


def process_arm_fault(driver: DriverState, call: str | None, error: str, nth: int) -> None:
    """Plan a failure: the nth matching call from now (or every one) answers `error`."""
    # Verify the call is a driver call, the error is a failure and nth is 1.. or FAULT_EVERY
    assert call is None or call in DRIVER_CALLS
    assert error != CUDA_SUCCESS and error.startswith("cudaError")
    assert nth >= 0
    driver.faults.append(DriverFault(call=call, error=error, nth=nth))


def process_clear_faults(driver: DriverState) -> None:
    driver.faults.clear()


def process_fault_schedule(driver: DriverState, call: str) -> str | None:
    """Count one call against every matching fault; answer the first firing fault's error.

    Every matching fault counts the call, also when an earlier one fires.
    """
    # Verify the call is a driver call
    assert call in DRIVER_CALLS
    driver.calls += 1
    injected: str | None = None
    for fault in driver.faults:
        if not is_fault_matching(fault, call):
            continue
        fault.seen += 1
        fires = fault.nth == FAULT_EVERY or fault.seen == fault.nth
        if fires and fault.nth != FAULT_EVERY:
            fault.spent = True
        if fires and injected is None:
            injected = fault.error
    return injected


def process_host_register(driver: DriverState, address: int, length: int) -> str:
    """cudaHostRegister: answers CUDA_SUCCESS or an error name; an error changes no range."""
    injected = process_fault_schedule(driver, CALL_HOST_REGISTER)
    if injected is not None:
        return injected
    error = compute_register_error(driver, address, length)
    if error is not None:
        return error
    driver.ranges[address] = length
    return CUDA_SUCCESS


def process_host_unregister(driver: DriverState, address: int) -> str:
    """cudaHostUnregister: answers CUDA_SUCCESS or an error name; an error changes no range."""
    injected = process_fault_schedule(driver, CALL_HOST_UNREGISTER)
    if injected is not None:
        return injected
    error = compute_unregister_error(driver, address)
    if error is not None:
        return error
    del driver.ranges[address]
    return CUDA_SUCCESS


def process_copy_to_host(driver: DriverState) -> str:
    """A device-to-host copy issued on the transfer stream."""
    return process_fault_schedule(driver, CALL_COPY_TO_HOST) or CUDA_SUCCESS


def process_synchronize(driver: DriverState) -> str:
    """Wait for the transfer stream; copies are complete after CUDA_SUCCESS."""
    return process_fault_schedule(driver, CALL_SYNCHRONIZE) or CUDA_SUCCESS


# -- registry transitions ----------------------------------------------------


def initialize_registry(driver: DriverState | None = None) -> RegistryState:
    return RegistryState(driver=driver if driver is not None else DriverState())


def process_allocate(
    registry: RegistryState, length: int, os_error: str | None = None
) -> StepResult:
    """Create, size and map a new segment. `os_error` is the OS's answer when it fails.

    A failed allocation leaves nothing behind (no name, no mapping).
    """
    # Verify the length is a positive byte count
    assert length > 0
    if registry.closed:
        return StepResult(StepStatus.CLOSED)
    if registry.poisoned:
        return StepResult(StepStatus.REFUSED)
    if os_error is not None:
        return StepResult(StepStatus.FAILED, error=os_error)
    segment_id = registry.next_segment_id
    registry.next_segment_id += 1
    registry.segments[segment_id] = Segment(
        segment_id=segment_id,
        address=compute_segment_address(segment_id),
        length=length,
        state=SEGMENT_ALLOCATED,
    )
    return StepResult(StepStatus.OK, segment_id=segment_id)


def process_register(registry: RegistryState, segment_id: int) -> StepResult:
    """cudaHostRegister the segment's whole mapping."""
    segment = get_segment(registry, segment_id)
    # Verify the segment was just allocated
    assert segment.state == SEGMENT_ALLOCATED
    if registry.closed:
        return StepResult(StepStatus.CLOSED, segment_id=segment_id)
    if registry.poisoned:
        return StepResult(StepStatus.REFUSED, segment_id=segment_id)
    error = process_host_register(registry.driver, segment.address, segment.length)
    if error != CUDA_SUCCESS:
        return StepResult(StepStatus.FAILED, error=error, segment_id=segment_id)
    segment.registered = True
    segment.state = SEGMENT_REGISTERED
    return StepResult(StepStatus.OK, segment_id=segment_id)


def process_copy(registry: RegistryState, segment_id: int) -> StepResult:
    """Device-to-host copy into the registered mapping, then synchronize."""
    segment = get_segment(registry, segment_id)
    # Verify the segment is registered and holds no data yet
    assert segment.state == SEGMENT_REGISTERED and segment.registered
    error = process_copy_to_host(registry.driver)
    if error == CUDA_SUCCESS:
        error = process_synchronize(registry.driver)
    if error != CUDA_SUCCESS:
        return StepResult(StepStatus.FAILED, error=error, segment_id=segment_id)
    segment.state = SEGMENT_COPIED
    segment.copied = True
    return StepResult(StepStatus.OK, segment_id=segment_id)


def process_unregister(registry: RegistryState, segment_id: int) -> StepResult:
    """cudaHostUnregister, retried once. Bookkeeping is cleared only on success.

    After UNREGISTER_ATTEMPTS failures the segment is retained (mapping and
    name kept: the driver may still hold the pages) and the registry is
    poisoned. Answers the last error then.
    """
    segment = get_segment(registry, segment_id)
    # Verify the bookkeeping says registered and the segment is not retained already
    assert segment.registered and segment.state in (SEGMENT_REGISTERED, SEGMENT_COPIED)
    error = CUDA_SUCCESS
    for _ in range(UNREGISTER_ATTEMPTS):
        error = process_host_unregister(registry.driver, segment.address)
        if error == CUDA_SUCCESS:
            segment.registered = False
            segment.state = SEGMENT_UNREGISTERED
            return StepResult(StepStatus.OK, segment_id=segment_id)
    segment.state = SEGMENT_RETAINED
    registry.poisoned = True
    return StepResult(StepStatus.RETAINED, error=error, segment_id=segment_id)


def process_remove(registry: RegistryState, segment_id: int) -> None:
    """Unmap and unlink a segment that is not registered (a failed transfer's)."""
    segment = get_segment(registry, segment_id)
    # Verify the driver cannot hold it by our bookkeeping and it was never published
    assert not segment.registered
    assert segment.state in (SEGMENT_ALLOCATED, SEGMENT_UNREGISTERED)
    segment.state = SEGMENT_REMOVED
    segment.mapped = False
    segment.linked = False


def process_publish(registry: RegistryState, segment_ids: list[int]) -> None:
    """Hand every segment of a transfer to the receiver; the producer unmaps its side."""
    # Verify every segment went through the whole lifecycle up to unregistered, copy included
    assert all(get_segment(registry, s).state == SEGMENT_UNREGISTERED for s in segment_ids)
    assert all(get_segment(registry, s).copied for s in segment_ids)
    for segment_id in segment_ids:
        segment = registry.segments[segment_id]
        segment.state = SEGMENT_PUBLISHED
        segment.mapped = False


def process_receive(registry: RegistryState, segment_id: int) -> None:
    """The receiver mapped the segment and unlinked its name at once."""
    segment = get_segment(registry, segment_id)
    # Verify the segment is published and its name still exists
    assert segment.state == SEGMENT_PUBLISHED and segment.linked
    segment.linked = False


def process_out_of_band_unregister(registry: RegistryState, segment_id: int) -> str:
    """Someone else unregisters the segment's range behind the registry's back.

    The real-driver failure injection: the registry's own unregister then
    answers cudaErrorHostMemoryNotRegistered. Bookkeeping is not touched.
    """
    segment = get_segment(registry, segment_id)
    return process_host_unregister(registry.driver, segment.address)


def _abort(registry: RegistryState, segment_ids: list[int]) -> bool:
    """Unregister what is registered and remove the rest; answers whether it poisoned."""
    poisoned = False
    for segment_id in segment_ids:
        segment = registry.segments[segment_id]
        if segment.registered and segment.state != SEGMENT_RETAINED:
            result = process_unregister(registry, segment_id)
            poisoned = poisoned or result.status is StepStatus.RETAINED
    for segment_id in segment_ids:
        if registry.segments[segment_id].state in (SEGMENT_ALLOCATED, SEGMENT_UNREGISTERED):
            process_remove(registry, segment_id)
    return poisoned


def process_transfer(
    registry: RegistryState, lengths: list[int], os_errors: dict[int, str] | None = None
) -> TransferResult:
    """One multi-field transfer: every field through the lifecycle, all published or none.

    Fields are allocated, registered and copied in order; the first failure
    stops the forward pass. Then every registered field is unregistered
    (also after a failure). Only if every step succeeded are all fields
    published; otherwise everything not retained is removed. `os_errors`
    maps a field index to the OS error its allocation answers.
    """
    # Verify there is at least one field and every length is positive
    assert lengths and all(length > 0 for length in lengths)
    planned = os_errors or {}
    if registry.closed:
        return TransferResult(TransferStatus.CLOSED)
    if registry.poisoned:
        return TransferResult(TransferStatus.REFUSED)
    segment_ids: list[int] = []
    failure: StepResult | None = None
    failed_step: str | None = None
    for index, length in enumerate(lengths):
        allocated = process_allocate(registry, length, planned.get(index))
        if allocated.status is not StepStatus.OK:
            failure, failed_step = allocated, "allocate"
            break
        assert allocated.segment_id is not None
        segment_ids.append(allocated.segment_id)
        registered = process_register(registry, allocated.segment_id)
        if registered.status is not StepStatus.OK:
            failure, failed_step = registered, "register"
            break
        copied = process_copy(registry, allocated.segment_id)
        if copied.status is not StepStatus.OK:
            failure, failed_step = copied, "copy"
            break
    if failure is None:
        for segment_id in segment_ids:
            result = process_unregister(registry, segment_id)
            if result.status is not StepStatus.OK and failure is None:
                failure, failed_step = result, "unregister"
        if failure is None:
            process_publish(registry, segment_ids)
            return TransferResult(TransferStatus.PUBLISHED, tuple(segment_ids))
    assert failure is not None
    _abort(registry, segment_ids)
    status = TransferStatus.POISONED if registry.poisoned else TransferStatus.FAILED
    return TransferResult(status, tuple(segment_ids), error=failure.error, step=failed_step)


def process_close(registry: RegistryState) -> int:
    """Close the registry. Idempotent; answers how many segments stay retained.

    In order: a segment retained earlier gets one more unregister (on
    success it is removed); segments still registered are unregistered under
    the retry rule (which may retain them and poison the registry);
    allocated and unregistered segments are removed; names of published
    segments no receiver took are unlinked. A retained segment keeps its
    mapping for the life of the process, its name for orphan collection.
    """
    if registry.closed:
        return len(get_retained(registry))
    for segment in get_retained(registry):
        if process_host_unregister(registry.driver, segment.address) == CUDA_SUCCESS:
            segment.registered = False
            segment.state = SEGMENT_REMOVED
            segment.mapped = False
            segment.linked = False
    for segment in list(registry.segments.values()):
        if segment.state in (SEGMENT_REGISTERED, SEGMENT_COPIED):
            process_unregister(registry, segment.segment_id)
    for segment in list(registry.segments.values()):
        if segment.state in (SEGMENT_ALLOCATED, SEGMENT_UNREGISTERED):
            process_remove(registry, segment.segment_id)
        elif segment.state == SEGMENT_PUBLISHED:
            segment.linked = False
    registry.closed = True
    return len(get_retained(registry))


__all__ = [
    "CALL_COPY_TO_HOST",
    "CALL_HOST_REGISTER",
    "CALL_HOST_UNREGISTER",
    "CALL_SYNCHRONIZE",
    "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED",
    "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED",
    "CUDA_ERROR_INVALID_VALUE",
    "CUDA_ERROR_MEMORY_ALLOCATION",
    "CUDA_ERROR_UNKNOWN",
    "CUDA_SUCCESS",
    "DRIVER_CALLS",
    "FAULT_EVERY",
    "REGISTERED_STATES",
    "SEGMENT_ALLOCATED",
    "SEGMENT_COPIED",
    "SEGMENT_PUBLISHED",
    "SEGMENT_REGISTERED",
    "SEGMENT_REMOVED",
    "SEGMENT_RETAINED",
    "SEGMENT_STATES",
    "SEGMENT_UNREGISTERED",
    "UNREGISTER_ATTEMPTS",
    "DriverFault",
    "DriverState",
    "RegistryState",
    "Segment",
    "StepResult",
    "StepStatus",
    "TransferResult",
    "TransferStatus",
    "compute_register_error",
    "compute_segment_address",
    "compute_unregister_error",
    "get_retained",
    "get_segment",
    "get_segments_in",
    "initialize_registry",
    "is_driver_holding",
    "is_fault_matching",
    "is_overlapping",
    "process_allocate",
    "process_arm_fault",
    "process_clear_faults",
    "process_close",
    "process_copy",
    "process_copy_to_host",
    "process_fault_schedule",
    "process_host_register",
    "process_host_unregister",
    "process_out_of_band_unregister",
    "process_publish",
    "process_receive",
    "process_register",
    "process_remove",
    "process_synchronize",
    "process_transfer",
    "process_unregister",
]
