"""The simulated CUDA driver: the driver port on a machine without a GPU, with planned faults.

`SimulatedCudaDriver` keeps the registered ranges itself and answers the
error names the real runtime does; its copies, with torch on the CPU, queue
on the source device's `SimulatedStream` and land at `synchronize`, as the
real ones do. `PlannedFault`s make a chosen call fail (the model's
`DriverFault`). The design rationale is `shmring.impl.registered.cuda_driver`'s,
which re-exports everything here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ...spec.registration import (
    CALL_COPY_TO_HOST,
    CALL_HOST_REGISTER,
    CALL_HOST_UNREGISTER,
    CALL_SYNCHRONIZE,
    CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED,
    CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED,
    CUDA_ERROR_INVALID_VALUE,
    CUDA_ERROR_UNKNOWN,
    CUDA_SUCCESS,
    DRIVER_CALLS,
    FAULT_EVERY,
)
from ..errors import ConfigurationError, RegistrationError
from .driver_port import (
    CopyStatistics,
    CudaDriver,
    HostRanges,
    TransferStreams,
    driver_error,
    is_registered_destination,
)

if TYPE_CHECKING:
    import torch


@dataclass
class PlannedFault:
    """A failure the simulated driver will answer (the model's `DriverFault`)."""

    call: str | None  # a port call name, or None for every call
    error: str  # the CUDA error name to answer
    nth: int  # 1 = the first matching call from now; FAULT_EVERY = every matching call
    seen: int = 0  # matching calls counted so far
    spent: bool = False  # an nth fault fires once


@dataclass(frozen=True)
class SimulatedDriverStatistics:
    """Counters of a `SimulatedCudaDriver`."""

    calls: int  # port calls made, failed ones included
    registered_ranges: int  # ranges registered now
    registered_bytes: int  # bytes in those ranges
    copies: int  # copies completed (landed at a synchronize)
    copies_into_registered: int  # of those, copies whose destination lay in a registered range
    copies_pending: int  # copies started and not yet synchronized
    streams: int  # transfer streams made (one per source device)
    injected_failures: int  # calls answered by a planned fault


@dataclass
class _Counters:
    calls: int = 0
    started: int = 0
    started_registered: int = 0
    copies: int = 0
    copies_into_registered: int = 0
    injected_failures: int = 0
    per_call: dict[str, int] = field(default_factory=dict)


class SimulatedStream:
    """A transfer stream of the simulated driver: copies queue here and land at `synchronize`."""

    def __init__(self, device: Any) -> None:
        self.device = device
        self.queued: list[tuple[torch.Tensor, torch.Tensor, bool]] = []  # (dst, src, registered)

    def synchronize(self) -> None:
        while self.queued:
            dst, src, _ = self.queued.pop(0)
            dst.copy_(src)


class SimulatedCudaDriver(CudaDriver):
    """A CUDA driver for machines without one.

    Keeps registered ranges (never overlapping) and answers error names as
    the real runtime does. `copy_to_host` accepts CPU sources and is
    asynchronous as the real one is: the copy is queued on the transfer
    stream of the source's device (`TransferStreams`) and lands, with torch on
    the CPU, when `synchronize` runs. Planned faults (`fail`, `fail_first`,
    `fail_every`) make a call raise the given error and change nothing.
    """

    accepts_host_sources = True

    def __init__(self) -> None:
        self._ranges = HostRanges()
        self._faults: list[PlannedFault] = []
        self._counters = _Counters()
        self.streams = TransferStreams(SimulatedStream)

    # -- fault planning ------------------------------------------------------

    def fail(self, call: str | None = None, error: str = CUDA_ERROR_UNKNOWN, nth: int = 1) -> None:
        """Make the nth matching call from now answer `error` (nth=FAULT_EVERY: every one)."""
        if call is not None and call not in DRIVER_CALLS:
            raise ConfigurationError(
                f"unknown driver call: call={call!r} (expected one of {DRIVER_CALLS})"
            )
        if error == CUDA_SUCCESS or not error.startswith("cudaError"):
            raise ConfigurationError(f"a fault must answer a CUDA error name: error={error!r}")
        if nth < 0:
            raise ConfigurationError(f"fault position must be >= 0: nth={nth}")
        self._faults.append(PlannedFault(call=call, error=error, nth=nth))

    def fail_first(self, call: str | None = None, error: str = CUDA_ERROR_UNKNOWN) -> None:
        self.fail(call, error, 1)

    def fail_every(self, call: str | None = None, error: str = CUDA_ERROR_UNKNOWN) -> None:
        self.fail(call, error, FAULT_EVERY)

    def clear_faults(self) -> None:
        self._faults.clear()

    def _enter(self, call: str) -> None:
        """Count the call against every matching fault; raise the first that fires."""
        self._counters.calls += 1
        self._counters.per_call[call] = self._counters.per_call.get(call, 0) + 1
        firing: str | None = None
        for fault in self._faults:
            if fault.spent or (fault.call is not None and fault.call != call):
                continue
            fault.seen += 1
            fires = fault.nth == FAULT_EVERY or fault.seen == fault.nth
            if fires and fault.nth != FAULT_EVERY:
                fault.spent = True
            if fires and firing is None:
                firing = fault.error
        if firing is not None:
            self._counters.injected_failures += 1
            raise driver_error(call, firing, "injected by SimulatedCudaDriver")

    # -- ranges --------------------------------------------------------------

    def host_register(self, address: int, length: int) -> None:
        self._enter(CALL_HOST_REGISTER)
        if length <= 0 or address <= 0:
            raise driver_error(
                CALL_HOST_REGISTER,
                CUDA_ERROR_INVALID_VALUE,
                f"address={address:#x} length={length}",
            )
        if self._ranges.overlaps(address, length):
            raise driver_error(
                CALL_HOST_REGISTER,
                CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED,
                f"address={address:#x} length={length}",
            )
        self._ranges.add(address, length)

    def host_unregister(self, address: int) -> None:
        self._enter(CALL_HOST_UNREGISTER)
        if address not in self._ranges:
            raise driver_error(
                CALL_HOST_UNREGISTER, CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED, f"address={address:#x}"
            )
        self._ranges.remove(address)

    def copy_to_host(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        self._enter(CALL_COPY_TO_HOST)
        if tuple(dst.shape) != tuple(src.shape) or dst.dtype != src.dtype:
            raise driver_error(
                CALL_COPY_TO_HOST,
                CUDA_ERROR_INVALID_VALUE,
                f"dst {tuple(dst.shape)} {dst.dtype} != src {tuple(src.shape)} {src.dtype}",
            )
        registered = is_registered_destination(self._ranges, dst)
        self.streams.stream_for(src.device).queued.append((dst, src, registered))
        self._counters.started += 1
        self._counters.started_registered += int(registered)

    def copy_statistics(self) -> CopyStatistics:
        return CopyStatistics(
            copies_started=self._counters.started,
            copies_into_page_locked=self._counters.started_registered,
            streams=len(self.streams.devices()),
        )

    def synchronize(self) -> None:
        try:
            self._enter(CALL_SYNCHRONIZE)
        except RegistrationError:
            # A failed synchronize leaves the destinations undefined: the
            # queued copies never land (and hold no view of the mapping).
            for device in self.streams.pending():
                self.streams.existing(device).queued.clear()
            raise
        for device in self.streams.pending():
            stream = self.streams.existing(device)
            self._counters.copies += len(stream.queued)
            self._counters.copies_into_registered += sum(1 for *_, r in stream.queued if r)
        self.streams.synchronize()

    # -- inspection ------------------------------------------------------------

    def registered_ranges(self) -> dict[int, int]:
        """Base address -> length of every range registered now."""
        return self._ranges.items()

    def is_registered(self, address: int) -> bool:
        """Whether `address` lies inside a registered range."""
        return self._ranges.containing(address) is not None

    def calls_of(self, call: str) -> int:
        return self._counters.per_call.get(call, 0)

    def statistics(self) -> SimulatedDriverStatistics:
        return SimulatedDriverStatistics(
            calls=self._counters.calls,
            registered_ranges=len(self._ranges.items()),
            registered_bytes=sum(self._ranges.items().values()),
            copies=self._counters.copies,
            copies_into_registered=self._counters.copies_into_registered,
            copies_pending=sum(
                len(self.streams.existing(d).queued) for d in self.streams.pending()
            ),
            streams=len(self.streams.devices()),
            injected_failures=self._counters.injected_failures,
        )


__all__ = [
    "PlannedFault",
    "SimulatedCudaDriver",
    "SimulatedDriverStatistics",
    "SimulatedStream",
]
