"""What travels: the walk that counts a payload's leaves and refuses what does not travel.

The walk runs before anything is encoded (`shmring.impl.codec.encode.prepare`):
it counts the tensors and arrays (the leaves), collects the payload's own
``Ext`` codes so the message's leaf ext code can avoid them, converts slices,
dataclasses, attrs classes, enums, sets and registered objects once, and
raises `UnsupportedPayloadError` for every type the codec does not carry
(see the package docstring for the list).

Registered types win (issue 27): a class registered with
`shmring.impl.extensions.register_type` travels through its own functions
whatever else it is (a dataclass, an attrs class, an enum, a msgspec
Struct, a dict subclass). msgspec encodes dataclasses, enums and sets
natively, before any ``enc_hook`` runs, so a conversion cannot wait for the
hook: `substitute` builds the tree msgspec then encodes, each converted
object replaced by what it travels as.
"""

from __future__ import annotations

import dataclasses
import enum
import sys
from typing import Any, Final

import msgspec
from msgspec.msgpack import Ext

from ...spec.layout import CODEC_TYPE_TAG
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

    The walk exists because msgspec would silently encode datetimes, numpy
    scalars and subclasses of the scalar types; the codec refuses them so
    nothing comes back as a different kind of object than the caller sent
    without being documented. Slices, dataclasses, attrs classes, enums,
    sets and registered objects are converted here, once: `converted` maps
    the id of each to ``(obj, replacement)``, where the replacement is what
    it travels as (`Registered` for a registered object). Most payloads hold
    none, so the first walk goes without the dict (None) and `_Rescan` asks
    for a second walk with one when it meets such an object.
    """
    cls = type(obj)
    if cls in _SCALAR_TYPES:
        return 0
    if depth > MAX_NESTING:
        raise UnsupportedPayloadError(
            f"payload nested deeper than {MAX_NESTING} containers (a cycle?): depth={depth}"
        )
    if cls is not dict and cls is not list and cls is not tuple:
        if extensions.codec_for_object(obj) is not None:  # registered types win over the rest
            return _scan_converted(obj, depth, exts, converted)
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
    """The walk met an object to convert without a `converted` dict."""


class Registered:
    """What a registered object travels as: its registered name and the state its encode gave."""

    __slots__ = ("name", "state")

    def __init__(self, name: str, state: Any) -> None:
        self.name = name
        self.state = state


_NOT_NATIVE: Final = object()


def _native_form(obj: Any) -> Any:
    """What msgspec's native encoding (and so vllm-omni's wire) makes of `obj`, or `_NOT_NATIVE`.

    A dataclass or attrs instance travels as a dict of its fields (shallow:
    a tensor field stays a leaf, never a copy), an enum as its value, a set
    or frozenset as a list of its items (in iteration order).
    """
    if isinstance(obj, enum.Enum):
        return obj.value
    if isinstance(obj, (set, frozenset)):
        return list(obj)
    cls = type(obj)
    if dataclasses.is_dataclass(cls):
        return {field.name: getattr(obj, field.name) for field in dataclasses.fields(obj)}
    attributes = getattr(cls, "__attrs_attrs__", None)
    if attributes is not None:
        return {attribute.name: getattr(obj, attribute.name) for attribute in attributes}
    return _NOT_NATIVE


def _scan_converted(obj: Any, depth: int, exts: set[int], converted: dict[int, Any] | None) -> int:
    """An object that travels converted: convert it once, then scan what it became."""
    codec = extensions.codec_for_object(obj)
    replacement: Any = None
    if codec is None:
        if type(obj) is slice:
            replacement = [obj.start, obj.stop, obj.step]
        else:
            replacement = _native_form(obj)
            if replacement is _NOT_NATIVE:
                raise _unsupported(obj, "register its class with shmring.register_type to send it")
    if converted is None:
        raise _Rescan
    if id(obj) in converted:
        return 0  # the same object twice: already converted (its leaves counted once per use)
    if codec is not None:
        try:
            state = codec.encode(obj)
        except UnsupportedPayloadError:
            raise
        except Exception as error:
            raise _unsupported(obj, f"its registered encode failed: {error!r}") from error
        converted[id(obj)] = (obj, Registered(codec.name, state))
        return _scan(state, depth + 1, exts, converted)
    converted[id(obj)] = (obj, replacement)
    return _scan(replacement, depth + 1, exts, converted)


def has_registered(converted: dict[int, Any]) -> bool:
    """Whether a registered object is among the conversions (the message must then be framed)."""
    return any(type(replacement) is Registered for _, replacement in converted.values())


def substitute(obj: Any, converted: dict[int, Any], code: int) -> Any:
    """The tree msgspec encodes for `obj`: every converted object replaced by what it travels as.

    A registered object becomes ``[Ext(code, tag + name), state]`` (`code`:
    the message's leaf ext code), the rest their converted form; containers
    on the way are rebuilt (dicts as dicts, lists and tuples as lists: the
    same msgpack), leaves and scalars are kept as they are.
    """
    cls = type(obj)
    if cls in _SCALAR_TYPES:
        return obj
    entry = converted.get(id(obj))
    if entry is not None and entry[0] is obj:
        replacement = entry[1]
        if type(replacement) is Registered:
            tag = Ext(code, bytes((CODEC_TYPE_TAG,)) + replacement.name.encode())
            return [tag, substitute(replacement.state, converted, code)]
        return substitute(replacement, converted, code)
    if isinstance(obj, dict):
        return {key: substitute(value, converted, code) for key, value in obj.items()}
    if isinstance(obj, (list, tuple)):
        if len(obj) > 8 and _SCALAR_TYPES.issuperset(map(type, obj)):
            return obj
        return [substitute(value, converted, code) for value in obj]
    if isinstance(obj, msgspec.Struct):
        changes = {}
        for name in obj.__struct_fields__:
            value = getattr(obj, name)
            if value is msgspec.UNSET:
                continue
            new = substitute(value, converted, code)
            if new is not value:
                changes[name] = new
        return msgspec.structs.replace(obj, **changes) if changes else obj
    return obj  # leaves, Exts, memoryviews


def _choose_leaf_code(exts: set[int]) -> int:
    """The descriptor ext code for one message: one the payload's own Exts do not use."""
    if DEFAULT_LEAF_EXT_CODE not in exts:
        return DEFAULT_LEAF_EXT_CODE
    for code in _LEAF_CODE_CANDIDATES:
        if code not in exts:
            return code
    raise UnsupportedPayloadError(f"payload uses every msgpack ext code: codes={len(exts)}")
