"""A same-uid neighbour truncates or unlinks our files (issue 22, "Hostile world II").

Defect 3: a ring or pool slot file truncated before or while a process maps
it must not kill that process with SIGBUS; the shrunk file is a typed
CorruptFrameError (or a ring attach that is refused and logged), the
connector keeps serving its other edges, and the producer re-creates its
ring. The truncating party is a second process (this test); the victims run
in a subprocess, so a SIGBUS shows as a negative return code instead of
killing the test run.

Defect 4: a producer whose live ring file a neighbour unlinked notices at its
next put (st_nlink == 0 on its own descriptor), re-creates and re-announces
the ring, moves the unclaimed frames into it, counts it in health, and later
puts are delivered to readers that attach afterwards.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from shmring.impl.connector import Connector, GetStatus
from shmring.impl.names import deployment_directory
from shmring.impl.ring.results import ReceiveStatus

EDGE = ("src", "dst")
OTHER_EDGE = ("src", "other")

# The victims: one producer and one reader connector in a child process. Each
# step prints one line; the parent truncates files between "ready" and "go".
_VICTIM = textwrap.dedent(
    """
    import sys
    from shmring.impl.connector import Connector
    from shmring.impl.errors import ShmringError

    scope, kind, attach_first = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
    edge, other = ("src", "dst"), ("src", "other")
    big = kind == "pool"
    payload = (b"p" * (1 << 20)) if big else b"small payload"
    producer = Connector(scope, ring_capacity=1 << 16)
    reader = Connector(scope)

    def attempt(label, call):
        try:
            got = call()
        except ShmringError as error:
            print(label, "typed", type(error).__name__, flush=True)
            return None
        print(label, getattr(got, "status", type(got).__name__), flush=True)
        return got

    producer.put(edge, "k0", payload)
    if attach_first:
        attempt("get0", lambda: reader.get(edge, "k0"))
        producer.put(edge, "k1", payload)  # a pool put reuses slot 0
    print("ready", flush=True)
    sys.stdin.readline()
    key = "k1" if attach_first else "k0"
    attempt("get-shrunk", lambda: reader.get(edge, key))
    attempt("put-after", lambda: producer.put(edge, "k2", payload))
    got = attempt("get-after", lambda: reader.get(edge, "k2"))
    if got is not None and getattr(got, "value", None) is not None:
        print("value-ok", bytes(got.value) == payload, flush=True)
    producer.put(other, "z", b"other edge")
    attempt("get-other", lambda: reader.get(other, "z"))
    health = producer.health()
    print("replaced", health.rings_replaced, flush=True)
    producer.close()
    reader.close()
    print("closed", flush=True)
    """
)


def _run_victim(scope: str, kind: str, attach_first: bool, size: int) -> dict[str, str]:
    """Run the victims, truncate every `kind` file of the scope to `size` bytes at "ready"."""
    child = subprocess.Popen(
        [sys.executable, "-c", _VICTIM, scope, kind, "1" if attach_first else "0"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None and child.stdin is not None
        lines = []
        while True:
            line = child.stdout.readline()
            assert line, f"victim ended early: {child.wait(30)} {child.stderr.read()}"
            lines.append(line.split())
            if line.startswith("ready"):
                break
        directory = deployment_directory(scope)
        prefix = "ring." if kind == "ring" else "pool."
        victims = [name for name in os.listdir(directory) if name.startswith(prefix)]
        assert victims
        for name in victims:
            os.truncate(os.path.join(directory, name), size)
        out, err = child.communicate("go\n", timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == 0, f"victim died: returncode={child.returncode} stderr={err}"
    lines += [line.split() for line in out.splitlines()]
    return {line[0]: " ".join(line[1:]) for line in lines if line}


@pytest.mark.parametrize("size", [0, 5000])
def test_issue22_ring_truncated_while_mapped_is_typed_not_sigbus(scope: str, size: int) -> None:
    seen = _run_victim(scope, "ring", attach_first=True, size=size)
    assert seen["get0"] == "GetStatus.DELIVERED"
    assert seen["get-shrunk"] == "typed CorruptFrameError"  # the bytes are gone; said so
    assert seen["put-after"] == "RingDescriptor"  # on a re-created ring
    assert seen["get-after"] == "GetStatus.DELIVERED" and seen["value-ok"] == "True"
    assert seen["get-other"] == "GetStatus.DELIVERED"
    assert seen["replaced"] == "1" and "closed" in seen


def test_issue22_ring_truncated_before_the_reader_maps_it_is_refused(scope: str) -> None:
    seen = _run_victim(scope, "ring", attach_first=False, size=0)
    assert seen["get-shrunk"] == "GetStatus.NOT_FOUND"  # refused at attach, logged
    assert seen["put-after"] == "RingDescriptor"
    assert seen["get-after"] == "GetStatus.DELIVERED" and seen["value-ok"] == "True"
    assert seen["get-other"] == "GetStatus.DELIVERED" and "closed" in seen


@pytest.mark.parametrize("size", [0, 8192])
def test_issue22_pool_slot_truncated_while_mapped_is_typed_not_sigbus(
    scope: str, size: int
) -> None:
    seen = _run_victim(scope, "pool", attach_first=True, size=size)
    assert seen["get0"] == "GetStatus.DELIVERED"
    assert seen["get-shrunk"] == "typed CorruptFrameError"
    assert seen["put-after"] == "PoolDescriptor"  # a fresh slot: the shrunk one is removed
    assert seen["get-after"] == "GetStatus.DELIVERED" and seen["value-ok"] == "True"
    assert seen["get-other"] == "GetStatus.DELIVERED" and "closed" in seen


def test_issue22_unlinked_ring_is_recreated_and_nothing_published_vanishes(scope: str) -> None:
    with (
        Connector(scope, ring_capacity=1 << 16) as producer,
        Connector(scope) as early,
    ):
        producer.put(EDGE, "k0", b"zero")
        assert early.get(EDGE, "k0").status is GetStatus.DELIVERED  # maps the ring
        producer.put(EDGE, "before", b"published before the unlink")
        ring = producer.ring(EDGE)
        assert ring is not None
        os.unlink(ring.path)  # the neighbour
        producer.put(EDGE, "after", b"published after the unlink")
        health = producer.health()
        assert health.rings_replaced == 1 and health.ring_frames_lost == 0
        assert producer.failed_edges() == {}
        replacement = producer.ring(EDGE)
        assert replacement is not None and replacement is not ring
        assert os.path.exists(replacement.path)
        with Connector(scope) as late:  # attaches after the unlink: finds both keys
            got = late.get(EDGE, "before")
            assert got.status is GetStatus.DELIVERED
            assert got.value == b"published before the unlink"
            assert late.get(EDGE, "after").value == b"published after the unlink"
        # Exactly once: the early reader's old mapping no longer delivers them.
        assert early.get(EDGE, "before").status is GetStatus.NOT_FOUND
        producer.put(EDGE, "later", b"later")
        assert early.get(EDGE, "later").value == b"later"  # it re-attached by path


def test_issue22_unlinked_ring_frame_claimed_meanwhile_is_not_moved(scope: str) -> None:
    with Connector(scope, ring_capacity=1 << 16) as producer, Connector(scope) as reader:
        producer.put(EDGE, "warm", b"w")
        assert reader.get(EDGE, "warm").status is GetStatus.DELIVERED  # maps the ring
        producer.put(EDGE, "k", b"v")
        ring = producer.ring(EDGE)
        assert ring is not None
        os.unlink(ring.path)
        assert reader.get(EDGE, "k").value == b"v"  # claimed from the old mapping
        producer.put(EDGE, "next", b"n")
        assert producer.health().rings_replaced == 1
        assert reader.get(EDGE, "k").status is GetStatus.NOT_FOUND  # never twice
        assert reader.get(EDGE, "next").value == b"n"


def test_issue22_a_damaged_ring_its_producer_replaced_is_dropped_and_the_new_one_read(
    scope: str,
) -> None:
    """A kept reader whose old ring is damaged and closed (re-created) unmaps it and reads the new one.

    The neighbour scribbles over the ring's head and unlinks the file; the
    producer's next put re-creates the ring under the same identity. The
    reader's next get meets the damage on the old mapping, drops that
    reader from its cache (not only from the edge's list) and finds the
    key in the new ring, then keeps reading it.
    """
    from shmring.spec.layout import RING_HEAD_OFFSET

    with Connector(scope, ring_capacity=1 << 16) as producer, Connector(scope) as reader:
        producer.put(EDGE, "warm", b"w")
        assert reader.get(EDGE, "warm").status is GetStatus.DELIVERED  # maps and keeps the ring
        ring = producer.ring(EDGE)
        assert ring is not None
        with open(ring.path, "r+b") as file:  # the neighbour
            file.seek(RING_HEAD_OFFSET)
            file.write((17).to_bytes(8, "little"))
        os.unlink(ring.path)
        producer.put(EDGE, "next", b"n")  # notices the unlink: the old ring CLOSED, a new one
        assert producer.health().rings_replaced == 1
        got = reader.get(EDGE, "next")
        assert got.status is GetStatus.DELIVERED and got.value == b"n"
        mapped = list(reader._ring_route.readers.values())
        assert len(mapped) == 1 and not mapped[0].producer_closed  # the damaged one is gone
        assert reader.get(EDGE, "next").status is GetStatus.NOT_FOUND  # once
        producer.put(EDGE, "later", b"l")
        assert reader.get(EDGE, "later").value == b"l"


def test_issue22_reader_drops_a_shrunk_ring_mapping(scope: str) -> None:
    from shmring.impl.errors import CorruptFrameError
    from shmring.impl.ring.producer import RingChannel
    from shmring.impl.ring.reader import RingReader

    directory = deployment_directory(scope)
    os.mkdir(directory, 0o700)
    path = os.path.join(directory, "ring.solo")
    try:
        with RingChannel.create(path, 1 << 16) as channel:
            reader = RingReader.attach(path)
            channel.put("k", b"v")
            os.truncate(path, 0)
            with pytest.raises(CorruptFrameError, match="shrank"):
                reader.get("k")
            with pytest.raises(CorruptFrameError, match="shrank"):
                reader.get("k")  # unmapped: it stays refused, never touched
            assert reader.producer_closed
            assert channel.file_problem() is not None
            reader.close()
    finally:
        for name in os.listdir(directory):
            os.unlink(os.path.join(directory, name))
        os.rmdir(directory)
    assert ReceiveStatus.DELIVERED  # the module's statuses import cleanly


def test_issue22_threat_table_lists_every_neighbour_action() -> None:
    from shmring.spec.environment import OUTCOMES, NeighbourAction, is_survivable

    here = os.path.dirname(os.path.abspath(__file__))
    with open(os.path.join(here, "..", "docs", "threat-model.md"), encoding="utf-8") as handle:
        table = handle.read()
    for action in NeighbourAction:
        assert is_survivable(action) and action in OUTCOMES
        assert f"| {action.value}" in table, action


def _as_other_uid(script: str, *args: str) -> None:
    """Run a shell `script` in a child process that dropped to another uid (nobody)."""
    other = 65534

    def drop() -> None:
        os.setgroups([])
        os.setgid(other)
        os.setuid(other)

    subprocess.run(
        ["/bin/sh", "-c", script, "sh", *args], check=True, preexec_fn=drop, timeout=60, env={}
    )


@pytest.mark.skipif(os.geteuid() != 0, reason="another uid needs root to create")
def test_issue22_sender_never_writes_into_a_directory_another_uid_recreated(scope: str) -> None:
    """Defect 1: the sender's files follow its verified descriptor, never the path again."""
    torch = pytest.importorskip("torch")
    from shmring.impl.errors import ConfigurationError
    from shmring.impl.registered.transfer import TransferReceiver, TransferSender

    path = deployment_directory(scope)
    sender = TransferSender(scope)
    try:
        with Connector(scope) as connector, TransferReceiver(scope) as receiver:
            connector.put(EDGE, "k", b"v")
            first = sender.send({"x": torch.arange(4, dtype=torch.int32)})
            assert receiver.receive(first)["x"].tolist() == [0, 1, 2, 3]
            assert connector.get(EDGE, "k").value == b"v"
        # The sender is a member too: the connector's close left the directory.
        # A same-uid neighbour removes it anyway, and a stranger re-creates it 0777.
        assert os.path.isdir(path)
        subprocess.run(
            [sys.executable, "-c", "import shutil, sys; shutil.rmtree(sys.argv[1])", path],
            check=True,
            timeout=60,
        )
        _as_other_uid('mkdir "$1" && chmod 0777 "$1"', path)
        assert os.stat(path).st_uid != os.getuid()
        with pytest.raises(ConfigurationError, match="owned by uid"):
            sender.send({"x": torch.arange(4, dtype=torch.int32)})
        assert os.listdir(path) == []  # nothing of ours in the stranger's directory
        os.rmdir(path)  # the stranger goes; the next send re-creates a private directory
        again = sender.send({"x": torch.arange(3, dtype=torch.int32)})
        info = os.stat(path)
        assert info.st_uid == os.getuid() and info.st_mode & 0o777 == 0o700
        with TransferReceiver(scope) as receiver:
            assert receiver.receive(again)["x"].tolist() == [0, 1, 2]
    finally:
        sender.close()
        if os.path.isdir(path) and os.stat(path).st_uid != os.getuid():
            for name in os.listdir(path):
                os.unlink(os.path.join(path, name))
            os.rmdir(path)
    assert not os.path.exists(path)  # the sender was the last member out


def _deleted_slot_blocks() -> int:
    """512-byte blocks of the deleted pool slot files this process still holds open."""
    blocks = 0
    for name in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
            if "/pool." in target and target.endswith("(deleted)"):
                blocks += os.fstat(int(name)).st_blocks
        except OSError:
            continue
    return blocks


def test_issue22_idle_reader_pins_no_pages_of_a_closed_producers_slots(scope: str) -> None:
    """An owned get, then the producer closes: the idle reader's mapping pins no pages."""
    payload = b"s" * (4 << 20)
    with Connector(scope) as reader:
        with Connector(scope, ring_capacity=1 << 16) as producer:
            descriptor = producer.put(EDGE, "big", payload)
            assert type(descriptor).__name__ == "PoolDescriptor"
            assert reader.get(EDGE, "big").value == payload
        assert _deleted_slot_blocks() == 0  # before: the 4 MiB slot stayed allocated


def test_issue22_cached_slot_mappings_are_bounded_in_bytes(
    scope: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from shmring.impl.pool import consumer

    monkeypatch.setattr(consumer, "MAX_MAPPED_SLOT_BYTES", 6 << 20)
    payload = b"b" * (2 << 20)  # one 2 MiB-class slot each while all are outstanding
    with Connector(scope, ring_capacity=1 << 16) as producer, Connector(scope) as reader:
        for index in range(6):
            producer.put(EDGE, f"k{index}", payload)
        for index in range(6):
            assert reader.get(EDGE, f"k{index}").value == payload
        pool = reader._ring_route.pool
        assert pool is not None and 0 < pool.mapped_bytes <= 6 << 20


def test_issue22_a_descriptor_of_the_unlinked_ring_never_reads_a_newer_frame(scope: str) -> None:
    with Connector(scope, ring_capacity=1 << 16) as producer, Connector(scope) as reader:
        old = producer.put(EDGE, "k", b"version 1")
        ring = producer.ring(EDGE)
        assert ring is not None
        os.unlink(ring.path)
        producer.put(EDGE, "other", b"o")  # replaces the ring, moving k's frame
        producer.put(EDGE, "k", b"version 2")  # retires the moved frame
        got = reader.get(EDGE, "k", descriptor=old)
        assert got.status is GetStatus.STALE, got  # the new ring continued the positions
        assert reader.get(EDGE, "k").value == b"version 2"
