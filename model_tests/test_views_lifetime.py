"""Lifetime of borrowed views, in the iceoryx2 style: each test names the claim.

A borrowed view's memory must stay mapped while any object derived from it
lives, and be released right after the last one dies: the segment mapping
closed (checked in /proc/self/maps), the arena frame DONE (checked in the
shared frame header). No test calls gc.collect() before checking a release:
"right after" means reference counting alone does it.
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
from collections.abc import Iterator

import numpy as np
import pytest
import torch

from shmring.impl.registered.arena import RegisteredArena, compute_arena_frame_length
from shmring.impl.registered.cuda_driver import SimulatedCudaDriver
from shmring.impl.registered.registration import Registry
from shmring.impl.registered.transfer import TransferOptions, TransferReceiver, TransferSender
from shmring.impl.registered.views import (
    LeaseOwner,
    borrow_segment,
    lease_owner_of,
    lease_statistics,
)
from shmring.model_tests.registration_machine import transfer_files
from shmring.spec.layout import FRAME_STATE_CLAIMED, FRAME_STATE_DONE
from shmring.spec.ring import PutStatus


def mapped(name: str) -> bool:
    """Whether this process maps a file whose path contains `name`."""
    with open("/proc/self/maps") as maps:
        return any(name in line for line in maps)


@pytest.fixture
def registry(scope: str) -> Iterator[Registry]:
    registry = Registry(scope, SimulatedCudaDriver())
    yield registry
    registry.close()


def publish(registry: Registry, tensor: torch.Tensor) -> str:
    (segment,) = registry.transfer([tensor])
    return segment.name


def test_saved_view_survives_release_of_original(registry: Registry) -> None:
    name = publish(registry, torch.arange(24, dtype=torch.uint8))
    original = borrow_segment(registry.directory, name, "uint8", (4, 6))
    saved = original[2:, 1:4]
    del original
    assert mapped(name)
    assert saved.tolist() == [[13, 14, 15], [19, 20, 21]]
    del saved
    assert not mapped(name)


def test_dropping_last_view_returns_the_frame(registry: Registry) -> None:
    av = pytest.importorskip("av", reason="the derived views include a PyAV frame")
    with RegisteredArena(registry, 4096) as arena:
        frame = arena.put(torch.arange(48, dtype=torch.uint8).reshape(4, 4, 3))
        assert not isinstance(frame, PutStatus)
        receiver = TransferReceiver(registry.scope, TransferOptions(enable_borrowed_frames=True))
        view = receiver._reader(frame.arena).borrow(frame, "uint8", (4, 4, 3))
        derived = [
            view[1:],
            torch.from_numpy(view),
            av.VideoFrame.from_numpy_buffer(view, format="rgb24"),
        ]
        del view
        while derived:
            assert arena.frame_state(frame.position) == FRAME_STATE_CLAIMED
            derived.pop(0)
        assert arena.frame_state(frame.position) == FRAME_STATE_DONE
        receiver.close()


def test_no_mapping_closed_under_a_live_view(registry: Registry) -> None:
    """The seed's early design crashed reading an array kept through np.asarray."""
    name = publish(registry, torch.arange(16, dtype=torch.uint8))
    view = borrow_segment(registry.directory, name, "uint8", (16,))
    kept = np.asarray(view)
    through_buffer = np.asarray(memoryview(view))
    del view
    gc.collect()
    assert mapped(name)
    assert kept.sum() == sum(range(16)) and through_buffer[-1] == 15
    registry.close()  # the producer side going away changes nothing for the receiver
    assert kept[3] == 3
    del kept
    assert mapped(name)  # the memoryview's array still holds it
    del through_buffer
    assert not mapped(name)


def test_reader_close_leaves_borrowed_arena_frames_readable(registry: Registry) -> None:
    with RegisteredArena(registry, 4096) as arena:
        frame = arena.put(torch.full((8,), 7, dtype=torch.uint8))
        assert not isinstance(frame, PutStatus)
        receiver = TransferReceiver(registry.scope, TransferOptions(enable_borrowed_frames=True))
        view = receiver._reader(frame.arena).borrow(frame, "uint8", (8,))
        receiver.close()
        gc.collect()
        assert view.tolist() == [7] * 8
        del view
        assert arena.frame_state(frame.position) == FRAME_STATE_DONE


def test_pyav_frame_keeps_mapping_alive(registry: Registry) -> None:
    av = pytest.importorskip("av")
    pixels = torch.arange(2 * 4 * 3, dtype=torch.uint8).reshape(2, 4, 3)
    name = publish(registry, pixels)
    view = borrow_segment(registry.directory, name, "uint8", (2, 4, 3))
    frame = av.VideoFrame.from_numpy_buffer(view, format="rgb24")
    del view
    gc.collect()
    assert mapped(name)
    assert np.array_equal(frame.to_ndarray(format="rgb24"), pixels.numpy())
    del frame
    assert not mapped(name)


def test_torch_views_keep_mapping_alive(registry: Registry) -> None:
    source = torch.randn(6).to(torch.bfloat16)
    name = publish(registry, source)
    bits = borrow_segment(registry.directory, name, "uint16", (6,))
    restored = torch.from_numpy(bits).view(torch.bfloat16)
    del bits
    gc.collect()
    assert mapped(name) and torch.equal(restored, source)
    del restored
    assert not mapped(name)


def test_base_chain_ends_in_a_lease_owner_not_a_subclass(registry: Registry) -> None:
    name = publish(registry, torch.zeros(4, dtype=torch.uint8))
    view = borrow_segment(registry.directory, name, "uint8", (4,))
    assert type(view) is np.ndarray
    owner = lease_owner_of(view[1:])
    assert isinstance(owner, LeaseOwner) and not isinstance(owner, np.ndarray)
    assert "__array_interface__" in vars(owner)
    assert view.flags.writeable
    del owner, view
    assert not mapped(name)


def test_leases_are_counted_and_all_released(registry: Registry) -> None:
    before = lease_statistics()
    names = [publish(registry, torch.zeros(4, dtype=torch.uint8)) for _ in range(3)]
    views = [borrow_segment(registry.directory, n, "uint8", (4,)) for n in names]
    assert lease_statistics().live == before.live + 3
    views.reverse()
    views.clear()
    after = lease_statistics()
    assert after.live == before.live and after.released == before.released + 3


def test_segment_name_unlinked_as_soon_as_receiver_mapped(registry: Registry) -> None:
    name = publish(registry, torch.zeros(4, dtype=torch.uint8))
    assert name in os.listdir(registry.directory)
    view = borrow_segment(registry.directory, name, "uint8", (4,))
    assert name not in os.listdir(registry.directory)
    del view


def test_receiver_killed_after_mapping_leaves_no_name(scope: str) -> None:
    options = TransferOptions(enable_registered_shm=True, arena_capacity=0)
    sender = TransferSender(scope, options, driver=SimulatedCudaDriver())
    descriptor = sender.send({"x": torch.ones(1024, dtype=torch.uint8)})
    assert descriptor.fields[0].carrier == "segment"
    code = (
        "import sys, signal, os\n"
        "from shmring.impl.registered.transfer import TransferReceiver, TransferOptions, TransferDescriptor\n"
        "d = TransferDescriptor.from_wire(eval(sys.argv[1]))\n"
        "v = TransferReceiver(d.scope, TransferOptions(enable_borrowed_frames=True)).receive(d)\n"
        "assert int(v['x'].sum()) == 1024\n"
        "print('mapped', flush=True)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, repr(descriptor.to_wire())],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.stdout.strip() == "mapped", result.stderr
    assert result.returncode == -9
    assert transfer_files(sender.directory) == []  # unlinked by the receiver before it died
    sender.close()
    assert not os.path.exists(sender.directory)


def test_arena_frame_claimed_by_killed_receiver_is_reused_once_its_death_is_detected(
    scope: str,
) -> None:
    """A receiver that dies holding a frame leaves it CLAIMED with its pid; reclaim sees the death.

    Until then (the receiver alive) the producer never overwrites the frame.
    """
    options = TransferOptions(enable_registered_shm=True, arena_capacity=4096)
    sender = TransferSender(scope, options, driver=SimulatedCudaDriver())
    descriptor = sender.send({"x": torch.ones(64, dtype=torch.uint8)})
    assert descriptor.fields[0].carrier == "arena"
    code = (
        "import sys, os, signal\n"
        "from shmring.impl.registered.transfer import TransferReceiver, TransferOptions, TransferDescriptor\n"
        "d = TransferDescriptor.from_wire(eval(sys.argv[1]))\n"
        "v = TransferReceiver(d.scope, TransferOptions(enable_borrowed_frames=True)).receive(d)\n"
        "print('claimed', flush=True)\n"
        "sys.stdin.readline()\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", code, repr(descriptor.to_wire())],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None and child.stdin is not None
        line = child.stdout.readline()
        assert line.strip() == "claimed", child.stderr.read() if child.stderr else ""
        arena = sender.arena
        assert arena is not None
        position = descriptor.fields[0].position
        assert arena.frame_state(position) == FRAME_STATE_CLAIMED
        assert arena.reclaim() == 0  # the holder lives: its frame stays
        child.stdin.write("die\n")
        child.stdin.close()
        assert child.wait(timeout=120) == -9
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(timeout=120)
        for stream in (child.stdout, child.stderr, child.stdin):
            if stream is not None and not stream.closed:
                stream.close()
    assert arena.reclaim() == compute_arena_frame_length(64)
    assert arena.tail > position and arena.statistics().reclaimed_from_dead_holders == 1
    sender.close()
