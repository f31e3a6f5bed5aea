"""`shmring check`: exit status, report and table say what was checked."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from shmring import cli
from shmring.check import sections


def test_check_reports_counts_and_passes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = tmp_path / "report.json"
    status = cli.main(
        ["check", "--only", "crosshair", "--report", str(report), "--database", "none"]
    )
    assert status == 0
    data = json.loads(report.read_text())
    assert data["passed"] is True
    (section,) = data["sections"]
    assert section["name"] == "crosshair"
    assert section["failure"] is None
    assert section["counts"]["contracts"] == 8
    assert section["counts"]["confirmed"] + section["counts"]["unrefuted within budget"] == 8
    assert "crosshair" in capsys.readouterr().out


def test_failing_section_exits_non_zero_and_prints_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def broken(
        budget: str, seed: int, progress: sections.Progress, database: str | None
    ) -> dict[str, int]:
        progress(1, 2)
        raise AssertionError("model and implementation disagree: put(k) -> ring vs fallback")

    monkeypatch.delitem(sections.UNITS, "model")  # one unit, through the runner
    monkeypatch.setitem(sections.RUNNERS, "model", broken)
    report = tmp_path / "report.json"
    status = cli.main(
        [
            "check",
            "--only",
            "model",
            "--workers",
            "1",
            "--report",
            str(report),
            "--database",
            "none",
        ]
    )
    assert status == 1
    out = capsys.readouterr().out
    assert "FAILED: model:all" in out
    assert "put(k) -> ring vs fallback" in out
    data = json.loads(report.read_text())
    assert data["passed"] is False
    (failure,) = data["failures"]
    assert failure["unit"] == "model:all"
    assert failure["rerun"] == "shmring check --budget quick --seed 0 --unit model:all"
    assert failure["rerun"] in out


def test_lockstep_section_counts_steps_per_machine(tmp_path: Path) -> None:
    result = sections.run_section("lockstep", "quick", seed=3, database=str(tmp_path / "db"))
    assert result.failure is None, result.failure
    machines = [key for key in result.counts if key.endswith(" steps") and key != "steps"]
    assert len(machines) == len(sections.LOCKSTEP_MACHINES)
    assert all(result.counts[key] > 0 for key in machines)
    assert result.counts["steps"] == sum(result.counts[key] for key in machines)


def test_console_script_is_installed_and_rejects_bad_arguments() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "shmring.cli", "check", "--budget", "enormous"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2
    assert "invalid choice: 'enormous'" in done.stderr
