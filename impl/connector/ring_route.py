"""The ring route: our `RingChannel` per edge, and the mapped rings of the producers we read.

Producer side (`spec.connector.process_ring_setup`, `spec.ring.process_put`,
`process_cancel`, `process_close`): one ring per edge this connector
publishes on, set up at the first put on the edge. Setup is file creation,
allocation, mapping *and* the discovery marker; any failure (ENOSPC, EPERM,
a marker or stamp that cannot be written) closes what was made and disables
the ring for that edge, and the fallback carries it. The model remembers a
failed setup for good; here the setup is tried again after a back-off
(`ring_retry_seconds`, doubling per failure; None keeps the model's rule).

Receiver side: `ring_readers.RingReaders`, which this class is (the rings
of the producers we read and the ring claim of a get).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import time
from collections.abc import Callable
from typing import Any

from ...spec.connector import Route
from ...spec.ring import PutStatus
from .. import codec
from ..errors import ShmringError
from ..names import ConnectorIdentity, ring_path
from ..os_seam import OsFacade
from ..pool import PoolReader
from ..ring.engine import RingProducer
from ..ring.producer import PublishHook, RingChannel
from .cohort import CohortGates
from .config import MAX_RING_RETRY_SECONDS, ConnectorConfig
from .decoders import ShedOnShortage
from .descriptors import RingDescriptor
from .edges import Edge
from .joining import Deployment
from .ring_readers import RingReaders
from .routes import Hook, RouteBackend

logger = logging.getLogger("shmring.connector")
_PUBLISHED = PutStatus.PUBLISHED


class RingRoute(RingReaders):
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
        self._init_readers()  # the receiver side (`ring_readers`)

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
    ) -> tuple[PutStatus, int | None]:
        """`spec.ring.process_put`: the ring's answer and the frame's position (None unless PUBLISHED).

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
        return outcome.status, outcome.position

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


_route_check: type[RouteBackend[RingChannel, RingDescriptor]] = RingRoute
