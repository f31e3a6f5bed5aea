"""A reader with a low descriptor limit and many producers (issue 12, part 3).

Design rationale. Issue 12's probe ran a reader under ``ulimit -n 64`` with
80 live producers: every get raised a bare ``OSError(EMFILE)`` from
discovery, so not even the first producers were served. Here the producers
are connectors in this process publishing as 80 helper processes (`sleep`,
so their pidfds and /proc entries are real), each putting one ring frame and
(every fourth) one fallback segment on the same edge; the reader is a child
process whose RLIMIT_NOFILE is set with `resource.setrlimit` before it
imports anything, and which gets every key twice (a first pass, then the
keys the first pass missed). It prints one JSON line: what it delivered,
and the errors by type (a bare OSError is one that is not a ShmringError);
the keys it missed are then got by a reader without the limit (`recovered`:
a shortage never loses a payload).

With `pool=True` the large payloads go to each producer's pool instead (one
slot file per producer): the reader maps a slot of every fourth producer,
so its slot mapping cache meets the descriptor limit too.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections import Counter
from typing import Any, Final

from ..spec.layout import MIN_POOL_CLASS
from ..spec.pool import compute_slot_charge

EDGE: Final = ("many", "one")
_LARGE: Final = 3000  # > a quarter of the 4 KiB ring: a fallback segment (or a pool slot)
_CHILD_TIMEOUT_S: Final = 300
# The pool of a producer with `pool=True`: one slot of the smallest class.
_POOL: Final = {
    "pool_min_bytes": MIN_POOL_CLASS,
    "pool_max_bytes": MIN_POOL_CLASS,
    "pool_budget_bytes": compute_slot_charge(MIN_POOL_CLASS),
}


def _reader(scope: str, keys: list[str], limit: int) -> dict[str, Any]:
    import resource

    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))
    from ..impl.connector import Connector, GetStatus
    from ..impl.errors import ShmringError

    delivered: set[str] = set()
    typed: Counter[str] = Counter()
    bare: Counter[str] = Counter()
    wrong = 0
    with Connector(scope, ring_capacity=4096, pool_budget_bytes=0) as reader:
        for _ in range(2):
            for key in keys:
                if key in delivered:
                    continue
                try:
                    got = reader.get(EDGE, key)
                except ShmringError as error:
                    typed[type(error).__name__] += 1
                    continue
                except OSError as error:
                    bare[str(error.errno)] += 1
                    continue
                if got.status is GetStatus.DELIVERED:
                    if got.value.get("key") != key:
                        wrong += 1
                    delivered.add(key)
    return {
        "missed": sorted(set(keys) - delivered),
        "delivered": len(delivered),
        "typed": dict(typed),
        "bare": dict(bare),
        "wrong": wrong,
    }


def _recover(scope: str, missed: list[str]) -> int:
    """How many keys the limited reader missed are delivered, intact, without the limit."""
    from ..impl.connector import Connector, GetStatus

    recovered = 0
    with Connector(scope, ring_capacity=4096, pool_budget_bytes=0) as reader:
        for key in missed:
            got = reader.get(EDGE, key)
            recovered += got.status is GetStatus.DELIVERED and got.value.get("key") == key
    return recovered


def run_probe(
    scope: str, producers: int = 80, limit: int = 64, *, pool: bool = False
) -> dict[str, Any]:
    """Start `producers` helper identities, publish, run the limited reader; answers its report.

    `pool`: the large payloads in pool slots (the report counts the pool puts).
    """
    from ..impl.connector.seams import Seams, seamed_connector
    from ..impl.names import read_start_time

    helpers = [
        subprocess.Popen(["sleep", "600"], stdin=subprocess.DEVNULL) for _ in range(producers)
    ]
    connectors = []
    try:
        keys = []
        for index, helper in enumerate(helpers):
            start = read_start_time(helper.pid)
            assert start is not None
            connector = seamed_connector(
                scope,
                Seams(identity=(helper.pid, start)),
                ring_capacity=4096,
                **(_POOL if pool else {"pool_budget_bytes": 0}),
            )
            connectors.append(connector)
            key = f"p{index}"
            payload: dict[str, Any] = {"key": key}
            connector.put(EDGE, key, payload)
            keys.append(key)
            if index % 4 == 0:
                big = f"p{index}big"
                connector.put(EDGE, big, {"key": big, "fill": b"x" * _LARGE})
                keys.append(big)
        code = (
            "import json, sys; from shmring.fault_injection import fdlimit; "
            "print(json.dumps(fdlimit._reader(sys.argv[1], sys.argv[3].split(','), int(sys.argv[2]))))"
        )
        done = subprocess.run(
            [sys.executable, "-c", code, scope, str(limit), ",".join(keys)],
            capture_output=True,
            timeout=_CHILD_TIMEOUT_S,
        )
        lines = done.stdout.decode().strip().splitlines()
        if done.returncode != 0 or not lines:
            raise AssertionError(
                f"reader failed: rc={done.returncode} stderr={done.stderr.decode()[-3000:]}"
            )
        report: dict[str, Any] = json.loads(lines[-1])
        report["keys"] = len(keys)
        report["pool_puts"] = sum(connector.health().pool_puts for connector in connectors)
        report["recovered"] = _recover(scope, report.pop("missed"))
        return report
    finally:
        for connector in connectors:
            with contextlib.suppress(Exception):
                connector.close()
        for helper in helpers:
            helper.kill()
            helper.wait()


__all__ = ["EDGE", "run_probe"]


if __name__ == "__main__":  # pragma: no cover - the probe, by hand
    import uuid

    print(json.dumps(run_probe(f"fd{uuid.uuid4().hex[:8]}", *map(int, sys.argv[1:]))))
    os._exit(0)
