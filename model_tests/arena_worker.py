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

Every call to the worker is answered within WORKER_TIMEOUT seconds or the
worker is killed and the call fails, so no test can hang on it.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import traceback
from multiprocessing.connection import Connection
from typing import Any, Final

import numpy as np
import torch

from shmring.impl.arena import ArenaFrameDescriptor, ArenaReader
from shmring.spec import leases

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


def serve(conn: Connection) -> None:
    """Worker loop: run each (method, args) on a Holder and answer ("ok", result) or ("error", text)."""
    holder: Holder | None = None
    while True:
        try:
            request = conn.recv()
        except EOFError:
            return
        method, args = request
        if method == "stop":
            if holder is not None:
                holder.reset()
            conn.send(("ok", None))
            return
        try:
            if method == "attach":
                if holder is not None:
                    holder.reset()
                holder = Holder(args[0])
                result = None
            else:
                assert holder is not None, "attach first"
                result = getattr(holder, method)(*args)
        except BaseException:
            conn.send(("error", traceback.format_exc()))
            continue
        conn.send(("ok", result))


class RemotePlace:
    """The same calls as LocalPlace, run in a spawned worker process."""

    name = "remote"

    def __init__(self) -> None:
        context = multiprocessing.get_context("spawn")
        self._conn, child = context.Pipe()
        self._process = context.Process(target=serve, args=(child,), daemon=True)
        self._process.start()
        child.close()

    def _call(self, method: str, *args: Any) -> Any:
        self._conn.send((method, args))
        if not self._conn.poll(WORKER_TIMEOUT):
            self.kill()
            raise TimeoutError(f"worker did not answer {method} within {WORKER_TIMEOUT} s")
        status, result = self._conn.recv()
        if status != "ok":
            raise RuntimeError(f"worker failed in {method}:\n{result}")
        return result

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
        if self._process.is_alive():
            with contextlib.suppress(TimeoutError, RuntimeError, OSError):
                self._call("stop")
        self._process.join(WORKER_TIMEOUT)
        self.kill()
        self._conn.close()

    def kill(self) -> None:
        if self._process.is_alive():
            self._process.kill()
            self._process.join(WORKER_TIMEOUT)


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
    "serve",
]
