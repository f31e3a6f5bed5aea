"""Owned copies of large payloads, into fresh memory that faults in 2 MiB pages.

Design rationale (issue 13, "large payloads, where the time goes" in
docs/performance.md). An owned decode of a large payload ends with one copy
out of the frame, slot or segment into fresh memory the receiver owns: the
``bytes`` of a top-level bytes payload, the ``bytearray`` under an own-area
tensor or array. malloc maps every allocation above 32 MiB freshly, so the
copy page-faults each 4 KiB page of its destination: on the measuring VM a
fault costs 3-7 us, and a 256 MiB copy out took 440 ms (584 MiB/s) where
the copy itself is 30 ms. Advising the destination's pages as huge
(`MADV_HUGEPAGE`, honoured where /sys/kernel/mm/transparent_hugepage/enabled
is ``madvise`` or ``always``) makes the same copy fault once per 2 MiB.

`owned_bin` builds exactly the ``bytes`` object the codec answers for a
payload that is one msgpack bin32 (the codec's encoding of a top-level
``bytes`` of 64 KiB or more: marker, 4-byte big-endian length, the bytes;
`encode._prepare_bytes`), or None for anything else, which `decode` then
hands to msgspec. `owned_bytearray` is ``bytearray(view)``. Both make their
object uninitialized (`PyBytes_FromStringAndSize(NULL, n)` /
`PyByteArray_FromStringAndSize(NULL, n)`, the C API's way to fill a new
object), advise its whole 2 MiB pages, then fill it with one memmove, before
any other code sees it; only for copies of at least `min_bytes` (32 MiB + 1:
glibc's largest dynamic mmap threshold, so the allocation is a mapping of
its own and the advice dies with the object, never touching the heap).
Where madvise fails or is absent the copy is the same, 4 KiB faults.
"""

from __future__ import annotations

import ctypes
import mmap
from typing import Final

# Payloads of at least this many bytes take the advised copy.
OWNED_HUGE_MIN_BYTES: Final = 32 << 20 | 1
HUGE_PAGE: Final = 2 << 20
_BIN32: Final = 0xC6  # msgpack bin 32: the marker, then the length (4 bytes, big-endian)
_BIN32_HEADER: Final = 5
_MADV_HUGEPAGE: Final = getattr(mmap, "MADV_HUGEPAGE", 14)

_new_bytes = ctypes.pythonapi.PyBytes_FromStringAndSize
_new_bytes.restype = ctypes.py_object
_new_bytes.argtypes = (ctypes.c_void_p, ctypes.c_ssize_t)
_new_bytearray = ctypes.pythonapi.PyByteArray_FromStringAndSize
_new_bytearray.restype = ctypes.py_object
_new_bytearray.argtypes = (ctypes.c_void_p, ctypes.c_ssize_t)
_libc = ctypes.CDLL(None, use_errno=True)
_madvise = getattr(_libc, "madvise", None)
if _madvise is not None:
    _madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    _madvise.restype = ctypes.c_int

# Copies that advised their destination, and ones whose advice the kernel refused.
statistics = {"advised": 0, "refused": 0}
min_bytes = OWNED_HUGE_MIN_BYTES  # a module setting, so a measurement can switch it off


def bin_length(view: memoryview) -> int | None:
    """The byte count of a payload that is exactly one msgpack bin32, else None."""
    if len(view) < _BIN32_HEADER or view[0] != _BIN32:
        return None
    length = int.from_bytes(view[1:_BIN32_HEADER], "big")
    return length if _BIN32_HEADER + length == len(view) else None


def owned_bin(view: memoryview) -> bytes | None:
    """`codec.decode(view)` for a large bin32 payload, copied into huge-page-advised memory.

    None when `view` is not one bin32 of at least `min_bytes` (decode it
    with msgspec). `view` is a contiguous byte view.
    """
    length = bin_length(view)
    if length is None or length < min_bytes:
        return None
    value = _new_bytes(None, length)
    destination = ctypes.cast(value, ctypes.c_void_p).value  # its first data byte
    assert destination is not None
    with view[_BIN32_HEADER:] as payload:
        _advise_and_copy(destination, payload, length)
    return value  # type: ignore[no-any-return]


def owned_bytearray(view: memoryview) -> bytearray:
    """``bytearray(view)``; at `min_bytes` and more, into huge-page-advised memory."""
    length = len(view)
    if length < min_bytes:
        return bytearray(view)
    value: bytearray = _new_bytearray(None, length)
    destination = ctypes.addressof(ctypes.c_char.from_buffer(value))
    _advise_and_copy(destination, view, length)
    return value


def _advise_and_copy(destination: int, source: memoryview, length: int) -> None:
    """Advise the whole 2 MiB pages of [destination, +length) huge, then copy `source` in."""
    start = -destination % HUGE_PAGE + destination
    end = (destination + length) // HUGE_PAGE * HUGE_PAGE
    if _madvise is not None and end > start:
        if _madvise(start, end - start, _MADV_HUGEPAGE) == 0:
            statistics["advised"] += 1
        else:
            statistics["refused"] += 1
    ctypes.memmove(destination, _address(source), length)


def _address(view: memoryview) -> int:
    """Address of a contiguous buffer's first byte (read-only views too)."""
    import numpy

    return int(numpy.frombuffer(view, numpy.uint8).ctypes.data)
