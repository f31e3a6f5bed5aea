"""Regenerate the figures in docs/ and the README that the code produces; `--check` for drift.

A generated figure sits between markers, ``<!-- gen:NAME -->`` and
``<!-- /gen -->`` (inline or spanning lines), and this script rewrites what
is between them from the code: the unit counts of `shmring check` per
section and budget, the model explorer's bounds, the Connector's defaults,
and docs/performance.md's one-screen summary, computed from the checked-in
JSON of the bench run it names (`SUMMARY_RUN`). Nothing is measured here (no
timings): what a run measures, its own table prints. CI runs ``python docs/generate.py --check`` through
model_tests/test_docs_names.py, which fails when a figure drifted.

    python docs/generate.py          # rewrite the figures
    python docs/generate.py --check  # exit 1 naming the files that drifted
"""

from __future__ import annotations

import inspect
import re
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MARKER = re.compile(r"<!-- gen:(?P<name>[a-z_]+) -->(?P<body>.*?)<!-- /gen -->", re.S)


def _units_table() -> str:
    from shmring.check import sections

    lines = [
        "",
        "| section | " + " | ".join(sections.BUDGETS) + " |",
        "| --- | " + " | ".join("---:" for _ in sections.BUDGETS) + " |",
    ]
    totals = dict.fromkeys(sections.BUDGETS, 0)
    for name in sections.SECTIONS:
        row = []
        for budget in sections.BUDGETS:
            count = len(sections.budget_units(name, budget, 0))
            totals[budget] += count
            row.append(f"{count:,}")
        lines.append(f"| `{name}` | " + " | ".join(row) + " |")
    lines.append("| all | " + " | ".join(f"{totals[b]:,}" for b in sections.BUDGETS) + " |")
    return "\n".join(lines) + "\n"


def _quick_units() -> str:
    from shmring.check import sections

    return f"{sum(len(sections.budget_units(n, 'quick', 0)) for n in sections.SECTIONS):,}"


def _fault_units() -> str:
    from shmring.check import sections

    return f"{len(sections.budget_units('faults', 'quick', 0)):,}"


def _explore_budget(which: str) -> str:
    from shmring.check import explore

    default = inspect.signature(explore.connector_system).parameters["budget"].default
    if which == "ci":
        return f"{default:,}"
    source = inspect.getsource(explore.long_systems)
    (long_budget,) = re.findall(r"connector_system\(budget=(\d+)", source)
    return f"{int(long_budget):,}"


def _config(name: str, unit: str = "") -> Callable[[], str]:
    def value() -> str:
        from shmring.impl.connector import config

        number = getattr(config, name)
        if unit == "GiB":
            return f"{number // 2**30} GiB"
        if unit == "s":
            return f"{number:g} s"
        return f"{number:,}"

    return value


# The bench run docs/performance.md's summary is computed from: the latest full
# side-by-side `bench_ring.py` run on a quiet machine (its .png is the plot).
SUMMARY_RUN = "benchmarks/results/host_ring_2026-12-01_session6"
SUMMARY_PEERS = (
    ("shm-per-key", "the seed's pattern: a segment per message"),
    ("zmq-ipc", "ZeroMQ over ipc://"),
    ("iceoryx2", "iceoryx2 publish-subscribe"),
    ("mp.Pipe", "multiprocessing.Pipe"),
)
SUMMARY_LATENCY = ("64 B", "tree", "64 KiB")
SUMMARY_THROUGHPUT = ("1 MiB", "16 MiB")


def _performance_summary() -> str:
    import json

    run = json.loads((ROOT / f"{SUMMARY_RUN}.json").read_text(encoding="utf-8"))
    latency, throughput = run["latency_us"], run["throughput_mib_s"]

    def ratio(table: dict, case: str, ours: str, peer: str, inverse: bool) -> str:
        mine, theirs = table.get(case, {}).get(ours), table.get(case, {}).get(peer)
        if not mine or not theirs:
            return "-"
        value = theirs["median"] / mine["median"] if inverse else mine["median"] / theirs["median"]
        return f"{value:.2f}x"

    head = [f"{case} p50" for case in SUMMARY_LATENCY] + [f"{c} MiB/s" for c in SUMMARY_THROUGHPUT]
    load = run["host"].get("load_average_1m") or ["?"]
    lines = [
        "",
        f"From `{SUMMARY_RUN}.json` (`{run['command']}`, {run['date'][:16].replace('T', ' ')} UTC,"
        f" {run['host']['cpus']} CPUs, load {load[0]:.2f}); latency: ours / peer's one-way"
        " median, below 1 is faster; throughput: peer's / ours, below 1 is faster too.",
        "",
        "| ours / peer | " + " | ".join(head) + " |",
        "|---|" + "---:|" * len(head),
    ]
    for ours in ("connector", "ring"):
        for peer, what in SUMMARY_PEERS:
            cells = [ratio(latency, case, ours, peer, False) for case in SUMMARY_LATENCY]
            cells += [ratio(throughput, case, ours, peer, True) for case in SUMMARY_THROUGHPUT]
            lines.append(f"| {ours} / {peer} ({what}) | " + " | ".join(cells) + " |")
    lines += ["", f"![latency and throughput per transport](../{SUMMARY_RUN}.png)", ""]
    return "\n".join(lines)


GENERATORS: dict[str, Callable[[], str]] = {
    "performance_summary": _performance_summary,
    "units_table": _units_table,
    "quick_units": _quick_units,
    "fault_units": _fault_units,
    "explore_ci_budget": lambda: _explore_budget("ci"),
    "explore_long_budget": lambda: _explore_budget("long"),
    "default_fallback_budget": _config("DEFAULT_FALLBACK_BUDGET", "GiB"),
    "default_max_sleep_seconds": _config("DEFAULT_MAX_SLEEP_SECONDS", "s"),
    "max_sleep_seconds": _config("MAX_SLEEP_SECONDS", "s"),
    "default_ring_retry_seconds": _config("DEFAULT_RING_RETRY_SECONDS", "s"),
    "max_ring_retry_seconds": _config("MAX_RING_RETRY_SECONDS", "s"),
    "default_rescan_seconds": _config("DEFAULT_RESCAN_SECONDS", "s"),
}


def files() -> list[Path]:
    return [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]


def regenerate(text: str, values: dict[str, str]) -> str:
    def replace(match: re.Match[str]) -> str:
        name = match.group("name")
        if name not in GENERATORS:
            raise SystemExit(f"unknown generated figure {name!r}")
        if name not in values:
            values[name] = GENERATORS[name]()
        return f"<!-- gen:{name} -->{values[name]}<!-- /gen -->"

    return MARKER.sub(replace, text)


def main(argv: list[str]) -> int:
    check = "--check" in argv
    values: dict[str, str] = {}
    drifted = []
    for path in files():
        text = path.read_text(encoding="utf-8")
        new = regenerate(text, values)
        if new != text:
            drifted.append(str(path.relative_to(ROOT)))
            if not check:
                path.write_text(new, encoding="utf-8")
    if check and drifted:
        print(f"generated figures drifted in {', '.join(drifted)}: run python docs/generate.py")
        return 1
    print(("drifted: " if check else "rewrote: ") + (", ".join(drifted) or "nothing"))
    return 0 if not (check and drifted) else 1


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main(sys.argv[1:]))
