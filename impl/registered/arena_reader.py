"""The registered arena's receiver side: map an arena file and claim its frames as leases.

`ArenaReader` claims the frame an `ArenaFrameDescriptor` names (lease mode
of `shmring.spec.ring`, the holder's pid stored before CLAIMED) and hands
out a borrowed view of its payload, or a copy. The design rationale, and
the producer side, are `shmring.impl.registered.arena`'s, which re-exports
everything here.
"""

from __future__ import annotations

import mmap
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...spec.layout import (
    ARENA_KEY_LENGTH,
    ARENA_PAYLOAD_OFFSET,
    DATA_FRAME_TYPE,
    FRAME_ALIGNMENT,
    FRAME_HEADER_LENGTH,
    FRAME_STATE_CLAIMED,
    FRAME_STATE_DONE,
    FRAME_STATE_PUBLISHED,
    RING_HEADER_LENGTH,
    compute_frame_length,
    compute_ring_file_length,
)
from .. import frame_io
from ..directory import open_private_file
from ..errors import ClosedError, CorruptFrameError, StaleDescriptorError
from ..names import validate_transfer_file_name
from ..os_seam import DEFAULT_OS, OsFacade
from ..ring.borrow import mark_frame_done
from ..ring.frames import (
    ARENA_FILE,
    corrupt_frame,
    frame_problem,
    load_frame_fields,
    read_checked_ring_header,
)
from ..ring.mapping import _FrameShapes
from .views import borrow


def compute_arena_frame_length(nbytes: int) -> int:
    return compute_frame_length(ARENA_KEY_LENGTH, nbytes)


@dataclass(frozen=True)
class ArenaFrameDescriptor:
    """What the receiver needs to claim one published arena frame."""

    arena: str  # arena file name in the deployment directory
    position: int  # logical ring position of the frame
    key: str  # the frame's key (16 hex digits)
    nbytes: int  # payload bytes


class ArenaReader:
    """Receiver side of one arena: maps the file and claims its frames.

    The reader's mapping is shared by every lease it hands out; each lease
    holds an export of it, so `close` never unmaps memory a view still
    reads: the mapping then closes when its last lease dies.
    """

    _mapping: Any = None
    _buf: memoryview | None = None
    _words: Any = None

    def __init__(self, directory: str, name: str, os_facade: OsFacade = DEFAULT_OS) -> None:
        validate_transfer_file_name(name)
        self.name = name
        path = os.path.join(directory, name)
        fd, info = open_private_file(path, os_facade, "arena file")
        try:
            if info.st_size < RING_HEADER_LENGTH:
                raise CorruptFrameError(f"arena file too short: path={path!r} size={info.st_size}")
            self.file_info = info  # the file mapped (`TransferReceiver` checks it)
            self.identity = (info.st_dev, info.st_ino)
            self.owner_uid = info.st_uid
            self._mapping = os_facade.mmap(fd, info.st_size)
        finally:
            os_facade.close(fd)
        self._buf = memoryview(self._mapping)
        header, problem = read_checked_ring_header(self._buf, info.st_size, ARENA_FILE)
        if problem is not None:
            self.close()
            raise CorruptFrameError(f"not a valid arena header: {problem}; path={path!r}")
        self.capacity = header.capacity
        self._shapes = _FrameShapes(header.capacity)
        with self._buf[: compute_ring_file_length(header.capacity)] as arena:
            self._words = frame_io.SharedWords(arena)  # whole words: header + aligned capacity
        # Map every page into this process now (one read per page), so a
        # borrow never pays first-touch page faults: the arena is long-lived.
        int(np.frombuffer(self._mapping, dtype=np.uint8)[:: mmap.PAGESIZE].sum())

    def _claim(self, descriptor: ArenaFrameDescriptor) -> int:
        """Validate the descriptor's frame and mark it claimed; answer its file offset.

        `spec.ring.process_get` with a descriptor, in lease mode. The frame
        header is checked like the host ring's (`ring.frames.frame_problem`,
        read below the head, then the tail re-loaded). StaleDescriptorError,
        like the ring's STALE: the frame was reclaimed (the tail passed it),
        or the valid frame at that position is not the descriptor's or not
        PUBLISHED (received already). CorruptFrameError: the descriptor does
        not fit this arena, or the header there fails validation.
        """
        buf = self._buf
        words = self._words
        if buf is None:
            raise ClosedError(f"arena reader is closed: name={self.name!r}")
        if descriptor.arena != self.name:
            raise CorruptFrameError(
                f"descriptor names another arena: {descriptor.arena!r} != {self.name!r}"
            )
        capacity = self.capacity
        frame_length = compute_arena_frame_length(descriptor.nbytes)
        position = descriptor.position
        physical = position % capacity
        if position < 0 or physical % FRAME_ALIGNMENT or physical + frame_length > capacity:
            raise CorruptFrameError(f"arena descriptor out of bounds: {descriptor}")
        offset = RING_HEADER_LENGTH + physical
        head = frame_io.load_head_acquire(words)
        fields = load_frame_fields(buf, offset, capacity)
        key = bytes(buf[offset + FRAME_HEADER_LENGTH : offset + ARENA_PAYLOAD_OFFSET])
        if frame_io.load_tail_acquire(words) > position:  # reclaimed, maybe rewritten under us
            raise StaleDescriptorError(f"arena frame reclaimed: {descriptor}")
        problem = frame_problem(position, head, fields, capacity, self._shapes)
        if problem is not None:
            raise corrupt_frame(position, problem, self.name)
        length, frame_type, state, key_length, payload_length, _, _ = fields
        if (
            length != frame_length
            or frame_type != DATA_FRAME_TYPE
            or key_length != ARENA_KEY_LENGTH
            or payload_length != descriptor.nbytes
            or key != descriptor.key.encode("ascii", "replace")
        ):
            raise StaleDescriptorError(
                f"arena frame at the descriptor's position is another one: {descriptor}"
            )
        if state != FRAME_STATE_PUBLISHED:
            raise StaleDescriptorError(
                f"arena frame not published (already claimed?): state={state} {descriptor}"
            )
        # The holder first, then CLAIMED (release): a producer that loads
        # CLAIMED reads this process as the holder (see `is_holder_alive`).
        frame_io.store_frame_holder_pid(words, offset, os.getpid())
        frame_io.store_frame_state_release(words, offset, FRAME_STATE_CLAIMED)
        return offset

    def borrow(
        self, descriptor: ArenaFrameDescriptor, dtype: np.dtype[Any] | str, shape: tuple[int, ...]
    ) -> np.ndarray:
        """A borrowed, writable view of the frame's payload.

        The frame belongs to this receiver until the last object derived from
        the view dies; then it is marked DONE in the shared header and the
        producer may reuse its bytes.
        """
        offset = self._claim(descriptor)
        frame_length = compute_arena_frame_length(descriptor.nbytes)
        keep = np.frombuffer(self._mapping, dtype=np.uint8, count=frame_length, offset=offset)
        return borrow(
            keep,
            ARENA_PAYLOAD_OFFSET,
            dtype,
            shape,
            release=mark_frame_done,
            label=f"arena {self.name} position {descriptor.position}",
        )

    def copy(
        self, descriptor: ArenaFrameDescriptor, dtype: np.dtype[Any] | str, shape: tuple[int, ...]
    ) -> np.ndarray:
        """An independently owned copy of the payload; the frame is done on return."""
        offset = self._claim(descriptor)
        assert self._buf is not None
        start = offset + ARENA_PAYLOAD_OFFSET
        try:
            wire = np.dtype(dtype)
            count = int(np.prod(shape, dtype=np.int64))
            copied = (
                np.frombuffer(self._mapping, dtype=wire, count=count, offset=start)
                .reshape(shape)
                .copy()
            )
        finally:
            frame_io.store_frame_state_release(self._words, offset, FRAME_STATE_DONE)
        return copied

    def frame_state(self, position: int) -> int:
        if self._buf is None:
            raise ClosedError(f"arena reader is closed: name={self.name!r}")
        return frame_io.load_frame_state_acquire(
            self._words, RING_HEADER_LENGTH + position % self.capacity
        )

    def close(self) -> None:
        """Drop the reader's mapping; live leases keep it until they end. Idempotent."""
        words, self._words = self._words, None
        buf, self._buf = self._buf, None
        mapping, self._mapping = self._mapping, None
        frame_io.release_mapping(words, buf, mapping)  # leases alive: closes with the last

    def __enter__(self) -> ArenaReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = [
    "ArenaFrameDescriptor",
    "ArenaReader",
    "compute_arena_frame_length",
]
