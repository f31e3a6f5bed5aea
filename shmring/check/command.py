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
import tempfile
import time
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from shmring.check import schedule
from shmring.check.sections import (
    RULE_COUNT_PREFIX,
    SECTIONS,
    Context,
    DatabaseError,
    SectionResult,
    open_database,
)


def check(args: argparse.Namespace) -> int:
    """`shmring check`: plan, run, print the table; 0 all held, 1 a check failed, 2 usage, 130 ^C.

    Whatever a user can get wrong (workers, --max-seconds, --shard, --unit,
    --database, the working directory, --report) is checked before the run
    starts and answered with one line on stderr that names the problem and
    the fix, and exit status 2.
    """
    console = Console(stderr=True)
    sections = list(dict.fromkeys(args.only)) if args.only else list(SECTIONS)
    workers = args.workers if args.workers is not None else default_workers()
    if workers < 1:
        return _usage(f"--workers must be at least 1: workers={workers}")
    if args.max_seconds is not None and args.max_seconds <= 0:
        return _usage(f"--max-seconds must be positive: max_seconds={args.max_seconds}")
    database = None if args.database == "none" else args.database
    problem = _database_problem(database) or (_report_problem(args.report) if args.report else None)
    if problem:
        return _usage(problem)
    try:
        shard = schedule.Shard.parse(args.shard) if args.shard else None
        open_database(database)
        context = Context(args.budget, args.seed, database, getattr(args, "program", "shmring"))
        plan = schedule.make_plan(
            context,
            sections,
            unit_patterns=args.unit or (),
            max_seconds=args.max_seconds,
            shard=shard,
        )
    except (ValueError, DatabaseError) as error:
        return _usage(str(error))
    missing = _missing_extras(plan.sections)
    if missing and not args.list_units:
        return _usage(missing)
    if args.list_units:
        for unit in plan.units:
            print(unit.id)
        if plan.streams:
            print(f"... then rounds of {', '.join(plan.streams)} until {args.max_seconds} s")
        return 0
    console.print(
        f"shmring check: budget={args.budget} seed={args.seed} workers={workers} "
        f"sections={','.join(plan.sections)} units={len(plan.units)}"
        + (f" shard={shard}" if shard else "")
        + (f" max-seconds={args.max_seconds:g}" if args.max_seconds else "")
    )
    started = time.perf_counter()
    done: list[Any] = []
    try:
        results = _run_with_progress(console, plan, workers, done)
    except KeyboardInterrupt:
        elapsed = time.perf_counter() - started
        report = schedule.build_report(plan, done, elapsed, workers=workers)
        report["interrupted"] = True
        path = args.report or INTERRUPTED_REPORT
        try:
            os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
            _write_report(report, path)
            where = f"the partial report ({len(done)} of {len(plan.units)} units) is in {path}"
        except OSError as error:
            where = f"no partial report written ({path}: {error.strerror})"
        print(f"shmring check: interrupted; {where}", file=sys.stderr)
        return 130
    elapsed = time.perf_counter() - started
    report = schedule.build_report(plan, results, elapsed, workers=workers)
    return _finish(
        report,
        elapsed,
        args.report,
        args.verbose,
        schedule.section_results,
        getattr(args, "statistics", False),
    )


# Where an interrupted run without --report leaves what it had done.
INTERRUPTED_REPORT = os.path.join(".shmring", "interrupted-report.json")

# Sections whose units move tensors: they need the torch extra (shmring.impl.extras).
SECTION_EXTRAS = {
    "lockstep": ("torch",),
    "faults": ("torch",),
    "fuzz": ("torch",),
    "interleavings": ("torch",),
}


def default_workers() -> int:
    """The cores this process may run on (its affinity mask, as `nproc` counts them)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not Linux
        return max(1, os.cpu_count() or 1)


def _usage(message: str) -> int:
    print(f"shmring check: {message}", file=sys.stderr)
    return 2


def _missing_extras(sections: Any) -> str | None:
    """A one-line error when a chosen section needs an extra that is not installed."""
    import importlib.util

    from shmring.impl.extras import EXTRAS

    needs: dict[str, list[str]] = {}
    for section in sections:
        for module in SECTION_EXTRAS.get(section, ()):
            try:
                found = importlib.util.find_spec(module) is not None
            except (ImportError, ValueError):
                found = False
            if not found:
                needs.setdefault(module, []).append(section)
    if not needs:
        return None
    extras = ",".join(sorted({EXTRAS[module] for module in needs}))
    named = "; ".join(f"{', '.join(chosen)} need {module}" for module, chosen in needs.items())
    others = [name for name in SECTIONS if name not in SECTION_EXTRAS]
    return (
        f"{named}, which is not installed: pip install 'shmring[{extras}]', "
        f"or choose other sections ({' '.join('--only ' + name for name in others)})"
    )


def _database_problem(database: str | None) -> str | None:
    """Why the example database directory cannot be used, or None; creates it when it can."""
    if not database or database.startswith(("redis://", "rediss://", "unix://")):
        return None
    cwd = os.getcwd()
    relative = not os.path.isabs(database)
    try:
        os.makedirs(database, exist_ok=True)
    except OSError as error:
        if relative and not _writable(cwd):
            return (
                f"the working directory {cwd} is not writable, and the example database "
                f"{database} would be created in it: run from a writable directory, or pass "
                "--database DIR (a writable directory) or --database none"
            )
        return (
            f"--database {database}: cannot create the directory ({error.strerror}): "
            "pass a writable directory, redis://HOST:PORT/N, or none"
        )
    if not os.access(database, os.W_OK | os.X_OK):
        return (
            f"--database {database}: the directory is not writable: "
            "pass a writable directory, redis://HOST:PORT/N, or none"
        )
    return None


def _writable(folder: str) -> bool:
    """Whether a file can be created in `folder` (tried, not inferred from mode bits: root, ro mounts)."""
    try:
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".shmring-probe-")
    except OSError:
        return False
    os.close(fd)
    os.unlink(probe)
    return True


def _report_problem(path: str) -> str | None:
    """Why `--report path` could not be written at the end of the run, or None (checked first)."""
    if os.path.isdir(path):
        return f"--report {path} is a directory: pass a file name, e.g. {path}/report.json"
    folder = os.path.dirname(path) or "."
    if not os.path.isdir(folder):
        return f"--report {path}: the folder {folder} does not exist: create it or pick another"
    existed = os.path.exists(path)
    try:
        with open(path, "a", encoding="utf-8"):
            pass
    except OSError as error:
        return f"--report {path} cannot be written ({error.strerror}): pick a writable path"
    if not existed:
        os.unlink(path)
    return None


def _write_report(report: dict[str, Any], path: str) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(report, handle, indent=2)


def _run_with_progress(console: Any, plan: Any, workers: int, done_units: list[Any]) -> list[Any]:
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
                done_units.append(result)
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
    report: dict[str, Any],
    elapsed: float,
    path: str | None,
    verbose: bool,
    sums: Any,
    statistics: bool = False,
) -> int:
    results = schedule.unit_results(report)
    sections = sums(report["section_names"], results)
    _print_table(sections, elapsed)
    if statistics:
        _print_rule_statistics(sections)
    if verbose:
        for result in results:
            if result.logs:
                print(f"\n--- {result.unit}: {result.logs} log record(s) ---")
                for line in result.log_lines:
                    print(f"  {line}")
                if result.logs > len(result.log_lines):
                    print(f"  ... and {result.logs - len(result.log_lines)} more")
    _print_failures(report["failures"])
    if path:
        _write_report(report, path)
    return 0 if report["passed"] else 1


def _print_failures(failures: list[dict[str, Any]]) -> None:
    """Each failure once: units that failed with the same text share one copy of it."""
    if not failures:
        return
    by_text: dict[str, list[dict[str, Any]]] = {}
    for failure in failures:
        by_text.setdefault(failure["message"].rstrip(), []).append(failure)
    for text, same in by_text.items():
        units = ", ".join(dict.fromkeys(failure["unit"] for failure in same))
        print(f"\n=== FAILED: {units} ===\n{text}")
    print("\nrerun a failure alone:")
    for rerun in dict.fromkeys(failure["rerun"] for failure in failures):
        print(f"  {rerun}")


def merge(args: argparse.Namespace) -> int:
    """`shmring report merge`: add shard reports up into one table and (optional) report."""
    try:
        reports = [(path, schedule.load_report(path)) for path in args.reports]
        merged, warnings = schedule.merge(reports)
    except OSError as error:
        print(f"shmring report merge: {error.filename}: {error.strerror}", file=sys.stderr)
        return 2
    except (ValueError, KeyError, TypeError) as error:
        print(f"shmring report merge: {error}", file=sys.stderr)
        return 2
    if args.report:
        problem = _report_problem(args.report)
        if problem:
            print(f"shmring report merge: {problem}", file=sys.stderr)
            return 2
    for warning in warnings:
        print(f"shmring report merge: {warning}", file=sys.stderr)
    status = _finish(
        merged,
        merged["seconds"],
        args.report,
        args.verbose,
        schedule.section_results,
        getattr(args, "statistics", False),
    )
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
        counts = ", ".join(
            f"{key}={value:,}"
            for key, value in result.counts.items()
            if not key.startswith(RULE_COUNT_PREFIX)
        )
        table.add_row(
            result.name,
            "ok" if result.failure is None else "FAILED",
            str(result.units),
            f"{result.seconds:.1f}",
            str(result.logs),
            counts or "-",
        )
    # 80 columns whatever the terminal: the counts wrap inside their cell.
    Console(width=TABLE_WIDTH).print(table)


TABLE_WIDTH = 80


def rule_statistics(results: list[SectionResult]) -> dict[str, dict[str, int]]:
    """machine -> rule -> how often it ran, from the sections' counts (lockstep only)."""
    machines: dict[str, dict[str, int]] = {}
    for result in results:
        for key, value in result.counts.items():
            if key.startswith(RULE_COUNT_PREFIX):
                machine, _, rule = key[len(RULE_COUNT_PREFIX) :].partition(".")
                machines.setdefault(machine, {})[rule] = value
    return machines


def _print_rule_statistics(results: list[SectionResult]) -> None:
    """One table per lockstep machine: each rule's runs and share, a rule never run marked."""
    machines = rule_statistics(results)
    if not machines:
        print("no lockstep rule statistics (no lockstep unit ran)")
        return
    for machine, rules in sorted(machines.items()):
        total = sum(rules.values())
        table = Table(title=f"lockstep {machine}: {total:,} rule runs")
        table.add_column("rule")
        table.add_column("runs", justify="right")
        table.add_column("share", justify="right")
        for rule, runs in sorted(rules.items(), key=lambda item: (-item[1], item[0])):
            share = f"{runs / total:.1%}" if total else "-"
            table.add_row(rule, f"{runs:,}" if runs else "0 (never ran)", share)
        Console(width=TABLE_WIDTH).print(table)
