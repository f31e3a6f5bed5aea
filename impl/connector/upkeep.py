"""What a connector does besides put and get: cleanup, cohorts, sheds, health (`Connector`'s upkeep).

`spec.connector.process_cleanup` / `process_cleanup_prefix` (retire a
key's unclaimed version on every edge), `spec.cohort` (publication
cohorts: puts that show together), the descriptor shortage's shed, the
deferred retires `reap_consumed` finishes, and `health()`
(`spec.connector.ConnectorHealth` plus what only the implementation counts).
"""

from __future__ import annotations

import contextlib
import os
import threading
import weakref
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, overload

from .. import lifecycle
from ..names import fallback_segment_file_name, ring_path
from ..ring.producer import RingChannel
from .descriptors import Descriptor, RingDescriptor
from .edges import Edge, Stage, split_edge, validate_key
from .results import ConnectorHealth

if TYPE_CHECKING:
    from .cohort import CohortWriter
    from .fallback_route import FallbackRoute
    from .joining import Deployment
    from .pool_route import PoolRoute
    from .ring_route import RingRoute
    from .waiting import Doorbell


class Upkeep:
    """`Connector`'s operations besides put, get and close (see the module docstring)."""

    directory: str
    _lock: threading.RLock
    _closed: bool
    _inherited: bool
    _deployment: Deployment | None
    _ring_route: RingRoute
    _fallback_route: FallbackRoute
    _pool_route: PoolRoute
    _bell: Doorbell
    _cohorts: CohortWriter | None
    _borrowed: weakref.WeakSet[Any]
    _close_unlink_failures: int
    _puts: int
    _gets: int
    _bytes: int
    _ring_puts: int
    _ring_gets: int
    _fallbacks: int
    _refusals: int
    _busy: int
    _pool_gets: int
    _borrowed_gets: int

    if TYPE_CHECKING:  # `Connector` defines them

        def _require_open(self) -> None: ...
        def _join(self) -> Deployment: ...

    def _shed_descriptors(self) -> int:
        """Out of descriptors: release kept segment mappings, half the mapped rings and slots, pidfds."""
        released = self._fallback_route.shed() + self._ring_route.shed()
        pool = self._ring_route.pool
        if pool is not None:
            released += pool.shed()  # the pool reader's slot mappings
        deployment = self._deployment
        if deployment is not None:
            liveness = deployment.liveness
            released += liveness.shed(liveness.pidfd_count // 2 + 1)
        return released

    def reap_consumed(self) -> int:
        """Drop this producer's records of segments readers claimed; answer the bytes freed.

        Also finishes what a producer call left for later (issue 27): ring
        frames whose retire met another process's lock, retired segments
        whose file is still there (a busy lock, a failed unlink) and ring
        files whose unlink failed; never waits, never raises for them.
        """
        with self._lock, lifecycle.deferred_signals():
            deployment = self._deployment
            if deployment is None or self._inherited:
                return 0
            self._reap_deferred()
            return deployment.writer.refresh() if not self._closed else 0

    def _reap_deferred(self) -> None:
        """Retry deferred retires and removals (no waiting; failures stay, counted)."""
        deployment = self._deployment
        if deployment is None:
            return
        if not self._closed:
            self._ring_route.reap()
        deployment.writer.reap()
        abandoned = self._ring_route.reap_abandoned()
        if (
            self._closed
            and not deployment.left
            and not abandoned
            and not deployment.writer.statistics().deferred
        ):
            deployment.leave()  # what close left is gone now: leave as close would have

    def file_path(self, descriptor: Descriptor) -> str:
        """The file a descriptor's frame lives in: its producer's ring, or the key's segment."""
        if isinstance(descriptor, RingDescriptor):
            return ring_path(self.directory, *descriptor.edge, descriptor.producer)
        return os.path.join(
            self.directory, fallback_segment_file_name(descriptor.edge, descriptor.key)
        )

    # -- cancellation ----------------------------------------------------------------------

    def cleanup(self, key: str) -> int:
        """`spec.connector.process_cleanup`: retire the key's unclaimed version on every edge.

        Waits for another process's lock at most `locks.PRODUCER_LOCK_WAIT_SECONDS`
        per ring or segment; what it could not do then is left for later
        (`reap_consumed`) and counted in `health().deferred_retires`.
        """
        with self._lock, lifecycle.deferred_signals():
            self._require_open()
            validate_key(key)
            self._reap_deferred()
            retired = self._ring_route.retire_key(key) + self._fallback_route.retire_key(key)
            if retired:
                self._bell.ring()
            return retired

    def cleanup_prefix(self, prefix: str) -> int:
        """`spec.connector.process_cleanup_prefix`: retire every unclaimed `prefix` + digits key."""
        with self._lock, lifecycle.deferred_signals():
            self._require_open()
            validate_key(prefix)
            retired = self._ring_route.retire_prefix(prefix)
            retired += self._fallback_route.retire_prefix(prefix)
            if retired:
                self._bell.ring()
            return retired

    # -- publication cohorts -----------------------------------------------------------------

    @overload
    def publication_cohort(
        self, source: Stage, destination: Stage, /
    ) -> contextlib.AbstractContextManager[int]: ...

    @overload
    def publication_cohort(
        self, edge: tuple[Stage, Stage], /
    ) -> contextlib.AbstractContextManager[int]: ...

    def publication_cohort(self, *edge_args: Any) -> contextlib.AbstractContextManager[int]:
        """``with connector.publication_cohort(src, dst):`` the puts inside show together.

        `spec.cohort`: every put to the edge inside the block (from any
        thread of this connector) is invisible to every receiver until the
        block ends; then all of them become deliverable at once, whatever
        their routes. A producer killed inside the block publishes none of
        them. A block inside another on the same edge joins it (only the
        outermost end commits). The block's value is the cohort's number.
        """
        edge, () = split_edge(edge_args, 0, "publication_cohort")
        return self._cohort(edge)

    @contextlib.contextmanager
    def _cohort(self, edge: Edge) -> Iterator[int]:
        with self._lock, lifecycle.deferred_signals():
            self._require_open()
            self._join()
            assert self._cohorts is not None  # joined
            number = self._cohorts.open(edge)
        try:
            yield number
        finally:
            with self._lock, lifecycle.deferred_signals():
                writer = self._cohorts
                if not self._closed and writer is not None and writer.commit(edge):
                    self._bell.ring()  # receivers waiting for a key of the cohort look again
                    bell = self._bell.stage(edge[1])
                    if bell is not None:
                        bell.wake()

    # -- inspection --------------------------------------------------------------------------

    def fallback_bytes(self) -> int:
        """Live fallback bytes charged to the budget, after dropping segments readers claimed."""
        with self._lock:
            deployment = self._deployment
            return deployment.writer.used_bytes() if deployment is not None else 0

    def failed_edges(self) -> dict[Edge, BaseException]:
        """Edges whose ring setup failed, with the error that disabled each."""
        with self._lock:
            return dict(self._ring_route.failed)

    @overload
    def ring(self, source: Stage, destination: Stage, /) -> RingChannel | None: ...

    @overload
    def ring(self, edge: tuple[Stage, Stage], /) -> RingChannel | None: ...

    def ring(self, *edge_args: Any) -> RingChannel | None:
        """This process's ring on an edge, if set up (for statistics and tests)."""
        edge, () = split_edge(edge_args, 0, "ring")
        return self._ring_route.channels.get(edge)

    def health(self) -> ConnectorHealth:
        with self._lock:
            fallback = self._fallback_route.statistics()
            deployment = self._deployment
            discovery = deployment.discovery if deployment is not None else None
            ring = self._ring_route
            pool_route = self._pool_route
            pool = pool_route.statistics()
            borrowed = list(self._borrowed)
            ring_deferred = ring.deferred_retires()
            return ConnectorHealth(
                puts=self._puts,
                gets=self._gets,
                bytes_transferred=self._bytes,
                ring_puts=self._ring_puts,
                ring_gets=self._ring_gets,
                fallbacks=self._fallbacks,
                refusals=self._refusals,
                busy=self._busy,
                fallback_bytes=fallback.used_bytes if fallback else 0,
                fallback_segments=fallback.segments if fallback else 0,
                rings=len(ring.channels),
                failed_edges=len(ring.failed),
                scans=discovery.scans if discovery is not None else 0,
                closed=self._closed,
                fallback_spares=fallback.spares if fallback else 0,
                fallback_spare_bytes=fallback.spare_bytes if fallback else 0,
                fallback_reused=fallback.reused if fallback else 0,
                fallback_mapping_hits=self._fallback_route.mappings.hits,
                reclaimed_files=discovery.reclaimed if discovery is not None else 0,
                ring_setup_retries=ring.retries,
                pool_puts=pool_route.puts,
                pool_gets=self._pool_gets,
                pool_fallbacks=pool_route.fallbacks,
                pool_slots=pool.slots if pool else 0,
                pool_bytes=pool.used_bytes if pool else 0,
                pool_slots_created=pool.created if pool else 0,
                pool_slots_reused=pool.reused if pool else 0,
                pool_slots_evicted=pool.evicted if pool else 0,
                pool_create_failures=pool.create_failures if pool else 0,
                pool_mapping_hits=pool_route.reader.hits if pool_route.reader else 0,
                borrowed_gets=self._borrowed_gets,
                borrowed_live=len(borrowed),
                borrowed_ring_frames=sum(payload.position is not None for payload in borrowed),
                deferred_retires=ring_deferred[0] + (fallback.deferred_total if fallback else 0),
                deferred_pending=ring_deferred[1] + (fallback.deferred if fallback else 0),
                unlink_failures=ring.unlink_failures()
                + (fallback.unlink_failures if fallback else 0)
                + self._close_unlink_failures,
                unlink_retries=fallback.unlink_retries if fallback else 0,
                cohorts_committed=self._cohorts.committed if self._cohorts is not None else 0,
                rings_replaced=ring.replaced,
                ring_frames_lost=ring.frames_lost,
            )
