"""The CUDA driver port: every CUDA call the registered transfer path makes.

Design rationale. Fault plans must reach each CUDA call (register,
unregister, the device-to-host copy, the stream synchronize) without
patching cuda-python or torch, and the path must be fully exercised on a
machine without a GPU. So the transport talks to CUDA only through a
`CudaDriver` object, the CUDA twin of `os_seam.OsFacade`:

* `CudaRuntimeDriver` is the real one, on cuda-python's runtime bindings
  (`cuda.bindings.runtime`, imported on first use) plus torch for the copy on
  a dedicated stream. A failed call raises `RegistrationError` carrying the
  CUDA error name (`cudaErrorHostMemoryNotRegistered`, ...).
* `SimulatedCudaDriver` keeps the registered ranges itself and answers like
  the real driver (overlap -> `cudaErrorHostMemoryAlreadyRegistered`, unknown
  base -> `cudaErrorHostMemoryNotRegistered`, empty -> `cudaErrorInvalidValue`),
  copies with torch on the CPU, and can be told to fail any call: the first,
  the nth, or every matching one. It follows the driver part of
  `shmring.spec.registration` (a lockstep test checks it), and the same test
  runs against the real driver on a GPU.

Calls are named by the constants of `shmring.spec.registration`
(`CALL_HOST_REGISTER`, ...), which fault plans use too.
"""

from __future__ import annotations

import abc
import bisect
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from shmring.impl.errors import ConfigurationError, RegistrationError
from shmring.spec.registration import (
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

if TYPE_CHECKING:
    import torch

# The runtime's name for each port call, used in error messages.
RUNTIME_NAMES = {
    CALL_HOST_REGISTER: "cudaHostRegister",
    CALL_HOST_UNREGISTER: "cudaHostUnregister",
    CALL_COPY_TO_HOST: "cudaMemcpyAsync (device to host)",
    CALL_SYNCHRONIZE: "cudaStreamSynchronize",
}


def driver_error(call: str, cuda_error: str, detail: str = "") -> RegistrationError:
    """The typed error a failed driver call raises; the message names the runtime call."""
    suffix = f" ({detail})" if detail else ""
    return RegistrationError(f"{RUNTIME_NAMES[call]} failed: {cuda_error}{suffix}", cuda_error)


class CudaDriver(abc.ABC):
    """What the transport needs from CUDA. Every method raises `RegistrationError` on failure."""

    #: Whether `copy_to_host` takes CPU tensors as sources (only the simulation does).
    accepts_host_sources: bool = False

    @abc.abstractmethod
    def host_register(self, address: int, length: int) -> None:
        """Page-lock [address, address + length) and make it visible to the device."""

    @abc.abstractmethod
    def host_unregister(self, address: int) -> None:
        """Undo `host_register` for the range based at `address`."""

    @abc.abstractmethod
    def copy_to_host(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        """Start copying `src` into the host tensor `dst` (same shape and dtype) on the transfer stream."""

    @abc.abstractmethod
    def synchronize(self) -> None:
        """Wait until every copy started on the transfer stream is complete."""


# -- the real driver -----------------------------------------------------------


class CudaRuntimeDriver(CudaDriver):
    """CUDA through cuda-python's runtime bindings, and torch for the copy.

    One runtime (the CUDA runtime API, sharing torch's primary context). The
    copy is a `non_blocking` `copy_` on a dedicated stream that first waits
    for the device's current stream, so the source is complete; the caller
    synchronizes before anything is published.
    """

    accepts_host_sources = False
    _stream: Any = None

    def __init__(self, device: int | None = None, flags: int | None = None) -> None:
        import torch
        from cuda.bindings import runtime  # imported here: the module must load without CUDA

        if not torch.cuda.is_available():
            raise ConfigurationError(
                "CudaRuntimeDriver needs a CUDA device: torch.cuda.is_available()=False"
            )
        self._runtime = runtime
        self._torch = torch
        self._device = torch.device(
            "cuda", torch.cuda.current_device() if device is None else device
        )
        self._flags = runtime.cudaHostRegisterDefault if flags is None else flags
        self._stream = torch.cuda.Stream(device=self._device)  # type: ignore[no-untyped-call]

    def _check(self, call: str, result: Any, detail: str) -> None:
        error = result[0] if isinstance(result, tuple) else result
        if error != self._runtime.cudaError_t.cudaSuccess:
            name = getattr(error, "name", None) or str(error)
            raise driver_error(call, name, detail)

    def host_register(self, address: int, length: int) -> None:
        result = self._runtime.cudaHostRegister(address, length, self._flags)
        self._check(CALL_HOST_REGISTER, result, f"address={address:#x} length={length}")

    def host_unregister(self, address: int) -> None:
        result = self._runtime.cudaHostUnregister(address)
        self._check(CALL_HOST_UNREGISTER, result, f"address={address:#x}")

    def copy_to_host(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        torch = self._torch
        try:
            self._stream.wait_stream(torch.cuda.current_stream(src.device))
            with torch.cuda.stream(self._stream):
                dst.copy_(src, non_blocking=True)
        except RuntimeError as exc:  # torch reports CUDA failures as RuntimeError subclasses
            raise driver_error(CALL_COPY_TO_HOST, _torch_cuda_error_name(exc), str(exc)) from exc

    def synchronize(self) -> None:
        try:
            self._stream.synchronize()
        except RuntimeError as exc:
            raise driver_error(CALL_SYNCHRONIZE, _torch_cuda_error_name(exc), str(exc)) from exc


def _torch_cuda_error_name(exc: BaseException) -> str:
    """torch puts the CUDA error text, not its name, in the message; keep a name if one is there."""
    for word in str(exc).replace(":", " ").split():
        if word.startswith("cudaError"):
            return word
    return CUDA_ERROR_UNKNOWN


# -- the simulated driver ------------------------------------------------------


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
    copies: int  # copies completed
    copies_into_registered: int  # of those, copies whose destination lay in a registered range
    injected_failures: int  # calls answered by a planned fault


@dataclass
class _Counters:
    calls: int = 0
    copies: int = 0
    copies_into_registered: int = 0
    injected_failures: int = 0
    per_call: dict[str, int] = field(default_factory=dict)


class SimulatedCudaDriver(CudaDriver):
    """A CUDA driver for machines without one.

    Keeps registered ranges (never overlapping) and answers error names as
    the real runtime does. `copy_to_host` copies with torch on the CPU and
    accepts CPU sources. Planned faults (`fail`, `fail_first`, `fail_every`)
    make a call raise the given error and change nothing.
    """

    accepts_host_sources = True

    def __init__(self) -> None:
        self._starts: list[int] = []  # sorted base addresses
        self._lengths: dict[int, int] = {}
        self._faults: list[PlannedFault] = []
        self._counters = _Counters()

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

    def _containing(self, address: int) -> int | None:
        """Base of the registered range containing `address`, if any."""
        index = bisect.bisect_right(self._starts, address) - 1
        if index >= 0:
            start = self._starts[index]
            if address < start + self._lengths[start]:
                return start
        return None

    def _overlaps(self, address: int, length: int) -> bool:
        index = bisect.bisect_right(self._starts, address) - 1
        if index >= 0 and self._starts[index] + self._lengths[self._starts[index]] > address:
            return True
        following = index + 1
        return following < len(self._starts) and self._starts[following] < address + length

    def host_register(self, address: int, length: int) -> None:
        self._enter(CALL_HOST_REGISTER)
        if length <= 0 or address <= 0:
            raise driver_error(
                CALL_HOST_REGISTER,
                CUDA_ERROR_INVALID_VALUE,
                f"address={address:#x} length={length}",
            )
        if self._overlaps(address, length):
            raise driver_error(
                CALL_HOST_REGISTER,
                CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED,
                f"address={address:#x} length={length}",
            )
        bisect.insort(self._starts, address)
        self._lengths[address] = length

    def host_unregister(self, address: int) -> None:
        self._enter(CALL_HOST_UNREGISTER)
        if address not in self._lengths:
            raise driver_error(
                CALL_HOST_UNREGISTER, CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED, f"address={address:#x}"
            )
        self._starts.remove(address)
        del self._lengths[address]

    def copy_to_host(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        self._enter(CALL_COPY_TO_HOST)
        if tuple(dst.shape) != tuple(src.shape) or dst.dtype != src.dtype:
            raise driver_error(
                CALL_COPY_TO_HOST,
                CUDA_ERROR_INVALID_VALUE,
                f"dst {tuple(dst.shape)} {dst.dtype} != src {tuple(src.shape)} {src.dtype}",
            )
        dst.copy_(src)
        self._counters.copies += 1
        if dst.numel() and self._containing(dst.data_ptr()) is not None:
            self._counters.copies_into_registered += 1

    def synchronize(self) -> None:
        self._enter(CALL_SYNCHRONIZE)

    # -- inspection ------------------------------------------------------------

    def registered_ranges(self) -> dict[int, int]:
        """Base address -> length of every range registered now."""
        return {start: self._lengths[start] for start in self._starts}

    def is_registered(self, address: int) -> bool:
        """Whether `address` lies inside a registered range."""
        return self._containing(address) is not None

    def calls_of(self, call: str) -> int:
        return self._counters.per_call.get(call, 0)

    def statistics(self) -> SimulatedDriverStatistics:
        return SimulatedDriverStatistics(
            calls=self._counters.calls,
            registered_ranges=len(self._starts),
            registered_bytes=sum(self._lengths.values()),
            copies=self._counters.copies,
            copies_into_registered=self._counters.copies_into_registered,
            injected_failures=self._counters.injected_failures,
        )


def cuda_available() -> bool:
    """Whether torch sees a CUDA device (False on CPU-only builds)."""
    import torch

    return bool(torch.cuda.is_available())


def default_driver() -> CudaDriver | None:
    """The real driver when CUDA is available, else None (the plain copy path)."""
    return CudaRuntimeDriver() if cuda_available() else None


__all__ = [
    "RUNTIME_NAMES",
    "CudaDriver",
    "CudaRuntimeDriver",
    "PlannedFault",
    "SimulatedCudaDriver",
    "SimulatedDriverStatistics",
    "cuda_available",
    "default_driver",
    "driver_error",
]
