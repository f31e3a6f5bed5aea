"""`shmring` command line: `check` runs the campaign; `report merge` joins shard reports;
`gc` and `stat` look after a deployment.

`check` and `report merge` need the checking toolkit (`pip install
'shmring[check]'`); without it they say so and exit 2. `gc` and `stat` need only
the transport.

`shmring check` runs the units of the campaign's sections (see
`shmring.check.sections`) on `--workers` processes, as `--shard K/N` of a fleet,
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
import os
import sys
from collections.abc import Sequence

from shmring.check import ToolkitMissingError, require_toolkit
from shmring.check.sections import BUDGETS, SECTIONS

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
    if args.command in ("check", "report"):
        # Check-only commands: the toolkit is the `check` extra, not a dependency.
        try:
            if args.command == "check":
                require_toolkit("shmring check")
            else:
                require_toolkit("shmring report merge", ("rich",))
        except ToolkitMissingError as error:
            print(f"{type(error).__name__}: {error}", file=sys.stderr)
            return 2
        from shmring.check import command

        return command.check(args) if args.command == "check" else command.merge(args)
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


if __name__ == "__main__":
    sys.exit(main())
