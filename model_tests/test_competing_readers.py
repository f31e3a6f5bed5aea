"""Competing readers skip a frame the other one claimed, without the lock (issue 12, part 4)."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator

import pytest

from shmring.impl.names import current_producer_identity, ring_path
from shmring.impl.ring.producer import RingChannel
from shmring.impl.ring.reader import RingReader
from shmring.impl.ring.results import ReceiveStatus
from shmring.model_tests.workers import deployment_directory


@pytest.fixture
def ring(scope: str) -> Iterator[tuple[RingChannel, RingReader, RingReader]]:
    with deployment_directory(scope) as directory:
        path = ring_path(directory, "s0", "s1", current_producer_identity())
        with RingChannel.create(path, 4096) as channel:
            first, second = RingReader.attach(path), RingReader.attach(path)
            try:
                yield channel, first, second
            finally:
                first.close()
                second.close()


def test_a_frame_the_other_reader_claimed_is_skipped_without_taking_the_lock(
    ring: tuple[RingChannel, RingReader, RingReader],
) -> None:
    channel, first, second = ring
    channel.put("k", b"payload")
    channel.put("other", b"x")
    assert second.get("other").status is ReceiveStatus.DELIVERED  # second indexed "k" too
    locks = second.statistics().locks
    assert first.get("k").status is ReceiveStatus.DELIVERED
    got = second.get("k")
    assert got.status is ReceiveStatus.NOT_FOUND
    stats = second.statistics()
    assert stats.locks == locks and stats.skipped == 1  # no lock taken for a lost frame
    assert stats.gets == 1


def test_a_lost_race_under_a_held_lock_answers_gone_not_busy(
    ring: tuple[RingChannel, RingReader, RingReader],
) -> None:
    channel, first, second = ring
    channel.put("k", b"payload")
    channel.put("j", b"payload")
    assert second.get("nothing").status is ReceiveStatus.NOT_FOUND  # second indexed both
    assert first.get("k").status is ReceiveStatus.DELIVERED
    holder = os.open(channel.path, os.O_RDONLY)
    try:
        fcntl.flock(holder, fcntl.LOCK_EX)  # another process's claim in progress
        assert second.get("k").status is ReceiveStatus.NOT_FOUND  # lost: skipped
        assert second.get("j").status is ReceiveStatus.BUSY  # still claimable: BUSY
    finally:
        os.close(holder)
    got = second.get("j")
    assert got.status is ReceiveStatus.DELIVERED and got.payload == b"payload"  # exactly once
    assert first.get("j").status is ReceiveStatus.NOT_FOUND
