"""Fork and exit: a connector belongs to the process that made it (issue 24)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

import shmring
from shmring.impl.connector import Connector, GetStatus, Route
from shmring.impl.errors import ClosedError, ShmringError
from shmring.impl.names import deployment_directory

EDGE = ("parent", "next")

# Child exit codes: what the inherited connector did.
_CHILD_OK = 0
_CHILD_PUT_WORKED = 10
_CHILD_UNTYPED = 11
_CHILD_CLOSE_RAISED = 12
_CHILD_GET_WORKED = 13


def _child(inherited: Connector, *, borrowed: object = None) -> int:
    """In the forked child: every use is ForkedError, close releases only; the exit code says."""
    try:
        inherited.put(EDGE, "k_child", {"from": "child"})
        return _CHILD_PUT_WORKED
    except shmring.ForkedError:
        pass
    except BaseException:  # noqa: BLE001 - any other outcome is the finding
        return _CHILD_UNTYPED
    try:
        inherited.get(EDGE, "k0")
        return _CHILD_GET_WORKED
    except shmring.ForkedError:
        pass
    except BaseException:  # noqa: BLE001
        return _CHILD_UNTYPED
    try:
        inherited.close()
        inherited.close()
    except BaseException:  # noqa: BLE001
        return _CHILD_CLOSE_RAISED
    del borrowed  # an inherited borrowed payload dies here
    return _CHILD_OK


def _fork_and_run(inherited: Connector, borrowed: object = None) -> int:
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 99
        try:
            code = _child(inherited, borrowed=borrowed)
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def test_forked_error_is_typed_and_exported() -> None:
    assert issubclass(shmring.ForkedError, ShmringError)
    assert issubclass(shmring.ForkedError, ClosedError)
    assert "ForkedError" in shmring.__all__


@pytest.mark.parametrize("large", [False, True], ids=["ring", "pool"])
def test_inherited_connector_in_a_forked_child_never_touches_the_parents_files(
    scope: str, large: bool
) -> None:
    """Issue 24, case 1: the child's put/close removed the parent's ring; k0 and k_parent vanished."""
    fill = b"x" * (3 << 20) if large else b"x"
    with Connector(scope, ring_capacity=64 * 1024) as parent, Connector(scope) as receiver:
        first = parent.put(EDGE, "k0", {"from": "parent", "fill": fill})
        assert first.route is (Route.POOL if large else Route.RING)
        files_before = sorted(os.listdir(deployment_directory(scope)))
        assert _fork_and_run(parent) == _CHILD_OK
        assert sorted(os.listdir(deployment_directory(scope))) == files_before
        parent.put(EDGE, "k_parent", {"from": "parent", "fill": fill})
        for key in ("k0", "k_parent"):
            got = receiver.get(EDGE, key)
            assert got.status is GetStatus.DELIVERED, (key, got.status)
            assert got.value["from"] == "parent"
        assert receiver.get(EDGE, "k_child").status is GetStatus.NOT_FOUND


def test_inherited_receiver_and_borrowed_payload_leave_the_parents_frames_alone(
    scope: str,
) -> None:
    """A borrowed payload that dies in the child does not mark the parent's frame done."""
    with Connector(scope) as producer, Connector(scope) as receiver:
        producer.put(EDGE, "held", {"blob": b"b" * 100_000})
        producer.put(EDGE, "k0", {"from": "parent"})
        held = receiver.get(EDGE, "held", borrow=True)
        assert held.status is GetStatus.DELIVERED
        assert _fork_and_run(receiver, borrowed=held.value) == _CHILD_OK
        assert receiver.health().borrowed_live == 1  # the parent still holds its frame
        got = receiver.get(EDGE, "k0")
        assert got.status is GetStatus.DELIVERED and got.value == {"from": "parent"}
        assert bytes(held.value["blob"][:3]) == b"bbb"
        del held


_EXIT_SCRIPT = textwrap.dedent(
    """
    import os, sys
    from shmring.impl.connector import Connector
    scope, mode = sys.argv[1], sys.argv[2]
    connector = Connector(scope, ring_capacity=64 * 1024)
    connector.put(("a", "b"), "small", {"v": 1})
    connector.put(("a", "b"), "large", {"v": b"x" * 100_000})  # a pool slot
    connector.put(("a", "c"), "seg", {"v": b"y" * 100_000})
    if mode == "fork":
        pid = os.fork()
        if pid == 0:
            sys.exit(0)  # a normal exit of the child runs its exit hooks
        os.waitpid(pid, 0)
        directory = connector.directory
        names = os.listdir(directory)
        assert any(name.startswith("ring.") for name in names), names
        with Connector(scope) as receiver:
            assert receiver.get(("a", "b"), "small").value == {"v": 1}
    print("exiting without close", flush=True)
    """
)


@pytest.mark.parametrize("mode", ["plain", "fork"])
def test_a_process_that_exits_without_close_leaves_no_files(scope: str, mode: str) -> None:
    """Issue 22 "Also" and issue 24, case 3: exit cleans up like close, never from a fork child."""
    done = subprocess.run(
        [sys.executable, "-c", _EXIT_SCRIPT, scope, mode], capture_output=True, timeout=120
    )
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    directory = deployment_directory(scope)
    left = sorted(os.listdir(directory)) if os.path.isdir(directory) else []
    if left:
        import shutil

        shutil.rmtree(directory, ignore_errors=True)
    assert left == [] and not os.path.exists(directory), left


def _fork(child: object) -> int:
    """Run `child()` (answers an exit code) in a forked child; answer its exit code."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 99
        try:
            code = child()  # type: ignore[operator]
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def test_inherited_shared_memory_connector_refuses_in_the_child_and_the_parent_serves(
    scope: str,
) -> None:
    """The drop-in answers (False, 0, None) for an inherited put (vllm-omni's shape), logged."""
    from shmring import SharedMemoryConnector

    sender = SharedMemoryConnector({"stage_id": 0, "wakeup_scope": scope})
    receiver = SharedMemoryConnector({"stage_id": 1, "wakeup_scope": scope})
    try:
        ok, _, first = sender.put(0, 1, "k0", {"from": "parent"})
        assert ok

        def child() -> int:
            answer = sender.put(0, 1, "k_child", {"from": "child"})
            sender.close()
            del sender.__dict__["_connector"]  # what gc would drop: nothing more happens
            return 0 if answer == (False, 0, None) else _CHILD_PUT_WORKED

        assert _fork(child) == 0
        ok, _, second = sender.put(0, 1, "k_parent", {"from": "parent"})
        assert ok
        for key, metadata in (("k0", first), ("k_parent", second)):
            got = receiver.get(0, 1, key, metadata)
            assert got is not None and got[0] == {"from": "parent"}, key
    finally:
        sender.close()
        receiver.close()


def test_inherited_transfer_sender_and_receiver_raise_forked_error(scope: str) -> None:
    torch = pytest.importorskip("torch")
    from shmring.impl.registered.transfer import TransferReceiver, TransferSender

    with TransferSender(scope) as sender, TransferReceiver(scope) as receiver:
        descriptor = sender.send({"x": torch.arange(6, dtype=torch.int32)})

        def child() -> int:
            try:
                sender.send({"x": torch.arange(2)})
                return _CHILD_PUT_WORKED
            except shmring.ForkedError:
                pass
            try:
                receiver.receive(descriptor)
                return _CHILD_GET_WORKED
            except shmring.ForkedError:
                pass
            sender.close()
            receiver.close()
            return 0

        assert _fork(child) == 0
        (array,) = receiver.receive(descriptor).values()
        assert array.tolist() == list(range(6))
