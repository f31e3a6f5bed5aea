"""Free-running producer and reader processes that record histories, and the history checker.

A producer runs a plan of puts and cleanups as fast as it can and records,
for every operation, what it did and its `time.monotonic_ns()` interval
(CLOCK_MONOTONIC is one clock for every process of the machine). Readers
compete for every key of every plan, claim what they can, and record each
delivery (key, payload tag, delivering producer, route, interval). Nothing
here imports torch: payloads are tagged bytes.

`check_histories` then holds the merged history to the model's promises
(`spec.connector` and `spec.discovery`):

* nothing duplicated: a tag is delivered at most once, among all readers;
* nothing corrupted or misattributed: the bytes are the tag's, from the
  producer that put it, under the key it was put with;
* nothing stale: no delivery of a version whose key was re-put (by anyone)
  or cleaned up before the get started;
* nothing from a dead producer: no delivery from a producer whose SIGKILL
  had completed before the get started;
* nothing lost: every producer that lived to the end had the last version
  of each of its keys delivered, unless it cleaned the key up afterwards.
"""

from __future__ import annotations

import contextlib
import random
import time
from collections import defaultdict
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from ..fault_injection.kit.payloads import payload_tag, tagged_payload

Edge = tuple[str, str]


@dataclass(frozen=True)
class PutRecord:
    producer: tuple[int, int]
    key: str
    tag: int
    route: str  # "ring", "fallback", or "refused"
    start: int  # monotonic ns
    end: int


@dataclass(frozen=True)
class CleanupRecord:
    producer: tuple[int, int]
    key: str
    retired: int
    start: int
    end: int


@dataclass(frozen=True)
class Delivery:
    reader: str
    key: str
    tag: int
    producer: tuple[int, int]
    route: str
    start: int
    end: int


def make_plan(seed: int, slot: int, first_tag: int, count: int) -> list[tuple[Any, ...]]:
    """A producer's plan: puts of unique tags over the slot's keys, some re-puts and cleanups."""
    rng = random.Random(seed)
    keys = [f"req_{slot}_{index}" for index in range(count)]
    plan: list[tuple[Any, ...]] = []
    tag = first_tag
    for index, key in enumerate(keys):
        size = rng.choice((16, 200, 900, 1800, 2600, 6000))  # ring and fallback alike
        plan.append(("put", key, tag, size))
        tag += 1
        if index >= 3 and rng.random() < 0.2:  # re-put an earlier key (maybe across routes)
            again = keys[rng.randrange(index)]
            plan.append(("put", again, tag, rng.choice((100, 2600, 6000))))
            tag += 1
        if index >= 3 and rng.random() < 0.08:
            plan.append(("cleanup", keys[rng.randrange(index)]))
    return plan


def history_producer(
    scope: str, edge: Edge, plan: list[tuple[Any, ...]], options: dict[str, Any], conn: Connection
) -> None:
    """Run `plan`; say "half" halfway through; report the history at the end."""
    from ..impl.connector import Connector
    from ..impl.errors import BackPressureError
    from ..impl.names import current_producer_identity

    puts: list[PutRecord] = []
    cleanups: list[CleanupRecord] = []
    connector = Connector(scope, **options)
    identity = (*current_producer_identity(), connector.instance)  # the producer's identity
    try:
        conn.send(("identity", identity))
        for index, step in enumerate(plan):
            if index == len(plan) // 2:
                conn.send(("half", None))
            if step[0] == "put":
                _, key, tag, size = step
                payload = tagged_payload(tag, size)
                start = time.monotonic_ns()
                try:
                    route = connector.put(edge, key, payload).route.value
                except BackPressureError:
                    route = "refused"
                puts.append(PutRecord(identity, key, tag, route, start, time.monotonic_ns()))
            else:
                _, key = step
                start = time.monotonic_ns()
                retired = connector.cleanup(key)
                cleanups.append(CleanupRecord(identity, key, retired, start, time.monotonic_ns()))
        conn.send(("done", (puts, cleanups, connector.health().fallback_reused)))
        # Stay up (and keep everything published) until told to close.
        with contextlib.suppress(EOFError):
            conn.recv()
    finally:
        connector.close()
        conn.close()


def history_reader(
    scope: str, edge: Edge, keys: list[str], name: str, done: Any, conn: Connection
) -> None:
    """Claim whatever it can of `keys` until producers are done and a sweep finds nothing."""
    from ..impl.connector import Connector, GetStatus

    deliveries: list[Delivery] = []
    corrupt: list[str] = []
    rng = random.Random(name)

    def record(key: str, got: Any, start: int) -> None:
        end = time.monotonic_ns()
        value = got.value
        tag = payload_tag(value)
        if value != tagged_payload(tag, len(value)):
            corrupt.append(key)
        deliveries.append(
            Delivery(name, key, tag, tuple(got.producer), got.route.value, start, end)
        )

    with Connector(scope) as connector:
        conn.send(("ready", None))
        quiet_sweeps = 0
        while True:
            finished = done.is_set()
            found = busy = 0
            order = list(keys)
            rng.shuffle(order)
            for key in order:
                start = time.monotonic_ns()
                got = connector.get(edge, key)
                if got.status is GetStatus.BUSY:
                    busy += 1
                elif got.delivered:
                    found += 1
                    record(key, got, start)
            if found or busy:
                quiet_sweeps = 0
                continue
            if finished:
                quiet_sweeps += 1
                if quiet_sweeps >= 2:
                    break
            else:
                # Nothing this sweep: wait on one key (spin, then sleep) rather than spin.
                key = rng.choice(keys)
                start = time.monotonic_ns()
                got = connector.get_with_deadline(edge, key, timeout=0.002)
                if got.delivered:
                    record(key, got, start)
    conn.send(("done", (deliveries, corrupt)))
    conn.close()


def check_histories(
    puts: list[PutRecord],
    cleanups: list[CleanupRecord],
    deliveries: list[Delivery],
    killed: dict[tuple[int, int], int],
    survivors: set[tuple[int, int]],
) -> dict[str, int]:
    """Raise AssertionError naming the first broken promise; answer counts for the report.

    `killed` maps a producer to the monotonic ns at which its SIGKILL had
    completed (the process reaped); `survivors` are the producers alive at
    the end.
    """
    by_tag = {p.tag: p for p in puts if p.route != "refused"}
    seen: dict[int, Delivery] = {}
    for delivery in deliveries:
        put = by_tag.get(delivery.tag)
        assert put is not None, f"delivered tag {delivery.tag} was never accepted: {delivery}"
        assert delivery.tag not in seen, (
            f"tag {delivery.tag} delivered twice: {seen[delivery.tag]}, {delivery}"
        )
        seen[delivery.tag] = delivery
        assert (put.key, put.producer) == (delivery.key, delivery.producer), (
            f"misattributed delivery {delivery} of {put}"
        )
        assert delivery.end >= put.start, f"delivered before it was put: {delivery} {put}"
        died = killed.get(put.producer)
        assert died is None or delivery.start < died, (
            f"delivered from producer {put.producer} after it was killed: {delivery}"
        )
        for later in puts:
            if (
                later.key == put.key
                and later.route != "refused"
                and later.start > put.end
                and later.end < delivery.start
            ):
                raise AssertionError(f"stale: {delivery} although {later} superseded {put}")
        for cleanup in cleanups:
            if cleanup.key == put.key and cleanup.start > put.end and cleanup.end < delivery.start:
                raise AssertionError(f"delivered after cleanup: {delivery}, {cleanup}")
    # Nothing lost: the last version of every key of every surviving producer.
    last: dict[tuple[tuple[int, int], str], PutRecord] = {}
    for put in sorted(puts, key=lambda p: p.start):
        if put.route != "refused":
            last[(put.producer, put.key)] = put
    cleaned: dict[tuple[tuple[int, int], str], list[CleanupRecord]] = defaultdict(list)
    for cleanup in cleanups:
        cleaned[(cleanup.producer, cleanup.key)].append(cleanup)
    required = 0
    for (producer, key), put in last.items():
        if producer not in survivors:
            continue
        if any(c.start > put.end for c in cleaned[(producer, key)]):
            continue
        required += 1
        assert put.tag in seen, f"lost: {put} never delivered"
    return {
        "puts": len(by_tag),
        "deliveries": len(deliveries),
        "required": required,
        "ring deliveries": sum(d.route == "ring" for d in deliveries),
        "fallback deliveries": sum(d.route == "fallback" for d in deliveries),
        "readers": len({d.reader for d in deliveries}),
        "from killed producers (before the kill)": sum(d.producer in killed for d in deliveries),
    }


__all__ = [
    "CleanupRecord",
    "Delivery",
    "PutRecord",
    "check_histories",
    "history_producer",
    "history_reader",
    "make_plan",
]
