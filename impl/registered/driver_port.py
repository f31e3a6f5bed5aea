"""The CUDA driver port's interface, and the bookkeeping both drivers share.

`CudaDriver` is the port: what the transport needs from CUDA
(`shmring.impl.registered.cuda_driver` gives the design rationale and the
real driver, `shmring.impl.registered.simulated_driver` the simulated one).
Both drivers keep their transfer streams in `TransferStreams` (one per
source device), their registered ranges in `HostRanges`, count their copies
in `CopyStatistics`, and raise `driver_error`'s typed error for a failed
call. Everything here is re-exported by `cuda_driver`, where importers take
it.
"""

from __future__ import annotations

import abc
import bisect
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ...spec.registration import (
    CALL_COPY_TO_HOST,
    CALL_HOST_REGISTER,
    CALL_HOST_UNREGISTER,
    CALL_SYNCHRONIZE,
)
from ..errors import RegistrationError

if TYPE_CHECKING:
    import torch

# The runtime's name for each port call, used in error messages.
RUNTIME_NAMES = {
    CALL_HOST_REGISTER: "cudaHostRegister",
    CALL_HOST_UNREGISTER: "cudaHostUnregister",
    CALL_COPY_TO_HOST: "cudaMemcpyAsync (device to host)",
    CALL_SYNCHRONIZE: "cudaStreamSynchronize",
}


def driver_error(call: str, cuda_error: str | None, detail: str = "") -> RegistrationError:
    """The typed error a failed driver call raises; the message names the runtime call.

    `cuda_error=None` says the CUDA error name is unknown (torch gave text no
    runtime error string matches); the message says so rather than guess.
    """
    suffix = f" ({detail})" if detail else ""
    name = cuda_error if cuda_error is not None else "CUDA error name unknown"
    return RegistrationError(f"{RUNTIME_NAMES[call]} failed: {name}{suffix}", cuda_error)


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


__all__ = [
    "RUNTIME_NAMES",
    "CopyStatistics",
    "CudaDriver",
    "HostRanges",
    "TransferStreams",
    "driver_error",
    "is_registered_destination",
    "written_span",
]
