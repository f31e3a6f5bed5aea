"""The table of impl's log messages (`log_messages.py`) and the check that holds records to it."""

from __future__ import annotations

import ast
import logging
import subprocess
import sys
import textwrap
from pathlib import Path

from shmring.model_tests.log_messages import MESSAGES, ImplRecordCheck, impl_directory

_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
    "exception": logging.ERROR,
    "critical": logging.CRITICAL,
}


def _module_loggers(tree: ast.Module, module: str) -> dict[str, str]:
    """Module-level `name = logging.getLogger(...)` bindings: variable -> logger name."""
    found = {}
    for node in tree.body:
        target: ast.expr | None = None
        value: ast.expr | None = None
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        elif isinstance(node, ast.AnnAssign):
            target, value = node.target, node.value
        if not (isinstance(target, ast.Name) and isinstance(value, ast.Call)):
            continue
        func = value.func
        if not (isinstance(func, ast.Attribute) and func.attr == "getLogger"):
            continue
        (arg,) = value.args
        if isinstance(arg, ast.Name) and arg.id == "__name__":
            found[target.id] = module
        else:
            assert isinstance(arg, ast.Constant) and isinstance(arg.value, str), ast.dump(arg)
            found[target.id] = arg.value
    return found


def impl_log_calls() -> set[tuple[str, int, str]]:
    """(logger name, level, format) of every log call in impl's source."""
    root = Path(impl_directory())
    calls = set()
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        parts = path.relative_to(root).with_suffix("").parts
        module = ".".join(("shmring", "impl", *parts))
        loggers = _module_loggers(tree, module)
        for node in ast.walk(tree):
            if not (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in _LEVELS
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id in loggers
            ):
                continue
            message = node.args[0]
            assert isinstance(message, ast.Constant) and isinstance(message.value, str), (
                f"{path.name}:{node.lineno}: a log call's message must be a literal format string"
            )
            calls.add((loggers[node.func.value.id], _LEVELS[node.func.attr], message.value))
    return calls


def test_the_table_holds_every_log_call_of_impl_and_nothing_else() -> None:
    calls = impl_log_calls()
    assert len(calls) >= 20  # the walk found impl's log calls (not an empty tree)
    assert calls - MESSAGES == set(), "log calls the table lacks"
    assert MESSAGES - calls == set(), "table entries no log call makes"


def _record(name: str, level: int, msg: str, pathname: str) -> logging.LogRecord:
    return logging.LogRecord(name, level, pathname, 1, msg, ("k", "e"), None)


def test_the_check_keeps_impl_records_outside_the_table_and_only_those() -> None:
    check = ImplRecordCheck()
    inside = impl_directory() + "compat_metadata.py"
    name, level, msg = sorted(MESSAGES)[0]
    check.handle(_record(name, level, msg, inside))
    assert check.wrong == []
    check.handle(_record(name, level, "XX" + msg + "XX", inside))  # the text changed
    check.handle(_record(name, logging.CRITICAL, msg, inside))  # another level
    check.handle(_record("shmring.other", level, msg, inside))  # another logger
    assert len(check.wrong) == 3, check.wrong
    check.handle(_record(name, level, "a test's own message", "/elsewhere/test_x.py"))
    assert len(check.wrong) == 3  # records not made by impl do not count


def test_a_record_impl_makes_with_a_changed_text_fails_the_test_it_happens_in(
    tmp_path: Path,
) -> None:
    """The fixture turns a wrong record into an error of the test it happened in, only that one."""
    (tmp_path / "conftest.py").write_text(
        "from shmring.model_tests.log_messages import impl_logs_known_messages, impl_records\n"
    )
    (tmp_path / "test_wrong.py").write_text(
        textwrap.dedent(
            """
            import logging
            import shmring.impl.compat_metadata as module

            def record(msg, *args):
                # a record as impl's own module makes it
                return logging.LogRecord(
                    "shmring.compat", logging.WARNING, module.__file__, 1, msg, args, None
                )

            def test_changed_text() -> None:
                logging.getLogger("shmring.compat").handle(record("XX changed"))

            def test_known_text() -> None:
                logging.getLogger("shmring.compat").handle(
                    record("shmring: refusing the descriptor of key=%r: %s", "k", "e")
                )
            """
        )
    )
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", "-p", "no:cacheprovider"]
        + ["-p", "no:xdist", "--rootdir", str(tmp_path), str(tmp_path)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "2 passed, 1 error" in done.stdout, done.stdout
    assert "ERROR test_wrong.py::test_changed_text" in done.stdout, done.stdout
    assert "does not hold" in done.stdout and "XX changed" in done.stdout, done.stdout
