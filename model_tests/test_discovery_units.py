"""Discovery and fallback pieces on their own: the error vocabulary and the dependency direction.

Using something we closed is ClosedError (trio's vocabulary; issue 11): the
stamp and the fallback writer raised BrokenError, which means the other side
changed. And liveness and names sit below discovery and the fallback: the ring
(which asks `is_holder_alive`) must not drag discovery in.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from shmring.impl.discovery import Stamp
from shmring.impl.errors import BrokenError, ClosedError
from shmring.impl.fallback import FallbackWriter
from shmring.impl.os_seam import DEFAULT_OS


class _Plan:
    nbytes = 4

    def write_into(self, buf: memoryview) -> int:
        buf[:4] = b"data"
        return 4


def test_a_closed_stamp_raises_closed_error(tmp_path: object) -> None:
    stamp = Stamp.open(str(tmp_path), DEFAULT_OS)
    assert stamp.bump() == 1 and stamp.load() == 1
    stamp.close()
    for use in (stamp.load, stamp.bump, lambda: stamp.prune_and_bump(str(tmp_path), [], 1)):
        with pytest.raises(ClosedError, match="stamp is closed"):
            use()
    stamp.close()  # idempotent


def test_a_closed_fallback_writer_raises_closed_error(tmp_path: object) -> None:
    writer = FallbackWriter(str(tmp_path), (1, 2, 0), 1 << 20, DEFAULT_OS)
    writer.close()
    with pytest.raises(ClosedError, match="fallback writer is closed") as caught:
        writer.put(("a", "b"), "k", _Plan())
    assert not isinstance(caught.value, BrokenError)


@pytest.mark.parametrize(
    ("module", "forbidden"),
    [
        ("shmring.impl.names", ("directory", "liveness", "discovery", "fallback")),
        ("shmring.impl.directory", ("liveness", "discovery", "fallback")),
        ("shmring.impl.liveness", ("directory", "discovery", "fallback")),
        ("shmring.impl.fallback", ("discovery", "liveness")),
    ],
)
def test_lower_modules_do_not_import_higher_ones(module: str, forbidden: tuple[str, ...]) -> None:
    code = (
        f"import sys, {module}\n"
        f"print(' '.join(m for m in {[f'shmring.impl.{f}' for f in forbidden]!r} "
        "if m in sys.modules))"
    )
    found = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    ).stdout.strip()
    assert found == "", f"{module} imports {found}"
