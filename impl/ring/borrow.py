"""A claimed frame handed out as a lease (see `shmring.impl.ring` for the rationale)."""

from __future__ import annotations

import ctypes
import sys

from shmring.impl.errors import (
    ClosedError,
)
from shmring.impl.frame_io import (
    store_frame_state_in_header,
)
from shmring.spec.layout import (
    FRAME_STATE_DONE,
)


class Lease:
    """A claimed frame whose payload is read in place.

    `view` is a read-only memoryview *borrowed* from the reader's mapping of
    the ring file. The ring (not the caller) owns the memory; it stays valid
    and unchanged until the lease is released, because a CLAIMED frame is
    never reclaimed. `release()` marks the frame DONE so the producer may
    reuse the space. Every view made from `view` (slices, `memoryview()`,
    numpy.frombuffer, torch.frombuffer) keeps the lease's private exporter
    alive; while one lives, `release()` raises BufferError and the frame stays
    CLAIMED: call it again once they are gone. An unreleased lease pins the
    ring at its position: release it, or use it as a context manager. The
    views stay valid after the reader is closed (the mapping lives on until
    the last of them dies).
    """

    __slots__ = ("_exporter", "_header", "_view", "position")

    def __init__(
        self, header: memoryview, exporter: ctypes.Array[ctypes.c_char], position: int
    ) -> None:
        self._header = header  # writable slice over the frame header (state field)
        # A ctypes array over the payload bytes: the one exporter every view of
        # the payload derives from, so its reference count tells whether any lives.
        self._exporter: ctypes.Array[ctypes.c_char] | None = exporter
        self._view: memoryview | None = memoryview(exporter).cast("B").toreadonly()
        self.position = position  # the frame's position (its descriptor)

    @property
    def view(self) -> memoryview:
        view = self._view
        if view is None:
            raise ClosedError(f"lease already released: position={self.position}")
        return view

    @property
    def released(self) -> bool:
        return self._exporter is None

    def release(self) -> None:
        """Give the frame back (DONE). Idempotent; BufferError while views of it live."""
        view, self._view = self._view, None
        if view is not None:
            view.release()
        exporter = self._exporter
        if exporter is None:
            return
        # References: our slot, the local, getrefcount's argument; any more is a live view.
        if sys.getrefcount(exporter) > 3:
            raise BufferError(
                f"views of the lease's payload still live; frame stays claimed: position={self.position}"
            )
        self._exporter = None
        del exporter
        store_frame_state_in_header(self._header, FRAME_STATE_DONE)
        self._header.release()

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()

    def __repr__(self) -> str:
        state = "released" if self._exporter is None else f"{len(self._exporter)} bytes"
        return f"Lease(position={self.position}, {state})"
