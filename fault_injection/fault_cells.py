"""The fault campaign: every scenario, every site, every error, both modes, call N for N = 1, 2, ...

Design rationale. SQLite's malloc and I/O-error tests fail the Nth
allocation for N = 1, 2, ... until a run completes without reaching N; that
walks the failure through every place the code can meet it, in the order
the code meets them, with no guessing about which places matter. Here a
*slot* is (scenario, site, error, mode); a *cell* is one run of the
scenario with the plan "fail call N at that site". A slot runs cells for
N = 1, 2, ... and stops at the first run that does not reach call N, which
for a deterministic scenario is N = (calls at the site in a fault-free run)
+ 1, so the number of cells is known in advance (`enumerate_cells`), and
the suite checks the campaign ran exactly that many.

After every cell (faults stopped, everything closed):

* no file of the cell's deployment is left (the directory is gone);
* no descriptor the cell opened through its seam is still open (the seam
  keeps what it opened, `CountingOs.held_descriptors`: what another test of
  the process opens or closes meanwhile, under xdist, counts for nothing),
  the process holds as many flock locks as before and no mapping of the
  cell's files;
* the simulated CUDA driver holds no registration;
* the scenario itself checked the model: each answer while faults fired,
  the state each failed operation left, every payload delivered exactly
  once and byte for byte after the faults stopped (see `scenarios`).

Entry points for `shmring check`: `run_faults`, `run_crash`, `run_fuzz`
(the last two live in `crash` and `fuzz` and are re-exported here). Each
takes a budget ("quick", "standard", "deep"), a seed and a progress callback
and answers a dict of counts; any failure raises `CampaignFailure` (an
AssertionError) whose message names the cells and how to rerun one:

    python -m shmring.fault_injection.fault_cells --scenario ring_wrap --plan open#3:ENOSPC:transient
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import logging
import os
import shutil
import sys
import time
import traceback
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Final

from ..impl.names import DEFAULT_SHM_ROOT, current_producer_identity
from .identities import Identities, borrowed_identities
from .kit.seams import CountingOs, FaultyOs
from .lockstep import ScenarioFailure
from .plans import FaultPlan, FaultyCudaDriver
from .scenarios import SCENARIOS, Env, Outcome, Scenario
from .sites import MODES, FaultError, all_sites

Progress = Callable[[int, "int | None"], None]

BUDGETS: Final = ("quick", "standard", "deep")
# How many errors of each site's catalogue a budget injects (0: all).
ERROR_DEPTH: Final = {"quick": 1, "standard": 2, "deep": 0}
_MAX_REPORTED: Final = 12


class CampaignFailure(AssertionError):
    """Some cells broke a promise; the message lists them and how to rerun each."""


@dataclass(frozen=True)
class Slot:
    """A scenario, a site, an error and a mode: the cells for N = 1 .. calls + 1."""

    scenario: str
    site: str
    error: FaultError
    mode: str
    calls: int  # calls at the site in a fault-free run (before the faults stop)

    @property
    def cells(self) -> int:
        return self.calls + 1


@dataclass(frozen=True)
class CellResult:
    plan: FaultPlan | None  # None: the fault-free baseline run
    scenario: str
    hit: bool  # the run reached call N (the plan fired)
    problems: tuple[str, ...]  # empty when the cell passed
    outcome: Outcome | None

    def describe(self) -> str:
        return (
            f"[{self.scenario} {self.plan}] "
            + "; ".join(self.problems)
            + f"\n    rerun: {reproduce_command(self.scenario, self.plan)}"
        )


def reproduce_command(scenario: str, plan: FaultPlan | None) -> str:
    suffix = f" --plan {plan}" if plan is not None else ""
    return f"python -m shmring.fault_injection.fault_cells --scenario {scenario}{suffix}"


# -- resources -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Resources:
    descriptors: tuple[int, ...]  # opened through the cell's seam and still open on that file
    locks: int  # flock locks of this pid in /proc/locks
    mappings: int  # lines of /proc/self/maps naming a shmring file of the scope


def _resources(scope: str, seam: CountingOs) -> Resources:
    pid = str(os.getpid())
    with open("/proc/locks", encoding="ascii") as locks:
        held = sum(1 for line in locks if line.split()[4:5] == [pid] and "FLOCK" in line)
    with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
        mapped = sum(1 for line in maps if scope in line)
    return Resources(tuple(seam.held_descriptors()), held, mapped)


def _names(fd: int) -> str:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return "?"


def _leaks(scope: str, before: Resources, directory: str, seam: CountingOs) -> list[str]:
    problems = []
    after = _resources(scope, seam)
    if after != before:
        gc.collect()  # a cycle may hold the last reference; count what stays after it
        after = _resources(scope, seam)
    if after.descriptors != before.descriptors:
        left = ", ".join(
            f"{fd} ({_names(fd)})" for fd in after.descriptors if fd not in before.descriptors
        )
        problems.append(f"descriptors opened through the seam left open: {left}")
    if after.locks != before.locks:
        problems.append(f"flock locks {before.locks} -> {after.locks}")
    if after.mappings:
        problems.append(f"{after.mappings} mappings of the deployment's files left")
    if os.path.lexists(directory):
        try:
            left = sorted(os.listdir(directory))
        except OSError:
            left = ["<unreadable>"]
        problems.append(f"deployment directory left with {left}")
        shutil.rmtree(directory, ignore_errors=True)
    return problems


# -- cells -------------------------------------------------------------------------------


def run_cell(
    scenario_name: str,
    plan: FaultPlan | None,
    identities: Identities,
    scope: str,
    shm_root: str = DEFAULT_SHM_ROOT,
) -> CellResult:
    """One run of a scenario under `plan` (None: fault-free), with every after-cell check."""
    scenario: Scenario = SCENARIOS[scenario_name]
    os_plan = plan if plan is not None and isinstance(plan.error, int) else None
    cuda_plan = plan if plan is not None and isinstance(plan.error, str) else None
    env = Env(scope, FaultyOs(os_plan), FaultyCudaDriver(cuda_plan), identities, shm_root)
    before = _resources(scope, env.os)
    problems: list[str] = []
    outcome: Outcome | None = None
    try:
        outcome = scenario(env)
    except ScenarioFailure as failure:
        problems.append(str(failure))
    except Exception as error:  # noqa: BLE001 - an undocumented escape is the finding
        problems.append(
            f"{type(error).__name__} escaped the scenario: {error} (at {_where(error)})"
        )
    problems += _leaks(scope, before, env.directory, env.os)
    ranges = env.driver.registered_ranges()
    if ranges:
        problems.append(f"driver still holds registrations {ranges}")
    hit = env.fault_hit()
    if plan is not None and not hit and env.reached[plan.site] >= plan.nth:
        problems.append(f"call {plan.nth} at {plan.site} was made but the plan did not fire")
    return CellResult(plan, scenario_name, hit, tuple(problems), outcome)


def _where(error: BaseException) -> str:
    """The innermost frames of a traceback, compactly."""
    frames = traceback.extract_tb(error.__traceback__)[-3:]
    return " <- ".join(
        f"{os.path.basename(f.filename)}:{f.lineno} {f.name}" for f in reversed(frames)
    )


def baseline(scenario_name: str, identities: Identities, scope: str) -> dict[str, int]:
    """Calls per site a fault-free run makes before its faults would stop."""
    result = run_cell(scenario_name, None, identities, scope)
    if result.problems:
        raise CampaignFailure(
            f"scenario {scenario_name} fails without any fault: {'; '.join(result.problems)}\n"
            f"    rerun: {reproduce_command(scenario_name, None)}"
        )
    assert result.outcome is not None
    return dict(result.outcome.reached)


def enumerate_slots(
    budget: str, identities: Identities, prefix: str, scenarios: Sequence[str] | None = None
) -> list[Slot]:
    """Every (scenario, site, error, mode) the budget covers, with its call count."""
    if budget not in BUDGETS:
        raise ValueError(f"budget must be one of {BUDGETS}: budget={budget!r}")
    # As the campaign does (`_prepare`): the once-per-process /proc read of our own
    # identity is no call of any scenario, so the counts do not depend on run order.
    current_producer_identity()
    depth = ERROR_DEPTH[budget]
    slots = []
    for index, name in enumerate(scenarios or SCENARIOS):
        reached = baseline(name, identities, f"{prefix}b{index}")
        for site in all_sites():
            calls = reached.get(site.name, 0)
            if not calls:
                continue
            for mode in MODES:
                for error in site.errors_for(mode, depth):
                    slots.append(Slot(name, site.name, error, mode, calls))
    return slots


def enumerate_cells(slots: Iterable[Slot]) -> int:
    return sum(slot.cells for slot in slots)


def run_slot(
    slot: Slot, identities: Identities, prefix: str, on_cell: Callable[[CellResult], None]
) -> int:
    """Cells for N = 1, 2, ... until a run does not reach call N; answers how many ran."""
    nth = 0
    while True:
        nth += 1
        plan = FaultPlan(slot.site, nth, slot.mode, slot.error)
        result = run_cell(slot.scenario, plan, identities, f"{prefix}{nth}")
        if nth > slot.cells and result.hit:
            result = CellResult(
                plan,
                slot.scenario,
                False,
                (
                    *result.problems,
                    f"the scenario made more than {slot.calls} calls at {slot.site}: not deterministic",
                ),
                result.outcome,
            )
        on_cell(result)
        if not result.hit:
            return nth


@contextlib.contextmanager
def quiet_logs() -> Iterator[None]:
    """Injected faults make the transport log warnings by the thousand; keep errors only."""
    logger = logging.getLogger("shmring")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def _prepare() -> Identities:
    current_producer_identity()  # cached: its /proc read is not part of any scenario
    import torch  # noqa: F401 - loaded once, before any cell, for the registered scenarios

    return borrowed_identities()


def run_faults(
    budget: str, seed: int, progress: Progress, scenarios: Sequence[str] | None = None
) -> dict[str, int]:
    """The fault-cell campaign. `seed` only names the run (cells are deterministic)."""
    with quiet_logs():
        return _run_faults(budget, seed, progress, scenarios)


def _run_faults(
    budget: str, seed: int, progress: Progress, scenarios: Sequence[str] | None
) -> dict[str, int]:
    identities = _prepare()
    prefix = f"fi{seed % 10000}x{uuid.uuid4().hex[:6]}"
    slots = enumerate_slots(budget, identities, prefix, scenarios)
    total = enumerate_cells(slots)
    failed: list[CellResult] = []
    counts = {"cells": 0, "cells_failed": 0, "fault_slots": len(slots), "faults_fired": 0}
    progress(0, total)

    def on_cell(result: CellResult) -> None:
        counts["cells"] += 1
        counts["faults_fired"] += result.hit
        if result.problems:
            counts["cells_failed"] += 1
            failed.append(result)
        progress(counts["cells"], total)

    for index, slot in enumerate(slots):
        run_slot(slot, identities, f"{prefix}s{index}n", on_cell)
    if counts["cells"] != total:
        raise CampaignFailure(f"ran {counts['cells']} cells, the registry enumerates {total}")
    if failed:
        shown = "\n".join(result.describe() for result in failed[:_MAX_REPORTED])
        more = (
            f"\n... and {len(failed) - _MAX_REPORTED} more" if len(failed) > _MAX_REPORTED else ""
        )
        raise CampaignFailure(
            f"{len(failed)} of {counts['cells']} fault cells failed:\n{shown}{more}"
        )
    return counts


def run_crash(budget: str, seed: int, progress: Progress) -> dict[str, int]:
    from . import crash

    return crash.run_crash(budget, seed, progress)


def run_fuzz(budget: str, seed: int, progress: Progress) -> dict[str, int]:
    from . import fuzz

    return fuzz.run_fuzz(budget, seed, progress)


# -- units for `shmring check` --------------------------------------------------------------
#
# A unit is the set of slots of one (scenario, site): `scenario/site`. The
# cells of a unit depend only on the budget and a fault-free baseline run of
# the scenario (run once per process and kept), so a unit runs the same cells
# in any worker or shard. A single cell is a unit too: `scenario/site#N:ERROR:mode`,
# and `scenario/baseline` is the fault-free run; failures name their cell.

BASELINE_UNIT: Final = "baseline"
_baselines: dict[str, dict[str, int]] = {}
_prepared: Identities | None = None


def fault_units() -> list[tuple[str, str]]:
    """(scenario, site) of every unit, in the campaign's order."""
    return [(scenario, site.name) for scenario in SCENARIOS for site in all_sites()]


def is_fault_unit(name: str) -> bool:
    """Whether `name` is `scenario/site`, `scenario/baseline` or `scenario/<plan>`."""
    scenario, _, rest = name.partition("/")
    if scenario not in SCENARIOS or not rest:
        return False
    if rest == BASELINE_UNIT or rest in {site.name for site in all_sites()}:
        return True
    try:
        FaultPlan.parse(rest)
    except ValueError:
        return False
    return True


def _identities_once() -> Identities:
    global _prepared
    if _prepared is None:
        _prepared = _prepare()
    return _prepared


def _scope(seed: int) -> str:
    return f"fi{seed % 10000}x{uuid.uuid4().hex[:6]}"


def run_fault_unit(
    name: str, budget: str, seed: int, progress: Progress
) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """One unit's cells; answers its counts and (cell unit name, report) per failed cell."""
    if budget not in BUDGETS:
        raise ValueError(f"budget must be one of {BUDGETS}: budget={budget!r}")
    if not is_fault_unit(name):
        raise ValueError(f"not a fault unit: {name!r}")
    scenario, _, rest = name.partition("/")
    identities = _identities_once()
    # Another section's unit may have run in this process just before: collect its
    # garbage now, or its descriptors closing mid-cell would read as this cell's doing.
    gc.collect()
    counts = {"cells": 0, "cells_failed": 0, "fault_slots": 0, "faults_fired": 0}
    failed: list[tuple[str, str]] = []

    def on_cell(result: CellResult) -> None:
        counts["cells"] += 1
        counts["faults_fired"] += result.hit
        if result.problems:
            counts["cells_failed"] += 1
            cell = f"{scenario}/{result.plan or BASELINE_UNIT}"
            failed.append((cell, f"[{cell}] " + "; ".join(result.problems)))
        progress(counts["cells"], None)

    if rest == BASELINE_UNIT or "#" in rest:
        plan = None if rest == BASELINE_UNIT else FaultPlan.parse(rest)
        on_cell(run_cell(scenario, plan, identities, _scope(seed)))
        return counts, failed
    if scenario not in _baselines:
        try:
            _baselines[scenario] = baseline(scenario, identities, _scope(seed))
        except CampaignFailure as failure:
            return counts, [(f"{scenario}/{BASELINE_UNIT}", str(failure))]
    calls = _baselines[scenario].get(rest, 0)
    slots = [
        Slot(scenario, rest, error, mode, calls)
        for site in all_sites()
        if site.name == rest and calls
        for mode in MODES
        for error in site.errors_for(mode, ERROR_DEPTH[budget])
    ]
    counts["fault_slots"] = len(slots)
    prefix = _scope(seed)
    for index, slot in enumerate(slots):
        run_slot(slot, identities, f"{prefix}s{index}n", on_cell)
    if counts["cells"] != enumerate_cells(slots):
        failed.append(
            (name, f"ran {counts['cells']} cells, the registry enumerates {enumerate_cells(slots)}")
        )
    return counts, failed


# -- rerunning one cell ------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Rerun one fault cell, or a whole budget.")
    parser.add_argument("--scenario", choices=sorted(SCENARIOS))
    parser.add_argument("--plan", help="site#nth:ERROR:mode, e.g. open#3:ENOSPC:transient")
    parser.add_argument("--budget", choices=BUDGETS, default="quick")
    args = parser.parse_args(argv)
    identities = _prepare()
    logging.getLogger("shmring").setLevel(logging.ERROR)
    if args.scenario:
        plan = FaultPlan.parse(args.plan) if args.plan else None
        result = run_cell(args.scenario, plan, identities, f"fi{uuid.uuid4().hex[:10]}")
        print(f"{args.scenario} {plan}: hit={result.hit}")
        if result.outcome is not None:
            print(f"  outcome: {result.outcome}")
        for problem in result.problems:
            print(f"  PROBLEM: {problem}")
        return 1 if result.problems else 0
    started = time.monotonic()
    counts = run_faults(args.budget, 0, lambda done, total: None)
    print(f"{counts} in {time.monotonic() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
