"""The CUDA driver port: every CUDA call the registered transfer path makes, and the real driver.

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

Where the code is: the port itself and what both drivers keep
(`CudaDriver`, `TransferStreams`, `HostRanges`, `driver_error`) are
`shmring.impl.registered.driver_port`'s, the simulated driver
`shmring.impl.registered.simulated_driver`'s; this module holds the real
driver and re-exports both (see __all__), so importers take every driver
name from here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

from ...spec.registration import (
    CALL_COPY_TO_HOST,
    CALL_HOST_REGISTER,
    CALL_HOST_UNREGISTER,
    CALL_SYNCHRONIZE,
    CUDA_ERROR_MEMORY_ALLOCATION,
)
from ..errors import ConfigurationError, MissingExtraError

# The port and the simulated driver have their own modules; they are
# re-exported here (see __all__) for the importers, which take them from cuda_driver.
from .driver_port import (
    RUNTIME_NAMES,
    CopyStatistics,
    CudaDriver,
    HostRanges,
    TransferStreams,
    driver_error,
    is_registered_destination,
    written_span,
)
from .simulated_driver import (
    PlannedFault,
    SimulatedCudaDriver,
    SimulatedDriverStatistics,
    SimulatedStream,
)

if TYPE_CHECKING:
    import torch


# The driver is older than the runtime the bindings were built for: the
# registered path cannot work in this process, the copying path can.
CUDA_ERROR_INSUFFICIENT_DRIVER: Final = "cudaErrorInsufficientDriver"
# cuda.bindings appeared in cuda-python 12.6.1; older releases have only `cuda.cudart`.
CUDA_PYTHON_REQUIREMENT: Final = "cuda-python>=12.6.1"


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
