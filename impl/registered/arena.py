"""The registered arena: one persistent, CUDA-registered ring of frames.

Design rationale. Allocating, registering, unregistering and unmapping a
segment per transfer made small videos 42-49% slower in the seed (the
registration is a page-locking system call, and every new mapping
page-faults). The arena pays that once: one shared-memory file in the ring
layout of `shmring.spec.layout`, registered once with the driver for its
whole life. A transfer reserves a frame, the device-to-host copy lands in
the frame's payload (then the stream is synchronized), and the frame is
published by storing its length last (`frame_io.store_frame_length_release`).

Frames are consumed in the ring model's *lease* mode (`shmring.spec.ring`):
the receiver claims a frame (state CLAIMED, written in the shared frame
header) and borrows it; when the last view of it dies the frame becomes
DONE, in whichever process holds it and in whatever order leases end.
Reclaim advances the tail over DONE and padding frames in position order
and stops at the first frame still published or claimed by a live holder.

A claim records the claiming process's pid in the frame header (stored
before CLAIMED), so a lease outlives no process: when reclaim meets a
claimed frame whose holder is dead (killed, say, before its views died), it
marks the frame DONE and goes on (`shmring.spec.leases.process_holder_exit`).
Death is detected by pid: pid reuse can only make a dead holder look alive,
which delays the reclaim until the new process with that pid exits, and is
never unsafe; any doubt (an error asking the OS) also counts as alive.

A payload the ring does not admit (larger than a quarter of the arena) or
that arrives while the arena is full is not the arena's business: `reserve`
answers the ring model's refusal and the caller takes a per-transfer
registered segment.

Arena frame keys are 16 ASCII hex digits of a sequence number, so every
payload starts 16-byte aligned (frame start, 32-byte header, 16-byte key).
The frame checksum covers the key only: checksumming payloads the device
wrote would read every byte on the CPU, which is what the arena avoids.

The receiver side (`ArenaReader`, and the `ArenaFrameDescriptor` it
claims by) is `shmring.impl.registered.arena_reader`'s, re-exported here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from ...spec.layout import (
    ARENA_KEY_LENGTH,
    ARENA_PAYLOAD_OFFSET,
    FRAME_KEY_OFFSET,
    RING_HEADER_LENGTH,
    RING_STATE_CLOSED,
    RING_STATE_OPEN,
    compute_ring_file_length,
)
from ...spec.ring import PutStatus, compute_capacity_error
from .. import frame_io
from ..errors import ClosedError, ConfigurationError
from ..extras import import_extra
from ..liveness import is_holder_alive
from ..names import arena_file_name, current_producer_identity
from ..ring.engine import RingProducer
from ..ring.mapping import _data_offset

# The receiver side has its own module; it is re-exported here (see
# __all__) for the importers, which take it from arena.
from .arena_reader import ArenaFrameDescriptor, ArenaReader, compute_arena_frame_length
from .registration import (
    RegisteredRange,
    Registry,
    ShmFile,
    copy_into_host,
    host_view,
)

if TYPE_CHECKING:
    import torch
else:  # the `torch` extra: a MissingExtraError naming it when absent
    torch = import_extra("torch", "the registered transfer (shmring.impl.registered)")

# Default arena: the largest ring capacity (frames up to a quarter of it are admitted).
DEFAULT_ARENA_CAPACITY: Final = 64 * 1024 * 1024


def arena_key(sequence: int) -> str:
    """The 16-character key of the arena frame with this sequence number."""
    return f"{sequence:0{ARENA_KEY_LENGTH}x}"


@dataclass
class ArenaReservation:
    """A frame reserved at the producer, not yet published (Aeron's BufferClaim)."""

    position: int  # where the frame will start
    padding: int  # padding bytes written before it at commit
    key: str
    nbytes: int
    frame_length: int
    frame_offset: int  # byte offset of the frame in the file


@dataclass(frozen=True)
class ArenaStatistics:
    """Counters of a producer's arena."""

    capacity: int  # data region bytes
    head: int  # next position to publish at
    tail: int  # oldest unreclaimed position
    published: int  # frames published, ever
    refused_not_admitted: int  # reservations refused as too large
    refused_full: int  # reservations refused for lack of space
    aborted: int  # reservations dropped before publication
    reclaimed_from_dead_holders: int  # claimed frames freed because their holder died
    registered: bool  # the arena's range is registered with the driver now


class RegisteredArena(RingProducer):
    """Producer side of the arena: owns the file, the mapping and its registration.

    The ring mechanics are the producer engine's (`shmring.impl.ring.engine`),
    the host ring's own: `reserve` is its `_reserve`, `commit` its
    `_commit` per pending reservation, `reclaim` its `_reclaim` with the
    dead-holder policy. Single-threaded: one producer thread reserves,
    copies and commits.
    """

    _file: ShmFile | None = None
    _range: RegisteredRange | None = None
    _payload: torch.Tensor | None = None
    _FREE_DEAD_HOLDERS_AT_EVERY_RECLAIM = True  # a dead holder's frame goes at the next reserve

    def __init__(self, registry: Registry, capacity: int = DEFAULT_ARENA_CAPACITY) -> None:
        error = compute_capacity_error(capacity)
        if error is not None or capacity == 0:
            raise ConfigurationError(
                error or f"arena capacity must be positive: capacity={capacity}"
            )
        self.registry = registry
        self.capacity = capacity
        self._os = registry._os
        pid, start_time = current_producer_identity(self._os)
        file = ShmFile(
            registry.files,
            arena_file_name(self._os),
            compute_ring_file_length(capacity),
            self._os,
        )
        try:
            # Touch every page once now, so no transfer pays first-touch page
            # faults (registration pins them on a GPU anyway).
            file.tensor[RING_HEADER_LENGTH:].zero_()
            with file.memoryview() as buf:
                frame_io.write_ring_header(buf, capacity, pid, start_time, RING_STATE_OPEN)
            self._range = registry.register_range(
                file.address, file.length, f"arena {file.name}", self._release_file
            )
        except BaseException:
            file.unmap()
            file.unlink()
            raise
        self._file = file
        self._buf = file.memoryview()
        self._words = frame_io.SharedWords(self._buf)
        self._payload = file.tensor
        self.name = file.name
        self.identity = file.identity  # (st_dev, st_ino): descriptors carry it
        self.owner_uid = file.owner_uid
        self._start_producer(capacity)
        self._sequence = 0
        self._pending: list[ArenaReservation] = []
        self._aborted = 0

    # -- state ----------------------------------------------------------------

    def statistics(self) -> ArenaStatistics:
        return ArenaStatistics(
            capacity=self.capacity,
            head=self._head,
            tail=self._tail,
            published=self._puts,
            refused_not_admitted=self._refused_not_admitted,
            refused_full=self._refused_full,
            aborted=self._aborted,
            reclaimed_from_dead_holders=self._reclaimed_from_dead_holders,
            registered=self._range is not None and self._range.registered,
        )

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError(f"arena is closed: name={self.name!r}")

    def _release_exports(self) -> None:
        """`lifecycle.release_inherited` in a forked child: drop the payload tensor over the file."""
        self._payload = None

    def _require_payload(self) -> torch.Tensor:
        if self._payload is None:
            raise ClosedError(f"arena is closed: name={self.name!r}")
        return self._payload

    # -- producer protocol ----------------------------------------------------

    def reclaim(self) -> int:
        """Advance the tail over done, retired and padding frames; answer the bytes freed.

        `spec.ring.process_reclaim` with the dead-holder policy (the engine's
        `_reclaim(free_dead_holders=True)`): a claimed frame whose holder is
        dead is marked DONE and freed with them (see `is_holder_alive` for
        what "dead" means).
        """
        return self._reclaim(True)

    def reserve(self, nbytes: int) -> ArenaReservation | PutStatus:
        """Reserve a frame for `nbytes` after the pending ones, or answer why not.

        `spec.ring.process_put` up to the reservation (admission, then the
        engine's `_reserve`). NOT_ADMITTED and FULL mean: take a
        per-transfer segment. Only the slot's length is written (zero) until
        `commit`.
        """
        self._check_open()
        if nbytes < 0:
            raise ValueError(f"payload length must not be negative: nbytes={nbytes}")
        frame_length = self._shapes[ARENA_KEY_LENGTH, nbytes]
        if frame_length < 0:  # the model's is_admitted said no
            self._refused_not_admitted += 1
            return PutStatus.NOT_ADMITTED
        head = self._pending_head()
        padding = self._reserve(head, frame_length)
        if padding < 0:
            return PutStatus.FULL
        position = head + padding
        reservation = ArenaReservation(
            position=position,
            padding=padding,
            key=arena_key(self._sequence),
            nbytes=nbytes,
            frame_length=frame_length,
            frame_offset=_data_offset(position, self.capacity),
        )
        self._sequence += 1
        self._pending.append(reservation)
        return reservation

    def _pending_head(self) -> int:
        if self._pending:
            last = self._pending[-1]
            return last.position + last.frame_length
        return self._head

    def copy_into(self, reservation: ArenaReservation, src: torch.Tensor) -> None:
        """Device-to-host copy of `src`'s wire bits into the reserved payload, synchronized."""
        start = reservation.frame_offset + ARENA_PAYLOAD_OFFSET
        copy_into_host(self.registry.driver, host_view(self._require_payload(), start, src), src)

    def commit(self) -> list[ArenaFrameDescriptor]:
        """Publish every pending reservation in order: the key, then the engine's `_commit`.

        The rest of `spec.ring.process_put` for each (padding first, length
        last, then head); the wake-up sequence once, after the last head.
        """
        self._check_open()
        buf = self._buf
        assert buf is not None  # open
        pending = self._pending
        last = len(pending) - 1
        published = []
        for index, reservation in enumerate(pending):
            key = reservation.key.encode("ascii")
            offset = reservation.frame_offset
            buf[offset + FRAME_KEY_OFFSET : offset + ARENA_PAYLOAD_OFFSET] = key
            self._commit(
                reservation.position,
                reservation.padding,
                reservation.frame_length,
                reservation.key,
                ARENA_KEY_LENGTH,
                reservation.nbytes,
                frame_io.compute_checksum(key, b""),
                index == last,
            )
            published.append(
                ArenaFrameDescriptor(
                    self.name, reservation.position, reservation.key, reservation.nbytes
                )
            )
        self._pending = []
        return published

    def abort(self) -> int:
        """Drop every pending reservation; nothing was published. Answers how many.

        Nothing to undo: a reservation wrote only a zero length, in free
        space above head (see `shmring.impl.ring.engine`).
        """
        dropped = len(self._pending)
        self._aborted += dropped
        self._pending = []
        return dropped

    def put(self, src: torch.Tensor) -> ArenaFrameDescriptor | PutStatus:
        """Reserve, copy and publish one tensor; the refusal when the arena cannot take it."""
        nbytes = src.numel() * src.element_size()
        reservation = self.reserve(nbytes)
        if isinstance(reservation, PutStatus):
            return reservation
        try:
            self.copy_into(reservation, src)
        except BaseException:
            self.abort()
            raise
        return self.commit()[0]

    # -- close ------------------------------------------------------------------

    def close(self) -> None:
        """Unregister and remove the arena. Idempotent.

        If the unregister fails for good the registry is poisoned and the
        arena's mapping and name are kept (the driver may still hold the
        pages); RegistryPoisonedError is raised.
        """
        if self._closed:
            if self._range is None or not self._range.registered:
                self._release_file()  # retries an unlink that failed
            return
        self._closed = True
        self._pending = []
        file = self._file
        if file is None:
            return
        frame_io.store_ring_state_release(self._words, RING_STATE_CLOSED)
        if self._range is not None and self._range.registered:
            # Raises RegistryPoisonedError when retained: the mapping stays until
            # a late unregister at registry close succeeds (`_release_file`).
            self.registry.unregister_range(self._range)
        self._release_file()

    def _release_file(self) -> None:
        """Unmap and unlink the arena file (only once nothing is registered).

        The file is forgotten only once its name is gone, so a failed unlink
        is retried by the next `close`.
        """
        file = self._file
        if file is None:
            return
        self._words.release()
        self._buf.release()
        self._payload = None
        file.unmap()
        file.unlink()
        self._file = None

    def __enter__(self) -> RegisteredArena:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = [
    "ARENA_KEY_LENGTH",
    "ARENA_PAYLOAD_OFFSET",
    "DEFAULT_ARENA_CAPACITY",
    "ArenaFrameDescriptor",
    "ArenaReader",
    "ArenaReservation",
    "ArenaStatistics",
    "RegisteredArena",
    "arena_key",
    "compute_arena_frame_length",
    "is_holder_alive",
]
