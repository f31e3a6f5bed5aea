"""Example tests of the connector, one per claim of the issue's property list.

Each test names the claim it checks. Processes (producers killed with
SIGKILL, another process holding a lock) are real; every test that starts
one guards itself with a watchdog and leaves /dev/shm as it found it.
"""

from __future__ import annotations

import errno
import os
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest

from shmring.fault_injection.kit.payloads import payload_tag, tagged_payload
from shmring.fault_injection.kit.processes import lock_holder, watchdog
from shmring.fault_injection.kit.seams import CountingOs, FaultyOs
from shmring.impl import codec
from shmring.impl.connector import (
    Connector,
    FallbackDescriptor,
    GetStatus,
    RingDescriptor,
    Route,
)
from shmring.impl.discovery import collect_orphans
from shmring.impl.errors import (
    BackPressureError,
    ClosedError,
    ConfigurationError,
    InvalidKeyError,
    NoSpaceError,
)
from shmring.impl.liveness import is_liveness_file_name
from shmring.impl.names import (
    STAMP_FILE_NAME,
    fallback_segment_path,
    parse_marker_file_name,
    parse_ring_file_name,
    ring_path,
)
from shmring.impl.os_seam import DEFAULT_OS, SITE_FLOCK, SITE_SCANDIR, OsFacade
from shmring.model_tests.connector_support import Worker, stop_worker
from shmring.spec.connector import compute_fallback_charge

EDGE = ("enc", "dec")
CAPACITY = 4096


def _files(connector: Connector) -> list[str]:
    path = connector.directory
    return sorted(os.listdir(path)) if os.path.isdir(path) else []


@pytest.fixture
def pair(scope: str) -> Iterator[tuple[Connector, Connector]]:
    """A producer and a receiver connector (one process, separate connectors)."""
    with (
        Connector(scope, ring_capacity=CAPACITY, pool_budget_bytes=0) as producer,
        Connector(scope) as receiver,
    ):
        yield producer, receiver
    assert not os.path.exists(producer.directory)


# -- routing ---------------------------------------------------------------------


def test_full_ring_and_oversize_frames_go_to_the_fallback_and_stay_readable(
    pair: tuple[Connector, Connector],
) -> None:
    producer, receiver = pair
    sent: dict[str, bytes] = {}
    routes: dict[str, Route] = {}
    for index in range(8):  # 800-byte frames: the ring holds five, then it is full
        key = f"k{index}"
        sent[key] = tagged_payload(index, 760)
        routes[key] = producer.put(EDGE, key, sent[key]).route
    sent["big"] = tagged_payload(99, 5000)  # larger than capacity / 4: never admitted
    routes["big"] = producer.put(EDGE, "big", sent["big"]).route
    assert [routes[f"k{i}"] for i in range(8)] == [Route.RING] * 5 + [Route.FALLBACK] * 3
    assert routes["big"] is Route.FALLBACK
    for key, payload in sent.items():
        got = receiver.get(EDGE, key)
        assert got.status is GetStatus.DELIVERED and got.value == payload, key
        assert got.route is routes[key]
    health = producer.health()
    assert (health.ring_puts, health.fallbacks) == (5, 4)


def test_ring_recovers_after_the_fallback_drains(pair: tuple[Connector, Connector]) -> None:
    producer, receiver = pair
    keys = [f"k{index}" for index in range(5)]
    for index, key in enumerate(keys):
        assert producer.put(EDGE, key, tagged_payload(index, 760)).route is Route.RING
    assert producer.put(EDGE, "spill", tagged_payload(10, 760)).route is Route.FALLBACK
    assert producer.fallback_bytes() > 0
    for key in [*keys, "spill"]:
        assert receiver.get(EDGE, key).delivered
    assert producer.fallback_bytes() == 0
    # Everything drained: the next frames take the ring again (wrapping past its end).
    for index in range(6):
        descriptor = producer.put(EDGE, "again", tagged_payload(20 + index, 760))
        assert isinstance(descriptor, RingDescriptor)
        assert payload_tag(receiver.get(EDGE, "again").value) == 20 + index
    assert producer.health().fallbacks == 1


def test_re_put_moves_a_key_between_routes_and_keeps_one_version(
    pair: tuple[Connector, Connector],
) -> None:
    producer, receiver = pair
    assert producer.put(EDGE, "k", tagged_payload(1, 100)).route is Route.RING
    assert producer.put(EDGE, "k", tagged_payload(2, 5000)).route is Route.FALLBACK
    assert producer.put(EDGE, "k", tagged_payload(3, 100)).route is Route.RING
    got = receiver.get(EDGE, "k")
    assert payload_tag(got.value) == 3 and got.route is Route.RING
    assert receiver.get(EDGE, "k").status is GetStatus.NOT_FOUND
    assert not [name for name in _files(producer) if name.startswith("fb.")]


# -- descriptors -------------------------------------------------------------------


def test_stale_descriptors_return_nothing(pair: tuple[Connector, Connector]) -> None:
    producer, receiver = pair
    old_ring = producer.put(EDGE, "k", tagged_payload(1, 100))
    new_ring = producer.put(EDGE, "k", tagged_payload(2, 100))  # re-put retires the old frame
    assert receiver.get(EDGE, "k", descriptor=old_ring).status is GetStatus.STALE
    old_segment = producer.put(EDGE, "s", tagged_payload(3, 5000))
    new_segment = producer.put(EDGE, "s", tagged_payload(4, 5000))
    assert isinstance(old_segment, FallbackDescriptor)
    assert receiver.get(EDGE, "s", descriptor=old_segment).status is GetStatus.STALE
    # The stale look left the newer versions in place, for their own descriptors.
    assert payload_tag(receiver.get(EDGE, "k", descriptor=new_ring).value) == 2
    assert payload_tag(receiver.get(EDGE, "s", descriptor=new_segment).value) == 4
    # A claimed version's descriptor is stale too: it is delivered exactly once.
    assert receiver.get(EDGE, "k", descriptor=new_ring).status is GetStatus.STALE
    assert receiver.get(EDGE, "s", descriptor=new_segment).status is GetStatus.STALE


def test_stale_descriptor_after_wraparound_never_reads_the_newer_frame(
    pair: tuple[Connector, Connector],
) -> None:
    producer, receiver = pair
    first = producer.put(EDGE, "k", tagged_payload(1, 760))
    assert producer.cleanup("k") == 1
    for index in range(12):  # laps the ring; frames land where `first` was
        producer.put(EDGE, "k", tagged_payload(100 + index, 760))
        assert receiver.get(EDGE, "k").delivered
    producer.put(EDGE, "k", tagged_payload(7, 760))
    assert isinstance(first, RingDescriptor)
    assert receiver.get(EDGE, "k", descriptor=first).status is GetStatus.STALE
    assert payload_tag(receiver.get(EDGE, "k").value) == 7


def test_descriptors_survive_a_round_trip_through_plain_dicts(
    pair: tuple[Connector, Connector],
) -> None:
    from shmring.impl.connector import descriptor_from_dict

    producer, receiver = pair
    for size in (100, 5000):
        descriptor = producer.put(EDGE, f"k{size}", tagged_payload(size, size))
        again = descriptor_from_dict(
            descriptor.route, codec.decode(codec.encode(descriptor.to_dict()))
        )
        assert again == descriptor
        assert payload_tag(receiver.get(EDGE, f"k{size}", descriptor=again).value) == size


# -- cancellation --------------------------------------------------------------------


def test_prefix_cancel_is_exact(pair: tuple[Connector, Connector]) -> None:
    producer, receiver = pair
    keys = ["req_0_7", "req_0_12", "req_0_10x", "request_0_0", "req_0_", "req_01", "xreq_0_1"]
    for index, key in enumerate(keys):
        producer.put(EDGE, key, tagged_payload(index, 100))
    producer.put(EDGE, "req_0_3", tagged_payload(50, 5000))  # a fallback segment matches too
    producer.put(("enc", "other"), "req_0_4", tagged_payload(51, 100))  # and another edge
    assert producer.cleanup_prefix("req_0_") == 4
    for key in ("req_0_7", "req_0_12", "req_0_3"):
        assert receiver.get(EDGE, key).status is GetStatus.NOT_FOUND
    assert receiver.get(("enc", "other"), "req_0_4").status is GetStatus.NOT_FOUND
    for key in ("req_0_10x", "request_0_0", "req_0_", "req_01", "xreq_0_1"):
        assert receiver.get(EDGE, key).delivered, key
    assert producer.cleanup_prefix("req_0_") == 0


def test_cleanup_retires_the_exact_key_on_every_edge_and_route(
    pair: tuple[Connector, Connector],
) -> None:
    producer, receiver = pair
    producer.put(EDGE, "r1", tagged_payload(1, 100))
    producer.put(("enc", "b2"), "r1", tagged_payload(2, 5000))
    producer.put(EDGE, "r10", tagged_payload(3, 100))
    assert producer.cleanup("r1") == 2
    assert receiver.get(EDGE, "r1").status is GetStatus.NOT_FOUND
    assert receiver.get(("enc", "b2"), "r1").status is GetStatus.NOT_FOUND
    assert receiver.get(EDGE, "r10").delivered


# -- budget and space ------------------------------------------------------------------


def test_back_pressure_past_the_budget_is_typed_and_changes_nothing(scope: str) -> None:
    budget = compute_fallback_charge("a", codec.prepare(tagged_payload(0, 5000)).nbytes) + 100
    with (
        Connector(
            scope, ring_capacity=CAPACITY, pool_budget_bytes=0, fallback_budget=budget
        ) as producer,
        Connector(scope) as receiver,
    ):
        producer.put(EDGE, "a", tagged_payload(1, 5000))
        before = _files(producer)
        with pytest.raises(BackPressureError, match="budget="):
            producer.put(EDGE, "b", tagged_payload(2, 5000))
        assert _files(producer) == before
        assert producer.health().refusals == 1
        # Replacing the key's own segment is charged net of the old one.
        producer.put(EDGE, "a", tagged_payload(3, 5000))
        assert payload_tag(receiver.get(EDGE, "a").value) == 3
        # Drained by a reader in another connector: room again.
        producer.put(EDGE, "b", tagged_payload(4, 5000))
        assert payload_tag(receiver.get(EDGE, "b").value) == 4


def test_no_space_for_a_segment_leaves_nothing_half_written(scope: str) -> None:
    seam = FaultyOs()
    with Connector(scope, ring_capacity=CAPACITY, pool_budget_bytes=0, os_facade=seam) as producer:
        producer.put(EDGE, "warm", tagged_payload(0, 100))  # ring and marker made
        before = _files(producer)
        seam.fail_next("fallocate", errno.ENOSPC)
        with pytest.raises(NoSpaceError) as raised:
            producer.put(EDGE, "big", tagged_payload(1, 5000))
        assert raised.value.errno == errno.ENOSPC and isinstance(raised.value, OSError)
        assert _files(producer) == before
        assert producer.health().puts == 1


@pytest.mark.root
def test_real_enospc_on_a_tiny_tmpfs_disables_the_ring_and_the_fallback_carries(
    scope: str, tmp_path: Any
) -> None:
    root = tmp_path / "tiny"
    root.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=256k,mode=0700", "tmpfs", str(root)],
        capture_output=True,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {mounted.stderr.decode().strip()}")
    try:
        with (
            Connector(scope, shm_root=str(root)) as producer,
            Connector(scope, shm_root=str(root)) as receiver,
        ):
            descriptor = producer.put(EDGE, "k", tagged_payload(1, 100))  # a 4 MiB ring cannot fit
            assert descriptor.route is Route.FALLBACK
            assert isinstance(producer.failed_edges()[EDGE], NoSpaceError)
            with pytest.raises(NoSpaceError):
                producer.put(EDGE, "huge", tagged_payload(2, 400_000))
            names = _files(producer)
            assert not [n for n in names if n.startswith(("ring.", "marker.", "fbtmp."))], names
            assert payload_tag(receiver.get(EDGE, "k").value) == 1
        assert not os.listdir(root)
    finally:
        subprocess.run(["umount", str(root)], check=True)


# -- setup failures ---------------------------------------------------------------------


def test_ring_setup_enospc_is_retried_after_its_back_off_and_health_says_so(scope: str) -> None:
    """Issue 12: ENOSPC at ring setup disabled the edge's ring for the connector's lifetime."""
    seam = FaultyOs()
    with (
        Connector(
            scope,
            ring_capacity=CAPACITY,
            pool_budget_bytes=0,
            os_facade=seam,
            ring_retry_seconds=0.05,
        ) as producer,
        Connector(scope) as receiver,
    ):
        seam.fail_open("ring.", errno.ENOSPC)
        assert producer.put(EDGE, "k0", tagged_payload(0, 100)).route is Route.FALLBACK
        assert EDGE in producer.failed_edges() and producer.health().ring_setup_retries == 0
        time.sleep(0.1)  # past the back-off: space is back, the next put sets the ring up
        assert producer.put(EDGE, "k1", tagged_payload(1, 100)).route is Route.RING
        health = producer.health()
        assert health.ring_setup_retries == 1 and health.failed_edges == 0 and health.rings == 1
        assert payload_tag(receiver.get(EDGE, "k0").value) == 0
        assert payload_tag(receiver.get(EDGE, "k1").value) == 1


def test_ring_setup_failing_again_doubles_the_back_off(scope: str) -> None:
    seam = FaultyOs()
    with Connector(
        scope, ring_capacity=CAPACITY, pool_budget_bytes=0, os_facade=seam, ring_retry_seconds=0.05
    ) as producer:
        seam.fail_open("ring.", errno.ENOSPC)
        producer.put(EDGE, "k0", tagged_payload(0, 100))
        first_at = producer._ring_route.retry_at[EDGE]
        time.sleep(0.1)
        seam.fail_open("ring.", errno.ENOSPC)
        assert producer.put(EDGE, "k1", tagged_payload(1, 100)).route is Route.FALLBACK
        again_at = producer._ring_route.retry_at[EDGE]
        assert again_at[1] == 2 and first_at[1] == 1
        assert producer.health().ring_setup_retries == 1
    with pytest.raises(ConfigurationError, match="ring_retry_seconds"):
        Connector(scope, ring_retry_seconds=-1.0)


@pytest.mark.parametrize(
    "fault",
    [("ring.", errno.ENOSPC), ("ring.", errno.EPERM), ("marker.", errno.ENOSPC)],
    ids=["ring-enospc", "ring-eperm", "marker-enospc"],
)
def test_ring_setup_failure_leaves_the_connector_working_on_the_fallback_with_nothing_behind(
    scope: str, fault: tuple[str, int]
) -> None:
    seam = FaultyOs()
    with (
        Connector(
            scope,
            ring_capacity=CAPACITY,
            pool_budget_bytes=0,
            os_facade=seam,
            ring_retry_seconds=3600.0,
        ) as producer,
        Connector(scope) as receiver,
    ):
        seam.fail_open(*fault)
        first = producer.put(EDGE, "k0", tagged_payload(0, 100))
        assert seam.fired[f"open {fault[0]}"] == 1
        assert first.route is Route.FALLBACK
        assert not [
            n for n in _files(producer) if parse_ring_file_name(n) or parse_marker_file_name(n)
        ]
        for index in range(1, 4):  # the edge is not retried within its back-off
            assert (
                producer.put(EDGE, f"k{index}", tagged_payload(index, 100)).route is Route.FALLBACK
            )
        assert [n for n in seam.opened if n.startswith(fault[0])] == []
        for index in range(4):
            assert payload_tag(receiver.get(EDGE, f"k{index}").value) == index
        # Another edge still gets its ring.
        assert producer.put(("enc", "b2"), "x", tagged_payload(9, 100)).route is Route.RING


def test_discovery_stamp_failure_leaves_the_connector_working_on_the_fallback(scope: str) -> None:
    seam = FaultyOs()
    with (
        Connector(scope, ring_capacity=CAPACITY, pool_budget_bytes=0, os_facade=seam) as producer,
        Connector(scope) as receiver,
    ):
        producer.get(EDGE, "join")  # joined: the next lock is the stamp's, at registration
        seam.fail_next(SITE_FLOCK, errno.ENOLCK)
        assert producer.put(EDGE, "k", tagged_payload(1, 100)).route is Route.FALLBACK
        assert seam.fired[SITE_FLOCK] == 1
        assert not [
            n for n in _files(producer) if parse_ring_file_name(n) or parse_marker_file_name(n)
        ]
        assert payload_tag(receiver.get(EDGE, "k").value) == 1


def test_an_unopenable_stamp_leaves_the_connector_working_on_the_fallback(scope: str) -> None:
    seam = FaultyOs()
    seam.fail_open(STAMP_FILE_NAME, errno.ENOSPC)
    with (
        Connector(scope, ring_capacity=CAPACITY, pool_budget_bytes=0, os_facade=seam) as producer,
        Connector(scope) as receiver,
    ):
        assert producer.put(EDGE, "k", tagged_payload(1, 100)).route is Route.FALLBACK
        assert EDGE in producer.failed_edges()
        assert payload_tag(receiver.get(EDGE, "k").value) == 1


# -- discovery ------------------------------------------------------------------------------


def test_empty_polls_take_no_lock_and_scan_nothing(scope: str) -> None:
    seam = CountingOs()
    with (
        Connector(scope, ring_capacity=CAPACITY, pool_budget_bytes=0) as producer,
        Connector(scope, os_facade=seam, rescan_seconds=3600.0) as receiver,
    ):
        producer.put(EDGE, "k", tagged_payload(1, 100))
        assert receiver.get(EDGE, "k").delivered  # first get: one scan, one claim
        scans, locks = seam.calls[SITE_SCANDIR], seam.calls[SITE_FLOCK]
        assert scans == 1
        for _ in range(200):
            assert receiver.get(EDGE, "k").status is GetStatus.NOT_FOUND
            assert receiver.get(EDGE, "other").status is GetStatus.NOT_FOUND
        assert seam.calls[SITE_SCANDIR] == scans
        assert seam.calls[SITE_FLOCK] == locks
        # A producer change moves the stamp: exactly one rescan, then quiet again.
        producer.put(("enc", "b2"), "k", tagged_payload(2, 100))
        receiver.get(EDGE, "k")
        receiver.get(EDGE, "k")
        assert seam.calls[SITE_SCANDIR] == scans + 1


def test_a_new_producer_is_discovered_even_when_the_clock_does_not_advance(scope: str) -> None:
    with Connector(scope) as receiver:
        assert receiver.get(EDGE, "k").status is GetStatus.NOT_FOUND  # scanned: nobody there
        directory = receiver.directory
        frozen = os.stat(directory)
        stamp_path = os.path.join(directory, STAMP_FILE_NAME)
        frozen_stamp = os.stat(stamp_path)
        worker = Worker(receiver.scope, {"ring_capacity": CAPACITY, "pool_budget_bytes": 0})
        try:
            assert worker.call("put", *EDGE, "k", 5, 100)[0] == "ring"
            # Put every timestamp back: a clock that did not move in between.
            os.utime(directory, ns=(frozen.st_atime_ns, frozen.st_mtime_ns))
            os.utime(stamp_path, ns=(frozen_stamp.st_atime_ns, frozen_stamp.st_mtime_ns))
            got = receiver.get(EDGE, "k")
            assert got.delivered and got.route is Route.RING and payload_tag(got.value) == 5
            assert got.producer == worker.identity
        finally:
            stop_worker(worker)


def test_all_producers_of_an_edge_are_found(scope: str) -> None:
    workers: list[Worker] = []
    with watchdog(120), Connector(scope) as receiver:
        try:
            for index in range(3):
                worker = Worker(scope, {"ring_capacity": CAPACITY, "pool_budget_bytes": 0})
                workers.append(worker)
                assert worker.call("put", *EDGE, f"p{index}", index, 100)[0] == "ring"
            identities = {w.identity for w in workers}
            found = {}
            for index in range(3):
                got = receiver.get(EDGE, f"p{index}")
                assert got.delivered and payload_tag(got.value) == index
                found[f"p{index}"] = got.producer
            assert set(found.values()) == identities
        finally:
            for worker in workers:
                stop_worker(worker)


def test_a_reader_whose_lock_is_held_by_another_process_returns_within_its_deadline(
    pair: tuple[Connector, Connector],
) -> None:
    producer, receiver = pair
    producer.put(EDGE, "ring", tagged_payload(1, 100))
    producer.put(EDGE, "segment", tagged_payload(2, 5000))
    assert producer.identity is not None
    ring_file = ring_path(producer.directory, *EDGE, producer.identity)
    segment_file = fallback_segment_path(producer.directory, EDGE, "segment")
    with watchdog(60):
        for path, key in ((ring_file, "ring"), (segment_file, "segment")):
            with lock_holder(path):
                started = time.monotonic()
                got = receiver.get_with_deadline(EDGE, key, timeout=0.2)
                assert got.status is GetStatus.BUSY
                assert time.monotonic() >= started + 0.2  # it kept trying until the deadline
            assert receiver.get(EDGE, key).delivered  # released: claimable again
    assert receiver.health().busy > 0


def test_get_with_deadline_sleeps_until_a_late_put_arrives(scope: str) -> None:
    with watchdog(60), Connector(scope) as receiver:
        receiver.get(EDGE, "late")
        worker = Worker(scope, {"ring_capacity": CAPACITY, "pool_budget_bytes": 0})
        try:
            assert (
                receiver.get_with_deadline(EDGE, "late", timeout=0.05).status is GetStatus.NOT_FOUND
            )
            worker.send(("put", *EDGE, "late", 42, 100))  # runs while we wait
            got = receiver.get_with_deadline(EDGE, "late", timeout=30)
            assert got.delivered and payload_tag(got.value) == 42
            assert worker.answer()[0] == "ring"
        finally:
            stop_worker(worker)


# -- producers going away -----------------------------------------------------------------------


def test_close_is_idempotent_and_removes_the_ring(scope: str) -> None:
    with Connector(scope) as receiver:
        producer = Connector(scope, ring_capacity=CAPACITY, pool_budget_bytes=0)
        ring = producer.put(EDGE, "k", tagged_payload(1, 100))
        segment = producer.put(EDGE, "s", tagged_payload(2, 5000))
        assert receiver.get(EDGE, "z").status is GetStatus.NOT_FOUND  # attaches the ring
        assert any(parse_ring_file_name(n) for n in _files(producer))
        assert producer.close() == 2
        assert producer.close() == 0
        # The receiver (this process) still holds our process's liveness file.
        assert [
            n
            for n in _files(producer)
            if n not in (STAMP_FILE_NAME, "members") and not is_liveness_file_name(n)
        ] == []
        assert receiver.get(EDGE, "k", descriptor=ring).status is GetStatus.PRODUCER_GONE
        assert receiver.get(EDGE, "s", descriptor=segment).status is GetStatus.PRODUCER_GONE
        assert receiver.get(EDGE, "k").status is GetStatus.NOT_FOUND
        with pytest.raises(ClosedError):
            producer.put(EDGE, "k", b"x")
        with pytest.raises(ClosedError):
            producer.get(EDGE, "k")
    assert not os.path.exists(receiver.directory)  # the last one out removes the directory


def test_a_dead_producers_frame_never_reaches_a_reused_key(scope: str) -> None:
    with watchdog(120), Connector(scope) as receiver:
        receiver.get(EDGE, "join")
        old = Worker(scope, {"ring_capacity": CAPACITY, "pool_budget_bytes": 0})
        new: Worker | None = None
        try:
            route, ring_data = old.call("put", *EDGE, "k", 1, 100)
            assert route == "ring"
            assert old.call("put", *EDGE, "s", 2, 5000)[0] == "fallback"
            old.kill()
            new = Worker(scope, {"ring_capacity": CAPACITY, "pool_budget_bytes": 0})
            # Nothing of the dead producer is delivered, by key or by descriptor.
            assert receiver.get(EDGE, "k").status is GetStatus.NOT_FOUND
            assert receiver.get(EDGE, "s").status is GetStatus.NOT_FOUND
            from shmring.impl.connector import descriptor_from_dict

            stale = descriptor_from_dict(Route.RING, ring_data)
            assert receiver.get(EDGE, "k", descriptor=stale).status is GetStatus.PRODUCER_GONE
            # The new producer reuses both keys: only its frames arrive.
            assert new.call("put", *EDGE, "k", 3, 100)[0] == "ring"
            assert new.call("put", *EDGE, "s", 4, 5000)[0] == "fallback"
            got = receiver.get(EDGE, "k")
            assert payload_tag(got.value) == 3 and got.producer == new.identity
            got = receiver.get(EDGE, "s")
            assert payload_tag(got.value) == 4 and got.producer == new.identity
        finally:
            stop_worker(new)
            old.kill()
    # The last survivor's close removed what the dead producer left (issue 5).
    assert collect_orphans(receiver.directory, DEFAULT_OS) == 0
    assert not os.path.exists(receiver.directory)


# -- configuration -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"ring_capacity": 1000}, "capacity=1000"),
        ({"ring_capacity": 4097}, "capacity=4097"),
        ({"ring_capacity": 128 * 1024 * 1024}, "capacity=134217728"),
        ({"ring_capacity": "4096"}, "capacity='4096'"),
        ({"fallback_budget": -1}, "fallback_budget=-1"),
        ({"fallback_budget": 1.5}, "fallback_budget=1.5"),
        ({"spin_seconds": -1}, "spin_seconds=-1"),
    ],
)
def test_configuration_errors_name_the_bad_value(
    scope: str, options: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigurationError, match=message.replace("(", r"\(")):
        Connector(scope, **options)


@pytest.mark.parametrize("scope_value", ["", "../x", "a/b", ".hidden", "x" * 65, 7])
def test_a_bad_scope_is_a_configuration_error(scope_value: Any) -> None:
    with pytest.raises(ConfigurationError, match="scope"):
        Connector(scope_value)


def test_bad_stage_names_and_keys_are_refused(pair: tuple[Connector, Connector]) -> None:
    producer, _ = pair
    with pytest.raises(InvalidKeyError, match="stage name"):
        producer.put("a.b", "c", "k", b"x")
    with pytest.raises(InvalidKeyError, match="key must be a str"):
        producer.put(EDGE, 7, b"x")
    with pytest.raises(TypeError):
        producer.put("a", "b", "k")
    assert producer.put(0, 1, "k", b"x").edge == ("0", "1")  # integer stage ids, as vllm-omni's


_RECEIVER_SCRIPT = """
import sys
from multiprocessing import resource_tracker
from shmring import Connector
with Connector(sys.argv[1]) as receiver:
    ring = receiver.get(("enc", "dec"), "k")
    segment = receiver.get(("enc", "dec"), "s")
print(ring.delivered, segment.delivered, resource_tracker._resource_tracker._pid,
      "multiprocessing.shared_memory" in sys.modules, "torch" in sys.modules)
"""


def test_a_receiver_never_registers_with_the_resource_tracker(
    pair: tuple[Connector, Connector],
) -> None:
    """Receiving a ring frame and a segment starts no resource tracker (and imports no torch)."""
    import sys

    producer, _ = pair
    producer.put(EDGE, "k", tagged_payload(1, 100))
    producer.put(EDGE, "s", tagged_payload(2, 5000))
    result = subprocess.run(
        [sys.executable, "-c", _RECEIVER_SCRIPT, producer.scope],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["True", "True", "None", "False", "False"]


# -- corruption -------------------------------------------------------------------------------


def test_a_corrupted_segment_gives_a_typed_error_and_the_reader_keeps_working(
    pair: tuple[Connector, Connector],
) -> None:
    from shmring.impl.errors import CorruptFrameError

    producer, receiver = pair
    producer.put(EDGE, "bad", tagged_payload(1, 5000))
    producer.put(EDGE, "good", tagged_payload(2, 5000))
    path = fallback_segment_path(producer.directory, EDGE, "bad")
    with open(path, "r+b") as handle:  # flip a payload byte behind the checksum's back
        handle.seek(os.path.getsize(path) - 100)
        byte = handle.read(1)
        handle.seek(-1, os.SEEK_CUR)
        handle.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(CorruptFrameError, match="checksum"):
        receiver.get(EDGE, "bad")
    assert not os.path.exists(path)  # removed, so it cannot block the key
    assert receiver.get(EDGE, "bad").status is GetStatus.NOT_FOUND
    assert payload_tag(receiver.get(EDGE, "good").value) == 2


@pytest.mark.parametrize(
    "data",
    [
        {},
        {"producer": [1], "source": "a", "destination": "b", "key": "k", "position": 0, "size": 1},
        {"producer": [1, 2], "source": "a", "destination": "b", "key": 7, "position": 0, "size": 1},
        {
            "producer": [1, 2],
            "source": "a",
            "destination": "b",
            "key": "k",
            "position": -1,
            "size": 1,
        },
        {
            "producer": [True, 2],
            "source": "a",
            "destination": "b",
            "key": "k",
            "position": 0,
            "size": 1,
        },
    ],
)
def test_a_malformed_descriptor_is_a_typed_error(data: dict[str, Any]) -> None:
    from shmring.impl.connector import descriptor_from_dict
    from shmring.impl.errors import CorruptFrameError

    with pytest.raises(CorruptFrameError, match="malformed ring descriptor"):
        descriptor_from_dict(Route.RING, data)


def test_bool_stage_ids_are_refused_even_after_an_int_one(
    pair: tuple[Connector, Connector],
) -> None:
    producer, _ = pair
    producer.put(1, 2, "k", b"x")
    with pytest.raises(InvalidKeyError):
        producer.put(True, 2, "k", b"x")


def test_large_fallback_files_are_handed_back_and_reused_and_nothing_is_left(scope: str) -> None:
    """Files of 1 MiB and more are kept by default: the next put of that size reuses one."""
    big = tagged_payload(1, 3 * 1024 * 1024)
    other = tagged_payload(2, 2 * 1024 * 1024)
    with (
        Connector(scope, ring_capacity=CAPACITY, pool_budget_bytes=0) as producer,
        Connector(scope) as receiver,
    ):
        producer.put(EDGE, "a", big)
        assert producer.health().fallback_spares == 1
        assert receiver.get(EDGE, "a").value == big  # claimed: handed back, not unlinked
        assert any(name.startswith("fbspare.") for name in _files(producer))
        again = tagged_payload(3, 3 * 1024 * 1024)
        producer.put(EDGE, "b", again)  # same file size: written into the handed-back file
        assert producer.health().fallback_reused == 1
        assert not any(name.startswith("fbspare.") for name in _files(producer))
        assert receiver.get(EDGE, "b").value == again
        assert receiver.health().fallback_mapping_hits == 1  # the same file, still mapped
        producer.put(EDGE, "c", other)  # another size: a file of its own
        assert producer.health().fallback_reused == 1
        assert receiver.get(EDGE, "c").value == other
        health = producer.health()
        assert health.fallback_spares == 2
        assert health.fallback_spare_bytes >= 5 * 1024 * 1024
        directory = producer.directory
    assert not os.path.exists(directory), "close left handed-back files behind"


def test_keeping_no_fallback_files_unlinks_every_claimed_segment(scope: str) -> None:
    big = tagged_payload(1, 2 * 1024 * 1024)
    with (
        Connector(
            scope, ring_capacity=CAPACITY, pool_budget_bytes=0, fallback_spare_bytes=0
        ) as producer,
        Connector(scope) as receiver,
    ):
        producer.put(EDGE, "a", big)
        assert receiver.get(EDGE, "a").value == big
        assert not [n for n in _files(producer) if n.startswith(("fb.", "fbspare."))]
        assert producer.health().fallback_spares == 0


@pytest.mark.parametrize("name", ["fallback_spare_bytes", "fallback_spare_min_bytes"])
@pytest.mark.parametrize("value", [-1, 1.5, True, "1"])
def test_spare_settings_are_validated(scope: str, name: str, value: Any) -> None:
    with pytest.raises(ConfigurationError, match=name):
        Connector(scope, **{name: value})


def test_stopped_and_killed_workers_hold_no_descriptors(scope: str) -> None:
    """The harness itself must not leak: long restart campaigns reached descriptor 1024 once."""
    import gc

    def open_descriptors() -> int:
        return len(os.listdir("/proc/self/fd"))

    Worker(
        scope, {"ring_capacity": CAPACITY, "pool_budget_bytes": 0}
    ).stop()  # starts the forkserver (kept for good)
    gc.collect()
    gc.disable()  # a Process that is merely unreachable would hide the leak until collected
    try:
        before = open_descriptors()
        workers = [
            Worker(scope, {"ring_capacity": CAPACITY, "pool_budget_bytes": 0}) for _ in range(4)
        ]
        workers[0].kill()
        workers[1].kill()
        for worker in workers:
            worker.stop()
            worker.stop()  # idempotent
        after = open_descriptors()
    finally:
        gc.enable()
    assert after <= before, f"{after - before} descriptors left by 4 workers"
    assert [w.exitcode for w in workers[:2]] == [-9, -9]
    assert [w.exitcode for w in workers[2:]] == [0, 0]


class _OpenAttempts(OsFacade):
    """Records every look for a file by name: open attempts (failed ones included) and existence checks."""

    def __init__(self) -> None:
        self.names: list[str] = []

    def open(self, path: str, flags: int, mode: int = 0o600) -> int:
        self.names.append(os.path.basename(path))
        return super().open(path, flags, mode)

    def open_at(self, dir_fd: int, name: str, flags: int, mode: int = 0o600) -> int:
        self.names.append(name)
        return super().open_at(dir_fd, name, flags, mode)

    def exists_at(self, dir_fd: int, name: str) -> bool:
        self.names.append(name)
        return super().exists_at(dir_fd, name)


def test_a_polling_get_looks_for_the_segment_only_when_the_doorbell_moved(scope: str) -> None:
    """Spinning on a key with nothing published costs no failing openat per poll."""
    from shmring.impl.names import fallback_segment_file_name

    seam = _OpenAttempts()
    with (
        Connector(scope, ring_capacity=CAPACITY, pool_budget_bytes=0) as producer,
        Connector(scope, os_facade=seam, spin_seconds=0.05) as receiver,
    ):
        producer.put(EDGE, "other", tagged_payload(1, 100))  # the deployment has a doorbell
        name = fallback_segment_file_name(EDGE, "waited")
        started = time.monotonic()
        got = receiver.get_with_deadline(EDGE, "waited", timeout=0.05)
        spun = time.monotonic() - started
        assert got.status is GetStatus.NOT_FOUND
        looks = seam.names.count(name)
        # At most one look per recheck interval (1 ms), plus the first.
        assert 1 <= looks <= spun / 0.001 + 2, f"{looks} looks in {spun:.3f} s"
        # A put rings the doorbell: the next poll looks and finds it.
        producer.put(EDGE, "waited", tagged_payload(2, 2000))  # over a quarter: fallback
        assert payload_tag(receiver.get_with_deadline(EDGE, "waited", timeout=5).value) == 2


class _Looks(OsFacade):
    """Records segment opens and existence checks apart; `failing_look` makes every check fail."""

    def __init__(self, failing_look: bool = False) -> None:
        self.opened: list[str] = []
        self.checked: list[str] = []
        self.failing_look = failing_look

    def open_at(self, dir_fd: int, name: str, flags: int, mode: int = 0o600) -> int:
        self.opened.append(name)
        return super().open_at(dir_fd, name, flags, mode)

    def exists_at(self, dir_fd: int, name: str) -> bool:
        self.checked.append(name)
        if self.failing_look:
            raise OSError(errno.EIO, "injected: the look fails")
        return super().exists_at(dir_fd, name)


def test_a_get_of_a_key_without_a_segment_opens_nothing_and_one_with_one_claims_it(
    scope: str,
) -> None:
    """Issue 23: the common miss is one faccessat, not a failed open in a signal-deferred section."""
    from shmring.impl.names import fallback_segment_file_name

    seam = _Looks()
    with (
        Connector(scope, ring_capacity=CAPACITY, pool_budget_bytes=0) as producer,
        Connector(scope, ring_capacity=CAPACITY, os_facade=seam) as receiver,
    ):
        producer.put(EDGE, "other", tagged_payload(1, 100))
        absent = fallback_segment_file_name(EDGE, "absent")
        assert receiver.get(EDGE, "absent").status is GetStatus.NOT_FOUND
        assert seam.checked.count(absent) == 1 and absent not in seam.opened
        # A segment that is there is looked at, opened and claimed, exactly once.
        assert producer.put(EDGE, "big", tagged_payload(2, 2000)).route is Route.FALLBACK
        present = fallback_segment_file_name(EDGE, "big")
        got = receiver.get(EDGE, "big")
        assert got.delivered and payload_tag(got.value) == 2 and got.route is Route.FALLBACK
        assert seam.checked.count(present) == 1 and seam.opened.count(present) == 1
        assert receiver.get(EDGE, "big").status is GetStatus.NOT_FOUND  # claimed once


def test_a_segment_look_that_fails_opens_as_before(scope: str) -> None:
    """A failing faccessat cannot tell: the get opens the segment and delivers it."""
    from shmring.impl.names import fallback_segment_file_name

    seam = _Looks(failing_look=True)
    with (
        Connector(scope, ring_capacity=CAPACITY, pool_budget_bytes=0) as producer,
        Connector(scope, ring_capacity=CAPACITY, os_facade=seam) as receiver,
    ):
        assert producer.put(EDGE, "big", tagged_payload(3, 2000)).route is Route.FALLBACK
        got = receiver.get(EDGE, "big")
        assert got.delivered and payload_tag(got.value) == 3
        name = fallback_segment_file_name(EDGE, "big")
        assert seam.checked.count(name) == 1 and seam.opened.count(name) == 1
        assert receiver.get(EDGE, "absent").status is GetStatus.NOT_FOUND


def test_a_producer_that_cannot_ring_the_doorbell_is_still_found_by_a_polling_get(
    scope: str,
) -> None:
    seam = FaultyOs()
    seam.fail_open(STAMP_FILE_NAME, errno.ENOSPC)  # no stamp: its puts ring nothing
    with (
        Connector(scope, ring_capacity=CAPACITY, pool_budget_bytes=0, os_facade=seam) as producer,
        Connector(scope, ring_capacity=CAPACITY, pool_budget_bytes=0) as receiver,
    ):
        receiver.put(EDGE, "ring it", tagged_payload(0, 100))  # the receiver has a doorbell
        assert receiver.get_with_deadline(EDGE, "k", timeout=0.01).status is GetStatus.NOT_FOUND
        assert producer.put(EDGE, "k", tagged_payload(1, 100)).route is Route.FALLBACK
        got = receiver.get_with_deadline(EDGE, "k", timeout=5)
        assert got.delivered and payload_tag(got.value) == 1


def test_a_plain_get_finds_a_segment_of_a_producer_that_cannot_ring_at_once(scope: str) -> None:
    """Issue 13 regression: only `get_with_deadline` skips the segment look, a plain get never.

    A skip while the doorbell has not moved would answer NOT_FOUND for up
    to the recheck interval for a producer whose stamp failed, where the
    model's get delivers (fault cell `restart`, EMFILE at open #18).
    """
    seam = FaultyOs()
    seam.fail_open(STAMP_FILE_NAME, errno.ENOSPC)  # no stamp: its puts ring nothing
    with (
        Connector(scope, ring_capacity=CAPACITY, os_facade=seam) as producer,
        Connector(scope, ring_capacity=CAPACITY) as receiver,
    ):
        receiver.put(EDGE, "ring it", tagged_payload(0, 100))  # the receiver has a doorbell
        for index in range(30):  # a skip would show as soon as one put takes under 1 ms
            key = f"k{index}"
            assert receiver.get(EDGE, key).status is GetStatus.NOT_FOUND  # the doorbell unmoved
            assert producer.put(EDGE, key, tagged_payload(index, 100)).route is Route.FALLBACK
            got = receiver.get(EDGE, key)
            assert got.delivered and payload_tag(got.value) == index, (index, got.status)


def test_get_with_deadline_watches_the_doorbell_between_polls(scope: str) -> None:
    """Issue 13: while it spins, a waiting get polls again only when the doorbell moved."""
    import threading

    with (
        watchdog(60),
        Connector(scope, ring_capacity=CAPACITY) as producer,
        Connector(scope, spin_seconds=0.5) as receiver,
    ):
        producer.put(EDGE, "warm", tagged_payload(0, 100))
        assert receiver.get(EDGE, "warm").delivered
        polls = 0
        real_get = receiver._get

        def counted(*args: Any) -> Any:
            nonlocal polls
            polls += 1
            return real_get(*args)

        receiver._get = counted  # type: ignore[method-assign]
        late = threading.Timer(0.1, producer.put, (EDGE, "late", tagged_payload(3, 100)))
        late.start()
        try:
            got = receiver.get_with_deadline(EDGE, "late", timeout=30)
        finally:
            late.join()
        assert got.delivered and payload_tag(got.value) == 3
        # One poll before the put, one after its ring (and none in the 0.1 s between,
        # where a spin of full polls made thousands).
        assert polls <= 4, f"{polls} polls"


def test_an_idle_get_with_deadline_sleeps_after_its_bounded_spin(scope: str) -> None:
    """Issue 13: no unbounded busy loop while idle; the spin ends, the doorbell wait sleeps."""
    with Connector(scope, ring_capacity=CAPACITY) as producer, Connector(scope) as receiver:
        producer.put(EDGE, "warm", tagged_payload(0, 100))  # the deployment has a doorbell
        assert receiver.get(EDGE, "warm").delivered
        wall = time.monotonic()
        cpu = time.thread_time()
        got = receiver.get_with_deadline(EDGE, "idle", timeout=0.3)
        cpu = time.thread_time() - cpu
        wall = time.monotonic() - wall
        assert got.status is GetStatus.NOT_FOUND and wall >= 0.3
        # Spinning for the whole wait would use about all of it.
        assert cpu < 0.5 * wall, f"{cpu:.3f} s of CPU in {wall:.3f} s idle"


@pytest.mark.parametrize("kind", [bytes, bytearray, memoryview])
def test_a_large_bytes_payload_goes_by_the_ring_as_header_and_body(scope: str, kind: Any) -> None:
    """Issue 13: a >= 64 KiB bytes-like payload is put as its bin header + body, and round-trips.

    Also with a fallback segment of the key to retire (the writer path keeps it).
    """
    body = tagged_payload(7, codec.DIRECT_BYTES_MIN + 5)
    with (
        Connector(scope, ring_capacity=1 << 20, pool_budget_bytes=0) as producer,
        Connector(scope) as receiver,
    ):
        producer.put(EDGE, "big", kind(body))
        got = receiver.get(EDGE, "big")
        assert got.delivered and got.route is Route.RING
        assert type(got.value) is bytes and got.value == body
        # A version carried by a segment first (not admitted, no pool), then one by the ring.
        assert isinstance(producer.put(EDGE, "again", b"z" * (300 << 10)), FallbackDescriptor)
        assert isinstance(producer.put(EDGE, "again", kind(body)), RingDescriptor)
        got = receiver.get(EDGE, "again")
        assert got.delivered and got.route is Route.RING and got.value == body


def test_the_hot_path_s_constructors_make_what_the_dataclasses_make() -> None:
    """`new_descriptor` / `new_delivery` (issue 23's lean path) are the dataclasses' own instances."""
    from shmring.impl.connector.descriptors import (
        FallbackDescriptor,
        PoolDescriptor,
        RingDescriptor,
        new_descriptor,
    )
    from shmring.impl.connector.results import Delivery, GetStatus, new_delivery
    from shmring.spec.connector import Route

    for kind in (RingDescriptor, PoolDescriptor, FallbackDescriptor):
        made = kind((1, 2, 3), ("a", "b"), "k", 5, 64)
        fast = new_descriptor(kind, (1, 2, 3), ("a", "b"), "k", 5, 64)
        assert type(fast) is kind and fast == made and hash(fast) == hash(made)
        assert repr(fast) == repr(made) and fast.to_dict() == made.to_dict()
        assert fast != new_descriptor(kind, (1, 2, 3), ("a", "b"), "k", 6, 64)
    made = Delivery(GetStatus.DELIVERED, b"x", 64, Route.POOL, (1, 2, 3))
    fast = new_delivery(b"x", 64, Route.POOL, (1, 2, 3))
    assert fast == made and repr(fast) == repr(made) and fast.delivered and fast.lease is None
    assert fast.release() and fast.value is None
