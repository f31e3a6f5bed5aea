"""The doorbell: a blocked receive sleeps in the kernel and wakes when rung.

Waits here are long (30 s) and the tests give them far less to finish, so a
wake that did not happen shows as a watchdog failure, not as a slow test.
"""

from __future__ import annotations

import mmap
import subprocess
import sys
import textwrap
import threading

import pytest

from shmring.impl import futex
from shmring.impl.connector import Connector, GetStatus
from shmring.impl.directory import ensure_deployment_directory
from shmring.impl.discovery import Stamp
from shmring.impl.os_seam import DEFAULT_OS

pytestmark = pytest.mark.skipif(not futex.AVAILABLE, reason="no futex syscall on this platform")

LONG_WAIT_S = 30.0
WATCHDOG_S = 20.0


@pytest.mark.parametrize("atomic", [True, False], ids=["wake-op", "plain-increment-fallback"])
def test_waiter_wakes_when_the_word_is_bumped(
    atomic: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Both ways of ringing: FUTEX_WAKE_OP, and the fallback for kernels that refuse it.
    monkeypatch.setattr(futex._Wake, "atomic", atomic)
    mapping = mmap.mmap(-1, 64)
    word = futex.FutexWord(mapping, 8)
    try:
        seen = word.load()
        started = threading.Event()

        def wait() -> None:
            started.set()
            word.wait(seen, LONG_WAIT_S)

        waiter = threading.Thread(target=wait)
        waiter.start()
        started.wait(WATCHDOG_S)
        while waiter.is_alive():
            word.bump_and_wake()
            waiter.join(0.05)
            if not waiter.is_alive():
                break
        waiter.join(WATCHDOG_S)
        assert not waiter.is_alive()
        assert word.load() != seen
    finally:
        word.close()
        mapping.close()


def test_wait_returns_at_once_when_the_word_already_moved() -> None:
    mapping = mmap.mmap(-1, 64)
    word = futex.FutexWord(mapping, 0)
    try:
        seen = word.load()
        word.bump_and_wake()
        done = threading.Thread(target=word.wait, args=(seen, LONG_WAIT_S))
        done.start()
        done.join(WATCHDOG_S)
        assert not done.is_alive()
    finally:
        word.close()
        mapping.close()


def test_doorbell_wakes_a_receiver_in_another_process(scope: str) -> None:
    directory = ensure_deployment_directory(scope, DEFAULT_OS)
    stamp = Stamp.open(directory, DEFAULT_OS)
    child_code = textwrap.dedent(
        f"""
        import sys
        from shmring.impl.discovery import Stamp
        from shmring.impl.os_seam import DEFAULT_OS
        stamp = Stamp.open({directory!r}, DEFAULT_OS)
        seen = stamp.doorbell()
        print(seen, flush=True)
        stamp.wait(seen, {LONG_WAIT_S})
        print(stamp.doorbell(), flush=True)
        stamp.close()
        """
    )
    child = subprocess.Popen([sys.executable, "-c", child_code], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        seen = int(child.stdout.readline())
        stamp.ring()
        # The child may not be asleep yet when the first ring comes: ring until it answers.
        ringer_stop = threading.Event()

        def keep_ringing() -> None:
            while not ringer_stop.wait(0.05):
                stamp.ring()

        ringer = threading.Thread(target=keep_ringing)
        ringer.start()
        try:
            after = int(child.stdout.readline())
        finally:
            ringer_stop.set()
            ringer.join()
        assert after != seen
        assert child.wait(timeout=WATCHDOG_S) == 0
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        if child.stdout is not None:
            child.stdout.close()
        stamp.close()
        for name in ("stamp",):
            DEFAULT_OS.unlink(f"{directory}/{name}")
        DEFAULT_OS.rmdir(directory)


def test_blocked_get_is_woken_by_a_put_from_another_connector(scope: str) -> None:
    with Connector(scope) as receiver, Connector(scope) as producer:
        receiver.get("a", "b", "warm-up")  # join the deployment before waiting
        result: list[object] = []

        def wait() -> None:
            result.append(receiver.get_with_deadline("a", "b", "k", timeout=LONG_WAIT_S))

        waiter = threading.Thread(target=wait)
        waiter.start()
        producer.put("a", "b", "k", {"v": 1})
        waiter.join(WATCHDOG_S)
        assert not waiter.is_alive()
        (got,) = result
        assert got.status is GetStatus.DELIVERED  # type: ignore[attr-defined]
        assert got.value == {"v": 1}  # type: ignore[attr-defined]


_RINGS_PER_PROCESS = 20000


def test_racing_wakers_in_two_processes_never_lose_a_ring() -> None:
    """Issue 13: a ring is one atomic add (FUTEX_WAKE_OP), so the word counts every ring.

    With a load-and-store increment two processes ringing at once lose
    increments (about 4% of 40,000 here), and a receiver that compares the
    word with what it read before its look could then miss a publication.
    """
    import os

    mapping = mmap.mmap(-1, 64)
    word = futex.FutexWord(mapping, 0)
    try:
        children = []
        for _ in range(2):
            pid = os.fork()
            if pid == 0:  # pragma: no cover - the child
                code = 1
                try:
                    for _ in range(_RINGS_PER_PROCESS):
                        word.bump_and_wake()
                    code = 0
                finally:
                    os._exit(code)
            children.append(pid)
        for pid in children:
            _, status = os.waitpid(pid, 0)
            assert os.waitstatus_to_exitcode(status) == 0
        assert word.load() == 2 * _RINGS_PER_PROCESS
    finally:
        word.close()
        mapping.close()


def test_spin_while_answers_whether_the_word_moved_within_its_bound() -> None:
    mapping = mmap.mmap(-1, 64)
    word = futex.FutexWord(mapping, 0)
    try:
        seen = word.load()
        assert word.spin_while(seen, 0.002) is False  # nobody rang: it gave up at its bound
        ringer = threading.Timer(0.02, word.bump_and_wake)
        ringer.start()
        try:
            assert word.spin_while(seen, LONG_WAIT_S) is True  # it saw the ring, long before 30 s
        finally:
            ringer.cancel()
            ringer.join()
        assert word.spin_while(seen, LONG_WAIT_S) is True  # already moved: at once
    finally:
        word.close()
        mapping.close()


@pytest.mark.parametrize("atomic", [True, False], ids=["wake-op", "plain-increment-fallback"])
def test_one_ring_wakes_a_waiter_already_asleep(
    atomic: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The wake call itself, on both ring paths: one ring, given after the waiter went to sleep."""
    import time

    monkeypatch.setattr(futex._Wake, "atomic", atomic)
    mapping = mmap.mmap(-1, 64)
    word = futex.FutexWord(mapping, 8)
    try:
        # Not 0: FUTEX_WAKE_OP's compare ("old value == 0") would wake one more waiter.
        word.bump_and_wake()
        seen = word.load()
        waiter = threading.Thread(target=word.wait, args=(seen, LONG_WAIT_S))
        waiter.start()
        time.sleep(0.2)  # asleep by now (were it not, the changed word ends its wait at once)
        word.bump_and_wake()
        waiter.join(WATCHDOG_S)
        assert not waiter.is_alive()  # a ring without the wake call leaves it asleep for 30 s
    finally:
        word.close()
        mapping.close()


def test_a_fresh_value_is_never_the_value_it_replaces() -> None:
    """The one value a plain-store ring may not write: the one a receiver just read."""
    state = futex._values.getstate()
    upcoming = futex._values.getrandbits(32)
    futex._values.setstate(state)
    assert futex.fresh_value(upcoming) == upcoming ^ 1
    futex._values.setstate(state)
    assert futex.fresh_value(upcoming ^ 1) == upcoming  # any other value: as drawn


def test_a_forked_child_draws_other_fresh_values_than_its_parent() -> None:
    """Parent and child ringing one doorbell must not write the same sequence."""
    import os

    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.write(write_end, b" ".join(b"%d" % futex.fresh_value(0) for _ in range(4)))
        finally:
            os._exit(0)
    os.close(write_end)
    try:
        child = [int(v) for v in os.read(read_end, 200).split()]
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
    finally:
        os.close(read_end)
    parent = [futex.fresh_value(0) for _ in range(4)]
    assert len(child) == 4 and child != parent


@pytest.mark.skipif(not futex.AVAILABLE, reason="needs futex(2)")
def test_a_wait_with_no_time_left_or_on_a_closed_word_returns_without_a_system_call() -> None:
    """A timeout <= 0 never reaches the kernel (a negative one would be EINVAL there), nor a
    closed word (its address may name a mapping that is gone, or one that never moves)."""
    mapping = mmap.mmap(-1, 64)
    word = futex.FutexWord(mapping, 0)
    try:
        seen = word.load()
        word.wait(seen, 0.0)
        word.wait(seen, -1.5)  # as a deadline already past gives it: no OSError(EINVAL)
        word.close()
        done = threading.Thread(target=word.wait, args=(seen, LONG_WAIT_S))
        done.start()
        done.join(WATCHDOG_S)
        assert not done.is_alive()  # it did not sleep on the unchanged word
    finally:
        word.close()
        mapping.close()
