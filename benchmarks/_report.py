"""What bench_ring.py makes of a run: issue 13's target table, the printed tables, markdown, plot.

Design rationale. Every target of issue 13 is a row here with its ratio,
its limit and a verdict (met / missed / not measured), computed from the
one run's medians, so the figures in `docs/performance.md` can be pasted
from `markdown()` instead of retyped. Two kinds of baseline appear:

* side by side: measured in the same run (the raw ring, iceoryx2, the
  single-thread copy and the futex round trip of `_probes`);
* external: the seed's vllm-omni ring and vLLM's `MessageQueue` are not in
  this repository; issue 13 gives their figures on this machine, and the
  rows against them say so (``source: external``) -- a ratio across runs,
  weaker than the side-by-side ones.

The lockstep target (the ring machine's steps/s) is one run of the suite's
ring machine in the parent process (`_probes.ring_lockstep_rate`).
"""

from __future__ import annotations

from typing import Any

MIB = 1 << 20
MB_TO_MIB = 1e6 / MIB  # issue 13's throughput table is in MB/s (10^6 bytes)

CONNECTORS = ("connector", "connector/poll")  # owned results, the two receive styles
BORROW = "connector/borrow"
LATENCY_LABELS = ("tree", "64 B", "4 KiB", "64 KiB")
OWNED_VS_ICEORYX2 = ("64 KiB", "1 MiB", "16 MiB")

# Issue 13's figures for the peers measured outside this repository (same
# 2-core machine, another run). Latency: the low end of the range for
# the seed's ring (the stricter side for "at most 0.6x"). Throughput: the
# issue's own figure for vLLM's queue ("6.2 GB/s here" at 16 MiB, 1,430 MB/s
# at 256 MiB).
SEED_RING_ONE_WAY_US = {"tree": 104.0, "64 B": 25.0, "4 KiB": 33.0, "64 KiB": 40.0}
VLLM_QUEUE_MIB_S = {"16 MiB": 6200 * MB_TO_MIB, "256 MiB": 1430 * MB_TO_MIB}
EXTERNAL_SOURCE = "issue 13's table (measured outside this repository, another run)"
IDLE_CPU_LIMIT = 0.05  # "idle-cheap": a busy loop is ~1.0 of a core; 5% is a bounded spin
LOCKSTEP_STEPS_S = 2000


def _row(
    target: str,
    ours: str,
    baseline: str,
    value: float | None,
    base: float | None,
    limit: float,
    at_most: bool,
    source: str = "side by side",
    **extra: Any,
) -> dict[str, Any]:
    """One target: ratio = value / base, met when it is within `limit` (<= or >=)."""
    ratio = value / base if value is not None and base else None
    met = None if ratio is None else (ratio <= limit if at_most else ratio >= limit)
    return {
        "target": target,
        "ours": ours,
        "baseline": baseline,
        "ratio": ratio,
        "limit": limit,
        "at_most": at_most,
        "met": met,
        "source": source,
        **extra,
    }


def _median(cell: dict[str, Any] | None) -> float | None:
    return None if cell is None else cell["median"]


def _size_of(label: str) -> str:
    """The message size of a throughput label ("16 MiB x64 burst" -> "16 MiB")."""
    return " ".join(label.split()[:2])


def _copy_baseline(label: str, by_kind: dict[str, Any]) -> tuple[str, str]:
    """The copy kind a borrowed target compares with: a burst's rotating set where measured."""
    if "burst" in label:
        rotating = f"rotating {label.split()[2]}"  # "16 MiB x64 burst" -> "rotating x64"
        if rotating in by_kind:
            return rotating, f"{label.split()[2][1:]} rotating mapped shm buffers"
    return "warm", "mapped shm"


def targets(result: dict[str, Any]) -> list[dict[str, Any]]:
    """Issue 13's targets as measured ratios; `met` is None where a side did not run."""
    rows: list[dict[str, Any]] = []
    latency = result["latency_us"]
    for label in LATENCY_LABELS:
        cells = latency.get(label, {})
        for ours in CONNECTORS:
            cell = cells.get(ours)
            for baseline, limit in (("ring", 1.1), ("iceoryx2", 1.0)):
                base = cells.get(baseline)
                p99 = cell["p99"] / base["p99"] if cell and base else None
                what = "raw ring + 10%" if baseline == "ring" else "iceoryx2"
                rows.append(
                    _row(
                        f"{label} one-way latency <= {what}",
                        ours,
                        baseline,
                        _median(cell),
                        _median(base),
                        limit,
                        True,
                        p99_ratio=p99,
                    )
                )
            rows.append(
                _row(
                    f"{label} one-way latency <= 0.6x the seed's ring",
                    ours,
                    f"seed ring {SEED_RING_ONE_WAY_US[label]:g} us",
                    _median(cell),
                    SEED_RING_ONE_WAY_US[label],
                    0.6,
                    True,
                    EXTERNAL_SOURCE,
                )
            )
    rates = result["throughput_mib_s"]
    for ours in CONNECTORS:
        for label in OWNED_VS_ICEORYX2:
            cells = rates.get(label, {})
            rows.append(
                _row(
                    f"{label} throughput (owned) >= iceoryx2",
                    ours,
                    "iceoryx2",
                    _median(cells.get(ours)),
                    _median(cells.get("iceoryx2")),
                    1.0,
                    False,
                )
            )
        rows.append(
            _row(
                "16 MiB throughput (owned) >= vLLM's queue",
                ours,
                f"vLLM MessageQueue {VLLM_QUEUE_MIB_S['16 MiB']:.0f} MiB/s",
                _median(rates.get("16 MiB", {}).get(ours)),
                VLLM_QUEUE_MIB_S["16 MiB"],
                1.0,
                False,
                EXTERNAL_SOURCE,
            )
        )
        cells = rates.get("256 MiB", {})
        peers = {"vLLM MessageQueue": VLLM_QUEUE_MIB_S["256 MiB"]}
        if "iceoryx2" in cells:
            peers["iceoryx2"] = cells["iceoryx2"]["median"]
        best = max(peers, key=lambda name: peers[name])
        rows.append(
            _row(
                "256 MiB throughput (owned) >= the best peer",
                ours,
                f"{best} {peers[best]:.0f} MiB/s",
                _median(cells.get(ours)),
                peers[best] if cells else None,
                1.0,
                False,
                EXTERNAL_SOURCE if best == "vLLM MessageQueue" else "side by side",
            )
        )
        for label, cells in rates.items():
            if "burst" in label:
                rows.append(
                    _row(
                        f"{label} throughput (owned, all in flight) >= iceoryx2",
                        ours,
                        "iceoryx2",
                        _median(cells.get(ours)),
                        _median(cells.get("iceoryx2")),
                        1.0,
                        False,
                    )
                )
    copies = result.get("copy_mib_s", {})
    for label, cells in rates.items():
        size = _size_of(label)
        if size not in copies:
            continue
        # A burst's baseline writes as many buffers as it has in flight (``rotating xN``).
        kind, what = _copy_baseline(label, copies[size])
        rows.append(
            _row(
                f"{label} throughput (borrowed) >= 0.9x the producer's single-thread copy",
                BORROW,
                f"copy into {what}, {size}",
                _median(cells.get(BORROW)),
                _median(copies[size].get(kind)),
                0.9,
                False,
                not_run=result["unavailable"].get(BORROW),
            )
        )
    wake = result.get("wake_us", {})
    futex, woken = wake.get("futex round trip"), wake.get("get_with_deadline wake")
    rows.append(
        _row(
            "get_with_deadline wake-up p99 <= 2x a futex round trip p99",
            "connector",
            "futex round trip",
            woken["p99"] if woken else None,
            futex["p99"] if futex else None,
            2.0,
            True,
            p50_ratio=woken["median"] / futex["median"] if woken and futex else None,
        )
    )
    idle = result.get("idle_cpu_fraction")
    rows.append(
        _row(
            f"get_with_deadline idle-cheap: CPU while idle <= {IDLE_CPU_LIMIT:.0%} of a core",
            "connector",
            "one core",
            idle,
            1.0 if idle is not None else None,
            IDLE_CPU_LIMIT,
            True,
            unit="fraction",
        )
    )
    lockstep = result.get("ring_lockstep", {})
    rate = lockstep.get("steps_per_s")
    rows.append(
        _row(
            f"ring lockstep machine >= {LOCKSTEP_STEPS_S:,} steps/s",
            "spec vs impl",
            f"profile {lockstep.get('profile', '-')}",
            rate,
            1.0 if rate is not None else None,
            float(LOCKSTEP_STEPS_S),
            False,
            unit="steps/s",
            not_run=lockstep.get("not_run"),
        )
    )
    return rows


# -- the connector against the raw ring and iceoryx2 (issue 23) ---------------------------

# (ours, baseline) pairs of the ratio table and the plot's ratio panel.
RATIO_PAIRS = (
    ("connector", "ring"),
    ("connector", "iceoryx2"),
    ("connector/poll", "ring"),
    ("connector/poll", "iceoryx2"),
)


def ratios(result: dict[str, Any]) -> dict[str, dict[str, dict[str, float]]]:
    """Connector / raw ring and Connector / iceoryx2 from this run, per case.

    ``{"latency": {label: {"connector / ring": ratio, ...}}, "throughput":
    {...}}``: one-way p50 latency as ours / baseline (below 1: ours is
    faster), throughput as ours / baseline (above 1: ours is faster). A
    pair that did not both run in a case is left out.
    """
    found: dict[str, dict[str, dict[str, float]]] = {"latency": {}, "throughput": {}}
    for kind, table in (
        ("latency", result["latency_us"]),
        ("throughput", result["throughput_mib_s"]),
    ):
        for label, cells in table.items():
            row = {}
            for ours, baseline in RATIO_PAIRS:
                value, base = _median(cells.get(ours)), _median(cells.get(baseline))
                if value is not None and base:
                    row[f"{ours} / {baseline}"] = value / base
            if row:
                found[kind][label] = row
    return found


def _ratio_lines(result: dict[str, Any]) -> list[str]:
    found = ratios(result)
    names = [f"{ours} / {baseline}" for ours, baseline in RATIO_PAIRS]
    lines = [
        "| case | " + " | ".join(names) + " |",
        "|---|" + "---:|" * len(names),
    ]
    for kind, what in (("latency", "one-way p50"), ("throughput", "throughput")):
        for label, row in found[kind].items():
            cells = [f"{row[name]:.2f}x" if name in row else "-" for name in names]
            lines.append(f"| {label} {what} | " + " | ".join(cells) + " |")
    return lines


# -- text ----------------------------------------------------------------------------------


def _verdict(row: dict[str, Any]) -> str:
    if row["met"] is None:
        return "not run" if row.get("not_run") else "not measured"
    return "met" if row["met"] else "MISSED"


def _ratio_text(row: dict[str, Any]) -> str:
    if row["ratio"] is None:
        return "-"
    if row.get("unit") == "fraction":
        return f"{row['ratio']:.2%} of a core"
    if row.get("unit"):
        return f"{row['ratio']:,.0f} {row['unit']}"
    text = f"{row['ratio']:.2f}x"
    if row.get("p99_ratio") is not None:
        text += f" [p99 {row['p99_ratio']:.2f}x]"
    if row.get("p50_ratio") is not None:
        text += f" [p50 {row['p50_ratio']:.2f}x]"
    return text


def _limit_text(row: dict[str, Any]) -> str:
    sign = "<=" if row["at_most"] else ">="
    if row.get("unit") == "fraction":
        return f"{sign} {row['limit']:.0%}"
    if row.get("unit"):
        return f"{sign} {row['limit']:,.0f}"
    return f"{sign} {row['limit']:g}" + ("" if row["limit"] >= 100 else "x")


def _latency_lines(result: dict[str, Any], transports: list[str]) -> list[str]:
    latency = result["latency_us"]
    labels = list(latency)
    lines = ["| transport | " + " | ".join(labels) + " |", "|---|" + "---:|" * len(labels)]
    for name in transports:
        if not any(name in latency[label] for label in labels):
            continue
        cells = []
        for label in labels:
            cell = latency[label].get(name)
            cells.append(f"{cell['median']:.1f} / {cell['p99']:.1f}" if cell else "-")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def _throughput_lines(result: dict[str, Any], transports: list[str]) -> list[str]:
    rates = result["throughput_mib_s"]
    sizes = list(rates)
    not_run = result["not_run"]
    lines = ["| transport | " + " | ".join(sizes) + " |", "|---|" + "---:|" * len(sizes)]
    for name in transports:
        if not any(name in rates[label] or name in not_run.get(label, {}) for label in sizes):
            continue  # a tree-only baseline
        cells = []
        for label in sizes:
            cell = rates[label].get(name)
            if cell is None:
                cells.append("n/a" if name in not_run.get(label, {}) else "-")
                continue
            text = f"{cell['median']:.0f} ({cell['worst']:.0f})"
            route = result["routes"].get(f"throughput {label}", {}).get(name)
            if route and route != ["ring"]:
                text += " " + "/".join(route)
            cells.append(text)
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    copies = result.get("copy_mib_s", {})
    for kind, what in (("warm", "mapped"), ("fresh", "fresh file")):
        cells = []
        for label in sizes:
            cell = copies.get(_size_of(label), {}).get(kind)
            cells.append(f"{cell['median']:.0f} ({cell['worst']:.0f})" if cell else "-")
        if any(cell != "-" for cell in cells):
            lines.append(f"| copy into shm, 1 thread ({what}) | " + " | ".join(cells) + " |")
    return lines


def _wake_lines(result: dict[str, Any]) -> list[str]:
    wake = result.get("wake_us", {})
    lines = ["| what | median | p99 | n |", "|---|---:|---:|---:|"]
    for name, cell in wake.items():
        lines.append(f"| {name} | {cell['median']:.1f} | {cell['p99']:.1f} | {cell['n']:.0f} |")
    idle = result.get("idle_cpu_fraction")
    if idle is not None:
        lines.append(f"| get_with_deadline idle: CPU per wall second | {idle:.3%} | | |")
    return lines


def _target_lines(result: dict[str, Any]) -> list[str]:
    lines = [
        "| target | ours | baseline | ratio | limit | verdict |",
        "|---|---|---|---:|---:|---|",
    ]
    for row in result["targets"]:
        baseline = row["baseline"] + (" (external)" if row["source"] == EXTERNAL_SOURCE else "")
        verdict = _verdict(row)
        lines.append(
            f"| {row['target']} | {row['ours']} | {baseline} | {_ratio_text(row)} | "
            f"{_limit_text(row)} | {verdict if verdict != 'MISSED' else '**missed**'} |"
        )
    return lines


def _notes(result: dict[str, Any]) -> list[str]:
    lines = []
    for label, reasons in result["not_run"].items():
        for name, why in reasons.items():
            lines.append(f"- {name} {label}: {why}")
    for name, why in result["unavailable"].items():
        lines.append(f"- {name}: not run: {why}")
    for label, why in result.get("copy_not_run", {}).items():
        lines.append(f"- copy into shm, 1 thread, {label}: {why}")
    sources = {row["source"] for row in result["targets"]}
    if EXTERNAL_SOURCE in sources:
        lines.append(f"- (external) baselines: {EXTERNAL_SOURCE}; a ratio across runs")
    lockstep = result.get("ring_lockstep", {})
    if "not_run" in lockstep:
        lines.append(f"- ring lockstep machine: not run: {lockstep['not_run']}")
    elif lockstep:
        cpu = lockstep.get("cpu_seconds")
        on_cpu = f", {lockstep['steps'] / cpu:,.0f} steps per CPU second" if cpu else ""
        lines.append(
            f"- ring lockstep machine: {lockstep['steps']} steps in {lockstep['seconds']:.1f} s "
            f"(profile {lockstep['profile']}, in the parent process after the workers exit"
            f"{on_cpu})"
        )
    return lines


def table(result: dict[str, Any], transports: list[str]) -> str:
    """The run as printed: every table, then the targets and what did not run."""
    lines = ["One-way latency, us (median / p99; half a ping-pong round trip)", ""]
    lines += _latency_lines(result, transports)
    if result["throughput_mib_s"]:
        lines += [
            "",
            "Throughput, MiB/s, receiver owns a copy (median, worst of all timed batches)",
        ]
        lines += ["(connector/borrow: the receiver borrows, no receive copy)", ""]
        lines += _throughput_lines(result, transports)
    if result.get("wake_us"):
        lines += ["", "Wake-up, us (a receiver asleep; futex: a full round trip)", ""]
        lines += _wake_lines(result)
    if any(ratios(result).values()):
        lines += ["", "Connector / raw ring and Connector / iceoryx2 (ratios of medians)", ""]
        lines += _ratio_lines(result)
    lines += ["", "Issue 13's targets (ratios of medians in this run)", ""]
    lines += _target_lines(result)
    lines += [""] + _notes(result)
    return "\n".join(lines)


def markdown(result: dict[str, Any], transports: list[str]) -> str:
    """A snippet for docs/performance.md: how the run was made, its tables, the target table."""
    host = result.get("host", {})
    load = [f"{value:.2f}" for value in host.get("load_average_1m", [])] or ["?", "?"]
    lines = [
        f"Run {result.get('date', '?')}, `{result.get('command', '')}` "
        f"({result.get('plan', {}).get('repeats', '?')} interleaved repeats, "
        f"{result.get('seconds', '?')} s; load average {load[0]} before, {load[-1]} after; "
        f"Python {host.get('python', '?')}, {host.get('cpus', '?')} CPUs, "
        f"kernel {host.get('kernel', '?')}). Medians; ratios are of medians in this one run.",
        "",
        "One-way latency, us, median / p99:",
        "",
        *_latency_lines(result, transports),
        "",
        "Throughput, MiB/s, median (worst batch); owned results except `connector/borrow`:",
        "",
        *_throughput_lines(result, transports),
    ]
    if result.get("wake_us"):
        lines += ["", "Wake-up of a sleeping receiver, us:", "", *_wake_lines(result)]
    if any(ratios(result).values()):
        lines += [
            "",
            "The Connector against the raw ring and iceoryx2, from this run (latency: ours / "
            "theirs, below 1 is faster; throughput: ours / theirs, above 1 is faster):",
            "",
            *_ratio_lines(result),
        ]
    lines += ["", "Issue 13's targets:", "", *_target_lines(result), "", *_notes(result)]
    return "\n".join(lines) + "\n"


# -- the plot ------------------------------------------------------------------------------


def write_plot(result: dict[str, Any], transports: list[str], path: str) -> None:
    """Latency (median, p99 tick), throughput (median, the copy baseline too) and wake-up, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    latency = result["latency_us"]
    rates = {label: dict(cells) for label, cells in result["throughput_mib_s"].items()}
    copy_name = "copy into shm, 1 thread"
    for label, cells in rates.items():
        warm = result.get("copy_mib_s", {}).get(_size_of(label), {}).get("warm")
        if warm:
            cells[copy_name] = warm
    names = [*transports, copy_name]
    wake = result.get("wake_us", {})
    found = ratios(result)
    shown_ratios = any(found.values())
    widths = [3, 3] + ([2] if shown_ratios else []) + ([1] if wake else [])
    panels = len(widths)
    figure, axes = plt.subplots(
        1, panels, figsize=(6.0 * panels, 5.5), gridspec_kw={"width_ratios": widths}
    )
    left, right = axes[0], axes[1]
    colors = plt.get_cmap("tab20")

    def bars(axis: Any, groups: dict[str, dict[str, Any]], title: str, ticks: bool) -> None:
        labels = list(groups)
        shown = [t for t in names if any(t in groups[label] for label in labels)]
        width = 0.8 / max(len(shown), 1)
        for index, name in enumerate(shown):
            xs, heights, p99s = [], [], []
            for position, label in enumerate(labels):
                cell = groups[label].get(name)
                if cell is None:
                    continue
                xs.append(position + (index - (len(shown) - 1) / 2) * width)
                heights.append(cell["median"])
                p99s.append(cell.get("p99"))
            color = colors(names.index(name) % 20)  # one colour per transport in every panel
            axis.bar(xs, heights, width, label=name, color=color)
            if ticks and all(p is not None for p in p99s):
                axis.scatter(xs, p99s, marker="_", color="black", s=30, zorder=3)
        axis.set_xticks(range(len(labels)))
        axis.set_xticklabels(labels, rotation=15, fontsize=8)
        axis.set_yscale("log")
        axis.set_title(title, fontsize=9)
        axis.grid(axis="y", which="both", alpha=0.3)

    bars(left, latency, "one-way latency, us (bar: median, tick: p99); lower is better", True)
    bars(right, rates, "throughput, MiB/s (median); higher is better", False)
    left.legend(fontsize=7, ncol=2)
    right.legend(fontsize=7, ncol=2)
    if shown_ratios:
        axis = axes[2]
        cases = [(f"{label} p50", row) for label, row in found["latency"].items()]
        cases += [(f"{label} MiB/s", row) for label, row in found["throughput"].items()]
        names = [f"{ours} / {baseline}" for ours, baseline in RATIO_PAIRS]
        names = [name for name in names if any(name in row for _, row in cases)]
        width = 0.8 / max(len(names), 1)
        for index, name in enumerate(names):
            xs = [
                i + (index - (len(names) - 1) / 2) * width
                for i, (_, row) in enumerate(cases)
                if name in row
            ]
            ys = [row[name] for _, row in cases if name in row]
            axis.bar(xs, ys, width, label=name, color=colors((2 * index + 1) % 20))
        axis.axhline(1.0, color="black", linewidth=0.8)
        axis.set_xticks(range(len(cases)))
        axis.set_xticklabels([case for case, _ in cases], rotation=30, fontsize=7, ha="right")
        axis.set_yscale("log")
        axis.set_title(
            "Connector / raw ring and / iceoryx2, this run\n"
            "(latency: < 1 is faster; throughput: > 1 is faster)",
            fontsize=9,
        )
        axis.grid(axis="y", which="both", alpha=0.3)
        axis.legend(fontsize=7)
    if wake:
        axis = axes[-1]
        labels = list(wake)
        axis.bar(range(len(labels)), [wake[k]["median"] for k in labels], color="tab:gray")
        axis.scatter(
            range(len(labels)), [wake[k]["p99"] for k in labels], marker="_", color="black", s=60
        )
        axis.set_xticks(range(len(labels)))
        axis.set_xticklabels(
            [k.replace(", ", ",\n") for k in labels], fontsize=7, rotation=20, ha="right"
        )
        axis.set_title("wake-up, us (median, p99 tick)", fontsize=9)
        axis.grid(axis="y", alpha=0.3)
    host = result.get("host", {})
    figure.suptitle(
        f"bench_ring.py {result.get('date', '')}: {result.get('command', '')} "
        f"(load {host.get('load_average_1m', '?')})",
        fontsize=9,
    )
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
