"""Helpers for ring tests: counting seams, directory cleanup, and worker processes.

Worker functions live here (an importable module, not a test file) because
tests start them with the "spawn" method, which imports the target by
module name in a fresh interpreter. Workers import only the standard
library and `shmring.impl`; none imports torch. Every worker reports over a
`multiprocessing` connection, and every test that starts one joins it with
a timeout and kills it if it overstays.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import signal
import time
from collections import Counter
from collections.abc import Iterator
from multiprocessing.connection import Connection

from shmring.impl.directory import (
    ensure_deployment_directory,
    remove_deployment_directory_if_empty,
)
from shmring.impl.names import DEFAULT_SHM_ROOT, current_producer_identity, ring_path
from shmring.impl.os_seam import DEFAULT_OS, OPEN_FLAGS_EXISTING, OsFacade
from shmring.impl.ring.producer import RingChannel
from shmring.impl.ring.reader import RingReader
from shmring.impl.ring.results import ReceiveStatus

# -- seams -----------------------------------------------------------------------


class CountingOs(OsFacade):
    """An OsFacade that counts the calls made through it, per site."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()

    def _enter(self, site: str) -> None:
        self.calls[site] += 1

    def total(self) -> int:
        return sum(self.calls.values())


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


def payload_for(tag: str, size: int) -> bytes:
    """Deterministic bytes that name `tag` (unique tags give unique payloads)."""
    seed = hashlib.blake2b(tag.encode(), digest_size=32).digest()
    return (seed * (size // len(seed) + 1))[:size]


# -- workers (run in spawned processes) ----------------------------------------------


def hold_ring_lock(path: str, conn: Connection) -> None:
    """Take the ring file's exclusive lock, say "locked", hold it until told to stop."""
    fd = DEFAULT_OS.open(path, OPEN_FLAGS_EXISTING)
    try:
        DEFAULT_OS.flock(fd, fcntl.LOCK_EX)
        conn.send("locked")
        conn.recv()  # any message (or the parent's death: EOFError) ends the hold
    except EOFError:
        pass
    finally:
        DEFAULT_OS.close(fd)
        conn.close()


def compete_for_keys(path: str, keys: list[str], conn: Connection, done_flag: str) -> None:
    """Claim whatever keys of `keys` this process can, until the producer is done.

    `done_flag` is a file the producer creates after its last put; once it
    exists, a full sweep in which every remaining key answers NOT_FOUND
    means the other reader claimed them. Reports ([(key, position, digest)],
    BUSY answers, claims lost to the other reader after taking the lock).
    """
    claimed: list[tuple[str, int | None, str]] = []
    busy = 0
    reader = RingReader.attach(path)
    try:
        pending = list(keys)
        conn.send("attached")
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
    conn.send((claimed, busy, lost))
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
        positions.append(channel.put(f"done_{index}", payload_for(f"done_{index}", 300)).position)
    conn.send(("published", positions))
    armed = True
    if stage == "writer":
        torn = payload_for("torn", 600)

        def writer(view: memoryview) -> None:
            view[:300] = torn[:300]
            hook("writer")

        channel.put_with_writer("torn", len(torn), writer)
    else:
        channel.put("torn", payload_for("torn", 600))
    conn.send(("finished", None))  # reached only if the stage was never hit


def kill_and_reap(process: object) -> None:
    """SIGKILL a multiprocessing.Process (if alive) and wait for it."""
    pid = getattr(process, "pid", None)
    if pid is None:
        return  # never started
    if getattr(process, "exitcode", 0) is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    process.join(10)  # type: ignore[attr-defined]


@contextlib.contextmanager
def watchdog(seconds: float) -> Iterator[None]:
    """Raise TimeoutError in the main thread if the block runs longer than `seconds`.

    A guard against hangs (a receive that blocked on a lock, a worker that
    never answers), not a timing assertion.
    """

    def fire(signum: int, frame: object) -> None:
        raise TimeoutError(f"watchdog: still blocked after {seconds} s")

    previous = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


__all__ = [
    "CountingOs",
    "compete_for_keys",
    "deployment_directory",
    "hold_ring_lock",
    "kill_and_reap",
    "payload_for",
    "publish_then_stop",
    "watchdog",
]
