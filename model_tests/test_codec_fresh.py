"""The owned copy of a large bytes payload out of a pool slot (`impl.pool.copyout`).

It must answer exactly what the codec answers (a new, independent ``bytes``
object), take only payloads that are one msgpack bin32, and advise its
destination's whole 2 MiB pages as huge (seen in /proc/self/smaps: the
VMA's ``hg`` flag), so the copy does not fault each 4 KiB page.
"""

from __future__ import annotations

import ctypes
import os
from typing import Any

import pytest

from shmring.impl import codec
from shmring.impl.connector import Connector
from shmring.impl.pool import copyout
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
    monkeypatch.setattr(copyout, "min_bytes", 1)
    data = os.urandom(100_000)
    encoded = _encoded(data)
    assert encoded[0] == 0xC6  # the codec's top-level bytes: one bin32
    got = copyout.owned_bin(memoryview(encoded).toreadonly())
    assert type(got) is bytes and got == data == codec.decode(encoded)
    assert got is not data
    assert copyout.owned_bin(memoryview(encoded + b"\0")) is None  # trailing byte: the codec's
    assert copyout.owned_bin(memoryview(encoded[:-1])) is None  # truncated: the codec's
    assert copyout.owned_bin(memoryview(_encoded(b"x" * 300))) is None  # bin16
    assert copyout.owned_bin(memoryview(_encoded({"x": data}))) is None  # a tree
    assert copyout.owned_bin(memoryview(b"")) is None
    monkeypatch.setattr(copyout, "min_bytes", len(data) + 1)
    assert copyout.owned_bin(memoryview(encoded)) is None  # below the threshold


def test_the_copy_advises_its_destinations_whole_huge_pages(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(copyout, "min_bytes", 1)
    data = os.urandom(5 * MIB)  # at least one whole 2 MiB page inside, wherever it lands
    before = dict(copyout.statistics)
    got = copyout.owned_bin(memoryview(_encoded(data)))
    assert got == data
    start = ctypes.cast(got, ctypes.c_void_p).value
    assert start is not None
    first_huge = -start % copyout.HUGE_PAGE + start
    assert copyout.statistics["advised"] == before["advised"] + 1
    assert "hg" in _vm_flags(first_huge)


def test_an_owned_pool_get_of_a_large_bytes_payload_is_an_independent_equal_copy(
    scope: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(copyout, "min_bytes", 64 * 1024)
    options = {"ring_capacity": 4096, "pool_min_bytes": 4096, "pool_max_bytes": 8 * MIB}
    first, second = os.urandom(5 * MIB), os.urandom(5 * MIB)  # a whole 2 MiB page inside
    with Connector(scope, **options) as producer, Connector(scope) as receiver:
        advised = copyout.statistics["advised"]
        assert producer.put(EDGE, "a", first).route is Route.POOL
        got = receiver.get(EDGE, "a")
        assert got.route is Route.POOL and type(got.value) is bytes and got.value == first
        assert copyout.statistics["advised"] == advised + 1
        producer.put(EDGE, "b", second)  # the same slot, rewritten: released after the copy
        assert producer.health().pool_slots_reused == 1
        assert receiver.get(EDGE, "b").value == second
        assert got.value == first  # owned: the rewrite did not reach it
