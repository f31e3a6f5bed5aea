"""One lockstep machine for every engine built on the ring model.

The host ring (`RingChannel` with a `RingReader`) and the registered arena
(`RegisteredArena` with an `ArenaReader`) run the same producer engine
(`impl/ring/engine.py`) and answer to the same model, `spec.ring`. This
machine states the shared rules once: a put that aims at exact fit, the
admission limit and just past it; a copy-out of a deliverable frame; a
lease of one; leases released in any order. It runs once per engine, through
an `Engine` adapter, the way zarr's stateful tests run one model against
several stores. A new engine gets every rule by writing an adapter; no rule
changes.

After every step, the producer's head and tail and the state in each
frame's shared header must equal the model's. Padding frames read DONE.

What only one engine has stays in that engine's own machine:
`ring_machine.py` (indexes, cancels, close, competing readers) and
`arena_machine.py` (views derived in a second process, CUDA copy faults).
Not a test file (`test_engine_lockstep.py` runs it).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import uuid
from typing import Any, ClassVar, Protocol

import torch
from hypothesis import note
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    invariant,
    precondition,
    rule,
)

from ..fault_injection.kit.payloads import tagged_payload
from ..impl.directory import ensure_deployment_directory, remove_deployment_directory_if_empty
from ..impl.names import current_producer_identity, ring_path
from ..impl.registered.arena import ArenaReader, RegisteredArena, arena_key
from ..impl.registered.cuda_driver import SimulatedCudaDriver
from ..impl.registered.registration import Registry
from ..impl.ring.engine import RingProducer
from ..impl.ring.producer import RingChannel
from ..impl.ring.reader import RingReader
from ..impl.ring.results import ReceiveStatus
from ..spec import ring as ring_spec
from ..spec.invariants import check_ring
from ..spec.layout import (
    ADMISSION_DIVISOR,
    FRAME_HEADER_LENGTH,
    FRAME_STATE_DONE,
    PADDING_FRAME_TYPE,
    RING_CAPACITY_ALIGNMENT,
)
from ..spec.ring import ConsumeMode, GetStatus, PutStatus

CAPACITY = 4096  # small: wraparound, exact fit and FULL within a few puts
KEYS = ("a", "b", "req_0_1")

EXACT_FIT = "exact fit"  # the frame ends exactly at the end of the data region
AT_LIMIT = "at limit"  # the largest admitted frame
OVER_LIMIT = "over limit"  # one alignment step past the admission limit
PAYLOAD_SIZES = st.one_of(
    st.integers(1, 1100), st.sampled_from([EXACT_FIT, EXACT_FIT, AT_LIMIT, OVER_LIMIT])
)


class Engine(Protocol):
    """What the machine needs from an engine: a producer, a reader, and the key it will use."""

    producer: RingProducer

    def key_for(self, key: str) -> str:
        """The key the next put publishes under (the arena names its frames itself)."""

    def put(self, key: str, payload: bytes) -> tuple[PutStatus, int | None]:
        """Publish `payload`; answer the status and the position (None unless PUBLISHED)."""

    def copy_out(self, key: str, position: int) -> bytes:
        """Claim the frame at `position` by its descriptor and copy its payload out."""

    def lease(self, key: str, position: int) -> tuple[Any, bytes]:
        """Claim the frame at `position` in place; answer a handle and the bytes it reads."""

    def release(self, handle: Any) -> None:
        """Let go of a lease's last view: the frame is done."""

    def close(self) -> None:
        """Close everything and check that nothing is left behind."""


class RingEngine:
    """The host ring: a `RingChannel` and a second mapping's `RingReader`."""

    def __init__(self) -> None:
        self.directory = ensure_deployment_directory(f"m{uuid.uuid4().hex[:12]}")
        path = ring_path(self.directory, "src", "dst", current_producer_identity())
        self.producer = self.channel = RingChannel.create(path, CAPACITY)
        self.reader = RingReader.attach(path)

    def key_for(self, key: str) -> str:
        return key

    def put(self, key: str, payload: bytes) -> tuple[PutStatus, int | None]:
        outcome = self.channel.put(key, payload)
        return outcome.status, outcome.position

    def copy_out(self, key: str, position: int) -> bytes:
        got = self.reader.get(key, position)
        assert got.status is ReceiveStatus.DELIVERED, got
        payload: bytes = got.payload
        return payload

    def lease(self, key: str, position: int) -> tuple[Any, bytes]:
        got = self.reader.get(key, position, mode=ConsumeMode.LEASE)
        assert got.status is ReceiveStatus.DELIVERED, got
        return got.payload, bytes(got.payload.view)

    def release(self, handle: Any) -> None:
        handle.release()

    def close(self) -> None:
        try:
            self.reader.close()
            self.channel.close()
        finally:
            if not remove_deployment_directory_if_empty(self.directory):
                shutil.rmtree(self.directory, ignore_errors=True)
                raise AssertionError(f"ring directory not empty after close: {self.directory}")


class _Borrowed:
    """An arena lease's view, dropped by `release` (Hypothesis keeps the handle itself)."""

    def __init__(self, view: Any) -> None:
        self.view: Any = view


class ArenaEngine:
    """The registered arena (simulated driver): a `RegisteredArena` and an `ArenaReader`."""

    def __init__(self) -> None:
        self.registry = Registry(f"t{uuid.uuid4().hex[:12]}", SimulatedCudaDriver())
        self.producer = self.arena = RegisteredArena(self.registry, CAPACITY)
        self.reader = ArenaReader(self.registry.directory, self.arena.name)
        self.reserved = 0  # reservations taken: the arena's key sequence
        self.descriptors: dict[int, Any] = {}  # position -> its frame descriptor

    def key_for(self, key: str) -> str:
        return arena_key(self.reserved)

    def put(self, key: str, payload: bytes) -> tuple[PutStatus, int | None]:
        assert key == arena_key(self.reserved)
        got = self.arena.put(torch.frombuffer(bytearray(payload), dtype=torch.uint8))
        if isinstance(got, PutStatus):
            return got, None
        self.reserved += 1
        assert got.key == key, (got, key)
        self.descriptors[got.position] = got
        return PutStatus.PUBLISHED, got.position

    def copy_out(self, key: str, position: int) -> bytes:
        descriptor = self.descriptors[position]
        return bytes(self.reader.copy(descriptor, "uint8", (descriptor.nbytes,)).tobytes())

    def lease(self, key: str, position: int) -> tuple[Any, bytes]:
        descriptor = self.descriptors[position]
        view = self.reader.borrow(descriptor, "uint8", (descriptor.nbytes,))
        return _Borrowed(view), view.tobytes()

    def release(self, handle: Any) -> None:
        handle.view = None

    def close(self) -> None:
        directory = self.registry.directory
        self.reader.close()
        self.arena.close()
        assert self.registry.close() == 0
        leftovers = os.listdir(directory) if os.path.isdir(directory) else []
        with contextlib.suppress(OSError):
            os.rmdir(directory)
        assert not leftovers, f"arena engine left {leftovers}"


class EngineLockstepMachine(RuleBasedStateMachine):
    """The shared rules; a subclass names its engine in `engine_type`."""

    engine_type: ClassVar[type[Engine]]
    leases = Bundle("leases")

    def __init__(self) -> None:
        super().__init__()
        self.ring = ring_spec.initialize_ring(CAPACITY)
        self.engine: Engine = self.engine_type()
        self.serial = 0
        self.payloads: dict[int, tuple[str, bytes]] = {}  # position -> key, payload

    def teardown(self) -> None:
        self.engine.close()

    def deliverable(self) -> list[int]:
        return [f.position for f in self.ring.frames if ring_spec.is_deliverable(f)]

    def _payload_length(self, key: str, size: int | str) -> int:
        if isinstance(size, int):
            return size
        limit = CAPACITY // ADMISSION_DIVISOR
        if size == AT_LIMIT:
            frame_length = limit
        elif size == OVER_LIMIT:
            frame_length = limit + RING_CAPACITY_ALIGNMENT
        else:  # EXACT_FIT: end at the region's end, or as close as one frame may
            frame_length = min(CAPACITY - self.ring.head % CAPACITY, limit)
        return max(frame_length - FRAME_HEADER_LENGTH - ring_spec.compute_key_length(key), 1)

    # -- rules ---------------------------------------------------------------------------

    @rule(key=st.sampled_from(KEYS), size=PAYLOAD_SIZES)
    def put(self, key: str, size: int | str) -> None:
        key = self.engine.key_for(key)
        self.serial += 1
        payload = tagged_payload(f"{self.serial}", self._payload_length(key, size))
        note(f"put({key!r}, {len(payload)} bytes) at head={self.ring.head} tail={self.ring.tail}")
        expected = ring_spec.process_put(self.ring, key, len(payload), payload)
        status, position = self.engine.put(key, payload)
        assert (status, position) == (expected.status, expected.position), (status, expected)
        if status is PutStatus.PUBLISHED:
            assert position is not None
            self.payloads[position] = (key, payload)  # positions never repeat

    def _claim(self, data: st.DataObject, mode: ConsumeMode) -> tuple[int, str, bytes]:
        """A deliverable frame drawn and claimed in the model: its position, key and payload."""
        position = data.draw(st.sampled_from(self.deliverable()), label="position")
        key, payload = self.payloads[position]
        note(f"{mode.name.lower()}(position={position})")
        got = ring_spec.process_get(self.ring, key, position, mode)
        assert (got.status, got.payload) == (GetStatus.DELIVERED, payload)
        return position, key, payload

    @precondition(lambda self: bool(self.deliverable()))
    @rule(data=st.data())
    def copy_out(self, data: st.DataObject) -> None:
        position, key, payload = self._claim(data, ConsumeMode.COPY_OUT)
        assert self.engine.copy_out(key, position) == payload

    @precondition(lambda self: bool(self.deliverable()))
    @rule(target=leases, data=st.data())
    def lease(self, data: st.DataObject) -> object:
        position, key, payload = self._claim(data, ConsumeMode.LEASE)
        handle, seen = self.engine.lease(key, position)
        assert seen == payload
        return (position, handle)

    @rule(held=consumes(leases))
    def release(self, held: tuple[int, Any]) -> None:
        position, handle = held
        note(f"release(position={position})")
        ring_spec.process_release(self.ring, position)
        self.engine.release(handle)

    # -- invariants ----------------------------------------------------------------------

    @invariant()
    def agrees_with_model(self) -> None:
        check_ring(self.ring)
        producer = self.engine.producer
        assert (producer.head, producer.tail) == (self.ring.head, self.ring.tail)
        for frame in self.ring.frames:
            padding = frame.frame_type == PADDING_FRAME_TYPE
            expected = FRAME_STATE_DONE if padding else frame.state
            state = producer.frame_state(frame.position)
            assert state == expected, f"frame at {frame.position}: shared={state}, model={expected}"


class RingEngineMachine(EngineLockstepMachine):
    engine_type = RingEngine


class ArenaEngineMachine(EngineLockstepMachine):
    engine_type = ArenaEngine


ENGINE_MACHINES = (RingEngineMachine, ArenaEngineMachine)

__all__ = [
    "CAPACITY",
    "ENGINE_MACHINES",
    "ArenaEngine",
    "ArenaEngineMachine",
    "Engine",
    "EngineLockstepMachine",
    "RingEngine",
    "RingEngineMachine",
]
