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
import json
import os
import shlex
import sys
from collections.abc import Sequence
from typing import Any

from shmring import __version__
from shmring.check import ToolkitMissingError, require_toolkit
from shmring.check.sections import BUDGETS, SECTIONS

DEFAULT_DATABASE = os.path.join(".shmring", "hypothesis")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="shmring", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--version", action="version", version=f"shmring {__version__}")
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
        "--workers",
        type=int,
        default=None,
        help="run units in N processes (default: the usable cores, os.sched_getaffinity)",
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
        "--statistics",
        action="store_true",
        help="also print how often each lockstep rule ran (always in the JSON report)",
    )
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
    merge.add_argument(
        "--statistics", action="store_true", help="also print how often each lockstep rule ran"
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
    stat.add_argument(
        "--scope", help="the deployment scope (default: every scope of this uid under --shm-root)"
    )
    stat.add_argument("--shm-root", default="/dev/shm", help="where the deployment directory lives")
    stat.add_argument("--json", action="store_true", help="print the status as JSON")
    return parser


def _program(argv: Sequence[str] | None) -> str:
    """How the user ran us, for the reproducers we print (`.venv/bin/shmring`, `python -m ...`)."""
    if argv is not None:  # called from Python (tests, embedding): the installed command's name
        return "shmring"
    invoked = sys.argv[0] if sys.argv and sys.argv[0] else "shmring"
    if os.path.basename(invoked) in ("cli.py", "__main__.py"):
        return f"{shlex.quote(sys.executable)} -m shmring.cli"
    return shlex.quote(invoked)


def main(argv: Sequence[str] | None = None) -> int:
    """The `shmring` command: exit 0 all held, 1 a check failed, 2 usage error, 130 interrupted."""
    try:
        return _main(argv)
    except KeyboardInterrupt:
        print("shmring: interrupted", file=sys.stderr)
        return 130


def _main(argv: Sequence[str] | None) -> int:
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

        args.program = _program(argv)
        return command.check(args) if args.command == "check" else command.merge(args)
    from shmring.impl import admin
    from shmring.impl.errors import ShmringError

    try:
        if args.command == "stat":
            return _stat(admin, args)
        removed = admin.collect(args.scope, args.shm_root, dry_run=args.dry_run)
    except ShmringError as error:
        print(f"shmring {args.command}: {error}", file=sys.stderr)
        return 2
    except OSError as error:
        print(
            f"shmring {args.command}: {error.filename or args.shm_root}: {error.strerror}: "
            "check --shm-root and the permissions",
            file=sys.stderr,
        )
        return 2
    verb = "would remove" if args.dry_run else "removed"
    print(f"{verb} {len(removed)} file(s)" + "".join(f"\n  {name}" for name in removed))
    return 0


def _stat(admin: Any, args: argparse.Namespace) -> int:
    """`shmring stat`: one scope, or every scope of this uid (like `ipcs`); text or --json."""
    scopes = [args.scope] if args.scope else admin.list_scopes(args.shm_root)
    statuses = [(scope, admin.deployment_status(scope, args.shm_root)) for scope in scopes]
    if args.json:
        documents = [admin.status_as_dict(scope, status) for scope, status in statuses]
        print(json.dumps(documents[0] if args.scope else documents, indent=2))
        return 0
    if not statuses:
        print(f"no shmring scopes of uid {os.getuid()} under {args.shm_root}")
        return 0
    for scope, status in statuses:
        if not args.scope:
            print(f"scope {scope}:")
        print(admin.format_status(status))
    return 0


if __name__ == "__main__":
    sys.exit(main())
