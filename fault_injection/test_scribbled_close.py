"""Issue 22, defect 7: `close()` after a neighbour scribbled over a live ring's header.

Overwriting the first 256 bytes of a live ring file made `close()` raise a
bare ValueError and leave the ring, its marker and the member files behind.
Close never raises for corrupt contents, removes every file it owns, and
says what it could not do (a logged warning naming the file).
"""

from __future__ import annotations

import logging
import os

import pytest

from shmring.impl.connector import Connector, GetStatus
from shmring.impl.liveness import liveness_file_name
from shmring.impl.names import current_producer_identity, deployment_directory

EDGE = ("a", "b")


@pytest.mark.parametrize("fill", [b"\xff", b"\x00", b"\x5a"], ids=["ones", "zeros", "bytes"])
@pytest.mark.parametrize("reader_first", [False, True], ids=["alone", "with_reader"])
def test_close_after_a_scribbled_ring_header_removes_what_it_owns(
    scope: str, fill: bytes, reader_first: bool, caplog: pytest.LogCaptureFixture
) -> None:
    producer = Connector(scope, ring_capacity=4096, pool_budget_bytes=0)
    reader = Connector(scope, ring_capacity=4096)
    try:
        producer.put(EDGE, "k0", {"v": 0})
        producer.put(EDGE, "k1", {"v": 1})
        producer.put(EDGE, "big", {"v": b"x" * 3000})  # a fallback segment too
        if reader_first:
            assert reader.get(EDGE, "k0").status is GetStatus.DELIVERED
        ring = producer.file_path(producer.put(EDGE, "k2", {"v": 2}))
        with open(ring, "r+b") as scribble:
            scribble.write(fill * 256)
        with caplog.at_level(logging.WARNING, logger="shmring"):
            producer.close()  # never raises
        assert producer.closed
        directory = deployment_directory(scope)
        left = sorted(os.listdir(directory)) if os.path.isdir(directory) else []
        # The joined reader's: the members and stamp files, and (once it joined)
        # this process's liveness file, which it holds (issue 26).
        readers = {"members", "stamp"}
        if reader_first:
            readers.add(liveness_file_name(current_producer_identity()))
        assert [name for name in left if name not in readers] == []
        assert any("could not" in record.getMessage() for record in caplog.records), caplog.text
        assert not os.path.exists(ring)
        for key in ("k1", "k2", "big"):  # nothing of a closed producer is delivered
            assert reader.get(EDGE, key).status is not GetStatus.DELIVERED
    finally:
        reader.close()
        producer.close()
    assert not os.path.exists(deployment_directory(scope))
