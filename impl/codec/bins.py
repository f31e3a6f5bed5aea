"""Large bins of a borrowed decode: the msgpack item walk that finds them, the Exts that stand in.

A borrowed decode (`decode.decode_borrowed`) hands large bytes values back
as views of the claimed payload. They sit inline in the msgpack, so before
msgspec sees it the decoder walks the msgpack items (`_large_bins`, a flat
walk: every item's length is in its own header) and replaces each large bin
by an Ext naming its place (`_with_bin_exts`; both for a framed payload's
header: `_borrowed_header`); the leaf reader's ext_hook turns that Ext back
into a view (`decode._LeafReader`).
"""

from __future__ import annotations

from typing import Any, Final

from ...spec.layout import CODEC_TYPE_TAG
from .wire import SHARED_LEAF_LIMIT

# Bytes values this large are borrowed by `decode_borrowed` (smaller ones are copied).
BORROWED_BYTES_MIN: Final = SHARED_LEAF_LIMIT
# First byte of the Ext a borrowed decode puts in place of a large bin (never on
# the wire: a wire Ext starting with it is a bad descriptor, as before).
_BORROWED_BIN_TAG: Final = CODEC_TYPE_TAG - 1

# msgpack item headers 0xC0..0xDF: (header bytes, bytes of the length field that
# follows the type byte; 0: none). Containers count items, not bytes: their header
# is all they occupy themselves (their items follow). -1: no such item (0xC1).
_MSGPACK_ITEMS: Final = (
    (1, 0), (-1, 0), (1, 0), (1, 0),  # nil, (never used), false, true
    (2, 1), (3, 2), (5, 4),  # bin 8 / 16 / 32
    (3, 1), (4, 2), (6, 4),  # ext 8 / 16 / 32 (length, then the type byte)
    (5, 0), (9, 0),  # float 32 / 64
    (2, 0), (3, 0), (5, 0), (9, 0), (2, 0), (3, 0), (5, 0), (9, 0),  # uint, int 8..64
    (3, 0), (4, 0), (6, 0), (10, 0), (18, 0),  # fixext 1 / 2 / 4 / 8 / 16
    (2, 1), (3, 2), (5, 4),  # str 8 / 16 / 32
    (3, 0), (5, 0), (3, 0), (5, 0),  # array 16 / 32, map 16 / 32
)  # fmt: skip
_MSGPACK_BIN32: Final = 0xC6
_MSGPACK_EXT8: Final = 0xC7
_MSGPACK_EXT32: Final = 0xC9
_MSGPACK_FIXEXT1: Final = 0xD4
_MSGPACK_FIXEXT16: Final = 0xD8
_MSGPACK_FIXSTR: Final = 0xA0
_MSGPACK_FIXSTR_MASK: Final = 0x1F
_MSGPACK_ITEMS_FIRST: Final = 0xC0
_MSGPACK_ITEMS_END: Final = 0xE0  # from here: negative fixints
# The Ext that stands for a large bin: the tag, then the bin's index (u32).
_BIN_INDEX_LENGTH: Final = 4
_BIN_EXT_DATA_LENGTH: Final = 1 + _BIN_INDEX_LENGTH


def _signed(byte: int) -> int:
    return byte - 256 if byte >= 128 else byte


def _large_bins(
    src: memoryview, start: int, end: int
) -> tuple[list[tuple[int, int, int]], set[int]]:
    """The bins of at least BORROWED_BYTES_MIN bytes in the msgpack items of src[start:end].

    Answers ([(item start, data start, data end)], the ext codes used). A flat
    walk, one item header at a time; anything malformed stops it with what
    it found so far (msgspec then reports the corruption as usual).
    """
    bins: list[tuple[int, int, int]] = []
    codes: set[int] = set()
    pos = start
    items = _MSGPACK_ITEMS
    while pos < end:
        byte = src[pos]
        if byte < _MSGPACK_FIXSTR:
            pos += 1  # positive fixint, fixmap, fixarray
        elif byte < _MSGPACK_ITEMS_FIRST:
            pos += 1 + (byte & _MSGPACK_FIXSTR_MASK)  # fixstr
        elif byte >= _MSGPACK_ITEMS_END:
            pos += 1  # negative fixint
        else:
            head, width = items[byte - _MSGPACK_ITEMS_FIRST]
            if head < 0 or pos + head > end:
                break
            size = int.from_bytes(src[pos + 1 : pos + 1 + width], "big") if width else 0
            if byte == _MSGPACK_BIN32 and size >= BORROWED_BYTES_MIN and pos + head + size <= end:
                bins.append((pos, pos + head, pos + head + size))
            elif _MSGPACK_EXT8 <= byte <= _MSGPACK_EXT32:
                codes.add(_signed(src[pos + head - 1]))  # ext 8 / 16 / 32: type after the length
            elif _MSGPACK_FIXEXT1 <= byte <= _MSGPACK_FIXEXT16:
                codes.add(_signed(src[pos + 1]))
            pos += head + size
    return bins, codes


def _with_bin_exts(
    src: memoryview, start: int, end: int, bins: list[tuple[int, int, int]], code: int
) -> bytes:
    """src[start:end] with each large bin replaced by an ext8 (`_BORROWED_BIN_TAG`, its index)."""
    pieces: list[Any] = []
    last = start
    head = bytes((_MSGPACK_EXT8, _BIN_EXT_DATA_LENGTH, code & 0xFF, _BORROWED_BIN_TAG))
    for index, (item, _, data_end) in enumerate(bins):
        pieces.append(src[last:item])
        pieces.append(head + index.to_bytes(_BIN_INDEX_LENGTH, "big"))
        last = data_end
    pieces.append(src[last:end])
    return b"".join(pieces)


def _borrowed_header(
    src: memoryview, start: int, end: int, code: int
) -> tuple[list[tuple[int, int]], bytes]:
    """A borrowed decode's header src[start:end], its large bins replaced by Exts that name them.

    Answers ([(data start, data end)] of those bins, the header for msgspec).
    """
    if end - start >= BORROWED_BYTES_MIN:
        bins, _ = _large_bins(src, start, end)
        if bins:
            header = _with_bin_exts(src, start, end, bins, code)
            return [(data_start, data_end) for _, data_start, data_end in bins], header
    return [], bytes(src[start:end])
