"""What a connector answers: get statuses, deliveries, health counters.

`GetStatus` is `spec.status.GetStatus`, the one vocabulary of every level
(BUSY: another process held a lock); `ConnectorHealth` is `spec.connector.ConnectorHealth`
plus what only the implementation can count.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Any, Final

from ...spec import status as _status
from ...spec.connector import Route
from ..names import ConnectorIdentity

GetStatus = (
    _status.GetStatus
)  # DELIVERED, NOT_FOUND, STALE, PRODUCER_GONE, BUSY (`spec.status`: one vocabulary)


@dataclass(frozen=True)
class Delivery:
    """The answer to a get. True exactly when something was delivered.

    A borrowed get (`get(..., borrow=True)`): the value's large leaves are
    read-only views of the claimed frame or segment (see `Connector.get`),
    which stays claimed until the last of them dies. `release()` (or leaving
    a ``with`` block) drops this delivery's own reference to the value at
    once; a leaf the caller still holds keeps the frame claimed until it
    dies, so no view ever reads memory the producer reused.
    """

    status: GetStatus
    value: Any = None  # the payload, owned memory; a borrowed get: large leaves borrowed
    size: int = 0  # encoded payload bytes (DELIVERED only)
    route: Route | None = None  # where it came from (DELIVERED only)
    producer: ConnectorIdentity | None = None  # whose frame it was (DELIVERED only)
    # A borrowed get: the claimed payload (a `ring.borrow.BorrowedPayload`) while
    # anything holds it; dead (or None) once it was given back.
    lease: weakref.ref[Any] | None = field(default=None, repr=False, compare=False)

    @property
    def delivered(self) -> bool:
        return self.status is GetStatus.DELIVERED

    @property
    def borrowed(self) -> bool:
        """Whether the value still holds a claimed frame or segment (views of it live)."""
        lease = self.lease
        return lease is not None and lease() is not None

    def release(self) -> bool:
        """Drop this delivery's value now; answers whether nothing borrowed is held any more.

        True: the frame or segment went back (or nothing was borrowed).
        False: a leaf of the value lives elsewhere and keeps it claimed; it
        goes back when the last such view dies. Idempotent.
        """
        object.__setattr__(self, "value", None)
        return not self.borrowed

    def __enter__(self) -> Delivery:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()

    def __bool__(self) -> bool:
        return self.status is GetStatus.DELIVERED


_new = object.__new__
_DELIVERED = GetStatus.DELIVERED


def new_delivery(
    value: Any,
    size: int,
    route: Route,
    producer: ConnectorIdentity | None,
    lease: weakref.ref[Any] | None = None,
) -> Delivery:
    """`Delivery(DELIVERED, value, size, route, producer, lease=lease)`, made once per get.

    The same instance the frozen dataclass's `__init__` makes, without its
    six `object.__setattr__` calls (issue 23's lean path).
    """
    delivery = _new(Delivery)
    delivery.__dict__.update(
        status=_DELIVERED, value=value, size=size, route=route, producer=producer, lease=lease
    )
    return delivery


NOT_FOUND: Final = Delivery(GetStatus.NOT_FOUND)
STALE: Final = Delivery(GetStatus.STALE)
GONE: Final = Delivery(GetStatus.PRODUCER_GONE)
BUSY: Final = Delivery(GetStatus.BUSY)
# A waiting get returns these at once; NOT_FOUND and BUSY are waited out.
FINAL_STATUSES: Final = frozenset((GetStatus.DELIVERED, GetStatus.STALE, GetStatus.PRODUCER_GONE))


@dataclass(frozen=True)
class ConnectorHealth:
    """Counters of one connector; the first seven and `pool_puts` / `pool_gets` / `pool_fallbacks`
    are `spec.connector.ConnectorHealth`'s.

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
    pool_puts: int = 0  # puts carried by a pool slot (their reference frame on the ring)
    pool_gets: int = 0  # gets delivered from a pool slot
    pool_fallbacks: int = 0  # puts the pool could not take (no slot, ring full): per-key segments
    pool_slots: int = 0  # slot files of this producer's pool now
    pool_bytes: int = 0  # their charge (file pages), at most `pool_budget_bytes`
    pool_slots_created: int = 0  # slot files created (none on the steady path)
    pool_slots_reused: int = 0  # pool puts that wrote into an existing slot
    pool_slots_evicted: int = 0  # slot files removed to make room for another class
    pool_create_failures: int = 0  # slot creations the OS refused (ENOSPC, EMFILE, ...)
    pool_mapping_hits: int = 0  # pool claims that found the slot already mapped
    borrowed_gets: int = 0  # gets delivered with borrow=True whose value held the payload
    borrowed_live: int = 0  # of those, still claimed now (their views live)
    borrowed_ring_frames: int = 0  # of the live ones, ring frames: each stops its ring's reclaim
    # Producer calls that met another process's lock past `locks.PRODUCER_LOCK_WAIT_SECONDS`
    # or a failed unlink, and left the rest for later (`reap_consumed()`, issue 27):
    deferred_retires: int = 0  # ring frames and segments whose retire or removal was deferred
    deferred_pending: int = 0  # of those, still waiting now (ring frames + segment files)
    unlink_failures: int = 0  # unlinks of our files that failed (each kept and retried)
    unlink_retries: int = 0  # removals tried again after a deferral
    cohorts_committed: int = 0  # publication cohorts this producer committed
    # A same-uid neighbour unlinked or truncated one of our ring files (issue 22):
    rings_replaced: int = 0  # rings re-created and re-announced (their unclaimed frames moved)
    ring_frames_lost: int = 0  # unclaimed frames not moved (a truncated file's bytes are gone)
