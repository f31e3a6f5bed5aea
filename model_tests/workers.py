"""Helpers for ring tests: directory cleanup, and the targets of ring worker processes.

Worker functions live here (an importable module, not a test file) because
tests start them with the "spawn" method, which imports the target by
module name in a fresh interpreter. Workers import only the standard
library, `shmring.impl` and the kit's payloads; none imports torch. Tests
run them in the kit's `WorkerProcess` (bounded waits, killed and reaped);
each reports ``(what, value)`` pairs over its connection.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import time
from collections.abc import Iterator
from multiprocessing.connection import Connection

from ..fault_injection.kit.payloads import tagged_payload
from ..impl.directory import (
    ensure_deployment_directory,
    remove_deployment_directory_if_empty,
)
from ..impl.names import DEFAULT_SHM_ROOT, current_producer_identity, ring_path
from ..impl.os_seam import DEFAULT_OS
from ..impl.ring.producer import RingChannel
from ..impl.ring.reader import RingReader
from ..impl.ring.results import ReceiveStatus

# -- deployment directories --------------------------------------------------------


@contextlib.contextmanager
def deployment_directory(scope: str, shm_root: str = DEFAULT_SHM_ROOT) -> Iterator[str]:
    """A fresh deployment directory, removed afterwards.

    Anything a test left inside is removed too, and then reported as a
    failure: tests must close what they create, but must not leave the
    leftovers behind for the next test either.
    """
    path = ensure_deployment_directory(scope, DEFAULT_OS, shm_root)
    try:
        yield path
    finally:
        leftovers = sorted(os.listdir(path)) if os.path.isdir(path) else []
        for name in leftovers:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(path, name))
        remove_deployment_directory_if_empty(path)
        if leftovers:
            raise AssertionError(f"test left files in {path}: {leftovers}")


# -- workers (run in spawned processes) ----------------------------------------------


def compete_for_keys(path: str, keys: list[str], done_flag: str, conn: Connection) -> None:
    """Claim whatever keys of `keys` this process can, until the producer is done.

    `done_flag` is a file the producer creates after its last put; once it
    exists, a full sweep in which every remaining key answers NOT_FOUND
    means the other reader claimed them. Says "attached", then reports
    "done" with ([(key, position, digest)], BUSY answers, claims lost to the
    other reader after taking the lock).
    """
    claimed: list[tuple[str, int | None, str]] = []
    busy = 0
    reader = RingReader.attach(path)
    try:
        pending = list(keys)
        conn.send(("attached", None))
        while pending:
            producer_done = os.path.exists(done_flag)
            still: list[str] = []
            settled = True
            for key in pending:
                got = reader.get(key)
                if got.status is ReceiveStatus.DELIVERED:
                    digest = hashlib.blake2b(got.payload, digest_size=16).hexdigest()
                    claimed.append((key, got.position, digest))
                    continue
                if got.status is ReceiveStatus.BUSY:
                    busy += 1
                    settled = False
                still.append(key)
            pending = still
            if producer_done and settled:
                break  # everything left was claimed by the other reader
        statistics = reader.statistics()
    finally:
        reader.close()
    lost = statistics.locks - statistics.gets  # locked to claim, found it claimed by the other
    conn.send(("done", (claimed, busy, lost)))
    conn.close()


def publish_then_stop(directory: str, capacity: int, stage: str, conn: Connection) -> None:
    """Create a ring, publish three frames, then stop mid-put at `stage` and wait to be killed.

    The ring is named for this process in `directory`; its path is the first
    message. `stage` is a publish-hook stage (`channel.HOOK_*`), or "writer"
    to stop halfway through a writer filling the payload in place.
    """
    path = ring_path(directory, "s0", "s1", current_producer_identity())
    conn.send(("path", path))

    armed = False  # only the last put stops

    def hook(at: str) -> None:
        if armed and at == stage:
            conn.send(("stopped", at))
            while True:  # the parent SIGKILLs us here
                time.sleep(1)

    channel = RingChannel.create(path, capacity, publish_hook=hook)
    positions = []
    for index in range(3):
        positions.append(
            channel.put(f"done_{index}", tagged_payload(f"done_{index}", 300)).position
        )
    conn.send(("published", positions))
    armed = True
    if stage == "writer":
        torn = tagged_payload("torn", 600)

        def writer(view: memoryview) -> None:
            view[:300] = torn[:300]
            hook("writer")

        channel.put_with_writer("torn", len(torn), writer)
    else:
        channel.put("torn", tagged_payload("torn", 600))
    conn.send(("finished", None))  # reached only if the stage was never hit


__all__ = ["compete_for_keys", "deployment_directory", "publish_then_stop"]
