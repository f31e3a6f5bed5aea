"""The transport installs and runs without the checking toolkit (the `check` extra).

Each test runs a fresh interpreter that, first thing, puts a finder at the head
of its own `sys.meta_path` refusing hypothesis, pytest, crosshair and rich as
if they were not installed; nothing in this process is patched. In it, the
whole of `shmring`, `shmring.impl` and `shmring.spec` imports and a Connector
delivers over the ring and the fallback; `shmring check` and `shmring report
merge` exit 2 naming `pip install 'shmring[check]'`; `shmring stat` works.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOOLKIT = ("hypothesis", "pytest", "_pytest", "crosshair", "rich")

# Runs first in the child: from here on the toolkit is "not installed".
REFUSE_TOOLKIT = f"""
import importlib.abc, sys
REFUSED = {TOOLKIT!r}

class RefuseToolkit(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in REFUSED:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None

early = sorted(m for m in sys.modules if m.partition(".")[0] in REFUSED)
assert not early, f"loaded before the hook: {{early}}"
sys.meta_path.insert(0, RefuseToolkit())
"""


def _run(body: str, *args: str) -> subprocess.CompletedProcess[str]:
    code = REFUSE_TOOLKIT + textwrap.dedent(body)
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=ROOT, timeout=300
    )


def test_the_hook_refuses_the_toolkit() -> None:
    """The guard itself: with the hook in place, a toolkit import fails as if not installed."""
    done = _run(
        """
        for name in REFUSED:
            try:
                __import__(name)
            except ModuleNotFoundError:
                continue
            raise SystemExit(f"{name} imported")
        print("refused")
        """
    )
    assert done.returncode == 0 and done.stdout.strip() == "refused", done.stderr


def test_the_transport_imports_and_delivers_without_the_toolkit(tmp_path: Path) -> None:
    done = _run(
        """
        import importlib, pkgutil, sys
        import numpy
        import shmring, shmring.impl, shmring.spec, shmring.cli

        # Every module of the transport and of the model, not only the connector's path.
        for package in (shmring.impl, shmring.spec):
            for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
                importlib.import_module(info.name)

        root = sys.argv[1]
        with shmring.Connector("notoolkit", shm_root=root) as sender, \\
                shmring.Connector("notoolkit", shm_root=root) as receiver:
            small = {"tokens": [1, 2, 3]}
            large = numpy.arange(1 << 20, dtype=numpy.uint8)  # more than the ring holds
            first = sender.put("thinker", "talker", "small", small)
            second = sender.put("thinker", "talker", "large", large)
            routes = [first.route.name, second.route.name]
            got = receiver.get("thinker", "talker", "small", descriptor=first)
            assert got.delivered and got.value == small, got
            got = receiver.get("thinker", "talker", "large", descriptor=second)
            assert got.delivered and (got.value == large).all(), got
        loaded = sorted(m for m in sys.modules if m.partition(".")[0] in REFUSED)
        print(",".join(routes), loaded)
        """,
        str(tmp_path),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    routes, loaded = done.stdout.strip().split(" ", 1)
    assert routes.split(",") == ["RING", "POOL"], routes  # issue 13: the pool carries it
    assert loaded == "[]"


def test_check_commands_without_the_toolkit_name_the_extra(tmp_path: Path) -> None:
    report = tmp_path / "r.json"
    report.write_text("{}")
    for argv, missing in (
        (["check", "--only", "model"], "hypothesis, pytest, crosshair-tool, rich are"),
        (["check", "--list-units"], "hypothesis, pytest, crosshair-tool, rich are"),
        (["report", "merge", str(report)], "rich is"),
    ):
        done = _run(
            """
            from shmring.cli import main
            sys.exit(main(sys.argv[1:]))
            """,
            *argv,
        )
        assert done.returncode == 2, (argv, done.stdout, done.stderr)
        assert done.stderr.strip() == (
            f"ToolkitMissingError: shmring {' '.join(argv[:2]) if argv[0] == 'report' else 'check'}"
            f" needs the checking toolkit, and {missing} not installed: "
            "pip install 'shmring[check]'"
        ), done.stderr
        assert done.stdout == ""


def test_stat_needs_only_the_transport(tmp_path: Path) -> None:
    done = _run(
        """
        from shmring.cli import main
        sys.exit(main(sys.argv[1:]))
        """,
        "stat",
        "--scope",
        "idle",
        "--shm-root",
        str(tmp_path),
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().endswith("idle: nothing in shared memory for this scope")
    assert list(tmp_path.iterdir()) == []


# distribution -> the module it provides, for the base install and the extras.
RUNTIME_MODULES = {"numpy": "numpy", "msgspec": "msgspec", "xxhash": "xxhash"}
EXTRA_MODULES = {"torch": "torch", "av": "av", "cuda-python": "cuda"}
# Payload types the codec registers when the application has them (never required).
OPTIONAL_IN_IMPL = {"vllm", "PIL"}


def _requirement_name(requirement: str) -> str:
    for stop in "<>=!~[; ":
        requirement = requirement.split(stop)[0]
    return requirement


def _third_party_imports(paths: list[Path]) -> set[str]:
    found: set[str] = set()
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                found.update(alias.name.partition(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found.add(node.module.partition(".")[0])
    return found - set(sys.stdlib_module_names) - {"shmring", "__future__"}


def test_runtime_dependencies_are_what_the_transport_imports() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    runtime = {_requirement_name(r) for r in project["dependencies"]}
    assert runtime == set(RUNTIME_MODULES), runtime
    extras = project["optional-dependencies"]
    assert {e: [_requirement_name(r) for r in extras[e]] for e in ("torch", "video", "cuda")} == {
        "torch": ["torch"],
        "video": ["av"],
        "cuda": ["cuda-python"],
    }
    assert extras["all"] == ["shmring[torch,video,cuda,check]"]
    check = {_requirement_name(r) for r in extras["check"]}
    assert check == {"hypothesis", "pytest", "crosshair-tool", "rich"}, check
    # The transport, the model and the top-level package (API and CLI), lazy imports included.
    transport = [*(ROOT / "impl").rglob("*.py"), *(ROOT / "spec").rglob("*.py")]
    imported = _third_party_imports([*transport, *(ROOT / "shmring").glob("*.py")])
    expected = set(RUNTIME_MODULES.values()) | set(EXTRA_MODULES.values()) | OPTIONAL_IN_IMPL
    assert imported == expected, imported
