"""Lockstep machine for the registered arena: `spec.ring` (lease mode) + `spec.leases`.

Not a test file (`test_arena_lockstep.py` runs it). The producer puts
payloads into a small `RegisteredArena` (a few KiB, so wraparound, padding
and FULL come early); frames are borrowed in this process or in a second
one, views are derived from them in every way the transport promises to
survive (np.asarray, slices, reshape, dtype views, torch.from_numpy, PyAV
frames), and dropped in any order. After each drop the frame's state in the
shared header must be what the models say: CLAIMED while any view lives,
DONE right after the last one died, in whichever process it lived.
"""

from __future__ import annotations

import contextlib
import os
import uuid

import numpy as np
import torch
from hypothesis import note
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from ..impl.errors import RegistrationError
from ..impl.registered.arena import (
    ArenaFrameDescriptor,
    ArenaReader,
    RegisteredArena,
    arena_key,
)
from ..impl.registered.cuda_driver import SimulatedCudaDriver
from ..impl.registered.registration import Registry
from ..impl.registered.views import lease_statistics
from ..spec import invariants, leases
from ..spec import ring as ring_spec
from ..spec.layout import FRAME_STATE_DONE, PADDING_FRAME_TYPE, compute_frame_length
from ..spec.ring import ConsumeMode, GetStatus, PutStatus
from .arena_worker import DERIVATIONS, TAG_RGB, LocalPlace, RemotePlace

ARENA_CAPACITY = 4096
_remote: RemotePlace | None = None


def remote_place() -> RemotePlace:
    """The one worker process of this test session (started on first use)."""
    global _remote
    if _remote is None:
        _remote = RemotePlace()
    return _remote


def stop_remote_place() -> None:
    global _remote
    if _remote is not None:
        _remote.stop()
        _remote = None


class ArenaMachine(RuleBasedStateMachine):
    use_remote = True

    def __init__(self) -> None:
        super().__init__()
        self.scope = f"t{uuid.uuid4().hex[:12]}"
        self.driver = SimulatedCudaDriver()
        self.registry = Registry(self.scope, self.driver)
        self.arena = RegisteredArena(self.registry, ARENA_CAPACITY)
        self.directory = self.registry.directory
        self.local = LocalPlace(self.directory)
        self.places: dict[str, LocalPlace | RemotePlace] = {"local": self.local}
        if self.use_remote:
            remote = remote_place()
            remote.attach(self.directory)
            self.places["remote"] = remote
        self.ring = ring_spec.initialize_ring(ARENA_CAPACITY)
        self.table = leases.LeaseTable()
        self.reserved = 0  # successful reservations: the arena's key sequence
        self.payloads: dict[
            int, tuple[bytes, tuple[int, int, int]]
        ] = {}  # position -> bytes, shape
        self.descriptors: dict[int, ArenaFrameDescriptor] = {}
        self.view_place: dict[int, str] = {}  # model view id -> place name
        self.view_tag: dict[int, str] = {}  # model view id -> what kind of object it is
        self.local_leases_before = lease_statistics().live
        self.seed = 0

    # -- helpers ------------------------------------------------------------------------

    def payload(self, rows: int, cols: int) -> torch.Tensor:
        self.seed += 1
        generator = torch.Generator().manual_seed(self.seed)
        return torch.randint(0, 256, (rows, cols, 3), dtype=torch.uint8, generator=generator)

    def deliverable(self) -> list[int]:
        return [f.position for f in self.ring.frames if ring_spec.is_deliverable(f)]

    def expected_put(self, nbytes: int) -> tuple[PutStatus, str]:
        """What the ring model says about a put, without applying it (reclaim aside)."""
        key = arena_key(self.reserved)
        frame_length = compute_frame_length(len(key), nbytes)
        if not ring_spec.is_admitted(self.ring.capacity, len(key), frame_length):
            return PutStatus.NOT_ADMITTED, key
        ring_spec.process_reclaim(self.ring)
        if not ring_spec.compute_has_space(
            self.ring.capacity, self.ring.head, self.ring.tail, frame_length
        ):
            return PutStatus.FULL, key
        return PutStatus.PUBLISHED, key

    # -- rules ---------------------------------------------------------------------------

    @rule(rows=st.integers(1, 12), cols=st.integers(1, 16), copy_fails=st.booleans())
    def put(self, rows: int, cols: int, copy_fails: bool) -> None:
        src = self.payload(rows, cols)
        nbytes = src.numel()
        note(f"put({rows}x{cols}x3 = {nbytes} bytes, copy fails={copy_fails})")
        status, key = self.expected_put(nbytes)
        if copy_fails:
            self.driver.fail_first("copy_to_host", "cudaErrorLaunchFailure")
        try:
            got = self.arena.put(src)
        except RegistrationError as error:
            assert copy_fails and status is PutStatus.PUBLISHED, f"unexpected copy failure: {error}"
            assert error.cuda_error == "cudaErrorLaunchFailure"
            self.reserved += 1  # the reservation took a key, then was aborted
            return
        finally:
            self.driver.clear_faults()
        if isinstance(got, PutStatus):
            assert got is status, f"arena answered {got}, model {status}"
            return
        assert status is PutStatus.PUBLISHED and not copy_fails, f"arena published, model {status}"
        self.reserved += 1
        result = ring_spec.process_put(self.ring, key, nbytes, key)
        assert result.status is PutStatus.PUBLISHED
        assert (got.position, got.key) == (result.position, key), f"arena {got}, model {result}"
        assert result.position is not None
        self.payloads[result.position] = (bytes(src.numpy()), (rows, cols, 3))
        self.descriptors[result.position] = got

    @rule(nbytes=st.integers(0, 1200))
    def reserve_then_abort(self, nbytes: int) -> None:
        note(f"reserve({nbytes}) then abort")
        status, _ = self.expected_put(nbytes)
        got = self.arena.reserve(nbytes)
        if isinstance(got, PutStatus):
            assert got is status
        else:
            assert status is PutStatus.PUBLISHED
            self.reserved += 1
            assert self.arena.abort() == 1

    @precondition(lambda self: bool(self.deliverable()))
    @rule(data=st.data())
    def borrow(self, data: st.DataObject) -> None:
        position = data.draw(st.sampled_from(self.deliverable()), label="position")
        place = data.draw(st.sampled_from(sorted(self.places)), label="place")
        note(f"borrow(position={position}) in {place}")
        got = ring_spec.process_get(
            self.ring, self.descriptors[position].key, position, ConsumeMode.LEASE
        )
        assert got.status is GetStatus.DELIVERED
        _, view_id = leases.process_borrow(self.table, leases.SOURCE_ARENA_FRAME, position)
        payload, shape = self.payloads[position]
        seen = self.places[place].borrow(view_id, self.descriptors[position], shape)
        assert seen == payload[: len(seen)], (
            f"borrowed view reads other bytes at position={position}"
        )
        self.view_place[view_id] = place
        self.view_tag[view_id] = TAG_RGB

    @precondition(lambda self: bool(self.deliverable()))
    @rule(data=st.data())
    def copy_out(self, data: st.DataObject) -> None:
        position = data.draw(st.sampled_from(self.deliverable()), label="position")
        note(f"copy out(position={position})")
        got = ring_spec.process_get(
            self.ring, self.descriptors[position].key, position, ConsumeMode.COPY_OUT
        )
        assert got.status is GetStatus.DELIVERED
        payload, shape = self.payloads[position]
        copied = self.local.reader(self.arena.name).copy(self.descriptors[position], "uint8", shape)
        assert copied.tobytes() == payload
        assert self.arena.frame_state(position) == FRAME_STATE_DONE

    def derivable(self) -> list[int]:
        return sorted(v for v in self.table.views if DERIVATIONS[self.view_tag[v]])

    @precondition(lambda self: bool(self.derivable()))
    @rule(data=st.data())
    def derive(self, data: st.DataObject) -> None:
        parent = data.draw(st.sampled_from(self.derivable()), label="parent")
        kinds = DERIVATIONS[self.view_tag[parent]]
        kind = data.draw(st.sampled_from(sorted(kinds)), label="kind")
        place = self.view_place[parent]
        note(f"derive {kind} from view={parent} in {place}")
        view_id = leases.process_derive(self.table, parent, kind)
        seen = self.places[place].derive(view_id, parent, kind)
        position = leases.get_lease_of(self.table, view_id).position
        assert position is not None
        payload, _ = self.payloads[position]
        assert seen == payload[: len(seen)], f"derived {kind} reads other bytes"
        self.view_place[view_id] = place
        self.view_tag[view_id] = kinds[kind]

    @precondition(lambda self: bool(self.table.views))
    @rule(data=st.data())
    def drop(self, data: st.DataObject) -> None:
        view_id = data.draw(st.sampled_from(sorted(self.table.views)), label="view")
        place = self.view_place.pop(view_id)
        self.view_tag.pop(view_id)
        note(f"drop view={view_id} in {place}")
        result = leases.process_drop(self.table, view_id)
        self.places[place].drop(view_id)
        position = self.table.leases[result.lease_id].position
        assert position is not None
        if result.released:
            ring_spec.process_release(self.ring, position)
        # Right after the drop, in the producer's own mapping:
        expected = ring_spec.get_frame_at(self.ring, position)
        if expected is not None:
            state = self.arena.frame_state(position)
            assert state == expected.state, (
                f"frame at {position}: shared state={state}, model={expected.state} after drop in {place}"
            )

    @rule()
    def reclaim(self) -> None:
        note("reclaim()")
        expected = ring_spec.process_reclaim(self.ring)
        assert self.arena.reclaim() == expected

    # -- invariants --------------------------------------------------------------------------

    @invariant()
    def models_hold(self) -> None:
        invariants.check_ring(self.ring)
        invariants.check_leases(self.table)
        invariants.check_leases_against_ring(self.table, self.ring)

    @invariant()
    def shared_headers_agree(self) -> None:
        assert (self.arena.head, self.arena.tail) == (self.ring.head, self.ring.tail)
        for frame in self.ring.frames:
            state = self.arena.frame_state(frame.position)
            expected = FRAME_STATE_DONE if frame.frame_type == PADDING_FRAME_TYPE else frame.state
            assert state == expected, (
                f"frame at {frame.position}: shared state={state}, model={expected}"
            )
        local_live = sum(
            1
            for lease in leases.get_live_leases(self.table)
            if any(self.view_place[v] == "local" for v in lease.live_views)
        )
        assert lease_statistics().live - self.local_leases_before == local_live

    def teardown(self) -> None:
        for place in self.places.values():
            place.reset()
        self.arena.close()
        retained = self.registry.close()
        assert retained == 0
        leftovers = os.listdir(self.directory) if os.path.isdir(self.directory) else []
        with contextlib.suppress(OSError):
            os.rmdir(self.directory)
        assert not leftovers, f"arena machine left {leftovers}"
        assert lease_statistics().live == self.local_leases_before


def borrow_in_reader(
    directory: str, descriptor: ArenaFrameDescriptor, shape: tuple[int, ...]
) -> np.ndarray:
    """One borrowed view through a fresh reader (closed at once; the view keeps the mapping)."""
    with ArenaReader(directory, descriptor.arena) as reader:
        return reader.borrow(descriptor, "uint8", shape)


__all__ = [
    "ARENA_CAPACITY",
    "ArenaMachine",
    "borrow_in_reader",
    "remote_place",
    "stop_remote_place",
]
