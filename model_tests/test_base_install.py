"""The base install (numpy, msgspec, xxhash) is the whole transport for msgpack trees and arrays.

Each test runs a fresh interpreter whose first statement puts a finder at the
head of its own `sys.meta_path` that refuses torch, PyAV and cuda-python as if
they were not installed (nothing in this process is patched). In it a
Connector carries a msgpack tree and numpy arrays over the ring and the pool,
and none of the three is ever imported; a feature that needs an extra raises
`MissingExtraError` (a `ShmringError`) naming ``pip install 'shmring[EXTRA]'``.
`.ci/install_check` does the same from a built wheel in a fresh venv.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXTRAS = ("torch", "av", "cuda")

REFUSE_EXTRAS = f"""
import importlib.abc, sys
REFUSED = {EXTRAS!r}

class RefuseExtras(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in REFUSED:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None

assert not [m for m in sys.modules if m.partition(".")[0] in REFUSED]
sys.meta_path.insert(0, RefuseExtras())
"""

# What the CI's wheel check runs too (.ci/install_check): put/get, then nothing of the extras.
PUT_GET = """
import sys
import numpy
import shmring

root = sys.argv[1]
with shmring.Connector("base", shm_root=root) as sender, \\
        shmring.Connector("base", shm_root=root) as receiver:
    tree = {"tokens": [1, 2, 3], "meta": {"id": "req_0", "score": 0.5}}
    small = numpy.arange(256, dtype=numpy.float32).reshape(16, 16)
    large = numpy.arange(1 << 20, dtype=numpy.uint8)  # more than the ring admits
    for key, value in (("tree", tree), ("small", {"a": small}), ("large", large)):
        descriptor = sender.put("thinker", "talker", key, value)
        got = receiver.get("thinker", "talker", key, descriptor=descriptor)
        assert got.delivered, (key, got)
        if key == "tree":
            assert got.value == tree, got.value
        elif key == "small":
            assert (got.value["a"] == small).all() and got.value["a"].dtype == small.dtype
        else:
            assert (got.value == large).all()
loaded = sorted(m for m in sys.modules if m.partition(".")[0] in ("torch", "av", "cuda"))
assert not loaded, f"optional modules imported: {loaded}"
print("base put/get ok")
"""


def _run(body: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", REFUSE_EXTRAS + textwrap.dedent(body), *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
        check=False,
    )


def test_the_hook_refuses_the_extras() -> None:
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


def test_put_get_of_a_tree_and_arrays_needs_no_extra(tmp_path: Path) -> None:
    done = _run(PUT_GET, str(tmp_path))
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip() == "base put/get ok"


def test_a_feature_without_its_extra_names_the_extra() -> None:
    done = _run(
        """
        import importlib
        from shmring import MissingExtraError, ShmringError
        from shmring.impl.codec import wire
        from shmring.impl.registered import cuda_driver

        cases = (
            ("shmring.impl.registered.transfer", "torch"),
            ("shmring.impl.registered.arena", "torch"),
            ("shmring.impl.registered.video", "video"),
        )
        for module, extra in cases:
            try:
                importlib.import_module(module)
            except MissingExtraError as error:
                assert isinstance(error, ShmringError) and isinstance(error, ImportError)
                print(extra, error.extra, str(error).endswith(f"pip install 'shmring[{extra}]'"))
            sys.modules.pop(module, None)
        for call, extra in ((wire.load_torch, "torch"), (cuda_driver.load_runtime, "cuda")):
            try:
                call()
            except MissingExtraError as error:
                print(extra, error.extra, str(error).endswith(f"pip install 'shmring[{extra}]'"))
        """
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines() == [
        "torch torch True",
        "torch torch True",
        "video video True",
        "torch torch True",
        "cuda cuda True",
    ], done.stdout


def test_check_sections_that_move_tensors_name_the_torch_extra() -> None:
    done = _run(
        """
        from shmring.cli import main
        sys.exit(main(["check", "--only", "model", "--only", "faults", "--database", "none"]))
        """
    )
    assert done.returncode == 2, done.stdout + done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("shmring check: faults need torch"), line
    assert "pip install 'shmring[torch]'" in line and "--only model" in line, line
    assert done.stdout == ""
