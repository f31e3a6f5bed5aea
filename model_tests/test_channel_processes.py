"""The ring channel across real processes: competing readers, and a producer
killed in the middle of a put.

Workers are spawned (fresh interpreters, `shmring.model_tests.workers`) in
the kit's `WorkerProcess` and report over pipes. Every wait has a timeout
and every worker is killed and reaped in `finally`, so a broken claim or
publication fails the test instead of hanging it.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from shmring.fault_injection.kit.payloads import tagged_payload
from shmring.fault_injection.kit.processes import WorkerProcess, watchdog
from shmring.impl.names import current_producer_identity, ring_path
from shmring.impl.ring.producer import (
    HOOK_FIELDS_WRITTEN,
    HOOK_LENGTH_STORED,
    HOOK_PAYLOAD_WRITTEN,
    RingChannel,
)
from shmring.impl.ring.reader import RingReader
from shmring.impl.ring.results import ReceiveStatus
from shmring.model_tests.workers import compete_for_keys, deployment_directory, publish_then_stop
from shmring.spec.layout import compute_frame_length
from shmring.spec.ring import PutStatus

WAIT_S = 60  # generous: spawning an interpreter on a loaded 2-core machine is slow


@pytest.fixture
def ring_dir(scope: str) -> Iterator[str]:
    with deployment_directory(scope) as path:
        yield path


def _spawn(target: object, *args: object) -> WorkerProcess:
    return WorkerProcess(target, *args, timeout=WAIT_S, method="spawn")  # type: ignore[arg-type]


def test_two_reader_processes_claim_each_frame_exactly_once(ring_dir: str, tmp_path: Path) -> None:
    keys = [f"req_{index}" for index in range(1000)]
    sizes = {key: 40 + (index * 37) % 700 for index, key in enumerate(keys)}
    done_flag = str(tmp_path / "producer-done")
    path = ring_path(ring_dir, "s0", "s1", current_producer_identity())
    with RingChannel.create(path, 16 * 1024) as channel:
        readers: list[WorkerProcess] = []
        try:
            for _ in range(2):
                readers.append(_spawn(compete_for_keys, path, keys, done_flag))
            for reader in readers:
                reader.expect("attached")
            positions = {}
            full = 0
            with watchdog(WAIT_S):
                for key in keys:
                    while True:
                        outcome = channel.put(key, tagged_payload(key, sizes[key]))
                        if outcome.status is PutStatus.PUBLISHED:
                            positions[key] = outcome.position
                            break
                        assert outcome.status is PutStatus.FULL
                        full += 1
                        time.sleep(0.0005)  # the readers drain the ring
            Path(done_flag).touch()
            reports = [reader.expect("done") for reader in readers]
            for reader in readers:
                reader.process.join(WAIT_S)
                assert reader.process.exitcode == 0
        finally:
            for reader in readers:
                reader.kill()
        claims = Counter(key for claimed, _busy, _lost in reports for key, _, _ in claimed)
        assert set(claims) == set(keys), f"lost: {sorted(set(keys) - set(claims))[:10]}"
        duplicated = sorted(key for key, count in claims.items() if count > 1)
        assert not duplicated, f"claimed twice: {duplicated[:10]}"
        for claimed, _busy, _lost in reports:
            for key, position, digest in claimed:
                assert position == positions[key]
                expected = hashlib.blake2b(tagged_payload(key, sizes[key]), digest_size=16)
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
    producer = _spawn(publish_then_stop, ring_dir, 4096, stage)
    pid = producer.process.pid
    path = None
    try:
        path = producer.expect("path")
        positions = producer.expect("published")
        early = RingReader.attach(path)  # attached while the producer is alive
        try:
            assert producer.expect("stopped") == stage
            producer.kill()
            assert producer.exitcode == -9
            late = RingReader.attach(path)  # attached after the kill
            try:
                for reader in (early, late):
                    assert reader.producer[0] == pid
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
                    assert got.payload == tagged_payload(key, 300)
                assert late.statistics().published_frames == 0
            finally:
                late.close()
        finally:
            early.close()
    finally:
        producer.kill()
        if path is not None and os.path.exists(path):
            os.unlink(path)  # the killed producer could not remove its file
