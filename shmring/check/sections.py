"""The sections of a `shmring check` campaign and the units each splits into.

Design rationale. A campaign is a list of independent sections (the model's
exhaustive exploration, CrossHair on the model's contracts, the lockstep
machines, the fault cells, the crash points, the fuzz cases). A section is
split into *units*: pieces that share nothing, run in any process and in
any order, and answer counts that simply add up (a model system, a lockstep
machine for one derived seed, a (scenario, site) set of fault cells, a crash
point, a fuzz target for one derived seed). Because a unit's work depends
only on (budget, campaign seed, unit name), any number of workers, any shard
of any number of machines, and a merge of their reports give the same counts
as one process would (pytest-xdist's and Hypothesis's split: the scheduler
knows nothing of what a unit does).

A section declares its units with a `SectionUnits` in `UNITS`. A section
that declares none (a function in `RUNNERS` only) is one unit, ``name:all``:
adding a section is adding a line to `SECTIONS` and a runner to `RUNNERS`.
Sections with `rounds` are streams: round r is one more unit per machine or
target with a fresh derived seed, so `--max-seconds` keeps drawing rounds
until the time is spent.

Every failure names the smallest unit that reproduces it (a failed fault
cell its own cell) and the `shmring check ... --unit ID` command that reruns
only that unit. Library logging is captured per unit and counted.
"""

from __future__ import annotations

import hashlib
import importlib
import logging
import math
import os
import re
import shlex
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

BUDGETS = ("quick", "standard", "deep")
SECTIONS = (
    "model",
    "crosshair",
    "lockstep",
    "faults",
    "crash",
    "fuzz",
    "interleavings",
    "interrupts",
)

Progress = Callable[[int, int | None], None]
_MAX_LOG_LINES = 40  # log lines a unit keeps for -v and failure reports (all are counted)


@dataclass(frozen=True)
class SectionResult:
    """What one section did (the sum of its units)."""

    name: str  # one of SECTIONS
    counts: dict[str, int] = field(default_factory=dict)  # what it checked, by kind
    seconds: float = 0.0  # wall time (in-process) or the sum of its units' times (workers)
    failure: str | None = None  # None when everything held; else the report, reproducers included
    units: int = 0  # units run
    logs: int = 0  # log records the library emitted while the section ran (captured)
    failures: tuple[Failure, ...] = ()  # one per reproducible failure


# -- units -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Unit:
    """One independent piece of a section; `id` is what `--unit` takes."""

    section: str  # one of SECTIONS
    name: str  # unique within the section; the runner reads its work from it
    order: tuple[int, ...] = (0,)  # position in the section's canonical order
    cost: float = 1.0  # rough seconds at the quick budget: costly units are started first

    @property
    def id(self) -> str:
        return f"{self.section}:{self.name}"


@dataclass(frozen=True)
class Failure:
    """One broken promise and how to see it again."""

    unit: str  # id of the smallest unit that reproduces it
    message: str  # what broke (Hypothesis's reproducer included where there is one)
    rerun: str  # a `shmring check` command that reruns only `unit`


@dataclass(frozen=True)
class UnitResult:
    """What one unit did; reports keep these so that shards merge exactly."""

    unit: str  # Unit.id
    order: tuple[int, ...]  # (section index, *Unit.order): the canonical order
    counts: dict[str, int]  # additive counts
    seconds: float  # wall time of the unit
    logs: int  # log records captured while it ran
    log_lines: tuple[str, ...]  # the first _MAX_LOG_LINES of them, formatted
    failures: tuple[Failure, ...]  # empty when everything held


class UnitFailed(AssertionError):
    """A unit found failures; it keeps the unit's counts and a reproducer per failure."""

    def __init__(self, counts: dict[str, int], failures: Sequence[tuple[str, str]]) -> None:
        # failures: (name of the smallest unit of the same section, message)
        super().__init__("\n".join(message for _, message in failures))
        self.counts = counts
        self.failures = list(failures)


@dataclass(frozen=True)
class Context:
    """What every unit of one campaign shares."""

    budget: str  # one of BUDGETS
    seed: int  # the campaign seed; units derive their own from it
    database: str | None = None  # Hypothesis example database spec (see open_database)
    program: str = "shmring"  # the command the user ran (`.venv/bin/shmring`): reruns name it


@dataclass(frozen=True)
class SectionUnits:
    """How a section splits into units.

    `units(budget, seed)` lists them; `rounds` (optional) makes the section a
    stream: `round_units(budget, seed, r)` is round r and the budget runs
    `rounds(budget)` of them, `--max-seconds` as many as the time allows.
    `run(unit, context, progress)` does one unit and answers its counts, or
    raises (UnitFailed for failures it can name more finely).
    `accepts(name)` says whether `--unit section:name` names a unit of it
    (default: only the budget's units).
    """

    run: Callable[[Unit, Context, Progress], dict[str, int]]
    units: Callable[[str, int], list[Unit]] | None = None
    round_units: Callable[[str, int, int], list[Unit]] | None = None
    rounds: Callable[[str], int] | None = None
    accepts: Callable[[str], bool] | None = None


def derived_seed(seed: int, *parts: object) -> int:
    """A unit's own seed: depends on the campaign seed and the unit, never on who runs it."""
    text = ":".join(str(part) for part in (seed, *parts))
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:6], "big")


def rerun_command(context: Context, unit_id: str) -> str:
    """The command that reruns only this unit."""
    return (
        f"{context.program} check --budget {context.budget} --seed {context.seed} "
        f"--unit {shlex.quote(unit_id)}"
    )


# -- example database ------------------------------------------------------------------


class DatabaseError(ValueError):
    """`--database` names something that cannot be opened."""


def open_database(spec: str | None) -> Any:
    """Hypothesis's own database for a spec: a directory, ``redis://...``, or None."""
    if spec is None or spec == "none":
        return None
    if spec.startswith(("redis://", "rediss://", "unix://")):
        try:
            import redis
            from hypothesis.extra.redis import RedisExampleDatabase
        except ImportError as error:
            raise DatabaseError(
                f"--database {spec}: the Redis database needs the redis extra "
                f"(pip install 'shmring[redis]', which installs hypothesis[redis]): {error}"
            ) from error
        return RedisExampleDatabase(redis.Redis.from_url(spec))
    from hypothesis.database import DirectoryBasedExampleDatabase

    return DirectoryBasedExampleDatabase(spec)


# -- logging -----------------------------------------------------------------------------


class _Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.count = 0
        self.lines: list[str] = []
        self.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        self.count += 1
        if len(self.lines) < _MAX_LOG_LINES:
            self.lines.append(self.format(record))


@contextmanager
def captured_logs() -> Iterator[_Capture]:
    """Every warning the library (or anything else) logs goes here, not to the terminal."""
    capture = _Capture()
    root = logging.getLogger()
    root.addHandler(capture)
    try:
        yield capture
    finally:
        root.removeHandler(capture)


# -- model: exhaustive bounded exploration -------------------------------------


def _model_systems(budget: str) -> list[tuple[Any, int | None]]:
    from shmring.check import explore

    return explore.ci_systems() if budget != "deep" else explore.long_systems()


def _model_units(budget: str, seed: int) -> list[Unit]:
    # Seconds each took at the quick budget (scheduling only: the longest start first).
    costs = {"ring": 25.0, "connector": 24.0, "deployment": 7.0, "registration": 4.0}
    return [
        Unit("model", system.name, (index,), costs.get(system.name, 10.0))
        for index, (system, _) in enumerate(_model_systems(budget))
    ]


def _run_model_unit(unit: Unit, context: Context, progress: Progress) -> dict[str, int]:
    from shmring.check import explore

    (system, depth), *_ = (
        entry for entry in _model_systems(context.budget) if entry[0].name == unit.name
    )
    progress(0, None)
    report = explore.explore(system, max_depth=depth)
    progress(1, 1)
    return {
        f"{report.system} states": report.states,
        f"{report.system} transitions": report.transitions,
        "states": report.states,
    }


def run_model(
    budget: str, seed: int, progress: Progress, database: str | None = None
) -> dict[str, int]:
    """The whole model section in this process (all its units)."""
    return _run_all("model", Context(budget, seed, database), progress)


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
    # The shared rules of every engine on the ring model, once per engine (issue 23).
    ("shmring.model_tests.engine_machine", "RingEngineMachine", 60, 40),
    ("shmring.model_tests.engine_machine", "ArenaEngineMachine", 40, 40),
)

_SCALE = {"quick": 1, "standard": 4, "deep": 20}
# Each machine's examples are split into this many seeds per budget scale step.
LOCKSTEP_ROUNDS_PER_SCALE = 4


def _short(class_name: str) -> str:
    return class_name.removesuffix("Machine").removesuffix("Lockstep").lower()


# Per-rule statistics in a unit's counts: "rule:<machine>.<rule>" (a rule that
# never fired counts 0). The summary table leaves them out; `--statistics`
# prints them, and the JSON report keeps them (merged shards add them up).
RULE_COUNT_PREFIX = "rule:"


def _counting(
    machine: type[Any], counter: dict[str, int], rules: dict[str, int] | None = None
) -> type[Any]:
    """A subclass that counts examples and steps (invariants run after every step),
    and into `rules` how often each rule (and initialize rule) ran."""
    from hypothesis.stateful import invariant

    class Counted(machine):  # type: ignore[misc, valid-type]
        @invariant()
        def _count_step(self) -> None:
            counter["steps"] += 1

        def teardown(self) -> None:
            counter["examples"] += 1
            counter["steps"] -= 1  # the invariant also ran once after initialisation
            super().teardown()

    if rules is not None:
        for name, method in _counted_rules(machine, rules).items():
            setattr(Counted, name, method)
    Counted.__name__ = machine.__name__
    Counted.__qualname__ = machine.__qualname__
    return Counted


def _counted_rules(machine: type[Any], rules: dict[str, int]) -> dict[str, Any]:
    """Each rule of `machine` again, counting its calls into `rules[name]`.

    Hypothesis finds a rule by the `Rule` record its decorator leaves on the
    method (`hypothesis.stateful.RULE_MARKER`, with arguments, targets and
    preconditions); the counted method carries a copy naming itself, so the
    rule draws, prints and shrinks as before (the pinned Hypothesis; an
    unknown record shape counts nothing rather than fail the campaign).
    """
    import dataclasses
    import functools
    import inspect

    from hypothesis import stateful

    markers = [
        getattr(stateful, "RULE_MARKER", None),
        getattr(stateful, "INITIALIZE_RULE_MARKER", None),
    ]
    counted: dict[str, Any] = {}
    for name, method in inspect.getmembers(machine, inspect.isfunction):
        for marker in markers:
            record = getattr(method, marker, None) if marker else None
            if record is None or not dataclasses.is_dataclass(record):
                continue
            rules.setdefault(name, 0)

            def make(original: Any, key: str) -> Any:
                @functools.wraps(original)
                def run(self: Any, *args: Any, **kwargs: Any) -> Any:
                    rules[key] += 1
                    return original(self, *args, **kwargs)

                return run

            wrapper = make(record.function, name)
            try:
                copy = dataclasses.replace(record, function=wrapper)
            except (TypeError, ValueError):
                rules.pop(name, None)
                continue
            setattr(wrapper, marker, copy)
            counted[name] = wrapper
    return counted


def _lockstep_rounds(budget: str) -> int:
    return LOCKSTEP_ROUNDS_PER_SCALE * _SCALE[budget]


# Seconds one round of each machine took at the quick budget (scheduling only).
_LOCKSTEP_COSTS = {
    "restart": 0.5,
    "driver": 0.5,
    "arena": 0.5,
    "ringengine": 0.5,
    "arenaengine": 0.5,
}


def _lockstep_round(budget: str, seed: int, round_: int) -> list[Unit]:
    units = []
    for index, (_, class_name, _, _) in enumerate(LOCKSTEP_MACHINES):
        short = _short(class_name)
        cost = _LOCKSTEP_COSTS.get(short, 1.0)
        units.append(Unit("lockstep", f"{short}/{round_}", (round_, index), cost))
    return units


def _lockstep_machine(short: str) -> tuple[str, str, int, int]:
    for entry in LOCKSTEP_MACHINES:
        if _short(entry[1]) == short:
            return entry
    raise ValueError(f"no lockstep machine {short!r}")


def _accepts_round_name(known: Callable[[str], object]) -> Callable[[str], bool]:
    def accepts(name: str) -> bool:
        head, _, round_ = name.rpartition("/")
        try:
            known(head)
        except (ValueError, KeyError):
            return False
        return round_.isdigit()

    return accepts


def _run_lockstep_unit(unit: Unit, context: Context, progress: Progress) -> dict[str, int]:
    from hypothesis import HealthCheck, Phase, settings
    from hypothesis import seed as hypothesis_seed
    from hypothesis.stateful import run_state_machine_as_test

    from shmring.fault_injection.kit.machines import bounded_shrinking

    short, _, round_ = unit.name.rpartition("/")
    module_name, class_name, examples, steps = _lockstep_machine(short)
    machine = getattr(importlib.import_module(module_name), class_name)
    counter = {"steps": 0, "examples": 0}
    rules: dict[str, int] = {}
    counted = hypothesis_seed(derived_seed(context.seed, "lockstep", short, int(round_)))(
        _counting(machine, counter, rules)
    )
    chosen = settings(
        max_examples=math.ceil(examples / LOCKSTEP_ROUNDS_PER_SCALE),
        stateful_step_count=steps,
        deadline=None,
        derandomize=False,
        database=open_database(context.database),
        suppress_health_check=list(HealthCheck),
        phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink],
        print_blob=True,
    )
    progress(0, None)
    with bounded_shrinking():  # a cut shrink says so in the failure's notes
        run_state_machine_as_test(counted, settings=chosen)
    progress(1, 1)
    return {
        f"{short} steps": counter["steps"],
        f"{short} examples": counter["examples"],
        "steps": counter["steps"],
        "examples": counter["examples"],
        **{f"{RULE_COUNT_PREFIX}{short}.{name}": count for name, count in sorted(rules.items())},
    }


def run_lockstep(
    budget: str, seed: int, progress: Progress, database: str | None = None
) -> dict[str, int]:
    """The whole lockstep section in this process (all its units)."""
    return _run_all("lockstep", Context(budget, seed, database), progress)


# -- faults, crash, fuzz: shmring.fault_injection ------------------------------


def _faults_units(budget: str, seed: int) -> list[Unit]:
    from shmring.fault_injection import fault_cells

    return [
        Unit("faults", f"{scenario}/{site}", (index,), 0.5)
        for index, (scenario, site) in enumerate(fault_cells.fault_units())
    ]


def _faults_accepts(name: str) -> bool:
    from shmring.fault_injection import fault_cells

    return fault_cells.is_fault_unit(name)


def _run_faults_unit(unit: Unit, context: Context, progress: Progress) -> dict[str, int]:
    from shmring.fault_injection import fault_cells

    counts, failed = fault_cells.run_fault_unit(unit.name, context.budget, context.seed, progress)
    if failed:
        raise UnitFailed(counts, failed)
    return counts


def _crash_units(budget: str, seed: int) -> list[Unit]:
    from shmring.fault_injection import crash

    return [
        Unit("crash", crash.cell_name(cell), (index,), 0.1)
        for index, cell in enumerate(crash.enumerate_crash_cells(budget, seed))
    ]


def _crash_accepts(name: str) -> bool:
    from shmring.fault_injection import crash

    try:
        crash.parse_cell_name(name)
    except ValueError:
        return False
    return True


def _run_crash_unit(unit: Unit, context: Context, progress: Progress) -> dict[str, int]:
    from shmring.fault_injection import crash

    cell = crash.parse_cell_name(unit.name)
    progress(0, 1)
    try:
        crash.run_crash_cell(cell, f"cr{context.seed % 10000}x{os.urandom(4).hex()}")
    except Exception as error:  # noqa: BLE001 - every failure is reported with its rerun
        text = "".join(traceback.format_exception(error))
        raise UnitFailed({"crash_points": 1, "crash_failed": 1}, [(unit.name, text)]) from error
    finally:
        progress(1, 1)
    return {"crash_points": 1, "crash_failed": 0}


# Rounds of every fuzz target per budget; the budget's cases are spread over them.
FUZZ_ROUNDS = {"quick": 3, "standard": 12, "deep": 40}
FORGED_UNIT = "forged"
_FUZZ_COSTS = {"codec": 0.5}  # seconds a round took at quick (others about 0.1)


def _fuzz_cases(budget: str, target: str) -> int:
    from shmring.fault_injection import fuzz

    return math.ceil(fuzz.BUDGET_CASES[budget][target] / FUZZ_ROUNDS[budget])


def _fuzz_round(budget: str, seed: int, round_: int) -> list[Unit]:
    from shmring.fault_injection import fuzz

    units = [
        Unit("fuzz", f"{target}/{round_}", (round_, index), _FUZZ_COSTS.get(target, 0.1))
        for index, target in enumerate(fuzz.TARGETS)
    ]
    if round_ == 0:
        units.append(Unit("fuzz", FORGED_UNIT, (0, len(units)), 0.1))
    return units


def _fuzz_target(name: str) -> str:
    from shmring.fault_injection import fuzz

    if name not in fuzz.TARGETS:
        raise ValueError(f"no fuzz target {name!r}")
    return name


def _fuzz_accepts(name: str) -> bool:
    return name == FORGED_UNIT or _accepts_round_name(_fuzz_target)(name)


def _run_fuzz_unit(unit: Unit, context: Context, progress: Progress) -> dict[str, int]:
    from shmring.fault_injection import fuzz

    if unit.name == FORGED_UNIT:
        return {"forged_cases": fuzz.forged_battery(f"fb{os.urandom(4).hex()}")}
    target, _, round_ = unit.name.rpartition("/")
    cases = _fuzz_cases(context.budget, target)
    done = 0

    def count() -> None:
        nonlocal done
        done += 1
        if done % 10 == 0:
            progress(done, cases)

    fuzz.TARGETS[target](cases, derived_seed(context.seed, "fuzz", target, int(round_)), count)
    return {f"fuzz {target}": done, "fuzz_cases": done}


def _fault_entry(name: str) -> Callable[..., dict[str, int]]:
    module = importlib.import_module("shmring.fault_injection.fault_cells")
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


INTERRUPT_STORM_SECONDS = {"quick": 3.0, "standard": 10.0, "deep": 60.0}


def run_interrupts(
    budget: str, seed: int, progress: Progress, database: str | None = None
) -> dict[str, int]:
    """The interrupt storm (issue 24): a handler raising inside put/get; `interrupts.run_storm`."""
    import uuid

    from shmring.fault_injection.interrupts import run_storm

    report = run_storm(
        f"ck{uuid.uuid4().hex[:10]}", INTERRUPT_STORM_SECONDS[budget], derived_seed(seed, "storm")
    )
    progress(1, 1)
    problems = []
    if report.untyped or report.typed or report.close_errors:
        problems.append(
            f"errors: untyped={report.untyped} typed={report.typed} "
            f"close={report.close_errors} samples={report.untyped_samples}"
        )
    if report.wrong or not report.after_ok:
        problems.append(f"wrong data={report.wrong} after_ok={report.after_ok}")
    if report.files_left:
        problems.append(f"files left after close: {report.left_kinds} ({report.left_samples})")
    if report.fds_left:
        problems.append(f"descriptors left open after close: {report.fd_kinds}")
    if problems:
        raise AssertionError("interrupt storm: " + "; ".join(problems))
    return {
        "interrupts": report.interrupts,
        "interrupted puts": report.interrupted_puts,
        "interrupted gets": report.interrupted_gets,
    }


# Sections that declare no units below run as one unit through these.
RUNNERS: dict[str, Callable[[str, int, Progress, str | None], dict[str, int]]] = {
    "model": run_model,
    "crosshair": run_crosshair,
    "lockstep": run_lockstep,
    "faults": run_faults,
    "crash": run_crash,
    "fuzz": run_fuzz,
    "interleavings": run_interleavings,
    "interrupts": run_interrupts,
}

UNITS: dict[str, SectionUnits] = {
    "model": SectionUnits(_run_model_unit, units=_model_units),
    "lockstep": SectionUnits(
        _run_lockstep_unit,
        round_units=_lockstep_round,
        rounds=_lockstep_rounds,
        accepts=_accepts_round_name(_lockstep_machine),
    ),
    "faults": SectionUnits(_run_faults_unit, units=_faults_units, accepts=_faults_accepts),
    "crash": SectionUnits(_run_crash_unit, units=_crash_units, accepts=_crash_accepts),
    "fuzz": SectionUnits(
        _run_fuzz_unit,
        round_units=_fuzz_round,
        rounds=lambda budget: FUZZ_ROUNDS[budget],
        accepts=_fuzz_accepts,
    ),
}

SINGLE_UNIT = "all"
_SINGLE_COSTS = {"crosshair": 6.0}


def section_units(name: str) -> SectionUnits:
    """A section's declaration; a section with a runner only is one unit, `name:all`."""
    if name in UNITS:
        return UNITS[name]
    if name not in RUNNERS:
        raise ValueError(f"unknown section {name!r}")

    def run(unit: Unit, context: Context, progress: Progress) -> dict[str, int]:
        return RUNNERS[name](context.budget, context.seed, progress, context.database)

    def units(budget: str, seed: int) -> list[Unit]:
        return [Unit(name, SINGLE_UNIT, (0,), _SINGLE_COSTS.get(name, 30.0))]

    return SectionUnits(run, units=units)


def is_stream(name: str) -> bool:
    """Whether a section draws more rounds under --max-seconds."""
    return section_units(name).round_units is not None


def budget_units(name: str, budget: str, seed: int) -> list[Unit]:
    """The units the budget runs for a section, in canonical order."""
    declared = section_units(name)
    if declared.round_units is not None:
        assert declared.rounds is not None, name
        return [
            unit
            for round_ in range(declared.rounds(budget))
            for unit in declared.round_units(budget, seed, round_)
        ]
    assert declared.units is not None, name
    return declared.units(budget, seed)


def stream_round(name: str, budget: str, seed: int, round_: int) -> list[Unit]:
    declared = section_units(name)
    assert declared.round_units is not None, name
    return declared.round_units(budget, seed, round_)


def resolve_unit(unit_id: str, budget: str, seed: int) -> Unit:
    """The Unit a `--unit` id names; ValueError when no section has it."""
    section, _, name = unit_id.partition(":")
    if section not in SECTIONS or not name:
        raise ValueError(f"not a unit id (section:name, section one of {SECTIONS}): {unit_id!r}")
    for unit in budget_units(section, budget, seed):
        if unit.name == name:
            return unit
    declared = section_units(section)
    if declared.accepts is not None and declared.accepts(name):
        return Unit(section, name, (10**9,))
    raise ValueError(f"section {section} has no unit {name!r} at budget {budget}")


# -- running units -----------------------------------------------------------------------


def run_unit(unit: Unit, context: Context, progress: Progress | None = None) -> UnitResult:
    """Run one unit with its logging captured; never raises for a failed check."""
    # Verify the section and budget are known
    assert unit.section in SECTIONS, unit.section
    assert context.budget in BUDGETS, context.budget
    declared = section_units(unit.section)
    order = (SECTIONS.index(unit.section), *unit.order)
    started = time.perf_counter()
    failures: list[Failure] = []
    counts: dict[str, int] = {}
    with captured_logs() as capture:
        try:
            counts = declared.run(unit, context, progress or (lambda done, total: None))
        except UnitFailed as failed:
            counts = failed.counts
            for name, message in failed.failures:
                unit_id = f"{unit.section}:{name}"
                failures.append(Failure(unit_id, message, rerun_command(context, unit_id)))
        except Exception as error:  # a failed check, or a crash of the unit itself
            text = "".join(traceback.format_exception(error))
            failures.append(Failure(unit.id, text, rerun_command(context, unit.id)))
    if failures and capture.lines:
        logged = "\n".join(f"    {line}" for line in capture.lines)
        tail = f"\n  logged while it ran ({capture.count} records):\n{logged}"
        failures = [Failure(f.unit, f.message + tail, f.rerun) for f in failures]
    return UnitResult(
        unit.id,
        order,
        counts,
        time.perf_counter() - started,
        capture.count,
        tuple(capture.lines),
        tuple(failures),
    )


# Modules units of a section import on first use; imported once before the
# workers fork, they are shared (copy-on-write) instead of imported per worker.
_PRELOAD = {
    "lockstep": ("hypothesis", "shmring.impl.connector", "torch"),
    "faults": ("shmring.fault_injection.fault_cells", "torch"),
    "crash": ("shmring.fault_injection.crash",),
    "fuzz": ("shmring.fault_injection.fuzz", "torch"),
}


def preload(sections: Sequence[str]) -> None:
    """Import what the sections' units will need, in this process (before forking workers)."""
    for name in dict.fromkeys(
        module for section in sections for module in _PRELOAD.get(section, ())
    ):
        importlib.import_module(name)


def run_unit_in_worker(args: tuple[Unit, Context]) -> UnitResult:
    """Entry point for `--workers`: one unit in a worker process, no progress."""
    unit, context = args
    os.environ.setdefault("SHMRING_CAMPAIGN_WORKER", "1")
    return run_unit(unit, context)


def summarise(
    name: str, results: Sequence[UnitResult], seconds: float | None = None
) -> SectionResult:
    """Add a section's unit results up, in canonical order (so any split sums the same)."""
    ordered = sorted(results, key=lambda result: result.order)
    counts: dict[str, int] = {}
    for result in ordered:
        for key, value in result.counts.items():
            counts[key] = counts.get(key, 0) + value
    failures = tuple(failure for result in ordered for failure in result.failures)
    text = None
    if failures:
        text = "\n".join(
            f"[{failure.unit}] {failure.message.rstrip()}\n    rerun: {failure.rerun}"
            for failure in failures
        )
    return SectionResult(
        name,
        counts,
        seconds if seconds is not None else sum(result.seconds for result in ordered),
        text,
        len(ordered),
        sum(result.logs for result in ordered),
        failures,
    )


def _run_all(name: str, context: Context, progress: Progress) -> dict[str, int]:
    """A section's budget units in this process; raises on the first failed unit's report."""
    units = budget_units(name, context.budget, context.seed)
    results = []
    progress(0, len(units))
    for index, unit in enumerate(units):
        results.append(run_unit(unit, context))
        progress(index + 1, len(units))
    section = summarise(name, results)
    if section.failure is not None:
        raise AssertionError(section.failure)
    return section.counts


def run_section(
    name: str,
    budget: str,
    seed: int,
    database: str | None = None,
    progress: Progress | None = None,
) -> SectionResult:
    """Run every unit of one section at a budget in this process."""
    # Verify the section and budget are known
    assert name in SECTIONS, name
    assert budget in BUDGETS, budget
    context = Context(budget, seed, database)
    units = budget_units(name, budget, seed)
    report = progress or (lambda done, total: None)
    started = time.perf_counter()
    results = []
    report(0, len(units))
    for index, unit in enumerate(units):
        results.append(run_unit(unit, context))
        report(index + 1, len(units))
    return summarise(name, results, time.perf_counter() - started)
