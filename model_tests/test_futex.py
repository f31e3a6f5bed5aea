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


def test_waiter_wakes_when_the_word_is_bumped() -> None:
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
