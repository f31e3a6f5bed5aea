"""The connector: one process's routing between its rings and the fallback.

A connector owns one ring per edge it publishes on (set up lazily, at the
first put on that edge) and one fallback segment per (edge, key) for frames
the ring does not take. The routing rules, in the order a put applies them:

1. The ring is disabled (capacity 0) or its setup failed for this edge
   (ENOSPC, EPERM, a discovery failure, ...): fallback. A failed setup is
   remembered; the edge is not retried.
2. The ring says NOT_ADMITTED (frame too large, key too long) or FULL:
   fallback.
3. The fallback refuses with back-pressure when the segment would take the
   live fallback bytes past the budget; nothing changes then.

Whichever route accepts, the key's older version on the *other* route is
retired, so an (edge, key) has at most one deliverable version in total.

A get with a descriptor reads only the route and place the descriptor names
(a ring descriptor never falls back); a get by key looks at both routes.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from shmring.spec import ring as ring_spec
from shmring.spec.layout import (
    compute_file_footprint,
    compute_frame_length,
    compute_ring_file_length,
)
from shmring.spec.ring import (
    ConsumeMode,
    GetStatus,
    PutStatus,
    RingState,
    compute_key_length,
    get_deliverable_frame,
    initialize_ring,
    is_deliverable,
    is_prefix_match,
    is_valid_capacity,
)

Edge = tuple[str, str]  # (source stage, destination stage)

# -- state -------------------------------------------------------------------


@dataclass(frozen=True)
class RingDescriptor:
    """Names the exact ring frame a put published."""

    edge: Edge
    key: str
    position: int


@dataclass(frozen=True)
class FallbackDescriptor:
    """Names the exact fallback segment a put created."""

    edge: Edge
    key: str
    generation: int  # unique per connector; a re-put makes a new generation


Descriptor = RingDescriptor | FallbackDescriptor


@dataclass
class FallbackSegment:
    """One per-key fallback segment holding one payload."""

    edge: Edge
    key: str
    generation: int  # the descriptor's generation; strictly increasing per connector
    length: int  # bytes charged to the budget: the file's pages (compute_fallback_charge)
    payload_length: int
    payload: object  # opaque payload token


@dataclass
class ConnectorHealth:
    """Counters the implementation's `health()` reports."""

    puts: int = 0  # accepted puts, either route
    gets: int = 0  # delivered gets, either route
    bytes_transferred: int = 0  # payload bytes of accepted puts plus delivered gets
    ring_puts: int = 0  # puts published on a ring
    ring_gets: int = 0  # gets delivered from a ring
    fallbacks: int = 0  # puts carried by the fallback
    refusals: int = 0  # puts refused with back-pressure


@dataclass
class ConnectorState:
    """One process's connector."""

    ring_capacity: int  # 0 disables rings; else a valid ring capacity; never changes
    fallback_budget: int  # most live fallback bytes; >= 0; never changes
    rings: dict[Edge, RingState] = field(
        default_factory=dict
    )  # set-up rings; disjoint from failed_edges
    failed_edges: set[Edge] = field(default_factory=set)  # ring setup failed; fallback for good
    # Live segments; (edge, key) holds no deliverable ring frame at the same time.
    fallback: dict[tuple[Edge, str], FallbackSegment] = field(default_factory=dict)
    fallback_bytes: int = 0  # == sum of live segment lengths; <= fallback_budget
    next_generation: int = 1  # larger than every generation issued so far
    health: ConnectorHealth = field(default_factory=ConnectorHealth)
    closed: bool = False  # set by close; nothing deliverable, nothing accepted afterwards


class Route(enum.Enum):
    RING = "ring"
    FALLBACK = "fallback"


class ConnectorPutStatus(enum.Enum):
    ACCEPTED = "accepted"  # on the ring or in the fallback; see `route`
    REFUSED = "refused"  # back-pressure: the fallback budget is spent
    CLOSED = "closed"  # the connector was closed


@dataclass(frozen=True)
class ConnectorPutResult:
    status: ConnectorPutStatus
    route: Route | None = None
    descriptor: Descriptor | None = None
    ring_status: PutStatus | None = None  # what the ring said, when it was asked
    length: int = 0  # frame or segment bytes


class ConnectorGetStatus(enum.Enum):
    DELIVERED = "delivered"
    NOT_FOUND = "not found"  # no deliverable version of the key on either route
    STALE = "stale"  # the descriptor's frame or segment is gone or superseded
    CLOSED = "closed"


@dataclass(frozen=True)
class ConnectorGetResult:
    status: ConnectorGetStatus
    route: Route | None = None
    payload: object = None


# -- predicates and pure helpers --------------------------------------------


def is_valid_budget(budget: int) -> bool:
    return budget >= 0


def compute_fallback_length(key: str, payload_length: int) -> int:
    """Bytes of a fallback segment's one frame (the ring's layout)."""
    # Verify the payload length is a byte count
    assert payload_length >= 0
    return compute_frame_length(compute_key_length(key), payload_length)


def compute_fallback_charge(key: str, payload_length: int) -> int:
    """Bytes a fallback segment is charged to the budget: what its file occupies.

    A ring header plus the frame, in whole pages (issue 12: a 1 KiB message
    was charged 1,344 bytes but took a 4 KiB page).
    """
    # Verify the payload length is a byte count
    assert payload_length >= 0
    frame_length = compute_fallback_length(key, payload_length)
    return compute_file_footprint(compute_ring_file_length(frame_length))


def compute_budget_allows(used: int, replaced: int, length: int, budget: int) -> bool:
    """Whether a new segment of `length` fits when it replaces `replaced` bytes."""
    # Verify the byte counts are consistent
    assert 0 <= replaced <= used <= budget
    assert length >= 0
    return used - replaced + length <= budget


def is_ring_usable(conn: ConnectorState, edge: Edge) -> bool:
    return conn.ring_capacity > 0 and edge not in conn.failed_edges


# -- accessors ---------------------------------------------------------------


def get_route_of(conn: ConnectorState, edge: Edge, key: str) -> Route | None:
    """Where the key's deliverable version lives, if anywhere."""
    ring = conn.rings.get(edge)
    if ring is not None and get_deliverable_frame(ring, key) is not None:
        return Route.RING
    if (edge, key) in conn.fallback:
        return Route.FALLBACK
    return None


def get_deliverable(conn: ConnectorState) -> list[tuple[Edge, str, Route]]:
    """Every deliverable (edge, key) with its route, in a stable order."""
    found: list[tuple[Edge, str, Route]] = []
    for edge in sorted(conn.rings):
        for frame in conn.rings[edge].frames:
            if is_deliverable(frame):
                found.append((edge, frame.key, Route.RING))
    for edge, key in sorted(conn.fallback):
        found.append((edge, key, Route.FALLBACK))
    return found


# -- transitions -------------------------------------------------------------


def initialize_connector(ring_capacity: int, fallback_budget: int) -> ConnectorState:
    # Verify the configuration (the implementation reports a ConfigurationError first)
    assert is_valid_capacity(ring_capacity)
    assert is_valid_budget(fallback_budget)
    return ConnectorState(ring_capacity=ring_capacity, fallback_budget=fallback_budget)


def process_ring_setup(conn: ConnectorState, edge: Edge, setup_ok: bool) -> bool:
    """Set up the edge's ring on first use; a failure disables it, once.

    `setup_ok` is the world's answer (file creation, allocation, mapping and
    the discovery marker all succeeded). Answers whether a ring is usable.
    """
    if not is_ring_usable(conn, edge):
        return False
    if edge in conn.rings:
        return True
    if not setup_ok:
        conn.failed_edges.add(edge)
        return False
    conn.rings[edge] = initialize_ring(conn.ring_capacity)
    return True


def _retire_fallback(conn: ConnectorState, edge: Edge, key: str) -> int:
    segment = conn.fallback.pop((edge, key), None)
    if segment is None:
        return 0
    conn.fallback_bytes -= segment.length
    return 1


def process_put(
    conn: ConnectorState,
    edge: Edge,
    key: str,
    payload_length: int,
    payload: object,
    ring_setup_ok: bool = True,
) -> ConnectorPutResult:
    """Route one put; see the module docstring for the rules."""
    # Verify the payload length is a byte count
    assert payload_length >= 0
    if conn.closed:
        return ConnectorPutResult(ConnectorPutStatus.CLOSED)
    ring_status: PutStatus | None = None
    if process_ring_setup(conn, edge, ring_setup_ok):
        ring = conn.rings[edge]
        put = ring_spec.process_put(ring, key, payload_length, payload)
        ring_status = put.status
        if put.status is PutStatus.PUBLISHED:
            assert put.position is not None
            _retire_fallback(conn, edge, key)
            conn.health.puts += 1
            conn.health.ring_puts += 1
            conn.health.bytes_transferred += payload_length
            return ConnectorPutResult(
                ConnectorPutStatus.ACCEPTED,
                Route.RING,
                RingDescriptor(edge, key, put.position),
                ring_status,
                put.frame_length,
            )
    length = compute_fallback_charge(key, payload_length)
    old = conn.fallback.get((edge, key))
    replaced = old.length if old is not None else 0
    if not compute_budget_allows(conn.fallback_bytes, replaced, length, conn.fallback_budget):
        conn.health.refusals += 1
        return ConnectorPutResult(ConnectorPutStatus.REFUSED, None, None, ring_status, length)
    _retire_fallback(conn, edge, key)
    old_ring = conn.rings.get(edge)
    if old_ring is not None:
        ring_spec.process_cancel(old_ring, key)
    generation = conn.next_generation
    conn.next_generation += 1
    conn.fallback[(edge, key)] = FallbackSegment(
        edge, key, generation, length, payload_length, payload
    )
    conn.fallback_bytes += length
    conn.health.puts += 1
    conn.health.fallbacks += 1
    conn.health.bytes_transferred += payload_length
    return ConnectorPutResult(
        ConnectorPutStatus.ACCEPTED,
        Route.FALLBACK,
        FallbackDescriptor(edge, key, generation),
        ring_status,
        length,
    )


def _deliver(
    conn: ConnectorState, route: Route, payload: object, payload_length: int
) -> ConnectorGetResult:
    conn.health.gets += 1
    conn.health.bytes_transferred += payload_length
    if route is Route.RING:
        conn.health.ring_gets += 1
    return ConnectorGetResult(ConnectorGetStatus.DELIVERED, route, payload)


def _get_fallback(
    conn: ConnectorState, edge: Edge, key: str, generation: int | None
) -> ConnectorGetResult | None:
    segment = conn.fallback.get((edge, key))
    if segment is None or (generation is not None and segment.generation != generation):
        return None
    _retire_fallback(conn, edge, key)
    return _deliver(conn, Route.FALLBACK, segment.payload, segment.payload_length)


def process_get(
    conn: ConnectorState,
    edge: Edge,
    key: str,
    descriptor: Descriptor | None = None,
    mode: ConsumeMode = ConsumeMode.COPY_OUT,
) -> ConnectorGetResult:
    """Claim the key's deliverable version, exactly once."""
    # Verify a descriptor names the same edge and key it is used with
    assert descriptor is None or (descriptor.edge == edge and descriptor.key == key)
    if conn.closed:
        return ConnectorGetResult(ConnectorGetStatus.CLOSED)
    ring = conn.rings.get(edge)
    if isinstance(descriptor, RingDescriptor):
        if ring is None:
            return ConnectorGetResult(ConnectorGetStatus.STALE)
        got = ring_spec.process_get(ring, key, descriptor.position, mode)
        if got.status is not GetStatus.DELIVERED:
            return ConnectorGetResult(ConnectorGetStatus.STALE)
        frame_length = _claimed_payload_length(ring, got.position)
        return _deliver(conn, Route.RING, got.payload, frame_length)
    if isinstance(descriptor, FallbackDescriptor):
        result = _get_fallback(conn, edge, key, descriptor.generation)
        return result if result is not None else ConnectorGetResult(ConnectorGetStatus.STALE)
    if ring is not None:
        got = ring_spec.process_get(ring, key, None, mode)
        if got.status is GetStatus.DELIVERED:
            return _deliver(
                conn, Route.RING, got.payload, _claimed_payload_length(ring, got.position)
            )
    result = _get_fallback(conn, edge, key, None)
    return result if result is not None else ConnectorGetResult(ConnectorGetStatus.NOT_FOUND)


def _claimed_payload_length(ring: RingState, position: int | None) -> int:
    for frame in ring.frames:
        if frame.position == position:
            return frame.payload_length
    raise AssertionError(f"claimed frame missing at position={position}")


def process_cleanup(conn: ConnectorState, key: str) -> int:
    """Retire the key's unclaimed version on every edge; answer how many."""
    retired = 0
    for ring in conn.rings.values():
        retired += ring_spec.process_cancel(ring, key)
    for edge, segment_key in sorted(conn.fallback):
        if segment_key == key:
            retired += _retire_fallback(conn, edge, key)
    return retired


def process_cleanup_prefix(conn: ConnectorState, prefix: str) -> int:
    """Retire every unclaimed `prefix` + digits key on every edge and route."""
    retired = 0
    for ring in conn.rings.values():
        retired += ring_spec.process_cancel_prefix(ring, prefix)
    for edge, key in sorted(conn.fallback):
        if is_prefix_match(prefix, key):
            retired += _retire_fallback(conn, edge, key)
    return retired


def process_close(conn: ConnectorState) -> int:
    """Retire everything the connector holds. Idempotent; answers what it retired."""
    retired = 0
    for ring in conn.rings.values():
        retired += ring_spec.process_close(ring)
    for edge, key in sorted(conn.fallback):
        retired += _retire_fallback(conn, edge, key)
    conn.closed = True
    return retired


def process_release(conn: ConnectorState, edge: Edge, position: int) -> None:
    """The last borrowed view of a leased ring frame died (lease mode only)."""
    ring = conn.rings.get(edge)
    # Verify the edge has a ring (the frame's state is verified by the ring)
    assert ring is not None
    ring_spec.process_release(ring, position)
