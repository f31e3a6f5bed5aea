"""Lockstep machine (b): the connector model (`spec.connector`) next to a real `Connector`.

Every rule applies one operation to the model and to one real connector
(which both puts and gets, so its own counters are the model's), and
compares the answers: put status, route and ring position; get status,
route and payload tag; cleanup counts; refusals (back-pressure) against
`BackPressureError`; a closed connector's CLOSED against `ClosedError`.
After every step the model's invariants hold (`check_connector`) and the
model agrees with the implementation on the health counters, the live
fallback bytes charged to the budget, which edges have a ring and which
failed, and each ring's head and tail.

Ring setup failures are planned through the connector's OS seam
(`FaultyOs`): the first put on an edge may fail the ring file's open
(ENOSPC, EPERM), its fallocate, the marker's open or the stamp's lock; the
model gets `ring_setup_ok=False` for exactly those puts, and the rule checks
the planned fault fired. A fallback put may also meet ENOSPC, which the
model does not know: the rule checks that the put raised `NoSpaceError` and
that nothing changed (the model is not stepped).

A second connector in the same process (`sibling`, opened by a rule) is a
producer of its own: it publishes `SIBLING_KEYS` on the same edges, on its
own rings, and has its own model connector; the main connector gets those
keys (by key and by descriptor) from the sibling's rings or segments, so the
sibling's frames are compared against the sibling's model. Each connector's
puts and refusals agree with its model; the gets and bytes agree summed over
both (the model counts a get at the producer, the implementation at the
receiver). Closing the sibling leaves the main connector working, and the
main connector's next scan unmaps the sibling's rings.

Publication cohorts (issue 27, `spec.cohort`): a rule opens a cohort on an
edge (the real connector's ``publication_cohort`` entered, the model's
`process_cohort_open`), another leaves it (exited: the outermost leave
commits); puts in between are members on whichever route takes them, and
every get compares the model's NOT_FOUND for a pending member with the
implementation's, by key and by descriptor.

Capacities are small (4096 or 8192 bytes, or 0: rings disabled) and payloads up to 3000 bytes, so
"not admitted", "full", wraparound and the budget are reached in a few steps.

The pool (issue 13) is drawn at setup: none, a tiny one (two slots of the
small class: exhaustion and eviction come fast) or a roomy one, with
classes of 4 and 8 KiB, so a payload the ring does not admit goes to a pool
slot (route POOL), to the fallback when no slot is to be had or the ring is
full for its reference, and sizes just over the 4 KiB and the 8 KiB class's
capacity (class + `layout.POOL_CLASS_HEADROOM`) meet the larger class and no
class at all.
"""

from __future__ import annotations

import copy
import errno
import itertools
import os
import uuid
from typing import Any

from hypothesis import HealthCheck, note
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    multiple,
    precondition,
    rule,
)

from ..fault_injection.kit.machines import Tally, rarely, register_profiles
from ..fault_injection.kit.payloads import payload_tag, tagged_payload
from ..fault_injection.kit.seams import FaultyOs
from ..impl import codec
from ..impl.connector import Connector, FallbackDescriptor, GetStatus, RingDescriptor
from ..impl.errors import BackPressureError, ClosedError, NoSpaceError
from ..spec import cohort as cohort_spec
from ..spec import connector as connector_spec
from ..spec import invariants
from ..spec import ring as ring_spec
from ..spec.connector import (
    ConnectorGetStatus,
    ConnectorPutStatus,
    Route,
)
from ..spec.layout import compute_slot_capacity
from ..spec.pool import compute_slot_charge
from ..spec.ring import PutStatus

POOL_MIN_CLASS = 4096
POOL_MAX_CLASS = 8192
CAPACITIES = (0, 4096, 4096, 8192)  # 0: rings disabled, the fallback carries all
BUDGETS = (0, 1500, 9000, 1 << 20, 1 << 20)  # nothing fits; two segments (a page each); plenty
EDGES = (("a", "b"), ("a", "c"))
KEYS = ("k0", "k1", "k2", "req_1_0", "req_1_12", "req_1_3x", "request_1_0")
PREFIXES = ("req_1_", "req_1_1", "req_", "request_1_", "k", "")
SIBLING_KEYS = ("s0", "s1", "s_2")  # no prefix in PREFIXES matches them
SIZES = st.one_of(
    st.sampled_from((8, 60, 400, 900, 960, 1000, 1900, 2100, 3000)),
    st.integers(600, 960),  # admitted by a 4096 ring, four of them fill it
    st.integers(8, 3000),
    # The 8 KiB pool class; no pool class (a class holds class + headroom bytes).
    st.sampled_from(
        (compute_slot_capacity(POOL_MIN_CLASS) + 1000, compute_slot_capacity(POOL_MAX_CLASS) + 1000)
    ),
)
# 0: no pool; two slots of the 4 KiB class; plenty (what a real deployment has).
POOL_BUDGETS = (0, 2 * compute_slot_charge(POOL_MIN_CLASS), 1 << 20)
# (what, target, errno) of a planned ring setup failure: the ring file's open,
# the next fallocate (the ring's), the marker's open, the next lock (the stamp's).
SETUP_FAULTS = (
    ("open", "ring.", errno.ENOSPC),
    ("open", "ring.", errno.EPERM),
    ("site", "fallocate", errno.ENOSPC),
    ("open", "marker.", errno.ENOSPC),
    ("site", "flock", errno.ENOLCK),
)

EVENT_LABELS = (
    "fallback",
    "fallback: not admitted",
    "fallback: full",
    "fallback file reused",
    "back-pressure",
    "stale descriptor",
    "re-put across routes",
    "prefix cleanup",
    "cleanup",
    "ring setup failure",
    "no space",
    "close",
    "get after close",
    "second connector in the same process",
    "delivered from the sibling's ring",
    "sibling closed",
    "closed sibling's rings unmapped",
    "pool",
    "pool slot reused",
    "pool fallback",
    "delivered from a pool slot",
    "cohort committed",
    "pending cohort member not delivered",
    "forked child refused",
    "ring replaced after a neighbour's unlink",
)
TALLY = Tally()  # labels reached and rules run in this process

CI_PROFILE = "connector-ci"
LONG_PROFILE = "connector-long"
register_profiles(
    CI_PROFILE,
    LONG_PROFILE,
    ci={"max_examples": 150, "stateful_step_count": 60},
    long={"max_examples": 1500, "stateful_step_count": 80},
    health_checks=(HealthCheck.too_slow, HealthCheck.filter_too_much),
)


def _mapped(path: str) -> bool:
    """Whether this process maps the file at `path` (deleted or not)."""
    with open("/proc/self/maps") as maps:
        return any(path in line for line in maps)


def _status_name(status: Any) -> str:
    return status.value


_CHILD_CODES = {
    10: "a put worked",
    11: "a get worked",
    12: "an error other than ForkedError (or ClosedError of a closed one)",
    13: "close raised",
    14: "close answered a retired count",
}


def _use_inherited(inherited: list[Connector]) -> int:
    """In a forked child: put, get and close each inherited connector; answer an exit code."""
    from ..impl.errors import ForkedError

    for connector in inherited:
        try:
            connector.put(EDGES[0], "k_child", b"from the child")
            return 10
        except (ForkedError, ClosedError):
            pass
        except BaseException:  # noqa: BLE001 - any other outcome is the finding
            return 12
        for edge in EDGES:
            for key in KEYS:
                try:
                    connector.get(edge, key)
                    return 11
                except (ForkedError, ClosedError):
                    pass
                except BaseException:  # noqa: BLE001
                    return 12
        try:
            if connector.close() or connector.close():
                return 14
        except BaseException:  # noqa: BLE001
            return 13
    return 0


class ConnectorLockstepMachine(RuleBasedStateMachine):
    """`spec.connector` and one real `Connector`, step for step."""

    descriptors = Bundle("descriptors")  # (model descriptor, implementation descriptor)

    def __init__(self) -> None:
        super().__init__()
        self.connector: Connector | None = None
        self.model: connector_spec.ConnectorState | None = None
        self.os = FaultyOs()
        self.tags = itertools.count(1)
        self.routes: dict[tuple[tuple[str, str], str], Route] = {}
        self.pool_budget = 0  # drawn at setup
        self.sibling: Connector | None = None  # a second connector in this process
        self.sibling_model: connector_spec.ConnectorState | None = None
        # Publication cohorts entered on the main connector, per edge (innermost last).
        self.cohorts: dict[tuple[str, str], list[Any]] = {}

    # -- setup ------------------------------------------------------------------------

    @initialize(
        capacity=st.sampled_from(CAPACITIES),
        budget=st.sampled_from(BUDGETS),
        spares=st.booleans(),
        pool_budget=st.sampled_from(POOL_BUDGETS),
    )
    def setup(self, capacity: int, budget: int, spares: bool, pool_budget: int) -> None:
        # spares: every fallback file is kept for reuse (the default keeps only
        # files of 1 MiB and more, which these payloads never reach), so
        # hand-back and reuse meet every rule below.
        note(
            f"connector(capacity={capacity}, budget={budget}, spares={spares}, "
            f"pool_budget={pool_budget})"
        )
        self.pool_budget = pool_budget
        scope = f"t{uuid.uuid4().hex[:12]}"
        self.connector = Connector(
            scope,
            ring_capacity=capacity,
            fallback_budget=budget,
            os_facade=self.os,
            fallback_spare_bytes=1 << 20 if spares else 0,
            fallback_spare_min_bytes=0,
            ring_retry_seconds=None,  # the model has no clock: a failed setup stays failed
            rescan_seconds=None,  # nor does it rescan without a stamp move
            pool_min_bytes=POOL_MIN_CLASS,
            pool_max_bytes=POOL_MAX_CLASS,
            pool_budget_bytes=pool_budget,
        )
        self.model = connector_spec.initialize_connector(
            capacity, budget, POOL_MIN_CLASS, POOL_MAX_CLASS, pool_budget
        )
        # Join the deployment now, so a planned lock fault hits the stamp, not the join.
        got = self.connector.get(EDGES[0], "never put")
        assert got.status.value == ConnectorGetStatus.NOT_FOUND.value

    def teardown(self) -> None:
        connector = self.connector
        if connector is None:
            return
        self.os.disarm()
        if self.sibling is not None:
            self.sibling.close()
        connector.close()
        for entered in self.cohorts.values():
            for cohort in reversed(entered):
                cohort.__exit__(None, None, None)  # after close: commits nothing, raises nothing
        self.cohorts.clear()
        connector.close()  # idempotent
        assert not os.path.exists(connector.directory), (
            f"close left the deployment directory: {sorted(os.listdir(connector.directory))}"
        )

    # -- helpers ------------------------------------------------------------------------

    def _conn(self) -> tuple[Connector, connector_spec.ConnectorState]:
        assert self.connector is not None and self.model is not None
        return self.connector, self.model

    def _is_fresh(self, edge: tuple[str, str]) -> bool:
        """The next put on `edge` sets up its ring (so a setup fault can be planned)."""
        _, model = self._conn()
        return (
            not model.closed
            and model.ring_capacity > 0
            and edge not in model.rings
            and edge not in model.failed_edges
        )

    def _arm(self, fault: tuple[str, str, int]) -> None:
        kind, target, code = fault
        if kind == "open":
            self.os.fail_open(target, code)
        else:
            self.os.fail_next(target, code)

    # -- rules -------------------------------------------------------------------------

    @rule(
        target=descriptors,
        edge=st.sampled_from(EDGES),
        key=st.sampled_from(KEYS),
        size=SIZES,
        fault=st.one_of(st.none(), st.none(), st.sampled_from(SETUP_FAULTS)),
    )
    def put(
        self,
        edge: tuple[str, str],
        key: str,
        size: int,
        fault: tuple[str, str, int] | None,
    ) -> Any:
        pair = self._put(edge, key, size, fault)
        return multiple() if pair is None else pair

    @rule(
        target=descriptors,
        edge=st.sampled_from(EDGES),
        sizes=st.lists(st.integers(700, 1000), min_size=3, max_size=len(KEYS)),
    )
    def fill(self, edge: tuple[str, str], sizes: list[int]) -> Any:
        """Several large frames under distinct keys, no get in between: the ring fills."""
        pairs = [self._put(edge, key, size, None) for key, size in zip(KEYS, sizes, strict=False)]
        return multiple(*(pair for pair in pairs if pair is not None))

    def _put(
        self,
        edge: tuple[str, str],
        key: str,
        size: int,
        fault: tuple[str, str, int] | None,
    ) -> tuple[Any, Any] | None:
        TALLY.step("put")
        connector, model = self._conn()
        tag = next(self.tags)
        payload = tagged_payload(tag, size)
        payload_length = codec.prepare(payload).nbytes
        planned = fault is not None and self._is_fresh(edge)
        note(
            f"put({edge}, {key!r}, tag={tag}, payload_length={payload_length}, fault={fault if planned else None})"
        )
        previous_route = connector_spec.get_route_of(model, edge, key)
        stored_length = cohort_spec.compute_stored_length(model.cohorts, edge, payload_length)
        expected = connector_spec.process_put(
            model, edge, key, payload_length, tag, ring_setup_ok=not planned
        )
        fired_before = sum(self.os.fired.values())
        before = connector.health()
        reused_before = before.fallback_reused
        if planned:
            assert fault is not None
            self._arm(fault)
        got: Any
        try:
            got = connector.put(edge, key, payload)
        except BackPressureError:
            got = ConnectorPutStatus.REFUSED
        except ClosedError:
            got = ConnectorPutStatus.CLOSED
        finally:
            armed = self.os.armed
            self.os.disarm()
        if planned:
            assert not armed and sum(self.os.fired.values()) == fired_before + 1, (
                f"planned setup fault {fault} did not fire"
            )
            TALLY.label("ring setup failure")
        if expected.status is not ConnectorPutStatus.ACCEPTED:
            assert got is expected.status, f"model {expected.status}, implementation {got!r}"
            if got is ConnectorPutStatus.REFUSED:
                TALLY.label("back-pressure")
            return None
        assert isinstance(got, (RingDescriptor, FallbackDescriptor)), (
            f"model accepted on {expected.route}, implementation answered {got!r}"
        )
        assert got.route is expected.route, (
            f"model route {expected.route}, implementation {got.route}"
        )
        assert got.size == stored_length  # a cohort member carries its envelope
        after = connector.health()
        if after.pool_fallbacks > before.pool_fallbacks:
            TALLY.label("pool fallback")
        if after.pool_slots_evicted > before.pool_slots_evicted:
            TALLY.label("pool slot evicted")
        if isinstance(got, RingDescriptor):
            assert isinstance(expected.descriptor, connector_spec.RingDescriptor)
            assert got.position == expected.descriptor.position, (
                f"ring position: model {expected.descriptor.position}, implementation {got.position}"
            )
            if got.route is Route.POOL:
                TALLY.label("pool")
                if after.pool_slots_reused > before.pool_slots_reused:
                    TALLY.label("pool slot reused")
        else:
            TALLY.label("fallback")
            if connector.health().fallback_reused > reused_before:
                TALLY.label("fallback file reused")
            if expected.ring_status is PutStatus.NOT_ADMITTED:
                TALLY.label("fallback: not admitted")
            elif expected.ring_status is PutStatus.FULL:
                TALLY.label("fallback: full")
        if previous_route is not None and previous_route is not expected.route:
            TALLY.label("re-put across routes")
        return (expected.descriptor, got)

    @precondition(
        lambda self: self.model is not None and not self.model.closed and self.model.rings
    )
    @rule(target=descriptors, data=st.data(), key=st.sampled_from(KEYS), size=SIZES)
    def neighbour_unlinks_ring(self, data: st.DataObject, key: str, size: int) -> Any:
        """Issue 22, defect 4 (`spec.environment` UNLINK_RING): a neighbour unlinks a live ring.

        The real file goes (a neighbour's `unlink`, not the seam); the
        producer's next put on the edge, right after, notices and re-creates
        the ring with every unclaimed frame moved (`spec.connector._replace_ring`).
        Later gets, re-puts, cleanups and the invariant check the moved
        frames and positions against the model.
        """
        TALLY.step("neighbour_unlinks_ring")
        connector, model = self._conn()
        edge = data.draw(st.sampled_from(sorted(model.rings)), label="edge")
        ring = connector.ring(edge)
        assert ring is not None, f"model has a ring on {edge}, the implementation none"
        before = connector.health()
        note(f"neighbour unlinks the ring of {edge}: {ring.path}")
        os.unlink(ring.path)
        connector_spec.process_neighbour_unlink_ring(model, edge)
        replaced, lost = model.health.rings_replaced, model.health.ring_frames_lost
        pair = self._put(edge, key, size, None)
        after = connector.health()
        assert (
            after.rings_replaced - before.rings_replaced == model.health.rings_replaced - replaced
        )
        assert after.ring_frames_lost - before.ring_frames_lost == (
            model.health.ring_frames_lost - lost
        ), f"frames lost: model {model.health.ring_frames_lost - lost}"
        TALLY.label("ring replaced after a neighbour's unlink")
        return multiple() if pair is None else pair

    @precondition(lambda self: self.model is not None and not self.model.closed)
    @rule(edge=st.sampled_from(EDGES), key=st.sampled_from(KEYS), size=SIZES)
    def put_without_space(self, edge: tuple[str, str], key: str, size: int) -> None:
        """A fallback put meets ENOSPC: NoSpaceError, and nothing changes anywhere."""
        TALLY.step("put_without_space")
        connector, model = self._conn()
        if self._is_fresh(edge):
            return  # its first fallocate would be the ring's: covered by `put`'s faults
        tag = next(self.tags)
        payload = tagged_payload(tag, size)
        payload_length = codec.prepare(payload).nbytes
        trial = copy.deepcopy(model)
        expected = connector_spec.process_put(trial, edge, key, payload_length, tag)
        if (
            expected.status is not ConnectorPutStatus.ACCEPTED
            or expected.route is not Route.FALLBACK
            or (
                trial.pool is not None
                and model.pool is not None
                and trial.pool.created > model.pool.created
            )
        ):
            return  # (a slot created on the way would take the planned ENOSPC)
        note(f"put_without_space({edge}, {key!r}, payload_length={payload_length})")
        reused_before = connector.health().fallback_reused
        self.os.fail_next("fallocate", errno.ENOSPC)
        got: Any = None
        try:
            got = connector.put(edge, key, payload)
        except NoSpaceError as error:
            assert error.errno == errno.ENOSPC
        finally:
            self.os.disarm()
        if got is not None:
            # Only a put that wrote into a handed-back file allocates nothing.
            assert connector.health().fallback_reused == reused_before + 1, (
                "a fallback put without space did not raise NoSpaceError"
            )
            assert got.route is Route.FALLBACK, f"put without space took {got.route}"
            accepted = connector_spec.process_put(model, edge, key, payload_length, tag)
            assert accepted == expected, f"model {accepted}, rehearsed {expected}"
            TALLY.label("fallback file reused")
            return
        TALLY.label("no space")
        # The pool was asked first (a payload the ring does not admit) and said no,
        # or took a slot and gave it back (ring full): counters the rehearsal moved.
        model.health.pool_fallbacks = trial.health.pool_fallbacks
        if model.pool is not None and trial.pool is not None:
            model.pool.reused = trial.pool.reused
        # The model is not stepped, except that the ring's put reclaimed before
        # it answered FULL or NOT_ADMITTED (a step the model allows any time).
        if expected.ring_status is PutStatus.FULL:
            ring_spec.process_reclaim(model.rings[edge])

    @rule(edge=st.sampled_from(EDGES), key=st.sampled_from(KEYS))
    def get(self, edge: tuple[str, str], key: str) -> None:
        TALLY.step("get")
        connector, model = self._conn()
        expected = connector_spec.process_get(model, edge, key)
        note(f"get({edge}, {key!r}) -> model {expected.status.value}")
        self._compare_get(expected, lambda: connector.get(edge, key))
        self._label_pending(edge, key, expected)

    @rule(pair=descriptors)
    def get_with_descriptor(self, pair: tuple[Any, Any]) -> None:
        TALLY.step("get_with_descriptor")
        connector, model = self._conn()
        model_descriptor, descriptor = pair
        if (
            self.sibling is not None
            and self.sibling_model is not None
            and descriptor.producer == self.sibling.identity
            and not model.closed
        ):
            expected = connector_spec.process_get(
                self.sibling_model, model_descriptor.edge, model_descriptor.key, model_descriptor
            )
            note(f"get(sibling's {descriptor}) -> model {expected.status.value}")
            got = connector.get(descriptor.edge, descriptor.key, descriptor=descriptor)
            if expected.status is ConnectorGetStatus.CLOSED:
                assert got.status is GetStatus.PRODUCER_GONE, (
                    f"descriptor of a closed sibling: {got.status}"
                )
                return
            self._compare_get(expected, lambda: got)
            return
        expected = connector_spec.process_get(
            model, model_descriptor.edge, model_descriptor.key, model_descriptor
        )
        note(f"get({descriptor}) -> model {expected.status.value}")
        self._compare_get(
            expected,
            lambda: connector.get(descriptor.edge, descriptor.key, descriptor=descriptor),
        )
        if expected.status is ConnectorGetStatus.STALE:
            TALLY.label("stale descriptor")

    def _label_pending(
        self, edge: tuple[str, str], key: str, expected: connector_spec.ConnectorGetResult
    ) -> None:
        """Label a get the model answered NOT_FOUND for a member of an uncommitted cohort."""
        model = self.model
        if (
            model is not None
            and expected.status is ConnectorGetStatus.NOT_FOUND
            and connector_spec.get_route_of(model, edge, key) is not None
        ):
            TALLY.label("pending cohort member not delivered")

    def _compare_get(self, expected: connector_spec.ConnectorGetResult, call: Any) -> None:
        try:
            got = call()
        except ClosedError:
            assert expected.status is ConnectorGetStatus.CLOSED, (
                f"ClosedError, model {expected.status}"
            )
            TALLY.label("get after close")
            return
        assert got.status.value == expected.status.value, (
            f"get: model {expected.status.value}, implementation {got.status.value}"
        )
        if expected.status is ConnectorGetStatus.DELIVERED:
            assert got.route is expected.route, f"route: model {expected.route}, impl {got.route}"
            assert payload_tag(got.value) == expected.payload, (
                f"payload: model tag {expected.payload}, implementation tag {payload_tag(got.value)}"
            )
            if got.route is Route.POOL:
                TALLY.label("delivered from a pool slot")

    @precondition(lambda self: self.model is not None and not self.model.closed)
    @rule(key=st.sampled_from(KEYS))
    def cleanup(self, key: str) -> None:
        TALLY.step("cleanup")
        connector, model = self._conn()
        expected = connector_spec.process_cleanup(model, key)
        got = connector.cleanup(key)
        note(f"cleanup({key!r}) -> {got}, model {expected}")
        assert got == expected, f"cleanup({key!r}): model {expected}, implementation {got}"
        if got:
            TALLY.label("cleanup")

    @precondition(lambda self: self.model is not None and not self.model.closed)
    @rule(prefix=st.sampled_from(PREFIXES))
    def cleanup_prefix(self, prefix: str) -> None:
        TALLY.step("cleanup_prefix")
        connector, model = self._conn()
        expected = connector_spec.process_cleanup_prefix(model, prefix)
        got = connector.cleanup_prefix(prefix)
        note(f"cleanup_prefix({prefix!r}) -> {got}, model {expected}")
        assert got == expected, (
            f"cleanup_prefix({prefix!r}): model {expected}, implementation {got}"
        )
        if got:
            TALLY.label("prefix cleanup")

    # -- publication cohorts ---------------------------------------------------------------

    @precondition(lambda self: self._main_open())
    @rule(edge=st.sampled_from(EDGES))
    def open_cohort(self, edge: tuple[str, str]) -> None:
        """Enter ``publication_cohort(edge)`` (a second one on the edge joins the first)."""
        TALLY.step("open_cohort")
        connector, model = self._conn()
        expected = connector_spec.process_cohort_open(model, edge)
        cohort = connector.publication_cohort(edge)
        number = cohort.__enter__()
        self.cohorts.setdefault(edge, []).append(cohort)
        note(f"open_cohort({edge}) -> {number}, model {expected}")
        assert number == expected, f"cohort number: model {expected}, implementation {number}"

    @precondition(lambda self: any(self.cohorts.values()))
    @rule(data=st.data())
    def commit_cohort(self, data: st.DataObject) -> None:
        """Leave the innermost cohort of an edge; the outermost leave commits it."""
        TALLY.step("commit_cohort")
        connector, model = self._conn()
        edge = data.draw(
            st.sampled_from(sorted(edge for edge, open_ in self.cohorts.items() if open_))
        )
        cohort = self.cohorts[edge].pop()
        committed = connector_spec.process_cohort_commit(model, edge)
        before = connector.health().cohorts_committed
        cohort.__exit__(None, None, None)
        note(f"commit_cohort({edge}) -> model committed={committed}")
        assert connector.health().cohorts_committed == before + committed, (
            f"cohort commit: model {committed}, implementation "
            f"{connector.health().cohorts_committed - before}"
        )
        if committed:
            TALLY.label("cohort committed")

    # -- the second connector in the same process ------------------------------------------

    def _sibling_open(self) -> bool:
        return self.sibling_model is not None and not self.sibling_model.closed

    def _main_open(self) -> bool:
        return self.model is not None and not self.model.closed

    @precondition(lambda self: self._main_open() and self.sibling is None)
    @rule()
    def open_sibling(self) -> None:
        """Open another connector of this process on the same deployment."""
        TALLY.step("open_sibling")
        connector, model = self._conn()
        self.sibling = Connector(
            connector.scope,
            ring_capacity=model.ring_capacity,
            fallback_budget=model.fallback_budget,
            pool_min_bytes=POOL_MIN_CLASS,
            pool_max_bytes=POOL_MAX_CLASS,
            pool_budget_bytes=self.pool_budget,
        )
        self.sibling_model = connector_spec.initialize_connector(
            model.ring_capacity,
            model.fallback_budget,
            POOL_MIN_CLASS,
            POOL_MAX_CLASS,
            self.pool_budget,
        )
        assert self.sibling.identity[:2] == connector.identity[:2]
        assert self.sibling.identity != connector.identity
        note(f"open_sibling() -> {self.sibling.identity}")
        TALLY.label("second connector in the same process")

    @precondition(lambda self: self._sibling_open() and self._main_open())
    @rule(
        target=descriptors,
        edge=st.sampled_from(EDGES),
        key=st.sampled_from(SIBLING_KEYS),
        size=SIZES,
    )
    def sibling_put(self, edge: tuple[str, str], key: str, size: int) -> Any:
        TALLY.step("sibling_put")
        sibling, model = self.sibling, self.sibling_model
        assert sibling is not None and model is not None
        tag = next(self.tags)
        payload = tagged_payload(tag, size)
        payload_length = codec.prepare(payload).nbytes
        expected = connector_spec.process_put(model, edge, key, payload_length, tag)
        note(f"sibling.put({edge}, {key!r}, tag={tag}, payload_length={payload_length})")
        try:
            got: Any = sibling.put(edge, key, payload)
        except BackPressureError:
            got = ConnectorPutStatus.REFUSED
        if expected.status is not ConnectorPutStatus.ACCEPTED:
            assert got is expected.status, f"model {expected.status}, implementation {got!r}"
            return multiple()
        assert got.route is expected.route, f"model route {expected.route}, impl {got.route}"
        assert got.producer == sibling.identity
        if isinstance(got, RingDescriptor):
            # Its own ring: no collision with the main connector's ring of the edge.
            assert isinstance(expected.descriptor, connector_spec.RingDescriptor)
            assert got.position == expected.descriptor.position
            assert sibling.file_path(got) != sibling.file_path(
                RingDescriptor(self._conn()[0].identity, edge, key, 0, 0)
            )
        return (expected.descriptor, got)

    @precondition(lambda self: self.sibling_model is not None and self._main_open())
    @rule(edge=st.sampled_from(EDGES), key=st.sampled_from(SIBLING_KEYS))
    def get_sibling_key(self, edge: tuple[str, str], key: str) -> None:
        """The main connector gets a key only the sibling publishes."""
        TALLY.step("get_sibling_key")
        connector, _ = self._conn()
        model = self.sibling_model
        assert model is not None
        expected = connector_spec.process_get(model, edge, key)
        if expected.status is ConnectorGetStatus.CLOSED:
            # The sibling closed: by key, its frames are simply not there any more.
            expected = connector_spec.ConnectorGetResult(ConnectorGetStatus.NOT_FOUND)
        note(f"get sibling key ({edge}, {key!r}) -> model {expected.status.value}")
        got = connector.get(edge, key)
        self._compare_get(expected, lambda: got)
        if got.delivered:
            assert got.producer == self.sibling.identity if self.sibling else False
            if got.route is Route.RING:
                TALLY.label("delivered from the sibling's ring")

    @precondition(lambda self: self._sibling_open())
    @rarely(5)
    def close_sibling(self) -> None:
        """The sibling closes (on one draw in five); the main connector keeps going and unmaps its rings."""
        TALLY.step("close_sibling")
        sibling, model = self.sibling, self.sibling_model
        assert sibling is not None and model is not None
        ring_files = [ring.path for edge in EDGES if (ring := sibling.ring(edge)) is not None]
        if self._main_open():
            # Gets of a key nobody put (no model step) map the sibling's rings first.
            connector, main_model = self._conn()
            for edge in EDGES:
                expected_get = connector_spec.process_get(main_model, edge, "never put")
                assert connector.get(edge, "never put").status.value == expected_get.status.value
            assert all(_mapped(path) for path in ring_files), "the sibling's rings were not mapped"
        expected = connector_spec.process_close(model)
        got = sibling.close()
        note(f"sibling.close() -> {got}, model {expected}")
        assert got == expected, f"sibling close: model retired {expected}, implementation {got}"
        TALLY.label("sibling closed")
        if self._main_open():
            # The main connector's next get scans (the stamp moved) and unmaps the sibling's rings.
            connector, main_model = self._conn()
            expected_get = connector_spec.process_get(main_model, EDGES[0], "never put")
            assert connector.get(EDGES[0], "never put").status.value == expected_get.status.value
            mapped = [path for path in ring_files if _mapped(path)]
            assert not mapped, f"a closed sibling's rings are still mapped: {mapped}"
            if ring_files:
                TALLY.label("closed sibling's rings unmapped")

    @rarely(10)
    def fork_then_use_inherited(self) -> None:
        """Issue 24: fork; in the child every use of the inherited connectors is ForkedError.

        No model step: the fork is not the parent's action, and the parent
        notices nothing. The child puts, gets every key of every edge and
        closes (twice) each inherited connector; its exit code says what
        happened. The invariant then checks the parent against the model as
        before, and every ring file of the parent is still where it was.
        """
        TALLY.step("fork_then_use_inherited")
        connector, model = self._conn()
        inherited = [connector] + ([self.sibling] if self.sibling is not None else [])
        rings = [
            ring.path
            for owner in inherited
            if not owner.closed
            for edge in EDGES
            if (ring := owner.ring(edge)) is not None
        ]
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            code = 99
            try:
                code = _use_inherited(inherited)
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        code = os.waitstatus_to_exitcode(status)
        note(f"fork_then_use_inherited() -> child exit {code}")
        assert code == 0, (
            f"the forked child's use of an inherited connector: {_CHILD_CODES.get(code, code)}"
        )
        missing = [path for path in rings if not os.path.exists(path)]
        assert not missing, f"a forked child's use removed the parent's rings: {missing}"
        TALLY.label("forked child refused")

    @rarely(20)
    def close(self) -> None:
        """Close, rarely (one draw in twenty), so most runs keep going."""
        TALLY.step("close")
        connector, model = self._conn()
        expected = connector_spec.process_close(model)
        got = connector.close()
        note(f"close() -> {got}, model {expected}")
        assert got == expected, f"close: model retired {expected}, implementation {got}"
        assert connector.close() == 0  # idempotent
        TALLY.label("close")

    # -- invariants --------------------------------------------------------------------

    @invariant()
    def agrees_with_model(self) -> None:
        if self.model is None or self.connector is None:
            return
        connector, model = self._conn()
        invariants.check_connector(model)
        health = connector.health()
        expected = model.health
        pairs = [(health, expected)]
        if self.sibling is not None and self.sibling_model is not None:
            invariants.check_connector(self.sibling_model)
            pairs.append((self.sibling.health(), self.sibling_model.health))
        for name in ("puts", "ring_puts", "fallbacks", "refusals", "pool_puts", "pool_fallbacks"):
            for got_health, model_health in pairs:
                assert getattr(got_health, name) == getattr(model_health, name), (
                    f"health.{name}: model {getattr(model_health, name)}, "
                    f"implementation {getattr(got_health, name)}"
                )
        # The model counts a get at the producer, the implementation at the receiver.
        for name in ("gets", "bytes_transferred", "ring_gets", "pool_gets"):
            got_total = sum(getattr(h, name) for h, _ in pairs)
            model_total = sum(getattr(m, name) for _, m in pairs)
            assert got_total == model_total, (
                f"health.{name} over both connectors: model {model_total}, "
                f"implementation {got_total}"
            )
        if self._sibling_open():
            sibling, sibling_model = self.sibling, self.sibling_model
            assert sibling is not None and sibling_model is not None
            assert sibling.fallback_bytes() == sibling_model.fallback_bytes
            for edge in EDGES:
                ring, model_ring = sibling.ring(edge), sibling_model.rings.get(edge)
                assert (ring is None) == (model_ring is None)
                if ring is not None and model_ring is not None:
                    assert (ring.head, ring.tail) == (model_ring.head, model_ring.tail)
        for got_health, model_conn in (
            (health, model),
            *(
                [(self.sibling.health(), self.sibling_model)]
                if self._sibling_open() and self.sibling is not None and self.sibling_model
                else []
            ),
        ):
            pool = model_conn.pool
            if pool is not None and not model_conn.closed:
                assert (
                    got_health.pool_slots,
                    got_health.pool_bytes,
                    got_health.pool_slots_created,
                    got_health.pool_slots_reused,
                    got_health.pool_slots_evicted,
                ) == (len(pool.slots), pool.used_bytes, pool.created, pool.reused, pool.evicted), (
                    f"pool: model slots={len(pool.slots)} bytes={pool.used_bytes} "
                    f"created={pool.created} reused={pool.reused} evicted={pool.evicted}, "
                    f"implementation {got_health}"
                )
            elif pool is None:
                assert got_health.pool_puts == 0 and got_health.pool_slots == 0
        if model.closed:
            assert health.closed
            return
        assert connector.fallback_bytes() == model.fallback_bytes, (
            f"fallback bytes: model {model.fallback_bytes}, implementation {connector.fallback_bytes()}"
        )
        assert set(connector.failed_edges()) == model.failed_edges
        for edge in EDGES:
            ring = connector.ring(edge)
            model_ring = model.rings.get(edge)
            assert (ring is None) == (model_ring is None), (
                f"ring of {edge}: model {model_ring}, impl {ring}"
            )
            if ring is not None and model_ring is not None:
                assert (ring.head, ring.tail) == (model_ring.head, model_ring.tail), (
                    f"ring {edge}: model head/tail {model_ring.head}/{model_ring.tail}, "
                    f"implementation {ring.head}/{ring.tail}"
                )


__all__ = [
    "CI_PROFILE",
    "EVENT_LABELS",
    "LONG_PROFILE",
    "TALLY",
    "ConnectorLockstepMachine",
]
