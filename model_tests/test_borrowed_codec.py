"""The codec's borrowed decode (`codec.decode_borrowed`) against its owned decode.

Property: for any tree the codec takes, the borrowed decode answers the
same value as `codec.decode` (large bytes as equal read-only memoryviews,
large arrays as equal read-only views), and on damaged input it raises
`CorruptFrameError` or answers, never anything else, never out of bounds.
"""

from __future__ import annotations

import contextlib
import ctypes
import tracemalloc
from typing import Any

import msgspec
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from shmring.impl import codec
from shmring.impl.errors import CorruptFrameError
from shmring.impl.ring.borrow import BorrowedPayload

BIG = codec.BORROWED_BYTES_MIN


def _payload(encoded: bytes, shift: int = 5) -> tuple[BorrowedPayload, bytearray, list[int]]:
    """`encoded` in a buffer at an odd offset, lent as a payload whose release is counted."""
    buffer = bytearray(len(encoded) + 2 * shift)
    buffer[shift : shift + len(encoded)] = encoded
    keep = (ctypes.c_char * len(encoded)).from_buffer(buffer, shift)
    payload = BorrowedPayload(keep, ctypes.addressof(keep), len(encoded), label="test")
    released: list[int] = []
    payload.arm(lambda _keep: released.append(1))
    return payload, buffer, released


def _normal(value: Any) -> Any:
    """A comparable form: views and arrays as bytes / lists."""
    if isinstance(value, dict):
        return {
            (_normal(k) if isinstance(k, memoryview) else k): _normal(v) for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return [_normal(v) for v in value]
    if isinstance(value, memoryview):
        return bytes(value)
    if isinstance(value, np.ndarray):
        return ("nd", str(value.dtype), value.shape, value.tobytes())
    if isinstance(value, torch.Tensor):
        return ("t", str(value.dtype), tuple(value.shape), value.numpy().tobytes())
    return value


leaves = st.one_of(
    st.integers(-(2**63), 2**63 - 1),
    st.text(max_size=8),
    st.none(),
    st.binary(max_size=16),
    st.sampled_from((b"a" * BIG, b"b" * (BIG + 7), b"c" * (BIG - 1))),
    st.sampled_from((np.arange(BIG // 8, dtype=np.int64), np.ones(5, dtype=np.float32))),
    st.builds(lambda code: msgspec.msgpack.Ext(code, b"x"), st.integers(0, 127)),
)
trees = st.recursive(
    leaves,
    lambda children: st.one_of(
        st.lists(children, max_size=4), st.dictionaries(st.text(max_size=4), children, max_size=4)
    ),
    max_leaves=8,
)


@settings(max_examples=40, deadline=None)
@given(trees)
def test_borrowed_decode_answers_what_the_owned_decode_answers(tree: Any) -> None:
    encoded = codec.encode(tree)
    payload, _, released = _payload(encoded)
    borrowed = codec.decode_borrowed(payload)
    del payload
    assert _normal(borrowed) == _normal(codec.decode(encoded))
    del borrowed
    assert released == [1]  # the payload went back exactly once, after its last view


def test_large_leaves_are_views_and_small_ones_copies() -> None:
    tree = {
        "blob": b"z" * BIG,
        "tiny": b"t",
        "array": np.arange(BIG, dtype=np.uint8),
        "tensor": torch.arange(BIG // 4, dtype=torch.int32),
        "nested": [{"blob": b"y" * (2 * BIG)}],
    }
    payload, buffer, released = _payload(codec.encode(tree))
    value = codec.decode_borrowed(payload)
    del payload
    assert isinstance(value["blob"], memoryview) and value["blob"].readonly
    assert isinstance(value["nested"][0]["blob"], memoryview)
    assert isinstance(value["tiny"], bytes)
    assert not value["array"].flags.writeable
    assert torch.equal(value["tensor"], tree["tensor"])
    # A view reads the lent buffer itself: changing it shows through (nothing copied).
    start = bytes(buffer).index(b"z" * 16)
    buffer[start] = ord("Z")
    assert value["blob"][0] == ord("Z")
    del value
    assert released == [1]


@pytest.mark.parametrize("tree", [b"q" * (3 * BIG), [b"q" * (3 * BIG), 1]], ids=["bytes", "list"])
def test_large_bytes_in_a_plain_payload_are_views_copied_nowhere(tree: Any) -> None:
    payload, _, released = _payload(codec.encode(tree))
    tracemalloc.start()
    try:
        value = codec.decode_borrowed(payload)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    del payload
    assert peak < BIG  # nothing of the payload's size was allocated
    blob = value if isinstance(value, memoryview) else value[0]
    assert isinstance(blob, memoryview) and bytes(blob) == b"q" * (3 * BIG)
    del value, blob
    assert released == [1]


def test_a_plain_payload_that_uses_the_default_leaf_code_keeps_its_exts() -> None:
    tree = [msgspec.msgpack.Ext(codec.DEFAULT_LEAF_EXT_CODE, b"user"), b"w" * BIG]
    payload, _, _ = _payload(codec.encode(tree))
    value = codec.decode_borrowed(payload)
    assert value[0] == tree[0] and bytes(value[1]) == tree[1]


@settings(max_examples=100, deadline=None)
@given(st.data())
def test_damaged_payloads_raise_corrupt_frame_error_only(data: st.DataObject) -> None:
    tree = {"a": b"a" * BIG, "n": [1, 2, {"b": b"b" * BIG}], "x": np.arange(BIG // 8)}
    encoded = bytearray(codec.encode(tree))
    for _ in range(data.draw(st.integers(1, 4))):
        index = data.draw(st.integers(0, len(encoded) - 1))
        encoded[index] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(1, len(encoded)))
    payload, _, _ = _payload(bytes(encoded[:cut]))
    with contextlib.suppress(CorruptFrameError):
        codec.decode_borrowed(payload)


def test_a_forged_borrowed_bin_ext_on_the_wire_is_corrupt() -> None:
    # An Ext with the leaf code whose data starts like a borrowed-bin stand-in.
    forged = codec.encode({"a": np.arange(4), "f": b"f" * BIG})
    code = forged[2]  # the prefix's leaf ext code byte
    wire = msgspec.msgpack.encode(msgspec.msgpack.Ext(code, bytes((0xFD, 0, 0, 0, 0))))
    broken = bytearray(forged)
    position = bytes(broken).find(b"\xc6")  # the large bin's header
    assert position > 0
    with pytest.raises(CorruptFrameError):
        codec.decode(bytes(broken[:position]) + wire + bytes(broken[position:]))
    payload, _, _ = _payload(bytes(broken[:position]) + wire + bytes(broken[position:]))
    with pytest.raises(CorruptFrameError):
        codec.decode_borrowed(payload)


def test_a_claim_object_plugs_in_with_its_view_and_release() -> None:
    """The hook for byte holders other than the ring (the pool's claim: `.view`, `.release()`)."""
    from shmring.impl.connector.decoders import borrow_sized
    from shmring.impl.ring.borrow import BorrowedPayload

    def borrow_claimed(view: memoryview, release: Any, label: str = "") -> Any:
        # A claim object holding its bytes: the payload over them, its release armed.
        keep = np.frombuffer(view, np.uint8)
        payload = BorrowedPayload(keep, int(keep.ctypes.data), keep.nbytes, label=label)
        del keep
        payload.arm(lambda _keep: release())
        return borrow_sized(payload)

    class Claim:
        def __init__(self, data: bytes) -> None:
            self._buffer = bytearray(data)
            self.view = memoryview(self._buffer).toreadonly()
            self.releases = 0

        def release(self) -> None:
            self.releases += 1

    tree = {"blob": b"p" * BIG, "array": np.arange(BIG // 8)}
    claim = Claim(codec.encode(tree))
    size, value, lease = borrow_claimed(claim.view, claim.release, label="slot")
    assert size == len(claim.view) and lease() is not None and claim.releases == 0
    assert bytes(value["blob"]) == tree["blob"] and np.array_equal(value["array"], tree["array"])
    blob = value["blob"]
    del value
    assert claim.releases == 0  # a kept leaf holds the slot
    del blob
    assert claim.releases == 1 and lease() is None
    small = Claim(codec.encode({"n": 1}))
    assert borrow_claimed(small.view, small.release)[1] == {"n": 1}
    assert small.releases == 1  # nothing borrowed: given back at once
