# mypy: disable-error-code="misc"
# (actions are lambdas that bind loop variables as defaults, which mypy cannot infer)
"""Exhaustive bounded exploration of the model.

Breadth-first search over every model state reachable within a bound, with
the invariants of `invariants` checked on every state reached and the
per-transition properties checked on every edge of the search. A *system*
says what the state is, which actions apply, and how to name a state
canonically so that equal states are visited once.

Positions only grow, so ring states are re-based after every step: positions
shift down by a multiple of the capacity until the tail lies in the first lap.
Behaviour depends only on positions modulo the capacity and their
differences, so re-basing merges states the model cannot tell apart and
makes the reachable set finite. Payload tokens are the payload length, for
the same reason.

The counts a bound produces are golden: the tests assert them, so any change
of the model's behaviour shows up as a changed count that a reviewer must
look at.
"""

from __future__ import annotations

import dataclasses
from collections import Counter, deque
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from shmring.spec import connector as connector_spec
from shmring.spec import discovery as discovery_spec
from shmring.spec import invariants
from shmring.spec import registration as registration_spec
from shmring.spec import ring as ring_spec
from shmring.spec.connector import (
    ConnectorGetStatus,
    ConnectorPutStatus,
    ConnectorState,
    Descriptor,
    Edge,
    Route,
)
from shmring.spec.discovery import DeploymentGetStatus, DeploymentState, PublishedDescriptor
from shmring.spec.layout import (
    FRAME_HEADER_LENGTH,
    FRAME_STATE_CLAIMED,
    FRAME_STATE_PUBLISHED,
    PADDING_FRAME_TYPE,
)
from shmring.spec.producers import ProducerId
from shmring.spec.ring import ConsumeMode, Frame, GetStatus, RingState

S = TypeVar("S")

Action = tuple[str, Callable[[S], None]]  # (label, mutate a copy of the state)


class ExplorationError(AssertionError):
    """An invariant or a transition property failed; names the path to the state."""


@dataclass(frozen=True)
class ExplorationReport:
    """What one bounded exploration saw."""

    system: str  # which system was explored
    bound: str  # the bound, in words
    states: int  # distinct canonical states reached (the initial one included)
    transitions: int  # actions applied (edges of the search, duplicates included)
    depth: int  # longest shortest path from the initial state
    events: dict[str, int] = field(default_factory=dict)  # how often each interesting step occurred
    complete: bool = True  # False when max_states cut the search short


@dataclass
class System(Generic[S]):
    """A model to explore."""

    name: str
    bound: str
    initial: Callable[[], S]
    actions: Callable[[S], Iterable[Action[S]]]
    clone: Callable[[S], S]
    canonical: Callable[[S], Hashable]
    check: Callable[[S], None]
    # Checks one edge of the search: (before, label, after) -> event names seen
    step: Callable[[S, str, S], Iterable[str]] = lambda before, label, after: ()
    normalize: Callable[[S], None] = lambda state: None


def explore(
    system: System[S],
    max_depth: int | None = None,
    max_states: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> ExplorationReport:
    """Visit every state reachable within the bound, checking as it goes."""
    # Verify the bounds are positive when given
    assert max_depth is None or max_depth >= 0
    assert max_states is None or max_states > 0
    start = system.initial()
    system.normalize(start)
    system.check(start)
    seen: dict[Hashable, tuple[Hashable | None, str]] = {system.canonical(start): (None, "")}
    queue: deque[tuple[S, int]] = deque([(start, 0)])
    transitions = 0
    depth = 0
    events: Counter[str] = Counter()
    complete = True
    while queue:
        state, level = queue.popleft()
        depth = max(depth, level)
        if max_depth is not None and level >= max_depth:
            continue
        here = system.canonical(state)
        for label, apply in system.actions(state):
            after = system.clone(state)
            try:
                apply(after)
                events.update(system.step(state, label, after))
                system.normalize(after)
                system.check(after)
            except AssertionError as error:
                path = _path(seen, here) + [label]
                raise ExplorationError(
                    f"{system.name}: {error} after {' -> '.join(path)}"
                ) from error
            transitions += 1
            key = system.canonical(after)
            if key in seen:
                continue
            if max_states is not None and len(seen) >= max_states:
                complete = False
                continue
            seen[key] = (here, label)
            queue.append((after, level + 1))
        if progress is not None:
            progress(len(seen), transitions)
    return ExplorationReport(
        system=system.name,
        bound=system.bound,
        states=len(seen),
        transitions=transitions,
        depth=depth,
        events=dict(sorted(events.items())),
        complete=complete,
    )


def _path(seen: dict[Hashable, tuple[Hashable | None, str]], key: Hashable) -> list[str]:
    labels: list[str] = []
    current: Hashable | None = key
    while current is not None:
        parent, label = seen[current]
        if parent is not None:
            labels.append(label)
        current = parent
    return list(reversed(labels))


# -- rings -------------------------------------------------------------------

KEYS = ("j_1", "j_2x")  # one key the prefix "j_" matches, one it does not
PREFIX = "j_"


def compute_payload_length(key: str, frame_length: int) -> int:
    """A payload length whose frame under `key` is exactly `frame_length` bytes."""
    # Verify the frame can hold the header and the key
    payload = frame_length - FRAME_HEADER_LENGTH - ring_spec.compute_key_length(key)
    assert payload >= 0
    return payload


def clone_ring(ring: RingState) -> RingState:
    return RingState(
        capacity=ring.capacity,
        head=ring.head,
        tail=ring.tail,
        frames=[dataclasses.replace(frame) for frame in ring.frames],
        closed=ring.closed,
    )


def normalize_ring(ring: RingState) -> None:
    if ring.capacity == 0:
        return
    shift = (ring.tail // ring.capacity) * ring.capacity
    if shift:
        ring.head -= shift
        ring.tail -= shift
        for frame in ring.frames:
            frame.position -= shift


def canonical_ring(ring: RingState) -> Hashable:
    """Equal for states the model cannot tell apart.

    Only a published frame's key and payload can still be observed; a
    claimed frame is known by its position (for release); done and retired
    frames behave alike (reclaimable, never delivered) and merge.
    """
    return (
        ring.head,
        ring.tail,
        ring.closed,
        tuple(_canonical_frame(f) for f in ring.frames),
    )


def _canonical_frame(frame: Frame) -> Hashable:
    if frame.state == FRAME_STATE_PUBLISHED:
        return (frame.position, frame.length, frame.key, frame.payload_length)
    if frame.state == FRAME_STATE_CLAIMED:
        return (frame.position, frame.length, "claimed")
    return (frame.position, frame.length)


def ring_actions(ring: RingState, frame_lengths: tuple[int, ...]) -> list[Action[RingState]]:
    actions: list[Action[RingState]] = []
    if ring.closed:
        return actions

    def put(key: str, length: int) -> Callable[[RingState], None]:
        payload = compute_payload_length(key, length)
        return lambda r: _expect(ring_spec.process_put(r, key, payload, payload) is not None)

    for key in KEYS:
        for length in frame_lengths:
            actions.append((f"put({key},{length})", put(key, length)))
        actions.append((f"get({key})", _ring_get(key, None, ConsumeMode.COPY_OUT)))
        actions.append((f"lease({key})", _ring_get(key, None, ConsumeMode.LEASE)))
        actions.append(
            (f"get({key},@{ring.head})", _ring_get(key, ring.head, ConsumeMode.COPY_OUT))
        )
        actions.append(
            (f"cancel({key})", lambda r, key=key: _expect(ring_spec.process_cancel(r, key) >= 0))
        )
    for frame in ring.frames:
        if frame.key:
            actions.append(
                (
                    f"get({frame.key},@{frame.position})",
                    _ring_get(frame.key, frame.position, ConsumeMode.COPY_OUT),
                )
            )
        if frame.state == FRAME_STATE_CLAIMED:
            actions.append(
                (
                    f"release(@{frame.position})",
                    lambda r, p=frame.position: ring_spec.process_release(r, p),
                )
            )
    actions.append(
        (
            f"cancel_prefix({PREFIX})",
            lambda r: _expect(ring_spec.process_cancel_prefix(r, PREFIX) >= 0),
        )
    )
    actions.append(("close", lambda r: _expect(ring_spec.process_close(r) >= 0)))
    return actions


def _expect(condition: bool) -> None:
    assert condition


def _ring_get(key: str, position: int | None, mode: ConsumeMode) -> Callable[[RingState], None]:
    def apply(ring: RingState) -> None:
        before = ring_spec.get_deliverable_frame(ring, key)
        expected_payload = before.payload if before is not None else None
        got = ring_spec.process_get(ring, key, position, mode)
        if got.status is GetStatus.DELIVERED:
            # A get delivers the key's one deliverable version, never another
            assert before is not None and got.position == before.position
            assert got.payload == expected_payload
            # A descriptor reads only its exact position
            assert position is None or got.position == position
        elif position is None:
            assert got.status is GetStatus.NOT_FOUND and before is None
        else:
            assert got.status is GetStatus.STALE

    return apply


def _published(ring: RingState) -> int:
    return sum(1 for f in ring.frames if ring_spec.is_deliverable(f))


def ring_step(before: RingState, label: str, after: RingState) -> list[str]:
    """Transition properties of the ring, and the events worth counting.

    Called before `after` is re-based, so positions compare directly.
    """
    found: list[str] = []
    assert after.head >= before.head and after.tail >= before.tail, "positions went back"
    if label.startswith("put("):
        size = int(label.split(",")[1].rstrip(")"))
        new = [f for f in after.frames if f.position >= before.head]
        data = [f for f in new if f.frame_type != PADDING_FRAME_TYPE]
        if any(f.frame_type == PADDING_FRAME_TYPE for f in new):
            found.append("wrap")
        elif data and (data[0].position + data[0].length) % after.capacity == 0:
            found.append("exact fit")
        if not data:
            assert after.head == before.head, "a refused put moved the head"
            found.append("not admitted" if size > after.capacity // 4 else "full")
            if size > after.capacity // 4:
                assert after.tail == before.tail, "a put that is not admitted reclaimed"
    elif label.startswith("get(") and "@" in label and _published(after) == _published(before):
        found.append("stale descriptor")
    elif (
        label.startswith("cancel")
        and before.head >= before.capacity
        and _published(after) < _published(before)
    ):
        found.append("cancel after wrap")
    elif label.startswith("release(@"):
        position = int(label[len("release(@") : -1])
        if any(f.state == FRAME_STATE_CLAIMED and f.position < position for f in before.frames):
            found.append("lease released out of order")
    return found


def ring_system(
    capacity: int = 4096, frame_lengths: tuple[int, ...] = (256, 768, 1024, 1040)
) -> System[RingState]:
    return System(
        name="ring",
        bound=f"capacity={capacity}, keys={list(KEYS)}, frame lengths={list(frame_lengths)}",
        initial=lambda: ring_spec.initialize_ring(capacity),
        actions=lambda ring: ring_actions(ring, frame_lengths),
        clone=clone_ring,
        canonical=canonical_ring,
        check=invariants.check_ring,
        step=ring_step,
        normalize=normalize_ring,
    )


# -- connector: ring plus fallback -------------------------------------------

EDGE: Edge = ("s0", "s1")


@dataclass
class ConnectorWorld:
    """A connector and the last descriptor issued for each key."""

    conn: ConnectorState
    issued: dict[str, Descriptor] = field(default_factory=dict)


def clone_connector(conn: ConnectorState) -> ConnectorState:
    return ConnectorState(
        ring_capacity=conn.ring_capacity,
        fallback_budget=conn.fallback_budget,
        rings={edge: clone_ring(ring) for edge, ring in conn.rings.items()},
        failed_edges=set(conn.failed_edges),
        fallback={k: dataclasses.replace(v) for k, v in conn.fallback.items()},
        fallback_bytes=conn.fallback_bytes,
        next_generation=conn.next_generation,
        health=dataclasses.replace(conn.health),
        closed=conn.closed,
    )


def canonical_connector(conn: ConnectorState, issued: dict[str, Descriptor]) -> Hashable:
    """Generations and counters grow without bound; only their relations are observable."""
    rings = tuple((edge, canonical_ring(ring)) for edge, ring in sorted(conn.rings.items()))
    live = {(seg.edge, seg.key): seg.generation for seg in conn.fallback.values()}
    segments = tuple(
        (edge, key, seg.length, seg.payload_length)
        for (edge, key), seg in sorted(conn.fallback.items())
    )
    descriptors = []
    for key, descriptor in sorted(issued.items()):
        if isinstance(descriptor, connector_spec.RingDescriptor):
            ring = conn.rings[descriptor.edge]
            # A reclaimed position never holds a frame again: stale for good
            where = descriptor.position if descriptor.position >= ring.tail else -1
            descriptors.append((key, "ring", where))
        else:
            current = live.get((descriptor.edge, descriptor.key)) == descriptor.generation
            descriptors.append((key, "fallback", current))
    return (rings, tuple(sorted(conn.failed_edges)), segments, conn.closed, tuple(descriptors))


def _normalize_world(world: ConnectorWorld) -> None:
    for edge, ring in world.conn.rings.items():
        if ring.capacity == 0:
            continue
        shift = (ring.tail // ring.capacity) * ring.capacity
        normalize_ring(ring)
        for key, descriptor in list(world.issued.items()):
            if (
                isinstance(descriptor, connector_spec.RingDescriptor)
                and descriptor.edge == edge
                and shift
            ):
                world.issued[key] = dataclasses.replace(
                    descriptor, position=descriptor.position - shift
                )


def connector_actions(
    world: ConnectorWorld, frame_lengths: tuple[int, ...]
) -> list[Action[ConnectorWorld]]:
    conn = world.conn
    actions: list[Action[ConnectorWorld]] = []
    if conn.closed:
        return actions
    setups = (True, False) if EDGE not in conn.rings and EDGE not in conn.failed_edges else (True,)
    for key in KEYS:
        for length in frame_lengths:
            for ok in setups:
                label = f"put({key},{length}{'' if ok else ',setup fails'})"
                actions.append((label, _connector_put(key, length, ok)))
        actions.append((f"get({key})", _connector_get(key, False)))
        if key in world.issued:
            actions.append((f"get({key},descriptor)", _connector_get(key, True)))
        actions.append(
            (
                f"cleanup({key})",
                lambda w, key=key: _expect(connector_spec.process_cleanup(w.conn, key) >= 0),
            )
        )
    actions.append(
        (
            f"cleanup_prefix({PREFIX})",
            lambda w: _expect(connector_spec.process_cleanup_prefix(w.conn, PREFIX) >= 0),
        )
    )
    actions.append(("close", lambda w: _expect(connector_spec.process_close(w.conn) >= 0)))
    return actions


def _connector_put(key: str, length: int, setup_ok: bool) -> Callable[[ConnectorWorld], None]:
    def apply(world: ConnectorWorld) -> None:
        payload = compute_payload_length(key, length)
        result = connector_spec.process_put(world.conn, EDGE, key, payload, payload, setup_ok)
        if result.status is ConnectorPutStatus.ACCEPTED:
            assert result.descriptor is not None
            world.issued[key] = result.descriptor
            # The accepted version is now the key's only deliverable one
            assert connector_spec.get_route_of(world.conn, EDGE, key) is result.route

    return apply


def _connector_get(key: str, use_descriptor: bool) -> Callable[[ConnectorWorld], None]:
    def apply(world: ConnectorWorld) -> None:
        descriptor = world.issued.get(key) if use_descriptor else None
        route_before = connector_spec.get_route_of(world.conn, EDGE, key)
        got = connector_spec.process_get(world.conn, EDGE, key, descriptor)
        if got.status is ConnectorGetStatus.DELIVERED:
            assert got.route is route_before
            # A ring descriptor never falls back
            assert (
                not isinstance(descriptor, connector_spec.RingDescriptor) or got.route is Route.RING
            )
            # Claimed exactly once: the key has nothing left
            assert connector_spec.get_route_of(world.conn, EDGE, key) is None
        elif descriptor is None:
            assert got.status is ConnectorGetStatus.NOT_FOUND and route_before is None

    return apply


def connector_step(before: ConnectorWorld, label: str, after: ConnectorWorld) -> list[str]:
    found: list[str] = []
    if "setup fails" in label:
        found.append("ring setup failed")
    if label.startswith("put("):
        if after.conn.health.refusals > before.conn.health.refusals:
            found.append("back-pressure")
        elif after.conn.health.fallbacks > before.conn.health.fallbacks:
            found.append("fallback")
            key = label[4:].split(",")[0]
            ring = before.conn.rings.get(EDGE)
            if ring is not None and ring_spec.get_deliverable_frame(ring, key) is not None:
                found.append("re-put across routes")
        elif (EDGE, label[4:].split(",")[0]) in before.conn.fallback:
            found.append("re-put across routes")
    if label.endswith("descriptor)") and after.conn.health.gets == before.conn.health.gets:
        found.append("stale descriptor")
    return found


def connector_system(
    capacity: int = 4096,
    budget: int = 5000,  # one segment (4 KiB of pages) fits, a second does not
    frame_lengths: tuple[int, ...] = (1024, 1040),
) -> System[ConnectorWorld]:
    return System(
        name="connector",
        bound=f"capacity={capacity}, budget={budget}, one edge, keys={list(KEYS)}, frame lengths={list(frame_lengths)}",
        initial=lambda: ConnectorWorld(connector_spec.initialize_connector(capacity, budget)),
        actions=lambda world: connector_actions(world, frame_lengths),
        clone=lambda world: ConnectorWorld(clone_connector(world.conn), dict(world.issued)),
        canonical=lambda world: canonical_connector(world.conn, world.issued),
        check=lambda world: invariants.check_connector(world.conn),
        step=connector_step,
        normalize=_normalize_world,
    )


# -- deployment: producers, restart, discovery --------------------------------

IDENTITIES: tuple[tuple[int, int], ...] = ((100, 1), (100, 2), (200, 1))  # (100, 2) reuses pid 100
RECEIVER = "r"


@dataclass
class DeploymentWorld:
    dep: DeploymentState
    # The last descriptor each producer issued
    issued: dict[ProducerId, PublishedDescriptor] = field(default_factory=dict)
    puts: dict[ProducerId, int] = field(default_factory=dict)  # puts made per producer (bounded)


def clone_deployment(dep: DeploymentState) -> DeploymentState:
    producers = {
        identity: dataclasses.replace(p, connector=clone_connector(p.connector))
        for identity, p in dep.producers.items()
    }
    receivers = {
        name: dataclasses.replace(r, attached={e: set(ps) for e, ps in r.attached.items()})
        for name, r in dep.receivers.items()
    }
    directory = discovery_spec.DirectoryState(
        set(dep.directory.markers), dep.directory.stamp, set(dep.directory.files)
    )
    return DeploymentState(
        dep.ring_capacity, dep.fallback_budget, producers, directory, receivers, dep.pool
    )


def canonical_deployment(world: DeploymentWorld) -> Hashable:
    dep = world.dep
    producers = tuple(
        (
            identity,
            p.alive,
            p.closed,
            canonical_connector(
                p.connector,
                {"d": world.issued[identity].descriptor} if identity in world.issued else {},
            ),
        )
        for identity, p in sorted(dep.producers.items())
    )
    receivers = tuple(
        (
            name,
            r.seen_stamp == dep.directory.stamp,
            tuple((e, tuple(sorted(ps))) for e, ps in sorted(r.attached.items())),
        )
        for name, r in sorted(dep.receivers.items())
    )
    return (
        producers,
        tuple(sorted(dep.directory.markers)),
        tuple(sorted(dep.directory.files)),
        receivers,
        tuple(sorted(world.puts.items())),
    )


def _normalize_deployment(world: DeploymentWorld) -> None:
    for identity, producer in world.dep.producers.items():
        issued = world.issued.get(identity)
        inner = ConnectorWorld(producer.connector, {"d": issued.descriptor} if issued else {})
        _normalize_world(inner)
        if issued is not None:
            world.issued[identity] = PublishedDescriptor(identity, inner.issued["d"])


def deployment_actions(
    world: DeploymentWorld, key: str, frame_lengths: tuple[int, ...], max_puts: int
) -> list[Action[DeploymentWorld]]:
    dep = world.dep
    actions: list[Action[DeploymentWorld]] = []
    started = [i for i in IDENTITIES if i in dep.producers]
    if len(started) < len(IDENTITIES):
        nxt = IDENTITIES[len(started)]
        actions.append(
            (
                f"start{nxt}",
                lambda w, nxt=nxt: _expect(
                    discovery_spec.process_start_producer(w.dep, nxt) is not None
                ),
            )
        )
    for identity in started:
        producer = dep.producers[identity]
        if producer.alive and world.puts.get(identity, 0) < max_puts:
            setups = (
                (True, False)
                if EDGE not in producer.connector.rings
                and EDGE not in producer.connector.failed_edges
                else (True,)
            )
            for length in frame_lengths:
                for ok in setups:
                    actions.append(
                        (
                            f"put{identity}({key},{length}{'' if ok else ',setup fails'})",
                            _deployment_put(identity, key, length, ok),
                        )
                    )
        if producer.alive:
            actions.append(
                (f"kill{identity}", lambda w, i=identity: discovery_spec.process_exit(w.dep, i))
            )
            actions.append(
                (
                    f"close{identity}",
                    lambda w, i=identity: _expect(discovery_spec.process_close(w.dep, i) >= 0),
                )
            )
        if identity in world.issued:
            actions.append((f"get({key},descriptor of {identity})", _deployment_get(key, identity)))
    actions.append((f"get({key})", _deployment_get(key, None)))
    return actions


def _deployment_put(
    identity: ProducerId, key: str, length: int, ok: bool
) -> Callable[[DeploymentWorld], None]:
    def apply(world: DeploymentWorld) -> None:
        payload = compute_payload_length(key, length)
        result, published = discovery_spec.process_put(
            world.dep, identity, EDGE, key, payload, (identity, payload), ok
        )
        if published is not None:
            world.issued[identity] = published
        world.puts[identity] = world.puts.get(identity, 0) + 1
        assert result.status is not ConnectorPutStatus.CLOSED

    return apply


def _deployment_get(key: str, identity: ProducerId | None) -> Callable[[DeploymentWorld], None]:
    def apply(world: DeploymentWorld) -> None:
        published = world.issued.get(identity) if identity is not None else None
        got = discovery_spec.process_get(world.dep, RECEIVER, EDGE, key, published)
        if got.status is DeploymentGetStatus.DELIVERED:
            assert got.producer is not None
            # Never a frame of a producer that is gone, not even under a reused pid
            assert world.dep.producers[got.producer].alive
            assert isinstance(got.payload, tuple) and got.payload[0] == got.producer
        if published is not None and not world.dep.producers[published.producer].alive:
            assert got.status is DeploymentGetStatus.PRODUCER_GONE

    return apply


def deployment_step(before: DeploymentWorld, label: str, after: DeploymentWorld) -> list[str]:
    invariants.check_stamp_step(before.dep.directory, after.dep.directory)
    invariants.check_reclaim_step(before.dep, after.dep)
    found: list[str] = []
    if label.startswith("start") and any(
        i[0] == int(label[6:].split(",")[0]) for i in before.dep.producers
    ):
        found.append("pid reused")
    if label.startswith("kill"):
        found.append("producer killed")
    if "setup fails" in label:
        found.append("ring setup failed")
    scans_before = sum(r.scans for r in before.dep.receivers.values())
    scans_after = sum(r.scans for r in after.dep.receivers.values())
    if label.startswith("get("):
        found.append("rescan" if scans_after > scans_before else "no rescan")
        if scans_after > scans_before:
            invariants.check_reclaimed_after_scan(after.dep)
            if discovery_spec.get_dead_with_files(before.dep):
                found.append("dead producer's files reclaimed")
        if "descriptor" in label and sum(
            p.connector.health.gets for p in after.dep.producers.values()
        ) == sum(p.connector.health.gets for p in before.dep.producers.values()):
            found.append("descriptor not served")
    if len(after.dep.directory.markers) < len(before.dep.directory.markers) and label.startswith(
        "get("
    ):
        found.append("stale marker pruned")
    return found


def deployment_system(
    capacity: int = 4096,
    budget: int = 5000,  # one segment (4 KiB of pages) fits, a second does not
    frame_lengths: tuple[int, ...] = (1024, 1040),
    max_puts: int = 2,
) -> System[DeploymentWorld]:
    key = KEYS[0]
    return System(
        name="deployment",
        bound=f"capacity={capacity}, budget={budget}, producers={list(IDENTITIES)}, {max_puts} puts each, one edge, key={key!r}, frame lengths={list(frame_lengths)}",
        initial=lambda: DeploymentWorld(discovery_spec.initialize_deployment(capacity, budget)),
        actions=lambda world: deployment_actions(world, key, frame_lengths, max_puts),
        clone=lambda world: DeploymentWorld(
            clone_deployment(world.dep), dict(world.issued), dict(world.puts)
        ),
        canonical=canonical_deployment,
        check=lambda world: invariants.check_deployment(world.dep),
        step=deployment_step,
        normalize=_normalize_deployment,
    )


# -- registration: CUDA host registration lifecycle ---------------------------


@dataclass
class RegistrationWorld:
    registry: registration_spec.RegistryState
    transfers: int = 0  # transfers started (bounded)


def _clone_registry(registry: registration_spec.RegistryState) -> registration_spec.RegistryState:
    driver = registration_spec.DriverState(
        ranges=dict(registry.driver.ranges),
        faults=[dataclasses.replace(f) for f in registry.driver.faults],
        calls=registry.driver.calls,
    )
    return dataclasses.replace(
        registry,
        driver=driver,
        segments={i: dataclasses.replace(s) for i, s in registry.segments.items()},
    )


def canonical_registration(world: RegistrationWorld) -> Hashable:
    """Segment ids and call counters only grow; what they do is positional."""
    registry = world.registry
    live = [
        s
        for s in sorted(registry.segments.values(), key=lambda s: s.segment_id)
        if s.state != "removed"
    ]
    segments = tuple(
        (
            s.length,
            s.state,
            s.registered,
            s.copied,
            s.mapped,
            s.linked,
            s.address in registry.driver.ranges,
        )
        for s in live
    )
    faults = tuple(
        (f.call, f.error, f.nth, f.seen if f.nth else 0, f.spent) for f in registry.driver.faults
    )
    return (segments, faults, registry.poisoned, registry.closed, world.transfers)


FAULT_CALLS: tuple[str | None, ...] = registration_spec.DRIVER_CALLS


def registration_actions(
    world: RegistrationWorld, max_transfers: int
) -> list[Action[RegistrationWorld]]:
    registry = world.registry
    actions: list[Action[RegistrationWorld]] = []
    if registry.closed:
        return actions
    if world.transfers < max_transfers:
        for lengths in ((4096,), (4096, 8192)):
            actions.append((f"transfer{list(lengths)}", _transfer(list(lengths), None)))
        actions.append(("transfer[4096] ENOSPC", _transfer([4096], {0: "ENOSPC"})))
    if not registry.driver.faults:
        for call in FAULT_CALLS:
            for nth in (1, 2, registration_spec.FAULT_EVERY):
                actions.append(
                    (
                        f"fail({call},nth={nth})",
                        lambda w, c=call, n=nth: registration_spec.process_arm_fault(
                            w.registry.driver, c, registration_spec.CUDA_ERROR_UNKNOWN, n
                        ),
                    )
                )
    else:
        actions.append(
            ("clear faults", lambda w: registration_spec.process_clear_faults(w.registry.driver))
        )
    for segment in registry.segments.values():
        if segment.state == registration_spec.SEGMENT_PUBLISHED and segment.linked:
            actions.append(
                (
                    f"receive({segment.segment_id})",
                    lambda w, i=segment.segment_id: registration_spec.process_receive(
                        w.registry, i
                    ),
                )
            )
        if segment.registered and segment.address in registry.driver.ranges:
            actions.append(
                (
                    f"unregister out of band({segment.segment_id})",
                    lambda w, i=segment.segment_id: _expect(
                        isinstance(
                            registration_spec.process_out_of_band_unregister(w.registry, i), str
                        )
                    ),
                )
            )
    actions.append(("close", lambda w: _expect(registration_spec.process_close(w.registry) >= 0)))
    return actions


def _transfer(
    lengths: list[int], os_errors: dict[int, str] | None
) -> Callable[[RegistrationWorld], None]:
    def apply(world: RegistrationWorld) -> None:
        world.transfers += 1
        result = registration_spec.process_transfer(world.registry, lengths, os_errors)
        published = [
            i
            for i in result.segment_ids
            if world.registry.segments[i].state == registration_spec.SEGMENT_PUBLISHED
        ]
        # All fields published, or none
        if result.status is registration_spec.TransferStatus.PUBLISHED:
            assert len(published) == len(lengths)
        else:
            assert not published

    return apply


def registration_step(before: RegistrationWorld, label: str, after: RegistrationWorld) -> list[str]:
    found: list[str] = []
    if not before.registry.poisoned and after.registry.poisoned:
        found.append("registry poisoned")
    if label.startswith("transfer"):
        retained_before = len(registration_spec.get_retained(before.registry))
        if len(registration_spec.get_retained(after.registry)) > retained_before:
            found.append("mapping retained")
        published = sum(
            1
            for s in after.registry.segments.values()
            if s.state == registration_spec.SEGMENT_PUBLISHED
        ) - sum(
            1
            for s in before.registry.segments.values()
            if s.state == registration_spec.SEGMENT_PUBLISHED
        )
        found.append("transfer published" if published else "transfer failed")
        if before.registry.poisoned:
            found.append("refused while poisoned")
    return found


def registration_system(max_transfers: int = 2) -> System[RegistrationWorld]:
    return System(
        name="registration",
        bound=f"{max_transfers} transfers of 1 or 2 fields, one armed fault at a time on {list(FAULT_CALLS)}",
        initial=lambda: RegistrationWorld(registration_spec.initialize_registry()),
        actions=lambda world: registration_actions(world, max_transfers),
        clone=lambda world: RegistrationWorld(_clone_registry(world.registry), world.transfers),
        canonical=canonical_registration,
        check=lambda world: invariants.check_registration(world.registry),
        step=registration_step,
    )


# -- the bounds the campaign and the tests use --------------------------------


def ci_systems() -> list[tuple[System[Any], int | None]]:
    """The bound CI explores completely (about 30 s on one core)."""
    return [
        (ring_system(frame_lengths=(768, 1024, 1040)), None),
        (connector_system(frame_lengths=(768, 1024, 1040)), None),
        (deployment_system(frame_lengths=(1024,), max_puts=1), None),
        (registration_system(max_transfers=3), None),
    ]


def long_systems() -> list[tuple[System[Any], int | None]]:
    """A larger bound for long campaigns (minutes)."""
    return [
        (ring_system(frame_lengths=(512, 1024, 1040)), 10),
        (connector_system(budget=13000, frame_lengths=(768, 1024, 1040)), None),
        (deployment_system(frame_lengths=(1024,), max_puts=2), None),
        (registration_system(max_transfers=4), None),
    ]
