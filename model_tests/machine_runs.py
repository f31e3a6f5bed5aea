"""Running a lockstep machine once and keeping what it reached.

Each lockstep test module runs its machine once per profile (a module-scoped
fixture) and asks two things of the run: did model and implementation ever
disagree, and was every labelled state reached. Each machine module counts
its labels and steps in its `TALLY` (the kit's `lockstep.Tally`); this module
clears and reads it.

The run happens with the objects that existed before it frozen (`gc.freeze`):
they are not garbage the run makes, and in a process that has imported torch
and numpy (~270,000 objects; the suite's has more) each of the run's two or three full
collections otherwise walked all of them, ~0.25 s apiece, ~0.5 s of a 4 s
ring-ci run (docs/performance.md, "Issue 13: lockstep steps/s, measured").
Reference counting still frees them; only the cycle collector skips them
until the run ends.
"""

from __future__ import annotations

import contextlib
import gc
import time
from collections import Counter
from dataclasses import dataclass
from types import ModuleType

from hypothesis import seed, settings
from hypothesis.stateful import RuleBasedStateMachine, run_state_machine_as_test

from ..fault_injection.kit.processes import watchdog


@dataclass(frozen=True)
class MachineRun:
    events: Counter[str]  # labelled states reached, with counts
    steps: int  # rules run
    seconds: float  # wall time of the run
    cpu_seconds: float  # CPU time of this process during the run (time.process_time)
    error: BaseException | None  # what the run raised, if anything


def run_machine(
    module: ModuleType,
    machine: type[RuleBasedStateMachine],
    profile: str,
    watchdog_seconds: float | None = None,
) -> MachineRun:
    """Run `machine` under the named settings profile; never raises (the run records it)."""
    tally = module.TALLY
    tally.clear()
    guard = watchdog(watchdog_seconds) if watchdog_seconds else contextlib.nullcontext()
    freeze = gc.get_freeze_count() == 0  # someone else's freeze is theirs to undo
    started, cpu_started = time.perf_counter(), time.process_time()
    error: BaseException | None = None
    try:
        if freeze:
            gc.freeze()
        with guard:
            run_state_machine_as_test(machine, settings=settings.get_profile(profile))
    except BaseException as raised:  # reported by the caller's tests
        error = raised
    finally:
        if freeze:
            gc.unfreeze()
    seconds = time.perf_counter() - started
    cpu_seconds = time.process_time() - cpu_started
    return MachineRun(Counter(tally.events), sum(tally.steps.values()), seconds, cpu_seconds, error)


# Seeds of the further runs `missing_labels` makes when the profile's own run
# left a label unreached (a fixed set: a failure names the run to repeat).
FURTHER_SEEDS = (1, 2, 3, 4)


def missing_labels(
    module: ModuleType,
    machine: type[RuleBasedStateMachine],
    profile: str,
    labels: tuple[str, ...],
    run: MachineRun,
    watchdog_seconds: float | None = None,
) -> tuple[list[str], Counter[str]]:
    """The labels neither `run` nor up to `FURTHER_SEEDS` more runs of `profile` reached.

    Which examples a derandomized run draws depends on more than the
    profile: Hypothesis seeds it from the machine's source and mixes in the
    literals of every local module the process has imported, so one run's
    coverage moves with unrelated edits and with which test files ran
    first (in 12 seeds of "connector-ci", 6 left some label unreached; each
    of the 6 reached every label with one further run). A label is missing only
    if no run reaches it; a reachable label is then missed by chance with
    the product of the runs' miss rates, an unreachable one always. The
    further runs are lockstep runs like any other: one that disagrees with
    the model raises here. Answers (missing, the events of all runs).
    """
    events = Counter(run.events)
    for number in FURTHER_SEEDS:
        missing = [label for label in labels if events[label] == 0]
        if not missing:
            break
        seeded = seed(number)(type(f"{machine.__name__}Seed{number}", (machine,), {}))
        further = run_machine(module, seeded, profile, watchdog_seconds)
        if further.error is not None:
            raise further.error
        events.update(further.events)
    return [label for label in labels if events[label] == 0], events


def report(name: str, run: MachineRun) -> None:
    """Re-raise the run's failure, else print its step rate and events (-s shows them)."""
    if run.error is not None:
        raise run.error
    print(
        f"\n{name}: {run.steps} steps in {run.seconds:.1f} s "
        f"({run.steps / run.seconds:.0f} steps/s, {run.steps / run.cpu_seconds:.0f} per CPU second); "
        f"events {dict(run.events)}"
    )
