"""The `shmring check` and `shmring report merge` commands (the parser is `shmring.cli`).

`check` plans the units (`schedule.make_plan`), runs them on `--workers`
processes with a progress bar per section, and prints the table of what was
checked; `merge` adds shard reports up into the same table and report. Both
use rich: `shmring.cli` calls them only once `require_toolkit` has passed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from shmring.check import schedule
from shmring.check.sections import SECTIONS, Context, DatabaseError, SectionResult, open_database


def check(args: argparse.Namespace) -> int:
    """`shmring check`: plan, run, print the table; 0 when everything held, 1 or 2 if not."""
    console = Console(stderr=True)
    sections = list(dict.fromkeys(args.only)) if args.only else list(SECTIONS)
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


def merge(args: argparse.Namespace) -> int:
    """`shmring report merge`: add shard reports up into one table and (optional) report."""
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
