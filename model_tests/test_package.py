"""Packaging: one namespace from several folders, and a model that stays pure."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FORBIDDEN_IN_SPEC = {
    "numpy",
    "torch",
    "mmap",
    "ctypes",
    "cuda",
    "os",
    "fcntl",
    "msgspec",
    "av",
    "shmring.impl",
}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def _forbidden(name: str) -> bool:
    return any(name == bad or name.startswith(bad + ".") for bad in FORBIDDEN_IN_SPEC)


@pytest.mark.parametrize("path", sorted((ROOT / "spec").glob("*.py")), ids=lambda p: p.name)
def test_spec_module_imports_nothing_impure(path: Path) -> None:
    bad = sorted(name for name in _imports(path) if _forbidden(name))
    assert not bad, f"{path.name} imports {bad}"


def test_importing_the_whole_model_loads_no_impure_module() -> None:
    modules = sorted(p.stem for p in (ROOT / "spec").glob("*.py") if p.stem != "__init__")
    code = (
        "import sys\n"
        + "".join(f"import shmring.spec.{m}\n" for m in modules)
        + "bad = [m for m in ('numpy', 'torch', 'mmap', 'ctypes', 'cuda', 'msgspec', 'av', 'shmring.impl') if m in sys.modules]\n"
        + "print(','.join(bad))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "", f"importing the model loaded {done.stdout.strip()}"


def test_impl_does_not_restate_layout_constants() -> None:
    """The layout's names are defined once, in spec/layout.py."""
    layout = ROOT / "spec" / "layout.py"
    names = {
        node.targets[0].id if isinstance(node, ast.Assign) else node.target.id  # type: ignore[union-attr]
        for node in ast.parse(layout.read_text()).body
        if isinstance(node, ast.Assign | ast.AnnAssign)
        and isinstance(node.targets[0] if isinstance(node, ast.Assign) else node.target, ast.Name)
    }
    offenders = []
    for path in sorted((ROOT / "impl").rglob("*.py")):
        for node in ast.parse(path.read_text()).body:
            targets = (
                node.targets
                if isinstance(node, ast.Assign)
                else [node.target]
                if isinstance(node, ast.AnnAssign)
                else []
            )
            offenders += [
                f"{path.name}:{t.id}" for t in targets if isinstance(t, ast.Name) and t.id in names
            ]
    assert not offenders, f"layout constants restated in impl: {offenders}"


def test_no_top_level_spec_or_impl_package_is_installed() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert all(name == "shmring" or name.startswith("shmring.") for name in config["packages"])


def _folder(package: str, package_dir: dict[str, str]) -> Path:
    """Where setuptools reads `package` from: its nearest mapped ancestor's folder, plus the rest."""
    parts = package.split(".")
    for cut in range(len(parts), 0, -1):
        mapped = package_dir.get(".".join(parts[:cut]))
        if mapped is not None:
            return ROOT.joinpath(mapped, *parts[cut:])
    return ROOT.joinpath(*parts)


def test_every_package_folder_is_listed() -> None:
    """A subpackage folder (one with __init__.py) that `packages` lacks would not ship."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = {_folder(package, config["package-dir"]) for package in config["packages"]}
    for folder in list(listed):
        for init in folder.rglob("__init__.py"):
            assert init.parent in listed, f"{init.parent.relative_to(ROOT)} is not in packages"


def test_wheel_holds_exactly_the_source_tree(tmp_path: Path) -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    expected = set()
    for package in config["packages"]:
        folder = _folder(package, config["package-dir"])
        prefix = package.replace(".", "/")
        expected |= {f"{prefix}/{p.name}" for p in folder.glob("*.py")}
        expected |= {f"{prefix}/{name}" for name in config.get("package-data", {}).get(package, [])}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(ROOT),
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"},
    )
    assert done.returncode == 0, done.stderr
    (wheel,) = tmp_path.glob("shmring-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        shipped = {
            name for name in archive.namelist() if not name.split("/")[0].endswith(".dist-info")
        }
    assert shipped == expected, (
        f"missing {sorted(expected - shipped)}, extra {sorted(shipped - expected)}"
    )
