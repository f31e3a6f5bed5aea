"""The configured linters pass: ruff over the tree, mypy strict over the model and its explorer."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_ruff_finds_nothing() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--no-cache", str(ROOT)],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_mypy_strict_passes_on_the_model_and_its_explorer() -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--no-incremental",
            "--config-file",
            str(ROOT / "pyproject.toml"),
            "-p",
            "shmring.spec",
            "-m",
            "shmring.check.explore",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT.parent,
    )
    assert done.returncode == 0, done.stdout + done.stderr
