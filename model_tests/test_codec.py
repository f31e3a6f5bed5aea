"""The frames codec: what goes in comes back, owned, and bad bytes only ever give CorruptFrameError.

Each test names the claim it checks. Hypothesis example counts are small so
the suite stays fast; the active settings profile may raise them.
"""

from __future__ import annotations

import contextlib
import datetime
import mmap
import os
import struct
import subprocess
import sys
import threading
import warnings
from typing import Any

import msgspec
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from msgspec.msgpack import Ext

from shmring.impl import codec
from shmring.impl.codec import wire
from shmring.impl.errors import CorruptFrameError, UnsupportedPayloadError
from shmring.impl.extensions import register_type, unregister_type
from shmring.spec.layout import (
    CODEC_DESCRIPTOR_AREA_OFFSET,
    CODEC_DESCRIPTOR_AREA_START_OFFSET,
    CODEC_DESCRIPTOR_DIMENSIONS_OFFSET,
    CODEC_DESCRIPTOR_DTYPE_OFFSET,
    CODEC_DESCRIPTOR_FORMAT,
    CODEC_DESCRIPTOR_LENGTH,
    CODEC_DESCRIPTOR_NDIM_OFFSET,
    CODEC_DIMENSION_LENGTH,
    CODEC_HEADER_LENGTH_OFFSET,
    CODEC_LEAF_CODE_OFFSET,
    CODEC_PREFIX_FORMAT,
    CODEC_PREFIX_LENGTH,
    CODEC_SHARED_LENGTH_OFFSET,
    codec_descriptor_format,
    codec_dimensions_format,
)

FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

TORCH_DTYPES = [getattr(torch, name) for name in codec.TORCH_DTYPE_NAMES]
NUMPY_DTYPES = [np.dtype(name) for name in codec.NUMPY_DTYPE_NAMES]
SHAPES = [(), (0,), (7,), (2, 3, 4), (3, 0, 2), (1, 1, 1)]


# -- helpers ---------------------------------------------------------------------


def make_tensor(dtype: torch.dtype, shape: tuple[int, ...], seed: int) -> torch.Tensor:
    """Finite, reproducible values of any supported dtype (so torch.equal is meaningful)."""
    generator = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=generator).bool()
    if dtype.is_floating_point or dtype.is_complex:
        return (torch.randn(shape, generator=generator, dtype=torch.float64) * 100).to(dtype)
    info = torch.iinfo(dtype)
    return torch.randint(info.min, info.max, shape, generator=generator, dtype=torch.int64).to(
        dtype
    )


def relayout(tensor: torch.Tensor, layout: str) -> torch.Tensor:
    """The same logical values under another memory layout or view bit, where the shape allows."""
    if layout == "transposed" and tensor.dim() >= 2:
        return tensor.transpose(0, -1).contiguous().transpose(0, -1)
    if layout == "strided" and tensor.dim() >= 1:
        wide = torch.zeros((*tensor.shape[:-1], tensor.shape[-1] * 2), dtype=tensor.dtype)
        wide[..., ::2] = tensor
        return wide[..., ::2]
    if layout == "conj" and tensor.is_complex():
        return tensor.conj_physical().conj()
    if layout == "neg" and tensor.is_complex():
        return torch._neg_view(-tensor)
    if layout == "conj_imag" and tensor.is_complex():
        return tensor.conj().imag  # a real tensor with the neg bit set
    if layout == "requires_grad" and tensor.dtype.is_floating_point:
        return tensor.clone().requires_grad_(True)
    return tensor


def assert_same(decoded: Any, expected: Any) -> None:
    """Deep equality with the codec's documented type mapping (tuple->list, bytes-like->bytes)."""
    if isinstance(expected, torch.Tensor):
        assert isinstance(decoded, torch.Tensor), type(decoded)
        expected = expected.detach().resolve_conj().resolve_neg()
        assert decoded.dtype == expected.dtype
        assert decoded.shape == expected.shape
        assert not decoded.requires_grad
        assert torch.equal(decoded, expected)
    elif isinstance(expected, np.ndarray):
        assert type(decoded) is np.ndarray, type(decoded)
        assert decoded.dtype == expected.dtype.newbyteorder("=")
        assert decoded.shape == expected.shape
        assert decoded.flags.writeable  # the receiver owns it (issue 27)
        assert np.array_equal(decoded, expected)
    elif isinstance(expected, dict):
        assert type(decoded) is dict and list(decoded) == list(expected)
        for key in expected:
            assert_same(decoded[key], expected[key])
    elif isinstance(expected, (list, tuple)):
        assert type(decoded) is list and len(decoded) == len(expected)
        for got, want in zip(decoded, expected, strict=True):
            assert_same(got, want)
    elif isinstance(expected, (bytearray, memoryview)):
        assert decoded == bytes(expected) and type(decoded) is bytes
    else:
        assert type(decoded) is type(expected) and decoded == expected


def round_trip(obj: Any) -> Any:
    return codec.decode(codec.encode(obj))


def storage_of(tensor: torch.Tensor) -> tuple[int, int]:
    storage = tensor.untyped_storage()
    return storage.data_ptr(), storage.nbytes()


# -- layout ------------------------------------------------------------------------


def test_layout_formats_agree_with_the_chained_offsets():
    """spec.layout's struct formats cover exactly the fields its offsets name."""
    assert struct.calcsize(CODEC_PREFIX_FORMAT) == CODEC_PREFIX_LENGTH
    assert struct.calcsize(CODEC_DESCRIPTOR_FORMAT) == CODEC_DESCRIPTOR_LENGTH
    for ndim in (0, 1, 5, codec.MAX_NDIM):
        assert struct.calcsize(codec_dimensions_format(ndim)) == CODEC_DIMENSION_LENGTH * ndim
        assert struct.calcsize(codec_descriptor_format(ndim)) == (
            CODEC_DESCRIPTOR_DIMENSIONS_OFFSET + CODEC_DIMENSION_LENGTH * ndim
        )
    # A real descriptor, read field by field at the layout's offsets.
    data = bytearray(codec.encode([torch.zeros(2, 3, dtype=torch.int32)]))
    assert data[CODEC_LEAF_CODE_OFFSET] == codec.DEFAULT_LEAF_EXT_CODE
    at = first_descriptor_at(data)
    assert data[at + CODEC_DESCRIPTOR_NDIM_OFFSET] == 2
    dims = at + CODEC_DESCRIPTOR_DIMENSIONS_OFFSET
    assert struct.unpack_from(codec_dimensions_format(2), data, dims) == (2, 3)


# -- round trips -------------------------------------------------------------------


@FAST
@given(
    dtype=st.sampled_from(TORCH_DTYPES),
    shape=st.sampled_from(SHAPES),
    layout=st.sampled_from(
        ["contiguous", "transposed", "strided", "conj", "neg", "conj_imag", "requires_grad"]
    ),
    seed=st.integers(0, 2**16),
)
def test_every_torch_dtype_shape_and_layout_round_trips(dtype, shape, layout, seed):
    tensor = relayout(make_tensor(dtype, shape, seed), layout)
    decoded = round_trip({"t": tensor})["t"]
    assert_same(decoded, tensor)
    assert decoded.is_contiguous() and not decoded.is_conj() and not decoded.is_neg()


@pytest.mark.parametrize("dtype", TORCH_DTYPES, ids=str)
def test_every_torch_and_numpy_dtype_round_trips_in_every_shape(dtype):
    for shape in SHAPES:
        tensor = make_tensor(dtype, shape, 11)
        leaves: list[Any] = [tensor, relayout(tensor, "strided")]
        if dtype != torch.bfloat16:
            leaves += [tensor.numpy(), np.asfortranarray(tensor.numpy())]
        assert_same(round_trip(leaves), leaves)


@pytest.mark.parametrize("dtype", TORCH_DTYPES, ids=str)
@pytest.mark.parametrize("layout", ["contiguous", "transposed", "strided", "conj", "neg"])
def test_write_into_an_unaligned_buffer_round_trips_every_dtype(dtype, layout):
    # A ring payload starts right after a key of any length; torch must never
    # write a complex128 to an unaligned address (it faults).
    tensor = relayout(make_tensor(dtype, (3, 5), 7), layout)
    plan = codec.prepare([tensor, tensor])
    for shift in (1, 3, 8):
        buf = bytearray(plan.nbytes + shift)
        assert plan.write_into(memoryview(buf)[shift:]) == plan.nbytes
        decoded = codec.decode(memoryview(buf)[shift:])
        assert_same(decoded, [tensor, tensor])


@FAST
@given(
    dtype=st.sampled_from(NUMPY_DTYPES),
    shape=st.sampled_from(SHAPES),
    layout=st.sampled_from(["C", "F", "strided", "byteswapped"]),
    seed=st.integers(0, 2**16),
)
def test_numpy_arrays_round_trip_and_come_back_writeable(dtype, shape, layout, seed):
    array = make_tensor(getattr(torch, dtype.name), shape, seed).numpy()
    if layout == "F":
        array = np.asfortranarray(array)
    elif layout == "strided" and array.ndim:
        array = np.repeat(array, 2, axis=-1)[..., ::2]
    elif layout == "byteswapped" and dtype.itemsize > 1:
        array = array.astype(dtype.newbyteorder(">"))
    decoded = round_trip([array])[0]
    assert_same(decoded, array)
    assert decoded.flags.c_contiguous
    decoded[...] = 0  # the receiver owns it (issue 27): writing it touches nothing else
    assert not decoded.any()


def test_vllm_small_tree_round_trips():
    tree = {"codes": {"audio": torch.arange(28)}, "meta": {"finished": torch.tensor(False)}}
    assert_same(round_trip(tree), tree)


scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=20)
    | st.binary(max_size=40)
)
SMALL_LEAVES = [
    torch.arange(6).reshape(2, 3),
    torch.tensor(2.5, dtype=torch.bfloat16),
    torch.ones(3, 4, dtype=torch.complex64).conj(),
    torch.zeros(0, 5),
    np.arange(10, dtype=np.int16)[::3],
    np.array(True),
]
leaves = st.sampled_from(SMALL_LEAVES)
trees = st.recursive(
    scalars | leaves,
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(st.text(max_size=8) | st.integers(-5, 5), children, max_size=4)
    ),
    max_leaves=12,
)


@FAST
@given(tree=trees)
def test_trees_round_trip_and_nbytes_is_the_exact_encoded_length(tree):
    plan = codec.prepare(tree)
    encoded = codec.encode(tree)
    assert plan.nbytes == len(encoded)
    sentinel = 0xA5
    buf = bytearray([sentinel]) * (plan.nbytes + 32)
    assert plan.write_into(memoryview(buf)[16:]) == plan.nbytes
    assert buf[:16] == bytes([sentinel]) * 16 and buf[16 + plan.nbytes :] == bytes([sentinel]) * 16
    assert bytes(buf[16 : 16 + plan.nbytes]) == encoded  # deterministic, padding zeroed
    assert_same(codec.decode(encoded), tree)


@FAST
@given(
    tree=st.recursive(
        scalars,
        lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4),
        max_leaves=12,
    )
)
def test_tensor_free_payload_is_plain_msgpack(tree):
    assert codec.encode(tree) == msgspec.msgpack.encode(tree)
    assert codec.prepare(tree).leaf_count == 0


@pytest.mark.parametrize("kind", [bytes, bytearray, memoryview])
@pytest.mark.parametrize("size", [0, 100, codec.DIRECT_BYTES_MIN, 70_000])
def test_bytes_payload_is_plain_msgpack_and_comes_back_as_bytes(kind, size):
    data = bytes(range(256)) * (size // 256) + bytes(size % 256)
    payload = kind(data)
    assert codec.encode(payload) == msgspec.msgpack.encode(data)
    assert codec.prepare(payload).leaf_count == 0
    decoded = codec.decode(codec.encode(payload))
    assert type(decoded) is bytes and decoded == data


def test_tuples_come_back_as_lists_and_dict_subclasses_as_dicts():
    import collections

    tree = collections.OrderedDict(a=(1, (2, torch.ones(2))), b=bytearray(b"xy"))
    decoded = round_trip(tree)
    assert type(decoded) is dict
    assert decoded["a"][0] == 1 and type(decoded["a"][1]) is list
    assert decoded["b"] == b"xy"


@pytest.mark.parametrize("with_tensor", [False, True])
def test_user_ext_values_keep_code_and_data(with_tensor):
    exts = [Ext(code, bytes([code & 0xFF]) * (code % 7)) for code in (0, 1, 5, 126, 127, -2, -128)]
    tree: dict[str, Any] = {"exts": exts, "nested": {"e": Ext(127, b"ours?")}}
    if with_tensor:
        tree["t"] = torch.arange(4)
    decoded = round_trip(tree)
    assert decoded["exts"] == exts
    assert decoded["nested"]["e"] == Ext(127, b"ours?")
    if with_tensor:
        assert torch.equal(decoded["t"], torch.arange(4))


def test_user_ext_that_looks_like_a_descriptor_is_not_taken_for_a_leaf():
    forged = codec.encode([torch.arange(3)])  # take a real descriptor's bytes
    descriptor = wire._DESCRIPTOR_BY_NDIM[1].pack(5, 0, 1, 0, 0, 3)
    assert descriptor in forged
    tree = [Ext(codec.DEFAULT_LEAF_EXT_CODE, descriptor), torch.arange(3)]
    decoded = round_trip(tree)
    assert decoded[0] == Ext(codec.DEFAULT_LEAF_EXT_CODE, descriptor)
    assert torch.equal(decoded[1], torch.arange(3))


class Meta(msgspec.Struct):
    finished: bool
    codes: torch.Tensor
    scores: Any = None
    note: str | msgspec.UnsetType = msgspec.UNSET


class Point(msgspec.Struct, array_like=True):
    x: int
    y: int


def test_struct_comes_back_as_a_dict_or_as_the_struct_given_type():
    value = Meta(finished=True, codes=torch.arange(5), scores=np.ones(2, dtype=np.float32))
    as_dict = round_trip(value)
    assert set(as_dict) == {"finished", "codes", "scores"}
    assert torch.equal(as_dict["codes"], torch.arange(5))
    typed = codec.decode(codec.encode(value), type=Meta)
    assert type(typed) is Meta and typed.finished is True and typed.note is msgspec.UNSET
    assert torch.equal(typed.codes, torch.arange(5))
    assert np.array_equal(typed.scores, np.ones(2, dtype=np.float32))
    assert round_trip(Point(1, 2)) == [1, 2]
    assert codec.decode(codec.encode([Point(1, 2)]), type=list[Point]) == [Point(1, 2)]


def test_tree_that_does_not_match_type_is_a_corrupt_frame_error():
    with pytest.raises(CorruptFrameError) as caught:
        codec.decode(codec.encode({"finished": True, "codes": "not a tensor"}), type=Meta)
    assert isinstance(caught.value.__cause__, msgspec.ValidationError)


# -- ownership -------------------------------------------------------------------


def test_decoded_output_does_not_alias_the_input_buffer():
    big = torch.arange(codec.SHARED_LEAF_LIMIT // 8 * 2, dtype=torch.int64)
    tree = {"small": torch.arange(10), "big": big, "arr": np.arange(4), "b": b"bytes", "s": "str"}
    buf = bytearray(codec.encode(tree))
    decoded = codec.decode(buf)
    buf[:] = b"\xff" * len(buf)
    assert_same(decoded, tree)
    plain = bytearray(codec.encode({"b": b"bytes" * 10}))
    decoded_plain = codec.decode(plain)
    plain[:] = b"\x00" * len(plain)
    assert decoded_plain == {"b": b"bytes" * 10}


def test_decode_and_write_into_keep_no_export_of_the_callers_mapping():
    # A ring reader must be able to close its mmap after any get, also while
    # it keeps the CorruptFrameError of a bad frame (whose traceback holds
    # the codec's frames).
    good = codec.encode([torch.arange(4), torch.arange(codec.SHARED_LEAF_LIMIT)])
    forged = bytearray(good)
    descriptor = wire._DESCRIPTOR_BY_NDIM[1].pack(5, 0, 1, 0, 0, 4)
    at = forged.index(descriptor)
    forged[at : at + len(descriptor)] = wire._DESCRIPTOR_BY_NDIM[1].pack(5, 0, 1, 0, 0, 5)
    kept: list[BaseException] = []
    for data in (good, bytes(forged), good[:-16], b"\x92\xa1"):
        mapping = mmap.mmap(-1, len(data))
        mapping[:] = data
        try:
            codec.decode(mapping)
        except CorruptFrameError as error:
            kept.append(error)
        mapping.close()
    assert len(kept) == 3
    plan = codec.prepare([torch.arange(4), torch.ones(3, 3).t(), np.arange(3)[::2]])
    mapping = mmap.mmap(-1, plan.nbytes)
    plan.write_into(mapping)
    assert codec.decode(mapping[:])[0].tolist() == [0, 1, 2, 3]
    mapping.close()


def test_source_overwritten_after_encode_does_not_change_the_decoded_value():
    tensor = torch.arange(100, dtype=torch.float32)
    array = np.arange(50)
    expected = (tensor.clone(), array.copy())
    plan = codec.prepare([tensor, array, tensor.t()])
    buf = bytearray(plan.nbytes)
    plan.write_into(buf)
    tensor.fill_(-1)
    array.fill(-1)
    decoded = codec.decode(buf)
    assert torch.equal(decoded[0], expected[0]) and torch.equal(decoded[2], expected[0])
    assert np.array_equal(decoded[1], expected[1])


def test_decoded_tensors_are_writable_and_do_not_share_values():
    decoded = round_trip([torch.zeros(4), torch.zeros(4)])
    decoded[0] += 1
    assert torch.equal(decoded[1], torch.zeros(4))


def test_decoded_leaves_are_16_byte_aligned():
    tree = [
        torch.ones(3, dtype=torch.complex128),
        torch.ones(5, dtype=torch.int8),
        torch.ones(2, dtype=torch.complex128),
    ]
    for tensor in round_trip(tree):
        assert tensor.data_ptr() % codec.REGION_ALIGNMENT == 0


def owner_of(array: np.ndarray) -> Any:
    """The object that owns a decoded array's memory (the codec's bytearray)."""
    owner: Any = array
    while isinstance(owner, np.ndarray) and owner.base is not None:
        owner = owner.base
    return owner.obj if isinstance(owner, memoryview) else owner


def test_large_multi_leaf_payload_gives_each_large_tensor_its_own_allocation():
    big_a = torch.arange(codec.SHARED_LEAF_LIMIT // 4, dtype=torch.float32)  # exactly the limit
    big_b = torch.ones(300, 300, dtype=torch.float64)
    tree = {"a": big_a, "meta": {"n": torch.tensor(3), "done": torch.tensor(True)}, "b": big_b}
    decoded = round_trip(tree)
    assert_same(decoded, tree)
    (ptr_a, size_a), (ptr_b, size_b) = storage_of(decoded["a"]), storage_of(decoded["b"])
    assert size_a == big_a.nbytes and size_b == big_b.nbytes and ptr_a != ptr_b
    # torch sees only each leaf's own bytes; the small leaves sit back to back
    # (16-byte slots) in one allocation, away from both large ones.
    ptr_n, ptr_done = decoded["meta"]["n"].data_ptr(), decoded["meta"]["done"].data_ptr()
    assert ptr_done - ptr_n == codec.REGION_ALIGNMENT
    for ptr, size in ((ptr_a, size_a), (ptr_b, size_b)):
        assert not ptr <= ptr_n < ptr + size


def test_numpy_leaves_share_one_owner_when_small_and_own_one_when_large():
    small = [np.arange(3), np.ones(4, dtype=np.float16), np.array(7)]
    large = [np.zeros(codec.SHARED_LEAF_LIMIT, dtype=np.uint8), np.ones((200, 100))]
    decoded = round_trip({"small": small, "large": large})
    owners = {id(owner_of(array)) for array in decoded["small"]}
    assert len(owners) == 1
    shared = owner_of(decoded["small"][0])
    padded = sum(
        -(-array.nbytes // codec.REGION_ALIGNMENT) * codec.REGION_ALIGNMENT for array in small
    )
    assert type(shared) is bytearray and len(shared) == padded == 64
    for got, want in zip(decoded["large"], large, strict=True):
        owner = owner_of(got)
        assert type(owner) is bytearray and len(owner) == want.nbytes and owner is not shared


def test_many_small_leaves_spill_past_the_shared_area_limit():
    leaf_bytes = codec.SHARED_LEAF_LIMIT // 2  # below the per-leaf limit
    count = codec.SHARED_AREA_LIMIT // leaf_bytes + 3
    tree = [np.full(leaf_bytes, i, dtype=np.uint8) for i in range(count)]
    decoded = round_trip(tree)
    assert_same(decoded, tree)
    shared = {id(owner_of(array)) for array in decoded[: count - 3]}
    assert len(shared) == 1 and len(owner_of(decoded[0])) == codec.SHARED_AREA_LIMIT
    spilled = [owner_of(array) for array in decoded[count - 3 :]]
    assert len({id(owner) for owner in spilled}) == 3
    assert all(len(owner) == leaf_bytes for owner in spilled)


# -- refusals ------------------------------------------------------------------------


class Custom:
    pass


def _quietly(make):
    def build():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return make()

    return build


def _cycle():
    items: list[Any] = []
    items.append(items)
    return items


UNSUPPORTED = {
    "object": (object, "object"),
    "custom class": (Custom, "Custom"),
    "datetime": (lambda: datetime.datetime(2024, 1, 1), "datetime"),
    "numpy scalar": (lambda: np.float32(1.0), "float32"),
    "numpy float64 (a float subclass)": (lambda: np.float64(1.0), "float64"),
    "object array": (lambda: np.array([None, 1], dtype=object), "dtype=object"),
    "string array": (lambda: np.array(["a"]), "dtype=<U1"),
    "uint16 array": (lambda: np.zeros(2, dtype=np.uint16), "dtype=uint16"),
    "ndarray subclass": (lambda: np.ma.masked_array([1, 2]), "MaskedArray"),
    "meta tensor": (lambda: torch.empty(3, device="meta"), "device=meta"),
    "sparse tensor": (lambda: torch.zeros(3).to_sparse(), "sparse_coo"),
    "sparse csr tensor": (_quietly(lambda: torch.eye(2).to_sparse_csr()), "sparse_csr"),
    "quantized tensor": (
        _quietly(lambda: torch.quantize_per_tensor(torch.rand(3), 0.1, 0, torch.quint8)),
        "quantized",
    ),
    "nested tensor": (
        _quietly(lambda: torch.nested.nested_tensor([torch.zeros(2), torch.zeros(3)])),
        "nested",
    ),
    "jagged nested tensor": (
        _quietly(
            lambda: torch.nested.nested_tensor(
                [torch.zeros(2), torch.zeros(3)], layout=torch.jagged
            )
        ),
        "nested",
    ),
    "uint16 tensor": (lambda: torch.zeros(2, dtype=torch.uint16), "dtype=torch.uint16"),
    "timestamp ext": (lambda: Ext(-1, b"\x00" * 4), "timestamp"),
    "strided memoryview": (lambda: memoryview(bytes(8))[::2], "C-contiguous"),
    "tuple key": (lambda: {(1, 2): 3}, "tuple"),
    "cycle": (_cycle, "deeper"),
    "int too large": (lambda: 2**64, "2**64"),
    "lone surrogate": (lambda: "\ud800", "surrogate"),
}


@pytest.mark.parametrize("name", list(UNSUPPORTED))
@pytest.mark.parametrize("where", ["top", "nested"])
def test_unsupported_objects_raise_the_typed_error_naming_them(name, where):
    make, expected_text = UNSUPPORTED[name]
    obj = make()
    payload = obj if where == "top" else {"ok": torch.ones(1), "deep": [1, {"x": obj}]}
    with pytest.raises(UnsupportedPayloadError) as caught:
        codec.prepare(payload)
    assert expected_text in str(caught.value)
    assert isinstance(caught.value, TypeError)


def test_write_into_refuses_a_small_or_read_only_buffer():
    plan = codec.prepare({"t": torch.arange(10)})
    with pytest.raises(ValueError, match=f"nbytes={plan.nbytes}"):
        plan.write_into(bytearray(plan.nbytes - 1))
    with pytest.raises(ValueError, match="read-only"):
        plan.write_into(bytes(plan.nbytes))


def test_write_into_refuses_a_tensor_resized_after_prepare():
    tensor = torch.arange(10)
    plan = codec.prepare([tensor])
    tensor.resize_(1000)
    with pytest.raises(ValueError, match="changed between prepare and write_into"):
        plan.write_into(bytearray(plan.nbytes))


# -- corrupt input ----------------------------------------------------------------------

CORPUS = [
    {"codes": {"audio": torch.arange(28)}, "meta": {"finished": torch.tensor(False)}},
    [torch.ones(2, 3, dtype=torch.complex128), np.arange(5, dtype=np.int8), Ext(3, b"xyz"), "text"],
    {
        "big": torch.arange(codec.SHARED_LEAF_LIMIT // 8, dtype=torch.int64),
        "small": torch.zeros(3, dtype=torch.bool),
    },
    {"plain": [1, 2.5, None, b"bin", {"k": "v"}], "ext": Ext(9, b"q")},
    torch.zeros(0, 3),
]
ENCODINGS = [codec.encode(obj) for obj in CORPUS]


def _decode_or_corrupt(data: bytes | bytearray) -> None:
    """Decode; a CorruptFrameError is an accepted outcome, any other exception fails the test."""
    with contextlib.suppress(CorruptFrameError):
        codec.decode(data)


@pytest.mark.parametrize("index", range(len(ENCODINGS)))
def test_every_truncation_raises_corrupt_frame_error(index):
    encoded = ENCODINGS[index]
    step = max(1, len(encoded) // 400)
    for length in range(0, len(encoded), step):
        with pytest.raises(CorruptFrameError):
            codec.decode(encoded[:length])


@FAST
@given(
    index=st.integers(0, len(ENCODINGS) - 1),
    flips=st.lists(st.tuples(st.integers(0, 2**32), st.integers(0, 255)), min_size=1, max_size=6),
)
def test_random_byte_corruption_only_raises_corrupt_frame_error_or_returns(index, flips):
    data = bytearray(ENCODINGS[index])
    for position, value in flips:
        data[position % len(data)] = value
    _decode_or_corrupt(data)


def first_descriptor_at(data: bytearray) -> int:
    """Offset of the first leaf descriptor's data (after its ext8 header) in a framed encoding."""
    code = data[CODEC_LEAF_CODE_OFFSET]
    starts = []
    for ndim in range(31):
        marker = bytes([0xC7, CODEC_DESCRIPTOR_LENGTH + CODEC_DIMENSION_LENGTH * ndim, code])
        found = data.find(marker, CODEC_PREFIX_LENGTH)
        if found >= 0:
            starts.append(found + len(marker))
    return min(starts)


@FAST
@given(
    index=st.integers(0, len(ENCODINGS) - 1),
    field=st.sampled_from(
        ["header_length", "shared_length", "dims", "offset", "ndim", "dtype", "area"]
    ),
    value=st.integers(0, 2**64 - 1),
)
def test_forged_header_fields_raise_corrupt_frame_error_without_huge_allocations(
    index, field, value
):
    data = bytearray(ENCODINGS[index])
    if data[0] != codec.FRAMED_MARKER:
        return
    if field in ("header_length", "shared_length"):
        where = {
            "header_length": CODEC_HEADER_LENGTH_OFFSET,
            "shared_length": CODEC_SHARED_LENGTH_OFFSET,
        }[field]
        data[where : where + 4] = (value & 0xFFFFFFFF).to_bytes(4, "little")
    else:
        at = first_descriptor_at(data)
        where = (
            at
            + {
                "dtype": CODEC_DESCRIPTOR_DTYPE_OFFSET,
                "area": CODEC_DESCRIPTOR_AREA_OFFSET,
                "ndim": CODEC_DESCRIPTOR_NDIM_OFFSET,
                "offset": CODEC_DESCRIPTOR_AREA_START_OFFSET,
                "dims": CODEC_DESCRIPTOR_DIMENSIONS_OFFSET,
            }[field]
        )
        width = 8 if field in ("offset", "dims") else 1
        data[where : where + width] = (value % (1 << (8 * width))).to_bytes(width, "little")
    _decode_or_corrupt(data)


def test_forged_huge_shape_is_refused_before_any_allocation():
    encoded = bytearray(codec.encode([torch.arange(4)]))
    descriptor = wire._DESCRIPTOR_BY_NDIM[1].pack(5, 0, 1, 0, 0, 4)
    at = encoded.index(descriptor)
    encoded[at : at + len(descriptor)] = wire._DESCRIPTOR_BY_NDIM[1].pack(5, 0, 1, 0, 0, 2**62)
    with pytest.raises(CorruptFrameError, match="out of place"):
        codec.decode(encoded)


def test_deeply_nested_plain_input_is_a_corrupt_frame_error():
    with pytest.raises(CorruptFrameError):
        codec.decode(b"\x91" * 100_000 + b"\xc0")


def test_non_bool_byte_in_a_bool_leaf_is_a_corrupt_frame_error():
    encoded = bytearray(codec.encode([torch.tensor([True, False, True])]))
    shared_start = len(encoded) - 16
    assert encoded[shared_start : shared_start + 3] == b"\x01\x00\x01"
    encoded[shared_start + 1] = 7
    with pytest.raises(CorruptFrameError, match="bool"):
        codec.decode(encoded)


# -- environment ----------------------------------------------------------------------


def test_bytes_and_tree_payloads_never_import_torch_or_numpy():
    script = (
        "import sys\n"
        "from shmring.impl import codec\n"
        "payload = {'k': [1, b'x', 'y', None, 2.5], 'big': b'z' * 100000}\n"
        "assert codec.decode(codec.encode(payload)) == payload\n"
        "assert codec.decode(codec.encode(b'q' * 100000)) == b'q' * 100000\n"
        "print(sorted(m for m in ('torch', 'numpy') if m in sys.modules))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(os.environ),
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_threads_encode_and_decode_independently():
    errors: list[BaseException] = []

    def worker(seed: int) -> None:
        try:
            for i in range(200):
                tree = {"t": torch.full((seed + 1,), i), "a": np.full(seed + 2, i), "i": i}
                assert_same(round_trip(tree), tree)
        except BaseException as error:  # reported below
            errors.append(error)

    threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not any(thread.is_alive() for thread in threads)
    assert not errors, errors


@pytest.mark.parametrize(
    "payload",
    [
        b"x" * 64,
        {"a": 1, "b": [True, None, "text"]},
        {"window": slice(2, None, 3)},  # plain msgpack: [2, None, 3]
        {"t": torch.arange(4)},
        b"y" * (codec.DIRECT_BYTES_MIN + 1),
    ],
    ids=["small-bytes", "plain-tree", "slice", "tensor", "large-bytes"],
)
def test_whole_is_exactly_what_write_into_writes(payload: Any) -> None:
    """`EncodePlan.whole()` (the connector copies it as is) is the encoding or None."""
    plan = codec.prepare(payload)
    written = bytearray(plan.nbytes)
    plan.write_into(written)
    whole = plan.whole()
    if whole is not None:
        assert whole == bytes(written)
    expected_whole = isinstance(payload, bytes) and len(payload) < codec.DIRECT_BYTES_MIN
    expected_whole = expected_whole or payload in (
        {"a": 1, "b": [True, None, "text"]},
        {"window": slice(2, None, 3)},
    )
    assert (whole is not None) == expected_whole


class _Registered:
    def __init__(self, value: int) -> None:
        self.value = value


def test_whole_is_none_for_a_framed_plan_without_leaves() -> None:
    """A registered object is framed (its type tag needs the leaf code) yet has no leaves."""
    register_type(_Registered, lambda obj: obj.value, _Registered)
    try:
        plan = codec.prepare({"obj": _Registered(7)})
        written = bytearray(plan.nbytes)
        plan.write_into(written)
        assert written[0] == codec.FRAMED_MARKER and plan.leaf_count == 0
        assert plan.whole() is None  # zero fill after the header: not the header alone
        assert codec.decode(written)["obj"].value == 7
    finally:
        unregister_type(_Registered)


@pytest.mark.parametrize(
    "payload",
    [
        b"x" * 64,
        {"a": 1, "b": [True, None, "text"]},
        {"t": torch.arange(4)},
        b"y" * codec.DIRECT_BYTES_MIN,
        bytearray(b"z" * (codec.DIRECT_BYTES_MIN + 3)),
        memoryview(b"w" * (1 << 20)),
    ],
    ids=["small-bytes", "plain-tree", "tensor", "large-bytes", "bytearray", "memoryview"],
)
def test_parts_are_exactly_what_write_into_writes(payload: Any) -> None:
    """Issue 13: `EncodePlan.parts()` (the ring copies header and body as they are) or None."""
    plan = codec.prepare(payload)
    written = bytearray(plan.nbytes)
    plan.write_into(written)
    parts = plan.parts()
    expected = isinstance(payload, (bytes, bytearray, memoryview)) and len(payload) >= (
        codec.DIRECT_BYTES_MIN
    )
    assert (parts is not None) == expected
    if parts is not None:
        head, body = parts
        assert head + bytes(body) == bytes(written)
        assert codec.decode(head + bytes(body)) == bytes(payload)
