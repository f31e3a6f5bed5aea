"""The ring file's mapping, and the pieces the producer and the readers share."""

from __future__ import annotations

import fcntl
import mmap
import os
from typing import Final

from ...spec.layout import (
    FRAME_ALIGNMENT,
    FRAME_STATE_CLAIMED,
    FRAME_STATE_DONE,
    FRAME_STATE_PUBLISHED,
    FRAME_STATE_RETIRED,
    RING_HEADER_LENGTH,
    compute_frame_length,
)
from ...spec.ring import (
    is_admitted,
)
from ..directory import Directory, PathDirectory
from ..errors import (
    ClosedError,
    CorruptFrameError,
)
from ..frame_io import (
    SharedWords,
    release_mapping,
)
from ..os_seam import (
    OsFacade,
)

Buffer = bytes | bytearray | memoryview  # what put copies from (any C-contiguous buffer)
# (length, type, state, key length, payload length, position, checksum) of a frame header
FrameFields = tuple[int, int, int, int, int, int, int]

_PAGE_SIZE: Final = mmap.PAGESIZE
_LOCK: Final = fcntl.LOCK_EX
_TRY_LOCK: Final = fcntl.LOCK_EX | fcntl.LOCK_NB
_UNLOCK: Final = fcntl.LOCK_UN
_ZERO_FILL: Final = bytes(FRAME_ALIGNMENT)
_KNOWN_STATES: Final = frozenset(
    (FRAME_STATE_PUBLISHED, FRAME_STATE_CLAIMED, FRAME_STATE_DONE, FRAME_STATE_RETIRED)
)
# Bounded retries of a lock-free read that raced with the producer.
_MAX_RACE_RETRIES: Final = 64


# -- shared pieces -------------------------------------------------------------


# Builds a NamedTuple from all its fields without its Python-level __new__ (hot paths).
_new_outcome: Final = tuple.__new__


def _data_offset(position: int, capacity: int) -> int:
    """Offset in the mapping of the byte at logical `position`."""
    return RING_HEADER_LENGTH + position % capacity


class _FrameShapes(dict[tuple[int, int], int]):
    """(key length, payload length) -> frame length when this ring admits it, else minus it.

    The numbers come from the model's helpers (`compute_frame_length`,
    `is_admitted`) on the first sight of a shape; afterwards a lookup is one
    dict probe, which is what the per-message paths pay. Bounded: forgotten
    wholesale past `_LIMIT` shapes.
    """

    __slots__ = ("capacity",)
    _LIMIT: Final = 4096

    def __init__(self, capacity: int) -> None:
        super().__init__()
        self.capacity = capacity

    def __missing__(self, shape: tuple[int, int]) -> int:
        key_length, payload_length = shape
        frame_length = compute_frame_length(key_length, payload_length)
        value = (
            frame_length if is_admitted(self.capacity, key_length, frame_length) else -frame_length
        )
        if len(self) >= self._LIMIT:
            self.clear()
        self[shape] = value
        return value


def _corrupt(message: str) -> CorruptFrameError:
    return CorruptFrameError(message)


class _RingFile:
    """What producer and reader share: a mapped ring file and its lock."""

    # Class-level defaults make close() idempotent, also after a failed setup.
    _fd: int = -1
    _mapping: mmap.mmap | None = None
    _buf: memoryview | None = None  # writable view of the whole mapping
    _words: SharedWords | None = None  # the mapping's shared fields (once its size is known good)
    _capacity: int = 0
    _file_length: int = 0  # the bytes mapped: the file must stay at least this long
    _locks: int = 0
    _shapes: _FrameShapes  # per ring, set once the capacity is known

    def __init__(self, path: str, os_facade: OsFacade, directory: Directory | None = None) -> None:
        self.path = path
        self._os = os_facade
        # Every file operation goes through the directory (a verified
        # descriptor for a connector's rings; by path for a standalone ring).
        self._dir = (
            directory if directory is not None else PathDirectory(os.path.dirname(path), os_facade)
        )

    @property
    def capacity(self) -> int:
        return self._capacity

    def _require_buf(self) -> memoryview:
        buf = self._buf
        if buf is None:
            raise ClosedError(f"ring channel is closed: path={self.path!r}")
        return buf

    def _require_words(self) -> SharedWords:
        words = self._words
        if words is None or self._buf is None:
            raise ClosedError(f"ring channel is closed: path={self.path!r}")
        return words

    def _shrink_problem(self) -> str | None:
        """Why the mapping may not be touched now: the file is shorter than what is mapped.

        A same-uid neighbour can truncate the file (issue 22, defect 3);
        touching a mapped page past the new end is SIGBUS, which kills the
        process. One lseek (the size) before the bytes are touched turns that into a
        typed refusal; a truncation landing between this check and the
        access still faults (docs/threat-model.md, "SIGBUS").
        """
        try:
            size = self._os.file_size(self._fd)
        except OSError:
            return None  # cannot tell (an injected fault): see `_shrunk_now`
        if size < self._file_length:
            return (
                f"ring file shrank under its mapping (a neighbour truncated it): "
                f"size={size} mapped={self._file_length} path={self.path!r}"
            )
        return None

    def _shrunk_now(self) -> bool:
        """One lseek: whether the file is shorter than the mapping (`_shrink_problem`).

        A failing size check of our own descriptor (only ever an injected fault)
        cannot tell, and the file is taken as whole: refusing would consume
        a deliverable frame for a fault that says nothing about the file.
        """
        try:
            return self._os.file_size(self._fd) < self._file_length
        except OSError:
            return False

    def _release_mapping(self) -> None:
        """Unmap and close the descriptor; keep the mapping if views of it still live."""
        words, self._words = self._words, None
        buf, self._buf = self._buf, None
        mapping, self._mapping = self._mapping, None
        release_mapping(words, buf, mapping)
        fd, self._fd = self._fd, -1
        if fd >= 0:
            self._os.close(fd)
