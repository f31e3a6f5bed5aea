"""vllm-omni's ``test_basic_connectors.py`` against `shmring.SharedMemoryConnector` (issue 27).

Upstream: its serializer round-trips trees, tensors (strided views too) and
arrays; the factory makes a SharedMemoryConnector whose ``threshold`` is the
spec's ``shm_threshold_bytes``; small and large payloads round-trip through
put and get with their size; metadata the connector does not know answers
None. The serializer is the facade's `serialize_obj` / `deserialize_obj`
(what `put` and `get` use); the factory, the mocked SHM helpers and the
Mori / Mooncake connectors are vllm-omni's own and not applicable
(docs/conformance.md). Each test names the upstream test it mirrors.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from shmring import ConfigurationError, SharedMemoryConnector
from shmring.model_tests.conformance_kit import facade


def test_trees_round_trip_through_the_serializer() -> None:
    """test_basic_serialization, test_pickle_serialization (the older name; no pickle here)."""
    data = {"key": "value", "list": [1, 2, 3]}
    serialized = SharedMemoryConnector.serialize_obj(data)
    assert isinstance(serialized, bytes)
    assert SharedMemoryConnector.deserialize_obj(serialized) == data


def test_tensors_round_trip_through_the_serializer() -> None:
    """test_tensor_serialization."""
    tensor = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    back = SharedMemoryConnector.deserialize_obj(SharedMemoryConnector.serialize_obj(tensor))
    assert torch.equal(tensor, back)


def test_strided_tensor_views_round_trip() -> None:
    """test_noncontiguous_tensor_serialization."""
    tensor = torch.arange(40, dtype=torch.long).reshape(4, 10).transpose(0, 1)
    assert not tensor.is_contiguous() and tensor.stride(-1) != 1
    back = SharedMemoryConnector.deserialize_obj(
        SharedMemoryConnector.serialize_obj({"codes": tensor})
    )
    assert torch.equal(tensor, back["codes"])


def test_arrays_round_trip_through_the_serializer() -> None:
    """test_ndarray_serialization."""
    array = np.array([[1, 2, 3], [4, 5, 6]])
    back = SharedMemoryConnector.deserialize_obj(SharedMemoryConnector.serialize_obj(array))
    assert np.array_equal(array, back) and back.flags.writeable  # the receiver's own copy


def test_the_threshold_is_the_specs_shm_threshold_bytes(scope: str) -> None:
    """test_create_shm_connector (the factory's part is vllm-omni's own)."""
    with facade(scope, 0, shm_threshold_bytes=1024) as connector:
        assert connector.threshold == 1024 and connector.health()["threshold"] == 1024
    with facade(scope, 0) as connector:
        assert connector.threshold == 65536  # vllm-omni's default
    with pytest.raises(ConfigurationError, match="shm_threshold_bytes"):
        facade(scope, 0, shm_threshold_bytes="big")


def test_a_small_payload_round_trips_with_its_size(scope: str) -> None:
    """test_put_get_small_payload_uses_shm, test_put_get_inline.

    Superseded in part: upstream answers ``shm`` metadata (older versions
    ``inline_bytes``); a small payload rides the seed's ring (``host_ring``).
    """
    with facade(scope, 0) as connector:
        data = {"small": "data"}
        success, size, metadata = connector.put("stage_0", "stage_1", "req_1", data)
        assert success is True and "size" in metadata and "inline_bytes" not in metadata
        assert "host_ring" in metadata
        assert connector.get("stage_0", "stage_1", "req_1", metadata) == (data, size)


def test_a_large_payload_takes_shm_metadata_and_round_trips(scope: str) -> None:
    """test_put_get_shm (upstream mocks its SHM helpers; here the real segment)."""
    with facade(scope, 0, host_ring_bytes=4096, pool_budget_bytes=0) as connector:
        data = {"large": "x" * 2000}  # more than the 4 KiB ring admits
        success, size, metadata = connector.put("stage_0", "stage_1", "req_2", data)
        assert success is True and "shm" in metadata and "inline_bytes" not in metadata
        assert metadata["shm"]["size"] == size
        assert connector.get("stage_0", "stage_1", "req_2", metadata) == (data, size)


def test_metadata_for_a_key_never_put_answers_none(scope: str) -> None:
    """test_get_invalid_metadata."""
    with facade(scope, 0) as connector:
        assert connector.get("stage_0", "stage_1", "req_3", {}) is None
        assert connector.get("stage_0", "stage_1", "req_3", {"unknown": "format"}) is None
