"""vllm-omni's ``test_omni_connector_configs.py`` and its connector's config keys, against the facade (issue 27).

Upstream loads stage YAML into per-stage connector specs: a
SharedMemoryConnector spec keeps its ``extra`` (``shm_threshold_bytes``)
and gets a ``role``; its connectors read ``shm_threshold_bytes``,
``raw_tensor_shm``, ``shm_event_notifications``,
``shm_notification_namespace``, ``stage_id``, ``VLLM_OMNI_SHM_WAKEUP`` and
``VLLM_OMNI_SHM_COHORT_NAMESPACE``. The YAML loader and the RDMA endpoint
plumbing are vllm-omni's (not applicable, docs/conformance.md); every key
upstream accepts is honoured or refused loudly here, an unknown key is
logged by name, and a closed facade answers as vllm-omni's does. Each test
names the upstream behaviour it mirrors.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest

from shmring import ClosedError, ConfigurationError, SharedMemoryConnector
from shmring.model_tests.conformance_kit import facade


def test_a_shm_spec_keeps_its_threshold_and_ignores_its_role(
    scope: str, caplog: pytest.LogCaptureFixture
) -> None:
    """test_shm_connector_is_untouched_by_endpoint_injection."""
    for role in ("sender", "receiver", "dual"):
        spec = {
            "stage_id": 1,
            "extra": {"wakeup_scope": scope, "shm_threshold_bytes": 65536, "role": role},
        }
        with caplog.at_level(logging.WARNING, logger="shmring.compat"):
            connector = SharedMemoryConnector(spec)
        with connector:
            assert connector.threshold == 65536
            assert "zmq_port" not in connector.config["extra"]
    assert not [record for record in caplog.records if "role" in record.getMessage()]


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("stage_id", "x", "stage_id must be an int"),
        ("stage_id", 1.5, "stage_id must be an int"),
        ("stage_id", True, "stage_id must be an int"),
        ("shm_threshold_bytes", -1, "shm_threshold_bytes must be an int >= 0"),
        ("shm_threshold_bytes", "64k", "shm_threshold_bytes must be an int >= 0"),
        ("raw_tensor_shm", "false", "raw_tensor_shm must be a bool"),
        ("shm_event_notifications", 1, "shm_event_notifications must be a bool"),
        ("shm_notification_namespace", "", "shm_notification_namespace must be a non-empty str"),
        ("host_ring_bytes", 1000, "ring capacity out of range"),
    ],
)
def test_a_bad_value_of_a_key_upstream_accepts_is_a_configuration_error(
    scope: str, key: str, value: Any, message: str
) -> None:
    """Issue 27: config upstream accepts is honoured or refused loudly (ConfigurationError naming it)."""
    config: dict[str, Any] = {"stage_id": 0, "wakeup_scope": scope, key: value}
    with pytest.raises(ConfigurationError, match=message):
        SharedMemoryConnector(config)
    with pytest.raises(ConfigurationError, match=message):  # under "extra" alike
        SharedMemoryConnector({"extra": config})


def test_an_unknown_key_is_logged_by_name(scope: str, caplog: pytest.LogCaptureFixture) -> None:
    """Issue 27: an unknown key gets a warning naming it (vllm-omni ignored it silently)."""
    with caplog.at_level(logging.WARNING, logger="shmring.compat"):
        with facade(scope, 0, shm_treshold_bytes=1024) as connector:  # a typo
            assert connector.threshold == 65536
        SharedMemoryConnector({"wakeup_scope": scope, "hots_ring_bytes": 4096}).close()
    messages = [record.getMessage() for record in caplog.records]
    assert any("'shm_treshold_bytes'" in message for message in messages)
    assert any("'hots_ring_bytes'" in message for message in messages)


@pytest.mark.parametrize("stage_id", [0, 3, "2", "-1", -1, None], ids=repr)
def test_stage_ids_vllm_omni_uses_are_accepted(scope: str, stage_id: Any) -> None:
    with facade(scope, stage_id) as connector:
        assert connector.stage_id == stage_id


def test_the_notification_namespace_names_the_deployment(scope: str) -> None:
    """``shm_notification_namespace``: connectors of one namespace wake each other (and share data)."""
    options = {"shm_notification_namespace": scope}
    with (
        SharedMemoryConnector({"stage_id": 0, "extra": options}) as sender,
        SharedMemoryConnector({"stage_id": 1, "extra": options}) as receiver,
    ):
        assert sender.scope == receiver.scope == scope
        assert sender.put(0, 1, "k", 1)[0] and receiver.get(0, 1, "k")[0] == 1
    with pytest.raises(ConfigurationError, match="must be its wakeup_scope"):
        SharedMemoryConnector({"wakeup_scope": scope, "shm_notification_namespace": "other"})
    with SharedMemoryConnector({"wakeup_scope": scope, "shm_notification_namespace": scope}):
        pass  # the same name twice is fine


def test_the_wakeup_switch_is_read_as_vllm_omni_reads_it(
    scope: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``VLLM_OMNI_SHM_WAKEUP``: 0 turns wake-ups off, 1 (or unset) on; anything else is refused."""
    monkeypatch.setenv("VLLM_OMNI_SHM_WAKEUP", "0")
    with facade(scope, 1) as connector:
        assert connector.get_wakeup_generation() is None
        monkeypatch.setenv("VLLM_OMNI_SHM_WAKEUP", "1")  # read at every call, as upstream
        assert connector.get_wakeup_generation() is not None
    monkeypatch.setenv("VLLM_OMNI_SHM_WAKEUP", "yes")
    with pytest.raises(ConfigurationError, match="VLLM_OMNI_SHM_WAKEUP must be 0 or 1"):
        facade(scope, 1)


@pytest.mark.parametrize("namespace", ["", "unit", "a-b_C9"])
def test_a_valid_cohort_namespace_is_accepted(
    scope: str, monkeypatch: pytest.MonkeyPatch, namespace: str
) -> None:
    """``VLLM_OMNI_SHM_COHORT_NAMESPACE`` (upstream: cohorts only with it; here always)."""
    monkeypatch.setenv("VLLM_OMNI_SHM_COHORT_NAMESPACE", namespace)
    with facade(scope, 0) as sender, facade(scope, 1) as receiver:
        with sender.publication_cohort(0, 1):
            sender.put(0, 1, "k", 1)
            assert receiver.get(0, 1, "k") is None
        assert receiver.get(0, 1, "k")[0] == 1


@pytest.mark.parametrize("namespace", ["has space", "x" * 65, "a/b"])
def test_a_bad_cohort_namespace_is_refused(
    scope: str, monkeypatch: pytest.MonkeyPatch, namespace: str
) -> None:
    """Upstream raises ValueError for it; ConfigurationError is one."""
    monkeypatch.setenv("VLLM_OMNI_SHM_COHORT_NAMESPACE", namespace)
    with pytest.raises(ConfigurationError, match="VLLM_OMNI_SHM_COHORT_NAMESPACE") as caught:
        facade(scope, 0)
    assert isinstance(caught.value, ValueError)


def test_a_closed_facade_answers_as_vllm_omni_does_and_the_connector_keeps_raising(
    scope: str,
) -> None:
    """Issue 27: after close(), get answers None and put (False, 0, None); `Connector` raises."""
    connector = facade(scope, 1)
    connector.close()
    assert connector.get(0, 1, "k") is None
    assert connector.get_with_deadline(0, 1, "k", deadline=1e18) is None
    assert connector.put(0, 1, "k", 1) == (False, 0, None)
    assert connector.cleanup("k") is False and connector.cleanup_prefix("k") == 0
    assert connector.get_wakeup_generation() is None
    assert connector.wait_for_change(0, timeout=0) is False
    assert connector.abandon_get("k") is None and connector.reap_consumed() is None
    assert connector.health()["status"] == "closed"
    with connector.publication_cohort(0, 1):
        pass
    for call in (
        lambda: connector.connector.get(0, 1, "k"),
        lambda: connector.connector.put(0, 1, "k", 1),
        lambda: connector.connector.cleanup("k"),
    ):
        with pytest.raises(ClosedError):
            call()
