"""The transports bench_ring.py puts side by side, behind one small interface.

Design rationale. Every transport is driven the same way by the worker loop
in `_harness`: `setup` makes what this process *receives* on (so the peer can
attach to it), `connect` opens what it *sends* on, using what the peer's
setup reported, then `send(seq, obj)` / `recv(seq, deadline)` move one
message each, and `close` removes everything this process made. Messages are
numbered; transports that address by key (the ring, the connector, per-key
segments) use the number as the key, stream transports ignore it.

What `recv` answers is owned by the receiver: bytes (or a buffer the
receiver alone holds, for zmq), or a decoded tree in fresh memory -- except
``connector/borrow``, which answers a borrowed read-only view and holds its
delivery until the next receive (issue 13's borrowed receive; not run where
the connector has no ``borrow`` parameter). Payloads
are either ``bytes`` or the small tensor tree; transports with no tensor
support carry the tree as bytes: the shmring codec for the shared-memory
and socket baselines (so they pay the same serialization as shmring),
standard ``pickle`` for Pipe and Queue (what their users write; torch's
shared-memory pickling reductions are not used).

Receivers that poll (ring, per-key segments, iceoryx2) spin; the connector
uses its own `get_with_deadline` (spins briefly, then sleeps); Pipe, Queue
and zmq block in the kernel. Every wait has a deadline.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
import pickle
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

from shmring.impl import codec
from shmring.spec.layout import U64_FORMAT

TREE = "tree"  # payload kind: the small tensor tree
BYTES = "bytes"  # payload kind: a bytes object of `size` bytes

SHM_ROOT = "/dev/shm"
_COMMIT = struct.Struct(U64_FORMAT)  # per-key segment: payload length + 1, written last
_PICKLE_PROTOCOL = 5


class BenchTimeout(RuntimeError):
    """A receive waited past its deadline (the peer died or the transport lost a message)."""


@dataclass(frozen=True)
class CaseSpec:
    """What one benchmark case moves, and how the transports are sized for it."""

    case_id: str  # unique per run and case: names files, services and keys
    transport: str  # a key of TRANSPORTS
    kind: str  # TREE or BYTES
    size: int  # payload bytes (BYTES), encoded bytes of the tree (TREE)
    ring_capacity: int  # ring and connector capacity for this case
    in_flight: int  # messages that may be queued at once (iceoryx2 buffer, zmq HWM)


def make_tree() -> dict[str, Any]:
    """The small tensor tree of the issue (a stage's per-step output)."""
    import torch

    return {"codes": {"audio": torch.arange(28)}, "meta": {"finished": torch.tensor(False)}}


def make_bytes(size: int) -> bytes:
    """A deterministic, non-constant payload of `size` bytes."""
    pattern = bytes(range(251))  # prime length: no alignment with powers of two
    return (pattern * (size // len(pattern) + 1))[:size]


def tree_equal(a: Any, b: Any) -> bool:
    import torch

    return (
        torch.equal(a["codes"]["audio"], b["codes"]["audio"])
        and bool(a["meta"]["finished"]) == bool(b["meta"]["finished"])
        and a["meta"]["finished"].dtype == b["meta"]["finished"].dtype
    )


def _writer(plan: codec.EncodePlan) -> Callable[[memoryview], None]:
    """`plan.write_into` as the ring's writer (its byte count is not needed)."""
    return cast("Callable[[memoryview], None]", plan.write_into)


def _spin_deadline_check(count: int, deadline: float, what: str) -> None:
    """Look at the clock only every 1024 polls, so spinning costs no syscall."""
    if count & 1023 == 0 and time.monotonic() > deadline:
        raise BenchTimeout(f"{what}: no message before the deadline")


class Transport:
    """One process's end of a two-process transport for one case."""

    name = "?"
    kinds: tuple[str, ...] = (TREE, BYTES)  # payload kinds it is measured with
    # Whether a sender may put a whole burst before the receiver starts
    # (False: a bounded kernel buffer would block the sender for good).
    buffers_bursts = True
    measures_latency = True  # False: throughput only (what it answers cannot be echoed)

    def __init__(self, spec: CaseSpec, me: str, peer: str, shared: dict[str, Any]) -> None:
        self.spec = spec
        self.me = me  # "a" or "b"
        self.peer = peer
        self.shared = shared  # objects made at spawn (Pipe ends, Queues)

    def setup(self) -> dict[str, Any]:
        """Make what this process receives on; answer what the peer needs to attach."""
        return {}

    def connect(self, peer_info: dict[str, Any]) -> None:
        """Open what this process sends on."""

    def send(self, seq: int, obj: Any) -> None:
        raise NotImplementedError

    def recv(self, seq: int, deadline: float) -> Any:
        raise NotImplementedError

    def close(self) -> None:
        """Remove everything this process made (idempotent)."""

    def stats(self) -> dict[str, Any]:
        """Counters worth reporting (the connector's routes)."""
        return {}


# -- shmring: the raw ring channel ---------------------------------------------------


class RingRaw(Transport):
    """`RingChannel` / `RingReader`: codec straight into the frame, decode straight out."""

    name = "ring"
    _out: Any = None
    _in: Any = None
    _directory: str | None = None

    def setup(self) -> dict[str, Any]:
        from shmring.impl.directory import ensure_deployment_directory
        from shmring.impl.names import current_producer_identity, ring_path
        from shmring.impl.ring.producer import RingChannel

        self._directory = ensure_deployment_directory(self.spec.case_id)
        identity = current_producer_identity()
        path = ring_path(self._directory, self.me, self.peer, identity)
        self._out = RingChannel.create(path, self.spec.ring_capacity, producer=identity)
        return {"identity": list(identity)}

    def connect(self, peer_info: dict[str, Any]) -> None:
        from shmring.impl.names import ring_path
        from shmring.impl.ring.reader import RingReader

        assert self._directory is not None
        identity = tuple(peer_info["identity"])
        self._in = RingReader.attach(ring_path(self._directory, self.peer, self.me, identity))

    def send(self, seq: int, obj: Any) -> None:
        from shmring.spec.ring import PutStatus

        out = self._out
        key = str(seq)
        if self.spec.kind == TREE:
            plan = codec.prepare(obj)
            outcome = out.put_with_writer(key, plan.nbytes, _writer(plan))
        else:
            outcome = out.put(key, obj)
        while outcome.status is PutStatus.FULL:  # the reader has not caught up: retry
            if self.spec.kind == TREE:
                outcome = out.put_with_writer(key, plan.nbytes, _writer(plan))
            else:
                outcome = out.put(key, obj)
        if outcome.status is not PutStatus.PUBLISHED:
            raise RuntimeError(f"ring put failed: status={outcome.status} seq={seq}")

    def recv(self, seq: int, deadline: float) -> Any:
        from shmring.impl.ring.results import ReceiveStatus

        reader = self._in
        key = str(seq)
        decode = codec.decode if self.spec.kind == TREE else None
        delivered = ReceiveStatus.DELIVERED
        count = 0
        while True:
            got = reader.get(key, decode=decode)
            if got.status is delivered:
                return got.payload
            count += 1
            _spin_deadline_check(count, deadline, f"ring recv seq={seq}")

    def close(self) -> None:
        from shmring.impl.directory import remove_deployment_directory_if_empty

        reader, self._in = self._in, None
        if reader is not None:
            reader.close()
        out, self._out = self._out, None
        if out is not None:
            out.close()
        if self._directory is not None:
            with contextlib.suppress(OSError):
                remove_deployment_directory_if_empty(self._directory)


# -- shmring: the connector ----------------------------------------------------------


class ConnectorTransport(Transport):
    """`Connector.put` / `get_with_deadline`: routing, discovery and codec included."""

    name = "connector"
    _connector: Any = None

    def setup(self) -> dict[str, Any]:
        from shmring.impl.connector import Connector

        self._connector = Connector(self.spec.case_id, ring_capacity=self.spec.ring_capacity)
        self._routes: dict[str, int] = {}
        return {}

    def send(self, seq: int, obj: Any) -> None:
        self._connector.put(self.me, self.peer, str(seq), obj)

    def recv(self, seq: int, deadline: float) -> Any:
        got = self._connector.get_with_deadline(self.peer, self.me, str(seq), deadline=deadline)
        if not got:
            raise BenchTimeout(f"connector recv seq={seq}: {got.status}")
        self._count_route(got)
        return got.value

    def _count_route(self, got: Any) -> None:
        """Tally where each delivery came from (`Delivery.route`: ring, pool, fallback)."""
        route = got.route
        name = route.name.lower() if route is not None else "unknown"
        self._routes[name] = self._routes.get(name, 0) + 1

    def stats(self) -> dict[str, Any]:
        """The health counters (issue 13's pool counters included where present), routes received."""
        import dataclasses

        if self._connector is None:
            return {}
        health = self._connector.health()
        counters = {
            field.name: getattr(health, field.name)
            for field in dataclasses.fields(health)
            if isinstance(getattr(health, field.name), int)
            and not isinstance(getattr(health, field.name), bool)
        }
        return {**counters, "received_routes": dict(self._routes)}

    def close(self) -> None:
        connector, self._connector = self._connector, None
        if connector is not None:
            connector.close()


def borrow_supported() -> str | None:
    """None when `Connector.get` and `get_with_deadline` take ``borrow``, else why not.

    Borrowed receive is issue 13's; the bench runs before and after it
    lands, so the row is reported as not run where the parameter is absent.
    """
    import inspect

    from shmring.impl.connector import Connector

    missing = [
        name
        for name in ("get", "get_with_deadline")
        if "borrow" not in inspect.signature(getattr(Connector, name)).parameters
    ]
    if missing:
        return f"Connector.{'/'.join(missing)} has no borrow parameter (no borrowed receive here)"
    return None


class ConnectorBorrowTransport(ConnectorTransport):
    """`Connector.put` / `get_with_deadline(..., borrow=True)`: read-only views, no receive copy.

    The receiver holds one borrowed delivery at a time, the way a consumer
    that only reads (an encoder, a model step) would: each receive releases
    the previous delivery (`Delivery.release()`) before it takes the next,
    and `close` releases the last. What it answers is the delivered value
    itself (a read-only view over shared memory for large payloads), valid
    until the next receive; the harness only reads it. Measured for
    throughput only: a ping-pong would send the borrowed view back.
    """

    name = "connector/borrow"
    kinds = (BYTES,)
    measures_latency = False
    _held: Any = None

    def recv(self, seq: int, deadline: float) -> Any:
        self._release_held()
        got = self._connector.get_with_deadline(
            self.peer, self.me, str(seq), deadline=deadline, borrow=True
        )
        if not got:
            raise BenchTimeout(f"connector/borrow recv seq={seq}: {got.status}")
        self._held = got
        self._count_route(got)
        return got.value

    def _release_held(self) -> None:
        held, self._held = self._held, None
        if held is not None:
            release = getattr(held, "release", None)
            if release is not None:
                release()

    def close(self) -> None:
        self._release_held()
        super().close()


class ConnectorPollTransport(ConnectorTransport):
    """`Connector.put` / a busy-polling `Connector.get` (no doorbell wait, no sleep)."""

    name = "connector/poll"

    def recv(self, seq: int, deadline: float) -> Any:
        get = self._connector.get
        key = str(seq)
        while True:
            got = get(self.peer, self.me, key)
            if got:
                self._count_route(got)
                return got.value
            if time.monotonic() >= deadline:
                raise BenchTimeout(f"connector/poll recv seq={seq}: {got.status}")


# -- baseline: one POSIX shared-memory segment per message -----------------------------


class ShmPerKey(Transport):
    """vllm-omni's SharedMemoryConnector pattern: a fresh segment per message, by key.

    The writer creates the segment with `multiprocessing.shared_memory.SharedMemory`
    (shm_open O_CREAT|O_EXCL, ftruncate, mmap), writes the payload, then a
    commit word (length + 1) last, and closes it. Ownership passes to the
    reader, so the writer unregisters the name from its resource tracker at
    once (Python 3.11 registers every segment it creates). The reader polls
    `open(/dev/shm/<name>)` (it never registers: no SharedMemory object),
    maps it, waits for the commit word, copies or decodes the payload out,
    unmaps and unlinks.
    """

    name = "shm-per-key"

    def _encode(self, obj: Any) -> bytes:
        return codec.encode(obj)

    def _decode(self, view: memoryview) -> Any:
        return codec.decode(view)

    def _name(self, source: str, seq: int) -> str:
        return f"shmring-bench-{self.spec.case_id}-{source}-{seq}"

    def send(self, seq: int, obj: Any) -> None:
        from multiprocessing import resource_tracker, shared_memory

        data = self._encode(obj) if self.spec.kind == TREE else obj
        length = len(data)
        segment = shared_memory.SharedMemory(
            name=self._name(self.me, seq), create=True, size=_COMMIT.size + length
        )
        # The reader unlinks it. (`_name` is the "/"-prefixed name the tracker was given.)
        resource_tracker.unregister(segment._name, "shared_memory")  # type: ignore[attr-defined]
        buf = segment.buf
        assert buf is not None
        buf[_COMMIT.size : _COMMIT.size + length] = data
        _COMMIT.pack_into(buf, 0, length + 1)
        del buf
        segment.close()

    def recv(self, seq: int, deadline: float) -> Any:
        path = os.path.join(SHM_ROOT, self._name(self.peer, seq))
        count = 0
        while True:
            count += 1
            _spin_deadline_check(count, deadline, f"shm-per-key recv seq={seq}")
            try:
                fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW)
            except FileNotFoundError:
                continue
            try:
                size = os.fstat(fd).st_size
                if size < _COMMIT.size:  # created, not yet truncated to size
                    continue
                mapping = mmap.mmap(fd, size)
            finally:
                os.close(fd)
            try:
                while (committed := _COMMIT.unpack_from(mapping, 0)[0]) == 0:
                    count += 1
                    _spin_deadline_check(count, deadline, f"shm-per-key commit seq={seq}")
                view = memoryview(mapping)[_COMMIT.size : _COMMIT.size + committed - 1]
                try:
                    value = self._decode(view) if self.spec.kind == TREE else view.tobytes()
                finally:
                    view.release()
            finally:
                mapping.close()
            os.unlink(path)
            return value

    def close(self) -> None:
        prefix = f"shmring-bench-{self.spec.case_id}-"
        with os.scandir(SHM_ROOT) as entries:
            for entry in entries:
                if entry.name.startswith(prefix):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(entry.path)


class ShmPerKeyPickle(ShmPerKey):
    """`ShmPerKey` carrying the tree as standard pickle instead of the shmring codec.

    The issue allows either serializer for baselines without tensor support;
    this row shows what the choice is worth. Measured with the tree only
    (for bytes it is `ShmPerKey` exactly).
    """

    name = "shm-per-key/pickle"
    kinds = (TREE,)

    def _encode(self, obj: Any) -> bytes:
        return pickle.dumps(obj, _PICKLE_PROTOCOL)

    def _decode(self, view: memoryview) -> Any:
        return pickle.loads(view)


class ShmPerKeyLocked(ShmPerKey):
    """`ShmPerKey` plus vllm-omni's per-key lock file, for an exactly-once claim.

    Two readers of the plain pattern could both copy a segment before either
    unlinks it; vllm-omni's connector guards each key with a lock file
    (``/dev/shm/shm_<key>_lockfile.lock``): the writer opens it and holds an
    exclusive flock while it writes, a reader takes it with LOCK_NB, copies
    the bytes out under it, then removes segment and lock file, and decodes
    the copy. This is the like-for-like baseline for the connector, which
    claims exactly once too (readers still never register with the tracker).
    """

    name = "shm-per-key+lock"

    def _lock_path(self, source: str, seq: int) -> str:
        return os.path.join(SHM_ROOT, self._name(source, seq) + ".lock")

    def send(self, seq: int, obj: Any) -> None:
        import fcntl

        with open(self._lock_path(self.me, seq), "wb+") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            super().send(seq, obj)
            fcntl.flock(lock, fcntl.LOCK_UN)

    def recv(self, seq: int, deadline: float) -> Any:
        import fcntl

        path = os.path.join(SHM_ROOT, self._name(self.peer, seq))
        lock_path = self._lock_path(self.peer, seq)
        count = 0
        while True:
            count += 1
            _spin_deadline_check(count, deadline, f"shm-per-key+lock recv seq={seq}")
            try:
                fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW)
            except FileNotFoundError:
                continue
            try:
                size = os.fstat(fd).st_size
                if size < _COMMIT.size:
                    continue
                mapping = mmap.mmap(fd, size)
            finally:
                os.close(fd)
            try:
                committed = _COMMIT.unpack_from(mapping, 0)[0]
                if committed == 0:
                    continue
                try:
                    lock = open(lock_path, "rb+")  # noqa: SIM115 - closed below
                except FileNotFoundError:
                    continue
                with lock:
                    try:
                        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    except BlockingIOError:
                        continue
                    data = mapping[_COMMIT.size : _COMMIT.size + committed - 1]
                    fcntl.flock(lock, fcntl.LOCK_UN)
            finally:
                mapping.close()
            os.unlink(path)
            os.unlink(lock_path)
            return codec.decode(data) if self.spec.kind == TREE else data


# -- baselines: multiprocessing ---------------------------------------------------------


class PipeTransport(Transport):
    """A duplex `multiprocessing.Pipe` made at spawn; the tree travels as pickle bytes."""

    name = "mp.Pipe"
    buffers_bursts = False  # the kernel's 64 KiB pipe buffer

    def send(self, seq: int, obj: Any) -> None:
        data = pickle.dumps(obj, _PICKLE_PROTOCOL) if self.spec.kind == TREE else obj
        self.shared["pipe"].send_bytes(data)

    def recv(self, seq: int, deadline: float) -> Any:
        conn = self.shared["pipe"]
        if not conn.poll(max(0.0, deadline - time.monotonic())):
            raise BenchTimeout(f"pipe recv seq={seq}")
        data = conn.recv_bytes()
        return pickle.loads(data) if self.spec.kind == TREE else data


class QueueTransport(Transport):
    """One `multiprocessing.Queue` per direction made at spawn; the tree as pickle bytes."""

    name = "mp.Queue"

    def send(self, seq: int, obj: Any) -> None:
        data = pickle.dumps(obj, _PICKLE_PROTOCOL) if self.spec.kind == TREE else obj
        self.shared[f"queue_{self.me}{self.peer}"].put(data)

    def recv(self, seq: int, deadline: float) -> Any:
        import queue

        try:
            data = self.shared[f"queue_{self.peer}{self.me}"].get(
                timeout=max(0.0, deadline - time.monotonic())
            )
        except queue.Empty:
            raise BenchTimeout(f"queue recv seq={seq}") from None
        return pickle.loads(data) if self.spec.kind == TREE else data


# -- baseline: pyzmq over ipc:// --------------------------------------------------------


class ZmqPair(Transport):
    """A zmq PAIR socket pair over ipc://; "a" binds, "b" connects; the tree as codec bytes.

    Sends are zero-copy for large messages (pyzmq copies below its threshold);
    receives take a `Frame` for messages of 64 KiB and more: its buffer is
    zmq's own message memory, held by the receiver alone.
    """

    name = "zmq-ipc"
    _context: Any = None
    _socket: Any = None
    _path: str | None = None

    def setup(self) -> dict[str, Any]:
        import tempfile

        import zmq

        self._context = zmq.Context()
        self._socket = self._context.socket(zmq.PAIR)
        self._socket.setsockopt(zmq.LINGER, 0)
        hwm = max(16, self.spec.in_flight)
        self._socket.setsockopt(zmq.SNDHWM, hwm)
        self._socket.setsockopt(zmq.RCVHWM, hwm)
        if self.me == "a":
            self._path = os.path.join(
                tempfile.gettempdir(), f"shmring-bench-{self.spec.case_id}.ipc"
            )
            self._socket.bind(f"ipc://{self._path}")
            return {"address": f"ipc://{self._path}"}
        return {}

    def connect(self, peer_info: dict[str, Any]) -> None:
        if self.me == "b":
            self._socket.connect(peer_info["address"])

    def send(self, seq: int, obj: Any) -> None:
        data = codec.encode(obj) if self.spec.kind == TREE else obj
        self._socket.send(data, copy=len(data) < 65536)

    def recv(self, seq: int, deadline: float) -> Any:
        socket = self._socket
        if not socket.poll(max(0, int((deadline - time.monotonic()) * 1000))):
            raise BenchTimeout(f"zmq recv seq={seq}")
        if self.spec.kind == TREE:
            return codec.decode(socket.recv())
        if self.spec.size < 65536:
            return socket.recv()
        return socket.recv(copy=False).buffer

    def close(self) -> None:
        socket, self._socket = self._socket, None
        if socket is not None:
            socket.close(linger=0)
        context, self._context = self._context, None
        if context is not None:
            context.term()
        if self._path is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._path)


# -- optional baseline: iceoryx2 ---------------------------------------------------------


def iceoryx2_available() -> str | None:
    """None when iceoryx2's Python API imports here, else why not."""
    try:
        import iceoryx2  # noqa: F401
    except ImportError as error:
        return f"iceoryx2 not installed ({error})"
    return None


class Iceoryx2(Transport):
    """iceoryx2 publish-subscribe of `Slice[c_uint8]` samples, one service per direction.

    Lossless: safe overflow off, the publisher retries until delivered, and
    the subscriber buffer holds `in_flight` samples. The tree is encoded by
    the shmring codec straight into the loaned sample and decoded straight
    out of the received one; bytes are memmoved in and copied out.
    """

    name = "iceoryx2"
    _node: Any = None
    _subscriber: Any = None
    _publisher: Any = None
    _services: tuple[Any, ...] = ()

    def _service(self, source: str, destination: str) -> Any:
        import iceoryx2 as iox2

        name = iox2.ServiceName.new(f"shmring-bench/{self.spec.case_id}/{source}{destination}")
        return (
            self._node.service_builder(name)
            .publish_subscribe(iox2.Slice[ctypes.c_uint8])
            .enable_safe_overflow(False)
            .subscriber_max_buffer_size(max(2, self.spec.in_flight))
            .history_size(0)
            .max_publishers(1)
            .max_subscribers(1)
            .open_or_create()
        )

    def setup(self) -> dict[str, Any]:
        import iceoryx2 as iox2

        iox2.set_log_level(iox2.LogLevel.Error)
        self._node = (
            iox2.NodeBuilder.new()
            .signal_handling_mode(iox2.SignalHandlingMode.Disabled)
            .create(iox2.ServiceType.Ipc)
        )
        inbound = self._service(self.peer, self.me)
        self._subscriber = (
            inbound.subscriber_builder().buffer_size(max(2, self.spec.in_flight)).create()
        )
        self._services = (inbound,)
        return {}

    def connect(self, peer_info: dict[str, Any]) -> None:
        import iceoryx2 as iox2

        outbound = self._service(self.me, self.peer)
        self._publisher = (
            outbound.publisher_builder()
            .initial_max_slice_len(max(1, self.spec.size))
            .allocation_strategy(iox2.AllocationStrategy.PowerOfTwo)
            .backpressure_strategy(iox2.BackpressureStrategy.RetryUntilDelivered)
            .create()
        )
        self._services = (*self._services, outbound)

    def send(self, seq: int, obj: Any) -> None:
        publisher = self._publisher
        publisher.update_connections()
        if self.spec.kind == TREE:
            plan = codec.prepare(obj)
            sample = publisher.loan_slice_uninit(plan.nbytes)
            raw = sample.payload().as_memory_view()  # format "<B": cast for slice stores
            view = raw.cast("B")
            plan.write_into(view)
            view.release()
            raw.release()
        else:
            sample = publisher.loan_slice_uninit(len(obj))
            ctypes.memmove(sample.payload().as_ptr(), obj, len(obj))
        sample.assume_init().send()

    def recv(self, seq: int, deadline: float) -> Any:
        subscriber = self._subscriber
        count = 0
        while (sample := subscriber.receive()) is None:
            count += 1
            _spin_deadline_check(count, deadline, f"iceoryx2 recv seq={seq}")
        raw = sample.payload().as_memory_view()
        view = raw.cast("B")
        try:
            value = codec.decode(view) if self.spec.kind == TREE else view.tobytes()
        finally:
            view.release()
            raw.release()
            sample.delete()
        return value

    def close(self) -> None:
        for name in ("_publisher", "_subscriber"):
            port = getattr(self, name)
            setattr(self, name, None)
            if port is not None:
                port.delete()
        self._services = ()
        self._node = None


TRANSPORTS: dict[str, type[Transport]] = {
    RingRaw.name: RingRaw,
    ConnectorTransport.name: ConnectorTransport,
    ConnectorPollTransport.name: ConnectorPollTransport,
    ConnectorBorrowTransport.name: ConnectorBorrowTransport,
    ShmPerKey.name: ShmPerKey,
    ShmPerKeyLocked.name: ShmPerKeyLocked,
    ShmPerKeyPickle.name: ShmPerKeyPickle,
    PipeTransport.name: PipeTransport,
    QueueTransport.name: QueueTransport,
    ZmqPair.name: ZmqPair,
    Iceoryx2.name: Iceoryx2,
}


def transport_unavailable(name: str) -> str | None:
    """None when the transport can run here, else why not."""
    if name == "zmq-ipc":
        try:
            import zmq  # noqa: F401
        except ImportError as error:
            return f"pyzmq not installed ({error})"
    if name == "iceoryx2":
        return iceoryx2_available()
    if name == ConnectorBorrowTransport.name:
        return borrow_supported()
    return None
