"""Lockstep machine: the ring model (`spec.ring`) next to the real ring channel.

Every rule applies one operation to the model and to a real `RingChannel`
(producer) and `RingReader` (a second mapping of the same file, as another
process would have), and compares the answers field for field: put status,
position, frame length, padding and retired count; get status, position and
payload bytes; cancel counts. After every step the model's invariants are
checked and the model's head and tail are compared with the ring header in
shared memory, and its deliverable and claimed frame counts with a walk of
the real frames. Each of the two readers (they compete for the same frames)
has the model's index next to it (`spec.index.ReaderIndex`, stepped by
`process_indexed_get` at each of its gets by key): after every step the
reader's real index equals the model's, entry for entry, and both pass
`check_reader_index` against the model ring (sound, complete below what the
reader has seen), through wraparound, re-puts, cancels and the other
reader's claims.

Capacities are small (4096..8192 bytes) and payloads up to ~1100 bytes, with
draws that aim at the exact end of the data region and at the admission
limit, so wraparound, exact fit, full and not-admitted happen within a few
steps. Campaigns import this module (`shmring check` runs
`RingLockstepMachine` under the "ring-long" profile); tests run it under
"ring-ci".
"""

from __future__ import annotations

import dataclasses
import shutil
import uuid

from hypothesis import note
from hypothesis import strategies as st
from hypothesis.control import should_note
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    initialize,
    invariant,
    multiple,
    precondition,
    rule,
)

from ..fault_injection.kit.machines import Tally, register_profiles
from ..fault_injection.kit.payloads import tagged_payload
from ..impl.directory import (
    ensure_deployment_directory,
    remove_deployment_directory_if_empty,
)
from ..impl.names import current_producer_identity, ring_path
from ..impl.ring.borrow import Lease
from ..impl.ring.producer import RingChannel
from ..impl.ring.reader import RingReader
from ..impl.ring.results import ReceiveStatus
from ..spec import index as index_spec
from ..spec import ring as ring_spec
from ..spec.invariants import check_reader_index, check_ring
from ..spec.layout import (
    ADMISSION_DIVISOR,
    FRAME_HEADER_LENGTH,
    FRAME_STATE_CLAIMED,
    MIN_RING_CAPACITY,
    RING_CAPACITY_ALIGNMENT,
)
from ..spec.ring import ConsumeMode, GetStatus, PutStatus

KEYS = ("a", "b", "é", "req_0_1", "req_0_12", "req_0_1x", "request_0_0")
FILLER_KEY = "filler"  # published and claimed in one rule; matches no prefix
PREFIXES = ("req_0_", "req_0_1", "req_", "request_0_", "a", "")

EVENT_LABELS = (
    "wrap",
    "exact fit",
    "full",
    "not admitted",
    "stale descriptor",
    "cancel after wrap",
    "lease released out of order",
)
TALLY = Tally()  # labels reached and rules run in this process

CI_PROFILE = "ring-ci"
LONG_PROFILE = "ring-long"
register_profiles(
    CI_PROFILE,
    LONG_PROFILE,
    ci={"max_examples": 100, "stateful_step_count": 80},
    long={"max_examples": 2000, "stateful_step_count": 100},
)

# Payload size draws: a byte count, or a target the rule turns into one.
EXACT_FIT = "exact fit"  # the frame ends exactly at the end of the data region
AT_LIMIT = "at limit"  # the largest admitted frame
OVER_LIMIT = "over limit"  # one alignment step past the admission limit
PAYLOAD_SIZES = st.one_of(
    st.integers(0, 1100),
    st.sampled_from([EXACT_FIT, EXACT_FIT, AT_LIMIT, OVER_LIMIT]),
)
# Large frames fill a small ring in a handful of puts.
LARGE_PAYLOAD_SIZES = st.one_of(
    st.integers(600, 1100),
    st.sampled_from([EXACT_FIT, AT_LIMIT]),
)


PUT_RESULT_FIELDS = tuple(field.name for field in dataclasses.fields(ring_spec.PutResult))


def _model_put_fields(result: ring_spec.PutResult) -> tuple[object, ...]:
    # The model's fields in declaration order, as the channel's outcome tuple
    # lists them (PutResult's fields are flat: dataclasses.astuple's deep copy
    # would return the same values, and costs a copy per put).
    return tuple(getattr(result, name) for name in PUT_RESULT_FIELDS)


def _model_receive_status(status: GetStatus) -> ReceiveStatus:
    return ReceiveStatus(status.value)


@dataclasses.dataclass(frozen=True)
class Descriptor:
    """What a put handed out: the key, the exact position, and the payload published."""

    key: str
    position: int
    payload: bytes


class RingLockstepMachine(RuleBasedStateMachine):
    descriptors = Bundle("descriptors")
    leases = Bundle("leases")

    def __init__(self) -> None:
        super().__init__()
        self.model: ring_spec.RingState | None = None
        self.channel: RingChannel | None = None
        self.reader: RingReader | None = None
        # A second mapping of the same file: its index goes stale whenever the
        # first reader claims, which the model does not care about.
        self.other_reader: RingReader | None = None
        self.directory: str | None = None
        # The model's index of each reader (`spec.index`), keyed by `other`.
        self.indexes = {False: index_spec.ReaderIndex(), True: index_spec.ReaderIndex()}
        self.serial = 0
        self.outstanding: set[int] = set()  # positions of leases not yet released
        # What the model answered, counted: the producer's and each reader's
        # counters must say the same at every step (a counter seen only at
        # zero passes a mutant that counts down).
        self.put_outcomes = {status: 0 for status in PutStatus}
        self.retired = 0  # frames puts (of a key again), cancels and close retired
        self.claims = {False: 0, True: 0}  # frames each reader claimed
        # Whether Hypothesis shows this example's notes (the final replay of a
        # failing example, or a verbose run). Notes are only read then, so the
        # other examples skip formatting them.
        self.noting = should_note()

    # -- setup ----------------------------------------------------------------------

    @initialize(units=st.integers(0, MIN_RING_CAPACITY // RING_CAPACITY_ALIGNMENT))
    def open_ring(self, units: int) -> None:
        capacity = MIN_RING_CAPACITY + units * RING_CAPACITY_ALIGNMENT
        if self.noting:
            note(f"ring of capacity={capacity}")
        self.directory = ensure_deployment_directory(f"m{uuid.uuid4().hex[:12]}")
        path = ring_path(self.directory, "src", "dst", current_producer_identity())
        self.model = ring_spec.initialize_ring(capacity)
        self.channel = RingChannel.create(path, capacity)
        self.reader = RingReader.attach(path)
        self.other_reader = RingReader.attach(path)

    def teardown(self) -> None:
        try:
            for reader in (self.reader, self.other_reader):
                if reader is not None:
                    reader.close()
            if self.channel is not None:
                self.channel.close()
        finally:
            if self.directory is not None and not remove_deployment_directory_if_empty(
                self.directory
            ):
                shutil.rmtree(self.directory, ignore_errors=True)
                raise AssertionError(f"ring directory not empty after close: {self.directory}")

    # -- helpers ----------------------------------------------------------------------

    @property
    def ring(self) -> ring_spec.RingState:
        assert self.model is not None
        return self.model

    def _payload_length(self, key: str, size: int | str) -> int:
        if isinstance(size, int):
            return size
        capacity = self.ring.capacity
        key_length = ring_spec.compute_key_length(key)
        limit = capacity // ADMISSION_DIVISOR
        if size == AT_LIMIT:
            frame_length = limit
        elif size == OVER_LIMIT:
            frame_length = limit + RING_CAPACITY_ALIGNMENT
        else:  # EXACT_FIT: end at the region's end, or get as close as one frame may
            frame_length = min(capacity - self.ring.head % capacity, limit)
        return max(frame_length - FRAME_HEADER_LENGTH - key_length, 0)

    def _indexed_get(self, key: str, other: bool, mode: ConsumeMode) -> ring_spec.GetResult:
        """The model's get by key through the reader's model index, checked against `process_get`.

        `spec.index.process_indexed_get` answers what `spec.ring.process_get`
        would: the frame `get_deliverable_frame` names (looked up before the
        step, which claims it), or NOT_FOUND.
        """
        frame = ring_spec.get_deliverable_frame(self.ring, key)
        result = index_spec.process_indexed_get(self.ring, self.indexes[other], key, mode)
        if frame is None:
            assert result.status is GetStatus.NOT_FOUND, (key, result)
        else:
            assert (result.status, result.position) == (GetStatus.DELIVERED, frame.position), (
                key,
                result,
                frame,
            )
        return result

    def _check_delivery(
        self, expected: ring_spec.GetResult, got_status: ReceiveStatus, got_position: int | None
    ) -> None:
        assert got_status is _model_receive_status(expected.status), (expected, got_status)
        assert got_position == expected.position, (expected.position, got_position)

    # -- rules ----------------------------------------------------------------------------

    @rule(target=descriptors, key=st.sampled_from(KEYS), size=PAYLOAD_SIZES)
    def put(self, key: str, size: int | str) -> object:
        return self._put(key, size)

    @rule(target=descriptors, key=st.sampled_from(KEYS), size=LARGE_PAYLOAD_SIZES)
    def put_large(self, key: str, size: int | str) -> object:
        return self._put(key, size)

    @rule(size=LARGE_PAYLOAD_SIZES)
    def put_and_take(self, size: int | str) -> None:
        # Move head along (a filler frame published and claimed at once), so
        # wraparound and the states after it come early in a run.
        if isinstance(self._put(FILLER_KEY, size), Descriptor):
            self.get(FILLER_KEY, other=False)

    def _put(self, key: str, size: int | str) -> object:
        TALLY.step("put")
        assert self.channel is not None
        ring = self.ring
        payload_length = self._payload_length(key, size)
        self.serial += 1
        payload = tagged_payload(f"{self.serial}", payload_length)
        if self.noting:
            note(f"put({key!r}, {payload_length} bytes) at head={ring.head} tail={ring.tail}")
        expected = ring_spec.process_put(ring, key, payload_length, payload)
        outcome = self.channel.put(key, payload)
        if self.noting:
            note(f"  -> {outcome}")
        assert tuple(outcome) == _model_put_fields(expected), (outcome, expected)
        self.put_outcomes[expected.status] += 1
        self.retired += expected.retired  # a put of a key retires its earlier frame
        if outcome.status is PutStatus.NOT_ADMITTED:
            TALLY.label("not admitted")
        elif outcome.status is PutStatus.FULL:
            TALLY.label("full")
        elif outcome.status is PutStatus.PUBLISHED:
            assert outcome.position is not None
            offset = outcome.position % ring.capacity
            if outcome.padding or (offset == 0 and outcome.position > 0):
                TALLY.label("wrap")
            if offset + outcome.frame_length == ring.capacity:
                TALLY.label("exact fit")
            return Descriptor(key, outcome.position, payload)
        return multiple()

    def _pick_reader(self, other: bool) -> RingReader:
        reader = self.other_reader if other else self.reader
        assert reader is not None
        return reader

    @rule(key=st.sampled_from(KEYS), other=st.booleans())
    def get(self, key: str, other: bool) -> None:
        TALLY.step("get")
        if self.noting:
            note(f"get({key!r}){' by the other reader' if other else ''}")
        expected = self._indexed_get(key, other, ConsumeMode.COPY_OUT)
        got = self._pick_reader(other).get(key)
        if self.noting:
            note(f"  -> {got.status.value} at {got.position}")
        self._check_delivery(expected, got.status, got.position)
        if expected.status is GetStatus.DELIVERED:
            self.claims[other] += 1
            assert got.payload == expected.payload

    @rule(descriptor=descriptors, other_key=st.sampled_from((None, *KEYS)), other=st.booleans())
    def get_by_descriptor(self, descriptor: Descriptor, other_key: str | None, other: bool) -> None:
        TALLY.step("get_by_descriptor")
        key = descriptor.key if other_key is None else other_key
        if self.noting:
            note(
                f"get({key!r}, position={descriptor.position}){' by the other reader' if other else ''}"
            )
        deliverable = ring_spec.get_deliverable_frame(self.ring, key)
        expected = index_spec.process_descriptor_get(
            self.ring, self.indexes[other], key, descriptor.position
        )
        # The index hides nothing the ring would deliver at that position
        # (here the re-put retires the older frame at once: no busy lock).
        named = deliverable is not None and deliverable.position == descriptor.position
        assert (expected.status is GetStatus.DELIVERED) == named, (expected, deliverable)
        got = self._pick_reader(other).get(key, descriptor.position)
        if self.noting:
            note(f"  -> {got.status.value}")
        self._check_delivery(expected, got.status, got.position)
        self.claims[other] += expected.status is GetStatus.DELIVERED
        if expected.status is GetStatus.STALE:
            TALLY.label("stale descriptor")
        else:
            assert got.payload == expected.payload == descriptor.payload

    @rule(target=leases, key=st.sampled_from(KEYS))
    def lease(self, key: str) -> object:
        return self._lease(key)

    @precondition(
        lambda self: self.model is not None and bool(ring_spec.get_deliverable_keys(self.model))
    )
    @rule(target=leases, data=st.data())
    def lease_deliverable(self, data: st.DataObject) -> object:
        # Aim at a key the model can deliver, so several leases are held at once.
        key = data.draw(st.sampled_from(sorted(ring_spec.get_deliverable_keys(self.ring))))
        return self._lease(key)

    def _lease(self, key: str) -> object:
        TALLY.step("lease")
        assert self.reader is not None
        if self.noting:
            note(f"lease({key!r})")
        expected = self._indexed_get(key, False, ConsumeMode.LEASE)
        got = self.reader.get(key, mode=ConsumeMode.LEASE)
        if self.noting:
            note(f"  -> {got.status.value} at {got.position}")
        self._check_delivery(expected, got.status, got.position)
        if got.status is not ReceiveStatus.DELIVERED:
            return multiple()
        self.claims[False] += 1
        lease: Lease = got.payload
        assert bytes(lease.view) == expected.payload
        self.outstanding.add(lease.position)
        return lease

    @rule(lease=consumes(leases))
    def release(self, lease: Lease) -> None:
        TALLY.step("release")
        if self.noting:
            note(f"release(position={lease.position})")
        if any(position < lease.position for position in self.outstanding):
            TALLY.label("lease released out of order")
        ring_spec.process_release(self.ring, lease.position)
        lease.release()
        self.outstanding.discard(lease.position)

    @rule(key=st.sampled_from(KEYS))
    def cancel(self, key: str) -> None:
        TALLY.step("cancel")
        assert self.channel is not None
        if self.noting:
            note(f"cancel({key!r})")
        wrapped = self.ring.head > self.ring.capacity
        expected = ring_spec.process_cancel(self.ring, key)
        assert self.channel.cancel(key) == expected
        self.retired += expected
        if wrapped and expected:
            TALLY.label("cancel after wrap")

    @rule(prefix=st.sampled_from(PREFIXES))
    def cancel_prefix(self, prefix: str) -> None:
        TALLY.step("cancel_prefix")
        assert self.channel is not None
        if self.noting:
            note(f"cancel_prefix({prefix!r})")
        expected = ring_spec.process_cancel_prefix(self.ring, prefix)
        assert self.channel.cancel_prefix(prefix) == expected
        self.retired += expected

    @precondition(lambda self: self.model is not None and self.model.head > 0)
    @rule(draw=st.integers(0, 7))
    def close(self, draw: int) -> None:
        # One draw in eight closes, so most runs stay open long enough to wrap.
        if draw:
            return
        TALLY.step("close")
        assert self.channel is not None
        if self.noting:
            note("close()")
        expected = ring_spec.process_close(self.ring)
        assert self.channel.close() == expected
        self.retired += expected

    # -- invariants --------------------------------------------------------------------

    @invariant()
    def agrees_with_model(self) -> None:
        if self.model is None:
            return
        ring = self.model
        check_ring(ring)
        assert self.channel is not None and self.reader is not None
        assert (self.channel.head, self.channel.tail) == (ring.head, ring.tail)
        shared = self.reader.statistics()  # read from the ring file
        assert (shared.head, shared.tail) == (ring.head, ring.tail), (shared, ring)
        assert shared.published_frames == len(ring_spec.get_deliverable_keys(ring))
        claimed = sum(frame.state == FRAME_STATE_CLAIMED for frame in ring.frames)
        assert shared.claimed_frames == claimed
        assert shared.closed == ring.closed
        own = self.channel.statistics()
        counted = (own.puts, own.refused_not_admitted, own.refused_full, own.retired)
        outcomes = self.put_outcomes
        expected_counts = (
            outcomes[PutStatus.PUBLISHED],
            outcomes[PutStatus.NOT_ADMITTED],
            outcomes[PutStatus.FULL],
            self.retired,
        )
        assert counted == expected_counts, (own, outcomes, self.retired)
        for other in (False, True):
            assert self._pick_reader(other).statistics().gets == self.claims[other], other
        for other, model_index in self.indexes.items():
            real = self._pick_reader(other).index_snapshot()
            check_reader_index(ring, model_index)
            assert (real.scanned_to, real.entries) == (
                model_index.scanned_to,
                model_index.entries,
            ), (
                other,
                real,
                model_index,
            )


__all__ = [
    "CI_PROFILE",
    "EVENT_LABELS",
    "LONG_PROFILE",
    "TALLY",
    "RingLockstepMachine",
]
