"""Borrowed views and the leases that keep their memory alive.

Read this module to learn when a receiver's borrowed memory goes back. A
receiver that borrows a payload (an arena frame or a per-transfer segment)
holds a *lease*. Every object derived from the borrowed view (`np.asarray`,
a slice, `torch.from_numpy`, a dtype view, a PyAV frame made with
`VideoFrame.from_numpy_buffer`) is a *view* of that lease:

* A lease is live while at least one of its views is. Dropping the parent of
  a view does not end the lease; only the last view does.
* The lease is released exactly once, right when its last view dies: an
  arena frame becomes done (the producer may reclaim it), a segment mapping
  is unmapped. Leases may end in any order; arena reclaim still advances in
  position order (see `ring.process_release` and `ring.process_reclaim`).
* The release of an arena frame is the frame header's state, which lives in
  shared memory: a lease taken in another process is released the same way.
* A lease belongs to the process that borrowed it (its *holder*), and no
  lease outlives its holder: when the holder dies, every view it had died
  with it, so each of its live leases is released then, exactly once
  (`process_holder_exit`). The implementation releases them when the
  producer's reclaim detects the death (the frame header records the
  holder's pid); until then the frame stays claimed. Detection may come
  late (a reused pid looks alive) but never early: a live holder's lease is
  never released for it.

The kind of a view is recorded but does not change the rule: the
implementation must make every kind hold the lease.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

# -- constants ---------------------------------------------------------------

SOURCE_ARENA_FRAME: Final = "arena frame"
SOURCE_SEGMENT: Final = "segment"
# A connector's borrowed ring frame (`spec.borrowing`): the table records no
# position (positions repeat across rings); the borrowing state keeps the frame.
SOURCE_RING_FRAME: Final = "ring frame"
SOURCES: Final = (SOURCE_ARENA_FRAME, SOURCE_SEGMENT, SOURCE_RING_FRAME)

VIEW_ROOT: Final = "root"  # the array the receiver was handed
VIEW_ASARRAY: Final = "np.asarray"
VIEW_SLICE: Final = "slice"
VIEW_RESHAPE: Final = "reshape"
VIEW_TORCH: Final = "torch.from_numpy"
VIEW_DTYPE: Final = "dtype view"  # e.g. .view(torch.bfloat16) of uint16 bits
VIEW_PYAV_FRAME: Final = "VideoFrame.from_numpy_buffer"
DERIVED_VIEW_KINDS: Final = (
    VIEW_ASARRAY,
    VIEW_SLICE,
    VIEW_RESHAPE,
    VIEW_TORCH,
    VIEW_DTYPE,
    VIEW_PYAV_FRAME,
)


# -- state -------------------------------------------------------------------


@dataclass
class Lease:
    """One borrowed payload."""

    lease_id: int  # unique in the table, never reused
    source: str  # one of SOURCES
    position: int | None  # the arena frame's ring position; None for a segment
    holder: int = 0  # the process that borrowed it (0: the table's own process)
    # Ids of the live views; the lease is released exactly when this becomes empty.
    live_views: set[int] = field(default_factory=set)
    released: bool = False  # True from the death of the last view on; never goes back


@dataclass
class View:
    """One live object that keeps a lease alive."""

    view_id: int  # unique in the table, never reused
    lease_id: int  # the lease it holds; that lease is not released while the view lives
    kind: str  # VIEW_ROOT or one of DERIVED_VIEW_KINDS
    parent: int | None  # the view it was derived from (None for the root); may be dead now


@dataclass
class LeaseTable:
    """A receiver's leases (one process, or the union of several)."""

    leases: dict[int, Lease] = field(default_factory=dict)  # every lease ever taken
    views: dict[int, View] = field(default_factory=dict)  # live views only
    next_lease_id: int = 0  # only grows
    next_view_id: int = 0  # only grows
    released_order: list[int] = field(default_factory=list)  # lease ids, in release order


@dataclass(frozen=True)
class DropResult:
    released: bool  # the dropped view was its lease's last: the lease ended now
    lease_id: int
    position: int | None  # the arena position to mark done, when `released` and an arena frame


# -- predicates --------------------------------------------------------------


def is_live_view(table: LeaseTable, view_id: int) -> bool:
    return view_id in table.views


def is_live_lease(table: LeaseTable, lease_id: int) -> bool:
    return lease_id in table.leases and not table.leases[lease_id].released


# -- accessors ---------------------------------------------------------------


def get_live_leases(table: LeaseTable) -> list[Lease]:
    return [lease for lease in table.leases.values() if not lease.released]


def get_live_views(table: LeaseTable, lease_id: int) -> list[int]:
    # Verify the lease exists
    assert lease_id in table.leases
    return sorted(table.leases[lease_id].live_views)


def get_lease_of(table: LeaseTable, view_id: int) -> Lease:
    # Verify the view is live
    assert view_id in table.views
    return table.leases[table.views[view_id].lease_id]


# -- transitions -------------------------------------------------------------


def _add_view(table: LeaseTable, lease: Lease, kind: str, parent: int | None) -> int:
    view_id = table.next_view_id
    table.next_view_id += 1
    table.views[view_id] = View(view_id=view_id, lease_id=lease.lease_id, kind=kind, parent=parent)
    lease.live_views.add(view_id)
    return view_id


def process_borrow(
    table: LeaseTable, source: str, position: int | None, holder: int = 0
) -> tuple[int, int]:
    """Process `holder` borrowed a payload; answers (lease id, root view id)."""
    # Verify the source is known and only arena frames carry a position
    assert source in SOURCES
    assert (position is not None) == (source == SOURCE_ARENA_FRAME)
    # Verify no live lease holds the same arena frame
    assert position is None or all(lease.position != position for lease in get_live_leases(table))
    lease_id = table.next_lease_id
    table.next_lease_id += 1
    lease = Lease(lease_id=lease_id, source=source, position=position, holder=holder)
    table.leases[lease_id] = lease
    view_id = _add_view(table, lease, VIEW_ROOT, None)
    return lease_id, view_id


def process_derive(table: LeaseTable, parent: int, kind: str) -> int:
    """A new object derived from a live view; it holds the same lease."""
    # Verify the parent is live and the kind is a derivation
    assert parent in table.views
    assert kind in DERIVED_VIEW_KINDS
    lease = get_lease_of(table, parent)
    return _add_view(table, lease, kind, parent)


def process_drop(table: LeaseTable, view_id: int) -> DropResult:
    """A view died. If it was its lease's last, the lease is released now."""
    # Verify the view is live
    assert view_id in table.views
    view = table.views.pop(view_id)
    lease = table.leases[view.lease_id]
    lease.live_views.discard(view_id)
    if lease.live_views:
        return DropResult(released=False, lease_id=lease.lease_id, position=None)
    lease.released = True
    table.released_order.append(lease.lease_id)
    return DropResult(released=True, lease_id=lease.lease_id, position=lease.position)


def process_holder_exit(table: LeaseTable, holder: int) -> list[DropResult]:
    """Process `holder` died: its views died with it; answers one release per live lease it held.

    The releases come in lease order (a dead process ends its leases in no
    order of its own). Other holders' leases and views are untouched.
    """
    results = []
    for lease in sorted(get_live_leases(table), key=lambda lease: lease.lease_id):
        if lease.holder != holder:
            continue
        for view_id in sorted(lease.live_views):
            results.append(process_drop(table, view_id))
        # Verify the lease ended with its last view
        assert lease.released
    return [result for result in results if result.released]


__all__ = [
    "DERIVED_VIEW_KINDS",
    "SOURCES",
    "SOURCE_ARENA_FRAME",
    "SOURCE_RING_FRAME",
    "SOURCE_SEGMENT",
    "VIEW_ASARRAY",
    "VIEW_DTYPE",
    "VIEW_PYAV_FRAME",
    "VIEW_RESHAPE",
    "VIEW_ROOT",
    "VIEW_SLICE",
    "VIEW_TORCH",
    "DropResult",
    "Lease",
    "LeaseTable",
    "View",
    "get_lease_of",
    "get_live_leases",
    "get_live_views",
    "is_live_lease",
    "is_live_view",
    "process_borrow",
    "process_derive",
    "process_drop",
    "process_holder_exit",
]
