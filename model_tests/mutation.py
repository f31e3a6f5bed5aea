"""Mutation score of impl/ (or spec/): a fresh stratified sample of mutmut's mutants, run by mutmut.

    .venv/bin/python model_tests/mutation.py                       # 45 mutants, a fresh seed
    .venv/bin/python model_tests/mutation.py --seed 2718281828     # that run's sample again
    .venv/bin/python model_tests/mutation.py --size 20 --modules codec,ring
    .venv/bin/python model_tests/mutation.py --full                # every mutant (slow)

Design rationale. A score measured on one fixed sample can be tuned to: kill
that sample's survivors and the number rises while the suite's strength does
not. So every run draws a *fresh* sample with a new seed (recorded; `--seed`
draws a past run's sample again), stratified by subpackage of the target
(`impl.codec`, `impl.ring`, ..., and each top-level module on its own), each
stratum's share proportional to its mutant count. mutmut 3 generates every
mutant into one trampolined copy under `mutants/` and its own runner
(`mutmut run NAME...`) runs the sample. Then every kill is *confirmed*: the
first failing test is found again, and it must fail alone on the mutant and
pass alone on clean code (a kill seen only through another test's leftovers
does not count). Survivors are matched against the checked-in equivalents
(`model_tests/mutation_equivalents.toml`, by function and changed line, with
the reason); the score is confirmed kills over the non-equivalent mutants,
with a 95% Wilson interval, and a row goes into the history table of
docs/mutation.md (date, commit, seed, sample size, score, interval).

The configuration lives in pyproject.toml ([tool.mutmut]); the run happens in
a copy of the tree under .shmring/mutation/TARGET so the working tree is
never touched. Writes .shmring/mutation/TARGET/summary.json,
survivors.txt (the diff of every mutant not killed, for triage) and
unreached.txt (the functions no test reaches in its own process, whose
mutants no test can kill: `unreached`).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import random
import re
import secrets
import shutil
import subprocess
import sys
import time
import tomllib
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "mutation.md"
EQUIVALENTS = ROOT / "model_tests" / "mutation_equivalents.toml"
DEFAULT_SIZE = 45  # mutants per run (the outside measurement drew 45)
HISTORY_HEADING = "## History of fresh-sample runs"
HISTORY_HEADER = (
    "| date (UTC) | commit | target | seed | sample | killed / non-equivalent | score | 95% Wilson |",
    "| --- | --- | --- | --- | --- | --- | --- | --- |",
)
# The suite's /dev/shm check counts only each test's own scope: runs here are
# plain pytest (no xdist), and on a shared machine other users' files would
# otherwise fail every run, on clean code too (conftest.py).
SCOPED_SHM = {"SHMRING_SHM_CHECK": "scope"}
CONFIRM_TIMEOUT_S = 300  # one pytest run while confirming a kill (the mutant may hang)
CLEAN_TIMEOUT_S = 1800  # the whole selection on clean code, no xdist (after a failed clean run)
# mutmut's clean run failed under two runs' load and the selection then passed
# alone (seed 3377516542): a failure that does not hold up gets one more run.
MUTMUT_RUNS = 2
# A mutant can break the code that cleans up (a close that no longer unlinks), and
# a run killed at its timeout cleans up nothing: the fresh samples of 2026-12-04
# left 16 deployment directories in /dev/shm. Where it may (root, unshare), every
# mutmut and confirming run gets a /dev/shm of its own, gone when it ends.
_PRIVATE_SHM = 'mount -t tmpfs -o size=8g tmpfs /dev/shm && exec "$0" "$@"'


def in_private_shm(command: list[str], *, root: bool | None = None) -> list[str]:
    """`command` run in a mount namespace with its own tmpfs /dev/shm, where this may be done.

    Root (`root`: whether this process is, by default asked) with
    util-linux's unshare: the namespace's tmpfs goes with its last process.
    Otherwise `command` as it is (what the run leaves in /dev/shm is then
    listed at its end, `shm_left` in summary.json).
    """
    unshare = shutil.which("unshare")
    if not (os.geteuid() == 0 if root is None else root) or unshare is None:
        return command
    return [unshare, "--mount", "--propagation", "private", "sh", "-c", _PRIVATE_SHM, *command]


def shm_entries() -> set[str]:
    """The names in /dev/shm that belong to this uid (a run's leftovers are the new ones)."""
    try:
        with os.scandir("/dev/shm") as entries:
            return {e.name for e in entries if e.stat(follow_symlinks=False).st_uid == os.getuid()}
    except OSError:
        return set()


PACKAGES = {
    "impl": "impl",
    "spec": "spec",
    "model_tests": "model_tests",
    "fault_injection": "fault_injection",
}
# The test selection is the suite itself: every test file pytest collects from
# the configured `testpaths` (pyproject.toml), minus what is named here, each
# with the reason it cannot run under mutmut. This is the one place a test is
# left out; a new test file joins by existing
# (`test_every_test_file_is_selected_or_left_out_with_a_reason`). A key is a
# test file (left out whole) or one test's node id (deselected). mutmut's
# stats run runs the whole selection once (in-process, no xdist, stopping at
# the first failure), and every mutant runs the selected tests that reach its
# function. The copy holds only the package (shmring/ with impl/, spec/, the
# tests, conftest.py, pyproject.toml), so a test that reads the checkout's
# README, docs/, benchmarks/ or .ci/ fails there on clean code.
_CHECKOUT = "reads the checkout's {}, which the mutation copy (the package only) does not hold"
NOT_SELECTED: dict[str, str] = {
    "model_tests/test_lint.py": "ruff and mypy read the source files, never the mutants (minutes)",
    "model_tests/test_package.py": "builds and inspects the package and its metadata, not the mutants",
    "model_tests/test_explore.py": "the model's exhaustive exploration with golden counts: minutes "
    "of setup, and it reaches spec/ and check/, not impl/",
    "model_tests/test_bench_smoke.py": _CHECKOUT.format("benchmarks/ scripts"),
    "model_tests/test_bench_report.py": _CHECKOUT.format("benchmarks/ report code"),
    "model_tests/test_gpu_check.py": _CHECKOUT.format(".ci/ scripts"),
    "model_tests/test_docs_names.py": _CHECKOUT.format("docs/ and README"),
    "model_tests/test_mutation_runner.py": _CHECKOUT.format("pyproject.toml and docs/mutation.md")
    + "; it tests this runner, not impl/",
    "model_tests/test_log_messages.py::test_the_table_holds_every_log_call_of_impl_and_nothing_else": (
        "reads impl's source files, which in the mutation copy hold every mutant's variant "
        "of each function (their changed messages too)"
    ),
    "model_tests/test_reprs.py::test_every_repr_of_impl_is_read_here": (
        "reads impl's source files, which in the mutation copy are mutmut's rewrite of them"
    ),
    "model_tests/test_error_messages.py::test_every_literal_message_of_impl_is_read_here": (
        "reads impl's source files, which in the mutation copy hold every mutant's variant "
        "of each function (their changed messages too)"
    ),
    "fault_injection/test_interleave.py": "builds its reordered readers by recompiling "
    "RingReader's methods from their source (inspect), which under mutmut is the trampoline "
    "that calls names only mutmut's module holds: the file fails to import",
    "fault_injection/test_interleave_neighbours.py": "builds its readers with "
    "test_interleave's recompiling helper: fails to import under mutmut as that file does",
    "fault_injection/test_interleave_liveness.py": "plants its bug by rewriting "
    "Liveness._lock_verdict's source (inspect): under mutmut that source is the trampoline, "
    "the rewrite misses, and the planted failure is never found (it stopped a stats run)",
    "model_tests/test_conformance.py::test_the_readme_examples_run": _CHECKOUT.format("README"),
    "model_tests/test_cli_errors.py::test_version_is_the_package_version": _CHECKOUT.format(
        "pyproject.toml"
    ),
    "model_tests/test_cli_errors.py::test_ctrl_c_exits_130_and_says_where_the_partial_report_is": (
        "interrupts a child `shmring check` while it runs; inside mutmut's stats run the child "
        "finished (124.6 s) before the interrupt came and exited 0, which stopped the stats run"
    ),
    "model_tests/test_cli_errors.py::test_stat_lists_every_scope_and_speaks_json": (
        "runs `python -m shmring.cli stat` in a child whose working directory is a temporary "
        "folder; the child imports mutmut's copy, whose hit recording looks for mutmut's "
        "configuration in that folder and raises FileNotFoundError (it stopped a stats run)"
    ),
    "model_tests/test_driver_port.py::test_pyproject_asks_for_the_cuda_python_that_has_bindings": (
        _CHECKOUT.format("pyproject.toml")
    ),
    "model_tests/test_hostile_files.py::test_issue22_threat_table_lists_every_neighbour_action": (
        _CHECKOUT.format("docs/threat-model.md")
    ),
    "model_tests/test_transport_without_toolkit.py::test_runtime_dependencies_are_what_the_transport_imports": (
        _CHECKOUT.format("pyproject.toml")
    ),
}
TEST_FILE = re.compile(r"^test_.*\.py$")  # pytest's default python_files


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
    (work / "pyproject.toml").write_text(mutmut_config(target, tests or selection()))
    (work / "prepared.json").write_text(json.dumps({"commit": commit_of(), "target": target}))


def mutmut_config(target: str, tests: list[str], root: Path = ROOT) -> str:
    """The copy's pyproject.toml: the root one, [tool.mutmut] aimed at `target` and `tests`."""
    config = (root / "pyproject.toml").read_text()
    if target != "impl":
        config = config.replace(
            'source_paths = ["shmring/impl/"]', f'source_paths = ["shmring/{target}/"]'
        )
        config = config.replace('"shmring/spec/",', '"shmring/impl/",')
    written = ", ".join(json.dumps(test) for test in tests)
    config, count = re.subn(
        r"^pytest_add_cli_args_test_selection = \[.*?\]",
        f"pytest_add_cli_args_test_selection = [{written}]",
        config,
        count=1,
        flags=re.S | re.M,
    )
    if count != 1:
        raise ValueError("pyproject.toml's [tool.mutmut] has no pytest_add_cli_args_test_selection")
    return config


def test_files(root: Path = ROOT) -> list[str]:
    """Every test file of the suite: the files pytest collects from the configured testpaths."""
    config = tomllib.loads((root / "pyproject.toml").read_text())
    found = []
    for folder in config["tool"]["pytest"]["ini_options"]["testpaths"]:
        for path in (root / folder).rglob("test_*.py"):
            if TEST_FILE.match(path.name) and "__pycache__" not in path.parts:
                found.append(path.relative_to(root).as_posix())
    return sorted(found)


def selection(root: Path = ROOT, left_out: dict[str, str] | None = None) -> list[str]:
    """The mutation runs' pytest arguments: every test file but those NOT_SELECTED, as paths
    of the copy, and a `--deselect` for each single test NOT_SELECTED."""
    left_out = NOT_SELECTED if left_out is None else left_out
    blank = sorted(path for path, reason in left_out.items() if not reason.strip())
    if blank:
        raise ValueError(f"test files left out of the selection without a reason: {blank}")
    files = [f"shmring/{path}" for path in test_files(root) if path not in left_out]
    return files + [f"--deselect=shmring/{test}" for test in sorted(left_out) if "::" in test]


def mutants(work: Path) -> dict[str, str | None]:
    """mutant name -> exit code (None: not run), from mutmut's .meta files."""
    found: dict[str, str | None] = {}
    for meta in sorted((work / "mutants").rglob("*.py.meta")):
        found.update(json.loads(meta.read_text())["exit_code_by_key"])
    return found


def unreached(work: Path, names: list[str]) -> dict[str, int]:
    """Functions with mutants that mutmut's stats run saw no test reach -> their mutant count.

    The stats run records the calls made in the test's own process: code
    run only in a forked child or a subprocess counts as reached by no test,
    and its mutants can never be killed, whatever the child asserted
    (`test_in_process_reach.py` was written for the 36 such functions found
    on 2026-12-03). Largest first.
    """
    stats_file = work / "mutants" / "mutmut-stats.json"
    if not stats_file.exists():
        return {}
    reached = json.loads(stats_file.read_text())["tests_by_mangled_function_name"]
    counts: dict[str, int] = defaultdict(int)
    for name in names:
        function = name.partition("__mutmut_")[0]
        if function not in reached:
            counts[function] += 1
    return dict(sorted(counts.items(), key=lambda item: (-item[1], item[0])))


def module_of(name: str) -> str:
    parts = name.split(".")
    for index in range(len(parts) - 1, -1, -1):
        if parts[index].startswith(("x_", "xǁ")):
            return ".".join(parts[:index])
    return name.rsplit(".", 1)[0]


def stratum_of(name: str) -> str:
    """The subpackage of the target a mutant belongs to (a top-level module is its own).

    ``shmring.impl.codec.encode.x_encode__mutmut_3`` -> ``codec``,
    ``shmring.impl.errors.x_describe_errno__mutmut_1`` -> ``errors``.
    """
    parts = module_of(name).split(".")
    if parts and parts[0] == "shmring":
        parts = parts[1:]
    return parts[1] if len(parts) > 1 else parts[0]


# -- the sample -------------------------------------------------------------------------------


def fresh_seed() -> int:
    """A seed no one chose: each run's sample is new unless `--seed` repeats one."""
    return secrets.randbelow(2**32)


def allocate(sizes: dict[str, int], total: int) -> dict[str, int]:
    """Mutants per stratum: `total` split in proportion to the strata's sizes (largest remainder).

    Every stratum gets at least one when `total` reaches the number of
    strata, none gets more than it has, and the shares add up to `total`
    (or to every mutant, when `total` is larger).
    """
    strata = sorted(name for name, size in sizes.items() if size > 0)
    everything = sum(sizes[name] for name in strata)
    if total >= everything:
        return {name: sizes[name] for name in strata}
    share = dict.fromkeys(strata, 0)
    if total >= len(strata):
        share = dict.fromkeys(strata, 1)
    left = total - sum(share.values())
    while left > 0:
        room = {name: sizes[name] - share[name] for name in strata if sizes[name] > share[name]}
        weight = sum(room.values())
        quota = {name: left * room[name] / weight for name in room}
        whole = {name: min(room[name], math.floor(quota[name])) for name in room}
        if not any(whole.values()):  # fewer left than strata with room: largest remainders
            for name in sorted(room, key=lambda n: (-quota[n], n))[:left]:
                whole[name] = 1
        for name, count in whole.items():
            share[name] += count
        left = total - sum(share.values())
    return share


def draw(names: list[str], total: int, seed: int, modules: set[str] = frozenset()) -> list[str]:
    """A stratified sample of `total` mutant names (0: all), the same for the same seed and names.

    `modules` keeps only the strata (or modules) named: `codec` is impl/codec/.
    """
    by_stratum: dict[str, list[str]] = defaultdict(list)
    for name in sorted(set(names)):
        if modules and not modules & {stratum_of(name), *module_of(name).split(".")}:
            continue
        by_stratum[stratum_of(name)].append(name)
    if total <= 0:
        return [name for stratum in sorted(by_stratum) for name in by_stratum[stratum]]
    share = allocate({stratum: len(pool) for stratum, pool in by_stratum.items()}, total)
    rng = random.Random(seed)
    chosen: list[str] = []
    for stratum in sorted(by_stratum):
        chosen += sorted(rng.sample(by_stratum[stratum], share.get(stratum, 0)))
    return chosen


def population(names: list[str]) -> dict[str, int]:
    """Mutants per stratum (the strata's sizes)."""
    counts: dict[str, int] = defaultdict(int)
    for name in names:
        counts[stratum_of(name)] += 1
    return counts


def stratified(strata: dict[str, dict[str, float]], sizes: dict[str, int]) -> tuple[float, float]:
    """The score of all mutants from per-stratum samples: sum of w_s p_s, +- 1.96 sigma."""
    weighed = {m: sizes[m] for m, row in strata.items() if row["score"] is not None}
    total = sum(weighed.values()) or 1
    estimate = variance = 0.0
    for stratum, size in weighed.items():
        row = strata[stratum]
        n = int(row["counted"])
        p = float(row["score"])
        w = size / total
        estimate += w * p
        adjusted = (p * n + 2) / (n + 4)  # Agresti-Coull: no zero variance at 0% or 100%
        variance += w * w * adjusted * (1 - adjusted) / (n + 4)
    return estimate, 1.96 * math.sqrt(variance)


# -- equivalent mutants ---------------------------------------------------------------------


@dataclass(frozen=True)
class Equivalent:
    """A mutant classified once as equivalent: where (function), which change, and why."""

    function: str  # e.g. impl.registered.arena.ArenaReader.__init__
    before: str  # the original line, stripped
    after: str  # the mutated line, stripped
    reason: str


def function_of(name: str) -> str:
    """``shmring.impl.registered.arena.xǁArenaReaderǁ__init____mutmut_18`` -> ``impl.registered.arena.ArenaReader.__init__``."""
    mangled = name.partition("__mutmut_")[0]
    module, _, function = mangled.rpartition(".")
    if module.startswith("shmring."):
        module = module[len("shmring.") :]
    if function.startswith("xǁ"):
        _, cls, method = function.split("ǁ")
        return f"{module}.{cls}.{method}"
    return f"{module}.{function.removeprefix('x_')}"


def changed_lines(diff: str) -> tuple[str, str]:
    """The removed and the added lines of a mutant's diff, each stripped and joined by newlines."""
    removed = [
        line[1:].strip()
        for line in diff.splitlines()
        if line.startswith("-") and not line.startswith("---")
    ]
    added = [
        line[1:].strip()
        for line in diff.splitlines()
        if line.startswith("+") and not line.startswith("+++")
    ]
    return "\n".join(removed), "\n".join(added)


def load_equivalents(path: Path = EQUIVALENTS) -> list[Equivalent]:
    """The checked-in classification; every entry needs a reason."""
    if not path.exists():
        return []
    entries = tomllib.loads(path.read_text()).get("equivalent", [])
    found = []
    for entry in entries:
        if not str(entry.get("reason", "")).strip():
            raise ValueError(f"an equivalent mutant without a reason: {entry}")
        found.append(
            Equivalent(
                entry["function"], entry["before"].strip(), entry["after"].strip(), entry["reason"]
            )
        )
    return found


def equivalent_to(name: str, diff: str, known: list[Equivalent]) -> Equivalent | None:
    """The classification matching this mutant (same function, same change), if any."""
    function = function_of(name)
    before, after = changed_lines(diff)
    for entry in known:
        if (entry.function, entry.before, entry.after) == (function, before, after):
            return entry
    return None


# -- the history ----------------------------------------------------------------------------


@dataclass(frozen=True)
class HistoryRow:
    date: str  # YYYY-MM-DD HH:MM (UTC)
    commit: str  # short hash, "+dirty" when the tree had changes
    target: str  # impl or spec, and the strata when not all
    seed: int
    sample: int  # mutants drawn
    killed: int  # confirmed kills
    counted: int  # non-equivalent mutants of the sample

    def cells(self) -> list[str]:
        low, high = wilson(self.killed, self.counted)
        score = f"{self.killed / self.counted:.0%}" if self.counted else "-"
        return [
            self.date,
            f"`{self.commit}`",
            self.target,
            str(self.seed),
            str(self.sample),
            f"{self.killed} / {self.counted}",
            score,
            f"{low:.0%}-{high:.0%}",
        ]


def append_history(row: HistoryRow, doc: Path = DOC) -> None:
    """Add `row` at the end of the history table (made, at the end of the document, if missing)."""
    text = doc.read_text() if doc.exists() else ""
    line = "| " + " | ".join(row.cells()) + " |"
    lines = text.splitlines()
    if HISTORY_HEADING not in lines:
        block = [
            "",
            HISTORY_HEADING,
            "",
            "One row per run of `model_tests/mutation.py`, appended by the script itself.",
            "",
            *HISTORY_HEADER,
            line,
        ]
        doc.write_text(text.rstrip("\n") + "\n" + "\n".join(block) + "\n")
        return
    at = lines.index(HISTORY_HEADING) + 1
    while at < len(lines) and not lines[at].startswith("|"):
        at += 1
    while at < len(lines) and lines[at].startswith("|"):
        at += 1
    lines.insert(at, line)
    doc.write_text("\n".join(lines) + "\n")


def commit_of(root: Path = ROOT) -> str:
    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True)
        return done.stdout.strip()

    commit = git("rev-parse", "--short", "HEAD") or "unknown"
    return commit + ("+dirty" if git("status", "--porcelain", "--untracked-files=no") else "")


# -- confirming a kill ----------------------------------------------------------------------


def _pytest(
    work: Path,
    mutant: str,
    tests: list[str],
    *,
    first_failure: bool,
    deselect: list[str] = (),
    timeout: float | None = None,
) -> subprocess.CompletedProcess[str]:
    """pytest in the mutants' copy with `mutant` active ("" for clean code), no xdist."""
    args = [
        sys.executable,
        "-m",
        "pytest",
        "--rootdir=.",
        "-q",
        "-p",
        "no:randomly",
        "-p",
        "no:xdist",
        "-p",
        "no:cacheprovider",
        "--tb=no",
        "-rfE",  # failures and errors (a fixture the mutant breaks errors, it does not fail)
    ]
    if first_failure:
        args.append("-x")
    for test in deselect:
        args += ["--deselect", test]
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    env.update({"MUTANT_UNDER_TEST": mutant, "PYTHONWARNINGS": "ignore", **SCOPED_SHM})
    try:
        return subprocess.run(
            in_private_shm([*args, *tests]),
            cwd=work / "mutants",
            env=env,
            capture_output=True,
            text=True,
            timeout=CONFIRM_TIMEOUT_S if timeout is None else timeout,
        )
    except subprocess.TimeoutExpired as expired:
        out = expired.stdout or ""
        out = out.decode(errors="replace") if isinstance(out, bytes) else out
        return subprocess.CompletedProcess(args, -9, out, "timeout")


def failed_tests(output: str) -> list[str]:
    """Node ids of the failures in pytest's -rf summary."""
    found = []
    for line in output.splitlines():
        words = line.split()
        # "ERROR - <message>" (a run-level error) names no test
        if len(words) > 1 and words[0] in ("FAILED", "ERROR") and ".py" in words[1]:
            found.append(_summary_node_id(line.split(" ", 1)[1]))
    return found


def clean_failures(work: Path) -> list[str] | None:
    """After mutmut's clean run failed: the copy's selection alone on clean code, and what fails.

    mutmut keeps no output of its clean run, so a run that stopped there
    said only "see mutmut.log". The answer is the failing node ids, [] when
    everything passes now (the failure did not hold up: load, another run
    beside it), None when the copy has no selection to run.
    """
    config = work / "mutants" / "pyproject.toml"
    if not config.exists():
        return None
    tests = tomllib.loads(config.read_text())["tool"]["mutmut"].get(
        "pytest_add_cli_args_test_selection"
    )
    if not tests:
        return None
    result = _pytest(work, "", list(tests), first_failure=False, timeout=CLEAN_TIMEOUT_S)
    failing = failed_tests(result.stdout)
    if failing or result.returncode == 0:
        return failing
    return None  # timed out, or failed without naming a test or a file


def _summary_node_id(rest: str) -> str:
    """The node id at the start of a summary line's `rest`, parameters with spaces included.

    A parametrized id may hold spaces (``test_x[stage_id-True-stage_id must
    be an int]``): cut at the first space, it named no test, and a kill of
    seed 2232352540 read "not confirmed" for it (exit 4 alone).
    """
    head = rest.split(" ", 1)[0]
    if "[" not in head or head.endswith("]"):
        return head
    end = rest.find("] - ")
    if end == -1:
        end = rest.rfind("]")
    return rest[: end + 1] if end != -1 else head


# pytest's words for a test file that did not import: at collection ("ERROR
# collecting F") and, when the run named node ids of it, "found no collectors
# for /abs/F::test".
_COLLECTING = re.compile(r"^ERROR collecting (\S+\.py)", re.MULTILINE)
_NO_COLLECTORS = re.compile(r"found no collectors for (\S+?\.py)::", re.MULTILINE)


def uncollected_files(run: subprocess.CompletedProcess[str], root: Path) -> list[str]:
    """The test files a run could not import (collection errors), relative to `root`, in order."""
    found: list[str] = []
    for match in [*_COLLECTING.finditer(run.stdout), *_NO_COLLECTORS.finditer(run.stderr)]:
        path = match.group(1)
        if Path(path).is_absolute():
            path = str(Path(path).relative_to(root)) if Path(path).is_relative_to(root) else path
        if path not in found:
            found.append(path)
    return found


def _confirm_collection(work: Path, name: str, files: list[str]) -> Confirmation | None:
    """A test file that fails to import on the mutant and imports on clean code: a kill.

    Such a file's tests never run on the mutant (mutmut counts the run's
    failure as a kill); pytest answers a run naming them "found no
    collectors" (exit 4) and no test fails. The file is checked alone, with
    `--collect-only`: exit 2 (a collection error) on the mutant, 0 on clean code.
    """
    for path in files[:CONFIRM_ATTEMPTS]:
        if _pytest(work, name, ["--collect-only", path], first_failure=False).returncode != 2:
            continue
        if _pytest(work, "", ["--collect-only", path], first_failure=False).returncode == 0:
            return Confirmation(
                path, f"{path} fails to import on the mutant, imports on clean code"
            )
    return None


def tests_reaching(work: Path, name: str) -> list[str]:
    """The tests mutmut's stats run saw reaching the mutant's function, shortest first.

    In name order, a function reached by hundreds of tests (several minutes
    of them) ran out of time before its failing test, and a real kill read as
    "not confirmed" (docs/mutation.md). Shortest first, as mutmut runs them.
    """
    stats = json.loads((work / "mutants" / "mutmut-stats.json").read_text())
    reached = stats["tests_by_mangled_function_name"].get(name.partition("__mutmut_")[0], [])
    durations = stats.get("duration_by_test", {})
    return sorted(reached, key=lambda test: (durations.get(test, float("inf")), test))


CONFIRM_ATTEMPTS = 3  # failing tests tried, one after another, before a kill reads "not confirmed"
CONFIRM_BATCH_S = 60.0  # recorded seconds of tests per pytest run while searching for the failure
CONFIRM_BUDGET_S = 1200.0  # wall seconds the search for one kill's failing test may take
UNKNOWN_DURATION_S = 1.0  # a test the stats run did not time counts as this much of a batch


def reaching_batches(work: Path, tests: list[str], limit: float | None = None) -> list[list[str]]:
    """`tests` in order, cut into runs of at most `limit` (CONFIRM_BATCH_S) recorded seconds.

    Each batch holds at least one test.

    One run of all of them under CONFIRM_TIMEOUT_S timed out for functions
    reached by 389 and 505 tests (seed 3041359273), though mutmut had seen
    them killed: in batches each run stays well inside the timeout, and a
    batch that still times out (the mutant makes a test hang) costs that
    batch, not the search.
    """
    stats = json.loads((work / "mutants" / "mutmut-stats.json").read_text())
    durations = stats.get("duration_by_test", {})
    limit = CONFIRM_BATCH_S if limit is None else limit
    batches: list[list[str]] = []
    spent = 0.0
    for test in tests:
        seconds = durations.get(test, UNKNOWN_DURATION_S)
        if not batches or (spent + seconds > limit and batches[-1]):
            batches.append([])
            spent = 0.0
        batches[-1].append(test)
        spent += seconds
    return batches


@dataclass
class Confirmation:
    """A kill's confirmation: the test that holds it up, or why none did."""

    test: str | None
    reason: str


def _holds_up_alone(work: Path, name: str, test: str) -> str | None:
    """None when `test` alone fails on mutant `name` and alone passes on clean code, else why not."""
    alone_mutant = _pytest(work, name, [test], first_failure=True)
    if alone_mutant.returncode not in KILLED:
        return f"{test} alone on the mutant: exit {alone_mutant.returncode}"
    alone_clean = _pytest(work, "", [test], first_failure=True)
    if alone_clean.returncode != 0:
        return f"{test} fails on clean code too (exit {alone_clean.returncode})"
    return None


def confirm_kill(work: Path, name: str) -> Confirmation:
    """The test that alone fails on mutant `name` and alone passes on clean code, or why not.

    The reaching tests run shortest first with `-x`, in batches (reaching_batches);
    the first failure is then run alone on the mutant and alone on clean code.
    A failure that does not hold up alone (it failed after another test's
    leftovers, or it fails on clean code too) is deselected and the search
    goes on, up to CONFIRM_ATTEMPTS failures and CONFIRM_BUDGET_S seconds.
    "Fails" is what mutmut counts as a kill (pytest's exit codes KILLED), so a
    mutant that breaks a test's teardown confirms as it was killed. The
    reason is kept for the summary.
    """
    tests = tests_reaching(work, name)
    if not tests:
        return Confirmation(None, "no test reaches it in the stats")
    tried: list[str] = []
    notes: list[str] = []
    timed_out = 0
    deadline = time.monotonic() + CONFIRM_BUDGET_S
    batches = reaching_batches(work, tests)
    for number, batch in enumerate(batches):
        if len(tried) >= CONFIRM_ATTEMPTS:
            break
        if time.monotonic() > deadline:
            notes.append(f"out of time after {number} of {len(batches)} batches")
            break
        while len(tried) < CONFIRM_ATTEMPTS:
            run = _pytest(work, name, batch, first_failure=True, deselect=tried)
            found = [test for test in failed_tests(run.stdout) if test not in tried]
            if not found and run.returncode in (2, 4):
                uncollected = uncollected_files(run, work / "mutants")
                by_import = _confirm_collection(work, name, uncollected)
                if by_import is not None:
                    return Confirmation(by_import.test, "; ".join([*notes, by_import.reason]))
            if not found:
                timed_out += run.returncode == -9
                break
            why_not = _holds_up_alone(work, name, found[0])
            if why_not is None:
                return Confirmation(found[0], "; ".join([*notes, f"{found[0]} fails alone"]))
            notes.append(why_not)
            tried.append(found[0])
    if len(tried) < CONFIRM_ATTEMPTS:
        hung = f", {timed_out} batches timed out" if timed_out else ""
        notes.append(f"the reaching tests ({len(tests)}) gave no failure that holds up{hung}")
    return Confirmation(None, "; ".join(notes))


# -- the run --------------------------------------------------------------------------------


def classify(code: int | None) -> str:
    """mutmut's exit code for a mutant -> what the run saw."""
    if code in KILLED:
        return "killed"
    if code in SURVIVED:
        return "survived"
    if code in TIMEOUT:
        return "timeout"
    if code in (5, 33):
        return "no tests"
    return "not checked" if code is None else f"other {code}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", choices=("impl", "spec"), default="impl")
    parser.add_argument("--size", type=int, default=DEFAULT_SIZE, help="mutants drawn (0: all)")
    parser.add_argument("--full", action="store_true", help="every mutant (same as --size 0)")
    parser.add_argument("--seed", type=int, help="sampling seed (default: a fresh one, recorded)")
    parser.add_argument(
        "--modules", default="", help="comma-separated strata or modules (default all)"
    )
    parser.add_argument("--max-children", type=int, default=1, help="mutants run at once")
    parser.add_argument("--reuse", action="store_true", help="keep the copy and mutmut's results")
    parser.add_argument(
        "--report-only",
        action="store_true",
        help="summarise the last run's results again (its seed unless --seed), run nothing, record nothing",
    )
    parser.add_argument(
        "--reconfirm",
        action="store_true",
        help="confirm the kills of the last run's mutmut results again (its seed unless --seed), "
        "without running mutmut; records a row",
    )
    parser.add_argument(
        "--tests",
        action="append",
        default=[],
        help="test paths (repeatable) in place of the configured selection",
    )
    parser.add_argument(
        "--no-history",
        action="store_true",
        help="a trial of the runner (e.g. --size 3): report, but add no row to the history",
    )
    parser.add_argument("--work", help="where the copy goes (default .shmring/mutation/TARGET)")
    args = parser.parse_args(argv)
    work = Path(args.work) if args.work else ROOT / ".shmring" / "mutation" / args.target
    mutmut = [sys.executable, "-m", "mutmut"]
    started = time.monotonic()
    shm_before = shm_entries()
    if args.reconfirm:
        args.reuse = True
    if (
        args.seed is None
        and (args.report_only or args.reconfirm)
        and (work / "summary.json").exists()
    ):
        args.seed = json.loads((work / "summary.json").read_text())["seed"]
    seed = fresh_seed() if args.seed is None else args.seed
    fresh = not (args.reuse or args.report_only) or not (work / "mutants").is_dir()
    if fresh:
        prepare(args.target, work, args.tests)
        subprocess.run(
            [sys.executable, "-c", _GENERATE], cwd=work, check=True, stdout=subprocess.DEVNULL
        )
    # The code measured is the copy's: a reused copy keeps the commit it was made from.
    prepared = work / "prepared.json"
    commit = json.loads(prepared.read_text())["commit"] if prepared.exists() else commit_of()
    every = list(mutants(work))
    modules = {m for m in args.modules.split(",") if m}
    names = draw(every, 0 if args.full else args.size, seed, modules)
    print(f"mutation: {len(names)} mutants of {args.target}/ drawn with seed {seed}", flush=True)
    runs = 0 if (args.report_only or args.reconfirm) else MUTMUT_RUNS
    for run in range(runs):
        with open(work / "mutmut.log", "a" if run else "w") as handle:
            subprocess.run(
                in_private_shm([*mutmut, "run", "--max-children", str(args.max_children), *names]),
                cwd=work,
                stdout=handle,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONWARNINGS": "ignore", **SCOPED_SHM},
            )
        codes = mutants(work)
        if not names or any(codes.get(name) is not None for name in names):
            break
        # mutmut stopped before any mutant (its stats run or the clean run
        # failed): there is no score to record.
        print(f"mutation: mutmut checked none of the sample; see {work / 'mutmut.log'}")
        failing = clean_failures(work)
        if failing:
            print("mutation: on clean code these fail in the copy:", *failing, sep="\n  ")
            return 2
        if failing is None:
            return 2
        print("mutation: the selection passes on clean code now: mutmut's failure did not hold up")
        if run + 1 < runs:
            print("mutation: running mutmut again", flush=True)
    codes = mutants(work)
    if names and all(codes.get(name) is None for name in names):
        return 2
    known = load_equivalents()
    confirmed: dict[str, str] = {}
    reasons: dict[str, str] = {}
    if not args.report_only:
        # Confirmations are independent pytest runs: as many at once as mutants ran.
        to_confirm = [n for n in names if classify(codes.get(n)) in ("killed", "timeout")]
        with ThreadPoolExecutor(max_workers=max(1, args.max_children)) as pool:
            for name, outcome in zip(
                to_confirm, pool.map(lambda n: confirm_kill(work, n), to_confirm), strict=True
            ):
                verdict = f"confirmed by {outcome.test}" if outcome.test else "not confirmed"
                print(f"  {name}: {verdict} ({outcome.reason})", flush=True)
                reasons[name] = outcome.reason
                if outcome.test is not None:
                    confirmed[name] = outcome.test
    else:
        previous = (
            json.loads((work / "summary.json").read_text())
            if (work / "summary.json").exists()
            else {}
        )
        confirmed = previous.get("confirmed", {})
        reasons = previous.get("reasons", {})
    per_stratum: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    survivors: list[tuple[str, str, str]] = []
    for name in names:
        status = classify(codes.get(name))
        if name in confirmed:
            status = "killed"
        elif status == "killed":
            status = "kill not confirmed"
        diff = ""
        if status != "killed":
            diff = subprocess.run(
                [*mutmut, "show", name], cwd=work, capture_output=True, text=True
            ).stdout
            if equivalent_to(name, diff, known) is not None:
                status = "equivalent"
        per_stratum[stratum_of(name)][status] += 1
        if status not in ("killed", "equivalent"):
            survivors.append((name, status, diff))
    summary: dict[str, object] = {
        "target": args.target,
        "seed": seed,
        "commit": commit,
        "size": len(names),
        "modules": sorted(modules),
        "seconds": 0,
        "strata": {},
        "confirmed": confirmed,
        "reasons": reasons,
    }
    strata: dict[str, dict[str, float]] = {}
    total_killed = total = 0
    for stratum, statuses in sorted(per_stratum.items()):
        # The denominator is every non-equivalent mutant: one that survived, was
        # not reached, timed out without a confirmed failing test, or whose kill
        # did not hold up alone counts against the suite.
        killed = statuses["killed"]
        counted = sum(statuses.values()) - statuses["equivalent"]
        low, high = wilson(killed, counted)
        strata[stratum] = {
            **statuses,
            "counted": counted,
            "score": killed / counted if counted else None,
            "interval": [round(low, 2), round(high, 2)],
        }
        total_killed += killed
        total += counted
        print(
            f"  {stratum:<16} killed {killed:>3} of {counted:>3} non-equivalent "
            f"({low:.0%}-{high:.0%})  {dict(statuses)}"
        )
    low, high = wilson(total_killed, total)
    summary["strata"] = strata
    summary["killed"], summary["counted"] = total_killed, total
    summary["interval"] = [round(low, 3), round(high, 3)]
    summary["seconds"] = round(time.monotonic() - started)
    left = sorted(shm_entries() - shm_before)
    summary["shm_left"] = left
    if left:
        # Not removed: with no namespace of its own, another run's files look the same.
        print(f"  left in /dev/shm during the run (mutants that broke cleanup?): {left}")
    print(
        f"  sample (seed {seed}, commit {commit}): killed {total_killed} of {total} non-equivalent "
        f"({total_killed / max(total, 1):.0%}, 95% Wilson {low:.0%}-{high:.0%}), every kill confirmed, "
        f"in {summary['seconds']} s"
    )
    estimate, margin = stratified(strata, population(every))
    summary["stratified"] = {"estimate": round(estimate, 3), "margin95": round(margin, 3)}
    print(
        f"  all mutants (each stratum weighted by its size): {estimate:.0%} +- {margin:.0%} (95%)"
    )
    missed = unreached(work, every)
    summary["unreached"] = {"functions": len(missed), "mutants": sum(missed.values())}
    (work / "unreached.txt").write_text("".join(f"{n} {f}\n" for f, n in missed.items()))
    print(
        f"  reached by no test in its own process: {len(missed)} functions, "
        f"{sum(missed.values())} of {len(every)} mutants ({work / 'unreached.txt'})"
    )
    (work / "summary.json").write_text(json.dumps(summary, indent=2, default=dict))
    with open(work / "survivors.txt", "w") as handle:
        for name, status, diff in survivors:
            why = f" [{reasons[name]}]" if name in reasons else ""
            handle.write(f"=== {name} ({status}){why}\n{diff}\n")
    print(f"  survivors' diffs: {work / 'survivors.txt'}")
    if not (args.report_only or args.no_history):
        scope = args.target + (f" ({','.join(sorted(modules))})" if modules else "")
        if args.tests:
            scope += " (own tests)"
        row = HistoryRow(
            datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M"),
            commit,
            scope,
            seed,
            len(names),
            total_killed,
            total,
        )
        append_history(row)
        print(f"  history: a row added to {DOC.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
