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
import threading
import weakref
from typing import TYPE_CHECKING, Any, overload

from .. import lifecycle
from ..errors import (
    ClosedError,
    ForkedError,
    ShmringError,
    typed_os_error,
)
from ..fallback import DEFAULT_SPARE_BYTES, SPARE_MIN_FILE_LENGTH
from ..names import (
    DEFAULT_SHM_ROOT,
    ConnectorIdentity,
    current_producer_identity,
    deployment_directory,
    next_instance,
)
from ..os_seam import DEFAULT_OS, OsFacade
from ..ring.producer import PublishHook
from .cohort import CohortGates, CohortWriter
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
)
from .edges import EDGE_CACHE, Edge, Stage, split_edge
from .fallback_route import FallbackRoute
from .get_path import GetPath
from .joining import Deployment
from .pool_route import PoolRoute
from .put_path import PutPath
from .results import (
    Delivery,
    GetStatus,
)
from .ring_route import RingRoute
from .upkeep import Upkeep
from .waiting import BlockingGets, Doorbell, FallbackMisses

if TYPE_CHECKING:
    from .seams import Seams

_DELIVERED = GetStatus.DELIVERED
_BUSY_STATUS = GetStatus.BUSY


class Connector(PutPath, GetPath, Upkeep, BlockingGets):
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
                return self._put(edge, key, obj)  # `put_path`: the model's steps, in order
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
        """`get`; `bell` (from `get_with_deadline`) is the doorbell read before this poll."""
        try:
            with self._lock:
                self._refreshed(key)  # `get_path`: the model's steps, in order
                if descriptor is None:
                    return self._get_by_key(edge, key, bell, borrow)
                return self._get_by_descriptor(edge, key, descriptor, borrow)
        except BufferError as error:
            raise lifecycle.unmasked(error) from None

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
