"""Tagged payloads: bytes that say which put they came from.

Every test that puts bytes and checks what comes back uses these: the tag
sits in the first 8 bytes (little-endian; `payload_tag` reads it back) and
the rest is a fill derived from the tag, so a torn, stale or foreign copy
shows anywhere in the payload, and unique tags give unique payloads. A
string tag (a key, a key and version) is hashed to its number first.
"""

from __future__ import annotations

import hashlib
import struct

from ...spec.layout import U64_FORMAT

TAG_BYTES = struct.calcsize(U64_FORMAT)  # the tag, one little-endian u64, starts a payload
_FILL_PERIOD = 64  # the fill repeats after this many bytes, so large payloads are cheap to make


def tag_number(tag: int | str) -> int:
    """The number a tag stands for: an int as it is, a string by its hash."""
    if isinstance(tag, int):
        return tag
    number: int = struct.unpack(
        U64_FORMAT, hashlib.blake2b(tag.encode(), digest_size=TAG_BYTES).digest()
    )[0]
    return number


def tagged_payload(tag: int | str, size: int) -> bytes:
    """Exactly `size` bytes: the tag in the first 8 (cut short below 8), then a fill derived from it."""
    number = tag_number(tag)
    head = struct.pack(U64_FORMAT, number)
    fill = hashlib.blake2b(head, digest_size=_FILL_PERIOD).digest()  # differs for every tag
    body_size = max(size - TAG_BYTES, 0)
    body = (fill * (body_size // _FILL_PERIOD + 1))[:body_size]
    return (head + body)[:size]


def payload_tag(payload: bytes) -> int:
    """The tag a `tagged_payload` of at least 8 bytes starts with."""
    tag: int = struct.unpack(U64_FORMAT, payload[:TAG_BYTES])[0]
    return tag


__all__ = ["TAG_BYTES", "payload_tag", "tag_number", "tagged_payload"]
