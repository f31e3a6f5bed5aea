"""Running a campaign's units: on N workers, as shard K of N, for a time budget; and merging.

Design rationale. The scheduler knows units, never what they do
(`shmring.check.sections` says that). One machine runs its units on `--workers`
processes, costly units first (longest-processing-time order), so a long
unit does not start last and bound the run. A fleet is any batch system
running `--shard K/N` on N machines: the partition is a pure function of
the unit list and the costs written in the code, so every machine computes
the same partition and nothing runs twice; `merge` adds the shards' unit
results back up in canonical order, which is why a merged report equals the
unsharded one. `--max-seconds` keeps drawing rounds of the stream sections
(lockstep, fuzz) after the fixed units, until the time is spent.
"""

from __future__ import annotations

import fnmatch
import json
import multiprocessing
import signal
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import asdict, dataclass
from typing import Any

from shmring.check.sections import (
    SECTIONS,
    Context,
    Failure,
    SectionResult,
    Unit,
    UnitResult,
    budget_units,
    is_stream,
    preload,
    rerun_command,
    resolve_unit,
    run_unit,
    run_unit_in_worker,
    stream_round,
    summarise,
)

REPORT_FORMAT = 2


@dataclass(frozen=True)
class Shard:
    """Shard `index` of `count` (1-based, as Slurm array indices and `--shard 1/4` read)."""

    index: int
    count: int

    @classmethod
    def parse(cls, text: str) -> Shard:
        try:
            index, count = (int(part) for part in text.split("/"))
        except ValueError:
            raise ValueError(f"a shard is K/N with 1 <= K <= N: shard={text!r}") from None
        if not 1 <= index <= count:
            raise ValueError(f"a shard is K/N with 1 <= K <= N: shard={text!r}")
        return cls(index, count)

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


def partition(units: Sequence[Unit], count: int) -> list[list[Unit]]:
    """Split units into `count` lists of about equal cost; deterministic (ties: canonical order)."""
    shards: list[list[Unit]] = [[] for _ in range(count)]
    loads = [0.0] * count
    canonical = sorted(units, key=_canonical)
    for unit in sorted(canonical, key=lambda unit: -unit.cost):
        lightest = min(range(count), key=lambda index: (loads[index], index))
        shards[lightest].append(unit)
        loads[lightest] += unit.cost
    return [sorted(shard, key=_canonical) for shard in shards]


def _canonical(unit: Unit) -> tuple[int, ...]:
    return (SECTIONS.index(unit.section), *unit.order)


@dataclass(frozen=True)
class Plan:
    """What this process runs."""

    context: Context
    sections: tuple[str, ...]  # sections asked for, in campaign order
    units: tuple[Unit, ...]  # the fixed units of this shard
    streams: tuple[str, ...]  # sections that draw rounds while time is left (--max-seconds)
    max_seconds: float | None = None
    shard: Shard | None = None


def make_plan(
    context: Context,
    sections: Sequence[str],
    *,
    unit_patterns: Sequence[str] = (),
    max_seconds: float | None = None,
    shard: Shard | None = None,
) -> Plan:
    """The units of a campaign; ValueError for a `--unit` that names nothing."""
    if unit_patterns:
        chosen: dict[str, Unit] = {}
        for pattern in unit_patterns:
            matched = _match(pattern, context)
            if not matched:
                raise ValueError(f"--unit {pattern!r} names no unit at budget {context.budget}")
            chosen.update((unit.id, unit) for unit in matched)
        units = list(chosen.values())
        sections = [name for name in SECTIONS if any(unit.section == name for unit in units)]
        streams: list[str] = []
    else:
        sections = [name for name in SECTIONS if name in sections]
        streams = [name for name in sections if max_seconds is not None and is_stream(name)]
        units = []
        for name in sections:
            if name in streams:
                units += stream_round(name, context.budget, context.seed, 0)
            else:
                units += budget_units(name, context.budget, context.seed)
    if shard is not None:
        units = partition(units, shard.count)[shard.index - 1]
    return Plan(
        context,
        tuple(sections),
        tuple(sorted(units, key=_canonical)),
        tuple(streams),
        max_seconds,
        shard,
    )


def _match(pattern: str, context: Context) -> list[Unit]:
    section = pattern.partition(":")[0]
    if section in SECTIONS and any(char in pattern for char in "*?["):
        return [
            unit
            for unit in budget_units(section, context.budget, context.seed)
            if fnmatch.fnmatchcase(unit.id, pattern)
        ]
    return [resolve_unit(pattern, context.budget, context.seed)]


def _stream_units(plan: Plan) -> Iterator[Unit]:
    """Rounds 1, 2, ... of every stream section, this shard's share, interleaved by round."""
    positions = dict.fromkeys(plan.streams, 0)
    if plan.shard is not None:  # round 0 was partitioned with the fixed units
        for name in plan.streams:
            positions[name] = len(stream_round(name, plan.context.budget, plan.context.seed, 0))
    round_ = 1
    while plan.streams:
        for name in plan.streams:
            for unit in stream_round(name, plan.context.budget, plan.context.seed, round_):
                position = positions[name]
                positions[name] += 1
                if plan.shard is None or position % plan.shard.count == plan.shard.index - 1:
                    yield unit
        round_ += 1


Listener = Callable[
    [Unit, "UnitResult | None", float], None
]  # (unit, result or None: started, fraction)


def execute(plan: Plan, workers: int, listener: Listener | None = None) -> list[UnitResult]:
    """Run the plan's units (costly first), then stream rounds until the deadline."""
    notify = listener or (lambda unit, result, fraction: None)
    started = time.monotonic()
    deadline = None if plan.max_seconds is None else started + plan.max_seconds
    fixed = sorted(plan.units, key=lambda unit: (-unit.cost, _canonical(unit)))
    more = _stream_units(plan)

    def next_unit() -> Unit | None:
        if fixed:
            return fixed.pop(0)
        if deadline is not None and time.monotonic() < deadline and plan.streams:
            return next(more)
        return None

    if workers == 1:
        return _execute_here(plan, next_unit, notify)
    return _execute_pool(plan, workers, next_unit, notify)


def _execute_here(
    plan: Plan, next_unit: Callable[[], Unit | None], notify: Listener
) -> list[UnitResult]:
    results = []
    while (unit := next_unit()) is not None:
        notify(unit, None, 0.0)

        def progress(done: int, total: int | None, unit: Unit = unit) -> None:
            notify(unit, None, min(done / total, 1.0) if total else 0.0)

        result = run_unit(unit, plan.context, progress)
        results.append(result)
        notify(unit, result, 1.0)
    return results


def _execute_pool(
    plan: Plan, workers: int, next_unit: Callable[[], Unit | None], notify: Listener
) -> list[UnitResult]:
    results: list[UnitResult] = []
    preload(plan.sections)
    context = multiprocessing.get_context("fork")
    pool = _pool(workers, context)
    running: dict[Future[UnitResult], Unit] = {}
    try:
        while True:
            while len(running) < workers and (unit := next_unit()) is not None:
                running[pool.submit(run_unit_in_worker, (unit, plan.context))] = unit
                notify(unit, None, 0.0)
            if not running:
                break
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            broken = False
            for future in done:
                unit = running.pop(future)
                try:
                    result = future.result()
                except Exception as error:  # noqa: BLE001 - the unit fails, the run goes on
                    broken = broken or isinstance(error, BrokenProcessPool)
                    result = _died(unit, plan.context, error)
                results.append(result)
                notify(unit, result, 1.0)
            if broken:  # a worker died (killed, or crashed the interpreter): fresh pool
                for unit in running.values():
                    result = _died(unit, plan.context, BrokenProcessPool("pool broken"))
                    results.append(result)
                    notify(unit, result, 1.0)
                running.clear()
                pool.shutdown(wait=True, cancel_futures=True)
                pool = _pool(workers, context)
    except KeyboardInterrupt:
        # Ctrl-C reaches the whole process group: the workers ignore it (no
        # tracebacks from them) and are stopped here, without waiting on the
        # pool's bookkeeping; the caller reports what had finished.
        processes = list((getattr(pool, "_processes", None) or {}).values())
        for process in processes:
            process.terminate()
        pool.shutdown(wait=False, cancel_futures=True)
        for process in processes:
            process.join(timeout=10)
            if process.is_alive():
                process.kill()
        raise
    except BaseException:
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    pool.shutdown(wait=True, cancel_futures=True)
    return results


def _ignore_interrupt() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _pool(workers: int, context: Any) -> ProcessPoolExecutor:
    return ProcessPoolExecutor(
        max_workers=workers, mp_context=context, initializer=_ignore_interrupt
    )


def _died(unit: Unit, context: Context, error: BaseException) -> UnitResult:
    message = f"the worker process running it failed: {type(error).__name__}: {error}"
    rerun = rerun_command(context, unit.id)
    return UnitResult(
        unit.id,
        _canonical(unit),
        {},
        0.0,
        0,
        (),
        (Failure(unit.id, message, rerun),),
    )


# -- reports -----------------------------------------------------------------------------------


def section_results(
    sections: Sequence[str], results: Sequence[UnitResult], seconds: dict[str, float] | None = None
) -> list[SectionResult]:
    """Per-section sums, in campaign order."""
    by_section: dict[str, list[UnitResult]] = {name: [] for name in sections}
    for result in results:
        by_section.setdefault(result.unit.partition(":")[0], []).append(result)
    return [
        summarise(name, by_section[name], (seconds or {}).get(name))
        for name in SECTIONS
        if name in by_section
    ]


def build_report(
    plan: Plan | None,
    results: Sequence[UnitResult],
    elapsed: float,
    *,
    workers: int,
    header: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The JSON report: the campaign, per-section sums, every unit, every failure."""
    if plan is not None:
        header = {
            "budget": plan.context.budget,
            "seed": plan.context.seed,
            "shard": str(plan.shard) if plan.shard else None,
            "max_seconds": plan.max_seconds,
            "section_names": list(plan.sections),
        }
    assert header is not None
    ordered = sorted(results, key=lambda result: result.order)
    sections = section_results(header["section_names"], ordered)
    failures = [asdict(failure) for section in sections for failure in section.failures]
    return {
        "format": REPORT_FORMAT,
        **header,
        "workers": workers,
        "seconds": round(elapsed, 2),
        "passed": not failures,
        "logs": sum(result.logs for result in ordered),
        "sections": [
            {key: value for key, value in asdict(section).items() if key != "failures"}
            for section in sections
        ],
        "failures": failures,
        "units": [asdict(result) for result in ordered],
    }


def unit_results(report: dict[str, Any]) -> list[UnitResult]:
    """The unit results a JSON report carries."""
    return [
        UnitResult(
            entry["unit"],
            tuple(entry["order"]),
            dict(entry["counts"]),
            float(entry["seconds"]),
            int(entry["logs"]),
            tuple(entry["log_lines"]),
            tuple(Failure(**failure) for failure in entry["failures"]),
        )
        for entry in report["units"]
    ]


class MergeError(ValueError):
    """Reports that cannot be merged (another campaign, or a unit in two of them)."""


def merge(reports: Sequence[tuple[str, dict[str, Any]]]) -> tuple[dict[str, Any], list[str]]:
    """One report from shard reports; answers it and the warnings (missing shards)."""
    if not reports:
        raise MergeError("nothing to merge")
    for path, report in reports:
        if report.get("format") != REPORT_FORMAT:
            raise MergeError(f"{path}: not a shmring check report of format {REPORT_FORMAT}")
    first_path, first = reports[0]
    for path, report in reports[1:]:
        for key in ("budget", "seed"):
            if report[key] != first[key]:
                raise MergeError(
                    f"{path} ran {key}={report[key]!r}, {first_path} {key}={first[key]!r}"
                )
    seen: dict[str, str] = {}
    results: list[UnitResult] = []
    for path, report in reports:
        for result in unit_results(report):
            if result.unit in seen:
                raise MergeError(f"unit {result.unit} ran twice: in {seen[result.unit]} and {path}")
            seen[result.unit] = path
            results.append(result)
    warnings = []
    shards = [report.get("shard") for _, report in reports]
    if all(shards):
        counts = {Shard.parse(text).count for text in shards}
        if len(counts) != 1:
            raise MergeError(f"shards of different partitions: {shards}")
        (count,) = counts
        missing = sorted(set(range(1, count + 1)) - {Shard.parse(text).index for text in shards})
        if missing:
            warnings.append(f"missing shards: {', '.join(f'{k}/{count}' for k in missing)}")
    names = [name for name in SECTIONS if any(name in r["section_names"] for _, r in reports)]
    header = {
        "budget": first["budget"],
        "seed": first["seed"],
        "shard": None,
        "max_seconds": first.get("max_seconds"),
        "section_names": names,
        "merged_from": [path for path, _ in reports],
        "complete": not warnings,
    }
    merged = build_report(
        None,
        results,
        max(report["seconds"] for _, report in reports),
        workers=sum(report["workers"] for _, report in reports),
        header=header,
    )
    return merged, warnings


class NotAReportError(ValueError):
    """A file given as a report is not a `shmring check --report` JSON report."""


_REPORT_KEYS = ("format", "budget", "seed", "section_names", "units", "seconds", "workers")


def load_report(path: str) -> dict[str, Any]:
    """A report written by `shmring check --report`; NotAReportError for anything else."""
    with open(path, encoding="utf-8") as handle:
        try:
            report = json.load(handle)
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise NotAReportError(f"{path} is not JSON ({error})") from error
    if not isinstance(report, dict):
        raise NotAReportError(
            f"{path} is not a shmring check report (a JSON {type(report).__name__}, "
            "not an object): pass files written by `shmring check --report`"
        )
    missing = [key for key in _REPORT_KEYS if key not in report]
    if missing or report.get("format") != REPORT_FORMAT or not isinstance(report["units"], list):
        raise NotAReportError(
            f"{path} is not a shmring check report of format {REPORT_FORMAT} "
            f"(missing {', '.join(missing) or 'nothing'}, format={report.get('format')!r}): "
            "pass files written by `shmring check --report`"
        )
    return report
