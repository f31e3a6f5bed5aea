"""The vllm-omni compatible facade: same call shapes, same return shapes."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import Any

import pytest

from shmring import SharedMemoryConnector
from shmring.fault_injection.kit.payloads import payload_tag, tagged_payload
from shmring.impl.compat import scope_from_config
from shmring.impl.errors import ConfigurationError


@pytest.fixture
def stages(scope: str) -> Iterator[tuple[SharedMemoryConnector, SharedMemoryConnector]]:
    """Stage 0 (sender) and stage 1 (receiver) of one deployment."""
    sender = SharedMemoryConnector(
        {"stage_id": 0, "extra": {"wakeup_scope": scope, "host_ring_bytes": 4096}}
    )
    receiver = SharedMemoryConnector({"stage_id": 1, "wakeup_scope": scope})
    try:
        yield sender, receiver
    finally:
        sender.close()
        receiver.close()
    assert not os.path.exists(sender.connector.directory)


def test_config_is_read_at_the_top_level_and_under_extra(scope: str) -> None:
    top = SharedMemoryConnector({"stage_id": 3, "wakeup_scope": scope, "host_ring_bytes": 8192})
    nested = SharedMemoryConnector(
        {"extra": {"stage_id": 4, "wakeup_scope": scope, "host_ring_bytes": 0}}
    )
    both = SharedMemoryConnector(
        {"host_ring_bytes": 4096, "wakeup_scope": scope, "extra": {"host_ring_bytes": 0}}
    )
    try:
        assert (top.stage_id, top.connector.ring_capacity, top.scope) == (3, 8192, scope)
        assert (nested.stage_id, nested.connector.ring_capacity) == (4, 0)
        assert both.connector.ring_capacity == 4096  # the top level wins
    finally:
        for connector in (top, nested, both):
            connector.close()


@pytest.mark.parametrize("ring_bytes", [1000, 4100, 1 << 30, -1])
def test_a_bad_ring_size_is_a_configuration_error_naming_it(scope: str, ring_bytes: int) -> None:
    with pytest.raises(ConfigurationError, match=f"capacity={ring_bytes}"):
        SharedMemoryConnector({"wakeup_scope": scope, "host_ring_bytes": ring_bytes})


def test_scopes_that_cannot_name_a_directory_are_digested() -> None:
    assert scope_from_config({"wakeup_scope": "run-7"}) == "run-7"
    odd = scope_from_config({"extra": {"wakeup_scope": "tenant/a b"}})
    assert (
        odd.startswith("h")
        and "/" not in odd
        and odd == scope_from_config({"wakeup_scope": "tenant/a b"})
    )
    assert scope_from_config({}) == f"ppid{os.getppid()}"


def test_put_answers_ok_size_and_ring_metadata(
    stages: tuple[SharedMemoryConnector, SharedMemoryConnector],
) -> None:
    sender, receiver = stages
    ok, size, metadata = sender.put(0, 1, "req_1", {"tokens": [1, 2, 3]})
    assert ok and size > 0
    assert (
        metadata is not None and set(metadata) == {"host_ring", "size"} and metadata["size"] == size
    )
    assert receiver.get(0, 1, "req_1", metadata) == ({"tokens": [1, 2, 3]}, size)
    assert receiver.get(0, 1, "req_1", metadata) is None  # claimed once


def test_large_payloads_answer_shm_metadata(
    stages: tuple[SharedMemoryConnector, SharedMemoryConnector],
) -> None:
    sender, receiver = stages
    payload = tagged_payload(7, 50_000)
    ok, size, metadata = sender.put(0, 1, "req_2", payload)
    assert ok and metadata is not None and set(metadata) == {"shm", "size"}
    # Issue 13: a pool slot carries it; the metadata names the ring file holding its reference.
    assert metadata["shm"]["pool"] is True and "/ring." in "/" + metadata["shm"]["name"]
    got = receiver.get(0, 1, "req_2", metadata)
    assert got is not None and got[0] == payload and got[1] == size
    assert receiver.health()["pool_gets"] == 1  # the exact frame the metadata names, from its slot


def test_metadata_may_be_keyed_by_the_get_key(
    stages: tuple[SharedMemoryConnector, SharedMemoryConnector],
) -> None:
    sender, receiver = stages
    _, size, metadata = sender.put(0, 1, "req_3", b"abc")
    assert receiver.get(0, 1, "req_3", {"req_3": metadata}) == (b"abc", size)


@pytest.mark.parametrize(
    "metadata",
    [
        None,
        {},
        {"shm": {"name": "req_4", "size": 3}},
        {"source_host": "10.0.0.1", "source_port": 1},
    ],
    ids=["none", "empty", "foreign-shm", "remote"],
)
def test_missing_or_foreign_metadata_falls_back_to_the_key(
    stages: tuple[SharedMemoryConnector, SharedMemoryConnector], metadata: Any
) -> None:
    sender, receiver = stages
    _, size, _ = sender.put(0, 1, "req_4", b"abc")
    assert receiver.get(0, 1, "req_4", metadata) == (b"abc", size)


def test_malformed_metadata_falls_back_to_the_key_and_says_what_was_wrong(
    stages: tuple[SharedMemoryConnector, SharedMemoryConnector], caplog: pytest.LogCaptureFixture
) -> None:
    """Metadata in our shape that cannot be read is ignored with its reason: the get looks up the key."""
    sender, receiver = stages
    _, _, metadata = sender.put(0, 1, "req_7", b"abc")
    ((name, data),) = (
        (k, v) for k, v in metadata.items() if isinstance(v, dict) and "producer" in v
    )
    broken = {**metadata, name: {**data, "size": "three"}}
    with caplog.at_level("WARNING", logger="shmring.compat"):
        assert receiver.get(0, 1, "req_7", broken) == (b"abc", 5)
    warnings = [r.getMessage() for r in caplog.records if "malformed metadata" in r.getMessage()]
    assert len(warnings) == 1 and "key='req_7'" in warnings[0], warnings
    assert "size must be a non-negative int: size='three'" in warnings[0], warnings


@pytest.mark.parametrize("waiting", [False, True], ids=["get", "get_with_deadline"])
def test_stale_metadata_returns_none(
    stages: tuple[SharedMemoryConnector, SharedMemoryConnector], waiting: bool
) -> None:
    """Metadata names one version: an older one answers None (never the newer payload), on both gets."""
    sender, receiver = stages

    def get(metadata: Any) -> Any:
        if waiting:
            return receiver.get_with_deadline(
                0, 1, "req_5", metadata, deadline=time.monotonic() + 5
            )
        return receiver.get(0, 1, "req_5", metadata)

    _, _, old = sender.put(0, 1, "req_5", b"old")
    _, size, new = sender.put(0, 1, "req_5", b"new")
    started = time.monotonic()
    assert get(old) is None
    assert time.monotonic() - started < 4  # stale is final: not waited for
    assert get(new) == (b"new", size)


def test_get_with_deadline_returns_none_at_the_deadline_and_the_payload_when_there(
    stages: tuple[SharedMemoryConnector, SharedMemoryConnector],
) -> None:
    sender, receiver = stages
    assert receiver.get_with_deadline(0, 1, "req_6", deadline=time.monotonic() + 0.05) is None
    assert receiver.get_with_deadline(0, 1, "req_6", deadline=time.monotonic() - 1) is None
    _, size, metadata = sender.put(0, 1, "req_6", [1, "two"])
    got = receiver.get_with_deadline(0, 1, "req_6", metadata, deadline=time.monotonic() + 10)
    assert got == ([1, "two"], size)


def test_cleanup_is_exact_and_cleanup_prefix_counts(
    stages: tuple[SharedMemoryConnector, SharedMemoryConnector],
) -> None:
    sender, receiver = stages
    for key in ("req_7_0", "req_7_1", "req_7_10", "req_7"):
        sender.put(0, 1, key, tagged_payload(1, 100))
    sender.put(0, 1, "req_7_2", tagged_payload(2, 50_000))
    assert sender.cleanup("req_7") == 1
    assert receiver.get(0, 1, "req_7") is None
    assert sender.cleanup_prefix("req_7_") == 4
    for key in ("req_7_0", "req_7_1", "req_7_10", "req_7_2"):
        assert receiver.get(0, 1, key) is None


def test_health_counts_puts_gets_bytes_and_routes(
    stages: tuple[SharedMemoryConnector, SharedMemoryConnector],
) -> None:
    sender, receiver = stages
    _, small, _ = sender.put(0, 1, "a", b"x" * 10)
    _, large, _ = sender.put(0, 1, "b", tagged_payload(3, 50_000))
    assert receiver.get(0, 1, "a") and receiver.get(0, 1, "b")
    sent = sender.health()
    keys = ("puts", "bytes_transferred", "host_ring_puts", "host_ring_fallbacks", "pool_puts")
    assert {k: sent[k] for k in keys} == {
        "puts": 2,
        "bytes_transferred": small + large,
        "host_ring_puts": 1,
        "host_ring_fallbacks": 0,  # issue 13: what the ring does not admit goes to the pool
        "pool_puts": 1,
    }
    got = receiver.health()
    assert (got["gets"], got["host_ring_gets"], got["pool_gets"], got["bytes_transferred"]) == (
        2,
        1,
        1,
        small + large,
    )
    assert got["status"] == "healthy"


def test_a_refused_put_answers_false_as_vllm_omni_does(scope: str) -> None:
    sender = SharedMemoryConnector(
        {"wakeup_scope": scope, "host_ring_bytes": 0, "fallback_budget_bytes": 100}
    )
    try:
        assert sender.put(0, 1, "big", b"x" * 1000) == (False, 0, None)
        assert sender.put(0, 1, "obj", object()) == (False, 0, None)  # never pickled
        health = sender.health()
        assert health["failed_puts"] == 2 and health["refusals"] == 1 and health["puts"] == 0
    finally:
        sender.close()


def test_disabled_ring_sends_everything_through_shm(scope: str) -> None:
    with (
        SharedMemoryConnector({"wakeup_scope": scope, "host_ring_bytes": 0}) as sender,
        SharedMemoryConnector({"wakeup_scope": scope}) as receiver,
    ):
        ok, size, metadata = sender.put(0, 1, "k", b"tiny")
        assert ok and metadata is not None and "shm" in metadata
        assert receiver.get(0, 1, "k", metadata) == (b"tiny", size)
        assert sender.health()["host_ring_puts"] == 0


def test_close_is_idempotent_and_a_closed_connector_refuses_puts(scope: str) -> None:
    sender = SharedMemoryConnector({"wakeup_scope": scope, "host_ring_bytes": 4096})
    assert sender.put(0, 1, "k", b"x")[0]
    sender.close()
    sender.close()
    assert sender.put(0, 1, "k", b"x") == (False, 0, None)
    assert sender.health()["status"] == "closed"


def test_the_small_tensor_tree_round_trips(
    stages: tuple[SharedMemoryConnector, SharedMemoryConnector],
) -> None:
    torch = pytest.importorskip("torch")
    sender, receiver = stages
    tree = {"codes": {"audio": torch.arange(28)}, "meta": {"finished": torch.tensor(False)}}
    ok, size, metadata = sender.put(0, 1, "tree", tree)
    assert ok and metadata is not None and "host_ring" in metadata
    tree["codes"]["audio"].zero_()  # the source may change once put returned
    got = receiver.get(0, 1, "tree", metadata)
    assert got is not None and got[1] == size
    value = got[0]
    assert torch.equal(value["codes"]["audio"], torch.arange(28))
    assert value["meta"]["finished"].dtype == torch.bool and not value["meta"]["finished"].item()


def test_payload_tags_are_preserved_across_many_keys(
    stages: tuple[SharedMemoryConnector, SharedMemoryConnector],
) -> None:
    sender, receiver = stages
    for index in range(40):
        sender.put(0, 1, f"req_9_{index}", tagged_payload(index, 200 + 37 * index))
    for index in reversed(range(40)):
        got = receiver.get(0, 1, f"req_9_{index}")
        assert got is not None and payload_tag(got[0]) == index


def test_foreign_receivers_are_kept_and_the_least_recently_used_is_closed_first(
    scope: str,
) -> None:
    """A descriptor of another scope joins a receiver there once; a later one uses it again."""
    from shmring.impl.compat_metadata import MAX_FOREIGN_SCOPES, ForeignReceivers
    from shmring.impl.connector import Connector
    from shmring.impl.names import DEFAULT_SHM_ROOT

    producers = [Connector(f"{scope}f{n}") for n in range(MAX_FOREIGN_SCOPES + 1)]
    foreign = ForeignReceivers(DEFAULT_SHM_ROOT, None)
    try:
        names = []
        for producer in producers:
            producer.put(("a", "b"), "k", b"made the directory")
            names.append(os.path.basename(producer.directory))
        first = foreign.receiver(names[0], "k")
        assert first is not None and first.scope == producers[0].scope
        kept = [first] + [foreign.receiver(name, "k") for name in names[1:MAX_FOREIGN_SCOPES]]
        assert len(foreign) == MAX_FOREIGN_SCOPES
        assert foreign.receiver(names[0], "k") is first  # kept, and now the most recent
        foreign.receiver(names[MAX_FOREIGN_SCOPES], "k")  # one too many: the oldest goes
        assert len(foreign) == MAX_FOREIGN_SCOPES
        assert foreign.receiver(names[0], "k") is first  # used last but one: still kept
        evicted = kept[1]  # the least recently used
        assert evicted is not None and evicted.closed
        assert not first.closed
    finally:
        foreign.close()
        for producer in producers:
            producer.close()
