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
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from dataclasses import dataclass
from typing import Any, Final

from shmring.fault_injection.kit.payloads import tagged_payload
from shmring.fault_injection.kit.processes import ForkedChild, Report
from shmring.impl.connector import Connector, GetStatus

EDGE: Final = ("work", "sink")
DEAD_EDGE: Final = ("crash", "sink")
RING_CAPACITY: Final = 64 * 1024
SPARE_MIN: Final = 64 * 1024  # small enough that the crashing producers keep spares
_BIG: Final = 100 * 1024  # > capacity / 4: a fallback segment, kept as a spare
_CHILD_TIMEOUT_S: Final = 60.0


@dataclass(frozen=True)
class CrashLoopReport:
    kills: int
    files_after_kill: tuple[int, ...]  # files in the directory after each kill and a get
    bytes_after_kill: tuple[int, ...]  # their bytes on disk (st_blocks * 512)
    live_files: int  # the live producer's and receiver's own files at the end
    delivered: int  # live payloads delivered
    lost: tuple[str, ...]  # live keys accepted but never delivered, or delivered wrong
    reclaimed: int  # files the receiver reclaimed (its health counter)


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


def _live(scope: str, total: int, report: Report, read_end: int) -> None:  # pragma: no cover
    with Connector(
        scope, ring_capacity=RING_CAPACITY, pool_budget_bytes=0, fallback_spare_min_bytes=SPARE_MIN
    ) as connector:
        for tag in range(total):
            size = _BIG if tag % 3 == 0 else 200
            connector.put(EDGE, f"live{tag}", _payload(tag, size))
            report({"tag": tag})
            os.read(read_end, 1)  # wait until the receiver took it (bounded traffic)
        report({"done": total})
        os.read(read_end, 1)  # stay alive (and open) until the receiver is done


def run_crash_loop(scope: str, kills: int) -> CrashLoopReport:
    """Run the loop (see the module docstring) in `scope`; answers what it measured."""
    receiver = Connector(scope, ring_capacity=RING_CAPACITY, pool_budget_bytes=0)
    directory = receiver.directory
    receiver.get(EDGE, "join")  # joins: the directory outlives every producer
    to_live_r, to_live_w = os.pipe()
    live = ForkedChild(lambda report: _live(scope, kills, report, to_live_r), _CHILD_TIMEOUT_S)
    os.close(to_live_r)
    files: list[int] = []
    used: list[int] = []
    lost: list[str] = []
    delivered = 0
    try:
        for index in range(kills):
            tag = int(_expect(live, "tag"))
            doomed = ForkedChild(
                lambda report, i=index: _doomed(scope, i, report), _CHILD_TIMEOUT_S
            )
            try:
                _expect(doomed, "ready")
            finally:
                doomed.kill()
            got = receiver.get_with_deadline(EDGE, f"live{tag}", timeout=10.0)
            value = got.value if got.status is GetStatus.DELIVERED else None
            expected = _payload(tag, _BIG if tag % 3 == 0 else 200)
            if value is None or value["tag"] != tag or bytes(value["fill"]) != expected["fill"]:
                lost.append(f"live{tag}: {got.status.value}")
            else:
                delivered += 1
            os.write(to_live_w, b"k")
            count, size = _directory_usage(directory)
            files.append(count)
            used.append(size)
        _expect(live, "done")
        live_files, _ = _directory_usage(directory)
        reclaimed = receiver.health().reclaimed_files
    finally:
        with contextlib.suppress(OSError):
            os.write(to_live_w, b"k")
        os.close(to_live_w)
        status, _ = live.reap()
        receiver.close()
    if status != 0:
        lost.append(f"the live producer failed: status={status}")
    return CrashLoopReport(
        kills, tuple(files), tuple(used), live_files, delivered, tuple(lost), reclaimed
    )


def main() -> None:  # pragma: no cover - the probe, by hand
    import sys
    import uuid

    kills = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    report = run_crash_loop(f"cl{uuid.uuid4().hex[:8]}", kills)
    print(json.dumps(report.__dict__))


if __name__ == "__main__":  # pragma: no cover
    main()


__all__ = ["CrashLoopReport", "run_crash_loop"]
