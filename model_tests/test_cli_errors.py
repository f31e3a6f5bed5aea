"""`shmring` behaves like a Unix tool: exit codes 0/1/2/130, one-line errors, honest reruns.

Every user error is one line on stderr that names the problem and the fix,
never a traceback, and is found before the run starts; a failing unit is
reported once with the command the user actually ran; the table fits 80
columns; `stat` lists every scope and speaks JSON.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import tomllib
from pathlib import Path

import pytest

import shmring
from shmring import cli
from shmring.check import command

ROOT = Path(__file__).resolve().parent.parent


def _shmring(*args: str, cwd: Path | str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.run(
        [sys.executable, "-m", "shmring.cli", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=timeout,
        check=False,
    )


def _one_line_error(done: subprocess.CompletedProcess[str], *words: str) -> str:
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr + done.stdout, done.stderr
    (line,) = done.stderr.strip().splitlines()
    for word in words:
        assert word in line, line
    return line


def test_version_is_the_package_version(tmp_path: Path) -> None:
    done = _shmring("--version", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert done.stdout.strip() == f"shmring {version}" == f"shmring {shmring.__version__}"
    assert f"## {version}" in (ROOT / "CHANGELOG.md").read_text()


def test_an_unusable_database_path_is_one_line(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    done = _shmring("check", "--only", "crosshair", "--database", str(blocker / "db"), cwd=tmp_path)
    _one_line_error(done, "--database", str(blocker / "db"), "none")
    assert done.stdout == ""


def test_an_unwritable_working_directory_is_one_line(tmp_path: Path) -> None:
    if os.geteuid() == 0:
        cwd: Path | str = "/proc"  # root writes through mode bits; /proc takes no new files
    else:
        cwd = tmp_path / "ro"
        cwd.mkdir()
        cwd.chmod(0o555)
    done = _shmring("check", "--only", "crosshair", cwd=cwd)
    _one_line_error(done, "working directory", "not writable", "--database none")


@pytest.mark.parametrize("where", ["missing-folder", "directory"])
def test_an_unwritable_report_path_is_refused_before_the_run(tmp_path: Path, where: str) -> None:
    path = tmp_path / "nope" / "r.json" if where == "missing-folder" else tmp_path
    started = time.monotonic()
    done = _shmring(
        "check", "--only", "model", "--database", "none", "--report", str(path), cwd=tmp_path
    )
    _one_line_error(done, "--report", str(path))
    assert done.stdout == ""  # no table: nothing ran
    assert time.monotonic() - started < 60


def test_report_merge_of_a_json_array_is_one_line(tmp_path: Path) -> None:
    array = tmp_path / "array.json"
    array.write_text("[1, 2, 3]")
    _one_line_error(_shmring("report", "merge", str(array), cwd=tmp_path), str(array), "not a")
    empty = tmp_path / "object.json"
    empty.write_text('{"units": 3}')
    _one_line_error(_shmring("report", "merge", str(empty), cwd=tmp_path), "not a shmring check")


# A wrapper named like the installed script, whose model units all fail the same way.
FAILING_SHMRING = """
import sys
from shmring import cli
from shmring.check import sections

def broken(unit, context, progress):
    raise AssertionError("MARKER: model and implementation disagree")

sections.UNITS["model"] = sections.SectionUnits(broken, units=sections.UNITS["model"].units)
sys.exit(cli.main())
"""


def test_a_failure_is_reported_once_with_the_command_that_was_run(tmp_path: Path) -> None:
    script = tmp_path / "bin" / "shmring"
    script.parent.mkdir()
    script.write_text(textwrap.dedent(FAILING_SHMRING))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run(
        [sys.executable, str(script), "check", "--only", "model", "--database", "none"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=300,
        check=False,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stdout.count("AssertionError: MARKER") == 1, done.stdout
    reruns = [line.strip() for line in done.stdout.splitlines() if line.startswith("  ")]
    assert f"{script} check --budget quick --seed 0 --unit model:ring" in reruns, done.stdout
    assert f"workers={len(os.sched_getaffinity(0))}" in done.stderr  # the default: usable cores
    table = [line for line in done.stdout.splitlines() if line[:1] in "┏┃┡│└" or "(" in line[:40]]
    assert table and max(len(line) for line in table) <= 80, table


def test_workers_default_to_the_usable_cores() -> None:
    assert command.default_workers() == len(os.sched_getaffinity(0))
    args = cli._parser().parse_args(["check"])
    assert args.workers is None


def test_ctrl_c_exits_130_and_says_where_the_partial_report_is(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    with subprocess.Popen(
        [sys.executable, "-m", "shmring.cli", "check", "--only", "model", "--budget", "deep"]
        + ["--workers", "2", "--database", "none"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # the signal goes to its group, as a terminal's ^C does
    ) as child:
        try:
            assert child.stderr is not None
            header = child.stderr.readline()
            assert header.startswith("shmring check: budget=deep"), header
            time.sleep(2.0)
            os.killpg(child.pid, signal.SIGINT)
            out, err = child.communicate(timeout=300)
        finally:
            if child.poll() is None:  # never leave a deep campaign running
                os.killpg(child.pid, signal.SIGKILL)
                child.wait()
    assert child.returncode == 130, (out, err)
    assert "Traceback" not in err + out, err
    last = err.strip().splitlines()[-1]
    partial = tmp_path / ".shmring" / "interrupted-report.json"
    assert (
        last.startswith("shmring check: interrupted; the partial report")
        and str(Path(".shmring") / "interrupted-report.json") in last
    ), last
    report = json.loads(partial.read_text())
    assert report["interrupted"] is True and report["passed"] is True


def test_stat_lists_every_scope_and_speaks_json(tmp_path: Path) -> None:
    root = str(tmp_path)
    assert cli.main(["stat", "--shm-root", root]) == 0
    with (
        shmring.Connector("statone", shm_root=root) as one,
        shmring.Connector("stattwo", shm_root=root) as two,
    ):
        one.put("a", "b", "k", {"x": 1})
        two.put("a", "b", "k", {"x": 2})
        done = _shmring("stat", "--shm-root", root, cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        assert "scope statone:" in done.stdout and "scope stattwo:" in done.stdout
        done = _shmring("stat", "--shm-root", root, "--json", cwd=tmp_path)
        listed = json.loads(done.stdout)
        assert [entry["scope"] for entry in listed] == ["statone", "stattwo"]
        assert all(entry["exists"] and len(entry["rings"]) == 1 for entry in listed)
        done = _shmring("stat", "--shm-root", root, "--scope", "statone", "--json", cwd=tmp_path)
        assert json.loads(done.stdout)["scope"] == "statone"
