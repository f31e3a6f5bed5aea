"""`shmring` command line: `check` runs the campaign; `gc` and `stat` look after a deployment.

`shmring check` runs the sections of `shmring.campaign` at a budget, shows a
progress bar per section, prints a table of what was checked with counts,
writes an optional JSON report and exits non-zero when anything failed. A
failing lockstep section prints Hypothesis's shrunk reproducer; the example
database (`--database`) keeps it, so the next campaign starts from it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict

from shmring.campaign import BUDGETS, SECTIONS, SectionResult, run_section, run_section_in_worker

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
        "--workers", type=int, default=1, help="run sections in N processes (default 1)"
    )
    check.add_argument(
        "--only",
        action="append",
        choices=SECTIONS,
        help="run only this section (repeatable); default: all",
    )
    check.add_argument("--report", metavar="FILE", help="write a JSON report here")
    check.add_argument(
        "--database",
        metavar="DIR",
        default=DEFAULT_DATABASE,
        help=f"Hypothesis example database (default {DEFAULT_DATABASE}); 'none' disables it",
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
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console(stderr=True)
    sections = list(dict.fromkeys(args.only)) if args.only else list(DEFAULT_SECTIONS)
    if args.workers < 1:
        console.print(f"--workers must be at least 1: workers={args.workers}")
        return 2
    database = None if args.database == "none" else args.database
    if database:
        os.makedirs(database, exist_ok=True)
    console.print(
        f"shmring check: budget={args.budget} seed={args.seed} workers={args.workers} "
        f"sections={','.join(sections)}"
    )
    started = time.perf_counter()
    results: list[SectionResult] = []
    if args.workers == 1:
        columns = (
            TextColumn("{task.description:<10}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
        )
        with Progress(*columns, console=console, transient=False) as bar:
            for name in sections:
                task = bar.add_task(name, total=None)

                def progress(done: int, total: int | None, task: int = task) -> None:
                    bar.update(task, completed=done, total=total)

                result = run_section(name, args.budget, args.seed, database, progress)
                bar.update(
                    task, description=f"{name} {'ok' if result.failure is None else 'FAILED'}"
                )
                results.append(result)
    else:
        with (
            ProcessPoolExecutor(max_workers=args.workers) as pool,
            console.status("running sections in workers"),
        ):
            jobs = [(name, args.budget, args.seed, database) for name in sections]
            results = list(pool.map(run_section_in_worker, jobs))
    elapsed = time.perf_counter() - started
    _print_table(results, elapsed)
    failed = [r for r in results if r.failure is not None]
    for result in failed:
        print(f"\n=== {result.name} FAILED ===\n{result.failure}", file=sys.stdout)
    if args.report:
        report = {
            "budget": args.budget,
            "seed": args.seed,
            "workers": args.workers,
            "seconds": round(elapsed, 2),
            "passed": not failed,
            "sections": [asdict(r) for r in results],
        }
        with open(args.report, "w", encoding="utf-8") as handle:
            json.dump(report, handle, indent=2)
    return 1 if failed else 0


def _print_table(results: list[SectionResult], elapsed: float) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"shmring check ({elapsed:.1f} s)")
    table.add_column("section")
    table.add_column("result")
    table.add_column("seconds", justify="right")
    table.add_column("what was checked")
    for result in results:
        counts = ", ".join(f"{key}={value:,}" for key, value in result.counts.items())
        table.add_row(
            result.name,
            "ok" if result.failure is None else "FAILED",
            f"{result.seconds:.1f}",
            counts or "-",
        )
    Console(width=max(120, Console().width)).print(table)


if __name__ == "__main__":
    sys.exit(main())
