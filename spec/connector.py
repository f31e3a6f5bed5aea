"""The connector: one process's routing between its rings and the fallback.

A connector owns one ring per edge it publishes on (set up lazily, at the
first put on that edge) and one fallback segment per (edge, key) for frames
the ring does not take. The routing rules, in the order a put applies them:

1. The ring is disabled (capacity 0) or its setup failed for this edge
   (ENOSPC, EPERM, a discovery failure, ...): fallback. A failed setup is
   remembered in `failed_edges` and the edge's puts take the fallback; the
   implementation tries the setup again after `ring_retry_seconds`
   (doubling up to a minute), which this model leaves out: a retried setup
   that succeeds is a fresh ring on the edge, as at its first put.
2. The ring says NOT_ADMITTED for the payload's frame (too large) but would
   admit a pool reference for the key: the pool (`spec.pool`). A slot takes
   the payload and the ring carries a small reference frame for the key, so
   the key's rules stay the ring's (route POOL). No slot to be had
   (`AcquireStatus.TOO_LARGE` / `EXHAUSTED`), or the ring FULL for the
   reference: the slot is abandoned and the fallback carries it.
3. The ring says NOT_ADMITTED (and no pool) or FULL: fallback.
4. The fallback refuses with back-pressure when the segment would take the
   live fallback bytes past the budget; nothing changes then.

Whichever route accepts, the key's older version on the *other* route is
retired, so an (edge, key) has at most one deliverable version in total.

A key is at most `layout.MAX_KEY_LENGTH` UTF-8 bytes: the implementation
refuses a longer one (InvalidKeyError) before any step here, so the ring's
"key too long: not admitted" rule is never met through a connector.

Descriptors are unbounded here. A get the implementation cannot finish for
want of them (ResourceExhaustedError) is no step of the model: it changes
nothing, so the key stays deliverable, exactly once (issue 22, defect 2).

A get with a descriptor reads only the route and place the descriptor names
(a ring descriptor never falls back); a get by key looks at both routes. A
ring frame that carries a pool reference is claimed like any ring frame;
the payload is then claimed from its slot and released (copy-out), and the
delivery's route is POOL. A pool put answers a `RingDescriptor`: the
reference frame is what it names.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from . import cohort as cohort_spec
from . import pool as pool_spec
from . import ring as ring_spec
from . import status
from .cohort import CohortTable
from .layout import (
    FRAME_STATE_CLAIMED,
    FRAME_STATE_PUBLISHED,
    MIN_POOL_CLASS,
    POOL_REF_LENGTH,
    compute_file_footprint,
    compute_frame_length,
    compute_ring_file_length,
)
from .pool import ClaimStatus, PoolState
from .ring import (
    ConsumeMode,
    GetStatus,
    PutStatus,
    RingState,
    compute_key_length,
    get_deliverable_frame,
    initialize_ring,
    is_admitted,
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

# The pid the model's consumer claims pool slots as (one process's connector).
MODEL_HOLDER_PID = 1


@dataclass(frozen=True)
class PoolRef:
    """The payload token of a ring frame that carries a pool slot's payload."""

    index: int  # the slot
    generation: int  # the publish it names


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
    pool_puts: int = 0  # puts carried by a pool slot (their reference on a ring)
    pool_gets: int = 0  # gets delivered from a pool slot
    pool_fallbacks: int = 0  # puts the pool could not take (no slot, ring full): the fallback's
    rings_replaced: int = 0  # rings re-created after a neighbour unlinked their file
    ring_frames_lost: int = 0  # unclaimed frames a replacement could not carry over


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
    pool: PoolState | None = None  # the producer's pool; None: no pool (every such put falls back)
    # slot index -> (edge, position) of the ring frame carrying its reference
    carriers: dict[int, tuple[Edge, int]] = field(default_factory=dict)
    health: ConnectorHealth = field(default_factory=ConnectorHealth)
    closed: bool = False  # set by close; nothing deliverable, nothing accepted afterwards
    # Publication cohorts per edge; a stored payload that is a member of one not
    # yet committed is not deliverable (`spec.cohort`).
    cohorts: CohortTable = field(default_factory=CohortTable)
    # Rings whose file a same-uid neighbour unlinked (`spec.environment`,
    # UNLINK_RING): still mapped and working, found by nobody new, replaced
    # at the producer's next put on the edge (`_replace_ring`).
    unlinked: set[Edge] = field(default_factory=set)


class Route(enum.Enum):
    RING = "ring"
    FALLBACK = "fallback"
    POOL = "pool"  # a pool slot; its reference frame on the ring


ConnectorPutStatus = status.PutStatus  # ACCEPTED, REFUSED, CLOSED


@dataclass(frozen=True)
class ConnectorPutResult:
    status: ConnectorPutStatus
    route: Route | None = None
    descriptor: Descriptor | None = None
    ring_status: PutStatus | None = None  # what the ring said, when it was asked
    length: int = 0  # frame or segment bytes


ConnectorGetStatus = status.GetStatus  # DELIVERED, NOT_FOUND, STALE, CLOSED


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


def choose_route(ring_usable: bool, ring_status: PutStatus | None, pool_fits: bool) -> Route:
    """The route a put takes next: the module docstring's rules 1-3, in one function.

    Asked before the ring is tried (`ring_status` None): RING when the
    edge's ring is usable, else FALLBACK (rule 1). Asked again with the
    ring's answer: POOL when the ring refused the payload as too large
    (NOT_ADMITTED) and `pool_fits` (the pool is on and the ring admits the
    key's reference frame, `is_pool_candidate`), else FALLBACK (rules 2, 3).
    A pool that finds no slot, or a ring FULL for the reference, leaves the
    fallback (rule 2's last sentence). The implementation's put asks the
    same function at the same two points (`impl.connector.put_path`).
    """
    if ring_status is None:
        return Route.RING if ring_usable else Route.FALLBACK
    if ring_status is PutStatus.NOT_ADMITTED and pool_fits:
        return Route.POOL
    return Route.FALLBACK


# -- accessors ---------------------------------------------------------------


def get_route_of(conn: ConnectorState, edge: Edge, key: str) -> Route | None:
    """Where the key's deliverable version lives, if anywhere."""
    ring = conn.rings.get(edge)
    if ring is not None:
        frame = get_deliverable_frame(ring, key)
        if frame is not None:
            return Route.POOL if _carries_pool_ref(frame.payload) else Route.RING
    if (edge, key) in conn.fallback:
        return Route.FALLBACK
    return None


def _carries_pool_ref(payload: object) -> bool:
    return isinstance(cohort_spec.get_payload(payload), PoolRef)


def get_deliverable(conn: ConnectorState) -> list[tuple[Edge, str, Route]]:
    """Every deliverable (edge, key) with its route, in a stable order."""
    found: list[tuple[Edge, str, Route]] = []
    for edge in sorted(conn.rings):
        for frame in conn.rings[edge].frames:
            if is_deliverable(frame):
                route = Route.POOL if _carries_pool_ref(frame.payload) else Route.RING
                found.append((edge, frame.key, route))
    for edge, key in sorted(conn.fallback):
        found.append((edge, key, Route.FALLBACK))
    return found


# -- transitions -------------------------------------------------------------


def initialize_connector(
    ring_capacity: int,
    fallback_budget: int,
    pool_min_class: int = MIN_POOL_CLASS,
    pool_max_class: int = MIN_POOL_CLASS,
    pool_budget: int = 0,
) -> ConnectorState:
    """A connector; a pool only when `pool_budget` > 0 (the model's default: none)."""
    # Verify the configuration (the implementation reports a ConfigurationError first)
    assert is_valid_capacity(ring_capacity)
    assert is_valid_budget(fallback_budget)
    assert pool_spec.is_valid_classes(pool_min_class, pool_max_class)
    assert pool_budget >= 0
    pool = (
        pool_spec.initialize_pool(pool_min_class, pool_max_class, pool_budget)
        if pool_budget > 0
        else None
    )
    return ConnectorState(ring_capacity=ring_capacity, fallback_budget=fallback_budget, pool=pool)


def is_carrier_pending(conn: ConnectorState, index: int) -> bool:
    """Whether the ring frame carrying slot `index`'s reference may still be claimed."""
    carrier = conn.carriers.get(index)
    if carrier is None:
        return False
    ring = conn.rings.get(carrier[0])
    if ring is None or ring.closed:
        return False
    frame = ring_spec.get_frame_at(ring, carrier[1])
    return frame is not None and frame.state in (FRAME_STATE_PUBLISHED, FRAME_STATE_CLAIMED)


def process_sync_carriers(conn: ConnectorState) -> None:
    """Tell the pool which carriers are gone (the producer reads its own frames' states)."""
    pool = conn.pool
    if pool is None:
        return
    for index in sorted(conn.carriers):
        if not is_carrier_pending(conn, index):
            pool_spec.process_pool_carrier_gone(pool, index)
            del conn.carriers[index]


def is_pool_candidate(conn: ConnectorState, key: str, put: ring_spec.PutResult) -> bool:
    """The ring refused the payload as too large but admits the key's reference frame."""
    if conn.pool is None or put.status is not PutStatus.NOT_ADMITTED:
        return False
    key_length = compute_key_length(key)
    return is_admitted(
        conn.ring_capacity, key_length, compute_frame_length(key_length, POOL_REF_LENGTH)
    )


def _put_pool(
    conn: ConnectorState, edge: Edge, key: str, payload_length: int, payload: object
) -> ConnectorPutResult | None:
    """The pool half of `process_put`; None when the put falls back (slot abandoned)."""
    pool = conn.pool
    assert pool is not None
    ring = conn.rings[edge]
    process_sync_carriers(conn)
    acquired = pool_spec.process_pool_acquire(pool, payload_length)
    if acquired.index is None:
        conn.health.pool_fallbacks += 1
        return None
    for index in acquired.evicted:
        conn.carriers.pop(index, None)
    generation = pool_spec.process_pool_publish(pool, acquired.index, payload_length, payload)
    ref = PoolRef(acquired.index, generation)
    # A member's envelope is in the slot (`payload_length` counts it); the
    # reference frame names the cohort, so the key's rules stay the ring's.
    stored_ref = cohort_spec.compute_stored_payload(conn.cohorts, edge, ref)
    put = ring_spec.process_put(ring, key, POOL_REF_LENGTH, stored_ref)
    if put.status is not PutStatus.PUBLISHED:
        pool_spec.process_pool_abandon(pool, acquired.index)
        conn.health.pool_fallbacks += 1
        return None
    assert put.position is not None
    conn.carriers[acquired.index] = (edge, put.position)
    _retire_fallback(conn, edge, key)
    conn.health.puts += 1
    conn.health.pool_puts += 1
    conn.health.bytes_transferred += payload_length
    return ConnectorPutResult(
        ConnectorPutStatus.ACCEPTED,
        Route.POOL,
        RingDescriptor(edge, key, put.position),
        put.status,
        put.frame_length,
    )


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


def process_neighbour_unlink_ring(conn: ConnectorState, edge: Edge) -> None:
    """A same-uid neighbour unlinks the edge's live ring file (`spec.environment` UNLINK_RING).

    The producer's mapping keeps working and nothing it knows changes until
    its next put on the edge, which notices (one fstat: no link left) and
    replaces the ring first (`_replace_ring`).
    """
    if not conn.closed and edge in conn.rings:
        conn.unlinked.add(edge)


def _replace_ring(conn: ConnectorState, edge: Edge) -> None:
    """The producer's answer to an unlinked ring: the promised Outcome of UNLINK_RING.

    A new ring continues the old one's positions (no descriptor of the old
    one names a frame of the new one); every unclaimed frame moves to it in
    publication order, a pool slot's carrier with it (the slot waits for
    the moved frame); one the new ring cannot take counts as lost. Nothing
    else is lost: a frame is moved or was claimed, exactly once.
    """
    conn.unlinked.discard(edge)
    old = conn.rings[edge]
    moved = sorted(
        (frame for frame in old.frames if is_deliverable(frame)),
        key=lambda frame: frame.position,
    )
    new = initialize_ring(conn.ring_capacity)
    new.head = new.tail = old.head
    conn.rings[edge] = new
    conn.health.rings_replaced += 1
    carried = {place: index for index, place in conn.carriers.items() if place[0] == edge}
    for frame in moved:
        put = ring_spec.process_put(new, frame.key, frame.payload_length, frame.payload)
        index = carried.get((edge, frame.position))
        if put.status is PutStatus.PUBLISHED:
            assert put.position is not None
            if index is not None:
                conn.carriers[index] = (edge, put.position)
        else:
            conn.health.ring_frames_lost += 1


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
    if edge in conn.unlinked:
        _replace_ring(conn, edge)
    # Inside a cohort of the edge: the payload is stored as its member.
    payload_length = cohort_spec.compute_stored_length(conn.cohorts, edge, payload_length)
    pool_payload = payload  # a pool slot holds the payload; its reference frame names the cohort
    payload = cohort_spec.compute_stored_payload(conn.cohorts, edge, payload)
    ring_status: PutStatus | None = None
    usable = process_ring_setup(conn, edge, ring_setup_ok)
    if choose_route(usable, None, False) is Route.RING:
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
        if choose_route(True, put.status, is_pool_candidate(conn, key, put)) is Route.POOL:
            pooled = _put_pool(conn, edge, key, payload_length, pool_payload)
            if pooled is not None:
                return pooled
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
    payload = cohort_spec.get_payload(payload)
    if route is Route.RING and isinstance(payload, PoolRef):
        return _deliver_pool(conn, payload)
    conn.health.gets += 1
    conn.health.bytes_transferred += payload_length
    if route is Route.RING:
        conn.health.ring_gets += 1
    return ConnectorGetResult(ConnectorGetStatus.DELIVERED, route, payload)


def _deliver_pool(conn: ConnectorState, ref: PoolRef) -> ConnectorGetResult:
    """The claimed ring frame carries a pool reference: claim the slot, copy out, release."""
    pool = conn.pool
    # Verify the reference is one of this connector's pool (the model never forges one)
    assert pool is not None
    claimed = pool_spec.process_pool_claim(pool, ref.index, ref.generation, MODEL_HOLDER_PID)
    assert claimed.status is ClaimStatus.DELIVERED
    pool_spec.process_pool_release(pool, ref.index)
    process_sync_carriers(conn)
    conn.health.gets += 1
    conn.health.pool_gets += 1
    conn.health.bytes_transferred += claimed.payload_length
    return ConnectorGetResult(ConnectorGetStatus.DELIVERED, Route.POOL, claimed.payload)


def _get_fallback(
    conn: ConnectorState, edge: Edge, key: str, generation: int | None
) -> ConnectorGetResult | None:
    segment = conn.fallback.get((edge, key))
    if segment is None or (generation is not None and segment.generation != generation):
        return None
    if cohort_spec.is_pending(conn.cohorts, edge, segment.payload):
        return _NOT_FOUND  # a member of a cohort not yet committed
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
        if _is_pending_frame(conn, edge, ring, key, descriptor.position):
            return _NOT_FOUND
        got = ring_spec.process_get(ring, key, descriptor.position, mode)
        if got.status is not GetStatus.DELIVERED:
            return ConnectorGetResult(ConnectorGetStatus.STALE)
        frame_length = _claimed_payload_length(ring, got.position)
        return _deliver(conn, Route.RING, got.payload, frame_length)
    if isinstance(descriptor, FallbackDescriptor):
        result = _get_fallback(conn, edge, key, descriptor.generation)
        return result if result is not None else ConnectorGetResult(ConnectorGetStatus.STALE)
    if ring is not None:
        if _is_pending_frame(conn, edge, ring, key, None):
            return _NOT_FOUND  # the key's one deliverable version is a pending member
        got = ring_spec.process_get(ring, key, None, mode)
        if got.status is GetStatus.DELIVERED:
            return _deliver(
                conn, Route.RING, got.payload, _claimed_payload_length(ring, got.position)
            )
    result = _get_fallback(conn, edge, key, None)
    return result if result is not None else ConnectorGetResult(ConnectorGetStatus.NOT_FOUND)


_NOT_FOUND = ConnectorGetResult(ConnectorGetStatus.NOT_FOUND)


def _is_pending_frame(
    conn: ConnectorState, edge: Edge, ring: RingState, key: str, position: int | None
) -> bool:
    """Whether the key's deliverable frame (the one at `position`, if given) is a pending member."""
    frame = get_deliverable_frame(ring, key)
    if frame is None or (position is not None and frame.position != position):
        return False
    return cohort_spec.is_pending(conn.cohorts, edge, frame.payload)


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
    if conn.pool is not None:
        pool_spec.process_pool_close(conn.pool)
        conn.carriers.clear()
    cohort_spec.process_cohort_close(conn.cohorts)
    conn.closed = True
    return retired


def process_cohort_open(conn: ConnectorState, edge: Edge) -> int | None:
    """Open a publication cohort on `edge` (or join the open one); its number, None once closed."""
    if conn.closed:
        return None
    return cohort_spec.process_cohort_open(conn.cohorts, edge)


def process_cohort_commit(conn: ConnectorState, edge: Edge) -> bool:
    """Leave the edge's open cohort; the outermost leave commits it (nothing once closed)."""
    if conn.closed or not cohort_spec.is_open(conn.cohorts, edge):
        return False
    return cohort_spec.process_cohort_commit(conn.cohorts, edge)


def process_release(conn: ConnectorState, edge: Edge, position: int) -> None:
    """The last borrowed view of a leased ring frame died (lease mode only)."""
    ring = conn.rings.get(edge)
    # Verify the edge has a ring (the frame's state is verified by the ring)
    assert ring is not None
    ring_spec.process_release(ring, position)
