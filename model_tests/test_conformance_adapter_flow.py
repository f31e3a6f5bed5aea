"""vllm-omni's ``test_adapter_and_flow.py`` against `shmring.SharedMemoryConnector` (issue 27).

Upstream drives its adapter (``try_send_via_connector`` /
``try_recv_via_connector``) over a connector: the sender puts the stage's
payload under the request id with the stage ids as strings and queues a
notification carrying the put's metadata; the receiver finds the edge's
connector and gets with ``metadata=`` that metadata. The adapter and the
stage-config helpers are vllm-omni's; what they ask of the connector is
checked here through `_send` / `_recv`, which make exactly the adapter's
calls. Each test names the upstream test it mirrors.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from shmring import SharedMemoryConnector
from shmring.model_tests.conformance_kit import facade


def _send(
    connector: Any,
    stage_id: int,
    next_stage_id: int,
    req_id: str,
    next_inputs: Any,
    sampling_params: Any,
    submit: Callable[[dict[str, Any]], None],
) -> bool:
    """The connector calls of vllm-omni's ``try_send_via_connector``."""
    payload = {"engine_inputs": next_inputs, "sampling_params": sampling_params}
    ok, _size, metadata = connector.put(str(stage_id), str(next_stage_id), req_id, payload)
    if not ok:
        return False
    submit(
        {
            "request_id": req_id,
            "from_connector": True,
            "from_stage": str(stage_id),
            "connector_metadata": metadata,
        }
    )
    return True


def _recv(task: dict[str, Any], connectors: dict[tuple[str, str], Any], stage_id: int) -> Any:
    """The connector calls of vllm-omni's ``try_recv_via_connector`` (None when nothing came)."""
    connector = connectors.get((task["from_stage"], str(stage_id)))
    if connector is None:
        return None
    try:
        result = connector.get(
            task["from_stage"],
            str(stage_id),
            task["request_id"],
            metadata=task.get("connector_metadata"),
        )
    except Exception:  # noqa: BLE001 - the adapter's own rule: a failed get is no input
        return None
    return None if result is None else result[0]["engine_inputs"]


@pytest.fixture
def edge(scope: str) -> Iterator[tuple[SharedMemoryConnector, SharedMemoryConnector]]:
    sender, receiver = facade(scope, 0), facade(scope, 1)
    try:
        yield sender, receiver
    finally:
        sender.close()
        receiver.close()


def test_a_send_puts_the_stage_payload_and_queues_its_metadata(edge: Any) -> None:
    """test_send_success."""
    sender, receiver = edge
    queued: list[dict[str, Any]] = []
    inputs, params = {"input_ids": [1, 2, 3]}, {"temperature": 0.7}
    assert _send(sender, 0, 1, "req_123", inputs, params, queued.append) is True
    (notification,) = queued
    assert notification["request_id"] == "req_123" and notification["from_connector"] is True
    got, _ = receiver.get("0", "1", "req_123", metadata=notification["connector_metadata"])
    assert got == {"engine_inputs": inputs, "sampling_params": params}


def test_a_refused_put_sends_nothing(edge: Any) -> None:
    """test_send_fail (a payload the codec refuses: ``(False, 0, None)``)."""
    sender, receiver = edge
    queued: list[dict[str, Any]] = []
    assert _send(sender, 0, 1, "req_fail", object(), {}, queued.append) is False
    assert queued == [] and receiver.get("0", "1", "req_fail") is None


def test_a_receive_gets_with_the_queued_metadata(edge: Any) -> None:
    """test_recv_success (the adapter's ``get(..., metadata=...)`` call shape)."""
    sender, receiver = edge
    _, _, metadata = sender.put("0", "1", "req_recv", {"engine_inputs": {"ids": [1]}})
    task = {
        "request_id": "req_recv",
        "from_connector": True,
        "from_stage": "0",
        "connector_metadata": metadata,
    }
    assert _recv(task, {("0", "1"): receiver}, stage_id=1) == {"ids": [1]}


def test_the_whole_flow_moves_the_inputs_unchanged(edge: Any) -> None:
    """test_shm_connector_flow."""
    sender, receiver = edge
    queued: list[dict[str, Any]] = []
    inputs = {"tokens": [10, 20, 30]}
    assert _send(sender, 0, 1, "flow_req", inputs, {"n": 1}, queued.append)
    task = queued[0]
    assert task["from_connector"] is True and task["from_stage"] == "0"
    assert _recv(task, {("0", "1"): receiver}, stage_id=1) == inputs


def test_a_task_without_metadata_is_found_by_key(edge: Any) -> None:
    """test_recv_with_missing_metadata (a real connector reads by key; upstream's mock raised)."""
    sender, receiver = edge
    sender.put("0", "1", "req_bad", {"engine_inputs": "by key"})
    task = {"request_id": "req_bad", "from_connector": True, "from_stage": "0"}
    assert _recv(task, {("0", "1"): receiver}, stage_id=1) == "by key"
    assert _recv({**task, "request_id": "never"}, {("0", "1"): receiver}, stage_id=1) is None


def test_a_stage_spec_with_a_role_and_model_options_is_accepted(
    scope: str, caplog: pytest.LogCaptureFixture
) -> None:
    """test_outgoing_only_async_stage_uses_sender_connector_spec, test_get_connectors_for_stage.

    vllm-omni's stage plans hand every connector ``extra`` with a ``role``
    and the model's own options: the role means nothing to shared memory
    (accepted quietly), a key the facade does not know is logged by name.
    """
    extra = {"wakeup_scope": scope, "codec_chunk_frames": 25, "role": "sender"}
    with (
        caplog.at_level(logging.WARNING, logger="shmring.compat"),
        SharedMemoryConnector({"stage_id": 1, "extra": extra}) as connector,
    ):
        assert connector.put("1", "2", "k", 1)[0]
    warned = [record.getMessage() for record in caplog.records]
    assert any("codec_chunk_frames" in message for message in warned)
    assert not any("'role'" in message for message in warned)
