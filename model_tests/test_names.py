"""Every deployment file name is built and parsed in one place (`shmring.impl.names`).

The parse table is what discovery, the garbage collector, `shmring stat` and
the last member's teardown read a file's kind and owner from; issue 11 merged
three copies of it. A name parses back to the kind and owner it was built
with, and to no other kind.
"""

from __future__ import annotations

import os
import struct

import pytest

from shmring.impl import names
from shmring.impl.errors import InvalidKeyError
from shmring.impl.names import FileKind
from shmring.spec.layout import (
    RING_HEADER_LENGTH,
    RING_MAGIC,
    RING_PRODUCER_PID_OFFSET,
    RING_PRODUCER_START_TIME_OFFSET,
    U64_FORMAT,
)

EDGE = ("src", "dst")
OWNER = (4321, 987654)  # (pid, start time) of some process
PRODUCER = (*OWNER, 3)  # one of its connectors


def _built() -> list[tuple[str, FileKind, tuple[int, int] | None]]:
    """(name, kind, owner in the name) for a name of every kind, as the builders make them."""
    me = names.current_producer_identity()
    return [
        (names.STAMP_FILE_NAME, FileKind.STAMP, None),
        (names.MEMBERS_FILE_NAME, FileKind.MEMBERS, None),
        (names.ring_file_name(*EDGE, PRODUCER), FileKind.RING, OWNER),
        (names.ring_file_name(*EDGE, OWNER), FileKind.RING, OWNER),
        (names.marker_file_name(EDGE, PRODUCER), FileKind.MARKER, OWNER),
        (names.live_file_name(PRODUCER), FileKind.LIVE, OWNER),
        (
            names.fallback_segment_file_name(EDGE, "key/with spaces"),
            FileKind.FALLBACK_SEGMENT,
            None,
        ),
        (names.fallback_temp_file_name(PRODUCER, 17), FileKind.FALLBACK_TEMP, OWNER),
        (names.fallback_spare_file_name(PRODUCER, 17), FileKind.FALLBACK_SPARE, OWNER),
        (names.registered_segment_file_name(), FileKind.REGISTERED_SEGMENT, me),
        (names.arena_file_name(), FileKind.ARENA, me),
        (names.pool_slot_file_name(PRODUCER, 12), FileKind.POOL_SLOT, OWNER),
        (names.cohort_gate_file_name(EDGE, PRODUCER), FileKind.COHORT_GATE, OWNER),
    ]


def test_every_built_name_parses_back_to_its_kind_and_owner() -> None:
    built = _built()
    assert {kind for _, kind, _ in built} == set(FileKind)  # the table has no kind untested
    for name, kind, owner in built:
        assert names.parse_file_name(name) == names.ParsedFileName(kind, owner), name
        assert names.file_owner(name) == owner, name


def test_a_name_matches_exactly_one_entry_of_the_parse_table() -> None:
    for name, kind, _ in _built():
        matching = [k for k, pattern in names._FILE_NAMES if pattern.fullmatch(name)]
        assert matching == [kind], name


def test_the_specific_parsers_agree_with_the_table() -> None:
    marker = names.marker_file_name(EDGE, PRODUCER)
    assert names.parse_marker_file_name(marker) == (EDGE, PRODUCER)
    assert names.parse_marker_file_name(names.marker_file_name(EDGE, OWNER)) == (EDGE, (*OWNER, 0))
    ring = names.parse_ring_file_name(names.ring_file_name(*EDGE, PRODUCER))
    assert ring is not None and ring.identity == PRODUCER
    assert names.parse_live_file_name(names.live_file_name(PRODUCER)) == OWNER
    assert names.parse_fallback_temp_file_name(names.fallback_temp_file_name(PRODUCER, 1)) == OWNER
    assert names.parse_fallback_spare_file_name(names.fallback_spare_file_name(OWNER, 1)) == OWNER
    assert names.is_fallback_segment_file_name(names.fallback_segment_file_name(EDGE, "k"))


@pytest.mark.parametrize(
    "name",
    [
        "",
        "stamp.old",
        "ring.a.b.12",  # no start time
        f"ring.{'a' * 65}.b.1.2",  # a stage name longer than any stage may be
        "marker.a.b.x.2",
        "live.1",
        "fb.a.b.0123",  # digest too short
        "fbtmp.1.2",  # no generation
        "seg.12.34.5.nothex!",
        "arena.1.2.ABCDEF01",  # tokens are lower-case hex
        "../stamp",
    ],
)
def test_a_name_no_shmring_file_has_parses_to_nothing(name: str) -> None:
    assert names.parse_file_name(name) is None
    assert names.file_owner(name) is None


def test_fallback_and_registered_segments_have_distinct_prefixes_and_names() -> None:
    assert names.FALLBACK_SEGMENT_FILE_PREFIX != names.REGISTERED_SEGMENT_FILE_PREFIX
    fallback = names.fallback_segment_file_name(EDGE, "k")
    registered = names.registered_segment_file_name()
    assert fallback.split(".")[0] == names.FALLBACK_SEGMENT_FILE_PREFIX
    assert registered.split(".")[0] == names.REGISTERED_SEGMENT_FILE_PREFIX
    assert names.fallback_segment_path("/d", EDGE, "k") == os.path.join("/d", fallback)


def test_only_registered_segment_and_arena_names_pass_as_transfer_names() -> None:
    for name in (names.registered_segment_file_name(), names.arena_file_name()):
        assert names.validate_transfer_file_name(name) == name
    for bad in (
        names.fallback_segment_file_name(EDGE, "k"),
        names.ring_file_name(*EDGE, PRODUCER),
        "/dev/shm/" + names.arena_file_name(),
        b"seg",
    ):
        with pytest.raises(InvalidKeyError):
            names.validate_transfer_file_name(bad)


def test_a_segment_header_tells_its_owner_only_with_a_rings_magic() -> None:
    header = bytearray(RING_HEADER_LENGTH)
    struct.pack_into(U64_FORMAT, header, 0, RING_MAGIC)
    struct.pack_into(U64_FORMAT, header, RING_PRODUCER_PID_OFFSET, OWNER[0])
    struct.pack_into(U64_FORMAT, header, RING_PRODUCER_START_TIME_OFFSET, OWNER[1])
    assert names.parse_segment_owner(bytes(header)) == OWNER
    assert names.parse_segment_owner(bytes(header[:-1])) is None  # shorter than a ring header
    header[0] ^= 0xFF
    assert names.parse_segment_owner(bytes(header)) is None


def test_pool_slot_name_carries_producer_and_index() -> None:
    name = names.pool_slot_file_name(PRODUCER, 12)
    assert names.parse_pool_slot_file_name(name) == (PRODUCER, 12)
    assert names.parse_pool_slot_file_name("pool.1.2.3") is None  # no instance
    assert names.parse_pool_slot_file_name(name + "x") is None
