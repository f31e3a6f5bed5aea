"""Cross-process histories: free-running producers and competing readers keep the model's promises.

Two producer processes publish unique tagged payloads on one edge (ring and
fallback, re-puts across routes, cleanups) while two reader processes
compete for every key. Halfway through, one producer is killed with SIGKILL
and a new process takes over its keys. Every operation is recorded with its
monotonic interval, and `history_workers.check_histories` holds the merged
history to the model: nothing lost, nothing duplicated (two readers claim
exactly once), nothing stale, nothing from a dead producer.

Every process is joined with a timeout and killed if it overstays; a
watchdog bounds the whole test. No timing is asserted.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from shmring.fault_injection.kit.processes import WorkerProcess, watchdog, worker_context
from shmring.impl.discovery import collect_orphans
from shmring.impl.names import deployment_directory
from shmring.impl.os_seam import DEFAULT_OS
from shmring.model_tests.connector_support import WORKER_PRELOAD
from shmring.model_tests.history_workers import (
    check_histories,
    history_producer,
    history_reader,
    make_plan,
)

EDGE = ("talker", "codec")
ANSWER_TIMEOUT = 120.0


def _process(target: Any, *args: Any) -> WorkerProcess:
    """A history worker; it runs until told "close" (or killed)."""
    return WorkerProcess(target, *args, timeout=ANSWER_TIMEOUT, preload=WORKER_PRELOAD)


def _run_histories(
    scope: str, ring_capacity: int, keys_per_slot: int, *, keep_fallback_files: bool = False
) -> dict[str, int]:
    options: dict[str, Any] = {"ring_capacity": ring_capacity}
    if keep_fallback_files:  # every fallback file is kept, handed back and reused
        options.update(fallback_spare_bytes=1 << 20, fallback_spare_min_bytes=0)
    plans = {
        "p0": make_plan(1, 0, 1_000_000, keys_per_slot),
        "p1": make_plan(2, 1, 2_000_000, keys_per_slot),
        "p1-restarted": make_plan(3, 1, 3_000_000, keys_per_slot),  # the same keys as p1
    }
    keys = sorted({step[1] for plan in plans.values() for step in plan})
    done = worker_context(preload=WORKER_PRELOAD).Event()
    processes: list[WorkerProcess] = []
    try:
        readers = [_process(history_reader, scope, EDGE, keys, f"r{i}", done) for i in range(2)]
        processes += readers
        for reader in readers:
            reader.expect("ready")
        p0 = _process(history_producer, scope, EDGE, plans["p0"], options)
        p1 = _process(history_producer, scope, EDGE, plans["p1"], options)
        processes += [p0, p1]
        identities = {"p0": p0.expect("identity"), "p1": p1.expect("identity")}
        p1.expect("half")
        killed = {identities["p1"]: p1.kill()}  # mid-stream: it keeps putting until the signal
        restarted = _process(history_producer, scope, EDGE, plans["p1-restarted"], options)
        processes.append(restarted)
        identities["p1-restarted"] = restarted.expect("identity")
        puts: list[Any] = []
        cleanups: list[Any] = []
        reused = 0
        for producer in (p0, restarted):
            producer.expect("half")
            got_puts, got_cleanups, got_reused = producer.expect("done")
            puts += got_puts
            cleanups += got_cleanups
            reused += got_reused
        done.set()
        deliveries: list[Any] = []
        for reader in readers:
            got, corrupt = reader.expect("done")
            assert not corrupt, f"corrupted payloads for keys {corrupt}"
            deliveries += got
    finally:
        for process in processes:
            process.stop(goodbye="close")
        directory = deployment_directory(scope)
        if os.path.isdir(directory):
            collect_orphans(directory, DEFAULT_OS)  # what the killed producer left
    # The killed producer's own record died with it: rebuild its accepted puts
    # from what was delivered (all its deliveries must obey the same rules).
    from shmring.model_tests.history_workers import PutRecord

    p1_tags = {step[2]: step[1] for step in plans["p1"] if step[0] == "put"}
    for delivery in deliveries:
        if delivery.producer == identities["p1"]:
            assert delivery.tag in p1_tags, f"unknown tag from the killed producer: {delivery}"
            puts.append(
                PutRecord(
                    delivery.producer, p1_tags[delivery.tag], delivery.tag, delivery.route, 0, 0
                )
            )
    counts = check_histories(
        puts, cleanups, deliveries, killed, {identities["p0"], identities["p1-restarted"]}
    )
    assert not os.path.exists(deployment_directory(scope)), (
        "the deployment directory was left behind"
    )
    counts["fallback files reused"] = reused
    return counts


@pytest.mark.parametrize(
    ("ring_capacity", "keep_fallback_files"),
    [(8192, False), (0, False), (0, True)],
    ids=["ring", "fallback-only", "fallback-only, files reused"],
)
def test_free_running_histories_keep_the_models_promises(
    scope: str, ring_capacity: int, keep_fallback_files: bool
) -> None:
    with watchdog(300):
        counts = _run_histories(
            scope, ring_capacity, keys_per_slot=40, keep_fallback_files=keep_fallback_files
        )
    assert counts["required"] > 0 and counts["readers"] == 2
    if ring_capacity:
        assert counts["ring deliveries"] > 0 and counts["fallback deliveries"] > 0
    if keep_fallback_files:
        assert counts["fallback files reused"] > 0
    print(f"\nhistories (ring_capacity={ring_capacity}): {counts}")


@pytest.mark.slow
def test_long_free_running_histories_keep_the_models_promises(scope: str) -> None:
    with watchdog(900):
        counts = _run_histories(scope, 16384, keys_per_slot=400)
    print(f"\nhistories (long): {counts}")
