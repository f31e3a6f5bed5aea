"""Places that hold borrowed views: this process, or a second one.

Not a test file. The arena machine borrows frames, derives views and drops
them in a `LocalPlace` (this process) or a `RemotePlace` (a spawned worker
process running `serve`), through the same four calls. Derivations follow
one table (`derive`), so both places make the same kinds of objects:

    rgb     (H x W x 3 uint8 array)  -> asarray, slice: rgb; reshape, dtype: array;
                                        torch: tensor; pyav: frame
    array   (any other array)        -> asarray, slice, reshape, dtype: array; torch: tensor
    tensor  (torch tensor)           -> slice, reshape, dtype: tensor; asarray: array
    frame   (PyAV VideoFrame)        -> nothing

The worker is the kit's `WorkerProcess` (spawned: it imports torch). Every
call to it is answered within WORKER_TIMEOUT seconds or the worker is killed
and the call fails, so no test can hang on it.
"""

from __future__ import annotations

from multiprocessing.connection import Connection
from typing import Any, Final

import numpy as np
import torch

from ..fault_injection.kit.processes import WorkerProcess, serve
from ..impl.registered.arena import ArenaFrameDescriptor, ArenaReader
from ..spec import leases

try:  # PyAV frames are one derivation among many: without PyAV the others still run
    import av
except ImportError:
    av = None

WORKER_TIMEOUT: Final = 60.0

TAG_RGB: Final = "rgb"
TAG_ARRAY: Final = "array"
TAG_TENSOR: Final = "tensor"
TAG_FRAME: Final = "frame"

DERIVATIONS: Final = {
    TAG_RGB: {
        leases.VIEW_ASARRAY: TAG_RGB,
        leases.VIEW_SLICE: TAG_RGB,
        leases.VIEW_RESHAPE: TAG_ARRAY,
        leases.VIEW_DTYPE: TAG_ARRAY,
        leases.VIEW_TORCH: TAG_TENSOR,
    }
    | ({leases.VIEW_PYAV_FRAME: TAG_FRAME} if av is not None else {}),
    TAG_ARRAY: {
        leases.VIEW_ASARRAY: TAG_ARRAY,
        leases.VIEW_SLICE: TAG_ARRAY,
        leases.VIEW_RESHAPE: TAG_ARRAY,
        leases.VIEW_DTYPE: TAG_ARRAY,
        leases.VIEW_TORCH: TAG_TENSOR,
    },
    TAG_TENSOR: {
        leases.VIEW_ASARRAY: TAG_ARRAY,
        leases.VIEW_SLICE: TAG_TENSOR,
        leases.VIEW_RESHAPE: TAG_TENSOR,
        leases.VIEW_DTYPE: TAG_TENSOR,
    },
    TAG_FRAME: {},
}


def derive(parent: Any, kind: str) -> Any:
    """Make a `kind` object from `parent` the way user code would."""
    if kind == leases.VIEW_ASARRAY:
        return np.asarray(parent)
    if kind == leases.VIEW_SLICE:
        return parent[: max(1, len(parent) - 1)]
    if kind == leases.VIEW_RESHAPE:
        return parent.reshape(-1)
    if kind == leases.VIEW_DTYPE:
        return parent.view(torch.int8) if isinstance(parent, torch.Tensor) else parent.view(np.int8)
    if kind == leases.VIEW_TORCH:
        return torch.from_numpy(parent)
    if kind == leases.VIEW_PYAV_FRAME:
        return av.VideoFrame.from_numpy_buffer(parent, format="rgb24")
    raise ValueError(f"unknown derivation: kind={kind!r}")


def first_bytes(obj: Any, count: int = 8) -> bytes:
    """The first bytes an object sees (to check it looks at the payload)."""
    if av is not None and isinstance(obj, av.VideoFrame):
        return bytes(obj.planes[0])[:count]
    if isinstance(obj, torch.Tensor):
        obj = obj.numpy()
    return np.ascontiguousarray(obj).reshape(-1).view(np.uint8)[:count].tobytes()


class Holder:
    """Views held in one process, by id; readers by arena name."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.readers: dict[str, ArenaReader] = {}
        self.objects: dict[int, Any] = {}

    def reader(self, name: str) -> ArenaReader:
        if name not in self.readers:
            self.readers[name] = ArenaReader(self.directory, name)
        return self.readers[name]

    def borrow(
        self, view_id: int, descriptor: ArenaFrameDescriptor, shape: tuple[int, ...]
    ) -> bytes:
        view = self.reader(descriptor.arena).borrow(descriptor, "uint8", shape)
        self.objects[view_id] = view
        return first_bytes(view)

    def derive(self, view_id: int, parent_id: int, kind: str) -> bytes:
        self.objects[view_id] = derive(self.objects[parent_id], kind)
        return first_bytes(self.objects[view_id])

    def drop(self, view_id: int) -> None:
        del self.objects[view_id]

    def reset(self) -> None:
        self.objects.clear()
        for reader in self.readers.values():
            reader.close()
        self.readers.clear()


# -- this process --------------------------------------------------------------------


class LocalPlace(Holder):
    name = "local"


# -- a second process ------------------------------------------------------------------


def serve_holder(conn: Connection) -> None:
    """Worker loop: run each (method, *args) on a Holder (made by "attach"), answer through `serve`."""
    holder: Holder | None = None

    def handle(command: tuple[Any, ...]) -> Any:
        nonlocal holder
        method, args = command[0], command[1:]
        if method == "attach":
            if holder is not None:
                holder.reset()
            holder = Holder(args[0])
            return None
        assert holder is not None, "attach first"
        return getattr(holder, method)(*args)

    try:
        serve(conn, handle)
    finally:
        if holder is not None:
            holder.reset()


class RemotePlace:
    """The same calls as LocalPlace, run in a spawned worker process."""

    name = "remote"

    def __init__(self) -> None:
        self._worker = WorkerProcess(serve_holder, timeout=WORKER_TIMEOUT, method="spawn")

    def _call(self, method: str, *args: Any) -> Any:
        try:
            return self._worker.call(method, *args)
        except TimeoutError:
            self.kill()
            raise

    def attach(self, directory: str) -> None:
        self._call("attach", directory)

    def borrow(
        self, view_id: int, descriptor: ArenaFrameDescriptor, shape: tuple[int, ...]
    ) -> bytes:
        result: bytes = self._call("borrow", view_id, descriptor, shape)
        return result

    def derive(self, view_id: int, parent_id: int, kind: str) -> bytes:
        result: bytes = self._call("derive", view_id, parent_id, kind)
        return result

    def drop(self, view_id: int) -> None:
        self._call("drop", view_id)

    def reset(self) -> None:
        self._call("reset")

    def stop(self) -> None:
        self._worker.stop()

    def kill(self) -> None:
        self._worker.kill()


__all__ = [
    "DERIVATIONS",
    "TAG_ARRAY",
    "TAG_FRAME",
    "TAG_RGB",
    "TAG_TENSOR",
    "Holder",
    "LocalPlace",
    "RemotePlace",
    "derive",
    "first_bytes",
    "serve_holder",
]
