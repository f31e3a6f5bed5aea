"""The fallback route: one segment file per (edge, key), with the model's byte budget.

Producer side: the fallback half of `spec.connector.process_put` (the
budget check comes before anything changes, BackPressureError past it; then
the key's ring frame is retired just before the segment becomes visible)
and `_retire_fallback` (`shmring.impl.fallback.FallbackWriter`).

Receiver side: the segment half of `spec.connector.process_get`
(`claim_segment`): a segment carries its owner's identity and is claimed
under its lock, with the owner's liveness asked before the payload is
decoded, the same step the ring route asks it at.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from ...spec.connector import Route
from .. import codec
from ..errors import ResourceExhaustedError, ShmringError, is_exhaustion
from ..fallback import (
    ClaimStatus,
    FallbackStatistics,
    FallbackWriter,
    SegmentMappings,
    claim_segment,
)
from ..names import ConnectorIdentity, fallback_segment_file_name
from ..os_seam import OsFacade
from .cohort import NOTHING_HELD, CohortGates, CohortPending
from .decoders import alive_or_assumed, borrow_sized
from .descriptors import FallbackDescriptor
from .edges import Edge
from .joining import Deployment
from .results import BUSY, GONE, NOT_FOUND, STALE, Delivery, GetStatus
from .routes import Hook, RouteBackend
from .shortage import retry_short_of_descriptors


def _holds_nothing(edge: Edge, key: str) -> bool:
    return False


# NOT_FOUND, for a segment that is a publication cohort's member not committed yet.
_PENDING = Delivery(GetStatus.NOT_FOUND)


class FallbackRoute:
    """The fallback route of one connector (see the module docstring). Not thread-safe."""

    route = Route.FALLBACK
    _deployment: Deployment | None = None
    _writer: FallbackWriter | None = None
    cohorts: CohortGates | None = None  # producers' publication cohort gates (set once joined)

    def __init__(self, os_facade: OsFacade, shed: Callable[[], int]) -> None:
        self._os = os_facade
        self._shed = shed  # the connector's `_shed_descriptors`
        # Mappings of handed-back fallback files, kept between this reader's claims.
        self.mappings = SegmentMappings()
        # Whether we hold a segment for (edge, key): the writer's own `has` once joined.
        self.holds: Callable[[Edge, str], bool] = _holds_nothing

    def joined(self, deployment: Deployment) -> None:
        self._deployment = deployment
        self._writer = deployment.writer
        self.holds = deployment.writer.has  # bound once: the put's hot path asks it every time
        # What `claim_segment` asks under the segment's lock, before it decodes.
        self._is_alive = functools.partial(alive_or_assumed, deployment.liveness)

    # -- producer: prepare / publish / retire ------------------------------------------

    def prepare(self, edge: Edge) -> Edge:
        """The fallback takes every edge once joined: its place is the edge itself."""
        return edge

    def publish(
        self, edge: Edge, key: str, plan: codec.EncodePlan, before_visible: Hook | None
    ) -> int:
        """The fallback half of `spec.connector.process_put`: the new segment's generation.

        BackPressureError: the budget would be exceeded (nothing changed).
        NoSpaceError / ResourceExhaustedError: the OS has no room or no
        descriptor (nothing published, nothing left). `before_visible` runs
        once the file is complete and the budget admitted it, before the
        segment becomes visible.
        """
        writer = self._writer
        assert writer is not None  # joined
        try:
            record = writer.put(edge, key, plan, before_publish=before_visible)
        except OSError as error:
            if isinstance(error, ShmringError) or not is_exhaustion(error):
                raise
            # Nothing was published and nothing is left (fallback.put); say why, typed.
            raise ResourceExhaustedError(
                f"out of descriptors for a fallback segment: key={key!r}: {error}",
                error.errno or 0,
            ) from error
        return record.generation

    def retirer(self, edge: Edge | None, key: str) -> Hook | None:
        """The hook retiring the key's segment (`spec.connector._retire_fallback`); None if none."""
        writer = self._writer
        if edge is None or writer is None or not writer.has(edge, key):
            return None
        return functools.partial(writer.retire, edge, key)

    def retire_key(self, key: str) -> int:
        """`_retire_fallback` of the key on every edge."""
        return self._writer.retire_key(key) if self._writer is not None else 0

    def retire_prefix(self, prefix: str) -> int:
        """`_retire_fallback` of every `prefix` + digits key on every edge."""
        return self._writer.retire_prefix(prefix) if self._writer is not None else 0

    def close(self) -> int:
        """`_retire_fallback` of every segment; drops spare and leftover files."""
        return self._writer.close() if self._writer is not None else 0

    # -- receiver: claim -------------------------------------------------------------------

    def may_hold(self, edge: Edge, key: str) -> bool:
        """False when the key's segment is surely not there now (one faccessat, nothing opened).

        A get by key asks first: the common miss then costs no failed open
        and no signal-deferred section. True when it may be there (or the
        look failed): `claim` looks as before. A segment renamed into place
        just after this answers NOT_FOUND, as a get that ran a moment
        earlier would.
        """
        deployment = self._deployment
        assert deployment is not None  # joined
        return deployment.directory.may_exist(fallback_segment_file_name(edge, key))

    def claim(
        self,
        edge: Edge,
        key: str,
        descriptor: FallbackDescriptor | None,
        busy: bool,
        borrow: bool = False,
    ) -> Delivery:
        """`_get_fallback` of `spec.connector.process_get`: the key's segment, claimed once.

        With a descriptor only its exact segment (owner and generation).
        `busy`: a ring of the edge was BUSY, so a miss here answers BUSY.
        `borrow`: decoded in place; the value's large leaves keep the
        segment's mapping (`claim_segment`'s `borrow`, `ring_route.borrow_sized`).
        """
        deployment = self._deployment
        assert deployment is not None  # joined
        directory = deployment.directory
        member = self._member(edge, borrow)
        try:
            claim = self._claim(directory, edge, key, descriptor, borrow, member)
        except CohortPending:
            return _PENDING  # a cohort member not committed yet: left as it is
        status = claim.status
        if status is ClaimStatus.DELIVERED:
            assert claim.owner is not None
            if borrow:
                _, value, payload = claim.value
                return Delivery(
                    GetStatus.DELIVERED,
                    value,
                    claim.payload_length,
                    Route.FALLBACK,
                    claim.owner,  # type: ignore[arg-type]  # the (pid, start, instance) it names
                    lease=payload,
                )
            return Delivery(
                GetStatus.DELIVERED,
                claim.value,
                claim.payload_length,
                Route.FALLBACK,
                claim.owner,  # type: ignore[arg-type]  # the (pid, start, instance) it names
            )
        if status is ClaimStatus.BUSY or busy:
            return BUSY
        if status is ClaimStatus.PRODUCER_GONE and descriptor is not None:
            return GONE
        if status is ClaimStatus.STALE:
            return STALE
        return NOT_FOUND

    def _claim(
        self,
        directory: Any,
        edge: Edge,
        key: str,
        descriptor: FallbackDescriptor | None,
        borrow: bool,
        member: Callable[[tuple[int, ...], memoryview], Any] | None,
    ) -> Any:
        return retry_short_of_descriptors(
            "a fallback segment",
            lambda: claim_segment(
                directory,
                edge,
                key,
                os_facade=self._os,
                is_alive=self._is_alive,
                decode=codec.decode,
                owner=descriptor.producer if descriptor else None,
                generation=descriptor.generation if descriptor else None,
                mappings=self.mappings,
                borrow=borrow_sized if borrow else None,
                member=member,
            ),
            self._shed,
        )

    def _member(
        self, edge: Edge, borrow: bool
    ) -> Callable[[tuple[int, ...], memoryview], Any] | None:
        """What decodes a publication cohort's member found in a segment (`claim_segment`'s `member`)."""
        gates = self.cohorts
        if gates is None:
            return None

        def member(owner: tuple[int, ...], payload: memoryview) -> Any:
            value = gates.decoder(edge, owner)(payload)  # type: ignore[arg-type]
            return (payload.nbytes, value, NOTHING_HELD) if borrow else value

        return member

    def claim_descriptor(
        self, edge: Edge, key: str, descriptor: FallbackDescriptor, borrow: bool = False
    ) -> Delivery:
        """The exact segment a fallback descriptor names; PRODUCER_GONE when it is not delivering."""
        got = self.claim(edge, key, descriptor, False, borrow)
        if got is _PENDING:
            return NOT_FOUND  # a member of a cohort not committed yet: the descriptor is good later
        if got.status is GetStatus.NOT_FOUND or got.status is GetStatus.STALE:
            return STALE if self._is_delivering(descriptor.producer) else GONE
        return got

    def _is_delivering(self, producer: ConnectorIdentity) -> bool:
        """`spec.producers.is_delivering`: running, and its connector open (its live file)."""
        deployment = self._deployment
        assert deployment is not None  # joined
        return deployment.liveness.is_alive(producer) and deployment.is_live(producer)

    def shed(self) -> int:
        """Unmap every kept segment mapping; answers how many."""
        released = len(self.mappings)
        self.mappings.close()
        return released

    def statistics(self) -> FallbackStatistics | None:
        return self._writer.statistics() if self._writer is not None else None


_route_check: type[RouteBackend[Edge, FallbackDescriptor]] = FallbackRoute
