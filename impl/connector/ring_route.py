"""The ring route: our `RingChannel` per edge, and the mapped rings of the producers we read.

Producer side (`spec.connector.process_ring_setup`, `spec.ring.process_put`,
`process_cancel`, `process_close`): one ring per edge this connector
publishes on, set up at the first put on the edge. Setup is file creation,
allocation, mapping *and* the discovery marker; any failure (ENOSPC, EPERM,
a marker or stamp that cannot be written) closes what was made and disables
the ring for that edge, and the fallback carries it. The model remembers a
failed setup for good; here the setup is tried again after a back-off
(`ring_retry_seconds`, doubling per failure; None keeps the model's rule).

Receiver side (`spec.discovery.get_candidates` and the ring half of
`spec.connector.process_get`): the rings of the edge's producers, mapped
once and kept (least recently used first out when descriptors run short).
Liveness is asked after the frame is found and locked, before its payload
is decoded (inside the decode callback): a frame of a producer that exited
is left unclaimed and its ring unmapped, without decoding it. Only the
exact frame a descriptor names is read for a get with a descriptor, after
the producer was found delivering (`spec.discovery.process_get`).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import logging
import os
import time
import weakref
from collections.abc import Callable
from typing import Any

from ...spec.connector import Route
from ...spec.layout import CODEC_FRAMED_MARKER, POOL_REF_LENGTH
from ...spec.ring import ConsumeMode, PutStatus
from .. import codec
from ..errors import (
    ClosedError,
    CorruptFrameError,
    ProducerGoneError,
    ResourceExhaustedError,
    ShmringError,
)
from ..lifecycle import deferred_signals
from ..liveness import Liveness
from ..names import ConnectorIdentity, ring_path
from ..os_seam import OsFacade
from ..pool import PoolReader, is_pool_ref
from ..ring.borrow import BorrowedPayload
from ..ring.engine import RingProducer
from ..ring.producer import PublishHook, RingChannel
from ..ring.reader import RingReader
from ..ring.results import ReceiveStatus
from .cohort import NOTHING_HELD, CohortGates, CohortPending, is_borrowed_member, is_member
from .config import MAX_RING_RETRY_SECONDS, ConnectorConfig
from .descriptors import RingDescriptor
from .edges import Edge
from .joining import Deployment
from .results import BUSY, GONE, NOT_FOUND, STALE, Delivery, GetStatus
from .routes import Hook, RouteBackend
from .shortage import retry_short_of_descriptors

logger = logging.getLogger("shmring.connector")
_RING = Route.RING
_POOL = Route.POOL
_FRAMED = CODEC_FRAMED_MARKER  # a cohort member's envelope starts like a framed payload

# A ring payload -> (encoded bytes, value, route): POOL when it was a pool reference.
Decoder = Callable[[memoryview], tuple[int, Any, Route]]
# (producer, its mapped ring, the decoder that asks its liveness first)
Candidate = tuple[ConnectorIdentity, RingReader, Decoder]


class ProducerExited(Exception):
    """Raised by a live decoder: the frame's producer is not running; the frame stays unclaimed."""


def decode_sized(view: memoryview) -> tuple[int, Any]:
    """Decode a ring payload into owned memory, keeping its encoded length."""
    return view.nbytes, codec.decode(view)


def pool_decoder(
    pool: PoolReader | None,
    producer: ConnectorIdentity,
    cohorts: CohortGates | None = None,
    edge: Edge | None = None,
) -> Decoder:
    """`decode_sized` that decodes a pool reference's payload from its slot (route POOL).

    `producer` is the ring's: a reference names only a slot of the ring's
    own producer (`PoolReader.claim` validates the rest). With `cohorts`, a
    publication cohort's member (on the ring or in the slot) is decoded only
    once its cohort committed (`cohort.CohortPending` otherwise: left as is).
    """
    decode_payload = codec.decode if cohorts is None else cohorts.decoder(edge, producer)  # type: ignore[arg-type]

    def decode(view: memoryview) -> tuple[int, Any, Route]:
        if pool is not None and is_pool_ref(view):
            size, value = pool.decode_owned(producer, view, decode_payload)
            return size, value, _POOL
        if cohorts is not None and view[0] == _FRAMED and is_member(view):
            return view.nbytes, decode_payload(view), _RING
        return view.nbytes, codec.decode(view), _RING

    return decode


# A borrowed get's decoder: (encoded bytes, value, the payload while a view holds it).
Borrower = Callable[[BorrowedPayload], tuple[int, Any, "weakref.ref[BorrowedPayload]"]]
_LEASE = ConsumeMode.LEASE


def borrow_sized(payload: BorrowedPayload) -> tuple[int, Any, weakref.ref[BorrowedPayload]]:
    """Decode a claimed payload in place (`codec.decode_borrowed`), keeping its length.

    THE hook of every borrowed get: whatever holds the bytes (a ring frame,
    a fallback segment's mapping, a pool slot) makes a `BorrowedPayload`
    over them with its release armed (`BorrowedPayload.arm(release)`: DONE
    in a frame header, a slot's `.release()`), and hands it here; the value's
    large leaves hold it, and the release runs when the last of them dies.
    """
    return payload.nbytes, codec.decode_borrowed(payload), weakref.ref(payload)


def borrow_claimed(
    view: memoryview, release: Callable[[], object], *, label: str = ""
) -> tuple[int, Any, weakref.ref[BorrowedPayload]]:
    """`borrow_sized` for a claim object that holds its bytes itself (the pool's slot claim).

    `view`: the claimed payload (a read-only memoryview, e.g. ``claim.view``);
    `release`: gives it back (``claim.release``, idempotent). `release()`
    runs once, when the last view made from the decoded value dies: at once
    when the value has no large leaf, and also after a decode that raised.
    """
    import numpy  # the borrowed decode needs it anyway

    keep = numpy.frombuffer(view, numpy.uint8)
    payload = BorrowedPayload(keep, int(keep.ctypes.data), keep.nbytes, label=label)
    del keep
    payload.arm(lambda _keep: release())
    return borrow_sized(payload)


def borrow_pool_ref(
    pool: PoolReader,
    producer: ConnectorIdentity,
    data: bytes,
    cohorts: CohortGates | None = None,
    edge: Edge | None = None,
) -> tuple[int, Any, weakref.ref[BorrowedPayload]]:
    """A borrowed get of a pool reference: the slot's payload decoded in place.

    `spec.pool.process_pool_claim`, then the borrowed decode over the slot
    (`borrow_sized`); the slot is released (DONE) when the last view dies,
    and its carrier ring frame is DONE at once (the carrier's payload is
    the 32-byte reference, which no view holds). A decode that raises undoes
    the claim (PUBLISHED again), as the owned path does.
    """
    import numpy  # the borrowed decode needs it anyway

    claim = pool.claim(producer, data)
    keep = numpy.frombuffer(claim.view, numpy.uint8)
    payload = BorrowedPayload(keep, int(keep.ctypes.data), keep.nbytes, label="pool slot")
    del keep
    try:
        if cohorts is not None and is_borrowed_member(payload):
            size, value = cohorts.borrowed(edge, producer, payload)  # type: ignore[arg-type]
            release = claim.release
            payload.arm(lambda _keep: release())
            return size, value, NOTHING_HELD  # an owned copy: the slot is released with `payload`
        value = codec.decode_borrowed(payload)
    except BaseException:
        payload.disown()
        claim.undo()
        raise
    release = claim.release
    payload.arm(lambda _keep: release())
    return payload.nbytes, value, weakref.ref(payload)


# A borrowed ring get's decoder: `Borrower`'s answer and the route that carried the bytes.
RouteBorrower = Callable[[BorrowedPayload], tuple[int, Any, "weakref.ref[BorrowedPayload]", Route]]


def pool_borrower(
    pool: PoolReader | None,
    producer: ConnectorIdentity,
    cohorts: CohortGates | None = None,
    edge: Edge | None = None,
) -> RouteBorrower:
    """`borrow_sized` for a ring frame that may be a pool reference (then `borrow_pool_ref`).

    A publication cohort's member comes back as an owned copy (`CohortGates.borrowed`).
    """

    def borrow(payload: BorrowedPayload) -> tuple[int, Any, weakref.ref[BorrowedPayload], Route]:
        if pool is not None and payload.nbytes == POOL_REF_LENGTH:
            data = ctypes.string_at(payload.address, payload.nbytes)
            if is_pool_ref(data):
                return (*borrow_pool_ref(pool, producer, data, cohorts, edge), _POOL)
        if cohorts is not None and is_borrowed_member(payload):
            size, value = cohorts.borrowed(edge, producer, payload)  # type: ignore[arg-type]
            return size, value, NOTHING_HELD, _RING
        return (*borrow_sized(payload), _RING)

    return borrow


def live_borrower(
    liveness: Liveness,
    producer: ConnectorIdentity,
    pool: PoolReader | None = None,
    cohorts: CohortGates | None = None,
    edge: Edge | None = None,
) -> RouteBorrower:
    """`pool_borrower` that first asks whether `producer` runs (as `live_decoder`)."""
    is_alive = liveness.is_alive
    borrow_frame = pool_borrower(pool, producer, cohorts, edge)

    def borrow(payload: BorrowedPayload) -> tuple[int, Any, weakref.ref[BorrowedPayload], Route]:
        try:
            alive = is_alive(producer)
        except ResourceExhaustedError:
            alive = True  # as `alive_or_assumed`
        if not alive:
            raise ProducerExited(producer)
        return borrow_frame(payload)

    return borrow


def alive_or_assumed(liveness: Liveness, producer: tuple[int, ...]) -> bool:
    """Liveness, where a shortage counts as alive: a found frame is never lost to a shortage.

    When not even /proc can be read after releasing every cache, the frame
    is delivered: its producer was alive at the scan, and losing an
    accepted frame is the worse failure.
    """
    try:
        return liveness.is_alive(producer)
    except ResourceExhaustedError:
        return True


def live_decoder(
    liveness: Liveness,
    producer: ConnectorIdentity,
    pool: PoolReader | None = None,
    cohorts: CohortGates | None = None,
    edge: Edge | None = None,
) -> Decoder:
    """`decode_sized` that first asks whether `producer` runs (`spec.producers.is_delivering`).

    Called by `RingReader.get` with the frame found and the ring locked; a
    raise leaves the frame deliverable, so a dead producer's frame is
    neither decoded nor claimed. The fallback's `claim_segment` asks at the
    same step (under the segment's lock, before decoding).
    """
    is_alive = liveness.is_alive
    decode_payload = codec.decode if cohorts is None else cohorts.decoder(edge, producer)  # type: ignore[arg-type]

    def decode(view: memoryview) -> tuple[int, Any, Route]:
        try:
            alive = is_alive(producer)
        except ResourceExhaustedError:
            alive = True  # as `alive_or_assumed`
        if not alive:
            raise ProducerExited(producer)
        if pool is not None and is_pool_ref(view):
            size, value = pool.decode_owned(producer, view, decode_payload)
            return size, value, _POOL
        if (
            cohorts is not None and view[0] == _FRAMED and is_member(view)
        ):  # a publication cohort's member
            return view.nbytes, decode_payload(view), _RING
        return view.nbytes, codec.decode(view), _RING

    return decode


class ShedOnShortage:
    """A `PoolReader` whose claims, short of descriptors, shed the connector's caches and retry.

    A slot's first claim opens and maps its file (two descriptors): under a
    low RLIMIT_NOFILE that is where EMFILE shows. Nothing is claimed before
    the mapping exists, so the claim is tried again after `shed` (idle
    rings, kept segment mappings, half the mapped slots, pidfds); when nothing
    is left to release, ResourceExhaustedError (typed) and the carrier frame
    stays deliverable.
    """

    def __init__(self, pool: PoolReader, shed: Callable[[], int]) -> None:
        self._pool = pool
        self._shed = shed

    def claim(self, producer: ConnectorIdentity, data: memoryview | bytes) -> Any:
        return retry_short_of_descriptors(
            "a pool slot mapping", lambda: self._pool.claim(producer, data), self._shed
        )

    def decode_owned(
        self,
        producer: ConnectorIdentity,
        data: memoryview | bytes,
        decode: Callable[[memoryview], Any],
    ) -> tuple[int, Any]:
        return retry_short_of_descriptors(
            "a pool slot mapping",
            lambda: self._pool.decode_owned(producer, data, decode),
            self._shed,
        )

    def __getattr__(self, name: str) -> Any:
        return getattr(self._pool, name)


class RingRoute:
    """The ring route of one connector (see the module docstring). Not thread-safe."""

    route = Route.RING
    _deployment: Deployment | None = None
    _pool: Any = None  # the connector's pool reader, as `ShedOnShortage` (set once joined)
    cohorts: CohortGates | None = None  # producers' publication cohort gates (set once joined)

    @property
    def pool(self) -> PoolReader | None:
        return self._pool  # type: ignore[no-any-return]

    @pool.setter
    def pool(self, reader: PoolReader | None) -> None:
        self._pool = None if reader is None else ShedOnShortage(reader, self._shed)

    def __init__(
        self,
        config: ConnectorConfig,
        identity: ConnectorIdentity,
        os_facade: OsFacade,
        publish_hook: PublishHook | None,
        shed: Callable[[], int],
    ) -> None:
        self._capacity = config.ring_capacity
        self._retry = config.ring_retry_seconds
        self._identity = identity
        self._os = os_facade
        self._publish_hook = publish_hook  # test seam handed to every ring (crash points of a put)
        self._shed = shed  # the connector's `_shed_descriptors`
        # -- producer side
        self.channels: dict[Edge, RingChannel] = {}  # set-up rings; disjoint from `failed`
        self.failed: dict[Edge, BaseException] = {}  # setup failed: the error that disabled it
        # edge -> (monotonic time of the next setup try, failures so far)
        self.retry_at: dict[Edge, tuple[float, int]] = {}
        self.retries = 0  # setups tried again after a failure and its back-off
        self.replaced = 0  # rings re-created because a neighbour unlinked or truncated the file
        self.frames_lost = 0  # unclaimed frames those rings could not hand to their successor
        self._abandoned: list[RingChannel] = []  # rings whose teardown must be retried at close
        # Ring files being set up, named before they exist (issue 24): close removes one
        # whose setup an exception (a signal handler's) stopped before `channels` held it.
        self._setting_up: dict[Edge, str] = {}
        # -- receiver side
        self.readers: dict[tuple[Edge, ConnectorIdentity], RingReader] = {}  # LRU first
        # Per edge, the candidates a get by key visits, in discovery's order;
        # dropped whenever discovery scans or a producer is released.
        self._edge_readers: dict[Edge, list[Candidate]] = {}
        self._sheds = 0  # times `shed` ran (a kept candidate list may be stale)
        # Discovery's producers per edge at the scan `scanned` last saw (its own dict).
        self._known: dict[Edge, set[ConnectorIdentity]] = {}
        # The reader whose `get` runs now: its decode may run short of descriptors
        # and shed (liveness's /proc read, a pool slot's mapping), never this one.
        self._claiming: RingReader | None = None

    def joined(self, deployment: Deployment) -> None:
        self._deployment = deployment
        # The join's own scan (`refresh_at_join`) is what later scans compare
        # with (`scanned`): without it the first stamp move after the join
        # would look like a change of every edge.
        self._known = dict(deployment.discovery.producers)

    # -- producer: prepare / publish / retire ------------------------------------------

    def prepare(self, edge: Edge, start_position: int = 0) -> RingChannel | None:
        """`spec.connector.process_ring_setup`: the edge's ring, set up on first use.

        None when rings are disabled (capacity 0) or the setup failed (until
        its back-off passed).
        """
        ring = self.channels.get(edge)
        if ring is not None:
            return ring
        if self._capacity == 0:
            return None
        if edge in self.failed:
            retry_at = self.retry_at.get(edge)
            if retry_at is None or time.monotonic() < retry_at[0]:
                return None
            del self.failed[edge]  # the back-off passed: try the setup again
            self.retries += 1
        deployment = self._deployment
        assert deployment is not None  # joined
        registrar = deployment.registrar
        if registrar is None:
            self._disable(edge, ShmringError("discovery stamp unavailable"))
            return None
        path = ring_path(deployment.directory.path, edge[0], edge[1], self._identity)
        if edge in self._setting_up:  # an earlier setup an exception stopped: its file is ours
            with contextlib.suppress(OSError):  # a failure shows as the create's EEXIST
                deployment.directory.unlink(os.path.basename(path))
        self._setting_up[edge] = path
        try:
            ring = RingChannel.create(
                path,
                self._capacity,
                os_facade=self._os,
                producer=self._identity,
                publish_hook=self._publish_hook,
                directory=deployment.directory,
                start_position=start_position,
            )
        except (OSError, ShmringError) as error:
            self._setting_up.pop(edge, None)  # create removed what it made
            self._disable(edge, error)
            return None
        try:
            registrar.register(edge)  # the marker comes only after the ring is ready
        except (OSError, ShmringError) as error:
            self._abandon(ring)
            self._setting_up.pop(edge, None)
            self._disable(edge, error)
            return None
        except BaseException:
            self._abandoned.append(ring)  # stopped by the caller's exception: close removes it
            self._setting_up.pop(edge, None)
            raise
        self.channels[edge] = ring
        self._setting_up.pop(edge, None)
        self.retry_at.pop(edge, None)
        return ring

    def replace(self, edge: Edge, ring: RingChannel, problem: str) -> RingChannel | None:
        """Re-create and re-announce the edge's ring whose file a neighbour unlinked or truncated.

        Issue 22, defects 3 and 4: `RingChannel.file_problem` said why. The
        old ring's unclaimed frames move to the new one in order (unlinked:
        `evacuate`); a truncated file's bytes are gone (`discard_shrunk`)
        and its frames count as lost. The marker goes and comes back (two
        stamp bumps), so readers rescan; a reader still holding the old
        mapping sees it CLOSED (or shrunk) and attaches the new file by
        path. Counted in `health().rings_replaced` / `ring_frames_lost`.
        None when the new ring could not be set up: the put falls back.
        """
        del self.channels[edge]
        self.replaced += 1
        head = (
            ring.head
        )  # the new ring continues the positions (no old descriptor names its frames)
        logger.warning("shmring: re-creating the ring of edge %s -> %s: %s", *edge, problem)
        moved: list[tuple[str, bytes, int]] = []
        try:
            moved, lost = ring.evacuate()
            self.frames_lost += lost
        except (OSError, ShmringError) as error:
            logger.warning("shmring: dropping the old ring of %s -> %s: %s", *edge, error)
        deployment = self._deployment
        assert deployment is not None  # joined
        registrar = deployment.registrar
        if registrar is not None:
            with contextlib.suppress(OSError, ShmringError):
                registrar.unregister([edge])
        new = self.prepare(edge, head)
        # A pool slot's carrier moves with its frame: the slot waits for the moved
        # frame (`frame_pending` of the old ring asks the new one), never reused
        # while a reader can still claim the reference (`spec.connector._replace_ring`).
        forwarded: dict[int, tuple[RingProducer, int]] = {}
        for key, payload, old_position in moved:
            outcome = new.put(key, payload) if new is not None else None
            if outcome is None or outcome.status is not PutStatus.PUBLISHED:
                self.frames_lost += 1
            elif outcome.position is not None:
                forwarded[old_position] = (new, outcome.position)
        ring.forwarded = forwarded
        return new

    def _abandon(self, ring: RingChannel) -> None:
        try:
            ring.close()
        except (OSError, ShmringError):
            self._abandoned.append(ring)  # close retries the unlink
            return
        if ring.unlink_pending:
            self._abandoned.append(ring)  # close retries the unlink

    def _disable(self, edge: Edge, error: BaseException) -> None:
        self.failed[edge] = error
        failures = self.retry_at.get(edge, (0.0, 0))[1] + 1
        if self._retry is not None:
            delay = min(self._retry * 2 ** (failures - 1), MAX_RING_RETRY_SECONDS)
            self.retry_at[edge] = (time.monotonic() + delay, failures)
        if failures == 1:
            logger.warning(
                "shmring: ring setup failed for edge %s -> %s; using per-key segments "
                "(retried after a back-off): %s",
                edge[0],
                edge[1],
                error,
            )

    def publish(
        self, ring: RingChannel, key: str, plan: codec.EncodePlan, before_visible: Hook | None
    ) -> int | None:
        """`spec.ring.process_put`: the frame's position, or None (NOT_ADMITTED or FULL).

        `before_visible` runs inside the ring's writer callback, which runs
        only once the ring has decided it has room, before the frame shows.
        """
        whole = plan.whole()
        parts = plan.parts() if whole is None and before_visible is None else None
        if whole is not None and before_visible is None:
            # A plain encoding with nothing to retire: the ring copies the
            # bytes as they are (what the writer below would write).
            outcome = ring.put(key, whole)
        elif parts is not None:
            # A large bytes payload: its header and the bytes, copied as they
            # are (no writer, no kept-view guard: nothing is lent).
            outcome = ring.put_parts(key, parts[0], parts[1])
        else:

            def write(view: memoryview) -> None:
                plan.write_into(view)
                if before_visible is not None:
                    before_visible()

            outcome = ring.put_with_writer(key, plan.nbytes, write)
        if outcome.status is PutStatus.PUBLISHED:
            return outcome.position
        return None

    def retirer(self, ring: RingChannel | None, key: str) -> Hook | None:
        """The hook retiring the key's ring frame (`spec.ring.process_cancel`); None without a ring."""
        return functools.partial(ring.cancel, key) if ring is not None else None

    def retire_key(self, key: str) -> int:
        """`spec.ring.process_cancel` on every edge's ring."""
        return sum(ring.cancel(key) for _, ring in sorted(self.channels.items()))

    def retire_prefix(self, prefix: str) -> int:
        """`spec.ring.process_cancel_prefix` on every edge's ring."""
        return sum(ring.cancel_prefix(prefix) for _, ring in sorted(self.channels.items()))

    def close(self, failures: list[BaseException]) -> int:
        """`spec.ring.process_close` on each of our rings (unlinked); answers what it retired.

        Failures are appended to `failures`; a later call retries them.
        """
        retired = 0
        for edge, ring in sorted(self.channels.items()):
            try:
                retired += ring.close()  # 0 when closed before; retries a failed unlink
                del self.channels[edge]
            except (OSError, ShmringError) as error:
                failures.append(error)
                continue
            if ring.unlink_pending:
                self._abandoned.append(ring)  # its file stays until an unlink succeeds
        deployment = self._deployment
        for edge, path in sorted(self._setting_up.items()):
            # A setup an exception stopped: the file (if it got that far) is ours by its name.
            if deployment is not None and edge not in self.channels:
                try:
                    deployment.directory.unlink(os.path.basename(path))
                except FileNotFoundError:
                    pass
                except OSError as error:
                    failures.append(error)
                    continue
            del self._setting_up[edge]
        self.reap_abandoned(failures)
        return retired

    def reap_abandoned(self, failures: list[BaseException] | None = None) -> int:
        """Retry the teardown of closed rings whose file is still linked; answer how many remain."""
        for ring in list(self._abandoned):
            try:
                ring.close()
            except (OSError, ShmringError) as error:
                if failures is not None:
                    failures.append(error)
                continue
            if not ring.unlink_pending:
                self._abandoned.remove(ring)
        return len(self._abandoned)

    def reap(self) -> int:
        """Retire what busy locks left on our rings (never waits); answer how many frames."""
        return sum(ring.reap() for _, ring in sorted(self.channels.items()))

    def unlink_failures(self) -> int:
        """Failed unlinks of our ring files so far (each kept and retried)."""
        return sum(ring.unlink_failures for ring in (*self.channels.values(), *self._abandoned))

    def deferred_retires(self) -> tuple[int, int]:
        """(ring retires deferred for a busy lock so far, frames still waiting)."""
        done = waiting = 0
        for ring in self.channels.values():
            total, now = ring.deferred_retires
            done += total
            waiting += now
        return done, waiting

    # -- receiver: claim -------------------------------------------------------------------

    def claim_by_key(
        self, edge: Edge, key: str, borrow: bool = False, *, again: bool = True
    ) -> tuple[Delivery | None, bool, ShmringError | None]:
        """The ring half of a get by key: the first live candidate's frame, claimed once.

        `again`: a ring found re-created under its producer's identity is
        looked at once more in the same get (False on that second look).

        `borrow`: the frame is decoded in place and stays CLAIMED while the
        value's large leaves live (`RingReader.get` in LEASE mode, `borrow_sized`).

        Answers (the delivery or None, whether some ring was BUSY, the error
        to raise if nothing else delivers). A damaged ring (CorruptFrameError)
        does not stop the edge's other rings; a shortage of descriptors
        (ResourceExhaustedError) serves the producers that could be mapped.
        """
        deployment = self._deployment
        assert deployment is not None  # joined
        busy = False
        corrupt: CorruptFrameError | None = None
        exhausted: ResourceExhaustedError | None = None
        readers = self.readers
        pairs = self._edge_readers.get(edge)
        cached = pairs is not None
        # Uncached: (producer, None, None) per producer discovery lists, resolved below.
        candidates: list[tuple[ConnectorIdentity, Any, Any]]
        if pairs is None:
            candidates = [
                (producer, None, None) for producer in deployment.discovery.producers_of(edge)
            ]
        else:
            candidates = pairs
        # Uncached: what this pass resolved, kept for later gets when it saw every
        # producer of the edge, none ran short of descriptors and nothing was shed.
        resolved: list[Candidate] = []
        complete = True
        sheds = self._sheds
        last = len(candidates) - 1
        for index, (producer, kept, decode) in enumerate(candidates):
            reader: RingReader | None = kept
            if cached:
                if readers.get((edge, producer)) is not reader:  # dropped under us: resolve afresh
                    self._edge_readers.clear()
                    return self.claim_by_key(edge, key, borrow, again=again)
                assert reader is not None
                # A closed ring delivers nothing (`RingReader.get`); it is
                # released after the miss below, not looked at before each get.
            else:
                try:
                    reader = self._reader(edge, producer)
                except ResourceExhaustedError as error:
                    exhausted = exhausted or error
                    complete = False
                    continue
                if reader is None:
                    continue
                decode = live_decoder(deployment.liveness, producer, self.pool, self.cohorts, edge)
                resolved.append((producer, reader, decode))
            self._claiming = reader
            try:
                if borrow:
                    borrower = live_borrower(
                        deployment.liveness, producer, self.pool, self.cohorts, edge
                    )
                    got = reader.get(key, mode=_LEASE, decode=borrower)
                else:
                    got = reader.get(key, decode=decode)
            except CohortPending:
                continue  # a member of a cohort not committed yet: not there for now
            except CorruptFrameError as error:
                if reader.shrunk is not None:
                    # Truncated by a neighbour (issue 22): unmapped, released, reported; a
                    # ring its producer re-creates is attached afresh at a later get.
                    self._release_closed(edge, producer, reader)
                    if not cached:
                        resolved.pop()
                    corrupt = corrupt or error
                    continue
                if cached and reader.producer_closed:
                    if self._release_closed(edge, producer, reader) and again:
                        return self.claim_by_key(edge, key, borrow, again=False)  # as below
                    continue
                # That producer's channel is damaged; the edge's other channels
                # (and the fallback) keep serving. Reported if nothing else delivers.
                corrupt = corrupt or error
                continue
            except ProducerExited:
                self.release(edge, producer)  # a dead producer's frame is never delivered
                if not cached:
                    resolved.pop()
                continue
            finally:
                self._claiming = None
            if got.status is ReceiveStatus.DELIVERED:
                if cached:  # most recently used last, as `_reader` does (the ring that delivered)
                    # `del` then store: no call in between for a handler to stop (issue 24)
                    if (edge, producer) in readers:
                        del readers[edge, producer]
                    readers[edge, producer] = reader
                if not cached and index == last:
                    self._keep_readers(edge, resolved, complete, sheds)
                if borrow:
                    return _borrowed(got.payload, producer), False, None
                size, value, route = got.payload
                return Delivery(GetStatus.DELIVERED, value, size, route, producer), False, None
            if got.status is ReceiveStatus.BUSY:
                busy = True
            elif reader.producer_closed:
                if self._release_closed(edge, producer, reader) and again:
                    # Re-created under the same identity (a neighbour unlinked the
                    # file, issue 22): its frames moved to the new file, which this
                    # same get looks at, as the model's get does.
                    return self.claim_by_key(edge, key, borrow, again=False)
                if not cached:
                    resolved.pop()
        if not cached:
            self._keep_readers(edge, resolved, complete, sheds)
        return None, busy, corrupt if corrupt is not None else exhausted

    def claim_descriptor(
        self, edge: Edge, key: str, descriptor: RingDescriptor, borrow: bool = False
    ) -> Delivery:
        """The exact frame a ring descriptor names, claimed once (PRODUCER_GONE first)."""
        deployment = self._deployment
        assert deployment is not None  # joined
        producer = descriptor.producer
        if producer not in deployment.discovery.producers.get(
            edge, ()
        ) or not deployment.liveness.is_alive(producer):
            self.release(edge, producer)
            return GONE
        reader = self._reader(edge, producer)
        if reader is None:
            return GONE
        self._claiming = reader
        try:
            if borrow:
                borrower = pool_borrower(self.pool, producer, self.cohorts, edge)
                got = reader.get(key, descriptor.position, mode=_LEASE, decode=borrower)
                if got.status is ReceiveStatus.DELIVERED:
                    return _borrowed(got.payload, producer)
            else:
                decode = pool_decoder(self.pool, producer, self.cohorts, edge)
                got = reader.get(key, descriptor.position, decode=decode)
        except CohortPending:
            return NOT_FOUND  # its cohort is not committed: the descriptor is good later
        except CorruptFrameError:
            if reader.shrunk is not None:
                self._release_closed(edge, producer, reader)  # truncated: attached afresh later
            raise
        finally:
            self._claiming = None
        if got.status is ReceiveStatus.DELIVERED:
            size, value, route = got.payload
            return Delivery(GetStatus.DELIVERED, value, size, route, producer)
        if got.status is ReceiveStatus.BUSY:
            return BUSY
        return STALE

    def _keep_readers(
        self, edge: Edge, resolved: list[Candidate], complete: bool, sheds: int
    ) -> None:
        """Keep the candidates a get by key resolved, for the next gets on the edge.

        Later gets visit this list instead of asking discovery and `_reader`
        per producer; it is dropped whenever discovery scans, a producer is
        released, descriptors are shed or the connector closes. Kept only
        when the pass saw every producer with nothing short or shed.
        """
        if complete and sheds == self._sheds:
            self._edge_readers[edge] = resolved

    def _reader(self, edge: Edge, producer: ConnectorIdentity) -> RingReader | None:
        """The mapped ring of `producer` on `edge`; None (and released) when it is gone."""
        readers = self.readers
        reader = readers.get((edge, producer))
        if reader is not None:
            # Most recently used last; `del` and the store run no call in between,
            # so no signal handler can stop us with the reader out (issue 24).
            del readers[(edge, producer)]
            readers[(edge, producer)] = reader
        if reader is None:
            deployment = self._deployment
            assert deployment is not None  # joined
            directory = deployment.directory
            path = ring_path(directory.path, edge[0], edge[1], producer)
            with deferred_signals():  # a descriptor and a mapping, kept (`lifecycle`)
                try:
                    reader = retry_short_of_descriptors(
                        "a ring mapping",
                        lambda: RingReader.attach(path, os_facade=self._os, directory=directory),
                        self._shed,
                    )
                except ProducerGoneError:
                    self.release(edge, producer)
                    return None
                except CorruptFrameError as error:
                    logger.warning("shmring: ignoring a corrupt ring %s: %s", path, error)
                    self.release(edge, producer)
                    return None
                if (*reader.producer, reader.instance) != producer:
                    named = (*reader.producer, reader.instance)
                    reader.close()
                    logger.warning("shmring: ring %s names producer=%s", path, named)
                    self.release(edge, producer)
                    return None
                self.readers[(edge, producer)] = reader
        elif reader.producer_closed:
            if self._release_closed(edge, producer, reader):
                return self._reader(edge, producer)  # the re-created ring, attached now
            return None
        return reader

    def _release_closed(self, edge: Edge, producer: ConnectorIdentity, reader: RingReader) -> bool:
        """Drop the reader of a ring that closed or shrank; answer whether its producer re-created it.

        A producer that re-created its ring (issue 22: a neighbour unlinked
        or truncated the file) keeps its name and identity, so discovery
        keeps listing it and the slot's pool mappings stay; only this
        mapping goes, and the next get attaches the new file by path.
        """
        if reader.is_replaced():
            self._edge_readers.pop(edge, None)
            if self.readers.get((edge, producer)) is reader:
                del self.readers[(edge, producer)]
            reader.close()
            return True
        self.release(edge, producer)
        return False

    # -- receiver: releasing mapped rings ------------------------------------------------------

    def scanned(self) -> None:
        """After a discovery scan: for the edges whose producers changed, forget the kept
        candidates and unmap the rings of producers discovery no longer lists.

        A get by key visits only the producers discovery still lists, so a
        producer that left would otherwise stay mapped (fd and mapping of a
        deleted file) until this connector closes. Only what changed is
        looked at (issue 25): an edge whose producers the scan found the same
        keeps its candidates, since the scan itself found each of them alive
        (it prunes the markers of dead ones: their edges change). A listed
        producer that closed is released after a miss (`claim_by_key`).
        """
        deployment = self._deployment
        assert deployment is not None  # joined
        known = deployment.discovery.producers
        before, self._known = self._known, known
        changed = {
            edge for edge in before.keys() | known.keys() if before.get(edge) != known.get(edge)
        }
        for edge in changed:
            self._edge_readers.pop(edge, None)
        for edge, producer in [slot for slot in self.readers if slot[0] in changed]:
            if producer not in known.get(edge, ()):
                self.release(edge, producer)

    def release(self, edge: Edge, producer: ConnectorIdentity) -> None:
        """Drop our mapping of a producer that closed or exited (on `edge`; its reader is in
        no other edge's candidates, which stay kept)."""
        self._edge_readers.pop(edge, None)
        reader = self.readers.pop((edge, producer), None)
        if reader is not None:
            reader.close()
        if self.pool is not None:
            self.pool.release_producer(producer)
        if self._deployment is not None:
            self._deployment.discovery.release(edge, producer)

    def shed(self) -> int:
        """Unmap half of the mapped rings (least recently used first); answers how many.

        Never the ring a claim runs on (`_claiming`): its frame is locked and
        mid-decode, and unmapping it would lose the claim.
        """
        self._sheds += 1
        self._edge_readers.clear()  # it holds readers closed below
        idle = [slot for slot, reader in self.readers.items() if reader is not self._claiming]
        count = (len(idle) + 1) // 2
        for slot in idle[:count]:
            self.readers.pop(slot).close()
        return count

    def close_readers(self) -> None:
        """Unmap every ring we read. Idempotent."""
        self._edge_readers.clear()
        for slot in list(self.readers):
            self.readers.pop(slot).close()

    def wake_values(self, edge: Edge) -> list[int]:
        """The wakeup sequences of the rings we read on `edge` (they move when a frame arrives)."""
        values = []
        for (reader_edge, _), reader in self.readers.items():
            if reader_edge == edge:
                with contextlib.suppress(ClosedError, CorruptFrameError):
                    values.append(reader.wakeup_sequence)  # a shrunk ring: its get reports it
        return values


def _borrowed(
    got: tuple[int, Any, weakref.ref[BorrowedPayload], Route], producer: ConnectorIdentity
) -> Delivery:
    """The Delivery of a borrowed get: `lease` is the payload while the value holds it."""
    size, value, payload, route = got
    return Delivery(GetStatus.DELIVERED, value, size, route, producer, lease=payload)


_route_check: type[RouteBackend[RingChannel, RingDescriptor]] = RingRoute
