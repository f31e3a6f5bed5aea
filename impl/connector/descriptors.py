"""Descriptors: what a put answers, naming the exact frame or segment it published.

`spec.connector.RingDescriptor` / `FallbackDescriptor` plus the producer
that published (`spec.discovery.PublishedDescriptor`) and the encoded size.
`to_dict` / `descriptor_from_dict` carry them between processes as plain
msgpack/JSON-friendly dicts (the compat facade's put metadata).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from ...spec.connector import Route
from ..errors import CorruptFrameError
from ..names import ConnectorIdentity, fallback_segment_file_name
from .edges import Edge


@dataclass(frozen=True)
class RingDescriptor:
    """Names the exact ring frame a put published (`spec.connector.RingDescriptor`)."""

    route: ClassVar[Route] = Route.RING
    producer: ConnectorIdentity  # (pid, start time, instance) of the publishing connector
    edge: Edge
    key: str
    position: int  # the frame's logical position in that producer's ring
    size: int  # encoded payload bytes

    def to_dict(self) -> dict[str, Any]:
        """A msgpack/JSON-friendly form (what the compat facade's metadata carries)."""
        return {
            **_common_fields(self.producer, self.edge, self.key, self.size),
            "position": self.position,
        }


@dataclass(frozen=True)
class PoolDescriptor(RingDescriptor):
    """A ring descriptor whose frame carries a pool reference (`spec.connector` route POOL).

    A get with it reads only that exact ring frame, as with any
    `RingDescriptor`; `to_dict` is the ring form plus ``"pool": True`` (the
    receiver needs no more: the frame names the slot).
    """

    route: ClassVar[Route] = Route.POOL

    def to_dict(self) -> dict[str, Any]:
        return {**super().to_dict(), "pool": True}


@dataclass(frozen=True)
class FallbackDescriptor:
    """Names the exact fallback segment a put created (`spec.connector.FallbackDescriptor`)."""

    route: ClassVar[Route] = Route.FALLBACK
    producer: ConnectorIdentity  # (pid, start time, instance) of the publishing connector
    edge: Edge
    key: str
    generation: int  # unique per producer process; a re-put makes a new one
    size: int  # encoded payload bytes

    def to_dict(self) -> dict[str, Any]:
        return {
            **_common_fields(self.producer, self.edge, self.key, self.size),
            "generation": self.generation,
            "name": fallback_segment_file_name(self.edge, self.key),
        }


Descriptor = RingDescriptor | FallbackDescriptor


def _common_fields(producer: ConnectorIdentity, edge: Edge, key: str, size: int) -> dict[str, Any]:
    """The fields every descriptor's `to_dict` carries (read back by `descriptor_from_dict`)."""
    return {
        "producer": list(producer),
        "source": edge[0],
        "destination": edge[1],
        "key": key,
        "size": size,
    }


def descriptor_from_dict(route: Route, data: Mapping[str, Any]) -> Descriptor:
    """Rebuild a descriptor from `to_dict`'s form; CorruptFrameError when it is malformed."""
    try:
        pid, start_time, *rest = data["producer"]
        if len(rest) > 1:
            raise ValueError(f"producer must be [pid, start time, instance]: {data['producer']!r}")
        producer = (
            _plain_int(pid, "producer pid"),
            _plain_int(start_time, "producer start time"),
            _plain_int(rest[0], "producer instance") if rest else 0,
        )
        edge = (str(data["source"]), str(data["destination"]))
        key = data["key"]
        size = _plain_int(data["size"], "size")
        if not isinstance(key, str):
            raise TypeError(f"key must be a str: key={key!r}")
        if route is Route.RING:
            return RingDescriptor(
                producer, edge, key, _plain_int(data["position"], "position"), size
            )
        if route is Route.POOL:
            return PoolDescriptor(
                producer, edge, key, _plain_int(data["position"], "position"), size
            )
        return FallbackDescriptor(
            producer, edge, key, _plain_int(data["generation"], "generation"), size
        )
    except (KeyError, TypeError, ValueError) as error:
        raise CorruptFrameError(
            f"malformed {route.value} descriptor: {error}: data={data!r}"
        ) from error


def _plain_int(value: object, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{what} must be a non-negative int: {what}={value!r}")
    return value


_new = object.__new__


def new_descriptor(
    kind: type[RingDescriptor] | type[FallbackDescriptor],
    producer: ConnectorIdentity,
    edge: Edge,
    key: str,
    place: int,
    size: int,
) -> Any:
    """`kind(producer, edge, key, place, size)` at half the cost of the frozen dataclass's `__init__`.

    What a put answers, made once per message (issue 23's lean path): the
    same instance the constructor makes (fields in `__dict__`, equal, hashed
    and printed alike; `test_connector` compares them), without its five
    `object.__setattr__` calls. `place` is the position or the generation.
    """
    descriptor = _new(kind)
    second = "position" if kind is not FallbackDescriptor else "generation"
    descriptor.__dict__.update(producer=producer, edge=edge, key=key, size=size)
    descriptor.__dict__[second] = place
    return descriptor
