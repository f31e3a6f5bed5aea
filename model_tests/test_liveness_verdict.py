"""The liveness verdict (issue 26): the model's oracle, and the real code through pid reuse.

The model (`spec.producers.get_verdict`): for any faithful environment, an
observer in any pid namespace never judges a live producer dead and judges
every dead one dead; a pid-only verdict from another namespace does not.

The implementation (`impl.liveness.Liveness`): a same-pid successor with
another start time, and a stale identity naming a live pid, on both the
fast path ((pid, start time), our namespace) and the lock path (a liveness
file of another namespace), so a verdict cached by pid alone fails here.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shmring.impl.directory import PathDirectory
from shmring.impl.liveness import (
    Liveness,
    hold_liveness_file,
    holds_liveness_file,
    liveness_file_name,
    release_liveness_file,
)
from shmring.impl.names import current_producer_identity, read_start_time
from shmring.impl.os_seam import DEFAULT_OS
from shmring.model_tests.workers import deployment_directory
from shmring.spec import producers as producers_spec

# -- the model ----------------------------------------------------------------------------

NAMESPACES = (0, 1, 2)


@st.composite
def environments(
    draw: st.DrawFn,
) -> tuple[list[producers_spec.ProducerState], dict[int, producers_spec.ProcessTable]]:
    """Producers in namespaces, some dead (pids maybe reused), and faithful process tables."""
    tables: dict[int, producers_spec.ProcessTable] = {n: {} for n in NAMESPACES}
    producers = []
    used: set[tuple[int, int, int]] = set()
    for _ in range(draw(st.integers(1, 6))):
        namespace = draw(st.sampled_from(NAMESPACES))
        pid = draw(st.integers(1, 3))  # pids collide across namespaces on purpose
        start = draw(st.integers(1, 5))
        if (namespace, pid, start) in used or pid in tables[namespace]:
            continue
        used.add((namespace, pid, start))
        alive = draw(st.booleans())
        producer = producers_spec.initialize_producer((pid, start, 0), 4096, 1 << 20)
        producer.namespace = namespace
        producer.alive = alive
        if alive:
            tables[namespace][pid] = start
        elif draw(st.booleans()):
            tables[namespace][pid] = start + 10  # the pid reused by a later process
        producers.append(producer)
    # Unrelated processes with the same pids in every namespace (a dead producer's pid reused).
    for namespace in NAMESPACES:
        for pid in (1, 2, 3):
            if pid not in tables[namespace] and draw(st.booleans()):
                tables[namespace][pid] = draw(st.integers(20, 30))
    return producers, tables


@given(environments(), st.sampled_from(NAMESPACES))
def test_model_verdict_is_safe_and_complete_in_every_namespace(
    environment: tuple[list[producers_spec.ProducerState], dict[int, producers_spec.ProcessTable]],
    observer: int,
) -> None:
    producers, tables = environment
    assert producers_spec.is_table_faithful(producers, tables)
    assert producers_spec.is_verdict_safe(producers, observer, tables)
    assert producers_spec.is_verdict_complete(producers, observer, tables)


def test_model_pid_verdict_from_another_namespace_is_unsafe() -> None:
    producer = producers_spec.initialize_producer((1, 500, 0), 4096, 1 << 20)
    producer.namespace = 1
    tables = {0: {1: 3}, 1: {1: 500}}  # pid 1 of the root namespace started at boot
    assert producers_spec.is_table_faithful([producer], tables)
    assert not producers_spec.get_pid_verdict(producer, tables[0])  # what main did
    assert producers_spec.get_verdict(producer, 0, tables)  # the lock's answer


# -- the implementation through pid reuse ---------------------------------------------------

_HOLDER = r"""
import fcntl, os, struct, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
fcntl.fcntl(fd, fcntl.F_OFD_SETLK, struct.pack("hhqqi4x", fcntl.F_WRLCK, 0, 0, 0, 0))
os.write(fd, b"pidns 1:1\n")  # another pid namespace than any real one
sys.stdout.write("locked\n"); sys.stdout.flush()
sys.stdin.readline()
"""


@pytest.fixture
def directory(scope: str) -> Iterator[str]:
    with deployment_directory(scope) as path:
        yield path


def _holder(path: str) -> subprocess.Popen[str]:
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, path],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None and holder.stdout.readline() == "locked\n"
    return holder


def _stop(holder: subprocess.Popen[str]) -> None:
    assert holder.stdin is not None and holder.stdout is not None
    holder.stdin.close()
    holder.wait(30)
    holder.stdout.close()


def _pidfds() -> int:
    """This process's open pidfds."""
    count = 0
    for name in os.listdir("/proc/self/fd"):
        try:
            count += os.readlink(f"/proc/self/fd/{name}") == "anon_inode:[pidfd]"
        except OSError:
            continue
    return count


def test_fast_path_pid_reuse_a_successor_and_a_stale_identity(directory: str) -> None:
    """Same namespace: (pid, start time) decides, never the pid alone, in either order."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        start = read_start_time(child.pid)
        assert start is not None
        live, stale = (child.pid, start), (child.pid, start - 1)
        liveness = Liveness(DEFAULT_OS, directory=PathDirectory(directory))
        try:
            assert liveness.is_alive(live)
            assert not liveness.is_alive(stale)  # a stale identity naming a live pid
            assert liveness.is_alive(live)
        finally:
            liveness.close()
        liveness = Liveness(DEFAULT_OS, directory=PathDirectory(directory))
        try:
            before = _pidfds()
            assert not liveness.is_alive(stale)  # the other order: dead first
            # The pidfd opened for the stale identity names the successor: closed at once
            # (the `pid_reuse` fault cell found it kept, one descriptor per such question).
            assert _pidfds() == before and liveness.pidfd_count == 0
            assert liveness.is_alive(live)  # the same pid's successor runs
        finally:
            liveness.close()
    finally:
        child.kill()
        child.wait()


def test_lock_path_pid_reuse_a_successor_and_a_stale_identity(directory: str) -> None:
    """Another namespace: each identity's own liveness file decides, never the pid alone.

    Two identities with one pid (one recorded in another pid namespace): the
    earlier process's file is unlocked (it died), the successor's is held.
    Neither pid runs here, so a pid verdict would call both dead.
    """
    pid = 2**22 + 7  # beyond pid_max: no process of ours has it
    dead, live = (pid, 100), (pid, 200)
    with open(os.path.join(directory, liveness_file_name(dead)), "wb") as handle:
        handle.write(b"pidns 1:1\n")
    holder = _holder(os.path.join(directory, liveness_file_name(live)))
    try:
        for order in ((dead, live), (live, dead)):
            liveness = Liveness(DEFAULT_OS, directory=PathDirectory(directory))
            try:
                verdicts = {identity: liveness.is_alive(identity) for identity in order}
                assert verdicts == {dead: False, live: True}
                assert liveness.is_alive(live) and not liveness.is_alive(dead)
            finally:
                liveness.close()
    finally:
        _stop(holder)
    liveness = Liveness(DEFAULT_OS, directory=PathDirectory(directory))
    try:
        assert not liveness.is_alive(live)  # its holder exited: the kernel released the lock
    finally:
        liveness.close()
        for identity in (dead, live):
            os.unlink(os.path.join(directory, liveness_file_name(identity)))


def test_a_liveness_file_being_made_is_alive_then_dead(directory: str) -> None:
    """Created, not yet locked nor written: alive for the grace period only."""
    identity = (2**22 + 9, 5)
    path = os.path.join(directory, liveness_file_name(identity))
    with open(path, "wb"):
        pass
    liveness = Liveness(DEFAULT_OS, directory=PathDirectory(directory))
    try:
        assert liveness.is_alive(identity)
        os.utime(path, (time.time() - 60, time.time() - 60))
        assert not liveness.is_alive(identity)
    finally:
        liveness.close()
        os.unlink(path)


def test_a_kept_liveness_file_replaced_or_removed_is_not_a_death(directory: str) -> None:
    """A first look that caught a member's file still empty keeps its descriptor;
    when that member leaves (its file unlinked, the lock dropped) and the same
    process joins again (a new file), the old inode's free lock is no verdict.
    Seen from outside: two same-uid processes churning connectors in one scope found a
    live sibling dead and removed its fallback temporary mid-put (issue 22)."""
    me = current_producer_identity()[:2]
    path = os.path.join(directory, liveness_file_name(me))
    namespace = os.stat("/proc/self/ns/pid")
    for rejoins in (True, False):
        with open(path, "wb"):
            pass  # created, not yet locked nor written: the observer's first look
        liveness = Liveness(DEFAULT_OS, directory=PathDirectory(directory))
        try:
            assert liveness.is_alive(me)
            with open(path, "wb") as handle:  # the member wrote it, then left
                handle.write(b"pidns %d:%d\n" % (namespace.st_dev, namespace.st_ino))
            os.unlink(path)
            if rejoins:
                hold_liveness_file(PathDirectory(directory), DEFAULT_OS)  # a new file, held
            try:
                assert liveness.is_alive(me), rejoins
                assert liveness.is_alive(me), rejoins  # and it stays so
            finally:
                if rejoins:
                    release_liveness_file(PathDirectory(directory), DEFAULT_OS)
        finally:
            liveness.close()
    assert not os.path.exists(path)


def test_own_liveness_file_is_held_counted_and_removed(directory: str) -> None:
    where = PathDirectory(directory)
    name = liveness_file_name(current_producer_identity())
    hold_liveness_file(where, DEFAULT_OS)
    hold_liveness_file(where, DEFAULT_OS)
    try:
        assert holds_liveness_file(where, DEFAULT_OS)
        with open(os.path.join(directory, name), "rb") as handle:
            content = handle.read()
        info = os.stat("/proc/self/ns/pid")
        assert content == b"pidns %d:%d\n" % (info.st_dev, info.st_ino)
        # Another process (this test's fresh interpreter) sees the lock held.
        probe = subprocess.run(
            [
                sys.executable,
                "-c",
                "import fcntl, os, struct, sys\n"
                "fd = os.open(sys.argv[1], os.O_RDONLY)\n"
                "r = fcntl.fcntl(fd, fcntl.F_OFD_GETLK,"
                " struct.pack('hhqqi4x', fcntl.F_WRLCK, 0, 0, 0, 0))\n"
                "print(struct.unpack('hhqqi4x', r)[0] != fcntl.F_UNLCK)",
                os.path.join(directory, name),
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        assert probe.stdout.strip() == "True"
        release_liveness_file(where, DEFAULT_OS)
        assert os.path.exists(os.path.join(directory, name))  # one hold left
    finally:
        release_liveness_file(where, DEFAULT_OS)
    assert not os.path.exists(os.path.join(directory, name))
    assert not holds_liveness_file(where, DEFAULT_OS)


def test_a_liveness_file_that_cannot_be_made_leaves_the_connector_working(scope: str) -> None:
    """ENOSPC at the liveness file: a warning, no file; (pid, start time) judges us."""
    import errno

    from shmring.fault_injection.kit.seams import FaultyOs
    from shmring.impl.connector import Connector

    seam = FaultyOs()
    seam.fail_open(liveness_file_name(current_producer_identity()), errno.ENOSPC)
    with Connector(scope, pool_budget_bytes=0, os_facade=seam) as producer:
        producer.put("a", "b", "k", b"payload")
        names = os.listdir(producer.directory)
        assert liveness_file_name(current_producer_identity()) not in names
        with Connector(scope, pool_budget_bytes=0) as receiver:
            assert receiver.get("a", "b", "k").value == b"payload"
