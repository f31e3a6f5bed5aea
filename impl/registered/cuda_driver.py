"""The CUDA driver port: every CUDA call the registered transfer path makes.

Design rationale. Fault plans must reach each CUDA call (register,
unregister, the device-to-host copy, the stream synchronize) without
patching cuda-python or torch, and the path must be fully exercised on a
machine without a GPU. So the transport talks to CUDA only through a
`CudaDriver` object, the CUDA twin of `os_seam.OsFacade`:

* `CudaRuntimeDriver` is the real one, on cuda-python's runtime bindings
  (`cuda.bindings.runtime`, imported when a driver is made, so this module
  loads without cuda-python; a missing one is a `MissingExtraError` naming the `cuda` extra) plus
  torch for the copy, on one transfer stream per source device. A failed
  call raises `RegistrationError` carrying the CUDA error name
  (`cudaErrorHostMemoryNotRegistered`, ...); where torch reports a failure
  only as text, the name is looked up from the runtime's own error strings,
  and where none matches the error says the name is unknown
  (`cuda_error=None`) instead of guessing.
* `SimulatedCudaDriver` keeps the registered ranges itself and answers like
  the real driver (overlap -> `cudaErrorHostMemoryAlreadyRegistered`, unknown
  base -> `cudaErrorHostMemoryNotRegistered`, empty -> `cudaErrorInvalidValue`),
  copies with torch on the CPU, and can be told to fail any call: the first,
  the nth, or every matching one. Its copies are asynchronous like the real
  ones: queued on the source device's stream, they land at `synchronize`, so
  a caller that publishes before synchronizing is caught on a CPU too. It
  follows the driver part of `shmring.spec.registration` (a lockstep test
  checks it), and the same test runs against the real driver on a GPU.

Calls are named by the constants of `shmring.spec.registration`
(`CALL_HOST_REGISTER`, ...), which fault plans use too.
"""

from __future__ import annotations

import abc
import bisect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from ...spec.registration import (
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
    DRIVER_CALLS,
    FAULT_EVERY,
)
from ..errors import ConfigurationError, MissingExtraError, RegistrationError

if TYPE_CHECKING:
    import torch

# The runtime's name for each port call, used in error messages.
RUNTIME_NAMES = {
    CALL_HOST_REGISTER: "cudaHostRegister",
    CALL_HOST_UNREGISTER: "cudaHostUnregister",
    CALL_COPY_TO_HOST: "cudaMemcpyAsync (device to host)",
    CALL_SYNCHRONIZE: "cudaStreamSynchronize",
}


# The driver is older than the runtime the bindings were built for: the
# registered path cannot work in this process, the copying path can.
CUDA_ERROR_INSUFFICIENT_DRIVER: Final = "cudaErrorInsufficientDriver"
# cuda.bindings appeared in cuda-python 12.6.1; older releases have only `cuda.cudart`.
CUDA_PYTHON_REQUIREMENT: Final = "cuda-python>=12.6.1"


def driver_error(call: str, cuda_error: str | None, detail: str = "") -> RegistrationError:
    """The typed error a failed driver call raises; the message names the runtime call.

    `cuda_error=None` says the CUDA error name is unknown (torch gave text no
    runtime error string matches); the message says so rather than guess.
    """
    suffix = f" ({detail})" if detail else ""
    name = cuda_error if cuda_error is not None else "CUDA error name unknown"
    return RegistrationError(f"{RUNTIME_NAMES[call]} failed: {name}{suffix}", cuda_error)


def load_runtime() -> Any:
    """`cuda.bindings.runtime`, or MissingExtraError (a ConfigurationError) naming the `cuda` extra."""
    try:
        from cuda.bindings import runtime
    except ImportError as error:
        raise MissingExtraError(
            "the registered transfer path's CUDA driver",
            f"{CUDA_PYTHON_REQUIREMENT} (cuda.bindings)",
            "cuda",
            f"{type(error).__name__}: {error}",
        ) from error
    return runtime


class TransferStreams:
    """One transfer stream per source device, and the ones used since the last synchronize.

    torch runs a device-to-host copy on a stream of the *source's* device, so
    a copy from a second GPU on the first GPU's stream would not be ordered
    by that stream: `synchronize` would return, and the mapping be
    unregistered and published, while the DMA still writes. So every device
    gets its own stream, made on first use, and `synchronize` waits for every
    stream a copy went to. Both drivers keep their streams here.
    """

    def __init__(self, make_stream: Callable[[Any], Any]) -> None:
        self._make_stream = make_stream
        self._streams: dict[Any, Any] = {}  # device -> its transfer stream
        self._pending: list[Any] = []  # devices with copies since the last synchronize, in order

    def stream_for(self, device: Any) -> Any:
        """The transfer stream of `device` (made on first use); it now counts as pending."""
        stream = self._streams.get(device)
        if stream is None:
            stream = self._streams[device] = self._make_stream(device)
        if device not in self._pending:
            self._pending.append(device)
        return stream

    def existing(self, device: Any) -> Any:
        """The transfer stream `device` already has (KeyError if none); changes nothing."""
        return self._streams[device]

    def devices(self) -> list[Any]:
        """Every device that has a transfer stream."""
        return list(self._streams)

    def pending(self) -> list[Any]:
        """The devices whose streams took a copy since the last complete synchronize."""
        return list(self._pending)

    def synchronize(self) -> None:
        """Wait for every pending stream; one that raises stays pending (and so do the rest)."""
        while self._pending:
            self._streams[self._pending[0]].synchronize()
            self._pending.pop(0)


class HostRanges:
    """Host ranges registered now (never overlapping), by base address.

    A copy is into page-locked memory only if EVERY byte it writes lies in a
    registered range (`covers`): torch's `is_pinned` and a lookup of the base
    pointer alone say yes for a destination whose tail runs past its range.
    """

    def __init__(self) -> None:
        self._starts: list[int] = []  # sorted base addresses
        self._lengths: dict[int, int] = {}

    def add(self, address: int, length: int) -> None:
        bisect.insort(self._starts, address)
        self._lengths[address] = length

    def remove(self, address: int) -> None:
        self._starts.remove(address)
        del self._lengths[address]

    def __contains__(self, address: object) -> bool:
        """Whether a range is based at `address`."""
        return address in self._lengths

    def containing(self, address: int) -> int | None:
        """Base of the range containing `address`, if any."""
        index = bisect.bisect_right(self._starts, address) - 1
        if index >= 0:
            start = self._starts[index]
            if address < start + self._lengths[start]:
                return start
        return None

    def overlaps(self, address: int, length: int) -> bool:
        index = bisect.bisect_right(self._starts, address) - 1
        if index >= 0 and self._starts[index] + self._lengths[self._starts[index]] > address:
            return True
        following = index + 1
        return following < len(self._starts) and self._starts[following] < address + length

    def covers(self, address: int, length: int) -> bool:
        """Whether every byte of [address, address + length) lies in a range (adjacent ones chain)."""
        end = address + length
        while address < end:
            start = self.containing(address)
            if start is None:
                return False
            address = start + self._lengths[start]
        return True

    def items(self) -> dict[int, int]:
        return {start: self._lengths[start] for start in self._starts}


def written_span(dst: torch.Tensor) -> tuple[int, int]:
    """(address, length) of the bytes a copy into `dst` writes: its strided span, not its base alone."""
    if dst.numel() == 0:
        return dst.data_ptr(), 0
    last = sum((n - 1) * step for n, step in zip(dst.shape, dst.stride(), strict=True))
    return dst.data_ptr(), (last + 1) * dst.element_size()


def is_registered_destination(ranges: HostRanges, dst: torch.Tensor) -> bool:
    """Whether the whole span a copy into `dst` writes is registered (empty: nothing is written)."""
    address, length = written_span(dst)
    return length > 0 and ranges.covers(address, length)


@dataclass(frozen=True)
class CopyStatistics:
    """What a driver's copies did: the evidence that a transfer took the asynchronous, registered way."""

    copies_started: int  # copy_to_host calls that started a copy
    # Of those, copies whose whole destination span was page-locked (registered
    # through this driver, and still registered) when the copy started: only
    # these run asynchronously (a `non_blocking` copy into pageable memory is
    # synchronous) and at full speed.
    copies_into_page_locked: int
    streams: int  # transfer streams made so far (one per source device)


class CudaDriver(abc.ABC):
    """What the transport needs from CUDA. Every method raises `RegistrationError` on failure."""

    #: Whether `copy_to_host` takes CPU tensors as sources (only the simulation does).
    accepts_host_sources: bool = False

    @abc.abstractmethod
    def copy_statistics(self) -> CopyStatistics:
        """Counters of the copies made through this driver."""

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
    copy is a `non_blocking` `copy_` on the transfer stream of the source's
    device (`TransferStreams`), which first waits for that device's current
    stream, so the source is complete; the caller synchronizes (every stream
    used) before anything is published.
    """

    accepts_host_sources = False
    _streams: TransferStreams | None = None
    _registered: HostRanges | None = None

    def __init__(self, device: int | None = None, flags: int | None = None) -> None:
        import torch

        runtime = load_runtime()  # here, not at import: the module must load without cuda-python
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
        self._streams = TransferStreams(
            lambda dev: torch.cuda.Stream(device=dev)  # type: ignore[no-untyped-call]
        )
        self._streams.stream_for(self._device)  # the driver's own device first
        self._streams.synchronize()
        self._copies = 0
        self._copies_pinned = 0

    def copy_statistics(self) -> CopyStatistics:
        return CopyStatistics(
            copies_started=self._copies,
            copies_into_page_locked=self._copies_pinned,
            streams=len(self.streams.devices()),
        )

    @property
    def device(self) -> Any:
        """The device the driver was made for (copies from other devices get their own stream)."""
        return self._device

    @property
    def streams(self) -> TransferStreams:
        assert self._streams is not None
        return self._streams

    @property
    def registered(self) -> HostRanges:
        """The ranges this driver registered and has not unregistered (read by the copy counters)."""
        if self._registered is None:
            self._registered = HostRanges()
        return self._registered

    def _check(self, call: str, result: Any, detail: str) -> None:
        error = result[0] if isinstance(result, tuple) else result
        if error != self._runtime.cudaError_t.cudaSuccess:
            name = getattr(error, "name", None) or str(error)
            raise driver_error(call, name, detail)

    def host_register(self, address: int, length: int) -> None:
        result = self._runtime.cudaHostRegister(address, length, self._flags)
        self._check(CALL_HOST_REGISTER, result, f"address={address:#x} length={length}")
        self.registered.add(address, length)

    def host_unregister(self, address: int) -> None:
        # Whatever the answer, the range no longer counts as page-locked (a
        # failed unregister is retried or retained, never copied into again).
        if address in self.registered:
            self.registered.remove(address)
        result = self._runtime.cudaHostUnregister(address)
        self._check(CALL_HOST_UNREGISTER, result, f"address={address:#x}")

    def copy_to_host(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        torch = self._torch
        try:
            # The stream of the source's device: torch runs the copy there.
            stream = self.streams.stream_for(src.device)
            stream.wait_stream(torch.cuda.current_stream(src.device))
            # Page-locked: the whole span written lies in ranges this driver
            # registered, and torch (the runtime) agrees for its first byte; a
            # range unregistered out of band reads as not pinned.
            pinned = is_registered_destination(self.registered, dst) and dst.is_pinned()
            with torch.cuda.stream(stream):
                dst.copy_(src, non_blocking=True)
            self._copies += 1
            self._copies_pinned += int(pinned)
        except RuntimeError as exc:  # torch reports CUDA failures as RuntimeError subclasses
            name = torch_cuda_error_name(exc, self._runtime)
            raise driver_error(CALL_COPY_TO_HOST, name, str(exc)) from exc

    def synchronize(self) -> None:
        try:
            self.streams.synchronize()
        except RuntimeError as exc:
            name = torch_cuda_error_name(exc, self._runtime)
            raise driver_error(CALL_SYNCHRONIZE, name, str(exc)) from exc


_error_names_by_text: dict[str, str] | None = None


def runtime_error_names(runtime: Any) -> dict[str, str]:
    """The runtime's error string -> error name (`"out of memory"` -> `cudaErrorMemoryAllocation`).

    Built once from `cudaGetErrorString` (works without a device); a string
    two errors share maps to neither.
    """
    global _error_names_by_text
    if _error_names_by_text is None:
        names: dict[str, str | None] = {}
        for error in runtime.cudaError_t:
            result = runtime.cudaGetErrorString(error)
            text = result[1] if isinstance(result, tuple) else result
            text = text.decode() if isinstance(text, bytes) else str(text)
            names[text] = None if text in names else error.name
        _error_names_by_text = {t: n for t, n in names.items() if n is not None}
    return _error_names_by_text


def torch_cuda_error_name(exc: BaseException, runtime: Any | None) -> str | None:
    """The CUDA error name behind a torch RuntimeError, or None when it cannot be told.

    torch writes `CUDA error: <the runtime's error string>` (or `CUDA out of
    memory.` from its allocator), not the name: a name in the text wins, then
    the runtime's string table, then the allocator's wording.
    """
    text = str(exc)
    for word in text.replace(":", " ").split():
        if word.startswith("cudaError"):
            return word.rstrip(".,;)")
    for line in text.splitlines():
        _, marker, rest = line.partition("CUDA error: ")
        if marker and runtime is not None:
            name = runtime_error_names(runtime).get(rest.strip().rstrip("."))
            if name is not None:
                return name
    if type(exc).__name__ == "OutOfMemoryError" or "CUDA out of memory" in text:
        return CUDA_ERROR_MEMORY_ALLOCATION
    return None


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


def cuda_available() -> bool:
    """Whether torch sees a CUDA device (False on CPU-only builds)."""
    import torch

    return bool(torch.cuda.is_available())


def default_driver() -> CudaDriver | None:
    """The real driver when CUDA is available, else None (the plain copy path)."""
    return CudaRuntimeDriver() if cuda_available() else None


__all__ = [
    "RUNTIME_NAMES",
    "CUDA_ERROR_INSUFFICIENT_DRIVER",
    "CUDA_PYTHON_REQUIREMENT",
    "CopyStatistics",
    "CudaDriver",
    "CudaRuntimeDriver",
    "HostRanges",
    "PlannedFault",
    "SimulatedCudaDriver",
    "SimulatedDriverStatistics",
    "SimulatedStream",
    "TransferStreams",
    "cuda_available",
    "default_driver",
    "driver_error",
    "is_registered_destination",
    "load_runtime",
    "runtime_error_names",
    "torch_cuda_error_name",
    "written_span",
]
