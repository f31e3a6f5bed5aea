"""Frames codec: a user payload to the bytes of one ring frame or fallback segment, and back.

Design rationale. The codec sits on the latency path of every put and get, so
it lets msgspec do the tree work in C and keeps Python work per message to a
walk that checks types, plus a few struct packs per tensor. Three choices
shape the format:

* Tensor data never goes through msgpack. Each CPU tensor or numpy array
  (a *leaf*) becomes a small msgpack ``Ext`` descriptor in the header and a
  raw, 16-byte aligned region after it. `prepare` sizes the whole encoding
  without touching tensor data, so the ring can decide admission (or size a
  fallback segment) before anything is copied; `EncodePlan.write_into` then
  copies each leaf straight into the destination (an mmap slice), resolving
  conj/neg bits and non-contiguous layouts in that one pass (torch's copy_
  into the destination; through a temporary when the destination is not
  16-byte aligned, because torch faults on unaligned complex stores).
* A payload without leaves is plain msgpack, byte for byte what
  ``msgspec.msgpack.encode`` gives. A framed payload starts with 0xC1, the
  one byte msgpack never uses, so the first byte tells the two apart.
* A user's own ``Ext`` values travel untouched: the descriptor ext code is
  chosen per message (127 unless the payload itself uses 127, then the next
  free code) and written in the prefix, so no user code is ever reserved.

Wire format (framed; every integer little-endian)::

    0      1        2            3         4              8              12
    +------+--------+------------+---------+--------------+--------------+
    | 0xC1 | version| leaf ext   | flags=0 | header length| shared length|
    | u8   | u8 = 1 | code i8    | u8      | u32 (H)      | u32 (S)      |
    +------+--------+------------+---------+--------------+--------------+
    12: msgpack header (H bytes): the payload tree, each leaf replaced by
        Ext(leaf ext code, descriptor); zero fill to a multiple of 16 = D
    D: shared area, S bytes: small leaves back to back, each zero padded to 16
    D + S: own area, to the end: large leaves back to back, each padded to 16

    descriptor (12 + 8 * ndim bytes):
    | dtype code u8 (| 0x80 for numpy) | area u8 (0 shared, 1 own) | ndim u8 |
    | reserved u8 = 0 | offset in its area u64 | ndim x dimension u64 |

Leaves appear in each area in header order, densely packed: the decoder
checks that every offset is exactly where the previous leaf of its area ended
and that both areas are covered to the byte, so a forged header can neither
overlap regions, read out of bounds nor make the decoder allocate more than
the input's size.

Ownership on decode. Nothing returned is a view of the input buffer: the
ring frame is reused as soon as the get returns. The shared area is copied
once into one ``bytearray`` and every small leaf is a view of it; a leaf of
`SHARED_LEAF_LIMIT` bytes or more (or one that would push the shared area
past `SHARED_AREA_LIMIT`) lives in the own area and gets its own allocation
on decode, so a small leaf the receiver keeps cannot pin a large tensor.
Torch tensors come back writable, numpy arrays read-only.

What travels, and how it comes back:

* CPU torch tensors (strided; dtypes in `TORCH_DTYPE_NAMES`, any shape and
  strides, conj/neg views, requires_grad) -> contiguous torch tensors of the
  same dtype and shape, without grad.
* numpy ``ndarray`` (exact type; same dtypes minus bfloat16; any byte order)
  -> read-only native-order C-contiguous ndarray.
* dict (keys str/int/float/bool/None/bytes), list, tuple -> dict, list, list.
* str, int (-2**63 .. 2**64-1), float, bool, None -> the same.
* bytes, bytearray, contiguous memoryview -> bytes.
* msgspec Structs -> their msgpack form: dicts (or lists for
  ``array_like``), or the Struct itself when `decode` is given ``type=``.
* ``msgspec.msgpack.Ext`` (code != -1, the msgpack timestamp) -> an equal Ext.
* ``slice`` -> ``[start, stop, step]`` (a list, as on vllm-omni's wire).
* ``PIL.Image.Image`` and every class registered with
  `shmring.impl.extensions.register_type` -> an object of that class, built
  by its registered decode function (see that module; a tagged two-item
  array on the wire, never pickle).

Everything else (GPU, meta, sparse, quantized or nested tensors; numpy
scalars, object or string arrays; sets, datetimes, dataclasses, enums,
subclasses of the scalar types, custom classes) raises
`UnsupportedPayloadError` naming the type. Nothing is ever pickled.

torch and numpy are imported only when a payload holds one of their objects:
a process that only moves bytes and trees never imports either.
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import struct
import sys
import threading
from typing import Any, Final

import msgspec
from msgspec.msgpack import Decoder, Encoder, Ext

from shmring.impl import extensions
from shmring.impl.errors import CorruptFrameError, UnsupportedPayloadError

# -- wire format ----------------------------------------------------------------

FRAMED_MARKER: Final = 0xC1  # the byte msgpack never uses: no plain message starts with it
FORMAT_VERSION: Final = 1
REGION_ALIGNMENT: Final = 16  # largest item size (complex128) and the SIMD width torch assumes
DEFAULT_LEAF_EXT_CODE: Final = 127
TIMESTAMP_EXT_CODE: Final = -1  # msgpack's own timestamp type; msgspec decodes it as datetime
# Every other code, in the order tried when a payload's own Exts use 127:
# the application range 126..0, then msgpack's reserved range -2..-128.
_LEAF_CODE_CANDIDATES: Final[tuple[int, ...]] = (*range(126, -1, -1), *range(-2, -129, -1))
SHARED_LEAF_LIMIT: Final = 64 * 1024  # leaves this large or larger get their own allocation
SHARED_AREA_LIMIT: Final = 1024 * 1024  # at most this many bytes of leaves share one allocation
MAX_NDIM: Final = 64  # numpy's and torch's limit
MAX_NESTING: Final = 128  # containers nested deeper are refused (also catches cycles)
DIRECT_BYTES_MIN: Final = 64 * 1024  # a top-level bytes payload this large is copied once

_PREFIX: Final = struct.Struct("<BBbBII")
PREFIX_LENGTH: Final = _PREFIX.size
_DESCRIPTOR: Final = struct.Struct("<BBBBQ")
DESCRIPTOR_LENGTH: Final = _DESCRIPTOR.size
# One packer per rank: descriptor head and dimensions in a single call.
_DESCRIPTOR_BY_NDIM: Final = tuple(struct.Struct(f"<BBBBQ{n}Q") for n in range(MAX_NDIM + 1))
_DIMS_BY_NDIM: Final = tuple(struct.Struct(f"<{n}Q") for n in range(MAX_NDIM + 1))
_NUMPY_FLAG: Final = 0x80
# First byte of an Ext(leaf code) that tags a registered object (no dtype code reaches it).
_TYPE_TAG: Final = 0xFE
# Registered objects rebuilt from nesting deeper than this are refused as corrupt.
_MAX_REBUILD_DEPTH: Final = 4 * MAX_NESTING
_SHARED_AREA: Final = 0
_OWN_AREA: Final = 1
_ALIGN_MASK: Final = REGION_ALIGNMENT - 1
_ZEROS: Final = bytes(REGION_ALIGNMENT)
_U32_MAX: Final = 0xFFFFFFFF

# Dtype code -> (name, numpy storage dtype, item size). The code is the wire value.
# bfloat16 exists only in torch; its bits are stored as int16.
_DTYPES: Final = (
    ("bool", "bool", 1),
    ("uint8", "uint8", 1),
    ("int8", "int8", 1),
    ("int16", "int16", 2),
    ("int32", "int32", 4),
    ("int64", "int64", 8),
    ("float16", "float16", 2),
    ("bfloat16", "int16", 2),
    ("float32", "float32", 4),
    ("float64", "float64", 8),
    ("complex64", "complex64", 8),
    ("complex128", "complex128", 16),
)
_BOOL_CODE: Final = 0
_BFLOAT16_CODE: Final = 7
_ITEMSIZES: Final = tuple(itemsize for _, _, itemsize in _DTYPES)
TORCH_DTYPE_NAMES: Final = tuple(name for name, _, _ in _DTYPES)
NUMPY_DTYPE_NAMES: Final = tuple(name for name, _, _ in _DTYPES if name != "bfloat16")

# How write_into copies a leaf; chosen by prepare from cheap flag reads.
_TORCH_DIRECT: Final = 0  # contiguous, no conj/neg bit: one memmove from data_ptr()
_TORCH_STRIDED: Final = 1  # strided or conj/neg: torch copy_ resolves and packs in one pass
#                            (two when the destination is not 16-byte aligned)
_NUMPY_DIRECT: Final = 2  # C-contiguous, native byte order: one memcpy
_NUMPY_STRIDED: Final = 3  # strided or swapped byte order: numpy copies and converts
_RAW_BYTES: Final = 4  # a top-level bytes-like payload

_NO_LEAVES: Final[list[Any]] = []  # never appended to: set while no message is being built
_NOTHING_CONVERTED: Final[dict[int, Any]] = {}  # likewise, never written
_SCALAR_TYPES: Final = frozenset({str, int, float, bool, type(None), bytes, bytearray})
_KEY_TYPES: Final = frozenset({str, int, float, bool, type(None), bytes})

# -- lazy torch / numpy tables ----------------------------------------------------

_np: Any = None
_numpy_codes: dict[Any, int] = {}
_numpy_storage: tuple[Any, ...] = ()
_torch: Any = None
_torch_codes: dict[Any, int] = {}
_torch_dtypes: tuple[Any, ...] = ()


def _numpy() -> Any:
    """Import numpy on first use and build its dtype tables."""
    global _np, _numpy_codes, _numpy_storage
    if _np is None:
        import numpy

        _numpy_storage = tuple(numpy.dtype(storage) for _, storage, _ in _DTYPES)
        _numpy_codes = {
            numpy.dtype(name): code
            for code, (name, _, _) in enumerate(_DTYPES)
            if code != _BFLOAT16_CODE
        }
        _np = numpy
    return _np


def _torch_module() -> Any:
    """Import torch on first use (only a frame that holds a tensor gets here)."""
    global _torch, _torch_codes, _torch_dtypes
    if _torch is None:
        import torch

        _numpy()
        _torch_dtypes = tuple(getattr(torch, name) for name, _, _ in _DTYPES)
        _torch_codes = {dtype: code for code, dtype in enumerate(_torch_dtypes)}
        _torch = torch
    return _torch


def _type_name(obj: object) -> str:
    cls = type(obj)
    return (
        cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"
    )


def _unsupported(obj: object, why: str = "") -> UnsupportedPayloadError:
    detail = f" ({why})" if why else ""
    return UnsupportedPayloadError(f"cannot encode an object of type {_type_name(obj)}{detail}")


def _unsupported_tensor(tensor: Any) -> UnsupportedPayloadError:
    """The error for a tensor the codec does not carry, naming the first reason."""
    if tensor.is_nested:
        return _unsupported(tensor, "nested tensor")
    if tensor.layout is not _torch.strided:
        return _unsupported(tensor, f"layout={tensor.layout}")
    if not tensor.is_cpu:
        return _unsupported(tensor, f"device={tensor.device}; move it to the CPU first")
    if tensor.is_quantized:
        return _unsupported(tensor, f"quantized dtype={tensor.dtype}")
    return _unsupported(tensor, f"dtype={tensor.dtype}")


def _is_leaf(obj: object) -> bool:
    """A torch tensor or numpy array, found without importing either module."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(obj, torch.Tensor):
        return True
    numpy = sys.modules.get("numpy")
    return numpy is not None and type(obj) is numpy.ndarray


# -- encoding -----------------------------------------------------------------------


def _scan(obj: Any, depth: int, exts: set[int], converted: dict[int, Any] | None) -> int:
    """Count the leaves under `obj`, collect the user Ext codes, refuse what does not travel.

    The walk exists because msgspec would silently encode sets, dataclasses,
    datetimes and enums; the codec refuses them so nothing comes back as a
    different kind of object than the caller sent without being documented.
    Slices and registered objects are converted here, once: `converted` maps
    the id of each to ``(obj, replacement)``, where the replacement is the
    ``[start, stop, step]`` list or ``(type name, state)``. Most payloads hold
    neither, so the first walk goes without the dict (None) and `_Rescan`
    asks for a second walk with one when it meets such an object.
    """
    cls = type(obj)
    if cls in _SCALAR_TYPES:
        return 0
    if depth > MAX_NESTING:
        raise UnsupportedPayloadError(
            f"payload nested deeper than {MAX_NESTING} containers (a cycle?): depth={depth}"
        )
    if cls is not dict and cls is not list and cls is not tuple:
        if cls is Ext:
            if obj.code == TIMESTAMP_EXT_CODE:
                raise _unsupported(
                    obj, "ext code -1 is the msgpack timestamp type, not a user extension"
                )
            exts.add(obj.code)
            return 0
        if cls is memoryview:
            if not obj.c_contiguous:
                raise _unsupported(obj, "memoryview is not C-contiguous")
            return 0
        if isinstance(obj, msgspec.Struct):
            fields = [getattr(obj, name) for name in obj.__struct_fields__]
            return _scan(
                [value for value in fields if value is not msgspec.UNSET], depth, exts, converted
            )
        if _is_leaf(obj):
            return 1
        if not isinstance(obj, (dict, list, tuple)):  # subclasses travel as their base type
            return _scan_converted(obj, depth, exts, converted)
    leaves = 0
    if isinstance(obj, dict):
        for key, value in obj.items():
            if type(key) not in _KEY_TYPES:
                raise _unsupported(
                    key, "as a dict key; keys must be str, int, float, bool, None or bytes"
                )
            if type(value) not in _SCALAR_TYPES:
                leaves += _scan(value, depth + 1, exts, converted)
        return leaves
    if len(obj) > 8 and _SCALAR_TYPES.issuperset(map(type, obj)):
        return 0
    for value in obj:
        if type(value) not in _SCALAR_TYPES:
            leaves += _scan(value, depth + 1, exts, converted)
    return leaves


class _Rescan(Exception):
    """The walk met a slice or a registered object without a `converted` dict."""


def _scan_converted(obj: Any, depth: int, exts: set[int], converted: dict[int, Any] | None) -> int:
    """A slice or a registered object: convert it once, then scan what it became."""
    if converted is None:
        if type(obj) is slice or extensions.codec_for_object(obj) is not None:
            raise _Rescan
        raise _unsupported(obj, "register its class with shmring.register_type to send it")
    if type(obj) is slice:
        replacement: Any = [obj.start, obj.stop, obj.step]
        converted[id(obj)] = (obj, replacement)
        return _scan(replacement, depth + 1, exts, converted)
    codec = extensions.codec_for_object(obj)
    if codec is None:
        raise _unsupported(obj, "register its class with shmring.register_type to send it")
    if id(obj) in converted:
        return 0  # the same object twice: already converted (its leaves counted once per use)
    try:
        state = codec.encode(obj)
    except UnsupportedPayloadError:
        raise
    except Exception as error:
        raise _unsupported(obj, f"its registered encode failed: {error!r}") from error
    converted[id(obj)] = (obj, (codec.name, state))
    return _scan(state, depth + 1, exts, converted)


def _choose_leaf_code(exts: set[int]) -> int:
    """The descriptor ext code for one message: one the payload's own Exts do not use."""
    if DEFAULT_LEAF_EXT_CODE not in exts:
        return DEFAULT_LEAF_EXT_CODE
    for code in _LEAF_CODE_CANDIDATES:
        if code not in exts:
            return code
    raise UnsupportedPayloadError(f"payload uses every msgpack ext code: codes={len(exts)}")


def _refuse_in_plain_tree(obj: Any) -> Any:
    """enc_hook for leaf-free payloads: the walk already refused everything else."""
    raise _unsupported(obj)


class _HeaderBuilder:
    """Per-thread msgspec encoder whose enc_hook turns leaves into descriptors.

    The hook needs per-message state (ext code, cursors, the leaf list); one
    builder per thread keeps the encoder and the bound hook alive between
    messages instead of rebuilding them on every put.
    """

    __slots__ = ("busy", "code", "converted", "encoder", "leaves", "own_cursor", "shared_cursor")

    def __init__(self) -> None:
        self.encoder = Encoder(enc_hook=self._leaf_descriptor)
        self.converted: dict[int, Any] = _NOTHING_CONVERTED
        self.busy = False
        self.code = DEFAULT_LEAF_EXT_CODE
        self.leaves: list[tuple[int, int, int, int, Any, Any]] = _NO_LEAVES
        self.shared_cursor = 0
        self.own_cursor = 0

    def _place(self, nbytes: int) -> tuple[int, int]:
        """Area and offset for a leaf of `nbytes` bytes (leaves keep header order per area)."""
        padded = (nbytes + _ALIGN_MASK) & ~_ALIGN_MASK
        cursor = self.shared_cursor
        if nbytes < SHARED_LEAF_LIMIT and cursor + padded <= SHARED_AREA_LIMIT:
            self.shared_cursor = cursor + padded
            return _SHARED_AREA, cursor
        cursor = self.own_cursor
        self.own_cursor = cursor + padded
        return _OWN_AREA, cursor

    def _leaf_descriptor(self, obj: Any) -> Any:
        if self.converted:
            entry = self.converted.get(id(obj))
            if entry is not None and entry[0] is obj:
                replacement = entry[1]
                if type(replacement) is list:  # a slice
                    return replacement
                name, state = replacement
                return [Ext(self.code, bytes((_TYPE_TAG,)) + name.encode()), state]
        torch = sys.modules.get("torch")
        if torch is not None and isinstance(obj, torch.Tensor):
            return self._tensor_descriptor(obj)
        numpy = sys.modules.get("numpy")
        if numpy is not None and type(obj) is numpy.ndarray:
            return self._array_descriptor(obj)
        raise _unsupported(obj)

    def _tensor_descriptor(self, tensor: Any) -> Ext:
        torch = _torch or _torch_module()
        code = _torch_codes.get(tensor.dtype)
        if (
            code is None
            or not tensor.is_cpu
            or tensor.layout is not torch.strided
            or tensor.is_nested
        ):
            raise _unsupported_tensor(tensor)
        shape = tensor.shape
        ndim = len(shape)
        nbytes = tensor.numel() * _ITEMSIZES[code]
        area, offset = self._place(nbytes)
        direct = tensor.is_contiguous() and not tensor.is_conj() and not tensor.is_neg()
        kind = _TORCH_DIRECT if direct else _TORCH_STRIDED
        self.leaves.append((area, offset, nbytes, kind, tensor, code))
        return Ext(self.code, _DESCRIPTOR_BY_NDIM[ndim].pack(code, area, ndim, 0, offset, *shape))

    def _array_descriptor(self, array: Any) -> Ext:
        _numpy()
        dtype = array.dtype
        code = _numpy_codes.get(dtype)
        direct = True
        if code is None:
            if dtype.isnative or dtype.fields is not None or dtype.hasobject:
                raise _unsupported(array, f"dtype={dtype}")
            code = _numpy_codes.get(dtype.newbyteorder("="))
            if code is None:
                raise _unsupported(array, f"dtype={dtype}")
            direct = False  # swapped byte order: numpy converts while copying
        shape = array.shape
        ndim = len(shape)
        nbytes = array.size * _ITEMSIZES[code]
        area, offset = self._place(nbytes)
        kind = _NUMPY_DIRECT if direct and array.flags.c_contiguous else _NUMPY_STRIDED
        self.leaves.append((area, offset, nbytes, kind, array, code))
        return Ext(
            self.code,
            _DESCRIPTOR_BY_NDIM[ndim].pack(code | _NUMPY_FLAG, area, ndim, 0, offset, *shape),
        )


_local = threading.local()
_plain_encoder: Final = Encoder(enc_hook=_refuse_in_plain_tree)


class EncodePlan:
    """An encoding sized but not yet written: admission first, copy second.

    `nbytes` is the exact length `write_into` writes. The plan borrows the
    payload's tensors and arrays until `write_into` returns (their values may
    change until then, their shapes may not); after that the source may be
    overwritten freely, the encoding holds no reference into it.
    """

    __slots__ = ("_data_start", "_head", "_leaves", "_own_start", "leaf_count", "nbytes")

    nbytes: int  # exact encoded length in bytes
    leaf_count: int  # tensors and arrays carried as raw regions (0: plain msgpack)

    def __init__(
        self,
        head: bytes,
        nbytes: int,
        data_start: int = 0,
        own_start: int = 0,
        leaves: list[tuple[int, int, int, int, Any, Any]] | None = None,
    ) -> None:
        self._head = head  # prefix and msgpack header (framed), or the whole message (plain)
        self._data_start = data_start  # where the shared area starts
        self._own_start = own_start  # where the own area starts
        self._leaves = leaves or ()  # (area, offset in area, nbytes, copy kind, source, dtype code)
        self.nbytes = nbytes
        raw = bool(leaves) and leaves[0][3] == _RAW_BYTES  # type: ignore[index]
        self.leaf_count = 0 if raw else len(self._leaves)

    def __repr__(self) -> str:
        return f"EncodePlan(nbytes={self.nbytes}, leaf_count={self.leaf_count})"

    def whole(self) -> bytes | None:
        """The whole encoding as one immutable bytes object when it is one, else None.

        A plain msgpack plan (no tensors, arrays or large bytes) already holds
        its encoding: a transport may copy it as is instead of calling
        `write_into` (what `write_into` would write, byte for byte).
        """
        head = self._head
        # A framed plan without leaves (slices, registered objects) zero-fills
        # past its header: only when the header is all of it is it whole.
        return head if not self._leaves and len(head) == self.nbytes else None

    def write_into(self, buf: Any) -> int:
        """Write the encoding into the first `nbytes` bytes of a writable buffer; return `nbytes`.

        Bytes past `nbytes` are left alone. The buffer may start at any
        address (a ring payload follows a key of any length): torch only ever
        writes into 16-byte aligned memory, anything else goes through memcpy.
        """
        view = memoryview(buf)
        mv = view
        try:
            if view.readonly:
                raise ValueError(
                    f"write_into needs a writable buffer, got a read-only {_type_name(buf)}"
                )
            if view.itemsize != 1 or view.ndim != 1:
                mv = view.cast("B")
            return self._write(mv)
        finally:
            # Our views go now, also on error, so the caller can close its
            # mapping; a view still exported by a failed copy's frame stays.
            with contextlib.suppress(BufferError):
                mv.release()
                view.release()

    def _write(self, mv: memoryview) -> int:
        nbytes = self.nbytes
        if len(mv) < nbytes:
            raise ValueError(f"buffer too small for the encoding: len={len(mv)} nbytes={nbytes}")
        head = self._head
        head_end = len(head)
        mv[:head_end] = head
        data_start = self._data_start
        if data_start > head_end:  # framed: zero fill after the header
            mv[head_end:data_start] = _ZEROS[: data_start - head_end]
        if not self._leaves:
            return nbytes
        own_start = self._own_start
        address = 0  # of mv[0], looked up once for the first contiguous tensor
        for area, offset, size, kind, source, code in self._leaves:
            start = (data_start if area == _SHARED_AREA else own_start) + offset
            end = start + size
            if not size:
                pass
            elif kind == _TORCH_DIRECT:
                # One memcpy from the tensor's memory; re-check what makes the raw copy safe.
                if source.nbytes != size or not source.is_contiguous():
                    raise ValueError(
                        f"tensor changed between prepare and write_into: nbytes={source.nbytes} "
                        f"planned={size}"
                    )
                if not address:
                    address = _address_of(mv)
                ctypes.memmove(address + start, source.data_ptr(), size)
            else:
                _write_leaf(mv, start, end, kind, source, code)
            pad = -size & _ALIGN_MASK if kind != _RAW_BYTES else 0
            if pad:
                mv[end : end + pad] = _ZEROS[:pad]
        return nbytes


def _address_of(mv: memoryview) -> int:
    """Address of a writable buffer's first byte (the ctypes view is dropped at once)."""
    return ctypes.addressof(ctypes.c_char.from_buffer(mv))


def _write_leaf(mv: memoryview, start: int, end: int, kind: int, source: Any, code: int) -> None:
    """Copy one leaf's values, C order, into mv[start:end] (all kinds but contiguous tensors)."""
    if kind == _NUMPY_DIRECT:
        mv[start:end] = source.reshape(-1).view(_np.uint8)
    elif kind == _RAW_BYTES:
        mv[start:end] = source
    elif kind == _NUMPY_STRIDED:
        target = _np.frombuffer(mv, _numpy_storage[code], source.size, start)
        _np.copyto(target.reshape(source.shape), source)
    else:
        _write_strided_tensor(mv, start, end, source, code)


def _write_strided_tensor(mv: memoryview, start: int, end: int, source: Any, code: int) -> None:
    """A strided, conj or neg tensor: resolved and made contiguous only now, in one copy."""
    torch = _torch
    numel = source.numel()
    target = _np.frombuffer(mv, _numpy_storage[code], numel, start)
    if target.__array_interface__["data"][0] & _ALIGN_MASK:
        # torch kernels assume naturally aligned elements (an unaligned
        # complex128 store faults); build the contiguous copy in torch memory.
        resolved = source.detach().resolve_conj().resolve_neg().contiguous()
        if code == _BFLOAT16_CODE:
            resolved = resolved.view(torch.int16)
        mv[start:end] = resolved.numpy().reshape(-1).view(_np.uint8)
        return
    destination = torch.from_numpy(target.reshape(tuple(source.shape)))
    if code == _BFLOAT16_CODE:
        destination = destination.view(torch.bfloat16)
    destination.copy_(source.detach())


def _prepare_bytes(obj: Any) -> EncodePlan:
    """A large top-level bytes payload: the msgpack bin header, then the bytes, copied once."""
    view = memoryview(obj).cast("B") if type(obj) is memoryview else obj
    size = len(view)
    if size > _U32_MAX:
        raise _unsupported(obj, f"msgpack bin is limited to 4 GiB: nbytes={size}")
    head = b"\xc6" + size.to_bytes(4, "big") if size > 0xFFFF else b"\xc5" + size.to_bytes(2, "big")
    leaves = [(_SHARED_AREA, 0, size, _RAW_BYTES, view, 0)]
    return EncodePlan(head, len(head) + size, len(head), len(head), leaves)


def prepare(obj: Any) -> EncodePlan:
    """Check and size the encoding of `obj` without copying tensor data.

    Raises `UnsupportedPayloadError` for anything the codec does not carry.
    """
    cls = type(obj)
    if cls is bytes:
        if len(obj) >= DIRECT_BYTES_MIN:
            return _prepare_bytes(obj)
        # Small bytes: msgpack bin, nothing to scan (what the general path encodes).
        head = _plain_encoder.encode(obj)
        return EncodePlan(head, len(head))
    if cls is bytearray and len(obj) >= DIRECT_BYTES_MIN:
        return _prepare_bytes(obj)
    if cls is memoryview and obj.nbytes >= DIRECT_BYTES_MIN:
        if not obj.c_contiguous:
            raise _unsupported(obj, "memoryview is not C-contiguous")
        return _prepare_bytes(obj)
    exts: set[int] = set()
    converted: dict[int, Any] = _NOTHING_CONVERTED
    try:
        leaf_count = _scan(obj, 0, exts, None)
    except _Rescan:
        exts.clear()
        converted = {}
        leaf_count = _scan(obj, 0, exts, converted)
    if leaf_count == 0 and not converted:
        try:
            head = _plain_encoder.encode(obj)
        except (OverflowError, UnicodeEncodeError) as error:
            raise UnsupportedPayloadError(f"cannot encode the payload: {error}") from error
        return EncodePlan(head, len(head))
    builder: _HeaderBuilder | None = getattr(_local, "builder", None)
    if builder is None or builder.busy:  # first use in this thread, or re-entered
        builder = _HeaderBuilder()
        if getattr(_local, "builder", None) is None:
            _local.builder = builder
    builder.busy = True
    builder.code = _choose_leaf_code(exts)
    builder.converted = converted
    leaves: list[tuple[int, int, int, int, Any, Any]] = []
    builder.leaves = leaves
    builder.shared_cursor = builder.own_cursor = 0
    try:
        header = builder.encoder.encode(obj)
    except (OverflowError, UnicodeEncodeError) as error:
        raise UnsupportedPayloadError(f"cannot encode the payload: {error}") from error
    finally:
        builder.busy = False
        builder.leaves = _NO_LEAVES  # the plan owns the list; the builder pins no tensor
        builder.converted = _NOTHING_CONVERTED
    header_length = len(header)
    shared_length = builder.shared_cursor
    if header_length > _U32_MAX:
        raise UnsupportedPayloadError(f"msgpack header larger than 4 GiB: nbytes={header_length}")
    data_start = (PREFIX_LENGTH + header_length + _ALIGN_MASK) & ~_ALIGN_MASK
    own_start = data_start + shared_length
    prefix = _PREFIX.pack(
        FRAMED_MARKER, FORMAT_VERSION, builder.code, 0, header_length, shared_length
    )
    return EncodePlan(
        prefix + header, own_start + builder.own_cursor, data_start, own_start, leaves
    )


def encode(obj: Any) -> bytes:
    """The whole encoding of `obj` as bytes (convenience; the ring uses `prepare`)."""
    plan = prepare(obj)
    if plan.nbytes == len(plan._head):
        return plan._head
    out = bytearray(plan.nbytes)
    plan.write_into(out)
    return bytes(out)


# -- decoding -----------------------------------------------------------------------


def _corrupt(message: str) -> CorruptFrameError:
    return CorruptFrameError(f"corrupt payload: {message}")


def _check_type(expected: type, obj: Any) -> Any:
    """dec_hook for `decode(..., type=...)`: leaves already are tensors or arrays."""
    if isinstance(obj, expected):
        return obj
    raise TypeError(f"expected {expected.__qualname__}, got {_type_name(obj)}")


class _LeafReader:
    """Per-thread msgspec decoder whose ext_hook turns descriptors back into leaves.

    A msgspec Decoder costs about a microsecond to build, more than a small
    message takes to decode, so each thread keeps one and points its state at
    the message being read. Nothing here outlives a `decode` call: `src` and
    `shared` are dropped in its `finally`.
    """

    __slots__ = (
        "busy",
        "code",
        "decoder",
        "own_cursor",
        "own_length",
        "own_start",
        "shared",
        "shared_cursor",
        "shared_length",
        "src",
        "tagged",
        "typed",
    )

    def __init__(self) -> None:
        self.decoder = Decoder(ext_hook=self._leaf)
        self.tagged = False  # the message holds registered objects (rebuilt after decoding)
        self.typed: dict[Any, Decoder[Any]] = {}
        self.busy = False
        self.src: memoryview | None = None
        self.shared: bytearray | None = None
        self.code = DEFAULT_LEAF_EXT_CODE
        self.shared_cursor = self.shared_length = 0
        self.own_cursor = self.own_length = self.own_start = 0

    def decoder_for(self, type_: Any) -> Decoder[Any]:
        if type_ is None:
            return self.decoder
        decoder = self.typed.get(type_)
        if decoder is None:
            decoder = Decoder(type=type_, ext_hook=self._leaf, dec_hook=_check_type)
            self.typed[type_] = decoder
        return decoder

    def _leaf(self, code: int, data: memoryview) -> Any:
        if code != self.code:
            return Ext(code, bytes(data))
        if len(data) and data[0] == _TYPE_TAG:
            self.tagged = True
            try:
                return _TypeTag(bytes(data[1:]).decode("utf-8"))
            except UnicodeDecodeError as error:
                raise _corrupt(f"type tag is not UTF-8: {error}") from None
        if len(data) < DESCRIPTOR_LENGTH:
            raise _corrupt(f"leaf descriptor too short: length={len(data)}")
        dtype_code, area, ndim, reserved, offset = _DESCRIPTOR.unpack_from(data)
        if ndim > MAX_NDIM or len(data) != DESCRIPTOR_LENGTH + 8 * ndim or reserved:
            raise _corrupt(
                f"bad leaf descriptor: ndim={ndim} length={len(data)} reserved={reserved}"
            )
        shape = _DIMS_BY_NDIM[ndim].unpack_from(data, DESCRIPTOR_LENGTH)
        is_numpy = dtype_code & _NUMPY_FLAG
        dtype_code &= ~_NUMPY_FLAG
        if dtype_code >= len(_DTYPES) or (is_numpy and dtype_code == _BFLOAT16_CODE):
            raise _corrupt(f"unknown leaf dtype code: code={dtype_code} numpy={bool(is_numpy)}")
        numel = math.prod(shape)
        nbytes = numel * _ITEMSIZES[dtype_code]
        padded = (nbytes + _ALIGN_MASK) & ~_ALIGN_MASK
        if area == _SHARED_AREA:
            if offset != self.shared_cursor or offset + padded > self.shared_length:
                raise _corrupt(
                    f"shared leaf out of place: offset={offset} nbytes={nbytes} "
                    f"expected_offset={self.shared_cursor} area_length={self.shared_length}"
                )
            self.shared_cursor = offset + padded
            storage: Any = self.shared
            start = offset
        elif area == _OWN_AREA:
            if offset != self.own_cursor or offset + padded > self.own_length:
                raise _corrupt(
                    f"own leaf out of place: offset={offset} nbytes={nbytes} "
                    f"expected_offset={self.own_cursor} area_length={self.own_length}"
                )
            self.own_cursor = offset + padded
            begin = self.own_start + offset
            assert self.src is not None
            storage = bytearray(self.src[begin : begin + nbytes]) if nbytes else None
            start = 0
        else:
            raise _corrupt(f"unknown leaf area: area={area}")
        numpy = _np or _numpy()
        storage_dtype = _numpy_storage[dtype_code]
        try:
            if nbytes:
                if dtype_code == _BOOL_CODE and _has_non_bool_byte(storage, start, nbytes):
                    raise _corrupt("bool leaf holds a byte other than 0 or 1")
                array = numpy.frombuffer(storage, storage_dtype, numel, start)
                if ndim != 1:
                    array = array.reshape(shape)
            else:
                array = numpy.empty(shape, storage_dtype)
            if is_numpy:
                array.flags.writeable = False
                return array
            torch = _torch or _torch_module()
            tensor = torch.from_numpy(array)
            if dtype_code == _BFLOAT16_CODE:
                tensor = tensor.view(torch.bfloat16)
            return tensor
        except (ValueError, TypeError, OverflowError, RuntimeError) as error:
            if isinstance(error, CorruptFrameError):
                raise
            raise _corrupt(f"leaf shape={shape} does not make an array: {error}") from error


class _TypeTag:
    """A decoded type tag: the name of the registered class whose state follows it."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name


def _rebuild(obj: Any, depth: int) -> Any:
    """Replace every ``[tag, state]`` pair in a freshly decoded tree by its registered object."""
    if depth > _MAX_REBUILD_DEPTH:
        raise _corrupt(f"registered objects nested deeper than {_MAX_REBUILD_DEPTH}")
    cls = type(obj)
    if cls is list:
        if len(obj) == 2 and type(obj[0]) is _TypeTag:
            name = obj[0].name
            state = _rebuild(obj[1], depth + 1)
            codec = extensions.codec_for_name(name)
            if codec is None:
                raise _corrupt(
                    f"payload holds an object of unregistered type name={name!r}; "
                    "register it with shmring.register_type on this side too"
                )
            try:
                return codec.decode(state)
            except Exception as error:
                raise _corrupt(f"cannot rebuild a {name}: {error!r}") from error
        for index, value in enumerate(obj):
            if type(value) is list or type(value) is dict or type(value) is _TypeTag:
                obj[index] = _rebuild(value, depth + 1)
    elif cls is dict:
        for key, value in obj.items():
            if type(key) is _TypeTag:
                raise _corrupt("a type tag as a dict key")
            if type(value) is list or type(value) is dict or type(value) is _TypeTag:
                obj[key] = _rebuild(value, depth + 1)
    elif cls is _TypeTag:
        raise _corrupt(f"type tag name={obj.name!r} outside a [tag, state] pair")
    return obj


def _has_non_bool_byte(storage: Any, start: int, nbytes: int) -> bool:
    if nbytes == 1:
        return bool(storage[start] > 1)
    return bool(_np.frombuffer(storage, _np.uint8, nbytes, start).max() > 1)


# What msgspec raises for malformed msgpack: DecodeError (ValidationError is
# one), UnicodeDecodeError for bad UTF-8, RecursionError for deep nesting.
_MSGPACK_ERRORS: Final = (msgspec.DecodeError, UnicodeDecodeError, RecursionError)
_plain_decoder: Final = Decoder()
_plain_typed: dict[Any, Decoder[Any]] = {}


def _plain_decoder_for(type_: Any) -> Decoder[Any]:
    if type_ is None:
        return _plain_decoder
    decoder = _plain_typed.get(type_)
    if decoder is None:
        decoder = Decoder(type=type_, dec_hook=_check_type)
        _plain_typed[type_] = decoder
    return decoder


def decode(buf: Any, *, type: Any = None) -> Any:
    """Decode one encoding into independently owned objects.

    `buf` (bytes, bytearray, memoryview, mmap) must hold exactly one
    encoding (trailing bytes are corruption) and is only read during the
    call: no result refers to it and no view of it outlives the call, also
    when it raises. With `type`, msgspec validates the tree against
    it (e.g. a Struct class); leaves match ``torch.Tensor`` / ``numpy.ndarray``
    annotations. Any malformed, truncated or inconsistent input, and a tree
    that does not match `type`, raises `CorruptFrameError` (msgspec's error
    in ``__cause__``); nothing is read outside `buf` and no allocation exceeds
    its size.
    """
    # Both views are released on the way out, also when an error (whose
    # traceback keeps these frames alive) leaves: a retained CorruptFrameError
    # must not stop the caller from closing or resizing its mapping.
    view = memoryview(buf)
    src = view
    try:
        if src.itemsize != 1 or src.ndim != 1:
            try:
                src = view.cast("B")
            except TypeError as error:
                raise _corrupt(f"payload is not a contiguous buffer: {error}") from None
        length = len(src)
        if length == 0:
            raise _corrupt("empty payload")
        if src[0] != FRAMED_MARKER:
            try:
                decoder = _plain_decoder if type is None else _plain_decoder_for(type)
                return decoder.decode(src)
            except _MSGPACK_ERRORS as error:  # DecodeError, bad UTF-8, nesting
                raise _corrupt(f"msgpack: {error}: nbytes={length}") from error
        return _decode_framed(src, length, type)
    finally:
        src.release()
        view.release()


def _decode_framed(src: memoryview, length: int, type_: Any) -> Any:
    if length < PREFIX_LENGTH:
        raise _corrupt(f"framed payload shorter than its prefix: nbytes={length}")
    _, version, code, flags, header_length, shared_length = _PREFIX.unpack_from(src)
    if version != FORMAT_VERSION or flags:
        raise _corrupt(f"unknown format: version={version} flags={flags}")
    header_end = PREFIX_LENGTH + header_length
    data_start = (header_end + _ALIGN_MASK) & ~_ALIGN_MASK
    own_start = data_start + shared_length
    if own_start > length or shared_length & _ALIGN_MASK or code == TIMESTAMP_EXT_CODE:
        raise _corrupt(
            f"bad prefix: header_length={header_length} shared_length={shared_length} "
            f"leaf_code={code} nbytes={length}"
        )
    reader: _LeafReader | None = getattr(_local, "reader", None)
    if reader is None or reader.busy:  # first use in this thread, or re-entered
        reader = _LeafReader()
        if getattr(_local, "reader", None) is None:
            _local.reader = reader
    reader.busy = True
    reader.src = src
    reader.code = code
    reader.shared = bytearray(src[data_start:own_start]) if shared_length else None
    reader.shared_cursor = 0
    reader.shared_length = shared_length
    reader.own_cursor = 0
    reader.own_start = own_start
    reader.own_length = length - own_start
    reader.tagged = False
    try:
        # The header is copied (it is small) so that the ext_hook's views, which
        # an error's traceback may keep, never point into the caller's buffer.
        result = reader.decoder_for(type_).decode(bytes(src[PREFIX_LENGTH:header_end]))
        if reader.shared_cursor != shared_length or reader.own_cursor != reader.own_length:
            raise _corrupt(
                f"leaves do not cover the data: shared={reader.shared_cursor}/{shared_length} "
                f"own={reader.own_cursor}/{reader.own_length}"
            )
        if reader.tagged:
            return _rebuild(result, 0)
        return result
    except CorruptFrameError:
        raise
    except _MSGPACK_ERRORS as error:
        raise _corrupt(f"msgpack header: {error}: nbytes={length}") from error
    finally:
        reader.busy = False
        reader.src = None
        reader.shared = None


__all__ = [
    "DEFAULT_LEAF_EXT_CODE",
    "FORMAT_VERSION",
    "FRAMED_MARKER",
    "MAX_NDIM",
    "MAX_NESTING",
    "NUMPY_DTYPE_NAMES",
    "REGION_ALIGNMENT",
    "SHARED_AREA_LIMIT",
    "SHARED_LEAF_LIMIT",
    "TORCH_DTYPE_NAMES",
    "EncodePlan",
    "decode",
    "encode",
    "prepare",
]
