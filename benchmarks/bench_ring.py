"""The host ring against the transports a pipeline would otherwise pick, side by side.

Transports: the raw ring channel (`RingChannel` / `RingReader`, codec into
and out of the frame), the `Connector` (routing, discovery, codec; its ring
path while frames fit, its large-payload path -- the pool where it has one,
else the per-key fallback -- when they do not) received three ways
(`get_with_deadline`, which spins briefly and then sleeps on the doorbell;
``connector/poll``, a busy loop of plain `get`; ``connector/borrow``,
`get_with_deadline(..., borrow=True)`, throughput only, not run where the
connector has no ``borrow`` parameter), per-key POSIX
SHM segments (vllm-omni's SharedMemoryConnector pattern), a
`multiprocessing.Pipe`, a `multiprocessing.Queue`, pyzmq PAIR over ipc://,
and iceoryx2 publish-subscribe when it is installed (the optional extra).
See `_transports.py` for exactly what each one does per message.

Measurements, in one run, between two worker processes pinned to different
cores (`_harness.py`):

* one-way latency (half a ping-pong round trip) of the small tensor tree
  ``{"codes": {"audio": torch.arange(28)}, "meta": {"finished":
  torch.tensor(False)}}`` and of 64 B / 4 KiB / 64 KiB bytes: median and
  p99 over every round trip of every repeat;
* throughput of 64 KiB / 1 MiB / 16 MiB / 256 MiB messages, the receiver
  ending with its own copy of each: per repeat an untimed batch (of 16 MiB
  and more, sent as a burst where the transport buffers one, so every
  reusable buffer exists before the clock starts: `BURST_WARM_MIN`), then one
  or more timed batches (three for the small sizes, whose batches last only
  milliseconds); median and worst over all timed batches;
* bursts (``16 MiB x64 burst``, ``256 MiB x8 burst``): the producer sends
  a whole batch before the receiver starts, so every message is in flight
  at once -- more than the connector's spare fallback files hold (16 of 16
  MiB by default); the JSON's ``routes`` and ``large_payload_health`` say
  which path carried them (ring, pool, fallback) and the producer's
  counters. Transports with a bounded kernel buffer (the Pipe) cannot take
  a burst. A case that would hold more than /dev/shm or memory has free is
  skipped with the reason (`space_shortfall`);
* reference measurements (`_probes.py`): a single-thread copy of each large
  payload into a mapped shm buffer (the producer side alone, the borrowed
  target's baseline), a futex round trip between the two workers, and the
  wake-up of a receiver asleep in `get_with_deadline` (plus the CPU an idle
  wait costs).

Next to ``--json out.json`` it writes ``out.png`` (or ``--plot PATH``):
latency and throughput per transport and size (matplotlib, the [bench]
extra), and ``out.md`` (or ``--markdown PATH``): the tables and issue 13's
target table for docs/performance.md. The target table (`_report.targets`:
every target of issue 13, its ratio, met or missed) is printed at the end
and stored in the JSON.

Repeats interleave: each repeat runs every case of every transport, the
transport order rotated per repeat, so machine noise hits all alike.

    .venv/bin/python benchmarks/bench_ring.py [--quick | --smoke] [--repeats N] [--json out.json]
        [--plot out.png] [--markdown out.md] [--transports a,b,...]

Ring capacity: 4 MiB (the connector's default) for latency, 64 MiB (the
maximum) for throughput (4 MiB in ``--smoke``, so its 1 MiB burst takes the
large-payload path). A frame larger than capacity/4 is not admitted, so
16 MiB and 256 MiB messages do not fit any ring: the raw channel cannot send
them (shown as n/a) and the connector sends them by its large-payload path
(the table says which route each connector cell took).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import multiprocessing
import os
import platform
import shlex
import sys
import time
import uuid
from dataclasses import asdict, dataclass
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _probes  # noqa: E402
from _harness import summarize, worker_main  # noqa: E402
from _report import markdown, table, targets, write_plot  # noqa: E402
from _space import space_shortfall  # noqa: E402
from _transports import (  # noqa: E402
    BYTES,
    SHM_ROOT,
    TRANSPORTS,
    TREE,
    CaseSpec,
    make_tree,
    transport_unavailable,
)

KIB = 1024
MIB = 1024 * KIB
LATENCY_CAPACITY = 4 * MIB
THROUGHPUT_CAPACITY = 64 * MIB
CONTROL_TIMEOUT_S = 600.0  # one control step (a whole batch); the workers' own deadlines come first

PROBE_TIMEOUT_S = 60.0  # one wake-up or futex round trip; a watchdog, not a bound

LATENCY_PAYLOADS = (
    ("tree", TREE, 0),
    ("64 B", BYTES, 64),
    ("4 KiB", BYTES, 4 * KIB),
    ("64 KiB", BYTES, 64 * KIB),
)


@dataclass(frozen=True)
class Plan:
    """How much of everything a run measures."""

    repeats: int
    latency_payloads: tuple[tuple[str, str, int], ...]
    latency_warm: int  # untimed round trips per case
    latency_count: int  # timed round trips per case and repeat
    # (message bytes, messages per batch, timed batches per repeat)
    throughput: tuple[tuple[int, int, int], ...]
    # The same, as bursts: every message of a batch is sent before the
    # receiver starts, so all of them are in flight at once (more than the
    # connector's spare fallback files hold: 16 of 16 MiB by default).
    bursts: tuple[tuple[int, int, int], ...] = ()
    # Ring capacity of the throughput cases (64 MiB: the largest; smoke: 4 MiB,
    # the connector's default, so its 1 MiB burst takes the large-payload path).
    throughput_capacity: int = THROUGHPUT_CAPACITY
    copy_count: int = 5  # timed single-thread copies per size and repeat (`_probes`)
    wake_warm: int = 10  # untimed wake-ups / futex round trips per repeat
    wake_count: int = 100  # timed ones per repeat
    wake_gap_s: float = 0.002  # idle before each (>= 10x the receiver's spin)
    idle_s: float = 0.2  # the idle get_with_deadline whose CPU time is measured
    # Examples of the ring lockstep machine's steps/s run (None: the suite's profile).
    lockstep_examples: int | None = None


def make_plan(mode: str, repeats: int | None) -> Plan:
    if mode == "smoke":  # the smallest sizes, one repeat: the scripts cannot rot
        return Plan(
            repeats or 1,
            LATENCY_PAYLOADS[:2],
            2,
            5,
            ((64 * KIB, 4, 1),),
            ((MIB, 20, 1),),
            throughput_capacity=LATENCY_CAPACITY,
            copy_count=2,
            wake_warm=3,
            wake_count=10,
            idle_s=0.05,
            lockstep_examples=3,
        )
    if mode == "quick":
        return Plan(
            repeats or 3,
            LATENCY_PAYLOADS,
            20,
            100,
            ((64 * KIB, 256, 2), (MIB, 16, 2), (16 * MIB, 4, 1)),
            ((16 * MIB, 24, 1),),
            lockstep_examples=30,
        )
    return Plan(
        repeats or 5,
        LATENCY_PAYLOADS,
        50,
        400,
        ((64 * KIB, 512, 3), (MIB, 32, 3), (16 * MIB, 8, 1), (256 * MIB, 2, 1)),
        ((16 * MIB, 64, 1), (256 * MIB, 8, 1)),
        copy_count=10,
        wake_warm=20,
        wake_count=300,
        idle_s=0.5,
    )


def burst_label(size: int, count: int) -> str:
    return f"{size_label(size)} x{count} burst"


def size_label(size: int) -> str:
    if size >= MIB:
        return f"{size // MIB} MiB"
    if size >= KIB:
        return f"{size // KIB} KiB"
    return f"{size} B"


def ring_admits(capacity: int, size: int, count: int) -> bool:
    """Whether the raw ring can carry a `size`-byte message under every key the case uses."""
    from shmring.spec.layout import compute_frame_length
    from shmring.spec.ring import is_admitted

    key_length = len(str(count))
    return is_admitted(capacity, key_length, compute_frame_length(key_length, size))


# -- the two workers -----------------------------------------------------------------


class WorkerError(RuntimeError):
    pass


class Pair:
    """Workers "a" and "b", their control pipes, and the Pipe/Queues made for them at spawn."""

    def __init__(self) -> None:
        context = multiprocessing.get_context("spawn")
        cpus = sorted(os.sched_getaffinity(0))
        self.pinned = len(cpus) >= 2
        pipe_a, pipe_b = context.Pipe(duplex=True)
        queue_ab, queue_ba = context.Queue(), context.Queue()
        shared = {
            "a": {"pipe": pipe_a, "queue_ab": queue_ab, "queue_ba": queue_ba},
            "b": {"pipe": pipe_b, "queue_ab": queue_ab, "queue_ba": queue_ba},
        }
        self.control: dict[str, Any] = {}
        self.processes: dict[str, Any] = {}
        self.info: dict[str, Any] = {}
        for index, me in enumerate(("a", "b")):
            parent_end, child_end = context.Pipe()
            cpu = cpus[index] if self.pinned else None
            process = context.Process(
                target=worker_main,
                args=(me, child_end, shared[me], cpu),
                name=f"bench-{me}",
                daemon=True,
            )
            process.start()
            child_end.close()
            self.control[me] = parent_end
            self.processes[me] = process
        for me in ("a", "b"):
            self.info[me] = self.wait(me, "ready")

    def send(self, who: str, command: str, *args: Any) -> None:
        self.control[who].send((command, args))

    def wait(self, who: str, expect: str = "ok", timeout: float = CONTROL_TIMEOUT_S) -> Any:
        control = self.control[who]
        if not control.poll(timeout):
            raise WorkerError(f"worker {who} gave no answer in {timeout} s")
        kind, answer = control.recv()
        if kind != expect:
            raise WorkerError(f"{kind}: {answer}")
        return answer

    def ask(self, who: str, command: str, *args: Any) -> Any:
        self.send(who, command, *args)
        return self.wait(who)

    def close(self) -> None:
        for who in self.processes:
            with contextlib.suppress(OSError, ValueError):
                self.control[who].send(("exit", ()))
        for process in self.processes.values():
            process.join(10)
            if process.is_alive():
                process.terminate()
                process.join(5)


def _connect(pair: Pair, spec: CaseSpec) -> None:
    info_a = pair.ask("a", "setup", spec)
    info_b = pair.ask("b", "setup", spec)
    pair.ask("a", "connect", info_b)
    pair.ask("b", "connect", info_a)


def _teardown(pair: Pair) -> dict[str, Any]:
    stats = {}
    for who in ("a", "b"):
        stats[who] = pair.ask(who, "teardown")
    return stats


def run_latency(
    pair: Pair, spec: CaseSpec, warm: int, count: int
) -> tuple[list[int], dict[str, Any]]:
    try:
        _connect(pair, spec)
        pair.send("b", "echo", 0, warm + count)
        pair.wait("b", "armed")
        samples = pair.ask("a", "ping", 0, warm, count)
        pair.wait("b")
    except BaseException:
        with contextlib.suppress(BaseException):
            _teardown(pair)
        raise
    return samples, _teardown(pair)


def _batch(pair: Pair, start: int, count: int) -> int:
    pair.send("b", "consume", start, count)
    pair.wait("b", "armed")
    began: int = pair.ask("a", "produce", start, count)
    finished: int = pair.wait("b")
    return finished - began


def _burst(pair: Pair, start: int, count: int) -> int:
    """All `count` messages sent, then all received: every one in flight at once."""
    began: int = pair.ask("a", "produce", start, count)
    pair.send("b", "consume", start, count)
    pair.wait("b", "armed")
    finished: int = pair.wait("b")
    return finished - began


# Batches of messages this large are warmed up by a burst (where the transport
# buffers one): a large-payload path that reuses its buffers (the connector's
# pool slots) makes one per message in flight, and a warm-up batch that left
# fewer in flight than a timed one did made the timed one create some (16 MiB:
# a put that creates its slot took 35 ms against 7 ms reusing one, and it
# happened in 3 of 5 timed batches of one mode and 2 of 5 of the other, enough
# to swap their medians; docs/performance.md, "medium payloads and the
# deadline wait"). A burst has every message of the batch in flight at once.
BURST_WARM_MIN = 16 * MIB


def run_throughput(
    pair: Pair,
    spec: CaseSpec,
    count: int,
    batches: int,
    burst: bool = False,
    warm_burst: bool = False,
) -> tuple[list[float], dict[str, Any]]:
    rates = []
    step = _burst if burst else _batch
    try:
        _connect(pair, spec)
        # untimed: first-touch costs, connections, discovery, every reusable buffer
        (_burst if warm_burst else step)(pair, 0, count)
        for batch in range(1, batches + 1):
            elapsed_ns = step(pair, batch * count, count)
            rates.append(count * spec.size / (elapsed_ns / 1e9) / MIB)
    except BaseException:
        with contextlib.suppress(BaseException):
            _teardown(pair)
        raise
    return rates, _teardown(pair)


# -- the run ---------------------------------------------------------------------------


def route_of(stats: dict[str, Any]) -> str | None:
    """Which way the connector's messages came, from what its receivers counted per delivery."""
    received: dict[str, int] = {}
    for side in stats.values():
        for route, count in side.get("received_routes", {}).items():
            received[route] = received.get(route, 0) + count
    if not received:
        return None
    if len(received) == 1:
        return next(iter(received))
    parts = ", ".join(f"{route} {count}" for route, count in sorted(received.items()))
    return f"mixed ({parts})"


def _rotating_copies(
    pair: Pair,
    plan: Plan,
    case_id: str,
    copies: dict[str, dict[str, list[float]]],
    skipped: dict[str, str],
) -> None:
    """The bursts' baseline: the copy into a rotating set of as many buffers as are in flight.

    Kind ``rotating xN`` under the size's label: what the producer writes in
    a burst of N (N slots, none of them in cache), where ``warm`` rewrites
    one buffer; the burst targets compare with it (`_report.targets`).
    """
    for size, count, _ in plan.bursts:
        if size < MIB:
            continue
        label = size_label(size)
        reason = space_shortfall(size, count + 1)
        if reason:
            skipped[f"{label} rotating x{count}"] = reason
            continue
        path = os.path.join(SHM_ROOT, f"shmring-bench-{case_id}-rotate")
        copies.setdefault(label, {})[f"rotating x{count}"] = pair.ask(
            "a",
            "probe",
            "copy_bandwidth",
            {
                "path": path,
                "size": size,
                "copies": max(plan.copy_count, count),
                "fresh": False,
                "rotate": count,
            },
        )


def run_probes(pair: Pair, plan: Plan, case_id: str, sizes: list[int]) -> dict[str, Any]:
    """One repeat of the reference measurements (`_probes`): copies, futex round trips, wake-ups."""
    copies: dict[str, dict[str, list[float]]] = {}
    skipped: dict[str, str] = {}
    for size in sizes:
        label = size_label(size)
        reason = space_shortfall(size, 2)
        if reason:
            skipped[label] = reason
            continue
        for kind in ("warm", "fresh"):
            path = os.path.join(SHM_ROOT, f"shmring-bench-{case_id}-copy")
            copies.setdefault(label, {})[kind] = pair.ask(
                "a",
                "probe",
                "copy_bandwidth",
                {"path": path, "size": size, "copies": plan.copy_count, "fresh": kind == "fresh"},
            )
    _rotating_copies(pair, plan, case_id, copies, skipped)
    futex_prefix = os.path.join(SHM_ROOT, f"shmring-bench-{case_id}-futex")
    word_paths = _probes.futex_word_paths(futex_prefix)
    try:
        for path in word_paths:
            with open(path, "wb") as stream:
                stream.truncate(_probes.FUTEX_FILE_BYTES)
        count = plan.wake_warm + plan.wake_count
        pair.send(
            "b",
            "probe",
            "futex_echo",
            {"prefix": futex_prefix, "count": count, "timeout_s": PROBE_TIMEOUT_S},
        )
        pair.wait("b", "armed")
        round_trips = pair.ask(
            "a",
            "probe",
            "futex_ping",
            {
                "prefix": futex_prefix,
                "warm": plan.wake_warm,
                "count": plan.wake_count,
                "gap_s": plan.wake_gap_s,
                "timeout_s": PROBE_TIMEOUT_S,
            },
        )
        pair.wait("b")
    finally:
        for path in word_paths:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
    scope = f"{case_id}w"
    pair.send(
        "b",
        "probe",
        "wake_receive",
        {
            "scope": scope,
            "warm": plan.wake_warm,
            "count": plan.wake_count,
            "idle_s": plan.idle_s,
            "timeout_s": PROBE_TIMEOUT_S,
        },
    )
    pair.wait("b", "armed")
    sent = pair.ask(
        "a",
        "probe",
        "wake_send",
        {
            "scope": scope,
            "warm": plan.wake_warm,
            "count": plan.wake_count,
            "gap_s": plan.wake_gap_s,
            "idle_s": plan.idle_s,
            "timeout_s": PROBE_TIMEOUT_S,
        },
    )
    received = pair.wait("b")
    return {
        "copies": copies,
        "copy_skipped": skipped,
        "futex_round_trip_ns": round_trips,
        "wake_ns": [
            r - s for r, s in zip(received["received_ns"], sent["put_started_ns"], strict=True)
        ],
        "wake_after_put_ns": [
            r - s for r, s in zip(received["received_ns"], sent["put_returned_ns"], strict=True)
        ],
        "idle_cpu_fraction": received["idle_cpu_fraction"],
        "wake_gap_s": sent["gap_s"],
    }


def run(plan: Plan, transports: list[str], log: Any = sys.stderr) -> dict[str, Any]:
    from shmring.impl import codec

    token = uuid.uuid4().hex[:8]
    tree_size = len(codec.encode(make_tree()))
    counter = 0
    latency: dict[str, dict[str, list[int]]] = {
        label: {t: [] for t in transports} for label, _, _ in plan.latency_payloads
    }
    throughput: dict[str, dict[str, list[float]]] = {
        size_label(size): {t: [] for t in transports} for size, _, _ in plan.throughput
    }
    for size, count, _ in plan.bursts:
        throughput[burst_label(size, count)] = {t: [] for t in transports}
    copy_sizes = sorted({size for size, _, _ in (*plan.throughput, *plan.bursts) if size >= MIB})
    copies: dict[str, dict[str, list[float]]] = {}
    probe_skips: dict[str, str] = {}
    futex_ns: list[int] = []
    wake_ns: list[int] = []
    wake_after_put_ns: list[int] = []
    idle_fractions: list[float] = []
    routes: dict[str, dict[str, set[str]]] = {}
    reuse: dict[str, dict[str, list[dict[str, int]]]] = {}  # bursts: files reused per case
    health: dict[str, dict[str, list[dict[str, int]]]] = {}  # large cases: the producer's counters
    not_run: dict[str, dict[str, str]] = {}
    started = time.monotonic()
    pair = Pair()
    sections = {"latency": 0.0, "throughput": 0.0, "probes": 0.0}  # seconds spent in each
    mark = time.monotonic()
    try:
        for repeat in range(plan.repeats):
            shift = repeat % len(transports)
            order = transports[shift:] + transports[:shift]
            for label, kind, size in plan.latency_payloads:
                for name in order:
                    transport = TRANSPORTS[name]
                    if kind not in transport.kinds or not transport.measures_latency:
                        continue
                    counter += 1
                    spec = CaseSpec(
                        f"b{token}{counter:05d}", name, kind, size or tree_size, LATENCY_CAPACITY, 2
                    )
                    samples, stats = run_latency(pair, spec, plan.latency_warm, plan.latency_count)
                    latency[label][name].extend(samples)
                    route = route_of(stats)
                    if route:
                        routes.setdefault(f"latency {label}", {}).setdefault(name, set()).add(route)
            mark = _lap(sections, "latency", mark)
            cases = [(size, count, batches, False) for size, count, batches in plan.throughput]
            cases += [(size, count, batches, True) for size, count, batches in plan.bursts]
            for size, count, batches, burst in cases:
                label = burst_label(size, count) if burst else size_label(size)
                for name in order:
                    transport = TRANSPORTS[name]
                    if BYTES not in transport.kinds:
                        continue
                    if burst and not transport.buffers_bursts:
                        not_run.setdefault(label, {})[name] = (
                            "a bounded kernel buffer: the sender would block before the receiver starts"
                        )
                        continue
                    capacity = plan.throughput_capacity
                    if name == "ring" and not ring_admits(capacity, size, (batches + 1) * count):
                        not_run.setdefault(label, {})[name] = (
                            f"not admitted: a {size_label(size)} frame exceeds capacity/4 of the "
                            f"{size_label(capacity)} ring"
                        )
                        continue
                    reason = space_shortfall(size, count)
                    if reason:
                        not_run.setdefault(label, {})[name] = reason
                        print(f"{name} {label}: {reason}", file=log)
                        continue
                    counter += 1
                    spec = CaseSpec(f"b{token}{counter:05d}", name, BYTES, size, capacity, count)
                    warm_burst = burst or (transport.buffers_bursts and size >= BURST_WARM_MIN)
                    rates, stats = run_throughput(
                        pair, spec, count, batches, burst=burst, warm_burst=warm_burst
                    )
                    throughput[label][name].extend(rates)
                    route = route_of(stats)
                    if route:
                        routes.setdefault(f"throughput {label}", {}).setdefault(name, set()).add(
                            route
                        )
                    producer = stats.get("a", {})
                    if "puts" in producer and size >= MIB:
                        health.setdefault(label, {}).setdefault(name, []).append(
                            {
                                key: value
                                for key, value in producer.items()
                                if key != "received_routes" and value
                            }
                        )
                    reused = producer.get("fallback_reused")
                    if burst and reused is not None:
                        reuse.setdefault(label, {}).setdefault(name, []).append(
                            {"messages": (batches + 1) * count, "fallback_reused": reused}
                        )
            mark = _lap(sections, "throughput", mark)
            counter += 1
            probes = run_probes(pair, plan, f"b{token}{counter:05d}", copy_sizes)
            probe_skips.update(probes["copy_skipped"])
            for label, by_kind in probes["copies"].items():
                for kind, rates in by_kind.items():
                    copies.setdefault(label, {}).setdefault(kind, []).extend(rates)
            futex_ns.extend(probes["futex_round_trip_ns"])
            wake_ns.extend(probes["wake_ns"])
            wake_after_put_ns.extend(probes["wake_after_put_ns"])
            if probes["idle_cpu_fraction"] is not None:
                idle_fractions.append(probes["idle_cpu_fraction"])
            mark = _lap(sections, "probes", mark)
            print(
                f"repeat {repeat + 1}/{plan.repeats} done after {time.monotonic() - started:.0f} s",
                file=log,
            )
    finally:
        pair.close()
        _remove_leftovers(token)
    print("ring lockstep machine (steps/s)", file=log)
    lockstep = _probes.ring_lockstep_rate(plan.lockstep_examples)
    sections["lockstep"] = lockstep.get("seconds", 0.0)
    return {
        "latency_us": {
            label: {
                name: _scaled(summarize(samples), 1e-3) for name, samples in by.items() if samples
            }
            for label, by in latency.items()
        },
        "throughput_mib_s": {
            label: {name: _rate_summary(rates) for name, rates in by.items() if rates}
            for label, by in throughput.items()
        },
        "copy_mib_s": {
            label: {kind: _rate_summary(rates) for kind, rates in by.items() if rates}
            for label, by in copies.items()
        },
        "copy_not_run": probe_skips,
        "wake_us": {
            name: _scaled(summarize(samples), 1e-3)
            for name, samples in (
                ("futex round trip", futex_ns),
                ("get_with_deadline wake", wake_ns),
                ("get_with_deadline wake, from put's return", wake_after_put_ns),
            )
            if samples
        },
        "idle_cpu_fraction": _median(idle_fractions) if idle_fractions else None,
        "ring_lockstep": lockstep,
        "routes": {
            case: {name: sorted(r) for name, r in by.items()} for case, by in routes.items()
        },
        "not_run": not_run,
        "burst_fallback_reuse": reuse,
        "large_payload_health": health,
        "tree_encoded_bytes": tree_size,
        "pinned_cpus": {who: info["cpus"] for who, info in pair.info.items()},
        "seconds": round(time.monotonic() - started, 1),
        "section_seconds": {name: round(value, 1) for name, value in sections.items()},
    }


def _lap(sections: dict[str, float], name: str, mark: float) -> float:
    """Add the time since `mark` to `sections[name]`; the new mark."""
    now = time.monotonic()
    sections[name] += now - mark
    return now


def _rate_summary(rates: list[float]) -> dict[str, float]:
    return {"median": _median(rates), "worst": min(rates), "runs": len(rates)}


def _median(values: list[float]) -> float:
    import statistics

    return statistics.median(values)


def _scaled(summary: dict[str, float], factor: float) -> dict[str, float]:
    return {key: (value if key == "n" else value * factor) for key, value in summary.items()}


def _remove_leftovers(token: str) -> None:
    """Safety net after a failed run: files named for this run's cases, nothing else."""
    import shutil
    import tempfile

    marker = f"b{token}"
    for root in (SHM_ROOT, tempfile.gettempdir()):
        with contextlib.suppress(FileNotFoundError), os.scandir(root) as entries:
            for entry in entries:
                if marker in entry.name and "shmring" in entry.name:
                    with contextlib.suppress(OSError):
                        if entry.is_dir(follow_symlinks=False):
                            shutil.rmtree(entry.path)
                        else:
                            os.unlink(entry.path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument(
        "--quick", action="store_true", help="fewer round trips, 3 repeats, no 256 MiB (~2.5 min)"
    )
    mode.add_argument(
        "--smoke", action="store_true", help="smallest sizes, 1 repeat (the CI smoke test)"
    )
    parser.add_argument(
        "--repeats", type=int, default=None, help="interleaved repeats (default 5; quick 3)"
    )
    parser.add_argument("--transports", default=",".join(TRANSPORTS), help="comma-separated subset")
    parser.add_argument("--json", dest="json_path", default=None, help="write the results here")
    parser.add_argument(
        "--plot",
        default=None,
        help="write the PNG plot here (default: next to --json, same name, .png)",
    )
    parser.add_argument(
        "--markdown",
        default=None,
        help="write the docs/performance.md snippet here (default: next to --json, .md)",
    )
    args = parser.parse_args(argv)
    plan = make_plan("smoke" if args.smoke else "quick" if args.quick else "full", args.repeats)
    if plan.repeats < 1:
        parser.error(f"--repeats must be >= 1: repeats={plan.repeats}")
    wanted = [name.strip() for name in args.transports.split(",") if name.strip()]
    unknown = [name for name in wanted if name not in TRANSPORTS]
    if unknown:
        parser.error(f"unknown transports: {unknown}; known: {list(TRANSPORTS)}")
    unavailable = {name: why for name in wanted if (why := transport_unavailable(name))}
    transports = [name for name in wanted if name not in unavailable]
    command = "python benchmarks/bench_ring.py " + " ".join(
        shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:])
    )
    load_before = os.getloadavg()
    result = run(plan, transports)
    result.update(
        {
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "command": command.strip(),
            "plan": asdict(plan),
            "transports": transports,
            "unavailable": unavailable,
            "host": {
                "python": platform.python_version(),
                "machine": platform.machine(),
                "cpus": os.cpu_count(),
                "kernel": platform.release(),
                # 1-minute load before and after: other jobs sharing the machine
                "load_average_1m": [load_before[0], os.getloadavg()[0]],
            },
        }
    )
    result["targets"] = targets(result)
    print(table(result, transports))
    if args.json_path:
        with open(args.json_path, "w") as stream:
            json.dump(result, stream, indent=2, sort_keys=False)
            stream.write("\n")
    stem = os.path.splitext(args.json_path)[0] if args.json_path else None
    snippet = args.markdown or (stem + ".md" if stem else None)
    if snippet:
        with open(snippet, "w") as stream:
            stream.write(markdown(result, transports))
        print(f"markdown: {snippet}", file=sys.stderr)
    plot = args.plot or (stem + ".png" if stem else None)
    if plot:
        try:
            write_plot(result, transports, plot)
        except ImportError as error:  # matplotlib is in the [bench] extra
            print(f"no plot: {error}", file=sys.stderr)
        else:
            print(f"plot: {plot}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
