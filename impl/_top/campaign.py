"""The sections of a `shmring check` campaign, each runnable on its own.

Design rationale. A campaign is a list of independent sections (the model's
exhaustive exploration, CrossHair on the model's contracts, the lockstep
machines, the fault cells, the crash points, the fuzz cases). Each section
is one function that takes the budget and the seed, reports progress, and
answers counts; a failure is an exception whose message is the reproducer.
Sections share nothing, so `--workers N` can run them in separate processes
and a failure in one does not hide the counts of the others.
"""

from __future__ import annotations

import importlib
import os
import re
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

BUDGETS = ("quick", "standard", "deep")
SECTIONS = ("model", "crosshair", "lockstep", "faults", "crash", "fuzz", "interleavings")

Progress = Callable[[int, int | None], None]


@dataclass(frozen=True)
class SectionResult:
    """What one section did."""

    name: str  # one of SECTIONS
    counts: dict[str, int] = field(default_factory=dict)  # what it checked, by kind
    seconds: float = 0.0  # wall time
    failure: str | None = None  # None when everything held; else the report, reproducer included


# -- model: exhaustive bounded exploration -------------------------------------


def run_model(
    budget: str, seed: int, progress: Progress, database: str | None = None
) -> dict[str, int]:
    from shmring.spec import explore

    systems = explore.ci_systems() if budget != "deep" else explore.long_systems()
    counts: dict[str, int] = {}
    total_states = 0
    for index, (system, depth) in enumerate(systems):
        report = explore.explore(
            system,
            max_depth=depth,
            progress=lambda states, transitions, index=index: progress(index, len(systems)),
        )
        counts[f"{report.system} states"] = report.states
        counts[f"{report.system} transitions"] = report.transitions
        total_states += report.states
        progress(index + 1, len(systems))
    counts["states"] = total_states
    return counts


# -- crosshair: the model's contracts ------------------------------------------

_CROSSHAIR_LINE = re.compile(r":(\d+): (info|error): (.*)$")


def run_crosshair(
    budget: str, seed: int, progress: Progress, database: str | None = None
) -> dict[str, int]:
    """Run CrossHair over spec.contracts; every contract confirmed or at least unrefuted."""
    import inspect

    from shmring.spec import contracts

    per_condition = {"quick": 8, "standard": 20, "deep": 60}[budget]
    by_line = {inspect.getsourcelines(fn)[1]: fn.__name__ for fn in contracts.CONTRACTS}
    progress(0, None)
    command = [
        sys.executable,
        "-m",
        "crosshair",
        "check",
        "--analysis_kind=asserts",
        "--report_all",
        f"--per_condition_timeout={per_condition}",
        "shmring.spec.contracts",
    ]
    budget_s = per_condition * len(by_line) * 3 + 120
    done = subprocess.run(command, capture_output=True, text=True, timeout=budget_s)
    verdicts: dict[str, str] = {}
    for match in map(_CROSSHAIR_LINE.search, done.stdout.splitlines()):
        if match is not None:
            line, kind, text = match.groups()
            name = by_line.get(int(line), f"line {line}")
            verdicts[name] = "error: " + text if kind == "error" else text
    missing = sorted(set(by_line.values()) - set(verdicts))
    failures = [f"{name}: {text}" for name, text in verdicts.items() if text.startswith("error")]
    if missing or failures or done.returncode not in (0, 1):
        detail = "\n".join(failures + [f"{name}: no verdict" for name in missing])
        raise AssertionError(
            f"CrossHair did not clear every contract:\n{detail}\n{done.stderr[-2000:]}"
        )
    confirmed = sum(1 for text in verdicts.values() if "Confirmed over all paths" in text)
    progress(len(by_line), len(by_line))
    return {
        "contracts": len(by_line),
        "confirmed": confirmed,
        "unrefuted within budget": len(by_line) - confirmed,
    }


# -- lockstep: model next to implementation ------------------------------------

# (module, class, quick examples, quick steps); standard x4 examples, deep x20.
LOCKSTEP_MACHINES: tuple[tuple[str, str, int, int], ...] = (
    ("shmring.model_tests.ring_machine", "RingLockstepMachine", 100, 50),
    ("shmring.model_tests.connector_machine", "ConnectorLockstepMachine", 80, 40),
    ("shmring.model_tests.discovery_machine", "DiscoveryLockstepMachine", 20, 25),
    ("shmring.model_tests.discovery_machine", "RestartLockstepMachine", 10, 25),
    ("shmring.model_tests.registration_machine", "DriverMachine", 80, 40),
    ("shmring.model_tests.registration_machine", "RegistryMachine", 80, 40),
    ("shmring.model_tests.arena_machine", "ArenaMachine", 30, 30),
)

_SCALE = {"quick": 1, "standard": 4, "deep": 20}


def _counting(machine: type[Any], counter: dict[str, int]) -> type[Any]:
    """A subclass that counts examples and steps (invariants run after every step)."""
    from hypothesis.stateful import invariant

    class Counted(machine):  # type: ignore[misc, valid-type]
        @invariant()
        def _count_step(self) -> None:
            counter["steps"] += 1

        def teardown(self) -> None:
            counter["examples"] += 1
            counter["steps"] -= 1  # the invariant also ran once after initialisation
            super().teardown()

    Counted.__name__ = machine.__name__
    Counted.__qualname__ = machine.__qualname__
    return Counted


def run_lockstep(
    budget: str, seed: int, progress: Progress, database: str | None = None
) -> dict[str, int]:
    from hypothesis import HealthCheck, Phase, settings
    from hypothesis import seed as hypothesis_seed
    from hypothesis.database import DirectoryBasedExampleDatabase
    from hypothesis.stateful import run_state_machine_as_test

    counts: dict[str, int] = {}
    scale = _SCALE[budget]
    db = DirectoryBasedExampleDatabase(database) if database else None
    for index, (module_name, class_name, examples, steps) in enumerate(LOCKSTEP_MACHINES):
        progress(index, len(LOCKSTEP_MACHINES))
        machine = getattr(importlib.import_module(module_name), class_name)
        counter = {"steps": 0, "examples": 0}
        counted = hypothesis_seed(seed)(_counting(machine, counter))
        chosen = settings(
            max_examples=examples * scale,
            stateful_step_count=steps,
            deadline=None,
            derandomize=False,
            database=db,
            suppress_health_check=list(HealthCheck),
            phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink],
            print_blob=True,
        )
        started = time.perf_counter()
        run_state_machine_as_test(counted, settings=chosen)
        elapsed = time.perf_counter() - started
        short = class_name.removesuffix("Machine").removesuffix("Lockstep").lower()
        counts[f"{short} steps"] = counter["steps"]
        counts[f"{short} steps/s"] = int(counter["steps"] / elapsed) if elapsed > 0 else 0
    progress(len(LOCKSTEP_MACHINES), len(LOCKSTEP_MACHINES))
    counts["steps"] = sum(v for k, v in counts.items() if k.endswith(" steps"))
    return counts


# -- faults, crash, fuzz: shmring.fault_injection ------------------------------


def _fault_entry(name: str) -> Callable[..., dict[str, int]]:
    module = importlib.import_module("shmring.fault_injection.campaign")
    entry: Callable[..., dict[str, int]] = getattr(module, f"run_{name}")
    return entry


def run_faults(
    budget: str, seed: int, progress: Progress, database: str | None = None
) -> dict[str, int]:
    return _fault_entry("faults")(budget, seed, progress)


def run_crash(
    budget: str, seed: int, progress: Progress, database: str | None = None
) -> dict[str, int]:
    return _fault_entry("crash")(budget, seed, progress)


def run_fuzz(
    budget: str, seed: int, progress: Progress, database: str | None = None
) -> dict[str, int]:
    return _fault_entry("fuzz")(budget, seed, progress)


def run_interleavings(
    budget: str, seed: int, progress: Progress, database: str | None = None
) -> dict[str, int]:
    from shmring.fault_injection.interleave import run_interleavings as run

    return run(budget, seed, progress)


RUNNERS: dict[str, Callable[[str, int, Progress, str | None], dict[str, int]]] = {
    "model": run_model,
    "crosshair": run_crosshair,
    "lockstep": run_lockstep,
    "faults": run_faults,
    "crash": run_crash,
    "fuzz": run_fuzz,
    "interleavings": run_interleavings,
}


def run_section(
    name: str,
    budget: str,
    seed: int,
    database: str | None = None,
    progress: Progress | None = None,
) -> SectionResult:
    """Run one section; never raises for a failed check (the result says so)."""
    # Verify the section and budget are known
    assert name in RUNNERS, name
    assert budget in BUDGETS, budget
    started = time.perf_counter()
    try:
        counts = RUNNERS[name](budget, seed, progress or (lambda done, total: None), database)
    except Exception as error:  # a failed check, or a crash of the section itself
        text = "".join(traceback.format_exception(error))
        return SectionResult(name, {}, time.perf_counter() - started, text)
    return SectionResult(name, counts, time.perf_counter() - started, None)


def run_section_in_worker(args: tuple[str, str, int, str | None]) -> SectionResult:
    """Entry point for `--workers`: one section in a worker process, no progress."""
    name, budget, seed, database = args
    os.environ.setdefault("SHMRING_CAMPAIGN_WORKER", "1")
    return run_section(name, budget, seed, database)
