"""Borrowed gets: a connector get whose value borrows the claimed payload.

Read with `spec.connector` (the get) and `spec.leases` (the lease). A get
with ``borrow=True`` claims exactly what an owned get claims
(`connector.process_get`), with one difference for a ring frame: it is
claimed in lease mode, so it stays CLAIMED instead of becoming DONE, and
while CLAIMED it stops its ring's reclaim (`ring.process_reclaim` stops at
the first published or claimed frame): the producer's puts meet a full
ring behind it and take the fallback. The frame becomes DONE exactly when
the lease ends (`ring.process_release`), and the lease ends:

* when its last view dies (`leases.process_drop`); the value the get
  answered is its root view, every leaf a caller keeps is a derived one;
* at an eager release (``Delivery.release()``), which drops the root view
  only: a derived view the caller still holds keeps the frame CLAIMED, so
  no view ever reads bytes the producer reused;
* when its holder dies (`leases.process_holder_exit`); the implementation
  notices at the producer's next put that finds the ring full, never
  before the holder is gone.

A fallback segment is consumed at the claim as always (its name goes, its
budget charge with it); its lease holds only the receiver's mapping and
changes nothing the producer sees. A value without large leaves holds
nothing: its lease ends at the get (``held=False``), and the frame is DONE
as after an owned get. Nothing here depends on what the leaves are; that
is the implementation's business (`impl.codec.decode_borrowed`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from . import ring as ring_spec
from .connector import (
    ConnectorGetResult,
    ConnectorGetStatus,
    ConnectorState,
    Descriptor,
    Edge,
    RingDescriptor,
    Route,
    process_get,
)
from .leases import (
    SOURCE_RING_FRAME,
    SOURCE_SEGMENT,
    DropResult,
    LeaseTable,
    get_live_leases,
    process_borrow,
    process_derive,
    process_drop,
    process_holder_exit,
)
from .ring import ConsumeMode, get_deliverable_frame

# -- state -------------------------------------------------------------------


@dataclass
class BorrowState:
    """One receiver's borrowed gets."""

    table: LeaseTable = field(default_factory=LeaseTable)  # their leases and live views
    # Lease id -> (edge, position) of the ring frame it keeps CLAIMED; only live
    # ring-frame leases are here (a segment's lease holds no frame).
    frames: dict[int, tuple[Edge, int]] = field(default_factory=dict)


@dataclass(frozen=True)
class BorrowedGetResult:
    result: ConnectorGetResult  # what `connector.process_get` answered
    lease_id: int | None = None  # the lease taken (DELIVERED only)
    view_id: int | None = None  # its root view (the value), while held; None: ended at the get
    position: int | None = None  # the ring frame claimed, for a ring delivery


# -- accessors ---------------------------------------------------------------


def get_claimed_frames(borrows: BorrowState, edge: Edge) -> list[int]:
    """Positions of the ring frames on `edge` that live borrowed leases keep CLAIMED."""
    return sorted(
        position for frame_edge, position in borrows.frames.values() if frame_edge == edge
    )


def get_live_borrows(borrows: BorrowState) -> int:
    """Live borrowed leases (the implementation's `health().borrowed_live`)."""
    return len(get_live_leases(borrows.table))


# -- transitions -------------------------------------------------------------


def _ring_position(
    conn: ConnectorState, edge: Edge, key: str, descriptor: Descriptor | None
) -> int | None:
    """The ring frame a get would claim, if it comes from a ring."""
    if isinstance(descriptor, RingDescriptor):
        return descriptor.position
    ring = conn.rings.get(edge)
    frame = get_deliverable_frame(ring, key) if ring is not None and descriptor is None else None
    return frame.position if frame is not None else None


def _end(conn: ConnectorState, borrows: BorrowState, drop: DropResult) -> None:
    """A lease that ended gives its ring frame back (CLAIMED -> DONE)."""
    if not drop.released:
        return
    frame = borrows.frames.pop(drop.lease_id, None)
    if frame is None:
        return  # a segment's lease
    edge, position = frame
    ring_spec.process_release(conn.rings[edge], position)


def process_borrowed_get(
    conn: ConnectorState,
    borrows: BorrowState,
    edge: Edge,
    key: str,
    descriptor: Descriptor | None = None,
    holder: int = 0,
    held: bool = True,
) -> BorrowedGetResult:
    """`connector.process_get` with ``borrow=True``; `held`: the value has a large leaf."""
    # Verify a descriptor names the same edge and key it is used with
    assert descriptor is None or (descriptor.edge == edge and descriptor.key == key)
    position = _ring_position(conn, edge, key, descriptor)
    result = process_get(conn, edge, key, descriptor, ConsumeMode.LEASE)
    if result.status is not ConnectorGetStatus.DELIVERED:
        return BorrowedGetResult(result)
    if result.route is Route.RING:
        assert position is not None
        lease_id, view_id = process_borrow(borrows.table, SOURCE_RING_FRAME, None, holder)
        borrows.frames[lease_id] = (edge, position)
    else:
        position = None
        lease_id, view_id = process_borrow(borrows.table, SOURCE_SEGMENT, None, holder)
    if not held:
        _end(conn, borrows, process_drop(borrows.table, view_id))
        return BorrowedGetResult(result, lease_id, None, position)
    return BorrowedGetResult(result, lease_id, view_id, position)


def process_borrowed_derive(borrows: BorrowState, view_id: int, kind: str) -> int:
    """The caller keeps a leaf (or any object made from one): a view of the same lease."""
    # Verify the parent view is live (and the kind a derivation: `leases.process_derive`)
    assert view_id in borrows.table.views
    return process_derive(borrows.table, view_id, kind)


def process_borrowed_drop(conn: ConnectorState, borrows: BorrowState, view_id: int) -> bool:
    """A view died (the value or a kept leaf); answers whether its lease ended now."""
    # Verify the view is live
    assert view_id in borrows.table.views
    drop = process_drop(borrows.table, view_id)
    _end(conn, borrows, drop)
    return drop.released


def process_borrowed_release(conn: ConnectorState, borrows: BorrowState, root_view: int) -> bool:
    """``Delivery.release()``: the delivery's value (its root view) goes now.

    Answers whether the lease ended: False while a view derived from the
    value lives; that view keeps the frame CLAIMED until it dies.
    """
    # Verify the root view is live and is a root
    assert root_view in borrows.table.views
    assert borrows.table.views[root_view].parent is None
    return process_borrowed_drop(conn, borrows, root_view)


def process_borrower_exit(conn: ConnectorState, borrows: BorrowState, holder: int) -> int:
    """The holder died with its views: every live lease it held ends; answers how many."""
    drops = process_holder_exit(borrows.table, holder)
    for drop in drops:
        _end(conn, borrows, drop)
    return len(drops)


__all__ = [
    "BorrowState",
    "BorrowedGetResult",
    "get_claimed_frames",
    "get_live_borrows",
    "process_borrowed_derive",
    "process_borrowed_drop",
    "process_borrowed_get",
    "process_borrowed_release",
    "process_borrower_exit",
]
