"""The borrowed-get rule of the model (`spec.borrowing`), example by example."""

from __future__ import annotations

import pytest

from shmring.spec import borrowing, invariants
from shmring.spec import connector as connector_spec
from shmring.spec.connector import ConnectorGetStatus, ConnectorPutStatus, Route
from shmring.spec.layout import FRAME_STATE_CLAIMED, FRAME_STATE_DONE
from shmring.spec.leases import VIEW_SLICE
from shmring.spec.ring import get_frame_at

EDGE = ("a", "b")
CAPACITY = 4096
FRAME = 900  # payload bytes: four frames fill a 4096 ring


def _setup() -> tuple[connector_spec.ConnectorState, borrowing.BorrowState]:
    return connector_spec.initialize_connector(CAPACITY, 1 << 20), borrowing.BorrowState()


def _state(conn: connector_spec.ConnectorState, position: int | None) -> int:
    assert position is not None
    frame = get_frame_at(conn.rings[EDGE], position)
    assert frame is not None
    return frame.state


def test_a_borrowed_ring_frame_stays_claimed_until_its_last_view_dies() -> None:
    conn, borrows = _setup()
    connector_spec.process_put(conn, EDGE, "k", FRAME, "v")
    got = borrowing.process_borrowed_get(conn, borrows, EDGE, "k")
    assert got.result.status is ConnectorGetStatus.DELIVERED and got.result.payload == "v"
    assert _state(conn, got.position) == FRAME_STATE_CLAIMED
    assert borrowing.get_claimed_frames(borrows, EDGE) == [got.position]
    assert got.view_id is not None
    kept = borrowing.process_borrowed_derive(borrows, got.view_id, VIEW_SLICE)
    assert not borrowing.process_borrowed_release(conn, borrows, got.view_id)
    assert _state(conn, got.position) == FRAME_STATE_CLAIMED  # the kept slice holds it
    invariants.check_borrows(conn, borrows)
    assert borrowing.process_borrowed_drop(conn, borrows, kept)
    assert _state(conn, got.position) == FRAME_STATE_DONE
    assert borrowing.get_live_borrows(borrows) == 0
    invariants.check_borrows(conn, borrows)


def test_a_claimed_frame_stops_reclaim_and_the_ring_fills_behind_it() -> None:
    conn, borrows = _setup()
    connector_spec.process_put(conn, EDGE, "held", FRAME, "h")
    held = borrowing.process_borrowed_get(conn, borrows, EDGE, "held")
    routes = []
    for index in range(6):
        put = connector_spec.process_put(conn, EDGE, f"k{index}", FRAME, index)
        assert put.status is ConnectorPutStatus.ACCEPTED
        routes.append(put.route)
        connector_spec.process_get(conn, EDGE, f"k{index}")  # consumed at once
    assert Route.FALLBACK in routes
    assert conn.rings[EDGE].tail == 0  # nothing reclaimed past the claimed frame
    assert held.view_id is not None
    borrowing.process_borrowed_release(conn, borrows, held.view_id)
    assert connector_spec.process_put(conn, EDGE, "after", FRAME, "x").route is Route.RING
    assert conn.rings[EDGE].tail > 0


def test_a_value_without_large_leaves_ends_its_lease_at_the_get() -> None:
    conn, borrows = _setup()
    connector_spec.process_put(conn, EDGE, "k", FRAME, "v")
    got = borrowing.process_borrowed_get(conn, borrows, EDGE, "k", held=False)
    assert got.view_id is None and _state(conn, got.position) == FRAME_STATE_DONE
    invariants.check_borrows(conn, borrows)


def test_a_borrowed_segment_holds_no_frame() -> None:
    conn, borrows = _setup()
    connector_spec.process_put(conn, EDGE, "big", 5000, "s")  # not admitted: the fallback
    got = borrowing.process_borrowed_get(conn, borrows, EDGE, "big")
    assert got.result.route is Route.FALLBACK and got.position is None
    assert (EDGE, "big") not in conn.fallback  # consumed at the claim, as always
    assert borrowing.get_live_borrows(borrows) == 1 and not borrows.frames


def test_a_dead_holder_gives_back_every_frame_it_held() -> None:
    conn, borrows = _setup()
    for key in ("k0", "k1"):
        connector_spec.process_put(conn, EDGE, key, FRAME, key)
    mine = borrowing.process_borrowed_get(conn, borrows, EDGE, "k0", holder=7)
    other = borrowing.process_borrowed_get(conn, borrows, EDGE, "k1", holder=8)
    assert borrowing.process_borrower_exit(conn, borrows, 7) == 1
    assert _state(conn, mine.position) == FRAME_STATE_DONE
    assert _state(conn, other.position) == FRAME_STATE_CLAIMED
    invariants.check_borrows(conn, borrows)


def test_the_invariant_catches_a_claimed_frame_nobody_borrowed() -> None:
    conn, borrows = _setup()
    connector_spec.process_put(conn, EDGE, "k", FRAME, "v")
    got = borrowing.process_borrowed_get(conn, borrows, EDGE, "k")
    borrows.frames.clear()  # the state forgets the lease's frame
    with pytest.raises(AssertionError):
        invariants.check_borrows(conn, borrows)
    assert got.position is not None
