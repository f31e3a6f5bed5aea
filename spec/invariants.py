"""Invariants of the model, one `check_*` function each.

Every invariant is also written as a comment on the field it governs. Tests
call these after every step (model alone, and model next to the
implementation); the bounded explorer calls them on every reachable state.
A violated invariant raises `InvariantViolation` naming the invariant and the
values that broke it.
"""

from __future__ import annotations

from collections import Counter

from shmring.spec.layout import (
    ADMISSION_DIVISOR,
    DATA_FRAME_TYPE,
    FRAME_ALIGNMENT,
    FRAME_STATE_DONE,
    PADDING_FRAME_TYPE,
    compute_frame_length,
)
from shmring.spec.ring import (
    RingState,
    compute_key_length,
    is_deliverable,
    is_valid_capacity,
)


class InvariantViolation(AssertionError):
    """An invariant of the model does not hold."""


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise InvariantViolation(message)


# -- ring ------------------------------------------------------------------


def check_ring_positions(ring: RingState) -> None:
    """tail <= head and head - tail <= capacity; positions never negative."""
    _require(is_valid_capacity(ring.capacity), f"invalid capacity: capacity={ring.capacity}")
    _require(0 <= ring.tail <= ring.head, f"tail after head: tail={ring.tail} head={ring.head}")
    _require(
        ring.head - ring.tail <= ring.capacity,
        f"ring over capacity: head={ring.head} tail={ring.tail} capacity={ring.capacity}",
    )


def check_ring_frames_tile(ring: RingState) -> None:
    """Unreclaimed frames tile [tail, head) with aligned lengths; none crosses the end."""
    position = ring.tail
    for frame in ring.frames:
        _require(
            frame.position == position,
            f"gap or overlap at position={position}: frame at {frame.position}",
        )
        _require(
            frame.length > 0 and frame.length % FRAME_ALIGNMENT == 0,
            f"unaligned frame length={frame.length} at position={frame.position}",
        )
        offset = frame.position % ring.capacity
        _require(
            offset + frame.length <= ring.capacity,
            f"frame crosses the end of the data region: position={frame.position} "
            f"length={frame.length} capacity={ring.capacity}",
        )
        if frame.frame_type == PADDING_FRAME_TYPE:
            _require(
                offset + frame.length == ring.capacity,
                f"padding does not end at the data region's end: position={frame.position}",
            )
            _require(frame.state == FRAME_STATE_DONE, "padding frame not done")
        else:
            _require(frame.frame_type == DATA_FRAME_TYPE, f"unknown frame type={frame.frame_type}")
            expected = compute_frame_length(compute_key_length(frame.key), frame.payload_length)
            _require(
                frame.length == expected,
                f"frame length={frame.length} differs from computed length={expected}",
            )
            _require(
                frame.length <= ring.capacity // ADMISSION_DIVISOR,
                f"frame larger than the admission limit: length={frame.length}",
            )
        position += frame.length
    _require(position == ring.head, f"frames end at {position}, head is {ring.head}")


def check_ring_one_version_per_key(ring: RingState) -> None:
    """A key has at most one deliverable frame."""
    counts = Counter(frame.key for frame in ring.frames if is_deliverable(frame))
    repeated = sorted(key for key, count in counts.items() if count > 1)
    _require(not repeated, f"keys with more than one deliverable version: {repeated}")


def check_ring_closed_holds_nothing(ring: RingState) -> None:
    """A closed ring has no deliverable frame."""
    if ring.closed:
        live = [frame.key for frame in ring.frames if is_deliverable(frame)]
        _require(not live, f"closed ring still delivers keys={live}")


def check_ring(ring: RingState) -> None:
    check_ring_positions(ring)
    check_ring_frames_tile(ring)
    check_ring_one_version_per_key(ring)
    check_ring_closed_holds_nothing(ring)
