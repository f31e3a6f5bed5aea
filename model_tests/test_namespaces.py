"""Containers: members in different pid namespaces sharing one shm root (issue 26).

Each test runs one side in a child pid namespace (``unshare --pid --fork
--mount-proc``: the new interpreter is pid 1 there, with its own /proc) and
the other in the test's own namespace, one ``/dev/shm`` shared, as a
Kubernetes pod's containers on one memory-backed emptyDir are. A live member
seen from another namespace must never be judged dead: none of its frames
lost, none of its files removed, by a receiver, `gc` or `stat`. A member
SIGKILLed inside its namespace is dead for an observer outside: its frames
never delivered, its files reclaimed.

Root only (a pid namespace needs CAP_SYS_ADMIN); skipped cleanly otherwise.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from shmring.impl.connector import Connector
from shmring.impl.names import DEFAULT_SHM_ROOT

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None,
    reason="needs root and unshare(1) to make pid namespaces",
)

KEYS = ("k0", "k1", "k2")
WAIT_S = 60.0

# A member in its own pid namespace, driven by lines on stdin, answering JSON lines.
_MEMBER = r"""
import json, os, sys
from shmring.impl.connector import Connector
scope, shm_root = sys.argv[1], sys.argv[2]
capacity = int(sys.argv[3]) if len(sys.argv) > 3 else 4 << 20
connector = Connector(scope, shm_root=shm_root, pool_budget_bytes=0, ring_capacity=capacity)
def say(**fields):
    sys.stdout.write(json.dumps(fields) + "\n"); sys.stdout.flush()
say(event="started", pid=os.getpid())
for line in sys.stdin:
    verb, *args = line.split()
    if verb == "put":
        for key in args:
            connector.put("a", "b", key, {"key": key, "payload": key * 100})
        say(event="put", keys=args, files=sorted(os.listdir(connector.directory)))
    elif verb == "get":
        got = {}
        for key in args:
            delivery = connector.get("a", "b", key)
            got[key] = [delivery.status.name, delivery.value]
        health = connector.health()
        say(event="got", got=got, reclaimed=health.reclaimed_files)
    elif verb == "close":
        connector.close()
        say(event="closed")
        break
"""


class Member:
    """A connector in a child pid namespace (`_MEMBER`), driven over pipes."""

    def __init__(
        self, scope: str, shm_root: str = DEFAULT_SHM_ROOT, capacity: int = 4 << 20
    ) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        self.process = subprocess.Popen(
            [
                "unshare",
                "--pid",
                "--fork",
                "--mount-proc",
                "--kill-child",
                sys.executable,
                "-c",
                _MEMBER,
                scope,
                shm_root,
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        started = self.expect("started")
        assert started["pid"] == 1, started  # really in a new pid namespace

    def expect(self, event: str) -> dict[str, object]:
        assert self.process.stdout is not None
        deadline = time.monotonic() + WAIT_S
        line = self.process.stdout.readline()
        assert line, f"member exited before {event!r} (rc={self.process.poll()})"
        assert time.monotonic() < deadline
        answer = json.loads(line)
        assert answer["event"] == event, answer
        return answer

    def send(self, line: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(line + "\n")
        self.process.stdin.flush()

    def host_pid(self) -> int:
        """The interpreter's pid in our namespace (unshare's forked child)."""
        unshare = self.process.pid
        for task in os.listdir(f"/proc/{unshare}/task"):
            children = Path(f"/proc/{unshare}/task/{task}/children").read_text().split()
            if children:
                return int(children[0])
        raise AssertionError("unshare has no child")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(WAIT_S)
        for stream in (self.process.stdin, self.process.stdout):
            if stream is not None:
                stream.close()


@pytest.fixture
def members(scope: str) -> Iterator[list[Member]]:
    started: list[Member] = []
    try:
        yield started
    finally:
        for member in started:
            member.stop()
        shutil.rmtree(_deployment(scope), ignore_errors=True)


def _deployment(scope: str, shm_root: str = DEFAULT_SHM_ROOT) -> str:
    from shmring.impl.names import deployment_directory

    return deployment_directory(scope, shm_root)


def _owned_files(scope: str, shm_root: str = DEFAULT_SHM_ROOT) -> set[str]:
    path = _deployment(scope, shm_root)
    if not os.path.isdir(path):
        return set()
    return {name for name in os.listdir(path) if name not in ("stamp", "members")}


def test_producer_in_child_namespace_receiver_in_root(scope: str, members: list[Member]) -> None:
    producer = Member(scope)
    members.append(producer)
    producer.send("put " + " ".join(KEYS))
    producer.expect("put")
    before = _owned_files(scope)
    assert any(name.startswith("ring.") for name in before), before
    with Connector(scope, pool_budget_bytes=0) as receiver:
        got = {key: receiver.get("a", "b", key) for key in KEYS}
        assert {key: got[key].status.name for key in KEYS} == dict.fromkeys(KEYS, "DELIVERED")
        assert got["k1"].value == {"key": "k1", "payload": "k1" * 100}
        assert receiver.health().reclaimed_files == 0
    assert before <= _owned_files(scope)  # nothing of the live producer removed
    producer.send("put k3")
    producer.expect("put")  # its ring still works


def test_producer_in_root_receiver_in_child_namespace(scope: str, members: list[Member]) -> None:
    with Connector(scope, pool_budget_bytes=0) as producer:
        for key in KEYS:
            producer.put("a", "b", key, {"key": key, "payload": key * 100})
        before = _owned_files(scope)
        receiver = Member(scope)
        members.append(receiver)
        receiver.send("get " + " ".join(KEYS))
        answer = receiver.expect("got")
        got = answer["got"]
        assert isinstance(got, dict)
        assert {key: got[key][0] for key in KEYS} == dict.fromkeys(KEYS, "DELIVERED"), got
        assert answer["reclaimed"] == 0
        assert before <= _owned_files(scope)


def test_sibling_namespaces(scope: str, members: list[Member]) -> None:
    producer = Member(scope)
    members.append(producer)
    producer.send("put " + " ".join(KEYS))
    producer.expect("put")
    receiver = Member(scope)
    members.append(receiver)
    receiver.send("get " + " ".join(KEYS))
    answer = receiver.expect("got")
    got = answer["got"]
    assert isinstance(got, dict)
    assert {key: got[key][0] for key in KEYS} == dict.fromkeys(KEYS, "DELIVERED"), got
    assert answer["reclaimed"] == 0


def _cli(*args: str, namespace: bool) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    command = [sys.executable, "-m", "shmring.cli", *args]
    if namespace:
        command = ["unshare", "--pid", "--fork", "--mount-proc", *command]
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=WAIT_S)


@pytest.mark.parametrize("producer_in_namespace", [True, False], ids=["child", "root"])
def test_gc_and_stat_from_another_namespace_remove_nothing_live(
    scope: str, members: list[Member], producer_in_namespace: bool
) -> None:
    outside: Connector | None = None
    try:
        if producer_in_namespace:
            producer = Member(scope)
            members.append(producer)
            producer.send("put " + " ".join(KEYS))
            producer.expect("put")
        else:
            outside = Connector(scope, pool_budget_bytes=0)
            for key in KEYS:
                outside.put("a", "b", key, {"key": key})
        before = _owned_files(scope)
        stat = _cli("stat", "--scope", scope, namespace=True)
        assert stat.returncode == 0, stat.stderr
        assert "dead" not in stat.stdout.lower(), stat.stdout
        gc = _cli("gc", "--scope", scope, namespace=True)
        assert gc.returncode == 0, gc.stderr
        assert "removed 0 file" in gc.stdout, gc.stdout
        assert before <= _owned_files(scope)
        with Connector(scope, pool_budget_bytes=0) as receiver:
            assert all(receiver.get("a", "b", key) for key in KEYS)
    finally:
        if outside is not None:
            outside.close()


def test_producer_killed_in_its_namespace_is_dead_outside(
    scope: str, members: list[Member]
) -> None:
    producer = Member(scope)
    members.append(producer)
    producer.send("put " + " ".join(KEYS))
    producer.expect("put")
    owned = _owned_files(scope)
    os.kill(producer.host_pid(), signal.SIGKILL)
    producer.process.wait(WAIT_S)
    with Connector(scope, pool_budget_bytes=0) as receiver:
        # Frames of a dead producer are never delivered.
        assert [receiver.get("a", "b", key).status.name for key in KEYS] == ["NOT_FOUND"] * 3
        deadline = time.monotonic() + 10.0
        while _owned_files(scope) & owned and time.monotonic() < deadline:
            receiver.get("a", "b", "another")
            time.sleep(0.05)
        assert not _owned_files(scope) & owned, _owned_files(scope)


# The container-restart case, in a private mount namespace holding a small
# tmpfs (room for one deployment's ring, not two) as the shm root.
_RESTART = r"""
import json, os, signal, subprocess, sys, time
sys.path[:0] = sys.argv[3].split(os.pathsep)
from shmring.model_tests.test_namespaces import Member
root, scope = sys.argv[1], sys.argv[2]
ring = 8 << 20
first = Member(scope, root, ring)
first.send("put k0 k1 k2")
before = first.expect("put")["files"]
os.kill(first.process.pid, signal.SIGKILL)  # unshare --kill-child: the whole container dies
first.process.wait(60)
second = Member(scope, root, ring)
second.send("put k3")
after = second.expect("put")["files"]
second.send("close")
second.expect("closed")
second.stop()
print(json.dumps({"before": before, "after": after}))
"""


def test_container_restart_reclaims_the_dead_members_files_at_the_first_join(
    scope: str, tmp_path: Path
) -> None:
    root = tmp_path / "shm"
    root.mkdir()
    env = dict(os.environ)
    path = os.pathsep.join(p for p in sys.path if p)
    script = (
        f"mount -t tmpfs -o size=12m,mode=1777 tmpfs {root} && "
        f"{sys.executable} -c '{_RESTART}' {root} {scope} {path}"
    )
    done = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
        capture_output=True,
        text=True,
        env=env,
        timeout=WAIT_S * 2,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.splitlines()[-1])
    old_rings = [n for n in result["before"] if n.startswith("ring.")]
    assert old_rings, result
    # The new container's first join removed the dead one's ring, live and
    # liveness files (markers wait for a receiver's scan); its own ring fit.
    assert not set(old_rings) & set(result["after"]), result
    assert not any(n.startswith("live.1.") and n in result["before"] for n in result["after"])
    assert [n for n in result["after"] if n.startswith("ring.")], result


def test_a_pid_namespace_without_its_own_proc_is_a_configuration_error(
    scope: str, members: list[Member]
) -> None:
    """/proc of the parent namespace: no start time of ours could be read; refused."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    script = (
        "import sys\n"
        "from shmring.impl.connector import Connector\n"
        "from shmring.impl.errors import ConfigurationError\n"
        "try:\n"
        "    Connector(sys.argv[1], pool_budget_bytes=0).put('a', 'b', 'k', b'x')\n"
        "except ConfigurationError as error:\n"
        "    print('refused:', error)\n"
    )
    done = subprocess.run(
        ["unshare", "--pid", "--fork", sys.executable, "-c", script, scope],
        capture_output=True,
        text=True,
        env=env,
        timeout=WAIT_S,
    )
    assert done.returncode == 0, done.stderr
    assert "refused:" in done.stdout and "/proc is not mounted" in done.stdout, done.stdout
    assert not any(name.startswith(("ring.", "live.", "marker.")) for name in _owned_files(scope))


# A borrower in its own pid namespace at a pid `argv[3]` (set through ns_last_pid),
# holding a borrowed ring payload until told to check it.
_BORROWER = r"""
import json, os, sys
scope, wanted = sys.argv[1], int(sys.argv[2])
with open("/proc/sys/kernel/ns_last_pid", "w") as last:
    last.write(str(wanted - 1))
child = os.fork()
if child:
    _, status = os.waitpid(child, 0)
    sys.exit(os.waitstatus_to_exitcode(status))
from shmring.impl.connector import Connector
connector = Connector(scope, pool_budget_bytes=0, ring_capacity=1 << 20)
def say(**fields):
    sys.stdout.write(json.dumps(fields) + "\n"); sys.stdout.flush()
got = connector.get("a", "b", "held", borrow=True)
view = got.value
say(event="held", pid=os.getpid(), status=got.status.name, route=got.route.name,
    kind=type(view).__name__, intact=bytes(view) == b"A" * len(view))
sys.stdin.readline()
say(event="checked", intact=bytes(view) == b"A" * len(view))
del view, got
connector.close()
"""


def _free_root_pid() -> int:
    """A pid no process of this namespace has now (high, below pid_max)."""
    used = {int(name) for name in os.listdir("/proc") if name.isdigit()}
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    for pid in range(pid_max - 100, 300, -97):
        if pid not in used and pid - 1 not in used:
            return pid
    raise AssertionError("no free pid")


def test_a_borrower_in_another_namespace_keeps_its_frame_when_the_ring_fills(scope: str) -> None:
    """Issue 26: a frame holder is judged by the kernel's verdict too, not by its pid alone.

    The borrower records its pid as its own namespace numbers it; here that
    pid names no process. On the old code the producer's full ring took the
    holder for dead, marked its frame DONE and wrote new frames over the
    bytes the live borrower's view reads.
    """
    wanted = _free_root_pid()
    with Connector(scope, pool_budget_bytes=0, ring_capacity=1 << 20) as producer:
        producer.put("a", "b", "held", b"A" * (96 * 1024))
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        borrower = subprocess.Popen(
            [
                "unshare",
                "--pid",
                "--fork",
                "--mount-proc",
                "--kill-child",
                sys.executable,
                "-c",
                _BORROWER,
                scope,
                str(wanted),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        try:
            assert borrower.stdout is not None and borrower.stdin is not None
            held = json.loads(borrower.stdout.readline())
            assert held["event"] == "held" and held["status"] == "DELIVERED", held
            assert held["pid"] == wanted and held["route"] == "RING", held
            assert held["kind"] == "memoryview" and held["intact"], held
            assert wanted not in {int(n) for n in os.listdir("/proc") if n.isdigit()}
            # Fill the ring many times over: the held frame at its tail stops the reclaim.
            for index in range(40):
                producer.put("a", "b", f"fill{index}", bytes([index % 200 + 40]) * (96 * 1024))
            borrower.stdin.write("check\n")
            borrower.stdin.flush()
            checked = json.loads(borrower.stdout.readline())
            assert checked == {"event": "checked", "intact": True}, checked
            ring = producer.ring("a", "b")
            assert ring is not None and ring.statistics().reclaimed_from_dead_holders == 0
        finally:
            if borrower.poll() is None:
                borrower.kill()
            borrower.wait(WAIT_S)
            for stream in (borrower.stdin, borrower.stdout):
                if stream is not None:
                    stream.close()


def test_the_pid_namespace_is_read_once_per_process_and_again_after_a_fork() -> None:
    """`own_pid_namespace` keeps (pid, namespace): reused by this pid, read again by another."""
    from shmring.impl import liveness_file
    from shmring.impl.os_seam import DEFAULT_OS

    namespace = liveness_file.own_pid_namespace(DEFAULT_OS)
    info = os.stat("/proc/self/ns/pid")
    assert namespace == (info.st_dev, info.st_ino)
    assert liveness_file._namespace_cache == (os.getpid(), namespace)
    saved = liveness_file._namespace_cache
    try:
        liveness_file._namespace_cache = (os.getpid(), (1, 2))  # what it keeps is what it answers
        assert liveness_file.own_pid_namespace(DEFAULT_OS) == (1, 2)
        liveness_file._namespace_cache = (os.getpid() + 1, (1, 2))  # a forked child's copy
        assert liveness_file.own_pid_namespace(DEFAULT_OS) == namespace
        assert liveness_file._namespace_cache == (os.getpid(), namespace)
    finally:
        liveness_file._namespace_cache = saved
