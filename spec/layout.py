"""Byte layout of a host ring file: ring header, then frames.

This module is the single place where the layout is written down. The
implementation imports these names; it never restates a number.

A ring file::

    0                                                     RING_HEADER_LENGTH
    +--------------------------- ring header ---------------------------+
    | magic u64 | version u32 | header length u32 | capacity u64        |  0..24
    | producer pid u64 | producer start time u64                        | 24..40
    | ring state u32 | producer instance u32 | ...padding to cache line  |  40..64
    | head position u64 (written by the producer only)    ...           |  64..128
    | tail position u64 (written by the producer only)    ...           | 128..192
    | wake-up sequence u64 (bumped after every publication) ...         | 192..256
    +-------------------------------------------------------------------+
    | data region: `capacity` bytes, physical offset = position % capacity
    +-------------------------------------------------------------------+

A frame in the data region, every field little-endian::

    0       4       6       8               12              16
    +-------+-------+-------+---------------+---------------+
    |length |type   |state  | key length    | payload length|
    |u32    |u16    |u16    | u32           | u32           |
    +-------+-------+-------+---------------+---------------+
    16                              24              28      32
    +-------------------------------+---------------+-------+
    | position u64                  | checksum u32  |holder |
    |                               |               |pid u32|
    +-------------------------------+---------------+-------+
    32: key bytes (UTF-8), then payload bytes, then zero fill to FRAME_ALIGNMENT

`length` is written last, after every other byte of the frame: a reader that
reads a non-zero length (acquire) sees a complete frame. A padding frame only
carries `length`, `type` and `state`, so it fits in the smallest possible
remainder at the end of the data region (FRAME_ALIGNMENT bytes).

`holder pid` names the process that claimed the frame in lease mode (host
ring and arena frames; see `shmring.spec.leases.process_holder_exit`). The
producer writes 0 when it publishes; a receiver stores its pid before it
stores CLAIMED, so a producer that loads CLAIMED (acquire) reads the holder
that claimed it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

# -- sections: one record per field -------------------------------------------
#
# Every header below is a tuple of `Section`s in offset order, and the
# `*_OFFSET` names are their offsets. Struct formats are derived from the
# sections (`compute_struct_format`), never written next to them, so a field
# is added, moved or resized in one place.

# The struct character of one integer of each width (every integer in these
# files is little-endian; `compute_struct_format` and the `*_FORMAT` words
# below add the byte order). What a memoryview cast takes.
U8_CHAR: Final = "B"
I8_CHAR: Final = "b"
U16_CHAR: Final = "H"
U32_CHAR: Final = "I"
U64_CHAR: Final = "Q"
LITTLE_ENDIAN: Final = "<"
PAD_CHAR: Final = "x"


@dataclass(frozen=True)
class Section:
    """One field of a header in a shared file (or in a codec payload)."""

    name: str  # what the field holds, as messages and docs call it
    offset: int  # bytes from the start of its header
    size: int  # bytes it occupies
    format: str  # its struct character (U8_CHAR .. U64_CHAR), without byte order

    @property
    def end(self) -> int:
        """The offset just past the field: where a field that follows it starts."""
        return self.offset + self.size


def compute_section_after(previous: Section, name: str, size: int, format: str) -> Section:
    """The field that starts where `previous` ends."""
    # Verify the size is positive
    assert size > 0
    return Section(name, previous.end, size, format)


def compute_struct_format(fields: tuple[Section, ...], skip: tuple[str, ...] = ()) -> str:
    """The little-endian struct format that reads `fields` in one go, from the first one's offset.

    Bytes between two fields, and the fields named in `skip`, are read as
    pad bytes. `fields` are in offset order and do not overlap.
    """
    # Verify there is a field and the fields are in order without overlap
    assert fields
    assert all(a.end <= b.offset for a, b in zip(fields, fields[1:], strict=False))
    parts = [LITTLE_ENDIAN]
    end = fields[0].offset
    for field in fields:
        if field.offset > end:
            parts.append(f"{field.offset - end}{PAD_CHAR}")
        parts.append(f"{field.size}{PAD_CHAR}" if field.name in skip else field.format)
        end = field.end
    return "".join(parts)


def get_section(fields: tuple[Section, ...], name: str) -> Section:
    """The field of `fields` called `name`."""
    for field in fields:
        if field.name == name:
            return field
    raise KeyError(name)


# -- ring header -----------------------------------------------------------

RING_MAGIC: Final = 0x31474E49524D4853  # b"SHMRING1" read as a little-endian u64
RING_VERSION: Final = 1

RING_MAGIC_FIELD: Final = Section("magic", 0, 8, U64_CHAR)
RING_VERSION_FIELD: Final = compute_section_after(RING_MAGIC_FIELD, "version", 4, U32_CHAR)
RING_HEADER_LENGTH_FIELD: Final = compute_section_after(
    RING_VERSION_FIELD, "header length", 4, U32_CHAR
)
RING_CAPACITY_FIELD: Final = compute_section_after(
    RING_HEADER_LENGTH_FIELD, "capacity", 8, U64_CHAR
)
RING_PRODUCER_PID_FIELD: Final = compute_section_after(
    RING_CAPACITY_FIELD, "producer pid", 8, U64_CHAR
)
RING_PRODUCER_START_TIME_FIELD: Final = compute_section_after(
    RING_PRODUCER_PID_FIELD, "producer start time", 8, U64_CHAR
)
RING_STATE_FIELD: Final = compute_section_after(
    RING_PRODUCER_START_TIME_FIELD, "ring state", 4, U32_CHAR
)
# Which connector of the producer process made the file: a process may hold
# several producers (connector instances) on one edge, each with its own ring.
RING_PRODUCER_INSTANCE_FIELD: Final = compute_section_after(
    RING_STATE_FIELD, "producer instance", 4, U32_CHAR
)

CACHE_LINE_LENGTH: Final = 64
# Head, tail and the wake-up sequence each own a cache line so that the
# producer's stores do not bounce the line readers poll.
RING_HEAD_FIELD: Final = Section("head", CACHE_LINE_LENGTH, 8, U64_CHAR)
RING_TAIL_FIELD: Final = Section("tail", RING_HEAD_FIELD.offset + CACHE_LINE_LENGTH, 8, U64_CHAR)
RING_WAKEUP_SEQUENCE_FIELD: Final = Section(
    "wake-up sequence", RING_TAIL_FIELD.offset + CACHE_LINE_LENGTH, 8, U64_CHAR
)
RING_HEADER_LENGTH: Final = RING_WAKEUP_SEQUENCE_FIELD.offset + CACHE_LINE_LENGTH

# The fields written once when the file is made (magic .. producer instance), in order.
RING_IDENTITY_FIELDS: Final = (
    RING_MAGIC_FIELD,
    RING_VERSION_FIELD,
    RING_HEADER_LENGTH_FIELD,
    RING_CAPACITY_FIELD,
    RING_PRODUCER_PID_FIELD,
    RING_PRODUCER_START_TIME_FIELD,
    RING_STATE_FIELD,
    RING_PRODUCER_INSTANCE_FIELD,
)
# Every field of the ring header, in order.
RING_HEADER_FIELDS: Final = (
    *RING_IDENTITY_FIELDS,
    RING_HEAD_FIELD,
    RING_TAIL_FIELD,
    RING_WAKEUP_SEQUENCE_FIELD,
)

RING_MAGIC_OFFSET: Final = RING_MAGIC_FIELD.offset
RING_VERSION_OFFSET: Final = RING_VERSION_FIELD.offset
RING_HEADER_LENGTH_OFFSET: Final = RING_HEADER_LENGTH_FIELD.offset
RING_CAPACITY_OFFSET: Final = RING_CAPACITY_FIELD.offset
RING_PRODUCER_PID_OFFSET: Final = RING_PRODUCER_PID_FIELD.offset
RING_PRODUCER_START_TIME_OFFSET: Final = RING_PRODUCER_START_TIME_FIELD.offset
RING_STATE_OFFSET: Final = RING_STATE_FIELD.offset
RING_PRODUCER_INSTANCE_OFFSET: Final = RING_PRODUCER_INSTANCE_FIELD.offset
RING_HEAD_OFFSET: Final = RING_HEAD_FIELD.offset
RING_TAIL_OFFSET: Final = RING_TAIL_FIELD.offset
RING_WAKEUP_SEQUENCE_OFFSET: Final = RING_WAKEUP_SEQUENCE_FIELD.offset

RING_STATE_OPEN: Final = 1
RING_STATE_CLOSED: Final = 2
# Only in a fallback segment's header: its producer keeps the file for reuse,
# so the reader that claims it hands it back (renames it to the producer's
# spare name) instead of unlinking it. Otherwise the segment reads OPEN.
RING_STATE_SPARE_WANTED: Final = 3

# -- capacity --------------------------------------------------------------

RING_CAPACITY_DISABLED: Final = 0
MIN_RING_CAPACITY: Final = 4 * 1024
MAX_RING_CAPACITY: Final = 64 * 1024 * 1024
RING_CAPACITY_ALIGNMENT: Final = 16

# -- frame header ----------------------------------------------------------

FRAME_LENGTH_FIELD: Final = Section("length", 0, 4, U32_CHAR)
FRAME_TYPE_FIELD: Final = compute_section_after(FRAME_LENGTH_FIELD, "type", 2, U16_CHAR)
FRAME_STATE_FIELD: Final = compute_section_after(FRAME_TYPE_FIELD, "state", 2, U16_CHAR)
FRAME_KEY_LENGTH_FIELD: Final = compute_section_after(FRAME_STATE_FIELD, "key length", 4, U32_CHAR)
FRAME_PAYLOAD_LENGTH_FIELD: Final = compute_section_after(
    FRAME_KEY_LENGTH_FIELD, "payload length", 4, U32_CHAR
)
FRAME_POSITION_FIELD: Final = compute_section_after(
    FRAME_PAYLOAD_LENGTH_FIELD, "position", 8, U64_CHAR
)
FRAME_CHECKSUM_FIELD: Final = compute_section_after(FRAME_POSITION_FIELD, "checksum", 4, U32_CHAR)
FRAME_HOLDER_PID_FIELD: Final = compute_section_after(
    FRAME_CHECKSUM_FIELD, "holder pid", 4, U32_CHAR
)
# Every field of a frame header, in order.
FRAME_HEADER_FIELDS: Final = (
    FRAME_LENGTH_FIELD,
    FRAME_TYPE_FIELD,
    FRAME_STATE_FIELD,
    FRAME_KEY_LENGTH_FIELD,
    FRAME_PAYLOAD_LENGTH_FIELD,
    FRAME_POSITION_FIELD,
    FRAME_CHECKSUM_FIELD,
    FRAME_HOLDER_PID_FIELD,
)
# What a padding frame carries: length, type and state.
FRAME_PREFIX_FIELDS: Final = FRAME_HEADER_FIELDS[:3]

FRAME_LENGTH_OFFSET: Final = FRAME_LENGTH_FIELD.offset
FRAME_TYPE_OFFSET: Final = FRAME_TYPE_FIELD.offset
FRAME_STATE_OFFSET: Final = FRAME_STATE_FIELD.offset
FRAME_KEY_LENGTH_OFFSET: Final = FRAME_KEY_LENGTH_FIELD.offset
FRAME_PAYLOAD_LENGTH_OFFSET: Final = FRAME_PAYLOAD_LENGTH_FIELD.offset
FRAME_POSITION_OFFSET: Final = FRAME_POSITION_FIELD.offset
FRAME_CHECKSUM_OFFSET: Final = FRAME_CHECKSUM_FIELD.offset
FRAME_HOLDER_PID_OFFSET: Final = FRAME_HOLDER_PID_FIELD.offset
FRAME_HEADER_LENGTH: Final = FRAME_HOLDER_PID_FIELD.end
FRAME_HOLDER_NONE: Final = 0  # holder pid of a frame no lease holder has claimed
FRAME_KEY_OFFSET: Final = FRAME_HEADER_LENGTH

FRAME_ALIGNMENT: Final = 16
MAX_KEY_LENGTH: Final = 65535
# A frame larger than capacity // ADMISSION_DIVISOR is not admitted.
ADMISSION_DIVISOR: Final = 4

# Frame types.
DATA_FRAME_TYPE: Final = 1
PADDING_FRAME_TYPE: Final = 2

# Frame states. A frame moves PUBLISHED -> CLAIMED -> DONE (lease mode),
# PUBLISHED -> DONE (copy-out mode) or PUBLISHED -> RETIRED (re-put, cancel,
# close). DONE and RETIRED frames, and padding, are reclaimable.
FRAME_STATE_PUBLISHED: Final = 1
FRAME_STATE_CLAIMED: Final = 2
FRAME_STATE_DONE: Final = 3
FRAME_STATE_RETIRED: Final = 4

FRAME_STATE_NAMES: Final = {
    FRAME_STATE_PUBLISHED: "published",
    FRAME_STATE_CLAIMED: "claimed",
    FRAME_STATE_DONE: "done",
    FRAME_STATE_RETIRED: "retired",
}


def align(value: int, alignment: int) -> int:
    """Round `value` up to a multiple of `alignment` (a power of two)."""
    # Verify the alignment is a power of two and the value is not negative
    assert alignment > 0 and alignment & (alignment - 1) == 0
    assert value >= 0
    # Division rather than a bit mask: the same number, and linear for a solver
    return (value + alignment - 1) // alignment * alignment


def compute_frame_length(key_length: int, payload_length: int) -> int:
    """Bytes a data frame occupies in the data region."""
    # Verify both lengths are non-negative
    assert key_length >= 0
    assert payload_length >= 0
    return align(FRAME_HEADER_LENGTH + key_length + payload_length, FRAME_ALIGNMENT)


def compute_ring_file_length(capacity: int) -> int:
    """Bytes of a ring file: header plus data region."""
    # Verify the capacity is not negative
    assert capacity >= 0
    return RING_HEADER_LENGTH + capacity


# tmpfs (/dev/shm) gives a file whole pages: a 1 KiB fallback segment takes a
# 4 KiB page, and the fallback budget charges what a file occupies. 4 KiB is
# the page of x86-64 and of most arm64 kernels; on a 16 or 64 KiB-page kernel
# the budget undercounts by the difference.
SHM_PAGE_SIZE: Final = 4096


def compute_file_footprint(file_length: int) -> int:
    """Bytes a shared-memory file of `file_length` bytes occupies: whole pages."""
    # Verify the length is not negative
    assert file_length >= 0
    return align(file_length, SHM_PAGE_SIZE)


# -- codec: the prefix and leaf descriptors of a framed payload ----------------
#
# A payload (a ring frame's payload bytes, or a fallback segment's) is plain
# msgpack or *framed*: it then starts with CODEC_FRAMED_MARKER, the one byte
# msgpack never uses (`shmring.impl.codec` encodes and decodes it). A framed
# payload, every integer little-endian::
#
#     0      1        2            3         4              8              12
#     +------+--------+------------+---------+--------------+--------------+
#     | 0xC1 | version| leaf ext   | flags=0 | header length| shared length|
#     | u8   | u8 = 1 | code i8    | u8      | u32 (H)      | u32 (S)      |
#     +------+--------+------------+---------+--------------+--------------+
#     12: msgpack header (H bytes): the payload tree, each leaf replaced by
#         Ext(leaf ext code, descriptor); zero fill to a multiple of 16 = D
#     D: shared area, S bytes: small leaves back to back, each zero padded to 16
#     D + S: own area, to the end: large leaves back to back, each padded to 16
#
# A leaf descriptor (the data of one Ext(leaf ext code)), 12 + 8 * ndim bytes::
#
#     0             1      2      3          4                12
#     +-------------+------+------+----------+----------------+------------------+
#     | dtype code  | area | ndim | reserved | offset in its  | ndim x dimension |
#     | u8 (| 0x80  | u8   | u8   | u8 = 0   | area u64       | u64              |
#     |  for numpy) |      |      |          |                |                  |
#     +-------------+------+------+----------+----------------+------------------+
#
# An Ext(leaf ext code) whose first byte is CODEC_TYPE_TAG is no descriptor:
# the rest is the UTF-8 name of a registered class (its state follows it).

CODEC_FRAMED_MARKER: Final = 0xC1  # the byte msgpack never uses: no plain message starts with it
CODEC_FORMAT_VERSION: Final = 1

CODEC_MARKER_FIELD: Final = Section("marker", 0, 1, U8_CHAR)
CODEC_VERSION_FIELD: Final = compute_section_after(CODEC_MARKER_FIELD, "version", 1, U8_CHAR)
CODEC_LEAF_CODE_FIELD: Final = compute_section_after(
    CODEC_VERSION_FIELD, "leaf ext code", 1, I8_CHAR
)
CODEC_FLAGS_FIELD: Final = compute_section_after(CODEC_LEAF_CODE_FIELD, "flags", 1, U8_CHAR)
CODEC_HEADER_LENGTH_FIELD: Final = compute_section_after(
    CODEC_FLAGS_FIELD, "header length", 4, U32_CHAR
)
CODEC_SHARED_LENGTH_FIELD: Final = compute_section_after(
    CODEC_HEADER_LENGTH_FIELD, "shared length", 4, U32_CHAR
)
CODEC_PREFIX_FIELDS: Final = (
    CODEC_MARKER_FIELD,
    CODEC_VERSION_FIELD,
    CODEC_LEAF_CODE_FIELD,
    CODEC_FLAGS_FIELD,
    CODEC_HEADER_LENGTH_FIELD,
    CODEC_SHARED_LENGTH_FIELD,
)
CODEC_MARKER_OFFSET: Final = CODEC_MARKER_FIELD.offset
CODEC_VERSION_OFFSET: Final = CODEC_VERSION_FIELD.offset
CODEC_LEAF_CODE_OFFSET: Final = CODEC_LEAF_CODE_FIELD.offset
CODEC_FLAGS_OFFSET: Final = CODEC_FLAGS_FIELD.offset
CODEC_HEADER_LENGTH_OFFSET: Final = CODEC_HEADER_LENGTH_FIELD.offset
CODEC_SHARED_LENGTH_OFFSET: Final = CODEC_SHARED_LENGTH_FIELD.offset
CODEC_PREFIX_LENGTH: Final = CODEC_SHARED_LENGTH_FIELD.end
# The prefix's fields in order (marker .. shared length), one struct format.
CODEC_PREFIX_FORMAT: Final = compute_struct_format(CODEC_PREFIX_FIELDS)

# Largest item size (complex128) and the SIMD width torch assumes: the header
# is zero filled to it, and every leaf starts on it.
CODEC_REGION_ALIGNMENT: Final = 16

CODEC_DESCRIPTOR_DTYPE_FIELD: Final = Section("dtype code", 0, 1, U8_CHAR)
CODEC_DESCRIPTOR_AREA_FIELD: Final = compute_section_after(
    CODEC_DESCRIPTOR_DTYPE_FIELD, "area", 1, U8_CHAR
)
CODEC_DESCRIPTOR_NDIM_FIELD: Final = compute_section_after(
    CODEC_DESCRIPTOR_AREA_FIELD, "ndim", 1, U8_CHAR
)
CODEC_DESCRIPTOR_RESERVED_FIELD: Final = compute_section_after(
    CODEC_DESCRIPTOR_NDIM_FIELD, "reserved", 1, U8_CHAR
)
CODEC_DESCRIPTOR_AREA_START_FIELD: Final = compute_section_after(
    CODEC_DESCRIPTOR_RESERVED_FIELD, "offset in its area", 8, U64_CHAR
)
# The descriptor's fixed fields in order (dtype code .. offset); the dimensions follow.
CODEC_DESCRIPTOR_FIELDS: Final = (
    CODEC_DESCRIPTOR_DTYPE_FIELD,
    CODEC_DESCRIPTOR_AREA_FIELD,
    CODEC_DESCRIPTOR_NDIM_FIELD,
    CODEC_DESCRIPTOR_RESERVED_FIELD,
    CODEC_DESCRIPTOR_AREA_START_FIELD,
)
CODEC_DESCRIPTOR_DTYPE_OFFSET: Final = CODEC_DESCRIPTOR_DTYPE_FIELD.offset
CODEC_DESCRIPTOR_AREA_OFFSET: Final = CODEC_DESCRIPTOR_AREA_FIELD.offset
CODEC_DESCRIPTOR_NDIM_OFFSET: Final = CODEC_DESCRIPTOR_NDIM_FIELD.offset
CODEC_DESCRIPTOR_RESERVED_OFFSET: Final = CODEC_DESCRIPTOR_RESERVED_FIELD.offset
CODEC_DESCRIPTOR_AREA_START_OFFSET: Final = CODEC_DESCRIPTOR_AREA_START_FIELD.offset
CODEC_DESCRIPTOR_DIMENSIONS_OFFSET: Final = CODEC_DESCRIPTOR_AREA_START_FIELD.end
CODEC_DESCRIPTOR_LENGTH: Final = CODEC_DESCRIPTOR_DIMENSIONS_OFFSET  # without the dimensions
CODEC_DIMENSION_LENGTH: Final = 8
# The descriptor's fixed fields in one struct format, and one dimension.
CODEC_DESCRIPTOR_FORMAT: Final = compute_struct_format(CODEC_DESCRIPTOR_FIELDS)
CODEC_DIMENSION_FORMAT: Final = U64_CHAR

CODEC_SHARED_AREA: Final = 0  # area byte: the leaf lives in the shared area
CODEC_OWN_AREA: Final = 1  # area byte: the leaf lives in the own area
CODEC_NUMPY_FLAG: Final = 0x80  # or-ed into the dtype code: the leaf comes back as numpy
CODEC_TYPE_TAG: Final = 0xFE  # first byte of a registered class's tag (no dtype code reaches it)


def codec_descriptor_format(ndim: int) -> str:
    """Struct format of a whole leaf descriptor of `ndim` dimensions (head and shape)."""
    # Verify the rank is not negative
    assert ndim >= 0
    return CODEC_DESCRIPTOR_FORMAT + CODEC_DIMENSION_FORMAT * ndim


def codec_dimensions_format(ndim: int) -> str:
    """Struct format of a descriptor's `ndim` dimensions alone (read from CODEC_DESCRIPTOR_LENGTH)."""
    # Verify the rank is not negative
    assert ndim >= 0
    return CODEC_DESCRIPTOR_FORMAT[0] + CODEC_DIMENSION_FORMAT * ndim


# -- publication cohorts (`spec.cohort`, `shmring.impl.connector.cohort`) ----------
#
# A payload put inside a publication cohort is stored behind an envelope that
# names its cohort; the payload proper (plain or framed) follows it. The
# first byte is CODEC_FRAMED_MARKER and the second COHORT_ENVELOPE_VERSION,
# a value no codec format version has, so an envelope is never mistaken for
# a payload::
#
#     0      1         2            4            8                        16
#     +------+---------+------------+------------+------------------------+
#     | 0xC1 | 0xCE    | zero u16   | zero u32   | cohort number u64      |
#     +------+---------+------------+------------+------------------------+
#     16: the payload's own encoding
#
# A producer's *cohort gate* of an edge is the file
# ``cohort.<src>.<dst>.<pid>.<start time>.<instance>`` (`shmring.impl.names`):
# one cache line whose first u64 is the highest committed cohort number of
# that edge. A member is deliverable once the gate has reached its number:
# the producer's one store of the gate is the commit.

COHORT_ENVELOPE_VERSION: Final = 0xCE
COHORT_ENVELOPE_FORMAT: Final = "<BBHIQ"  # marker, version, zero, zero, cohort number
COHORT_ENVELOPE_LENGTH: Final = 16
COHORT_NUMBER_OFFSET: Final = 8
COHORT_GATE_COMMITTED_OFFSET: Final = 0
COHORT_GATE_FILE_LENGTH: Final = 64

# -- integer words -------------------------------------------------------------
#
# Every integer in these files is little-endian. The struct format of one word
# of each width, for code that reads or writes a single word outside
# `shmring.impl.frame_io` (the fault plans, the tests, the benchmarks).

U16_FORMAT: Final = LITTLE_ENDIAN + U16_CHAR
U32_FORMAT: Final = LITTLE_ENDIAN + U32_CHAR
U64_FORMAT: Final = LITTLE_ENDIAN + U64_CHAR

# -- discovery stamp file ---------------------------------------------------
#
# The deployment's ``stamp`` file (shmring.impl.discovery.stamp), one page
# long, every field little-endian::
#
#     0               8               12              16              64
#     +---------------+---------------+---------------+-- zero fill ---+
#     | stamp u64     | doorbell u32  | waiters u32   |                |
#     +---------------+---------------+---------------+----------------+
#     64: STAGE_BELL_SLOTS stage bells, STAGE_BELL_LENGTH bytes each:
#     +---------------+---------------+
#     | bell u32      | interest u32  |   slot i at STAGE_BELLS_OFFSET + i * 8
#     +---------------+---------------+
#
# `stamp` is `spec.discovery`'s DirectoryState.stamp: it strictly increases
# with every change of the marker set, under the file's exclusive flock. The
# doorbell is a futex word every connector rings after it publishes: a plain
# store of a fresh value (`impl.discovery.stamp.Stamp.ring`), then, after a
# full fence, a FUTEX_WAKE only when `waiters` is not zero. `waiters` counts
# the receivers asleep on the doorbell (atomic adds, made before they sleep).
#
# A stage bell (issue 27) is the futex word of one destination stage: a put
# to that stage bumps it, so a receiver of the stage sleeps until traffic to
# its own stage. `interest` counts the receivers that wait on the slot
# (atomic adds); a put rings the bell only when it is not zero. A stage whose
# name is a decimal number below STAGE_BELL_DIRECT_SLOTS has the slot of that
# number (vllm-omni's stage ids: never shared); any other name hashes into
# the remaining slots (`compute_stage_bell_slot`), where two stages may share
# a slot (a spurious wake-up, never a missed one).

STAMP_FIELD: Final = Section("stamp", 0, 8, U64_CHAR)
DOORBELL_FIELD: Final = compute_section_after(STAMP_FIELD, "doorbell", 4, U32_CHAR)
DOORBELL_WAITERS_FIELD: Final = compute_section_after(DOORBELL_FIELD, "waiters", 4, U32_CHAR)
STAMP_FILE_FIELDS: Final = (STAMP_FIELD, DOORBELL_FIELD, DOORBELL_WAITERS_FIELD)
STAMP_OFFSET: Final = STAMP_FIELD.offset
DOORBELL_OFFSET: Final = DOORBELL_FIELD.offset
DOORBELL_WAITERS_OFFSET: Final = DOORBELL_WAITERS_FIELD.offset  # receivers asleep on it
STAGE_BELLS_OFFSET: Final = CACHE_LINE_LENGTH
STAGE_BELL_WORD_FIELD: Final = Section("bell", 0, 4, U32_CHAR)  # within a slot: the futex word
STAGE_BELL_INTEREST_FIELD: Final = compute_section_after(
    STAGE_BELL_WORD_FIELD, "interest", 4, U32_CHAR
)
STAGE_BELL_FIELDS: Final = (STAGE_BELL_WORD_FIELD, STAGE_BELL_INTEREST_FIELD)
STAGE_BELL_LENGTH: Final = STAGE_BELL_INTEREST_FIELD.end
STAGE_BELL_WORD_OFFSET: Final = STAGE_BELL_WORD_FIELD.offset
STAGE_BELL_INTEREST_OFFSET: Final = STAGE_BELL_INTEREST_FIELD.offset  # waiting receivers
STAGE_BELL_SLOTS: Final = 256
STAGE_BELL_DIRECT_SLOTS: Final = 128
STAMP_FILE_LENGTH: Final = STAGE_BELLS_OFFSET + STAGE_BELL_SLOTS * STAGE_BELL_LENGTH


def compute_stage_bell_slot(stage: str) -> int:
    """The stage bell slot of a destination stage (see the stamp file above)."""
    if stage.isdecimal() and stage.isascii() and int(stage) < STAGE_BELL_DIRECT_SLOTS:
        return int(stage)
    digest = 0
    for byte in stage.encode("utf-8"):  # FNV-1a, 32 bits: the same in every process
        digest = ((digest ^ byte) * 0x01000193) & 0xFFFFFFFF
    return STAGE_BELL_DIRECT_SLOTS + digest % (STAGE_BELL_SLOTS - STAGE_BELL_DIRECT_SLOTS)


# -- registered arena frames (`shmring.impl.registered.arena`) --------------------------
#
# An arena is a ring file (the layout above) whose frame keys are the
# ARENA_KEY_LENGTH lower-case hex digits of a sequence number, so every
# payload starts 16-byte aligned (frame start, header, key)::
#
#     0                   FRAME_KEY_OFFSET      ARENA_PAYLOAD_OFFSET
#     +-- frame header ---+-- key: 16 hex digits --+-- payload ...
#
ARENA_KEY_LENGTH: Final = 16
ARENA_PAYLOAD_OFFSET: Final = FRAME_KEY_OFFSET + ARENA_KEY_LENGTH

# -- pool slot files and pool references (`shmring.impl.pool`) ---------------------
#
# A payload the ring does not admit travels in a *pool slot*: a file of its
# producer's pool (`spec.pool`), one payload per slot. A slot's *class* is a
# power of two; its payload *capacity* is the class plus POOL_CLASS_HEADROOM
# (`compute_slot_capacity`), so a power-of-two tensor with the codec's header
# and small leaves next to it lands in its own class, not the next one (which
# would double the memory of the most common payload shape). The header's
# capacity field holds the capacity (class + headroom), what the consumer
# checks a payload length against. A slot file is a header page, then the
# payload::
#
#     0            8         12          16            24            32
#     +------------+---------+-----------+-------------+-------------+
#     | magic u64  | version | header    | capacity    | producer    |
#     | "SHMPOOL1" | u32     | length u32| u64         | pid u64     |
#     +------------+---------+-----------+-------------+-------------+
#     32             40          44          48             56        60
#     +--------------+-----------+-----------+--------------+---------+------------+
#     | producer     | producer  | slot      | generation   | state   | holder pid |
#     | start u64    | inst u32  | index u32 | u64          | u32     | u32        |
#     +--------------+-----------+-----------+--------------+---------+------------+
#     64                 72              80          84 .. POOL_SLOT_HEADER_LENGTH
#     +------------------+---------------+-----------+---- zero fill ----+
#     | payload length   | checksum u64  | flags u32 |                   |
#     | u64              | (XXH3-64)     |           |                   |
#     +------------------+---------------+-----------+-------------------+
#     POOL_SLOT_HEADER_LENGTH (one page): the payload, `capacity` bytes
#     (class + POOL_CLASS_HEADROOM; the file is header + class + headroom)
#
# The first eight fields never change after creation; the producer stores
# payload length, checksum, flags, generation and holder 0, then state
# PUBLISHED (release) last. A consumer stores its pid as holder, then CLAIMED,
# and DONE when it has copied the payload out (or its lease ended).
#
# A *pool reference* is the payload of the ring frame that carries a slot's
# payload on the edge's ring (so key semantics stay the ring's). It starts
# with CODEC_FRAMED_MARKER like a framed codec payload, but its second byte is
# POOL_REF_TAG where a codec payload has CODEC_FORMAT_VERSION, so no codec
# payload reads as a reference::
#
#     0      1        2        3          4            8             16            24          32
#     +------+--------+--------+----------+------------+-------------+-------------+-----------+
#     | 0xC1 | tag u8 | flags  | reserved | slot index | generation  | payload     | checksum  |
#     | u8   | 0x50   | u8     | u8 = 0   | u32        | u64         | length u64  | u64       |
#     +------+--------+--------+----------+------------+-------------+-------------+-----------+
#
# The slot is the file `pool.<producer of the ring>.<slot index>`: a reference
# names no file of anyone but the ring's own producer.

POOL_MAGIC: Final = 0x314C4F4F504D4853  # b"SHMPOOL1" read as a little-endian u64
POOL_VERSION: Final = 1

POOL_MAGIC_FIELD: Final = Section("magic", 0, 8, U64_CHAR)
POOL_VERSION_FIELD: Final = compute_section_after(POOL_MAGIC_FIELD, "version", 4, U32_CHAR)
POOL_HEADER_LENGTH_FIELD: Final = compute_section_after(
    POOL_VERSION_FIELD, "header length", 4, U32_CHAR
)
POOL_CAPACITY_FIELD: Final = compute_section_after(
    POOL_HEADER_LENGTH_FIELD, "capacity", 8, U64_CHAR
)
POOL_PRODUCER_PID_FIELD: Final = compute_section_after(
    POOL_CAPACITY_FIELD, "producer pid", 8, U64_CHAR
)
POOL_PRODUCER_START_TIME_FIELD: Final = compute_section_after(
    POOL_PRODUCER_PID_FIELD, "producer start time", 8, U64_CHAR
)
POOL_PRODUCER_INSTANCE_FIELD: Final = compute_section_after(
    POOL_PRODUCER_START_TIME_FIELD, "producer instance", 4, U32_CHAR
)
POOL_SLOT_INDEX_FIELD: Final = compute_section_after(
    POOL_PRODUCER_INSTANCE_FIELD, "slot index", 4, U32_CHAR
)
POOL_GENERATION_FIELD: Final = compute_section_after(
    POOL_SLOT_INDEX_FIELD, "generation", 8, U64_CHAR
)
POOL_STATE_FIELD: Final = compute_section_after(POOL_GENERATION_FIELD, "state", 4, U32_CHAR)
POOL_HOLDER_PID_FIELD: Final = compute_section_after(POOL_STATE_FIELD, "holder pid", 4, U32_CHAR)
POOL_PAYLOAD_LENGTH_FIELD: Final = compute_section_after(
    POOL_HOLDER_PID_FIELD, "payload length", 8, U64_CHAR
)
POOL_CHECKSUM_FIELD: Final = compute_section_after(
    POOL_PAYLOAD_LENGTH_FIELD, "checksum", 8, U64_CHAR
)
POOL_FLAGS_FIELD: Final = compute_section_after(POOL_CHECKSUM_FIELD, "flags", 4, U32_CHAR)
# The fields written once at creation (magic .. slot index), in order.
POOL_IDENTITY_FIELDS: Final = (
    POOL_MAGIC_FIELD,
    POOL_VERSION_FIELD,
    POOL_HEADER_LENGTH_FIELD,
    POOL_CAPACITY_FIELD,
    POOL_PRODUCER_PID_FIELD,
    POOL_PRODUCER_START_TIME_FIELD,
    POOL_PRODUCER_INSTANCE_FIELD,
    POOL_SLOT_INDEX_FIELD,
)
# Every field of a slot header, in order.
POOL_HEADER_FIELDS: Final = (
    *POOL_IDENTITY_FIELDS,
    POOL_GENERATION_FIELD,
    POOL_STATE_FIELD,
    POOL_HOLDER_PID_FIELD,
    POOL_PAYLOAD_LENGTH_FIELD,
    POOL_CHECKSUM_FIELD,
    POOL_FLAGS_FIELD,
)
POOL_MAGIC_OFFSET: Final = POOL_MAGIC_FIELD.offset
POOL_VERSION_OFFSET: Final = POOL_VERSION_FIELD.offset
POOL_HEADER_LENGTH_OFFSET: Final = POOL_HEADER_LENGTH_FIELD.offset
POOL_CAPACITY_OFFSET: Final = POOL_CAPACITY_FIELD.offset
POOL_PRODUCER_PID_OFFSET: Final = POOL_PRODUCER_PID_FIELD.offset
POOL_PRODUCER_START_TIME_OFFSET: Final = POOL_PRODUCER_START_TIME_FIELD.offset
POOL_PRODUCER_INSTANCE_OFFSET: Final = POOL_PRODUCER_INSTANCE_FIELD.offset
POOL_SLOT_INDEX_OFFSET: Final = POOL_SLOT_INDEX_FIELD.offset
POOL_GENERATION_OFFSET: Final = POOL_GENERATION_FIELD.offset
POOL_STATE_OFFSET: Final = POOL_STATE_FIELD.offset
POOL_HOLDER_PID_OFFSET: Final = POOL_HOLDER_PID_FIELD.offset
POOL_PAYLOAD_LENGTH_OFFSET: Final = POOL_PAYLOAD_LENGTH_FIELD.offset
POOL_CHECKSUM_OFFSET: Final = POOL_CHECKSUM_FIELD.offset
POOL_FLAGS_OFFSET: Final = POOL_FLAGS_FIELD.offset
POOL_HEADER_FIELDS_END: Final = POOL_FLAGS_FIELD.end
# The fields written once at creation (magic .. slot index), one struct format.
POOL_IDENTITY_FORMAT: Final = compute_struct_format(POOL_IDENTITY_FIELDS)
# The payload starts on a page: what a consumer maps is page aligned.
POOL_SLOT_HEADER_LENGTH: Final = SHM_PAGE_SIZE

# Slot states (0: a header never written, invalid).
POOL_SLOT_FREE: Final = 1
POOL_SLOT_PUBLISHED: Final = 2
POOL_SLOT_CLAIMED: Final = 3
POOL_SLOT_DONE: Final = 4
POOL_SLOT_STATE_NAMES: Final = {
    POOL_SLOT_FREE: "free",
    POOL_SLOT_PUBLISHED: "published",
    POOL_SLOT_CLAIMED: "claimed",
    POOL_SLOT_DONE: "done",
}
POOL_FLAG_CHECKSUM: Final = 1  # the checksum field holds XXH3-64 of the payload

# Size classes: powers of two between these bounds (the options choose within them).
MIN_POOL_CLASS: Final = SHM_PAGE_SIZE
MAX_POOL_CLASS: Final = 1 << 40
# Payload bytes a slot holds beyond its class: the codec's header (prefix and
# leaf descriptors, a few dozen bytes per leaf) and the small leaves that
# travel next to a large tensor. A page multiple, so class + headroom is too.
POOL_CLASS_HEADROOM: Final = 64 * 1024

POOL_REF_TAG: Final = 0x50  # b"P"; never CODEC_FORMAT_VERSION
POOL_REF_MARKER_FIELD: Final = Section("marker", 0, 1, U8_CHAR)
POOL_REF_TAG_FIELD: Final = compute_section_after(POOL_REF_MARKER_FIELD, "tag", 1, U8_CHAR)
POOL_REF_FLAGS_FIELD: Final = compute_section_after(POOL_REF_TAG_FIELD, "flags", 1, U8_CHAR)
POOL_REF_RESERVED_FIELD: Final = compute_section_after(POOL_REF_FLAGS_FIELD, "reserved", 1, U8_CHAR)
POOL_REF_INDEX_FIELD: Final = compute_section_after(
    POOL_REF_RESERVED_FIELD, "slot index", 4, U32_CHAR
)
POOL_REF_GENERATION_FIELD: Final = compute_section_after(
    POOL_REF_INDEX_FIELD, "generation", 8, U64_CHAR
)
POOL_REF_PAYLOAD_LENGTH_FIELD: Final = compute_section_after(
    POOL_REF_GENERATION_FIELD, "payload length", 8, U64_CHAR
)
POOL_REF_CHECKSUM_FIELD: Final = compute_section_after(
    POOL_REF_PAYLOAD_LENGTH_FIELD, "checksum", 8, U64_CHAR
)
POOL_REF_FIELDS: Final = (
    POOL_REF_MARKER_FIELD,
    POOL_REF_TAG_FIELD,
    POOL_REF_FLAGS_FIELD,
    POOL_REF_RESERVED_FIELD,
    POOL_REF_INDEX_FIELD,
    POOL_REF_GENERATION_FIELD,
    POOL_REF_PAYLOAD_LENGTH_FIELD,
    POOL_REF_CHECKSUM_FIELD,
)
POOL_REF_MARKER_OFFSET: Final = POOL_REF_MARKER_FIELD.offset
POOL_REF_TAG_OFFSET: Final = POOL_REF_TAG_FIELD.offset
POOL_REF_FLAGS_OFFSET: Final = POOL_REF_FLAGS_FIELD.offset
POOL_REF_RESERVED_OFFSET: Final = POOL_REF_RESERVED_FIELD.offset
POOL_REF_INDEX_OFFSET: Final = POOL_REF_INDEX_FIELD.offset
POOL_REF_GENERATION_OFFSET: Final = POOL_REF_GENERATION_FIELD.offset
POOL_REF_PAYLOAD_LENGTH_OFFSET: Final = POOL_REF_PAYLOAD_LENGTH_FIELD.offset
POOL_REF_CHECKSUM_OFFSET: Final = POOL_REF_CHECKSUM_FIELD.offset
POOL_REF_LENGTH: Final = POOL_REF_CHECKSUM_FIELD.end
POOL_REF_FORMAT: Final = compute_struct_format(POOL_REF_FIELDS)
POOL_MAX_SLOT_INDEX: Final = (1 << 32) - 1

assert POOL_HEADER_FIELDS_END <= POOL_SLOT_HEADER_LENGTH
assert POOL_CLASS_HEADROOM % SHM_PAGE_SIZE == 0


def compute_slot_capacity(size_class: int) -> int:
    """Payload bytes a slot of class `size_class` holds: the class plus the headroom."""
    # Verify the class is not negative
    assert size_class >= 0
    return size_class + POOL_CLASS_HEADROOM


def compute_slot_file_length(capacity: int) -> int:
    """Bytes of a pool slot file of `capacity` payload bytes (`compute_slot_capacity`)."""
    # Verify the capacity is not negative
    assert capacity >= 0
    return POOL_SLOT_HEADER_LENGTH + capacity
