"""spec/layout.py's `Section` records: every header is its sections, every struct format derived.

Issue 23: the frame header's order was written in spec/layout.py and again
in three struct formats in impl/frame_io.py. Now each header is a tuple of
`Section`s, the `*_OFFSET` names are their offsets and every multi-field
struct format comes from `compute_struct_format`; these tests check that
the records describe the bytes (sizes, order, no overlap) and that what
frame_io writes reads back field by field through them.
"""

from __future__ import annotations

import struct

import pytest

from shmring.impl import frame_io
from shmring.spec import layout
from shmring.spec.layout import (
    LITTLE_ENDIAN,
    Section,
    compute_struct_format,
    get_section,
)

HEADERS = {
    "ring header": layout.RING_HEADER_FIELDS,
    "frame header": layout.FRAME_HEADER_FIELDS,
    "codec prefix": layout.CODEC_PREFIX_FIELDS,
    "codec leaf descriptor": layout.CODEC_DESCRIPTOR_FIELDS,
    "stamp file": layout.STAMP_FILE_FIELDS,
    "pool slot header": layout.POOL_HEADER_FIELDS,
    "pool reference": layout.POOL_REF_FIELDS,
}


@pytest.mark.parametrize("name", HEADERS)
def test_sections_are_in_order_without_overlap_and_sized_as_their_format(name: str) -> None:
    fields = HEADERS[name]
    end = 0
    for field in fields:
        assert field.offset >= end, (name, field)
        assert struct.calcsize(LITTLE_ENDIAN + field.format) == field.size, (name, field)
        end = field.end
    assert len({field.name for field in fields}) == len(fields), name


@pytest.mark.parametrize("name", HEADERS)
def test_a_derived_format_reads_every_field_where_its_section_says(name: str) -> None:
    fields = HEADERS[name]
    buf = bytearray(fields[-1].end)
    values = []
    for number, field in enumerate(fields, start=1):
        value = number if field.format.islower() else number * 3  # fits every width, signed too
        struct.pack_into(LITTLE_ENDIAN + field.format, buf, field.offset, value)
        values.append(value)
    assert list(struct.unpack_from(compute_struct_format(fields), buf, fields[0].offset)) == values
    skipped = fields[1].name
    read = struct.unpack_from(compute_struct_format(fields, skip=(skipped,)), buf)
    assert list(read) == values[:1] + values[2:]


def test_the_offset_names_are_the_sections_offsets() -> None:
    for field in layout.FRAME_HEADER_FIELDS:
        name = "FRAME_" + field.name.upper().replace(" ", "_") + "_OFFSET"
        assert getattr(layout, name) == field.offset, name
    assert layout.FRAME_HEADER_FIELDS[-1].end == layout.FRAME_HEADER_LENGTH
    assert get_section(layout.RING_HEADER_FIELDS, "ring state").offset == layout.RING_STATE_OFFSET
    assert layout.POOL_HEADER_FIELDS[-1].end == layout.POOL_HEADER_FIELDS_END
    assert layout.POOL_REF_FIELDS[-1].end == layout.POOL_REF_LENGTH
    assert layout.CODEC_PREFIX_FIELDS[-1].end == layout.CODEC_PREFIX_LENGTH
    with pytest.raises(KeyError):
        get_section(layout.FRAME_HEADER_FIELDS, "no such field")


def test_compute_struct_format_pads_the_gaps_between_sections() -> None:
    first = Section("a", 0, 4, layout.U32_CHAR)
    later = Section("b", 8, 2, layout.U16_CHAR)
    assert struct.calcsize(compute_struct_format((first, later))) == later.end


def test_what_frame_io_writes_reads_back_through_the_sections() -> None:
    buf = memoryview(bytearray(layout.RING_HEADER_LENGTH + layout.FRAME_HEADER_LENGTH))
    frame_io.write_ring_header(buf, 8192, 1234, 5678, layout.RING_STATE_OPEN, 9)
    header = frame_io.read_ring_header(buf)
    expected = (layout.RING_MAGIC, layout.RING_VERSION, layout.RING_HEADER_LENGTH, 8192)
    assert (header.magic, header.version, header.header_length, header.capacity) == expected
    for field, value in zip(
        layout.RING_IDENTITY_FIELDS,
        (*expected, 1234, 5678, layout.RING_STATE_OPEN, 9),
        strict=True,
    ):
        assert struct.unpack_from(LITTLE_ENDIAN + field.format, buf, field.offset)[0] == value
    offset = layout.RING_HEADER_LENGTH
    frame_io.write_data_frame_fields(
        buf,
        offset,
        state=layout.FRAME_STATE_PUBLISHED,
        key_length=3,
        payload_length=7,
        position=4096,
        checksum=0xABCD,
    )
    by_name = {
        field.name: struct.unpack_from(LITTLE_ENDIAN + field.format, buf, offset + field.offset)[0]
        for field in layout.FRAME_HEADER_FIELDS
    }
    assert by_name == {
        "length": 0,  # stored last, by the publication
        "type": layout.DATA_FRAME_TYPE,
        "state": layout.FRAME_STATE_PUBLISHED,
        "key length": 3,
        "payload length": 7,
        "position": 4096,
        "checksum": 0xABCD,
        "holder pid": layout.FRAME_HOLDER_NONE,
    }
    read = frame_io.read_frame_header(buf, offset)
    assert (read.frame_type, read.key_length, read.position, read.checksum) == (
        layout.DATA_FRAME_TYPE,
        3,
        4096,
        0xABCD,
    )
