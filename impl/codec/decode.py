"""Decoding: one encoding back into independently owned objects.

Leaves appear in each area in header order, densely packed: the decoder
checks that every offset is exactly where the previous leaf of its area ended
and that both areas are covered to the byte, so a forged header can neither
overlap regions, read out of bounds nor make the decoder allocate more than
the input's size (layout: `shmring.spec.layout`, the codec block).

Ownership on decode. Nothing returned is a view of the input buffer: the
ring frame is reused as soon as the get returns. The shared area is copied
once into one ``bytearray`` and every small leaf is a view of it; a leaf in
the own area gets its own allocation, so a small leaf the receiver keeps
cannot pin a large tensor. What the receiver owns is writable: torch tensors
and numpy arrays alike (issue 27); only a borrowed view is read-only.

Borrowed decode (`decode_borrowed`, a connector's `get(..., borrow=True)`).
The input is a `ring.borrow.BorrowedPayload`: the claimed payload, in place.
Own-area leaves (tensors and arrays of `SHARED_LEAF_LIMIT` bytes or more)
and bytes values of `BORROWED_BYTES_MIN` bytes or more are views of it
(numpy read-only, bytes as read-only memoryviews, tensors over a writable
`tensor_face`); the rest (the shared area, small bytes, every other value)
is copied as above. The views hold the payload: the frame stays claimed
until the last one dies. Large bytes values sit inline in the msgpack: the
decoder hands msgspec a header in which each is an Ext naming its place
(`bins`: the msgpack item walk that finds them); the checks are the same.
"""

from __future__ import annotations

import math
import threading
from typing import Any, Final

import msgspec
from msgspec.msgpack import Decoder, Ext

from ...spec.layout import (
    CODEC_DESCRIPTOR_DIMENSIONS_OFFSET,
    CODEC_DESCRIPTOR_LENGTH,
    CODEC_DIMENSION_LENGTH,
    CODEC_FORMAT_VERSION,
    CODEC_FRAMED_MARKER,
    CODEC_NUMPY_FLAG,
    CODEC_OWN_AREA,
    CODEC_PREFIX_LENGTH,
    CODEC_SHARED_AREA,
    CODEC_TYPE_TAG,
)
from ..errors import CorruptFrameError
from ..ring.borrow import BorrowedPayload, tensor_face
from . import fresh
from .bins import (
    _BIN_EXT_DATA_LENGTH,
    _BORROWED_BIN_TAG,
    BORROWED_BYTES_MIN,
    _borrowed_header,
    _large_bins,
    _with_bin_exts,
)
from .rebuild import _corrupt, _rebuild, _TypeTag
from .wire import (
    _ALIGN_MASK,
    _BFLOAT16_CODE,
    _BOOL_CODE,
    _DESCRIPTOR,
    _DIMS_BY_NDIM,
    _DTYPES,
    _ITEMSIZES,
    _LEAF_CODE_CANDIDATES,
    _PREFIX,
    DEFAULT_LEAF_EXT_CODE,
    MAX_NDIM,
    TIMESTAMP_EXT_CODE,
    _numpy_storage,
    _type_name,
    load_numpy,
    load_torch,
)

# numpy and torch once a payload held one of their objects (`wire.load_*`).
_np: Any = None
_torch: Any = None
_local = threading.local()  # the per-thread `_LeafReader`


def _numpy() -> Any:
    global _np
    _np = load_numpy()
    return _np


def _torch_module() -> Any:
    global _torch
    _torch = load_torch()
    return _torch


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
        "bin_cursor",
        "bins",
        "busy",
        "code",
        "decoder",
        "own_cursor",
        "own_length",
        "own_start",
        "payload",
        "root",
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
        self.root: Any = None  # borrowed decode: the payload as a read-only uint8 array
        self.payload: BorrowedPayload | None = None  # borrowed decode: what the views hold
        self.bins: list[tuple[int, int]] = []  # borrowed decode: large bins, (start, end) in `root`
        self.bin_cursor = 0

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
        if self.root is not None and len(data) and data[0] == _BORROWED_BIN_TAG:
            return self._borrowed_bin(data)
        if len(data) and data[0] == CODEC_TYPE_TAG:
            self.tagged = True
            try:
                return _TypeTag(bytes(data[1:]).decode("utf-8"))
            except UnicodeDecodeError as error:
                raise _corrupt(f"type tag is not UTF-8: {error}") from None
        if len(data) < CODEC_DESCRIPTOR_LENGTH:
            raise _corrupt(f"leaf descriptor too short: length={len(data)}")
        dtype_code, area, ndim, reserved, offset = _DESCRIPTOR.unpack_from(data)
        if (
            ndim > MAX_NDIM
            or len(data) != CODEC_DESCRIPTOR_LENGTH + CODEC_DIMENSION_LENGTH * ndim
            or reserved
        ):
            raise _corrupt(
                f"bad leaf descriptor: ndim={ndim} length={len(data)} reserved={reserved}"
            )
        shape = _DIMS_BY_NDIM[ndim].unpack_from(data, CODEC_DESCRIPTOR_DIMENSIONS_OFFSET)
        is_numpy = dtype_code & CODEC_NUMPY_FLAG
        dtype_code &= ~CODEC_NUMPY_FLAG
        if dtype_code >= len(_DTYPES) or (is_numpy and dtype_code == _BFLOAT16_CODE):
            raise _corrupt(f"unknown leaf dtype code: code={dtype_code} numpy={bool(is_numpy)}")
        numel = math.prod(shape)
        nbytes = numel * _ITEMSIZES[dtype_code]
        padded = (nbytes + _ALIGN_MASK) & ~_ALIGN_MASK
        if area == CODEC_SHARED_AREA:
            if offset != self.shared_cursor or offset + padded > self.shared_length:
                raise _corrupt(
                    f"shared leaf out of place: offset={offset} nbytes={nbytes} "
                    f"expected_offset={self.shared_cursor} area_length={self.shared_length}"
                )
            self.shared_cursor = offset + padded
            storage: Any = self.shared
            start = offset
        elif area == CODEC_OWN_AREA:
            if offset != self.own_cursor or offset + padded > self.own_length:
                raise _corrupt(
                    f"own leaf out of place: offset={offset} nbytes={nbytes} "
                    f"expected_offset={self.own_cursor} area_length={self.own_length}"
                )
            self.own_cursor = offset + padded
            begin = self.own_start + offset
            if self.root is not None and nbytes:
                # Borrowed: a view of the claimed payload (numpy read-only; torch
                # has no read-only tensors, so a writable face that holds it).
                if is_numpy:
                    storage, start = self.root, begin
                else:
                    assert self.payload is not None
                    storage = (_np or _numpy()).asarray(tensor_face(self.payload, begin, nbytes))
                    start = 0
            else:
                assert self.src is not None
                storage = (
                    fresh.owned_bytearray(self.src[begin : begin + nbytes]) if nbytes else None
                )
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
                # Writeable when it is the receiver's own copy; a borrowed view of
                # the claimed payload is read-only (its buffer is).
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

    def _borrowed_bin(self, data: memoryview) -> memoryview:
        """The large bin a borrowed decode replaced by this Ext: a read-only view of the payload."""
        index = int.from_bytes(data[1:], "big")
        if len(data) != _BIN_EXT_DATA_LENGTH or index != self.bin_cursor or index >= len(self.bins):
            raise _corrupt(f"borrowed bytes out of place: index={index} length={len(data)}")
        self.bin_cursor = index + 1
        start, end = self.bins[index]
        return memoryview(self.root[start:end])


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


def decode_borrowed(payload: BorrowedPayload, *, type: Any = None) -> Any:
    """Decode a claimed payload in place: its large leaves are views that hold `payload`.

    What is borrowed and what is copied: see the module docstring. The same
    checks as `decode`, the same errors; a value without large leaves holds
    nothing of `payload` (the caller then sees it die at once).
    """
    numpy = _np or _numpy()
    root = numpy.asarray(payload)  # read-only uint8, its base is `payload`
    src = memoryview(root)
    try:
        length = len(src)
        if length == 0:
            raise _corrupt("empty payload")
        if src[0] == CODEC_FRAMED_MARKER:
            return _decode_framed(src, length, type, root, payload)
        bins: list[tuple[int, int, int]] = []
        if length >= BORROWED_BYTES_MIN:
            bins, codes = _large_bins(src, 0, length)
        if not bins:
            try:
                decoder = _plain_decoder if type is None else _plain_decoder_for(type)
                return decoder.decode(src)
            except _MSGPACK_ERRORS as error:
                raise _corrupt(f"msgpack: {error}: nbytes={length}") from error
        # Large bins in a plain payload: an ext code the payload does not use stands for them.
        code = next(c for c in (DEFAULT_LEAF_EXT_CODE, *_LEAF_CODE_CANDIDATES) if c not in codes)
        reader = _take_reader()
        _point(reader, src, code, root, payload, length, length, length)  # no areas
        reader.bins = [(data_start, data_end) for _, data_start, data_end in bins]
        try:
            result = reader.decoder_for(type).decode(_with_bin_exts(src, 0, length, bins, code))
            _check_covered(reader, 0)
            return _rebuild(result, 0) if reader.tagged else result
        except CorruptFrameError:
            raise
        except _MSGPACK_ERRORS as error:
            raise _corrupt(f"msgpack: {error}: nbytes={length}") from error
        finally:
            _unpoint(reader)
    finally:
        src.release()


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
        if src[0] != CODEC_FRAMED_MARKER:
            if type is None and length >= fresh.min_bytes:
                value = fresh.owned_bin(src)  # a large top-level bytes: huge-page-advised copy
                if value is not None:
                    return value
            try:
                decoder = _plain_decoder if type is None else _plain_decoder_for(type)
                return decoder.decode(src)
            except _MSGPACK_ERRORS as error:  # DecodeError, bad UTF-8, nesting
                raise _corrupt(f"msgpack: {error}: nbytes={length}") from error
        return _decode_framed(src, length, type)
    finally:
        src.release()
        view.release()


def _take_reader() -> _LeafReader:
    """This thread's `_LeafReader`, or a fresh one when it is busy (a re-entered decode)."""
    reader: _LeafReader | None = getattr(_local, "reader", None)
    if reader is None or reader.busy:  # first use in this thread, or re-entered
        reader = _LeafReader()
        if getattr(_local, "reader", None) is None:
            _local.reader = reader
    return reader


def _point(
    reader: _LeafReader,
    src: memoryview,
    code: int,
    root: Any,
    payload: BorrowedPayload | None,
    data_start: int,
    own_start: int,
    length: int,
) -> None:
    """Point `reader` at one message (undone by `_unpoint`)."""
    reader.busy = True
    reader.src = src
    reader.code = code
    shared_length = own_start - data_start
    reader.shared = bytearray(src[data_start:own_start]) if shared_length else None
    reader.shared_cursor = 0
    reader.shared_length = shared_length
    reader.own_cursor = 0
    reader.own_start = own_start
    reader.own_length = length - own_start
    reader.tagged = False
    reader.root = root
    reader.payload = payload
    reader.bin_cursor = 0


def _unpoint(reader: _LeafReader) -> None:
    reader.busy = False
    reader.src = None
    reader.shared = None
    reader.root = None
    reader.payload = None
    reader.bins = []
    reader.bin_cursor = 0


def _check_covered(reader: _LeafReader, shared_length: int) -> None:
    if (
        reader.shared_cursor != shared_length
        or reader.own_cursor != reader.own_length
        or reader.bin_cursor != len(reader.bins)
    ):
        raise _corrupt(
            f"leaves do not cover the data: shared={reader.shared_cursor}/{shared_length} "
            f"own={reader.own_cursor}/{reader.own_length}"
        )


def _decode_framed(
    src: memoryview,
    length: int,
    type_: Any,
    root: Any = None,
    payload: BorrowedPayload | None = None,
) -> Any:
    if length < CODEC_PREFIX_LENGTH:
        raise _corrupt(f"framed payload shorter than its prefix: nbytes={length}")
    _, version, code, flags, header_length, shared_length = _PREFIX.unpack_from(src)
    if version != CODEC_FORMAT_VERSION or flags:
        raise _corrupt(f"unknown format: version={version} flags={flags}")
    header_end = CODEC_PREFIX_LENGTH + header_length
    data_start = (header_end + _ALIGN_MASK) & ~_ALIGN_MASK
    own_start = data_start + shared_length
    if own_start > length or shared_length & _ALIGN_MASK or code == TIMESTAMP_EXT_CODE:
        raise _corrupt(
            f"bad prefix: header_length={header_length} shared_length={shared_length} "
            f"leaf_code={code} nbytes={length}"
        )
    reader: _LeafReader | None = getattr(_local, "reader", None)
    if reader is None or reader.busy:  # first use in this thread, or re-entered
        reader = _take_reader()
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
        if root is None:
            header = bytes(src[CODEC_PREFIX_LENGTH:header_end])
        else:
            reader.root = root
            reader.payload = payload
            reader.bin_cursor = 0
            reader.bins, header = _borrowed_header(src, CODEC_PREFIX_LENGTH, header_end, code)
        result = reader.decoder_for(type_).decode(header)
        if (
            reader.shared_cursor != shared_length
            or reader.own_cursor != reader.own_length
            or (root is not None and reader.bin_cursor != len(reader.bins))
        ):
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
        if root is not None:
            _unpoint(reader)
