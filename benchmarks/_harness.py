"""Two pinned worker processes driven step by step over control pipes.

Design rationale. A benchmark case runs between worker "a" (the producer,
which also times) and worker "b" (the consumer / echo), each pinned to its
own core, with the parent only sequencing: setup -> connect -> run ->
teardown, one control message per step and nothing on the timed path. The
workers live for the whole run, so process start and imports are paid once,
and the parent can interleave cases of every transport freely.

Timed loops run with the garbage collector paused (collected just before),
the same for every transport. Latency is a ping-pong: "a" sends message i,
"b" receives it and sends it back, "a" times the round trip with
`time.perf_counter_ns` and records half of it. Throughput is one batch:
"a" stamps the clock before its first send, "b" after its last receive
(both CLOCK_MONOTONIC, one clock on one host); "b" is receiving before "a"
starts.
"""

from __future__ import annotations

import contextlib
import gc
import math
import os
import statistics
import time
import traceback
from collections.abc import Sequence
from multiprocessing.connection import Connection
from typing import Any

import _probes
from _transports import (
    TRANSPORTS,
    TREE,
    BenchTimeout,
    CaseSpec,
    Transport,
    make_bytes,
    make_tree,
    tree_equal,
)

# The `_probes` functions that wait for the peer and send "armed" first.
_ARMED_PROBES = frozenset(("futex_echo", "wake_receive"))
RECEIVE_TIMEOUT_S = 120.0  # one message; generous: 256 MiB through a pipe on a busy VM


def percentile(samples: Sequence[float], fraction: float) -> float:
    """Nearest-rank percentile (no interpolation: a p99 is a value that occurred)."""
    ordered = sorted(samples)
    rank = max(1, math.ceil(fraction * len(ordered)))
    return ordered[rank - 1]


def summarize(samples: Sequence[float]) -> dict[str, float]:
    return {
        "median": statistics.median(samples),
        "p99": percentile(samples, 0.99),
        "min": min(samples),
        "n": len(samples),
    }


class _Worker:
    def __init__(self, me: str, shared: dict[str, Any]) -> None:
        self.me = me
        self.peer = "b" if me == "a" else "a"
        self.shared = shared
        self.transport: Transport | None = None
        self.spec: CaseSpec | None = None
        self.payload: Any = None
        self._payload_cache: dict[tuple[str, int], Any] = {}

    def _payload_for(self, spec: CaseSpec) -> Any:
        key = (spec.kind, spec.size)
        payload = self._payload_cache.get(key)
        if payload is None:
            # Keep at most one big payload alive.
            self._payload_cache = {
                k: v for k, v in self._payload_cache.items() if k[0] == TREE or k[1] <= 1 << 20
            }
            payload = make_tree() if spec.kind == TREE else make_bytes(spec.size)
            self._payload_cache[key] = payload
        return payload

    def _check(self, value: Any, seq: int) -> None:
        spec = self.spec
        assert spec is not None
        if spec.kind == TREE:
            ok = tree_equal(value, self.payload)
        else:
            ok = len(value) == spec.size and bytes(value) == self.payload
        if not ok:
            raise AssertionError(f"{spec.transport}: message {seq} arrived changed")

    def _deadline(self) -> float:
        return time.monotonic() + RECEIVE_TIMEOUT_S

    # -- commands ------------------------------------------------------------------

    def setup(self, spec: CaseSpec) -> dict[str, Any]:
        self.spec = spec
        self.payload = self._payload_for(spec)
        self.transport = TRANSPORTS[spec.transport](spec, self.me, self.peer, self.shared)
        return self.transport.setup()

    def connect(self, peer_info: dict[str, Any]) -> None:
        assert self.transport is not None
        self.transport.connect(peer_info)

    def echo(self, control: Connection, start: int, count: int) -> None:
        transport = self.transport
        assert transport is not None
        control.send(("armed", None))
        gc.collect()
        gc.disable()
        try:
            for seq in range(start, start + count):
                transport.send(seq, transport.recv(seq, self._deadline()))
        finally:
            gc.enable()

    def ping(self, start: int, warm: int, count: int) -> list[int]:
        transport = self.transport
        assert transport is not None
        payload = self.payload
        for seq in range(start, start + warm):
            transport.send(seq, payload)
            self._check(transport.recv(seq, self._deadline()), seq)
        half_round_trips: list[int] = []
        record = half_round_trips.append
        clock = time.perf_counter_ns
        gc.collect()
        gc.disable()
        try:
            reply = None
            seq = start + warm
            for seq in range(start + warm, start + warm + count):
                deadline = time.monotonic() + RECEIVE_TIMEOUT_S
                began = clock()
                transport.send(seq, payload)
                reply = transport.recv(seq, deadline)
                record((clock() - began) // 2)
        finally:
            gc.enable()
        self._check(reply, seq)
        return half_round_trips

    def consume(self, control: Connection, start: int, count: int) -> int:
        transport, spec = self.transport, self.spec
        assert transport is not None and spec is not None
        size = spec.size
        value = None
        # The collection runs after the clock stops, not before the receives:
        # a burst's clock started with the producer, and a full collection
        # with torch loaded takes 0.1-0.3 s on the 2-core VM (it traverses
        # every tracked object, garbage or not).
        gc.disable()
        control.send(("armed", None))
        try:
            for seq in range(start, start + count):
                value = transport.recv(seq, self._deadline())
                if spec.kind != TREE and len(value) != size:
                    raise AssertionError(f"message {seq}: {len(value)} bytes, sent {size}")
            finished = time.perf_counter_ns()
        finally:
            gc.enable()
        gc.collect()
        self._check(value, start + count - 1)
        return finished

    def produce(self, start: int, count: int) -> int:
        transport = self.transport
        assert transport is not None
        payload = self.payload
        gc.collect()
        gc.disable()
        try:
            began = time.perf_counter_ns()
            for seq in range(start, start + count):
                transport.send(seq, payload)
        finally:
            gc.enable()
        return began

    def probe(self, control: Connection, name: str, kwargs: dict[str, Any]) -> Any:
        """One side of a reference measurement (`_probes`), the collector paused as for a case."""
        function = getattr(_probes, name)
        gc.collect()
        gc.disable()
        try:
            if name in _ARMED_PROBES:  # the waiting side: tells the parent when it waits
                return function(control, **kwargs)
            return function(**kwargs)
        finally:
            gc.enable()

    def teardown(self) -> dict[str, Any]:
        transport, self.transport = self.transport, None
        if transport is None:
            return {}
        try:
            return transport.stats()
        finally:
            transport.close()


def worker_main(me: str, control: Connection, shared: dict[str, Any], cpu: int | None) -> None:
    """A worker's loop: one control message in, one answer out, until "exit"."""
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    import torch  # noqa: F401  (paid once here, not in the first case)

    torch.set_num_threads(1)
    worker = _Worker(me, shared)
    control.send(("ready", {"pid": os.getpid(), "cpus": sorted(os.sched_getaffinity(0))}))
    while True:
        command, args = control.recv()
        if command == "exit":
            break
        answer: Any = None
        try:
            if command == "setup":
                answer = worker.setup(*args)
            elif command == "connect":
                worker.connect(*args)
            elif command == "echo":
                worker.echo(control, *args)
            elif command == "ping":
                answer = worker.ping(*args)
            elif command == "consume":
                answer = worker.consume(control, *args)
            elif command == "produce":
                answer = worker.produce(*args)
            elif command == "probe":
                answer = worker.probe(control, *args)
            elif command == "teardown":
                answer = worker.teardown()
            else:
                raise ValueError(f"unknown command: command={command!r}")
        except BaseException as error:  # reported to the parent, which stops the run
            with contextlib.suppress(BaseException):
                worker.teardown()
            kind = "timeout" if isinstance(error, BenchTimeout) else "error"
            control.send((kind, f"worker {me}: {traceback.format_exc()}"))
            continue
        control.send(("ok", answer))
    worker.teardown()
