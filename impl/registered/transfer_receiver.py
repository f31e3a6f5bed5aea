"""The transfer API's consumer side: `TransferReceiver` maps what a descriptor names.

`receive` is `shmring.spec.registration.process_receive` for each segment
field (map, then unlink the name) and the arena reader's claim for each arena
field; it takes all of a descriptor's fields or none: every system call comes
first, so an OS failure takes nothing and the same descriptor may be received
again. With `enable_borrowed_frames` the arrays are borrowed views
(`shmring.impl.registered.views`), otherwise independent copies.
"""

from __future__ import annotations

import contextlib
import os
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import lifecycle
from ..errors import ClosedError, CorruptFrameError, ForkedError
from ..extras import import_extra
from ..names import DEFAULT_SHM_ROOT, deployment_directory, validate_scope
from ..os_seam import DEFAULT_OS, OsFacade
from .arena import ArenaFrameDescriptor, ArenaReader
from .transfer_descriptor import (
    _TORCH_DTYPES,
    CARRIER_ARENA,
    TransferDescriptor,
    TransferOptions,
)
from .views import borrow_mapped, check_made, copy_mapped, map_segment, unlink_segment

if TYPE_CHECKING:
    import torch
else:  # the `torch` extra: a MissingExtraError naming it when absent
    torch = import_extra("torch", "the registered transfer (shmring.impl.registered)")


def restore_tensor(array: np.ndarray, dtype: str) -> torch.Tensor:
    """The sender's tensor over `array`'s memory (no copy); bfloat16 by a dtype view of the uint16 bits."""
    if dtype not in _TORCH_DTYPES:
        raise CorruptFrameError(f"unknown dtype: dtype={dtype!r}")
    tensor = torch.from_numpy(array)
    target = _TORCH_DTYPES[dtype]
    return tensor if tensor.dtype == target else tensor.view(target)


class TransferReceiver:
    """Consumer side: maps what a descriptor names; borrows or copies it out."""

    _closed = False
    _inherited = False  # inherited through fork (`impl.lifecycle`)

    def __init__(
        self,
        scope: str,
        options: TransferOptions | None = None,
        *,
        os_facade: OsFacade = DEFAULT_OS,
        shm_root: str = DEFAULT_SHM_ROOT,
    ) -> None:
        options = TransferOptions.of(options)
        self.scope = validate_scope(scope)
        self.options = options
        self._os = os_facade
        self._directory = deployment_directory(scope, shm_root)
        self._readers: dict[str, ArenaReader] = {}
        lifecycle.track(self, close_at_exit=False)  # it owns no file; a fork child's copy is inert

    def _forked_in_child(self) -> None:
        """`lifecycle`: in a forked child this receiver is the parent's: ForkedError, close releases."""
        self._inherited = True
        self._closed = True

    def _reader(self, name: str, made: tuple[int, tuple[int, int]] | None = None) -> ArenaReader:
        """The arena reader of `name`; with `made`, of that very file, else CorruptFrameError.

        `made` is a descriptor's (owner uid, (st_dev, st_ino)). A cached
        reader of another file of that name (replaced since) is dropped and
        the name opened again; a file that still is not the descriptor's is
        refused (`views.check_made`), never read.
        """
        reader = self._readers.get(name)
        if reader is not None and made is not None and (reader.owner_uid, reader.identity) != made:
            del self._readers[name]
            reader.close()
            reader = None
        if reader is None:
            reader = ArenaReader(self._directory, name, self._os)
            try:
                if made is not None:
                    check_made(os.path.join(self._directory, name), reader.file_info, made)
            except BaseException:
                reader.close()
                raise
            self._readers[name] = reader
        return reader

    def receive(self, descriptor: TransferDescriptor) -> dict[str, np.ndarray]:
        """Every field as a numpy array of its wire dtype.

        With `enable_borrowed_frames` the arrays are borrowed views: the
        receiver owns the memory until the last object derived from an array
        dies (see `views.LeaseOwner`); they may be written. Otherwise they are
        independent copies and the shared memory is released before this
        returns. When a system call fails (mapping a segment, opening the
        arena) nothing is taken and the same descriptor may be received again.
        """
        if self._closed:
            if self._inherited:
                raise ForkedError(
                    f"receiver inherited through fork: scope={self.scope!r}; "
                    f"make a new TransferReceiver in this process after the fork"
                )
            raise ClosedError(f"receiver is closed: scope={self.scope!r}")
        if descriptor.scope != self.scope:
            raise CorruptFrameError(
                f"descriptor for scope={descriptor.scope!r}, receiver scope={self.scope!r}"
            )
        borrowed = self.options.enable_borrowed_frames
        for field in descriptor.fields:
            field.check()
        # 1. Every system call first (arena readers, segment mappings), so an
        #    OS failure here takes nothing: all fields stay for a retry.
        mapped: dict[str, Any] = {}
        received: dict[str, np.ndarray] = {}
        try:
            for field in descriptor.fields:
                if field.carrier == CARRIER_ARENA:
                    self._reader(field.file, (field.owner_uid, field.identity))
                else:
                    mapped[field.name] = map_segment(
                        self._directory,
                        field.file,
                        self._os,
                        unlink=False,
                        made=(field.owner_uid, field.identity),
                    )
            # 2. Take every field (no system call).
            for field in descriptor.fields:
                if field.carrier == CARRIER_ARENA:
                    frame = ArenaFrameDescriptor(
                        field.file, field.position, field.key, field.nbytes
                    )
                    reader = self._readers[field.file]  # opened and checked in step 1
                    take = reader.borrow if borrowed else reader.copy
                    received[field.name] = take(frame, field.wire_dtype, field.shape)
                else:
                    take_mapped = borrow_mapped if borrowed else copy_mapped
                    mapping = mapped.pop(field.name)
                    received[field.name] = take_mapped(
                        mapping, field.file, field.wire_dtype, field.shape
                    )
        except BaseException:
            received.clear()  # release what was taken; the traceback must not hold leases
            for mapping in mapped.values():
                mapping.close()
            raise
        # 3. The commit: taken segments' names go. A name that cannot be
        #    removed now is removed by the sender's close; what was taken stays taken.
        for field in descriptor.fields:
            if field.carrier != CARRIER_ARENA:
                with contextlib.suppress(OSError):
                    unlink_segment(self._directory, field.file, self._os)
        return received

    def receive_tensors(self, descriptor: TransferDescriptor) -> dict[str, torch.Tensor]:
        """Like `receive`, with each field restored to its torch dtype (bfloat16 by dtype view)."""
        arrays = self.receive(descriptor)
        by_name = {f.name: f for f in descriptor.fields}
        return {name: restore_tensor(array, by_name[name].dtype) for name, array in arrays.items()}

    def close(self) -> None:
        """Drop the arena mappings; live borrowed views keep theirs. Idempotent."""
        if self._inherited:  # release the child's copies of the mappings, mark no frame
            lifecycle.release_inherited(self)
            self._readers.clear()
            return
        self._closed = True
        for reader in self._readers.values():
            reader.close()
        self._readers.clear()

    def __enter__(self) -> TransferReceiver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
