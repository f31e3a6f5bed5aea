"""vllm-omni's ``test_shm_connector.py`` against `shmring.SharedMemoryConnector` (issue 27).

Upstream (every stored version of the file): key-addressed put and get,
metadata fallback (foreign, non-dict and empty metadata read by key, its
own handle, metadata keyed by the request id), tensor-parallel rank keys,
cleanup and close, no file left behind after a get (falsy payloads too),
raw tensor payloads, event notifications, an empty segment seen mid-write.
Its private ``_pending_keys`` is the producer's record of what it still
owns; here that is what `health()` and the files under /dev/shm show.
Where the seed's ring design differs (small payloads ride the ring:
``host_ring`` metadata, not ``shm``) the table in docs/conformance.md says
so; each test names the upstream test it mirrors.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import msgspec
import pytest
import torch

from shmring import SharedMemoryConnector
from shmring.fault_injection.kit.processes import watchdog
from shmring.model_tests.conformance_kit import SHM_ROOT, facade, file_of, segment_name


@pytest.fixture
def connector(scope: str) -> Iterator[SharedMemoryConnector]:
    """Upstream's ``SharedMemoryConnector({"shm_threshold_bytes": 0})``: one facade puts and gets."""
    c = facade(scope, 0, shm_threshold_bytes=0)
    yield c
    c.close()


def _own_files(connector: SharedMemoryConnector) -> list[str]:
    """The payload files of the deployment (rings aside): segments, pool slots, temporaries."""
    directory = connector.connector.directory
    return sorted(name for name in os.listdir(directory) if name.startswith(("fb", "pool.")))


# -- key-based read and write --------------------------------------------------------


def test_put_then_get_by_key(connector: SharedMemoryConnector) -> None:
    """TestKeyBasedReadWrite::test_put_then_get_by_key."""
    data = {"hello": "world", "n": 42}
    ok, size, meta = connector.put("s0", "s1", "test_key_1", data)
    assert ok and size > 0
    assert "host_ring" in meta  # superseded: upstream's "shm" (the seed's ring carries it)
    assert os.path.isfile(file_of(meta))
    result = connector.get("s0", "s1", "test_key_1", metadata=None)
    assert result == (data, size)
    assert connector.health()["gets"] == 1
    assert connector.get("s0", "s1", "test_key_1") is None  # consumed: no longer pending


def test_a_tensor_payload_leaves_no_file(scope: str) -> None:
    """TestKeyBasedReadWrite::test_tensor_payload_removes_lock_file."""
    with facade(scope, 0, host_ring_bytes=0) as connector:
        payload = torch.ones(2, 2)
        ok, _, metadata = connector.put("s0", "s1", "tensor_payload", payload)
        assert ok and "shm" in metadata and os.path.exists(file_of(metadata))
        result = connector.get("s0", "s1", "tensor_payload", metadata=metadata)
        assert torch.equal(result[0], payload)
        assert not os.path.exists(file_of(metadata)) and _own_files(connector) == []


def test_raw_tensor_payloads_round_trip_by_key(scope: str) -> None:
    """TestKeyBasedReadWrite::test_raw_tensor_payload_round_trip_by_key.

    Tensors always travel as raw regions here (``raw_tensor_shm`` is
    accepted and changes nothing); upstream's ``format: tensor-v1`` metadata
    and ``raw_tensor_puts`` counter are superseded by the codec's layout.
    """
    with facade(scope, 1, raw_tensor_shm=True) as connector:
        assert connector.raw_tensor_shm is True
        audio = torch.arange(12, dtype=torch.long).reshape(3, 4)
        payload = {
            "codes": {"audio": audio},
            "meta": {"finished": torch.tensor(False), "request_id": "r0"},
        }
        ok, size, _ = connector.put("s1", "s2", "raw_tensor_payload", payload)
        assert ok and size > audio.numel() * audio.element_size()
        restored, restored_size = connector.get("s1", "s2", "raw_tensor_payload")
        assert torch.equal(restored["codes"]["audio"], audio)
        assert torch.equal(restored["meta"]["finished"], torch.tensor(False))
        assert restored["meta"]["request_id"] == "r0" and restored_size == size


class Codes(msgspec.Struct, omit_defaults=True):
    audio: torch.Tensor | None = None


class Meta(msgspec.Struct, omit_defaults=True):
    finished: torch.Tensor | None = None
    request_id: str = ""


class Payload(msgspec.Struct, omit_defaults=True):
    codes: Codes | None = None
    meta: Meta | None = None


def test_raw_struct_payloads_with_mixed_alignment_round_trip(scope: str) -> None:
    """TestKeyBasedReadWrite::test_raw_msgspec_payload_round_trip_with_mixed_alignment."""
    with facade(scope, 1, raw_tensor_shm=True) as connector:
        audio = torch.arange(6, dtype=torch.int64).reshape(2, 3)
        payload = Payload(Codes(audio), Meta(torch.tensor(False), "r-struct"))
        mixed = {"flag": torch.tensor(True), "payload": payload}  # a 1-byte tensor before int64
        assert connector.put("s1", "s2", "raw_struct", mixed)[0]
        restored, _ = connector.get("s1", "s2", "raw_struct")
        assert torch.equal(restored["flag"], torch.tensor(True))
        assert torch.equal(
            restored["payload"]["codes"]["audio"], audio
        )  # a Struct arrives as a dict
        assert torch.equal(restored["payload"]["meta"]["finished"], torch.tensor(False))
        assert restored["payload"]["meta"]["request_id"] == "r-struct"


def test_event_notifications_off_report_unavailable(connector: SharedMemoryConnector) -> None:
    """TestKeyBasedReadWrite::test_event_notification_disabled_reports_unavailable."""
    assert connector.event_notifications_enabled is False
    assert connector.wait_for_data(0.001) is False


def test_an_event_notification_wakes_the_target_stage(scope: str) -> None:
    """TestKeyBasedReadWrite::test_event_notification_wakes_target_stage."""
    options = {"shm_event_notifications": True, "shm_notification_namespace": scope}
    sender = SharedMemoryConnector({"stage_id": 1, "extra": options})
    receiver = SharedMemoryConnector({"stage_id": 2, "extra": options})
    other = SharedMemoryConnector({"stage_id": 3, "extra": options})
    try:
        assert receiver.event_notifications_enabled and other.event_notifications_enabled
        assert sender.put("1", "2", "notify_target_stage", {"ready": True})[0]
        assert receiver.wait_for_data(0.1)
        assert other.wait_for_data(0.01) is False  # another stage's put is not its data
        assert receiver.get("1", "2", "notify_target_stage") is not None
        assert receiver.wait_for_data(0.01) is False  # drained: nothing new since
    finally:
        sender.close()
        receiver.close()
        other.close()
    assert receiver.event_notifications_enabled is False


def test_a_wait_with_nothing_arriving_ends_at_its_timeout(scope: str) -> None:
    """wait_for_data and wait_for_change answer False once their timeout passed, not later.

    Each wait sleeps on the stage bell at most 1 s at a time and looks at
    its deadline between: a wrong deadline there waits for good, which the
    watchdog turns into a failure.
    """
    options = {"shm_event_notifications": True, "shm_notification_namespace": scope}
    receiver = SharedMemoryConnector({"stage_id": 2, "extra": options})
    try:
        with watchdog(5):
            assert receiver.wait_for_data(0.05) is False
            generation = receiver.get_wakeup_generation()
            assert generation is not None
            assert receiver.wait_for_change(generation, timeout=0.05) is False
    finally:
        receiver.close()


@pytest.mark.parametrize("falsy", [0, {}, b"", [], False, None], ids=repr)
def test_a_falsy_payload_round_trips_and_leaves_no_file(scope: str, falsy: object) -> None:
    """test_falsey_payload_removes_lock_file, TestCleanup::test_get_removes_lock_file_even_for_falsy_payload."""
    with facade(scope, 0, host_ring_bytes=0) as connector:
        ok, _, metadata = connector.put("s0", "s1", "falsy_key_1", falsy)
        assert ok
        assert connector.get("s0", "s1", "falsy_key_1", metadata=metadata)[0] == falsy
        assert not os.path.exists(file_of(metadata)) and _own_files(connector) == []


def test_get_nonexistent_key_returns_none(connector: SharedMemoryConnector) -> None:
    """TestKeyBasedReadWrite::test_get_nonexistent_key_returns_none."""
    assert connector.get("s0", "s1", "no_such_key_xyz", metadata=None) is None


def test_a_segment_seen_before_it_is_complete_answers_none(scope: str) -> None:
    """TestKeyBasedReadWrite::test_get_empty_shm_race_returns_none.

    Segments are written under a private name and renamed into place
    complete, so a reader never sees one half made; a file at a segment's
    name that is empty is corrupt: the get answers None (no traceback), the
    file is removed, and the connector goes on.
    """
    with facade(scope, 0, host_ring_bytes=0) as connector:
        path = os.path.join(
            connector.connector.directory, segment_name("not_ready_yet", ("s0", "s1"))
        )
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        os.close(fd)
        assert connector.get("s0", "s1", "not_ready_yet", metadata=None) is None
        assert not os.path.exists(path) and connector.health()["failed_gets"] == 1
        assert connector.put("s0", "s1", "not_ready_yet", 1)[0]
        assert connector.get("s0", "s1", "not_ready_yet")[0] == 1


def test_rank_aware_keys_are_independent(connector: SharedMemoryConnector) -> None:
    """TestKeyBasedReadWrite::test_rank_aware_keys_independent."""
    payloads = {}
    for rank in range(4):
        data = {"rank": rank, "values": list(range(rank, rank + 3))}
        assert connector.put("s0", "s1", f"req1_s0_0_{rank}_{rank}", data)[0]
        payloads[rank] = data
    for rank in range(4):
        assert connector.get("s0", "s1", f"req1_s0_0_{rank}_{rank}")[0] == payloads[rank]


# -- metadata fallback -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "metadata"),
    [
        ("fb_key_1", {"source_host": "10.0.0.1", "source_port": 12345}),
        ("fb_key_2", "not_a_dict"),
        ("fb_key_3", {}),
    ],
    ids=["rdma-style", "not-a-dict", "empty-dict"],
)
def test_foreign_metadata_falls_back_to_the_key(
    connector: SharedMemoryConnector, key: str, metadata: object
) -> None:
    """TestMetadataFallback::test_rdma_style_/test_non_dict_/test_empty_dict_metadata_falls_back_to_key."""
    connector.put("s0", "s1", key, {"payload": key})
    assert connector.get("s0", "s1", key, metadata=metadata)[0] == {"payload": key}


def test_the_puts_own_metadata_still_works(connector: SharedMemoryConnector) -> None:
    """TestMetadataFallback::test_shm_handle_metadata_still_works (its handle is ``host_ring`` here)."""
    ok, _, meta = connector.put("s0", "s1", "shm_direct_1", {"direct": True})
    assert ok and connector.get("s0", "s1", "shm_direct_1", metadata=meta)[0] == {"direct": True}


def test_metadata_keyed_by_request_id(connector: SharedMemoryConnector) -> None:
    """TestMetadataFallback::test_metadata_keyed_by_request_id."""
    ok, _, meta = connector.put("s0", "s1", "wrap_key", {"wrapped": True})
    assert connector.get("s0", "s1", "wrap_key", metadata={"wrap_key": meta})[0] == {
        "wrapped": True
    }


def test_a_descriptor_names_its_file_whatever_the_receivers_scope(scope: str) -> None:
    """Issue 27, defect 5: the metadata's ``name`` finds the file from any scope of this uid."""
    with facade(scope, 0, host_ring_bytes=0) as sender, facade(f"{scope}b", 1) as elsewhere:
        ok, size, metadata = sender.put("s0", "s1", "named", {"found": True})
        assert ok and elsewhere.scope != sender.scope
        assert elsewhere.get("s0", "s1", "named") is None  # by key: its own scope only
        assert elsewhere.get("s0", "s1", "named", metadata) == ({"found": True}, size)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make a directory of another uid")
def test_a_descriptor_naming_another_owners_deployment_is_refused(
    scope: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 27, defect 5: still under this uid's shm root; another owner's directory is refused."""
    foreign = os.path.join(SHM_ROOT, f"shmring-{os.getuid()}-{scope}x")
    os.mkdir(foreign, 0o700)
    os.chown(foreign, 12345, 12345)
    try:
        with facade(scope, 1) as receiver:
            forged = {
                "shm": {
                    "producer": [os.getpid(), 0, 0],
                    "source": "s0",
                    "destination": "s1",
                    "key": "k",
                    "size": 1,
                    "generation": 1,
                    "name": f"{os.path.basename(foreign)}/fb.s0.s1.0",
                },
                "size": 1,
            }
            assert receiver.get("s0", "s1", "k", forged) is None
            outside = {**forged, "shm": {**forged["shm"], "name": "../etc/passwd"}}
            assert receiver.get("s0", "s1", "k", outside) is None
        assert os.listdir(foreign) == []  # nothing made in it
        # Each refusal says which key and why (the error itself, not only that it happened).
        refusals = [
            r.getMessage() for r in caplog.records if "refusing the descriptor" in r.getMessage()
        ]
        assert any("key='k'" in m and "owned by uid=12345" in m for m in refusals), refusals
        assert any("not a deployment of this uid: name='..'" in m for m in refusals), refusals
    finally:
        os.rmdir(foreign)


# -- heterogeneous tensor parallelism ----------------------------------------------------------


def test_a_receiver_reads_several_sender_keys(connector: SharedMemoryConnector) -> None:
    """TestHeteroTPMultiKey::test_receiver_reads_multiple_sender_keys."""
    for rank in range(2):
        connector.put("s0", "s1", f"req1_s0_0_{rank}_0", {"sender": rank, "shard": [rank * 10]})
    shards = [connector.get("s0", "s1", f"req1_s0_0_{rank}_0")[0] for rank in range(2)]
    assert [shard["sender"] for shard in shards] == [0, 1]


def test_a_sender_writes_several_receiver_keys(connector: SharedMemoryConnector) -> None:
    """TestHeteroTPMultiKey::test_sender_writes_multiple_receiver_keys."""
    for rank in range(2):
        connector.put("s0", "s1", f"req1_s0_0_0_{rank}", {"target": rank})
    for rank in range(2):
        assert connector.get("s0", "s1", f"req1_s0_0_0_{rank}")[0]["target"] == rank


# -- cleanup -----------------------------------------------------------------------------


def test_cleanup_removes_the_exact_unconsumed_key(connector: SharedMemoryConnector) -> None:
    """TestCleanup::test_cleanup_removes_unconsumed_segment.

    Superseded in part: one upstream version also matched ``_``-delimited
    suffixes (``cleanup("req_42")`` removed ``cleanup_req_42``); its newest
    connector, like the seed, retires the exact key only, and the numbered
    chunks of a request through `cleanup_prefix`.
    """
    connector.put("s0", "s1", "cleanup_req_42", {"leak": True})
    assert connector.cleanup("req_42") is False  # never a suffix
    assert connector.cleanup("cleanup_req_42") is True
    assert connector.get("s0", "s1", "cleanup_req_42", metadata=None) is None


def test_cleanup_is_a_no_op_for_a_consumed_key(connector: SharedMemoryConnector) -> None:
    """TestCleanup::test_cleanup_noop_for_consumed_segment."""
    connector.put("s0", "s1", "consumed_req_99", {"consumed": True})
    assert connector.get("s0", "s1", "consumed_req_99") is not None
    assert connector.cleanup("consumed_req_99") is False


def test_close_removes_everything_pending(scope: str) -> None:
    """TestCleanup::test_close_cleans_all_pending."""
    connector = facade(scope, 0, host_ring_bytes=0)
    files = [file_of(connector.put("s0", "s1", f"close_test_{i}", {"i": i})[2]) for i in range(3)]
    assert all(os.path.exists(path) for path in files)
    directory = connector.connector.directory
    connector.close()
    assert not any(os.path.exists(path) for path in files) and not os.path.exists(directory)


def test_a_request_sweep_removes_its_chunk_keys_and_nothing_else(scope: str) -> None:
    """TestCleanup::test_cleanup_sweeps_chunk_keys_and_lock_files.

    Superseded in part: upstream's ``cleanup(external request id)`` swept
    ``{id}_{stage}_{chunk}`` keys; the seed's cleanup is exact and
    `cleanup_prefix` sweeps a prefix followed by digits only (so
    ``req-c1_0_`` matches ``req-c1_0_1``, never ``other-req_0_0``).
    """
    with facade(scope, 0, host_ring_bytes=0) as connector:
        for chunk in range(2):
            assert connector.put("s0", "s1", f"req-c1_0_{chunk}", {"chunk": chunk})[0]
        assert connector.put("s0", "s1", "other-req_0_0", {"keep": True})[0]
        assert connector.cleanup_prefix("req-c1_0_") == 2
        for chunk in range(2):
            assert connector.get("s0", "s1", f"req-c1_0_{chunk}") is None
            assert not os.path.exists(
                os.path.join(
                    SHM_ROOT,
                    connector.connector.directory,
                    segment_name(f"req-c1_0_{chunk}", ("s0", "s1")),
                )
            )
        assert connector.get("s0", "s1", "other-req_0_0")[0] == {"keep": True}
