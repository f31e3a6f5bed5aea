"""vllm-omni's ``test_wire_types.py`` (and what its serializer carries) against the facade (issue 27).

Upstream's tensor-dict wire format: dicts of tensors of any dtype, shape,
stride, scalars and empty tensors round-trip; a corrupted header is
refused ("checksum"), so is a truncated payload. Its serializer (msgspec
with hooks) also carries dataclasses (as dicts), sets (as lists), enums
(by value) and vLLM's output types, rebuilds a ``RequestOutput`` from its
dict form, and a subclass's overridden ``serialize_obj`` /
``deserialize_obj`` is what put and get use. The seed's codec has its own
layout (`spec.layout`, the codec block: superseded ``OMDI`` magic) and
checks every frame's checksum; registered types win over what msgspec would
make of them. Each test names the upstream behaviour it mirrors.
"""

from __future__ import annotations

import dataclasses
import enum
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from typing import Any

import attrs
import msgspec
import numpy as np
import pytest
import torch

from shmring import CorruptFrameError, SharedMemoryConnector, register_type, unregister_type
from shmring.fault_injection.kit.processes import lock_holder
from shmring.impl import codec
from shmring.model_tests.conformance_kit import facade, file_of
from shmring.spec.layout import FRAME_KEY_OFFSET, RING_HEADER_LENGTH

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def edge(scope: str) -> Iterator[tuple[SharedMemoryConnector, SharedMemoryConnector]]:
    sender, receiver = facade(scope, 0, host_ring_bytes=1 << 20), facade(scope, 1)
    try:
        yield sender, receiver
    finally:
        sender.close()
        receiver.close()


def _send(edge: Any, key: str, value: Any) -> Any:
    sender, receiver = edge
    ok, _, metadata = sender.put("0", "1", key, value)
    assert ok, f"refused: {value!r}"
    return receiver.get("0", "1", key, metadata)[0]


# -- tensor dicts ----------------------------------------------------------------------


def test_tensor_dicts_round_trip(edge: Any) -> None:
    """test_tensor_dict_wire_format_round_trip, test_is_tensor_dict_requires_string_tensor_items."""
    payload = {
        "tokens": torch.arange(12, dtype=torch.int64).reshape(3, 4),
        "codes": torch.arange(8, dtype=torch.int32)[::2],
        "scores": torch.tensor([[1.25, 2.5]], dtype=torch.float32),
        "scalar": torch.tensor(7, dtype=torch.int64),
        "empty": torch.empty((0, 3), dtype=torch.float16),
        "bf16": torch.arange(4, dtype=torch.bfloat16),
    }
    restored = _send(edge, "tensors", payload)
    assert restored.keys() == payload.keys()
    for key, expected in payload.items():
        got = restored[key]
        assert got.dtype == expected.dtype and got.shape == expected.shape, key
        assert torch.equal(got, expected), key
    # Not a tensor dict: lists stay lists, int keys stay int keys.
    assert _send(edge, "not-tensors", {"tokens": [1, 2, 3], 1: torch.arange(2)})["tokens"] == [
        1,
        2,
        3,
    ]


def test_a_corrupted_payload_is_refused_and_removed(scope: str) -> None:
    """test_tensor_dict_wire_format_rejects_header_checksum_mismatch (the seed checksums every frame)."""
    with facade(scope, 0, host_ring_bytes=0) as sender, facade(scope, 1) as receiver:
        ok, _, metadata = sender.put("0", "1", "tokens", {"tokens": torch.arange(4)})
        path = file_of(metadata)
        where = RING_HEADER_LENGTH + FRAME_KEY_OFFSET + len("tokens") + 20  # in the payload
        with open(path, "r+b") as segment:  # flip a byte of the payload
            segment.seek(where)
            byte = segment.read(1)
            segment.seek(where)
            segment.write(bytes([byte[0] ^ 0xFF]))
        assert receiver.get("0", "1", "tokens", metadata) is None  # logged, answered None
        assert not os.path.exists(path) and receiver.health()["failed_gets"] == 1
        # The codec alone (no frame checksum around it) refuses a damaged header too.
        data = bytearray(codec.encode({"tokens": torch.arange(4)}))
        data[12] ^= 0xFF  # the msgpack header right after the framed prefix
        with pytest.raises(CorruptFrameError, match="msgpack header"):
            codec.decode(bytes(data))


def test_a_truncated_payload_is_refused() -> None:
    """test_tensor_dict_wire_format_rejects_truncated_payload."""
    encoded = SharedMemoryConnector.serialize_obj({"tokens": torch.arange(4, dtype=torch.int64)})
    with pytest.raises(CorruptFrameError):
        SharedMemoryConnector.deserialize_obj(encoded[:-1])


@pytest.mark.parametrize("ring_bytes", [1 << 16, 0], ids=["ring frame", "segment"])
def test_a_payload_that_does_not_decode_leaves_no_file_and_is_reported(
    scope: str, ring_bytes: int
) -> None:
    """Issue 27: consuming a payload that fails to decode removes every file of it, error reported."""
    image = pytest.importorskip("PIL.Image")
    with facade(scope, 0, host_ring_bytes=ring_bytes) as sender, facade(scope, 1) as receiver:
        ok, _, metadata = sender.put("0", "1", "img", {"image": image.new("L", (2, 2))})
        assert ok and ("host_ring" in metadata) == bool(ring_bytes)
        script = textwrap.dedent(
            f"""
            import sys
            sys.modules["PIL"] = None  # this receiver has no pillow
            from shmring import SharedMemoryConnector
            receiver = SharedMemoryConnector({{"stage_id": 1, "wakeup_scope": {sender.scope!r}}})
            print(receiver.get("0", "1", "img"), receiver.health()["failed_gets"])
            print(receiver.get("0", "1", "img"))
            receiver.close()
            """
        )
        result = subprocess.run(
            [sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=120
        )
        assert result.returncode == 0, result.stderr
        assert result.stdout.splitlines() == ["None 1", "None"]  # reported once, then gone
        assert "install pillow" in result.stderr
        assert receiver.get("0", "1", "img") is None  # consumed: not delivered to anyone
        if not ring_bytes:
            assert not os.path.exists(file_of(metadata))  # the segment went with it
        assert sender.put("0", "1", "next", 1)[0] and receiver.get("0", "1", "next")[0] == 1


# -- what vllm-omni's serializer carries ------------------------------------------------


@dataclasses.dataclass
class Step:
    index: int
    codes: Any


class Colour(enum.Enum):
    RED = "red"


class Level(enum.IntEnum):
    HIGH = 3


@attrs.define
class Window:
    start: int
    frames: Any


def test_dataclasses_sets_enums_and_attrs_classes_travel_as_msgspec_encodes_them(
    edge: Any,
) -> None:
    """Issue 27: payloads upstream carries (dataclasses, sets, frozensets, enums by value, mixes with tensors)."""
    frames = np.arange(6, dtype=np.float32).reshape(2, 3)
    payload = {
        "step": Step(1, torch.arange(3)),
        "tags": {3, 1, 2},
        "frozen": frozenset({"a"}),
        "colour": Colour.RED,
        "level": Level.HIGH,
        "window": Window(5, frames),
        "nested": [Step(2, {"deep": (Colour.RED, torch.ones(2))})],
    }
    got = _send(edge, "native", payload)
    assert got["step"]["index"] == 1 and torch.equal(got["step"]["codes"], torch.arange(3))
    assert sorted(got["tags"]) == [1, 2, 3] and got["frozen"] == ["a"]
    assert got["colour"] == "red" and got["level"] == 3
    assert got["window"]["start"] == 5 and np.array_equal(got["window"]["frames"], frames)
    nested = got["nested"][0]["codes"]["deep"]
    assert nested[0] == "red" and torch.equal(nested[1], torch.ones(2))
    # The wire is what msgspec makes of it, byte for byte, for a tree without leaves.
    plain = {"step": Step(1, [1]), "tags": {1}, "colour": Colour.RED}
    assert SharedMemoryConnector.serialize_obj(plain) == msgspec.msgpack.encode(plain)


@dataclasses.dataclass
class Output:
    index: int
    token_ids: Any


def test_a_registered_dataclass_comes_back_as_itself(edge: Any) -> None:
    """Issue 27, defect 1: registered types win over msgspec's native handling."""
    register_type(Output, lambda o: [o.index, o.token_ids], lambda s: Output(s[0], s[1]))
    try:
        got = _send(edge, "registered", {"outputs": [Output(0, np.arange(3)), Output(1, [4])]})
        assert [type(o) for o in got["outputs"]] == [Output, Output]
        assert np.array_equal(got["outputs"][0].token_ids, np.arange(3))
        assert got["outputs"][1] == Output(1, [4])
    finally:
        unregister_type(Output)


@pytest.mark.parametrize("which", ["enum", "attrs", "struct", "dict subclass"])
def test_registered_enums_attrs_structs_and_dict_subclasses_come_back_as_themselves(
    edge: Any, which: str
) -> None:
    """Issue 27, defect 1: "anything" (what msgspec would otherwise encode natively)."""

    class Params(msgspec.Struct):
        n: int

    class Record(dict):  # type: ignore[type-arg]
        pass

    cases: dict[str, tuple[type, Any, Any, Any]] = {
        "enum": (Colour, Colour.RED, lambda c: c.value, Colour),
        "attrs": (Window, Window(1, 2), lambda w: [w.start, w.frames], lambda s: Window(*s)),
        "struct": (Params, Params(3), lambda p: p.n, Params),
        "dict subclass": (Record, Record(a=1), dict, Record),
    }
    cls, value, encode, decode = cases[which]
    register_type(cls, encode, decode, name=f"conformance.{which}")
    try:
        got = _send(edge, f"registered {which}", {"value": value})["value"]
        assert type(got) is cls and got == value
    finally:
        unregister_type(cls)


def test_owned_arrays_are_writeable_and_borrowed_views_stay_read_only(scope: str) -> None:
    """Issue 27: arrays the receiver owns are writeable; borrowed ones stay read-only."""
    from shmring import Connector

    with Connector(scope) as sender, Connector(scope) as receiver:
        big = np.arange(1 << 15, dtype=np.float32)  # a large leaf: borrowed views hold it
        small = np.arange(4)
        sender.put("0", "1", "owned", {"big": big, "small": small})
        owned = receiver.get("0", "1", "owned").value
        assert owned["big"].flags.writeable and owned["small"].flags.writeable
        owned["big"][0] = -1  # the receiver's copy, nobody else's
        assert big[0] == 0
        sender.put("0", "1", "borrowed", {"big": big})
        with receiver.get("0", "1", "borrowed", borrow=True) as got:
            view = got.value["big"]
            assert not view.flags.writeable
            with pytest.raises(ValueError, match="read-only"):
                view[0] = 1
            del view


# -- vLLM's outputs ------------------------------------------------------------------------

_STAND_INS = textwrap.dedent(
    """
    import dataclasses, sys, types
    outputs = types.ModuleType("vllm.outputs")

    @dataclasses.dataclass
    class CompletionOutput:  # vLLM's is a dataclass
        index: int
        text: str
        token_ids: list
        cumulative_logprob: float | None
        logprobs: object
        finish_reason: str | None = None
        stop_reason: object = None

    class RequestOutput:  # vLLM's is not
        def __init__(self, request_id, prompt, prompt_token_ids, prompt_logprobs, outputs,
                     finished, **kwargs):
            self.request_id, self.prompt, self.prompt_token_ids = request_id, prompt, prompt_token_ids
            self.prompt_logprobs, self.outputs, self.finished = prompt_logprobs, outputs, finished

    CompletionOutput.__module__ = RequestOutput.__module__ = "vllm.outputs"
    outputs.CompletionOutput, outputs.RequestOutput = CompletionOutput, RequestOutput
    vllm = types.ModuleType("vllm")
    vllm.outputs = outputs
    sys.modules["vllm"], sys.modules["vllm.outputs"] = vllm, outputs
    """
)


def test_request_outputs_come_back_as_themselves_from_objects_and_from_dicts(scope: str) -> None:
    """test_shm_ring.py::test_tensor_frames_preserve_shared_output_reconstruction (issue 27, defect 4).

    With ``vllm.outputs`` importable (stand-ins of vLLM's classes, its
    CompletionOutput a dataclass as vLLM's is): a RequestOutput sent as an
    object, or as vllm-omni's dict form of one, comes back a RequestOutput
    holding CompletionOutputs, ``multimodal_output`` tensors kept. Without
    vllm (this process) the dict form stays a dict: nothing to build from.
    """
    script = _STAND_INS + textwrap.dedent(
        f"""
        import dataclasses, torch
        from shmring import SharedMemoryConnector
        connector = SharedMemoryConnector({{"stage_id": 0, "wakeup_scope": {scope!r}}})
        completion = outputs.CompletionOutput(0, "", [1], 0.0, None)
        completion.multimodal_output = {{"codes": torch.arange(28)}}
        sent = outputs.RequestOutput("object", None, [1], None, [completion], False)
        as_dict = dataclasses.asdict(outputs.CompletionOutput(0, "", [1], 0.0, None))
        as_dict["multimodal_output"] = {{"codes": torch.arange(28)}}
        shaped = {{"request_id": "dict", "prompt": None, "prompt_token_ids": [1],
                   "prompt_logprobs": None, "outputs": [as_dict], "finished": False}}
        try:
            for key, value in (("object", sent), ("dict", shaped)):
                ok, _, metadata = connector.put("0", "1", key, value)
                got = connector.get("0", "1", key, metadata)[0]
                assert type(got) is outputs.RequestOutput, (key, type(got))
                assert type(got.outputs[0]) is outputs.CompletionOutput, (key, got.outputs)
                assert torch.equal(got.outputs[0].multimodal_output["codes"], torch.arange(28)), key
                assert got.request_id == key and got.prompt_token_ids == [1]
        finally:
            connector.close()
        print("rebuilt")
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "rebuilt"
    with facade(scope, 0) as connector:
        shaped = {
            "request_id": "r",
            "prompt": None,
            "prompt_token_ids": [1],
            "outputs": [],
            "finished": True,
        }
        connector.put("0", "1", "dict", shaped)
        try:
            import vllm.outputs  # type: ignore[import-not-found]  # noqa: F401
        except ImportError:
            assert connector.get("0", "1", "dict")[0] == shaped  # no vllm here: stays a dict


# -- serialize_obj / deserialize_obj overridden -------------------------------------------------


class Tagged(SharedMemoryConnector):
    """A subclass that frames payloads its own way, as vllm-omni's connectors may."""

    @staticmethod
    def serialize_obj(obj: Any) -> bytes:
        return b"TAG:" + SharedMemoryConnector.serialize_obj(obj)

    @staticmethod
    def deserialize_obj(data: bytes | memoryview) -> Any:
        data = bytes(data)
        assert data.startswith(b"TAG:"), data[:8]
        return {"unwrapped": SharedMemoryConnector.deserialize_obj(data[4:])}


class Wrapping(SharedMemoryConnector):
    """A subclass that only post-processes what it receives."""

    @staticmethod
    def deserialize_obj(data: bytes | memoryview) -> Any:
        return {"wrapped": SharedMemoryConnector.deserialize_obj(data)}


def test_put_and_get_go_through_overridden_serializers(scope: str) -> None:
    """Issue 27: get through an overridden deserialize_obj, put through serialize_obj."""
    with (
        Tagged({"stage_id": 0, "wakeup_scope": scope}) as sender,
        Tagged({"stage_id": 1, "wakeup_scope": scope}) as receiver,
    ):
        ok, size, metadata = sender.put("0", "1", "k", {"v": torch.arange(3)})
        got, got_size = receiver.get("0", "1", "k", metadata)
        assert torch.equal(got["unwrapped"]["v"], torch.arange(3)) and got_size == size
        with facade(scope, 1) as plain:
            # A plain receiver's deserialize_obj cannot read the override's bytes (as in
            # vllm-omni): None, logged; the payload was consumed.
            sender.put("0", "1", "k2", 1)
            assert plain.get("0", "1", "k2") is None and plain.health()["failed_gets"] == 1


def test_an_overridden_deserialize_obj_reads_a_plain_senders_bytes(scope: str) -> None:
    """Issue 27: the override gets the bytes the sender's serialize_obj made (the codec's)."""
    with facade(scope, 0) as sender, Wrapping({"stage_id": 1, "wakeup_scope": scope}) as receiver:
        ok, size, metadata = sender.put("0", "1", "k", {"v": [1, 2]})
        assert receiver.get("0", "1", "k", metadata) == ({"wrapped": {"v": [1, 2]}}, size)
        sender.put("0", "1", "t", torch.arange(4))
        got, _ = receiver.get("0", "1", "t")
        assert torch.equal(got["wrapped"], torch.arange(4))


def test_a_locked_frame_answers_none_at_once_through_the_override(scope: str) -> None:
    """Overrides change nothing about locks: a frame another process holds answers None."""
    with (
        Tagged({"stage_id": 0, "wakeup_scope": scope}) as sender,
        Tagged({"stage_id": 1, "wakeup_scope": scope}) as receiver,
    ):
        ok, _, metadata = sender.put("0", "1", "held", 1)
        with lock_holder(file_of(metadata)):
            assert receiver.get("0", "1", "held", metadata) is None
        assert receiver.get("0", "1", "held", metadata)[0] == {"unwrapped": 1}
