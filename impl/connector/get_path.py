"""A get, top to bottom: `spec.discovery.process_get` as one straight pipeline (issue 23).

`Connector.get` takes the connector's lock and runs these steps, each a
method named for what it does and the model step it mirrors:

1. `_refreshed`: the key checked, the connector joined, and
   `spec.discovery.process_refresh` (a directory scan only when the stamp
   moved; the ring route then forgets what the scan changed);
2. by key (`_get_by_key`): the ring half (`RingReaders.claim_by_key`:
   find the edge's producers, claim the first deliverable frame once,
   decode it), then the key's segment (`_claim_segment`,
   `spec.connector._get_fallback`);
   with a descriptor (`_get_by_descriptor`): only the route and place it
   names, PRODUCER_GONE first;
3. `_count`: the model's health counters of a get (`spec.connector._deliver`), plus BUSY.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...spec.connector import Route
from ...spec.layout import MAX_KEY_LENGTH
from .. import lifecycle
from ..errors import InvalidKeyError
from .descriptors import Descriptor, FallbackDescriptor, RingDescriptor
from .edges import Edge, validate_key
from .results import BUSY, NOT_FOUND, Delivery, GetStatus
from .shortage import retry_short_of_descriptors

if TYPE_CHECKING:
    from .fallback_route import FallbackRoute
    from .joining import Deployment
    from .ring_route import RingRoute
    from .waiting import FallbackMisses

_DELIVERED = GetStatus.DELIVERED
_BUSY_STATUS = GetStatus.BUSY
_NOT_FOUND_STATUS = GetStatus.NOT_FOUND
_RING = Route.RING
_POOL = Route.POOL


class GetPath:
    """The get pipeline of `Connector` (see the module docstring). Runs under its lock."""

    _closed: bool
    _deployment: Deployment | None
    _ring_route: RingRoute
    _fallback_route: FallbackRoute
    _misses: FallbackMisses
    _gets: int
    _bytes: int
    _ring_gets: int
    _pool_gets: int
    _busy: int

    if TYPE_CHECKING:  # `Connector` defines them

        def _require_open(self) -> None: ...
        def _join(self) -> Deployment: ...
        def _shed_descriptors(self) -> int: ...

    def _refreshed(self, key: str) -> None:
        """Checks, the join, then `spec.discovery.process_refresh` (a scan only when the stamp moved)."""
        if self._closed:
            self._require_open()  # CLOSED
        if type(key) is not str or not key.isascii() or len(key) > MAX_KEY_LENGTH:
            validate_key(key)
        deployment = self._deployment
        if deployment is None:  # not (fully) joined yet: `_join` retries what failed
            with lifecycle.deferred_signals():
                deployment = self._join()
        if retry_short_of_descriptors(
            "a discovery scan", deployment.discovery.refresh, self._shed_descriptors
        ):
            self._ring_route.scanned()

    def _get_by_key(self, edge: Edge, key: str, bell: int | None, borrow: bool) -> Delivery:
        """`process_get` by key: `get_candidates`' rings (live producers, discovery's order), then the segment."""
        got, busy, problem = self._ring_route.claim_by_key(edge, key, borrow)
        if got is None:
            got = self._claim_segment(edge, key, bell, busy, borrow)
            if problem is not None and got.status is not _DELIVERED:
                self._count(got)
                raise problem  # a damaged ring, or producers not looked at
        self._count(got)
        return got

    def _claim_segment(
        self, edge: Edge, key: str, bell: int | None, busy: bool, borrow: bool
    ) -> Delivery:
        """`spec.connector._get_fallback`: the key's segment, unless nothing rang since it was missed.

        A plain get (`bell` None) always looks: a producer that cannot ring
        the doorbell (its stamp failed) may have written it a moment ago,
        and the model's get finds it (fault cell `restart` with EMFILE at
        open #18 showed a skip there answering NOT_FOUND).
        """
        if self._misses.unchanged(edge, key, bell):
            return BUSY if busy else NOT_FOUND
        fallback = self._fallback_route
        if not fallback.may_hold(edge, key):
            got = BUSY if busy else NOT_FOUND  # what `claim` answers when there is no segment
        else:
            with lifecycle.deferred_signals():  # a segment is opened, locked, unlinked
                got = fallback.claim(edge, key, None, busy, borrow)
        if bell is not None and got.status is _NOT_FOUND_STATUS:
            self._misses.record(edge, key, bell)
        return got

    def _get_by_descriptor(
        self, edge: Edge, key: str, descriptor: Descriptor, borrow: bool
    ) -> Delivery:
        """`process_get` with a descriptor: only its route and place (PRODUCER_GONE first)."""
        if not isinstance(descriptor, (RingDescriptor, FallbackDescriptor)):
            raise TypeError(f"not a descriptor: descriptor={descriptor!r}")
        if descriptor.edge != edge or descriptor.key != key:
            raise InvalidKeyError(
                f"descriptor names edge={descriptor.edge} key={descriptor.key!r}, "
                f"get asked edge={edge} key={key!r}"
            )
        if isinstance(descriptor, RingDescriptor):
            got = self._ring_route.claim_descriptor(edge, key, descriptor, borrow)
        else:
            with lifecycle.deferred_signals():
                got = self._fallback_route.claim_descriptor(edge, key, descriptor, borrow)
        self._count(got)
        return got

    def _count(self, got: Delivery) -> None:
        """The model's health counters of a get (`spec.connector._deliver`), plus BUSY."""
        status = got.status
        if status is _DELIVERED:
            self._gets += 1
            self._bytes += got.size
            if got.route is _RING:
                self._ring_gets += 1
            elif got.route is _POOL:
                self._pool_gets += 1
        elif status is _BUSY_STATUS:
            self._busy += 1
