"""Crash points: SIGKILL a producer or a reader at a named place, in each ring state.

Design rationale. A fault plan makes a call fail; a crash makes the process
vanish between two stores, with its locks dropped by the kernel and its
files left as they were. Each crash cell forks one child that sets the ring
up in a chosen state (empty, partly full, wrapped past the end of the data
region), then kills itself with SIGKILL at the crash point:

producer (a `Connector` publishing; the ring's publish hook, or the OS seam
during close, names the place):
    after reserve    room decided, the slot reads "unpublished", no byte written
    after payload    key, payload and fill written, no header
    before header    every header field but the length written
    after length     frame complete, head not advanced
    after publish    put returned (head advanced)
    close locked     closing: CLOSED marked, killed holding the ring lock
    close unlink     closing: everything retired, killed before the unlink
    pool before ref  a pool put: payload in its slot (PUBLISHED), the reference
                     frame reserved on the ring, not one byte of it written
    pool after ref   a pool put returned (its reference frame published)

reader (the producer lives in the campaign's process):
    reader mid-copy    killed inside the copy of a claimed ring frame (holds the lock)
    reader lease       killed holding a lease on a ring frame
    fallback mid-copy  killed inside the copy of a fallback segment (holds its lock)
    pool claimed       killed holding a pool slot CLAIMED (a borrowed get of a pool payload)

After the child is dead the campaign checks, as the survivors see it:

* no torn frame is visible: a raw `RingReader` of the dead producer's ring
  walks it without a corruption error, reads every frame published before
  the crash byte for byte, and the crashed put's frame only when its
  publication completed;
* a dead producer's frames are never delivered through a connector, by key
  or by descriptor;
* a frame a killed reader was copying is delivered exactly once afterwards;
  a frame leased by a killed reader is never delivered again;
* a restarted producer (a new process identity) starts with an empty ring
  and its reused keys deliver only its own payloads;
* the survivor's first scan reclaims the dead producer's ring and its pool
  slot files;
* a slot a killed reader held CLAIMED is reused by its live producer (no
  new slot file), and its payload is not delivered again;
* once the survivors close, nothing of the deployment is left in /dev/shm.

* a ring frame leased by a killed reader is freed (once) when a later put
  finds the ring full: the claim records the holder's pid.

Not covered by the cells: reclaiming the arena frames a killed lease
holder kept (also recorded by pid; `test_crash.py` checks it with a process
of its own).
"""

from __future__ import annotations

import fcntl
import os
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from ..impl.codec import BORROWED_BYTES_MIN
from ..impl.connector import Connector, GetStatus, Route
from ..impl.connector.seams import Seams, seamed_connector
from ..impl.errors import ProducerGoneError
from ..impl.fallback import claim_segment
from ..impl.names import (
    current_producer_identity,
    deployment_directory,
    parse_pool_slot_file_name,
    ring_path,
)
from ..impl.os_seam import DEFAULT_OS, SITE_FLOCK, SITE_UNLINK, OsFacade
from ..impl.pool import is_pool_ref
from ..impl.ring.producer import (
    HOOK_FIELDS_WRITTEN,
    HOOK_LENGTH_STORED,
    HOOK_PAYLOAD_WRITTEN,
    HOOK_RESERVED,
)
from ..impl.ring.reader import RingReader
from ..impl.ring.results import ReceiveStatus
from ..spec.pool import compute_slot_charge
from ..spec.ring import ConsumeMode
from .kit.payloads import tagged_payload
from .kit.processes import ForkedChild, die, killed_by_sigkill

EDGE: Final = ("enc", "dec")
CAPACITY: Final = 4096
TARGET: Final = "target"
CHILD_TIMEOUT_S: Final = 60.0

PRODUCER_POINTS: Final = {
    "after reserve": HOOK_RESERVED,
    "after payload": HOOK_PAYLOAD_WRITTEN,
    "before header": HOOK_FIELDS_WRITTEN,
    "after length": HOOK_LENGTH_STORED,
    "after publish": None,
    "close locked": SITE_FLOCK,
    "close unlink": SITE_UNLINK,
    "pool before ref": HOOK_RESERVED,
    "pool after ref": None,
}
# Points after which the crashed put's frame is (and must be) readable by a raw reader.
_PUBLISHED_POINTS: Final = frozenset(("after publish", "pool after ref"))
READER_POINTS: Final = ("reader mid-copy", "reader lease", "fallback mid-copy", "pool claimed")
# Cells whose target is a payload the ring does not admit, carried by a pool slot:
# one class, large enough for a leaf a borrowed get borrows (it holds the slot
# CLAIMED until the view dies; smaller leaves are copied), room for two slots.
POOL_CLASS: Final = 2 * BORROWED_BYTES_MIN
POOL_POINTS: Final = frozenset(("pool before ref", "pool after ref", "pool claimed"))
POOL_OPTIONS: Final = {
    "pool_min_bytes": POOL_CLASS,
    "pool_max_bytes": POOL_CLASS,
    "pool_budget_bytes": 2 * compute_slot_charge(POOL_CLASS),
}
NO_POOL: Final = {"pool_budget_bytes": 0}
RING_STATES: Final = ("empty", "partly full", "wrapped")
BUDGET_ROUNDS: Final = {"quick": 1, "standard": 3, "deep": 10}


class CrashFailure(AssertionError):
    """A crash cell found a broken promise."""


@dataclass(frozen=True)
class CrashCell:
    point: str
    state: str
    size: int = 600  # payload bytes of the crashed put

    def __str__(self) -> str:
        return f"{self.point} / {self.state} / {self.size} bytes"


def enumerate_crash_cells(budget: str = "quick", seed: int = 0) -> list[CrashCell]:
    """Every crash point in every ring state; larger budgets repeat them with other payload sizes."""
    cells = []
    for round_ in range(BUDGET_ROUNDS[budget]):
        size = 600 if round_ == 0 else 64 + (seed * 7919 + round_ * 104729) % 900
        for point in (*PRODUCER_POINTS, *READER_POINTS):
            states = RING_STATES if point != "fallback mid-copy" else ("partly full",)
            for state in states:
                cells.append(CrashCell(point, state, size))
    return cells


def cell_name(cell: CrashCell) -> str:
    """The cell as a `shmring check --unit crash:NAME` name: ``point/state/size``, dashes for spaces."""
    return "/".join((cell.point.replace(" ", "-"), cell.state.replace(" ", "-"), str(cell.size)))


def _pool_options(cell: CrashCell) -> dict[str, int]:
    """The pool of the cell's connectors: on for the pool cells, off for the others."""
    return POOL_OPTIONS if cell.point in POOL_POINTS else NO_POOL


def _target_size(cell: CrashCell) -> int:
    """The crashed put's payload: for a pool cell, above the ring's admission (capacity / 4)
    and, for "pool claimed", a leaf a borrowed get keeps in place."""
    if cell.point == "pool claimed":
        return BORROWED_BYTES_MIN + cell.size
    return CAPACITY // 2 + cell.size % 1000 if cell.point in POOL_POINTS else cell.size


def _pool_files(directory: str, producer: tuple[int, ...]) -> list[str]:
    """Slot files of `producer`'s pool in the deployment directory."""
    return sorted(
        name
        for name in _listing(directory)
        if (parsed := parse_pool_slot_file_name(name)) is not None and parsed[0] == producer
    )


def parse_cell_name(name: str) -> CrashCell:
    """Inverse of `cell_name`; ValueError for a name that is not a crash cell."""
    parts = name.split("/")
    if len(parts) != 3 or not parts[2].isdigit():
        raise ValueError(f"not a crash cell (point/state/size): {name!r}")
    points = {point.replace(" ", "-"): point for point in (*PRODUCER_POINTS, *READER_POINTS)}
    states = {state.replace(" ", "-"): state for state in RING_STATES}
    if parts[0] not in points or parts[1] not in states:
        raise ValueError(f"no crash point {parts[0]!r} in ring state {parts[1]!r}")
    return CrashCell(points[parts[0]], states[parts[1]], int(parts[2]))


# -- processes -----------------------------------------------------------------------------


def _run_child(
    work: Callable[[Callable[[dict[str, Any]], None]], None],
) -> tuple[int, list[dict[str, Any]]]:
    """Run `work(report)` in a forked child until it dies; answers (wait status, its reports)."""
    child = ForkedChild(work, CHILD_TIMEOUT_S)
    try:
        return child.reap()
    except TimeoutError as error:
        raise CrashFailure(
            f"child {child.pid} did not reach its crash point within {CHILD_TIMEOUT_S} s"
        ) from error


class _CrashingOs(OsFacade):
    """Dies at a site while `dies_at(site)` holds: before an unlink, or right *after* taking a lock."""

    def __init__(self, dies_at: Callable[[str], bool]) -> None:
        self._dies_at = dies_at

    def _enter(self, site: str) -> None:
        if site != SITE_FLOCK and self._dies_at(site):
            die()

    def flock(self, fd: int, operation: int) -> None:
        super().flock(fd, operation)
        if operation & fcntl.LOCK_EX and self._dies_at(SITE_FLOCK):
            die()  # holding the lock: the kernel drops it with the process


# -- ring states ---------------------------------------------------------------------------


def _setup_state(producer: Connector, own_reader: Connector, state: str) -> dict[str, bytes]:
    """Bring the producer's ring into `state`; answers the payloads still deliverable."""
    kept: dict[str, bytes] = {}
    if state == "empty":
        producer.put(EDGE, "warm", tagged_payload(1, 100))  # ring set up, then drained
        own_reader.get(EDGE, "warm")
    elif state == "partly full":
        for index, size in ((2, 500), (3, 700)):
            kept[f"k{index}"] = tagged_payload(index, size)
            producer.put(EDGE, f"k{index}", kept[f"k{index}"])
    else:  # wrapped: three large frames consumed, then two more cross the end
        for index in (4, 5, 6):
            producer.put(EDGE, f"w{index}", tagged_payload(index, 900))
            own_reader.get(EDGE, f"w{index}")
        for index, size in ((7, 500), (8, 700)):
            kept[f"k{index}"] = tagged_payload(index, size)
            producer.put(EDGE, f"k{index}", kept[f"k{index}"])
        ring = producer.ring(EDGE)
        assert ring is not None and ring.head > CAPACITY, (
            f"ring did not wrap: head={ring and ring.head}"
        )
    return kept


# -- producer crash cells ---------------------------------------------------------------------


def _producer_child(
    scope: str, cell: CrashCell
) -> Callable[[Callable[[dict[str, Any]], None]], None]:
    stage = PRODUCER_POINTS[cell.point]

    def work(report: Callable[[dict[str, Any]], None]) -> None:
        armed = {"put": False, "close": False}

        def hook(reached: str) -> None:
            if armed["put"] and reached == stage:
                die()

        seam = _CrashingOs(lambda site: armed["close"] and site == stage)
        producer = seamed_connector(
            scope,
            Seams(publish_hook=hook),
            ring_capacity=CAPACITY,
            os_facade=seam,
            **_pool_options(cell),
        )
        own_reader = Connector(scope, ring_capacity=CAPACITY, pool_budget_bytes=0)
        kept = _setup_state(producer, own_reader, cell.state)
        identity = producer.identity  # (pid, start time, instance)
        ring = producer.ring(EDGE)
        assert ring is not None
        report({"identity": list(identity), "kept": sorted(kept), "head": ring.head})
        payload = tagged_payload(99, _target_size(cell))
        if cell.point.startswith("close"):
            descriptor = producer.put(EDGE, TARGET, payload)  # something to retire at close
            report({"target": descriptor.to_dict(), "route": descriptor.route.value})
            armed["close"] = True
            producer.close()
        else:
            armed["put"] = cell.point not in _PUBLISHED_POINTS
            descriptor = producer.put(EDGE, TARGET, payload)
            report({"target": descriptor.to_dict(), "route": descriptor.route.value})
            die()
        raise AssertionError(f"crash point {cell.point!r} was never reached")

    return work


def run_producer_cell(cell: CrashCell, scope: str) -> None:
    directory = deployment_directory(scope)
    receiver = Connector(scope, ring_capacity=CAPACITY, pool_budget_bytes=0)
    restarted: Connector | None = None
    raw: RingReader | None = None
    try:
        receiver.get(EDGE, "join")  # joined before the child starts: the directory outlives it
        status, reports = _run_child(_producer_child(scope, cell))
        _require(
            killed_by_sigkill(status),
            f"child was not killed at {cell.point!r}: status={status} reports={reports}",
        )
        info = reports[0]
        _require("identity" in info, f"child failed before its crash point: {reports}")
        identity = tuple(int(part) for part in info["identity"])
        kept = {key: _kept_payload(key) for key in info["kept"]}
        target = next((r for r in reports if "target" in r), None)
        published = cell.point in _PUBLISHED_POINTS or cell.point.startswith("close")
        # 1. Raw, before any survivor scans (a scan reclaims the dead ring): no torn frame.
        path = ring_path(directory, EDGE[0], EDGE[1], identity)
        try:
            raw = RingReader.attach(path)
        except ProducerGoneError:
            _require(
                cell.point.startswith("close"),
                f"ring of a producer killed at {cell.point!r} is gone",
            )
        if raw is not None:
            raw.statistics()  # walks every frame: CorruptFrameError on anything torn
            for key, payload in kept.items():
                got_raw = raw.get(key)
                _require(
                    got_raw.status is ReceiveStatus.DELIVERED
                    and got_raw.payload == _encoded(payload),
                    f"frame {key!r} published before the crash reads {got_raw.status}",
                )
            got_raw = raw.get(TARGET)
            if published and target is not None and target["route"] == Route.RING.value:
                _require(
                    got_raw.status is ReceiveStatus.DELIVERED
                    and got_raw.payload == _encoded(tagged_payload(99, cell.size)),
                    f"published target reads {got_raw.status}",
                )
            elif published and target is not None and target["route"] == Route.POOL.value:
                _require(
                    got_raw.status is ReceiveStatus.DELIVERED
                    and got_raw.payload is not None
                    and is_pool_ref(got_raw.payload),
                    f"published pool target reads {got_raw.status}, not its reference",
                )
            elif not published:
                _require(
                    got_raw.status is ReceiveStatus.NOT_FOUND,
                    f"target killed at {cell.point!r} is visible: {got_raw.status}",
                )
            raw.close()
            raw = None
        # 2. Through a connector: nothing of the dead producer is ever delivered, and
        # the receiver's scan reclaimed its ring (spec.discovery.process_reclaim).
        for key in (*kept, TARGET):
            got = receiver.get(EDGE, key)
            _require(not got.delivered, f"dead producer's {key!r} delivered: {got}")
        if target is not None and target["route"] == Route.RING.value:
            from ..impl.connector import descriptor_from_dict

            stale = descriptor_from_dict(Route.RING, target["target"])
            got = receiver.get(EDGE, TARGET, descriptor=stale)
            _require(
                got.status is GetStatus.PRODUCER_GONE, f"dead producer's descriptor answered {got}"
            )
        _require(not os.path.lexists(path), f"ring of the dead producer not reclaimed: {path}")
        if cell.point in POOL_POINTS:
            _require(
                target is None or target["route"] == Route.POOL.value,
                f"the pool cell's target took {target}",
            )
            left = _pool_files(directory, identity)
            _require(not left, f"slot files of the dead producer not reclaimed: {left}")
        # 3. A restarted producer starts clean and owns the reused keys.
        restarted = Connector(scope, ring_capacity=CAPACITY, pool_budget_bytes=0)
        fresh = {key: tagged_payload(200 + index, 300) for index, key in enumerate((*kept, TARGET))}
        for key, payload in fresh.items():
            restarted.put(EDGE, key, payload)
        ring = restarted.ring(EDGE)
        _require(
            ring is not None and ring.tail == 0, f"restarted ring does not start clean: {ring}"
        )
        for key, payload in fresh.items():
            got = receiver.get(EDGE, key)
            _require(
                got.delivered and got.value == payload and got.producer == restarted.identity,
                f"reused key {key!r} answered {got.status} from {got.producer}",
            )
    finally:
        if raw is not None:
            raw.close()
        if restarted is not None:
            restarted.close()
        receiver.close()
    _require(
        not os.path.lexists(directory), lambda: f"survivors closed, left {_listing(directory)}"
    )


def _kept_payload(key: str) -> bytes:
    index = int(key[1:])
    return tagged_payload(index, {2: 500, 3: 700, 7: 500, 8: 700}[index])


def _encoded(payload: bytes) -> bytes:
    from ..impl import codec

    return codec.encode(payload)


# -- reader crash cells ----------------------------------------------------------------------


def _reader_child(
    path: str, directory: str, cell: CrashCell, scope: str
) -> Callable[[Callable[[dict[str, Any]], None]], None]:
    def work(report: Callable[[dict[str, Any]], None]) -> None:
        if cell.point == "pool claimed":
            consumer = Connector(scope, ring_capacity=CAPACITY, pool_budget_bytes=0)
            held = consumer.get(EDGE, TARGET, borrow=True)  # the slot CLAIMED while held
            report({"claimed": held.status.value, "route": str(held.route and held.route.value)})
            die()
        if cell.point == "fallback mid-copy":

            def copying(view: memoryview) -> None:
                bytes(view[: len(view) // 2])
                die()

            claim_segment(
                directory,
                EDGE,
                TARGET,
                os_facade=DEFAULT_OS,
                is_alive=lambda _: True,
                decode=copying,
            )
        else:
            reader = RingReader.attach(path)
            if cell.point == "reader lease":
                got = reader.get(TARGET, mode=ConsumeMode.LEASE)
                report({"leased": got.status.value})
                die()

            def copying_ring(view: memoryview) -> None:
                bytes(view[: len(view) // 2])
                die()

            reader.get(TARGET, decode=copying_ring)
        raise AssertionError(f"crash point {cell.point!r} was never reached")

    return work


def run_reader_cell(cell: CrashCell, scope: str) -> None:
    directory = deployment_directory(scope)
    producer = Connector(scope, ring_capacity=CAPACITY, **_pool_options(cell))
    receiver = Connector(scope, ring_capacity=CAPACITY, pool_budget_bytes=0)
    try:
        kept = _setup_state(producer, receiver, cell.state)
        size = max(cell.size, 1200) if cell.point == "fallback mid-copy" else _target_size(cell)
        payload = tagged_payload(77, size)
        descriptor = producer.put(EDGE, TARGET, payload)
        expected_route = {"fallback mid-copy": Route.FALLBACK, "pool claimed": Route.POOL}.get(
            cell.point, Route.RING
        )
        _require(descriptor.route is expected_route, f"target took the {descriptor.route} route")
        ring = producer.ring(EDGE)
        assert ring is not None
        status, reports = _run_child(_reader_child(ring.path, directory, cell, scope))
        _require(
            killed_by_sigkill(status),
            f"reader was not killed at {cell.point!r}: status={status} reports={reports}",
        )
        got = receiver.get(EDGE, TARGET)
        if cell.point == "pool claimed":
            _require(
                reports == [{"claimed": "delivered", "route": Route.POOL.value}],
                f"pool child reported {reports}",
            )
            _require(not got.delivered, f"a payload a killed reader claimed was delivered: {got}")
            _check_dead_holder_slot_reused(producer, receiver)
        elif cell.point == "reader lease":
            _require(reports == [{"leased": "delivered"}], f"lease child reported {reports}")
            _require(
                not got.delivered, f"a frame leased by a killed reader was delivered again: {got}"
            )
        else:
            _require(
                got.delivered and got.value == payload,
                f"frame a killed reader was copying: {got.status}",
            )
            again = receiver.get(EDGE, TARGET)
            _require(not again.delivered, "frame a killed reader was copying delivered twice")
        for key, value in kept.items():  # other frames unaffected
            other = receiver.get(EDGE, key)
            _require(
                other.delivered and other.value == value,
                f"{key!r} after the reader crash: {other.status}",
            )
        # The producer keeps serving; a frame leased by the killed reader is
        # freed once a put finds the ring full (its holder is dead), so the
        # ring goes on past it instead of pinning there.
        routes = []
        for index in range(12):
            sent = tagged_payload(300 + index, 700)
            routes.append(producer.put(EDGE, f"after{index}", sent).route)
            got = receiver.get(EDGE, f"after{index}")
            _require(
                got.delivered and got.value == sent, f"put after the reader crash: {got.status}"
            )
        if cell.point == "reader lease":
            freed = ring.statistics().reclaimed_from_dead_holders
            _require(freed == 1, f"the killed holder's frame was freed {freed} times, not once")
            _require(routes[-1] is Route.RING, f"the ring stayed pinned by a dead holder: {routes}")
    finally:
        producer.close()
        receiver.close()
    _require(
        not os.path.lexists(directory), lambda: f"survivors closed, left {_listing(directory)}"
    )


def _check_dead_holder_slot_reused(producer: Connector, receiver: Connector) -> None:
    """The slot a killed reader holds CLAIMED is reused; no slot file is created for it."""
    before = producer.health()
    # The pool holds two slots: one the dead reader holds, one free. Two puts
    # left unclaimed need both; a third (their carriers pending) falls back.
    routes = []
    for index in range(3):
        routes.append(producer.put(EDGE, f"pool{index}", tagged_payload(400 + index, 3000)).route)
    after = producer.health()
    _require(
        routes[:2] == [Route.POOL, Route.POOL] and routes[2] is Route.FALLBACK,
        f"puts after the holder died took {routes}",
    )
    _require(
        after.pool_slots_created - before.pool_slots_created <= 1
        and after.pool_slots_reused > before.pool_slots_reused,
        f"the dead holder's slot was not reused: before {before}, after {after}",
    )
    for index in range(3):
        got = receiver.get(EDGE, f"pool{index}")
        _require(
            got.delivered and got.value == tagged_payload(400 + index, 3000),
            f"pool{index} after the holder died: {got.status}",
        )


# -- campaign -------------------------------------------------------------------------------


def _require(condition: bool, message: str | Callable[[], str]) -> None:
    if not condition:
        raise CrashFailure(message() if callable(message) else message)


def _listing(directory: str) -> list[str]:
    try:
        return sorted(os.listdir(directory))
    except OSError:
        return []


def run_crash_cell(cell: CrashCell, scope: str | None = None) -> None:
    """One crash cell; CrashFailure names the broken promise."""
    scope = scope or f"cr{uuid.uuid4().hex[:10]}"
    current_producer_identity()
    if cell.point in PRODUCER_POINTS:
        run_producer_cell(cell, scope)
    else:
        run_reader_cell(cell, scope)


def run_crash(
    budget: str, seed: int, progress: Callable[[int, int | None], None]
) -> dict[str, int]:
    """Every crash cell of the budget; CrashFailure lists the failing ones."""
    import logging
    import shutil

    cells = enumerate_crash_cells(budget, seed)
    failed: list[str] = []
    progress(0, len(cells))
    logger = logging.getLogger("shmring")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        for index, cell in enumerate(cells):
            scope = f"cr{seed % 10000}x{uuid.uuid4().hex[:8]}"
            try:
                run_crash_cell(cell, scope)
            except Exception as error:  # noqa: BLE001 - every failure is reported
                failed.append(f"[{cell}] {type(error).__name__}: {error}")
                shutil.rmtree(deployment_directory(scope), ignore_errors=True)
            progress(index + 1, len(cells))
    finally:
        logger.setLevel(level)
    if failed:
        raise CrashFailure(
            f"{len(failed)} of {len(cells)} crash cells failed:\n"
            + "\n".join(failed[:12])
            + "\n    rerun one: python -c 'from shmring.fault_injection.crash import *; "
            'run_crash_cell(CrashCell("<point>", "<state>", <size>))\''
        )
    return {"crash_points": len(cells), "crash_failed": 0}


__all__ = [
    "PRODUCER_POINTS",
    "READER_POINTS",
    "RING_STATES",
    "CrashCell",
    "CrashFailure",
    "cell_name",
    "enumerate_crash_cells",
    "parse_cell_name",
    "run_crash",
    "run_crash_cell",
]
