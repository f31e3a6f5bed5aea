"""Registered objects back from a decoded tree: type tags, their ``[tag, state]`` pairs, the rebuild.

A registered object travels as a two-item array: an Ext holding its type tag
(the registered name), then its state (`shmring.impl.extensions`). The leaf
reader's ext_hook turns the tag into a `_TypeTag` (`decode._LeafReader`);
once msgspec has built the tree, `_rebuild` replaces each pair by the object
its registered decode function builds. Also the one way the decoder words
a corrupt payload (`_corrupt`).
"""

from __future__ import annotations

from typing import Any, Final

from .. import extensions
from ..errors import CorruptFrameError
from .wire import MAX_NESTING

# Registered objects rebuilt from nesting deeper than this are refused as corrupt.
_MAX_REBUILD_DEPTH: Final = 4 * MAX_NESTING


def _corrupt(message: str) -> CorruptFrameError:
    return CorruptFrameError(f"corrupt payload: {message}")


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
