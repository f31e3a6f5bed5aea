"""Registration lifecycle: the simulated driver and the registry against `spec.registration`.

The machines (in `registration_machine`) inject a failure at every driver
call and at every allocation system call; the example tests below pin the
rules a reviewer checks first.
"""

from __future__ import annotations

import os

import pytest
import torch

from shmring.impl.errors import ClosedError, RegistrationError, RegistryPoisonedError
from shmring.impl.registered.cuda_driver import SimulatedCudaDriver
from shmring.impl.registered.registration import Registry
from shmring.impl.registered.views import copy_segment
from shmring.model_tests.registration_machine import (
    DriverMachine,
    RegistryMachine,
    profile,
    transfer_files,
)
from shmring.spec import registration as spec

DriverMachine.TestCase.settings = profile(max_examples=30, stateful_step_count=30)
RegistryMachine.TestCase.settings = profile(max_examples=40, stateful_step_count=30)

TestSimulatedDriverLockstep = DriverMachine.TestCase
TestRegistryLockstep = RegistryMachine.TestCase


@pytest.fixture
def driver() -> SimulatedCudaDriver:
    return SimulatedCudaDriver()


@pytest.fixture
def registry(scope: str, driver: SimulatedCudaDriver):
    registry = Registry(scope, driver)
    yield registry
    driver.clear_faults()
    registry.close()
    for entry in registry.retained():  # a test that poisons cleans up what is kept on purpose
        segment = next(s for s in registry.segments() if s.range is entry)
        segment.file.unmap()
        segment.file.unlink()
    registry._held.close()  # a poisoned registry stays a member of its scope: leave now
    if os.path.isdir(registry.directory):
        os.rmdir(registry.directory)


def test_simulated_driver_answers_real_error_names(driver: SimulatedCudaDriver) -> None:
    driver.host_register(0x10000, 8192)
    with pytest.raises(RegistrationError) as overlap:
        driver.host_register(0x11000, 4096)
    assert overlap.value.cuda_error == "cudaErrorHostMemoryAlreadyRegistered"
    with pytest.raises(RegistrationError) as unknown:
        driver.host_unregister(0x11000)
    assert unknown.value.cuda_error == "cudaErrorHostMemoryNotRegistered"
    with pytest.raises(RegistrationError) as empty:
        driver.host_register(0x40000, 0)
    assert empty.value.cuda_error == "cudaErrorInvalidValue"
    driver.host_register(0x12000, 4096)  # adjacent, not overlapping
    assert driver.registered_ranges() == {0x10000: 8192, 0x12000: 4096}


def test_simulated_driver_fails_first_nth_and_every(driver: SimulatedCudaDriver) -> None:
    driver.fail(spec.CALL_SYNCHRONIZE, "cudaErrorLaunchFailure", nth=2)
    driver.synchronize()
    with pytest.raises(RegistrationError, match="cudaErrorLaunchFailure"):
        driver.synchronize()
    driver.synchronize()  # an nth fault fires once
    driver.fail_every(spec.CALL_HOST_REGISTER)
    for address in (0x1000, 0x9000):
        with pytest.raises(RegistrationError):
            driver.host_register(address, 4096)
    assert driver.registered_ranges() == {}  # a failed call changes nothing
    driver.clear_faults()
    driver.fail_first(None, "cudaErrorUnknown")
    with pytest.raises(RegistrationError):
        driver.host_register(0x1000, 4096)
    driver.host_register(0x1000, 4096)


def test_failed_unregister_retains_mapping_and_poisons_registry(
    registry: Registry, driver: SimulatedCudaDriver
) -> None:
    driver.fail_every(spec.CALL_HOST_UNREGISTER, "cudaErrorUnknown")
    with pytest.raises(RegistryPoisonedError) as raised:
        registry.transfer([torch.arange(100, dtype=torch.uint8)])
    assert raised.value.cuda_error == "cudaErrorUnknown"
    assert driver.calls_of(spec.CALL_HOST_UNREGISTER) == spec.UNREGISTER_ATTEMPTS  # retried once
    (segment,) = registry.segments()
    assert segment.state == spec.SEGMENT_RETAINED
    assert segment.registered and segment.mapped and os.path.exists(segment.path)
    assert driver.is_registered(segment.address)
    # The retained mapping is still readable memory (not closed under the driver).
    assert bytes(segment.file.tensor[:100].numpy()) == bytes(range(100))
    with pytest.raises(RegistryPoisonedError, match="restart"):
        registry.transfer([torch.zeros(4, dtype=torch.uint8)])
    with pytest.raises(RegistryPoisonedError):
        registry.allocate(16)
    assert registry.statistics().poisoned and registry.statistics().segments_retained == 1


def test_retry_of_failed_unregister_succeeds_without_poison(
    registry: Registry, driver: SimulatedCudaDriver
) -> None:
    driver.fail_first(spec.CALL_HOST_UNREGISTER)
    (published,) = registry.transfer([torch.arange(10, dtype=torch.uint8)])
    assert not registry.poisoned
    assert registry.statistics().unregister_retries == 1
    assert driver.registered_ranges() == {}
    data = copy_segment(registry.directory, published.name, "uint8", (10,))
    assert data.tolist() == list(range(10))


@pytest.mark.parametrize(
    "call", [spec.CALL_HOST_REGISTER, spec.CALL_COPY_TO_HOST, spec.CALL_SYNCHRONIZE]
)
def test_register_or_copy_failure_removes_segment(
    registry: Registry, driver: SimulatedCudaDriver, call: str
) -> None:
    driver.fail_first(call, "cudaErrorMemoryAllocation")
    with pytest.raises(RegistrationError) as raised:
        registry.transfer([torch.ones(64, dtype=torch.uint8)])
    assert not isinstance(raised.value, RegistryPoisonedError)
    assert raised.value.cuda_error == "cudaErrorMemoryAllocation"
    assert registry.segments() == []
    assert driver.registered_ranges() == {}
    assert transfer_files(registry.directory) == []


def test_multi_field_transfer_publishes_all_or_none(
    registry: Registry, driver: SimulatedCudaDriver
) -> None:
    driver.fail(spec.CALL_COPY_TO_HOST, "cudaErrorUnknown", nth=3)
    fields = [torch.full((32,), i, dtype=torch.uint8) for i in range(3)]
    with pytest.raises(RegistrationError):
        registry.transfer(fields)
    assert transfer_files(registry.directory) == []  # the first two fields were removed too
    assert registry.statistics().segments_published == 0
    published = registry.transfer(fields)
    assert [copy_segment(registry.directory, p.name, "uint8", (32,))[0] for p in published] == [
        0,
        1,
        2,
    ]


def test_out_of_band_unregister_makes_own_unregister_fail_and_poison(
    registry: Registry, driver: SimulatedCudaDriver
) -> None:
    segment = registry.allocate(4096)
    registry.register(segment)
    registry.copy(segment, torch.zeros(4096, dtype=torch.uint8))
    driver.host_unregister(segment.address)  # someone else, behind the registry's back
    with pytest.raises(RegistryPoisonedError) as raised:
        registry.unregister(segment)
    assert raised.value.cuda_error == "cudaErrorHostMemoryNotRegistered"
    assert segment.state == spec.SEGMENT_RETAINED and segment.mapped


def test_closed_registry_refuses(registry: Registry) -> None:
    registry.close()
    with pytest.raises(ClosedError):
        registry.transfer([torch.zeros(1, dtype=torch.uint8)])


def test_close_unlinks_names_no_receiver_took(registry: Registry) -> None:
    registry.transfer([torch.zeros(8, dtype=torch.uint8)])
    assert len(transfer_files(registry.directory)) == 1
    directory = registry.directory
    registry.close()
    assert not os.path.exists(directory)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-device answers")
def test_runtime_driver_without_a_device_fails_clearly() -> None:
    """The real driver's calls are well formed and their failures typed, also with no GPU."""
    import ctypes
    import mmap

    from cuda.bindings import runtime

    from shmring.impl.errors import ConfigurationError
    from shmring.impl.registered.cuda_driver import CudaRuntimeDriver, default_driver

    assert default_driver() is None
    with pytest.raises(ConfigurationError, match="is_available"):
        CudaRuntimeDriver()
    driver = object.__new__(CudaRuntimeDriver)  # skip the device check to reach the runtime
    driver._runtime = runtime
    driver._flags = runtime.cudaHostRegisterDefault
    buffer = mmap.mmap(-1, 2 * mmap.PAGESIZE)
    anchor = ctypes.c_char.from_buffer(buffer)
    address = ctypes.addressof(anchor)
    try:
        for call in (
            lambda: driver.host_register(address, mmap.PAGESIZE),
            lambda: driver.host_unregister(address),
        ):
            with pytest.raises(RegistrationError) as raised:
                call()
            assert raised.value.cuda_error is not None and raised.value.cuda_error.startswith(
                "cudaError"
            )
            assert raised.value.cuda_error != "cudaErrorUnknown"
    finally:
        del anchor
        buffer.close()
