"""The registered transfer path on a real GPU, with the real CUDA driver.

Every test here is marked `cuda` and skipped cleanly where
`torch.cuda.is_available()` is False (CI). `.ci/gpu_check` runs them on a GPU
machine. Failures are made for real: a range unregistered out of band makes
the transport's own unregister fail with cudaErrorHostMemoryNotRegistered.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import pytest
import torch

from shmring.impl.errors import RegistrationError, RegistryPoisonedError
from shmring.impl.registered.cuda_driver import CudaRuntimeDriver
from shmring.impl.registered.registration import Registry
from shmring.impl.registered.transfer import (
    CARRIER_ARENA,
    CARRIER_SEGMENT,
    TransferOptions,
    TransferReceiver,
    TransferSender,
)
from shmring.model_tests.registration_machine import DriverMachine, RegistryMachine, profile
from shmring.spec import registration as spec

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(
        not torch.cuda.is_available(),
        reason="needs a CUDA device (torch.cuda.is_available() is False)",
    ),
]


class RealDriverMachine(DriverMachine):
    driver_factory = CudaRuntimeDriver
    simulated = False
    device = "cuda"


class RealRegistryMachine(RegistryMachine):
    driver_factory = CudaRuntimeDriver
    simulated = False
    device = "cuda"


RealDriverMachine.TestCase.settings = profile(max_examples=15, stateful_step_count=25)
RealRegistryMachine.TestCase.settings = profile(max_examples=15, stateful_step_count=25)
TestRealDriverLockstep = RealDriverMachine.TestCase
TestRealRegistryLockstep = RealRegistryMachine.TestCase


@pytest.fixture
def registry(scope: str) -> Iterator[Registry]:
    registry = Registry(scope, CudaRuntimeDriver())
    yield registry
    registry.close()
    for segment in registry.segments():  # test-only cleanup of what poisoning keeps on purpose
        segment.file.unmap()
        segment.file.unlink()
    with contextlib.suppress(OSError):
        os.rmdir(registry.directory)


def test_registered_segment_is_pinned_until_unregistered(registry: Registry) -> None:
    segment = registry.allocate(1 << 20)
    assert not segment.file.tensor.is_pinned()
    registry.register(segment)
    assert segment.file.tensor.is_pinned()
    source = torch.arange(1 << 20, device="cuda", dtype=torch.int32).to(torch.uint8)
    registry.copy(segment, source)
    assert torch.equal(segment.file.tensor, source.cpu())
    registry.unregister(segment)
    assert not segment.file.tensor.is_pinned()
    registry.publish([segment])


def test_real_driver_error_names(registry: Registry) -> None:
    driver = registry.driver
    segment = registry.allocate(1 << 16)
    registry.register(segment)
    with pytest.raises(RegistrationError) as twice:
        driver.host_register(segment.address, segment.length)
    assert twice.value.cuda_error == spec.CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED
    registry.unregister(segment)
    with pytest.raises(RegistrationError) as unknown:
        driver.host_unregister(segment.address)
    assert unknown.value.cuda_error == spec.CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED
    registry.remove(segment)


def test_out_of_band_unregister_retains_mapping_and_poisons_registry(registry: Registry) -> None:
    segment = registry.allocate(1 << 16)
    registry.register(segment)
    registry.copy(segment, torch.ones(1 << 16, device="cuda", dtype=torch.uint8))
    registry.driver.host_unregister(segment.address)  # out of band: the real fault
    with pytest.raises(RegistryPoisonedError) as raised:
        registry.unregister(segment)
    assert raised.value.cuda_error == spec.CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED
    assert (
        segment.state == spec.SEGMENT_RETAINED and segment.mapped and os.path.exists(segment.path)
    )
    with pytest.raises(RegistryPoisonedError):
        registry.transfer([torch.ones(4, device="cuda", dtype=torch.uint8)])


def test_arena_unregister_failure_poisons_sender(scope: str) -> None:
    options = TransferOptions(enable_registered_shm=True, arena_capacity=1 << 20)
    sender = TransferSender(scope, options)
    sender.send({"x": torch.ones(1000, device="cuda", dtype=torch.uint8)})
    arena = sender.arena
    registry = sender.registry
    assert arena is not None and registry is not None
    path = os.path.join(sender.directory, arena.name)
    registry.driver.host_unregister(arena._range.address)  # type: ignore[union-attr]
    with pytest.raises(RegistryPoisonedError):
        sender.close()
    assert os.path.exists(path) and registry.poisoned
    # Test-only cleanup: the driver no longer holds it, so the file may go now.
    arena._release_file()
    with contextlib.suppress(OSError):
        os.rmdir(sender.directory)


def test_gpu_fields_arrive_through_arena_and_segments(scope: str) -> None:
    options = TransferOptions(
        enable_registered_shm=True, enable_borrowed_frames=True, arena_capacity=1 << 20
    )
    fields = {
        "small": torch.arange(1000, device="cuda", dtype=torch.int32),
        "large": torch.randn(512, 1024, device="cuda"),  # 2 MiB: more than a quarter of the arena
        "bf16": torch.randn(33, 7, device="cuda").to(torch.bfloat16),
        "strided": torch.randn(64, 64, device="cuda").t(),
    }
    with TransferSender(scope, options) as sender, TransferReceiver(scope, options) as receiver:
        descriptor = sender.send(fields)
        carriers = {f.name: f.carrier for f in descriptor.fields}
        assert carriers["small"] == CARRIER_ARENA and carriers["large"] == CARRIER_SEGMENT
        assert descriptor.registered and sender.driver is not None
        copies = sender.driver.copy_statistics()
        assert copies.copies_started == len(fields) == copies.copies_into_page_locked
        received = receiver.receive_tensors(descriptor)
        for name, tensor in fields.items():
            assert received[name].dtype == tensor.dtype
            assert torch.equal(received[name], tensor.cpu()), name
        del received


def sleep_cycles(milliseconds: float) -> int:
    """GPU clock cycles `torch.cuda._sleep` needs to keep a stream busy for about `milliseconds`."""
    probe = 10_000_000
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(probe)  # warm-up: the first launch pays for loading the kernel
    start.record()
    torch.cuda._sleep(probe)
    end.record()
    end.synchronize()
    return int(probe * milliseconds / max(start.elapsed_time(end), 1e-3))


@pytest.mark.parametrize("elements", [1 << 14, 1 << 20], ids=["arena", "segment"])
def test_copy_waits_for_work_queued_on_the_producer_stream(scope: str, elements: int) -> None:
    """Issue 9: the producer's stream is busy (~200 ms) when send starts, so a copy that
    did not wait for it would read the buffer before the last kernel wrote it."""
    options = TransferOptions(enable_registered_shm=True, arena_capacity=1 << 24)
    cycles = sleep_cycles(200.0)
    with TransferSender(scope, options) as sender, TransferReceiver(scope, options) as receiver:
        for _ in range(3):
            x = torch.zeros(elements, device="cuda")
            torch.cuda._sleep(cycles)  # the producer's stream: busy for ~200 ms ...
            x.fill_(50.0)  # ... then this write, queued behind it
            assert not torch.cuda.current_stream().query(), "the stream was not busy at send"
            descriptor = sender.send({"x": x})
            got = receiver.receive(descriptor)["x"]
            assert float(got.min()) == 50.0 and float(got.max()) == 50.0
        carriers = {f.carrier for f in descriptor.fields}
        assert carriers == {CARRIER_ARENA if elements < 1 << 16 else CARRIER_SEGMENT}


def test_registered_copy_is_asynchronous_and_page_locked(registry: Registry) -> None:
    """The copy returns before it is done (the host does not wait), into page-locked memory."""
    driver = registry.driver
    assert isinstance(driver, CudaRuntimeDriver)
    segment = registry.allocate(1 << 20)
    registry.register(segment)
    source = torch.zeros(1 << 20, device="cuda", dtype=torch.uint8)
    torch.cuda._sleep(sleep_cycles(100.0))
    source.fill_(7)
    before = driver.copy_statistics()
    driver.copy_to_host(segment.file.tensor, source)
    assert not driver.streams.existing(source.device).query()  # still queued: asynchronous
    driver.synchronize()
    assert driver.streams.existing(source.device).query()
    assert int(segment.file.tensor.min()) == 7 == int(segment.file.tensor.max())
    after = driver.copy_statistics()
    assert after.copies_started - before.copies_started == 1
    assert after.copies_into_page_locked - before.copies_into_page_locked == 1
    registry.copy(segment, source)  # and through the lifecycle, so the segment can go
    registry.unregister(segment)
    registry.publish([segment])


def test_gpu_video_pipeline_matches_cpu_encoding(scope: str) -> None:
    pytest.importorskip("av", reason="the video encoder needs PyAV")
    from shmring.impl.registered.video import encode_rgb_to_mp4  # PyAV costs only this test

    frames = torch.randint(0, 256, (4, 48, 64, 3), dtype=torch.uint8)
    options = TransferOptions(enable_registered_shm=True, enable_borrowed_frames=True)
    with TransferSender(scope, options) as sender, TransferReceiver(scope, options) as receiver:
        descriptor = sender.send({"frames": frames.cuda()})
        # The route (issue 21), as the benchmark checks it: registered, not the fallback,
        # one asynchronous copy into wholly registered memory.
        assert descriptor.registered and sender.driver is not None
        stats = sender.statistics()
        assert (stats.transfers_registered, stats.transfers_fell_back) == (1, 0)
        copies = sender.driver.copy_statistics()
        assert copies.copies_started == 1 == copies.copies_into_page_locked
        view = receiver.receive(descriptor)["frames"]
        assert encode_rgb_to_mp4(view) == encode_rgb_to_mp4(frames.numpy())
        del view
