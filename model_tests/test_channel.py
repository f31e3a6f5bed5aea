"""Example tests for the ring channel, one claim each (see DESIGN.md, "Ring channel").

The lockstep machine (`ring_machine`) explores sequences; these pin down the
individual promises with hand-made states, including the ones a machine
cannot reach on its own: corrupted bytes, symlinks, a lock held by another
process, the resource tracker of a fresh interpreter.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import os
import stat
import subprocess
import sys
from collections.abc import Iterator

import numpy as np
import pytest

from shmring.fault_injection.kit.payloads import tagged_payload
from shmring.fault_injection.kit.processes import lock_holder, watchdog
from shmring.fault_injection.kit.seams import CountingOs, FaultyOs
from shmring.impl.directory import ensure_deployment_directory
from shmring.impl.errors import (
    ClosedError,
    ConfigurationError,
    CorruptFrameError,
    InvalidKeyError,
    NoSpaceError,
    ProducerGoneError,
    UnsupportedPayloadError,
)
from shmring.impl.frame_io import read_frame_header
from shmring.impl.names import (
    current_producer_identity,
    parse_ring_file_name,
    parse_start_time,
    read_start_time,
    ring_file_name,
    ring_path,
    validate_scope,
    validate_stage_name,
)
from shmring.impl.names import deployment_directory as deployment_directory_path
from shmring.impl.os_seam import SITE_FALLOCATE, OsFacade
from shmring.impl.ring.producer import RingChannel
from shmring.impl.ring.reader import RingReader
from shmring.impl.ring.results import ReceiveStatus
from shmring.model_tests.workers import deployment_directory
from shmring.spec import ring as ring_spec
from shmring.spec.layout import (
    FRAME_HEADER_LENGTH,
    FRAME_LENGTH_OFFSET,
    FRAME_PAYLOAD_LENGTH_OFFSET,
    FRAME_STATE_DONE,
    MAX_KEY_LENGTH,
    PADDING_FRAME_TYPE,
    RING_CAPACITY_OFFSET,
    RING_HEAD_OFFSET,
    RING_HEADER_LENGTH,
    RING_HEADER_LENGTH_OFFSET,
    RING_MAGIC_OFFSET,
    RING_STATE_OFFSET,
    RING_VERSION_OFFSET,
    compute_frame_length,
)
from shmring.spec.ring import ConsumeMode, PutStatus

DELIVERED = ReceiveStatus.DELIVERED
NOT_FOUND = ReceiveStatus.NOT_FOUND
STALE = ReceiveStatus.STALE
BUSY = ReceiveStatus.BUSY

SMALL = 4096


@pytest.fixture
def ring_dir(scope: str) -> Iterator[str]:
    with deployment_directory(scope) as path:
        yield path


def _path(ring_dir: str, source: str = "s0", destination: str = "s1") -> str:
    return ring_path(ring_dir, source, destination, current_producer_identity())


@contextlib.contextmanager
def _ring(
    ring_dir: str,
    capacity: int = SMALL,
    *,
    producer_os: OsFacade | None = None,
    reader_os: OsFacade | None = None,
) -> Iterator[tuple[RingChannel, RingReader]]:
    path = _path(ring_dir)
    channel = RingChannel.create(path, capacity, os_facade=producer_os or OsFacade())
    try:
        reader = RingReader.attach(path, os_facade=reader_os or OsFacade())
        try:
            yield channel, reader
        finally:
            reader.close()
    finally:
        channel.close()


def _payload_for_frame(key: str, frame_length: int) -> bytes:
    """A payload that makes a frame of exactly `frame_length` bytes under `key`."""
    size = frame_length - FRAME_HEADER_LENGTH - len(key.encode())
    assert compute_frame_length(len(key.encode()), size) == frame_length
    return tagged_payload(key, size)


# -- descriptors and staleness ---------------------------------------------------------


def test_stale_descriptor_never_reads_newer_frame(ring_dir: str) -> None:
    with _ring(ring_dir) as (channel, reader):
        first = channel.put("k", _payload_for_frame("k", 64))
        assert first.position is not None
        second = channel.put("k", tagged_payload("second", 31))
        assert second.retired == 1
        assert reader.get("k", first.position).status is STALE
        # Go once round the ring so that a newer "k" lands on first's bytes.
        assert reader.get("k", second.position).payload == tagged_payload("second", 31)
        while channel.head < first.position + SMALL:
            assert channel.put("x", _payload_for_frame("x", 64)).status is PutStatus.PUBLISHED
            assert reader.get("x").status is DELIVERED
        newest = channel.put("k", _payload_for_frame("k", 64))
        assert newest.position == first.position + SMALL  # same physical offset
        assert reader.get("k", first.position).status is STALE
        assert reader.get("k", second.position).status is STALE
        got = reader.get("k", newest.position)
        assert got.status is DELIVERED
        assert got.payload == _payload_for_frame("k", 64)


def test_descriptor_of_another_key_is_stale(ring_dir: str) -> None:
    with _ring(ring_dir) as (channel, reader):
        put = channel.put("a", b"payload of a")
        assert reader.get("b", put.position).status is STALE
        assert reader.get("a", put.position).payload == b"payload of a"


# -- admission, padding, space ---------------------------------------------------------


def test_not_admitted_leaves_ring_untouched(ring_dir: str) -> None:
    counting = CountingOs()
    with _ring(ring_dir, producer_os=counting) as (channel, reader):
        channel.put("claimed", b"x" * 100)
        assert reader.get("claimed").status is DELIVERED  # reclaimable, but not reclaimed below
        with open(channel.path, "rb") as file:
            before = file.read()
        calls_before = counting.total()
        too_big = SMALL // 4 - FRAME_HEADER_LENGTH - len(b"big") + 1
        outcome = channel.put("big", bytes(too_big))
        model = ring_spec.process_put(ring_spec.initialize_ring(SMALL), "big", too_big, None)
        assert outcome.status is PutStatus.NOT_ADMITTED
        assert (outcome.status, outcome.frame_length) == (model.status, model.frame_length)
        with open(channel.path, "rb") as file:
            assert file.read() == before
        assert counting.total() == calls_before
        assert (channel.head, channel.tail) == (144, 0)


def test_key_longer_than_the_limit_is_not_admitted(ring_dir: str) -> None:
    with _ring(ring_dir, 1 << 20) as (channel, reader):
        key = "k" * (MAX_KEY_LENGTH + 1)
        assert channel.put(key, b"").status is PutStatus.NOT_ADMITTED
        assert channel.put(key[:-1], b"v").status is PutStatus.PUBLISHED
        assert reader.get(key[:-1]).payload == b"v"


def test_padding_at_wraparound(ring_dir: str) -> None:
    model = ring_spec.initialize_ring(SMALL)
    with _ring(ring_dir) as (channel, reader):
        sizes = [("p", 512), ("a", 1024), ("b", 1024), ("c", 1024)]
        for key, frame_length in sizes:
            payload = _payload_for_frame(key, frame_length)
            assert tuple(channel.put(key, payload)) == tuple(_model_put(model, key, payload))
            assert reader.get(key).status is DELIVERED
            ring_spec.process_get(model, key)
        assert channel.head == 3584
        payload = _payload_for_frame("d", 1024)
        outcome = channel.put("d", payload)
        assert tuple(outcome) == tuple(_model_put(model, "d", payload))
        assert outcome.padding == SMALL - 3584
        assert outcome.position == SMALL  # starts at physical offset 0
        with open(channel.path, "rb") as file:
            data = memoryview(file.read())
        padding = read_frame_header(data, RING_HEADER_LENGTH + 3584)
        assert (padding.length, padding.frame_type, padding.state) == (
            512,
            PADDING_FRAME_TYPE,
            FRAME_STATE_DONE,
        )
        assert reader.get("d").payload == payload


def test_exact_fit_needs_no_padding(ring_dir: str) -> None:
    model = ring_spec.initialize_ring(SMALL)
    with _ring(ring_dir) as (channel, reader):
        for key in ("a", "b", "c", "d", "e"):
            payload = _payload_for_frame(key, 1024)
            outcome = channel.put(key, payload)
            assert tuple(outcome) == tuple(_model_put(model, key, payload))
            assert outcome.padding == 0
            assert reader.get(key).payload == payload
            ring_spec.process_get(model, key)
        # "d" ended exactly at the end of the data region; "e" starts at offset 0.
        assert outcome.position == SMALL


def test_full_ring_refuses_until_reclaimed(ring_dir: str) -> None:
    with _ring(ring_dir) as (channel, reader):
        for key in ("a", "b", "c", "d"):
            assert channel.put(key, _payload_for_frame(key, 1024)).status is PutStatus.PUBLISHED
        assert channel.put("e", _payload_for_frame("e", 1024)).status is PutStatus.FULL
        assert reader.get("b").status is DELIVERED
        # Reclaim stops at "a", still published, though "b" is done.
        assert channel.put("e", _payload_for_frame("e", 1024)).status is PutStatus.FULL
        assert reader.get("a").status is DELIVERED
        assert channel.put("e", _payload_for_frame("e", 1024)).status is PutStatus.PUBLISHED
        assert channel.tail == 2048


def _model_put(model: ring_spec.RingState, key: str, payload: bytes) -> tuple[object, ...]:
    """The model's answer to the same put, field for field like `PutOutcome`."""
    return dataclasses.astuple(ring_spec.process_put(model, key, len(payload), payload))


# -- claims ------------------------------------------------------------------------------


def test_claim_happens_once(ring_dir: str) -> None:
    with _ring(ring_dir) as (channel, first_reader):
        second_reader = RingReader.attach(channel.path)
        try:
            put = channel.put("k", b"once")
            assert first_reader.get("k").payload == b"once"
            assert second_reader.get("k").status is NOT_FOUND
            assert second_reader.get("k", put.position).status is STALE
            assert first_reader.get("k").status is NOT_FOUND
            leased = channel.put("lease", b"borrowed")
            lease = second_reader.get("lease", mode=ConsumeMode.LEASE).payload
            assert first_reader.get("lease", leased.position).status is STALE
            assert bytes(lease.view) == b"borrowed"
            lease.release()
            assert first_reader.get("lease").status is NOT_FOUND
        finally:
            second_reader.close()


def test_copy_out_is_independent_of_later_ring_traffic(ring_dir: str) -> None:
    with _ring(ring_dir) as (channel, reader):
        source = bytearray(b"a" * 200)
        channel.put("k", source)
        source[:] = b"b" * 200  # the source may change as soon as put returns
        got = reader.get("k").payload
        for index in range(100):  # wrap several times over the frame's bytes
            channel.put("other", bytes([index]) * 200)
            reader.get("other")
        assert got == b"a" * 200


def test_decode_gets_a_view_and_its_copy_is_delivered(ring_dir: str) -> None:
    with _ring(ring_dir) as (channel, reader):
        channel.put("k", b"decode me")
        got = reader.get("k", decode=lambda view: bytes(view).upper())
        assert got.payload == b"DECODE ME"


def test_decode_that_keeps_a_view_pins_the_frame(ring_dir: str) -> None:
    with _ring(ring_dir) as (channel, reader):
        channel.put("k", b"kept")
        channel.put("sliced", b"sliced")
        kept_slices: list[memoryview] = []
        with pytest.raises(BufferError, match="pinned"):
            reader.get("sliced", decode=lambda view: kept_slices.append(view[1:]))
        assert bytes(kept_slices.pop()) == b"liced"
        kept: list[np.ndarray] = []
        with pytest.raises(BufferError, match="pinned"):
            reader.get("k", decode=lambda view: kept.append(np.frombuffer(view, np.uint8)))
        # The frame is claimed (never reclaimed): what the array shows stays put.
        assert reader.get("k").status is NOT_FOUND
        assert reader.statistics().claimed_frames == 2
        assert kept[0].tobytes() == b"kept"
        assert not kept[0].flags.writeable
        kept.clear()


def test_decode_that_raises_leaves_the_frame_deliverable(ring_dir: str) -> None:
    with _ring(ring_dir) as (channel, reader):
        channel.put("k", b"retry me")

        def broken(view: memoryview) -> object:
            raise ValueError("decoder failed")

        with pytest.raises(ValueError, match="decoder failed"):
            reader.get("k", decode=broken)
        assert reader.get("k").payload == b"retry me"


@pytest.mark.parametrize(
    ("mode", "refused"),
    [
        (ConsumeMode.COPY_OUT, UnsupportedPayloadError),
        (ConsumeMode.COPY_OUT, CorruptFrameError),
        (ConsumeMode.LEASE, UnsupportedPayloadError),
        (ConsumeMode.LEASE, CorruptFrameError),
    ],
    ids=["owned-unsupported", "owned-corrupt", "borrowed-unsupported", "borrowed-corrupt"],
)
def test_a_payload_its_decoder_refuses_is_retired_and_the_decoders_error_raised(
    ring_dir: str, mode: ConsumeMode, refused: type[Exception]
) -> None:
    """A payload that does not decode is consumed (vllm-omni's behaviour), on the owned and borrowed path alike.

    Any other failure of the decoder leaves the frame deliverable (the test above).
    """
    with _ring(ring_dir) as (channel, reader):
        channel.put("bad", b"never decodes")
        channel.put("next", b"fine")

        def refuse(payload: object) -> object:
            raise refused("refused by the test's decoder")

        with pytest.raises(refused, match="refused by the test's decoder"):
            reader.get("bad", mode=mode, decode=refuse)
        assert reader.get("bad").status is NOT_FOUND  # retired: no later get fails on it
        assert reader.statistics().claimed_frames == 0  # nothing holds it
        assert reader.get("next").payload == b"fine"


def test_lease_view_is_read_only_and_release_frees_space(ring_dir: str) -> None:
    with _ring(ring_dir) as (channel, reader):
        for key in ("a", "b", "c", "d"):
            channel.put(key, _payload_for_frame(key, 1024))
        lease = reader.get("a", mode=ConsumeMode.LEASE).payload
        assert lease.view.readonly
        for key in ("b", "c", "d"):
            assert reader.get(key).status is DELIVERED
        assert channel.put("e", b"").status is PutStatus.FULL  # "a" pins the tail
        held = np.frombuffer(lease.view, np.uint8)
        sliced = lease.view[10:20]
        with pytest.raises(BufferError):
            lease.release()  # an array made from the lease still lives
        assert channel.put("e", b"").status is PutStatus.FULL
        del held
        with pytest.raises(BufferError):
            lease.release()  # and so does a slice
        assert bytes(sliced) == _payload_for_frame("a", 1024)[10:20]
        sliced.release()
        lease.release()
        lease.release()  # idempotent
        with pytest.raises(ClosedError):
            _ = lease.view
        assert channel.put("e", b"").status is PutStatus.PUBLISHED


def test_writer_fills_the_frame_in_place(ring_dir: str) -> None:
    with _ring(ring_dir) as (channel, reader):

        def writer(view: memoryview) -> None:
            assert len(view) == 10
            view[:] = b"0123456789"

        put = channel.put_with_writer("k", 10, writer)
        assert put.status is PutStatus.PUBLISHED
        assert reader.get("k", put.position).payload == b"0123456789"


def ring_spec_checksum(key: bytes, payload: bytes) -> int:
    """docs/protocol.md's frame checksum: low 32 bits of XXH3-64 of the payload, seeded by the key's."""
    from xxhash import xxh3_64_intdigest

    return xxh3_64_intdigest(payload, seed=xxh3_64_intdigest(key)) & 0xFFFFFFFF


def test_put_parts_publishes_what_put_of_the_joined_bytes_publishes(ring_dir: str) -> None:
    """Issue 13: `put_parts` (a codec header and a large bytes body, no writer) is `put(head + body)`.

    Byte for byte and with the same checksum field: a reader claims it like
    any frame, and the two frames differ only in their keys' positions.
    """
    head, body = b"\xc5\x01\x00", bytes(range(256))
    with _ring(ring_dir) as (channel, reader):
        joined = channel.put("k1", head + body)
        parts = channel.put_parts("k2", head, memoryview(bytearray(body)))
        assert parts.status is PutStatus.PUBLISHED
        assert parts.frame_length == joined.frame_length
        with open(channel.path, "rb") as file:
            data = memoryview(file.read())
        frames = [
            read_frame_header(data, RING_HEADER_LENGTH + outcome.position)
            for outcome in (joined, parts)
        ]
        assert frames[0].payload_length == frames[1].payload_length == len(head) + len(body)
        assert frames[1].checksum == ring_spec_checksum(b"k2", head + body)
        assert frames[0].checksum == ring_spec_checksum(b"k1", head + body)
        assert reader.get("k2", parts.position).payload == head + body
        assert reader.get("k1").payload == head + body


def test_writer_that_keeps_a_view_publishes_nothing(ring_dir: str) -> None:
    with _ring(ring_dir) as (channel, reader):
        kept: list[memoryview] = []
        with pytest.raises(BufferError, match="nothing published"):
            channel.put_with_writer("k", 4, lambda view: kept.append(view[1:3]))
        assert channel.head == 0
        assert reader.get("k").status is NOT_FOUND
        kept.clear()
        assert channel.put("k", b"fine").status is PutStatus.PUBLISHED


def test_failed_writer_publishes_nothing(ring_dir: str) -> None:
    with _ring(ring_dir) as (channel, reader):
        channel.put("k", b"old")

        def failing(view: memoryview) -> None:
            view[:3] = b"new"
            raise RuntimeError("encoder failed")

        with pytest.raises(RuntimeError):
            channel.put_with_writer("k", 3, failing)
        assert channel.head == 48  # only "old"
        assert reader.get("k").payload == b"old"


# -- cancel --------------------------------------------------------------------------------


def test_prefix_cancel_is_exact(ring_dir: str) -> None:
    keys = ["req_0_1", "req_0_12", "req_0_1x", "request_0_0", "req_0_", "req_1_3"]
    with _ring(ring_dir) as (channel, reader):
        for key in keys:
            channel.put(key, key.encode())
        assert channel.cancel_prefix("req_0_") == 2
        assert channel.cancel_prefix("req_0_") == 0
        for key in ("req_0_1", "req_0_12"):
            assert reader.get(key).status is NOT_FOUND
        for key in ("req_0_1x", "request_0_0", "req_0_", "req_1_3"):
            assert reader.get(key).payload == key.encode()


def test_cancel_answers_how_many_it_retired(ring_dir: str) -> None:
    with _ring(ring_dir) as (channel, reader):
        channel.put("k", b"v")
        assert channel.cancel("missing") == 0
        assert channel.cancel("k") == 1
        assert channel.cancel("k") == 0
        channel.put("claimed", b"v")
        assert reader.get("claimed").status is DELIVERED
        assert channel.cancel("claimed") == 0  # a claimed frame is not retired


# -- locks and polling ---------------------------------------------------------------------


def test_empty_poll_takes_no_lock(ring_dir: str) -> None:
    """An empty poll's one system call is the fstat that refuses a truncated file (issue 22)."""
    counting = CountingOs()
    with _ring(ring_dir, reader_os=counting) as (channel, reader):
        counting.calls.clear()
        for _ in range(100):
            assert reader.get("k").status is NOT_FOUND
        assert counting.calls == {"stat": 100}
        other = channel.put("other", b"not for k")
        assert reader.get("k").status is NOT_FOUND  # scans the new frame, lock-free
        assert reader.get("k", other.position).status is STALE
        for _ in range(100):
            assert reader.get("k").status is NOT_FOUND
        assert counting.calls == {"stat": 202}
        channel.put("k", b"for k")
        assert reader.get("k").payload == b"for k"
        assert counting.calls == {"stat": 203, "flock": 2}  # lock and unlock, to claim
        for _ in range(100):
            assert reader.get("k").status is NOT_FOUND
        assert counting.calls == {"stat": 303, "flock": 2}


def test_reader_does_not_wait_for_a_held_lock(ring_dir: str) -> None:
    with _ring(ring_dir) as (channel, reader):
        put = channel.put("k", b"behind a lock")
        # A blocking flock would hang here: the watchdog stops it.
        with lock_holder(channel.path), watchdog(10):
            assert reader.get("k").status is BUSY
            assert reader.get("k", put.position).status is BUSY
        # released: the holder exited cleanly (`lock_holder` checks it)
        assert reader.get("k").payload == b"behind a lock"
        assert reader.statistics().busy == 2


# -- validation and corruption -------------------------------------------------------------


@pytest.mark.parametrize(
    ("field_offset", "width", "bad_value"),
    [
        (RING_MAGIC_OFFSET, 8, 0x1234),
        (RING_VERSION_OFFSET, 4, 99),
        (RING_HEADER_LENGTH_OFFSET, 4, 64),
        (RING_CAPACITY_OFFSET, 8, 1000),
        (RING_CAPACITY_OFFSET, 8, 8192),  # valid, but not the file's size
        (RING_STATE_OFFSET, 4, 77),
        (RING_HEAD_OFFSET, 8, 3 * SMALL),
    ],
)
def test_corrupted_header_is_a_typed_error(
    ring_dir: str, field_offset: int, width: int, bad_value: int
) -> None:
    with RingChannel.create(_path(ring_dir), SMALL) as channel:
        _overwrite(channel.path, field_offset, bad_value.to_bytes(width, "little"))
        with pytest.raises(CorruptFrameError) as raised:
            RingReader.attach(channel.path)
        assert channel.path in str(raised.value)


def test_corrupted_frame_is_a_typed_error_and_reader_keeps_working(ring_dir: str) -> None:
    with _ring(ring_dir) as (channel, reader):
        bad = channel.put("bad", b"x" * 100)
        assert bad.position is not None
        channel.put("good", b"y" * 100)
        payload_offset = RING_HEADER_LENGTH + bad.position + FRAME_HEADER_LENGTH + len("bad")
        _overwrite(channel.path, payload_offset, b"z")
        with pytest.raises(CorruptFrameError, match=f"position={bad.position}"):
            reader.get("bad")
        assert reader.get("bad").status is NOT_FOUND  # retired, so the ring keeps flowing
        assert reader.get("good").payload == b"y" * 100
        channel.put("next", b"n")
        assert channel.tail > bad.position


def test_corrupted_frame_length_is_a_typed_error(ring_dir: str) -> None:
    with _ring(ring_dir) as (channel, reader):
        put = channel.put("k", b"x" * 100)
        assert put.position is not None
        _overwrite(channel.path, RING_HEADER_LENGTH + put.position, (8).to_bytes(4, "little"))
        with pytest.raises(CorruptFrameError, match="length=8"):
            reader.get("k")


def test_frame_running_past_the_end_of_the_region_is_a_typed_error(ring_dir: str) -> None:
    # Length, key and payload lengths agree and the frame lies below head: only the
    # bound "offset + length <= capacity" of ring.frames.frame_problem refuses it.
    with _ring(ring_dir) as (channel, reader):
        puts = [channel.put(f"k{i:02}", bytes(16)) for i in range(SMALL // 64)]
        assert [put.position for put in puts] == [64 * i for i in range(SMALL // 64)]
        for i in (0, 1):
            assert reader.get(f"k{i:02}").status is DELIVERED
        assert channel.put("k64", bytes(16)).position == SMALL  # head is past the last slot
        last = RING_HEADER_LENGTH + SMALL - 64
        assert compute_frame_length(3, 93) == 128
        _overwrite(channel.path, last + FRAME_LENGTH_OFFSET, (128).to_bytes(4, "little"))
        _overwrite(channel.path, last + FRAME_PAYLOAD_LENGTH_OFFSET, (93).to_bytes(4, "little"))
        with RingReader.attach(channel.path) as fresh:
            with pytest.raises(CorruptFrameError, match="bad frame length=128"):
                fresh.statistics()
            with pytest.raises(CorruptFrameError, match="bad frame length=128"):
                fresh.get("k63")


def test_corrupted_head_is_a_typed_error_on_get(ring_dir: str) -> None:
    with _ring(ring_dir) as (channel, reader):
        channel.put("k", b"x")
        _overwrite(channel.path, RING_HEAD_OFFSET, (17).to_bytes(8, "little"))
        with pytest.raises(CorruptFrameError, match="head=17"):
            reader.get("k")
        _overwrite(channel.path, RING_HEAD_OFFSET, channel.head.to_bytes(8, "little"))
        assert reader.get("k").payload == b"x"


def _overwrite(path: str, offset: int, data: bytes) -> None:
    fd = os.open(path, os.O_RDWR)
    try:
        os.pwrite(fd, data, offset)
    finally:
        os.close(fd)


@pytest.mark.parametrize("capacity", [1000, 4097, 4080, 64 * 1024 * 1024 + 16, -16])
def test_invalid_capacity_is_a_configuration_error(ring_dir: str, capacity: int) -> None:
    with pytest.raises(ConfigurationError, match=f"capacity={capacity}\\b"):
        RingChannel.create(_path(ring_dir), capacity)
    assert os.listdir(ring_dir) == []


def test_disabled_capacity_has_no_channel(ring_dir: str) -> None:
    with pytest.raises(ConfigurationError, match="capacity=0"):
        RingChannel.create(_path(ring_dir), 0)
    assert os.listdir(ring_dir) == []


def test_no_space_at_setup_is_a_typed_error_and_leaves_nothing(ring_dir: str) -> None:
    no_space = FaultyOs()
    no_space.fail_every(SITE_FALLOCATE, errno.ENOSPC)
    with pytest.raises(NoSpaceError) as raised:
        RingChannel.create(_path(ring_dir), SMALL, os_facade=no_space)
    assert raised.value.errno == errno.ENOSPC
    assert os.listdir(ring_dir) == []


# -- lifetime ------------------------------------------------------------------------------


def test_close_is_idempotent_and_removes_the_file(ring_dir: str) -> None:
    channel = RingChannel.create(_path(ring_dir), SMALL)
    reader = RingReader.attach(channel.path)
    try:
        file_mode = stat.S_IMODE(os.stat(channel.path).st_mode)
        assert file_mode == 0o600
        channel.put("a", b"1")
        channel.put("b", b"2")
        leased = reader.get("b", mode=ConsumeMode.LEASE).payload
        assert channel.close() == 1  # "a"; "b" is leased, not retired
        assert not os.path.exists(channel.path)
        assert channel.close() == 0
        assert channel.put("c", b"3").status is PutStatus.CLOSED
        assert reader.producer_closed
        assert reader.get("a").status is NOT_FOUND
        assert bytes(leased.view) == b"2"  # the reader's mapping outlives the file
        leased.release()
        with pytest.raises(ProducerGoneError):
            RingReader.attach(channel.path)
    finally:
        reader.close()
        reader.close()
        channel.close()
    with pytest.raises(ClosedError):
        reader.get("a")


def test_reader_close_with_a_live_lease_keeps_the_view_valid(ring_dir: str) -> None:
    with RingChannel.create(_path(ring_dir), SMALL) as channel:
        channel.put("k", b"still here")
        reader = RingReader.attach(channel.path)
        lease = reader.get("k", mode=ConsumeMode.LEASE).payload
        reader.close()
        assert bytes(lease.view) == b"still here"
        lease.release()


def test_reader_exposes_the_producer_identity(ring_dir: str) -> None:
    with _ring(ring_dir) as (_channel, reader):
        assert reader.producer == current_producer_identity()
        assert reader.producer[1] == read_start_time(os.getpid())


_TRACKER_PROBE = """
import sys
from shmring.impl.ring.reader import RingReader
reader = RingReader.attach(sys.argv[1])
got = reader.get("k")
reader.close()
tracker = sys.modules.get("multiprocessing.resource_tracker")
started = tracker is not None and tracker._resource_tracker._pid is not None
print(got.payload.decode(), "tracker-imported" if tracker else "no-tracker", started)
"""


def test_reader_never_registers_with_resource_tracker(ring_dir: str) -> None:
    with RingChannel.create(_path(ring_dir), SMALL) as channel:
        channel.put("k", b"seen")
        result = subprocess.run(
            [sys.executable, "-c", _TRACKER_PROBE, channel.path],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        payload, _imported, started = result.stdout.split()
        assert (payload, started) == ("seen", "False")
        assert os.path.exists(channel.path)  # a reader never unlinks


def test_symlink_at_ring_path_is_refused(ring_dir: str, scope: str) -> None:
    path = _path(ring_dir)
    victim = os.path.join(ring_dir, "victim")
    with open(victim, "wb") as file:
        file.write(b"do not touch")
    os.symlink(victim, path)
    try:
        with pytest.raises(FileExistsError):
            RingChannel.create(path, SMALL)
        with pytest.raises(CorruptFrameError, match="symlink"):
            RingReader.attach(path)
        with open(victim, "rb") as file:
            assert file.read() == b"do not touch"
    finally:
        os.unlink(path)
        os.unlink(victim)
    # A deployment directory that is a symlink is refused as well.
    linked_scope = f"{scope}-link"
    link = deployment_directory_path(linked_scope)
    os.symlink(ring_dir, link)
    try:
        with pytest.raises(ConfigurationError, match="not a directory"):
            ensure_deployment_directory(linked_scope)
    finally:
        os.unlink(link)


# -- naming --------------------------------------------------------------------------------


def test_deployment_directory_is_private(ring_dir: str) -> None:
    info = os.lstat(ring_dir)
    assert stat.S_ISDIR(info.st_mode)
    assert stat.S_IMODE(info.st_mode) == 0o700
    assert info.st_uid == os.getuid()
    assert os.path.basename(ring_dir).startswith(f"shmring-{os.getuid()}-")


@pytest.mark.parametrize(
    "bad", ["", "a/b", "..", "a..b", ".hidden", "a\0b", "x" * 65, "-x", "a b", 7]
)
def test_bad_scope_is_a_configuration_error(bad: object) -> None:
    with pytest.raises(ConfigurationError, match="scope="):
        validate_scope(bad)


@pytest.mark.parametrize("bad", ["", "a/b", "..", "a.b", "a\0b", "x" * 65, "a b", None])
def test_bad_stage_name_is_an_invalid_key_error(bad: object) -> None:
    with pytest.raises(InvalidKeyError, match="name="):
        validate_stage_name(bad)


def test_ring_file_name_round_trips() -> None:
    name = ring_file_name("thinker", "talker-2", (1234, 98765))
    assert name == "ring.thinker.talker-2.1234.98765"
    parsed = parse_ring_file_name(name)
    assert parsed is not None
    assert (parsed.source, parsed.destination, parsed.producer) == (
        "thinker",
        "talker-2",
        (1234, 98765),
    )
    assert parse_ring_file_name("ring.a.b.c.1.2") is None
    assert parse_ring_file_name("marker.a.b.1.2") is None


def test_start_time_is_read_after_the_command_name() -> None:
    line = b"42 (odd) name) (x) S 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 777 19 20\n"
    assert parse_start_time(line) == 777
    assert read_start_time(2**22 + 12345) is None  # beyond pid_max: no such process


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (b"42 no parenthesis S 1 2 3", "not a /proc stat line: b'42 no parenthesis S 1 2 3'"),
        (b"42 (x) S 1 2 3", "/proc stat line too short: b'42 (x) S 1 2 3'"),
        (b"9 (" + b"n" * 200 + b") S 1", "/proc stat line too short: " + repr(b"9 (" + b"n" * 77)),
    ],
    ids=["no-command-name", "too-short", "cut-at-80-bytes"],
)
def test_a_line_that_is_no_start_time_is_refused_naming_the_line(line: bytes, message: str) -> None:
    """The refusal says which line it read (its first 80 bytes), not only that one was wrong."""
    with pytest.raises(ValueError) as refused:
        parse_start_time(line)
    assert str(refused.value) == message
