"""Owned copies of large payloads into huge-page-advised memory (`impl.codec.fresh`).

`owned_bin` must answer exactly what msgspec answers for a top-level bytes
payload (a new, independent ``bytes`` object) and take only payloads that
are one msgpack bin32; `owned_bytearray` (under own-area tensors and arrays)
must be ``bytearray(view)``. Both advise their destination's whole 2 MiB
pages as huge (seen in /proc/self/smaps: the VMA's ``hg`` flag), so the copy
does not fault each 4 KiB page; `codec.decode` uses them on every route.
"""

from __future__ import annotations

import ctypes
import os
from typing import Any

import numpy
import pytest
import torch

from shmring.impl import codec
from shmring.impl.codec import fresh
from shmring.impl.connector import Connector
from shmring.spec.connector import Route

EDGE = ("enc", "dec")
MIB = 1 << 20


def _encoded(value: Any) -> bytes:
    plan = codec.prepare(value)
    buf = bytearray(plan.nbytes)
    plan.write_into(buf)
    return bytes(buf)


def _vm_flags(address: int) -> list[str]:
    """The VmFlags of the mapping of this process that holds `address`."""
    inside = False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            head = line.split(maxsplit=1)[0]
            if "-" in head and not head.endswith(":"):
                low, high = (int(part, 16) for part in head.split("-"))
                inside = low <= address < high
            elif inside and head == "VmFlags:":
                return line.split()[1:]
    raise AssertionError(f"no mapping holds {address:#x}")


def test_owned_bin_answers_the_codecs_bytes_for_one_bin32_and_none_for_anything_else(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(fresh, "min_bytes", 1)
    data = os.urandom(100_000)
    encoded = _encoded(data)
    assert encoded[0] == 0xC6  # the codec's top-level bytes: one bin32
    got = fresh.owned_bin(memoryview(encoded).toreadonly())
    assert type(got) is bytes and got == data == codec.decode(encoded)
    assert got is not data
    assert fresh.owned_bin(memoryview(encoded + b"\0")) is None  # trailing byte: the codec's
    assert fresh.owned_bin(memoryview(encoded[:-1])) is None  # truncated: the codec's
    assert fresh.owned_bin(memoryview(_encoded(b"x" * 300))) is None  # bin16
    assert fresh.owned_bin(memoryview(_encoded({"x": data}))) is None  # a tree
    assert fresh.owned_bin(memoryview(b"")) is None
    monkeypatch.setattr(fresh, "min_bytes", len(data) + 1)
    assert fresh.owned_bin(memoryview(encoded)) is None  # below the threshold


def test_the_copy_advises_its_destinations_whole_huge_pages(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(fresh, "min_bytes", 1)
    data = os.urandom(5 * MIB)  # at least one whole 2 MiB page inside, wherever it lands
    before = dict(fresh.statistics)
    got = fresh.owned_bin(memoryview(_encoded(data)))
    assert got == data
    start = ctypes.cast(got, ctypes.c_void_p).value
    assert start is not None
    first_huge = -start % fresh.HUGE_PAGE + start
    assert fresh.statistics["advised"] == before["advised"] + 1
    assert "hg" in _vm_flags(first_huge)


def test_an_owned_pool_get_of_a_large_bytes_payload_is_an_independent_equal_copy(
    scope: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fresh, "min_bytes", 64 * 1024)
    options = {"ring_capacity": 4096, "pool_min_bytes": 4096, "pool_max_bytes": 8 * MIB}
    first, second = os.urandom(5 * MIB), os.urandom(5 * MIB)  # a whole 2 MiB page inside
    with Connector(scope, **options) as producer, Connector(scope) as receiver:
        advised = fresh.statistics["advised"]
        assert producer.put(EDGE, "a", first).route is Route.POOL
        got = receiver.get(EDGE, "a")
        assert got.route is Route.POOL and type(got.value) is bytes and got.value == first
        assert fresh.statistics["advised"] == advised + 1
        producer.put(EDGE, "b", second)  # the same slot, rewritten: released after the copy
        assert producer.health().pool_slots_reused == 1
        assert receiver.get(EDGE, "b").value == second
        assert got.value == first  # owned: the rewrite did not reach it


def test_an_owned_tensor_is_copied_into_advised_memory_on_decode(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(fresh, "min_bytes", MIB)
    tensor = torch.arange(5 * MIB // 8, dtype=torch.int64)  # 5 MiB: a whole 2 MiB page inside
    small = numpy.arange(100, dtype=numpy.int16)  # a shared-area leaf: not advised
    encoded = _encoded({"t": tensor, "s": small})
    before = fresh.statistics["advised"]
    got = codec.decode(encoded)
    assert torch.equal(got["t"], tensor) and numpy.array_equal(got["s"], small)
    assert fresh.statistics["advised"] == before + 1
    start = got["t"].data_ptr()
    assert "hg" in _vm_flags(-start % fresh.HUGE_PAGE + start)
    got["t"][0] = 7  # owned and writable: the encoding is untouched
    assert codec.decode(encoded)["t"][0] == 0


def test_owned_bytearray_is_bytearray_of_its_view_at_any_size(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    data = os.urandom(3 * MIB)
    for threshold in (1, len(data), len(data) + 1):
        monkeypatch.setattr(fresh, "min_bytes", threshold)
        got = fresh.owned_bytearray(memoryview(data).toreadonly())
        assert type(got) is bytearray and got == data
