"""The connector: one process's routing between its rings and the fallback.

Design rationale. `shmring.spec.connector` (routing), `spec.producers`
(identity, exit vs close) and `spec.discovery` (markers, stamp, receiver
caches) say what a connector does; this module wires the pieces that do it:

* `ring.producer.RingChannel`, one per edge this process publishes on, set up at
  the first put on the edge. Setup is file creation, allocation, mapping
  *and* the discovery marker; any failure (ENOSPC, EPERM, a marker or stamp
  that cannot be written) closes what was made, disables the ring for that
  edge once, and the fallback carries the edge from then on.
* `fallback.FallbackWriter` for the frames the ring does not take, with the
  model's byte budget (`BackPressureError` past it).
* `discovery`: the producer's markers (`Registrar`), the receiver's cache of
  markers refreshed only when the stamp moved (`DiscoveryCache`), pidfd
  liveness (`Liveness`), and the directory membership that lets the last
  connector remove the directory.

A put follows `spec.connector.process_put`: ring first; PUBLISHED retires
the key's fallback segment *before* the frame becomes visible (inside the
ring's writer callback, which runs only once the ring has decided it has
room), so the key never has two deliverable versions; NOT_ADMITTED, FULL or
no ring go to the fallback, whose budget check comes before anything
changes, and which retires the key's ring frame just before its segment
becomes visible.

A get follows `spec.discovery.process_get`: refresh (a scan only when the
stamp moved), then with a descriptor only the exact frame or segment it
names (PRODUCER_GONE first when its producer exited or closed), by key the
rings of the edge's live producers and then the key's segment. A frame or
segment of a producer that is not running is never delivered: ring frames
are checked against the producer's pidfd as they are claimed, segments
carry their owner's identity and are checked under their lock.

A receive never waits for another process's lock (BUSY instead, which
`get_with_deadline` retries), and an unchanged empty channel costs one
shared-memory load per producer plus one `open` of the key's segment name:
no lock, no directory scan.

A producer is one connector instance, identified by (pid, process start
time, instance): each connector publishes on its own rings, markers and live
file, so a process may hold any number of producers on one edge, each
discovered like any other and closed on its own. Liveness is the process's,
so every instance of a killed process is dead at once.

A connector is thread-safe (one lock around each operation; a waiting
`get_with_deadline` sleeps without it). It is not fork-safe: a child process
makes its own.
"""

from __future__ import annotations

import contextlib
import enum
import functools
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Final

from shmring.impl import codec
from shmring.impl.directory import DeploymentDirectory, open_deployment_directory
from shmring.impl.discovery import DiscoveryCache, Membership, Registrar, Stamp
from shmring.impl.errors import (
    BackPressureError,
    ClosedError,
    ConfigurationError,
    CorruptFrameError,
    InvalidKeyError,
    ProducerGoneError,
    ResourceExhaustedError,
    ShmringError,
    is_exhaustion,
)
from shmring.impl.fallback import (
    DEFAULT_SPARE_BYTES,
    SPARE_MIN_FILE_LENGTH,
    ClaimStatus,
    FallbackWriter,
    SegmentMappings,
    claim_segment,
)
from shmring.impl.liveness import Liveness
from shmring.impl.names import (
    DEFAULT_SHM_ROOT,
    ConnectorIdentity,
    current_producer_identity,
    deployment_directory,
    fallback_segment_file_name,
    live_file_name,
    next_instance,
    ring_path,
    validate_scope,
    validate_stage_name,
)
from shmring.impl.os_seam import DEFAULT_OS, FILE_MODE, OPEN_FLAGS_CREATE, OsFacade
from shmring.impl.ring.producer import PublishHook, RingChannel
from shmring.impl.ring.reader import RingReader
from shmring.impl.ring.results import ReceiveStatus
from shmring.spec.connector import Route, is_valid_budget
from shmring.spec.discovery import DeploymentGetStatus
from shmring.spec.ring import PutStatus, compute_capacity_error

logger = logging.getLogger("shmring.connector")

Edge = tuple[str, str]  # (source stage, destination stage)

DEFAULT_RING_CAPACITY: Final = 4 * 1024 * 1024
DEFAULT_FALLBACK_BUDGET: Final = 16 * 1024 * 1024 * 1024
DEFAULT_SPIN_SECONDS: Final = 0.0002  # get_with_deadline polls without sleeping this long
DEFAULT_MAX_SLEEP_SECONDS: Final = 0.001  # then sleeps, backing off up to this between polls
# Bounds of the wait tuning: a longer spin only burns a core, a longer sleep step only adds latency.
MAX_SPIN_SECONDS: Final = 1.0
MAX_SLEEP_SECONDS: Final = 1.0
# No deployment has more shared memory than this; a larger budget is a mistake, not a wish.
MAX_FALLBACK_BUDGET: Final = (1 << 63) - 1
# A failed ring setup (ENOSPC, EMFILE, ...) is tried again after this long,
# doubling after every further failure up to the maximum: space that returns
# gives the edge its ring back, and a full /dev/shm costs one try a minute.
DEFAULT_RING_RETRY_SECONDS: Final = 1.0
# A polling receiver rescans the directory at least this often, so what a
# killed producer left (it moves no stamp) is reclaimed within about this
# long even when nothing else in the deployment changes.
DEFAULT_RESCAN_SECONDS: Final = 5.0
MAX_RING_RETRY_SECONDS: Final = 60.0
_MIN_SLEEP_SECONDS: Final = 0.00005
# The longest a blocked receive sleeps on the doorbell before it looks again
# for what rings no bell (a producer that died).
_MAX_DOORBELL_WAIT_SECONDS: Final = 0.05
# A polling get looks for a fallback segment at least this often even when the
# doorbell says nothing was published (producers that cannot ring it).
_FALLBACK_RECHECK_SECONDS: Final = 0.001


# -- descriptors -----------------------------------------------------------------


@dataclass(frozen=True)
class RingDescriptor:
    """Names the exact ring frame a put published (`spec.connector.RingDescriptor`)."""

    route: ClassVar[Route] = Route.RING
    producer: ConnectorIdentity  # (pid, start time, instance) of the publishing connector
    edge: Edge
    key: str
    position: int  # the frame's logical position in that producer's ring
    size: int  # encoded payload bytes

    def to_dict(self) -> dict[str, Any]:
        """A msgpack/JSON-friendly form (what the compat facade's metadata carries)."""
        return {
            **_common_fields(self.producer, self.edge, self.key, self.size),
            "position": self.position,
        }


@dataclass(frozen=True)
class FallbackDescriptor:
    """Names the exact fallback segment a put created (`spec.connector.FallbackDescriptor`)."""

    route: ClassVar[Route] = Route.FALLBACK
    producer: ConnectorIdentity  # (pid, start time, instance) of the publishing connector
    edge: Edge
    key: str
    generation: int  # unique per producer process; a re-put makes a new one
    size: int  # encoded payload bytes

    def to_dict(self) -> dict[str, Any]:
        return {
            **_common_fields(self.producer, self.edge, self.key, self.size),
            "generation": self.generation,
            "name": fallback_segment_file_name(self.edge, self.key),
        }


Descriptor = RingDescriptor | FallbackDescriptor


def _common_fields(producer: ConnectorIdentity, edge: Edge, key: str, size: int) -> dict[str, Any]:
    """The fields every descriptor's `to_dict` carries (read back by `descriptor_from_dict`)."""
    return {
        "producer": list(producer),
        "source": edge[0],
        "destination": edge[1],
        "key": key,
        "size": size,
    }


def descriptor_from_dict(route: Route, data: Mapping[str, Any]) -> Descriptor:
    """Rebuild a descriptor from `to_dict`'s form; CorruptFrameError when it is malformed."""
    try:
        pid, start_time, *rest = data["producer"]
        if len(rest) > 1:
            raise ValueError(f"producer must be [pid, start time, instance]: {data['producer']!r}")
        producer = (
            _plain_int(pid, "producer pid"),
            _plain_int(start_time, "producer start time"),
            _plain_int(rest[0], "producer instance") if rest else 0,
        )
        edge = (str(data["source"]), str(data["destination"]))
        key = data["key"]
        size = _plain_int(data["size"], "size")
        if not isinstance(key, str):
            raise TypeError(f"key must be a str: key={key!r}")
        if route is Route.RING:
            return RingDescriptor(
                producer, edge, key, _plain_int(data["position"], "position"), size
            )
        return FallbackDescriptor(
            producer, edge, key, _plain_int(data["generation"], "generation"), size
        )
    except (KeyError, TypeError, ValueError) as error:
        raise CorruptFrameError(
            f"malformed {route.value} descriptor: {error}: data={data!r}"
        ) from error


def _plain_int(value: object, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{what} must be a non-negative int: {what}={value!r}")
    return value


# -- results -----------------------------------------------------------------------


class GetStatus(enum.Enum):
    """What a get found; the first four mean what `spec.discovery.DeploymentGetStatus` means."""

    DELIVERED = DeploymentGetStatus.DELIVERED.value
    NOT_FOUND = DeploymentGetStatus.NOT_FOUND.value
    STALE = (
        DeploymentGetStatus.STALE.value
    )  # the descriptor's frame or segment is gone or superseded
    PRODUCER_GONE = (
        DeploymentGetStatus.PRODUCER_GONE.value
    )  # the descriptor's producer exited or closed
    BUSY = "busy"  # another process held a lock; nothing changed, retry (get_with_deadline does)


@dataclass(frozen=True)
class Delivery:
    """The answer to a get. True exactly when something was delivered."""

    status: GetStatus
    value: Any = None  # the payload, in independently owned memory (DELIVERED only)
    size: int = 0  # encoded payload bytes (DELIVERED only)
    route: Route | None = None  # where it came from (DELIVERED only)
    producer: ConnectorIdentity | None = None  # whose frame it was (DELIVERED only)

    @property
    def delivered(self) -> bool:
        return self.status is GetStatus.DELIVERED

    def __bool__(self) -> bool:
        return self.status is GetStatus.DELIVERED


_NOT_FOUND: Final = Delivery(GetStatus.NOT_FOUND)
_STALE: Final = Delivery(GetStatus.STALE)
_GONE: Final = Delivery(GetStatus.PRODUCER_GONE)
_BUSY: Final = Delivery(GetStatus.BUSY)
_FINAL_STATUSES: Final = frozenset((GetStatus.DELIVERED, GetStatus.STALE, GetStatus.PRODUCER_GONE))


@dataclass(frozen=True)
class ConnectorHealth:
    """Counters of one connector; the first seven are `spec.connector.ConnectorHealth`'s.

    In the model a producer's connector also counts the gets of its frames;
    here each connector counts what *it* did, so for a connector that both
    puts and gets (the lockstep machine's) the two agree.
    """

    puts: int  # accepted puts, either route
    gets: int  # delivered gets, either route
    bytes_transferred: int  # payload bytes of accepted puts plus delivered gets
    ring_puts: int  # puts published on a ring
    ring_gets: int  # gets delivered from a ring
    fallbacks: int  # puts carried by the fallback
    refusals: int  # puts refused with back-pressure
    busy: int  # gets that found another process's lock held
    fallback_bytes: int  # live fallback bytes charged to the budget, as of the last look
    fallback_segments: int  # live fallback segments, as of the last look
    rings: int  # rings set up (one per edge published on)
    failed_edges: int  # edges whose ring setup failed (the fallback carries them)
    scans: int  # discovery directory scans (only when the stamp moved)
    closed: bool  # close() was called
    fallback_spares: int = 0  # segment files kept for reuse (published or handed back)
    fallback_spare_bytes: int = 0  # their file bytes (at most `fallback_spare_bytes`)
    fallback_reused: int = 0  # fallback puts that wrote into a handed-back file
    fallback_mapping_hits: int = 0  # fallback claims that found the file already mapped
    reclaimed_files: int = 0  # files of dead producers this connector's scans removed
    ring_setup_retries: int = 0  # ring setups tried again after a failure and its back-off


# -- the connector -------------------------------------------------------------------


class Connector:
    """Puts and gets between local stage processes over host rings and per-key segments.

    `scope` names the deployment (every endpoint of an edge uses the same
    one). `ring_capacity` is each ring's data bytes: 0 disables rings, else
    4 KiB..64 MiB in multiples of 16. `fallback_budget` bounds the live
    bytes of this process's fallback segments. `fallback_spare_bytes` bounds
    the segment files kept for reuse (0: none): a segment file of at least
    `fallback_spare_min_bytes` is kept mapped after it is published, a
    reader hands it back when it claims it, and a later put of the same
    file size writes into it instead of allocating, mapping and faulting a
    new one (`shmring.impl.fallback`). `os_facade` is the seam fault
    plans use; production leaves it None. `shm_root` must be an existing
    directory. `spin_seconds` (at most `MAX_SPIN_SECONDS`) and
    `max_sleep_seconds` (at most `MAX_SLEEP_SECONDS`) tune
    `get_with_deadline`. `identity` (tests only) makes the
    connector publish as another live or dead process (pid, start time);
    `publish_hook` (tests only) is handed to every ring it creates (crash
    tests stop the producer at a stage of a put). `ring_retry_seconds`: how
    long after a failed ring setup the next put on that edge tries again
    (doubling per failure, at most `MAX_RING_RETRY_SECONDS`); None never
    retries (the lockstep machines, whose model has no clock).
    `rescan_seconds`: a receiver rescans the directory at least this often
    even when its stamp did not move, reclaiming what killed producers left
    (None: only when the stamp moved, as the model says).

    Each connector is its own producer, (pid, start time, instance): two
    connectors of one process on one edge publish on two rings.

    Use as a context manager, or call `close()` (idempotent).
    """

    _closed: bool = False

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
        identity: tuple[int, int] | None = None,
        publish_hook: PublishHook | None = None,
        ring_retry_seconds: float | None = DEFAULT_RING_RETRY_SECONDS,
        rescan_seconds: float | None = DEFAULT_RESCAN_SECONDS,
    ) -> None:
        validate_scope(scope)
        for option, seconds in (
            ("ring_retry_seconds", ring_retry_seconds),
            ("rescan_seconds", rescan_seconds),
        ):
            if seconds is not None and (
                not isinstance(seconds, (int, float))
                or isinstance(seconds, bool)
                or not seconds >= 0
            ):
                raise ConfigurationError(
                    f"{option} must be None or a number >= 0: {option}={seconds!r}"
                )
        self._rescan = rescan_seconds
        if not isinstance(ring_capacity, int) or isinstance(ring_capacity, bool):
            raise ConfigurationError(f"ring capacity must be an int: capacity={ring_capacity!r}")
        capacity_error = compute_capacity_error(ring_capacity)
        if capacity_error is not None:
            raise ConfigurationError(capacity_error)
        if (
            not isinstance(fallback_budget, int)
            or isinstance(fallback_budget, bool)
            or not is_valid_budget(fallback_budget)
        ):
            raise ConfigurationError(
                f"fallback budget must be an int >= 0 bytes: fallback_budget={fallback_budget!r}"
            )
        if fallback_budget > MAX_FALLBACK_BUDGET:
            raise ConfigurationError(
                f"fallback budget must be at most 2**63 - 1 bytes: fallback_budget={fallback_budget!r}"
            )
        for name, count in (
            ("fallback_spare_bytes", fallback_spare_bytes),
            ("fallback_spare_min_bytes", fallback_spare_min_bytes),
        ):
            if not isinstance(count, int) or isinstance(count, bool) or count < 0:
                raise ConfigurationError(f"{name} must be an int >= 0 bytes: {name}={count!r}")
        for name, value in (
            ("spin_seconds", spin_seconds),
            ("max_sleep_seconds", max_sleep_seconds),
        ):
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not value >= 0:
                raise ConfigurationError(f"{name} must be a number >= 0: {name}={value!r}")
        for name, value, bound in (
            ("spin_seconds", spin_seconds, MAX_SPIN_SECONDS),
            ("max_sleep_seconds", max_sleep_seconds, MAX_SLEEP_SECONDS),
        ):
            if not math.isfinite(value) or value > bound:
                raise ConfigurationError(
                    f"{name} must be at most {bound} seconds (a longer spin only burns a core, "
                    f"a longer sleep step only adds latency): {name}={value!r}"
                )
        if not isinstance(shm_root, str) or not os.path.isdir(shm_root):
            what = "does not exist" if not os.path.lexists(str(shm_root)) else "is not a directory"
            raise ConfigurationError(
                f"shm_root {what} (it must be an existing directory, e.g. /dev/shm): "
                f"shm_root={shm_root!r}"
            )
        self.scope = scope
        self.ring_capacity = ring_capacity
        self.fallback_budget = fallback_budget
        self.fallback_spare_bytes = fallback_spare_bytes
        self.fallback_spare_min_bytes = fallback_spare_min_bytes
        self.shm_root = shm_root
        self.directory = deployment_directory(scope, shm_root)
        self._os = os_facade if os_facade is not None else DEFAULT_OS
        self._spin = float(spin_seconds)
        self._max_sleep = float(max_sleep_seconds)
        self._lock = threading.RLock()
        self._publish_hook = publish_hook  # test seam handed to every ring (crash points of a put)
        self.instance = next_instance()  # which of this process's connectors (0, 1, ...)
        # `identity` is a test seam: publish as another (pid, start time), so one process
        # can stand in for several producers (fault campaigns); production leaves it None.
        process = identity if identity is not None else current_producer_identity()
        # This connector's producer identity: (pid, start time, instance).
        self.identity: ConnectorIdentity = (process[0], process[1], self.instance)
        self._rings: dict[Edge, RingChannel] = {}
        self._failed_edges: dict[Edge, BaseException] = {}
        self._ring_retry = ring_retry_seconds
        # edge -> (monotonic time of the next setup try, failures so far)
        self._ring_retry_at: dict[Edge, tuple[float, int]] = {}
        self._ring_retries = 0
        self._abandoned: list[RingChannel] = []  # rings whose teardown must be retried at close
        self._readers: dict[tuple[Edge, ConnectorIdentity], RingReader] = {}
        # Per edge, the (producer, reader) pairs a get by key visits, in discovery's
        # order; dropped whenever discovery scans or a producer is released.
        self._edge_readers: dict[Edge, list[tuple[ConnectorIdentity, RingReader]]] = {}
        self._sheds = 0  # times `_shed_descriptors` ran (a kept reader list may be stale)
        # (edge, key, doorbell, time) of the last polling get whose segment look found nothing.
        self._fallback_miss: tuple[Edge, str, int, float] | None = None
        # Mappings of handed-back fallback files, kept between this reader's claims.
        self._segment_mappings = SegmentMappings()
        self._membership: Membership | None = None
        self._dir: DeploymentDirectory | None = (
            None  # the verified directory descriptor, once joined
        )
        self._stamp: Stamp | None = None
        self._wake: Callable[[], None] | None = None  # the doorbell's wake (`Stamp.waker`)
        self._liveness: Liveness | None = None
        self._discovery: DiscoveryCache | None = None
        self._registrar: Registrar | None = None
        self._fallback: FallbackWriter | None = None
        self._live_path: str | None = None
        self._puts = self._gets = self._bytes = 0
        self._ring_puts = self._ring_gets = self._fallbacks = self._refusals = self._busy = 0

    # -- context manager -------------------------------------------------------------

    def __enter__(self) -> Connector:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"rings={len(self._rings)}"
        return f"Connector(scope={self.scope!r}, capacity={self.ring_capacity}, {state})"

    # -- joining the deployment ------------------------------------------------------------

    def _require_open(self) -> None:
        if self._closed:
            raise ClosedError(f"connector is closed: scope={self.scope!r}")

    def _join(self) -> FallbackWriter:
        """Join the deployment directory on first use; answers the fallback writer."""
        fallback = self._fallback
        if fallback is not None:
            return fallback
        os_facade = self._os
        identity = self.identity

        def ensure() -> DeploymentDirectory:
            try:
                return open_deployment_directory(self.scope, os_facade, self.shm_root)
            except ConfigurationError as error:
                raise ConfigurationError(
                    f"{error}; remedy: remove that path (if it is yours) or pick another "
                    f"scope or shm_root"
                ) from error

        membership = Membership.join(None, os_facade, ensure_directory=ensure)
        directory = membership.directory
        assert isinstance(directory, DeploymentDirectory)
        try:
            try:
                stamp: Stamp | None = Stamp.open(directory, os_facade)
            except (OSError, ShmringError) as error:
                # Discovery is unavailable: no rings of ours, and every get
                # scans. The fallback still carries everything.
                logger.warning("shmring: discovery stamp unavailable in %s: %s", directory, error)
                stamp = None
            liveness = Liveness(os_facade, identity, on_exhausted=self._shed_descriptors)
            self._discovery = DiscoveryCache(directory, os_facade, liveness, stamp)
            self._discovery.rescan_seconds = self._rescan
            self._registrar = Registrar(directory, os_facade, stamp, identity) if stamp else None
            fallback = FallbackWriter(
                directory,
                identity,
                self.fallback_budget,
                os_facade,
                spare_bytes=self.fallback_spare_bytes,
                spare_min=self.fallback_spare_min_bytes,
            )
        except BaseException:
            membership.leave()
            directory.close()
            raise
        self._dir = directory
        self._membership = membership
        self._stamp = stamp
        self._wake = stamp.waker() if stamp is not None else None
        self._liveness = liveness
        self._fallback = fallback
        return fallback

    def join(self) -> None:
        """Join the deployment now instead of at the first put or get.

        ConfigurationError (with its remedy) when the deployment directory
        is unusable: not a directory, another uid's, or open to others.
        """
        with self._lock:
            self._require_open()
            self._join()

    def _ensure_live_file(self) -> None:
        """Say "this producer's connector is open" (for fallback descriptors after close)."""
        if self._live_path is not None or self.identity is None:
            return
        path = os.path.join(self.directory, live_file_name(self.identity))
        directory = self._dir
        assert directory is not None  # joined
        try:
            fd = directory.open(path, OPEN_FLAGS_CREATE, FILE_MODE)
        except FileExistsError:
            pass  # left by our own earlier, failed close
        except OSError as error:
            logger.warning("shmring: cannot create %s: %s", path, error)
            return
        else:
            self._os.close(fd)
        self._live_path = path

    def _release_live_file(self) -> None:
        path = self._live_path
        if path is None:
            return
        directory = self._dir
        if directory is not None:
            with contextlib.suppress(FileNotFoundError):
                directory.unlink(path)
        self._live_path = None

    # -- rings -------------------------------------------------------------------------------

    def _ring_for(self, edge: Edge) -> RingChannel | None:
        """The edge's ring, set up on first use; None when disabled or failed (for good)."""
        ring = self._rings.get(edge)
        if ring is not None:
            return ring
        if self.ring_capacity == 0:
            return None
        if edge in self._failed_edges:
            retry_at = self._ring_retry_at.get(edge)
            if retry_at is None or time.monotonic() < retry_at[0]:
                return None
            del self._failed_edges[edge]  # the back-off passed: try the setup again
            self._ring_retries += 1
        registrar = self._registrar
        identity = self.identity
        assert identity is not None  # joined
        if registrar is None:
            self._disable_ring(edge, ShmringError("discovery stamp unavailable"))
            return None
        path = ring_path(self.directory, edge[0], edge[1], identity)
        try:
            ring = RingChannel.create(
                path,
                self.ring_capacity,
                os_facade=self._os,
                producer=identity,
                publish_hook=self._publish_hook,
                directory=self._dir,
            )
        except (OSError, ShmringError) as error:
            self._disable_ring(edge, error)
            return None
        try:
            registrar.register(edge)  # the marker comes only after the ring is ready
        except (OSError, ShmringError) as error:
            self._abandon(ring)
            self._disable_ring(edge, error)
            return None
        self._rings[edge] = ring
        self._ring_retry_at.pop(edge, None)
        return ring

    def _abandon(self, ring: RingChannel) -> None:
        try:
            ring.close()
        except (OSError, ShmringError):
            self._abandoned.append(ring)  # close retries the unlink

    def _disable_ring(self, edge: Edge, error: BaseException) -> None:
        self._failed_edges[edge] = error
        failures = self._ring_retry_at.get(edge, (0.0, 0))[1] + 1
        if self._ring_retry is not None:
            delay = min(self._ring_retry * 2 ** (failures - 1), MAX_RING_RETRY_SECONDS)
            self._ring_retry_at[edge] = (time.monotonic() + delay, failures)
        if failures == 1:
            logger.warning(
                "shmring: ring setup failed for edge %s -> %s; using per-key segments "
                "(retried after a back-off): %s",
                edge[0],
                edge[1],
                error,
            )

    # -- put -------------------------------------------------------------------------------

    def put(self, *args: Any) -> Descriptor:
        """``put(src, dst, key, obj)`` or ``put((src, dst), key, obj)``: publish a copy of `obj`.

        Answers the descriptor of what was published (hand it to the
        receiver for an exact get). `obj` may be changed as soon as put
        returns. BackPressureError: the fallback budget is spent (nothing
        changed); NoSpaceError: the OS has no room for the segment.
        """
        edge, (key, obj) = _split_edge(args, 2, "put")
        with self._lock:
            if self._closed:
                self._require_open()
            if type(key) is not str or not key.isascii():
                _validate_key(key)
            plan = codec.prepare(obj)
            fallback = self._fallback
            if fallback is None:
                fallback = self._join()
            if self._live_path is None:
                self._ensure_live_file()
            identity = self.identity
            assert identity is not None
            size = plan.nbytes
            ring = self._rings.get(edge)
            if ring is None:
                ring = self._ring_for(edge)
            if ring is not None:
                whole = plan.whole()
                if whole is not None and not fallback.has(edge, key):
                    # A plain encoding with no segment to retire: the ring copies
                    # the bytes as they are (what the writer below would write).
                    outcome = ring.put(key, whole)
                else:

                    def write(view: memoryview) -> None:
                        plan.write_into(view)
                        # The ring has room: retire the key's segment before the frame shows.
                        if fallback.has(edge, key):
                            fallback.retire(edge, key)

                    outcome = ring.put_with_writer(key, size, write)
                if outcome.status is PutStatus.PUBLISHED:
                    assert outcome.position is not None
                    self._puts += 1
                    self._ring_puts += 1
                    self._bytes += size
                    wake = self._wake
                    if wake is not None:
                        wake()  # what `_ring_doorbell` does, one call shorter
                    return RingDescriptor(identity, edge, key, outcome.position, size)
            cancel: Callable[[], object] | None = (lambda: ring.cancel(key)) if ring else None
            try:
                record = fallback.put(edge, key, plan, before_publish=cancel)
            except BackPressureError:
                self._refusals += 1
                raise
            except OSError as error:
                if isinstance(error, ShmringError) or not is_exhaustion(error):
                    raise
                # Nothing was published and nothing is left (fallback.put); say why, typed.
                raise ResourceExhaustedError(
                    f"out of descriptors for a fallback segment: key={key!r}: {error}",
                    error.errno or 0,
                ) from error
            self._puts += 1
            self._fallbacks += 1
            self._bytes += size
            self._ring_doorbell()
            return FallbackDescriptor(identity, edge, key, record.generation, size)

    # -- get -------------------------------------------------------------------------------

    def get(self, *args: Any, descriptor: Descriptor | None = None) -> Delivery:
        """``get(src, dst, key)`` or ``get((src, dst), key)``: claim the key's version, once.

        With `descriptor` only the exact frame or segment it names. Never
        waits for another process (BUSY instead); see `get_with_deadline`.
        """
        edge, (key,) = _split_edge(args, 1, "get")
        return self._get(edge, key, descriptor, None)

    def _get(
        self, edge: Edge, key: str, descriptor: Descriptor | None, bell: int | None
    ) -> Delivery:
        """`get`; `bell` (from `get_with_deadline`) is the doorbell read before this poll."""
        with self._lock:
            if self._closed:
                self._require_open()
            if type(key) is not str or not key.isascii():
                _validate_key(key)
            if self._fallback is None:  # not (fully) joined yet: `_join` retries what failed
                self._join()
            discovery = self._discovery
            assert discovery is not None
            if self._short_of_descriptors("a discovery scan", discovery.refresh):
                self._edge_readers.clear()
                self._release_departed()
            if descriptor is None:
                return self._get_by_key(edge, key, bell)
            if not isinstance(descriptor, (RingDescriptor, FallbackDescriptor)):
                raise TypeError(f"not a descriptor: descriptor={descriptor!r}")
            if descriptor.edge != edge or descriptor.key != key:
                raise InvalidKeyError(
                    f"descriptor names edge={descriptor.edge} key={descriptor.key!r}, "
                    f"get asked edge={edge} key={key!r}"
                )
            if isinstance(descriptor, RingDescriptor):
                return self._get_ring_descriptor(edge, key, descriptor)
            return self._get_fallback_descriptor(edge, key, descriptor)

    def _get_by_key(self, edge: Edge, key: str, bell: int | None = None) -> Delivery:
        discovery = self._discovery
        liveness = self._liveness
        assert discovery is not None and liveness is not None
        busy = False
        corrupt: CorruptFrameError | None = None
        exhausted: ResourceExhaustedError | None = None
        readers = self._readers
        pairs = self._edge_readers.get(edge)
        cached = pairs is not None
        if pairs is None:
            candidates: list[tuple[ConnectorIdentity, RingReader | None]] = [
                (producer, None) for producer in discovery.producers_of(edge)
            ]
        else:
            candidates = pairs  # type: ignore[assignment]
        # Uncached: what this pass resolved, kept for later gets when it saw every
        # producer of the edge, none ran short of descriptors and nothing was shed.
        resolved: list[tuple[ConnectorIdentity, RingReader]] = []
        complete = True
        sheds = self._sheds
        last = len(candidates) - 1
        for index, (producer, reader) in enumerate(candidates):
            if cached:
                assert reader is not None
                slot = (edge, producer)
                if readers.pop(slot, None) is not reader:  # dropped under us: resolve afresh
                    self._edge_readers.clear()
                    return self._get_by_key(edge, key, bell)
                readers[slot] = reader  # most recently used last, as `_reader` does
                if reader.producer_closed:
                    self._release(edge, producer)
                    continue
            else:
                try:
                    reader = self._reader(edge, producer)
                except ResourceExhaustedError as error:
                    # Partial service: the producers we can map are still looked at.
                    exhausted = exhausted or error
                    complete = False
                    continue
                if reader is None:
                    continue
                resolved.append((producer, reader))
            try:
                got = reader.get(key, decode=_decode_sized)
            except CorruptFrameError as error:
                # That producer's channel is damaged; the edge's other channels
                # (and the fallback) keep serving. Reported if nothing else delivers.
                corrupt = corrupt or error
                continue
            if got.status is ReceiveStatus.DELIVERED:
                if not self._alive_after_claim(producer):
                    self._release(edge, producer)  # a dead producer's frame is never delivered
                    if not cached:
                        resolved.pop()
                    continue
                if not cached and index == last:
                    self._keep_readers(edge, resolved, complete, sheds)
                size, value = got.payload
                self._gets += 1  # `_delivered`, inline on the hot path
                self._bytes += size
                self._ring_gets += 1
                return Delivery(GetStatus.DELIVERED, value, size, Route.RING, producer)
            if got.status is ReceiveStatus.BUSY:
                busy = True
            elif reader.producer_closed:
                self._release(edge, producer)
                if not cached:
                    resolved.pop()
        if not cached:
            self._keep_readers(edge, resolved, complete, sheds)
        if self._fallback_unchanged(edge, key, bell):
            delivery = _BUSY if busy else _NOT_FOUND
            if busy:
                self._busy += 1
        else:
            delivery = self._claim_fallback(edge, key, None, busy)
            if bell is not None and delivery.status is GetStatus.NOT_FOUND:
                self._fallback_miss = (edge, key, bell, time.monotonic())
        if corrupt is not None and not delivery.delivered:
            raise corrupt
        if exhausted is not None and not delivery.delivered:
            raise exhausted  # NOT_FOUND could be wrong: some producers were not looked at
        return delivery

    def _keep_readers(
        self,
        edge: Edge,
        resolved: list[tuple[ConnectorIdentity, RingReader]],
        complete: bool,
        sheds: int,
    ) -> None:
        """Keep the (producer, mapped ring) pairs a get by key resolved, for the next gets.

        Later gets on the edge visit this list instead of asking discovery and
        `_reader` per producer; it is dropped whenever discovery scans, a
        producer is released, descriptors are shed or the connector closes.
        Kept only when the pass saw every producer with nothing short or shed.
        """
        if complete and sheds == self._sheds:
            self._edge_readers[edge] = resolved

    # -- short of descriptors ------------------------------------------------------------
    #
    # Issue 12: under `ulimit -n 64` a reader with 80 producers got a bare
    # EMFILE from every get, so not even the first producers were served. Each
    # mapped ring costs two descriptors (ours and the one mmap keeps) and each
    # producer a pidfd. So when a call runs out, what we cache goes first
    # (least recently used rings, kept segment mappings; `Liveness` sheds its
    # pidfds itself) and the call is tried again; only when nothing is left
    # to release does a typed ResourceExhaustedError (an OSError) reach the
    # caller, after every producer that could be mapped was looked at.

    def _shed_descriptors(self) -> int:
        """Release half of the cached ring mappings (least recently used) and kept segments."""
        self._sheds += 1
        self._edge_readers.clear()  # it holds readers closed below
        released = len(self._segment_mappings)
        self._segment_mappings.close()
        count = (len(self._readers) + 1) // 2
        for key in list(self._readers)[:count]:
            self._readers.pop(key).close()
        if self._liveness is not None:
            released += self._liveness.shed(self._liveness.pidfd_count // 2 + 1)
        return released + count

    def _short_of_descriptors(self, what: str, action: Callable[[], Any]) -> Any:
        """Run `action`; out of descriptors, shed what we cache and run it again (typed error)."""
        for _ in range(4):
            try:
                return action()
            except OSError as error:
                if isinstance(error, ShmringError) or not is_exhaustion(error):
                    raise
                if not self._shed_descriptors():
                    raise ResourceExhaustedError(
                        f"out of descriptors for {what}: {error}", error.errno or 0
                    ) from error
        raise ResourceExhaustedError(
            f"out of descriptors for {what}, even after releasing mappings"
        )

    def _alive_after_claim(self, producer: tuple[int, ...]) -> bool:
        """Liveness after a frame was claimed: a claimed frame is never lost to a shortage.

        When not even /proc can be read after releasing every cache, the
        frame is delivered: its producer was alive at the scan, and losing an
        accepted frame is the worse failure.
        """
        liveness = self._liveness
        assert liveness is not None
        try:
            return liveness.is_alive(producer)
        except ResourceExhaustedError:
            return True

    def _fallback_unchanged(self, edge: Edge, key: str, bell: int | None) -> bool:
        """Whether a polling get may skip looking for the key's segment (one failing openat).

        Every put rings the doorbell after it publishes, so when the bell
        still reads what it read before our last look found nothing, nothing
        was published since by any producer that rings. A producer that
        cannot ring (its discovery stamp failed) is still found: the segment
        is looked for again at least every `_FALLBACK_RECHECK_SECONDS`.
        """
        miss = self._fallback_miss
        return (
            bell is not None
            and miss is not None
            and miss[0] == edge
            and miss[1] == key
            and miss[2] == bell
            and time.monotonic() - miss[3] < _FALLBACK_RECHECK_SECONDS
        )

    def _get_ring_descriptor(self, edge: Edge, key: str, descriptor: RingDescriptor) -> Delivery:
        discovery = self._discovery
        liveness = self._liveness
        assert discovery is not None and liveness is not None
        producer = descriptor.producer
        if producer not in discovery.producers.get(edge, ()) or not liveness.is_alive(producer):
            self._release(edge, producer)
            return _GONE
        reader = self._reader(edge, producer)
        if reader is None:
            return _GONE
        got = reader.get(key, descriptor.position, decode=_decode_sized)
        if got.status is ReceiveStatus.DELIVERED:
            size, value = got.payload
            return self._delivered(Route.RING, value, size, producer)
        if got.status is ReceiveStatus.BUSY:
            self._busy += 1
            return _BUSY
        return _STALE

    def _get_fallback_descriptor(
        self, edge: Edge, key: str, descriptor: FallbackDescriptor
    ) -> Delivery:
        got = self._claim_fallback(edge, key, descriptor, False)
        if got.status is GetStatus.NOT_FOUND or got.status is GetStatus.STALE:
            return _STALE if self._is_delivering(descriptor.producer) else _GONE
        return got

    def _claim_fallback(
        self, edge: Edge, key: str, descriptor: FallbackDescriptor | None, busy: bool
    ) -> Delivery:
        liveness = self._liveness
        assert liveness is not None
        assert self._dir is not None  # joined
        directory = self._dir
        claim = self._short_of_descriptors(
            "a fallback segment",
            lambda: claim_segment(
                directory,
                edge,
                key,
                os_facade=self._os,
                is_alive=self._alive_after_claim,
                decode=codec.decode,
                owner=descriptor.producer if descriptor else None,
                generation=descriptor.generation if descriptor else None,
                mappings=self._segment_mappings,
            ),
        )
        status = claim.status
        if status is ClaimStatus.DELIVERED:
            assert claim.owner is not None
            return self._delivered(Route.FALLBACK, claim.value, claim.payload_length, claim.owner)
        if status is ClaimStatus.BUSY or busy:
            self._busy += 1
            return _BUSY
        if status is ClaimStatus.OWNER_GONE and descriptor is not None:
            return _GONE
        if status is ClaimStatus.STALE:
            return _STALE
        return _NOT_FOUND

    def _is_delivering(self, producer: ConnectorIdentity) -> bool:
        """The producer is running and its connector is open (its live file exists)."""
        liveness = self._liveness
        assert liveness is not None
        if not liveness.is_alive(producer):
            return False
        try:
            assert self._dir is not None  # joined
            self._dir.stat(live_file_name(producer))
        except FileNotFoundError:
            return False
        return True

    def _delivered(
        self, route: Route, value: Any, size: int, producer: ConnectorIdentity
    ) -> Delivery:
        self._gets += 1
        self._bytes += size
        if route is Route.RING:
            self._ring_gets += 1
        return Delivery(GetStatus.DELIVERED, value, size, route, producer)

    def _reader(self, edge: Edge, producer: ConnectorIdentity) -> RingReader | None:
        """The mapped ring of `producer` on `edge`; None (and released) when it is gone."""
        reader = self._readers.pop((edge, producer), None)
        if reader is not None:
            self._readers[(edge, producer)] = reader  # most recently used last
        if reader is None:
            path = ring_path(self.directory, edge[0], edge[1], producer)
            try:
                reader = self._short_of_descriptors(
                    "a ring mapping",
                    lambda: RingReader.attach(path, os_facade=self._os, directory=self._dir),
                )
            except ProducerGoneError:
                self._release(edge, producer)
                return None
            except CorruptFrameError as error:
                logger.warning("shmring: ignoring a corrupt ring %s: %s", path, error)
                self._release(edge, producer)
                return None
            if (*reader.producer, reader.instance) != producer:
                named = (*reader.producer, reader.instance)
                reader.close()
                logger.warning("shmring: ring %s names producer=%s", path, named)
                self._release(edge, producer)
                return None
            self._readers[(edge, producer)] = reader
        elif reader.producer_closed:
            self._release(edge, producer)
            return None
        return reader

    def _release_departed(self) -> None:
        """After a scan: unmap every ring whose producer closed, died or lost its marker.

        A get by key visits only the producers discovery still lists, so a
        producer that left would otherwise stay mapped (fd and mapping of a
        deleted file) until this connector closes.
        """
        discovery = self._discovery
        liveness = self._liveness
        assert discovery is not None and liveness is not None
        for edge, producer in list(self._readers):
            reader = self._readers[(edge, producer)]
            if (
                producer not in discovery.producers.get(edge, ())
                or reader.producer_closed
                or not self._alive_after_claim(producer)
            ):
                self._release(edge, producer)

    def _release(self, edge: Edge, producer: ConnectorIdentity) -> None:
        """Drop our mapping of a producer that closed or exited."""
        self._edge_readers.clear()
        reader = self._readers.pop((edge, producer), None)
        if reader is not None:
            reader.close()
        if self._discovery is not None:
            self._discovery.release(edge, producer)

    # -- blocking get ----------------------------------------------------------------------

    def get_with_deadline(
        self,
        *args: Any,
        descriptor: Descriptor | None = None,
        deadline: float | None = None,
        timeout: float | None = None,
        wait_for_locks: bool = True,
    ) -> Delivery:
        """Like `get`, but wait until `deadline` (a `time.monotonic()` value) or `timeout` seconds.

        Polls without sleeping for a short spin, then sleeps on the
        deployment's doorbell (a futex every connector rings when it
        publishes, retires or registers), so an idle wait costs no CPU and
        wakes as soon as something may have arrived. Each sleep is bounded
        by `_MAX_DOORBELL_WAIT_SECONDS`, so what rings no bell (a producer
        dying) is still seen promptly. While another process holds a lock
        (BUSY), or without futexes, it sleeps in short steps instead,
        backing off up to `max_sleep_seconds`. Answers the first final
        result (delivered, stale, producer gone) or the last one when time
        runs out (NOT_FOUND or BUSY). With `wait_for_locks=False` a BUSY
        answer is final too: a receive loop that polls many keys never
        spends its deadline on one that another process holds.
        """
        if deadline is None:
            deadline = time.monotonic() + (timeout if timeout is not None else 0.0)
        edge, (key,) = _split_edge(args, 1, "get_with_deadline")
        start = time.monotonic()
        sleep = _MIN_SLEEP_SECONDS
        signature = None
        while True:
            bell = self._doorbell()
            got = self._get(edge, key, descriptor, bell)
            if got.status in _FINAL_STATUSES:
                return got
            if got.status is GetStatus.BUSY and not wait_for_locks:
                return got
            now = time.monotonic()
            if now >= deadline:
                return got
            if now - start < self._spin:
                continue
            stamp = self._stamp
            if bell is not None and stamp is not None and got.status is not GetStatus.BUSY:
                stamp.wait(bell, min(deadline - now, _MAX_DOORBELL_WAIT_SECONDS))
                continue
            seen = self._wake_signature(edge)
            if seen != signature:
                signature = seen
                sleep = _MIN_SLEEP_SECONDS
            time.sleep(min(sleep, deadline - now))
            sleep = min(sleep * 2, max(self._max_sleep, _MIN_SLEEP_SECONDS))

    def wakeup_generation(self) -> int | None:
        """The deployment doorbell now (read it before polling); None without one."""
        with self._lock:
            self._require_open()
            self._join()
        return self._doorbell()

    def wait_for_change(self, generation: int | None, timeout: float) -> bool:
        """Sleep until the doorbell moves past `generation` (something was published) or `timeout`.

        Answers whether it moved. One call sleeps at most a second (so a
        death, which rings no bell, is still looked for); without a doorbell
        (None) it answers False at once: the caller keeps its timed poll.
        """
        stamp = self._stamp
        if generation is None or stamp is None or self._doorbell() is None:
            return False
        if self._doorbell() == generation:
            stamp.wait(generation, max(0.0, min(timeout, _MAX_DOORBELL_WAIT_SECONDS * 20)))
        return self._doorbell() != generation

    def _doorbell(self) -> int | None:
        """The deployment doorbell's value, or None when there is none to wait on."""
        stamp = self._stamp
        if stamp is None:
            return None
        try:
            return stamp.doorbell()
        except ValueError:  # closed under us
            return None

    def _ring_doorbell(self) -> None:
        """Wake receivers blocked in `get_with_deadline` (after a publish or retire)."""
        stamp = self._stamp
        if stamp is not None:
            stamp.ring()

    def _wake_signature(self, edge: Edge) -> tuple[int, ...]:
        """Shared-memory counters that move when something may have arrived on `edge`."""
        with self._lock:
            values = [self._stamp.load() if self._stamp is not None else 0]
            for (reader_edge, _), reader in self._readers.items():
                if reader_edge == edge:
                    with contextlib.suppress(ClosedError):
                        values.append(reader.wakeup_sequence)
            return tuple(values)

    def abandon_get(self, key: str) -> None:
        """Forget what this receiver remembers about looking for `key` (nothing is retired)."""
        with self._lock:
            _validate_key(key)
            miss = self._fallback_miss
            if miss is not None and miss[1] == key:
                self._fallback_miss = None

    def reap_consumed(self) -> int:
        """Drop this producer's records of segments readers claimed; answer the bytes freed."""
        with self._lock:
            fallback = self._fallback
            return fallback.refresh() if fallback is not None and not self._closed else 0

    def file_path(self, descriptor: Descriptor) -> str:
        """The file a descriptor's frame lives in: its producer's ring, or the key's segment."""
        if isinstance(descriptor, RingDescriptor):
            return ring_path(self.directory, *descriptor.edge, descriptor.producer)
        return os.path.join(
            self.directory, fallback_segment_file_name(descriptor.edge, descriptor.key)
        )

    # -- cancellation ----------------------------------------------------------------------

    def cleanup(self, key: str) -> int:
        """Retire the key's unclaimed version on every edge (ring and fallback); answer how many."""
        with self._lock:
            self._require_open()
            _validate_key(key)
            retired = sum(ring.cancel(key) for _, ring in sorted(self._rings.items()))
            if self._fallback is not None:
                retired += self._fallback.retire_key(key)
            if retired:
                self._ring_doorbell()
            return retired

    def cleanup_prefix(self, prefix: str) -> int:
        """Retire every unclaimed `prefix` + digits key on every edge and route; answer how many."""
        with self._lock:
            self._require_open()
            _validate_key(prefix)
            retired = sum(ring.cancel_prefix(prefix) for _, ring in sorted(self._rings.items()))
            if self._fallback is not None:
                retired += self._fallback.retire_prefix(prefix)
            if retired:
                self._ring_doorbell()
            return retired

    # -- close -------------------------------------------------------------------------------

    def close(self) -> int:
        """Retire everything this process published and remove every file it owns.

        Rings are marked closed and unlinked, markers removed (one stamp
        bump), unclaimed segments removed; the last connector of the
        deployment removes the directory. Idempotent: a second call retries
        whatever failed and answers 0. Answers how many versions it retired.
        """
        with self._lock:
            first = not self._closed
            self._closed = True
            retired = 0
            failures: list[BaseException] = []
            for edge, ring in sorted(self._rings.items()):
                try:
                    retired += ring.close()  # 0 when closed before; retries a failed unlink
                    del self._rings[edge]
                except (OSError, ShmringError) as error:
                    failures.append(error)
            for ring in list(self._abandoned):
                try:
                    ring.close()
                    self._abandoned.remove(ring)
                except (OSError, ShmringError) as error:
                    failures.append(error)
            if self._registrar is not None:
                try:
                    self._registrar.unregister_all()
                except (OSError, ShmringError) as error:
                    failures.append(error)
            if self._fallback is not None:
                try:
                    retired += self._fallback.close()
                except (OSError, ShmringError) as error:
                    failures.append(error)
            with contextlib.suppress(OSError):
                self._release_live_file()
            self._edge_readers.clear()
            for key in list(self._readers):
                self._readers.pop(key).close()
            self._segment_mappings.close()
            if retired:
                with contextlib.suppress(OSError, ValueError):
                    self._ring_doorbell()
            if not failures:
                self._leave()
            if failures:
                raise failures[0]
            return retired if first else 0

    def _leave(self) -> None:
        if self._liveness is not None:
            self._liveness.close()
        if self._stamp is not None:
            self._stamp.close()
        if self._membership is not None:
            self._membership.leave()
            self._membership = None
        if self._dir is not None and self._live_path is None:
            self._dir.close()  # kept while the live file's unlink must be retried
            self._dir = None

    @property
    def closed(self) -> bool:
        return self._closed

    # -- inspection --------------------------------------------------------------------------

    def fallback_bytes(self) -> int:
        """Live fallback bytes charged to the budget, after dropping segments readers claimed."""
        with self._lock:
            return self._fallback.used_bytes() if self._fallback is not None else 0

    def failed_edges(self) -> dict[Edge, BaseException]:
        """Edges whose ring setup failed, with the error that disabled each."""
        with self._lock:
            return dict(self._failed_edges)

    def ring(self, *edge_args: Any) -> RingChannel | None:
        """This process's ring on an edge, if set up (for statistics and tests)."""
        edge, () = _split_edge(edge_args, 0, "ring")
        return self._rings.get(edge)

    def health(self) -> ConnectorHealth:
        with self._lock:
            fallback = self._fallback.statistics() if self._fallback is not None else None
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
                rings=len(self._rings),
                failed_edges=len(self._failed_edges),
                scans=self._discovery.scans if self._discovery is not None else 0,
                closed=self._closed,
                fallback_spares=fallback.spares if fallback else 0,
                fallback_spare_bytes=fallback.spare_bytes if fallback else 0,
                fallback_reused=fallback.reused if fallback else 0,
                fallback_mapping_hits=self._segment_mappings.hits,
                reclaimed_files=self._discovery.reclaimed if self._discovery is not None else 0,
                ring_setup_retries=self._ring_retries,
            )


# -- helpers ---------------------------------------------------------------------------


def _decode_sized(view: memoryview) -> tuple[int, Any]:
    """Decode a ring payload into owned memory, keeping its encoded length."""
    return view.nbytes, codec.decode(view)


@functools.lru_cache(maxsize=1024, typed=True)  # typed: True must not hit 1's entry
def _cached_stage(value: str | int) -> str:
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    return validate_stage_name(value)


def _stage(value: object, argument: str) -> str:
    """A validated stage name (ints, as vllm-omni's stage ids, become their decimal string)."""
    if not isinstance(value, (str, int)) or isinstance(value, bool):
        raise InvalidKeyError(f"{argument} must be a str or an int: {argument}={value!r}")
    return _cached_stage(value)


# Validated edges by the (src, dst) a caller passed, when both are exactly str
# or int (never bool: True == 1 must not find 1's entry).
_EDGE_CACHE: dict[tuple[Any, Any], Edge] = {}
_EDGE_CACHE_LIMIT: Final = 1024


def _edge_of(source: Any, destination: Any) -> Edge:
    kind, other = type(source), type(destination)
    if (kind is str or kind is int) and (other is str or other is int):
        edge = _EDGE_CACHE.get((source, destination))
        if edge is None:
            edge = (_stage(source, "from_stage"), _stage(destination, "to_stage"))
            if len(_EDGE_CACHE) >= _EDGE_CACHE_LIMIT:
                _EDGE_CACHE.clear()
            _EDGE_CACHE[source, destination] = edge
        return edge
    return (_stage(source, "from_stage"), _stage(destination, "to_stage"))


def _split_edge(args: tuple[Any, ...], rest: int, what: str) -> tuple[Edge, tuple[Any, ...]]:
    """(edge, remaining args) from ``(src, dst, *rest)`` or ``((src, dst), *rest)``."""
    if len(args) == rest + 2:
        source, destination = args[0], args[1]
        if type(source) is str and type(destination) is str:  # the hot path: one dict look-up
            edge = _EDGE_CACHE.get((source, destination))
            if edge is not None:
                return edge, args[2:]
        return _edge_of(source, destination), args[2:]
    if len(args) == rest + 1 and isinstance(args[0], tuple) and len(args[0]) == 2:
        return _edge_of(args[0][0], args[0][1]), args[1:]
    raise TypeError(
        f"{what}() takes (src, dst, ...) or ((src, dst), ...) and {rest} more: got {len(args)} arguments"
    )


def _validate_key(key: object) -> None:
    if not isinstance(key, str):
        raise InvalidKeyError(f"key must be a str: key={key!r}")
    if not key.isascii():
        try:
            key.encode("utf-8")
        except UnicodeEncodeError as error:
            raise InvalidKeyError(f"key is not valid UTF-8 text: key={key!r}") from error


__all__ = [
    "DEFAULT_FALLBACK_BUDGET",
    "DEFAULT_RING_CAPACITY",
    "Connector",
    "ConnectorHealth",
    "Delivery",
    "Descriptor",
    "FallbackDescriptor",
    "GetStatus",
    "RingDescriptor",
    "Route",
    "descriptor_from_dict",
]
