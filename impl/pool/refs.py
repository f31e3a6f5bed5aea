"""Pool references: the payload of the ring frame that carries a slot's payload.

`spec.layout`'s pool block gives the 32 bytes. `is_pool_ref` is the cheap
test a ring decoder runs on every payload (length, marker, tag: a codec
payload has its format version where a reference has POOL_REF_TAG);
`decode_ref` checks every field's bounds and raises CorruptFrameError for
anything else, so a forged reference can name no file outside its
producer's pool and no byte outside its slot.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Final

from ...spec.layout import (
    CODEC_FRAMED_MARKER,
    POOL_FLAG_CHECKSUM,
    POOL_REF_FORMAT,
    POOL_REF_LENGTH,
    POOL_REF_TAG,
    POOL_REF_TAG_OFFSET,
)
from ..errors import CorruptFrameError

_REF: Final = struct.Struct(POOL_REF_FORMAT)
assert _REF.size == POOL_REF_LENGTH
_KNOWN_FLAGS: Final = POOL_FLAG_CHECKSUM


@dataclass(frozen=True)
class PoolRef:
    """A decoded reference (`spec.connector.PoolRef` plus what the consumer checks)."""

    index: int  # the slot: file `pool.<ring's producer>.<index>`
    generation: int  # the publish it names
    payload_length: int  # bytes of the payload in the slot
    checksum: int  # XXH3-64 of the payload when `flags` has POOL_FLAG_CHECKSUM, else 0
    flags: int

    @property
    def checked(self) -> bool:
        return bool(self.flags & POOL_FLAG_CHECKSUM)


def encode_ref(
    index: int, generation: int, payload_length: int, checksum: int, flags: int
) -> bytes:
    return _REF.pack(
        CODEC_FRAMED_MARKER, POOL_REF_TAG, flags, 0, index, generation, payload_length, checksum
    )


def is_pool_ref(view: memoryview | bytes) -> bool:
    """Whether a ring payload is a pool reference (it may still be a corrupt one)."""
    return (
        len(view) == POOL_REF_LENGTH
        and view[0] == CODEC_FRAMED_MARKER
        and view[POOL_REF_TAG_OFFSET] == POOL_REF_TAG
    )


def decode_ref(view: memoryview | bytes) -> PoolRef:
    """The reference's fields; CorruptFrameError for any malformed byte."""
    if len(view) != POOL_REF_LENGTH:
        raise CorruptFrameError(f"pool reference of {len(view)} bytes, not {POOL_REF_LENGTH}")
    marker, tag, flags, reserved, index, generation, length, checksum = _REF.unpack_from(view, 0)
    if marker != CODEC_FRAMED_MARKER or tag != POOL_REF_TAG:
        raise CorruptFrameError(f"not a pool reference: marker={marker:#x} tag={tag:#x}")
    if flags & ~_KNOWN_FLAGS or reserved:
        raise CorruptFrameError(f"pool reference with unknown flags={flags:#x} reserved={reserved}")
    if generation == 0:
        raise CorruptFrameError("pool reference names generation 0 (no publish has it)")
    if not flags & POOL_FLAG_CHECKSUM and checksum:
        raise CorruptFrameError(f"pool reference carries checksum={checksum:#x} without its flag")
    return PoolRef(index, generation, length, checksum, flags)
