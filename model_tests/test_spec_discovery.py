"""Example tests of `spec.producers` and `spec.discovery`, the model alone.

A deployment here has 4 KiB rings and a large fallback budget. Producers are
(pid, start time) pairs; P1 and P1_AGAIN share a pid (the second reuses the
first's after it died). Every helper call checks the deployment invariants
and the stamp rule across the step, so each test also exercises them.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest

from shmring.check.explore import compute_payload_length
from shmring.spec import discovery as spec
from shmring.spec import invariants
from shmring.spec import producers as producers_spec
from shmring.spec.connector import FallbackDescriptor, RingDescriptor, Route
from shmring.spec.discovery import DeploymentGetStatus, DeploymentState, PublishedDescriptor

CAPACITY = 4096
OVERSIZE = 1040
EDGE = ("s0", "s1")
OTHER_EDGE = ("s1", "s2")
P1 = (100, 1)
P1_AGAIN = (100, 2)  # pid 100 reused by a later process
P2 = (200, 1)
P3 = (300, 1)


def fresh(capacity: int = CAPACITY) -> DeploymentState:
    return spec.initialize_deployment(capacity, 1 << 20)


def step(dep: DeploymentState, action: Callable[[], object]) -> object:
    """Apply one transition and check the invariants and the stamp rule across it."""
    before = copy.deepcopy(dep.directory)
    result = action()
    invariants.check_stamp_step(before, dep.directory)
    invariants.check_deployment(dep)
    return result


def start(dep: DeploymentState, identity: tuple[int, int]) -> None:
    step(dep, lambda: spec.process_start_producer(dep, identity))


def put(
    dep: DeploymentState,
    identity: tuple[int, int],
    key: str,
    frame_length: int = 256,
    payload: object = None,
    edge: tuple[str, str] = EDGE,
    setup_ok: bool = True,
) -> PublishedDescriptor | None:
    def action() -> PublishedDescriptor | None:
        _, published = spec.process_put(
            dep,
            identity,
            edge,
            key,
            compute_payload_length(key, frame_length),
            (identity, key) if payload is None else payload,
            setup_ok,
        )
        return published

    return step(dep, action)  # type: ignore[return-value]


def get(
    dep: DeploymentState,
    key: str,
    published: PublishedDescriptor | None = None,
    receiver: str = "r",
    edge: tuple[str, str] = EDGE,
) -> spec.DeploymentGetResult:
    return step(dep, lambda: spec.process_get(dep, receiver, edge, key, published))  # type: ignore[return-value]


def refresh(dep: DeploymentState, receiver: str = "r") -> bool:
    return step(dep, lambda: spec.process_refresh(dep, receiver))  # type: ignore[return-value]


def kill(dep: DeploymentState, identity: tuple[int, int]) -> None:
    step(dep, lambda: spec.process_exit(dep, identity))


def close(dep: DeploymentState, identity: tuple[int, int]) -> int:
    return step(dep, lambda: spec.process_close(dep, identity))  # type: ignore[return-value]


# -- identity ----------------------------------------------------------------------------------


def test_identity_is_pid_and_start_time() -> None:
    assert producers_spec.is_same_process(P1, (100, 1))
    assert not producers_spec.is_same_process(P1, P1_AGAIN)
    assert producers_spec.is_pid_reuse(P1, P1_AGAIN)
    assert not producers_spec.is_pid_reuse(P1, P2)
    assert not producers_spec.is_pid_reuse(P1, P1)


def test_exit_and_close_both_stop_delivery_but_only_close_retires() -> None:
    killed = producers_spec.initialize_producer(P1, CAPACITY, 1 << 20)
    closed = producers_spec.initialize_producer(P2, CAPACITY, 1 << 20)
    for producer in (killed, closed):
        assert producers_spec.is_delivering(producer)
    producers_spec.process_producer_exit(killed)
    assert (killed.alive, killed.closed, killed.connector.closed) == (False, False, False)
    assert producers_spec.process_producer_close(closed) == 0
    assert (closed.alive, closed.closed, closed.connector.closed) == (False, True, True)
    assert not producers_spec.is_delivering(killed) and not producers_spec.is_delivering(closed)


# -- markers and the stamp ----------------------------------------------------------------------


def test_marker_appears_only_after_ring_ready() -> None:
    dep = fresh()
    start(dep, P1)
    assert dep.directory.markers == set() and dep.directory.stamp == 0
    put(dep, P1, "a", setup_ok=False)  # setup failed: fallback, no ring, no marker
    assert dep.directory.markers == set() and dep.directory.stamp == 0
    put(dep, P1, "b", edge=OTHER_EDGE)
    assert dep.directory.markers == {(P1, OTHER_EDGE)} and dep.directory.stamp == 1
    assert OTHER_EDGE in dep.producers[P1].connector.rings


def test_disabled_rings_never_register_markers() -> None:
    dep = fresh(capacity=0)
    start(dep, P1)
    put(dep, P1, "a")
    assert dep.directory.markers == set() and dep.directory.stamp == 0


def test_first_put_on_an_edge_registers_its_marker_even_when_the_frame_goes_to_the_fallback() -> (
    None
):
    dep = fresh()
    start(dep, P1)
    published = put(dep, P1, "k", OVERSIZE)
    assert published is not None and isinstance(published.descriptor, FallbackDescriptor)
    assert dep.directory.markers == {(P1, EDGE)} and dep.directory.stamp == 1


def test_stamp_strictly_increases_on_every_marker_change() -> None:
    dep = fresh()
    stamps = [dep.directory.stamp]
    start(dep, P1)
    start(dep, P2)
    for identity, edge in ((P1, EDGE), (P1, OTHER_EDGE), (P2, EDGE)):
        put(dep, identity, "k", edge=edge)
        stamps.append(dep.directory.stamp)
    close(dep, P1)  # removes both of P1's markers: one change
    stamps.append(dep.directory.stamp)
    kill(dep, P2)  # no marker change yet
    assert dep.directory.stamp == stamps[-1]
    refresh(dep)  # the scan prunes P2's stale marker
    stamps.append(dep.directory.stamp)
    assert stamps == [0, 1, 2, 3, 4, 5]
    assert dep.directory.markers == set()


def test_puts_that_change_no_marker_leave_the_stamp() -> None:
    dep = fresh()
    start(dep, P1)
    put(dep, P1, "a")
    put(dep, P1, "b")
    put(dep, P1, "c", OVERSIZE)
    assert dep.directory.stamp == 1


def test_close_removes_markers_and_answers_how_many_it_retired() -> None:
    dep = fresh()
    start(dep, P1)
    put(dep, P1, "a")
    put(dep, P1, "b", OVERSIZE, edge=OTHER_EDGE)
    put(dep, P1, "c")
    get(dep, "c")
    assert close(dep, P1) == 2
    assert dep.directory.markers == set()


def test_close_of_a_producer_without_markers_leaves_the_stamp() -> None:
    dep = fresh()
    start(dep, P1)
    put(dep, P1, "a", setup_ok=False)
    assert close(dep, P1) == 1
    assert dep.directory.stamp == 0


# -- the receiver's cache ------------------------------------------------------------------------


def test_receiver_rescans_only_when_stamp_moved() -> None:
    dep = fresh()
    start(dep, P1)
    assert refresh(dep)  # never scanned: scans
    assert not refresh(dep)
    put(dep, P1, "a")  # marker: the stamp moves
    assert refresh(dep)
    assert not refresh(dep)
    put(dep, P1, "b")  # no marker change
    assert not refresh(dep)
    get(dep, "a")
    get(dep, "b")
    get(dep, "nothing")
    receiver = dep.receivers["r"]
    assert (receiver.scans, receiver.seen_stamp) == (2, 1)


def test_new_producer_is_discovered() -> None:
    dep = fresh()
    start(dep, P1)
    put(dep, P1, "a")
    assert get(dep, "a").producer == P1  # the receiver cached the stamp
    start(dep, P2)
    put(dep, P2, "b")
    got = get(dep, "b")
    assert (got.status, got.producer, got.route) == (DeploymentGetStatus.DELIVERED, P2, Route.RING)


def test_all_producers_of_an_edge_are_found() -> None:
    dep = fresh()
    for identity in (P1, P2, P3):
        start(dep, identity)
        put(dep, identity, f"k{identity[0]}")
    put(dep, P1, "x", edge=OTHER_EDGE)
    refresh(dep)
    assert dep.receivers["r"].attached == {EDGE: {P1, P2, P3}, OTHER_EDGE: {P1}}
    assert spec.get_live_producers(dep, EDGE) == [P1, P2, P3]
    for identity in (P1, P2, P3):
        assert get(dep, f"k{identity[0]}").producer == identity


def test_producer_registering_after_the_scan_is_picked_up_by_the_next_get() -> None:
    dep = fresh()
    start(dep, P1)
    put(dep, P1, "a")
    refresh(dep)
    start(dep, P2)
    put(dep, P2, "a")  # a second producer of the same key on the edge
    refresh(dep)
    assert dep.receivers["r"].attached[EDGE] == {P1, P2}
    candidates = spec.get_candidates(dep, dep.receivers["r"], EDGE, "a")
    assert candidates == [(P1, Route.RING), (P2, Route.RING)]


# -- dead producers ---------------------------------------------------------------------------


@pytest.mark.parametrize("frame_length", [256, OVERSIZE], ids=["ring", "fallback"])
def test_dead_producers_frame_is_never_delivered(frame_length: int) -> None:
    dep = fresh()
    start(dep, P1)
    published = put(dep, P1, "k", frame_length)
    refresh(dep)
    kill(dep, P1)
    assert get(dep, "k") == spec.DeploymentGetResult(DeploymentGetStatus.NOT_FOUND)
    assert get(dep, "k", published) == spec.DeploymentGetResult(DeploymentGetStatus.PRODUCER_GONE)
    # Its version is still in its connector: only the liveness rule keeps it from a receiver.
    assert producers_spec.is_delivering(dep.producers[P1]) is False
    assert dep.producers[P1].connector.fallback or dep.producers[P1].connector.rings[EDGE].frames


@pytest.mark.parametrize("frame_length", [256, OVERSIZE], ids=["ring", "fallback"])
def test_dead_producers_frame_never_delivered_under_reused_key(frame_length: int) -> None:
    dep = fresh()
    start(dep, P1)
    old = put(dep, P1, "k", frame_length, "old")
    kill(dep, P1)
    start(dep, P2)
    new = put(dep, P2, "k", frame_length, "new")
    assert get(dep, "k", old) == spec.DeploymentGetResult(DeploymentGetStatus.PRODUCER_GONE)
    got = get(dep, "k")
    assert (got.status, got.producer, got.payload) == (DeploymentGetStatus.DELIVERED, P2, "new")
    assert get(dep, "k").status is DeploymentGetStatus.NOT_FOUND
    assert get(dep, "k", new).status is DeploymentGetStatus.STALE


@pytest.mark.parametrize("frame_length", [256, OVERSIZE], ids=["ring", "fallback"])
def test_dead_producers_frame_never_delivered_under_reused_pid(frame_length: int) -> None:
    dep = fresh()
    start(dep, P1)
    old = put(dep, P1, "k", frame_length, "old")
    assert old is not None
    kill(dep, P1)
    start(dep, P1_AGAIN)
    new = put(dep, P1_AGAIN, "k", frame_length, "new")
    assert new is not None
    # The new process's version sits at the very place the old descriptor names
    # (same edge, key, and position or generation): only the identity tells them apart.
    assert new.descriptor == old.descriptor and new.producer != old.producer
    assert get(dep, "k", old) == spec.DeploymentGetResult(DeploymentGetStatus.PRODUCER_GONE)
    got = get(dep, "k", new)
    assert (got.status, got.producer, got.payload) == (
        DeploymentGetStatus.DELIVERED,
        P1_AGAIN,
        "new",
    )
    assert get(dep, "k").status is DeploymentGetStatus.NOT_FOUND


def test_closed_producers_descriptor_answers_producer_gone() -> None:
    dep = fresh()
    start(dep, P1)
    published = put(dep, P1, "k")
    close(dep, P1)
    assert get(dep, "k", published).status is DeploymentGetStatus.PRODUCER_GONE
    assert get(dep, "k").status is DeploymentGetStatus.NOT_FOUND


def test_descriptor_of_a_producer_never_started_answers_producer_gone() -> None:
    dep = fresh()
    unknown = PublishedDescriptor(P3, RingDescriptor(EDGE, "k", 0))
    assert get(dep, "k", unknown).status is DeploymentGetStatus.PRODUCER_GONE


def test_live_producers_descriptor_reads_its_exact_version() -> None:
    dep = fresh()
    start(dep, P1)
    first = put(dep, P1, "k", payload="v1")
    second = put(dep, P1, "k", OVERSIZE, payload="v2")
    assert get(dep, "k", first).status is DeploymentGetStatus.STALE
    got = get(dep, "k", second)
    assert (got.status, got.producer, got.route, got.payload) == (
        DeploymentGetStatus.DELIVERED,
        P1,
        Route.FALLBACK,
        "v2",
    )


def test_stale_markers_are_pruned_by_a_scan() -> None:
    dep = fresh()
    for identity in (P1, P2):
        start(dep, identity)
        put(dep, identity, "k")
    refresh(dep)
    kill(dep, P1)
    assert (P1, EDGE) in dep.directory.markers and spec.is_marker_stale(dep, P1)
    assert not refresh(dep)  # the stamp did not move: no scan, no pruning
    assert (P1, EDGE) in dep.directory.markers
    assert refresh(dep, receiver="newcomer")  # a scan prunes
    assert dep.directory.markers == {(P2, EDGE)} and dep.directory.stamp == 3
    assert dep.receivers["newcomer"].seen_stamp == 3  # cached after its own pruning
    assert refresh(dep)  # the stamp moved for the first receiver too


def test_cached_channels_released_on_exit_and_close() -> None:
    dep = fresh()
    for identity in (P1, P2):
        start(dep, identity)
        put(dep, identity, "k")
    refresh(dep)
    assert dep.receivers["r"].attached == {EDGE: {P1, P2}}
    kill(dep, P1)
    assert not refresh(dep)  # released without a scan
    assert dep.receivers["r"].attached == {EDGE: {P2}}
    close(dep, P2)
    assert refresh(dep)
    assert dep.receivers["r"].attached == {}


# -- preconditions ------------------------------------------------------------------------------


def _deployment() -> DeploymentState:
    dep = fresh()
    start(dep, P1)
    start(dep, P2)
    put(dep, P1, "k")
    kill(dep, P2)
    return dep


INVALID_CALLS: dict[str, Callable[[DeploymentState], object]] = {
    "start a used identity": lambda d: spec.process_start_producer(d, P1),
    "put by a dead producer": lambda d: spec.process_put(d, P2, EDGE, "k", 1, "x"),
    "put by an unknown producer": lambda d: spec.process_put(d, P3, EDGE, "k", 1, "x"),
    "kill a dead producer": lambda d: spec.process_exit(d, P2),
    "close a dead producer": lambda d: spec.process_close(d, P2),
    "descriptor of another key": lambda d: spec.process_get(
        d, "r", EDGE, "other", PublishedDescriptor(P1, RingDescriptor(EDGE, "k", 0))
    ),
}


@pytest.mark.parametrize("name", sorted(INVALID_CALLS))
def test_invalid_call_leaves_state_untouched(name: str) -> None:
    dep = _deployment()
    before = copy.deepcopy(dep)
    with pytest.raises(AssertionError):
        INVALID_CALLS[name](dep)
    assert dep == before


# -- several producers in one process (issue 10) -------------------------------------------

A0, A1 = (400, 7, 0), (400, 7, 1)  # two connectors of one process
B0 = (500, 7, 0)


def test_two_producers_of_one_process_share_an_edge_and_close_independently() -> None:
    dep = fresh()
    for identity in (A0, A1, B0):
        start(dep, identity)
    assert producers_spec.is_same_process(A0, A1) and not producers_spec.is_same_process(A0, B0)
    first, second = put(dep, A0, "a"), put(dep, A1, "b")
    assert first is not None and second is not None
    assert {(A0, EDGE), (A1, EDGE)} <= dep.directory.markers
    assert close(dep, A0) == 1  # retires its own frame only
    assert get(dep, "a").status is DeploymentGetStatus.NOT_FOUND
    assert get(dep, "b").producer == A1


def test_killing_a_process_kills_every_producer_in_it() -> None:
    dep = fresh()
    for identity in (A0, A1, B0):
        start(dep, identity)
    published = [put(dep, identity, f"k{i}") for i, identity in enumerate((A0, A1, B0))]
    gone = step(dep, lambda: spec.process_exit_process(dep, (400, 7)))
    assert gone == [A0, A1]
    for index, descriptor in enumerate(published[:2]):
        assert get(dep, f"k{index}").status is DeploymentGetStatus.NOT_FOUND
        assert get(dep, f"k{index}", descriptor).status is DeploymentGetStatus.PRODUCER_GONE
    assert get(dep, "k2").producer == B0
    with pytest.raises(AssertionError):  # no live producer left in that process
        spec.process_exit_process(dep, (400, 7))
