"""`shmring check` units: the same counts on any number of workers or shards, and every
failure rerun by the one command it prints."""

from __future__ import annotations

import json
import logging
import shlex
import time
from pathlib import Path
from typing import Any

import pytest

from shmring import cli
from shmring.check import schedule, sections
from shmring.fault_injection import fuzz, scenarios
from shmring.fault_injection.lockstep import ScenarioFailure

# A small slice of every kind of unit: fault cells of one scenario, crash points in one
# ring state, one fuzz target's rounds and the forged battery, one lockstep seed.
SUBSET = (
    "faults:ring_wrap/*",
    "crash:*/empty/600",
    "fuzz:codec/*",
    "fuzz:forged",
    "lockstep:ring/0",
)


def _check(tmp_path: Path, name: str, *extra: str) -> tuple[int, dict[str, Any]]:
    report = tmp_path / f"{name}.json"
    # In this process (one worker), where the tests' monkeypatched targets live.
    workers = [] if "--workers" in extra else ["--workers", "1"]
    args = ["check", "--database", "none", "--report", str(report), *workers, *extra]
    status = cli.main(args)
    return status, json.loads(report.read_text())


def _subset_args() -> list[str]:
    return [arg for pattern in SUBSET for arg in ("--unit", pattern)]


def _counts(report: dict[str, Any]) -> dict[str, dict[str, int]]:
    return {section["name"]: section["counts"] for section in report["sections"]}


def _unit_counts(report: dict[str, Any]) -> dict[str, dict[str, int]]:
    return {unit["unit"]: unit["counts"] for unit in report["units"]}


@pytest.fixture(scope="module")
def unsharded(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    status, report = _check(tmp_path_factory.mktemp("one"), "one", *_subset_args())
    assert status == 0, report["failures"]
    return report


def test_subset_covers_every_kind_of_unit(unsharded: dict[str, Any]) -> None:
    counts = _counts(unsharded)
    assert set(counts) == {"lockstep", "faults", "crash", "fuzz"}
    assert counts["faults"]["cells"] > 0 and counts["faults"]["cells_failed"] == 0
    assert counts["crash"]["crash_points"] == 12  # 13 points, 12 of them in the empty state
    assert counts["fuzz"]["fuzz codec"] == 3 * sections._fuzz_cases("quick", "codec")
    assert counts["lockstep"]["ring steps"] > 0


def test_two_workers_count_exactly_what_one_does(tmp_path: Path, unsharded: dict[str, Any]) -> None:
    status, report = _check(tmp_path, "two", "--workers", "2", *_subset_args())
    assert status == 0, report["failures"]
    assert _counts(report) == _counts(unsharded)
    assert _unit_counts(report) == _unit_counts(unsharded)
    assert report["workers"] == 2


def test_two_shards_merge_into_the_unsharded_report(
    tmp_path: Path, unsharded: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    status, first = _check(tmp_path, "s1", "--shard", "1/2", *_subset_args())
    assert status == 0, first["failures"]
    status, second = _check(tmp_path, "s2", "--shard", "2/2", *_subset_args())
    assert status == 0, second["failures"]
    ones, twos = set(_unit_counts(first)), set(_unit_counts(second))
    assert ones and twos and not ones & twos  # nothing runs twice
    assert ones | twos == set(_unit_counts(unsharded))  # nothing is left out
    merged_path = tmp_path / "merged.json"
    capsys.readouterr()
    status = cli.main(
        [
            "report",
            "merge",
            str(tmp_path / "s1.json"),
            str(tmp_path / "s2.json"),
            "--report",
            str(merged_path),
        ]
    )
    assert status == 0
    merged = json.loads(merged_path.read_text())
    assert _counts(merged) == _counts(unsharded)
    assert [s["units"] for s in merged["sections"]] == [s["units"] for s in unsharded["sections"]]
    assert merged["complete"] is True
    assert "shmring check" in capsys.readouterr().out  # the same table


def test_merge_refuses_a_unit_run_twice_and_names_missing_shards(
    tmp_path: Path, unsharded: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "one.json"
    path.write_text(json.dumps(unsharded))
    assert cli.main(["report", "merge", str(path), str(path)]) == 2
    assert "ran twice" in capsys.readouterr().err
    shard = dict(unsharded, shard="1/3")
    path.write_text(json.dumps(shard))
    assert cli.main(["report", "merge", str(path)]) == 1
    assert "missing shards: 2/3, 3/3" in capsys.readouterr().err


def test_shards_partition_the_whole_quick_campaign() -> None:
    context = sections.Context("quick", 0)
    everything = schedule.make_plan(context, sections.SECTIONS).units
    shards = [
        schedule.make_plan(context, sections.SECTIONS, shard=schedule.Shard(k, 3)).units
        for k in (1, 2, 3)
    ]
    ids = [unit.id for shard in shards for unit in shard]
    assert len(ids) == len(set(ids))
    assert sorted(ids) == sorted(unit.id for unit in everything)
    assert all(shards)


# -- reproducers ---------------------------------------------------------------------------

BROKEN = "broken_at_open_2"


def _broken_scenario(env: scenarios.Env) -> scenarios.Outcome:
    """ring_wrap, with a promise broken only when the second open fails transiently."""
    outcome = scenarios.ring_wrap(env)
    plan = env.os.plan
    if plan is not None and (plan.site, plan.nth, plan.mode) == ("open", 2, "transient"):
        raise ScenarioFailure("deliberately broken for the reproducer test")
    return outcome


def _reruns(out: str) -> list[str]:
    return [line.strip() for line in out.splitlines() if line.strip().startswith("shmring check ")]


@pytest.mark.parametrize("workers", ["1", "2"])
def test_failed_fault_cell_prints_the_command_that_reruns_only_it(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    workers: str,
) -> None:
    monkeypatch.setitem(scenarios.SCENARIOS, BROKEN, _broken_scenario)
    capsys.readouterr()
    status, report = _check(
        tmp_path, "broken", "--workers", workers, "--unit", f"faults:{BROKEN}/*"
    )
    assert status == 1
    (failure,) = report["failures"]
    cell = f"faults:{BROKEN}/open#2:ENOSPC:transient"
    assert failure["unit"] == cell
    assert "deliberately broken" in failure["message"]
    assert failure["rerun"] in _reruns(capsys.readouterr().out)
    assert report["sections"][0]["counts"]["cells"] > 1  # the unit ran many cells, one failed

    argv = shlex.split(failure["rerun"])
    assert argv[:2] == ["shmring", "check"]
    status, again = _check(tmp_path, "again", *argv[2:])
    assert status == 1
    assert [unit["unit"] for unit in again["units"]] == [cell]  # only that cell ran
    assert again["sections"][0]["counts"]["cells"] == 1
    assert [f["unit"] for f in again["failures"]] == [cell]


def test_failed_fuzz_round_prints_the_command_that_reruns_only_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[int] = []

    def target(cases: int, seed: int, count: Any) -> None:
        calls.append(seed)
        count()
        if seed == sections.derived_seed(0, "fuzz", "codec", 1):
            raise fuzz.FuzzFailure(f"deliberately broken for seed {seed}")

    monkeypatch.setitem(fuzz.TARGETS, "codec", target)
    status, report = _check(tmp_path, "fuzz", "--unit", "fuzz:codec/*")
    assert status == 1
    assert len(calls) == 3
    (failure,) = report["failures"]
    assert failure["unit"] == "fuzz:codec/1"
    calls.clear()
    status, again = _check(tmp_path, "again", *shlex.split(failure["rerun"])[2:])
    assert status == 1
    assert calls == [sections.derived_seed(0, "fuzz", "codec", 1)]
    assert [unit["unit"] for unit in again["units"]] == ["fuzz:codec/1"]


def test_section_without_units_is_one_unit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    seen: list[tuple[str, int]] = []

    def runner(
        budget: str, seed: int, progress: sections.Progress, database: str | None
    ) -> dict[str, int]:
        seen.append((budget, seed))
        progress(1, 1)
        return {"schedules": 7}

    monkeypatch.delitem(sections.UNITS, "model")
    monkeypatch.setitem(sections.RUNNERS, "model", runner)
    status, report = _check(tmp_path, "single", "--only", "model", "--seed", "5")
    assert status == 0
    assert seen == [("quick", 5)]
    assert [unit["unit"] for unit in report["units"]] == ["model:all"]
    assert report["sections"][0]["counts"] == {"schedules": 7}


# -- logging ---------------------------------------------------------------------------------


@pytest.mark.parametrize("verbose", [False, True])
def test_library_logging_is_captured_counted_and_shown_only_with_v(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], verbose: bool
) -> None:
    capsys.readouterr()
    extra = ["-v"] if verbose else []
    status, report = _check(tmp_path, "logs", "--unit", "faults:ring_wrap/open", *extra)
    assert status == 0
    output = capsys.readouterr()
    text = output.out + output.err
    (unit,) = report["units"]
    assert unit["logs"] > 0 and report["logs"] == unit["logs"]
    assert report["sections"][0]["logs"] == unit["logs"]
    assert ("ring setup failed" in text) is verbose
    assert ("log record(s)" in text) is verbose


def test_logs_of_a_failed_unit_come_with_its_failure() -> None:
    def noisy(unit: sections.Unit, context: sections.Context, progress: Any) -> dict[str, int]:
        logging.getLogger("shmring.connector").warning("the ring looked odd")
        raise AssertionError("and then it broke")

    declared = sections.SectionUnits(noisy, units=lambda budget, seed: [])
    result = _with_units("crash", declared, sections.Unit("crash", "x"))
    (failure,) = result.failures
    assert result.logs == 1
    assert "the ring looked odd" in failure.message and "and then it broke" in failure.message


def _with_units(
    section: str, declared: sections.SectionUnits, unit: sections.Unit
) -> sections.UnitResult:
    saved = sections.UNITS[section]
    sections.UNITS[section] = declared
    try:
        return sections.run_unit(unit, sections.Context("quick", 0))
    finally:
        sections.UNITS[section] = saved


# -- time budget -----------------------------------------------------------------------------


def _fake_stream(ran: list[str]) -> sections.SectionUnits:
    def round_units(budget: str, seed: int, round_: int) -> list[sections.Unit]:
        return [sections.Unit("fuzz", f"t{i}/{round_}", (round_, i), 0.01) for i in range(3)]

    def run(unit: sections.Unit, context: sections.Context, progress: Any) -> dict[str, int]:
        ran.append(unit.name)
        time.sleep(0.01)
        return {"cases": 1}

    return sections.SectionUnits(run, round_units=round_units, rounds=lambda budget: 2)


def test_max_seconds_keeps_drawing_rounds_until_the_time_is_spent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ran: list[str] = []
    monkeypatch.setitem(sections.UNITS, "fuzz", _fake_stream(ran))
    context = sections.Context("quick", 0)
    fixed = schedule.execute(schedule.make_plan(context, ["fuzz"]), 1)
    assert len(fixed) == 6  # the budget: two rounds of three
    ran.clear()
    plan = schedule.make_plan(context, ["fuzz"], max_seconds=0.5)
    results = schedule.execute(plan, 1)
    rounds = {int(name.rpartition("/")[2]) for name in ran}
    assert len(results) == len(ran) > 6  # past the budget's two rounds
    assert rounds == set(range(max(rounds) + 1))  # every round up to the last, in order
    assert len(set(ran)) == len(ran)


def test_max_seconds_shards_draw_disjoint_rounds(monkeypatch: pytest.MonkeyPatch) -> None:
    ran: list[str] = []
    monkeypatch.setitem(sections.UNITS, "fuzz", _fake_stream(ran))
    context = sections.Context("quick", 0)
    drawn = []
    for k in (1, 2):
        ran.clear()
        plan = schedule.make_plan(context, ["fuzz"], max_seconds=0.3, shard=schedule.Shard(k, 2))
        schedule.execute(plan, 1)
        drawn.append(set(ran))
    assert drawn[0] and drawn[1] and not drawn[0] & drawn[1]


# -- options ---------------------------------------------------------------------------------


def test_unknown_unit_and_bad_shard_are_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["check", "--unit", "faults:no_such/open", "--database", "none"]) == 2
    assert "no unit" in capsys.readouterr().err
    assert cli.main(["check", "--shard", "3/2", "--database", "none"]) == 2
    assert "K/N" in capsys.readouterr().err


def test_redis_database_without_the_extra_is_a_clear_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(__import__("sys").modules, "redis", None)  # the extra not installed
    status = cli.main(["check", "--only", "model", "--database", "redis://localhost:6379/0"])
    assert status == 2
    assert "shmring[redis]" in capsys.readouterr().err


def test_directory_database_is_hypothesis_own(tmp_path: Path) -> None:
    from hypothesis.database import DirectoryBasedExampleDatabase

    database = sections.open_database(str(tmp_path / "db"))
    assert isinstance(database, DirectoryBasedExampleDatabase)
    assert sections.open_database("none") is None


def test_a_worker_that_dies_fails_its_unit_and_the_others_still_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import os
    import signal

    def run(unit: sections.Unit, context: sections.Context, progress: Any) -> dict[str, int]:
        if unit.name == "dies":
            os.kill(os.getpid(), signal.SIGKILL)
        return {"ran": 1}

    names = ["a", "dies", "b", "c", "d"]
    declared = sections.SectionUnits(
        run,
        units=lambda budget, seed: [
            sections.Unit("crash", name, (i,), 1.0) for i, name in enumerate(names)
        ],
    )
    monkeypatch.setitem(sections.UNITS, "crash", declared)
    plan = schedule.make_plan(sections.Context("quick", 0), ["crash"])
    results = {result.unit: result for result in schedule.execute(plan, 2)}
    assert set(results) == {f"crash:{name}" for name in names}
    (failure,) = results["crash:dies"].failures
    assert "BrokenProcessPool" in failure.message
    assert failure.rerun.endswith("--unit crash:dies")
    # whatever shared the broken pool failed with it or ran again in a fresh pool; nothing is lost
    assert sum(result.counts.get("ran", 0) for result in results.values()) >= 1


# -- per-rule statistics (issue 28) ------------------------------------------------------------


def _machine_rules(machine: type[Any]) -> set[str]:
    import inspect

    from hypothesis import stateful

    return {
        name
        for name, method in inspect.getmembers(machine, inspect.isfunction)
        if getattr(method, stateful.RULE_MARKER, None) is not None
        or getattr(method, stateful.INITIALIZE_RULE_MARKER, None) is not None
    }


@pytest.mark.parametrize("shown", [False, True])
def test_lockstep_rule_statistics_count_every_rule_and_add_up_to_the_steps(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shown: bool
) -> None:
    from shmring.model_tests.registration_machine import DriverMachine

    capsys.readouterr()
    extra = ["--statistics"] if shown else []
    status, report = _check(tmp_path, "rules", "--unit", "lockstep:driver/0", *extra)
    assert status == 0, report["failures"]
    counts = _unit_counts(report)["lockstep:driver/0"]
    rules = {
        key.removeprefix(sections.RULE_COUNT_PREFIX + "driver."): value
        for key, value in counts.items()
        if key.startswith(sections.RULE_COUNT_PREFIX)
    }
    assert set(rules) == _machine_rules(DriverMachine)  # a rule never run is there, as 0
    assert sum(rules.values()) == counts["steps"] > 0  # one rule per step, nothing else
    assert sum(1 for runs in rules.values() if runs) > 1
    out = capsys.readouterr().out
    table = out.split("lockstep driver:")[0]
    assert "rule:" not in table  # the summary table stays short
    assert ("lockstep driver: " in out) is shown
    if shown:
        busiest = max(rules, key=lambda rule: rules[rule])
        assert f"│ {busiest} " in out and f"{counts['steps']:,} rule runs" in out


def test_counted_rules_still_print_a_failing_rule_by_its_own_name(tmp_path: Path) -> None:
    """The counting wrapper keeps the reproduction a user copies: `state.<rule>(...)`."""
    from hypothesis import settings
    from hypothesis import strategies as st
    from hypothesis.stateful import RuleBasedStateMachine, rule, run_state_machine_as_test

    class Failing(RuleBasedStateMachine):
        @rule(value=st.integers(0, 10))
        def grow(self, value: int) -> None:
            assert value < 7, "deliberately failing"

        @rule()
        def idle(self) -> None:
            pass

    runs: dict[str, int] = {}
    counted = sections._counting(Failing, {"steps": 0, "examples": 0}, runs)
    with pytest.raises(AssertionError, match="deliberately failing") as raised:
        run_state_machine_as_test(counted, settings=settings(database=None, max_examples=200))
    assert "state.grow(value=7)" in "\n".join(getattr(raised.value, "__notes__", []))
    assert set(runs) == {"grow", "idle"} and runs["grow"] > 0
