"""Connector worker processes: a process that owns Connectors and runs the commands it is sent.

Worker functions live here (an importable module, not a test file) because
tests start them in other processes, which import the target by module
name. Workers import the standard library, `shmring.impl` and the kit's
payloads only; payloads are bytes and plain trees, so no worker imports
torch. The process harness (bounded waits, kill, stop) is the kit's
`WorkerProcess`; the seams and payloads are the kit's too.
"""

from __future__ import annotations

import contextlib
import errno
from multiprocessing.connection import Connection
from typing import Any

from ..fault_injection.kit.payloads import payload_tag, tagged_payload
from ..fault_injection.kit.processes import WorkerProcess, serve

# -- worker processes ----------------------------------------------------------------


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
    from ..impl.connector import Connector, descriptor_from_dict
    from ..impl.errors import BackPressureError
    from ..impl.names import current_producer_identity
    from ..spec.connector import Route

    connectors = [Connector(scope, **options)]

    def handle(command: tuple[Any, ...]) -> Any:
        connector = connectors[0]
        if command[0] == "on":
            connector = connectors[command[1]]
            command = command[2:]
        name, args = command[0], command[1:]
        if name == "open":
            connectors.append(Connector(scope, **options))
            return len(connectors) - 1
        if name == "identity":
            return (*current_producer_identity(), connector.instance)
        if name == "put":
            src, dst, key, tag, size = args
            try:
                descriptor = connector.put(src, dst, key, tagged_payload(tag, size))
            except BackPressureError:
                return ("refused", None)
            return (descriptor.route.value, descriptor.to_dict())
        if name == "get":
            src, dst, key, data, route = args
            descriptor = descriptor_from_dict(Route(route), data) if data else None
            got = connector.get(src, dst, key, descriptor=descriptor)
            tag = payload_tag(got.value) if got.delivered else None
            return (got.status.value, tag, got.producer)
        if name == "close":
            return connector.close()
        if name == "health":
            return connector.health()
        raise ValueError(f"unknown command={name!r}")

    try:
        serve(conn, handle)
    finally:
        for connector in connectors:
            with contextlib.suppress(Exception):
                connector.close()
        conn.close()


# Modules the fork server imports once, before its first worker.
WORKER_PRELOAD = ("shmring.model_tests.connector_support", "shmring.impl.connector")


class Worker(WorkerProcess):
    """A `connector_worker` in its own process, and our end of its pipe."""

    def __init__(
        self, scope: str, options: dict[str, Any] | None = None, timeout: float = 30.0
    ) -> None:
        super().__init__(
            connector_worker, scope, options or {}, timeout=timeout, preload=WORKER_PRELOAD
        )
        # (pid, start time, instance) of the worker's connector
        self.identity: tuple[int, int, int] = tuple(self.call("identity"))  # type: ignore[assignment]


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


ERRNO_FAULTS: tuple[int, ...] = (errno.ENOSPC, errno.EPERM, errno.EACCES)

__all__ = [
    "ERRNO_FAULTS",
    "WORKER_PRELOAD",
    "SiblingWorker",
    "Worker",
    "connector_worker",
    "stop_worker",
]
