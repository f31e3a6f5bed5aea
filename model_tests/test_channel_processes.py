"""The ring channel across real processes: competing readers, and a producer
killed in the middle of a put.

Workers are spawned (fresh interpreters, `shmring.model_tests.workers`) and
report over pipes. Every wait has a timeout and every worker is killed and
reaped in `finally`, so a broken claim or publication fails the test instead
of hanging it.
"""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import time
from collections import Counter
from collections.abc import Iterator
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import pytest

from shmring.impl.names import current_producer_identity, ring_path
from shmring.impl.ring.producer import (
    HOOK_FIELDS_WRITTEN,
    HOOK_LENGTH_STORED,
    HOOK_PAYLOAD_WRITTEN,
    RingChannel,
)
from shmring.impl.ring.reader import RingReader
from shmring.impl.ring.results import ReceiveStatus
from shmring.model_tests.workers import (
    compete_for_keys,
    deployment_directory,
    kill_and_reap,
    payload_for,
    publish_then_stop,
    watchdog,
)
from shmring.spec.layout import compute_frame_length
from shmring.spec.ring import PutStatus

SPAWN = multiprocessing.get_context("spawn")
WAIT_S = 60  # generous: spawning an interpreter on a loaded 2-core machine is slow


@pytest.fixture
def ring_dir(scope: str) -> Iterator[str]:
    with deployment_directory(scope) as path:
        yield path


def _recv(conn: Connection, timeout: float = WAIT_S) -> Any:
    if not conn.poll(timeout):
        raise TimeoutError(f"no message from worker within {timeout} s")
    return conn.recv()


def test_two_reader_processes_claim_each_frame_exactly_once(ring_dir: str, tmp_path: Path) -> None:
    keys = [f"req_{index}" for index in range(1000)]
    sizes = {key: 40 + (index * 37) % 700 for index, key in enumerate(keys)}
    done_flag = str(tmp_path / "producer-done")
    path = ring_path(ring_dir, "s0", "s1", current_producer_identity())
    with RingChannel.create(path, 16 * 1024) as channel:
        pipes: list[Connection] = []
        readers = []
        try:
            for _ in range(2):
                parent_end, child_end = SPAWN.Pipe()
                reader = SPAWN.Process(
                    target=compete_for_keys, args=(path, keys, child_end, done_flag)
                )
                reader.start()
                child_end.close()
                pipes.append(parent_end)
                readers.append(reader)
            for conn in pipes:
                assert _recv(conn) == "attached"
            positions = {}
            full = 0
            with watchdog(WAIT_S):
                for key in keys:
                    while True:
                        outcome = channel.put(key, payload_for(key, sizes[key]))
                        if outcome.status is PutStatus.PUBLISHED:
                            positions[key] = outcome.position
                            break
                        assert outcome.status is PutStatus.FULL
                        full += 1
                        time.sleep(0.0005)  # the readers drain the ring
            Path(done_flag).touch()
            reports = [_recv(conn) for conn in pipes]
            for reader in readers:
                reader.join(WAIT_S)
                assert reader.exitcode == 0
        finally:
            for conn in pipes:
                conn.close()
            for reader in readers:
                kill_and_reap(reader)
                reader.close()
        claims = Counter(key for claimed, _busy, _lost in reports for key, _, _ in claimed)
        assert set(claims) == set(keys), f"lost: {sorted(set(keys) - set(claims))[:10]}"
        duplicated = sorted(key for key, count in claims.items() if count > 1)
        assert not duplicated, f"claimed twice: {duplicated[:10]}"
        for claimed, _busy, _lost in reports:
            for key, position, digest in claimed:
                assert position == positions[key]
                expected = hashlib.blake2b(payload_for(key, sizes[key]), digest_size=16)
                assert digest == expected.hexdigest(), key
        # Everything was claimed, so a put reclaims the whole ring.
        assert channel.put("last", b"x").status is PutStatus.PUBLISHED
        assert channel.tail == channel.head - compute_frame_length(len("last"), 1)
        print(
            f"\nclaims per reader: {[len(claimed) for claimed, _, _ in reports]}, "
            f"busy answers: {[busy for _, busy, _ in reports]}, "
            f"claims lost after locking: {[lost for _, _, lost in reports]}, full puts: {full}"
        )


@pytest.mark.parametrize(
    "stage", ["writer", HOOK_PAYLOAD_WRITTEN, HOOK_FIELDS_WRITTEN, HOOK_LENGTH_STORED]
)
def test_producer_killed_mid_put_never_exposes_a_torn_frame(ring_dir: str, stage: str) -> None:
    parent_end, child_end = SPAWN.Pipe()
    producer = SPAWN.Process(target=publish_then_stop, args=(ring_dir, 4096, stage, child_end))
    path = None
    try:
        producer.start()
        child_end.close()
        kind, path = _recv(parent_end)
        assert kind == "path"
        kind, positions = _recv(parent_end)
        assert kind == "published"
        early = RingReader.attach(path)  # attached while the producer is alive
        try:
            assert _recv(parent_end) == ("stopped", stage)
            kill_and_reap(producer)
            assert producer.exitcode == -9
            late = RingReader.attach(path)  # attached after the kill
            try:
                for reader in (early, late):
                    assert reader.producer[0] == producer.pid
                    statistics = reader.statistics()
                    assert statistics.head == positions[-1] + compute_frame_length(
                        len("done_2"), 300
                    )
                    assert statistics.published_frames == 3
                    assert reader.get("torn").status is ReceiveStatus.NOT_FOUND
                    assert reader.get("torn", statistics.head).status is ReceiveStatus.STALE
                for index, position in enumerate(positions):
                    key = f"done_{index}"
                    reader = early if index % 2 else late
                    got = reader.get(key, position)
                    assert got.status is ReceiveStatus.DELIVERED
                    assert got.payload == payload_for(key, 300)
                assert late.statistics().published_frames == 0
            finally:
                late.close()
        finally:
            early.close()
    finally:
        parent_end.close()
        kill_and_reap(producer)
        producer.close()
        if path is not None and os.path.exists(path):
            os.unlink(path)  # the killed producer could not remove its file
