"""Tests written for mutants that survived the rest of the suite (docs/mutation.md, issue 15).

Each names the promise the mutant broke unnoticed: a limit at its exact
boundary, a statistics field no other test read, a liveness edge.
"""

from __future__ import annotations

import errno
import gc
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from msgspec.msgpack import Ext

from shmring.impl import codec
from shmring.impl.errors import (
    CorruptFrameError,
    NoSpaceError,
    UnsupportedPayloadError,
    describe_errno,
)
from shmring.impl.liveness import Liveness
from shmring.impl.names import read_start_time
from shmring.impl.os_seam import DEFAULT_OS
from shmring.impl.registered import views
from shmring.impl.registered.arena import ArenaReader, RegisteredArena
from shmring.impl.registered.cuda_driver import SimulatedCudaDriver
from shmring.impl.registered.registration import Registry
from shmring.impl.registered.transfer import CARRIER_SEGMENT, FieldDescriptor
from shmring.impl.ring.producer import RingChannel
from shmring.spec import layout
from shmring.spec.ring import PutStatus

# -- codec limits ------------------------------------------------------------------------


def _nested_lists(levels: int) -> list[object]:
    tree: list[object] = []
    for _ in range(levels):
        tree = [tree]
    return tree


def _nested_dicts(levels: int) -> dict[str, object]:
    tree: dict[str, object] = {}
    for _ in range(levels):
        tree = {"k": tree}
    return tree


@pytest.mark.parametrize("nest", [_nested_lists, _nested_dicts])
def test_codec_carries_exactly_max_nesting_containers_and_refuses_one_more(nest: object) -> None:
    assert callable(nest)
    deepest = nest(codec.MAX_NESTING)
    assert codec.decode(codec.encode(deepest)) == deepest
    with pytest.raises(UnsupportedPayloadError, match="nested deeper than 128"):
        codec.encode(nest(codec.MAX_NESTING + 1))


def test_payload_whose_exts_leave_one_code_free_travels_and_one_using_all_is_refused() -> None:
    every = [code for code in range(-128, 128) if code != codec.TIMESTAMP_EXT_CODE]
    for free in (codec.DEFAULT_LEAF_EXT_CODE, 0, -128):
        exts = [Ext(code, bytes([code & 0xFF])) for code in every if code != free]
        payload = {"exts": exts, "leaf": np.arange(5, dtype=np.int16)}
        decoded = codec.decode(codec.encode(payload))
        assert decoded["exts"] == exts
        assert np.array_equal(decoded["leaf"], payload["leaf"])
    with pytest.raises(UnsupportedPayloadError, match="every msgpack ext code"):
        codec.encode({"exts": [Ext(code, b"") for code in every], "leaf": np.arange(2)})


def test_codec_imports_and_round_trips_tensors_in_a_fresh_process() -> None:
    # The child imports the very modules this process does (same sys.path), so a
    # codec that only works once something else imported numpy or torch fails here.
    script = (
        "import json, sys\n"
        "from shmring.impl import codec\n"
        "assert 'numpy' not in sys.modules and 'torch' not in sys.modules\n"
        "import numpy as np, torch\n"
        "tree = {'a': np.arange(6, dtype=np.float32).reshape(2, 3), 't': torch.arange(4)}\n"
        "back = codec.decode(codec.encode(tree))\n"
        "print(json.dumps([back['a'].tolist(), back['t'].tolist(), type(back['t']).__name__]))\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == [[[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]], [0, 1, 2, 3], "Tensor"]


# -- statistics fields ---------------------------------------------------------------------


def test_ring_statistics_count_puts_refused_full_and_not_admitted(tmp_path: Path) -> None:
    with RingChannel.create(str(tmp_path / "ring"), 4096) as ring:
        published = 0
        while (outcome := ring.put(f"k{published}", b"x" * 200)).status is PutStatus.PUBLISHED:
            published += 1
        assert outcome.status is PutStatus.FULL
        assert ring.put("again", b"x" * 200).status is PutStatus.FULL
        assert ring.put("huge", b"x" * 2048).status is PutStatus.NOT_ADMITTED
        stats = ring.statistics()
    assert published > 0
    assert stats.puts == published
    assert stats.refused_full == 2
    assert stats.refused_not_admitted == 1


def test_lease_statistics_count_a_release_once_when_the_last_view_dies() -> None:
    gc.collect()  # leases other tests left to the collector are released now, not below
    keep = np.zeros(64, dtype=np.uint8)
    released: list[int] = []
    before = views.lease_statistics()
    owner = views.LeaseOwner(
        keep, 16, np.dtype(np.uint8), (8,), release=lambda array: released.append(array.nbytes)
    )
    view = np.asarray(owner)
    del owner
    taken = views.lease_statistics()
    assert (taken.taken, taken.released) == (before.taken + 1, before.released)
    assert taken.live == before.live + 1
    del view
    gc.collect()
    after = views.lease_statistics()
    assert released == [64]
    assert (after.taken, after.released, after.live) == (
        taken.taken,
        before.released + 1,
        before.live,
    )


# -- liveness --------------------------------------------------------------------------------


def _descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_pid_zero_or_negative_is_dead_and_a_dead_producers_pidfd_is_closed_at_once() -> None:
    liveness = Liveness(DEFAULT_OS)
    try:
        assert not liveness.is_alive((0, 1))
        assert not liveness.is_alive((-7, 1))
        child = subprocess.Popen(["sleep", "60"])
        try:
            start = read_start_time(child.pid)
            assert start is not None
            before = _descriptors()
            assert liveness.is_alive((child.pid, start))
            # a pidfd is kept for the live producer (pid <= 0 did not turn pidfds off)
            assert _descriptors() == before + 1
        finally:
            child.kill()
            child.wait()
        assert not liveness.is_alive((child.pid, start))
        assert _descriptors() == before  # closed as soon as the death was seen
        assert not liveness.is_alive((child.pid, start))  # dead stays dead
    finally:
        liveness.close()


# -- messages, seam calls and statistics the first impl/ sample found unasserted -------------


def test_describe_errno_names_known_codes_and_shows_unknown_ones_as_numbers() -> None:
    assert describe_errno(errno.ENOSPC) == f"ENOSPC ({os.strerror(errno.ENOSPC)})"
    assert describe_errno(4242).startswith("4242 (")


def test_os_facade_write_writes_the_bytes(tmp_path: Path) -> None:
    fd = os.open(tmp_path / "f", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        assert DEFAULT_OS.write(fd, b"shmring") == 7
        assert os.pread(fd, 16, 0) == b"shmring"
    finally:
        os.close(fd)


def test_field_descriptor_with_a_negative_dimension_names_itself_in_the_error() -> None:
    field = FieldDescriptor(
        "x", CARRIER_SEGMENT, "seg", 0, "", 0, "float32", "float32", (2, -1), 0, (0, 0)
    )
    with pytest.raises(CorruptFrameError, match=r"negative shape or position: .*shape=\(2, -1\)"):
        field.check()


def test_registry_statistics_count_the_arena_range_while_it_is_registered(scope: str) -> None:
    registry = Registry(scope, SimulatedCudaDriver())
    try:
        assert registry.statistics().ranges_registered == 0
        with RegisteredArena(registry, 8192):
            assert registry.statistics().ranges_registered == 1
        assert registry.statistics().ranges_registered == 0
    finally:
        registry.close()


def test_wrapped_arena_drained_to_tail_equals_head_keeps_taking_frames(scope: str) -> None:
    from shmring.model_tests.arena_machine import borrow_in_reader

    registry = Registry(scope, SimulatedCudaDriver())
    try:
        with RegisteredArena(registry, 4096) as arena:
            for n in range(12):  # 12 frames of ~900 bytes: the 4 KiB arena wraps twice
                frame = arena.put(torch.full((900,), n, dtype=torch.uint8))
                assert not isinstance(frame, PutStatus), n
                view = borrow_in_reader(registry.directory, frame, (900,))
                assert int(view[0]) == int(view[-1]) == n
                del view
                assert arena.reclaim() > 0
                assert arena.tail == arena.head  # drained, before and after wrapping
                assert arena.reclaim() == 0  # and reclaiming again finds nothing
            assert arena.head > 2 * 4096
    finally:
        registry.close()


# -- spec/layout: helpers only the implementation called ---------------------------------------


def test_ring_file_length_is_header_plus_capacity_also_for_a_disabled_ring() -> None:
    assert layout.compute_ring_file_length(0) == layout.RING_HEADER_LENGTH
    assert layout.compute_ring_file_length(4096) == layout.RING_HEADER_LENGTH + 4096


def test_align_accepts_every_power_of_two_including_one() -> None:
    assert [layout.align(7, alignment) for alignment in (1, 2, 4, 16)] == [7, 8, 8, 16]
    with pytest.raises(AssertionError):
        layout.align(7, 3)


def test_no_space_error_carries_its_errno_and_its_message() -> None:
    error = NoSpaceError("no space for a ring file: capacity=4096", errno.EMFILE)
    assert isinstance(error, OSError) and error.errno == errno.EMFILE
    assert error.strerror == "no space for a ring file: capacity=4096"
    assert "capacity=4096" in str(error)


def test_arena_reader_attaches_to_an_arena_whose_bytes_read_as_nan(scope: str) -> None:
    # Attaching touches one byte per page; read as anything but bytes, 0xFF... is a NaN.
    registry = Registry(scope, SimulatedCudaDriver())
    try:
        with RegisteredArena(registry, 65536) as arena:
            frames = [arena.put(torch.full((15000,), 255, dtype=torch.uint8)) for _ in range(4)]
            assert not any(isinstance(frame, PutStatus) for frame in frames)
            with ArenaReader(registry.directory, arena.name) as reader:
                assert reader.capacity == 65536
    finally:
        registry.close()
