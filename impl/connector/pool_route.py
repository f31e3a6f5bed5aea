"""The pool route: payloads the ring does not admit, in this producer's pool slots.

`spec.connector.process_put`'s pool step (`_put_pool`): the ring refused
the payload as too large (NOT_ADMITTED) but admits the key's reference
frame (`is_pool_candidate`), so a slot takes the payload (`PoolProducer.
acquire`, the codec's `write_into` straight into the slot: one copy) and
the ring carries the reference (`RingChannel.put_with_writer`, the other
route's retirer inside it, exactly as the ring route does). The ring's
answer decides: PUBLISHED, and the slot waits for its carrier
(`RingProducer.frame_pending`); FULL or CLOSED, and the slot is FREE again
and the per-key fallback carries the put (a *pool fallback*).

The receiver half lives in `ring_route`: a claimed ring frame whose payload
`refs.is_pool_ref` is decoded from its slot (`PoolReader.decode_owned`),
and the delivery's route is POOL. A pool put answers a `RingDescriptor`:
the reference frame is what it names.
"""

from __future__ import annotations

import functools

from ...spec.connector import Route
from ...spec.layout import POOL_REF_LENGTH
from ...spec.ring import PutStatus
from .. import codec
from ..names import ConnectorIdentity
from ..os_seam import OsFacade
from ..pool import PoolProducer, PoolReader, PoolStatistics
from ..ring.producer import RingChannel
from .config import ConnectorConfig
from .joining import Deployment
from .routes import Hook


class PoolRoute:
    """The pool route of one connector (see the module docstring). Not thread-safe."""

    route = Route.POOL
    producer: PoolProducer | None = None  # once joined, when the budget is not 0
    reader: PoolReader | None = None  # once joined

    def __init__(
        self, config: ConnectorConfig, identity: ConnectorIdentity, os_facade: OsFacade
    ) -> None:
        self._config = config
        self._identity = identity
        self._os = os_facade
        self.enabled = config.pool_budget_bytes > 0
        self.puts = 0  # puts the pool carried
        self.fallbacks = 0  # pool candidates the pool could not take

    def joined(self, deployment: Deployment) -> None:
        config = self._config
        if self.enabled:
            self.producer = PoolProducer(
                deployment.directory,
                self._identity,
                self._os,
                min_class=config.pool_min_bytes,
                max_class=config.pool_max_bytes,
                budget=config.pool_budget_bytes,
                checksum=config.pool_checksum,
            )
        self.reader = PoolReader(deployment.directory, self._os)

    def is_candidate(self, ring: RingChannel, key: str, nbytes: int) -> bool:
        """`spec.connector.is_pool_candidate`: too large for the ring, its reference is not."""
        if self.producer is None:
            return False
        key_length = len(key.encode("utf-8"))
        return not ring.admits(key_length, nbytes) and ring.admits(key_length, POOL_REF_LENGTH)

    def publish(
        self, ring: RingChannel, key: str, plan: codec.EncodePlan, before_visible: Hook | None
    ) -> int | None:
        """`spec.connector._put_pool`: the carrier's position, or None (a pool fallback)."""
        producer = self.producer
        assert producer is not None  # `is_candidate` said yes
        nbytes = plan.nbytes
        slot = producer.acquire(nbytes)
        if slot is None:
            self.fallbacks += 1
            return None
        head = ring.head
        try:
            with slot.payload_view(nbytes) as view:
                plan.write_into(view)
            ref = producer.publish(slot, nbytes)

            def write(view: memoryview) -> None:
                view[:] = ref
                if before_visible is not None:
                    before_visible()

            outcome = ring.put_with_writer(key, len(ref), write)
            position = outcome.position
            if outcome.status is PutStatus.PUBLISHED:
                assert position is not None
                producer.carried(slot, functools.partial(ring.frame_pending, position))
        except BaseException:
            # Stopped anywhere (a signal handler's exception, issue 24): a carrier the ring
            # published keeps its slot; only an unpublished one gives the slot back.
            carrier = ring.published_since(key, head)
            if carrier is None:
                producer.abandon(slot)
            else:
                producer.carried(slot, functools.partial(ring.frame_pending, carrier))
            raise
        if outcome.status is not PutStatus.PUBLISHED:
            producer.abandon(slot)
            self.fallbacks += 1
            return None
        self.puts += 1
        return position

    def statistics(self) -> PoolStatistics | None:
        return self.producer.statistics() if self.producer is not None else None

    def close(self) -> int:
        """Unlink our slot files (`spec.pool.process_pool_close`); answers how many."""
        return self.producer.close() if self.producer is not None else 0

    def close_reader(self) -> None:
        if self.reader is not None:
            self.reader.close()
