"""Encoding: `prepare` sizes a payload's encoding, `EncodePlan.write_into` writes it.

Tensor data never goes through msgpack. Each CPU tensor or numpy array (a
*leaf*) becomes a small msgpack ``Ext`` descriptor in the header and a raw,
16-byte aligned region after it (layout: `shmring.spec.layout`, the codec
block). `prepare` sizes the whole encoding without touching tensor data, so
the ring can decide admission (or size a fallback segment) before anything is
copied; `EncodePlan.write_into` then copies each leaf straight into the
destination (an mmap slice), resolving conj/neg bits and non-contiguous
layouts in that one pass (torch's copy_ into the destination; through a
temporary when the destination is not 16-byte aligned, because torch faults
on unaligned complex stores). A payload without leaves is plain msgpack.

A leaf of `SHARED_LEAF_LIMIT` bytes or more (or one that would push the
shared area past `SHARED_AREA_LIMIT`) is placed in the own area, so that the
decoder gives it its own allocation.
"""

from __future__ import annotations

import contextlib
import ctypes
import sys
import threading
from typing import Any, Final

from msgspec.msgpack import Encoder, Ext

from ...spec.layout import (
    CODEC_FORMAT_VERSION,
    CODEC_FRAMED_MARKER,
    CODEC_NUMPY_FLAG,
    CODEC_OWN_AREA,
    CODEC_PREFIX_LENGTH,
    CODEC_SHARED_AREA,
)
from ..errors import UnsupportedPayloadError
from .scan import _choose_leaf_code, _Rescan, _scan, has_registered, substitute
from .wire import (
    _ALIGN_MASK,
    _BFLOAT16_CODE,
    _DESCRIPTOR_BY_NDIM,
    _ITEMSIZES,
    _NUMPY_DIRECT,
    _NUMPY_STRIDED,
    _PREFIX,
    _RAW_BYTES,
    _TORCH_DIRECT,
    _TORCH_STRIDED,
    _U32_MAX,
    _ZEROS,
    DEFAULT_LEAF_EXT_CODE,
    DIRECT_BYTES_MIN,
    SHARED_AREA_LIMIT,
    SHARED_LEAF_LIMIT,
    _numpy_codes,
    _numpy_storage,
    _torch_codes,
    _type_name,
    _unsupported,
    _unsupported_tensor,
    load_numpy,
    load_torch,
)

_NO_LEAVES: Final[list[Any]] = []  # never appended to: set while no message is being built

# numpy and torch once a payload held one of their objects (`wire.load_*`).
_np: Any = None
_torch: Any = None


def _numpy() -> Any:
    global _np
    _np = load_numpy()
    return _np


def _torch_module() -> Any:
    global _np, _torch
    _torch = load_torch()
    _np = load_numpy()
    return _torch


def _refuse_in_plain_tree(obj: Any) -> Any:
    """enc_hook for leaf-free payloads: the walk already refused everything else."""
    raise _unsupported(obj)


class _HeaderBuilder:
    """Per-thread msgspec encoder whose enc_hook turns leaves into descriptors.

    The hook needs per-message state (ext code, cursors, the leaf list); one
    builder per thread keeps the encoder and the bound hook alive between
    messages instead of rebuilding them on every put.
    """

    __slots__ = ("busy", "code", "encoder", "leaves", "own_cursor", "shared_cursor")

    def __init__(self) -> None:
        self.encoder = Encoder(enc_hook=self._leaf_descriptor)
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
            return CODEC_SHARED_AREA, cursor
        cursor = self.own_cursor
        self.own_cursor = cursor + padded
        return CODEC_OWN_AREA, cursor

    def _leaf_descriptor(self, obj: Any) -> Any:
        # Converted objects (slices, registered ones, ...) were substituted before
        # encoding (`scan.substitute`): only leaves reach this hook.
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
        if _np is None:
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
            _DESCRIPTOR_BY_NDIM[ndim].pack(code | CODEC_NUMPY_FLAG, area, ndim, 0, offset, *shape),
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

    def parts(self) -> tuple[bytes, Any] | None:
        """(header, bytes-like body) when the encoding is exactly header + body, else None.

        A large top-level bytes payload (`DIRECT_BYTES_MIN` or more) encodes
        as a msgpack bin header and the bytes themselves: a transport may
        copy the two pieces as they are instead of calling `write_into`
        (what `write_into` would write, byte for byte).
        """
        leaves = self._leaves
        if len(leaves) != 1:
            return None
        area, offset, size, kind, source, _ = leaves[0]
        head = self._head
        if (
            kind != _RAW_BYTES
            or area != CODEC_SHARED_AREA
            or offset
            or self._data_start != len(head)
            or self.nbytes != len(head) + size
        ):
            return None
        return head, source

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
            start = (data_start if area == CODEC_SHARED_AREA else own_start) + offset
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
    leaves = [(CODEC_SHARED_AREA, 0, size, _RAW_BYTES, view, 0)]
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
    tree = obj
    code = DEFAULT_LEAF_EXT_CODE
    tagged = False
    try:
        leaf_count = _scan(obj, 0, exts, None)
    except _Rescan:
        # Slices, dataclasses, enums, sets, registered objects: the tree msgspec
        # encodes has each replaced by what it travels as.
        exts.clear()
        converted: dict[int, Any] = {}
        leaf_count = _scan(obj, 0, exts, converted)
        code = _choose_leaf_code(exts)
        tagged = has_registered(converted)
        tree = substitute(obj, converted, code)
    else:
        if leaf_count:
            code = _choose_leaf_code(exts)
    if leaf_count == 0 and not tagged:
        try:
            head = _plain_encoder.encode(tree)
        except (OverflowError, UnicodeEncodeError) as error:
            raise UnsupportedPayloadError(f"cannot encode the payload: {error}") from error
        return EncodePlan(head, len(head))
    builder: _HeaderBuilder | None = getattr(_local, "builder", None)
    if builder is None or builder.busy:  # first use in this thread, or re-entered
        builder = _HeaderBuilder()
        if getattr(_local, "builder", None) is None:
            _local.builder = builder
    builder.busy = True
    builder.code = code
    leaves: list[tuple[int, int, int, int, Any, Any]] = []
    builder.leaves = leaves
    builder.shared_cursor = builder.own_cursor = 0
    try:
        header = builder.encoder.encode(tree)
    except (OverflowError, UnicodeEncodeError) as error:
        raise UnsupportedPayloadError(f"cannot encode the payload: {error}") from error
    finally:
        builder.busy = False
        builder.leaves = _NO_LEAVES  # the plan owns the list; the builder pins no tensor
    header_length = len(header)
    shared_length = builder.shared_cursor
    if header_length > _U32_MAX:
        raise UnsupportedPayloadError(f"msgpack header larger than 4 GiB: nbytes={header_length}")
    data_start = (CODEC_PREFIX_LENGTH + header_length + _ALIGN_MASK) & ~_ALIGN_MASK
    own_start = data_start + shared_length
    prefix = _PREFIX.pack(
        CODEC_FRAMED_MARKER, CODEC_FORMAT_VERSION, builder.code, 0, header_length, shared_length
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
