"""The errors impl raises with a fixed message, each raised here and read word for word.

A test that checks an error with `pytest.raises(..., match=...)` searches
its message for some words: a message changed around them ("XX...XX", what
mutmut makes of a string) passes it. These are the raises whose message is
one literal string (the f-string messages carry values, which other tests
read); `test_every_literal_message_of_impl_is_read_here` keeps the list
equal to impl's source.
"""

from __future__ import annotations

import ast
import dataclasses
import mmap
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

from shmring.impl import codec, extensions
from shmring.impl.errors import ConfigurationError, CorruptFrameError
from shmring.impl.futex import FutexWord
from shmring.impl.registered.cuda_driver import SimulatedCudaDriver
from shmring.impl.registered.registration import Registry
from shmring.impl.registered.transfer import TransferOptions, TransferSender
from shmring.impl.ring.borrow import BorrowedPayload, CollectedLease
from shmring.model_tests.log_messages import impl_directory
from shmring.spec.layout import (
    CODEC_HEADER_LENGTH_FIELD,
    CODEC_PREFIX_LENGTH,
    CODEC_REGION_ALIGNMENT,
    LITTLE_ENDIAN,
)

# Each literal message -> the test here that reads it, or why none does.
READ = {
    "empty payload": "test_an_empty_payload_is_refused_owned_or_borrowed",
    "bool leaf holds a byte other than 0 or 1": "test_a_bool_leaf_holding_another_byte_is_refused",
    "a type tag as a dict key": "test_a_type_tag_as_a_dict_key_is_refused",
    "the payload holds a PIL.Image.Image; install pillow to receive it": "reached only in a "
    "subprocess without pillow (test_conformance_wire_types.py checks its words)",
    "futex word is closed": "test_a_closed_futex_word_refuses_a_load",
    "pool reference names generation 0 (no publish has it)": "test_pool.py's forged "
    "references (a get of one; the message matched whole, anchored)",
    "the registered transfer path's CUDA driver": "MissingExtraError's feature: reached only "
    "where cuda-python is refused (test_base_install.py, in a subprocess)",
    "CudaRuntimeDriver needs a CUDA device: torch.cuda.is_available()=False": (
        "test_the_real_driver_without_a_device_says_so"
    ),
    "a transfer needs at least one field": "test_a_transfer_of_no_fields_is_refused",
    "no video frames in the MP4 data": "not reached: it needs an MP4 that holds no frame",
    "this lease ends when the last view of it dies, not by release()": (
        "test_a_collected_lease_refuses_release"
    ),
}


def literal_messages() -> set[str]:
    """The first argument of every `raise X("literal")` in impl."""
    found = set()
    for path in Path(impl_directory()).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call) and node.exc.args:
                first = node.exc.args[0]
                if isinstance(first, ast.Constant) and isinstance(first.value, str):
                    found.add(first.value)
    return found


def test_every_literal_message_of_impl_is_read_here() -> None:
    assert literal_messages() == set(READ)


def test_an_empty_payload_is_refused_owned_or_borrowed() -> None:
    with pytest.raises(CorruptFrameError) as owned:
        codec.decode(memoryview(b""))
    assert str(owned.value) == "corrupt payload: empty payload"
    keep = np.zeros(0, np.uint8)
    with pytest.raises(CorruptFrameError) as borrowed:
        codec.decode_borrowed(BorrowedPayload(keep, int(keep.ctypes.data), 0, label="test"))
    assert str(borrowed.value) == "corrupt payload: empty payload"


def test_a_bool_leaf_holding_another_byte_is_refused() -> None:
    encoded = bytearray(codec.encode({"a": np.array([True, False] * 10)}))
    encoded[encoded.rindex(1)] = 2  # the leaf's last True
    with pytest.raises(CorruptFrameError) as refused:
        codec.decode(memoryview(bytes(encoded)))
    assert str(refused.value) == "corrupt payload: bool leaf holds a byte other than 0 or 1"


def test_a_type_tag_as_a_dict_key_is_refused() -> None:
    """A registered type's tag where a dict key goes: no encoder writes it, a scribbler may."""

    @dataclasses.dataclass(frozen=True)
    class Point:
        x: int

    extensions.register_type(Point, lambda p: {"x": p.x}, lambda s: Point(**s), name="t.Point")
    try:
        # [[tag, state], 2] as the codec writes it; its tag is one Ext.
        written = codec.encode([Point(1), 2])
        assert codec.decode(memoryview(written)) == [Point(1), 2]
    finally:
        extensions.unregister_type(Point)
    length_format = LITTLE_ENDIAN + CODEC_HEADER_LENGTH_FIELD.format
    header_length = struct.unpack_from(length_format, written, CODEC_HEADER_LENGTH_FIELD.offset)[0]
    header = written[CODEC_PREFIX_LENGTH : CODEC_PREFIX_LENGTH + header_length]
    assert header[:2] == b"\x92\x92"  # a list of two, whose first item is a list of two
    tag = header[2 : header.index(b"\x81")]  # the Ext, up to the state's fixmap
    forged = b"\x81" + tag + b"\x02"  # {tag: 2}
    prefix = bytearray(written[:CODEC_PREFIX_LENGTH])
    struct.pack_into(length_format, prefix, CODEC_HEADER_LENGTH_FIELD.offset, len(forged))
    data = bytes(prefix) + forged
    data += bytes(-len(data) % CODEC_REGION_ALIGNMENT)
    with pytest.raises(CorruptFrameError) as refused:
        codec.decode(memoryview(data))
    assert str(refused.value) == "corrupt payload: a type tag as a dict key"


def test_a_closed_futex_word_refuses_a_load() -> None:
    mapping = mmap.mmap(-1, mmap.PAGESIZE)
    word = FutexWord(mapping, 0)
    assert word.load() == 0
    word.close()
    with pytest.raises(ValueError) as refused:
        word.load()
    assert str(refused.value) == "futex word is closed"
    mapping.close()


def test_a_transfer_of_no_fields_is_refused(scope: str) -> None:
    registry = Registry(scope, SimulatedCudaDriver())
    try:
        with pytest.raises(ValueError) as refused:
            registry.transfer([])
        assert str(refused.value) == "a transfer needs at least one field"
    finally:
        registry.close()
    options = TransferOptions(enable_registered_shm=True, enable_borrowed_frames=False)
    with TransferSender(scope, options, driver=SimulatedCudaDriver()) as sender:
        with pytest.raises(ValueError) as refused:
            sender.send({})
        assert str(refused.value) == "a transfer needs at least one field"


def test_a_collected_lease_refuses_release() -> None:
    keep = bytearray(4)
    lease = CollectedLease(keep, release=None)
    with pytest.raises(TypeError) as refused:
        lease.release()
    assert str(refused.value) == "this lease ends when the last view of it dies, not by release()"
    assert not lease.released  # refused: it still holds its memory


def test_the_real_driver_without_a_device_says_so() -> None:
    pytest.importorskip("cuda.bindings", reason="the message comes after cuda-python's import")
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: the driver is made")
    from shmring.impl.registered.cuda_driver import CudaRuntimeDriver

    with pytest.raises(ConfigurationError) as refused:
        CudaRuntimeDriver()
    assert str(refused.value) == (
        "CudaRuntimeDriver needs a CUDA device: torch.cuda.is_available()=False"
    )
