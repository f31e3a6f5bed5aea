"""The `Connector`'s own doorbell calls: `wakeup_generation` and `wait_for_change`.

vllm-omni's facade sleeps on stage bells (`test_conformance`); these are the
native calls under it, which a fresh mutation sample found no test reaching
(seed 880892088: a mutant that dropped the timeout survived as "no tests").
"""

from __future__ import annotations

import threading

from shmring.fault_injection.kit.processes import watchdog
from shmring.impl.connector import Connector

EDGE = ("enc", "dec")


def test_the_generation_moves_with_every_put_and_wait_for_change_says_so(scope: str) -> None:
    with Connector(scope) as producer, Connector(scope) as receiver:
        generation = receiver.wakeup_generation()
        assert generation is not None  # futexes on Linux
        assert receiver.wait_for_change(generation, timeout=0.0) is False
        assert receiver.wait_for_change(generation, timeout=0.01) is False  # nothing published
        producer.put(EDGE, "a", b"x")
        assert receiver.wait_for_change(generation, timeout=0.0) is True  # no sleep needed
        moved = receiver.wakeup_generation()
        assert moved is not None and moved != generation
        producer.put(EDGE, "b", b"y")
        assert receiver.wakeup_generation() not in (generation, moved)  # each put rings once more


def test_wait_for_change_wakes_when_another_thread_puts(scope: str) -> None:
    with Connector(scope) as producer, Connector(scope) as receiver:
        generation = receiver.wakeup_generation()
        started = threading.Event()

        def put_later() -> None:
            started.wait()
            producer.put(EDGE, "late", b"z")

        thread = threading.Thread(target=put_later)
        thread.start()
        try:
            with watchdog(60):
                started.set()
                woke = False
                while not woke:  # one call sleeps at most a second: call again until it moves
                    woke = receiver.wait_for_change(generation, timeout=1.0)
        finally:
            thread.join()
        assert receiver.get(EDGE, "late").value == b"z"


def test_one_wait_returns_within_its_cap_even_for_a_long_timeout(scope: str) -> None:
    """At most a second per call (so a death, which rings no bell, is still looked for)."""
    with Connector(scope) as receiver:
        generation = receiver.wakeup_generation()
        with watchdog(30):  # an uncapped wait of an hour would be cut here, failing the test
            assert receiver.wait_for_change(generation, timeout=3600.0) is False


def test_no_generation_and_a_closed_connector_answer_false_at_once(scope: str) -> None:
    receiver = Connector(scope)
    generation = receiver.wakeup_generation()
    assert receiver.wait_for_change(None, timeout=5.0) is False
    receiver.close()
    assert receiver.wait_for_change(generation, timeout=5.0) is False
