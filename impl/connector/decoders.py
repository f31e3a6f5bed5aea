"""What a ring get does with the frame it claimed: decode it, owned or borrowed (issue 23).

One decoder and one borrower per (producer, edge), each written once:
`frame_decoder` (owned: `spec.connector._deliver`) and `frame_borrower`
(`spec.borrowing.process_borrowed_get`). Each first asks, when given
`liveness`, whether the frame's producer runs (`spec.producers.is_delivering`:
a dead producer's frame is left unclaimed, `ProducerExited`), then takes the
payload's kind from its first bytes: a pool reference (`spec.connector.
_deliver_pool`: the slot's payload, route POOL), a publication cohort's
member (decoded once its cohort committed, `cohort.CohortPending` before),
or an inline encoding (route RING). A get with a descriptor passes no
liveness: it asked before it looked (`claim_descriptor`).
"""

from __future__ import annotations

import ctypes
import weakref
from collections.abc import Callable
from typing import Any

from ...spec.connector import Route
from ...spec.layout import POOL_REF_LENGTH
from .. import codec
from ..errors import ResourceExhaustedError
from ..liveness import Liveness
from ..names import ConnectorIdentity
from ..pool import PoolReader, is_pool_ref
from ..ring.borrow import BorrowedPayload
from .cohort import NOTHING_HELD, CohortGates, is_borrowed_member
from .edges import Edge
from .shortage import retry_short_of_descriptors

_RING = Route.RING
_POOL = Route.POOL

# A ring payload -> (encoded bytes, value, route): POOL when it was a pool reference.
Decoder = Callable[[memoryview], tuple[int, Any, Route]]
# A borrowed get's decoder: (encoded bytes, value, the payload while a view holds it, route).
Borrower = Callable[[BorrowedPayload], tuple[int, Any, "weakref.ref[BorrowedPayload]", Route]]


class ProducerExited(Exception):
    """Raised by a decoder given liveness: the frame's producer is not running; the frame stays unclaimed."""


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


def frame_decoder(
    pool: PoolReader | None,
    producer: ConnectorIdentity,
    cohorts: CohortGates | None = None,
    edge: Edge | None = None,
    liveness: Liveness | None = None,
) -> Decoder:
    """The owned decode of `producer`'s ring frames on `edge` (see the module docstring).

    `producer` is the ring's: a reference names only a slot of the ring's
    own producer (`PoolReader.claim` validates the rest).
    """
    decode_payload = codec.decode if cohorts is None else cohorts.decoder(edge, producer)  # type: ignore[arg-type]
    is_alive = liveness.is_alive if liveness is not None else None

    def decode(view: memoryview) -> tuple[int, Any, Route]:
        if is_alive is not None:
            try:
                alive = is_alive(producer)
            except ResourceExhaustedError:
                alive = True  # as `alive_or_assumed`
            if not alive:
                raise ProducerExited(producer)
        if pool is not None and is_pool_ref(view):
            size, value = pool.decode_owned(producer, view, decode_payload)
            return size, value, _POOL
        # `decode_payload` is the cohorts' when the edge has them: it opens a
        # member's envelope, and decodes anything else as `codec.decode` does.
        return view.nbytes, decode_payload(view), _RING

    return decode


def borrow_sized(payload: BorrowedPayload) -> tuple[int, Any, weakref.ref[BorrowedPayload]]:
    """Decode a claimed payload in place (`codec.decode_borrowed`), keeping its length.

    THE hook of every borrowed get: whatever holds the bytes (a ring frame,
    a fallback segment's mapping, a pool slot) makes a `BorrowedPayload`
    over them with its release armed (`BorrowedPayload.arm(release)`: DONE
    in a frame header, a slot's `.release()`), and hands it here; the value's
    large leaves hold it, and the release runs when the last of them dies.
    """
    return payload.nbytes, codec.decode_borrowed(payload), weakref.ref(payload)


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


def frame_borrower(
    pool: PoolReader | None,
    producer: ConnectorIdentity,
    cohorts: CohortGates | None = None,
    edge: Edge | None = None,
    liveness: Liveness | None = None,
) -> Borrower:
    """The borrowed decode of `producer`'s ring frames (a pool reference: `borrow_pool_ref`).

    A publication cohort's member comes back as an owned copy (`CohortGates.borrowed`).
    """

    is_alive = liveness.is_alive if liveness is not None else None

    def borrow(payload: BorrowedPayload) -> tuple[int, Any, weakref.ref[BorrowedPayload], Route]:
        if is_alive is not None:
            try:
                alive = is_alive(producer)
            except ResourceExhaustedError:
                alive = True  # as `alive_or_assumed`
            if not alive:
                raise ProducerExited(producer)
        if pool is not None and payload.nbytes == POOL_REF_LENGTH:
            data = ctypes.string_at(payload.address, payload.nbytes)
            if is_pool_ref(data):
                return (*borrow_pool_ref(pool, producer, data, cohorts, edge), _POOL)
        if cohorts is not None and is_borrowed_member(payload):
            size, value = cohorts.borrowed(edge, producer, payload)  # type: ignore[arg-type]
            return size, value, NOTHING_HELD, _RING
        return (*borrow_sized(payload), _RING)

    return borrow


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
