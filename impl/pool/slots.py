"""One pool slot file: its header words, its creation, its validation.

The layout is `spec.layout`'s pool block; every field several processes
touch (generation, state, holder, payload length, checksum, flags) goes
through `frame_io.SharedWords` over the header page, one aligned load or
store each. The fields written once at creation (magic .. slot index) are
packed in one go before any other process can know the file exists (its
index appears in a reference only after the slot's first publish).

`slot_problem` is the one check a consumer runs before it trusts a slot's
bytes; it answers a reason (CorruptFrameError's message) or None, and never
reads outside the mapping: the capacity is checked against the file's size
before a payload offset is computed.
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import struct
from dataclasses import dataclass
from typing import Final

from ...spec.layout import (
    POOL_CHECKSUM_OFFSET,
    POOL_FLAGS_OFFSET,
    POOL_GENERATION_OFFSET,
    POOL_HOLDER_PID_OFFSET,
    POOL_IDENTITY_FORMAT,
    POOL_MAGIC,
    POOL_PAYLOAD_LENGTH_OFFSET,
    POOL_SLOT_FREE,
    POOL_SLOT_HEADER_LENGTH,
    POOL_SLOT_STATE_NAMES,
    POOL_STATE_OFFSET,
    POOL_VERSION,
    compute_slot_file_length,
)
from ..directory import Directory
from ..errors import NoSpaceError
from ..frame_io import SharedWords, release_mapping
from ..os_seam import OPEN_FLAGS_CREATE, OsFacade, SharedMapping

_IDENTITY: Final = struct.Struct(POOL_IDENTITY_FORMAT)
_NO_SPACE_ERRNOS: Final = (errno.ENOSPC, errno.EDQUOT)

assert POOL_GENERATION_OFFSET % 8 == 0 and POOL_PAYLOAD_LENGTH_OFFSET % 8 == 0
assert POOL_CHECKSUM_OFFSET % 8 == 0 and POOL_STATE_OFFSET % 4 == 0
assert POOL_HOLDER_PID_OFFSET % 4 == 0 and POOL_FLAGS_OFFSET % 4 == 0
assert POOL_SLOT_HEADER_LENGTH % 8 == 0


# -- shared words -----------------------------------------------------------------


def load_slot_state_acquire(words: SharedWords) -> int:
    return words.u32[POOL_STATE_OFFSET >> 2]


def store_slot_state_release(words: SharedWords, state: int) -> None:
    """The last store of a publish (PUBLISHED) or a claim (CLAIMED): everything before is visible."""
    words.u32[POOL_STATE_OFFSET >> 2] = state


def load_slot_holder_pid(words: SharedWords) -> int:
    return words.u32[POOL_HOLDER_PID_OFFSET >> 2]


def store_slot_holder_pid(words: SharedWords, pid: int) -> None:
    """Before CLAIMED, so a producer that loads CLAIMED reads the holder that claimed it."""
    words.u32[POOL_HOLDER_PID_OFFSET >> 2] = pid


def load_slot_generation(words: SharedWords) -> int:
    return words.u64[POOL_GENERATION_OFFSET >> 3]


def load_slot_payload_fields(words: SharedWords) -> tuple[int, int, int]:
    """(payload length, checksum, flags) of the last publish."""
    return (
        words.u64[POOL_PAYLOAD_LENGTH_OFFSET >> 3],
        words.u64[POOL_CHECKSUM_OFFSET >> 3],
        words.u32[POOL_FLAGS_OFFSET >> 2],
    )


def store_slot_publish_fields(
    words: SharedWords, generation: int, payload_length: int, checksum: int, flags: int
) -> None:
    """Everything a publish writes before its state: length, checksum, flags, generation, no holder."""
    words.u64[POOL_PAYLOAD_LENGTH_OFFSET >> 3] = payload_length
    words.u64[POOL_CHECKSUM_OFFSET >> 3] = checksum
    words.u32[POOL_FLAGS_OFFSET >> 2] = flags
    words.u64[POOL_GENERATION_OFFSET >> 3] = generation
    words.u32[POOL_HOLDER_PID_OFFSET >> 2] = 0


# -- identity fields and validation --------------------------------------------------


@dataclass(frozen=True)
class SlotIdentity:
    """The fields a slot's creator writes once."""

    magic: int
    version: int
    header_length: int
    capacity: int
    pid: int
    start_time: int
    instance: int
    index: int


def read_slot_identity(buf: memoryview) -> SlotIdentity:
    """The creation fields of a header (the caller checked the buffer holds a header)."""
    return SlotIdentity(*_IDENTITY.unpack_from(buf, 0))


def slot_problem(
    identity: SlotIdentity, file_length: int, producer: tuple[int, int, int], index: int
) -> str | None:
    """Why a slot file may not be trusted as slot `index` of `producer`, or None."""
    if identity.magic != POOL_MAGIC:
        return f"bad pool slot magic={identity.magic:#x}"
    if identity.version != POOL_VERSION:
        return f"unknown pool slot version={identity.version}"
    if identity.header_length != POOL_SLOT_HEADER_LENGTH:
        return f"bad pool slot header length={identity.header_length}"
    if compute_slot_file_length(identity.capacity) > file_length:
        return f"pool slot capacity={identity.capacity} beyond its file of {file_length} bytes"
    named = (identity.pid, identity.start_time, identity.instance)
    if named != tuple(producer) or identity.index != index:
        return (
            f"pool slot names producer={named} index={identity.index}, "
            f"expected producer={tuple(producer)} index={index}"
        )
    return None


def state_name(state: int) -> str:
    return POOL_SLOT_STATE_NAMES.get(state, f"invalid ({state})")


# -- a mapped slot file ---------------------------------------------------------------------


class SlotMapping:
    """A slot file mapped read-write: header words and the whole mapping. Close is idempotent.

    The mapping is `OsFacade.map_shared`'s, which holds no descriptor; `fd`
    is -1 unless the holder kept one (the consumer does, to see an unlinked
    file): a producer's slot costs no descriptor (issue 22, defect 5).
    Closing drops our references; the pages are unmapped at once, or when
    the last borrowed view made from `buf` dies.
    """

    _fd: int = -1
    _mapping: SharedMapping | mmap.mmap | None = None
    _buf: memoryview | None = None
    words: SharedWords | None = None

    def __init__(
        self, fd: int, mapping: SharedMapping | mmap.mmap, file_length: int, os_facade: OsFacade
    ) -> None:
        self._os = os_facade
        self._fd = fd
        self._mapping = mapping
        self.file_length = file_length
        self._buf = memoryview(mapping).cast("B")
        self.words = SharedWords(self._buf[:POOL_SLOT_HEADER_LENGTH])

    @property
    def fd(self) -> int:
        return self._fd

    @property
    def mapping(self) -> SharedMapping | mmap.mmap:
        assert self._mapping is not None  # open
        return self._mapping

    @property
    def buf(self) -> memoryview:
        assert self._buf is not None  # open
        return self._buf

    def close(self) -> None:
        self._release_exports()
        fd, self._fd = self._fd, -1
        if fd >= 0:
            self._os.close(fd)

    def _release_exports(self) -> None:
        """`lifecycle.release_inherited` in a forked child: drop the mapping, never the descriptor.

        A descriptor the child inherited is `lifecycle`'s to close (it checks
        that the number still names the file of the fork); the ctypes mapping
        is unmapped once nothing refers to it (a SharedMapping has no close:
        dropping it here unmaps it, or its last view does).
        """
        words, self.words = self.words, None
        buf, self._buf = self._buf, None
        mapping, self._mapping = self._mapping, None
        release_mapping(words, buf, mapping if isinstance(mapping, mmap.mmap) else None)


def _typed(error: OSError, capacity: int) -> OSError:
    """ENOSPC / EDQUOT as NoSpaceError (with its errno); any other OSError as it is."""
    if error.errno not in _NO_SPACE_ERRNOS:
        return error
    return NoSpaceError(
        f"no space for a pool slot of {capacity} bytes: {os.strerror(error.errno or 0)}",
        error.errno or errno.ENOSPC,
    )


def create_slot_file(
    directory: Directory,
    name: str,
    producer: tuple[int, int, int],
    index: int,
    capacity: int,
    os_facade: OsFacade,
) -> SlotMapping:
    """Create, reserve (fallocate: ENOSPC here, never a SIGBUS later) and map a FREE slot.

    `capacity` is the payload bytes it holds (`layout.compute_slot_capacity`
    of its class: class + headroom), stored in the header's capacity field.

    NoSpaceError when the OS has no room; any failure leaves no file behind.
    """
    length = compute_slot_file_length(capacity)
    try:
        fd = directory.open(name, OPEN_FLAGS_CREATE)
    except OSError as error:
        raise _typed(error, capacity) from error
    try:
        try:
            os_facade.ftruncate(fd, length)
            os_facade.fallocate(fd, length)
            # Map, then close: the mapping holds no descriptor (issue 22, defect 5).
            slot = SlotMapping(-1, os_facade.map_shared(fd, length), length, os_facade)
        finally:
            os_facade.close(fd)
    except BaseException as error:
        with contextlib.suppress(OSError):
            directory.unlink(name)
        if isinstance(error, OSError):
            raise _typed(error, capacity) from error
        raise
    words = slot.words
    assert words is not None
    _IDENTITY.pack_into(
        slot.buf,
        0,
        POOL_MAGIC,
        POOL_VERSION,
        POOL_SLOT_HEADER_LENGTH,
        capacity,
        producer[0],
        producer[1],
        producer[2],
        index,
    )
    store_slot_publish_fields(words, 0, 0, 0, 0)
    store_slot_state_release(words, POOL_SLOT_FREE)
    return slot
