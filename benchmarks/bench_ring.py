"""The host ring against the transports a pipeline would otherwise pick, side by side.

Transports: the raw ring channel (`RingChannel` / `RingReader`, codec into
and out of the frame), the `Connector` (routing, discovery, codec; its ring
path while frames fit, the per-key fallback when they do not) received two
ways (`get_with_deadline`, which spins briefly and then sleeps on the
doorbell, and ``connector/poll``, a busy loop of plain `get`), per-key POSIX
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
  ending with its own copy of each: per repeat an untimed batch, then one
  or more timed batches (three for the small sizes, whose batches last only
  milliseconds); median and worst over all timed batches;
* bursts (``16 MiB x32 burst``): the producer sends a whole batch before
  the receiver starts, so every message is in flight at once -- more than
  the connector's spare fallback files hold (16 of 16 MiB by default); the
  JSON's ``burst_fallback_reuse`` says how many puts reused a file.
  Transports with a bounded kernel buffer (the Pipe) cannot take a burst.

Next to ``--json out.json`` it writes ``out.png`` (or ``--plot PATH``):
latency and throughput per transport and size (matplotlib, the [bench]
extra). The targets printed at the end are issue 13's: the connector
within 10% of the raw ring and at most iceoryx2 per latency payload, and at
least iceoryx2's throughput at 64 KiB, 1 MiB, 16 MiB and in the bursts.

Repeats interleave: each repeat runs every case of every transport, the
transport order rotated per repeat, so machine noise hits all alike.

    .venv/bin/python benchmarks/bench_ring.py [--quick | --smoke] [--repeats N] [--json out.json] [--plot out.png]

Ring capacity: 4 MiB (the connector's default) for latency, 64 MiB (the
maximum) for throughput. A frame larger than capacity/4 is not admitted, so
16 MiB and 256 MiB messages do not fit any ring: the raw channel cannot send
them (shown as n/a) and the connector sends them through its per-key
fallback (the table says which route each connector cell took).
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

from _harness import summarize, worker_main  # noqa: E402
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


def make_plan(mode: str, repeats: int | None) -> Plan:
    if mode == "smoke":  # the smallest sizes, one repeat: the scripts cannot rot
        return Plan(repeats or 1, LATENCY_PAYLOADS[:2], 2, 5, ((64 * KIB, 4, 1),), ((MIB, 4, 1),))
    if mode == "quick":
        return Plan(
            repeats or 3,
            LATENCY_PAYLOADS,
            20,
            100,
            ((64 * KIB, 256, 2), (MIB, 16, 2), (16 * MIB, 4, 1)),
            ((16 * MIB, 24, 1),),
        )
    return Plan(
        repeats or 5,
        LATENCY_PAYLOADS,
        50,
        400,
        ((64 * KIB, 512, 3), (MIB, 32, 3), (16 * MIB, 8, 1), (256 * MIB, 2, 1)),
        ((16 * MIB, 32, 1),),
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


def run_throughput(
    pair: Pair, spec: CaseSpec, count: int, batches: int, burst: bool = False
) -> tuple[list[float], dict[str, Any]]:
    rates = []
    step = _burst if burst else _batch
    try:
        _connect(pair, spec)
        step(pair, 0, count)  # untimed: first-touch costs, connections, discovery
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
    """Which way the connector's puts went, from the producer's health counters."""
    producer = stats.get("a", {})
    if "ring_puts" not in producer:
        return None
    ring, fallback = producer["ring_puts"], producer["fallbacks"]
    if fallback == 0:
        return "ring"
    if ring == 0:
        return "fallback"
    return f"mixed ({fallback}/{ring + fallback} fallback)"


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
    routes: dict[str, dict[str, set[str]]] = {}
    reuse: dict[str, dict[str, list[dict[str, int]]]] = {}  # bursts: files reused per case
    not_run: dict[str, dict[str, str]] = {}
    started = time.monotonic()
    pair = Pair()
    try:
        for repeat in range(plan.repeats):
            shift = repeat % len(transports)
            order = transports[shift:] + transports[:shift]
            for label, kind, size in plan.latency_payloads:
                for name in order:
                    if kind not in TRANSPORTS[name].kinds:
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
                    if name == "ring" and not ring_admits(
                        THROUGHPUT_CAPACITY, size, (batches + 1) * count
                    ):
                        not_run.setdefault(label, {})[name] = (
                            f"not admitted: a {size_label(size)} frame exceeds capacity/4 of the largest ring (64 MiB)"
                        )
                        continue
                    counter += 1
                    spec = CaseSpec(
                        f"b{token}{counter:05d}", name, BYTES, size, THROUGHPUT_CAPACITY, count
                    )
                    rates, stats = run_throughput(pair, spec, count, batches, burst=burst)
                    throughput[label][name].extend(rates)
                    route = route_of(stats)
                    if route:
                        routes.setdefault(f"throughput {label}", {}).setdefault(name, set()).add(
                            route
                        )
                    reused = stats.get("a", {}).get("fallback_reused")
                    if burst and reused is not None:
                        reuse.setdefault(label, {}).setdefault(name, []).append(
                            {"messages": (batches + 1) * count, "fallback_reused": reused}
                        )
            print(
                f"repeat {repeat + 1}/{plan.repeats} done after {time.monotonic() - started:.0f} s",
                file=log,
            )
    finally:
        pair.close()
        _remove_leftovers(token)
    return {
        "latency_us": {
            label: {
                name: _scaled(summarize(samples), 1e-3) for name, samples in by.items() if samples
            }
            for label, by in latency.items()
        },
        "throughput_mib_s": {
            label: {
                name: {"median": _median(rates), "worst": min(rates), "runs": len(rates)}
                for name, rates in by.items()
                if rates
            }
            for label, by in throughput.items()
        },
        "routes": {
            case: {name: sorted(r) for name, r in by.items()} for case, by in routes.items()
        },
        "not_run": not_run,
        "burst_fallback_reuse": reuse,
        "tree_encoded_bytes": tree_size,
        "pinned_cpus": {who: info["cpus"] for who, info in pair.info.items()},
        "seconds": round(time.monotonic() - started, 1),
    }


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


# -- targets and tables --------------------------------------------------------------------


CONNECTORS = ("connector", "connector/poll")


def _ratio_row(
    what: str,
    ours: str,
    cell: dict[str, float] | None,
    base: dict[str, float] | None,
    limit: float,
    at_most: bool,
    p99: bool = False,
) -> dict[str, Any]:
    if cell is None or base is None:
        return {"target": what, "ours": ours, "ratio": None, "limit": limit, "met": None}
    ratio = cell["median"] / base["median"]
    row = {
        "target": what,
        "ours": ours,
        "ratio": ratio,
        "limit": limit,
        "met": ratio <= limit if at_most else ratio >= limit,
    }
    if p99:
        row["p99_ratio"] = cell["p99"] / base["p99"]
    return row


def targets(result: dict[str, Any]) -> list[dict[str, Any]]:
    """Issue 13's targets as measured ratios; `met` is None where a side did not run.

    Small messages: the connector (both receive styles) within 10% of the raw
    ring and at most iceoryx2, per latency payload. Throughput: the connector
    at least iceoryx2 at 64 KiB, 1 MiB, 16 MiB and in the bursts.
    """
    rows: list[dict[str, Any]] = []
    for label, cells in result["latency_us"].items():
        for ours in CONNECTORS:
            cell = cells.get(ours)
            for baseline, limit, what in (
                ("ring", 1.1, f"{label} one-way latency <= raw ring + 10%"),
                ("iceoryx2", 1.0, f"{label} one-way latency <= iceoryx2"),
            ):
                rows.append(
                    _ratio_row(what, ours, cell, cells.get(baseline), limit, True, p99=True)
                )
    rates = result["throughput_mib_s"]
    for label, cells in rates.items():
        if label not in ("64 KiB", "1 MiB", "16 MiB") and "burst" not in label:
            continue
        for ours in CONNECTORS:
            rows.append(
                _ratio_row(
                    f"{label} throughput >= iceoryx2",
                    ours,
                    cells.get(ours),
                    cells.get("iceoryx2"),
                    1.0,
                    False,
                )
            )
    return rows


def write_plot(result: dict[str, Any], transports: list[str], path: str) -> None:
    """Latency (median, p99 as a tick) and throughput (median) per transport and size, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    latency = result["latency_us"]
    rates = result["throughput_mib_s"]
    figure, (left, right) = plt.subplots(1, 2, figsize=(15, 5.5))
    colors = plt.get_cmap("tab10")

    def bars(axis: Any, groups: dict[str, dict[str, Any]], value: str, title: str) -> None:
        labels = list(groups)
        shown = [t for t in transports if any(t in groups[label] for label in labels)]
        width = 0.8 / max(len(shown), 1)
        for index, name in enumerate(shown):
            xs, heights, p99s = [], [], []
            for position, label in enumerate(labels):
                cell = groups[label].get(name)
                if cell is None:
                    continue
                xs.append(position + (index - (len(shown) - 1) / 2) * width)
                heights.append(cell[value])
                p99s.append(cell.get("p99"))
            color = colors(transports.index(name) % 10)  # one colour per transport in both panels
            axis.bar(xs, heights, width, label=name, color=color)
            if value == "median" and all(p is not None for p in p99s) and axis is left:
                axis.scatter(xs, p99s, marker="_", color="black", s=30, zorder=3)
        axis.set_xticks(range(len(labels)))
        axis.set_xticklabels(labels, rotation=15)
        axis.set_yscale("log")
        axis.set_title(title)
        axis.grid(axis="y", which="both", alpha=0.3)

    bars(left, latency, "median", "one-way latency, us (bar: median, tick: p99); lower is better")
    bars(
        right, rates, "median", "throughput, MiB/s, receiver owns a copy (median); higher is better"
    )
    left.legend(fontsize=8, ncol=2)
    host = result.get("host", {})
    figure.suptitle(
        f"bench_ring.py {result.get('date', '')}: {result.get('command', '')} "
        f"(load {host.get('load_average_1m', '?')})",
        fontsize=9,
    )
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def table(result: dict[str, Any], transports: list[str]) -> str:
    lines = []
    latency = result["latency_us"]
    labels = list(latency)
    lines.append("One-way latency, us (median / p99; half a ping-pong round trip)")
    lines.append("")
    lines.append("| transport | " + " | ".join(labels) + " |")
    lines.append("|---|" + "---:|" * len(labels))
    for name in transports:
        cells = []
        for label in labels:
            cell = latency[label].get(name)
            cells.append(f"{cell['median']:.1f} / {cell['p99']:.1f}" if cell else "-")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    rates = result["throughput_mib_s"]
    if rates:
        sizes = list(rates)
        lines.append("")
        lines.append("Throughput, MiB/s, receiver owns a copy (median, worst of all timed batches)")
        lines.append("")
        lines.append("| transport | " + " | ".join(sizes) + " |")
        lines.append("|---|" + "---:|" * len(sizes))
        for name in transports:
            if not any(
                name in rates[label] or name in result["not_run"].get(label, {}) for label in sizes
            ):
                continue  # a tree-only baseline
            cells = []
            for label in sizes:
                cell = rates[label].get(name)
                if cell is None:
                    cells.append("n/a" if name in result["not_run"].get(label, {}) else "-")
                    continue
                text = f"{cell['median']:.0f} ({cell['worst']:.0f})"
                route = result["routes"].get(f"throughput {label}", {}).get(name)
                if route and route != ["ring"]:
                    text += " " + "/".join(route)
                cells.append(text)
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append("Targets (ratio of medians; p99 ratio in brackets for latency)")
    lines.append("")
    for row in result["targets"]:
        if row["ratio"] is None:
            verdict = "not measured"
            ratio = "-"
        else:
            verdict = "met" if row["met"] else "MISSED"
            ratio = f"{row['ratio']:.3f}x"
            if "p99_ratio" in row:
                ratio += f" [{row['p99_ratio']:.3f}x]"
        lines.append(f"- {row['target']} ({row['ours']}): {ratio} -> {verdict}")
    for label, reasons in result["not_run"].items():
        for name, why in reasons.items():
            lines.append(f"- {name} {label}: {why}")
    for name, why in result["unavailable"].items():
        lines.append(f"- {name}: not run: {why}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument(
        "--quick", action="store_true", help="fewer round trips, 3 repeats, no 256 MiB"
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
    plot = args.plot or (os.path.splitext(args.json_path)[0] + ".png" if args.json_path else None)
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
