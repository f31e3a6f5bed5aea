"""Connectors in lockstep with `spec.discovery`, under faults.

Design rationale. A fault cell runs a short, fixed sequence of operations on
real connectors and applies each to the model (`spec.discovery`, whose
producers hold `spec.connector` states). While an operation succeeds, its
answer must be the model's answer: the same route and ring position for a
put, a refusal exactly when the model refuses, the same status, producer,
route and payload bytes for a get.

An operation that raised (an injected error escaped, which is allowed for
documented types) has no answer to compare. What it *did* is read from the
files themselves (`observe`: the key's PUBLISHED ring frames and its
fallback segment, read with plain system calls outside the seam), and must
be one of the outcomes the contract allows:

* a failed put: unchanged, or fully applied, or the key's older version
  retired and the new one not published (a key never has two versions, and
  a failed put never publishes half a frame);
* a failed get: unchanged (a failed get never consumes a frame);
* a failed close: retried once the faults stop, then nothing is deliverable.

The model then follows the outcome that happened, so later operations are
compared exactly again. After the scenario, `check_all` compares every key's
observed state with the model.
"""

from __future__ import annotations

import contextlib
import copy
import mmap
import os
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from ..impl import codec
from ..impl.connector import (
    Connector,
    Delivery,
    GetStatus,
    RingDescriptor,
)
from ..impl.connector.seams import Seams, seamed_connector
from ..impl.errors import BackPressureError, CorruptFrameError, ShmringError
from ..impl.frame_io import SharedWords
from ..impl.names import (
    ProducerIdentity,
    fallback_segment_path,
    read_segment_owner,
    ring_path,
)
from ..impl.os_seam import DEFAULT_OS
from ..impl.ring.frames import published_keys, read_checked_ring_header
from ..spec import connector as connector_spec
from ..spec import discovery as discovery_spec
from ..spec import pool as pool_spec
from ..spec import producers as producers_spec
from ..spec import ring as ring_spec
from ..spec.connector import ConnectorPutStatus
from ..spec.discovery import DeploymentGetStatus, PublishedDescriptor
from ..spec.layout import FRAME_STATE_OFFSET, FRAME_STATE_RETIRED, RING_HEADER_LENGTH, U16_FORMAT

Edge = tuple[str, str]
# What escapes a connector operation without being a bug: shmring's own
# errors, and OSError (the injected errno, or one it caused).
DOCUMENTED_ERRORS: tuple[type[BaseException], ...] = (ShmringError, OSError)


class ScenarioFailure(AssertionError):
    """The implementation broke a promise in a scenario (the message says which)."""


def require(condition: bool, message: str | Callable[[], str]) -> None:
    if not condition:
        raise ScenarioFailure(message() if callable(message) else message)


# -- reading the files -----------------------------------------------------------------


@dataclass(frozen=True)
class Observed:
    """Where a key of one producer is deliverable, read from the files."""

    ring: tuple[int, ...]  # positions of PUBLISHED frames of the key in the producer's ring
    fallback: bool  # a segment for (edge, key) owned by the producer exists


def _read_ring_keys(path: str) -> dict[str, list[int]]:
    """key -> positions of PUBLISHED data frames between tail and head of the ring at `path`."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return {}
    try:
        size = os.fstat(fd).st_size
        if size <= RING_HEADER_LENGTH:
            return {}
        mapping = mmap.mmap(fd, size, prot=mmap.PROT_READ)
    finally:
        os.close(fd)
    try:
        with memoryview(mapping) as buf:
            header, problem = read_checked_ring_header(buf, size)
            if problem is not None:
                return {}
            words = SharedWords(buf)
            try:
                return published_keys(buf, words, header.capacity, path)
            except CorruptFrameError as error:
                raise ScenarioFailure(f"ring walk: {error}") from error
            finally:
                words.release()
    finally:
        mapping.close()


def _segment_owner(path: str) -> ProducerIdentity | None:
    """The owner of the segment at `path`; None when there is none, or it is retired.

    A segment its producer retired but could not remove yet (its lock held,
    its unlink failed: `FallbackWriter.reap` removes it later) is no version.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        state = os.pread(fd, 2, RING_HEADER_LENGTH + FRAME_STATE_OFFSET)
        if len(state) == 2 and struct.unpack(U16_FORMAT, state)[0] == FRAME_STATE_RETIRED:
            return None
        return read_segment_owner(fd, DEFAULT_OS)
    finally:
        os.close(fd)


def observe(directory: str, producer: tuple[int, ...], edge: Edge, key: str) -> Observed:
    """The key's files of `producer` (a connector's (pid, start time, instance))."""
    ring = _read_ring_keys(ring_path(directory, edge[0], edge[1], producer)).get(key, [])
    owner = _segment_owner(fallback_segment_path(directory, edge, key))
    return Observed(tuple(ring), owner == producer[:2])


def expected_of(conn: connector_spec.ConnectorState, edge: Edge, key: str) -> Observed:
    """What `observe` must show for the model's state of one producer."""
    ring = conn.rings.get(edge)
    frame = ring_spec.get_deliverable_frame(ring, key) if ring is not None else None
    return Observed(
        (frame.position,) if frame is not None else (),
        (edge, key) in conn.fallback,
    )


# -- the lockstep ------------------------------------------------------------------------


@dataclass
class Ledger:
    """Counters of one scenario run (the cell's outcome record)."""

    operations: int = 0
    accepted: int = 0
    refused: int = 0
    delivered: int = 0
    failed: list[str] = field(default_factory=list)  # "op: ErrorType" of every documented error


class Deployment:
    """Producers and receivers of one scope, each operation mirrored in the model."""

    def __init__(
        self,
        scope: str,
        os_facade: Any,
        ring_capacity: int,
        fallback_budget: int,
        ledger: Ledger,
        armed: Callable[[], bool],
        *,
        keep_fallback_files: bool = False,
        pool: tuple[int, int, int] | None = None,
    ) -> None:
        self.scope = scope
        self.os = os_facade
        self.capacity = ring_capacity
        self.budget = fallback_budget
        # Producers keep every fallback file for reuse (readers hand them back).
        self.keep_fallback_files = keep_fallback_files
        self.ledger = ledger
        self.armed = armed  # whether faults may still fire (errors are allowed only then)
        # (min class, max class, budget) of every producer's pool; None: no pool (the
        # pool is then off in the producers too, so their large payloads stay segments).
        self.pool = pool
        self.model = discovery_spec.initialize_deployment(ring_capacity, fallback_budget, pool)
        self.producers: dict[ProducerIdentity, Connector] = {}
        self.receivers: dict[str, Connector] = {}
        self.keys: set[tuple[ProducerIdentity, Edge, str]] = set()
        # Producers whose close failed: what they held just before. Until the
        # close is retried (`retry_closes`) their leftovers may still be
        # delivered, each at most once.
        self.closing: dict[ProducerIdentity, connector_spec.ConnectorState] = {}
        self.directory = ""

    # -- lifecycle -------------------------------------------------------------------

    def start_producer(self, identity: ProducerIdentity) -> Connector:
        connector = seamed_connector(
            self.scope,
            Seams(identity=identity),
            ring_capacity=self.capacity,
            fallback_budget=self.budget,
            **_pool_options(self.pool),
            os_facade=self.os,
            spin_seconds=0.0,
            max_sleep_seconds=0.0,
            fallback_spare_bytes=1 << 20 if self.keep_fallback_files else 0,
            fallback_spare_min_bytes=0,
            ring_retry_seconds=None,  # the model has no clock: a failed setup stays failed
            rescan_seconds=None,  # nor does it rescan without a stamp move
        )
        self.directory = connector.directory
        self.producers[identity] = connector
        discovery_spec.process_start_producer(self.model, identity)
        return connector

    def start_receiver(self, name: str) -> Connector:
        connector = Connector(
            self.scope, ring_capacity=self.capacity, os_facade=self.os, rescan_seconds=None
        )
        self.directory = connector.directory
        self.receivers[name] = connector
        return connector

    def exit_producer(self, identity: ProducerIdentity) -> None:
        """The model learns the producer is dead (its identity names an exited process)."""
        discovery_spec.process_exit(self.model, identity)

    # -- operations -----------------------------------------------------------------------

    def _failed(self, what: str, error: BaseException) -> None:
        require(
            isinstance(error, DOCUMENTED_ERRORS),
            lambda: f"{what}: undocumented {type(error).__name__} escaped: {error!r}",
        )
        require(
            self.armed(),
            lambda: f"{what}: {type(error).__name__} after the faults stopped: {error!r}",
        )
        self.ledger.failed.append(f"{what}: {type(error).__name__}")

    def put(self, identity: ProducerIdentity, edge: Edge, key: str, payload: bytes) -> Any:
        """Put on both sides; answers the model's published descriptor (or None)."""
        self.ledger.operations += 1
        what = f"put({identity[0]}, {edge}, {key!r}, {len(payload)} bytes)"
        connector = self.producers[identity]
        size = codec.prepare(payload).nbytes
        failed_before = edge in connector.failed_edges()
        pool_before = _pool_counts(connector)
        try:
            got: Any = connector.put(edge, key, payload)
        except BackPressureError as error:
            got = error
        except BaseException as error:  # noqa: BLE001 - judged below
            self._failed(what, error)
            self._after_failed_put(identity, edge, key, size, payload, failed_before, pool_before)
            return None
        setup_ok = failed_before or edge not in connector.failed_edges()
        refused = _pool_counts(connector)[2] > pool_before[2]
        require(
            not refused or self.armed(),
            lambda: f"{what}: a pool slot's creation failed after the faults stopped",
        )
        with _creation_refused(self.model.producers[identity].connector, refused):
            result, published = discovery_spec.process_put(
                self.model, identity, edge, key, size, payload, ring_setup_ok=setup_ok
            )
        self.keys.add((identity, edge, key))
        if isinstance(got, BackPressureError):
            require(
                result.status is ConnectorPutStatus.REFUSED,
                lambda: f"{what}: implementation refused (back-pressure), model {result}",
            )
            self.ledger.refused += 1
            return None
        require(
            result.status is ConnectorPutStatus.ACCEPTED,
            lambda: f"{what}: implementation accepted {got}, model {result}",
        )
        require(
            got.route is result.route, lambda: f"{what}: route {got.route}, model {result.route}"
        )
        if isinstance(got, RingDescriptor):
            assert isinstance(result.descriptor, connector_spec.RingDescriptor)
            require(
                got.position == result.descriptor.position,
                lambda: f"{what}: ring position {got.position}, model {result.descriptor}",
            )
        self.ledger.accepted += 1
        return (got, published)

    def _after_failed_put(
        self,
        identity: ProducerIdentity,
        edge: Edge,
        key: str,
        size: int,
        payload: bytes,
        failed_before: bool,
        pool_before: tuple[int, int, int],
    ) -> None:
        """Follow the outcome the failed put had, if the contract allows it.

        A put that took a pool slot (created or reused) and then failed gave
        the slot back (FREE): the model's pool takes and abandons one too.
        """
        connector = self.producers[identity]
        self.keys.add((identity, edge, key))
        seen = observe(self.directory or connector.directory, connector.identity, edge, key)
        setup_ok = failed_before or edge not in connector.failed_edges()
        has_ring = connector.ring(edge) is not None
        candidates = []
        for outcome in ("unchanged", "applied", "old retired"):
            model = copy.deepcopy(self.model)
            producer = model.producers[identity]
            if outcome == "applied":
                result, _ = discovery_spec.process_put(
                    model, identity, edge, key, size, payload, ring_setup_ok=setup_ok
                )
                if result.status is not ConnectorPutStatus.ACCEPTED:
                    continue
            else:
                _setup_only(model, identity, edge, setup_ok and has_ring, setup_ok)
                _slot_given_back(producer.connector, size, pool_before, _pool_counts(connector))
                if outcome == "old retired":
                    ring = producer.connector.rings.get(edge)
                    if ring is not None:
                        ring_spec.process_cancel(ring, key)
                    connector_spec._retire_fallback(producer.connector, edge, key)
            if (
                expected_of(producer.connector, edge, key) == seen
                and (edge in producer.connector.rings) == has_ring
            ):
                candidates.append((outcome, model))
        require(
            bool(candidates),
            lambda: (
                f"failed put({identity[0]}, {edge}, {key!r}) left a state the contract does not allow: "
                f"files show {seen}, rings set up={has_ring}; model before: "
                f"{expected_of(self.model.producers[identity].connector, edge, key)}"
            ),
        )
        self.model = candidates[0][1]

    def get(
        self,
        name: str,
        edge: Edge,
        key: str,
        published: Any = None,
    ) -> Delivery | None:
        """Get on both sides (by key, or with the (descriptor, model descriptor) pair of a put)."""
        self.ledger.operations += 1
        what = f"get[{name}]({edge}, {key!r}{', descriptor' if published else ''})"
        receiver = self.receivers[name]
        descriptor = published[0] if published else None
        model_descriptor: PublishedDescriptor | None = published[1] if published else None
        before = {
            identity: expected_of(producer.connector, edge, key)
            for identity, producer in self.model.producers.items()
            if producers_spec.is_delivering(producer)
        }
        try:
            got = receiver.get(edge, key, descriptor=descriptor)
        except BaseException as error:  # noqa: BLE001 - judged below
            self._failed(what, error)
            for identity, held in before.items():
                seen = observe(receiver.directory, self.producers[identity].identity, edge, key)
                if seen != held:
                    raise ScenarioFailure(
                        f"{what} failed and consumed or changed a version: files {seen}, model {held}"
                    ) from error
            return None
        if got.status is GetStatus.BUSY:
            discovery_spec.process_refresh(self.model, name)
            return got
        # The harness names producers by their (borrowed) process; each runs one connector.
        producer_of = got.producer[:2] if got.producer is not None else None
        if got.delivered and producer_of in self.closing:
            left = self.closing[producer_of]
            leftover = connector_spec.process_get(left, edge, key)
            require(
                leftover.status is connector_spec.ConnectorGetStatus.DELIVERED
                and leftover.payload == got.value,
                lambda: (
                    f"{what}: delivered {got.producer}'s version after its failed close, "
                    f"but it held no such version ({leftover.status})"
                ),
            )
            discovery_spec.process_refresh(self.model, name)
            self.ledger.delivered += 1
            return got
        expected = discovery_spec.process_get(self.model, name, edge, key, model_descriptor)
        require(
            got.status.value == expected.status.value,
            lambda: f"{what}: implementation {got.status.value}, model {expected.status.value}",
        )
        if expected.status is DeploymentGetStatus.DELIVERED:
            require(
                producer_of == expected.producer and got.route is expected.route,
                lambda: (
                    f"{what}: delivered from {got.producer} {got.route}, model {expected.producer} {expected.route}"
                ),
            )
            require(
                got.value == expected.payload,
                lambda: (
                    f"{what}: payload differs from the accepted one (torn or swapped): "
                    f"{len(got.value) if isinstance(got.value, bytes) else got.value!r} bytes"
                ),
            )
            self.ledger.delivered += 1
        return got

    def close_producer(self, identity: ProducerIdentity) -> None:
        self.ledger.operations += 1
        connector = self.producers[identity]
        before = copy.deepcopy(self.model.producers[identity].connector)
        try:
            connector.close()
        except BaseException as error:  # noqa: BLE001 - judged below
            self._failed(f"close({identity[0]})", error)
            self.closing[identity] = before
        finally:
            producer = self.model.producers[identity]
            if producer.alive:
                discovery_spec.process_close(self.model, identity)

    def retry_closes(self) -> None:
        """Close again every producer whose close failed (no faults now): it must succeed."""
        for identity in sorted(self.closing):
            self.producers[identity].close()
        self.closing.clear()

    # -- checks -----------------------------------------------------------------------------

    def check_all(self) -> None:
        """Every key's files agree with the model (run once the faults stopped)."""
        for identity, edge, key in sorted(self.keys):
            producer = self.model.producers[identity]
            if not producers_spec.is_delivering(producer):
                continue
            seen = observe(self.directory, self.producers[identity].identity, edge, key)
            expected = expected_of(producer.connector, edge, key)
            if seen != expected:
                raise ScenarioFailure(
                    f"key {key!r} of producer {identity[0]} on {edge}: files {seen}, model {expected}"
                )

    def drain(self, name: str) -> None:
        """Get every key once more (no faults): the model's deliverable versions come out, exactly once."""
        for _identity, edge, key in sorted(self.keys):
            self.get(name, edge, key)
        for _identity, edge, key in sorted(self.keys):
            got = self.get(name, edge, key)
            if got is None or got.delivered:
                raise ScenarioFailure(f"drain: key {key!r} on {edge} delivered twice")

    def close_all(self) -> None:
        """Close every connector (no faults); each close must now succeed."""
        for identity in sorted(self.producers):
            connector = self.producers[identity]
            connector.close()
            producer = self.model.producers[identity]
            if producer.alive:
                discovery_spec.process_close(self.model, identity)
        for name in sorted(self.receivers):
            self.receivers[name].close()

    def abandon(self) -> None:
        """Best-effort close of everything after a failure (errors ignored)."""
        for connector in [*self.producers.values(), *self.receivers.values()]:
            with contextlib.suppress(BaseException):
                connector.close()


def _pool_options(pool: tuple[int, int, int] | None) -> dict[str, int]:
    """The connector options of a pool (min class, max class, budget); None: the pool off."""
    if pool is None:
        return {"pool_budget_bytes": 0}
    return {"pool_min_bytes": pool[0], "pool_max_bytes": pool[1], "pool_budget_bytes": pool[2]}


def _pool_counts(connector: Connector) -> tuple[int, int, int]:
    """(slots created, slots reused, creations the OS refused) of a producer's pool."""
    health = connector.health()
    return health.pool_slots_created, health.pool_slots_reused, health.pool_create_failures


@contextlib.contextmanager
def _creation_refused(conn: connector_spec.ConnectorState, refused: bool) -> Iterator[None]:
    """The model's put while the OS refused the slot file the pool would create.

    The implementation creates a slot only when no slot of the class is
    reusable, and a refused creation leaves nothing behind (the put falls
    back): in the model, a pool that may create no slot (EXHAUSTED). The
    scenarios use one class, so no eviction precedes the creation.
    """
    pool = conn.pool
    if not refused or pool is None:
        yield
        return
    budget = pool.budget
    pool.budget = max(pool.used_bytes, 1)
    try:
        yield
    finally:
        pool.budget = budget


def _slot_given_back(
    conn: connector_spec.ConnectorState,
    size: int,
    before: tuple[int, int, int],
    after: tuple[int, int, int],
) -> None:
    """A failed put that took a slot (created or reused) abandoned it: so does the model."""
    pool = conn.pool
    if pool is None or (after[0], after[1]) == (before[0], before[1]):
        return
    acquired = pool_spec.process_pool_acquire(pool, size)
    if acquired.index is not None:
        pool_spec.process_pool_abandon(pool, acquired.index)


def _setup_only(
    model: discovery_spec.DeploymentState,
    identity: ProducerIdentity,
    edge: Edge,
    ring_ready: bool,
    setup_ok: bool,
) -> None:
    """The part of a put that sets up the edge's ring (and its marker), without the put."""
    conn = model.producers[identity].connector
    had_ring = edge in conn.rings
    if had_ring or conn.closed:
        return
    if not connector_spec.is_ring_usable(conn, edge):
        return
    if ring_ready:
        connector_spec.process_ring_setup(conn, edge, True)
        model.directory.markers.add((identity, edge))
        model.directory.stamp += 1
    elif not setup_ok:
        connector_spec.process_ring_setup(conn, edge, False)


@contextlib.contextmanager
def suppressed() -> Iterator[None]:
    with contextlib.suppress(BaseException):
        yield


__all__ = [
    "DOCUMENTED_ERRORS",
    "Deployment",
    "Ledger",
    "Observed",
    "ScenarioFailure",
    "expected_of",
    "observe",
    "require",
]
