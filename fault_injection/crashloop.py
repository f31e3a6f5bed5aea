"""Crash loop: producers SIGKILLed one after another while traffic flows (issue 12, part 2).

Design rationale. Issue 12's probe killed 50 producers in 180 s and watched
/dev/shm grow by about 25 MiB per kill (rings and spare segment files) until
`shmring gc` or the last close. Live members now reclaim a dead producer's
files at their next discovery scan (`discovery.reclaim_dead_files`, the
model's `process_reclaim`); this campaign checks it under a crash loop:

* a long-lived producer (a child process, alive throughout) publishes
  tagged payloads, on the ring and through fallback segments;
* `kills` short-lived producers, one at a time, join, publish ring frames,
  fallback segments and a kept (spare) segment, and are SIGKILLed holding
  everything;
* the receiver (this process) gets the live producer's keys between kills.

It records the number and bytes of files in the deployment directory after
each kill, once the receiver's next get has run, and answers them with what
was lost. Promises: the directory stays within the live producers' files
plus a constant (the one producer killed since the last scan), and every
payload the live producer had accepted is delivered exactly once, intact.

With `pool=True` (issue 13) every connector has a pool of two slots of one
class (`POOL_OPTIONS`) and the large payloads take it: sizes above the
ring's admission and within the class's slot capacity
(`layout.compute_slot_capacity`), so every third live payload is a pool
put (`pool_puts` counts them). The short-lived producer is then one role
restarted again and again on the same keys: each incarnation commits a
ring frame and a pool payload ("dp"), then is SIGKILLed *inside* its next
pool put ("dq", its payload PUBLISHED in its slot) at one of the ring's
publish stages (`CRASH_STAGES`, in turn: the reference frame reserved, its
payload, its fields, its length written). While it hangs there the
receiver gets "dp": it must come from this incarnation (`restarts_seen`,
the distinct producer identities that delivered it, and its tag), by the
pool route. After the kill neither "dq" nor anything else of the dead
incarnation may be delivered. At the end `shmring gc` (`admin.collect`)
runs while the live members are still there, and no file of any dead
producer, pool slot files included, may be left (`dead_files_after_gc`).
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from dataclasses import dataclass
from typing import Any, Final

from ..impl import admin
from ..impl.connector import Connector, GetStatus, Route
from ..impl.connector.seams import Seams, seamed_connector
from ..impl.names import file_owner, parse_pool_slot_file_name
from ..impl.ring.producer import (
    HOOK_FIELDS_WRITTEN,
    HOOK_LENGTH_STORED,
    HOOK_PAYLOAD_WRITTEN,
    HOOK_RESERVED,
)
from ..spec.layout import ADMISSION_DIVISOR, POOL_CLASS_HEADROOM, compute_slot_capacity
from ..spec.pool import compute_slot_charge
from .kit.payloads import tagged_payload
from .kit.processes import ForkedChild, Report

EDGE: Final = ("work", "sink")
DEAD_EDGE: Final = ("crash", "sink")
RING_CAPACITY: Final = 64 * 1024
SPARE_MIN: Final = 64 * 1024  # small enough that the crashing producers keep spares
_BIG: Final = 100 * 1024  # > capacity / 4: a fallback segment, kept as a spare
_CHILD_TIMEOUT_S: Final = 60.0
# The pool of every connector with `pool=True`: one class, room for two slots.
POOL_CLASS: Final = 64 * 1024
POOL_OPTIONS: Final = {
    "pool_min_bytes": POOL_CLASS,
    "pool_max_bytes": POOL_CLASS,
    "pool_budget_bytes": 2 * compute_slot_charge(POOL_CLASS),
}
NO_POOL: Final = {"pool_budget_bytes": 0}
# A pool payload: more than the class (the headroom takes the rest), less than
# its capacity, far above what the ring admits.
_POOL_BIG: Final = POOL_CLASS + POOL_CLASS_HEADROOM // 2
assert RING_CAPACITY // ADMISSION_DIVISOR < _POOL_BIG < compute_slot_capacity(POOL_CLASS) - 4096
# Where an incarnation of the restarted producer dies inside its pool put, in turn.
CRASH_STAGES: Final = (HOOK_RESERVED, HOOK_PAYLOAD_WRITTEN, HOOK_FIELDS_WRITTEN, HOOK_LENGTH_STORED)


@dataclass(frozen=True)
class CrashLoopReport:
    kills: int
    files_after_kill: tuple[int, ...]  # files in the directory after each kill and a get
    bytes_after_kill: tuple[int, ...]  # their bytes on disk (st_blocks * 512)
    live_files: int  # the live producer's and receiver's own files at the end
    delivered: int  # live payloads delivered
    lost: tuple[str, ...]  # live keys accepted but never delivered, or delivered wrong
    reclaimed: int  # files the receiver reclaimed (its health counter)
    pool_puts: int = 0  # live puts the pool carried (pool=True)
    restarts_seen: int = 0  # incarnations whose committed pool payload came from themselves
    dead_files_after_gc: tuple[str, ...] = ()  # files of dead producers left after gc
    # after each kill and a get: slot files of incarnations before the one just killed
    stale_slot_files: tuple[int, ...] = ()


def _payload(tag: int, size: int) -> dict[str, Any]:
    return {"tag": tag, "fill": tagged_payload(tag, size)}


def _directory_usage(path: str) -> tuple[int, int]:
    try:
        names = os.listdir(path)
    except FileNotFoundError:
        return 0, 0
    used = 0
    for name in names:
        with contextlib.suppress(FileNotFoundError):
            used += os.stat(os.path.join(path, name)).st_blocks * 512
    return len(names), used


def _expect(child: ForkedChild, field: str) -> Any:
    """The `field` of the child's next report (AssertionError if it reported something else)."""
    message = child.next_report()
    if field not in message:
        raise AssertionError(f"crash-loop child {child.pid} reported {message}, expected {field!r}")
    return message[field]


def _doomed(scope: str, index: int, report: Report) -> None:  # pragma: no cover - child
    connector = Connector(
        scope,
        ring_capacity=RING_CAPACITY,
        pool_budget_bytes=0,
        fallback_spare_min_bytes=SPARE_MIN,
    )
    connector.put(DEAD_EDGE, f"d{index}r", _payload(index, 100))  # ring, marker, live file
    connector.put(DEAD_EDGE, f"d{index}f", _payload(index, _BIG))  # a segment, kept for reuse
    connector.put(DEAD_EDGE, f"d{index}g", _payload(index, _BIG))  # and an unclaimed one
    report({"ready": index})
    time.sleep(_CHILD_TIMEOUT_S)  # killed here, holding everything


def _doomed_pool(scope: str, index: int, report: Report) -> None:  # pragma: no cover - child
    """An incarnation of the restarted producer: commits, then dies inside a pool put."""
    stage = CRASH_STAGES[index % len(CRASH_STAGES)]
    armed = False

    def hook(reached: str) -> None:
        if armed and reached == stage:
            report({"ready": index, "identity": list(connector.identity), "stage": reached})
            time.sleep(_CHILD_TIMEOUT_S)  # killed here, mid-put

    connector = seamed_connector(
        scope,
        Seams(publish_hook=hook),
        ring_capacity=RING_CAPACITY,
        fallback_spare_min_bytes=SPARE_MIN,
        **POOL_OPTIONS,
    )
    connector.put(DEAD_EDGE, "dr", _payload(index, 100))  # ring, marker, live file
    committed = connector.put(DEAD_EDGE, "dp", _payload(index, _POOL_BIG))  # a slot
    report({"committed": committed.route.value})
    armed = True
    connector.put(DEAD_EDGE, "dq", _payload(index, _POOL_BIG))  # the second slot, then the hook
    report({"error": "the crash stage was never reached"})


def _live_size(tag: int, pool: bool) -> int:
    if tag % 3:
        return 200
    return _POOL_BIG if pool else _BIG


def _live(
    scope: str, total: int, report: Report, read_end: int, pool: bool
) -> None:  # pragma: no cover
    with Connector(
        scope,
        ring_capacity=RING_CAPACITY,
        fallback_spare_min_bytes=SPARE_MIN,
        **(POOL_OPTIONS if pool else NO_POOL),
    ) as connector:
        for tag in range(total):
            put = connector.put(EDGE, f"live{tag}", _payload(tag, _live_size(tag, pool)))
            report({"tag": tag, "route": put.route.value, "identity": list(connector.identity)})
            os.read(read_end, 1)  # wait until the receiver took it (bounded traffic)
        report({"done": total})
        os.read(read_end, 1)  # stay alive (and open) until the receiver is done


def run_crash_loop(scope: str, kills: int, *, pool: bool = False) -> CrashLoopReport:
    """Run the loop (see the module docstring) in `scope`; answers what it measured."""
    receiver = Connector(scope, ring_capacity=RING_CAPACITY, pool_budget_bytes=0)
    directory = receiver.directory
    receiver.get(EDGE, "join")  # joins: the directory outlives every producer
    to_live_r, to_live_w = os.pipe()
    live = ForkedChild(
        lambda report: _live(scope, kills, report, to_live_r, pool), _CHILD_TIMEOUT_S
    )
    os.close(to_live_r)
    files: list[int] = []
    used: list[int] = []
    lost: list[str] = []
    delivered = pool_puts = 0
    incarnations: set[tuple[int, ...]] = set()
    dead_left: tuple[str, ...] = ()
    stale: list[int] = []
    live_producer: tuple[int, ...] = ()
    last: tuple[int, ...] = ()  # the incarnation killed last (pool=True)
    try:
        for index in range(kills):
            message = live.next_report()
            if "tag" not in message:
                raise AssertionError(f"live producer reported {message}")
            tag = int(message["tag"])
            pool_puts += message["route"] == Route.POOL.value
            live_producer = tuple(message["identity"])
            if pool:
                last = _restart_and_kill_mid_put(scope, index, receiver, incarnations, lost)
            else:
                doomed = ForkedChild(
                    lambda report, i=index: _doomed(scope, i, report), _CHILD_TIMEOUT_S
                )
                try:
                    _expect(doomed, "ready")
                finally:
                    doomed.kill()
            got = receiver.get_with_deadline(EDGE, f"live{tag}", timeout=10.0)
            value = got.value if got.status is GetStatus.DELIVERED else None
            expected = _payload(tag, _live_size(tag, pool))
            if value is None or value["tag"] != tag or bytes(value["fill"]) != expected["fill"]:
                lost.append(f"live{tag}: {got.status.value}")
            else:
                delivered += 1
            os.write(to_live_w, b"k")
            count, size = _directory_usage(directory)
            files.append(count)
            used.append(size)
            if pool:  # the one just killed may wait for the next scan; no earlier one may
                stale.append(len(_slot_files(directory, exclude={live_producer, last})))
        _expect(live, "done")
        live_files, _ = _directory_usage(directory)
        reclaimed = receiver.health().reclaimed_files
        if pool:
            live_owner = live_producer[:2]
            admin.collect(scope)  # `shmring gc`, with the live members still there
            members = {live_owner, tuple(receiver.identity[:2])}
            dead_left = tuple(
                name
                for name in sorted(os.listdir(directory))
                if (owner := file_owner(name)) is not None and tuple(owner) not in members
            )
    finally:
        with contextlib.suppress(OSError):
            os.write(to_live_w, b"k")
        os.close(to_live_w)
        status, _ = live.reap()
        receiver.close()
    if status != 0:
        lost.append(f"the live producer failed: status={status}")
    return CrashLoopReport(
        kills,
        tuple(files),
        tuple(used),
        live_files,
        delivered,
        tuple(lost),
        reclaimed,
        pool_puts,
        len(incarnations),
        dead_left,
        tuple(stale),
    )


def _slot_files(directory: str, exclude: set[tuple[int, ...]]) -> list[str]:
    """Pool slot files in `directory` of producers not in `exclude`."""
    return [
        name
        for name in os.listdir(directory)
        if (parsed := parse_pool_slot_file_name(name)) is not None and parsed[0] not in exclude
    ]


def _restart_and_kill_mid_put(
    scope: str,
    index: int,
    receiver: Connector,
    incarnations: set[tuple[int, ...]],
    lost: list[str],
) -> tuple[int, ...]:
    """Start incarnation `index` of the restarted producer, take its committed pool payload
    while it hangs inside its next pool put, SIGKILL it there; nothing more of it delivered.
    Answers its identity."""
    identity: tuple[int, ...] = ()
    doomed = ForkedChild(lambda report: _doomed_pool(scope, index, report), _CHILD_TIMEOUT_S)
    try:
        committed = _expect(doomed, "committed")
        if committed != Route.POOL.value:
            lost.append(f"incarnation {index}: its large put took the {committed} route")
        ready = doomed.next_report()
        if ready.get("ready") != index:
            raise AssertionError(f"incarnation {index} reported {ready}")
        identity = tuple(ready["identity"])
        slots = [
            name
            for name in os.listdir(receiver.directory)
            if (parsed := parse_pool_slot_file_name(name)) is not None and parsed[0] == identity
        ]
        if len(slots) != 2:  # dp's and dq's, both PUBLISHED
            lost.append(f"incarnation {index}: slot files {slots} while it hangs mid-put")
        got = receiver.get_with_deadline(DEAD_EDGE, "dp", timeout=10.0)
        value = got.value if got.status is GetStatus.DELIVERED else None
        if (
            value is None
            or got.route is not Route.POOL
            or tuple(got.producer or ()) != identity
            or value["tag"] != index
            or bytes(value["fill"]) != _payload(index, _POOL_BIG)["fill"]
        ):
            lost.append(f"incarnation {index}: committed dp answered {got.status.value}")
        else:
            incarnations.add(identity)
    finally:
        doomed.kill()
    for key in ("dq", "dr", "dp"):  # killed mid-put, never taken, taken: none is delivered
        got = receiver.get(DEAD_EDGE, key)
        if got.delivered:
            lost.append(f"incarnation {index} ({ready.get('stage')}): dead {key} delivered")
    return identity


def main() -> None:  # pragma: no cover - the probe, by hand
    import sys
    import uuid

    kills = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    pool = len(sys.argv) > 2 and sys.argv[2] == "pool"
    report = run_crash_loop(f"cl{uuid.uuid4().hex[:8]}", kills, pool=pool)
    print(json.dumps(report.__dict__))


if __name__ == "__main__":  # pragma: no cover
    main()


__all__ = ["CrashLoopReport", "run_crash_loop"]
