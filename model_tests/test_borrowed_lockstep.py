"""Lockstep: borrowed gets (`spec.borrowing` over `spec.connector`) next to a real `Connector`.

Every rule applies one operation to the model and to one real connector
(which puts and gets, as in the connector machine) and compares: put
route; get status, route, payload tag and whether the value holds its
frame; what an eager release answers. After every step the model's
invariants hold (`check_connector`, `check_borrows`) and the two agree on
the ring's head, tail and CLAIMED frames and on the live borrowed leases
(`health().borrowed_live`, `borrowed_ring_frames`).

A value is *large* (one float32 array of at least the own-area threshold,
borrowed: the model's ``held=True``) or *small* (bytes, copied: the lease
ends at the get). The model's root view is the delivery's value; a derived
view is a slice of the array the caller keeps; dropping one is `del`.
"""

from __future__ import annotations

import gc
from collections import Counter
from typing import Any

import numpy as np
from hypothesis import HealthCheck, note, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from shmring.fault_injection.kit.machines import one_in
from shmring.impl import codec
from shmring.impl.connector import Connector, Delivery, GetStatus, Route
from shmring.spec import borrowing, invariants
from shmring.spec import connector as connector_spec
from shmring.spec.connector import ConnectorGetStatus
from shmring.spec.layout import FRAME_STATE_CLAIMED
from shmring.spec.leases import VIEW_SLICE
from shmring.spec.ring import get_deliverable_frame

EDGE = ("src", "dst")
KEYS = ("k0", "k1", "k2")
CAPACITY = 1024 * 1024  # frames up to 256 KiB; a few large values fill it
BUDGET = 64 * 1024 * 1024
LEAF = codec.SHARED_LEAF_LIMIT // 4  # float32 elements of the smallest borrowed leaf
# (kind, size): large values in float32 elements (ring, or fallback past 256 KiB); small in bytes.
SIZES = st.one_of(
    st.tuples(st.just("large"), st.sampled_from((LEAF, 2 * LEAF, 3 * LEAF, 3 * LEAF, 5 * LEAF))),
    st.tuples(st.just("large"), st.sampled_from((2 * LEAF, 3 * LEAF))),
    st.tuples(st.just("small"), st.sampled_from((16, 900, 3000))),
)


# What a run must reach, counted by the rules (a change that makes one unreachable fails).
LABELS = (
    "borrowed from a ring",
    "borrowed from a segment",
    "put took the fallback while a borrow held the ring",
    "release kept by a slice",
    "release gave the frame back",
)
REACHED: Counter[str] = Counter()


def _value(kind: str, size: int, tag: int) -> Any:
    if kind == "large":
        return {"a": np.full(size, float(tag), dtype=np.float32), "tag": tag}
    return {"b": bytes([tag % 256]) * size, "tag": tag}


class BorrowedGetMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.conn: Connector | None = None
        self.model = connector_spec.initialize_connector(CAPACITY, BUDGET)
        self.borrows = borrowing.BorrowState()
        self.tags = 0
        self.kinds: dict[int, str] = {}  # payload tag -> kind
        self.roots: dict[int, Delivery] = {}  # model root view id -> the delivery holding it
        self.derived: dict[int, Any] = {}  # model derived view id -> the kept slice

    @initialize(scope=st.uuids())
    def setup(self, scope: Any) -> None:
        self.conn = Connector(
            f"b{scope.hex[:12]}",
            ring_capacity=CAPACITY,
            fallback_budget=BUDGET,
            pool_budget_bytes=0,
        )

    def teardown(self) -> None:
        self.roots.clear()
        self.derived.clear()
        if self.conn is not None:
            self.conn.close()
        gc.collect()

    def _connector(self) -> Connector:
        assert self.conn is not None
        return self.conn

    # -- rules ---------------------------------------------------------------

    @rule(key=st.sampled_from(KEYS), shape=SIZES)
    def put(self, key: str, shape: tuple[str, int]) -> None:
        kind, size = shape
        self.tags += 1
        tag = self.tags
        self.kinds[tag] = kind
        value = _value(kind, size, tag)
        nbytes = codec.prepare(value).nbytes
        note(f"put {key} {kind} {size} tag={tag} nbytes={nbytes}")
        expected = connector_spec.process_put(self.model, EDGE, key, nbytes, tag)
        descriptor = self._connector().put(EDGE, key, value)
        assert descriptor.route is expected.route, (descriptor, expected)
        if descriptor.route is Route.FALLBACK and self.borrows.frames and nbytes < CAPACITY // 4:
            REACHED["put took the fallback while a borrow held the ring"] += 1

    def _deliverable_kind(self, key: str) -> str | None:
        ring = self.model.rings.get(EDGE)
        frame = None if ring is None else get_deliverable_frame(ring, key)
        if frame is not None:
            return self.kinds[frame.payload]  # type: ignore[index]
        segment = self.model.fallback.get((EDGE, key))
        return self.kinds[segment.payload] if segment is not None else None  # type: ignore[index]

    @rule(key=st.sampled_from(KEYS))
    def borrowed_get(self, key: str) -> None:
        held = self._deliverable_kind(key) == "large"
        expected = borrowing.process_borrowed_get(self.model, self.borrows, EDGE, key, held=held)
        got = self._connector().get(EDGE, key, borrow=True)
        note(f"borrowed get {key}: {expected.result.status} {got.status}")
        self._compare(expected.result, got)
        if got.status is GetStatus.DELIVERED:
            assert got.borrowed is held
            if held:
                REACHED[f"borrowed from a {'ring' if got.route is Route.RING else 'segment'}"] += 1
            if expected.view_id is not None:
                self.roots[expected.view_id] = got

    @rule(key=st.sampled_from(KEYS), shape=SIZES)
    def put_then_borrow(self, key: str, shape: tuple[str, int]) -> None:
        self.put(key, shape)
        self.borrowed_get(key)

    @rule(key=st.sampled_from(KEYS))
    def owned_get(self, key: str) -> None:
        expected = connector_spec.process_get(self.model, EDGE, key)
        got = self._connector().get(EDGE, key)
        self._compare(expected, got)
        assert not got.borrowed

    def _compare(self, expected: connector_spec.ConnectorGetResult, got: Delivery) -> None:
        if expected.status is ConnectorGetStatus.DELIVERED:
            assert got.status is GetStatus.DELIVERED, got
            assert got.route is expected.route
            assert got.value["tag"] == expected.payload
            if "a" in got.value:
                assert float(got.value["a"][-1]) == float(expected.payload)  # type: ignore[arg-type]
        else:
            assert got.status is GetStatus.NOT_FOUND, got

    @precondition(lambda self: bool(self.roots))
    @rule(data=st.data())
    def keep_a_slice(self, data: st.DataObject) -> None:
        root = data.draw(st.sampled_from(sorted(self.roots)))
        delivery = self.roots[root]
        if delivery.value is None:
            return  # released already: the model's root view is gone too
        view = borrowing.process_borrowed_derive(self.borrows, root, VIEW_SLICE)
        self.derived[view] = delivery.value["a"][1:]

    @precondition(lambda self: bool(self.roots))
    @rule(data=st.data(), now=one_in(3))
    def release(self, data: st.DataObject, now: bool) -> None:
        if not now:
            return  # borrows pile up: the ring fills behind them
        root = data.draw(st.sampled_from(sorted(self.roots)))
        delivery = self.roots.pop(root)
        expected = borrowing.process_borrowed_release(self.model, self.borrows, root)
        assert delivery.release() is expected
        REACHED["release gave the frame back" if expected else "release kept by a slice"] += 1
        note(f"release root={root}: {expected}")

    @precondition(lambda self: bool(self.derived))
    @rule(data=st.data())
    def drop_slice(self, data: st.DataObject) -> None:
        view = data.draw(st.sampled_from(sorted(self.derived)))
        del self.derived[view]
        borrowing.process_borrowed_drop(self.model, self.borrows, view)

    @rule(key=st.sampled_from(KEYS))
    def cleanup(self, key: str) -> None:
        assert self._connector().cleanup(key) == connector_spec.process_cleanup(self.model, key)

    # -- invariants ----------------------------------------------------------

    @invariant()
    def agrees_with_model(self) -> None:
        REACHED["steps"] += 1
        if self.conn is None:
            return
        invariants.check_connector(self.model)
        invariants.check_borrows(self.model, self.borrows)
        health = self.conn.health()
        assert health.borrowed_live == borrowing.get_live_borrows(self.borrows)
        assert health.borrowed_ring_frames == len(self.borrows.frames)
        ring, channel = self.model.rings.get(EDGE), self.conn.ring(EDGE)
        if ring is not None and channel is not None:
            stats = channel.statistics()
            assert (stats.head, stats.tail) == (ring.head, ring.tail)
            claimed = sum(frame.state == FRAME_STATE_CLAIMED for frame in ring.frames)
            assert stats.claimed_frames == claimed


def test_borrowed_gets_agree_with_the_model() -> None:
    REACHED.clear()
    run_state_machine_as_test(
        BorrowedGetMachine,
        settings=settings(
            max_examples=40,
            stateful_step_count=40,
            deadline=None,
            derandomize=True,
            database=None,
            suppress_health_check=list(HealthCheck),
        ),
    )
    missing = [label for label in LABELS if REACHED[label] == 0]
    assert not missing, f"never reached: {missing}; reached: {dict(REACHED)}"
    print(f"\nborrowed lockstep: {dict(REACHED)}")
