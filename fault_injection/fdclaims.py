"""Many outstanding pooled keys and a tight descriptor limit (issue 22, defects 2 and 5).

Design rationale. Issue 22's probe put 60 large keys through one
producer's pool and read them with a reader under a low RLIMIT_NOFILE:
the reader got ResourceExhaustedError ("retry later") for some, and 9 to 24
of those were "not found" on retry, so the claim that failed had taken
the key with it. `reader_probe` repeats that: the producer is this
process, the reader a child whose limit is set with `resource.setrlimit`
before it imports shmring (optionally holding every borrowed payload it
gets), which after its first key takes every descriptor left (so a claim
gets only what a shed frees) and retries a typed failure in later passes;
its last pass runs after it gave the descriptors and every held payload
back. Then a reader
without a limit gets what the child missed. A key is lost when neither
delivered it, and delivered twice when both did.

`producer_probe` is defect 5: a producer child under the limit makes
`puts` large puts that nobody reads (each holds its pool slot) and reports
how many took the pool, how many fell back, and the errors by type.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from typing import Any, Final

from ..spec.layout import MIN_POOL_CLASS
from ..spec.pool import compute_slot_charge

EDGE: Final = ("pooled", "reader")
_CHILD_TIMEOUT_S: Final = 300
_PASSES: Final = 6
_RING: Final = 1 << 16  # a reference frame per key; room for 300 of them


# Past a quarter of the ring, within the smallest class's capacity (class +
# headroom), and at least `codec.BORROWED_BYTES_MIN`: a borrowed get keeps it mapped.
_FILL: Final = 64 * 1024


def _payload(key: str) -> dict[str, Any]:
    return {"key": key, "fill": (key.encode() * (_FILL // len(key) + 1))[:_FILL]}


def pool_options(slots: int) -> dict[str, int]:
    """A producer's pool of `slots` slots of the smallest class."""
    return {
        "pool_min_bytes": MIN_POOL_CLASS,
        "pool_max_bytes": MIN_POOL_CLASS,
        "pool_budget_bytes": slots * compute_slot_charge(MIN_POOL_CLASS),
    }


def _limit(limit: int) -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))


def _take_every_descriptor() -> list[int]:
    held: list[int] = []
    try:
        while True:
            held.append(os.open("/dev/null", os.O_RDONLY | os.O_CLOEXEC))
    except OSError:
        pass
    return held


def _reader(scope: str, keys: list[str], limit: int, hold: bool) -> dict[str, Any]:
    _limit(limit)
    from ..impl.connector import Connector, GetStatus
    from ..impl.errors import ShmringError

    delivered: Counter[str] = Counter()
    statuses: Counter[str] = Counter()
    typed: Counter[str] = Counter()
    bare: Counter[str] = Counter()
    failed_once: set[str] = set()
    held: list[Any] = []
    wrong = 0
    squeezed: list[int] = []
    with Connector(scope, ring_capacity=4096, pool_budget_bytes=0) as reader:
        for attempt in range(_PASSES + 1):
            if attempt == 1:  # every descriptor taken: only what a shed frees is left
                squeezed = _take_every_descriptor()
            if attempt == _PASSES:  # the last pass after giving every held payload back
                for fd in squeezed:
                    os.close(fd)
                squeezed.clear()
                for got in held:
                    got.release()
                held.clear()
            for key in keys:
                if delivered[key]:
                    continue
                try:
                    got = reader.get(EDGE, key, borrow=hold)
                except ShmringError as error:
                    typed[type(error).__name__] += 1
                    failed_once.add(key)
                    continue
                except OSError as error:
                    bare[str(error.errno)] += 1
                    failed_once.add(key)
                    continue
                statuses[got.status.name] += 1
                if got.status is GetStatus.DELIVERED:
                    value = got.value
                    if value.get("key") != key or bytes(value["fill"]) != _payload(key)["fill"]:
                        wrong += 1
                    delivered[key] += 1
                    if hold and attempt < _PASSES:
                        held.append(got)
                    else:
                        got.release()
    return {
        "delivered": sorted(delivered),
        "failed_once": sorted(failed_once),
        "statuses": dict(statuses),
        "typed": dict(typed),
        "bare": dict(bare),
        "wrong": wrong,
    }


def _child(code: str, *args: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, timeout=_CHILD_TIMEOUT_S
    )
    lines = done.stdout.decode().strip().splitlines()
    if done.returncode != 0 or not lines:
        raise AssertionError(
            f"child failed: rc={done.returncode} stderr={done.stderr.decode()[-3000:]}"
        )
    report: dict[str, Any] = json.loads(lines[-1])
    return report


def reader_probe(
    scope: str, keys: int = 60, limit: int = 24, *, hold: bool = False
) -> dict[str, Any]:
    """`keys` pooled keys of one producer (this process), read by a child at `limit` descriptors."""
    from ..impl.connector import Connector, GetStatus, Route

    names = [f"big{index}" for index in range(keys)]
    with Connector(scope, ring_capacity=_RING, **pool_options(keys)) as producer:
        routes = Counter(producer.put(EDGE, key, _payload(key)).__class__.__name__ for key in names)
        report = _child(
            "import json, sys; from shmring.fault_injection import fdclaims; "
            "print(json.dumps(fdclaims._reader(sys.argv[1], sys.argv[2].split(','), "
            "int(sys.argv[3]), sys.argv[4] == '1')))",
            scope,
            ",".join(names),
            str(limit),
            "1" if hold else "0",
        )
        delivered = set(report.pop("delivered"))
        recovered = set()
        with Connector(scope, ring_capacity=4096, pool_budget_bytes=0) as reader:
            for key in names:
                got = reader.get(EDGE, key)
                if got.status is GetStatus.DELIVERED:
                    assert got.route is Route.POOL, got
                    recovered.add(key)
        report["descriptors"] = dict(routes)
        report["pool_puts"] = producer.health().pool_puts
    report["keys"] = keys
    report["delivered"] = len(delivered)
    report["lost"] = sorted(set(names) - delivered - recovered)
    report["twice"] = sorted(delivered & recovered)
    report["lost_after_failure"] = sorted(set(report["lost"]) & set(report["failed_once"]))
    return report


def _producer(scope: str, puts: int, limit: int) -> dict[str, Any]:
    _limit(limit)
    from ..impl.connector import Connector
    from ..impl.errors import ShmringError

    typed: Counter[str] = Counter()
    bare: Counter[str] = Counter()
    ok = 0
    with Connector(scope, ring_capacity=_RING, **pool_options(puts)) as producer:
        for index in range(puts):
            key = f"big{index}"
            try:
                producer.put(EDGE, key, _payload(key))
                ok += 1
            except ShmringError as error:
                typed[type(error).__name__] += 1
            except OSError as error:
                bare[str(error.errno)] += 1
        health = producer.health()
        open_fds = len(os.listdir("/proc/self/fd"))
    return {
        "ok": ok,
        "pool_puts": health.pool_puts,
        "fallbacks": health.fallbacks,
        "pool_slots": health.pool_slots,
        "typed": dict(typed),
        "bare": dict(bare),
        "open_fds": open_fds,
    }


def producer_probe(scope: str, puts: int = 300, limit: int = 64) -> dict[str, Any]:
    """A producer child at `limit` descriptors making `puts` outstanding large puts."""
    return _child(
        "import json, sys; from shmring.fault_injection import fdclaims; "
        "print(json.dumps(fdclaims._producer(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))))",
        scope,
        str(puts),
        str(limit),
    )


__all__ = ["EDGE", "pool_options", "producer_probe", "reader_probe"]


if __name__ == "__main__":  # pragma: no cover - the probes, by hand
    import uuid

    which = sys.argv[1]
    numbers = [int(value) for value in sys.argv[2:]]
    probe = reader_probe if which == "reader" else producer_probe
    print(json.dumps(probe(f"fc{uuid.uuid4().hex[:8]}", *numbers)))
