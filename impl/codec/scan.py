"""What travels: the walk that counts a payload's leaves and refuses what does not travel.

The walk runs before anything is encoded (`shmring.impl.codec.encode.prepare`):
it counts the tensors and arrays (the leaves), collects the payload's own
``Ext`` codes so the message's leaf ext code can avoid them, converts slices
and registered objects once, and raises `UnsupportedPayloadError` for every
type the codec does not carry (see the package docstring for the list).
"""

from __future__ import annotations

import sys
from typing import Any, Final

import msgspec
from msgspec.msgpack import Ext

from .. import extensions
from ..errors import UnsupportedPayloadError
from .wire import (
    _LEAF_CODE_CANDIDATES,
    DEFAULT_LEAF_EXT_CODE,
    MAX_NESTING,
    TIMESTAMP_EXT_CODE,
    _unsupported,
)

_SCALAR_TYPES: Final = frozenset({str, int, float, bool, type(None), bytes, bytearray})
_KEY_TYPES: Final = frozenset({str, int, float, bool, type(None), bytes})


def _is_leaf(obj: object) -> bool:
    """A torch tensor or numpy array, found without importing either module."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(obj, torch.Tensor):
        return True
    numpy = sys.modules.get("numpy")
    return numpy is not None and type(obj) is numpy.ndarray


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
