"""Helpers for connector and discovery tests: a fault-planning seam, and worker processes.

Worker functions live here (an importable module, not a test file) because
tests start them with the "spawn" method, which imports the target by module
name in a fresh interpreter. Workers import the standard library and
`shmring.impl` only; payloads are bytes and plain trees, so no worker
imports torch. Every worker answers over a `multiprocessing` connection, and
every test that starts one joins it with a timeout and kills it if it
overstays (`stop_worker`).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import multiprocessing
import os
import signal
import struct
import time
import traceback
from collections import Counter
from collections.abc import Iterator
from multiprocessing.connection import Connection
from typing import Any

from shmring.impl.os_seam import FILE_MODE, SITE_FLOCK, OsFacade
from shmring.model_tests.workers import watchdog
from shmring.spec.layout import U64_FORMAT

# -- seams -----------------------------------------------------------------------


class FaultyOs(OsFacade):
    """An OsFacade that counts calls per site and fails the ones a test arms.

    `fail_open(prefix, code)` makes the next open of a file whose name starts
    with `prefix` raise OSError(code); `fail_next(site, code)` makes the next
    call at `site` raise (an unlock never fails). Each armed fault fires once;
    `fired` counts the faults that did.
    """

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()
        self.fired: Counter[str] = Counter()
        self._open_faults: dict[str, int] = {}
        self._site_faults: dict[str, int] = {}
        self.opened: list[str] = []  # names of the files opened successfully, in order

    def fail_open(self, prefix: str, code: int) -> None:
        self._open_faults[prefix] = code

    def fail_next(self, site: str, code: int) -> None:
        self._site_faults[site] = code

    def disarm(self) -> None:
        self._open_faults.clear()
        self._site_faults.clear()

    @property
    def armed(self) -> bool:
        return bool(self._open_faults or self._site_faults)

    def _enter(self, site: str) -> None:
        self.calls[site] += 1
        code = self._site_faults.pop(site, None)
        if code is not None:
            self.fired[site] += 1
            raise OSError(code, f"injected at {site}: {os.strerror(code)}")

    def open(self, path: str, flags: int, mode: int = FILE_MODE) -> int:
        name = os.path.basename(path)
        for prefix, code in list(self._open_faults.items()):
            if name.startswith(prefix):
                del self._open_faults[prefix]
                self.fired[f"open {prefix}"] += 1
                raise OSError(code, f"injected open: {os.strerror(code)}", path)
        fd = super().open(path, flags, mode)
        self.opened.append(name)
        return fd

    def open_at(self, dir_fd: int, name: str, flags: int, mode: int = FILE_MODE) -> int:
        for prefix, code in list(self._open_faults.items()):
            if name.startswith(prefix):
                del self._open_faults[prefix]
                self.fired[f"open {prefix}"] += 1
                raise OSError(code, f"injected open: {os.strerror(code)}", name)
        fd = super().open_at(dir_fd, name, flags, mode)
        self.opened.append(name)
        return fd

    def flock(self, fd: int, operation: int) -> None:
        if operation == fcntl.LOCK_UN:
            self.calls[SITE_FLOCK] += 1
            fcntl.flock(fd, operation)
            return
        super().flock(fd, operation)


class CountingOs(OsFacade):
    """Counts calls per site; fails nothing."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()

    def _enter(self, site: str) -> None:
        self.calls[site] += 1


# -- payloads ----------------------------------------------------------------------

_TAG: struct.Struct = struct.Struct(U64_FORMAT)


def tagged_payload(tag: int, size: int) -> bytes:
    """`size` bytes (at least 8) starting with `tag`, the rest derived from it."""
    size = max(size, _TAG.size)
    fill = bytes((tag * 31 + i) & 0xFF for i in range(min(size - _TAG.size, 64)))
    body = (fill * ((size - _TAG.size) // max(len(fill), 1) + 1))[: size - _TAG.size]
    return _TAG.pack(tag) + body


def payload_tag(payload: bytes) -> int:
    value: int = _TAG.unpack_from(payload, 0)[0]
    return value


# -- worker processes ----------------------------------------------------------------


def _reply(conn: Connection, value: Any) -> None:
    conn.send(("ok", value))


def connector_worker(scope: str, options: dict[str, Any], conn: Connection) -> None:
    """A process that owns Connectors (one at first) and runs the commands it is sent.

    Commands are tuples ``(name, *args)``: ``identity``, ``put(src, dst, key,
    tag, size)`` -> ("ring"|"fallback"|"refused", descriptor dict or None),
    ``get(src, dst, key, descriptor dict or None, route)`` -> (status, tag,
    producer), ``close`` -> retired, ``health``, ``stop``; they address the
    first connector. ``open`` makes another connector in the same process
    (another producer) and answers its index; ``("on", index, name, *args)``
    runs a command on that one. Errors come back as ("error", type name, message).
    """
    from shmring.impl.connector import Connector, descriptor_from_dict
    from shmring.impl.errors import BackPressureError
    from shmring.impl.names import current_producer_identity
    from shmring.spec.connector import Route

    connectors = [Connector(scope, **options)]
    try:
        while True:
            try:
                command = conn.recv()
            except EOFError:
                return
            connector = connectors[0]
            if command[0] == "on":
                connector = connectors[command[1]]
                command = command[2:]
            name, args = command[0], command[1:]
            try:
                if name == "open":
                    connectors.append(Connector(scope, **options))
                    _reply(conn, len(connectors) - 1)
                elif name == "identity":
                    _reply(conn, (*current_producer_identity(), connector.instance))
                elif name == "put":
                    src, dst, key, tag, size = args
                    try:
                        descriptor = connector.put(src, dst, key, tagged_payload(tag, size))
                    except BackPressureError:
                        _reply(conn, ("refused", None))
                        continue
                    _reply(conn, (descriptor.route.value, descriptor.to_dict()))
                elif name == "get":
                    src, dst, key, data, route = args
                    descriptor = descriptor_from_dict(Route(route), data) if data else None
                    got = connector.get(src, dst, key, descriptor=descriptor)
                    tag = payload_tag(got.value) if got.delivered else None
                    _reply(conn, (got.status.value, tag, got.producer))
                elif name == "close":
                    _reply(conn, connector.close())
                elif name == "health":
                    _reply(conn, connector.health())
                elif name == "stop":
                    _reply(conn, None)
                    return
                else:
                    conn.send(("error", "ValueError", f"unknown command={name!r}"))
            except Exception as error:  # report, keep serving
                conn.send(("error", type(error).__name__, f"{error}\n{traceback.format_exc()}"))
    finally:
        for connector in connectors:
            with contextlib.suppress(Exception):
                connector.close()
        conn.close()


_PRELOAD = ["shmring.model_tests.connector_support", "shmring.impl.connector"]
_forkserver_ready = False


def worker_context() -> multiprocessing.context.BaseContext:
    """How workers start: "forkserver" (preloading shmring) unless SHMRING_WORKER_START says otherwise.

    The fork server is a clean process started once, so workers inherit none
    of the test process's descriptors, mappings or locks, and a new worker
    costs a fork rather than a fresh interpreter.
    """
    global _forkserver_ready
    method = os.environ.get("SHMRING_WORKER_START", "forkserver")
    context = multiprocessing.get_context(method)
    if method == "forkserver" and not _forkserver_ready:
        context.set_forkserver_preload(_PRELOAD)
        _forkserver_ready = True
    return context


class Worker:
    """A `connector_worker` in its own process, and our end of its pipe."""

    def __init__(
        self, scope: str, options: dict[str, Any] | None = None, timeout: float = 30.0
    ) -> None:
        context = worker_context()
        self._conn, child = context.Pipe()
        self.process = context.Process(
            target=connector_worker, args=(scope, options or {}, child), daemon=True
        )
        self.process.start()
        child.close()
        self.timeout = timeout
        # (pid, start time, instance) of the worker's connector
        self.identity: tuple[int, int, int] = tuple(self.call("identity"))  # type: ignore[assignment]

    def call(self, *command: Any) -> Any:
        """Send one command and wait for its answer."""
        self.send(*command)
        return self.receive()

    def send(self, *command: Any) -> None:
        """Send one command without waiting (answer it with `receive`)."""
        self._conn.send(command)

    def receive(self) -> Any:
        if not self._conn.poll(self.timeout):
            raise TimeoutError(f"worker did not answer within {self.timeout}s")
        reply = self._conn.recv()
        if reply[0] == "error":
            raise RuntimeError(f"worker {reply[1]}: {reply[2]}")
        return reply[1]

    exitcode: int | None = None  # once reaped
    _reaped = False

    def kill(self) -> None:
        """SIGKILL the worker and reap it. Idempotent."""
        if self._reaped:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.process.pid, signal.SIGKILL)  # type: ignore[arg-type]
        self.process.join(10)
        self._conn.close()
        self._release()

    def stop(self) -> None:
        """Ask the worker to close its connector and exit; kill it if it does not. Idempotent."""
        if self._reaped:
            return
        if self.process.exitcode is None:
            with contextlib.suppress(Exception):
                self.call("stop")
            self.process.join(10)
        if self.process.exitcode is None:
            self.kill()
        with contextlib.suppress(OSError):
            self._conn.close()
        self._release()

    def _release(self) -> None:
        """Keep the exit code and free the Process's descriptors (its sentinel pipe) now.

        Without this each stopped worker held a pipe until garbage collection,
        and long campaigns climbed past descriptor 1024.
        """
        if self._reaped or self.process.exitcode is None:
            return  # still running after the kill's join: leave it to the watchdog
        self.exitcode = self.process.exitcode
        self.process.close()
        self._reaped = True


class SiblingWorker:
    """Another connector inside a `Worker`'s process: a second producer of the same process.

    Commands go to that connector; killing it kills the whole process (every
    producer in it), and stopping it is left to the process's own `Worker`.
    """

    def __init__(self, base: Worker) -> None:
        self.base = base
        self.index: int = base.call("open")
        self.identity: tuple[int, int, int] = tuple(self.call("identity"))  # type: ignore[assignment]

    def call(self, *command: Any) -> Any:
        return self.base.call("on", self.index, *command)

    def kill(self) -> None:
        self.base.kill()

    def stop(self) -> None:
        """Nothing of its own: the process stops with its `Worker`."""


def stop_worker(worker: Worker | None) -> None:
    if worker is not None:
        worker.stop()


def hold_file_lock(path: str, conn: Connection) -> None:
    """Take the exclusive flock of the file at `path`, say "locked", hold it until told."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        conn.send("locked")
        conn.recv()
    except EOFError:
        pass
    finally:
        os.close(fd)
        conn.close()


@contextlib.contextmanager
def lock_holder(path: str, timeout: float = 30.0) -> Iterator[multiprocessing.process.BaseProcess]:
    """Another process holding the flock of `path` for the duration of the block."""
    context = multiprocessing.get_context("spawn")
    parent, child = context.Pipe()
    process = context.Process(target=hold_file_lock, args=(path, child), daemon=True)
    process.start()
    child.close()
    try:
        if not parent.poll(timeout):
            raise TimeoutError("lock holder did not start")
        assert parent.recv() == "locked"
        yield process
    finally:
        with contextlib.suppress(OSError):
            parent.send("release")
        process.join(10)
        if process.exitcode is None:
            process.kill()
            process.join(10)
        parent.close()


def wait_until(predicate: Any, timeout: float, interval: float = 0.005) -> bool:
    """Poll `predicate` until it holds or `timeout` passes; answer whether it held."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return bool(predicate())


ERRNO_FAULTS: tuple[int, ...] = (errno.ENOSPC, errno.EPERM, errno.EACCES)

__all__ = [
    "ERRNO_FAULTS",
    "CountingOs",
    "FaultyOs",
    "SiblingWorker",
    "Worker",
    "connector_worker",
    "hold_file_lock",
    "worker_context",
    "lock_holder",
    "payload_tag",
    "stop_worker",
    "tagged_payload",
    "wait_until",
    "watchdog",
]
