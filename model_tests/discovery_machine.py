"""Lockstep machines (c) and (d): discovery and producer restart across real processes.

(c) `DiscoveryLockstepMachine`: producers are real processes (one
`Connector` each, in a persistent worker driven step by step over a pipe),
receivers are connectors in the test process. Every rule applies one
operation to `spec.discovery` and to the processes: start a producer, put,
get by key or with a published descriptor, close a producer (its process
keeps running), kill one with SIGKILL. Gets compare status, the delivering
producer's identity, the route and the payload tag; closes compare the
retired count. After every step the model's invariants hold
(`check_deployment`, and `check_stamp_step` against the previous step) and
the model agrees with the files: the stamp file holds the model's stamp, the
marker files are the model's markers, and each receiver made exactly as
many directory scans (counted at its OS seam) as the model's receiver.

Producers occupy *slots*: a slot's keys are published by at most one live
producer (the contract: one active publisher per key), several slots share
an edge, and a producer started in a slot whose producer was killed or
closed reuses that slot's keys. A producer is a connector, not a process:
`start_sibling_producer` opens a second connector inside a live producer's
process (its own slot, ring and markers on the same edges); closing it
leaves its sibling publishing, and killing the process kills both
(`spec.discovery.process_exit_process`).

(d) `RestartLockstepMachine`: the same machine with one slot and a kill
rule drawn far more often, so producers die with frames on the ring and
segments in the fallback and their successors reuse every key. Besides the
model comparison, every delivered payload is checked to come from the
producer that is alive in its slot: a dead producer's frame never reaches a
reused key.
"""

from __future__ import annotations

import itertools
import os
import struct
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
from ..fault_injection.kit.seams import CountingOs
from ..impl import codec
from ..impl.connector import Connector, descriptor_from_dict
from ..impl.discovery import collect_orphans
from ..impl.names import STAMP_FILE_NAME, parse_marker_file_name
from ..impl.os_seam import DEFAULT_OS
from ..spec import discovery as discovery_spec
from ..spec import invariants
from ..spec.connector import ConnectorPutStatus, Route, get_deliverable, get_route_of
from ..spec.discovery import DeploymentGetStatus, DirectoryState, PublishedDescriptor
from ..spec.layout import U64_FORMAT
from .connector_support import SiblingWorker, Worker

RING_CAPACITY = 4096
FALLBACK_BUDGET = 1 << 20
EDGES = (("a", "b"), ("a", "c"))
RECEIVERS = ("r0", "r1")
SIZES = st.one_of(st.sampled_from((8, 300, 900, 1500)), st.integers(8, 1500))

EVENT_LABELS = (
    "producer started",
    "producer restarted in a used slot",
    "producer killed",
    "producer closed",
    "second connector in the same process",
    "killed process ran several producers",
    "delivered from ring",
    "delivered from fallback",
    "several producers on an edge",
    "producer gone",
    "stale descriptor",
    "dead producer's key not delivered",
    "rescan",
    "stale marker pruned",
)
TALLY = Tally()  # labels reached and rules run in this process (both machines)

CI_PROFILE = "discovery-ci"
LONG_PROFILE = "discovery-long"
RESTART_CI_PROFILE = "restart-ci"
RESTART_LONG_PROFILE = "restart-long"
_HEALTH_CHECKS = (HealthCheck.too_slow, HealthCheck.filter_too_much)
register_profiles(
    CI_PROFILE,
    LONG_PROFILE,
    ci={"max_examples": 80, "stateful_step_count": 50},
    long={"max_examples": 200, "stateful_step_count": 60},
    health_checks=_HEALTH_CHECKS,
)
register_profiles(
    RESTART_CI_PROFILE,
    RESTART_LONG_PROFILE,
    ci={"max_examples": 40, "stateful_step_count": 50},
    long={"max_examples": 150, "stateful_step_count": 60},
    health_checks=_HEALTH_CHECKS,
)

_U64 = struct.Struct(U64_FORMAT)


def slot_keys(slot: int) -> tuple[str, ...]:
    """The keys slot `slot` publishes."""
    return (f"s{slot}_k0", f"s{slot}_k1", f"req_{slot}_0", f"req_{slot}_12")


class DiscoveryLockstepMachine(RuleBasedStateMachine):
    """`spec.discovery` against producer processes and in-process receivers."""

    SLOTS: int = 3
    LIFECYCLE_ODDS: int = 4  # a kill rule acts on one draw in this many
    CLOSE_ODDS: int = 4  # a close rule acts on one draw in this many
    START_ODDS: int = 3  # with someone publishing already, a start acts on one draw in this many
    published = Bundle("published")  # (model PublishedDescriptor, descriptor dict, route)

    def __init__(self) -> None:
        super().__init__()
        self.dep: discovery_spec.DeploymentState | None = None
        self.scope = ""
        self.directory = ""
        # By producer identity (pid, start time, instance), every one started.
        self.workers: dict[tuple[int, ...], Worker | SiblingWorker] = {}
        self.slot_of: dict[tuple[int, ...], int] = {}
        self.live_in_slot: dict[int, tuple[int, ...]] = {}
        self.used_slots: set[int] = set()
        self.receivers: dict[str, Connector] = {}
        self.seams: dict[str, CountingOs] = {}
        self.tags = itertools.count(1)
        self.tag_owner: dict[int, tuple[int, ...]] = {}
        self.previous_directory: DirectoryState | None = None

    # -- setup and teardown -------------------------------------------------------------

    @initialize()
    def setup(self) -> None:
        self.scope = f"t{uuid.uuid4().hex[:12]}"
        self.dep = discovery_spec.initialize_deployment(RING_CAPACITY, FALLBACK_BUDGET)
        for name in RECEIVERS:
            seam = CountingOs()
            self.seams[name] = seam
            receiver = Connector(
                self.scope, ring_capacity=RING_CAPACITY, os_facade=seam, rescan_seconds=None
            )
            self.receivers[name] = receiver
            # Receivers are up before producers: each joins the deployment
            # (so the directory and its stamp outlive every producer) and scans once.
            expected = discovery_spec.process_get(self.dep, name, EDGES[0], "never put")
            assert receiver.get(EDGES[0], "never put").status.value == expected.status.value
        self.directory = self.receivers[RECEIVERS[0]].directory

    def teardown(self) -> None:
        for worker in self.workers.values():
            worker.stop()
        for receiver in self.receivers.values():
            receiver.close()
        if self.directory:
            collect_orphans(self.directory, DEFAULT_OS)  # what killed producers left
            assert not os.path.exists(self.directory), (
                f"deployment directory left behind: {sorted(os.listdir(self.directory))}"
            )

    def _model(self) -> discovery_spec.DeploymentState:
        assert self.dep is not None
        return self.dep

    def _alive(self) -> list[tuple[int, ...]]:
        """Live producers in slot order (not pid order, so draws do not depend on pids)."""
        return [self.live_in_slot[slot] for slot in sorted(self.live_in_slot)]

    # -- producers ----------------------------------------------------------------------

    @precondition(lambda self: self.dep is not None and not self.live_in_slot)
    @rule(data=st.data())
    def start_first_producer(self, data: st.DataObject) -> None:
        """Nobody publishes: a producer starts at once."""
        self._start_producer(data)

    @precondition(lambda self: self.dep is not None and 0 < len(self.live_in_slot) < self.SLOTS)
    @rarely("START_ODDS", data=st.data())
    def start_producer(self, data: st.DataObject) -> None:
        """Someone publishes already: another producer starts, more rarely."""
        self._start_producer(data)

    def _start_producer(self, data: st.DataObject) -> None:
        TALLY.step("start_producer")
        dep = self._model()
        slot = data.draw(
            st.sampled_from([s for s in range(self.SLOTS) if s not in self.live_in_slot])
        )
        worker = Worker(
            self.scope,
            # The discovery model has no pool: what the ring refuses is a segment here.
            {
                "ring_capacity": RING_CAPACITY,
                "fallback_budget": FALLBACK_BUDGET,
                "pool_budget_bytes": 0,
            },
        )
        identity = worker.identity
        self.workers[identity] = worker
        self.slot_of[identity] = slot
        self.live_in_slot[slot] = identity
        note(f"start_producer(slot={slot}) -> {identity}")
        discovery_spec.process_start_producer(dep, identity)
        # Its join reclaims what dead members left (`spec.discovery.process_join`).
        if discovery_spec.process_join(dep):
            TALLY.label("join reclaimed a dead member's files")
        TALLY.label("producer started")
        if slot in self.used_slots:
            TALLY.label("producer restarted in a used slot")
        self.used_slots.add(slot)

    @precondition(lambda self: self.dep is not None and 0 < len(self.live_in_slot) < self.SLOTS)
    @rarely(2, data=st.data())
    def start_sibling_producer(self, data: st.DataObject) -> None:
        """A second connector in a live producer's process: another producer, same process."""
        TALLY.step("start_sibling_producer")
        dep = self._model()
        host = data.draw(st.sampled_from(self._alive()))
        slot = data.draw(
            st.sampled_from([s for s in range(self.SLOTS) if s not in self.live_in_slot])
        )
        base = self.workers[host]
        sibling = SiblingWorker(base.base if isinstance(base, SiblingWorker) else base)
        identity = sibling.identity
        assert identity[:2] == host[:2] and identity != host, (host, identity)
        self.workers[identity] = sibling
        self.slot_of[identity] = slot
        self.live_in_slot[slot] = identity
        note(f"start_sibling_producer(of={host}, slot={slot}) -> {identity}")
        discovery_spec.process_start_producer(dep, identity)
        # Its join reclaims what dead members left (`spec.discovery.process_join`).
        if discovery_spec.process_join(dep):
            TALLY.label("join reclaimed a dead member's files")
        TALLY.label("second connector in the same process")
        if slot in self.used_slots:
            TALLY.label("producer restarted in a used slot")
        self.used_slots.add(slot)

    @precondition(lambda self: self.dep is not None and bool(self.live_in_slot))
    @rule(
        target=published,
        data=st.data(),
        edge=st.sampled_from(EDGES),
        size=SIZES,
    )
    def put(self, data: st.DataObject, edge: tuple[str, str], size: int) -> Any:
        TALLY.step("put")
        dep = self._model()
        identity = data.draw(st.sampled_from(self._alive()))
        key = data.draw(st.sampled_from(slot_keys(self.slot_of[identity])))
        tag = next(self.tags)
        payload_length = codec.prepare(tagged_payload(tag, size)).nbytes
        expected, published = discovery_spec.process_put(
            dep, identity, edge, key, payload_length, tag
        )
        route, descriptor = self.workers[identity].call("put", edge[0], edge[1], key, tag, size)
        note(f"put({identity}, {edge}, {key!r}, tag={tag}, length={payload_length}) -> {route}")
        if expected.status is not ConnectorPutStatus.ACCEPTED:
            assert route == "refused", f"model {expected.status}, implementation {route}"
            return multiple()
        assert expected.route is not None and route == expected.route.value, (
            f"route: model {expected.route}, implementation {route}"
        )
        self.tag_owner[tag] = identity
        if sum(1 for p, e in dep.directory.markers if e == edge) > 1:
            TALLY.label("several producers on an edge")
        assert published is not None
        return (published, descriptor, route)

    @precondition(lambda self: self.dep is not None and bool(self.live_in_slot))
    @rule(
        target=published,
        data=st.data(),
        edge=st.sampled_from(EDGES),
        size=SIZES,
        receiver=st.sampled_from(RECEIVERS),
    )
    def put_then_get(
        self, data: st.DataObject, edge: tuple[str, str], size: int, receiver: str
    ) -> Any:
        """A put, then a receiver's get by key of the same key: the common pipeline step."""
        entry = self.put(data, edge, size)
        if isinstance(entry, tuple):
            model_descriptor = entry[0].descriptor
            self._get_by_key(receiver, model_descriptor.edge, model_descriptor.key)
        return entry

    @precondition(lambda self: self.dep is not None and bool(self.live_in_slot))
    @rule(receiver=st.sampled_from(RECEIVERS), data=st.data())
    def ask_liveness_through_pid_reuse(self, receiver: str, data: st.DataObject) -> None:
        """The real verdict (the receiver's `Liveness`) against the model's, pid reuse included.

        A live producer; a stale identity naming its live pid (another start
        time: a same-pid successor seen from its predecessor's record, or the
        reverse); killed producers, whose pids may be reused by now. Asked in
        a drawn order, so a verdict cached by pid alone answers one wrongly.
        """
        TALLY.step("ask_liveness_through_pid_reuse")
        dep = self._model()
        live = data.draw(st.sampled_from(self._alive()))
        stale = (live[0], live[1] + data.draw(st.sampled_from((-1, 1))), *live[2:])
        killed = [
            p for p, state in sorted(dep.producers.items()) if not state.alive and not state.closed
        ]
        asked = [live, stale, *killed[:2]]
        order = data.draw(st.permutations(asked))
        deployment = self.receivers[receiver]._deployment
        if deployment is None:
            return
        for identity in order:
            state = dep.producers.get(identity)
            expected = state is not None and state.alive
            assert deployment.liveness.is_alive(identity) == expected, (
                f"liveness of {identity}: model {expected}, implementation {not expected}"
            )
        TALLY.label("stale identity naming a live pid judged dead")

    @precondition(lambda self: self.dep is not None and bool(self.live_in_slot))
    @rarely("LIFECYCLE_ODDS", data=st.data())
    def kill_producer(self, data: st.DataObject) -> None:
        """Most draws keep the producer: runs should also deliver things."""
        self._kill_producer(data)

    def _kill_producer(self, data: st.DataObject) -> None:
        TALLY.step("kill_producer")
        dep = self._model()
        identity = data.draw(st.sampled_from(self._alive()))
        note(f"kill(process of {identity})")
        self.workers[identity].kill()
        # Every producer of that process dies with it.
        gone = discovery_spec.process_exit_process(dep, (identity[0], identity[1]))
        for producer in gone:
            del self.live_in_slot[self.slot_of[producer]]
        TALLY.label("producer killed")
        if len(gone) > 1:
            TALLY.label("killed process ran several producers")

    @precondition(lambda self: self.dep is not None and bool(self.live_in_slot))
    @rarely("CLOSE_ODDS", data=st.data())
    def close_producer(self, data: st.DataObject) -> None:
        """The producer closes its connector; its process keeps running (and is stopped at teardown)."""
        TALLY.step("close_producer")
        dep = self._model()
        identity = data.draw(st.sampled_from(self._alive()))
        expected = discovery_spec.process_close(dep, identity)
        retired = self.workers[identity].call("close")
        note(f"close({identity}) -> {retired}, model {expected}")
        assert retired == expected, f"close retired: model {expected}, implementation {retired}"
        del self.live_in_slot[self.slot_of[identity]]
        TALLY.label("producer closed")

    # -- receivers ---------------------------------------------------------------------

    @precondition(lambda self: self.dep is not None)
    @rule(
        receiver=st.sampled_from(RECEIVERS),
        edge=st.sampled_from(EDGES),
        data=st.data(),
    )
    def get(self, receiver: str, edge: tuple[str, str], data: st.DataObject) -> None:
        TALLY.step("get")
        slot = data.draw(st.integers(0, self.SLOTS - 1))
        self._get_by_key(receiver, edge, data.draw(st.sampled_from(slot_keys(slot))))

    @rule(receiver=st.sampled_from(RECEIVERS), entry=published)
    def get_published_key(
        self, receiver: str, entry: tuple[PublishedDescriptor, dict[str, Any], str]
    ) -> None:
        """A get by key (no descriptor) of a key something was published under."""
        TALLY.step("get_published_key")
        model_descriptor, _, _ = entry
        descriptor = model_descriptor.descriptor
        self._get_by_key(receiver, descriptor.edge, descriptor.key)

    def _dead_versions(self) -> list[tuple[tuple[str, str], str]]:
        """(edge, key) pairs a dead or closed producer still holds a version of, per the model."""
        dep = self._model()
        found = set()
        for producer in dep.producers.values():
            if producer.alive:
                continue
            for edge, key, _ in get_deliverable(producer.connector):
                found.add((edge, key))
        return sorted(found)

    @precondition(lambda self: self.dep is not None and bool(self._dead_versions()))
    @rule(receiver=st.sampled_from(RECEIVERS), data=st.data())
    def get_dead_key(self, receiver: str, data: st.DataObject) -> None:
        """A get by key of a key whose only (or older) version belongs to a dead producer."""
        TALLY.step("get_dead_key")
        edge, key = data.draw(st.sampled_from(self._dead_versions()))
        self._get_by_key(receiver, edge, key)

    def _get_by_key(self, receiver: str, edge: tuple[str, str], key: str) -> None:
        dep = self._model()
        stamp_before = dep.directory.stamp
        scans_before = self.seams[receiver].calls["scandir"]
        expected = discovery_spec.process_get(dep, receiver, edge, key)
        got = self.receivers[receiver].get(edge, key)
        note(
            f"{receiver}.get({edge}, {key!r}) -> {got.status.value}, model {expected.status.value}"
        )
        self._compare(expected, got)
        if dep.directory.stamp != stamp_before:
            TALLY.label("stale marker pruned")
        if scans_before and self.seams[receiver].calls["scandir"] > scans_before:
            TALLY.label("rescan")
        if expected.status is DeploymentGetStatus.NOT_FOUND and any(
            not p.alive and get_route_of(p.connector, edge, key) for p in dep.producers.values()
        ):
            TALLY.label("dead producer's key not delivered")

    @rule(receiver=st.sampled_from(RECEIVERS), entry=published)
    def get_with_descriptor(
        self, receiver: str, entry: tuple[PublishedDescriptor, dict[str, Any], str]
    ) -> None:
        TALLY.step("get_with_descriptor")
        dep = self._model()
        model_descriptor, data, route = entry
        descriptor = descriptor_from_dict(Route(route), data)
        edge, key = descriptor.edge, descriptor.key
        expected = discovery_spec.process_get(dep, receiver, edge, key, model_descriptor)
        got = self.receivers[receiver].get(edge, key, descriptor=descriptor)
        note(f"{receiver}.get({descriptor}) -> {got.status.value}, model {expected.status.value}")
        self._compare(expected, got)
        if expected.status is DeploymentGetStatus.PRODUCER_GONE:
            TALLY.label("producer gone")
        elif expected.status is DeploymentGetStatus.STALE:
            TALLY.label("stale descriptor")

    def _compare(self, expected: discovery_spec.DeploymentGetResult, got: Any) -> None:
        assert got.status.value == expected.status.value, (
            f"get: model {expected.status.value}, implementation {got.status.value}"
        )
        if expected.status is not DeploymentGetStatus.DELIVERED:
            return
        tag = payload_tag(got.value)
        assert tag == expected.payload, (
            f"payload: model tag {expected.payload}, implementation {tag}"
        )
        assert got.route is expected.route, (
            f"route: model {expected.route}, implementation {got.route}"
        )
        assert got.producer == expected.producer, (
            f"producer: model {expected.producer}, implementation {got.producer}"
        )
        owner = self.tag_owner[tag]
        assert owner == got.producer and owner in self.live_in_slot.values(), (
            f"tag {tag} of producer {owner} delivered; live producers {self._alive()}"
        )
        TALLY.label("delivered from ring" if got.route is Route.RING else "delivered from fallback")

    # -- invariants ---------------------------------------------------------------------

    @invariant()
    def directory_lives_while_a_member_does(self) -> None:
        """`spec.discovery.is_directory_required`: never torn down under a live member (issue 22)."""
        if (
            self.dep is not None
            and self.directory
            and discovery_spec.is_directory_required(self.dep)
        ):
            assert os.path.isdir(self.directory), (
                "the deployment directory went under a live member"
            )

    @invariant()
    def agrees_with_model(self) -> None:
        if self.dep is None:
            return
        dep = self.dep
        invariants.check_deployment(dep)
        previous = self.previous_directory
        if previous is not None:
            invariants.check_stamp_step(previous, dep.directory)
        self.previous_directory = DirectoryState(set(dep.directory.markers), dep.directory.stamp)
        stamp = _read_stamp(self.directory)
        if stamp is not None:
            assert stamp == dep.directory.stamp, f"stamp: model {dep.directory.stamp}, file {stamp}"
        names = os.listdir(self.directory) if os.path.isdir(self.directory) else []
        markers = {
            parsed[::-1] for parsed in map(parse_marker_file_name, names) if parsed is not None
        }
        assert markers == dep.directory.markers, (
            f"markers: model {sorted(dep.directory.markers)}, files {sorted(markers)}"
        )
        for name, seam in self.seams.items():
            model_scans = dep.receivers[name].scans if name in dep.receivers else 0
            assert seam.calls["scandir"] == model_scans, (
                f"{name} scans: model {model_scans}, implementation {seam.calls['scandir']}"
            )
            # What the connector reports of them too (`health().scans`).
            reported = self.receivers[name].health().scans
            assert reported == model_scans, f"{name} health.scans {reported}, model {model_scans}"


def _read_stamp(directory: str) -> int | None:
    try:
        with open(os.path.join(directory, STAMP_FILE_NAME), "rb") as handle:
            data = handle.read(_U64.size)
    except FileNotFoundError:
        return None
    return _U64.unpack(data)[0] if len(data) == _U64.size else 0


RESTART_EVENT_LABELS = (
    "producer killed",
    "producer restarted in a used slot",
    "dead producer's key not delivered",
    "delivered from ring",
    "delivered from fallback",
    "producer gone",
)


class RestartLockstepMachine(DiscoveryLockstepMachine):
    """(d): one slot, producers killed often and restarted under the same keys."""

    SLOTS = 1
    LIFECYCLE_ODDS = 2
    CLOSE_ODDS = 8

    @precondition(lambda self: self.dep is not None and bool(self.live_in_slot))
    @rarely("LIFECYCLE_ODDS", data=st.data())
    def kill_producer_again(self, data: st.DataObject) -> None:
        """A second kill rule: restarts happen several times per run."""
        self._kill_producer(data)


__all__ = [
    "CI_PROFILE",
    "EVENT_LABELS",
    "LONG_PROFILE",
    "RESTART_CI_PROFILE",
    "RESTART_EVENT_LABELS",
    "RESTART_LONG_PROFILE",
    "TALLY",
    "DiscoveryLockstepMachine",
    "RestartLockstepMachine",
    "slot_keys",
]
