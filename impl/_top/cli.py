"""`shmring` command line: `check` runs the campaign; `report merge` joins shard reports;
`gc` and `stat` look after a deployment.

`shmring check` runs the units of the campaign's sections (see
`shmring.campaign`) on `--workers` processes, as `--shard K/N` of a fleet,
for a fixed budget or `--max-seconds`; it shows a progress bar per section,
prints a table of what was checked with counts, writes an optional JSON
report and exits non-zero when anything failed. Every failure prints the
`shmring check ... --unit ID` command that reruns only it (a lockstep
divergence also Hypothesis's shrunk reproducer; the example database,
`--database`, keeps it so the next campaign, on any machine sharing it,
starts from it). Library logging is captured: counted, shown with `-v`
and with failures.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

from shmring.campaign import BUDGETS, SECTIONS, Context, DatabaseError, SectionResult, open_database

DEFAULT_SECTIONS = SECTIONS
DEFAULT_DATABASE = os.path.join(".shmring", "hypothesis")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="shmring", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    check = commands.add_parser("check", help="run the model-checking and fault-injection campaign")
    check.add_argument(
        "--budget",
        choices=BUDGETS,
        default="quick",
        help="quick (default, about a minute), standard, deep",
    )
    check.add_argument(
        "--seed", type=int, default=0, help="seed for the randomised sections (default 0)"
    )
    check.add_argument(
        "--workers", type=int, default=1, help="run units in N processes (default 1)"
    )
    check.add_argument(
        "--only",
        action="append",
        choices=SECTIONS,
        help="run only this section (repeatable); default: all",
    )
    check.add_argument(
        "--unit",
        action="append",
        metavar="ID",
        help="run only this unit (section:name as failures print it, or a glob such as "
        "'faults:ring_wrap/*'; repeatable)",
    )
    check.add_argument(
        "--shard",
        metavar="K/N",
        help="run shard K of N (1 <= K <= N): N machines together run each unit once",
    )
    check.add_argument(
        "--max-seconds",
        type=float,
        metavar="S",
        help="after the fixed units, keep drawing lockstep and fuzz rounds until S seconds",
    )
    check.add_argument(
        "--list-units", action="store_true", help="print the units this run would run, run none"
    )
    check.add_argument(
        "-v", "--verbose", action="store_true", help="print the library's captured log records"
    )
    check.add_argument("--report", metavar="FILE", help="write a JSON report here")
    check.add_argument(
        "--database",
        metavar="DB",
        default=DEFAULT_DATABASE,
        help=f"Hypothesis example database: a directory (default {DEFAULT_DATABASE}), "
        "redis://host:port/N (needs the redis extra), or 'none'",
    )

    report = commands.add_parser("report", help="work with `shmring check` reports")
    report_commands = report.add_subparsers(dest="report_command", required=True)
    merge = report_commands.add_parser(
        "merge", help="add shard reports up into one report and print its table"
    )
    merge.add_argument("reports", nargs="+", metavar="REPORT", help="JSON reports of shards")
    merge.add_argument("--report", metavar="FILE", help="write the merged JSON report here")
    merge.add_argument(
        "-v", "--verbose", action="store_true", help="print the captured log records"
    )

    gc = commands.add_parser(
        "gc", help="remove what dead producers of a deployment left in shared memory"
    )
    gc.add_argument("--scope", required=True, help="the deployment scope")
    gc.add_argument(
        "--dry-run", action="store_true", help="list what would be removed, remove nothing"
    )
    gc.add_argument("--shm-root", default="/dev/shm", help="where the deployment directory lives")

    stat = commands.add_parser(
        "stat", help="show a deployment's producers, ring occupancy and fallback usage"
    )
    stat.add_argument("--scope", required=True, help="the deployment scope")
    stat.add_argument("--shm-root", default="/dev/shm", help="where the deployment directory lives")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "check":
        return _check(args)
    if args.command == "report":
        return _merge(args)
    from shmring.impl import admin
    from shmring.impl.errors import ShmringError

    try:
        if args.command == "stat":
            print(admin.format_status(admin.deployment_status(args.scope, args.shm_root)))
            return 0
        removed = admin.collect(args.scope, args.shm_root, dry_run=args.dry_run)
    except ShmringError as error:
        print(f"shmring {args.command}: {error}", file=sys.stderr)
        return 2
    verb = "would remove" if args.dry_run else "removed"
    print(f"{verb} {len(removed)} file(s)" + "".join(f"\n  {name}" for name in removed))
    return 0


def _check(args: argparse.Namespace) -> int:
    from rich.console import Console

    from shmring import schedule

    console = Console(stderr=True)
    sections = list(dict.fromkeys(args.only)) if args.only else list(DEFAULT_SECTIONS)
    if args.workers < 1:
        print(
            f"shmring check: --workers must be at least 1: workers={args.workers}", file=sys.stderr
        )
        return 2
    if args.max_seconds is not None and args.max_seconds <= 0:
        print(
            f"shmring check: --max-seconds must be positive: max_seconds={args.max_seconds}",
            file=sys.stderr,
        )
        return 2
    database = None if args.database == "none" else args.database
    try:
        shard = schedule.Shard.parse(args.shard) if args.shard else None
        if database and not database.startswith(("redis://", "rediss://", "unix://")):
            os.makedirs(database, exist_ok=True)
        open_database(database)
        context = Context(args.budget, args.seed, database)
        plan = schedule.make_plan(
            context,
            sections,
            unit_patterns=args.unit or (),
            max_seconds=args.max_seconds,
            shard=shard,
        )
    except (ValueError, DatabaseError) as error:
        print(f"shmring check: {error}", file=sys.stderr)
        return 2
    if args.list_units:
        for unit in plan.units:
            print(unit.id)
        if plan.streams:
            print(f"... then rounds of {', '.join(plan.streams)} until {args.max_seconds} s")
        return 0
    console.print(
        f"shmring check: budget={args.budget} seed={args.seed} workers={args.workers} "
        f"sections={','.join(plan.sections)} units={len(plan.units)}"
        + (f" shard={shard}" if shard else "")
        + (f" max-seconds={args.max_seconds:g}" if args.max_seconds else "")
    )
    started = time.perf_counter()
    results = _run_with_progress(console, plan, args.workers)
    elapsed = time.perf_counter() - started
    report = schedule.build_report(plan, results, elapsed, workers=args.workers)
    return _finish(report, elapsed, args.report, args.verbose, schedule.section_results)


def _run_with_progress(console: Any, plan: Any, workers: int) -> list[Any]:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from shmring import schedule

    columns = (
        TextColumn("{task.description:<16}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("units"),
        TimeElapsedColumn(),
    )
    totals = {name: 0 for name in plan.sections}
    for unit in plan.units:
        totals[unit.section] += 1
    done = dict.fromkeys(plan.sections, 0)
    failed = dict.fromkeys(plan.sections, False)
    fractions: dict[str, dict[str, float]] = {name: {} for name in plan.sections}
    with Progress(*columns, console=console, transient=False) as bar:
        tasks = {
            name: bar.add_task(name, total=None if name in plan.streams else totals[name])
            for name in plan.sections
        }

        def listener(unit: Any, result: Any, fraction: float) -> None:
            name = unit.section
            if result is None:
                fractions[name][unit.id] = fraction
            else:
                fractions[name].pop(unit.id, None)
                done[name] += 1
                failed[name] = failed[name] or bool(result.failures)
            verdict = "FAILED" if failed[name] else ("ok" if done[name] >= totals[name] else "")
            bar.update(
                tasks[name],
                completed=done[name] + sum(fractions[name].values()),
                description=f"{name} {verdict}".rstrip(),
            )

        return schedule.execute(plan, workers, listener)


def _finish(
    report: dict[str, Any], elapsed: float, path: str | None, verbose: bool, sums: Any
) -> int:
    from shmring import schedule

    results = schedule.unit_results(report)
    sections = sums(report["section_names"], results)
    _print_table(sections, elapsed)
    if verbose:
        for result in results:
            if result.logs:
                print(f"\n--- {result.unit}: {result.logs} log record(s) ---")
                for line in result.log_lines:
                    print(f"  {line}")
                if result.logs > len(result.log_lines):
                    print(f"  ... and {result.logs - len(result.log_lines)} more")
    for section in sections:
        if section.failure is not None:
            print(f"\n=== {section.name} FAILED ===\n{section.failure}", file=sys.stdout)
    if report["failures"]:
        print("\nrerun a failure alone:")
        for failure in report["failures"]:
            print(f"  {failure['rerun']}")
    if path:
        with open(path, "w", encoding="utf-8") as handle:
            json.dump(report, handle, indent=2)
    return 0 if report["passed"] else 1


def _merge(args: argparse.Namespace) -> int:
    from shmring import schedule

    try:
        reports = [(path, schedule.load_report(path)) for path in args.reports]
        merged, warnings = schedule.merge(reports)
    except (OSError, ValueError, KeyError) as error:
        print(f"shmring report merge: {error}", file=sys.stderr)
        return 2
    for warning in warnings:
        print(f"shmring report merge: {warning}", file=sys.stderr)
    status = _finish(merged, merged["seconds"], args.report, args.verbose, schedule.section_results)
    return status if not warnings else max(status, 1)


def _print_table(results: list[SectionResult], elapsed: float) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"shmring check ({elapsed:.1f} s)")
    table.add_column("section")
    table.add_column("result")
    table.add_column("units", justify="right")
    table.add_column("seconds", justify="right")
    table.add_column("logs", justify="right")
    table.add_column("what was checked")
    for result in results:
        counts = ", ".join(f"{key}={value:,}" for key, value in result.counts.items())
        table.add_row(
            result.name,
            "ok" if result.failure is None else "FAILED",
            str(result.units),
            f"{result.seconds:.1f}",
            str(result.logs),
            counts or "-",
        )
    Console(width=max(120, Console().width)).print(table)


if __name__ == "__main__":
    sys.exit(main())
