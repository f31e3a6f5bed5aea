"""The registered arena against `spec.ring` (lease mode) and `spec.leases`.

Frames are borrowed here and in a second process, views derived in every
way the transport promises to survive, and dropped in random order; the
shared frame header must say CLAIMED while a view lives and DONE right after
the last one died. Example tests pin the cases a reviewer looks for first.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import torch

from shmring.impl.errors import (
    ConfigurationError,
    CorruptFrameError,
    RegistryPoisonedError,
    StaleDescriptorError,
)
from shmring.impl.registered.arena import RegisteredArena
from shmring.impl.registered.cuda_driver import SimulatedCudaDriver
from shmring.impl.registered.registration import Registry
from shmring.model_tests.arena_machine import (
    ArenaMachine,
    borrow_in_reader,
    remote_place,
    stop_remote_place,
)
from shmring.model_tests.registration_machine import profile
from shmring.spec.layout import (
    DATA_FRAME_TYPE,
    FRAME_LENGTH_OFFSET,
    FRAME_PAYLOAD_LENGTH_OFFSET,
    FRAME_STATE_CLAIMED,
    FRAME_STATE_DONE,
    FRAME_STATE_PUBLISHED,
    FRAME_TYPE_OFFSET,
    RING_HEADER_LENGTH,
)
from shmring.spec.ring import PutStatus

ArenaMachine.TestCase.settings = profile(max_examples=20, stateful_step_count=30)
TestArenaLockstep = ArenaMachine.TestCase


@pytest.fixture(scope="module", autouse=True)
def _stop_worker() -> Iterator[None]:
    yield
    stop_remote_place()


@pytest.fixture
def registry(scope: str) -> Iterator[Registry]:
    registry = Registry(scope, SimulatedCudaDriver())
    yield registry
    registry.close()


def test_arena_is_registered_once_and_frames_land_in_it(registry: Registry) -> None:
    driver = registry.driver
    assert isinstance(driver, SimulatedCudaDriver)
    with RegisteredArena(registry, 8192) as arena:
        for n in range(20):
            assert not isinstance(arena.put(torch.full((100,), n, dtype=torch.uint8)), PutStatus)
            arena.reclaim()
        stats = driver.statistics()
        assert stats.registered_ranges == 1 and driver.calls_of("host_register") == 1
        assert stats.copies == stats.copies_into_registered == 20
    assert driver.registered_ranges() == {}


def test_refusals_follow_the_ring_model(registry: Registry) -> None:
    with RegisteredArena(registry, 4096) as arena:
        assert arena.put(torch.zeros(2000, dtype=torch.uint8)) is PutStatus.NOT_ADMITTED
        descriptors = [arena.put(torch.zeros(900, dtype=torch.uint8)) for _ in range(5)]
        assert descriptors[-1] is PutStatus.FULL  # nothing was borrowed and released


def test_frames_return_out_of_order_and_reclaim_stays_in_order(registry: Registry) -> None:
    with RegisteredArena(registry, 4096) as arena:
        first, second = (arena.put(torch.full((3, 4, 3), n, dtype=torch.uint8)) for n in (1, 2))
        assert not isinstance(first, PutStatus) and not isinstance(second, PutStatus)
        a = borrow_in_reader(registry.directory, first, (3, 4, 3))
        b = borrow_in_reader(registry.directory, second, (3, 4, 3))
        assert arena.frame_state(first.position) == FRAME_STATE_CLAIMED
        del b
        assert arena.frame_state(second.position) == FRAME_STATE_DONE
        assert arena.reclaim() == 0  # the first frame is still claimed
        del a
        assert arena.frame_state(first.position) == FRAME_STATE_DONE
        assert arena.reclaim() > 0 and arena.tail == arena.head


@pytest.mark.parametrize("second", ["slice", "VideoFrame.from_numpy_buffer"], ids=["numpy", "pyav"])
def test_frame_borrowed_in_second_process_returns_when_its_views_die(
    registry: Registry, second: str
) -> None:
    if second == "VideoFrame.from_numpy_buffer":
        pytest.importorskip("av", reason="the PyAV frame case needs PyAV")
    place = remote_place()
    place.attach(registry.directory)
    with RegisteredArena(registry, 4096) as arena:
        frame = arena.put(torch.arange(2 * 5 * 3, dtype=torch.uint8).reshape(2, 5, 3))
        assert not isinstance(frame, PutStatus)
        assert place.borrow(0, frame, (2, 5, 3))[:3] == bytes([0, 1, 2])
        place.derive(1, 0, "torch.from_numpy")
        place.derive(2, 0, second)
        for view in (0, 2):
            place.drop(view)
            assert arena.frame_state(frame.position) == FRAME_STATE_CLAIMED
        place.drop(1)
        assert arena.frame_state(frame.position) == FRAME_STATE_DONE
        place.reset()


def test_stale_or_reused_descriptor_is_stale_like_the_rings(registry: Registry) -> None:
    # The ring answers STALE for a descriptor whose frame is no longer deliverable;
    # the arena reader (which answers arrays, not statuses) raises the typed
    # StaleDescriptorError for the same cases, never CorruptFrameError.
    assert not issubclass(StaleDescriptorError, CorruptFrameError)
    with RegisteredArena(registry, 4096) as arena:
        frame = arena.put(torch.zeros(10, dtype=torch.uint8))
        assert not isinstance(frame, PutStatus)
        view = borrow_in_reader(registry.directory, frame, (10,))
        with pytest.raises(StaleDescriptorError, match="not published"):
            borrow_in_reader(registry.directory, frame, (10,))
        del view
        assert arena.frame_state(frame.position) == FRAME_STATE_DONE
        with pytest.raises(StaleDescriptorError, match="not published"):
            borrow_in_reader(registry.directory, frame, (10,))  # received already
        with pytest.raises(StaleDescriptorError, match="another one"):
            borrow_in_reader(
                registry.directory,
                frame.__class__(frame.arena, frame.position, "f" * 16, 10),
                (10,),
            )
        later = arena.put(torch.ones(10, dtype=torch.uint8))  # reclaims the DONE frame
        assert not isinstance(later, PutStatus) and arena.tail > frame.position
        with pytest.raises(StaleDescriptorError, match="reclaimed"):
            borrow_in_reader(registry.directory, frame, (10,))
        assert bytes(borrow_in_reader(registry.directory, later, (10,))) == bytes([1] * 10)


def test_corrupt_arena_frame_header_is_corrupt_not_stale(registry: Registry) -> None:
    with RegisteredArena(registry, 4096) as arena:
        frame = arena.put(torch.zeros(10, dtype=torch.uint8))
        assert not isinstance(frame, PutStatus)
        path = os.path.join(registry.directory, arena.name)
        field = RING_HEADER_LENGTH + frame.position + FRAME_TYPE_OFFSET
        with open(path, "r+b") as file:
            file.seek(field)
            file.write((77).to_bytes(2, "little"))
        with pytest.raises(CorruptFrameError, match="bad frame type=77"):
            borrow_in_reader(registry.directory, frame, (10,))
        with open(path, "r+b") as file:
            file.seek(field)
            file.write(DATA_FRAME_TYPE.to_bytes(2, "little"))
        assert bytes(borrow_in_reader(registry.directory, frame, (10,))) == bytes(10)


def test_arena_frame_running_past_the_end_of_the_region_is_corrupt(registry: Registry) -> None:
    # The header's lengths agree and the frame lies below head; only the region bound
    # of ring.frames.frame_problem tells corruption from a stale descriptor here.
    with RegisteredArena(registry, 4096) as arena:
        frames = [arena.put(torch.full((16,), i, dtype=torch.uint8)) for i in range(64)]
        assert [getattr(f, "position", None) for f in frames] == [64 * i for i in range(64)]
        for frame in frames[:2]:
            assert bytes(borrow_in_reader(registry.directory, frame, (16,)))  # then DONE
        wrapped = arena.put(torch.zeros(16, dtype=torch.uint8))
        assert getattr(wrapped, "position", None) == 4096
        path = os.path.join(registry.directory, arena.name)
        last = RING_HEADER_LENGTH + 4096 - 64
        with open(path, "r+b") as file:
            file.seek(last + FRAME_LENGTH_OFFSET)
            file.write((128).to_bytes(4, "little"))
            file.seek(last + FRAME_PAYLOAD_LENGTH_OFFSET)
            file.write((80).to_bytes(4, "little"))
        with pytest.raises(CorruptFrameError, match="bad frame length=128"):
            borrow_in_reader(registry.directory, frames[-1], (16,))


def test_copy_failure_publishes_nothing(registry: Registry) -> None:
    driver = registry.driver
    assert isinstance(driver, SimulatedCudaDriver)
    with RegisteredArena(registry, 4096) as arena:
        driver.fail_first("synchronize")
        with pytest.raises(Exception, match="cudaErrorUnknown"):
            arena.put(torch.zeros(10, dtype=torch.uint8))
        assert arena.head == 0
        frame = arena.put(torch.ones(10, dtype=torch.uint8))
        assert not isinstance(frame, PutStatus) and frame.position == 0
        assert arena.frame_state(0) == FRAME_STATE_PUBLISHED


def test_arena_unregister_failure_retains_arena_until_late_unregister(registry: Registry) -> None:
    driver = registry.driver
    assert isinstance(driver, SimulatedCudaDriver)
    arena = RegisteredArena(registry, 4096)
    path = os.path.join(registry.directory, arena.name)
    driver.fail_every("host_unregister")
    with pytest.raises(RegistryPoisonedError):
        arena.close()
    assert os.path.exists(path) and registry.poisoned
    driver.clear_faults()
    assert registry.close() == 0  # the late unregister succeeds and the arena file goes
    assert not os.path.exists(path)


def test_invalid_arena_capacity_is_a_configuration_error(registry: Registry) -> None:
    with pytest.raises(ConfigurationError, match="capacity=1000"):
        RegisteredArena(registry, 1000)


def test_a_reader_sees_the_state_the_arena_writes_and_refuses_once_closed(
    registry: Registry,
) -> None:
    """`ArenaReader.frame_state` reads the frame header the arena's own view reads."""
    from shmring.impl.errors import ClosedError
    from shmring.impl.registered.arena import ArenaReader

    with RegisteredArena(registry, 4096) as arena:
        first, second = (arena.put(torch.full((7,), n, dtype=torch.uint8)) for n in (1, 2))
        assert not isinstance(first, PutStatus) and not isinstance(second, PutStatus)
        reader = ArenaReader(registry.directory, first.arena)
        try:
            assert reader.frame_state(first.position) == FRAME_STATE_PUBLISHED
            view = reader.borrow(first, "uint8", (7,))
            assert reader.frame_state(first.position) == FRAME_STATE_CLAIMED
            assert reader.frame_state(second.position) == FRAME_STATE_PUBLISHED
            # A position past the capacity names the same place (positions only grow).
            assert reader.frame_state(first.position + reader.capacity) == FRAME_STATE_CLAIMED
            del view
            assert reader.frame_state(first.position) == FRAME_STATE_DONE
            assert arena.frame_state(first.position) == FRAME_STATE_DONE
        finally:
            reader.close()
        with pytest.raises(ClosedError, match=f"arena reader is closed: name={reader.name!r}"):
            reader.frame_state(first.position)
        drained = borrow_in_reader(registry.directory, second, (7,))
        del drained
