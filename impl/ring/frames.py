"""Reading a ring file's bytes: ONE header validation and ONE frame walker.

Design rationale. Everything a reader takes from shared memory is checked
before use (see "Validation" in `shmring.impl.ring`): the ring header when a
file is mapped, head and tail on every load, and every frame header before a
byte behind it is trusted. These checks were once written out by the host
ring's reader (twice: its scan and its statistics walk), the arena reader,
the fallback's segment check and the fault-injection observers; this module
is now the only place that decides what a valid header is, and the only loop
that walks frames from one position up to a head. The callers keep only what
is theirs: the reader's index, the arena's descriptor match, a count.

Model steps. A frame this module accepts is a `spec.ring.Frame` of the ring
between tail and head: `frame_problem` is the implementation's reading of the
model's invariants on one frame (a data frame's length is
`spec.layout.compute_frame_length` of its key and payload and admitted by
`spec.ring.is_admitted`; a padding frame runs to the end of the region and
is DONE; states are the four of `spec.layout`). `walk_frames` produces the
frames `spec.ring.get_frame_at` / `get_deliverable_frame` look up (the
reader's scan indexes them; `process_get` then claims one).

Lock-free reads. A walk reads frames without the ring lock; after the header
(and key) of every data frame, and of anything that does not validate, it
re-loads the tail: a frame the tail passed may have been rewritten while it
was read, so the walk resumes at the new tail instead of trusting (or
reporting as corrupt) what it read. Only a frame that fails validation while
the tail still covers it is corruption.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from ...spec.layout import (
    DATA_FRAME_TYPE,
    FRAME_ALIGNMENT,
    FRAME_HEADER_LENGTH,
    FRAME_KEY_OFFSET,
    FRAME_STATE_DONE,
    FRAME_STATE_PUBLISHED,
    PADDING_FRAME_TYPE,
    RING_CAPACITY_DISABLED,
    RING_HEADER_LENGTH,
    RING_MAGIC,
    RING_VERSION,
    compute_frame_length,
    compute_ring_file_length,
)
from ...spec.ring import is_valid_capacity
from ..errors import CorruptFrameError
from ..frame_io import (
    RingHeader,
    SharedWords,
    load_frame_header_fields,
    load_frame_prefix,
    load_head_acquire,
    load_tail_acquire,
    read_frame_header,
    read_ring_header,
)
from .mapping import (
    _KNOWN_STATES,
    _MAX_RACE_RETRIES,
    FrameFields,
    _FrameShapes,
)

# -- the ring header -------------------------------------------------------------


@dataclass(frozen=True)
class FileRule:
    """How a file in the ring layout relates its header's capacity to its size."""

    name: str  # what the messages call the file
    ring_capacity: bool  # the capacity is a ring's (spec.ring.is_valid_capacity, not 0)
    exact_size: bool  # size == compute_ring_file_length(capacity); else at least that


# A host ring: a valid ring capacity, the file exactly header + capacity.
RING_FILE: Final = FileRule("ring", ring_capacity=True, exact_size=True)
# A registered arena: a ring capacity; the file may be longer (page-rounded).
ARENA_FILE: Final = FileRule("arena", ring_capacity=True, exact_size=False)
# A fallback segment: one frame, whose length is the header's capacity.
SEGMENT_FILE: Final = FileRule("segment", ring_capacity=False, exact_size=True)


def ring_header_problem(header: RingHeader, size: int, rule: FileRule = RING_FILE) -> str | None:
    """Why `header`, read from a file of `size` bytes, is not a valid header under `rule`, or None.

    The ring state is the caller's: a reader tells a closed ring (its producer
    is gone) from a corrupt one; a segment's state says whom to hand it back to.
    """
    if header.magic != RING_MAGIC:
        return f"bad {rule.name} magic: magic={header.magic:#x}"
    if header.version != RING_VERSION:
        return f"unsupported {rule.name} version: version={header.version}"
    if header.header_length != RING_HEADER_LENGTH:
        return f"bad {rule.name} header length: header_length={header.header_length}"
    capacity = header.capacity
    if rule.ring_capacity and (
        capacity == RING_CAPACITY_DISABLED or not is_valid_capacity(capacity)
    ):
        return f"bad {rule.name} capacity: capacity={capacity}"
    length = compute_ring_file_length(capacity)
    if size != length if rule.exact_size else size < length:
        return f"{rule.name} file size does not match its capacity: size={size} capacity={capacity}"
    return None


def read_checked_ring_header(
    buf: memoryview, size: int, rule: FileRule = RING_FILE
) -> tuple[RingHeader, str | None]:
    """The header at the start of `buf` (at least RING_HEADER_LENGTH bytes) and its problem."""
    header = read_ring_header(buf)
    return header, ring_header_problem(header, size, rule)


# -- positions ---------------------------------------------------------------------


def load_positions(words: SharedWords, capacity: int, path: str) -> tuple[int, int]:
    """(tail, head), consistent with each other, validated (CorruptFrameError otherwise)."""
    for _ in range(_MAX_RACE_RETRIES):
        tail = load_tail_acquire(words)
        head = load_head_acquire(words)
        if load_tail_acquire(words) != tail:
            continue  # the producer reclaimed meanwhile; head may be past tail + capacity
        if (
            tail <= head <= tail + capacity
            and tail % FRAME_ALIGNMENT == 0
            and head % FRAME_ALIGNMENT == 0
        ):
            return tail, head
        raise CorruptFrameError(
            f"ring positions corrupted: head={head} tail={tail} capacity={capacity} path={path!r}"
        )
    raise CorruptFrameError(f"ring tail keeps moving while read: path={path!r}")  # pragma: no cover


# -- one frame ---------------------------------------------------------------------


def load_frame_fields(buf: memoryview, offset: int, capacity: int) -> FrameFields:
    """The header fields at mapping `offset`, never reading past the data region.

    Where fewer than FRAME_HEADER_LENGTH bytes remain only a padding frame
    fits, so only its (length, type, state) are read; the rest read as 0.
    """
    if RING_HEADER_LENGTH + capacity - offset >= FRAME_HEADER_LENGTH:
        return load_frame_header_fields(buf, offset)
    length, frame_type, state = load_frame_prefix(buf, offset)
    return (length, frame_type, state, 0, 0, 0, 0)


def frame_problem(
    position: int, head: int, fields: FrameFields, capacity: int, shapes: _FrameShapes
) -> str | None:
    """Why the header `fields` read at `position` are not a valid frame below `head`, or None."""
    length, frame_type, state, key_length, payload_length, frame_position, _ = fields
    offset = position % capacity
    if (
        length == 0
        or length % FRAME_ALIGNMENT
        or offset + length > capacity
        or position + length > head
    ):
        return f"bad frame length={length}"
    if frame_type == PADDING_FRAME_TYPE:
        if offset + length != capacity or state != FRAME_STATE_DONE:
            return f"bad padding frame: length={length} state={state}"
        return None
    if frame_type != DATA_FRAME_TYPE:
        return f"bad frame type={frame_type}"
    if state not in _KNOWN_STATES:
        return f"bad frame state={state}"
    if frame_position != position:
        return f"frame position field={frame_position}"
    if shapes[key_length, payload_length] != length:
        return (
            f"bad lengths: length={length} key_length={key_length} payload_length={payload_length}"
        )
    return None


def corrupt_frame(position: int, problem: str, path: str) -> CorruptFrameError:
    return CorruptFrameError(f"corrupted frame at position={position}: {problem}; path={path!r}")


# -- the walker --------------------------------------------------------------------

# One frame a walk met: (position, mapping offset, header fields, key bytes (b"" for padding)).
WalkedFrame = tuple[int, int, FrameFields, bytes]


def walk_frames(
    buf: memoryview,
    words: SharedWords,
    capacity: int,
    shapes: _FrameShapes,
    position: int,
    head: int,
    path: str,
) -> tuple[list[WalkedFrame], int, bool]:
    """The valid frames from `position` (a frame boundary) up to `head`, without the lock.

    Answers (frames, end, complete). `frames` are in position order; a frame
    whose position the tail passed while it was read is not among them: the
    walk resumes at the new tail (frames listed before that may be stale;
    callers prune below the tail). `complete` is False only when the tail
    kept lapping the walk (`end` is then the last tail seen); otherwise `end`
    is `head`. CorruptFrameError for a frame that fails validation while the
    tail still covers it.
    """
    frames: list[WalkedFrame] = []
    append = frames.append
    region_end = RING_HEADER_LENGTH + capacity
    last_header = region_end - FRAME_HEADER_LENGTH  # a whole header fits at offsets up to here
    retries = 0
    while position < head:
        offset = RING_HEADER_LENGTH + position % capacity
        if offset <= last_header:
            fields = load_frame_header_fields(buf, offset)
        else:
            fields = load_frame_fields(buf, offset, capacity)
        length, frame_type, state, key_length, payload_length, frame_position, _ = fields
        if (
            frame_type == DATA_FRAME_TYPE
            and frame_position == position
            and length == shapes[key_length, payload_length]
            and offset + length <= region_end
            and position + length <= head
            and state in _KNOWN_STATES
        ):
            # A valid data frame (frame_problem's checks, without the call): its key,
            # then the tail again (a frame the tail passed may have been rewritten).
            key_start = offset + FRAME_KEY_OFFSET
            key = bytes(buf[key_start : key_start + key_length])
            if load_tail_acquire(words) > position:
                retries += 1
                if retries > _MAX_RACE_RETRIES:  # pragma: no cover - lapped endlessly
                    return frames, load_tail_acquire(words), False
                position = load_tail_acquire(words)
                continue
            append((position, offset, fields, key))
            position += length
            continue
        problem = frame_problem(position, head, fields, capacity, shapes)
        if problem is not None:
            now_tail = load_tail_acquire(words)
            if now_tail > position:  # reclaimed and possibly rewritten under us
                retries += 1
                if retries > _MAX_RACE_RETRIES:  # pragma: no cover - lapped endlessly
                    return frames, now_tail, False
                position = now_tail
                continue
            raise corrupt_frame(position, problem, path)
        append((position, offset, fields, b""))  # padding
        position += length
    return frames, position, True


def published_keys(
    buf: memoryview, words: SharedWords, capacity: int, path: str
) -> dict[str, list[int]]:
    """key -> positions of the PUBLISHED data frames between tail and head (an observer's look).

    For a mapping of a whole ring file whose header the caller checked
    (`read_checked_ring_header`); the fault-injection observers' reading of
    a ring. CorruptFrameError for a frame that fails validation.
    """
    tail, head = load_positions(words, capacity, path)
    found: dict[str, list[int]] = {}
    frames, _, _ = walk_frames(buf, words, capacity, _FrameShapes(capacity), tail, head, path)
    for position, _, fields, key in frames:
        if fields[1] == DATA_FRAME_TYPE and fields[2] == FRAME_STATE_PUBLISHED:
            found.setdefault(key.decode("utf-8"), []).append(position)
    return found


# -- a one-frame file (fallback segment) -------------------------------------------


def segment_problem(
    buf: memoryview, size: int, key_bytes: bytes
) -> tuple[str | None, RingHeader, FrameFields | None]:
    """(problem or None, header, frame fields) of a one-frame segment file holding `key_bytes`.

    The segment is a ring header whose capacity is the length of the one
    PUBLISHED data frame after it. `buf` covers the whole file (`size` bytes,
    at least RING_HEADER_LENGTH + FRAME_HEADER_LENGTH).
    """
    header, problem = read_checked_ring_header(buf, size, SEGMENT_FILE)
    if problem is not None:
        return problem, header, None  # no frame read: a header that fails says nothing of it
    frame = read_frame_header(buf, RING_HEADER_LENGTH)
    fields = (
        frame.length,
        frame.frame_type,
        frame.state,
        frame.key_length,
        frame.payload_length,
        frame.position,
        frame.checksum,
    )
    if frame.length != header.capacity:
        problem = f"frame length={frame.length} differs from capacity={header.capacity}"
    elif frame.frame_type != DATA_FRAME_TYPE or frame.state != FRAME_STATE_PUBLISHED:
        problem = f"bad frame type={frame.frame_type} state={frame.state}"
    elif compute_frame_length(frame.key_length, frame.payload_length) != frame.length:
        problem = (
            f"lengths disagree: length={frame.length} key_length={frame.key_length} "
            f"payload_length={frame.payload_length}"
        )
    else:
        key_start = RING_HEADER_LENGTH + FRAME_KEY_OFFSET
        if (
            frame.key_length != len(key_bytes)
            or buf[key_start : key_start + frame.key_length] != key_bytes
        ):
            problem = "the segment holds another key"
    return problem, header, fields


__all__ = [
    "ARENA_FILE",
    "RING_FILE",
    "SEGMENT_FILE",
    "FileRule",
    "WalkedFrame",
    "corrupt_frame",
    "frame_problem",
    "load_frame_fields",
    "load_positions",
    "published_keys",
    "read_checked_ring_header",
    "ring_header_problem",
    "segment_problem",
    "walk_frames",
]
