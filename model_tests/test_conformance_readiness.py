"""vllm-omni's ``test_shm_readiness.py`` (and its receivers' wake-up FIFOs) against the facade (issue 27).

Upstream's ``ShmReadiness`` watches /dev/shm with inotify: a publication is
seen only once its writer closed the file, several keys published by
another process arrive together, a local wake before the wait is kept, a
queue overflow asks for a rescan, an invalidated watch is an error rather
than lost notifications, a cohort receiver ignores other edges. Its
connector gives each receiving connector a FIFO of its own, woken by puts
to its stage. The seed's receivers sleep on futex words instead: the
deployment doorbell and, per destination stage, a stage bell in the stamp
file (`discovery.StageBell`), compared with a snapshot
(`get_wakeup_generation` / `wait_for_change`). The inotify specifics
(overflow, invalidated watches) have no counterpart: a counter neither
overflows nor is invalidated (docs/conformance.md). Each test names the
upstream behaviour it mirrors.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from shmring import SharedMemoryConnector
from shmring.fault_injection.kit.processes import watchdog
from shmring.model_tests.conformance_kit import facade


@pytest.fixture
def stages(scope: str) -> Iterator[tuple[SharedMemoryConnector, ...]]:
    """A sender (stage 0) and receivers of stages 1, 1 and 2."""
    connectors = (facade(scope, 0), facade(scope, 1), facade(scope, 1), facade(scope, 2))
    try:
        yield connectors
    finally:
        for connector in connectors:
            connector.close()


def test_a_wakeup_comes_only_after_the_payload_is_there(stages: Any) -> None:
    """test_publication_requires_writer_close: woken, the receiver always finds the payload."""
    sender, receiver, _, _ = stages
    generation = receiver.get_wakeup_generation()
    seen: list[Any] = []

    def receive() -> None:
        assert receiver.wait_for_change(generation, timeout=30)
        seen.append(receiver.get(0, 1, "request_0_0"))

    with watchdog(60):
        waiter = threading.Thread(target=receive)
        waiter.start()
        sender.put(0, 1, "request_0_0", b"published")
        waiter.join()
    assert seen == [(b"published", seen[0][1])]


def test_puts_of_another_process_wake_the_receiver_and_all_their_keys_are_there(
    stages: Any, scope: str
) -> None:
    """test_cross_process_publication_batches_keys."""
    _, receiver, _, _ = stages
    generation = receiver.get_wakeup_generation()
    script = textwrap.dedent(
        f"""
        from shmring import SharedMemoryConnector
        sender = SharedMemoryConnector({{"stage_id": 0, "wakeup_scope": {scope!r}}})
        for key in ("a_0_0", "b_0_1"):
            assert sender.put(0, 1, key, key.encode())[0]
        print("put", flush=True)
        input()
        sender.close()
        """
    )
    with watchdog(120):
        child = subprocess.Popen(
            [sys.executable, "-c", script],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
        )
        try:
            assert child.stdout is not None and child.stdout.readline() == "put\n"
            assert receiver.wait_for_change(generation, timeout=30) is True
            assert receiver.get(0, 1, "a_0_0")[0] == b"a_0_0"
            assert receiver.get(0, 1, "b_0_1")[0] == b"b_0_1"
        finally:
            child.communicate("\n", timeout=60)
    assert child.returncode == 0


def test_a_put_before_the_wait_is_not_lost(stages: Any) -> None:
    """test_local_wake_before_wait_is_retained."""
    sender, receiver, _, _ = stages
    generation = receiver.get_wakeup_generation()
    sender.put(0, 1, "early", 1)
    assert receiver.wait_for_change(generation, timeout=0) is True  # already changed: no wait


def test_a_receiver_wakes_for_its_own_stage_only(stages: Any) -> None:
    """Issue 27: wait_for_change returns on a put to this receiver's stage, not on other traffic."""
    sender, receiver, _, other = stages
    generation = receiver.get_wakeup_generation()
    sender.put(0, 2, "for stage 2", 1)
    sender.put(0, 3, "for stage 3", 1)
    assert receiver.wait_for_change(generation, timeout=0.05) is False
    other_generation = other.get_wakeup_generation()
    sender.put(0, 1, "for stage 1", 1)
    assert receiver.wait_for_change(generation, timeout=5) is True
    assert other.wait_for_change(other_generation, timeout=0.05) is False


def test_two_receivers_of_a_stage_each_see_every_wakeup_whatever_the_other_does(
    stages: Any, scope: str
) -> None:
    """Upstream: every receiver of a stage owns its FIFO; a put broadcasts to all of them."""
    sender, first, second, _ = stages
    one, two = first.get_wakeup_generation(), second.get_wakeup_generation()
    sender.put(0, 1, "k0", 1)
    assert first.wait_for_change(one, timeout=5) is True
    assert second.wait_for_change(two, timeout=5) is True  # the first one's wait took nothing
    one, two = first.get_wakeup_generation(), second.get_wakeup_generation()
    first.close()
    assert first.get_wakeup_generation() is None  # a closed receiver has no bell
    assert first.wait_for_change(one, timeout=0) is False
    sender.put(0, 1, "k1", 1)
    assert second.wait_for_change(two, timeout=5) is True  # its peer's close did not matter
    with facade(scope, 1) as replacement:  # a receiver that starts after one closed
        three = replacement.get_wakeup_generation()
        sender.put(0, 1, "k2", 1)
        assert replacement.wait_for_change(three, timeout=5) is True


def test_a_waiting_receiver_is_woken_by_a_put_to_its_stage(stages: Any) -> None:
    """Upstream's receive loop: snapshot, poll, block in wait_for_change until data arrives."""
    sender, receiver, _, _ = stages
    generation = receiver.get_wakeup_generation()
    assert receiver.get(0, 1, "next") is None
    timer = threading.Timer(0.05, lambda: sender.put(0, 1, "next", 5))
    with watchdog(60):
        timer.start()
        assert receiver.wait_for_change(generation, timeout=30) is True
        timer.join()
    assert receiver.get(0, 1, "next")[0] == 5


@pytest.mark.parametrize("stage_id", [None, -1, "-1"], ids=repr)
def test_no_stage_no_generation(scope: str, stage_id: object) -> None:
    """Upstream: get_wakeup_generation() is None for a stage id that is None, negative or not a number."""
    with facade(scope, stage_id) as connector:
        assert connector.get_wakeup_generation() is None
        assert connector.wait_for_change(None, timeout=0) is False
    with facade(scope, 1) as named:
        named.stage_id = "prefill"  # vllm-omni reads the attribute at every call
        assert named.get_wakeup_generation() is None


def test_wakeups_switched_off_by_the_environment(
    scope: str, monkeypatch: pytest.MonkeyPatch, stages: Any
) -> None:
    """Upstream: ``VLLM_OMNI_SHM_WAKEUP=0`` leaves every receiver to its timed poll."""
    sender, receiver, _, _ = stages
    monkeypatch.setenv("VLLM_OMNI_SHM_WAKEUP", "0")
    assert receiver.get_wakeup_generation() is None
    assert receiver.wait_for_change(0, timeout=0) is False
    sender.put(0, 1, "still delivered", 1)
    assert receiver.get(0, 1, "still delivered")[0] == 1
    with facade(scope, 1) as late:
        assert late.get_wakeup_generation() is None
