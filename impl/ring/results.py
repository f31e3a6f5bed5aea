"""What a ring put or get answers, and a ring's statistics (see `shmring.impl.ring`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final, NamedTuple

from ...spec import status as _status
from ...spec.ring import (
    PutStatus,
)

# -- results -------------------------------------------------------------------


class PutOutcome(NamedTuple):
    """What a put did; field for field `shmring.spec.ring.PutResult`."""

    status: PutStatus
    position: int | None = None  # the descriptor: where the frame was published
    frame_length: int = 0  # bytes the frame occupies (also when refused)
    padding: int = 0  # bytes of padding written before the frame
    retired: int = 0  # older versions of the key retired by this put (0 or 1)


ReceiveStatus = (
    _status.GetStatus
)  # DELIVERED, NOT_FOUND, STALE, BUSY (`spec.status`: one vocabulary)


class Received(NamedTuple):
    """What a get answered."""

    status: ReceiveStatus
    position: int | None = None  # position of the claimed frame
    payload: Any = None  # copy-out: the decoded, independently owned value; lease: a `Lease`


_DELIVERED: Final = ReceiveStatus.DELIVERED
_PUT_CLOSED: Final = PutOutcome(PutStatus.CLOSED)
_NOT_FOUND: Final = Received(ReceiveStatus.NOT_FOUND)
_STALE: Final = Received(ReceiveStatus.STALE)
_BUSY: Final = Received(ReceiveStatus.BUSY)


@dataclass(frozen=True)
class RingStatistics:
    """A snapshot of one ring, as one producer or one reader sees it."""

    capacity: int  # data region bytes; never changes
    head: int  # position where the next frame starts
    tail: int  # position of the oldest unreclaimed frame
    used_bytes: int  # head - tail: bytes held by unreclaimed frames (padding included)
    free_bytes: int  # capacity - used_bytes
    published_frames: int  # deliverable frames between tail and head
    claimed_frames: int  # frames leased and not yet released
    closed: bool  # the producer closed the ring
    puts: int  # frames this object published (producer; 0 for a reader)
    refused_not_admitted: int  # puts refused as too large (producer)
    refused_full: int  # puts refused for lack of space now (producer)
    retired: int  # frames this object retired: re-put, cancel, close (producer)
    gets: int  # frames this object claimed (reader; 0 for a producer)
    busy: int  # gets answered BUSY because another process held the lock (reader)
    locks: int  # ring locks this object took
    reclaimed_from_dead_holders: int = (
        0  # claimed frames freed because their lease holder died (producer)
    )
    skipped: int = 0  # gets that saw, without the lock, the frame claimed by another reader
