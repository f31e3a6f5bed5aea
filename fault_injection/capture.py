"""The directory-capture probe: another uid races to own a victim's deployment directory.

Design rationale. Issue 12's probe: two processes of one uid join and leave
a scope in a loop while another uid loops ``mkdir -m 0777`` of that scope's
directory path. Whenever the last victim's teardown removes the directory,
the attacker may create its own there; a victim that re-resolved the path
after checking it would then create its files in the attacker's directory,
where the attacker can read and unlink them. Everything here runs as real
processes with real uids (root is needed to switch to them): the attacker
is a child started with `subprocess`'s `user=` and `group=` as an
unprivileged uid, so the kernel's own permission rules (sticky /dev/shm,
0700 directories) apply to it exactly as in production; the victims run as
the test's own uid.

The attacker's uid is a bare number with no passwd entry (nothing to create
or remove on the machine); `free_uid` picks one no account and no running
process uses.

Each child prints one JSON line:

* a victim: joins that succeeded, joins that landed in a directory not its
  own (checked on the connector's directory descriptor), typed errors by
  class name, bare ``OSError``s (not shmring errors) with their errno and
  where they came from, its own keys not delivered back or delivered
  changed, and its pool puts;
* the attacker: how often its mkdir won, and every file name it saw in a
  directory it made (a victim's file there is a capture).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import pwd
import subprocess
import sys
import time
import traceback
from collections import Counter
from typing import Any, Final

VICTIMS: Final = 2
_CHILD_GRACE_S: Final = 60.0
# Each victim's pool (issue 13): one slot of the smallest class. Per join it puts
# a ring frame, a payload only a slot takes (above the 4 KiB ring's admission,
# within the slot's capacity) and one too large for the slot (a fallback segment),
# so slot files are created through the directory descriptor too.
_POOL_CLASS: Final = 4096  # layout.MIN_POOL_CLASS
_SLOT_PAYLOAD: Final = 2000
_SEGMENT_PAYLOAD: Final = 70 * 1024  # > compute_slot_capacity(_POOL_CLASS): no slot takes it


def free_uid(start: int, taken: set[int] = frozenset()) -> int:  # type: ignore[assignment]
    """A uid >= `start` with no passwd entry, not in `taken`, owning no process."""
    running = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                running.add(os.stat(f"/proc/{entry}").st_uid)
            except OSError:
                continue
    uid = start
    while True:
        try:
            pwd.getpwuid(uid)
        except KeyError:
            if uid not in taken and uid not in running:
                return uid
        uid += 1


def _victim(scope: str, index: int, seconds: float) -> dict[str, Any]:
    from ..impl.connector import Connector
    from ..impl.errors import ShmringError
    from ..spec.layout import MIN_POOL_CLASS, compute_slot_capacity
    from ..spec.pool import compute_slot_charge

    assert _POOL_CLASS == MIN_POOL_CLASS
    assert _SLOT_PAYLOAD < compute_slot_capacity(_POOL_CLASS) < _SEGMENT_PAYLOAD

    uid = os.getuid()
    joins = foreign = 0
    typed: Counter[str] = Counter()
    bare: Counter[str] = Counter()
    bare_where: Counter[str] = Counter()  # where each bare error came from, for the report
    wrong: Counter[str] = Counter()  # a key of ours not delivered, or delivered changed
    edge = (f"v{index}", "out")
    deadline = time.monotonic() + seconds
    count = pool_puts = 0
    while time.monotonic() < deadline:
        count += 1
        try:
            with Connector(
                scope,
                ring_capacity=4096,
                pool_min_bytes=_POOL_CLASS,
                pool_max_bytes=_POOL_CLASS,
                pool_budget_bytes=compute_slot_charge(_POOL_CLASS),
                fallback_spare_bytes=0,
            ) as connector:
                connector.put(edge, f"k{count}", {"n": count})  # ring, marker, live file
                connector.put(edge, f"big{count}", {"b": b"x" * _SLOT_PAYLOAD})  # a pool slot
                connector.put(edge, f"seg{count}", {"b": b"s" * _SEGMENT_PAYLOAD})  # a segment
                pool_puts += connector.health().pool_puts
                joins += 1
                where = connector._deployment.directory if connector._deployment else None
                assert where is not None  # joined by the puts
                info = os.fstat(where.fd)
                if info.st_uid != uid or info.st_mode & 0o077:
                    foreign += 1
                expected = {
                    f"k{count}": {"n": count},
                    f"big{count}": {"b": b"x" * _SLOT_PAYLOAD},
                    f"seg{count}": {"b": b"s" * _SEGMENT_PAYLOAD},
                }
                for key, value in expected.items():
                    delivery = connector.get(edge, key)
                    if not delivery.delivered or delivery.value != value:
                        wrong[f"{key.rstrip('0123456789')} {delivery.status.name}"] += 1
        except ShmringError as error:
            typed[type(error).__name__] += 1
        except OSError as error:
            name = errno.errorcode.get(error.errno or 0, str(error.errno))
            bare[name] += 1
            bare_where[f"{name} at {_innermost_shmring_frame(error)}"] += 1
    return {
        "joins": joins,
        "foreign": foreign,
        "typed": dict(typed),
        "bare": dict(bare),
        "bare_where": dict(bare_where),
        "wrong": dict(wrong),
        "pool_puts": pool_puts,
    }


def _innermost_shmring_frame(error: BaseException) -> str:
    """`file:line function` of the three deepest traceback frames inside the package."""
    frames = [
        f"{os.path.basename(frame.filename)}:{frame.lineno} {frame.name}"
        for frame in traceback.extract_tb(error.__traceback__)
        if f"{os.sep}impl{os.sep}" in frame.filename or f"{os.sep}spec{os.sep}" in frame.filename
    ]
    return " < ".join(reversed(frames[-3:])) or "?"


# The attacker runs with the system's Python and the standard library only:
# the victims' interpreter may sit where another uid cannot read (/root).
_ATTACKER_SCRIPT: Final = """
import json, os, sys, time
path, seconds = sys.argv[1], float(sys.argv[2])
won, seen = 0, set()
deadline = time.monotonic() + seconds
while time.monotonic() < deadline:
    try:
        os.mkdir(path, 0o777)
    except OSError:
        continue
    try:
        os.chmod(path, 0o777)  # past the umask: open to everyone, as in the probe
    except OSError:
        continue  # already gone: a root victim's teardown removed it and made its own
    won += 1
    for _ in range(20):  # hold it a moment, looking for what victims put in it
        try:
            names = os.listdir(path)
        except OSError:
            break
        for name in names:
            seen.add(name)
            try:
                os.unlink(os.path.join(path, name))
            except OSError:
                pass
    try:
        os.rmdir(path)
    except OSError:
        pass
print(json.dumps({"won": won, "seen": sorted(seen)}))
"""
ATTACKER_PYTHON: Final = "/usr/bin/python3"


def available() -> tuple[bool, str]:
    """Whether the probe can run here (and why not)."""
    if os.geteuid() != 0:
        return False, "needs root to start the attacker as another uid"
    if not os.access(ATTACKER_PYTHON, os.X_OK):
        return False, f"no system Python for the attacker: {ATTACKER_PYTHON}"
    return True, ""


def run_probe(scope: str, seconds: float, shm_root: str = "/dev/shm") -> dict[str, Any]:
    """Run the attacker and `VICTIMS` victims for `seconds`; answers what each saw.

    Needs root (to start children as other uids). Removes whatever the run
    left under `shm_root` for this scope before answering.
    """
    victim_uid = os.getuid()
    attacker_uid = free_uid(61000, {victim_uid})
    path = os.path.join(shm_root, f"shmring-{victim_uid}-{scope}")
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    code = (
        "import json, sys; from shmring.fault_injection import capture; "
        "print(json.dumps(capture._victim(sys.argv[1], int(sys.argv[2]), float(sys.argv[3]))))"
    )
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", code, scope, str(index), str(seconds)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for index in range(VICTIMS)
    ]
    processes.append(
        subprocess.Popen(
            [ATTACKER_PYTHON, "-I", "-c", _ATTACKER_SCRIPT, path, str(seconds)],
            user=attacker_uid,
            group=attacker_uid,
            extra_groups=[],
            env={"PATH": "/usr/bin:/bin"},
            cwd="/",
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
    )
    results: list[dict[str, Any]] = []
    try:
        for process in processes:
            out, err = process.communicate(timeout=seconds + _CHILD_GRACE_S)
            lines = out.decode().strip().splitlines()
            if process.returncode != 0 or not lines:
                raise AssertionError(
                    f"probe child failed: rc={process.returncode} stderr={err.decode()[-3000:]}"
                )
            results.append(json.loads(lines[-1]))
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
        _remove_tree(path)
    victims, attacker = results[:-1], results[-1]
    return {
        "victim_uid": victim_uid,
        "attacker_uid": attacker_uid,
        "joins": sum(v["joins"] for v in victims),
        "foreign_joins": sum(v["foreign"] for v in victims),
        "pool_puts": sum(v["pool_puts"] for v in victims),
        "typed": sum((Counter(v["typed"]) for v in victims), Counter()),
        "bare": sum((Counter(v["bare"]) for v in victims), Counter()),
        "bare_where": sum((Counter(v["bare_where"]) for v in victims), Counter()),
        "wrong": sum((Counter(v["wrong"]) for v in victims), Counter()),
        "attacker_won": attacker["won"],
        "attacker_saw": attacker["seen"],
    }


def _remove_tree(path: str) -> None:
    try:
        names = os.listdir(path)
    except OSError:
        return
    for name in names:
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(path, name))
    with contextlib.suppress(OSError):
        os.rmdir(path)


__all__ = ["ATTACKER_PYTHON", "VICTIMS", "available", "free_uid", "run_probe"]
