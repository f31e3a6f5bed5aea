"""In-process tests of code that other tests reach only in a child process (issue 29).

mutmut's stats run records which tests reach a function in the test's own
process; what runs only in a forked child or a subprocess (the fork release,
vllm-omni's output reconstruction, `shmring stat`'s scope walk) counted as
reached by no test, so its mutants (404 of 14,738 on 2026-12-03) could never
be killed, whatever the child's test asserted. Each test here reaches such
code in the test's process and checks its effect; the child-process tests
stay, for what only a real fork or a fresh interpreter shows.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from shmring import cli
from shmring.impl import admin, extensions, lifecycle, liveness_file
from shmring.impl.connector import Connector, GetStatus
from shmring.impl.directory import as_directory
from shmring.impl.errors import ForkedError
from shmring.impl.names import deployment_directory
from shmring.impl.os_seam import DEFAULT_OS
from shmring.impl.ring.producer import RingChannel
from shmring.impl.ring.reader import RingReader
from shmring.spec.ring import ConsumeMode

EDGE = ("a", "b")

# -- the fork release, run on a connector marked inherited in this process ----------------


def _mapped(directory: str) -> int:
    with open("/proc/self/maps") as maps:
        return sum(directory in line for line in maps)


def _held(directory: str) -> int:
    """Descriptors of the deployment this process holds, less its own liveness file.

    The liveness file (``live.<pid>.<start>``) is the process's, not a
    connector's: a forked child closes its copy at the fork
    (`liveness_file`), and here this process is its real owner.
    """
    names = (os.path.realpath(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd"))
    return sum(
        name.startswith(directory) and not os.path.basename(name).startswith("live.")
        for name in names
    )


def test_an_inherited_connector_s_close_releases_its_mappings_and_descriptors_only(
    scope: str,
) -> None:
    """What the fork hook and `close()` of a forked child's copy do, step by step, here.

    `_snapshot_fds` records this process's descriptors as the fork would;
    `_forked_in_child` marks the connector inherited; its close then
    releases (`release_inherited`) and touches no file: everything the
    connector made is still there afterwards, and this test removes it.
    """
    directory = os.path.realpath(deployment_directory(scope))
    connector = Connector(scope, ring_capacity=64 * 1024)
    try:
        connector.put(EDGE, "small", {"v": 1})
        connector.put(EDGE, "large", {"v": b"x" * 300_000})  # a pool slot: a ctypes mapping
        with Connector(scope) as receiver:
            assert receiver.get(EDGE, "large").value == {"v": b"x" * 300_000}
        files = sorted(os.listdir(directory))
        assert _mapped(directory) > 0 and _held(directory) > 0
        lifecycle._snapshot_fds()
        connector._forked_in_child()
        with pytest.raises(ForkedError):
            connector.put(EDGE, "k", 1)
        assert connector.close() == 0
        assert _mapped(directory) == 0  # every ring, stamp and slot mapping released
        assert _held(directory) == 0  # and every descriptor
        assert sorted(os.listdir(directory)) == files  # no file touched
        assert lifecycle.release_inherited(connector) == (0, 0)  # nothing twice
    finally:
        lifecycle._inherited_fds.clear()
        if os.path.isdir(directory):
            liveness_file.release_liveness_file(as_directory(directory), DEFAULT_OS)
        shutil.rmtree(directory, ignore_errors=True)


def test_a_descriptor_reused_since_the_fork_is_never_closed_as_inherited(
    tmp_path: Path,
) -> None:
    """An attribute naming a number that now names another file keeps it open."""

    class Holder:
        __module__ = "shmring.test_holder"  # one of ours, for the walk

        def __init__(self, fd: int) -> None:
            self.fd = fd
            self.other_fd = -1
            self.name = "not a descriptor"

    first = os.open(tmp_path / "first", os.O_CREAT | os.O_RDWR)
    holder = Holder(first)
    try:
        lifecycle._snapshot_fds()
        os.close(first)
        reused = os.open(tmp_path / "second", os.O_CREAT | os.O_RDWR)  # the same number again
        assert reused == first
        assert lifecycle.release_inherited({"held": [holder]}) == (0, 0)
        os.fstat(reused)  # still open
        assert holder.fd == first  # left as it was
        os.close(reused)
        inherited = os.open(tmp_path / "third", os.O_CREAT | os.O_RDWR)
        holder.fd = inherited
        lifecycle._snapshot_fds()
        assert lifecycle.release_inherited((holder,)) == (0, 1)
        after = os.open(tmp_path / "fourth", os.O_CREAT | os.O_RDWR)  # opened after the "fork"
        holder.other_fd = after
        assert lifecycle.release_inherited([holder]) == (0, 0)
        os.close(after)  # still open: it was never inherited
        assert holder.fd == -1
        with pytest.raises(OSError):
            os.fstat(inherited)
    finally:
        lifecycle._inherited_fds.clear()


def test_the_walk_stays_inside_our_objects() -> None:
    """A mapping reachable only through a foreign object is not ours to close."""
    import mmap

    class Foreign:
        __module__ = "elsewhere"  # not ours wherever this file is imported from

        def __init__(self, mapping: mmap.mmap) -> None:
            self.mapping = mapping

    ours_mapping, foreign_mapping = mmap.mmap(-1, 4096), mmap.mmap(-1, 4096)
    try:
        assert lifecycle.release_inherited(
            {"ours": [ours_mapping], "foreign": Foreign(foreign_mapping)}
        ) == (1, 0)
        assert ours_mapping.closed and not foreign_mapping.closed
    finally:
        foreign_mapping.close()


# -- vllm-omni's output reconstruction, with stand-in classes -------------------------------


@dataclasses.dataclass
class _Completion:
    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None = None


class _Request:
    def __init__(
        self,
        request_id: str,
        prompt: str,
        prompt_token_ids: list[int],
        outputs: Any,
        finished: bool,
    ) -> None:
        self.request_id = request_id
        self.prompt = prompt
        self.prompt_token_ids = prompt_token_ids
        self.outputs = outputs
        self.finished = finished


class _Refusing:
    def __init__(self, **kwargs: Any) -> None:
        raise TypeError("takes nothing this way")


@pytest.fixture
def vllm_outputs(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    """A stand-in ``vllm.outputs`` module (vLLM is not a dependency)."""
    outputs = types.ModuleType("vllm.outputs")
    outputs.RequestOutput = _Request  # type: ignore[attr-defined]
    outputs.CompletionOutput = _Completion  # type: ignore[attr-defined]
    vllm = types.ModuleType("vllm")
    vllm.outputs = outputs  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    monkeypatch.setitem(sys.modules, "vllm.outputs", outputs)
    return outputs


def _request_dict(**extra: Any) -> dict[str, Any]:
    return {
        "request_id": "r1",
        "prompt": "hi",
        "prompt_token_ids": [1, 2],
        "outputs": [{"index": 0, "text": "yo", "token_ids": [3], "finish_reason": "stop"}],
        "finished": True,
        **extra,
    }


def test_dicts_shaped_like_vllm_outputs_come_back_as_them_bottom_up(
    vllm_outputs: types.ModuleType,
) -> None:
    tree = {"batch": [_request_dict(multimodal_output={"image": b"px"})], "n": 1}
    back = extensions.restore_vllm_outputs(tree)
    (request,) = back["batch"]
    assert type(request) is _Request and request.request_id == "r1" and request.finished
    assert request.multimodal_output == {"image": b"px"}  # a key the class does not take
    (completion,) = request.outputs
    assert type(completion) is _Completion
    assert (completion.index, completion.text, completion.token_ids) == (0, "yo", [3])
    assert back["n"] == 1


def test_dicts_not_shaped_like_vllm_outputs_stay_dicts(vllm_outputs: types.ModuleType) -> None:
    partial = {"request_id": "r1", "prompt": "hi"}  # not every key
    odd_keys = {**_request_dict(), 7: "a non-str key"}
    nested = [[{"index": 0, "text": "t", "token_ids": [], "finish_reason": None}]]
    back = extensions.restore_vllm_outputs({"p": partial, "o": odd_keys, "l": nested})
    assert back["p"] == partial and type(back["p"]) is dict
    assert type(back["o"]) is dict and type(back["o"]["outputs"][0]) is _Completion
    assert type(back["l"][0][0]) is _Completion  # lists inside lists are walked
    assert extensions.restore_vllm_outputs("text") == "text"
    assert extensions.restore_vllm_outputs(b"raw") == b"raw"


@pytest.mark.parametrize("absent", ["RequestOutput", "CompletionOutput"])
def test_a_vllm_outputs_module_without_both_classes_rebuilds_nothing(
    vllm_outputs: types.ModuleType, monkeypatch: pytest.MonkeyPatch, absent: str
) -> None:
    """Either class missing (or not a class): no reconstruction at all, not half of one."""
    monkeypatch.setattr(vllm_outputs, absent, "not a class")
    assert extensions.vllm_output_classes() is None
    tree = {"batch": [_request_dict()]}
    back = extensions.restore_vllm_outputs(tree)
    assert type(back["batch"][0]) is dict and type(back["batch"][0]["outputs"][0]) is dict


def test_reconstruction_stops_at_its_depth_bound(
    vllm_outputs: types.ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A bound of 8 here: 512 levels of recursion under mutmut's trampolines
    # (two frames a level) pass Python's recursion limit, on clean code too.
    monkeypatch.setattr(extensions, "_MAX_RESTORE_DEPTH", 8)
    leaf = {"index": 0, "text": "t", "token_ids": [], "finish_reason": None}
    deep: Any = leaf
    for _ in range(8 + 1):
        deep = [deep]
    back = extensions.restore_vllm_outputs(deep)
    innermost = back
    while type(innermost) is list:
        innermost = innermost[0]
    assert innermost == leaf and type(innermost) is dict  # beyond the bound: left as it is
    at_bound: Any = dict(leaf)
    for _ in range(8):
        at_bound = [at_bound]
    innermost = extensions.restore_vllm_outputs(at_bound)
    while type(innermost) is list:
        innermost = innermost[0]
    assert type(innermost) is _Completion  # at the bound: still rebuilt


def test_a_class_that_refuses_its_fields_is_rebuilt_from_attributes() -> None:
    built = extensions._build(_Refusing, {"a": 1, "b": [2]})
    assert type(built) is _Refusing and (built.a, built.b) == (1, [2])
    assert extensions._init_names(_Completion) == {"index", "text", "token_ids", "finish_reason"}
    assert extensions._init_names(_Request) == {
        "request_id",
        "prompt",
        "prompt_token_ids",
        "outputs",
        "finished",
    }
    assert extensions._init_names(_Refusing) == frozenset()  # **kwargs names nothing


def test_without_vllm_the_tree_is_returned_as_it_is(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "vllm.outputs", types.ModuleType("vllm.outputs"))
    tree = [_request_dict()]
    assert extensions.restore_vllm_outputs(tree) is tree and type(tree[0]) is dict


def test_a_vllm_type_travels_as_its_attributes_and_refuses_another_state() -> None:
    rebuild = extensions._rebuilder(_Request)
    state = extensions._attributes(_Request("r", "p", [1], [], False))
    assert state == {
        "request_id": "r",
        "prompt": "p",
        "prompt_token_ids": [1],
        "outputs": [],
        "finished": False,
    }
    back = rebuild(state)
    assert type(back) is _Request and vars(back) == state
    for bad in ([1, 2], {1: "x"}):
        with pytest.raises(TypeError, match="state must be a dict of attributes"):
            rebuild(bad)


# -- `shmring stat`'s scope walk and its JSON ----------------------------------------------


def test_stat_walks_only_this_uid_s_valid_deployment_directories(tmp_path: Path) -> None:
    uid = os.getuid()
    (tmp_path / f"shmring-{uid}-good").mkdir()
    (tmp_path / f"shmring-{uid}-also_good").mkdir()
    (tmp_path / f"shmring-{uid}-bad scope!").mkdir()  # not a valid scope
    (tmp_path / f"shmring-{uid}-afile").write_bytes(b"")  # not a directory
    (tmp_path / f"shmring-{uid}-link").symlink_to(tmp_path / f"shmring-{uid}-good")
    (tmp_path / f"shmring-{uid + 1}-theirs").mkdir()  # another uid's prefix
    (tmp_path / "unrelated").mkdir()
    assert admin.list_scopes(str(tmp_path)) == ["also_good", "good"]
    assert admin.list_scopes(str(tmp_path), uid=uid + 1) == []  # the name alone is not enough
    assert admin.list_scopes(str(tmp_path / "absent")) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a directory another owner")
def test_stat_skips_a_directory_with_our_prefix_that_another_uid_owns(tmp_path: Path) -> None:
    uid = os.getuid()
    planted = tmp_path / f"shmring-{uid}-planted"
    planted.mkdir()
    os.chown(planted, 4242, 4242)
    (tmp_path / f"shmring-{uid}-mine").mkdir()
    assert admin.list_scopes(str(tmp_path)) == ["mine"]
    assert admin.list_scopes(str(tmp_path), uid=4242) == []


def test_stat_json_names_the_scope_and_every_field(
    scope: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with Connector(scope, ring_capacity=64 * 1024) as connector:
        connector.put(EDGE, "k", b"v")
        assert cli.main(["stat", "--scope", scope, "--json"]) == 0
        document = json.loads(capsys.readouterr().out)
        assert cli.main(["stat", "--json"]) == 0  # every scope of this uid: ours among them
        every = json.loads(capsys.readouterr().out)
        status = admin.deployment_status(scope)
    assert document == json.loads(json.dumps(admin.status_as_dict(scope, status)))
    assert document["scope"] == scope and document["exists"] is True
    (ring,) = document["rings"]
    assert ring["edge"] == list(EDGE) and ring["published_frames"] == 1
    assert [entry for entry in every if entry["scope"] == scope] == [document]


# -- a publication cohort's members met by a borrowed get -----------------------------------


def test_a_borrowed_get_of_cohort_members_waits_for_the_cohort_then_owns_its_copy(
    scope: str,
) -> None:
    small, large = {"v": [1, 2]}, {"v": b"x" * 300_000}
    with Connector(scope, ring_capacity=1 << 16) as producer, Connector(scope) as receiver:
        with producer.publication_cohort(EDGE):
            producer.put(EDGE, "small", small)  # a ring frame
            producer.put(EDGE, "large", large)  # a pool slot
            for key in ("small", "large"):
                assert receiver.get(EDGE, key, borrow=True).status is GetStatus.NOT_FOUND
        before = receiver.health().bytes_transferred
        got_small = receiver.get(EDGE, "small", borrow=True)
        got_large = receiver.get(EDGE, "large", borrow=True)
        borrowed_bytes = receiver.health().bytes_transferred - before
        assert (got_small.status, got_large.status) == (GetStatus.DELIVERED, GetStatus.DELIVERED)
        assert got_small.value == small and got_large.value == large
        assert type(got_large.value["v"]) is bytes  # an owned copy, not a view
        health = receiver.health()
        assert health.borrowed_live == 0
        ring = producer.ring(EDGE)
        assert ring is not None
        stats = ring.statistics()
        assert (stats.published_frames, stats.claimed_frames) == (0, 0)  # both frames DONE
        # The bytes counted are the members' stored bytes, as an owned get counts them.
        with producer.publication_cohort(EDGE):  # the next cohort: pending past the first
            producer.put(EDGE, "small2", small)
            producer.put(EDGE, "large2", large)
            for key in ("small2", "large2"):
                assert receiver.get(EDGE, key, borrow=True).status is GetStatus.NOT_FOUND
        before = receiver.health().bytes_transferred
        assert receiver.get(EDGE, "small2").value == small
        assert receiver.get(EDGE, "large2").value == large
        assert borrowed_bytes == receiver.health().bytes_transferred - before > 300_000


# -- what a user prints ----------------------------------------------------------------------


def test_a_connector_and_a_lease_say_what_they_are(scope: str, tmp_path: Path) -> None:
    with Connector(scope, ring_capacity=64 * 1024) as connector:
        assert repr(connector) == f"Connector(scope={scope!r}, capacity=65536, rings=0)"
        connector.put(EDGE, "k", b"v" * 10)
        assert repr(connector) == f"Connector(scope={scope!r}, capacity=65536, rings=1)"
    assert repr(connector) == f"Connector(scope={scope!r}, capacity=65536, closed)"
    path = str(tmp_path / "ring")
    with RingChannel.create(path, 4096) as ring:
        ring.put("k", b"payload")
        with RingReader.attach(path, os_facade=DEFAULT_OS) as reader:
            lease = reader.get("k", mode=ConsumeMode.LEASE).payload
            assert repr(lease) == f"Lease(position={lease.position}, 7 bytes)"
            lease.release()
            assert repr(lease) == f"Lease(position={lease.position}, released)"


# -- the fork and exit hooks, called in this process on objects of the test's own -----------


class _Hooked:
    """A tracked object that records the hooks' calls; `fails` makes both of them raise."""

    def __init__(self, fails: bool = False) -> None:
        self.fails = fails
        self.marked = 0
        self.closes = 0

    def _forked_in_child(self) -> None:
        self.marked += 1
        if self.fails:
            raise RuntimeError("a hook that fails")

    def close(self) -> None:
        self.closes += 1
        if self.fails:
            raise RuntimeError("a close that fails")


@pytest.fixture
def own_lifecycle(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """lifecycle's registries for this test alone (the process's own objects are not touched)."""
    import weakref

    state: dict[str, Any] = {
        "tracked": weakref.WeakSet(),
        "at_exit": weakref.WeakSet(),
        "fds": {},
        "main": [None],
    }
    monkeypatch.setattr(lifecycle, "_tracked", state["tracked"])
    monkeypatch.setattr(lifecycle, "_close_at_exit", state["at_exit"])
    monkeypatch.setattr(lifecycle, "_inherited_fds", state["fds"])
    monkeypatch.setattr(lifecycle, "_main_thread", state["main"])
    monkeypatch.setattr(lifecycle, "_generation", lifecycle._generation)
    return state


def test_the_fork_hook_marks_every_tracked_object_and_records_the_inherited_fds(
    own_lifecycle: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    import threading

    kept, failing, other = _Hooked(), _Hooked(fails=True), _Hooked()
    lifecycle.track(kept)
    lifecycle.track(failing, close_at_exit=False)
    lifecycle.track(other, close_at_exit=False)
    assert len(own_lifecycle["at_exit"]) == 1
    before = lifecycle.generation()
    read_end, write_end = os.pipe()
    try:
        with caplog.at_level("ERROR", logger="shmring.impl.lifecycle"):
            lifecycle._after_fork_in_child()
        assert lifecycle.generation() == before + 1
        assert lifecycle.is_inherited(before) and not lifecycle.is_inherited(before + 1)
        # every one, in whatever order: the failing one stopped nobody
        assert (kept.marked, failing.marked, other.marked) == (1, 1, 1)
        assert "marking an inherited shmring object failed" in caplog.text
        assert len(own_lifecycle["at_exit"]) == 0  # the parent's objects: the parent closes them
        assert kept.closes == 0
        assert own_lifecycle["main"] == [threading.get_ident()]
        info = os.fstat(read_end)
        assert own_lifecycle["fds"][read_end] == (info.st_dev, info.st_ino)
        assert own_lifecycle["fds"][write_end] == (os.fstat(write_end).st_dev, info.st_ino)
    finally:
        os.close(read_end)
        os.close(write_end)


def test_the_fork_hook_with_nothing_tracked_records_no_fds(own_lifecycle: dict[str, Any]) -> None:
    own_lifecycle["fds"][99999] = (1, 2)  # a stale record of the previous fork: cleared
    before = lifecycle.generation()
    lifecycle._after_fork_in_child()
    assert lifecycle.generation() == before + 1
    assert own_lifecycle["fds"] == {}


def test_the_exit_hook_closes_each_object_once_and_logs_a_close_that_failed(
    own_lifecycle: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    first, failing, last = _Hooked(), _Hooked(fails=True), _Hooked()
    closed_by_owner = _Hooked()
    for obj in (first, failing, last, closed_by_owner):
        lifecycle.track(obj)
    lifecycle.closed(closed_by_owner)
    with caplog.at_level("WARNING", logger="shmring.impl.lifecycle"):
        lifecycle._close_all_at_exit()
    assert (first.closes, failing.closes, last.closes, closed_by_owner.closes) == (1, 1, 1, 0)
    assert "at interpreter exit failed" in caplog.text
    lifecycle._close_all_at_exit()  # once: a second run closes nothing again
    assert (first.closes, failing.closes, last.closes) == (1, 1, 1)


# -- a spare discarded while an interrupted frame still exports its mapping ------------------


@pytest.mark.parametrize("exported", [True, False])
def test_a_spare_discarded_while_propagating_always_closes_its_descriptor(
    tmp_path: Path, exported: bool
) -> None:
    """`_discard_quietly` (a put failing mid-fill): the mapping an interrupted frame still
    exports stays until that view dies, and the descriptor is closed either way."""
    import mmap

    from shmring.impl.fallback.spares import Spare, SpareStock
    from shmring.impl.os_seam import SITE_CLOSE, OsFacade

    class CountsCloses(OsFacade):
        closes = 0

        def _enter(self, site: str) -> None:
            if site == SITE_CLOSE:
                CountsCloses.closes += 1

    path = tmp_path / "spare"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    os.ftruncate(fd, mmap.PAGESIZE)
    mapping = mmap.mmap(fd, mmap.PAGESIZE)
    info = os.fstat(fd)
    spare = Spare(fd, mapping, mmap.PAGESIZE, (info.st_dev, info.st_ino))
    stock = SpareStock()
    stock._os = CountsCloses()
    view = memoryview(mapping) if exported else None
    try:
        stock._discard_quietly(spare)
        assert spare.fd == -1 and CountsCloses.closes == 1
        with pytest.raises(OSError):
            os.fstat(fd)  # closed (nothing else opened since in this test)
        assert mapping.closed is (not exported)
        stock._discard_quietly(spare)  # again: nothing left to close
        assert CountsCloses.closes == 1
    finally:
        if view is not None:
            view.release()
        mapping.close()


# -- a transfer sender and receiver marked inherited in this process -------------------------


def test_an_inherited_transfer_pair_refuses_work_and_its_close_removes_nothing(scope: str) -> None:
    """What a forked child's copies do (`_forked_in_child`), reached in this process."""
    torch = pytest.importorskip("torch")
    from shmring.impl.registered.cuda_driver import SimulatedCudaDriver
    from shmring.impl.registered.transfer import TransferOptions, TransferReceiver, TransferSender
    from shmring.model_tests.registration_machine import transfer_files

    options = TransferOptions(
        enable_registered_shm=True, enable_borrowed_frames=True, arena_capacity=16384
    )
    sender = TransferSender(scope, options, driver=SimulatedCudaDriver())
    receiver = TransferReceiver(scope, options)
    directory = deployment_directory(scope)
    try:
        descriptor = sender.send({"x": torch.arange(16, dtype=torch.float32)})
        assert receiver.receive(descriptor)["x"].tolist() == list(range(16))
        again = sender.send({"x": torch.arange(4, dtype=torch.float32)})
        files = transfer_files(directory)
        assert files and _mapped(directory) and _held(directory)
        lifecycle._snapshot_fds()  # as the fork would: what is open now was inherited
        sender._forked_in_child()
        receiver._forked_in_child()
        with pytest.raises(ForkedError, match="sender inherited through fork"):
            sender.send({"x": torch.zeros(2)})
        with pytest.raises(ForkedError, match="receiver inherited through fork"):
            receiver.receive(again)
        sender.close()
        receiver.close()
        assert transfer_files(directory) == files  # the parent's files stay the parent's
        assert _mapped(directory) == 0  # this process's copies of the mappings are gone
        assert _held(directory) == 0  # and of the descriptors
        sender.close()  # idempotent, still only a release
        assert transfer_files(directory) == files
    finally:
        lifecycle._inherited_fds.clear()
        if os.path.isdir(directory):
            liveness_file.release_liveness_file(as_directory(directory), DEFAULT_OS)
        shutil.rmtree(directory, ignore_errors=True)
