"""Discovery: how receivers find the producers of an edge.

A deployment has one directory. A producer adds a marker for (itself, edge)
only after its ring on that edge is ready, and removes its markers when it
closes. Every change to the markers advances the directory's `stamp`, which
strictly increases, so a receiver rescans only when the stamp moved and
never misses a new producer, even when the wall clock does not advance (the
implementation's stamp is a counter, not an mtime).

A receiver caches, per edge, the producers it has attached (reader channels
mapped). It records the stamp it read *before* scanning, so a producer that
registers during the scan moves the stamp past the cached one and is picked
up by the next get. Markers of dead producers are pruned during a scan;
channels of producers that exited or closed are released at the next get.

Reclaim. Everything else a producer leaves in the directory (its rings,
live file, fallback segments and spare files; `DirectoryState.files`) is
removed by the producer itself when it closes. A producer that was killed
cannot; the first scan of any receiver that finds it dead reclaims all of
it, alongside the stale markers, so a crash loop does not fill shared
memory. After that scan no file of a dead producer remains, and a live
producer's files are never touched (identity is (pid, start time): a
restarted process is another producer).

Frames of a producer that is not alive are never delivered: a get with a
descriptor of a dead producer answers PRODUCER_GONE; a get by key looks only
at live producers, so a new producer's reused key is never served an old
frame.

A producer is one connector instance, (pid, start time, instance)
(`spec.producers`): a process may run several producers on one edge, each
with its own marker, each discovered and closed on its own. A killed process
takes every one of its producers with it (`process_exit_process`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from . import connector as connector_spec
from . import producers as producers_spec
from . import status
from .connector import (
    ConnectorGetResult,
    ConnectorGetStatus,
    ConnectorPutResult,
    Descriptor,
    Edge,
    Route,
)
from .producers import ProducerId, ProducerState
from .ring import ConsumeMode

# -- state -------------------------------------------------------------------


@dataclass
class DirectoryState:
    """The per-deployment discovery directory."""

    # (producer, edge) pairs; a marker exists only once that producer's ring on the edge is ready
    markers: set[tuple[ProducerId, Edge]] = field(default_factory=set)
    stamp: int = 0  # strictly increases with every change of `markers`
    # Producers with files (rings, live file, segments, spares) in the directory;
    # a closed producer has none, a dead one keeps its files until a scan reclaims them
    files: set[ProducerId] = field(default_factory=set)


@dataclass
class ReceiverState:
    """One receiving process's discovery cache."""

    seen_stamp: int | None = None  # stamp read before the last scan; None: never scanned
    # Reader channels mapped per edge; only producers that had a marker at the last scan
    attached: dict[Edge, set[ProducerId]] = field(default_factory=dict)
    scans: int = 0  # directory scans done; grows only when the stamp moved


@dataclass(frozen=True)
class PublishedDescriptor:
    """What a producer hands the receiver: whose frame, and where."""

    producer: ProducerId
    descriptor: Descriptor


DeploymentGetStatus = status.GetStatus  # DELIVERED, NOT_FOUND, STALE, PRODUCER_GONE


@dataclass(frozen=True)
class DeploymentGetResult:
    status: DeploymentGetStatus
    producer: ProducerId | None = None  # whose frame was delivered
    route: Route | None = None
    payload: object = None


@dataclass
class DeploymentState:
    """Every producer and receiver of one deployment (scope)."""

    ring_capacity: int  # every producer's ring capacity; never changes
    fallback_budget: int  # every producer's fallback budget; never changes
    producers: dict[ProducerId, ProducerState] = field(default_factory=dict)  # all ever started
    directory: DirectoryState = field(default_factory=DirectoryState)
    receivers: dict[str, ReceiverState] = field(default_factory=dict)
    pool: tuple[int, int, int] | None = None  # every producer's pool (min, max class, budget)


# -- predicates and accessors ------------------------------------------------


def is_marker_stale(dep: DeploymentState, producer: ProducerId) -> bool:
    """A marker whose producer is no longer alive."""
    return not dep.producers[producer].alive


def get_live_producers(dep: DeploymentState, edge: Edge) -> list[ProducerId]:
    """Producers with a marker on the edge that are alive, in a stable order."""
    return sorted(
        p
        for p, e in dep.directory.markers
        if e == edge and producers_spec.is_delivering(dep.producers[p])
    )


def is_directory_required(dep: DeploymentState) -> bool:
    """Whether the deployment directory must exist: a scope's lifetime is the union of its members'.

    Issue 22, defect 8: every live member (a producer that neither closed
    nor died, every receiver, a transfer sender) keeps the directory; it is
    removed only by the last member out, and only once nothing but the
    stamp and the membership file is left in it (`is_directory_removable`).
    """
    return bool(dep.receivers) or any(state.alive for state in dep.producers.values())


def is_directory_removable(dep: DeploymentState) -> bool:
    """Whether the last member's leave removes the directory: no member left, no dead one's files."""
    return not is_directory_required(dep) and not get_dead_with_files(dep)


def get_dead_with_files(dep: DeploymentState) -> set[ProducerId]:
    """Producers that are not alive and still have files in the directory."""
    return {p for p in dep.directory.files if not dep.producers[p].alive}


def get_receiver(dep: DeploymentState, name: str) -> ReceiverState:
    return dep.receivers.setdefault(name, ReceiverState())


def get_candidates(
    dep: DeploymentState, receiver: ReceiverState, edge: Edge, key: str
) -> list[tuple[ProducerId, Route]]:
    """Live producers holding a deliverable version of the key on the edge.

    Ring frames are found through attached channels, fallback segments by
    name. A workload with one producer per key has at most one candidate;
    with several, the implementation may deliver any of them.
    """
    found: list[tuple[ProducerId, Route]] = []
    attached = receiver.attached.get(edge, set())
    for identity in sorted(dep.producers):
        producer = dep.producers[identity]
        if not producers_spec.is_delivering(producer):
            continue
        route = connector_spec.get_route_of(producer.connector, edge, key)
        # A pool reference is a ring frame: found through the attached channel too.
        if route in (Route.RING, Route.POOL) and identity in attached or route is Route.FALLBACK:
            found.append((identity, route))
    return found


# -- transitions -------------------------------------------------------------


def initialize_deployment(
    ring_capacity: int, fallback_budget: int, pool: tuple[int, int, int] | None = None
) -> DeploymentState:
    """A deployment; `pool` = (min class, max class, budget) gives every producer a pool."""
    # Verify the configuration
    assert connector_spec.is_valid_budget(fallback_budget)
    return DeploymentState(ring_capacity=ring_capacity, fallback_budget=fallback_budget, pool=pool)


def _change_markers(dep: DeploymentState) -> None:
    dep.directory.stamp += 1


def process_start_producer(dep: DeploymentState, identity: ProducerId) -> ProducerState:
    """A new process starts publishing; it may reuse an old pid, never an identity."""
    # Verify the identity was never used in this deployment
    assert identity not in dep.producers
    producer = producers_spec.initialize_producer(
        identity, dep.ring_capacity, dep.fallback_budget, dep.pool
    )
    dep.producers[identity] = producer
    return producer


def process_put(
    dep: DeploymentState,
    identity: ProducerId,
    edge: Edge,
    key: str,
    payload_length: int,
    payload: object,
    ring_setup_ok: bool = True,
) -> tuple[ConnectorPutResult, PublishedDescriptor | None]:
    """A live producer puts; a newly ready ring registers its marker."""
    producer = dep.producers.get(identity)
    # Verify the producer exists and is alive
    assert producer is not None and producer.alive
    had_ring = edge in producer.connector.rings
    result = connector_spec.process_put(
        producer.connector, edge, key, payload_length, payload, ring_setup_ok
    )
    dep.directory.files.add(identity)  # at least its live file
    if not had_ring and edge in producer.connector.rings:
        dep.directory.markers.add((identity, edge))
        _change_markers(dep)
    published = PublishedDescriptor(identity, result.descriptor) if result.descriptor else None
    return result, published


def process_exit(dep: DeploymentState, identity: ProducerId) -> None:
    """The producer was killed; its markers and files stay until pruned or collected."""
    producer = dep.producers.get(identity)
    # Verify the producer exists and is alive
    assert producer is not None and producer.alive
    producers_spec.process_producer_exit(producer)


def process_exit_process(dep: DeploymentState, process: tuple[int, int]) -> list[ProducerId]:
    """A process was killed: every live producer it ran exits; answers them in order."""
    # Verify the process ran at least one live producer
    gone = sorted(
        identity
        for identity, producer in dep.producers.items()
        if producer.alive and producers_spec.get_process(identity) == process
    )
    assert gone
    for identity in gone:
        producers_spec.process_producer_exit(dep.producers[identity])
    return gone


def process_close(dep: DeploymentState, identity: ProducerId) -> int:
    """The producer closes: retire everything, remove its markers."""
    producer = dep.producers.get(identity)
    # Verify the producer exists and is alive
    assert producer is not None and producer.alive
    retired = producers_spec.process_producer_close(producer)
    dep.directory.files.discard(identity)
    mine = {marker for marker in dep.directory.markers if marker[0] == identity}
    if mine:
        dep.directory.markers -= mine
        _change_markers(dep)
    return retired


def process_refresh(dep: DeploymentState, name: str) -> bool:
    """A receiver's look at the directory before a get; answers whether it scanned.

    No scan when the stamp has not moved. A scan reclaims every file of dead
    producers (`process_reclaim`), prunes stale markers (which moves the
    stamp; the receiver caches the stamp after its own pruning) and attaches
    every live producer's channel per edge. Channels of producers that are
    no longer alive are released whether or not a scan happened.
    """
    receiver = get_receiver(dep, name)
    scanned = False
    if receiver.seen_stamp != dep.directory.stamp:
        scanned = True
        receiver.scans += 1
        process_reclaim(dep)
        stale = {m for m in dep.directory.markers if is_marker_stale(dep, m[0])}
        if stale:
            dep.directory.markers -= stale
            _change_markers(dep)
        receiver.seen_stamp = dep.directory.stamp
        attached: dict[Edge, set[ProducerId]] = {}
        for identity, edge in dep.directory.markers:
            attached.setdefault(edge, set()).add(identity)
        receiver.attached = attached
    for edge in list(receiver.attached):
        live = {
            p for p in receiver.attached[edge] if producers_spec.is_delivering(dep.producers[p])
        }
        if live:
            receiver.attached[edge] = live
        else:
            del receiver.attached[edge]
    return scanned


def process_join(dep: DeploymentState) -> set[ProducerId]:
    """A member joins (its first put or get): dead members' files go; answers whose.

    Markers stay (pruning moves the stamp; a receiver's scan does it). So a
    scope whose members all died (a restarted container, pids from 1 again
    in a new pid namespace) gives its space back at the next join, before
    any receiver looks.
    """
    return process_reclaim(dep)


def process_reclaim(dep: DeploymentState) -> set[ProducerId]:
    """Remove every file of producers that are not alive; answers whose files went.

    Only files of producers found dead go: a live producer's, or a restarted
    process's (another identity), are never touched. Their frames were
    undeliverable already, so no get answers differently afterwards.
    """
    dead = get_dead_with_files(dep)
    dep.directory.files -= dead
    return dead


def _wrap(identity: ProducerId, got: ConnectorGetResult) -> DeploymentGetResult:
    status = {
        ConnectorGetStatus.DELIVERED: DeploymentGetStatus.DELIVERED,
        ConnectorGetStatus.NOT_FOUND: DeploymentGetStatus.NOT_FOUND,
        ConnectorGetStatus.STALE: DeploymentGetStatus.STALE,
        ConnectorGetStatus.CLOSED: DeploymentGetStatus.PRODUCER_GONE,
    }[got.status]
    if status is DeploymentGetStatus.DELIVERED:
        return DeploymentGetResult(status, identity, got.route, got.payload)
    return DeploymentGetResult(status)


def process_get(
    dep: DeploymentState,
    name: str,
    edge: Edge,
    key: str,
    published: PublishedDescriptor | None = None,
    mode: ConsumeMode = ConsumeMode.COPY_OUT,
) -> DeploymentGetResult:
    """A receiver claims the key's deliverable version from a live producer."""
    # Verify a descriptor names the same edge and key it is used with
    assert published is None or (
        published.descriptor.edge == edge and published.descriptor.key == key
    )
    process_refresh(dep, name)
    if published is not None:
        producer = dep.producers.get(published.producer)
        if producer is None or not producers_spec.is_delivering(producer):
            return DeploymentGetResult(DeploymentGetStatus.PRODUCER_GONE)
        got = connector_spec.process_get(producer.connector, edge, key, published.descriptor, mode)
        return _wrap(published.producer, got)
    candidates = get_candidates(dep, get_receiver(dep, name), edge, key)
    if not candidates:
        return DeploymentGetResult(DeploymentGetStatus.NOT_FOUND)
    identity, _ = candidates[0]
    got = connector_spec.process_get(dep.producers[identity].connector, edge, key, None, mode)
    return _wrap(identity, got)
