"""An interrupt storm: a signal handler raising at random points of put/get (issue 24).

Design rationale. A service is interrupted where it stands: Ctrl-C, a
SIGTERM handler that raises `SystemExit`, a handler raising the user's own
exception. Issue 24 ran put/get traffic under an interval timer every
0.15-1 ms whose handler raised, and found untyped `BufferError`s escaping
put/get and thousands of fallback temporaries (``fbtmp.*``) left after
both connectors' close. Here one child process (its own signal handlers,
its own files) runs that traffic for a few seconds: a producer with a pool,
a producer without one (its large payloads take per-key segments) and a
receiver, small, pool-sized and segment-sized payloads, every payload
derived from its key so a wrong delivery shows. An interrupted put has
published or not; an interrupted get delivered (lost to the caller, as any
value a raising handler interrupts) or left the frame deliverable, which
the next get of the key checks. After the timer stops, every connector
closes and the child reports what is left in the deployment directory.

The child prints one JSON line (`StormReport`'s fields); `run_storm` runs it
and answers the report. Nothing here patches stdlib: the interrupt is a
real SIGALRM handler raising a real exception.
"""

from __future__ import annotations

import gc
import json
import os
import random
import signal
import subprocess
import sys
import time
import traceback
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any, Final

EDGE_POOL: Final = ("storm", "pool")
EDGE_SEGMENT: Final = ("storm", "segment")
RING_CAPACITY: Final = 16 * 1024  # frames above 4 KiB leave the ring
# Payload sizes: ring frames, pool slots (or segments without a pool), and larger ones.
_SIZES: Final = (64, 900, 6000, 40_000, 200_000)
_INTERVAL_S: Final = (0.00015, 0.001)  # the timer fires every 0.15-1 ms
_CHILD_TIMEOUT_S: Final = 300


class Interrupt(Exception):  # noqa: N818 - the user's exception, not an error of ours
    """What the storm's signal handler raises."""


@dataclass
class StormReport:
    """What a storm did and what it left."""

    seconds: float = 0.0  # how long the traffic ran
    interrupts: int = 0  # handler calls that raised
    puts: int = 0  # puts that returned
    gets: int = 0  # gets that delivered
    interrupted_puts: int = 0  # puts the interrupt stopped
    interrupted_gets: int = 0  # gets the interrupt stopped
    wrong: int = 0  # deliveries whose value is not the key's payload
    typed: dict[str, int] = field(default_factory=dict)  # ShmringErrors from put/get, by type
    untyped: dict[str, int] = field(default_factory=dict)  # any other error, by type
    untyped_samples: list[str] = field(default_factory=list)  # a few errors' messages
    close_errors: dict[str, int] = field(default_factory=dict)  # errors close raised
    not_left: list[str] = field(default_factory=list)  # connectors whose close kept something
    after_ok: bool = False  # a put and get after the storm worked (no lock stayed held)
    files_left: int = 0  # files in the deployment directory after every close
    left_samples: list[str] = field(default_factory=list)  # a few of their names
    left_kinds: dict[str, int] = field(default_factory=dict)  # those files by name prefix
    fds_left: int = 0  # descriptors of deployment files still open after every close
    fd_kinds: dict[str, int] = field(default_factory=dict)  # those by file name prefix


def _payload(key: str, size: int) -> bytes:
    seed = key.encode()
    return (seed * (size // len(seed) + 1))[:size]


def _expected(key: str) -> bytes:
    return _payload(key, int(key.rsplit("-", 1)[1]))


def _storm(scope: str, seconds: float, seed: int) -> StormReport:
    from ..impl.connector import Connector, GetStatus
    from ..impl.errors import ShmringError
    from ..impl.names import deployment_directory

    rng = random.Random(seed)
    report = StormReport()
    typed: Counter[str] = Counter()
    untyped: Counter[str] = Counter()
    armed = [False]
    storming = [True]  # False once the storm ends: a late ring re-arms no timer

    def fire(signum: int, frame: object) -> None:
        # A SIGALRM already pending when the timer is disarmed still runs this
        # handler; re-arming then would fire after the default disposition is
        # back and kill the child with SIGALRM (rc -14, seen once under xdist).
        if storming[0]:
            signal.setitimer(signal.ITIMER_REAL, rng.uniform(*_INTERVAL_S))
        if armed[0]:  # inside a put or get (the loop around them is not what we test)
            report.interrupts += 1
            raise Interrupt

    def untyped_error(error: BaseException) -> None:
        untyped[type(error).__name__] += 1
        sample(error)

    def typed_error(error: BaseException) -> None:
        typed[type(error).__name__] += 1
        if typed[type(error).__name__] <= 2:
            sample(error)

    def sample(error: BaseException) -> None:
        if len(report.untyped_samples) < 8:
            where = traceback.extract_tb(error.__traceback__)[-3:]
            trail = " <- ".join(f"{frame.name}:{frame.lineno}" for frame in reversed(where))
            report.untyped_samples.append(f"{type(error).__name__}: {error} at {trail}"[:400])

    directory = deployment_directory(scope)
    fds_before = _open_fds()
    pool = Connector(scope, ring_capacity=RING_CAPACITY, pool_min_bytes=64 * 1024)
    segments = Connector(scope, ring_capacity=RING_CAPACITY, pool_budget_bytes=0)
    receiver = Connector(scope, ring_capacity=RING_CAPACITY, pool_budget_bytes=0)
    connectors = (pool, segments, receiver)
    pending: list[tuple[tuple[str, str], str]] = []  # puts whose key is still to get
    previous = signal.signal(signal.SIGALRM, fire)
    started = time.monotonic()
    counter = 0
    try:
        signal.setitimer(signal.ITIMER_REAL, rng.uniform(*_INTERVAL_S))
        while time.monotonic() - started < seconds:
            counter += 1
            producer, edge = (pool, EDGE_POOL) if counter % 2 else (segments, EDGE_SEGMENT)
            key = f"k{counter}-{rng.choice(_SIZES)}"
            payload = _expected(key)
            try:
                armed[0] = True
                producer.put(edge, key, payload)
                armed[0] = False
                report.puts += 1
            except Interrupt:
                armed[0] = False
                report.interrupted_puts += 1
            except ShmringError as error:
                armed[0] = False
                typed_error(error)
            except Exception as error:
                armed[0] = False
                untyped_error(error)
            pending.append((edge, key))
            # Get the oldest pending keys: an interrupted get leaves its key pending.
            for _ in range(min(2, len(pending))):
                edge, key = pending[0]
                try:
                    armed[0] = True
                    got = receiver.get(edge, key)
                    armed[0] = False
                except Interrupt:
                    armed[0] = False
                    report.interrupted_gets += 1
                    break
                except ShmringError as error:
                    armed[0] = False
                    typed_error(error)
                    pending.pop(0)
                    continue
                except Exception as error:
                    armed[0] = False
                    untyped_error(error)
                    pending.pop(0)
                    continue
                pending.pop(0)
                if got.status is GetStatus.DELIVERED:
                    report.gets += 1
                    if got.value != _expected(key):
                        report.wrong += 1
            if len(pending) > 64:
                del pending[:32]  # interrupted puts that published nothing
    finally:
        armed[0] = False
        storming[0] = False
        signal.setitimer(signal.ITIMER_REAL, 0)
        report.seconds = round(time.monotonic() - started, 3)
        signal.signal(signal.SIGALRM, previous)
    report.typed, report.untyped = dict(typed), dict(untyped)
    try:
        probe = "after-64"
        pool.put(EDGE_POOL, probe, _expected(probe))
        got = receiver.get(EDGE_POOL, probe)
        report.after_ok = got.status is GetStatus.DELIVERED and got.value == _expected(probe)
    except Exception as error:  # noqa: BLE001 - reported, not raised
        untyped_error(error)
    close_errors: Counter[str] = Counter()
    for connector in connectors:
        try:
            connector.close()
        except Exception as error:  # noqa: BLE001 - reported, not raised
            close_errors[type(error).__name__] += 1
    report.close_errors = dict(close_errors)
    for connector in connectors:
        health = connector.health()
        deployment = connector._deployment
        if (
            health.deferred_pending
            or health.unlink_failures
            or (deployment and not deployment.left)
        ):
            report.not_left.append(
                f"deferred={health.deferred_pending} unlink_failures={health.unlink_failures} "
                f"left={deployment.left if deployment else None}"
            )
    # A descriptor lost to an interrupt keeps its file (and a lock on it) for the life
    # of the process: every one a connector opened must be closed by now. (Mappings
    # of borrowed payloads would keep none: this storm borrows nothing.)
    del connectors, connector, pool, segments, receiver, deployment, health
    gc.collect()
    lost = {fd: target for fd, target in _open_fds().items() if fd not in fds_before}
    ours = [target for target in lost.values() if target.startswith(directory)]
    report.fds_left = len(ours)
    report.fd_kinds = dict(Counter(os.path.basename(target).split(".", 1)[0] for target in ours))
    try:
        left = sorted(os.listdir(directory))
    except FileNotFoundError:
        left = []
    report.files_left = len(left)
    report.left_samples = left[:8]
    report.left_kinds = dict(Counter(name.split(".", 1)[0] for name in left))
    return report


def _open_fds() -> dict[int, str]:
    """This process's descriptors and what they name (``/proc/self/fd``)."""
    found: dict[int, str] = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            found[int(name)] = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue  # the listing's own descriptor, closed by now
    return found


def run_storm(scope: str, seconds: float = 3.0, seed: int = 0) -> StormReport:
    """Run a storm of `seconds` in a child process; answers its report.

    The child's deployment directory is removed afterwards whatever it
    left (the report has counted it), so a failing storm leaves /dev/shm clean.
    """
    code = (
        "import json, sys; from shmring.fault_injection import interrupts; "
        "print(json.dumps(interrupts.child_main(sys.argv[1], float(sys.argv[2]), int(sys.argv[3]))))"
    )
    try:
        done = subprocess.run(
            [sys.executable, "-c", code, scope, str(seconds), str(seed)],
            capture_output=True,
            timeout=_CHILD_TIMEOUT_S,
        )
    finally:
        _remove_deployment(scope)
    lines = done.stdout.decode().strip().splitlines()
    if done.returncode != 0 or not lines:
        raise AssertionError(
            f"storm child failed: rc={done.returncode} stderr={done.stderr.decode()[-3000:]}"
        )
    return StormReport(**json.loads(lines[-1]))


def child_main(scope: str, seconds: float, seed: int) -> dict[str, Any]:
    return asdict(_storm(scope, seconds, seed))


def _remove_deployment(scope: str) -> None:
    import shutil

    from ..impl.names import deployment_directory

    shutil.rmtree(deployment_directory(scope), ignore_errors=True)


__all__ = ["Interrupt", "StormReport", "run_storm"]


if __name__ == "__main__":  # pragma: no cover - the storm, by hand
    import uuid

    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 8.0
    seed = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    print(json.dumps(asdict(run_storm(f"storm{uuid.uuid4().hex[:8]}", seconds, seed))))
