"""The configured linters pass: ruff over the tree, mypy strict over the model and its explorer."""

from __future__ import annotations

import os
import shutil
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


# The packages setuptools' package-dir maps into shmring (pyproject.toml): their folders here.
MAPPED = ("spec", "impl", "fault_injection", "model_tests")


def package_shaped_copy(into: Path) -> Path:
    """This checkout's files laid out as installed (shmring/, shmring/spec/, ...), under `into`.

    mypy finds `shmring.spec` by path: through a strict editable install's
    link tree it checks whichever checkout was installed (not necessarily
    this one), and through a plain editable install (an import hook mypy
    does not run) it finds nothing. A copy of *this* tree on MYPYPATH makes
    the verdict depend on the code alone, however the checkout was installed.
    """
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    package = into / "shmring"
    shutil.copytree(ROOT / "shmring", package, ignore=ignore)
    for folder in MAPPED:
        shutil.copytree(ROOT / folder, package / folder, ignore=ignore)
    return into


def test_mypy_strict_passes_on_the_model_and_its_explorer(tmp_path: Path) -> None:
    tree = package_shaped_copy(tmp_path / "tree")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--no-incremental",
            "-v",
            # What spec and the explorer import is read for its types, its own
            # errors not reported: as when it was found in an installed package.
            "--follow-imports=silent",
            "--config-file",
            str(ROOT / "pyproject.toml"),
            "-p",
            "shmring.spec",
            "-m",
            "shmring.check.explore",
        ],
        capture_output=True,
        text=True,
        cwd=tree,
        env={**os.environ, "MYPYPATH": str(tree)},
    )
    report = [line for line in done.stdout.splitlines() if not line.startswith("LOG:")]
    shown = "\n".join(report).replace(str(tree / "shmring") + os.sep, "")
    assert done.returncode == 0, shown + done.stderr[-2000:]
    # -v logs where each module was parsed from: the copy, not an installed checkout.
    parsed = [line for line in done.stderr.splitlines() if line.endswith("(shmring.spec)")]
    assert parsed and all(str(tree) in line for line in parsed), parsed
