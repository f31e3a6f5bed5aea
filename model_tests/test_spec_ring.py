"""Example tests of `spec.ring`, the model alone: one test per transition and claim.

Each test builds a small ring (4 KiB, so the admission limit is 1024 bytes),
applies the transitions a claim is about and asserts the concrete positions,
states and answers the model must give. `frame(key, n)` picks the payload
length that makes the frame exactly `n` bytes, so the arithmetic in a test
reads as whole frames.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest

from shmring.check.explore import compute_payload_length
from shmring.spec import invariants
from shmring.spec import ring as spec
from shmring.spec.layout import (
    DATA_FRAME_TYPE,
    FRAME_HEADER_LENGTH,
    FRAME_STATE_CLAIMED,
    FRAME_STATE_DONE,
    FRAME_STATE_PUBLISHED,
    FRAME_STATE_RETIRED,
    MAX_KEY_LENGTH,
    MAX_RING_CAPACITY,
    MIN_RING_CAPACITY,
    PADDING_FRAME_TYPE,
)
from shmring.spec.ring import ConsumeMode, GetStatus, PutStatus, RingState

CAPACITY = 4096
LIMIT = CAPACITY // 4  # the largest admitted frame


def put(ring: RingState, key: str, frame_length: int, payload: object = None) -> spec.PutResult:
    """Put a frame of exactly `frame_length` bytes; the payload token defaults to the key."""
    result = spec.process_put(
        ring, key, compute_payload_length(key, frame_length), key if payload is None else payload
    )
    invariants.check_ring(ring)
    return result


def get(
    ring: RingState, key: str, position: int | None = None, mode: ConsumeMode = ConsumeMode.COPY_OUT
) -> spec.GetResult:
    result = spec.process_get(ring, key, position, mode)
    invariants.check_ring(ring)
    return result


def fresh() -> RingState:
    return spec.initialize_ring(CAPACITY)


# -- capacity ------------------------------------------------------------------------


def test_valid_capacities_are_zero_or_aligned_from_4k_to_64m() -> None:
    assert spec.is_valid_capacity(0)
    assert spec.is_valid_capacity(MIN_RING_CAPACITY)
    assert spec.is_valid_capacity(MIN_RING_CAPACITY + 16)
    assert spec.is_valid_capacity(MAX_RING_CAPACITY)
    assert not spec.is_valid_capacity(MIN_RING_CAPACITY - 16)
    assert not spec.is_valid_capacity(MIN_RING_CAPACITY + 8)
    assert not spec.is_valid_capacity(MAX_RING_CAPACITY + 16)
    assert not spec.is_valid_capacity(-4096)


@pytest.mark.parametrize(
    "capacity", [1000, 4097, MIN_RING_CAPACITY - 16, MAX_RING_CAPACITY + 16, -1]
)
def test_invalid_capacity_is_rejected_with_the_value(capacity: int) -> None:
    message = spec.compute_capacity_error(capacity)
    assert message is not None and f"capacity={capacity} " in message
    with pytest.raises(AssertionError, match=f"capacity={capacity} "):
        spec.initialize_ring(capacity)


def test_valid_capacity_has_no_error_and_starts_empty() -> None:
    assert spec.compute_capacity_error(CAPACITY) is None
    ring = fresh()
    assert (ring.capacity, ring.head, ring.tail, ring.frames, ring.closed) == (
        CAPACITY,
        0,
        0,
        [],
        False,
    )


# -- admission -----------------------------------------------------------------------


def test_frame_length_is_header_key_and_payload_aligned_to_16() -> None:
    assert FRAME_HEADER_LENGTH == 32
    assert spec.compute_key_length("é") == 2  # UTF-8 bytes, not characters
    ring = fresh()
    result = spec.process_put(ring, "abc", 1, "x")  # 32 + 3 + 1 = 36 -> 48
    assert (result.status, result.position, result.frame_length) == (PutStatus.PUBLISHED, 0, 48)
    assert ring.head == 48


def test_frame_of_a_quarter_of_capacity_is_admitted() -> None:
    ring = fresh()
    result = put(ring, "k", LIMIT)
    assert (result.status, result.frame_length, ring.head) == (PutStatus.PUBLISHED, LIMIT, LIMIT)


def test_frame_over_a_quarter_of_capacity_is_not_admitted_and_uses_no_credit() -> None:
    ring = fresh()
    put(ring, "a", 256)
    get(ring, "a")  # done: reclaimable, but a refusal must not even reclaim
    before = copy.deepcopy(ring)
    result = put(ring, "k", LIMIT + 16)
    assert result == spec.PutResult(PutStatus.NOT_ADMITTED, frame_length=LIMIT + 16)
    assert ring == before
    assert (ring.head, ring.tail) == (256, 0)


def test_key_longer_than_65535_bytes_is_not_admitted() -> None:
    ring = spec.initialize_ring(MAX_RING_CAPACITY)  # the frame is far below capacity / 4
    for key in ("k" * (MAX_KEY_LENGTH + 1), "é" * ((MAX_KEY_LENGTH + 1) // 2)):
        assert spec.compute_key_length(key) == MAX_KEY_LENGTH + 1
        result = spec.process_put(ring, key, 0, "x")
        assert result.status is PutStatus.NOT_ADMITTED
        assert (ring.head, ring.frames) == (0, [])
    longest = spec.process_put(ring, "k" * MAX_KEY_LENGTH, 0, "x")
    assert longest.status is PutStatus.PUBLISHED
    assert longest.frame_length == 65568  # align16(32 + 65535)


def test_disabled_ring_admits_nothing() -> None:
    ring = spec.initialize_ring(0)
    assert not spec.is_admitted(0, 1, 48)
    assert spec.process_put(ring, "k", 0, "x").status is PutStatus.NOT_ADMITTED
    assert ring.head == 0 and ring.frames == []


# -- space and wraparound ------------------------------------------------------------


def fill_to_3840(first: int) -> RingState:
    """A ring holding a, b, c, d with a `first`-byte frame first and head at 3840."""
    ring = fresh()
    put(ring, "a", first)
    put(ring, "b", 1024)
    put(ring, "c", 1024)
    put(ring, "d", 3840 - first - 2048)
    assert ring.head == 3840
    return ring


def test_padding_fills_the_rest_at_wraparound() -> None:
    ring = fill_to_3840(1024)
    get(ring, "a")
    get(ring, "b")
    result = put(ring, "e", 1024)
    assert (result.status, result.padding, result.position) == (PutStatus.PUBLISHED, 256, 4096)
    assert result.position is not None and result.position % CAPACITY == 0  # physical offset 0
    padding, frame = ring.frames[-2:]
    assert (padding.position, padding.length, padding.frame_type, padding.state) == (
        3840,
        256,
        PADDING_FRAME_TYPE,
        FRAME_STATE_DONE,
    )
    assert (frame.position, frame.key, frame.frame_type) == (4096, "e", DATA_FRAME_TYPE)
    assert (ring.tail, ring.head) == (2048, 5120)


def test_exact_fit_needs_no_padding() -> None:
    assert spec.compute_padding(CAPACITY, 3072, 1024) == 0
    assert spec.compute_padding(CAPACITY, 3072, 1040) == 1024
    ring = fresh()
    for key in "abc":
        put(ring, key, 1024)
    result = put(ring, "d", 1024)  # ends exactly at the end of the data region
    assert (result.status, result.position, result.padding) == (PutStatus.PUBLISHED, 3072, 0)
    assert all(f.frame_type == DATA_FRAME_TYPE for f in ring.frames)
    assert ring.head - ring.tail == CAPACITY  # a full ring is allowed
    get(ring, "a")
    after = put(ring, "e", 1024)
    assert (after.position, after.padding) == (4096, 0)  # starts the next lap at offset 0


def test_put_refused_when_padding_plus_size_exceeds_free_space() -> None:
    ring = fill_to_3840(768)
    get(ring, "a")  # 768 bytes reclaimable: free space becomes 256 + 768 = 1024
    assert spec.compute_free_space(CAPACITY, 3840, 768) == 1024
    assert not spec.compute_has_space(CAPACITY, 3840, 768, 1024)  # 256 padding + 1024 > 1024
    result = put(ring, "e", 1024)
    assert result == spec.PutResult(PutStatus.FULL, frame_length=1024)
    assert ring.head == 3840  # no padding written, no frame
    assert [f.key for f in ring.frames] == ["b", "c", "d"]  # the put did reclaim "a"
    assert ring.tail == 768


def test_put_fits_when_padding_plus_size_equals_free_space() -> None:
    ring = fill_to_3840(1024)
    get(ring, "a")  # free: 256 + 1024 = 1280 = padding + frame
    result = put(ring, "e", 1024)
    assert (result.status, result.padding, result.position) == (PutStatus.PUBLISHED, 256, 4096)
    assert ring.head - ring.tail == CAPACITY


def test_positions_only_grow_across_laps() -> None:
    ring = fresh()
    heads = []
    for n in range(12):
        put(ring, f"k{n}", 1024)
        get(ring, f"k{n}")
        heads.append(ring.head)
    assert heads == [1024 * (n + 1) for n in range(12)]
    assert ring.tail == 11 * 1024  # each put reclaimed the frame before it


# -- versions, claims and descriptors ------------------------------------------------


def test_reput_retires_the_older_unclaimed_version() -> None:
    ring = fresh()
    first = put(ring, "k", 256, "v1")
    second = put(ring, "k", 256, "v2")
    assert (second.status, second.retired) == (PutStatus.PUBLISHED, 1)
    assert spec.get_frame_at(ring, 0).state == FRAME_STATE_RETIRED  # type: ignore[union-attr]
    assert spec.get_deliverable_keys(ring) == ["k"]
    got = get(ring, "k")
    assert (got.status, got.position, got.payload) == (GetStatus.DELIVERED, second.position, "v2")
    assert get(ring, "k").status is GetStatus.NOT_FOUND
    assert first.retired == 0


def test_reput_after_a_claim_retires_nothing() -> None:
    ring = fresh()
    put(ring, "k", 256)
    get(ring, "k")
    assert put(ring, "k", 256).retired == 0


def test_refused_reput_keeps_the_older_version() -> None:
    ring = fresh()
    put(ring, "k", 256, "v1")
    assert put(ring, "k", LIMIT + 16, "v2").status is PutStatus.NOT_ADMITTED
    assert get(ring, "k").payload == "v1"


def test_get_claims_exactly_once() -> None:
    ring = fresh()
    published = put(ring, "k", 256, "v")
    got = get(ring, "k")
    assert got == spec.GetResult(GetStatus.DELIVERED, position=0, payload="v")
    assert get(ring, "k") == spec.GetResult(GetStatus.NOT_FOUND)
    assert get(ring, "k", published.position) == spec.GetResult(GetStatus.STALE)


def test_copy_out_get_marks_the_frame_done_at_claim() -> None:
    ring = fresh()
    put(ring, "k", 256)
    get(ring, "k", mode=ConsumeMode.COPY_OUT)
    assert ring.frames[0].state == FRAME_STATE_DONE
    assert spec.process_reclaim(ring) == 256


def test_lease_get_keeps_the_frame_claimed_until_release() -> None:
    ring = fresh()
    put(ring, "k", 256)
    got = get(ring, "k", mode=ConsumeMode.LEASE)
    assert got.status is GetStatus.DELIVERED and ring.frames[0].state == FRAME_STATE_CLAIMED
    assert spec.process_reclaim(ring) == 0
    assert get(ring, "k").status is GetStatus.NOT_FOUND  # claimed is not deliverable
    spec.process_release(ring, 0)
    assert ring.frames[0].state == FRAME_STATE_DONE
    assert spec.process_reclaim(ring) == 256 and ring.tail == 256


def test_descriptor_reads_exactly_its_frame() -> None:
    ring = fresh()
    put(ring, "a", 256)
    b = put(ring, "b", 256, "vb")
    assert get(ring, "b", position=b.position) == spec.GetResult(GetStatus.DELIVERED, 256, "vb")


def test_descriptor_used_with_another_key_is_stale() -> None:
    ring = fresh()
    a = put(ring, "a", 256)
    assert get(ring, "b", position=a.position).status is GetStatus.STALE
    assert ring.frames[0].state == FRAME_STATE_PUBLISHED  # untouched


def _stale_after_reput(ring: RingState, position: int) -> None:
    put(ring, "k", 256, "newer")


def _stale_after_cancel(ring: RingState, position: int) -> None:
    assert spec.process_cancel(ring, "k") == 1
    put(ring, "k", 512, "newer")


def _stale_after_wrap(ring: RingState, position: int) -> None:
    get(ring, "k")
    for n in range(3):
        put(ring, f"f{n}", 1024)
        get(ring, f"f{n}")
    newer = put(ring, "k", 1024, "newer")
    # The newer frame sits at the old frame's physical offset, one lap later.
    assert newer.position is not None and newer.position % CAPACITY == position % CAPACITY
    assert newer.position == position + CAPACITY


@pytest.mark.parametrize(
    "supersede",
    [_stale_after_reput, _stale_after_cancel, _stale_after_wrap],
    ids=["re-put", "cancel", "wrap"],
)
def test_stale_descriptor_never_reads_newer_frame(
    supersede: Callable[[RingState, int], None],
) -> None:
    ring = fresh()
    old = put(ring, "k", 1024, "older")
    assert old.position is not None
    supersede(ring, old.position)
    assert get(ring, "k", position=old.position) == spec.GetResult(GetStatus.STALE)
    # The newer version is still there for the get that should have it.
    got = get(ring, "k")
    assert (got.status, got.payload) == (GetStatus.DELIVERED, "newer")
    assert got.position != old.position


# -- cancel ----------------------------------------------------------------------------


def test_cancel_by_exact_key_answers_how_many_it_retired() -> None:
    ring = fresh()
    put(ring, "k", 256)
    put(ring, "k1", 256)
    assert spec.process_cancel(ring, "k") == 1
    assert spec.process_cancel(ring, "k") == 0
    assert spec.get_deliverable_keys(ring) == ["k1"]


def test_prefix_cancel_matches_only_digit_suffixes() -> None:
    assert spec.is_prefix_match("req_0_", "req_0_7")
    assert spec.is_prefix_match("req_0_", "req_0_12")
    assert not spec.is_prefix_match("req_0_", "req_0_10x")
    assert not spec.is_prefix_match("req_0_", "request_0_0")
    assert not spec.is_prefix_match("req_0_", "req_0_")
    assert not spec.is_prefix_match("req_0_", "req_0_٣")  # a non-ASCII digit
    ring = fresh()
    for key in ("req_0_7", "req_0_10x", "request_0_0", "req_0_", "req_0_12"):
        put(ring, key, 256)
    assert spec.process_cancel_prefix(ring, "req_0_") == 2
    assert spec.get_deliverable_keys(ring) == ["req_0_10x", "request_0_0", "req_0_"]
    assert spec.process_cancel_prefix(ring, "req_0_") == 0


def test_prefix_cancel_leaves_claimed_frames_alone() -> None:
    ring = fresh()
    put(ring, "req_1", 256)
    get(ring, "req_1", mode=ConsumeMode.LEASE)
    assert spec.process_cancel_prefix(ring, "req_") == 0
    assert ring.frames[0].state == FRAME_STATE_CLAIMED


# -- reclaim ---------------------------------------------------------------------------


def test_reclaim_stops_at_first_unclaimed_frame() -> None:
    ring = fresh()
    for key in "abc":
        put(ring, key, 256)
    get(ring, "b")
    get(ring, "c")
    assert spec.process_reclaim(ring) == 0
    assert ring.tail == 0
    get(ring, "a")
    assert spec.process_reclaim(ring) == 768
    assert (ring.tail, ring.frames) == (768, [])


def test_reclaim_passes_retired_and_padding_frames() -> None:
    ring = fill_to_3840(1024)
    for key in "abcd":
        spec.process_cancel(ring, key)
    put(ring, "e", 1024)  # reclaims a..d, pads 256, wraps
    spec.process_cancel(ring, "e")
    assert spec.process_reclaim(ring) == 256 + 1024
    assert ring.tail == ring.head == 5120


def test_lease_release_out_of_order_reclaims_in_order() -> None:
    ring = fresh()
    for key in "abc":
        put(ring, key, 256)
        get(ring, key, mode=ConsumeMode.LEASE)
    spec.process_release(ring, 512)
    spec.process_release(ring, 256)
    assert spec.process_reclaim(ring) == 0  # "a" is still leased
    assert [f.state for f in ring.frames] == [
        FRAME_STATE_CLAIMED,
        FRAME_STATE_DONE,
        FRAME_STATE_DONE,
    ]
    spec.process_release(ring, 0)
    assert spec.process_reclaim(ring) == 768
    assert ring.tail == ring.head == 768


# -- close -----------------------------------------------------------------------------


def test_close_retires_everything_and_is_idempotent() -> None:
    ring = fresh()
    put(ring, "a", 256)
    put(ring, "b", 256)
    put(ring, "c", 256)
    get(ring, "c", mode=ConsumeMode.LEASE)
    assert spec.process_close(ring) == 2
    assert ring.closed and spec.get_deliverable_keys(ring) == []
    assert spec.process_close(ring) == 0
    assert put(ring, "d", 256) == spec.PutResult(PutStatus.CLOSED)
    assert get(ring, "a").status is GetStatus.NOT_FOUND
    # A lease taken before close is still released normally.
    spec.process_release(ring, 512)
    assert spec.process_reclaim(ring) == 768


# -- preconditions -----------------------------------------------------------------------


def _leased_ring() -> RingState:
    ring = fresh()
    put(ring, "a", 256)
    put(ring, "b", 256)
    get(ring, "a", mode=ConsumeMode.LEASE)
    return ring


def _released_once() -> RingState:
    ring = _leased_ring()
    spec.process_release(ring, 0)
    return ring


# name -> (the valid state to start from, the call whose precondition fails)
INVALID_CALLS: dict[str, tuple[Callable[[], RingState], Callable[[RingState], object]]] = {
    "negative payload length": (_leased_ring, lambda r: spec.process_put(r, "k", -1, "x")),
    "release of a published frame": (_leased_ring, lambda r: spec.process_release(r, 256)),
    "release of no frame": (_leased_ring, lambda r: spec.process_release(r, 100)),
    "release twice": (_released_once, lambda r: spec.process_release(r, 0)),
}


@pytest.mark.parametrize("name", sorted(INVALID_CALLS))
def test_invalid_call_leaves_state_untouched(name: str) -> None:
    prepare, call = INVALID_CALLS[name]
    ring = prepare()
    before = copy.deepcopy(ring)
    with pytest.raises(AssertionError):
        call(ring)
    assert ring == before


def test_helpers_reject_impossible_arguments() -> None:
    with pytest.raises(AssertionError):
        spec.compute_free_space(CAPACITY, 0, 10)  # tail after head
    with pytest.raises(AssertionError):
        spec.compute_free_space(CAPACITY, CAPACITY + 16, 0)  # more than a lap in use
    with pytest.raises(AssertionError):
        spec.compute_padding(CAPACITY, 0, CAPACITY + 16)
    with pytest.raises(AssertionError):
        spec.is_admitted(CAPACITY, -1, 48)
