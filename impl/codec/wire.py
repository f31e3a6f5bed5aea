"""The codec's wire vocabulary: limits, dtype codes, leaf copy kinds, lazy torch / numpy tables.

The byte layout of a framed payload (prefix, leaf descriptor, areas) is
written down once, in `shmring.spec.layout` (the codec block); this module
turns it into the struct packers the encoder and decoder share, and holds
what the layout does not fix: which ext codes a message may use, the size
limits, the dtype code table and how a leaf is copied.

torch and numpy are imported only when a payload holds one of their objects
(`load_numpy`, `load_torch`); the tables they fill are filled in place, so a
module that imported a table by name sees it filled.
"""

from __future__ import annotations

import struct
from typing import Any, Final

from ...spec.layout import (
    CODEC_DESCRIPTOR_FORMAT,
    CODEC_PREFIX_FORMAT,
    CODEC_REGION_ALIGNMENT,
    codec_descriptor_format,
    codec_dimensions_format,
)
from ..errors import UnsupportedPayloadError
from ..extras import import_extra

# -- ext codes and limits ---------------------------------------------------------

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

# -- packers of the layout's formats ----------------------------------------------

_PREFIX: Final = struct.Struct(CODEC_PREFIX_FORMAT)
_DESCRIPTOR: Final = struct.Struct(CODEC_DESCRIPTOR_FORMAT)
# One packer per rank: descriptor head and dimensions in a single call.
_DESCRIPTOR_BY_NDIM: Final = tuple(
    struct.Struct(codec_descriptor_format(n)) for n in range(MAX_NDIM + 1)
)
_DIMS_BY_NDIM: Final = tuple(struct.Struct(codec_dimensions_format(n)) for n in range(MAX_NDIM + 1))
_ALIGN_MASK: Final = CODEC_REGION_ALIGNMENT - 1
_ZEROS: Final = bytes(CODEC_REGION_ALIGNMENT)
_U32_MAX: Final = 0xFFFFFFFF

# -- dtypes -----------------------------------------------------------------------

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

# -- lazy torch / numpy tables ----------------------------------------------------

_np: Any = None
_numpy_codes: dict[Any, int] = {}  # numpy dtype -> dtype code
_numpy_storage: list[Any] = []  # dtype code -> numpy storage dtype
_torch: Any = None
_torch_codes: dict[Any, int] = {}  # torch dtype -> dtype code


def load_numpy() -> Any:
    """Import numpy on first use and fill its dtype tables; the numpy module."""
    global _np
    if _np is None:
        import numpy

        _numpy_storage[:] = [numpy.dtype(storage) for _, storage, _ in _DTYPES]
        _numpy_codes.update(
            {
                numpy.dtype(name): code
                for code, (name, _, _) in enumerate(_DTYPES)
                if code != _BFLOAT16_CODE
            }
        )
        _np = numpy
    return _np


def load_torch() -> Any:
    """Import torch (and numpy) on first use (only a frame that holds a tensor gets here)."""
    global _torch
    if _torch is None:
        torch = import_extra("torch", "a tensor payload")

        load_numpy()
        _torch_codes.update(
            {getattr(torch, name): code for code, (name, _, _) in enumerate(_DTYPES)}
        )
        _torch = torch
    return _torch


# -- errors -----------------------------------------------------------------------


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
    if tensor.layout is not load_torch().strided:
        return _unsupported(tensor, f"layout={tensor.layout}")
    if not tensor.is_cpu:
        return _unsupported(tensor, f"device={tensor.device}; move it to the CPU first")
    if tensor.is_quantized:
        return _unsupported(tensor, f"quantized dtype={tensor.dtype}")
    return _unsupported(tensor, f"dtype={tensor.dtype}")
