"""A reader's index of one ring: key -> the position where the reader saw the key's frame.

Read `spec.ring` first. A reader finds a key's frame without walking the
ring on every get: it keeps an index of the frames it has already seen and,
whenever the head moved since, adds the frames published since (and only
those: never a rescan). The index is a *derived view* of the ring state,
not part of it: it may be behind the ring (frames claimed by another reader,
cancelled, re-put or reclaimed since the reader looked), and this module
says what it may and may not answer:

* It never answers a frame the model would not deliver. An entry is a
  candidate, and a get uses it only after checking the ring at that exact
  position (`get_index_answer`: a data frame of this key starts there and
  is deliverable; the implementation reads the frame header at claim). So a
  stale entry costs a miss, never a wrong frame.
* It never misses a frame it has seen. Every deliverable frame that starts
  below `scanned_to` is the entry of its key (`spec.invariants.
  check_reader_index`). A frame at or above `scanned_to` is one the reader
  has not seen yet; a get scans first whenever the head moved, so once it
  looks up a key, `scanned_to` is the head and the index answers exactly
  what `spec.ring.process_get` answers.
* Its entries die: with reclaim (an entry below the tail is dropped at the
  next scan), with re-put (the newer frame replaces the entry at the scan
  that sees it), with cancel, a competing reader's claim, close or a
  checksum failure (the get that finds the frame no longer deliverable drops
  the entry), and with wrap (a frame overwritten after a wrap lies below the
  tail). So the index never holds more entries than frames the ring held
  when the reader last scanned: its size is bounded by the ring's.

The position is the entry's generation: positions only grow, so a slot of
the data region reused after a wrap holds a frame at another position, and
an entry can never be mistaken for the newer frame there.

A get with a descriptor checks the exact frame the descriptor names
(`spec.ring.process_get` with `position`), and first asks the index whether
a newer frame of the key exists (`process_descriptor_get`): a producer whose
ring lock was busy may have published the newer frame before it could retire
the older one, and the newest frame of a key hides every older one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .layout import DATA_FRAME_TYPE, FRAME_STATE_PUBLISHED
from .ring import (
    ConsumeMode,
    Frame,
    GetResult,
    GetStatus,
    RingState,
    get_frame_at,
    is_deliverable,
    process_get,
)

# -- state -----------------------------------------------------------------


@dataclass
class ReaderIndex:
    """What one reader knows of one ring's frames."""

    # The reader has seen every frame that starts below this position (it is
    # the head the reader loaded at its last scan); never decreases, never
    # passes the ring's head.
    scanned_to: int = 0
    # key -> position of the newest frame of the key this reader saw
    # PUBLISHED. Every deliverable frame below `scanned_to` is its key's
    # entry; an entry at or above the tail names a data frame of its key
    # starting exactly there; no entry is at or above `scanned_to`.
    entries: dict[str, int] = field(default_factory=dict)


# -- predicates ------------------------------------------------------------


def is_index_behind(ring: RingState, index: ReaderIndex) -> bool:
    """The head moved since the reader's last scan: frames it has not seen may exist."""
    return index.scanned_to != ring.head


# -- accessors -------------------------------------------------------------


def get_index_answer(ring: RingState, index: ReaderIndex, key: str) -> Frame | None:
    """The frame a get by `key` may claim through the index, or None (a miss).

    The entry validated against the ring at its exact position: a data frame
    of `key` starts there and is deliverable. Anything else (no entry, a
    reclaimed position, another key there after a wrap, a frame claimed,
    retired or cancelled since the scan) is a miss.
    """
    position = index.entries.get(key)
    if position is None:
        return None
    frame = get_frame_at(ring, position)
    if frame is None or frame.frame_type != DATA_FRAME_TYPE or frame.key != key:
        return None
    if not is_deliverable(frame):
        return None
    return frame


# -- transitions -----------------------------------------------------------


def process_index_scan(ring: RingState, index: ReaderIndex) -> int:
    """Index the frames published since the last scan; answer how many frames it looked at.

    Entries the tail passed are dropped. Only frames at or above both
    `scanned_to` and the tail are read: a data frame seen PUBLISHED becomes
    its key's entry (replacing an older one: the older frame was retired by
    the put of this one); one seen in any other state drops an older entry
    of its key (a newer version exists, so the older one is not deliverable).
    """
    # Verify the reader never saw past the head
    assert index.scanned_to <= ring.head
    entries = index.entries
    for key in [key for key, position in entries.items() if position < ring.tail]:
        del entries[key]
    start = max(index.scanned_to, ring.tail)
    looked = 0
    for frame in ring.frames:
        if frame.position < start:
            continue
        looked += 1
        if frame.frame_type != DATA_FRAME_TYPE:
            continue
        if frame.state == FRAME_STATE_PUBLISHED:
            entries.pop(
                frame.key, None
            )  # the implementation keeps insertion order = position order
            entries[frame.key] = frame.position
        else:
            older = entries.get(frame.key)
            if older is not None and older < frame.position:
                del entries[frame.key]
    index.scanned_to = ring.head
    return looked


def process_index_forget(index: ReaderIndex, key: str, position: int) -> None:
    """A get found the entry's frame no longer deliverable: drop the entry (if it still names it)."""
    if index.entries.get(key) == position:
        del index.entries[key]


def process_indexed_get(
    ring: RingState,
    index: ReaderIndex,
    key: str,
    mode: ConsumeMode = ConsumeMode.COPY_OUT,
) -> GetResult:
    """A get by key through the index: scan if the head moved, look up, validate, claim.

    Answers what `spec.ring.process_get(ring, key, mode=mode)` answers (the
    index only changes how the frame is found): a closed ring delivers
    nothing and keeps the entry; a miss of the validation drops it; a claim
    drops it.
    """
    if is_index_behind(ring, index):
        process_index_scan(ring, index)
    position = index.entries.get(key)
    if position is None or ring.closed:
        return GetResult(GetStatus.NOT_FOUND)
    frame = get_index_answer(ring, index, key)
    del index.entries[key]
    if frame is None:
        return GetResult(GetStatus.NOT_FOUND)
    return process_get(ring, key, frame.position, mode)


def process_descriptor_get(
    ring: RingState,
    index: ReaderIndex,
    key: str,
    position: int,
    mode: ConsumeMode = ConsumeMode.COPY_OUT,
) -> GetResult:
    """A get with a descriptor: the exact frame at `position`, unless a newer frame of the key exists.

    A position that holds no data frame of `key` is STALE at once (no scan:
    the look costs no system call). Otherwise the index catches up if the
    head moved, and an entry of the key at another position is a newer
    version (entries only name the newest frame seen): STALE. Else what
    `spec.ring.process_get` answers for `position`. The index keeps its
    entries (a claim by descriptor leaves the key's entry to fail its own
    validation later).
    """
    frame = get_frame_at(ring, position)
    if frame is None or frame.frame_type != DATA_FRAME_TYPE or frame.key != key:
        return GetResult(GetStatus.STALE)
    if is_index_behind(ring, index):
        process_index_scan(ring, index)
    newest = index.entries.get(key)
    if newest is not None and newest != position:
        return GetResult(GetStatus.STALE)
    return process_get(ring, key, position, mode)


__all__ = [
    "ReaderIndex",
    "get_index_answer",
    "is_index_behind",
    "process_descriptor_get",
    "process_index_forget",
    "process_index_scan",
    "process_indexed_get",
]
