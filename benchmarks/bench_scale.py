"""Scale curves: what a get and a put cost as the frames waiting, the producers and the edges grow.

bench_ring.py measures one message between two processes; this measures
how the price of one message moves with the state around it (issue 25), in
one process pinned to one core, every measured operation timed on its own
(`time.perf_counter_ns`), the sizes of a curve interleaved per repeat (the
order rotated), medians of the per-repeat medians:

* ``waiting``: N frames of 64 B wait on the edge (64 MiB ring, N = 100 ..
  50,000) while the receiver takes keys in random order. Per operation: a
  `Connector.put` of a new key, then a `Connector.get` of a random waiting
  key (so N stays as it is; the get also indexes the frame just put), and
  the same two on the raw ring (`RingChannel.put`, `RingReader.get`).
* ``burst`` (the issue's own measurement): N frames are put, then 200
  random keys of them are got; the figure is the mean time of those gets,
  the first of which indexes all N frames (``first get`` and ``later
  gets`` separately too), and the index's memory (tracemalloc: what the
  receiver's first get allocated and kept) per waiting frame.
* ``producers``: P producers (Connector instances) in the scope, P - 1 of
  them with a frame waiting on their own edge into the same stage; put +
  get on the measured edge.
* ``same edge``: P producers all on the measured edge (the put's producer
  last in the order a get visits them): what a get by key pays per
  producer of its own edge.
* ``stamp moves``: as ``producers``, but the discovery stamp is bumped
  before each put (untimed), as a marker change anywhere in the scope
  would: the get after it rescans the directory, so this is what discovery
  costs per change against the producers present.
* ``edges``: one producer connector publishing on E edges into one
  receiver (64 KiB rings), put + get on a random edge each time.

    .venv/bin/python benchmarks/bench_scale.py [--quick | --smoke] [--repeats N]
        [--json out.json] [--plot out.png] [--sections waiting,burst,...]
    .venv/bin/python benchmarks/bench_scale.py --compare before.json [...] --against after.json [...]
        [--plot out.png]   # before / after: medians over the runs of each side, one plot

`--json out.json` also writes ``out.png`` (the curves) unless `--plot`
names another path. Never asserts a time: `model_tests/test_bench_smoke.py`
runs `--smoke` and checks that every curve has its points.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import platform
import random
import shlex
import statistics
import sys
import time
import tracemalloc
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

KIB = 1024
MIB = 1024 * KIB
PAYLOAD = bytes(range(64))
WAITING_CAPACITY = 64 * MIB  # the largest ring: 50,000 frames of 64 B fit many times over
SMALL_CAPACITY = 64 * KIB  # per ring where many rings exist at once (producers, edges)
BURST_GETS = 200

SECTIONS = ("waiting", "burst", "producers", "same edge", "stamp moves", "edges")


@dataclass(frozen=True)
class Plan:
    repeats: int
    waiting: tuple[int, ...]
    producers: tuple[int, ...]
    edges: tuple[int, ...]
    operations: int  # timed operations per point and repeat
    burst_repeats: int


def make_plan(mode: str, repeats: int | None) -> Plan:
    if mode == "smoke":
        return Plan(repeats or 1, (100, 1000), (1, 4), (1, 4), 20, 1)
    if mode == "quick":
        return Plan(
            repeats or 3, (100, 1000, 10000, 50000), (1, 8, 64), (1, 16, 256), 300, repeats or 2
        )
    return Plan(
        repeats or 5,
        (100, 1000, 5000, 10000, 25000, 50000),
        (1, 4, 16, 64),
        (1, 4, 16, 64, 256),
        1000,
        repeats or 5,
    )


def _scope(tag: str) -> str:
    return f"scale{tag}{uuid.uuid4().hex[:8]}"


class Point:
    """One point of a curve: its state (set up once) and one repeat's timed operations."""

    def __init__(self) -> None:
        self.samples: dict[str, list[float]] = {}  # series -> per-repeat medians, us

    def record(self, series: str, values_ns: list[int]) -> None:
        self.samples.setdefault(series, []).append(statistics.median(values_ns) / 1000)

    def run(self, operations: int, rng: random.Random) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


class Waiting(Point):
    """N frames waiting on one edge, taken in random order (connector and raw ring)."""

    def __init__(self, waiting: int) -> None:
        super().__init__()
        from shmring.impl.connector import Connector
        from shmring.impl.directory import ensure_deployment_directory
        from shmring.impl.names import current_producer_identity, ring_path
        from shmring.impl.ring.producer import RingChannel
        from shmring.impl.ring.reader import RingReader

        scope = _scope("w")
        self.producer = Connector(scope, ring_capacity=WAITING_CAPACITY)
        self.receiver = Connector(scope, ring_capacity=WAITING_CAPACITY)
        self.directory = ensure_deployment_directory(_scope("r"))
        identity = current_producer_identity()
        path = ring_path(self.directory, "a", "b", identity)
        self.channel = RingChannel.create(path, WAITING_CAPACITY, producer=identity)
        self.reader = RingReader.attach(path)
        self.waiting = [f"w{index}" for index in range(waiting)]
        for key in self.waiting:
            self.producer.put("a", "b", key, PAYLOAD)
            self.channel.put(key, PAYLOAD)
        self.receiver.get("a", "b", "none")  # the receiver maps the ring and indexes what waits
        self.reader.get("none")
        self.serial = 0

    def run(self, operations: int, rng: random.Random) -> None:
        clock = time.perf_counter_ns
        puts, gets, raw_puts, raw_gets = [], [], [], []
        producer, receiver, channel, reader = (
            self.producer,
            self.receiver,
            self.channel,
            self.reader,
        )
        waiting = self.waiting
        for _ in range(operations):
            self.serial += 1
            new = f"n{self.serial}"
            slot = rng.randrange(len(waiting))
            key = waiting[slot]
            waiting[slot] = new
            began = clock()
            producer.put("a", "b", new, PAYLOAD)
            middle = clock()
            got = receiver.get("a", "b", key)
            ended = clock()
            if not got:
                raise AssertionError(f"connector lost key={key!r}: {got.status}")
            puts.append(middle - began)
            gets.append(ended - middle)
            began = clock()
            channel.put(new, PAYLOAD)
            middle = clock()
            status = reader.get(key).status
            ended = clock()
            if status.value != "delivered":
                raise AssertionError(f"raw ring lost key={key!r}: {status}")
            raw_puts.append(middle - began)
            raw_gets.append(ended - middle)
        self.record("connector get", gets)
        self.record("connector put", puts)
        self.record("connector put + get", [p + g for p, g in zip(puts, gets, strict=True)])
        self.record("raw ring get", raw_gets)
        self.record("raw ring put", raw_puts)

    def close(self) -> None:
        from shmring.impl.directory import remove_deployment_directory_if_empty

        self.reader.close()
        self.channel.close()
        self.receiver.close()
        self.producer.close()
        remove_deployment_directory_if_empty(self.directory)


def burst(waiting: int, rng: random.Random, traced: bool = False) -> dict[str, float]:
    """The issue's measurement: put `waiting` frames, then get BURST_GETS random ones of them.

    `traced`: instead of timing, measure with tracemalloc what the first
    get (the one that indexes the frames) allocates and keeps.
    """
    from shmring.impl.connector import Connector

    scope = _scope("b")
    producer = Connector(scope, ring_capacity=WAITING_CAPACITY)
    receiver = Connector(scope, ring_capacity=WAITING_CAPACITY)
    clock = time.perf_counter_ns
    try:
        producer.put("a", "b", "first", PAYLOAD)
        if not receiver.get("a", "b", "first"):  # the receiver maps the ring before the burst
            raise AssertionError("the producer is not seen")
        for index in range(waiting):
            producer.put("a", "b", f"k{index}", PAYLOAD)
        keys = [f"k{index}" for index in rng.sample(range(waiting), min(BURST_GETS, waiting))]
        if traced:
            gc.collect()
            tracemalloc.start()
            got = receiver.get("a", "b", keys[0])
            kept, _ = tracemalloc.get_traced_memory()
            tracemalloc.stop()
            return {"index bytes per waiting frame": kept / waiting}
        began = clock()
        got = receiver.get("a", "b", keys[0])
        first = clock() - began
        if not got:
            raise AssertionError(f"lost key={keys[0]!r}")
        times = []
        for key in keys[1:]:
            began = clock()
            got = receiver.get("a", "b", key)
            times.append(clock() - began)
            if not got:
                raise AssertionError(f"lost key={key!r}")
        return {
            "mean get (the issue's figure)": (first + sum(times)) / len(keys) / 1000,
            "first get": first / 1000,
            "later gets (median)": (statistics.median(times) if times else 0.0) / 1000,
            "first get per waiting frame": first / waiting / 1000,
        }
    finally:
        receiver.close()
        producer.close()


class Producers(Point):
    """P producers in the scope; the measured one on edge (a, b), the others elsewhere or on it."""

    def __init__(self, count: int, same_edge: bool, bump: bool = False) -> None:
        super().__init__()
        self.bump = bump  # move the discovery stamp before each put (untimed)
        from shmring.impl.connector import Connector

        scope = _scope("p")
        self.receiver = Connector(scope, ring_capacity=SMALL_CAPACITY)
        self.others = []
        for index in range(count - 1):
            other = Connector(scope, ring_capacity=SMALL_CAPACITY)
            source = "a" if same_edge else f"o{index}"
            other.put(source, "b", f"other{index}", PAYLOAD)  # its ring and marker exist
            self.others.append(other)
        # Made last: the newest instance, so a get by key visits it after the others.
        self.producer = Connector(scope, ring_capacity=SMALL_CAPACITY)
        self.producer.put("a", "b", "first", PAYLOAD)
        if not self.receiver.get("a", "b", "first"):
            raise AssertionError("the measured producer is not seen")
        for index in range(count - 1):
            self.receiver.get("a" if same_edge else f"o{index}", "b", "none")  # maps every ring
        self.serial = 0

    def run(self, operations: int, rng: random.Random) -> None:
        clock = time.perf_counter_ns
        puts, gets = [], []
        producer, receiver = self.producer, self.receiver
        stamp = producer._deployment.stamp if self.bump and producer._deployment else None
        for _ in range(operations):
            self.serial += 1
            key = f"k{self.serial}"
            if stamp is not None:
                stamp.bump()  # as a marker change would: the receiver's next get rescans
            began = clock()
            producer.put("a", "b", key, PAYLOAD)
            middle = clock()
            got = receiver.get("a", "b", key)
            ended = clock()
            if not got:
                raise AssertionError(f"lost key={key!r}: {got.status}")
            puts.append(middle - began)
            gets.append(ended - middle)
        self.record("connector get", gets)
        self.record("connector put", puts)
        self.record("connector put + get", [p + g for p, g in zip(puts, gets, strict=True)])

    def close(self) -> None:
        self.receiver.close()
        self.producer.close()
        for other in self.others:
            other.close()


class Edges(Point):
    """One producer connector on E edges into one receiver; put + get on a random edge."""

    def __init__(self, count: int) -> None:
        super().__init__()
        from shmring.impl.connector import Connector

        scope = _scope("e")
        self.producer = Connector(scope, ring_capacity=SMALL_CAPACITY)
        self.receiver = Connector(scope, ring_capacity=SMALL_CAPACITY)
        self.sources = [f"s{index}" for index in range(count)]
        for source in self.sources:
            self.producer.put(source, "b", "first", PAYLOAD)
        for source in self.sources:
            if not self.receiver.get(source, "b", "first"):
                raise AssertionError(f"edge {source} -> b is not seen")
        self.serial = 0

    def run(self, operations: int, rng: random.Random) -> None:
        clock = time.perf_counter_ns
        puts, gets = [], []
        producer, receiver, sources = self.producer, self.receiver, self.sources
        for _ in range(operations):
            self.serial += 1
            key = f"k{self.serial}"
            source = sources[rng.randrange(len(sources))]
            began = clock()
            producer.put(source, "b", key, PAYLOAD)
            middle = clock()
            got = receiver.get(source, "b", key)
            ended = clock()
            if not got:
                raise AssertionError(f"lost key={key!r} on {source}: {got.status}")
            puts.append(middle - began)
            gets.append(ended - middle)
        self.record("connector get", gets)
        self.record("connector put", puts)
        self.record("connector put + get", [p + g for p, g in zip(puts, gets, strict=True)])

    def close(self) -> None:
        self.receiver.close()
        self.producer.close()


def run_curve(
    name: str, points: dict[int, Callable[[], Point]], plan: Plan, rng: random.Random
) -> dict[str, dict[str, float]]:
    """Every point of one curve, set up once, then `plan.repeats` interleaved repeats."""
    made: dict[int, Point] = {}
    try:
        for size, make in points.items():
            made[size] = make()
        sizes = list(made)
        for repeat in range(plan.repeats):
            order = sizes[repeat % len(sizes) :] + sizes[: repeat % len(sizes)]
            for size in order:
                gc.collect()
                gc.disable()
                try:
                    made[size].run(plan.operations, rng)
                finally:
                    gc.enable()
            print(f"  {name}: repeat {repeat + 1}/{plan.repeats}", file=sys.stderr, flush=True)
    finally:
        for point in made.values():
            point.close()
    return {
        str(size): {series: statistics.median(values) for series, values in point.samples.items()}
        for size, point in made.items()
    }


def run_burst(plan: Plan, rng: random.Random) -> dict[str, dict[str, float]]:
    samples: dict[int, dict[str, list[float]]] = {}
    sizes = list(plan.waiting)
    for repeat in range(plan.burst_repeats):
        for size in sizes[repeat % len(sizes) :] + sizes[: repeat % len(sizes)]:
            gc.collect()
            gc.disable()
            try:
                figures = burst(size, rng)
            finally:
                gc.enable()
            if repeat == 0:
                figures.update(burst(size, rng, traced=True))
            for series, value in figures.items():
                samples.setdefault(size, {}).setdefault(series, []).append(value)
        print(f"  burst: repeat {repeat + 1}/{plan.burst_repeats}", file=sys.stderr, flush=True)
    return {
        str(size): {series: statistics.median(values) for series, values in figures.items()}
        for size, figures in samples.items()
    }


def measure(plan: Plan, sections: tuple[str, ...], seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    curves: dict[str, Any] = {}
    if "waiting" in sections:
        curves["waiting"] = run_curve(
            "waiting", {n: (lambda n=n: Waiting(n)) for n in plan.waiting}, plan, rng
        )
    if "burst" in sections:
        curves["burst"] = run_burst(plan, rng)
    if "producers" in sections:
        curves["producers"] = run_curve(
            "producers",
            {p: (lambda p=p: Producers(p, same_edge=False)) for p in plan.producers},
            plan,
            rng,
        )
    if "same edge" in sections:
        curves["same edge"] = run_curve(
            "same edge",
            {p: (lambda p=p: Producers(p, same_edge=True)) for p in plan.producers},
            plan,
            rng,
        )
    if "stamp moves" in sections:
        curves["stamp moves"] = run_curve(
            "stamp moves",
            {p: (lambda p=p: Producers(p, same_edge=False, bump=True)) for p in plan.producers},
            plan,
            rng,
        )
    if "edges" in sections:
        curves["edges"] = run_curve(
            "edges", {e: (lambda e=e: Edges(e)) for e in plan.edges}, plan, rng
        )
    return curves


# -- the targets of issue 25 ------------------------------------------------------------

TARGETS = (
    # (curve, series, limit, what)
    ("waiting", "connector get", 1.5, "random-order get, most frames waiting / fewest"),
    ("waiting", "raw ring get", 1.5, "raw ring get, most frames waiting / fewest"),
    ("producers", "connector put + get", 1.2, "put + get, most producers in the scope / one"),
    ("edges", "connector put + get", 1.2, "put + get, most edges per connector / one"),
)


def targets(curves: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for curve, series, limit, what in TARGETS:
        points = curves.get(curve)
        if not points:
            continue
        sizes = sorted(points, key=int)
        low, high = points[sizes[0]].get(series), points[sizes[-1]].get(series)
        ratio = high / low if low and high is not None else None
        rows.append(
            {
                "target": f"{what} ({sizes[-1]} vs {sizes[0]}) <= {limit}x",
                "curve": curve,
                "series": series,
                "ratio": ratio,
                "limit": limit,
                "verdict": "not measured"
                if ratio is None
                else ("met" if ratio <= limit else "missed"),
            }
        )
    return rows


def markdown(result: dict[str, Any]) -> str:
    lines = []
    labels = {
        "waiting": "frames waiting",
        "burst": "frames put before the gets",
        "producers": "producers in the scope",
        "same edge": "producers on the measured edge",
        "stamp moves": "producers in the scope, stamp moved before each put",
        "edges": "edges per connector",
    }
    for curve, points in result["curves"].items():
        sizes = sorted(points, key=int)
        series = list(points[sizes[0]])
        lines.append(f"| {labels.get(curve, curve)} | " + " | ".join(series) + " |")
        lines.append("|---:|" + "---:|" * len(series))
        for size in sizes:
            cells = " | ".join(f"{points[size].get(s, float('nan')):.2f}" for s in series)
            lines.append(f"| {int(size):,} | {cells} |")
        lines.append("")
    lines.append("| target | ratio | verdict |")
    lines.append("|---|---:|---|")
    for row in result["targets"]:
        ratio = "-" if row["ratio"] is None else f"{row['ratio']:.2f}x"
        lines.append(f"| {row['target']} | {ratio} | {row['verdict']} |")
    return "\n".join(lines) + "\n"


def write_plot(result: dict[str, Any], path: str) -> None:
    """One panel per curve: us per operation against its size (log x; y as `_scale_y`)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = result["curves"]
    titles = {
        "waiting": "frames waiting on the edge (random-order gets)",
        "burst": "N frames put, then 200 random gets (issue 25's measurement)",
        "producers": "producers in the scope (others on other edges)",
        "same edge": "producers on the measured edge",
        "stamp moves": "producers in the scope, the stamp moved before each put",
        "edges": "edges per connector",
    }
    figure, axes = plt.subplots(1, len(curves), figsize=(4.6 * len(curves), 4.4), squeeze=False)
    for axis, (curve, points) in zip(axes[0], curves.items(), strict=True):
        sizes = sorted(points, key=int)
        for series in points[sizes[0]]:
            if "bytes" in series or "per waiting frame" in series:
                continue
            axis.plot(
                [int(s) for s in sizes],
                [points[s][series] for s in sizes],
                marker="o",
                label=series,
            )
        axis.set_xscale("log")
        _scale_y(axis)
        axis.set_xlabel(titles.get(curve, curve), fontsize=8)
        axis.set_ylabel("us per operation (median of repeats)", fontsize=8)
        axis.grid(which="both", alpha=0.3)
        axis.legend(fontsize=7)
    host = result.get("host", {})
    figure.suptitle(
        f"bench_scale.py {result.get('date', '')} {result.get('revision', '')}: "
        f"{result.get('command', '')} (load {host.get('load_average_1m', '?')})",
        fontsize=9,
    )
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


# -- before / after -------------------------------------------------------------------

# The series a comparison shows, per curve (the put's curves are in the tables).
COMPARED = {
    "waiting": ("connector get", "raw ring get", "connector put"),
    "burst": ("mean get (the issue's figure)", "later gets (median)"),
    "producers": ("connector put + get",),
    "same edge": ("connector put + get",),
    "stamp moves": ("connector put + get",),
    "edges": ("connector put + get",),
}


def merge_runs(paths: list[str]) -> dict[str, Any]:
    """The curves of several runs of one side: per point and series, the median over the runs."""
    runs = []
    for path in paths:
        with open(path) as stream:
            runs.append(json.load(stream))
    curves: dict[str, Any] = {}
    for name in runs[0]["curves"]:
        points: dict[str, dict[str, float]] = {}
        for size in runs[0]["curves"][name]:
            series = runs[0]["curves"][name][size]
            points[size] = {
                key: statistics.median(run["curves"][name][size][key] for run in runs)
                for key in series
            }
        curves[name] = points
    loads = [run["host"]["load_average_1m"] for run in runs]
    return {"curves": curves, "runs": len(runs), "loads": loads, "targets": targets(curves)}


def compare_markdown(before: dict[str, Any], after: dict[str, Any]) -> str:
    lines = [
        "| curve | size | series | before | after | after / before |",
        "|---|---:|---|---:|---:|---:|",
    ]
    for name, shown in COMPARED.items():
        if name not in before["curves"] or name not in after["curves"]:
            continue
        for size in sorted(before["curves"][name], key=int):
            for series in shown:
                old = before["curves"][name][size].get(series)
                new = after["curves"][name].get(size, {}).get(series)
                if old is None or new is None:
                    continue
                lines.append(
                    f"| {name} | {int(size):,} | {series} | {old:.1f} | {new:.1f} | {new / old:.2f} |"
                )
    lines += ["", "| target | before | after |", "|---|---:|---:|"]
    for old, new in zip(before["targets"], after["targets"], strict=True):
        text = [
            f"{row['ratio']:.2f}x {row['verdict']}" if row["ratio"] is not None else "-"
            for row in (old, new)
        ]
        lines.append(f"| {old['target']} | {text[0]} | {text[1]} |")
    return "\n".join(lines) + "\n"


def write_compare_plot(before: dict[str, Any], after: dict[str, Any], path: str) -> None:
    """One panel per curve: before dashed, after solid, the same colour per series."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [name for name in COMPARED if name in before["curves"] and name in after["curves"]]
    figure, axes = plt.subplots(1, len(names), figsize=(4.4 * len(names), 4.4), squeeze=False)
    colors = plt.get_cmap("tab10")
    for axis, name in zip(axes[0], names, strict=True):
        for index, series in enumerate(COMPARED[name]):
            for side, style in ((before, "--"), (after, "-")):
                points = side["curves"][name]
                sizes = sorted(points, key=int)
                axis.plot(
                    [int(s) for s in sizes],
                    [points[s][series] for s in sizes],
                    style,
                    marker="o",
                    color=colors(index),
                    label=f"{series} ({'before' if side is before else 'after'})",
                )
        axis.set_xscale("log")
        _scale_y(axis)
        axis.set_title(name, fontsize=9)
        axis.set_ylabel("us per operation", fontsize=8)
        axis.grid(which="both", alpha=0.3)
        axis.legend(fontsize=6)
    figure.suptitle(
        f"bench_scale.py before (dashed, {before['runs']} runs, load {before['loads']}) / "
        f"after (solid, {after['runs']} runs, load {after['loads']})",
        fontsize=9,
    )
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def _scale_y(axis: Any) -> None:
    """Log where a panel spans a decade or more; else linear from 0, so a flat curve looks flat."""
    values = [y for line in axis.get_lines() for y in line.get_ydata() if y > 0]
    if values and max(values) / min(values) >= 10:
        axis.set_yscale("log")
    else:
        axis.set_ylim(bottom=0, top=max(values, default=1) * 1.15)


def _revision() -> str:
    import subprocess

    try:
        out = subprocess.run(
            [
                "git",
                "-C",
                os.path.dirname(os.path.abspath(__file__)),
                "rev-parse",
                "--short",
                "HEAD",
            ],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except OSError:
        return "?"
    return out.stdout.strip() or "?"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true")
    mode.add_argument("--smoke", action="store_true")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--sections", default=",".join(SECTIONS))
    parser.add_argument("--seed", type=int, default=25)
    parser.add_argument("--json", dest="json_path", default=None)
    parser.add_argument("--plot", default=None)
    parser.add_argument("--compare", nargs="+", default=None, help="JSON runs before a change")
    parser.add_argument("--against", nargs="+", default=None, help="JSON runs after it")
    args = parser.parse_args(argv)
    if args.compare or args.against:
        if not (args.compare and args.against):
            parser.error("--compare and --against go together")
        before, after = merge_runs(args.compare), merge_runs(args.against)
        print(compare_markdown(before, after))
        if args.plot:
            write_compare_plot(before, after, args.plot)
        return 0
    sections = tuple(s.strip() for s in args.sections.split(",") if s.strip())
    unknown = [s for s in sections if s not in SECTIONS]
    if unknown:
        parser.error(f"unknown sections: {unknown} (known: {', '.join(SECTIONS)})")
    plan = make_plan("smoke" if args.smoke else "quick" if args.quick else "full", args.repeats)
    cpus = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpus[0]})
    load_before = os.getloadavg()[0]
    began = time.monotonic()
    curves = measure(plan, sections, args.seed)
    result: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "command": shlex.join(["bench_scale.py", *(argv if argv is not None else sys.argv[1:])]),
        "revision": _revision(),
        "plan": plan.__dict__,
        "seconds": round(time.monotonic() - began, 1),
        "host": {
            "python": platform.python_version(),
            "machine": platform.machine(),
            "cpus": len(cpus),
            "load_average_1m": round(load_before, 2),
            "load_average_1m_after": round(os.getloadavg()[0], 2),
        },
        "curves": curves,
    }
    result["targets"] = targets(curves)
    text = markdown(result)
    print(text)
    if args.json_path:
        with open(args.json_path, "w") as stream:
            json.dump(result, stream, indent=2)
            stream.write("\n")
    plot = args.plot or (os.path.splitext(args.json_path)[0] + ".png" if args.json_path else None)
    if plot:
        try:
            write_plot(result, plot)
        except ImportError as error:  # matplotlib is in the [bench] extra
            print(f"no plot: {error}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
