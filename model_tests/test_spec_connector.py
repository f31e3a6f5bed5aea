"""Example tests of `spec.connector`, the model alone: routing, budget, descriptors, counters.

A connector here has 4 KiB rings (admission limit 1024 bytes) and, unless a
test says otherwise, a budget large enough never to refuse. `put(conn, key,
n)` makes a frame (and so a fallback segment) of exactly `n` bytes, with the
payload token given or the key.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest

from shmring.check.explore import compute_payload_length
from shmring.spec import connector as spec
from shmring.spec import invariants
from shmring.spec.connector import (
    ConnectorGetStatus,
    ConnectorPutStatus,
    ConnectorState,
    FallbackDescriptor,
    RingDescriptor,
    Route,
)
from shmring.spec.layout import FRAME_STATE_CLAIMED, FRAME_STATE_RETIRED
from shmring.spec.ring import ConsumeMode, PutStatus

CAPACITY = 4096
OVERSIZE = 1040  # one alignment step past the admission limit
# What a segment of an OVERSIZE frame is charged: its file, header and frame, in pages
CHARGE = 4096
EDGE = ("s0", "s1")
OTHER_EDGE = ("s1", "s2")


def fresh(capacity: int = CAPACITY, budget: int = 1 << 20) -> ConnectorState:
    return spec.initialize_connector(capacity, budget)


def put(
    conn: ConnectorState,
    key: str,
    frame_length: int,
    payload: object = None,
    edge: tuple[str, str] = EDGE,
    setup_ok: bool = True,
) -> spec.ConnectorPutResult:
    result = spec.process_put(
        conn,
        edge,
        key,
        compute_payload_length(key, frame_length),
        key if payload is None else payload,
        setup_ok,
    )
    invariants.check_connector(conn)
    return result


def get(
    conn: ConnectorState,
    key: str,
    descriptor: spec.Descriptor | None = None,
    edge: tuple[str, str] = EDGE,
    mode: ConsumeMode = ConsumeMode.COPY_OUT,
) -> spec.ConnectorGetResult:
    result = spec.process_get(conn, edge, key, descriptor, mode)
    invariants.check_connector(conn)
    return result


# -- configuration ---------------------------------------------------------------------


@pytest.mark.parametrize(("capacity", "budget"), [(1000, 0), (4097, 0), (CAPACITY, -1)])
def test_invalid_configuration_is_rejected(capacity: int, budget: int) -> None:
    with pytest.raises(AssertionError):
        spec.initialize_connector(capacity, budget)


def test_fallback_segment_holds_one_frame_length() -> None:
    assert spec.compute_fallback_length("k", 0) == 48  # align16(32 + 1)
    assert spec.compute_fallback_length("k", 2000) == 2048  # align16(32 + 1 + 2000)


def test_fallback_segment_is_charged_what_its_file_occupies() -> None:
    """Issue 12: a 1 KiB message was charged 1,344 bytes but took a 4 KiB page."""
    assert spec.compute_fallback_charge("k", 0) == 4096  # header + 48 bytes: one page
    assert spec.compute_fallback_charge("k", 1024) == 4096
    assert spec.compute_fallback_charge("k", 4096) == 8192  # 64 + align16(4129) spills over
    assert spec.compute_fallback_charge("k", OVERSIZE) == CHARGE


# -- routing -----------------------------------------------------------------------------


def test_small_frame_goes_to_the_ring() -> None:
    conn = fresh()
    result = put(conn, "k", 256, "v")
    assert result == spec.ConnectorPutResult(
        ConnectorPutStatus.ACCEPTED,
        Route.RING,
        RingDescriptor(EDGE, "k", 0),
        PutStatus.PUBLISHED,
        256,
    )
    assert conn.fallback == {} and conn.fallback_bytes == 0


def test_oversize_frame_goes_to_the_fallback() -> None:
    conn = fresh()
    result = put(conn, "k", OVERSIZE, "v")
    assert result == spec.ConnectorPutResult(
        ConnectorPutStatus.ACCEPTED,
        Route.FALLBACK,
        FallbackDescriptor(EDGE, "k", 1),
        PutStatus.NOT_ADMITTED,
        CHARGE,
    )
    assert conn.fallback_bytes == CHARGE
    assert conn.rings[EDGE].frames == []  # the ring was set up, but took no credit


def test_full_ring_sends_the_frame_to_the_fallback() -> None:
    conn = fresh()
    for key in "abcd":
        assert put(conn, key, 1024).route is Route.RING
    result = put(conn, "e", 1024)
    assert (result.status, result.route, result.ring_status) == (
        ConnectorPutStatus.ACCEPTED,
        Route.FALLBACK,
        PutStatus.FULL,
    )
    assert result.descriptor == FallbackDescriptor(EDGE, "e", 1)


def test_disabled_ring_sends_everything_to_the_fallback() -> None:
    conn = fresh(capacity=0)
    result = put(conn, "k", 256)
    assert (result.route, result.ring_status) == (Route.FALLBACK, None)
    assert conn.rings == {} and conn.failed_edges == set()  # disabled is not failed


def test_setup_failure_sends_the_edge_to_the_fallback() -> None:
    conn = fresh()
    result = put(conn, "k", 256, setup_ok=False)
    assert (result.route, result.ring_status) == (Route.FALLBACK, None)
    assert conn.failed_edges == {EDGE} and EDGE not in conn.rings


def test_setup_failure_is_remembered_once() -> None:
    conn = fresh()
    put(conn, "a", 256, setup_ok=False)
    again = put(conn, "b", 256, setup_ok=True)  # the world would allow it now: not retried
    assert (again.route, again.ring_status) == (Route.FALLBACK, None)
    assert conn.failed_edges == {EDGE} and conn.rings == {}
    other = put(conn, "c", 256, edge=OTHER_EDGE)  # another edge is unaffected
    assert other.route is Route.RING and set(conn.rings) == {OTHER_EDGE}


def test_ring_is_set_up_only_at_the_first_put_on_an_edge() -> None:
    conn = fresh()
    assert spec.process_ring_setup(conn, EDGE, True)
    ring = conn.rings[EDGE]
    assert spec.process_ring_setup(conn, EDGE, False)  # already set up: the world is not asked
    assert conn.rings[EDGE] is ring and conn.failed_edges == set()
    assert not spec.process_ring_setup(fresh(capacity=0), EDGE, True)


# -- budget ---------------------------------------------------------------------------------


def test_budget_back_pressure_refusal_changes_nothing() -> None:
    conn = fresh(budget=CHARGE)
    put(conn, "a", OVERSIZE, "va")  # uses the whole budget
    put(conn, "b", 256)  # on the ring: not charged
    before = copy.deepcopy(conn)
    result = put(conn, "c", OVERSIZE)
    assert result == spec.ConnectorPutResult(
        ConnectorPutStatus.REFUSED, None, None, PutStatus.NOT_ADMITTED, CHARGE
    )
    assert conn.health.refusals == 1
    conn.health.refusals = 0
    assert conn == before
    assert get(conn, "a").payload == "va"


def test_refused_reput_keeps_the_older_version() -> None:
    conn = fresh(budget=CHARGE)
    put(conn, "a", OVERSIZE, "fills")
    put(conn, "k", 256, "older")
    assert put(conn, "k", OVERSIZE, "newer").status is ConnectorPutStatus.REFUSED
    got = get(conn, "k")
    assert (got.route, got.payload) == (Route.RING, "older")


def test_reput_in_the_fallback_is_charged_only_the_difference() -> None:
    conn = fresh(budget=CHARGE)
    assert spec.compute_budget_allows(CHARGE, CHARGE, CHARGE, CHARGE)
    assert not spec.compute_budget_allows(CHARGE, 0, 16, CHARGE)
    put(conn, "k", OVERSIZE, "v1")
    result = put(conn, "k", OVERSIZE, "v2")  # replaces its own segment: fits
    assert result.status is ConnectorPutStatus.ACCEPTED
    assert result.descriptor == FallbackDescriptor(EDGE, "k", 2)
    assert conn.fallback_bytes == CHARGE and len(conn.fallback) == 1


def test_delivered_segment_gives_its_bytes_back_to_the_budget() -> None:
    conn = fresh(budget=CHARGE)
    put(conn, "a", OVERSIZE)
    get(conn, "a")
    assert conn.fallback_bytes == 0
    assert put(conn, "b", OVERSIZE).status is ConnectorPutStatus.ACCEPTED


def test_zero_budget_refuses_every_fallback_put() -> None:
    conn = fresh(budget=0)
    assert put(conn, "k", 256).route is Route.RING
    assert put(conn, "k", OVERSIZE).status is ConnectorPutStatus.REFUSED


# -- versions across routes ------------------------------------------------------------------


def test_reput_from_ring_to_fallback_keeps_only_the_newest() -> None:
    conn = fresh()
    put(conn, "k", 256, "ring")
    result = put(conn, "k", OVERSIZE, "fallback")
    assert result.route is Route.FALLBACK
    assert conn.rings[EDGE].frames[0].state == FRAME_STATE_RETIRED
    assert spec.get_deliverable(conn) == [(EDGE, "k", Route.FALLBACK)]
    assert get(conn, "k").payload == "fallback"
    assert get(conn, "k").status is ConnectorGetStatus.NOT_FOUND


def test_reput_from_fallback_to_ring_keeps_only_the_newest() -> None:
    conn = fresh()
    put(conn, "k", OVERSIZE, "fallback")
    result = put(conn, "k", 256, "ring")
    assert result.route is Route.RING
    assert conn.fallback == {} and conn.fallback_bytes == 0
    assert spec.get_deliverable(conn) == [(EDGE, "k", Route.RING)]
    assert get(conn, "k").payload == "ring"
    assert get(conn, "k").status is ConnectorGetStatus.NOT_FOUND


def test_same_key_on_two_edges_is_two_versions() -> None:
    conn = fresh()
    put(conn, "k", 256, "first edge")
    put(conn, "k", OVERSIZE, "second edge", edge=OTHER_EDGE)
    assert get(conn, "k").payload == "first edge"
    assert get(conn, "k", edge=OTHER_EDGE).payload == "second edge"


# -- gets ------------------------------------------------------------------------------------


def test_get_by_key_finds_either_route() -> None:
    conn = fresh()
    put(conn, "r", 256, "on ring")
    put(conn, "f", OVERSIZE, "in fallback")
    assert get(conn, "f") == spec.ConnectorGetResult(
        ConnectorGetStatus.DELIVERED, Route.FALLBACK, "in fallback"
    )
    assert get(conn, "r") == spec.ConnectorGetResult(
        ConnectorGetStatus.DELIVERED, Route.RING, "on ring"
    )
    assert get(conn, "x") == spec.ConnectorGetResult(ConnectorGetStatus.NOT_FOUND)


def test_ring_descriptor_never_falls_back() -> None:
    conn = fresh()
    ring_put = put(conn, "k", 256, "ring")
    put(conn, "k", OVERSIZE, "fallback")
    assert isinstance(ring_put.descriptor, RingDescriptor)
    assert get(conn, "k", ring_put.descriptor) == spec.ConnectorGetResult(ConnectorGetStatus.STALE)
    assert (EDGE, "k") in conn.fallback  # the fallback version was not touched
    assert get(conn, "k").payload == "fallback"


def test_ring_descriptor_on_an_edge_without_a_ring_is_stale() -> None:
    conn = fresh()
    descriptor = RingDescriptor(OTHER_EDGE, "k", 0)
    assert get(conn, "k", descriptor, edge=OTHER_EDGE).status is ConnectorGetStatus.STALE


def test_fallback_descriptor_reads_only_its_generation() -> None:
    conn = fresh()
    first = put(conn, "k", OVERSIZE, "v1")
    second = put(conn, "k", OVERSIZE, "v2")
    assert first.descriptor == FallbackDescriptor(EDGE, "k", 1)
    assert second.descriptor == FallbackDescriptor(EDGE, "k", 2)
    assert get(conn, "k", first.descriptor).status is ConnectorGetStatus.STALE
    assert get(conn, "k", second.descriptor).payload == "v2"
    assert get(conn, "k", second.descriptor).status is ConnectorGetStatus.STALE


def test_fallback_descriptor_never_reads_the_ring() -> None:
    conn = fresh()
    fallback_put = put(conn, "k", OVERSIZE, "fallback")
    put(conn, "k", 256, "ring")
    assert get(conn, "k", fallback_put.descriptor).status is ConnectorGetStatus.STALE
    assert get(conn, "k").payload == "ring"


def test_lease_get_through_the_connector_is_released_by_position() -> None:
    conn = fresh()
    put(conn, "k", 256)
    got = get(conn, "k", mode=ConsumeMode.LEASE)
    assert got.route is Route.RING
    assert conn.rings[EDGE].frames[0].state == FRAME_STATE_CLAIMED
    spec.process_release(conn, EDGE, 0)
    assert conn.rings[EDGE].frames[0].state != FRAME_STATE_CLAIMED


# -- cleanup and close -------------------------------------------------------------------------


def test_cleanup_retires_the_key_on_every_edge_and_route() -> None:
    conn = fresh()
    put(conn, "k", 256)
    put(conn, "k", OVERSIZE, edge=OTHER_EDGE)
    put(conn, "k1", 256)
    assert spec.process_cleanup(conn, "k") == 2
    assert spec.get_deliverable(conn) == [(EDGE, "k1", Route.RING)]
    assert conn.fallback_bytes == 0
    assert spec.process_cleanup(conn, "k") == 0


def test_cleanup_prefix_counts_digit_suffixed_keys_on_both_routes() -> None:
    conn = fresh()
    put(conn, "req_0_1", 256)
    put(conn, "req_0_2", OVERSIZE)
    put(conn, "req_0_3", 256, edge=OTHER_EDGE)
    put(conn, "req_0_4x", 256)
    put(conn, "req_0_", OVERSIZE)
    put(conn, "request_0_5", 256)
    assert spec.process_cleanup_prefix(conn, "req_0_") == 3
    assert [key for _, key, _ in spec.get_deliverable(conn)] == [
        "req_0_4x",
        "request_0_5",
        "req_0_",
    ]
    assert spec.process_cleanup_prefix(conn, "req_0_") == 0


def test_close_retires_everything_and_is_idempotent() -> None:
    conn = fresh()
    put(conn, "a", 256)
    put(conn, "b", OVERSIZE)
    put(conn, "c", 256, edge=OTHER_EDGE)
    assert spec.process_close(conn) == 3
    assert spec.get_deliverable(conn) == [] and conn.fallback_bytes == 0
    assert all(ring.closed for ring in conn.rings.values())
    assert spec.process_close(conn) == 0
    assert put(conn, "d", 256) == spec.ConnectorPutResult(ConnectorPutStatus.CLOSED)
    assert get(conn, "a") == spec.ConnectorGetResult(ConnectorGetStatus.CLOSED)


# -- health ------------------------------------------------------------------------------------


def test_health_counts_puts_gets_bytes_routes_and_refusals() -> None:
    conn = fresh(budget=CHARGE)
    ring_payload = compute_payload_length("a", 256)
    fallback_payload = compute_payload_length("b", OVERSIZE)
    put(conn, "a", 256)
    put(conn, "b", OVERSIZE)
    put(conn, "c", OVERSIZE)  # refused
    get(conn, "a")
    get(conn, "b")
    get(conn, "nothing")
    h = conn.health
    assert (h.puts, h.ring_puts, h.fallbacks, h.refusals) == (2, 1, 1, 1)
    assert (h.gets, h.ring_gets) == (2, 1)
    assert h.bytes_transferred == 2 * (ring_payload + fallback_payload)


# -- preconditions -------------------------------------------------------------------------------


def _with_versions() -> ConnectorState:
    conn = fresh()
    put(conn, "r", 256)
    put(conn, "f", OVERSIZE)
    return conn


INVALID_CALLS: dict[str, Callable[[ConnectorState], object]] = {
    "negative payload length": lambda c: spec.process_put(c, EDGE, "k", -1, "x"),
    "descriptor of another key": lambda c: spec.process_get(
        c, EDGE, "f", FallbackDescriptor(EDGE, "r", 1)
    ),
    "descriptor of another edge": lambda c: spec.process_get(
        c, EDGE, "r", RingDescriptor(OTHER_EDGE, "r", 0)
    ),
    "release on an edge without a ring": lambda c: spec.process_release(c, OTHER_EDGE, 0),
    "release of an unclaimed frame": lambda c: spec.process_release(c, EDGE, 0),
}


@pytest.mark.parametrize("name", sorted(INVALID_CALLS))
def test_invalid_call_leaves_state_untouched(name: str) -> None:
    conn = _with_versions()
    before = copy.deepcopy(conn)
    with pytest.raises(AssertionError):
        INVALID_CALLS[name](conn)
    assert conn == before
