"""What each of impl's objects says it is: every `__repr__` in impl, in each of its states, exactly.

A repr is what a user reads in a log line or a debugger; one no test read
could say anything (seed 2205163994: a lease whose view was gone said
"1 bytes"). `test_every_repr_of_impl_is_read_here` keeps the list complete.
"""

from __future__ import annotations

import ast
import ctypes
import os
from pathlib import Path

import numpy as np
import pytest

from shmring.impl.codec.encode import encode, prepare
from shmring.impl.compat import SerializedPayload
from shmring.impl.os_seam import DEFAULT_OS
from shmring.impl.registered.views import borrow, lease_owner_of
from shmring.impl.ring.borrow import BorrowedPayload
from shmring.impl.ring.producer import RingChannel
from shmring.impl.ring.reader import RingReader
from shmring.model_tests.log_messages import impl_directory
from shmring.spec.layout import compute_frame_length
from shmring.spec.ring import ConsumeMode

# Every class of impl that defines __repr__ -> the test here that reads it
# (Connector's and Lease's first states are read in test_in_process_reach).
READ_HERE = {
    "BorrowedPayload": "test_a_borrowed_payload_says_whether_it_is_live",
    "Connector": "test_in_process_reach.py::test_a_connector_and_a_lease_say_what_they_are",
    "EncodePlan": "test_an_encode_plan_says_its_size_and_leaves",
    "Lease": "test_a_lease_whose_release_was_refused_says_it_lends_nothing_now",
    "LeaseOwner": "test_a_lease_owner_says_whether_it_is_live",
    "RingChannel": "test_a_ring_channel_says_where_its_head_and_tail_are",
    "RingReader": "test_a_ring_reader_says_its_ring_and_producer",
    "SerializedPayload": "test_a_serialized_payload_says_its_length",
}


def test_every_repr_of_impl_is_read_here() -> None:
    found = set()
    for path in Path(impl_directory()).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef) and any(
                isinstance(item, ast.FunctionDef) and item.name == "__repr__" for item in node.body
            ):
                found.add(node.name)
    assert found == set(READ_HERE)


@pytest.mark.parametrize(
    ("obj", "leaves"),
    [
        ({"a": 1, "b": [1, 2]}, 0),  # plain msgpack
        (b"x" * 100_000, 0),  # large bytes: one raw region, not a leaf
        ({"t": np.arange(12, dtype=np.float32).reshape(3, 4), "u": np.zeros(5, np.int8)}, 2),
    ],
    ids=["msgpack", "raw-bytes", "two-arrays"],
)
def test_an_encode_plan_says_its_size_and_leaves(obj: object, leaves: int) -> None:
    plan = prepare(obj)
    assert repr(plan) == f"EncodePlan(nbytes={len(encode(obj))}, leaf_count={leaves})"


def test_a_serialized_payload_says_its_length() -> None:
    assert repr(SerializedPayload(b"abcde")) == "SerializedPayload(5 bytes)"
    assert repr(SerializedPayload(b"")) == "SerializedPayload(0 bytes)"


def test_a_ring_channel_says_where_its_head_and_tail_are(tmp_path: Path) -> None:
    path = str(tmp_path / "ring")
    ring = RingChannel.create(path, 4096)
    try:
        assert repr(ring) == f"RingChannel(path={path!r}, capacity=4096, head=0 tail=0)"
        ring.put("key", b"payload")
        head = compute_frame_length(len(b"key"), len(b"payload"))
        assert repr(ring) == f"RingChannel(path={path!r}, capacity=4096, head={head} tail=0)"
    finally:
        ring.close()
    assert repr(ring) == f"RingChannel(path={path!r}, capacity=4096, closed)"


def test_a_ring_reader_says_its_ring_and_producer(tmp_path: Path) -> None:
    path = str(tmp_path / "ring")
    with RingChannel.create(path, 8192) as ring, RingReader.attach(path, os_facade=DEFAULT_OS) as r:
        assert r.producer[0] == os.getpid() and r.producer == ring.producer[:2]
        pid, start = r.producer
        assert repr(r) == f"RingReader(path={path!r}, capacity=8192, producer=({pid}, {start}))"


def test_a_lease_whose_release_was_refused_says_it_lends_nothing_now(tmp_path: Path) -> None:
    path = str(tmp_path / "ring")
    with RingChannel.create(path, 4096) as ring:
        ring.put("k", b"payload")
        with RingReader.attach(path, os_facade=DEFAULT_OS) as reader:
            lease = reader.get("k", mode=ConsumeMode.LEASE).payload
            part = lease.view[:3]
            part_array = np.frombuffer(part, np.uint8)  # an export: the view cannot be released
            with pytest.raises(BufferError):
                lease.release()
            # Its view is given up, its frame still claimed: nothing lent through it now.
            assert repr(lease) == f"Lease(position={lease.position}, 0 bytes)"
            del part_array, part
            lease.release()
            assert repr(lease) == f"Lease(position={lease.position}, released)"


def test_a_borrowed_payload_says_whether_it_is_live() -> None:
    memory = bytearray(16)
    keep = (ctypes.c_char * 16).from_buffer(memory)
    payload = BorrowedPayload(keep, ctypes.addressof(keep), 16, label="edge", position=7)
    del keep
    assert repr(payload) == "<BorrowedPayload edge position=7 live=True>"
    # It ends as its last view dies (its __del__), where nothing outside can
    # ask it any more: the end is run here by hand to read what it says then.
    payload._end()
    assert repr(payload) == "<BorrowedPayload edge position=7 live=False>"


def test_a_lease_owner_says_whether_it_is_live() -> None:
    array = borrow(np.zeros(16, np.uint8), 4, "uint8", (8,), label="field 0")
    owner = lease_owner_of(array)
    assert owner is not None
    assert repr(owner) == "<LeaseOwner field 0 live=True>"
    del array
    owner._end()  # what its __del__ runs (see the borrowed payload's test)
    assert repr(owner) == "<LeaseOwner field 0 live=False>"
