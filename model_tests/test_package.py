"""Packaging: one namespace from several folders, and a model that stays pure."""

from __future__ import annotations

import ast
import os
import re
import shutil
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


def test_no_module_restates_layout_constants() -> None:
    """The layout's names are defined once, in spec/layout.py (every folder of the tree)."""
    layout = ROOT / "spec" / "layout.py"
    names = {
        node.targets[0].id if isinstance(node, ast.Assign) else node.target.id  # type: ignore[union-attr]
        for node in ast.parse(layout.read_text()).body
        if isinstance(node, ast.Assign | ast.AnnAssign)
        and isinstance(node.targets[0] if isinstance(node, ast.Assign) else node.target, ast.Name)
    }
    offenders = []
    for path in _guarded_files():
        for node in ast.parse(path.read_text()).body:
            targets = (
                node.targets
                if isinstance(node, ast.Assign)
                else [node.target]
                if isinstance(node, ast.AnnAssign)
                else []
            )
            offenders += [
                f"{path.relative_to(ROOT)}:{t.id}"
                for t in targets
                if isinstance(t, ast.Name) and t.id in names
            ]
    assert not offenders, f"layout constants restated outside spec/layout.py: {offenders}"


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
        # The test suite stays in the clone (setup.py's build hook): it reads the clone.
        expected |= {
            f"{prefix}/{p.name}" for p in folder.glob("*.py") if not p.name.startswith("test_")
        }
        expected |= {f"{prefix}/{name}" for name in config.get("package-data", {}).get(package, [])}
    # Built from a copy: setuptools reuses the checkout's build/lib, where a
    # module that was moved or deleted would linger and ship again.
    source = tmp_path / "source"
    shutil.copytree(
        ROOT,
        source,
        ignore=shutil.ignore_patterns(
            ".git", ".venv", "build", "*.egg-info", "__pycache__", ".*_cache", ".hypothesis", ".whl"
        ),
    )
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
            str(source),
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"},
    )
    assert done.returncode == 0, done.stderr
    (wheel,) = tmp_path.glob("shmring-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        archive_names = archive.namelist()
        metadata = archive.read("shmring-0.1.0.dist-info/METADATA").decode()
        shipped = {name for name in archive_names if not name.split("/")[0].endswith(".dist-info")}
    assert "License-Expression: Apache-2.0" in metadata, metadata[:800]
    assert not [name for name in shipped if name.rpartition("/")[2].startswith("test_")]
    assert "shmring-0.1.0.dist-info/licenses/LICENSE" in archive_names, archive_names
    assert shipped == expected, (
        f"missing {sorted(expected - shipped)}, extra {sorted(shipped - expected)}"
    )


# -- layout in one place -----------------------------------------------------------
#
# Every byte offset and struct format of the shared files and of the codec's
# wire format is written once, in spec/layout.py (its `Section` records; the
# struct formats are derived from them by `compute_struct_format`).
# impl/frame_io.py, the impl module that turns those into aligned loads and
# stores, restates none of them either: the guard reads every Python file of
# the tree but the layout itself (the implementation, frame_io included, the
# fault plans, the lockstep machines and tests, the benchmarks and the
# top-level package) and reports a layout fact written anywhere else.

LAYOUT_HOMES = frozenset({"spec/layout.py"})
_STRUCT_CHARS = "xcbB?hHiIlLqQnNefdspP"
# A struct format with its byte order, e.g. "<Q" or "<BBbBII".
_ORDERED_FORMAT = re.compile(rf"[<>!=@][0-9]*[{_STRUCT_CHARS}][0-9{_STRUCT_CHARS}]*")
# Any struct format, e.g. "Q" (what a memoryview cast or a struct call takes).
_ANY_FORMAT = re.compile(rf"[<>!=@]?[0-9{_STRUCT_CHARS}]+")
_STRUCT_CALLS = frozenset(
    {"pack", "unpack", "unpack_from", "pack_into", "Struct", "calcsize", "iter_unpack"}
)


def _guarded_files() -> list[Path]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    top = _folder("shmring", config.get("package-dir", {}))
    files: set[Path] = set()
    for folder in ("impl", "fault_injection", "model_tests", "benchmarks", top):
        files |= {p for p in (ROOT / folder).rglob("*.py") if "__pycache__" not in p.parts}
    return sorted(files)


def _literal(node: ast.AST) -> str | None:
    """The text of a string literal or of an f-string's parts ({} for each value)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(
            part.value if isinstance(part, ast.Constant) else "{}" for part in node.values
        )
    return None


def layout_findings(source: str) -> list[tuple[int, str]]:
    """(line, finding) for every layout fact written in `source` (one file's text)."""
    tree = ast.parse(source)
    found: list[tuple[int, str]] = []
    # Format specs of f-strings ("{x:<28}") look like struct formats and are not.
    specs = {
        id(sub)
        for node in ast.walk(tree)
        if isinstance(node, ast.FormattedValue) and node.format_spec is not None
        for sub in ast.walk(node.format_spec)
    }
    for node in ast.walk(tree):
        if id(node) in specs:
            continue
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if _ORDERED_FORMAT.fullmatch(node.value):
                found.append((node.lineno, f"struct format literal {node.value!r}"))
        elif isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            on_struct = (
                isinstance(func, ast.Attribute)
                and isinstance(func.value, ast.Name)
                and func.value.id == "struct"
            )
            by_format = name in _STRUCT_CALLS and (on_struct or isinstance(func, ast.Name))
            if by_format and node.args and _literal(node.args[0]) is not None:
                found.append((node.lineno, f"struct call {name} with a literal format"))
            if name in ("unpack_from", "pack_into"):
                at = 2 if on_struct or isinstance(func, ast.Name) else 1
                offsets = [node.args[at]] if len(node.args) > at else []
                offsets += [k.value for k in node.keywords if k.arg == "offset"]
                for offset in offsets:
                    if isinstance(offset, ast.Constant) and offset.value not in (0, None):
                        found.append(
                            (node.lineno, f"struct call {name} at literal offset {offset.value}")
                        )
            if (
                name == "from_bytes"
                and isinstance(func, ast.Attribute)
                and isinstance(func.value, ast.Name)
                and func.value.id == "int"
                and any(
                    _literal(arg) == "little"
                    for arg in [*node.args, *(k.value for k in node.keywords)]
                )
            ):
                found.append((node.lineno, "int.from_bytes of little-endian (header) bytes"))
            if name == "cast" and isinstance(func, ast.Attribute) and node.args:
                text = _literal(node.args[0])
                if text is not None and _ANY_FORMAT.fullmatch(text) and text not in ("B", "b", "c"):
                    found.append((node.lineno, f"memoryview cast to {text!r}"))
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Name) and target.id.endswith("_OFFSET"):
                    found.append((node.lineno, f"offset constant {target.id}"))
    return found


def _tree_layout_findings() -> dict[tuple[str, str], list[int]]:
    findings: dict[tuple[str, str], list[int]] = {}
    for path in _guarded_files():
        relative = path.relative_to(ROOT).as_posix()
        if relative in LAYOUT_HOMES:
            continue
        for line, finding in layout_findings(path.read_text(encoding="utf-8")):
            findings.setdefault((relative, finding), []).append(line)
    return findings


def test_layout_facts_are_written_only_in_the_layout() -> None:
    """No struct format, header offset or little-endian header read outside spec/layout.py."""
    findings = _tree_layout_findings()
    offenders = sorted(
        f"{path}:{lines[0]}: {finding}" for (path, finding), lines in findings.items()
    )
    assert not offenders, "layout facts outside spec/layout.py:\n" + "\n".join(offenders)


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ('X = struct.Struct("<Q")\n', ["struct format literal '<Q'", "struct call Struct"]),
        ('n = struct.unpack_from("<QQ", header, 24)\n', ["'<QQ'", "unpack_from", "offset 24"]),
        ("v = _U64.unpack_from(buf, 40)[0]\n", ["struct call unpack_from at literal offset 40"]),
        ('p = struct.Struct(f"<BBBBQ{n}Q")\n', ["struct call Struct with a literal format"]),
        ('v = int.from_bytes(h[8:16], "little")\n', ["int.from_bytes"]),
        ('w = memoryview(m).cast("Q")\n', ["memoryview cast to 'Q'"]),
        ("STAMP_OFFSET: Final = 0\n", ["offset constant STAMP_OFFSET"]),
    ],
)
def test_layout_guard_reports_each_kind_of_site(source: str, expected: list[str]) -> None:
    reported = " | ".join(finding for _, finding in layout_findings(source))
    assert all(part in reported for part in expected), reported


@pytest.mark.parametrize(
    "source",
    [
        "X = struct.Struct(U64_FORMAT)\n",
        "v = _U64.unpack_from(buf, RING_HEAD_OFFSET)[0]\n",
        'print(f"{name:<28} {score:>6}")\n',
        'seed = int.from_bytes(digest[:6], "big")\n',
        'view = memoryview(m).cast("B")\n',
        'label = f"<{key}/v{version}>"\n',
    ],
)
def test_layout_guard_leaves_other_code_alone(source: str) -> None:
    assert layout_findings(source) == []


# -- install and CI, as a new user meets them ----------------------------------------


def test_license_is_an_spdx_string_with_its_file() -> None:
    """No setuptools license-table deprecation warning: PEP 639's SPDX string and LICENSE."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["license"] == "Apache-2.0"
    assert project["license-files"] == ["LICENSE"]
    assert (ROOT / "LICENSE").read_text().lstrip().startswith("Apache License")


def test_readme_has_two_setup_commands_and_ci_runs_the_test_one() -> None:
    readme = (ROOT / "README.md").read_text()
    fences = re.findall(r"```sh\n(.*?)```", readme, re.S)
    first_two = [fence.strip() for fence in fences[:2]]
    assert first_two == [
        "bash .ci/setup && .venv/bin/shmring check",
        "bash .ci/setup && .venv/bin/python -m pytest",
    ], first_two
    run = (ROOT / ".ci" / "run").read_text().splitlines()
    assert first_two[1] in run, "CI must run the README's test command"
    assert "bash .ci/install_check" in run  # the wheel, installed alone, from outside the clone
    setup = (ROOT / ".ci" / "setup").read_text()
    assert " -q " not in setup and ">/dev/null" not in setup  # pip's progress is shown
