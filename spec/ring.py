"""The ring channel: one producer's ring of frames on one edge.

Read this module first. It says what a ring promises, as a sequential state
machine over logical positions:

* Positions only grow. A frame lives at `position`; its bytes sit at physical
  offset `position % capacity` of the data region (see `layout`).
* The producer appends at `head`. Reclaim moves `tail` forward over frames
  nobody will read again (done, retired, padding) and stops at the first
  frame that is still published or claimed. Free space is
  `capacity - (head - tail)`.
* A frame that would cross the end of the data region is preceded by a
  padding frame that fills the rest, and starts at physical offset 0.
* A frame larger than `capacity // ADMISSION_DIVISOR`, or with a key longer
  than MAX_KEY_LENGTH bytes, is not admitted: the caller uses the fallback and
  the ring is left as it was.
* A key has at most one deliverable version: a successful put retires the
  key's older published frame.
* A get claims a published frame exactly once. With a descriptor (the
  position put returned) it reads only that exact frame, so a stale
  descriptor can never read a newer publication.

The model keeps payloads as opaque tokens: what travels is the implementation's
business; what the model decides is which token a get returns, if any.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from . import status
from .layout import (
    ADMISSION_DIVISOR,
    DATA_FRAME_TYPE,
    FRAME_ALIGNMENT,
    FRAME_STATE_CLAIMED,
    FRAME_STATE_DONE,
    FRAME_STATE_PUBLISHED,
    FRAME_STATE_RETIRED,
    MAX_KEY_LENGTH,
    MAX_RING_CAPACITY,
    MIN_RING_CAPACITY,
    PADDING_FRAME_TYPE,
    RING_CAPACITY_ALIGNMENT,
    RING_CAPACITY_DISABLED,
    compute_frame_length,
)

# -- state -----------------------------------------------------------------


class ConsumeMode(enum.Enum):
    """How a get consumes a frame."""

    COPY_OUT = "copy-out"  # payload copied out; the frame is done at claim
    LEASE = "lease"  # payload borrowed; the frame is done when the lease is released


@dataclass
class Frame:
    """One frame in the data region, data or padding."""

    position: int  # logical position of the first byte; tail <= position < head
    length: int  # bytes occupied, a multiple of FRAME_ALIGNMENT
    frame_type: int  # DATA_FRAME_TYPE or PADDING_FRAME_TYPE
    state: int  # FRAME_STATE_*; padding is always DONE
    key: str = ""  # the message key; "" for padding
    payload_length: int = 0  # encoded payload bytes; 0 for padding
    payload: object = None  # opaque token standing for the payload bytes


@dataclass
class RingState:
    """One producer's ring on one edge."""

    capacity: int  # data region bytes: 0 (disabled) or a valid capacity; never changes
    head: int = 0  # position where the next frame starts; never decreases
    tail: int = 0  # position of the oldest unreclaimed frame; tail <= head <= tail + capacity
    # Unreclaimed frames in position order; they tile [tail, head) exactly.
    frames: list[Frame] = field(default_factory=list)
    closed: bool = False  # set by close; a closed ring accepts no put and holds nothing deliverable


PutStatus = status.PutStatus  # PUBLISHED, NOT_ADMITTED, FULL, CLOSED


@dataclass(frozen=True)
class PutResult:
    status: PutStatus
    position: int | None = None  # the descriptor: where the frame was published
    frame_length: int = 0  # bytes the frame occupies (also when refused)
    padding: int = 0  # bytes of padding written before the frame
    retired: int = 0  # older versions of the key retired by this put (0 or 1)


GetStatus = status.GetStatus  # DELIVERED, NOT_FOUND, STALE (BUSY: the implementation's)


@dataclass(frozen=True)
class GetResult:
    status: GetStatus
    position: int | None = None  # position of the claimed frame
    payload: object = None  # the claimed frame's payload token


# -- predicates ------------------------------------------------------------


def is_valid_capacity(capacity: int) -> bool:
    """0 disables the ring; otherwise MIN..MAX and aligned."""
    if capacity == RING_CAPACITY_DISABLED:
        return True
    return (
        MIN_RING_CAPACITY <= capacity <= MAX_RING_CAPACITY
        and capacity % RING_CAPACITY_ALIGNMENT == 0
    )


def is_admitted(capacity: int, key_length: int, frame_length: int) -> bool:
    """Whether a frame may ever use this ring (independent of free space)."""
    # Verify lengths are not negative
    assert key_length >= 0 and frame_length >= 0
    if capacity == RING_CAPACITY_DISABLED:
        return False
    return key_length <= MAX_KEY_LENGTH and frame_length <= capacity // ADMISSION_DIVISOR


def is_prefix_match(prefix: str, key: str) -> bool:
    """`key` is `prefix` followed by one or more ASCII digits.

    `req_0_` matches `req_0_7` and `req_0_12`, not `req_0_10x`, `req_0_` nor
    `request_0_0`.
    """
    if not key.startswith(prefix):
        return False
    rest = key[len(prefix) :]
    return len(rest) > 0 and all("0" <= c <= "9" for c in rest)


def is_deliverable(frame: Frame) -> bool:
    return frame.frame_type == DATA_FRAME_TYPE and frame.state == FRAME_STATE_PUBLISHED


def is_reclaimable(frame: Frame) -> bool:
    return frame.state in (FRAME_STATE_DONE, FRAME_STATE_RETIRED)


# -- pure helpers ----------------------------------------------------------


def compute_capacity_error(capacity: int) -> str | None:
    """The configuration error for `capacity`, or None when it is valid."""
    if is_valid_capacity(capacity):
        return None
    return (
        f"ring capacity out of range: capacity={capacity} "
        f"(0 disables the ring; otherwise {MIN_RING_CAPACITY}..{MAX_RING_CAPACITY} "
        f"bytes, a multiple of {RING_CAPACITY_ALIGNMENT})"
    )


def compute_key_length(key: str) -> int:
    """Bytes of the key on the wire (UTF-8)."""
    return len(key.encode("utf-8"))


def compute_free_space(capacity: int, head: int, tail: int) -> int:
    """Bytes not held by unreclaimed frames."""
    # Verify the positions describe a ring
    assert 0 <= tail <= head <= tail + capacity
    return capacity - (head - tail)


def compute_padding(capacity: int, head: int, frame_length: int) -> int:
    """Padding needed before a frame of `frame_length` published at `head`.

    Zero when the frame fits before the end of the data region (an exact fit
    included); otherwise the rest of the region, so the frame starts at 0.
    """
    # Verify the ring is enabled and the frame could fit in it at all
    assert capacity > 0
    assert 0 < frame_length <= capacity
    assert head >= 0
    offset = head % capacity
    if offset + frame_length <= capacity:
        return 0
    return capacity - offset


def compute_has_space(capacity: int, head: int, tail: int, frame_length: int) -> bool:
    """`padding + frame_length <= capacity - (head - tail)`."""
    # Verify the positions describe a ring and the frame could fit at all
    assert 0 <= tail <= head <= tail + capacity
    assert 0 < frame_length <= capacity
    padding = compute_padding(capacity, head, frame_length)
    return padding + frame_length <= compute_free_space(capacity, head, tail)


# -- accessors -------------------------------------------------------------


def get_frame_at(ring: RingState, position: int) -> Frame | None:
    """The unreclaimed frame that starts exactly at `position`, if any."""
    for frame in ring.frames:
        if frame.position == position:
            return frame
    return None


def get_deliverable_frame(ring: RingState, key: str) -> Frame | None:
    """The key's deliverable frame (there is at most one)."""
    for frame in ring.frames:
        if frame.key == key and is_deliverable(frame):
            return frame
    return None


def get_deliverable_keys(ring: RingState) -> list[str]:
    return [frame.key for frame in ring.frames if is_deliverable(frame)]


def get_used_bytes(ring: RingState) -> int:
    return ring.head - ring.tail


# -- transitions -----------------------------------------------------------


def initialize_ring(capacity: int) -> RingState:
    # Verify the capacity is valid (callers report compute_capacity_error first)
    assert is_valid_capacity(capacity), compute_capacity_error(capacity)
    return RingState(capacity=capacity)


def process_reclaim(ring: RingState) -> int:
    """Advance the tail over reclaimable frames; answer the bytes freed.

    Stops at the first frame that is published or claimed, so frames are
    never reclaimed out of order even when later ones are already done.
    """
    freed = 0
    while ring.frames and is_reclaimable(ring.frames[0]):
        frame = ring.frames.pop(0)
        ring.tail += frame.length
        freed += frame.length
    return freed


def process_put(ring: RingState, key: str, payload_length: int, payload: object) -> PutResult:
    """Publish `payload` under `key`, or say why the ring cannot take it."""
    # Verify the payload length is a byte count
    assert payload_length >= 0
    if ring.closed:
        return PutResult(PutStatus.CLOSED)
    key_length = compute_key_length(key)
    frame_length = compute_frame_length(key_length, payload_length)
    if not is_admitted(ring.capacity, key_length, frame_length):
        return PutResult(PutStatus.NOT_ADMITTED, frame_length=frame_length)
    process_reclaim(ring)
    if not compute_has_space(ring.capacity, ring.head, ring.tail, frame_length):
        return PutResult(PutStatus.FULL, frame_length=frame_length)
    padding = compute_padding(ring.capacity, ring.head, frame_length)
    if padding:
        ring.frames.append(
            Frame(
                position=ring.head,
                length=padding,
                frame_type=PADDING_FRAME_TYPE,
                state=FRAME_STATE_DONE,
            )
        )
        ring.head += padding
    retired = process_cancel(ring, key)
    position = ring.head
    ring.frames.append(
        Frame(
            position=position,
            length=frame_length,
            frame_type=DATA_FRAME_TYPE,
            state=FRAME_STATE_PUBLISHED,
            key=key,
            payload_length=payload_length,
            payload=payload,
        )
    )
    ring.head += frame_length
    return PutResult(
        PutStatus.PUBLISHED,
        position=position,
        frame_length=frame_length,
        padding=padding,
        retired=retired,
    )


def process_get(
    ring: RingState,
    key: str,
    position: int | None = None,
    mode: ConsumeMode = ConsumeMode.COPY_OUT,
) -> GetResult:
    """Claim the key's deliverable frame, exactly once.

    With `position` (a descriptor) only the frame published at that exact
    position may be claimed; anything else there (a newer frame, a retired or
    claimed one, nothing at all) answers STALE.
    """
    if position is None:
        frame = get_deliverable_frame(ring, key)
        if frame is None:
            return GetResult(GetStatus.NOT_FOUND)
    else:
        found = get_frame_at(ring, position)
        if found is None or found.key != key or not is_deliverable(found):
            return GetResult(GetStatus.STALE)
        frame = found
    frame.state = FRAME_STATE_DONE if mode is ConsumeMode.COPY_OUT else FRAME_STATE_CLAIMED
    return GetResult(GetStatus.DELIVERED, position=frame.position, payload=frame.payload)


def process_release(ring: RingState, position: int) -> None:
    """The last borrowed view of a leased frame died: the frame is done.

    Leases may be released in any order; reclaim still advances in order.
    """
    frame = get_frame_at(ring, position)
    # Verify a claimed frame starts at the position
    assert frame is not None and frame.state == FRAME_STATE_CLAIMED
    frame.state = FRAME_STATE_DONE


def process_cancel(ring: RingState, key: str) -> int:
    """Retire the key's unclaimed frame; answer how many were retired."""
    frame = get_deliverable_frame(ring, key)
    if frame is None:
        return 0
    frame.state = FRAME_STATE_RETIRED
    return 1


def process_cancel_prefix(ring: RingState, prefix: str) -> int:
    """Retire every unclaimed frame whose key is `prefix` + digits."""
    retired = 0
    for frame in ring.frames:
        if is_deliverable(frame) and is_prefix_match(prefix, frame.key):
            frame.state = FRAME_STATE_RETIRED
            retired += 1
    return retired


def process_close(ring: RingState) -> int:
    """Retire everything unclaimed and refuse further puts. Idempotent."""
    retired = 0
    for frame in ring.frames:
        if is_deliverable(frame):
            frame.state = FRAME_STATE_RETIRED
            retired += 1
    ring.closed = True
    return retired


__all__ = [
    "FRAME_ALIGNMENT",
    "ConsumeMode",
    "Frame",
    "GetResult",
    "GetStatus",
    "PutResult",
    "PutStatus",
    "RingState",
    "compute_capacity_error",
    "compute_free_space",
    "compute_has_space",
    "compute_key_length",
    "compute_padding",
    "get_deliverable_frame",
    "get_deliverable_keys",
    "get_frame_at",
    "get_used_bytes",
    "initialize_ring",
    "is_admitted",
    "is_deliverable",
    "is_prefix_match",
    "is_reclaimable",
    "is_valid_capacity",
    "process_cancel",
    "process_cancel_prefix",
    "process_close",
    "process_get",
    "process_put",
    "process_reclaim",
    "process_release",
]
