"""vllm-omni's ``test_shm_cleanup_retry.py`` against `shmring.SharedMemoryConnector` (issue 27).

Upstream: a producer owns what it published until it is really gone; a
cleanup whose unlink fails keeps the name and retries it (bounded, backed
off), close flushes once and never raises, a retry never removes another
producer's reused key, and cleanup never waits for a busy transfer lock
(it returns within 0.5 s). Here the same, with the seed's rule on top: a
cleanup *retires* (no get after it delivers the payload, docs/conformance.md),
so what is retried is only the removal of the file. Faults come through
the OS seam (`conformance_kit.UnlinkFaults`); locks are held by another
process (`lock_holder`). Every test names the upstream test it mirrors.
"""

from __future__ import annotations

import errno
import os
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from shmring import SharedMemoryConnector
from shmring.fault_injection.kit.processes import lock_holder, wait_until, watchdog
from shmring.model_tests.conformance_kit import UnlinkFaults, facade, file_of, segment_name

EDGE = ("0", "1")


@pytest.fixture
def faults() -> UnlinkFaults:
    return UnlinkFaults()


@pytest.fixture
def sender(scope: str, faults: UnlinkFaults) -> Iterator[SharedMemoryConnector]:
    """vllm-omni's ``SharedMemoryConnector({"stage_id": 0})``: every payload in a segment."""
    connector = facade(scope, 0, host_ring_bytes=0, os_facade=faults)
    try:
        yield connector
    finally:
        faults.heal()
        connector.close()


@pytest.fixture
def receiver(scope: str) -> Iterator[SharedMemoryConnector]:
    connector = facade(scope, 1, host_ring_bytes=0)
    try:
        yield connector
    finally:
        connector.close()


def _put(sender: SharedMemoryConnector, key: str, value: Any = "payload") -> str:
    ok, _, metadata = sender.put("0", "1", key, value)
    assert ok and metadata is not None and "shm" in metadata
    return file_of(metadata)


def _inode(path: str) -> int:
    return os.stat(path).st_ino


def test_a_failed_cleanup_stays_owned_and_is_retried(
    sender: SharedMemoryConnector, receiver: SharedMemoryConnector, faults: UnlinkFaults
) -> None:
    """test_failed_cleanup_stays_owned_and_idle_sender_retries (issue 27, defect 3)."""
    path = _put(sender, "retry_key")
    _put(sender, "retry_key_suffix", "peer")
    inode = _inode(path)
    faults.fail(segment_name("retry_key"), times=1)
    assert sender.cleanup("retry_key") is True  # retired (never delivered again); no error
    assert _inode(path) == inode  # the unlink failed: the file is kept, still ours
    health = sender.health()
    assert health["unlink_failures"] == 1 and health["deferred_pending"] == 1
    # The sender's idle maintenance (reap_consumed) retries it after its back-off.
    assert wait_until(lambda: (sender.reap_consumed(), not os.path.exists(path))[1], 10)
    assert faults.attempts[segment_name("retry_key")] == 2
    assert sender.health()["deferred_pending"] == 0
    assert receiver.get("0", "1", "retry_key_suffix")[0] == "peer"  # its peer was never touched


def test_a_persistent_unlink_failure_backs_off_and_close_flushes_it_without_raising(
    scope: str, sender: SharedMemoryConnector, faults: UnlinkFaults
) -> None:
    """test_persistent_failure_is_bounded_and_close_flushes_once (issue 27, defect 3)."""
    name = segment_name("stuck")
    path = _put(sender, "stuck")
    faults.fail(name, times=None)
    sender.cleanup("stuck")
    for _ in range(50):  # a busy sender: each call may try, the back-off decides
        assert sender.cleanup("stuck") is False  # nothing left to retire
        sender.reap_consumed()
    assert faults.attempts[name] < 5  # not once per call: backed off
    attempts = faults.attempts[name]
    sender.close()  # never raises for it; one immediate try
    assert faults.attempts[name] == attempts + 1
    assert os.path.exists(path) and sender.health()["unlink_failures"] >= 2
    faults.heal()
    sender.close()  # a later close (or reap_consumed) retries what is left
    assert not os.path.exists(path)
    assert not os.path.exists(sender.connector.directory)  # the last one out, once nothing is left


def test_a_retry_never_removes_another_producers_reused_key(
    scope: str, sender: SharedMemoryConnector, receiver: SharedMemoryConnector, faults: UnlinkFaults
) -> None:
    """test_retry_does_not_unlink_another_producers_reused_key (issue 27, defect 3)."""
    path = _put(sender, "reused", "old generation")
    first = _inode(path)
    faults.fail(segment_name("reused"), times=1)
    sender.cleanup("reused")
    with facade(scope, 0, host_ring_bytes=0) as replacement:
        assert replacement.put("0", "1", "reused", "new generation")[0]
        second = _inode(path)
        assert second != first
        sender.reap_consumed()
        sender.close()
        assert _inode(path) == second  # the old cleanup left the replacement's file alone
        assert sender.health()["deferred_pending"] == 0
        assert receiver.get("0", "1", "reused")[0] == "new generation"


def test_a_retired_segment_is_never_delivered_and_duplicate_cleanups_are_safe(
    sender: SharedMemoryConnector, receiver: SharedMemoryConnector, faults: UnlinkFaults
) -> None:
    """test_consumer_unlink_before_retry_and_duplicate_cleanup_are_safe.

    Superseded in part: upstream's receiver still reads a payload whose
    cleanup failed; the seed's cleanup retires it, so the receiver answers
    None and removes the retired file under its lock (docs/conformance.md).
    """
    name = segment_name("twice")
    path = _put(sender, "twice")
    faults.fail(name, times=1)
    assert sender.cleanup("twice") is True
    assert receiver.get("0", "1", "twice") is None  # retired: never delivered
    assert not os.path.exists(path)  # the receiver removed it, holding its lock
    sender.reap_consumed()
    for _ in range(3):
        assert sender.cleanup("twice") is False
    assert faults.attempts[name] == 1  # nothing left for the sender to try
    assert sender.health()["deferred_pending"] == 0


def test_an_unexpected_unlink_error_propagates_and_keeps_the_segment(
    sender: SharedMemoryConnector, receiver: SharedMemoryConnector, faults: UnlinkFaults
) -> None:
    """test_unexpected_cleanup_error_propagates_without_automatic_retry."""
    path = _put(sender, "odd")
    faults.fail(segment_name("odd"), times=1, error=RuntimeError("unexpected program error"))
    with pytest.raises(RuntimeError, match="unexpected program error"):
        sender.cleanup("odd")
    sender.reap_consumed()
    assert os.path.exists(path) and sender.health()["deferred_pending"] == 0  # not deferred
    assert sender.cleanup("odd") is True and not os.path.exists(path)  # a later cleanup does it
    assert receiver.get("0", "1", "odd") is None


def test_a_replacement_writer_waits_for_the_old_generations_lock(
    scope: str, sender: SharedMemoryConnector, receiver: SharedMemoryConnector
) -> None:
    """test_cleanup_and_replacement_writer_share_the_same_lock and the consumer's variant.

    A writer replacing a segment takes the lock of the file at its name,
    as the old generation's reader (or cleanup) does: while another
    process holds it (briefly), the replacement waits, then publishes.
    """
    path = _put(sender, "shared", "old generation")
    with facade(scope, 0, host_ring_bytes=0) as writer, watchdog(60):
        with lock_holder(path) as holder:
            releaser = threading.Timer(0.1, holder.release)
            releaser.start()
            started = time.monotonic()
            ok, _, _ = writer.put("0", "1", "shared", "replacement generation")
            waited = time.monotonic() - started
            releaser.join()
        assert ok and waited >= 0.09  # it did not bypass the lock
        assert receiver.get("0", "1", "shared")[0] == "replacement generation"
        assert receiver.get("0", "1", "shared") is None  # one version: the old one went with it


def test_cleanup_reput_and_close_return_while_another_process_holds_the_lock(
    scope: str, sender: SharedMemoryConnector, receiver: SharedMemoryConnector
) -> None:
    """test_cleanup_never_waits_for_a_busy_transfer_lock (issue 27, defect 2).

    Upstream bounds cleanup by 0.5 s; here every producer call waits at
    most `PRODUCER_LOCK_WAIT_SECONDS` per lock, then defers: each call below
    returns while the holder still holds the lock (the watchdog would fire
    otherwise).
    """
    path = _put(sender, "busy")
    with watchdog(30), lock_holder(path):
        assert sender.cleanup("busy") is True  # marked retired without the lock
        assert os.path.exists(path)  # removed once the lock is free
        assert sender.health()["deferred_pending"] == 1
        far = time.monotonic() + 1
        assert receiver.get_with_deadline("0", "1", "busy", deadline=far) is None
    other = _put(sender, "busy too")
    with watchdog(30), lock_holder(other):
        sender.close()  # returns while the lock is held; the file is kept, counted
        assert os.path.exists(other) and sender.health()["deferred_pending"] >= 1
    # reap_consumed after close too: what close left goes once the lock is free (backed off).
    assert wait_until(lambda: (sender.reap_consumed(), not os.path.exists(other))[1], 10)
    assert not os.path.exists(path)
    assert receiver.get("0", "1", "busy too") is None


def test_ring_cleanup_reput_and_close_return_while_a_reader_holds_the_ring_lock(
    scope: str,
) -> None:
    """test_cleanup_never_waits_for_a_busy_transfer_lock, on the seed's ring (issue 27, defect 2).

    The ring's lock is held through the ring file (as a reader holds it
    for a claim): cleanup, a re-put of the same key and close each return
    while it is held; the retire they could not do is done once it is free.
    """
    with facade(scope, 0) as sender, facade(scope, 1) as receiver:
        ok, _, metadata = sender.put("0", "1", "k", b"v1")
        assert ok and "host_ring" in metadata
        with watchdog(30), lock_holder(file_of(metadata)):
            assert sender.cleanup("k") is False  # could not retire it now: deferred
            assert sender.health()["deferred_pending"] == 1
            ok, _, newer = sender.put("0", "1", "k", b"v2")  # re-put: does not wait either
            assert ok
        assert receiver.get("0", "1", "k", metadata) is None  # the older version is gone
        assert receiver.get("0", "1", "k", newer)[0] == b"v2"
        sender.reap_consumed()
        assert sender.health()["deferred_pending"] == 0
        ok, _, metadata = sender.put("0", "1", "last", b"v3")
        with watchdog(30), lock_holder(file_of(metadata)):
            sender.close()  # returns while the lock is held: the ring is CLOSED first
        assert receiver.get("0", "1", "last") is None
        assert not os.path.exists(file_of(metadata))


def test_a_reput_past_the_bound_fails_cleanly_and_changes_nothing(
    scope: str, sender: SharedMemoryConnector, receiver: SharedMemoryConnector
) -> None:
    """Issue 27, defect 2: a segment re-put whose old file stays locked answers (False, 0, None)."""
    path = _put(sender, "held", "first")
    with watchdog(30), lock_holder(path):
        assert sender.put("0", "1", "held", "second") == (False, 0, None)
    assert receiver.get("0", "1", "held")[0] == "first"  # nothing changed


def test_a_same_producer_reput_is_not_removed_by_its_old_cleanup(
    sender: SharedMemoryConnector, receiver: SharedMemoryConnector, faults: UnlinkFaults
) -> None:
    """test_same_producer_reuse_does_not_inherit_old_cleanup_request."""
    path = _put(sender, "again", "old")
    faults.fail(segment_name("again"), times=1)
    sender.cleanup("again")
    _put(sender, "again", "new")  # replaces the retired file at the name
    sender.reap_consumed()
    assert sender.health()["deferred_pending"] == 0
    assert os.path.exists(path) and receiver.get("0", "1", "again")[0] == "new"


def test_a_claim_whose_commit_fails_answers_none_and_loses_nothing(
    scope: str, sender: SharedMemoryConnector
) -> None:
    """test_consumer_returns_payload_when_lock_removal_fails.

    Superseded: upstream hands the payload back even when removing its lock
    file fails. A claim here commits by taking the segment's name away; one
    that cannot do that is not a claim (another reader could deliver the
    same payload: exactly once is the seed's rule). The facade answers None,
    logged, and the payload is delivered once the fault is gone.
    """
    faults = UnlinkFaults()
    path = _put(sender, "commit")
    with facade(scope, 1, host_ring_bytes=0, os_facade=faults) as receiver:
        faults.fail(segment_name("commit"), times=1, error=OSError(errno.EIO, "injected"))
        assert receiver.get("0", "1", "commit") is None
        assert os.path.exists(path) and receiver.health()["failed_gets"] == 1
        assert receiver.get("0", "1", "commit")[0] == "payload"
        assert not os.path.exists(path)
