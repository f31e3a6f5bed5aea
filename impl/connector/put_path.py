"""A put, top to bottom: `spec.connector.process_put` as one straight pipeline (issue 23).

`Connector.put` takes the connector's lock and runs these steps, each a
method named for what it does and the model step it mirrors:

1. `_encode`: the key checked and the payload encoded once
   (`codec.prepare`), so every size is known before any lock; inside a
   publication cohort the plan is the cohort's member (`spec.cohort`);
2. `_ring_for`: the edge's ring, set up on first use or re-created when a
   neighbour unlinked or truncated its file (`process_ring_setup`,
   `process_neighbour_unlink_ring`);
3. the route, from the model's one rule (`spec.connector.choose_route`),
   asked before the ring is tried and again with the ring's answer;
4. write and publish on that route (`RingRoute.publish`, `_put_pool`,
   `_put_fallback`); whichever accepts retires the key's version on the
   other route before its own shows (`_retire_fallback`, `process_cancel`);
5. `_published`: the health counters and the doorbell.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...spec.connector import Route, choose_route
from ...spec.layout import MAX_KEY_LENGTH
from ...spec.status import PutStatus
from .. import codec, lifecycle
from ..errors import BackPressureError
from ..names import ConnectorIdentity
from ..ring.producer import RingChannel
from .cohort import MemberPlan
from .descriptors import (
    Descriptor,
    FallbackDescriptor,
    PoolDescriptor,
    RingDescriptor,
    new_descriptor,
)
from .edges import Edge, validate_key

if TYPE_CHECKING:
    from .fallback_route import FallbackRoute
    from .joining import Deployment
    from .pool_route import PoolRoute
    from .ring_route import RingRoute
    from .waiting import Doorbell

_RING = Route.RING
_POOL = Route.POOL
_PUBLISHED = PutStatus.PUBLISHED
_NOT_ADMITTED = PutStatus.NOT_ADMITTED


class PutPath:
    """The put pipeline of `Connector` (see the module docstring). Runs under its lock."""

    identity: ConnectorIdentity
    _closed: bool
    _deployment: Deployment | None
    _ring_route: RingRoute
    _fallback_route: FallbackRoute
    _pool_route: PoolRoute
    _bell: Doorbell
    _cohort_numbers: dict[Edge, int]
    _puts: int
    _ring_puts: int
    _fallbacks: int
    _refusals: int
    _bytes: int

    if TYPE_CHECKING:  # `Connector` defines them

        def _require_open(self) -> None: ...
        def _join(self) -> Deployment: ...

    def _put(self, edge: Edge, key: str, obj: object) -> Descriptor:
        """`spec.connector.process_put`: encode, choose the route, write, publish, wake."""
        plan = self._encode(edge, key, obj)
        channel = self._ring_for(edge)
        fallback = self._fallback_route
        retire_other = fallback.retirer(edge, key) if fallback.holds(edge, key) else None
        if choose_route(channel is not None, None, False) is _RING:
            assert channel is not None
            status, position = self._ring_route.publish(channel, key, plan, retire_other)
            if status is _PUBLISHED:
                self._ring_puts += 1
                return self._published(
                    new_descriptor(RingDescriptor, self.identity, edge, key, position, plan.nbytes)  # type: ignore[arg-type]
                )
            if (
                choose_route(True, status, self._pool_fits(channel, key, status, plan.nbytes))
                is _POOL
            ):
                descriptor = self._put_pool(channel, edge, key, plan, retire_other)
                if descriptor is not None:
                    return descriptor
        return self._put_fallback(channel, edge, key, plan)

    def _encode(self, edge: Edge, key: str, obj: object) -> Any:
        """The key checked, the payload encoded once (`codec.prepare`), the connector joined."""
        if self._closed:
            self._require_open()  # CLOSED
        if type(key) is not str or not key.isascii() or len(key) > MAX_KEY_LENGTH:
            validate_key(key)
        plan = codec.prepare(obj)
        numbers = self._cohort_numbers
        if numbers and edge in numbers:  # inside a publication cohort of the edge
            plan = MemberPlan(plan, numbers[edge])
        deployment = self._deployment
        if deployment is None or deployment.live_path is None:
            # Files are made here: no signal handler stops it half way (`lifecycle`).
            with lifecycle.deferred_signals():
                if deployment is None:
                    deployment = self._join()
                if deployment.live_path is None:
                    deployment.ensure_live_file(self.identity, self._os)  # type: ignore[attr-defined]
        return plan

    def _ring_for(self, edge: Edge) -> RingChannel | None:
        """`spec.connector.process_ring_setup`: the edge's ring (None: the fallback carries it).

        One fstat per put: a file a neighbour unlinked or truncated is
        replaced first (`process_neighbour_unlink_ring`, issue 22).
        """
        ring = self._ring_route
        channel = ring.channels.get(edge)
        if channel is None:
            with lifecycle.deferred_signals():
                return ring.prepare(edge)
        lost = channel.file_problem()
        if lost is not None:
            with lifecycle.deferred_signals():
                return ring.replace(edge, channel, lost)
        return channel

    def _pool_fits(self, channel: RingChannel, key: str, status: PutStatus, nbytes: int) -> bool:
        """`spec.connector.is_pool_candidate`: the pool is on and the key's reference frame fits."""
        pool = self._pool_route
        return status is _NOT_ADMITTED and pool.enabled and pool.is_candidate(channel, key, nbytes)

    def _put_pool(
        self, channel: RingChannel, edge: Edge, key: str, plan: Any, retire_other: Any
    ) -> Descriptor | None:
        """`spec.connector._put_pool`: a slot takes the payload, the ring its reference frame."""
        with lifecycle.deferred_signals():  # a slot may be made or emptied
            position = self._pool_route.publish(channel, key, plan, retire_other)
        if position is None:
            return None  # no slot, or the ring FULL for the reference: the fallback
        return self._published(
            new_descriptor(PoolDescriptor, self.identity, edge, key, position, plan.nbytes)
        )

    def _put_fallback(
        self, channel: RingChannel | None, edge: Edge, key: str, plan: Any
    ) -> Descriptor:
        """The fallback half of `process_put`: the budget first (REFUSED changes nothing).

        The key's ring frame is retired before the segment shows.
        """
        fallback = self._fallback_route
        try:
            with lifecycle.deferred_signals():  # a file is made, filled and renamed
                generation = fallback.publish(
                    fallback.prepare(edge), key, plan, self._ring_route.retirer(channel, key)
                )
        except BackPressureError:
            self._refusals += 1
            raise
        self._fallbacks += 1
        return self._published(
            new_descriptor(FallbackDescriptor, self.identity, edge, key, generation, plan.nbytes)
        )

    def _published(self, descriptor: Descriptor) -> Descriptor:
        """Counted (`ConnectorHealth`) and announced: the doorbell and the stage's bell."""
        self._puts += 1
        self._bytes += descriptor.size
        bell = self._bell
        bell.ring()
        bell.ring_stage(descriptor.edge[1])
        return descriptor
