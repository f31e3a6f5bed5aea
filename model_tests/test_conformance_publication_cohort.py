"""vllm-omni's ``test_shm_cohort.py`` against `shmring.SharedMemoryConnector` (issue 27).

Upstream: inside ``publication_cohort(from, to)`` a model step's puts are
invisible to receivers, on leaving it all of them become visible, readers
never trigger notifications themselves, and leaving a cohort with no put
still wakes deferred readers. Here a cohort is a protocol feature of its
own (`spec.cohort`, lockstepped in `connector_machine`): members on every
route (ring frame, pool slot, fallback segment) are invisible until the
commit, all visible in one step after it, also to receivers in another
process, and never when the producer dies inside the block. Each test
names the upstream behaviour it mirrors.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from shmring import Connector, GetStatus, SharedMemoryConnector
from shmring.fault_injection.kit.processes import ForkedChild, watchdog
from shmring.impl.discovery.gc import collect_orphans
from shmring.model_tests.conformance_kit import facade
from shmring.spec import cohort as cohort_spec
from shmring.spec import connector as connector_spec
from shmring.spec.connector import ConnectorGetStatus, Route
from shmring.spec.layout import COHORT_ENVELOPE_LENGTH, compute_frame_length

RING = 4096  # frames up to 1 KiB ride the ring
LARGE = b"L" * 3000  # the ring does not admit it


@pytest.fixture
def edge(scope: str) -> Iterator[tuple[SharedMemoryConnector, SharedMemoryConnector]]:
    sender = facade(scope, 0, host_ring_bytes=RING, pool_budget_bytes=0)
    receiver = facade(scope, 1)
    try:
        yield sender, receiver
    finally:
        sender.close()
        receiver.close()


# -- the model ---------------------------------------------------------------------------


def test_the_model_hides_members_until_the_commit_and_shows_all_of_them() -> None:
    """spec.cohort: test_cohort_prevents_partial_reads_and_commits_all_keys, in the model."""
    conn = connector_spec.initialize_connector(4096, 1 << 20)
    edge = ("0", "1")
    assert connector_spec.process_cohort_open(conn, edge) == 1
    small = connector_spec.process_put(conn, edge, "a", 10, "tag-a")
    large = connector_spec.process_put(conn, edge, "b", 3000, "tag-b")
    assert (small.route, large.route) == (Route.RING, Route.FALLBACK)
    # The member's frame holds the envelope in front of its payload.
    assert small.length == compute_frame_length(1, 10 + COHORT_ENVELOPE_LENGTH)
    for key, descriptor in (("a", small.descriptor), ("b", large.descriptor)):
        assert connector_spec.process_get(conn, edge, key).status is ConnectorGetStatus.NOT_FOUND
        got = connector_spec.process_get(conn, edge, key, descriptor)
        assert got.status is ConnectorGetStatus.NOT_FOUND  # not STALE: good once committed
    assert connector_spec.process_cohort_commit(conn, edge) is True
    assert connector_spec.process_get(conn, edge, "a").payload == "tag-a"
    assert connector_spec.process_get(conn, edge, "b", large.descriptor).payload == "tag-b"


def test_the_model_joins_nested_cohorts_and_numbers_them_per_edge() -> None:
    table = cohort_spec.CohortTable()
    edge, other = ("0", "1"), ("0", "2")
    assert cohort_spec.process_cohort_open(table, edge) == 1
    assert cohort_spec.process_cohort_open(table, edge) == 1  # joins the open one
    assert cohort_spec.process_cohort_open(table, other) == 1  # its own numbering
    member = cohort_spec.compute_stored_payload(table, edge, "x")
    assert cohort_spec.is_pending(table, edge, member)
    assert cohort_spec.process_cohort_commit(table, edge) is False  # the inner leave
    assert cohort_spec.is_pending(table, edge, member)
    assert cohort_spec.process_cohort_commit(table, edge) is True
    assert not cohort_spec.is_pending(table, edge, member)
    assert cohort_spec.process_cohort_open(table, edge) == 2
    assert cohort_spec.compute_stored_length(table, edge, 5) == 5 + COHORT_ENVELOPE_LENGTH
    assert cohort_spec.compute_stored_length(table, ("9", "9"), 5) == 5


# -- one process -----------------------------------------------------------------------


def test_members_are_invisible_until_the_block_ends_then_all_visible(edge: Any) -> None:
    """test_cohort_prevents_partial_reads_and_commits_all_keys."""
    sender, receiver = edge
    generation = receiver.get_wakeup_generation()
    with sender.publication_cohort("0", "1"):
        ok, _, small = sender.put("0", "1", "c0", {"value": 1})
        assert ok and "host_ring" in small
        assert receiver.get("0", "1", "c0") is None
        assert receiver.get("0", "1", "c0", small) is None
        ok, _, large = sender.put("0", "1", "c1", LARGE)
        assert ok and "shm" in large  # a fallback segment: a member all the same
        assert receiver.get("0", "1", "c1") is None and receiver.get("0", "1", "c1", large) is None
        assert receiver.wait_for_change(generation, timeout=0) is True  # its puts rang it
        generation = receiver.get_wakeup_generation()
    assert receiver.wait_for_change(generation, timeout=5) is True  # the commit rings too
    assert receiver.get("0", "1", "c0", small)[0] == {"value": 1}
    assert receiver.get("0", "1", "c1")[0] == LARGE
    # Readers cannot trigger notifications themselves.
    generation = receiver.get_wakeup_generation()
    assert receiver.get("0", "1", "c0") is None
    assert receiver.wait_for_change(generation, timeout=0) is False
    assert sender.health()["cohorts_committed"] == 1


def test_a_pool_member_is_invisible_until_the_commit(scope: str) -> None:
    """test_cohort_prevents_partial_reads_and_commits_all_keys, on the pool route."""
    with facade(scope, 0, host_ring_bytes=RING) as sender, facade(scope, 1) as receiver:
        payload = b"P" * (2 << 20)  # the pool carries it, its reference on the ring
        with sender.publication_cohort("0", "1"):
            ok, _, metadata = sender.put("0", "1", "pooled", payload)
            assert ok and metadata["shm"].get("pool") is True
            assert receiver.get("0", "1", "pooled", metadata) is None
            assert receiver.get("0", "1", "pooled") is None
        assert receiver.get("0", "1", "pooled", metadata)[0] == payload


def test_leaving_an_empty_cohort_still_wakes_waiting_readers(edge: Any) -> None:
    """test_release_without_successful_put_still_wakes_deferred_readers."""
    sender, receiver = edge
    generation = receiver.get_wakeup_generation()
    with sender.publication_cohort("0", "1"):
        pass
    assert receiver.wait_for_change(generation, timeout=5) is True


def test_a_commit_on_another_edge_does_not_wake_this_stage(scope: str) -> None:
    """test_shm_readiness.py::test_cohort_receiver_ignores_other_edge_and_preserves_overflow."""
    with facade(scope, 0) as sender, facade(scope, 1) as receiver:
        generation = receiver.get_wakeup_generation()
        with sender.publication_cohort("0", "2"):
            sender.put("0", "2", "elsewhere", 1)
        assert receiver.wait_for_change(generation, timeout=0.05) is False
        with sender.publication_cohort("0", "1"):
            pass
        assert receiver.wait_for_change(generation, timeout=5) is True


def test_nested_blocks_publish_at_the_outermost_end(edge: Any) -> None:
    sender, receiver = edge
    with sender.publication_cohort("0", "1"):
        with sender.publication_cohort("0", "1"):
            sender.put("0", "1", "inner", 1)
        assert receiver.get("0", "1", "inner") is None  # the inner end commits nothing
        sender.put("0", "1", "outer", 2)
    assert receiver.get("0", "1", "inner")[0] == 1 and receiver.get("0", "1", "outer")[0] == 2


def test_puts_of_other_threads_inside_the_block_are_members(edge: Any) -> None:
    """Upstream: the output worker holds the cohort while a save thread makes the puts."""
    sender, receiver = edge
    with sender.publication_cohort("0", "1"):
        saver = threading.Thread(target=lambda: sender.put("0", "1", "saved", {"by": "thread"}))
        saver.start()
        saver.join()
        assert receiver.get("0", "1", "saved") is None
    assert receiver.get("0", "1", "saved")[0] == {"by": "thread"}


def test_puts_to_other_edges_and_by_other_producers_are_not_members(edge: Any, scope: str) -> None:
    sender, receiver = edge
    with facade(scope, 0) as other, sender.publication_cohort("0", "1"):
        sender.put("0", "2", "other edge", 1)
        other.put("0", "1", "other producer", 2)
        with facade(scope, 2) as stage2:
            assert stage2.get("0", "2", "other edge")[0] == 1
        assert receiver.get("0", "1", "other producer")[0] == 2


def test_a_reput_inside_a_cohort_retires_the_older_version_at_once(edge: Any) -> None:
    """spec.cohort: routing, re-put and cancel follow spec.connector inside a cohort."""
    sender, receiver = edge
    _, _, old = sender.put("0", "1", "k", "old")
    with sender.publication_cohort("0", "1"):
        sender.put("0", "1", "k", "new")
        assert receiver.get("0", "1", "k", old) is None and receiver.get("0", "1", "k") is None
        sender.put("0", "1", "gone", 1)
        assert sender.cleanup("gone") is True
    assert receiver.get("0", "1", "k")[0] == "new" and receiver.get("0", "1", "gone") is None


def test_a_connector_get_of_a_member_is_not_found_not_stale(scope: str) -> None:
    """spec.cohort: NOT_FOUND (waited out by get_with_deadline), never STALE, for a pending member."""
    with Connector(scope) as sender, Connector(scope) as receiver:
        with sender.publication_cohort("0", "1"):
            descriptor = sender.put("0", "1", "k", b"v")
            assert receiver.get("0", "1", "k", descriptor=descriptor).status is GetStatus.NOT_FOUND
        got = receiver.get_with_deadline("0", "1", "k", descriptor=descriptor, timeout=5)
        assert got.status is GetStatus.DELIVERED and got.value == b"v"


def test_closing_inside_the_block_publishes_nothing(edge: Any, scope: str) -> None:
    sender, receiver = edge
    with sender.publication_cohort("0", "1"):
        sender.put("0", "1", "never", 1)
        sender.close()
    assert receiver.get("0", "1", "never") is None


# -- across processes -----------------------------------------------------------------


def _producer(scope: str, go: int, die_inside: bool) -> Any:
    def work(report: Any) -> None:  # pragma: no cover - runs in the forked child
        sender = facade(scope, 0, host_ring_bytes=RING, pool_budget_bytes=0)
        with sender.publication_cohort("0", "1"):
            sender.put("0", "1", "x0", {"step": 7})
            report({"one": True})
            os.read(go, 1)
            sender.put("0", "1", "x1", LARGE)
            report({"inside": True})
            if die_inside:
                os.read(go, 1)  # the parent kills us here
            os.read(go, 1)
        report({"committed": True})
        os.read(go, 1)
        sender.close()

    return work


def test_a_receiver_in_another_process_never_sees_part_of_a_cohort(scope: str) -> None:
    """Issue 27: no partial cohort, also across processes."""
    go_read, go_write = os.pipe()
    with watchdog(120), facade(scope, 1) as receiver:
        child = ForkedChild(_producer(scope, go_read, die_inside=False))
        try:
            assert child.next_report() == {"one": True}
            assert receiver.get("0", "1", "x0") is None
            os.write(go_write, b"x")
            assert child.next_report() == {"inside": True}
            assert receiver.get("0", "1", "x0") is None and receiver.get("0", "1", "x1") is None
            os.write(go_write, b"x")
            assert child.next_report() == {"committed": True}
            assert receiver.get("0", "1", "x1")[0] == LARGE  # the later member, first
            assert receiver.get("0", "1", "x0")[0] == {"step": 7}
            os.write(go_write, b"x")
            status, _ = child.reap()
            assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
        finally:
            child.kill()
            os.close(go_read)
            os.close(go_write)


def test_a_producer_killed_inside_a_cohort_publishes_none_of_it(scope: str) -> None:
    """Issue 27: none visible if the producer dies inside the block."""
    go_read, go_write = os.pipe()
    with watchdog(120), facade(scope, 1) as receiver:
        child = ForkedChild(_producer(scope, go_read, die_inside=True))
        try:
            assert child.next_report() == {"one": True}
            os.write(go_write, b"x")
            assert child.next_report() == {"inside": True}
            child.kill()  # SIGKILL inside the block: the gate never moves
            for key in ("x0", "x1"):
                assert receiver.get("0", "1", key) is None
                deadline = time.monotonic() + 0.2
                assert receiver.get_with_deadline("0", "1", key, deadline=deadline) is None
            directory = receiver.connector.directory
        finally:
            child.kill()
            os.close(go_read)
            os.close(go_write)
    collect_orphans(directory, receiver.connector._os)  # what the dead producer left
    assert not os.path.exists(directory)
