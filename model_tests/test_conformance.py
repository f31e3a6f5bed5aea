"""The facade driven the way a vllm-omni pipeline and its connector tests drive theirs (issue 10).

Each test uses `shmring.SharedMemoryConnector` only through vllm-omni's call
shapes: a config dict, ``put`` -> ``(ok, size, metadata)``, ``get`` ->
``(obj, size)`` or None, files found through the metadata's ``"name"``
under ``/dev/shm``, locks taken on those files by another process, objects
made with ``serialize_obj`` / ``deserialize_obj``. Regression tests name
the issue they came from.
"""

from __future__ import annotations

import gc
import math
import os
import re
import subprocess
import sys
import textwrap
import threading
import time
import warnings
from collections.abc import Iterator
from typing import Any

import msgspec
import numpy as np
import pytest

from shmring import (
    ConfigurationError,
    Connector,
    InvalidKeyError,
    SharedMemoryConnector,
    UnsupportedPayloadError,
    register_type,
    unregister_type,
)
from shmring.fault_injection.kit.processes import lock_holder, watchdog
from shmring.impl import codec, extensions
from shmring.impl.names import DEFAULT_SHM_ROOT, deployment_directory

SHM_ROOT = DEFAULT_SHM_ROOT  # vllm-omni's tests look for files under /dev/shm
RING_BYTES = 64 * 1024  # frames up to 16 KiB ride the ring
LARGE = b"L" * (RING_BYTES // 2)  # not admitted: a per-key segment carries it


def make(scope: str, stage: int = 0, **extra: Any) -> SharedMemoryConnector:
    return SharedMemoryConnector(
        {
            "stage_id": stage,
            "extra": {"wakeup_scope": scope, "host_ring_bytes": RING_BYTES, **extra},
        }
    )


@pytest.fixture
def pipeline(scope: str) -> Iterator[tuple[SharedMemoryConnector, SharedMemoryConnector]]:
    """Stage 0 sends, stage 1 receives."""
    sender, receiver = make(scope, 0), make(scope, 1)
    try:
        yield sender, receiver
    finally:
        sender.close()
        receiver.close()
    assert not os.path.exists(sender.connector.directory)


def _file_of(metadata: dict[str, Any]) -> str:
    handle = metadata.get("host_ring") or metadata["shm"]
    return os.path.join(SHM_ROOT, handle["name"])


def _mapped(path: str) -> bool:
    with open("/proc/self/maps") as maps:
        return any(path in line for line in maps)


# -- descriptor names ------------------------------------------------------------------


def test_descriptor_names_are_files_under_the_shm_root(scope: str) -> None:
    # The seed's per-key segment, as vllm-omni sees it: with the pool (issue 13,
    # the default) "shm" names the ring file carrying the reference instead
    # (test_compat.py::test_large_payloads_answer_shm_metadata).
    sender, receiver = make(scope, 0, pool_budget_bytes=0), make(scope, 1)
    try:
        _check_descriptor_names(sender, receiver)
    finally:
        sender.close()
        receiver.close()


def _check_descriptor_names(sender: SharedMemoryConnector, receiver: SharedMemoryConnector) -> None:
    ok, size, small = sender.put(0, 1, "req_0", {"x": 1})
    assert ok and size == small["size"] > 0
    ok, _, large = sender.put(0, 1, "req_1", LARGE)
    assert ok and set(small) == {"host_ring", "size"} and set(large) == {"shm", "size"}
    ring_file, segment_file = _file_of(small), _file_of(large)
    assert os.path.isfile(ring_file) and os.path.isfile(segment_file)
    assert os.path.dirname(ring_file) == sender.connector.directory
    for handle in (small["host_ring"], large["shm"]):  # the fields a descriptor always had
        assert {"producer", "source", "destination", "key", "size"} <= set(handle)
    assert receiver.get(0, 1, "req_1", large) == (LARGE, large["size"])
    assert not os.path.exists(segment_file)  # consumed: the segment is gone, as in vllm-omni
    assert receiver.get(0, 1, "req_0", {"req_0": small}) == ({"x": 1}, small["size"])


# -- locks held by another process -----------------------------------------------------


def test_a_frame_locked_by_another_process_answers_none_at_once(pipeline: Any) -> None:
    """get_with_deadline never spends its deadline on another process's lock (issue 10)."""
    sender, receiver = pipeline
    ok, _, metadata = sender.put(0, 1, "locked", b"payload")
    assert ok and "host_ring" in metadata
    with watchdog(60), lock_holder(_file_of(metadata)):
        far = time.monotonic() + 3600  # waiting for it would trip the watchdog
        assert receiver.get_with_deadline(0, 1, "locked", metadata, deadline=far) is None
        assert receiver.get_with_deadline(0, 1, "locked", deadline=far) is None
        assert receiver.get(0, 1, "locked") is None
        assert receiver.connector.health().busy >= 3
    got = receiver.get_with_deadline(0, 1, "locked", metadata, deadline=time.monotonic() + 30)
    assert got == (b"payload", metadata["size"])


def test_a_locked_segment_answers_none_until_released(pipeline: Any) -> None:
    sender, receiver = pipeline
    ok, _, metadata = sender.put(0, 1, "big", LARGE)
    assert ok and "shm" in metadata
    with watchdog(60), lock_holder(_file_of(metadata)):
        far = time.monotonic() + 3600
        assert receiver.get_with_deadline(0, 1, "big", metadata, deadline=far) is None
    assert receiver.get(0, 1, "big", metadata) == (LARGE, metadata["size"])


def test_an_absent_key_is_waited_for_until_the_deadline(pipeline: Any) -> None:
    sender, receiver = pipeline
    deadline = time.monotonic() + 0.2
    assert receiver.get_with_deadline(0, 1, "never", deadline=deadline) is None
    assert time.monotonic() >= deadline  # it waited, it did not give up early
    assert receiver.get_with_deadline(0, 1, "never", deadline=time.monotonic() - 1) is None

    def late_put() -> None:
        time.sleep(0.05)
        sender.put(0, 1, "late", [1, 2])

    thread = threading.Thread(target=late_put)
    with watchdog(60):
        thread.start()
        got = receiver.get_with_deadline(0, 1, "late", deadline=time.monotonic() + 30)
        thread.join()
    assert got is not None and got[0] == [1, 2]


# -- producers: connectors, not processes ------------------------------------------------


def test_two_connectors_in_one_process_both_publish_on_their_own_ring(scope: str) -> None:
    """Issue 10: the second connector of a process on an edge used to fall back for good."""
    first, second, receiver = make(scope), make(scope), make(scope, 1)
    try:
        _, _, a = first.put(0, 1, "a", b"from first")
        _, _, b = second.put(0, 1, "b", b"from second")
        assert "host_ring" in a and "host_ring" in b, (a, b)
        assert a["host_ring"]["name"] != b["host_ring"]["name"]
        assert os.path.isfile(_file_of(a)) and os.path.isfile(_file_of(b))
        assert not first.connector.failed_edges() and not second.connector.failed_edges()
        assert a["host_ring"]["producer"][:2] == b["host_ring"]["producer"][:2]
        assert receiver.get(0, 1, "b")[0] == b"from second"
        assert receiver.get(0, 1, "a", a)[0] == b"from first"
        first.close()  # closes on its own; the other keeps publishing
        assert not os.path.exists(_file_of(a)) and os.path.isfile(_file_of(b))
        _, _, c = second.put(0, 1, "c", b"still here")
        assert "host_ring" in c and receiver.get(0, 1, "c")[0] == b"still here"
        many = [make(scope) for _ in range(5)]  # any number per process
        try:
            names = {m.put(0, 1, f"m{i}", i)[2]["host_ring"]["name"] for i, m in enumerate(many)}
            assert len(names) == 5
            assert sorted(receiver.get(0, 1, f"m{i}")[0] for i in range(5)) == list(range(5))
        finally:
            for m in many:
                m.close()
    finally:
        first.close()
        second.close()
        receiver.close()


def test_a_closed_producers_ring_is_unmapped_at_the_next_get(scope: str) -> None:
    """Issue 10's repro: the receiver kept the ring of a closed producer mapped."""
    sender, receiver = make(scope, 0), make(scope, 1)
    try:
        _, _, metadata = sender.put(0, 1, "k", 1)
        assert receiver.get(0, 1, "k") == (1, metadata["size"])
        ring_file = _file_of(metadata)
        assert _mapped(ring_file)
        sender.close()
        assert receiver.get(0, 1, "x") is None
        assert not _mapped(ring_file), "a closed producer's ring is still mapped"
        assert (
            not receiver.connector._ring_route.readers
        )  # fd and cache entry went with the mapping
    finally:
        sender.close()
        receiver.close()


# -- the rest of OmniConnectorBase --------------------------------------------------------


def test_base_class_methods_behave_like_vllm_omnis(pipeline: Any) -> None:
    sender, receiver = pipeline
    assert SharedMemoryConnector.supports_raw_data is False
    assert sender.cleanup("nothing there") is False
    sender.put(0, 1, "gone", b"x")
    assert sender.cleanup("gone") is True and receiver.get(0, 1, "gone") is None
    sender.put(0, 1, "big", LARGE)
    assert receiver.get(0, 1, "big") is not None
    assert sender.connector.fallback_bytes() == 0  # claimed by the receiver
    assert sender.reap_consumed() is None
    assert receiver.abandon_get("big") is None and receiver.get(0, 1, "big") is None
    assert sender.health()["status"] == "healthy"
    assert {"puts", "gets", "bytes_transferred"} <= set(sender.health())


def test_serialize_obj_round_trips_exactly() -> None:
    tree = {"a": [1, 2.5, None, True], "b": b"\x00raw", "t": (1, "x"), "n": np.arange(4)}
    data = SharedMemoryConnector.serialize_obj(tree)
    assert isinstance(data, bytes)
    back = SharedMemoryConnector.deserialize_obj(data)
    assert back["a"] == tree["a"] and back["b"] == tree["b"] and back["t"] == [1, "x"]
    assert (back["n"] == tree["n"]).all()
    assert SharedMemoryConnector.serialize_obj(back) == data  # a fixed point


def test_context_manager_and_garbage_collection_close_it(scope: str) -> None:
    with make(scope) as connector:
        _, _, metadata = connector.put(0, 1, "k", b"v")
        ring_file = _file_of(metadata)
    assert connector.connector.closed and not os.path.exists(ring_file)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a ResourceWarning would fail here
        dropped = make(scope)
        _, _, metadata = dropped.put(0, 1, "k", b"v")
        directory = dropped.connector.directory
        del dropped
        gc.collect()
    assert not os.path.exists(_file_of(metadata)) and not os.path.exists(directory)


# -- payloads vllm-omni's serializer carries ------------------------------------------------


def test_pil_images_arrive_with_mode_size_and_pixels(pipeline: Any) -> None:
    image_module = pytest.importorskip("PIL.Image")  # a dev dependency: present in CI
    sender, receiver = pipeline
    rgb = image_module.new("RGB", (7, 5), (10, 20, 30))
    rgb.putpixel((3, 2), (1, 2, 3))
    gray16 = image_module.new("I;16", (4, 3), 40000)
    palette = image_module.new("P", (2, 2))
    palette.putpalette([0, 0, 0, 255, 0, 0])
    palette.putpixel((1, 0), 1)
    for key, image in (("rgb", rgb), ("gray16", gray16), ("palette", palette)):
        ok, _, metadata = sender.put(0, 1, key, {"image": image})
        assert ok, key
        got, _ = receiver.get(0, 1, key, metadata)
        back = got["image"]
        assert isinstance(back, image_module.Image)
        assert (back.mode, back.size, back.tobytes()) == (image.mode, image.size, image.tobytes())
    assert back.getpalette()[:6] == [0, 0, 0, 255, 0, 0]


def test_without_pillow_an_image_frame_is_a_clear_error() -> None:
    image_module = pytest.importorskip("PIL.Image")
    frame = codec.encode(image_module.new("L", (2, 2)))
    script = textwrap.dedent(
        """
        import sys
        sys.modules["PIL"] = None  # pillow is not installed
        from shmring import UnsupportedPayloadError
        from shmring.impl import codec
        try:
            codec.decode(bytes.fromhex(sys.stdin.read()))
        except UnsupportedPayloadError as error:
            print("refused:", error)
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], input=frame.hex(), capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    assert "refused:" in result.stdout and "install pillow" in result.stdout


def test_slices_arrive_as_start_stop_step(pipeline: Any) -> None:
    sender, receiver = pipeline
    _, _, metadata = sender.put(0, 1, "s", {"window": slice(2, None, 3), "all": [slice(5)]})
    assert receiver.get(0, 1, "s", metadata)[0] == {
        "window": [2, None, 3],
        "all": [[None, 5, None]],
    }


@pytest.mark.parametrize("dtype", codec.NUMPY_DTYPE_NAMES)
def test_strided_and_negative_stride_arrays_arrive_equal_and_writeable(
    pipeline: Any, dtype: str
) -> None:
    """Owned arrays are the receiver's: writeable (issue 27; issue 10 had them read-only)."""
    sender, receiver = pipeline
    base = (np.arange(60) % 2 if dtype == "bool" else np.arange(60)).astype(dtype).reshape(6, 10)
    views = {"strided": base[:, ::3], "negative": base[::-1, ::-2], "transposed": base.T}
    _, _, metadata = sender.put(0, 1, f"arrays-{dtype}", views)
    got, _ = receiver.get(0, 1, f"arrays-{dtype}", metadata)
    for name, view in views.items():
        assert got[name].dtype == view.dtype and np.array_equal(got[name], view), name
        assert got[name].flags.writeable
        got[name][...] = (
            0  # writing the receiver's copy touches neither the sender's nor the others
        )
        assert np.array_equal(view, views[name]) and not got[name].any()


class Sampling(msgspec.Struct, omit_defaults=True):
    temperature: float = 1.0
    stop: list[str] = []
    seed: int | None = None


def test_structs_with_omit_defaults_keep_defaults_omitted(pipeline: Any) -> None:
    sender, receiver = pipeline
    _, _, metadata = sender.put(0, 1, "p", {"params": Sampling(seed=7), "raw": b"\x01"})
    got, _ = receiver.get(0, 1, "p", metadata)
    assert got == {"params": {"seed": 7}, "raw": b"\x01"}  # the defaults stayed omitted
    data = SharedMemoryConnector.serialize_obj(Sampling(temperature=0.5))
    assert codec.decode(data, type=Sampling) == Sampling(temperature=0.5)


def test_bytes_travel_anywhere_in_a_tree(pipeline: Any) -> None:
    sender, receiver = pipeline
    tree = {b"key": [b"", {"deep": (b"\xff" * 70000, np.ones(3))}], "b": bytearray(b"ba")}
    _, _, metadata = sender.put(0, 1, "bytes", tree)
    got, _ = receiver.get(0, 1, "bytes", metadata)
    assert got[b"key"][0] == b"" and got[b"key"][1]["deep"][0] == b"\xff" * 70000
    assert got["b"] == b"ba" and np.array_equal(got[b"key"][1]["deep"][1], np.ones(3))


# -- the extension registry ----------------------------------------------------------------


class Completion:
    def __init__(self, index: int, text: str, token_ids: Any) -> None:
        self.index, self.text, self.token_ids = index, text, token_ids


class Unregistered:
    pass


@pytest.fixture
def completion_type() -> Iterator[None]:
    register_type(
        Completion,
        lambda c: {"index": c.index, "text": c.text, "token_ids": c.token_ids},
        lambda s: Completion(s["index"], s["text"], s["token_ids"]),
    )
    try:
        yield
    finally:
        unregister_type(Completion)


def test_registered_types_come_back_as_themselves(pipeline: Any, completion_type: None) -> None:
    sender, receiver = pipeline
    outputs = [Completion(i, f"t{i}", np.arange(i, dtype=np.int64)) for i in range(3)]
    ok, _, metadata = sender.put(0, 1, "out", {"outputs": outputs})
    assert ok
    got, _ = receiver.get(0, 1, "out", metadata)
    for sent, back in zip(outputs, got["outputs"], strict=True):
        assert type(back) is Completion and (back.index, back.text) == (sent.index, sent.text)
        assert np.array_equal(back.token_ids, sent.token_ids)
    assert any(c.cls is Completion for c in extensions.registered_types())


def test_unregistered_objects_are_refused_and_the_connector_goes_on(pipeline: Any) -> None:
    sender, receiver = pipeline
    with pytest.raises(UnsupportedPayloadError, match="Unregistered"):
        SharedMemoryConnector.serialize_obj({"x": Unregistered()})
    assert sender.put(0, 1, "bad", Unregistered()) == (False, 0, None)
    assert sender.health()["failed_puts"] == 1
    assert sender.put(0, 1, "good", 1)[0] and receiver.get(0, 1, "good")[0] == 1


def test_a_frame_of_a_type_the_receiver_does_not_know_is_a_typed_error(
    completion_type: None,
) -> None:
    frame = codec.encode(Completion(1, "x", []))
    unregister_type(Completion)
    with pytest.raises(Exception, match="unregistered type") as caught:
        codec.decode(frame)
    assert type(caught.value).__name__ == "CorruptFrameError"


def test_vllm_output_types_register_themselves_when_vllm_imports() -> None:
    """The facade's registration path, with stand-in vllm.outputs injected via sys.modules."""
    script = textwrap.dedent(
        """
        import sys, types
        outputs = types.ModuleType("vllm.outputs")

        class CompletionOutput:
            def __init__(self, index, text, token_ids):
                self.index, self.text, self.token_ids = index, text, token_ids

        class RequestOutput:
            def __init__(self, request_id, outputs, finished):
                self.request_id, self.outputs, self.finished = request_id, outputs, finished

        CompletionOutput.__module__ = RequestOutput.__module__ = "vllm.outputs"
        outputs.CompletionOutput, outputs.RequestOutput = CompletionOutput, RequestOutput
        vllm = types.ModuleType("vllm")
        vllm.outputs = outputs
        sys.modules["vllm"], sys.modules["vllm.outputs"] = vllm, outputs

        import shmring.impl.compat  # registers them at import
        from shmring.impl import extensions

        names = sorted(c.name for c in extensions.registered_types() if c.name.startswith("vllm."))
        assert names == ["vllm.outputs.CompletionOutput", "vllm.outputs.RequestOutput"], names
        sent = RequestOutput("r1", [CompletionOutput(0, "hi", [1, 2])], True)
        back = shmring.impl.compat.SharedMemoryConnector.deserialize_obj(
            shmring.impl.compat.SharedMemoryConnector.serialize_obj(sent)
        )
        assert type(back) is RequestOutput and back.request_id == "r1" and back.finished
        assert type(back.outputs[0]) is CompletionOutput and back.outputs[0].token_ids == [1, 2]
        print("registered", *names)
        """
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "registered vllm.outputs.CompletionOutput vllm.outputs.RequestOutput" in result.stdout
    # Here vllm is not installed: nothing is registered, and that is the only reason.
    try:
        import vllm.outputs  # type: ignore[import-not-found]  # noqa: F401
    except ImportError:
        assert extensions.register_vllm_types() == []
    else:
        assert len(extensions.register_vllm_types()) == 2


# -- input hygiene: a typed error, nothing left behind, the connector keeps working ----------


def test_a_lone_surrogate_key_is_an_invalid_key(pipeline: Any) -> None:
    sender, receiver = pipeline
    for call in (
        lambda: sender.put(0, 1, "\ud800", b"x"),
        lambda: receiver.get(0, 1, "\ud800"),
        lambda: receiver.get_with_deadline(0, 1, "a\udfff", deadline=time.monotonic() + 1),
        lambda: sender.cleanup("\ud800"),
    ):
        with pytest.raises(InvalidKeyError, match="UTF-8"):
            call()
    assert sender.put(0, 1, "ok", 1)[0] and receiver.get(0, 1, "ok")[0] == 1


def test_an_unhashable_stage_id_is_a_typed_error_naming_the_argument(pipeline: Any) -> None:
    sender, receiver = pipeline
    with pytest.raises(InvalidKeyError, match="from_stage"):
        sender.put(["a"], "b", "k", 1)
    with pytest.raises(InvalidKeyError, match="to_stage"):
        receiver.get("a", {"b": 1}, "k")
    assert sender.put(0, 1, "ok", 1)[0] and receiver.get(0, 1, "ok")[0] == 1


def test_a_missing_or_non_directory_shm_root_is_refused_at_construction(
    scope: str, tmp_path: Any
) -> None:
    not_a_directory = tmp_path / "file"
    not_a_directory.write_bytes(b"")
    for root, what in ((tmp_path / "missing", "does not exist"), (not_a_directory, "not a dir")):
        with pytest.raises(ConfigurationError, match=what):
            Connector(scope, shm_root=str(root))
        with pytest.raises(ConfigurationError, match=what):
            SharedMemoryConnector({"wakeup_scope": scope, "shm_root": str(root)})


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("spin_seconds", math.inf, "spin_seconds must be at most"),
        ("spin_seconds", 3600.0, "spin_seconds must be at most"),
        ("max_sleep_seconds", math.inf, "max_sleep_seconds must be at most"),
        ("fallback_budget", 2**200, "at most 2\\*\\*63 - 1 bytes"),
    ],
)
def test_unbounded_settings_are_refused_with_a_clear_message(
    scope: str, option: str, value: Any, message: str
) -> None:
    with pytest.raises(ConfigurationError, match=message):
        Connector(scope, **{option: value})


def test_the_facade_bounds_the_fallback_budget_too(scope: str) -> None:
    with pytest.raises(ConfigurationError, match="fallback budget"):
        SharedMemoryConnector({"wakeup_scope": scope, "fallback_budget_bytes": 2**200})


def test_an_open_deployment_directory_fails_the_facade_at_construction(scope: str) -> None:
    directory = deployment_directory(scope)
    os.mkdir(directory, 0o700)
    os.chmod(directory, 0o755)  # open to others: not ours to trust
    try:
        with pytest.raises(ConfigurationError, match="remedy"):
            SharedMemoryConnector({"wakeup_scope": scope})
        assert os.listdir(directory) == []  # nothing was made in it
    finally:
        os.rmdir(directory)
    with make(scope) as fine:  # the same scope works once the directory is fixed
        assert fine.put(0, 1, "k", 1)[0]


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make a directory of another uid")
def test_a_squatted_deployment_directory_fails_the_facade_at_construction(scope: str) -> None:
    directory = deployment_directory(scope)
    os.mkdir(directory, 0o700)
    os.chown(directory, 12345, 12345)  # squatted by another uid
    try:
        with pytest.raises(ConfigurationError, match="owned by uid=12345.*remedy"):
            SharedMemoryConnector({"wakeup_scope": scope})
    finally:
        os.rmdir(directory)


# -- the README's examples ---------------------------------------------------------------


def test_the_readme_examples_run(scope: str) -> None:
    readme = os.path.join(os.path.dirname(os.path.dirname(__file__)), "README.md")
    if not os.path.exists(readme):  # an installed copy without the repository
        readme = os.path.join(os.getcwd(), "README.md")
    with open(readme) as handle:
        blocks = re.findall(r"```python\n(.*?)```", handle.read(), re.S)
    assert len(blocks) >= 2
    for block in blocks:
        code = textwrap.dedent(block).replace('"demo"', repr(scope))
        exec(compile(code, "README.md", "exec"), {})


def test_a_receive_loop_sleeps_on_the_wakeup_generation(pipeline: Any) -> None:
    """vllm-omni's receive loop: snapshot the generation, poll, wait for a change."""
    sender, receiver = pipeline
    generation = receiver.get_wakeup_generation()
    assert generation is not None  # futexes are available on Linux
    assert receiver.get(0, 1, "next") is None
    assert receiver.wait_for_change(generation, timeout=0.01) is False  # nothing happened
    sender.put(0, 1, "next", 5)
    with watchdog(60):
        assert receiver.wait_for_change(generation, timeout=30) is True
    assert receiver.get(0, 1, "next")[0] == 5
    assert SharedMemoryConnector._make_key("req", "0", "1") == "req@0_1"
