"""The CUDA driver port's rules, on a CPU: streams per device, error names, fallbacks (issue 9).

Everything here runs without a GPU, through `SimulatedCudaDriver` or the
real driver's pure parts (its stream bookkeeping and its error-name table,
which cuda-python builds without a device). `test_cuda_real.py` checks the
same rules with the real driver on a GPU.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap
from typing import Any

import numpy as np
import pytest
import torch

from shmring.impl.errors import RegistrationError
from shmring.impl.registered.cuda_driver import (
    CUDA_ERROR_INSUFFICIENT_DRIVER,
    CUDA_PYTHON_REQUIREMENT,
    SimulatedCudaDriver,
    TransferStreams,
    driver_error,
    torch_cuda_error_name,
)
from shmring.impl.registered.host_copy import copy_to_host_or_gather, gather_through_host
from shmring.impl.registered.transfer import (
    CARRIER_SEGMENT,
    TransferOptions,
    TransferReceiver,
    TransferSender,
)
from shmring.spec.registration import (
    CALL_COPY_TO_HOST,
    CALL_HOST_REGISTER,
    CALL_SYNCHRONIZE,
    CUDA_ERROR_MEMORY_ALLOCATION,
)

REGISTERED = TransferOptions(
    enable_registered_shm=True, enable_borrowed_frames=False, arena_capacity=16384
)

# -- one transfer stream per source device ------------------------------------------------


class RecordingStream:
    """A stream that records whether it was waited for."""

    def __init__(self, device: Any) -> None:
        self.device = device
        self.synchronized = 0

    def synchronize(self) -> None:
        self.synchronized += 1


def test_each_source_device_gets_its_own_stream_and_synchronize_waits_for_all() -> None:
    """Issue 9: a copy from a second GPU runs on that GPU's stream; synchronize must wait for it."""
    streams = TransferStreams(RecordingStream)
    first = streams.stream_for("cuda:0")
    second = streams.stream_for("cuda:1")
    assert first is not second and streams.stream_for("cuda:1") is second
    assert (first.device, second.device) == ("cuda:0", "cuda:1")
    streams.synchronize()
    assert first.synchronized == 1 and second.synchronized == 1
    assert streams.pending() == []
    streams.stream_for("cuda:1")
    streams.synchronize()  # only streams used since the last synchronize are waited for
    assert first.synchronized == 1 and second.synchronized == 2


def test_a_stream_whose_synchronize_fails_stays_pending() -> None:
    class Failing(RecordingStream):
        fail = True

        def synchronize(self) -> None:
            if self.fail:
                raise RuntimeError("CUDA error: an illegal memory access was encountered")
            super().synchronize()

    streams = TransferStreams(Failing)
    streams.stream_for(0)
    streams.stream_for(1)
    with pytest.raises(RuntimeError):
        streams.synchronize()
    assert streams.pending() == [0, 1]
    Failing.fail = False
    streams.synchronize()
    assert streams.pending() == []


def test_simulated_copies_land_only_at_synchronize(scope: str) -> None:
    """The simulated copy is asynchronous as the real one: publish before synchronize is caught."""
    driver = SimulatedCudaDriver()
    dst = torch.zeros(16, dtype=torch.uint8)
    src = torch.arange(16, dtype=torch.uint8)
    driver.copy_to_host(dst, src)
    assert not dst.any() and driver.statistics().copies_pending == 1
    driver.synchronize()
    assert torch.equal(dst, src) and driver.statistics().copies == 1
    assert driver.copy_statistics().copies_started == 1
    assert driver.copy_statistics().streams == 1  # one device (cpu): one stream


def test_failed_synchronize_never_lands_the_copy() -> None:
    driver = SimulatedCudaDriver()
    dst = torch.zeros(8, dtype=torch.uint8)
    driver.copy_to_host(dst, torch.ones(8, dtype=torch.uint8))
    driver.fail_first(CALL_SYNCHRONIZE, "cudaErrorLaunchFailure")
    with pytest.raises(RegistrationError):
        driver.synchronize()
    driver.synchronize()
    assert not dst.any() and driver.statistics().copies_pending == 0


# -- cuda-python missing -------------------------------------------------------------------

_WITHOUT_CUDA_PYTHON = textwrap.dedent(
    """
    import importlib.abc, sys

    class HideCudaPython(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "cuda" or name.startswith("cuda."):
                raise ModuleNotFoundError(f"No module named {name!r} (hidden)", name=name)
            return None

    sys.meta_path.insert(0, HideCudaPython())
    from shmring.impl.registered.cuda_driver import CudaRuntimeDriver, load_runtime
    from shmring.impl.errors import ConfigurationError
    from shmring.impl.registered.transfer import TransferOptions, TransferSender

    for make in (load_runtime, CudaRuntimeDriver):
        try:
            make()
        except ConfigurationError as error:
            print("ConfigurationError:", error)
        except BaseException as error:
            print("WRONG:", type(error).__name__, error)
        else:
            print("WRONG: no error")
    print("modules:", sorted(m for m in sys.modules if m == "cuda" or m.startswith("cuda.")))
    """
)


def test_without_cuda_python_the_driver_is_a_configuration_error() -> None:
    """Issue 9: ModuleNotFoundError escaped from CudaRuntimeDriver on a machine without cuda-python."""
    done = subprocess.run(
        [sys.executable, "-c", _WITHOUT_CUDA_PYTHON],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 3, done.stdout + done.stderr
    for line in lines[:2]:
        assert line.startswith("ConfigurationError:"), line
        assert CUDA_PYTHON_REQUIREMENT in line
    assert lines[2] == "modules: []"


def test_pyproject_asks_for_the_cuda_python_that_has_bindings() -> None:
    import pathlib
    import tomllib

    root = pathlib.Path(__file__).resolve().parent.parent
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    assert CUDA_PYTHON_REQUIREMENT in project["optional-dependencies"]["cuda"]


# -- error names from torch's texts ----------------------------------------------------------


def test_torch_error_texts_map_to_runtime_names() -> None:
    runtime = pytest.importorskip("cuda.bindings.runtime")
    illegal = RuntimeError(
        "CUDA error: an illegal memory access was encountered\n"
        "CUDA kernel errors might be asynchronously reported at some other API call"
    )
    assert torch_cuda_error_name(illegal, runtime) == "cudaErrorIllegalAddress"
    launch = RuntimeError("CUDA error: unspecified launch failure")
    assert torch_cuda_error_name(launch, runtime) == "cudaErrorLaunchFailure"
    named = RuntimeError("CUDA driver error: cudaErrorNotReady: device not ready")
    assert torch_cuda_error_name(named, runtime) == "cudaErrorNotReady"
    allocator = torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.00 GiB")
    assert torch_cuda_error_name(allocator, runtime) == CUDA_ERROR_MEMORY_ALLOCATION


def test_an_unmatched_text_says_the_name_is_unknown() -> None:
    runtime = pytest.importorskip("cuda.bindings.runtime")
    name = torch_cuda_error_name(RuntimeError("CUDA error: something new"), runtime)
    assert name is None
    error = driver_error(CALL_COPY_TO_HOST, name, "CUDA error: something new")
    assert error.cuda_error is None
    assert "CUDA error name unknown" in str(error) and "cudaErrorUnknown" not in str(error)


# -- cudaErrorInsufficientDriver: the copying path, once, logged, counted ------------------------


def test_insufficient_driver_falls_back_to_the_copying_path_once(
    scope: str, caplog: pytest.LogCaptureFixture
) -> None:
    driver = SimulatedCudaDriver()
    driver.fail_every(CALL_HOST_REGISTER, CUDA_ERROR_INSUFFICIENT_DRIVER)
    caplog.set_level(logging.WARNING, logger="shmring.transfer")
    with (
        TransferSender(scope, REGISTERED, driver=driver) as sender,
        TransferReceiver(scope, REGISTERED) as receiver,
    ):
        for n in range(3):
            data = torch.full((1000,), n, dtype=torch.int32)
            descriptor = sender.send({"x": data})
            assert not descriptor.registered
            assert np.array_equal(receiver.receive(descriptor)["x"], data.numpy())
        stats = sender.statistics()
        assert stats.transfers_fell_back == 1 and stats.transfers_plain == 3
        assert stats.transfers_registered == 0
        assert stats.registered_disabled is not None
        assert CUDA_ERROR_INSUFFICIENT_DRIVER in stats.registered_disabled
        # The arena's and one segment's register were tried, then never again.
        assert driver.calls_of(CALL_HOST_REGISTER) == 2
        assert driver.registered_ranges() == {}
    warnings = [r for r in caplog.records if "registered transfer path off" in r.getMessage()]
    assert len(warnings) == 1 and CUDA_ERROR_INSUFFICIENT_DRIVER in warnings[0].getMessage()


def test_other_registration_failures_still_reach_the_caller(scope: str) -> None:
    driver = SimulatedCudaDriver()
    with TransferSender(scope, REGISTERED, driver=driver) as sender:
        driver.fail_first(CALL_COPY_TO_HOST, "cudaErrorLaunchFailure")
        with pytest.raises(RegistrationError, match="cudaErrorLaunchFailure"):
            sender.send({"x": torch.ones(100, dtype=torch.uint8)})
        assert sender.statistics().transfers_fell_back == 0
        assert sender.statistics().registered_disabled is None
        assert sender.send({"x": torch.ones(100, dtype=torch.uint8)}).registered


# -- a strided source whose device-side contiguous copy finds no memory ---------------------------


def test_strided_source_without_device_memory_takes_the_host_path(scope: str) -> None:
    driver = SimulatedCudaDriver()
    with (
        TransferSender(scope, REGISTERED, driver=driver) as sender,
        TransferReceiver(scope, REGISTERED) as receiver,
    ):
        source = torch.arange(64 * 48, dtype=torch.int16).reshape(64, 48).t()
        assert not source.is_contiguous()
        driver.fail_first(CALL_COPY_TO_HOST, CUDA_ERROR_MEMORY_ALLOCATION)
        descriptor = sender.send({"strided": source, "plain": torch.ones(7)})
        assert not descriptor.registered
        assert {f.carrier for f in descriptor.fields} == {CARRIER_SEGMENT}
        got = receiver.receive(descriptor)
        assert np.array_equal(got["strided"], source.numpy())
        stats = sender.statistics()
        assert stats.transfers_fell_back == 1 and stats.registered_disabled is None
        assert sender.send({"strided": source}).registered  # this transfer only
        assert driver.registered_ranges() == {
            sender.arena._range.address: sender.arena._range.length
        }  # type: ignore[union-attr]


def test_out_of_memory_with_contiguous_sources_reaches_the_caller(scope: str) -> None:
    driver = SimulatedCudaDriver()
    with TransferSender(scope, REGISTERED, driver=driver) as sender:
        driver.fail_first(CALL_COPY_TO_HOST, CUDA_ERROR_MEMORY_ALLOCATION)
        with pytest.raises(RegistrationError, match=CUDA_ERROR_MEMORY_ALLOCATION):
            sender.send({"x": torch.ones(100, dtype=torch.uint8)})


@pytest.mark.parametrize(
    "make",
    [
        lambda: torch.arange(24 * 16, dtype=torch.int32).reshape(24, 16).t(),
        lambda: torch.arange(1000, dtype=torch.float32)[3::7],
        lambda: torch.arange(2 * 3 * 4 * 5, dtype=torch.uint8).reshape(2, 3, 4, 5)[:, 1:, ::2, 3],
        lambda: torch.arange(5, dtype=torch.int64).reshape(5, 1).expand(5, 4),
        lambda: torch.arange(12, dtype=torch.float16).reshape(3, 4)[:, :0],
    ],
    ids=["transposed", "stepped", "sliced", "expanded", "empty"],
)
def test_host_gather_of_a_strided_source_equals_torch_copy(make: Any) -> None:
    source = make()
    dst = torch.full(source.shape, 99, dtype=source.dtype)
    gather_through_host(dst, source)
    assert torch.equal(dst, source)


class DeviceFullOnce:
    """A host destination whose first copy fails as torch's allocator does on a full GPU."""

    def __init__(self, like: torch.Tensor) -> None:
        self.tensor = torch.full(like.shape, 99, dtype=like.dtype)
        self.sources: list[torch.Tensor] = []

    def copy_(self, src: torch.Tensor) -> None:
        self.sources.append(src)
        if len(self.sources) == 1:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.50 KiB")
        self.tensor.copy_(src)


def test_a_strided_source_is_gathered_on_the_host_only_when_the_device_is_full() -> None:
    """The host gather copies the whole span a view covers (a column spans nearly the whole
    matrix): the copying path uses it only when the device-side copy finds no memory."""
    source = torch.arange(24 * 16, dtype=torch.int32).reshape(24, 16)[:, 3]
    dst = torch.empty(source.shape, dtype=source.dtype)
    recorded: list[torch.Tensor] = []
    copy_ = dst.copy_
    dst.copy_ = lambda src: (recorded.append(src), copy_(src))  # type: ignore[method-assign]
    copy_to_host_or_gather(dst, source)
    assert len(recorded) == 1 and recorded[0] is source  # copied as it is: no staged span
    full = DeviceFullOnce(source)
    copy_to_host_or_gather(full, source)  # type: ignore[arg-type]
    assert len(full.sources) == 2 and full.sources[1] is not source  # the gathered view
    assert torch.equal(full.tensor, source)
    with pytest.raises(torch.cuda.OutOfMemoryError):  # contiguous: nothing to gather
        copy_to_host_or_gather(DeviceFullOnce(source.contiguous()), source.contiguous())  # type: ignore[arg-type]


class FakeCudaStream:
    """What `CudaRuntimeDriver` asks of a torch CUDA stream, recorded."""

    def __init__(self, device: Any) -> None:
        self.device = device
        self.waited_for: list[Any] = []
        self.synchronized = 0

    def wait_stream(self, other: Any) -> None:
        self.waited_for.append(other)

    def synchronize(self) -> None:
        self.synchronized += 1


class FakeTorchCuda:
    """torch.cuda as far as the real driver's copy uses it: current streams and the stream context."""

    def __init__(self) -> None:
        self.current: list[Any] = []  # the stream context entered, in order

    def current_stream(self, device: Any) -> str:
        return f"current stream of {device}"

    def stream(self, stream: FakeCudaStream) -> Any:
        import contextlib

        self.current.append(stream)
        return contextlib.nullcontext()


class FakeSource:
    """A tensor on some device: only what the driver reads of it."""

    def __init__(self, device: str) -> None:
        self.device = device


class FakeDestination:
    """One registered byte at ADDRESS (the driver counts it page-locked only if registered)."""

    ADDRESS = 0x1000
    shape = (1,)

    def __init__(self) -> None:
        self.copied_from: list[tuple[Any, bool]] = []

    def data_ptr(self) -> int:
        return self.ADDRESS

    def stride(self) -> tuple[int, ...]:
        return (1,)

    def element_size(self) -> int:
        return 1

    def numel(self) -> int:
        return 1

    def is_pinned(self) -> bool:
        return True

    def copy_(self, src: Any, non_blocking: bool = False) -> None:
        self.copied_from.append((src, non_blocking))


def test_real_driver_copies_on_the_stream_of_the_source_device() -> None:
    """Issue 9, the real driver's code (torch behind its seam): a tensor from another GPU
    gets that GPU's stream, ordered after that GPU's current stream, and synchronize
    waits for both streams."""
    from types import SimpleNamespace

    from shmring.impl.registered.cuda_driver import CudaRuntimeDriver

    cuda = FakeTorchCuda()
    driver = object.__new__(CudaRuntimeDriver)  # no device here: build it around the seam
    driver._torch = SimpleNamespace(cuda=cuda)
    driver._runtime = None
    driver._device = "cuda:0"
    driver._streams = TransferStreams(FakeCudaStream)
    driver._copies = driver._copies_pinned = 0
    driver.registered.add(FakeDestination.ADDRESS, 1)
    dst = FakeDestination()
    driver.copy_to_host(dst, FakeSource("cuda:0"))  # type: ignore[arg-type]
    driver.copy_to_host(dst, FakeSource("cuda:1"))  # type: ignore[arg-type]
    first, second = driver.streams.existing("cuda:0"), driver.streams.existing("cuda:1")
    assert cuda.current == [first, second]  # each copy ran inside its device's stream
    assert first.waited_for == ["current stream of cuda:0"]
    assert second.waited_for == ["current stream of cuda:1"]
    assert [blocking for _, blocking in dst.copied_from] == [True, True]  # non_blocking
    driver.synchronize()
    assert first.synchronized == 1 and second.synchronized == 1
    stats = driver.copy_statistics()
    assert stats.copies_started == 2 == stats.copies_into_page_locked and stats.streams == 2
