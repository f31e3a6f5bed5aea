"""Mutation score of impl/ (or spec/): a stratified sample of mutmut's mutants, run by mutmut.

    .venv/bin/python model_tests/mutation.py --target impl --per-module 10
    .venv/bin/python model_tests/mutation.py --target spec --per-module 8
    .venv/bin/python model_tests/mutation.py --target impl --full      # every mutant (slow)

Design rationale. mutmut 3 generates every mutant of a file into one
trampolined copy under `mutants/` and runs, per mutant, only the tests that
reached the mutated function. A full run of impl/ is thousands of mutants;
here a fixed-seed sample of `--per-module` mutants of each module is handed
to mutmut's own runner (`mutmut run NAME...`), and the score per module and
overall comes with a 95% Wilson interval. The configuration lives in
pyproject.toml ([tool.mutmut]); the run happens in a copy of the tree under
.shmring/mutation/TARGET so that impl/ and spec/ keep separate results and
the working tree is never touched. The root conftest points the installed
shmring.impl / shmring.spec at the mutated copy (docs/mutation.md).

Writes .shmring/mutation/TARGET/summary.json and survivors.txt (the diff of
every surviving mutant, for triage).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import shutil
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = {
    "impl": "impl",
    "spec": "spec",
    "model_tests": "model_tests",
    "fault_injection": "fault_injection",
}
# Tests of the model, for --target spec (the impl/ selection lives in pyproject.toml).
SPEC_TESTS = (
    "shmring/model_tests/test_spec_ring.py",
    "shmring/model_tests/test_spec_connector.py",
    "shmring/model_tests/test_spec_discovery.py",
    "shmring/model_tests/test_spec_registration.py",
    "shmring/model_tests/test_spec_machine.py",
    "shmring/model_tests/test_mutation_kills.py",
)
# What mutmut's exit codes mean (mutmut.stats.status_by_exit_code, repeated for the summary).
KILLED = {1, 3}
SURVIVED = {0}
TIMEOUT = {36, -24, 24, 152, 255}

_GENERATE = """
import warnings
warnings.simplefilter("ignore")
from mutmut.__main__ import create_mutants
from mutmut.utils.file_utils import copy_also_copy_files, copy_src_dir, setup_source_paths
copy_src_dir(); copy_also_copy_files(); setup_source_paths(); create_mutants(1)
"""


def wilson(killed: int, total: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval of a proportion."""
    if total == 0:
        return (0.0, 1.0)
    p = killed / total
    centre = (p + z * z / (2 * total)) / (1 + z * z / total)
    half = z * math.sqrt(p * (1 - p) / total + z * z / (4 * total * total)) / (1 + z * z / total)
    return (max(0.0, centre - half), min(1.0, centre + half))


def prepare(target: str, work: Path, tests: list[str]) -> None:
    """A fresh copy of the tree laid out as the installed package, [tool.mutmut] aimed at `target`.

    mutmut names a mutant after its file's path and the tests record the
    module names they run, so the files must sit where setuptools'
    package-dir puts them: shmring/ (with check/) as it is, impl/ at shmring/impl/, ...
    """
    shutil.rmtree(work, ignore_errors=True)
    package = work / "shmring"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(ROOT / "shmring", package, ignore=ignore)
    for folder, name in PACKAGES.items():
        shutil.copytree(ROOT / folder, package / name, ignore=ignore)
    shutil.copy2(ROOT / "conftest.py", work / "conftest.py")
    config = (ROOT / "pyproject.toml").read_text()
    if target != "impl":
        config = config.replace(
            'source_paths = ["shmring/impl/"]', f'source_paths = ["shmring/{target}/"]'
        )
        config = config.replace('"shmring/spec/",', '"shmring/impl/",')
    if tests:
        selection = ", ".join(json.dumps(test) for test in tests)
        config = re.sub(
            r"pytest_add_cli_args_test_selection = \[.*?\]",
            f"pytest_add_cli_args_test_selection = [{selection}]",
            config,
            flags=re.S,
        )
    (work / "pyproject.toml").write_text(config)


def mutants(work: Path) -> dict[str, str | None]:
    """mutant name -> exit code (None: not run), from mutmut's .meta files."""
    found: dict[str, str | None] = {}
    for meta in sorted((work / "mutants").rglob("*.py.meta")):
        found.update(json.loads(meta.read_text())["exit_code_by_key"])
    return found


def module_of(name: str) -> str:
    parts = name.split(".")
    for index in range(len(parts) - 1, -1, -1):
        if parts[index].startswith(("x_", "xǁ")):
            return ".".join(parts[:index])
    return name.rsplit(".", 1)[0]


def sample(names: list[str], per_module: int, seed: int, modules: set[str]) -> list[str]:
    by_module: dict[str, list[str]] = defaultdict(list)
    for name in sorted(names):
        by_module[module_of(name)].append(name)
    rng = random.Random(seed)
    chosen = []
    for module in sorted(by_module):
        # A module or a package: `--modules codec` takes every module of impl/codec/.
        if modules and not modules & set(module.split(".")):
            continue
        pool = by_module[module]
        chosen += pool if per_module <= 0 else rng.sample(pool, min(per_module, len(pool)))
    return chosen


def population(names: list[str]) -> dict[str, int]:
    """Mutants per module (the strata's sizes)."""
    counts: dict[str, int] = defaultdict(int)
    for name in names:
        counts[module_of(name)] += 1
    return counts


def stratified(modules: dict[str, dict[str, float]], sizes: dict[str, int]) -> tuple[float, float]:
    """The score of all mutants from per-module samples: sum of w_m p_m, +- 1.96 sigma."""
    weighed = {m: sizes[m] for m, row in modules.items() if row["score"] is not None}
    total = sum(weighed.values()) or 1
    estimate = variance = 0.0
    for module, size in weighed.items():
        row = modules[module]
        n = row.get("killed", 0) + row.get("survived", 0)
        n += row.get("no tests", 0)
        p = float(row["score"])
        w = size / total
        estimate += w * p
        adjusted = (p * n + 2) / (n + 4)  # Agresti-Coull: no zero variance at 0% or 100%
        variance += w * w * adjusted * (1 - adjusted) / (n + 4)
    return estimate, 1.96 * math.sqrt(variance)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", choices=("impl", "spec"), default="impl")
    parser.add_argument("--per-module", type=int, default=10, help="mutants per module (0: all)")
    parser.add_argument("--full", action="store_true", help="every mutant (same as --per-module 0)")
    parser.add_argument("--seed", type=int, default=15, help="sampling seed")
    parser.add_argument("--modules", default="", help="comma-separated module names (default all)")
    parser.add_argument("--max-children", type=int, default=1, help="mutants run at once")
    parser.add_argument("--reuse", action="store_true", help="keep the copy and mutmut's results")
    parser.add_argument(
        "--report-only",
        action="store_true",
        help="summarise the last run's results again, run nothing",
    )
    parser.add_argument(
        "--tests",
        action="append",
        default=[],
        help="test paths (repeatable) in place of the configured selection",
    )
    parser.add_argument("--work", help="where the copy goes (default .shmring/mutation/TARGET)")
    args = parser.parse_args(argv)
    work = Path(args.work) if args.work else ROOT / ".shmring" / "mutation" / args.target
    mutmut = [sys.executable, "-m", "mutmut"]
    started = time.monotonic()
    fresh = not (args.reuse or args.report_only) or not (work / "mutants").is_dir()
    if fresh:
        tests = args.tests or (list(SPEC_TESTS) if args.target == "spec" else [])
        prepare(args.target, work, tests)
        subprocess.run(
            [sys.executable, "-c", _GENERATE], cwd=work, check=True, stdout=subprocess.DEVNULL
        )
    names = sample(
        list(mutants(work)),
        0 if args.full else args.per_module,
        args.seed,
        {m for m in args.modules.split(",") if m},
    )
    print(f"mutation: {len(names)} mutants of {args.target}/ sampled", flush=True)
    if not args.report_only:
        with open(work / "mutmut.log", "w") as handle:
            subprocess.run(
                [*mutmut, "run", "--max-children", str(args.max_children), *names],
                cwd=work,
                stdout=handle,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONWARNINGS": "ignore"},
            )
    codes = mutants(work)
    per_module: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    survivors: list[tuple[str, str]] = []
    for name in names:
        code = codes.get(name)
        status = (
            "killed"
            if code in KILLED
            else "survived"
            if code in SURVIVED
            else "timeout"
            if code in TIMEOUT
            else "no tests"
            if code in (5, 33)
            else "not checked"
            if code is None
            else f"other {code}"
        )
        per_module[module_of(name)][status] += 1
        if status in ("survived", "no tests"):
            survivors.append((name, status))
    summary = {
        "target": args.target,
        "seed": args.seed,
        "per_module": args.per_module,
        "seconds": round(time.monotonic() - started),
        "modules": {},
    }
    total_killed = total = 0
    for module, statuses in sorted(per_module.items()):
        # A timeout is not counted as a kill: in a forked mutant run, tests that
        # start processes can hang on state inherited from mutmut's own process
        # (a label's default value "timed out"), so a timeout says nothing.
        killed = statuses["killed"]
        counted = killed + statuses["survived"] + statuses["no tests"]
        low, high = wilson(killed, counted)
        summary["modules"][module] = {
            **statuses,
            "score": killed / counted if counted else None,
            "interval": [round(low, 2), round(high, 2)],
        }
        total_killed += killed
        total += counted
        print(
            f"  {module:<28} killed {killed:>3} of {counted:>3}  "
            f"({low:.0%}-{high:.0%})  {dict(statuses)}"
        )
    low, high = wilson(total_killed, total)
    summary["killed"], summary["counted"] = total_killed, total
    summary["interval"] = [round(low, 3), round(high, 3)]
    print(
        f"  sample: killed {total_killed} of {total} ({total_killed / max(total, 1):.0%}, "
        f"95% Wilson {low:.0%}-{high:.0%}) in {summary['seconds']} s"
    )
    estimate, margin = stratified(summary["modules"], population(list(codes)))
    summary["stratified"] = {"estimate": round(estimate, 3), "margin95": round(margin, 3)}
    print(
        f"  all mutants (weighted by each module's mutant count): "
        f"{estimate:.0%} +- {margin:.0%} (95%)"
    )
    (work / "summary.json").write_text(json.dumps(summary, indent=2, default=dict))
    with open(work / "survivors.txt", "w") as handle:
        for name, status in survivors:
            shown = subprocess.run(
                [*mutmut, "show", name], cwd=work, capture_output=True, text=True
            )
            handle.write(f"=== {name} ({status})\n{shown.stdout}\n")
    print(f"  survivors' diffs: {work / 'survivors.txt'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
