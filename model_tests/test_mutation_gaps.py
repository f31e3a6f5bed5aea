"""The classes of gap a fresh mutation sample found (issue 29), each pinned by exact checks.

A fresh sample of impl/'s mutants survived where the suite asserted less
than the code promises: counters only ever compared with zero (a counter
that counts down passes), error classification only fed errors already in
the class (every OSError taken as descriptor exhaustion passes), shedding
whose return value and callback nobody read, codec inputs no test built.
The tests here fix the class:
nonzero counts are asserted exactly, every classifier meets an error
*outside* its class, every shed's answer is checked against what it closed.
"""

from __future__ import annotations

import ctypes
import errno
import importlib
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator

import msgspec
import numpy as np
import pytest

from shmring.fault_injection.kit.seams import FaultyOs
from shmring.impl import codec, errors
from shmring.impl.connector import shortage
from shmring.impl.errors import ResourceExhaustedError
from shmring.impl.fallback.writer import FallbackWriter
from shmring.impl.liveness import Liveness, read_process_status
from shmring.impl.names import (
    ProducerIdentity,
    current_producer_identity,
    fallback_spare_file_name,
)
from shmring.impl.os_seam import SITE_PIDFD
from shmring.impl.ring.borrow import BorrowedPayload


@pytest.fixture
def sleepers() -> Iterator[list[ProducerIdentity]]:
    """Four live processes other than this one, as (pid, start time)."""
    children = [
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) for _ in range(4)
    ]
    try:
        identities = []
        for child in children:
            status = read_process_status(child.pid, FaultyOs())
            assert status is not None
            identities.append((child.pid, status[0]))
        yield identities
    finally:
        for child in children:
            child.kill()
            child.wait()


# -- error classification: errors outside the class ---------------------------------------------


def test_only_descriptor_and_mapping_shortage_is_exhaustion() -> None:
    for code in (errno.EMFILE, errno.ENFILE, errno.ENOMEM):
        assert errors.is_exhaustion(OSError(code, "short"))
    for code in (errno.EIO, errno.ENOSPC, errno.EACCES, errno.ENOENT, errno.EAGAIN, None):
        assert not errors.is_exhaustion(OSError(code, "not short")), code
    assert not errors.is_exhaustion(ValueError(errno.EMFILE))  # an errno number is not enough


def test_retry_passes_an_error_outside_the_class_through_untouched_and_sheds_nothing() -> None:
    shed_calls: list[int] = []

    def shed() -> int:
        shed_calls.append(1)
        return 1

    for code in (errno.EIO, errno.ENOSPC, errno.EACCES):
        failure = OSError(code, "not a shortage")

        def action(failure: OSError = failure) -> None:
            raise failure

        with pytest.raises(OSError) as raised:
            shortage.retry_short_of_descriptors("a test", action, shed)
        assert raised.value is failure  # not re-typed as ResourceExhaustedError
        assert not isinstance(raised.value, ResourceExhaustedError)
    assert shed_calls == []


def test_retry_sheds_once_per_shortage_and_answers_the_action_s_result() -> None:
    failures = [OSError(errno.EMFILE, "short"), OSError(errno.ENFILE, "short")]
    shed_answers = [3, 1]
    calls = {"action": 0, "shed": 0}

    def action() -> str:
        calls["action"] += 1
        if failures:
            raise failures.pop(0)
        return "done"

    def shed() -> int:
        calls["shed"] += 1
        return shed_answers.pop(0)

    assert shortage.retry_short_of_descriptors("a test", action, shed) == "done"
    assert calls == {"action": 3, "shed": 2}


def test_retry_with_nothing_left_to_shed_raises_the_typed_error_with_the_errno() -> None:
    failure = OSError(errno.ENFILE, "system table full")

    def action() -> None:
        raise failure

    calls = []
    with pytest.raises(ResourceExhaustedError) as raised:
        shortage.retry_short_of_descriptors("a map", action, lambda: calls.append(0) or 0)
    assert raised.value.errno == errno.ENFILE and raised.value.__cause__ is failure
    assert "out of descriptors for a map" in str(raised.value)
    assert calls == [0]
    # Shedding that always frees something ends after the fixed number of tries.
    tries = []
    with pytest.raises(ResourceExhaustedError, match="even after releasing"):
        shortage.retry_short_of_descriptors("a map", action, lambda: tries.append(1) or 1)
    assert len(tries) == shortage._TRIES


def test_a_pidfd_refused_for_a_reason_other_than_exhaustion_sheds_no_pidfd(
    sleepers: list[ProducerIdentity],
) -> None:
    seam = FaultyOs()
    liveness = Liveness(seam)
    try:
        assert liveness.is_alive(sleepers[0]) and liveness.is_alive(sleepers[1])
        assert liveness.pidfd_count == 2
        seam.fail_next(SITE_PIDFD, errno.EIO)  # the pidfd_open of the next new producer
        assert liveness.is_alive(sleepers[2])  # /proc answered
        assert liveness.pidfd_count == 2  # nothing shed: EIO is not a shortage
        assert liveness.is_alive(sleepers[3])
        assert liveness.pidfd_count == 3  # and no cap was set either
        assert liveness.checks == 4
    finally:
        liveness.close()
    assert seam.held_descriptors() == []


def test_a_pidfd_refused_for_want_of_descriptors_sheds_half_and_caps_the_rest(
    sleepers: list[ProducerIdentity],
) -> None:
    seam = FaultyOs()
    liveness = Liveness(seam)
    try:
        for producer in sleepers[:3]:
            assert liveness.is_alive(producer)
        assert liveness.pidfd_count == 3
        seam.fail_next(SITE_PIDFD, errno.EMFILE)
        assert liveness.is_alive(sleepers[3])
        assert liveness.pidfd_count == 1  # 3 // 2 + 1 = 2 closed, the cap is what is left
        for producer in sleepers:  # asked again: /proc or a pidfd, never more than the cap
            assert liveness.is_alive(producer)
            assert liveness.pidfd_count == 1
    finally:
        liveness.close()
    assert seam.held_descriptors() == []


# -- shedding: its answer and its callback --------------------------------------------------


def test_shed_answers_how_many_pidfds_it_closed_least_recently_opened_first(
    sleepers: list[ProducerIdentity],
) -> None:
    seam = FaultyOs()
    liveness = Liveness(seam)
    try:
        for producer in sleepers[:3]:
            assert liveness.is_alive(producer)
        held = seam.held_descriptors()
        assert len(held) == 3
        closes = seam.calls["close"]
        assert liveness.shed(2) == 2
        assert liveness.pidfd_count == 1 and seam.calls["close"] == closes + 2
        assert liveness.shed(5) == 1  # only one was left
        assert liveness.shed(1) == 0
        assert seam.held_descriptors() == []
        assert liveness.checks == 3
    finally:
        liveness.close()


def test_out_of_descriptors_for_proc_the_owner_s_callback_is_asked_and_its_answer_counts(
    sleepers: list[ProducerIdentity],
) -> None:
    asked: list[int] = []
    seam = FaultyOs()
    liveness = Liveness(seam, on_exhausted=lambda: asked.append(1) or 1)
    try:
        seam.fail_open("stat", errno.EMFILE)  # /proc/<pid>/stat, no pidfd to shed yet
        assert liveness.is_alive(sleepers[0])
        assert asked == [1]  # asked once: it released one, the read was tried again
    finally:
        liveness.close()
    assert seam.held_descriptors() == []

    seam = FaultyOs()
    refused: list[int] = []
    liveness = Liveness(seam, on_exhausted=lambda: refused.append(1) or 0)
    try:
        seam.fail_open("stat", errno.EMFILE)
        with pytest.raises(ResourceExhaustedError) as raised:
            liveness.is_alive(sleepers[1])
        assert raised.value.errno == errno.EMFILE and refused == [1]
    finally:
        liveness.close()
    assert seam.held_descriptors() == []  # the pidfd opened for the question is closed


# -- codec inputs no test built ------------------------------------------------------------------

BIG = codec.BORROWED_BYTES_MIN


def _lent(encoded: bytes) -> BorrowedPayload:
    buffer = bytearray(encoded)
    keep = (ctypes.c_char * len(encoded)).from_buffer(buffer)
    payload = BorrowedPayload(keep, ctypes.addressof(keep), len(encoded), label="test")
    payload.arm(lambda _keep: None)
    return payload


@pytest.mark.parametrize(
    "ahead",
    [
        "s" * 31,  # fixstr, the longest
        "\u0186" * 15,  # fixstr of 30 bytes, each pair led by 0xc6 (bin 32's header byte)
        "m" * 32,  # str 8
        "\u0186" * 200,  # str 16 (400 bytes of UTF-8 whose lead byte is 0xc6, bin 32's)
        "l" * 65_535,  # str 16, the longest
        "h" * 65_536,  # str 32
        b"b" * 300,  # bin 16 (small: copied)
        2**40,  # uint 64
        -(2**20),  # int 32
        1.5,  # float 64
        msgspec.msgpack.Ext(5, b"e" * 20),  # ext 8
        msgspec.msgpack.Ext(6, b"f" * 4),  # fixext 4
    ],
    ids=lambda value: f"{type(value).__name__}{len(value) if hasattr(value, '__len__') else ''}",
)
def test_borrowed_decode_finds_a_large_leaf_after_a_mid_sized_item(ahead: object) -> None:
    # The borrowed path walks the plain payload's items to find its large
    # bins; an item of any header width ahead of one must be stepped over
    # exactly, or the bin is missed (copied) or misread.
    tree = {"ahead": ahead, "blob": b"q" * (2 * BIG), "after": "x" * 40}
    encoded = codec.encode(tree)
    value = codec.decode_borrowed(_lent(encoded))
    assert isinstance(value["blob"], memoryview), "the large bin was not found: copied"
    assert bytes(value["blob"]) == b"q" * (2 * BIG)
    assert value["ahead"] == ahead and value["after"] == "x" * 40
    del value


def test_a_multi_dimensional_byte_buffer_travels_as_its_bytes() -> None:
    data = bytes(range(256)) * (codec.DIRECT_BYTES_MIN // 256 + 4)
    rows = 4
    view = memoryview(data)[: len(data) // rows * rows].cast("B", (rows, len(data) // rows))
    assert view.ndim == 2 and view.nbytes >= codec.DIRECT_BYTES_MIN
    plan = codec.prepare(view)
    encoded = codec.encode(view)
    assert plan.nbytes == len(encoded) == view.nbytes + 5  # bin 32: a 5-byte header
    assert codec.decode(encoded) == view.tobytes()


@pytest.mark.parametrize("shape", ["2-D uint8", "1-D uint32"])
def test_write_into_a_buffer_of_any_shape_writes_the_same_bytes(shape: str) -> None:
    tree = {"a": np.arange(100, dtype=np.int64), "b": "text", "c": b"z" * 100}
    expected = codec.encode(tree)
    plan = codec.prepare(tree)
    size = (plan.nbytes + 63) // 64 * 64
    if shape == "2-D uint8":
        target = np.full((size // 64, 64), 0xEE, dtype=np.uint8)
    else:
        target = np.full(size // 4, 0xEEEEEEEE, dtype=np.uint32)
    assert plan.write_into(target) == plan.nbytes == len(expected)
    written = target.tobytes()
    assert written[: plan.nbytes] == expected
    assert set(written[plan.nbytes :]) <= {0xEE}  # bytes past nbytes left alone


# -- a fallback segment whose filling fails ---------------------------------------------------


class _FailingPlan:
    """A plan whose copy fails (a tensor resized between prepare and write_into)."""

    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes

    def write_into(self, buf: object) -> int:
        raise ValueError("tensor changed between prepare and write_into")


def _mapped(directory: str) -> int:
    with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
        return sum(1 for line in maps if directory in line)


def test_a_segment_whose_filling_fails_leaks_neither_its_mapping_nor_its_descriptor(
    tmp_path: os.PathLike[str],
) -> None:
    directory = os.fspath(tmp_path)
    seam = FaultyOs()
    producer = (*current_producer_identity(), 0)
    writer = FallbackWriter(
        directory, producer, 64 << 20, seam, spare_bytes=8 << 20, spare_min=4096
    )
    edge = ("enc", "dec")
    good = codec.prepare(b"p" * (256 << 10))  # a file big enough to be kept as a spare
    try:
        baseline = seam.held_descriptors()  # the deployment directory's descriptor
        # A new file that would have been kept: the fill fails, nothing of it stays,
        # also while the caller still holds the error (its traceback holds the
        # put's frame: reference counting alone would not unmap it then).
        with pytest.raises(ValueError, match="tensor changed") as raised:
            writer.put(edge, "k", _FailingPlan(good.nbytes))
        assert seam.held_descriptors() == baseline and _mapped(directory) == 0
        del raised
        assert os.listdir(directory) == []
        stats = writer.statistics()
        assert (stats.spares, stats.spare_bytes, stats.puts, stats.segments) == (0, 0, 0, 0)
        # A spare handed back and taken again: its fill fails, the spare goes entirely.
        record = writer.put(edge, "k", good)
        assert writer.statistics().spares == 1 and _mapped(directory) == 1
        handed_back = os.path.join(directory, fallback_spare_file_name(producer, record.generation))
        os.rename(record.path, handed_back)  # what a reader's claim does with it
        with pytest.raises(ValueError, match="tensor changed") as raised:
            writer.put(edge, "k", _FailingPlan(good.nbytes))
        assert seam.held_descriptors() == baseline and _mapped(directory) == 0
        del raised
        stats = writer.statistics()
        assert (stats.spares, stats.spare_bytes, stats.puts) == (0, 0, 1)
        assert not os.path.exists(handed_back)
    finally:
        writer.close()
    assert seam.held_descriptors() == []


# -- the per-thread codec state: registered on the first use, reused after ------------------

# The modules (the package's `decode` and `encode` names are its functions).
codec_decode = importlib.import_module("shmring.impl.codec.decode")
codec_encode = importlib.import_module("shmring.impl.codec.encode")


def _in_a_new_thread(body: Callable[[], object]) -> object:
    """Run `body` in a fresh thread (its thread-local state unused) and answer its result."""
    result: list[object] = []
    failure: list[BaseException] = []

    def run() -> None:
        try:
            result.append(body())
        except BaseException as error:  # noqa: BLE001 - re-raised below
            failure.append(error)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    if failure:
        raise failure[0]
    return result[0]


def test_a_thread_s_first_framed_decode_registers_its_reader_and_later_ones_reuse_it() -> None:
    tree = {"t": np.arange(64, dtype=np.int64), "s": "x"}
    encoded = codec.encode(tree)

    def body() -> tuple[object, ...]:
        before = getattr(codec_decode._local, "reader", None)
        codec.decode(encoded)
        first = getattr(codec_decode._local, "reader", None)
        codec.decode(encoded)
        second = getattr(codec_decode._local, "reader", None)
        assert first is not None and not first.busy
        first.busy = True  # a decode re-entered from a registered type's decode
        try:
            nested = codec_decode._take_reader()
        finally:
            first.busy = False
        return before, first, second, nested, getattr(codec_decode._local, "reader", None)

    before, first, second, nested, after = _in_a_new_thread(body)  # type: ignore[misc]
    assert before is None  # a new thread starts with none
    assert second is first  # registered at the first use, taken at the second
    assert nested is not first and after is first  # a busy reader is never replaced


def test_a_thread_s_first_prepare_registers_its_header_builder_and_later_ones_reuse_it() -> None:
    tree = {"t": np.arange(64, dtype=np.int64)}

    def body() -> tuple[object, ...]:
        before = getattr(codec_encode._local, "builder", None)
        codec.prepare(tree)
        first = getattr(codec_encode._local, "builder", None)
        codec.prepare(tree)
        second = getattr(codec_encode._local, "builder", None)
        assert first is not None
        first.busy = True  # a prepare re-entered from a registered type's encode
        try:
            plan = codec.prepare(tree)
        finally:
            first.busy = False
        return before, first, second, plan, getattr(codec_encode._local, "builder", None)

    before, first, second, plan, after = _in_a_new_thread(body)  # type: ignore[misc]
    assert before is None and second is first and after is first
    assert codec.decode(plan_bytes(plan))["t"].tolist() == list(range(64))


def plan_bytes(plan: codec.EncodePlan) -> bytes:
    buffer = bytearray(plan.nbytes)
    plan.write_into(buffer)
    return bytes(buffer)
