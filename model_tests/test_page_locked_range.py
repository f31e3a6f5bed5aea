"""A copy counts as page-locked only when the WHOLE range it writes is registered (issue 21).

The drivers' copy counters are the evidence that a transfer took the
asynchronous, registered way (`CopyStatistics.copies_into_page_locked`; the
benchmark's route checks read them). A destination whose first byte lies in
a registered range but whose tail runs past it is not page-locked memory: a
check of the base pointer alone (torch's `is_pinned`, the simulated driver's
old lookup) would count it.
"""

from __future__ import annotations

import contextlib
from types import SimpleNamespace
from typing import Any

import torch

from shmring.impl.registered.cuda_driver import (
    CudaRuntimeDriver,
    SimulatedCudaDriver,
    TransferStreams,
)

PAGE = 4096


def test_simulated_driver_counts_only_destinations_inside_registered_memory() -> None:
    driver = SimulatedCudaDriver()
    host = torch.zeros(4 * PAGE, dtype=torch.uint8)
    base = host.data_ptr()
    driver.host_register(base, PAGE)
    driver.host_register(base + PAGE, PAGE)  # adjacent: [base, base + 2 pages) is registered
    one_page = torch.ones(PAGE, dtype=torch.uint8)
    driver.copy_to_host(host[:PAGE], one_page)  # inside the first range
    driver.copy_to_host(host[PAGE // 2 : PAGE + PAGE // 2], one_page)  # across both: registered
    driver.copy_to_host(host[PAGE + PAGE // 2 : 2 * PAGE + PAGE // 2], one_page)  # tail past it
    driver.copy_to_host(host[3 * PAGE :], one_page)  # not registered at all
    assert driver.copy_statistics().copies_into_page_locked == 2
    driver.synchronize()
    stats = driver.statistics()
    assert stats.copies == 4 and stats.copies_into_registered == 2
    assert bool(host[: 2 * PAGE + PAGE // 2].all() and host[3 * PAGE :].all())  # all landed


def test_simulated_driver_checks_the_span_a_strided_destination_writes() -> None:
    driver = SimulatedCudaDriver()
    host = torch.zeros(4, PAGE, dtype=torch.uint8)
    driver.host_register(host.data_ptr(), 3 * PAGE)
    column = host[:, 0]  # four bytes, one page apart: the last lies in the fourth page
    driver.copy_to_host(column, torch.ones(4, dtype=torch.uint8))
    driver.copy_to_host(host[:3, 0], torch.ones(3, dtype=torch.uint8))
    driver.synchronize()
    assert driver.copy_statistics().copies_into_page_locked == 1


class _PinnedLookingDestination:
    """A host tensor as torch reports registered memory: pinned if its FIRST byte is."""

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor

    def is_pinned(self) -> bool:
        return True

    def data_ptr(self) -> int:
        return self.tensor.data_ptr()

    def element_size(self) -> int:
        return self.tensor.element_size()

    def stride(self) -> tuple[int, ...]:
        return self.tensor.stride()

    @property
    def shape(self) -> torch.Size:
        return self.tensor.shape

    def numel(self) -> int:
        return self.tensor.numel()

    def copy_(self, src: Any, non_blocking: bool = False) -> None:
        self.tensor.copy_(src)


class _Stream:
    def wait_stream(self, other: Any) -> None:
        pass

    def synchronize(self) -> None:
        pass


def test_real_driver_counts_only_destinations_inside_ranges_it_registered() -> None:
    """The real driver's code around its seams (no GPU here): torch's `is_pinned` says True
    for every destination below, as it does when the first byte is registered."""
    ok = object()
    runtime = SimpleNamespace(
        cudaError_t=SimpleNamespace(cudaSuccess=ok),
        cudaHostRegister=lambda address, length, flags: (ok,),
        cudaHostUnregister=lambda address: (ok,),
    )
    cuda = SimpleNamespace(
        current_stream=lambda device: None, stream=lambda stream: contextlib.nullcontext()
    )
    driver = object.__new__(CudaRuntimeDriver)  # no device here: build it around the seams
    driver._runtime = runtime
    driver._torch = SimpleNamespace(cuda=cuda)
    driver._device = "cuda:0"
    driver._flags = 0
    driver._streams = TransferStreams(lambda device: _Stream())
    driver._copies = driver._copies_pinned = 0
    host = torch.zeros(2 * PAGE, dtype=torch.uint8)
    source = torch.ones(PAGE, dtype=torch.uint8)
    driver.host_register(host.data_ptr(), PAGE)
    driver.copy_to_host(_PinnedLookingDestination(host[:PAGE]), source)  # type: ignore[arg-type]
    driver.copy_to_host(_PinnedLookingDestination(host[PAGE // 2 : PAGE + PAGE // 2]), source)  # type: ignore[arg-type]
    driver.host_unregister(host.data_ptr())
    driver.copy_to_host(_PinnedLookingDestination(host[:PAGE]), source)  # type: ignore[arg-type]
    stats = driver.copy_statistics()
    assert stats.copies_started == 3 and stats.copies_into_page_locked == 1
