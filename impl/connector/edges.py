"""The edge and key of a call: what `spec.connector` calls `Edge` and a key.

A caller names an edge as ``(src, dst)`` or as two leading arguments, with
stage names or, as vllm-omni's stage ids, ints (their decimal string). The
validated edge is cached by what the caller passed, because every put and
get parses it: the hot path is one dict look-up.
"""

from __future__ import annotations

import functools
from typing import Any, Final

from ...spec.layout import MAX_KEY_LENGTH
from ..errors import InvalidKeyError
from ..names import Edge, validate_stage_name

# A stage as callers may pass it: a stage name, or an int stage id.
Stage = str | int


@functools.lru_cache(maxsize=1024, typed=True)  # typed: True must not hit 1's entry
def _cached_stage(value: str | int) -> str:
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    return validate_stage_name(value)


def _stage(value: object, argument: str) -> str:
    """A validated stage name (ints, as vllm-omni's stage ids, become their decimal string)."""
    if not isinstance(value, (str, int)) or isinstance(value, bool):
        raise InvalidKeyError(f"{argument} must be a str or an int: {argument}={value!r}")
    return _cached_stage(value)


# Validated edges by the (src, dst) a caller passed, when both are exactly str
# or int (never bool: True == 1 must not find 1's entry).
EDGE_CACHE: Final[dict[tuple[Any, Any], Edge]] = {}
_EDGE_CACHE_LIMIT: Final = 1024


def edge_of(source: Any, destination: Any) -> Edge:
    """The validated edge ``(source, destination)`` (InvalidKeyError naming the bad argument)."""
    kind, other = type(source), type(destination)
    if (kind is str or kind is int) and (other is str or other is int):
        edge = EDGE_CACHE.get((source, destination))
        if edge is None:
            edge = (_stage(source, "from_stage"), _stage(destination, "to_stage"))
            if len(EDGE_CACHE) >= _EDGE_CACHE_LIMIT:
                EDGE_CACHE.clear()
            EDGE_CACHE[source, destination] = edge
        return edge
    return (_stage(source, "from_stage"), _stage(destination, "to_stage"))


def split_edge(args: tuple[Any, ...], rest: int, what: str) -> tuple[Edge, tuple[Any, ...]]:
    """(edge, remaining args) from ``(src, dst, *rest)`` or ``((src, dst), *rest)``."""
    if len(args) == rest + 2:
        source, destination = args[0], args[1]
        if type(source) is str and type(destination) is str:  # the hot path: one dict look-up
            edge = EDGE_CACHE.get((source, destination))
            if edge is not None:
                return edge, args[2:]
        return edge_of(source, destination), args[2:]
    if len(args) == rest + 1 and isinstance(args[0], tuple) and len(args[0]) == 2:
        return edge_of(args[0][0], args[0][1]), args[1:]
    raise TypeError(
        f"{what}() takes (src, dst, ...) or ((src, dst), ...) and {rest} more: got {len(args)} arguments"
    )


def validate_key(key: object) -> None:
    """InvalidKeyError unless `key` is a str of at most MAX_KEY_LENGTH UTF-8 bytes.

    The limit is the ring frame's key length field's (`spec.layout.MAX_KEY_LENGTH`),
    so every valid key fits a ring frame's header (issue 22: there was none).
    """
    if not isinstance(key, str):
        raise InvalidKeyError(f"key must be a str: key={key!r}")
    if key.isascii():
        length = len(key)
    else:
        try:
            length = len(key.encode("utf-8"))
        except UnicodeEncodeError as error:
            raise InvalidKeyError(f"key is not valid UTF-8 text: key={key!r}") from error
    if length > MAX_KEY_LENGTH:
        raise InvalidKeyError(
            f"key too long: {length} UTF-8 bytes, at most {MAX_KEY_LENGTH}: key={key[:32]!r}..."
        )
