"""Reading and writing ring headers and frame headers in a shared mapping.

Design rationale. Producers and readers in different processes share these
bytes with no lock on the publication path, so the order of stores is the
protocol: a frame's body and header fields are written first and its length
last (`store_frame_length_release`, after Aeron's `frameLengthOrdered`); a
reader that loads a non-zero length (`load_frame_length_acquire`) may read
the rest. CPython gives no fences, but every load and store of a field that
another process may touch at the same time goes through `SharedWords`: one
aligned load or store of the field's size (never `struct.pack_into`, which
zero-fills first and writes byte by byte). On the platforms we support
(x86-64 TSO, and aarch64 where aligned 2/4/8-byte accesses are single-copy
atomic and the interpreter's own locking orders them) that is what the
`_acquire` / `_release` names promise. Fields only their writer sees while
it writes them (a frame before its length is stored, a ring header before
its magic) use `struct` in one go.

Every layout number comes from `shmring.spec.layout`.
"""

from __future__ import annotations

import contextlib
import mmap
import struct
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from xxhash import xxh3_64_intdigest

from ..spec.layout import (
    DATA_FRAME_TYPE,
    FRAME_HEADER_FIELDS,
    FRAME_HEADER_LENGTH,
    FRAME_HOLDER_NONE,
    FRAME_HOLDER_PID_FIELD,
    FRAME_LENGTH_FIELD,
    FRAME_PREFIX_FIELDS,
    FRAME_STATE_FIELD,
    FRAME_TYPE_FIELD,
    PADDING_FRAME_TYPE,
    RING_HEAD_FIELD,
    RING_HEADER_FIELDS,
    RING_HEADER_LENGTH,
    RING_IDENTITY_FIELDS,
    RING_MAGIC,
    RING_MAGIC_FIELD,
    RING_STATE_FIELD,
    RING_TAIL_FIELD,
    RING_VERSION,
    RING_WAKEUP_SEQUENCE_FIELD,
    U16_CHAR,
    U16_FORMAT,
    U32_CHAR,
    U64_CHAR,
    Section,
    compute_struct_format,
)

_U16: Final = struct.Struct(U16_FORMAT)

# The layout is little-endian; SharedWords uses the host's byte order.
assert sys.byteorder == "little", "shmring's shared layout needs a little-endian host"


def _word_index(field: Section) -> int:
    """Index of `field` among the words of its own size (`SharedWords`); it must be aligned."""
    # Every field several processes touch at once is naturally aligned.
    assert field.offset % field.size == 0, field
    return field.offset // field.size


# Frame offsets are multiples of FRAME_ALIGNMENT, so a frame field's word index is
# (frame offset + field offset) >> shift, the shift of its size.
_SHIFTS: Final = {2: 1, 4: 2, 8: 3}
_FRAME_LENGTH_SHIFT: Final = _SHIFTS[FRAME_LENGTH_FIELD.size]
_FRAME_STATE_SHIFT: Final = _SHIFTS[FRAME_STATE_FIELD.size]
_FRAME_HOLDER_SHIFT: Final = _SHIFTS[FRAME_HOLDER_PID_FIELD.size]
_FRAME_STATE: Final = FRAME_STATE_FIELD.offset
for _field in (FRAME_LENGTH_FIELD, FRAME_STATE_FIELD, FRAME_HOLDER_PID_FIELD):
    _word_index(_field)  # aligned within the (aligned) frame
# The word arrays `SharedWords` casts to, by field size.
_WORD_CHARS: Final = {2: U16_CHAR, 4: U32_CHAR, 8: U64_CHAR}
assert {f.format for f in (FRAME_STATE_FIELD, FRAME_LENGTH_FIELD, RING_HEAD_FIELD)} <= set(
    _WORD_CHARS.values()
)


def u64_words(buf: memoryview) -> memoryview:
    """`buf` as u64 items: each item read or written is one aligned 8-byte load or store.

    For a shared file whose words are all u64 (the discovery stamp); release
    the view before the mapping closes. A ring's mapping uses `SharedWords`.
    """
    return buf.cast(U64_CHAR)


class SharedWords:
    """One-instruction loads and stores of the u16/u32/u64 fields processes share.

    `struct.pack_into` zero-fills its target before writing the value byte by
    byte, and `unpack_from` reads byte by byte, so a process reading a field
    while another stores it could see 0 or a mix of old and new bytes (a
    stress run of the ring did see head = 0). Item access on a memoryview
    cast to 'H', 'I' or 'Q' copies one item with a fixed-size memcpy, which
    compiles to one aligned load or store: readers see the old value or the
    new one. Make one per mapping (its length a multiple of 8); `release()`
    before the mapping is closed.
    """

    __slots__ = ("u16", "u32", "u64")

    def __init__(self, buf: memoryview) -> None:
        self.u16 = buf.cast(U16_CHAR)
        self.u32 = buf.cast(U32_CHAR)
        self.u64 = buf.cast(U64_CHAR)

    def release(self) -> None:
        self.u16.release()
        self.u32.release()
        self.u64.release()

    _release_exports = release  # `lifecycle.release_inherited` in a forked child


# The data-frame header fields after `length` (holder pid included), packed in one store.
_FRAME_FIELDS: Final = struct.Struct(compute_struct_format(FRAME_HEADER_FIELDS[1:]))
assert FRAME_TYPE_FIELD.offset + _FRAME_FIELDS.size == FRAME_HEADER_LENGTH


@dataclass(frozen=True)
class FrameHeader:
    """A frame header as read from the mapping (not yet validated)."""

    length: int  # 0 while unpublished
    frame_type: int  # DATA_FRAME_TYPE or PADDING_FRAME_TYPE
    state: int  # FRAME_STATE_*
    key_length: int
    payload_length: int
    position: int  # the logical position the producer wrote this frame at
    checksum: int  # compute_checksum of key and payload bytes


@dataclass(frozen=True)
class RingHeader:
    magic: int
    version: int
    header_length: int
    capacity: int
    producer_pid: int
    producer_start_time: int
    state: int
    producer_instance: int = 0  # which connector of the producer process


# -- ring header -------------------------------------------------------------


# The fields a ring header is made with (magic .. producer instance), in one struct.
_RING_IDENTITY: Final = struct.Struct(compute_struct_format(RING_IDENTITY_FIELDS))
# The whole ring header, in one struct (head, tail and the wake-up sequence: 0 at creation).
_RING_HEADER: Final = struct.Struct(compute_struct_format(RING_HEADER_FIELDS))
_RING_MAGIC: Final = struct.Struct(compute_struct_format((RING_MAGIC_FIELD,)))
assert RING_HEADER_FIELDS[0] is RING_MAGIC_FIELD and RING_MAGIC_FIELD.offset == 0


def write_ring_header(
    buf: memoryview,
    capacity: int,
    producer_pid: int,
    producer_start_time: int,
    state: int,
    producer_instance: int = 0,
) -> None:
    """Initialise a new ring's header; the magic goes last so a half-made file reads as invalid."""
    _RING_HEADER.pack_into(
        buf,
        0,
        0,  # magic: stored last, below
        RING_VERSION,
        RING_HEADER_LENGTH,
        capacity,
        producer_pid,
        producer_start_time,
        state,
        producer_instance,
        0,  # head
        0,  # tail
        0,  # wake-up sequence
    )
    _RING_MAGIC.pack_into(buf, RING_MAGIC_FIELD.offset, RING_MAGIC)


def read_ring_header(buf: memoryview) -> RingHeader:
    return RingHeader(*_RING_IDENTITY.unpack_from(buf, RING_IDENTITY_FIELDS[0].offset))


_RING_STATE_WORD: Final = _word_index(RING_STATE_FIELD)
_HEAD_WORD: Final = _word_index(RING_HEAD_FIELD)
_TAIL_WORD: Final = _word_index(RING_TAIL_FIELD)
_WAKEUP_WORD: Final = _word_index(RING_WAKEUP_SEQUENCE_FIELD)


def store_ring_state_release(words: SharedWords, state: int) -> None:
    words.u32[_RING_STATE_WORD] = state


def load_ring_state_acquire(words: SharedWords) -> int:
    value: int = words.u32[_RING_STATE_WORD]
    return value


def store_head_release(words: SharedWords, head: int) -> None:
    """Advance head after the frame it covers is published."""
    words.u64[_HEAD_WORD] = head


def load_head_acquire(words: SharedWords) -> int:
    value: int = words.u64[_HEAD_WORD]
    return value


def store_tail_release(words: SharedWords, tail: int) -> None:
    words.u64[_TAIL_WORD] = tail


def load_tail_acquire(words: SharedWords) -> int:
    value: int = words.u64[_TAIL_WORD]
    return value


def bump_wakeup_sequence_release(words: SharedWords) -> int:
    """Advance the wake-up sequence (single writer: the producer), wrapping at 2**64.

    Readers only compare it for change; a scribbled all-ones word wraps to 0
    instead of failing the store (issue 22: close raised ValueError there).
    """
    value: int = (words.u64[_WAKEUP_WORD] + 1) & 0xFFFF_FFFF_FFFF_FFFF
    words.u64[_WAKEUP_WORD] = value
    return value


def load_wakeup_sequence_acquire(words: SharedWords) -> int:
    value: int = words.u64[_WAKEUP_WORD]
    return value


# -- frames ------------------------------------------------------------------


def compute_checksum(key: bytes, payload: bytes | memoryview) -> int:
    """32 bits of XXH3-64 over the payload, seeded with XXH3-64 of the key.

    XXH3 (the xxhash package) checks a MiB in about 10 us where zlib's crc32
    takes about 150 us, which dominated large puts and gets; it detects the
    same accidental corruption (it is not a defence against a writer that
    means harm: only the same uid can write these files).
    """
    return xxh3_64_intdigest(payload, seed=xxh3_64_intdigest(key)) & 0xFFFFFFFF


def write_data_frame_fields(
    buf: memoryview,
    offset: int,
    *,
    state: int,
    key_length: int,
    payload_length: int,
    position: int,
    checksum: int,
) -> None:
    """Write every header field of a data frame except `length`; no lease holder yet."""
    _FRAME_FIELDS.pack_into(
        buf,
        offset + FRAME_TYPE_FIELD.offset,
        DATA_FRAME_TYPE,
        state,
        key_length,
        payload_length,
        position,
        checksum,
        FRAME_HOLDER_NONE,
    )


def write_padding_frame_fields(buf: memoryview, offset: int, state: int) -> None:
    """A padding frame only has type and state before its length."""
    _U16.pack_into(buf, offset + FRAME_TYPE_FIELD.offset, PADDING_FRAME_TYPE)
    _U16.pack_into(buf, offset + FRAME_STATE_FIELD.offset, state)


# Frame offsets are multiples of FRAME_ALIGNMENT, so these word indexes are exact.


def store_frame_length_release(words: SharedWords, offset: int, length: int) -> None:
    """Publish a frame: its length is the last store a producer makes to it."""
    words.u32[(offset + FRAME_LENGTH_FIELD.offset) >> _FRAME_LENGTH_SHIFT] = length


def load_frame_length_acquire(words: SharedWords, offset: int) -> int:
    value: int = words.u32[(offset + FRAME_LENGTH_FIELD.offset) >> _FRAME_LENGTH_SHIFT]
    return value


def store_frame_state_release(words: SharedWords, offset: int, state: int) -> None:
    words.u16[(offset + _FRAME_STATE) >> _FRAME_STATE_SHIFT] = state


def load_frame_state_acquire(words: SharedWords, offset: int) -> int:
    value: int = words.u16[(offset + _FRAME_STATE) >> _FRAME_STATE_SHIFT]
    return value


def store_frame_holder_pid(words: SharedWords, offset: int, pid: int) -> None:
    """Name the lease holder; a claimer stores it before it stores CLAIMED (release)."""
    words.u32[(offset + FRAME_HOLDER_PID_FIELD.offset) >> _FRAME_HOLDER_SHIFT] = pid


def load_frame_holder_pid(words: SharedWords, offset: int) -> int:
    """The lease holder's pid; meaningful only after loading CLAIMED (acquire)."""
    value: int = words.u32[(offset + FRAME_HOLDER_PID_FIELD.offset) >> _FRAME_HOLDER_SHIFT]
    return value


def store_frame_state_in_header(header: memoryview, state: int) -> None:
    """`store_frame_state_release` through a view that starts at the frame (a lease's own)."""
    with header.cast("B")[:FRAME_HEADER_LENGTH] as frame, frame.cast(U16_CHAR) as halves:
        halves[_word_index(FRAME_STATE_FIELD)] = state


def release_mapping(
    words: SharedWords | None, buf: memoryview | None, mapping: mmap.mmap | None
) -> None:
    """Drop a mapping's views in order and unmap it, unless a borrowed view still lives.

    A lease's view keeps the mapping (BufferError from close): it is unmapped
    when the last view of it dies and the mmap object is freed.
    """
    if words is not None:
        words.release()
    if buf is not None:
        buf.release()
    if mapping is not None:
        with contextlib.suppress(BufferError):
            mapping.close()


# The whole frame header in one unpack (holder pid skipped).
_FRAME_HEADER: Final = struct.Struct(
    compute_struct_format(FRAME_HEADER_FIELDS, skip=(FRAME_HOLDER_PID_FIELD.name,))
)
assert _FRAME_HEADER.size == FRAME_HEADER_LENGTH


# (length, type, state, key length, payload length, position, checksum) in one load,
# for readers of frames below a head they loaded (acquire): such a frame was
# complete before head moved, so the order of loads inside one unpack does not
# matter. A frame being overwritten is caught by the caller re-reading the tail
# afterwards (see `shmring.impl.ring`). Padding frames carry only the first
# three fields; the rest is whatever the bytes hold. `load_frame_header_fields(buf,
# offset)` is the struct's own bound method: the walk of a ring calls it once
# per frame, and a Python wrapper around it cost a third of the walk.
load_frame_header_fields: Final[
    Callable[[memoryview, int], tuple[int, int, int, int, int, int, int]]
] = _FRAME_HEADER.unpack_from  # type: ignore[assignment]


_FRAME_PREFIX: Final = struct.Struct(compute_struct_format(FRAME_PREFIX_FIELDS))
assert _FRAME_PREFIX.size == FRAME_PREFIX_FIELDS[-1].end


def load_frame_prefix(buf: memoryview, offset: int) -> tuple[int, int, int]:
    """(length, type, state): all a padding frame carries.

    Safe where fewer than FRAME_HEADER_LENGTH bytes remain before the end of
    the data region (a padding frame may be FRAME_ALIGNMENT bytes long).
    """
    fields: tuple[int, int, int] = _FRAME_PREFIX.unpack_from(buf, offset)
    return fields


def read_frame_header(buf: memoryview, offset: int) -> FrameHeader:
    """Read a frame header; padding frames read only what they carry."""
    length, frame_type, state = _FRAME_PREFIX.unpack_from(buf, offset)
    if frame_type != DATA_FRAME_TYPE:
        return FrameHeader(length, frame_type, state, 0, 0, 0, 0)
    return FrameHeader(*_FRAME_HEADER.unpack_from(buf, offset))


__all__ = [
    "FRAME_HEADER_LENGTH",
    "SharedWords",
    "FrameHeader",
    "RingHeader",
    "bump_wakeup_sequence_release",
    "compute_checksum",
    "load_frame_header_fields",
    "load_frame_holder_pid",
    "load_frame_length_acquire",
    "load_frame_prefix",
    "load_frame_state_acquire",
    "load_head_acquire",
    "load_ring_state_acquire",
    "load_tail_acquire",
    "load_wakeup_sequence_acquire",
    "read_frame_header",
    "read_ring_header",
    "release_mapping",
    "store_frame_holder_pid",
    "store_frame_length_release",
    "store_frame_state_in_header",
    "store_frame_state_release",
    "store_head_release",
    "store_ring_state_release",
    "store_tail_release",
    "write_data_frame_fields",
    "write_padding_frame_fields",
    "write_ring_header",
]
