"""What the conformance modules share: facades as vllm-omni configures them, and an unlink seam.

The `test_conformance_*` modules mirror vllm-omni's own connector tests
(``tests/distributed/omni_connectors/``), one module per upstream file,
each test naming the upstream test whose behaviour it checks
(docs/conformance.md has the table). They drive `shmring.SharedMemoryConnector`
only through vllm-omni's call shapes; faults come through the OS seam.
"""

from __future__ import annotations

import errno
import os
from collections import Counter
from typing import Any

from ..impl.compat import SharedMemoryConnector
from ..impl.names import DEFAULT_SHM_ROOT, fallback_segment_file_name
from ..impl.os_seam import OsFacade

SHM_ROOT = DEFAULT_SHM_ROOT  # vllm-omni's tests look for files under /dev/shm


def facade(scope: str, stage: Any = 0, **extra: Any) -> SharedMemoryConnector:
    """A facade of `scope` for `stage`, its options under ``extra`` as vllm-omni's specs put them."""
    os_facade = extra.pop("os_facade", None)
    return SharedMemoryConnector(
        {"stage_id": stage, "extra": {"wakeup_scope": scope, **extra}}, os_facade=os_facade
    )


def file_of(metadata: dict[str, Any]) -> str:
    """The file a put's metadata names (``os.path.join("/dev/shm", name)``, as vllm-omni's tests do)."""
    handle = metadata.get("host_ring") or metadata["shm"]
    return os.path.join(SHM_ROOT, handle["name"])


def segment_name(key: str, edge: tuple[str, str] = ("0", "1")) -> str:
    """The file name of the key's fallback segment on `edge`."""
    return fallback_segment_file_name(edge, key)


class UnlinkFaults(OsFacade):
    """The OS seam with unlinks of chosen files failing (EACCES, or any exception given).

    `fail(name, times)`: the next `times` unlinks of a file named `name`
    fail (None: every one until `heal`); `attempts[name]` counts them all.
    """

    def __init__(self) -> None:
        self.attempts: Counter[str] = Counter()
        self._failing: dict[str, tuple[int | None, BaseException | None]] = {}

    def fail(self, name: str, times: int | None = 1, error: BaseException | None = None) -> None:
        self._failing[name] = (times, error)

    def heal(self) -> None:
        self._failing.clear()

    def _check(self, name: str) -> None:
        entry = self._failing.get(name)
        if name in self._failing or self.attempts.get(name):
            self.attempts[name] += 1
        if entry is None:
            return
        times, error = entry
        if times is not None:
            if times <= 1:
                del self._failing[name]
            else:
                self._failing[name] = (times - 1, error)
        raise error if error is not None else PermissionError(errno.EACCES, "injected", name)

    def unlink_at(self, dir_fd: int, name: str) -> None:
        self._check(name)
        super().unlink_at(dir_fd, name)

    def unlink(self, path: str) -> None:
        self._check(os.path.basename(path))
        super().unlink(path)


__all__ = ["SHM_ROOT", "UnlinkFaults", "facade", "file_of", "segment_name"]
