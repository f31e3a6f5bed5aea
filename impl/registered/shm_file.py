"""One shared-memory file this process created and maps read-write (`ShmFile`).

Per-transfer segments (`shmring.impl.registered.registration`), the copying path's
unregistered segments (`shmring.impl.registered.transfer`) and the registered arena's
file are each one of these. Every OS call goes through the `OsFacade`.
"""

from __future__ import annotations

import contextlib
import mmap
import os
from typing import TYPE_CHECKING

from ..directory import Directory, as_directory
from ..errors import ClosedError
from ..extras import import_extra
from ..os_seam import DEFAULT_OS, OPEN_FLAGS_CREATE, OsFacade

if TYPE_CHECKING:
    import torch
else:  # the `torch` extra: a MissingExtraError naming it when absent
    torch = import_extra("torch", "the registered transfer (shmring.impl.registered)")


class ShmFile:
    """A shared-memory file this process created and maps read-write.

    Owns the mapping and `tensor`, a torch uint8 tensor over all of it. The
    mapping is closed by `unmap`; if some view of it is still alive (a
    traceback, a caller's tensor), closing is left to the last view, so a
    mapping is never closed under a live view.
    """

    _mapping: mmap.mmap | None = None
    _tensor: torch.Tensor | None = None
    _linked = False

    def __init__(
        self, directory: str | Directory, name: str, length: int, os_facade: OsFacade = DEFAULT_OS
    ) -> None:
        if length <= 0:
            raise ValueError(f"shared-memory file length must be positive: length={length}")
        # Created and unlinked through the directory (a verified descriptor for
        # a sender's and a registry's files: issue 22, defect 1).
        self._dir = as_directory(directory, os_facade)
        self.name = name
        self.path = os.path.join(self._dir.path, name)
        self.length = length
        self._os = os_facade
        fd = self._dir.open(name, OPEN_FLAGS_CREATE)
        self._linked = True
        try:
            # What a descriptor naming this file carries, so a receiver can
            # tell this file from another one put at its name (issue 22).
            info = os_facade.fstat(fd)
            self.identity: tuple[int, int] = (info.st_dev, info.st_ino)
            self.owner_uid: int = info.st_uid
            os_facade.ftruncate(fd, length)
            os_facade.fallocate(fd, length)
            self._mapping = os_facade.mmap(fd, length)
        except BaseException:
            self._discard_name()
            raise
        finally:
            os_facade.close(fd)
        # Over a memoryview, not the mmap itself: torch keeps only a reference
        # to the object it is given, and a memoryview holds an export, so the
        # mapping cannot be closed while any tensor over it lives (given the
        # mmap, close() unmapped under live tensors, and a later read of one
        # crashed the process: a forked child's release did, 2026-12-04).
        self._tensor = torch.frombuffer(memoryview(self._mapping), dtype=torch.uint8)
        self.address = self._tensor.data_ptr()

    @property
    def mapped(self) -> bool:
        return self._mapping is not None

    @property
    def linked(self) -> bool:
        """Whether this process has not unlinked the name (a receiver may have)."""
        return self._linked

    @property
    def tensor(self) -> torch.Tensor:
        if self._tensor is None:
            raise ClosedError(f"shared-memory file is unmapped: path={self.path!r}")
        return self._tensor

    def memoryview(self) -> memoryview:
        if self._mapping is None:
            raise ClosedError(f"shared-memory file is unmapped: path={self.path!r}")
        return memoryview(self._mapping)

    def unmap(self) -> None:
        """Close the mapping now, or when its last outside view dies. Idempotent."""
        mapping, self._mapping, self._tensor = self._mapping, None, None
        if mapping is not None:
            # A view alive: the mapping closes when it dies.
            with contextlib.suppress(BufferError):
                mapping.close()

    def _release_exports(self) -> None:
        """`lifecycle.release_inherited` in a forked child: drop our tensor over the mapping."""
        self._tensor = None

    def unlink(self) -> None:
        """Remove the name; a receiver that already unlinked it is fine. Idempotent.

        If the unlink fails the name is still ours, so a later call retries it.
        """
        if self._linked:
            with contextlib.suppress(FileNotFoundError):
                self._dir.unlink(self.name)
            self._linked = False

    def _discard_name(self) -> None:
        self._linked = False
        with contextlib.suppress(OSError):
            self._dir.unlink(self.name)
