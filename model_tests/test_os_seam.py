"""The OS seam's own behaviour (what every fault plan wraps)."""

from __future__ import annotations

import os
import subprocess
import sys

from shmring.impl.os_seam import DEFAULT_OS


def test_pidfd_alive_works_for_descriptors_numbered_above_1024() -> None:
    """Regression: the long restart campaign opened >1024 descriptors and
    `select` refused the pidfd ("filedescriptor out of range")."""
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE
    )
    pidfd = DEFAULT_OS.pidfd_open(child.pid)
    high = os.dup2(pidfd, 1500)
    try:
        assert DEFAULT_OS.pidfd_alive(high) is True
        assert child.stdin is not None
        child.stdin.close()
        child.wait(timeout=30)
        assert DEFAULT_OS.pidfd_alive(high) is False
    finally:
        os.close(high)
        os.close(pidfd)
        if child.poll() is None:
            child.kill()
            child.wait(timeout=30)
