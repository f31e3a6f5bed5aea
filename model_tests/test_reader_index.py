"""The reader's index (issue 25): the model's rules (`spec.index`) and the real reader's.

The ring lockstep machine checks the real index against the model after
every step; these pin down single promises with hand-made states: what the
index may answer and what it may not, that it is built incrementally
(every frame walked once), that its entries die, that a header changed
under an entry is a typed error, and that a descriptor get uses no index.
"""

from __future__ import annotations

import contextlib
import struct
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shmring.fault_injection.kit.seams import CountingOs
from shmring.impl.errors import CorruptFrameError
from shmring.impl.frame_io import load_frame_state_acquire
from shmring.impl.names import current_producer_identity, ring_path
from shmring.impl.os_seam import OsFacade
from shmring.impl.ring import reader as reader_module
from shmring.impl.ring.producer import RingChannel
from shmring.impl.ring.reader import RingReader
from shmring.impl.ring.results import ReceiveStatus
from shmring.model_tests.workers import deployment_directory
from shmring.spec import index as index_spec
from shmring.spec import ring as ring_spec
from shmring.spec.invariants import InvariantViolation, check_reader_index, check_ring
from shmring.spec.layout import (
    FRAME_POSITION_OFFSET,
    FRAME_STATE_RETIRED,
    MIN_RING_CAPACITY,
    RING_HEADER_LENGTH,
    U64_FORMAT,
)

DELIVERED = ReceiveStatus.DELIVERED
NOT_FOUND = ReceiveStatus.NOT_FOUND
STALE = ReceiveStatus.STALE


# -- the model -----------------------------------------------------------------------

KEYS = ("a", "b", "c", "d")
# (operation, key, payload length): the model's ring steps, and two readers' gets.
STEPS = st.lists(
    st.tuples(
        st.sampled_from(("put", "get0", "get1", "lease0", "cancel", "close")),
        st.sampled_from(KEYS),
        st.integers(0, 700),
    ),
    max_size=60,
)


@settings(max_examples=200, deadline=None)
@given(capacity_units=st.integers(0, 16), steps=STEPS)
def test_indexed_get_answers_what_process_get_answers(
    capacity_units: int, steps: list[tuple[str, str, int]]
) -> None:
    """Two readers' indexed gets, next to `process_get` on a copy of the ring, agree step by step."""
    capacity = MIN_RING_CAPACITY + 16 * capacity_units
    ring = ring_spec.initialize_ring(capacity)
    indexes = [index_spec.ReaderIndex(), index_spec.ReaderIndex()]
    for operation, key, length in steps:
        if operation == "put":
            ring_spec.process_put(ring, key, length, (key, length))
        elif operation == "cancel":
            ring_spec.process_cancel(ring, key)
        elif operation == "close" and length < 50:
            ring_spec.process_close(ring)
        elif operation.startswith(("get", "lease")):
            mode = ring_spec.ConsumeMode.LEASE if operation[0] == "l" else None
            frame = ring_spec.get_deliverable_frame(ring, key)
            result = index_spec.process_indexed_get(
                ring, indexes[int(operation[-1])], key, mode or ring_spec.ConsumeMode.COPY_OUT
            )
            if frame is None:
                assert result.status is ring_spec.GetStatus.NOT_FOUND
            else:
                assert result.status is ring_spec.GetStatus.DELIVERED
                assert (result.position, result.payload) == (frame.position, frame.payload)
        check_ring(ring)
        for index in indexes:
            check_reader_index(ring, index)


def _ring_with_frames() -> tuple[ring_spec.RingState, index_spec.ReaderIndex]:
    ring = ring_spec.initialize_ring(MIN_RING_CAPACITY)
    for key in ("a", "b"):
        ring_spec.process_put(ring, key, 10, key)
    index = index_spec.ReaderIndex()
    index_spec.process_index_scan(ring, index)
    check_reader_index(ring, index)
    return ring, index


def test_check_reader_index_rejects_an_entry_the_reader_has_not_seen() -> None:
    ring, index = _ring_with_frames()
    ring_spec.process_put(ring, "c", 10, "c")
    index.entries["c"] = ring.frames[-1].position  # not scanned yet
    with pytest.raises(InvariantViolation, match="not yet seen"):
        check_reader_index(ring, index)


def test_check_reader_index_rejects_an_entry_naming_another_key() -> None:
    ring, index = _ring_with_frames()
    index.entries["a"] = index.entries["b"]
    with pytest.raises(InvariantViolation, match="names no frame of its key"):
        check_reader_index(ring, index)


def test_check_reader_index_rejects_a_missed_frame() -> None:
    ring, index = _ring_with_frames()
    del index.entries["b"]
    with pytest.raises(InvariantViolation, match="misses a frame it has seen"):
        check_reader_index(ring, index)


def test_a_stale_model_entry_is_a_miss_never_a_frame() -> None:
    """An entry whose frame was claimed by another reader answers nothing, and is dropped."""
    ring, index = _ring_with_frames()
    ring_spec.process_get(ring, "a")  # another reader took it
    assert index_spec.get_index_answer(ring, index, "a") is None
    check_reader_index(ring, index)  # stale but allowed
    assert index_spec.process_indexed_get(ring, index, "a").status is ring_spec.GetStatus.NOT_FOUND
    assert "a" not in index.entries


def test_model_entries_die_with_reclaim() -> None:
    ring, index = _ring_with_frames()
    for key in ("a", "b"):
        index_spec.process_indexed_get(ring, index, key)
    ring_spec.process_put(ring, "c", 10, "c")  # reclaims a and b
    index_spec.process_index_scan(ring, index)
    assert index.entries == {"c": ring.frames[-1].position}


# -- the real reader -----------------------------------------------------------------


@contextlib.contextmanager
def _ring(
    scope: str, reader_os: OsFacade | None = None, capacity: int = MIN_RING_CAPACITY
) -> Iterator[tuple[RingChannel, RingReader, RingReader]]:
    with deployment_directory(scope) as directory:
        path = ring_path(directory, "s0", "s1", current_producer_identity())
        channel = RingChannel.create(path, capacity)
        readers = [
            RingReader.attach(path, os_facade=reader_os or OsFacade()),
            RingReader.attach(path),
        ]
        try:
            yield channel, readers[0], readers[1]
        finally:
            for reader in readers:
                reader.close()
            channel.close()


def test_an_older_entry_dies_when_its_newer_version_was_claimed_elsewhere(scope: str) -> None:
    """Regression (issue 25): a re-put's frame another reader took drops this reader's older entry."""
    with _ring(scope) as (channel, reader, other):
        channel.put("k", b"v1")
        assert reader.get("x").status is NOT_FOUND  # indexes k v1
        channel.put("k", b"v2")  # retires v1
        assert other.get("k").payload == b"v2"
        assert reader.get("y").status is NOT_FOUND  # scans v2, seen DONE
        assert reader.index_snapshot().entries == {}
        assert reader.get("k").status is NOT_FOUND


def test_the_index_walks_every_frame_once(scope: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Built incrementally from what the head added, never by rescanning (issue 25)."""
    walked: list[int] = []
    walk = reader_module.walk_frames

    def counting_walk(*args: object) -> object:
        frames, end, complete = walk(*args)  # type: ignore[arg-type]
        walked.append(len(frames))
        return frames, end, complete

    monkeypatch.setattr(reader_module, "walk_frames", counting_walk)
    with _ring(scope, capacity=64 * 1024) as (channel, reader, _):
        puts = 0
        for round_ in range(40):
            for index in range(3):
                assert channel.put(f"k{round_}_{index}", b"x" * 40).position is not None
                puts += 1
            for _ in range(5):  # gets on an unchanged head walk nothing
                assert reader.get("absent").status is NOT_FOUND
            # One of three taken: the others wait, so the tail stays at the first frame.
            assert reader.get(f"k{round_}_1").status is DELIVERED
        assert channel.tail == 0
        assert sum(walked) == puts
        assert len(walked) == 40  # one walk per head move the reader saw
        for round_ in range(40):  # every waiting frame is found without another walk
            for index in (0, 2):
                assert reader.get(f"k{round_}_{index}").status is DELIVERED
        assert sum(walked) == puts


def test_a_stale_entry_after_a_full_put_costs_a_miss(scope: str) -> None:
    """The tail passed an entry while the head stayed (a put refused FULL after reclaiming)."""
    with _ring(scope) as (channel, reader, other):
        assert channel.put("k0", b"s" * 478).frame_length == 512
        for key in ("k1", "k2", "k3"):
            assert channel.put(key, b"l" * 990).frame_length == 1024
        assert reader.get("none").status is NOT_FOUND  # indexes k0..k3
        assert other.get("k0").status is DELIVERED
        head = channel.head
        # Reclaims k0 (512 bytes), then needs 512 of padding + 1024: FULL.
        assert channel.put("k4", b"l" * 990).status is ring_spec.PutStatus.FULL
        assert (channel.head, channel.tail) == (head, 512)
        assert reader.index_snapshot().entries["k0"] == 0  # stale: the head did not move
        assert reader.get("k0").status is NOT_FOUND  # checked at claim: the tail passed it
        assert "k0" not in reader.index_snapshot().entries
        assert reader.get("k1").status is DELIVERED


def test_a_header_changed_under_an_entry_is_a_typed_error_and_the_reader_goes_on(
    scope: str,
) -> None:
    with _ring(scope) as (channel, reader, _):
        bad = channel.put("bad", b"payload")
        good = channel.put("good", b"payload")
        assert bad.position is not None and good.position is not None
        assert reader.get("none").status is NOT_FOUND  # indexes both
        offset = RING_HEADER_LENGTH + bad.position + FRAME_POSITION_OFFSET
        buf = channel._buf
        assert buf is not None
        struct.pack_into(U64_FORMAT, buf, offset, bad.position + 4096)  # scribbled
        with pytest.raises(CorruptFrameError, match=f"position={bad.position}"):
            reader.get("bad")
        words = channel._words
        assert words is not None
        assert load_frame_state_acquire(words, RING_HEADER_LENGTH + bad.position) == (
            FRAME_STATE_RETIRED
        )
        assert reader.get("bad").status is NOT_FOUND
        assert reader.get("good").payload == b"payload"


def test_a_descriptor_get_neither_scans_nor_locks_for_another_key(scope: str) -> None:
    counting = CountingOs()
    with _ring(scope, reader_os=counting) as (channel, reader, _):
        first = channel.put("k", b"mine")
        for index in range(20):
            channel.put(f"other{index}", b"not mine")
        assert first.position is not None
        counting.calls.clear()
        assert reader.get("other", first.position).status is STALE  # k's frame, not other's
        assert counting.calls == {"stat": 1}  # the truncation check (issue 22), no lock
        assert reader.get("k", first.position).payload == b"mine"
        walked = reader.index_snapshot().scanned_to  # it caught the index up once
        counting.calls.clear()
        assert reader.get("other", first.position).status is STALE
        assert counting.calls == {"stat": 1} and reader.index_snapshot().scanned_to == walked
        assert reader.get("k", first.position).status is STALE  # claimed
        assert reader.get("k", first.position + 16).status is STALE  # inside the frame
        assert reader.get("k", channel.head).status is STALE  # not yet written


def test_entries_die_with_reclaim_so_the_index_stays_as_small_as_the_ring(scope: str) -> None:
    """Frames this reader indexed, another took and the tail passed leave no entry behind."""
    with _ring(scope) as (channel, reader, other):
        for round_ in range(200):  # many laps of a 4 KiB ring
            channel.put(f"k{round_}", b"x" * 100)  # reclaims the frames taken before
            assert reader.get("absent").status is NOT_FOUND  # indexes k{round_}, prunes
            assert other.get(f"k{round_}").status is DELIVERED
        entries = reader.index_snapshot().entries
        assert len(entries) <= 2, len(entries)
        assert len(reader._order_positions) == len(reader._order_keys) <= 2
