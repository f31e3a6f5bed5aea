"""The route interface: what the ring and the fallback both offer a connector.

`spec.connector.process_put` tries the ring, then the fallback, and
whichever accepts retires the key's version on the other route *before* its
own version becomes visible, so an (edge, key) never has two deliverable
versions. Both routes therefore offer the same four steps, and
`Connector.put` / `Connector.get` are written in them:

``prepare(edge)``
    The edge's place on this route, set up on first use, or None when the
    route does not take the edge (`spec.connector.process_ring_setup`; the
    fallback takes every edge once joined).
``publish(place, key, plan, before_visible)``
    Publish one encoded payload (`spec.ring.process_put` on a ring; the
    fallback half of `spec.connector.process_put`). `before_visible` runs
    once the route has decided to accept and before anything shows: the
    other route's `retirer`. Answers the position / generation, or None when
    the route does not take the frame (ring NOT_ADMITTED or FULL); the
    fallback raises BackPressureError instead (nothing changed).
``retirer(place, key)``
    The hook that retires the key's version on this route, or None when
    this route surely holds none (`spec.connector._retire_fallback`,
    `spec.ring.process_cancel`).
``claim_by_key`` / ``claim_descriptor``
    A receiver's claim (`spec.connector.process_get` for one producer,
    inside `spec.discovery.process_get`): only a delivering producer's
    version is claimed, and liveness is asked before the payload is decoded.

Cleanup (`retire_key`, `retire_prefix`) and `close` are the same on both
(`spec.connector.process_cleanup`, `process_cleanup_prefix`, `process_close`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from ..codec import EncodePlan
from .edges import Edge
from .results import Delivery

Place = TypeVar("Place")
Desc = TypeVar("Desc", contravariant=True)
# A before-visible hook: retires the key's version on the other route.
Hook = Callable[[], object]


class RouteBackend(Protocol[Place, Desc]):
    """One route's steps (see the module docstring).

    `Place` is the route's per-edge handle (a `RingChannel`, or the edge),
    `Desc` its descriptor type. Both routes are checked against this by
    mypy (the `_route_check` lines at the end of their modules).
    """

    def prepare(self, edge: Edge) -> Place | None: ...

    def publish(
        self, place: Place, key: str, plan: EncodePlan, before_visible: Hook | None
    ) -> Any: ...

    def retirer(self, place: Place | None, key: str) -> Hook | None: ...

    def retire_key(self, key: str) -> int: ...

    def retire_prefix(self, prefix: str) -> int: ...

    def claim_descriptor(self, edge: Edge, key: str, descriptor: Desc) -> Delivery: ...
