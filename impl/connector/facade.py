"""`Connector`: one producer's puts and one receiver's gets, in the model's steps.

`put` is `spec.connector.process_put` and `get` is `spec.discovery.
process_get` (around `spec.connector.process_get`), written in the steps of
the two routes (`routes.RouteBackend`: prepare, publish with a
before-visible hook, retire, claim); the routes, the deployment
(`joining`), the configuration (`config`) and the waiting loop
(`waiting`) are their own modules. This one only sequences them, holds the
lock and counts (`ConnectorHealth`).

A connector is thread-safe (one lock around each operation; a waiting
`get_with_deadline` sleeps without it). It belongs to the process that made
it (`impl.lifecycle`): in a forked child the inherited connector raises
`ForkedError` and its close releases the child's mappings only; a child
makes its own. A connector still open at interpreter exit is closed then.
"""

from __future__ import annotations

import contextlib
import os
import threading
import weakref
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, overload

from ...spec.connector import Route
from ...spec.layout import MAX_KEY_LENGTH
from .. import codec, lifecycle
from ..errors import (
    BackPressureError,
    ClosedError,
    ForkedError,
    InvalidKeyError,
    ShmringError,
    typed_os_error,
)
from ..fallback import DEFAULT_SPARE_BYTES, SPARE_MIN_FILE_LENGTH
from ..names import (
    DEFAULT_SHM_ROOT,
    ConnectorIdentity,
    current_producer_identity,
    deployment_directory,
    fallback_segment_file_name,
    next_instance,
    ring_path,
)
from ..os_seam import DEFAULT_OS, OsFacade
from ..ring.producer import PublishHook, RingChannel
from .cohort import CohortGates, CohortWriter, MemberPlan
from .config import (
    DEFAULT_FALLBACK_BUDGET,
    DEFAULT_MAX_SLEEP_SECONDS,
    DEFAULT_POOL_BUDGET_BYTES,
    DEFAULT_POOL_MAX_BYTES,
    DEFAULT_POOL_MIN_BYTES,
    DEFAULT_RESCAN_SECONDS,
    DEFAULT_RING_CAPACITY,
    DEFAULT_RING_RETRY_SECONDS,
    DEFAULT_SPIN_SECONDS,
    ConnectorConfig,
)
from .descriptors import (
    Descriptor,
    FallbackDescriptor,
    PoolDescriptor,
    RingDescriptor,
)
from .edges import EDGE_CACHE, Edge, Stage, split_edge, validate_key
from .fallback_route import FallbackRoute
from .joining import Deployment
from .pool_route import PoolRoute
from .results import (
    BUSY,
    NOT_FOUND,
    ConnectorHealth,
    Delivery,
    GetStatus,
)
from .ring_route import RingRoute
from .shortage import retry_short_of_descriptors
from .waiting import BlockingGets, Doorbell, FallbackMisses

if TYPE_CHECKING:
    from .seams import Seams

_DELIVERED = GetStatus.DELIVERED
_BUSY_STATUS = GetStatus.BUSY


class Connector(BlockingGets):
    """Puts and gets between local stage processes over host rings and per-key segments.

    `scope` names the deployment (every endpoint of an edge uses the same
    one); the other options are `ConnectorConfig`'s, each checked there
    with its bounds: `ring_capacity` (each ring's data bytes, 0: no rings),
    `fallback_budget` (live bytes of this producer's segments),
    `fallback_spare_bytes` / `fallback_spare_min_bytes` (segment files kept
    mapped for reuse, `shmring.impl.fallback`), `shm_root`, `spin_seconds`
    / `max_sleep_seconds` (`get_with_deadline`), `ring_retry_seconds` (the
    back-off after a failed ring setup; None: never retry, as the model)
    and `rescan_seconds` (rescan the directory at least this often; None:
    only when the stamp moved, as the model). The pool (`impl.pool`) carries
    what the ring does not admit: slot classes `pool_min_bytes` ..
    `pool_max_bytes` (powers of two), at most `pool_budget_bytes` of slot
    files (0: no pool, per-key segments as before) and, with
    `pool_checksum`, an XXH3-64 of every pool payload on both sides. `os_facade` is the OS port
    every shmring object takes (`impl.os_seam`; fault plans hand one facade
    to all the objects of a scenario); production leaves it None. Test
    seams (another identity, crash hooks) are not options: see `seams`.

    Each connector is its own producer, (pid, start time, instance): two
    connectors of one process on one edge publish on two rings.

    Use as a context manager, or call `close()` (idempotent).
    """

    _closed: bool = False
    _inherited: bool = False  # inherited through fork: the parent's (`_forked_in_child`)
    _deployment: Deployment | None = None  # set once joined (`_join`)
    _joining: Deployment | None = None  # joined, not yet wired (an exception stopped `_join`)

    def __init__(
        self,
        scope: str,
        *,
        ring_capacity: int = DEFAULT_RING_CAPACITY,
        fallback_budget: int = DEFAULT_FALLBACK_BUDGET,
        fallback_spare_bytes: int = DEFAULT_SPARE_BYTES,
        fallback_spare_min_bytes: int = SPARE_MIN_FILE_LENGTH,
        os_facade: OsFacade | None = None,
        shm_root: str = DEFAULT_SHM_ROOT,
        spin_seconds: float = DEFAULT_SPIN_SECONDS,
        max_sleep_seconds: float = DEFAULT_MAX_SLEEP_SECONDS,
        ring_retry_seconds: float | None = DEFAULT_RING_RETRY_SECONDS,
        rescan_seconds: float | None = DEFAULT_RESCAN_SECONDS,
        pool_min_bytes: int = DEFAULT_POOL_MIN_BYTES,
        pool_max_bytes: int = DEFAULT_POOL_MAX_BYTES,
        pool_budget_bytes: int = DEFAULT_POOL_BUDGET_BYTES,
        pool_checksum: bool = False,
    ) -> None:
        config = ConnectorConfig(
            scope,
            ring_capacity=ring_capacity,
            fallback_budget=fallback_budget,
            fallback_spare_bytes=fallback_spare_bytes,
            fallback_spare_min_bytes=fallback_spare_min_bytes,
            shm_root=shm_root,
            spin_seconds=spin_seconds,
            max_sleep_seconds=max_sleep_seconds,
            ring_retry_seconds=ring_retry_seconds,
            rescan_seconds=rescan_seconds,
            pool_min_bytes=pool_min_bytes,
            pool_max_bytes=pool_max_bytes,
            pool_budget_bytes=pool_budget_bytes,
            pool_checksum=pool_checksum,
        )
        self._setup(config, os_facade, None)

    def _setup(
        self, config: ConnectorConfig, os_facade: OsFacade | None, seams: Seams | None
    ) -> None:
        """`spec.connector.initialize_connector` (config checked) and the producer's identity."""
        self.config = config
        self.scope = config.scope
        self.ring_capacity = config.ring_capacity
        self.fallback_budget = config.fallback_budget
        self.fallback_spare_bytes = config.fallback_spare_bytes
        self.fallback_spare_min_bytes = config.fallback_spare_min_bytes
        self.shm_root = config.shm_root
        self.directory = deployment_directory(config.scope, config.shm_root)
        self._os = os_facade if os_facade is not None else DEFAULT_OS
        self._lock = threading.RLock()
        self.instance = next_instance()  # which of this process's connectors (0, 1, ...)
        process = seams.identity if seams is not None else None
        if process is None:
            try:
                process = current_producer_identity()
            except OSError as error:  # /proc/self/stat, out of descriptors (issue 22)
                raise typed_os_error(error, "reading this process's start time", "/proc") from error
        # This connector's producer identity: (pid, start time, instance).
        self.identity: ConnectorIdentity = (process[0], process[1], self.instance)
        hook: PublishHook | None = seams.publish_hook if seams is not None else None
        self._ring_route = RingRoute(config, self.identity, self._os, hook, self._shed_descriptors)
        self._fallback_route = FallbackRoute(self._os, self._shed_descriptors)
        self._pool_route = PoolRoute(config, self.identity, self._os)
        self._bell = Doorbell()
        self._misses = FallbackMisses()
        # Publication cohorts (`cohort`): the writer once joined, and the numbers a put reads.
        self._cohorts: CohortWriter | None = None
        self._cohort_numbers: dict[Edge, int] = {}
        self._close_unlink_failures = 0  # gate-file unlinks close could not do (kept, retried)
        self._puts = self._gets = self._bytes = 0
        self._ring_puts = self._ring_gets = self._fallbacks = self._refusals = self._busy = 0
        self._pool_gets = 0
        # Borrowed gets: how many held their payload, and those payloads while they live.
        self._borrowed_gets = 0
        self._borrowed: weakref.WeakSet[Any] = weakref.WeakSet()
        lifecycle.track(self)  # marked at fork, closed at exit if still open

    def _forked_in_child(self) -> None:
        """`lifecycle`: in a forked child this connector is the parent's; every use is ForkedError.

        `_closed` makes every operation stop at its first check (the hot
        paths test nothing more); the lock is new, since another thread of
        the parent may have held it at the fork.
        """
        self._inherited = True
        self._closed = True
        self._lock = threading.RLock()

    # -- context manager -------------------------------------------------------------

    def __enter__(self) -> Connector:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"rings={len(self._ring_route.channels)}"
        return f"Connector(scope={self.scope!r}, capacity={self.ring_capacity}, {state})"

    # -- joining the deployment ------------------------------------------------------------

    def _require_open(self) -> None:
        if self._closed:
            if self._inherited:
                raise ForkedError(
                    f"connector inherited through fork (made by another process): "
                    f"scope={self.scope!r} producer={self.identity}; "
                    f"make a new Connector in this process after the fork"
                )
            raise ClosedError(f"connector is closed: scope={self.scope!r}")

    def _join(self) -> Deployment:
        """Join the deployment directory on first use (`joining.Deployment.join`)."""
        deployment = self._deployment
        if deployment is not None:
            return deployment
        deployment = self._joining  # a join an exception stopped part way: finish its wiring
        if deployment is None:
            try:
                deployment = Deployment.join(
                    self.config, self.identity, self._os, self._shed_descriptors
                )
            except OSError as error:  # issue 22: typed, naming the file and the remedy
                raise typed_os_error(error, "joining the deployment", self.directory) from error
            self._joining = deployment
        self._bell.attach(deployment.stamp)
        self._ring_route.joined(deployment)
        self._fallback_route.joined(deployment)
        self._pool_route.joined(deployment)
        self._ring_route.pool = self._pool_route.reader
        self._cohorts = CohortWriter(deployment.directory, self.identity, self._os)
        self._cohort_numbers = self._cohorts.numbers
        gates = CohortGates(deployment.directory, self._os)
        self._ring_route.cohorts = self._fallback_route.cohorts = gates
        self._deployment = deployment
        self._joining = None
        return deployment

    def join(self) -> None:
        """Join the deployment now instead of at the first put or get.

        ConfigurationError (with its remedy) when the deployment directory
        is unusable: not a directory, another uid's, or open to others.
        """
        with self._lock, lifecycle.deferred_signals():
            self._require_open()
            self._join()

    # -- put -------------------------------------------------------------------------------

    @overload
    def put(self, source: Stage, destination: Stage, key: str, obj: object, /) -> Descriptor: ...

    @overload
    def put(self, edge: tuple[Stage, Stage], key: str, obj: object, /) -> Descriptor: ...

    def put(self, *args: Any) -> Descriptor:
        """``put(src, dst, key, obj)`` or ``put((src, dst), key, obj)``: publish a copy of `obj`.

        `spec.connector.process_put`. Answers the descriptor of what was
        published (hand it to the receiver for an exact get). `obj` may be
        changed as soon as put returns. BackPressureError: the fallback
        budget is spent (nothing changed); NoSpaceError: the OS has no room
        for the segment. TypeError for another call shape.
        """
        # The hot path of `split_edge`, inline: two str stages already seen.
        known = None
        if len(args) == 4 and type(args[0]) is str and type(args[1]) is str:
            known = EDGE_CACHE.get((args[0], args[1]))
        if known is not None:
            edge, key, obj = known, args[2], args[3]
        else:
            edge, (key, obj) = split_edge(args, 2, "put")
        try:
            with self._lock:
                if self._closed:
                    self._require_open()  # CLOSED
                if type(key) is not str or not key.isascii() or len(key) > MAX_KEY_LENGTH:
                    validate_key(key)
                plan = codec.prepare(obj)
                numbers = self._cohort_numbers
                if numbers and edge in numbers:  # inside a publication cohort of the edge
                    plan = MemberPlan(plan, numbers[edge])  # type: ignore[assignment]
                deployment = self._deployment
                if deployment is None or deployment.live_path is None:
                    # Files are made here: no signal handler stops it half way (`lifecycle`).
                    with lifecycle.deferred_signals():
                        if deployment is None:
                            deployment = self._join()
                        if deployment.live_path is None:
                            deployment.ensure_live_file(self.identity, self._os)
                size = plan.nbytes
                ring, fallback = self._ring_route, self._fallback_route
                # process_ring_setup: the edge's ring, set up on first use.
                channel = ring.channels.get(edge)
                if channel is None:
                    with lifecycle.deferred_signals():
                        channel = ring.prepare(edge)
                else:
                    # One fstat: a file a neighbour unlinked or truncated is replaced first (issue 22).
                    lost = channel.file_problem()
                    if lost is not None:
                        with lifecycle.deferred_signals():
                            channel = ring.replace(edge, channel, lost)
                if channel is not None:
                    # ring_spec.process_put; PUBLISHED retires the key's segment before the frame shows.
                    retire_other = (
                        fallback.retirer(edge, key) if fallback.holds(edge, key) else None
                    )
                    position = ring.publish(channel, key, plan, retire_other)
                    if position is not None:
                        self._puts += 1
                        self._ring_puts += 1
                        self._bytes += size
                        wake = self._bell.wake
                        if wake is not None:
                            wake()  # what `Doorbell.ring` does, one call shorter
                        self._bell.ring_stage(edge[1])
                        return RingDescriptor(self.identity, edge, key, position, size)
                    # NOT_ADMITTED but the key's reference fits: the pool (`_put_pool`).
                    pool = self._pool_route
                    if pool.enabled and pool.is_candidate(channel, key, size):
                        with lifecycle.deferred_signals():  # a slot may be made or emptied
                            position = pool.publish(channel, key, plan, retire_other)
                        if position is not None:
                            self._puts += 1
                            self._bytes += size
                            self._bell.ring()
                            self._bell.ring_stage(edge[1])
                            return PoolDescriptor(self.identity, edge, key, position, size)
                # NOT_ADMITTED, FULL or no ring (or no slot): the fallback. Its budget check comes first
                # (REFUSED changes nothing); the key's ring frame is retired before the segment shows.
                try:
                    with lifecycle.deferred_signals():  # a file is made, filled and renamed
                        generation = fallback.publish(
                            fallback.prepare(edge), key, plan, ring.retirer(channel, key)
                        )
                except BackPressureError:
                    self._refusals += 1
                    raise
                self._puts += 1
                self._fallbacks += 1
                self._bytes += size
                self._bell.ring()
                self._bell.ring_stage(edge[1])
                return FallbackDescriptor(self.identity, edge, key, generation, size)
        except BufferError as error:
            raise lifecycle.unmasked(error) from None

    # -- get -------------------------------------------------------------------------------

    @overload
    def get(
        self,
        source: Stage,
        destination: Stage,
        key: str,
        /,
        *,
        descriptor: Descriptor | None = None,
        borrow: bool = False,
    ) -> Delivery: ...

    @overload
    def get(
        self,
        edge: tuple[Stage, Stage],
        key: str,
        /,
        *,
        descriptor: Descriptor | None = None,
        borrow: bool = False,
    ) -> Delivery: ...

    def get(
        self, *args: Any, descriptor: Descriptor | None = None, borrow: bool = False
    ) -> Delivery:
        """``get(src, dst, key)`` or ``get((src, dst), key)``: claim the key's version, once.

        `spec.discovery.process_get`. With `descriptor` only the exact frame
        or segment it names. Never waits for another process (BUSY instead);
        see `get_with_deadline`.

        The value is independently owned by default. `borrow=True`
        (`spec.borrowing.process_borrowed_get`): its large leaves (tensors
        and arrays of `codec.SHARED_LEAF_LIMIT` bytes or more, bytes values
        of `codec.BORROWED_BYTES_MIN` or more, which come back as read-only
        memoryviews) are views of the claimed payload, copied nowhere on
        this side; numpy arrays and memoryviews are read-only, torch tensors
        are not (torch has none): never write one. A ring frame stays
        CLAIMED while any of them lives (also past this connector's and the
        producer's close) and becomes DONE after the last dies, or at
        `Delivery.release()` when nothing else holds one; while claimed it
        stops its ring's in-order reclaim, so the producer's puts go to the
        fallback once the ring is full behind it (`health().borrowed_ring_frames`).
        A fallback segment is borrowed by keeping its mapping (the file is
        unlinked at the claim; its /dev/shm pages stay held, outside the
        producer's budget, until the last view dies). Small leaves are
        copied. A process killed while holding a frame frees it at the
        producer's next put that finds the ring full (the dead-holder rule).
        """
        known = None
        if len(args) == 3 and type(args[0]) is str and type(args[1]) is str:
            known = EDGE_CACHE.get((args[0], args[1]))  # `split_edge`'s hot path, inline
        if known is not None and not borrow:
            return self._get(known, args[2], descriptor, None)
        edge, (key,) = split_edge(args, 1, "get")
        if borrow:
            return self._track_borrowed(self._get(edge, key, descriptor, None, True))
        return self._get(edge, key, descriptor, None)

    def _track_borrowed(self, got: Delivery) -> Delivery:
        """Count a borrowed delivery whose value holds its payload (`health().borrowed_*`)."""
        lease = got.lease
        payload = lease() if lease is not None else None
        if payload is not None:
            with self._lock:
                self._borrowed_gets += 1
                self._borrowed.add(payload)
        return got

    def _get(
        self,
        edge: Edge,
        key: str,
        descriptor: Descriptor | None,
        bell: int | None,
        borrow: bool = False,
    ) -> Delivery:
        """`get`; `bell` (from `get_with_deadline`) is the doorbell read before this poll.

        A plain get (None) always looks for the key's segment: a producer
        that cannot ring the doorbell (its stamp failed) may have written it
        a moment ago, and the model's get finds it (fault cell `restart`
        with EMFILE at open #18 showed a skip there answering NOT_FOUND).
        """
        try:
            with self._lock:
                if self._closed:
                    self._require_open()  # CLOSED
                if type(key) is not str or not key.isascii() or len(key) > MAX_KEY_LENGTH:
                    validate_key(key)
                deployment = self._deployment
                if deployment is None:  # not (fully) joined yet: `_join` retries what failed
                    with lifecycle.deferred_signals():
                        deployment = self._join()
                # process_refresh: a directory scan only when the stamp moved.
                discovery = deployment.discovery
                if retry_short_of_descriptors(
                    "a discovery scan", discovery.refresh, self._shed_descriptors
                ):
                    self._ring_route.scanned()
                if descriptor is None:
                    # By key: get_candidates' rings (live producers, discovery's order) ...
                    got, busy, problem = self._ring_route.claim_by_key(edge, key, borrow)
                    if got is not None:
                        self._gets += 1  # `_count`, inline on the hot path
                        self._bytes += got.size
                        if got.route is Route.RING:
                            self._ring_gets += 1
                        else:
                            self._pool_gets += 1
                        return got
                    # ... then the key's segment (`_get_fallback`).
                    if self._misses.unchanged(edge, key, bell):
                        got = BUSY if busy else NOT_FOUND
                    else:
                        with lifecycle.deferred_signals():  # a segment is opened, locked, unlinked
                            got = self._fallback_route.claim(edge, key, None, busy, borrow)
                        if bell is not None and got.status is GetStatus.NOT_FOUND:
                            self._misses.record(edge, key, bell)
                    status = got.status
                    if status is _BUSY_STATUS:
                        self._busy += 1
                    elif status is _DELIVERED:
                        self._count(got)
                    if problem is not None and status is not _DELIVERED:
                        raise problem  # a damaged ring, or producers not looked at
                    return got
                if not isinstance(descriptor, (RingDescriptor, FallbackDescriptor)):
                    raise TypeError(f"not a descriptor: descriptor={descriptor!r}")
                if descriptor.edge != edge or descriptor.key != key:
                    raise InvalidKeyError(
                        f"descriptor names edge={descriptor.edge} key={descriptor.key!r}, "
                        f"get asked edge={edge} key={key!r}"
                    )
                # With a descriptor: only its route and place (PRODUCER_GONE first).
                if isinstance(descriptor, RingDescriptor):
                    got = self._ring_route.claim_descriptor(edge, key, descriptor, borrow)
                else:
                    with lifecycle.deferred_signals():
                        got = self._fallback_route.claim_descriptor(edge, key, descriptor, borrow)
                self._count(got)
                return got
        except BufferError as error:
            raise lifecycle.unmasked(error) from None

    def _count(self, got: Delivery) -> None:
        """The model's health counters of a get (`spec.connector._deliver`), plus BUSY."""
        if got.status is _DELIVERED:
            self._gets += 1
            self._bytes += got.size
            if got.route is Route.RING:
                self._ring_gets += 1
            elif got.route is Route.POOL:
                self._pool_gets += 1
        elif got.status is _BUSY_STATUS:
            self._busy += 1

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

    # -- close -------------------------------------------------------------------------------

    def close(self) -> int:
        """`spec.producers.process_close`: retire everything, remove every file this producer owns.

        Rings are marked closed and unlinked, markers removed (one stamp
        bump), unclaimed segments removed; the last connector of the
        deployment removes the directory. Idempotent: a second call retries
        whatever failed and answers 0. Answers how many versions it retired.
        A lock another process holds past `locks.PRODUCER_LOCK_WAIT_SECONDS`,
        or a failed unlink, never makes it wait or raise: the file is kept
        (counted in `health()`), and a later `close()` or `reap_consumed()`
        removes it and leaves the deployment then.
        """
        lifecycle.closed(self)
        with self._lock, lifecycle.deferred_signals():
            if self._inherited:  # a forked child's copy: release its mappings, touch no file
                lifecycle.release_inherited(self)
                return 0
            first = not self._closed
            self._closed = True
            if self._deployment is None and self._joining is not None:
                self._join()  # wiring only (no file): then close leaves it as any other
            failures: list[BaseException] = []
            retired = self._ring_route.close(failures)
            try:
                self._pool_route.close()  # after the rings: no carrier can be claimed any more
            except (OSError, ShmringError) as error:
                failures.append(error)
            deployment = self._deployment
            if deployment is not None and deployment.registrar is not None:
                try:
                    deployment.registrar.unregister_all()
                except (OSError, ShmringError) as error:
                    failures.append(error)
            try:
                retired += self._fallback_route.close()
            except (OSError, ShmringError) as error:
                failures.append(error)
            if deployment is not None:
                with contextlib.suppress(OSError):
                    deployment.release_live_file()
            cohorts = self._cohorts
            gate_failures = cohorts.close() if cohorts is not None else []
            gates = self._ring_route.cohorts
            if gates is not None:
                gates.close()
            self._ring_route.close_readers()
            self._pool_route.close_reader()
            self._fallback_route.mappings.close()
            if retired:
                with contextlib.suppress(OSError, ValueError):
                    self._bell.ring()
            # What another process's lock or a failed unlink left (issue 27) stays
            # for a later close or reap_consumed(); it is counted, never raised.
            pending = deployment is not None and (
                deployment.writer.statistics().deferred > 0
                or self._ring_route.reap_abandoned() > 0
                or bool(gate_failures)
            )
            self._close_unlink_failures += len(gate_failures)
            if failures:
                first = failures[0]
                if isinstance(first, OSError):  # typed, naming the file (issue 22)
                    raise typed_os_error(first, "closing", self.directory) from first
                raise first
            if deployment is not None and not pending:
                deployment.leave()
            return retired if first else 0

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def inherited(self) -> bool:
        """Whether this is a forked child's copy of another process's connector (`lifecycle`)."""
        return self._inherited

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
