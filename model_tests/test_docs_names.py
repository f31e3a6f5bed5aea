"""Docs cannot cite code that is gone: every dotted code name in docs/ and spec/ docstrings resolves.

A backticked ``module.name`` (``producers.process_scan``, ``claim.FallbackClaim``,
``shmring.impl.ring.engine``, ``spec.ring.GetStatus.STALE``) in docs/*.md, the
README or a docstring of spec/ names a module of shmring by its last
component (or its dotted path) and then attributes of it; this test imports
it and walks the attributes (a dataclass field or an annotated attribute of a
class counts). A backticked name whose first part is no shmring module
(``os.open``, ``np.ndarray``) is not shmring's to check. A file name
(``layout.py``) is not a code name.
"""

from __future__ import annotations

import ast
import importlib
import pkgutil
import re
import sys
from functools import cache
from pathlib import Path
from typing import Any

import pytest

import shmring

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("shmring.spec", "shmring.impl", "shmring.fault_injection", "shmring.check")
# `name.name...`, optionally called: `producers.process_close` or `engine.put()`.
DOTTED = re.compile(r"`((?:[A-Za-z_]\w*\.)+[A-Za-z_]\w*)(?:\(\))?`")
# Backticked text that looks dotted but names no shmring code: a variable of
# the prose (an mmap called `mapping`), mutmut's names of mutants.
NOT_CODE_NAMES = {"mapping.close"}
FILE_SUFFIXES = {"py", "md", "json", "toml", "txt", "whl", "cfg", "png", "yaml", "yml", "sh"}


@cache
def modules_by_last_part() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {"shmring": ["shmring"]}
    for name in PACKAGES:
        package = importlib.import_module(name)
        found.setdefault(name.rpartition(".")[2], []).append(name)
        for info in pkgutil.walk_packages(package.__path__, name + "."):
            if info.name.rpartition(".")[2].startswith("test_"):
                continue
            found.setdefault(info.name.rpartition(".")[2], []).append(info.name)
    return found


def _attribute(obj: Any, part: str, path: str) -> tuple[bool, Any]:
    if hasattr(obj, part):
        return True, getattr(obj, part)
    if isinstance(obj, type(shmring)):
        try:
            return True, importlib.import_module(f"{path}.{part}")
        except ImportError:
            return False, None
    if isinstance(obj, type):
        for klass in obj.__mro__:
            if part in getattr(klass, "__dataclass_fields__", {}) or part in vars(klass).get(
                "__annotations__", {}
            ):
                return True, None  # a field: nothing further to walk
    return False, None


def resolves(dotted: str) -> bool | None:
    """True or False for a shmring name; None when the first part is no shmring module."""
    first, *rest = dotted.split(".")
    if first in sys.stdlib_module_names or "__mutmut_" in dotted or dotted in NOT_CODE_NAMES:
        return None  # `gc.collect` is Python's gc, not shmring.impl.discovery.gc
    if dotted.startswith("shmring."):
        candidates = ["shmring"]
        rest = dotted.split(".")[1:]
    else:
        candidates = modules_by_last_part().get(first, [])
    if not candidates:
        return None
    for module_name in candidates:
        obj: Any = importlib.import_module(module_name)
        path = module_name
        for part in rest:
            ok, obj = _attribute(obj, part, path)
            if not ok:
                break
            path = f"{path}.{part}"
            if obj is None:
                break
        else:
            return True
        if ok:
            return True
    return False


def _cited() -> list[tuple[str, str]]:
    texts = [(str(path.relative_to(ROOT)), path.read_text()) for path in ROOT.glob("docs/*.md")]
    texts.append(("README.md", (ROOT / "README.md").read_text()))
    for path in sorted((ROOT / "spec").glob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                doc = ast.get_docstring(node)
                if doc:
                    texts.append((f"{path.relative_to(ROOT)}:{getattr(node, 'name', '')}", doc))
    cited = []
    for where, text in texts:
        for match in DOTTED.finditer(text):
            name = match.group(1)
            if name.rpartition(".")[2] in FILE_SUFFIXES:
                continue
            cited.append((where, name))
    return cited


def test_the_resolver_tells_live_names_from_gone_ones() -> None:
    assert resolves("producers.process_producer_close") is True
    assert resolves("discovery.stamp.StageBell") is True
    assert resolves("shmring.impl.ring.engine") is True
    assert resolves("producers.process_close") is False
    assert resolves("claim._lend") is False
    assert resolves("os.open") is None and resolves("gc.collect") is None


def test_every_cited_code_name_resolves() -> None:
    cited = _cited()
    assert len(cited) > 100  # the docs do cite code
    stale = sorted({f"{where}: {name}" for where, name in cited if resolves(name) is False})
    assert not stale, "stale code names:\n" + "\n".join(stale)


def test_generated_figures_match_the_code() -> None:
    """docs/generate.py --check: every figure between gen markers is what the code says now."""
    import subprocess

    done = subprocess.run(
        [sys.executable, str(ROOT / "docs" / "generate.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    text = (ROOT / "docs" / "campaigns.md").read_text()
    assert (
        "<!-- gen:units_table -->" in text
        and "<!-- gen:explore_ci_budget -->" in (ROOT / "docs" / "model.md").read_text()
    )


def test_docs_index_sends_each_reader_somewhere_that_exists() -> None:
    index = (ROOT / "docs" / "index.md").read_text()
    for reader in ("a user of the transport", "a campaign runner", "a reviewer of the model"):
        assert reader in index
    for page in re.findall(r"`([a-z-]+\.md)`", index):
        assert (ROOT / "docs" / page).is_file(), page
    assert "docs/index.md" in (ROOT / "README.md").read_text()


# -- docs/code-layout.md: the map of impl/ is the code's ------------------------------------


def _code_layout() -> Any:
    sys.path.insert(0, str(ROOT / "model_tests"))
    try:
        return importlib.import_module("code_layout")
    finally:
        sys.path.remove(str(ROOT / "model_tests"))


def test_code_layout_is_generated_from_the_code() -> None:
    """The per-module section of docs/code-layout.md is what the generator writes today."""
    layout = _code_layout()
    document = (ROOT / "docs" / "code-layout.md").read_text()
    assert layout.replaced(document, layout.generate()) == document, (
        "docs/code-layout.md is behind the code: run model_tests/code_layout.py --write"
    )


def test_the_generator_reads_sizes_jobs_and_imports_from_the_source(tmp_path: Path) -> None:
    """A planted package: its size, docstring and relative and absolute imports come out."""
    impl = tmp_path / "impl"
    (impl / "pkg").mkdir(parents=True)
    (impl / "__init__.py").write_text('"""Top."""\n')
    (impl / "base.py").write_text('"""The base | of it."""\nimport os\n')
    (impl / "pkg" / "__init__.py").write_text('"""A package."""\nfrom . import leaf\n')
    (impl / "pkg" / "leaf.py").write_text(
        '"""A leaf."""\n\nfrom ..base import x\nfrom shmring.impl import pkg\n'
        "from ...spec.layout import Y\n"
    )
    layout = _code_layout()
    text = layout.generate(impl)
    assert "| `pkg/leaf.py` | 5 | A leaf. | `base`, `pkg` | `spec.layout` |" in text
    assert "| `pkg/__init__.py` | 2 | A package. | `pkg.leaf` |  |" in text
    assert "| `base.py` | 2 | The base \\| of it. | none |  |" in text
    assert "4 modules, 10 lines; the largest is `impl/pkg/leaf.py` (5 lines)." in text
    with pytest.raises(ValueError, match="markers"):
        layout.replaced("no markers here", text)


def test_every_impl_module_has_a_place_in_the_concept_table() -> None:
    """A new module must be placed in the hand-written concept table, under its package's row."""
    document = (ROOT / "docs" / "code-layout.md").read_text()
    table = document.split("## `impl/`, by concept", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in table.splitlines() if line.startswith("| `")]
    missing = []
    for path in sorted((ROOT / "impl").rglob("*.py")):
        relative = path.relative_to(ROOT / "impl")
        if relative.name == "__init__.py":
            continue
        if len(relative.parts) == 1:
            placed = any(f"`{relative.name}`" in row.split(" | ")[0] for row in rows)
        else:
            package = f"`{relative.parts[0]}/`"
            placed = any(
                row.split(" | ")[0].startswith(f"| {package}") and f"`{relative.name}`" in row
                for row in rows
            )
        if not placed:
            missing.append(str(relative))
    assert missing == [], f"impl modules without a place in docs/code-layout.md: {missing}"
