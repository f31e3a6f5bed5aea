"""The transfer API: options, path choice, dtype round trips, all-or-none."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import torch

from shmring.impl.errors import (
    ConfigurationError,
    CorruptFrameError,
    RegistrationError,
    StaleDescriptorError,
    UnsupportedPayloadError,
)
from shmring.impl.registered.cuda_driver import SimulatedCudaDriver
from shmring.impl.registered.transfer import (
    CARRIER_ARENA,
    CARRIER_SEGMENT,
    TransferDescriptor,
    TransferOptions,
    TransferReceiver,
    TransferSender,
    restore_tensor,
)
from shmring.impl.registered.views import lease_owner_of
from shmring.model_tests.registration_machine import transfer_files

REGISTERED = TransferOptions(
    enable_registered_shm=True, enable_borrowed_frames=True, arena_capacity=16384
)


@pytest.fixture
def driver() -> SimulatedCudaDriver:
    return SimulatedCudaDriver()


@pytest.fixture
def pair(
    scope: str, driver: SimulatedCudaDriver
) -> Iterator[tuple[TransferSender, TransferReceiver]]:
    sender = TransferSender(scope, REGISTERED, driver=driver)
    receiver = TransferReceiver(scope, REGISTERED)
    yield sender, receiver
    receiver.close()
    driver.clear_faults()
    sender.close()


def test_options_default_off_and_type_checked() -> None:
    options = TransferOptions()
    assert options.enable_registered_shm is False and options.enable_borrowed_frames is False
    for bad in (1, "yes", None, 1.0):
        with pytest.raises(ConfigurationError, match=repr(bad)):
            TransferOptions(enable_registered_shm=bad)  # type: ignore[arg-type]
        with pytest.raises(ConfigurationError, match=repr(bad)):
            TransferOptions(enable_borrowed_frames=bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="arena_capacity=True"):
        TransferOptions(arena_capacity=True)
    with pytest.raises(ConfigurationError, match="capacity=1000"):
        TransferOptions(arena_capacity=1000)
    with pytest.raises(ConfigurationError, match="options must be TransferOptions"):
        TransferSender("s", {"enable_registered_shm": True})  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="options must be TransferOptions"):
        TransferReceiver("s", {"enable_borrowed_frames": True})  # type: ignore[arg-type]
    assert isinstance(ConfigurationError("x"), ValueError)


def test_defaults_take_the_plain_copy_path(scope: str) -> None:
    with TransferSender(scope) as sender, TransferReceiver(scope) as receiver:
        descriptor = sender.send({"x": torch.arange(6, dtype=torch.int32)})
        assert not descriptor.registered
        assert sender.statistics().transfers_plain == 1 and sender.registry is None
        (array,) = receiver.receive(descriptor).values()
        assert array.tolist() == list(range(6))
        assert lease_owner_of(array) is None  # a copy, owned by the receiver
        assert transfer_files(sender.directory) == []


def test_cpu_tensors_without_a_host_capable_driver_take_the_plain_path(scope: str) -> None:
    class DeviceOnlyDriver(SimulatedCudaDriver):
        accepts_host_sources = False

    driver = DeviceOnlyDriver()
    with TransferSender(scope, REGISTERED, driver=driver) as sender:
        descriptor = sender.send({"x": torch.zeros(3)})
        assert not descriptor.registered and driver.statistics().calls == 0
        TransferReceiver(scope).receive(descriptor)


def test_bf16_travels_as_uint16_bits(
    pair: tuple[TransferSender, TransferReceiver], driver: SimulatedCudaDriver
) -> None:
    sender, receiver = pair
    special = torch.tensor(
        [0.0, -0.0, float("inf"), float("nan"), 1e-40, -3.5], dtype=torch.bfloat16
    )
    source = torch.cat([special, torch.randn(250).to(torch.bfloat16)]).reshape(4, 64)
    descriptor = sender.send({"x": source})
    field = descriptor.fields[0]
    assert (field.dtype, field.wire_dtype, field.nbytes) == (
        "bfloat16",
        "uint16",
        source.numel() * 2,
    )
    bits = receiver.receive(descriptor)["x"]
    assert bits.dtype == np.uint16 and bits.shape == (4, 64)
    assert np.array_equal(bits, source.view(torch.int16).numpy().view(np.uint16))
    restored = restore_tensor(bits, field.dtype)
    assert restored.dtype == torch.bfloat16
    assert torch.equal(
        restored.view(torch.int16), source.view(torch.int16)
    )  # bit-exact, NaN included
    assert restored.data_ptr() == bits.ctypes.data  # a view, not a widened copy


def test_every_dtype_round_trips_on_both_paths(scope: str, driver: SimulatedCudaDriver) -> None:
    fields = {
        "bool": torch.tensor([True, False, True]),
        "u8": torch.arange(5, dtype=torch.uint8),
        "i64": torch.arange(-3, 3, dtype=torch.int64).reshape(2, 3),
        "f16": torch.randn(4).half(),
        "f32": torch.randn(3, 2).t(),  # not contiguous
        "bf16": torch.randn(7).to(torch.bfloat16),
        "scalar": torch.tensor(2.5),
        "empty": torch.zeros(0, 3),
    }
    for options in (TransferOptions(), REGISTERED):
        with (
            TransferSender(scope, options, driver=driver) as sender,
            TransferReceiver(scope, options) as receiver,
        ):
            received = receiver.receive_tensors(sender.send(fields))
            for name, tensor in fields.items():
                got = received[name]
                assert got.dtype == tensor.dtype and got.shape == tensor.shape, name
                assert torch.equal(got, tensor) or (got.isnan() == tensor.isnan()).all(), name
            del received


def test_large_or_late_fields_take_segments_and_all_arrive(
    pair: tuple[TransferSender, TransferReceiver],
) -> None:
    sender, receiver = pair
    small = torch.full((1000,), 1, dtype=torch.uint8)
    large = torch.full((8000,), 2, dtype=torch.uint8)  # more than a quarter of the arena
    descriptor = sender.send({"small": small, "large": large})
    assert [f.carrier for f in descriptor.fields] == [CARRIER_ARENA, CARRIER_SEGMENT]
    views = receiver.receive(descriptor)
    assert views["small"].sum() == 1000 and views["large"].sum() == 16000
    # Keep frames borrowed until the arena is full: later fields take segments.
    descriptors = [sender.send({"x": small}) for _ in range(16)]  # 1056-byte frames, 16 KiB arena
    carriers = [d.fields[0].carrier for d in descriptors]
    assert carriers == [CARRIER_ARENA] * 14 + [CARRIER_SEGMENT] * 2, carriers
    held = [receiver.receive(d)["x"] for d in descriptors]
    assert all(h.sum() == 1000 for h in held)
    del views, held
    assert sender.send({"x": small}).fields[0].carrier == CARRIER_ARENA  # frames came back


def test_multi_field_failure_publishes_none(
    pair: tuple[TransferSender, TransferReceiver], driver: SimulatedCudaDriver
) -> None:
    sender, _ = pair
    arena_field = torch.ones(100, dtype=torch.uint8)
    segment_field = torch.ones(9000, dtype=torch.uint8)
    driver.fail("copy_to_host", "cudaErrorUnknown", nth=2)  # the segment's copy
    with pytest.raises(RegistrationError):
        sender.send({"a": arena_field, "b": segment_field})
    arena = sender.arena
    assert arena is not None and arena.head == 0  # the arena frame was not published
    assert transfer_files(sender.directory) == [arena.name]  # the segment was removed
    assert sender.registry is not None and not sender.registry.poisoned
    descriptor = sender.send({"a": arena_field, "b": segment_field})
    assert arena.head > 0 and len(descriptor.fields) == 2


def test_descriptor_round_trips_as_plain_data_and_is_validated(
    pair: tuple[TransferSender, TransferReceiver],
) -> None:
    sender, receiver = pair
    descriptor = sender.send({"x": torch.arange(4, dtype=torch.int16)})
    wire = descriptor.to_wire()
    assert TransferDescriptor.from_wire(wire) == descriptor
    bad = dict(wire, fields=[dict(wire["fields"][0], file="../../etc/passwd")])
    with pytest.raises(Exception, match="passwd"):
        TransferDescriptor.from_wire(bad)
    bad = dict(wire, fields=[dict(wire["fields"][0], nbytes=999)])
    with pytest.raises(CorruptFrameError, match="nbytes=999"):
        TransferDescriptor.from_wire(bad)
    receiver.receive(descriptor)


def test_unsupported_dtype_is_refused(pair: tuple[TransferSender, TransferReceiver]) -> None:
    sender, _ = pair
    with pytest.raises(UnsupportedPayloadError, match="complex64"):
        sender.send({"x": torch.zeros(2, dtype=torch.complex64)})


def test_an_arena_descriptor_received_twice_is_stale_not_corrupt(
    pair: tuple[TransferSender, TransferReceiver],
) -> None:
    # Like the ring's STALE: the frame was delivered once; the second receive takes nothing.
    sender, receiver = pair
    descriptor = sender.send({"x": torch.arange(4, dtype=torch.int16)})
    assert [field.carrier for field in descriptor.fields] == [CARRIER_ARENA]
    first = receiver.receive(descriptor)
    assert first["x"].tolist() == [0, 1, 2, 3]
    with pytest.raises(StaleDescriptorError, match="not published"):
        receiver.receive(descriptor)
