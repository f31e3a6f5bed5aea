"""Bad input: corrupted bytes in real files, and forged descriptors and names.

Design rationale. Shared memory is written by other processes; a reader
must treat every byte it maps as hostile. Hypothesis mutates real files made
by the real writers (bit flips, overwritten ranges, header fields set to
chosen values, truncation and extension) and the readers must answer with a
typed error (`CorruptFrameError`, `ProducerGoneError`) or with nothing for
that frame or channel: never another exception (an IndexError or
struct.error would mean a read outside the mapping), never a payload that
was not put, and other channels keep working.

Targets (each a Hypothesis test run programmatically, so the same code
serves pytest and `shmring check`):

* `ring_file`: a ring file with published, done and padding frames, wrapped;
  mutations anywhere, biased towards the ring header and frame headers
  (ring bytes only: the raw `RingReader` never claims a
  slot, a pool reference is a payload like any other to it; the pool's own
  bytes are `pool_ref`'s and `pool_slot`'s).
* `connector_ring`: one producer's ring corrupted while another producer
  serves the same edge through the same receiving connector; both have a
  pool, each ring carries a pool reference frame next to a ring frame, and
  the healthy producer's pool payload must be served too. A mutated
  reference mostly meets the ring frame's checksum first (it covers the
  payload), so forged references straight into a claim are `pool_ref`'s.
* `codec`: the encoding of a payload with torch and numpy tensors (tensor
  frame headers: prefix, msgpack header, leaf descriptors, data areas).
* `fallback_segment`: a per-key fallback segment file.
* `pool_ref`: the ring payload that carries a pool slot (`impl.pool.refs`):
  a real reference mutated (fields biased) or random bytes, decoded, then
  claimed against a real slot file: bounded fields that encode back to the
  same bytes, or CorruptFrameError; a claim only of the published payload.
* `pool_slot`: a real pool slot file (header fields biased, payload bytes,
  truncation and extension), claimed with its valid reference: the
  published payload from inside the file, or CorruptFrameError (the slot
  header validator `slots.slot_problem` and the claim's checks).
* `descriptors`: forged ring/fallback descriptor dicts and transfer field
  descriptors (path separators, `..`, other uids' names, wrong positions,
  negative and huge sizes, wrong types); every path opened must stay inside
  the deployment directory (or /proc).

`forged_battery` adds fixed cases: symlinks planted at a ring path, a
segment path and the deployment directory, a ring file of another uid,
wrong magic and version.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import struct
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Final

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st

from ..impl.errors import (
    ConfigurationError,
    CorruptFrameError,
    InvalidKeyError,
    ProducerGoneError,
    ShmringError,
)
from ..impl.os_seam import FILE_MODE, OsFacade
from ..spec.layout import (
    FRAME_CHECKSUM_OFFSET,
    FRAME_KEY_LENGTH_OFFSET,
    FRAME_KEY_OFFSET,
    FRAME_LENGTH_OFFSET,
    FRAME_PAYLOAD_LENGTH_OFFSET,
    FRAME_POSITION_OFFSET,
    FRAME_STATE_OFFSET,
    FRAME_TYPE_OFFSET,
    MIN_POOL_CLASS,
    POOL_CAPACITY_OFFSET,
    POOL_CHECKSUM_OFFSET,
    POOL_FLAGS_OFFSET,
    POOL_GENERATION_OFFSET,
    POOL_HEADER_LENGTH_OFFSET,
    POOL_HOLDER_PID_OFFSET,
    POOL_MAGIC_OFFSET,
    POOL_PAYLOAD_LENGTH_OFFSET,
    POOL_PRODUCER_INSTANCE_OFFSET,
    POOL_PRODUCER_PID_OFFSET,
    POOL_PRODUCER_START_TIME_OFFSET,
    POOL_REF_CHECKSUM_OFFSET,
    POOL_REF_FLAGS_OFFSET,
    POOL_REF_GENERATION_OFFSET,
    POOL_REF_INDEX_OFFSET,
    POOL_REF_LENGTH,
    POOL_REF_MARKER_OFFSET,
    POOL_REF_PAYLOAD_LENGTH_OFFSET,
    POOL_REF_RESERVED_OFFSET,
    POOL_REF_TAG_OFFSET,
    POOL_SLOT_HEADER_LENGTH,
    POOL_SLOT_INDEX_OFFSET,
    POOL_STATE_OFFSET,
    POOL_VERSION_OFFSET,
    RING_CAPACITY_OFFSET,
    RING_HEAD_OFFSET,
    RING_HEADER_LENGTH,
    RING_HEADER_LENGTH_OFFSET,
    RING_MAGIC_OFFSET,
    RING_PRODUCER_PID_OFFSET,
    RING_STATE_OFFSET,
    RING_TAIL_OFFSET,
    RING_VERSION_OFFSET,
    U32_FORMAT,
    compute_slot_capacity,
)
from ..spec.pool import compute_slot_charge
from .kit.machines import bounded_shrinking

EDGE: Final = ("enc", "dec")
OTHER_EDGE: Final = ("dec", "out")
CAPACITY: Final = 4096

# Cases per target for each budget: quick (CI) a few hundred in all, deep >= 10,000.
BUDGET_CASES: Final = {
    "quick": {
        "ring_file": 120,
        "connector_ring": 25,
        "codec": 120,
        "fallback_segment": 50,
        "descriptors": 60,
        "pool_ref": 120,
        "pool_slot": 60,
    },
    "standard": {
        "ring_file": 800,
        "connector_ring": 150,
        "codec": 800,
        "fallback_segment": 300,
        "descriptors": 300,
        "pool_ref": 800,
        "pool_slot": 300,
    },
    "deep": {
        "ring_file": 4000,
        "connector_ring": 600,
        "codec": 4000,
        "fallback_segment": 1000,
        "descriptors": 1000,
        "pool_ref": 4000,
        "pool_slot": 1000,
    },
}
TYPED_READ_ERRORS: Final = (CorruptFrameError, ProducerGoneError)


class FuzzFailure(AssertionError):
    """A reader mishandled corrupted or forged input (the message holds the Hypothesis reproducer)."""


# -- mutations -------------------------------------------------------------------------------

_INTERESTING = st.sampled_from(
    [
        0,
        1,
        15,
        16,
        17,
        255,
        4095,
        4096,
        4097,
        2**15,
        2**16 - 1,
        2**31 - 1,
        2**31,
        2**32 - 1,
        2**63,
        2**64 - 1,
    ]
)


@dataclass(frozen=True)
class Mutation:
    kind: str  # "flip", "write", "field", "truncate", "extend"
    offset: int
    width: int = 0  # field width in bytes (1, 2, 4, 8) for "field"
    value: int = 0  # bit index ("flip"), field value ("field"), bytes to add ("extend")
    data: bytes = b""  # "write"


def apply(template: bytes, mutations: list[Mutation]) -> bytes:
    buf = bytearray(template)
    for m in mutations:
        if m.kind == "flip" and m.offset < len(buf):
            buf[m.offset] ^= 1 << m.value
        elif m.kind == "write":
            buf[m.offset : m.offset + len(m.data)] = m.data[: max(0, len(buf) - m.offset)]
        elif m.kind == "field" and m.offset + m.width <= len(buf):
            buf[m.offset : m.offset + m.width] = (m.value % (1 << (8 * m.width))).to_bytes(
                m.width, "little"
            )
        elif m.kind == "truncate":
            del buf[m.offset :]
        elif m.kind == "extend":
            buf.extend(bytes(m.value))
    return bytes(buf)


def mutations(
    length: int, fields: list[tuple[int, int]], *, resize: bool = True
) -> st.SearchStrategy[list[Mutation]]:
    """1-4 mutations of a `length`-byte file; `fields` are (offset, width) of header fields.

    Without `resize` the file keeps its length: a file another process has
    mapped must not shrink under it (the kernel answers a touch past the new
    end with SIGBUS, in any mmap transport; only our own uid could do it).
    """
    anywhere = st.integers(0, max(length - 1, 0))
    in_place = [
        st.builds(Mutation, st.just("flip"), anywhere, st.just(0), st.integers(0, 7)),
        st.builds(Mutation, st.just("write"), anywhere, data=st.binary(min_size=1, max_size=24)),
        st.sampled_from(fields).flatmap(
            lambda f: st.builds(
                Mutation,
                st.just("field"),
                st.just(f[0]),
                st.just(f[1]),
                st.one_of(_INTERESTING, st.integers(0, 2 ** (8 * f[1]) - 1)),
            )
        ),
    ]
    resizing = [
        st.builds(Mutation, st.just("truncate"), st.integers(0, length)),
        st.builds(Mutation, st.just("extend"), st.just(0), st.just(0), st.integers(1, 8192)),
    ]
    return st.lists(st.one_of(*in_place, *(resizing if resize else [])), min_size=1, max_size=4)


_RING_HEADER_FIELDS: Final = [
    (RING_MAGIC_OFFSET, 8),
    (RING_VERSION_OFFSET, 4),
    (RING_HEADER_LENGTH_OFFSET, 4),
    (RING_CAPACITY_OFFSET, 8),
    (RING_PRODUCER_PID_OFFSET, 8),
    (RING_STATE_OFFSET, 4),
    (RING_HEAD_OFFSET, 8),
    (RING_TAIL_OFFSET, 8),
]
_FRAME_FIELDS: Final = [
    (FRAME_LENGTH_OFFSET, 4),
    (FRAME_TYPE_OFFSET, 2),
    (FRAME_STATE_OFFSET, 2),
    (FRAME_KEY_LENGTH_OFFSET, 4),
    (FRAME_PAYLOAD_LENGTH_OFFSET, 4),
    (FRAME_POSITION_OFFSET, 8),
    (FRAME_CHECKSUM_OFFSET, 4),
]


def _frame_fields(frame_offsets: list[int]) -> list[tuple[int, int]]:
    return [(base + offset, width) for base in frame_offsets for offset, width in _FRAME_FIELDS]


# -- files -------------------------------------------------------------------------------------


def _write(path: str, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, FILE_MODE)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


@contextlib.contextmanager
def _scratch(prefix: str) -> Iterator[str]:
    """A private deployment directory for one fuzz run, removed afterwards."""
    from ..impl.directory import ensure_deployment_directory

    scope = f"{prefix}{uuid.uuid4().hex[:10]}"
    directory = ensure_deployment_directory(scope)
    try:
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


@dataclass
class RingTemplate:
    data: bytes  # the ring file's bytes
    payloads: dict[
        str, set[bytes]
    ]  # key -> every payload ever put under it (raw, as the ring holds it)
    frames: list[int]  # file offsets of every frame header between tail and head
    keys: list[str]


def make_ring_template(directory: str) -> RingTemplate:
    """A real ring: wrapped, with padding, done, retired and published frames."""
    from ..impl.names import current_producer_identity, ring_path
    from ..impl.ring.producer import RingChannel
    from ..impl.ring.reader import RingReader

    path = ring_path(directory, "tpl", "x", current_producer_identity())
    payloads: dict[str, set[bytes]] = {}
    with RingChannel.create(path, CAPACITY) as channel, RingReader.attach(path) as reader:

        def put(key: str, size: int, tag: int) -> None:
            data = bytes((tag + i) % 251 for i in range(size))
            payloads.setdefault(key, set()).add(data)
            channel.put(key, data)

        for i in range(3):
            put(f"w{i}", 900, i)
        for i in range(3):
            reader.get(f"w{i}")
        put("a", 500, 10)
        put("b", 300, 11)
        put("c", 700, 12)  # wraps: padding before it
        put("b", 200, 13)  # re-put: the first b is retired
        reader.get("a")
        put("d", 40, 14)
        with open(path, "rb") as file:
            data = file.read()
        frames = []
        position = channel.tail
        while position < channel.head:
            offset = RING_HEADER_LENGTH + position % CAPACITY
            frames.append(offset)
            length = struct.unpack_from(U32_FORMAT, data, offset + FRAME_LENGTH_OFFSET)[0]
            position += length
        return RingTemplate(data, payloads, frames, sorted(payloads))


# -- running a Hypothesis target ------------------------------------------------------------------


def _settings(cases: int) -> settings:
    return settings(
        max_examples=cases,
        deadline=None,
        database=None,
        derandomize=False,
        phases=(Phase.explicit, Phase.generate, Phase.shrink),
        suppress_health_check=list(HealthCheck),
    )


def _run(name: str, test: Callable[[], None], seed: int) -> None:
    try:
        with bounded_shrinking():  # a cut shrink adds its note
            hypothesis_seed(seed)(test)()
    except Exception as error:  # noqa: BLE001 - reported with Hypothesis's notes
        notes = "\n".join(getattr(error, "__notes__", []))
        raise FuzzFailure(
            f"fuzz target {name}: {type(error).__name__}: {error}\n{notes}\n"
            f"    (target seed {seed}; `shmring check` prints the command that reruns it)"
        ) from error


# -- targets ----------------------------------------------------------------------------------


def fuzz_ring_file(cases: int, seed: int, count: Callable[[], None]) -> None:
    """Mutated ring files: a reader answers typed errors or original payloads, never crashes."""
    from ..impl.ring.reader import RingReader
    from ..impl.ring.results import ReceiveStatus

    with _scratch("fz") as directory:
        template = make_ring_template(directory)
        fields = _RING_HEADER_FIELDS + _frame_fields(template.frames)
        path = os.path.join(directory, "corrupt")
        healthy_path = os.path.join(directory, "healthy")
        _write(healthy_path, template.data)
        healthy = RingReader.attach(healthy_path)
        try:

            @_settings(cases)
            @given(mutations(len(template.data), fields))
            def case(planned: list[Mutation]) -> None:
                count()
                _write(path, apply(template.data, planned))
                try:
                    reader = RingReader.attach(path)
                except TYPED_READ_ERRORS:
                    return
                try:
                    for key in template.keys:
                        try:
                            got = reader.get(key)
                        except TYPED_READ_ERRORS:
                            continue
                        if got.status is ReceiveStatus.DELIVERED:
                            assert got.payload in template.payloads[key], (
                                f"delivered {len(got.payload)} bytes under {key!r} that were never put"
                            )
                    with contextlib.suppress(*TYPED_READ_ERRORS):
                        reader.statistics()
                finally:
                    reader.close()
                healthy.statistics()  # the other channel is untouched and still readable

            _run("ring_file", case, seed)
        finally:
            healthy.close()


# connector_ring's producers: a pool of one slot of the smallest class, so each
# corrupted ring carries a ring frame and a pool reference frame, and the
# healthy producer serves a pool payload next to it (issue 13).
_CONNECTOR_POOL: Final = {
    "pool_min_bytes": MIN_POOL_CLASS,
    "pool_max_bytes": MIN_POOL_CLASS,
    "pool_budget_bytes": compute_slot_charge(MIN_POOL_CLASS),
}


def fuzz_connector_ring(cases: int, seed: int, count: Callable[[], None]) -> None:
    """One producer's ring corrupted: the receiver keeps serving the other producer of the edge.

    Each ring holds a ring frame ("a0") and a pool reference frame ("p0",
    its payload in the producer's slot), so mutations of the ring's bytes
    reach the reference through the connector: either is delivered only as
    put, or not at all (a typed error or a plain status); the healthy
    producer's ring frame and pool payload are served.
    """
    from ..impl.connector import Connector, Route
    from ..impl.connector.seams import Seams, seamed_connector
    from ..impl.names import ring_path
    from .identities import borrowed_identities

    identities = borrowed_identities()
    probe_scope = f"fp{uuid.uuid4().hex[:10]}"
    corrupt_payload, good_payload = b"A" * 300, b"B" * 200
    corrupt_pooled, good_pooled = b"P" * 2000, b"Q" * 2000  # > CAPACITY / 4: a slot's
    with seamed_connector(
        probe_scope, Seams(identity=identities.live_a), ring_capacity=CAPACITY, **_CONNECTOR_POOL
    ) as probe:
        probe.put(EDGE, "a0", corrupt_payload)
        pooled = probe.put(EDGE, "p0", corrupt_pooled)
        assert pooled.route is Route.POOL, pooled
        ring = probe.ring(EDGE)
        assert ring is not None
        with open(ring.path, "rb") as file:
            length = len(file.read())
    ref_frame = RING_HEADER_LENGTH + pooled.position % CAPACITY
    ref_start = ref_frame + FRAME_KEY_OFFSET + len("p0")
    fields = (
        _RING_HEADER_FIELDS
        + _frame_fields([RING_HEADER_LENGTH, ref_frame])
        + [(ref_start + offset, width) for offset, width in _POOL_REF_FIELDS]
    )

    @_settings(cases)
    @given(mutations(length, fields, resize=False))
    def case(planned: list[Mutation]) -> None:
        count()
        scope = f"fc{uuid.uuid4().hex[:10]}"
        with (
            seamed_connector(
                scope,
                Seams(identity=identities.live_a),
                ring_capacity=CAPACITY,
                **_CONNECTOR_POOL,
            ) as bad,
            seamed_connector(
                scope,
                Seams(identity=identities.live_b),
                ring_capacity=CAPACITY,
                **_CONNECTOR_POOL,
            ) as good,
            Connector(scope, ring_capacity=CAPACITY, pool_budget_bytes=0) as receiver,
        ):
            bad.put(EDGE, "a0", corrupt_payload)
            assert bad.put(EDGE, "p0", corrupt_pooled).route is Route.POOL
            good.put(EDGE, "b0", good_payload)
            assert good.put(EDGE, "q0", good_pooled).route is Route.POOL
            path = ring_path(receiver.directory, EDGE[0], EDGE[1], bad.identity)
            with open(path, "r+b") as file:
                data = apply(file.read(), planned)
                file.seek(0)
                file.write(data)
            for key, put in (("a0", corrupt_payload), ("p0", corrupt_pooled)) * 2:
                try:
                    got = receiver.get(EDGE, key)
                except TYPED_READ_ERRORS:
                    pass
                else:
                    assert not got.delivered or got.value == put, (
                        f"a corrupted frame was delivered for {key}"
                    )
            for key, put in (("b0", good_payload), ("q0", good_pooled)):
                got = receiver.get(EDGE, key)
                assert got.delivered and got.value == put, (
                    f"the healthy producer's {key} was not served next to a corrupted ring: "
                    f"{got.status}"
                )

    _run("connector_ring", case, seed)


def _codec_templates() -> list[tuple[bytes, list[tuple[int, int]]]]:
    import numpy as np
    import torch

    from ..impl import codec

    payloads = [
        {
            "x": torch.arange(6, dtype=torch.float32).reshape(2, 3),
            "n": np.arange(5, dtype=np.int16),
        },
        {
            "h": torch.ones(4, dtype=torch.bfloat16),
            "big": torch.arange(4096, dtype=torch.int64),
            "meta": [1, "a", None],
        },
        [np.zeros((2, 2, 3), dtype=np.uint8), torch.tensor([True, False])],
        # Registered types (a tagged [tag, state] pair each) next to a slice and a leaf.
        {"point": _FuzzPoint(3, np.arange(4, dtype=np.int32)), "s": slice(1, 9, 2)},
    ]
    with contextlib.suppress(ImportError):
        from PIL import Image

        payloads.append({"image": Image.new("RGB", (4, 3), (1, 2, 3)), "tag": b"pil"})
    templates = []
    for payload in payloads:
        data = codec.encode(payload)
        # The prefix fields, and the first 64 bytes of the msgpack header (leaf descriptors live there).
        fields = [(1, 1), (2, 1), (3, 1), (4, 4), (8, 4)] + [
            (12 + i, 1) for i in range(min(64, len(data) - 12))
        ]
        templates.append((data, fields))
    return templates


class _FuzzPoint:
    """A registered application type for the codec templates (`extensions.register_type`)."""

    def __init__(self, x: int, data: Any) -> None:
        self.x = x
        self.data = data


def _register_fuzz_types() -> None:
    from ..impl import extensions

    extensions.register_type(
        _FuzzPoint,
        lambda point: {"x": point.x, "data": point.data},
        lambda state: _FuzzPoint(state["x"], state["data"]),
        name="shmring.fuzz.Point",
    )


def fuzz_codec(cases: int, seed: int, count: Callable[[], None]) -> None:
    """Mutated tensor frames: decode returns something or raises CorruptFrameError."""
    from ..impl import codec

    _register_fuzz_types()
    templates = _codec_templates()

    @_settings(cases)
    @given(
        st.sampled_from(range(len(templates))).flatmap(
            lambda i: st.tuples(st.just(i), mutations(len(templates[i][0]), templates[i][1]))
        )
    )
    def case(drawn: tuple[int, list[Mutation]]) -> None:
        count()
        index, planned = drawn
        data = apply(templates[index][0], planned)
        with contextlib.suppress(CorruptFrameError):
            codec.decode(memoryview(data))

    _run("codec", case, seed)


def fuzz_fallback_segment(cases: int, seed: int, count: Callable[[], None]) -> None:
    """Mutated fallback segments: the claim answers the original payload, nothing, or a typed error."""
    from ..impl import codec
    from ..impl.connector import Connector
    from ..impl.fallback import ClaimStatus, claim_segment
    from ..impl.names import fallback_segment_path

    scope = f"ff{uuid.uuid4().hex[:10]}"
    original = bytes(range(256)) * 8
    with Connector(scope, ring_capacity=0) as producer:
        producer.put(EDGE, "seg", original)
        path = fallback_segment_path(producer.directory, EDGE, "seg")
        with open(path, "rb") as file:
            template = file.read()
        directory = producer.directory
        producer.cleanup("seg")
    frame_fields = [(RING_HEADER_LENGTH + o, w) for o, w in _FRAME_FIELDS]

    with _scratch("fg") as scratch:
        target = fallback_segment_path(scratch, EDGE, "seg")
        del directory

        @_settings(cases)
        @given(mutations(len(template), _RING_HEADER_FIELDS + frame_fields))
        def case(planned: list[Mutation]) -> None:
            count()
            _write(target, apply(template, planned))
            try:
                claim = claim_segment(
                    scratch,
                    EDGE,
                    "seg",
                    os_facade=OsFacade(),
                    is_alive=lambda _: True,
                    decode=codec.decode,
                )
            except TYPED_READ_ERRORS:
                return
            finally:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(target)
            if claim.status is ClaimStatus.DELIVERED:
                assert claim.value == original, "a corrupted segment was delivered"

        _run("fallback_segment", case, seed)


# -- pool slots and references ----------------------------------------------------------------

_POOL_REF_FIELDS: Final = [
    (POOL_REF_MARKER_OFFSET, 1),
    (POOL_REF_TAG_OFFSET, 1),
    (POOL_REF_FLAGS_OFFSET, 1),
    (POOL_REF_RESERVED_OFFSET, 1),
    (POOL_REF_INDEX_OFFSET, 4),
    (POOL_REF_GENERATION_OFFSET, 8),
    (POOL_REF_PAYLOAD_LENGTH_OFFSET, 8),
    (POOL_REF_CHECKSUM_OFFSET, 8),
]
_POOL_SLOT_FIELDS: Final = [
    (POOL_MAGIC_OFFSET, 8),
    (POOL_VERSION_OFFSET, 4),
    (POOL_HEADER_LENGTH_OFFSET, 4),
    (POOL_CAPACITY_OFFSET, 8),
    (POOL_PRODUCER_PID_OFFSET, 8),
    (POOL_PRODUCER_START_TIME_OFFSET, 8),
    (POOL_PRODUCER_INSTANCE_OFFSET, 4),
    (POOL_SLOT_INDEX_OFFSET, 4),
    (POOL_GENERATION_OFFSET, 8),
    (POOL_STATE_OFFSET, 4),
    (POOL_HOLDER_PID_OFFSET, 4),
    (POOL_PAYLOAD_LENGTH_OFFSET, 8),
    (POOL_CHECKSUM_OFFSET, 8),
    (POOL_FLAGS_OFFSET, 4),
]
_POOL_CLASS: Final = 2 * MIN_POOL_CLASS  # the payload crosses a page of its own
_POOL_PAYLOAD: Final = bytes(range(256)) * 20  # 5,120 bytes


@dataclass(frozen=True)
class PoolTemplate:
    """A published slot: its file's bytes, its name, its producer and its reference."""

    name: str
    producer: tuple[int, int, int]
    file: bytes
    ref: bytes
    checked: bool  # the reference carries a payload checksum


@contextlib.contextmanager
def _pool_templates() -> Iterator[tuple[str, list[PoolTemplate]]]:
    """A scratch directory and a published slot of each kind (checksum off, on), as bytes."""
    from ..impl.directory import PathDirectory
    from ..impl.names import current_producer_identity
    from ..impl.pool import PoolProducer

    with _scratch("fp") as scratch:
        directory = PathDirectory(scratch, OsFacade())
        templates = []
        for instance, checked in enumerate((False, True)):
            producer_id = (*current_producer_identity(), instance)
            producer = PoolProducer(
                directory,
                producer_id,
                OsFacade(),
                min_class=_POOL_CLASS,
                max_class=_POOL_CLASS,
                budget=1 << 20,
                checksum=checked,
            )
            try:
                slot = producer.acquire(len(_POOL_PAYLOAD))
                assert slot is not None
                with slot.payload_view(len(_POOL_PAYLOAD)) as view:
                    view[:] = _POOL_PAYLOAD
                ref = producer.publish(slot, len(_POOL_PAYLOAD))
                with open(os.path.join(scratch, slot.name), "rb") as file:
                    data = file.read()
                templates.append(PoolTemplate(slot.name, producer_id, data, ref, checked))
            finally:
                producer.close()
        yield scratch, templates


def _claim_pool(scratch: str, template: PoolTemplate, ref: bytes) -> bytes | None:
    """Claim `ref` against the slot file now in `scratch`: the payload copied, or None (refused)."""
    from ..impl.directory import PathDirectory
    from ..impl.pool import PoolReader

    reader = PoolReader(PathDirectory(scratch, OsFacade()), OsFacade())
    try:
        claim = reader.claim(template.producer, ref)
    except CorruptFrameError:
        return None
    finally:
        reader.close()  # a claim's view keeps its own export of the mapping
    try:
        path = os.path.join(scratch, template.name)
        assert POOL_SLOT_HEADER_LENGTH + claim.nbytes <= os.stat(path).st_size, (
            f"a claim of {claim.nbytes} bytes reads past the slot file"
        )
        return claim.view.tobytes()
    finally:
        claim.view.release()
        claim.release()


def fuzz_pool_ref(cases: int, seed: int, count: Callable[[], None]) -> None:
    """Forged pool references: bounded fields or CorruptFrameError; a claim only of what was put."""
    from ..impl.pool import decode_ref, encode_ref, is_pool_ref

    with _pool_templates() as (scratch, templates):
        target = os.path.join(scratch, templates[0].name)

        @_settings(cases)
        @given(
            st.sampled_from(templates),
            st.one_of(
                mutations(POOL_REF_LENGTH, _POOL_REF_FIELDS).map(lambda m: ("mutated", m)),
                st.binary(max_size=2 * POOL_REF_LENGTH).map(lambda b: ("random", b)),
            ),
        )
        def case(template: PoolTemplate, drawn: tuple[str, Any]) -> None:
            count()
            kind, what = drawn
            ref = apply(template.ref, what) if kind == "mutated" else what
            try:
                fields = decode_ref(ref)
            except CorruptFrameError:
                return
            assert len(ref) == POOL_REF_LENGTH and is_pool_ref(ref), "a non-reference decoded"
            assert fields.generation > 0, "a reference to generation 0 decoded"
            again = encode_ref(
                fields.index,
                fields.generation,
                fields.payload_length,
                fields.checksum,
                fields.flags,
            )
            assert again == ref, "a decoded reference does not encode back to its bytes"
            _write(target, template.file)
            try:
                got = _claim_pool(scratch, template, ref)
            finally:
                os.unlink(target)
            if got is not None:
                assert got == _POOL_PAYLOAD, "a forged reference delivered other bytes"

        _run("pool_ref", case, seed)


def fuzz_pool_slot(cases: int, seed: int, count: Callable[[], None]) -> None:
    """Mutated pool slot files: the published payload from inside the file, or CorruptFrameError."""
    with _pool_templates() as (scratch, templates):
        length = len(templates[0].file)  # every template is one slot of the same class
        # Cuts where a validator's bound shows: inside the header, inside the payload.
        end = POOL_SLOT_HEADER_LENGTH + len(_POOL_PAYLOAD)
        cuts = st.sampled_from((POOL_SLOT_HEADER_LENGTH - 1, POOL_SLOT_HEADER_LENGTH, end - 1, end))
        cut = st.lists(st.builds(Mutation, st.just("truncate"), cuts), max_size=1)

        @_settings(cases)
        @given(st.sampled_from(templates), mutations(length, _POOL_SLOT_FIELDS), cut)
        def case(template: PoolTemplate, planned: list[Mutation], cut: list[Mutation]) -> None:
            count()
            planned = planned + cut
            target = os.path.join(scratch, template.name)
            _write(target, apply(template.file, planned))
            try:
                got = _claim_pool(scratch, template, template.ref)
            finally:
                os.unlink(target)
            if got is not None:
                assert len(got) == len(_POOL_PAYLOAD), f"a claim of {len(got)} bytes delivered"
                assert got == _POOL_PAYLOAD or not template.checked, (
                    "a corrupted payload passed its checksum"
                )

        _run("pool_slot", case, seed)


class RecordingOs(OsFacade):
    """Records every path opened or stat'ed (nothing else changes)."""

    def __init__(self) -> None:
        self.paths: list[str] = []

    def open(self, path: str, flags: int, mode: int = FILE_MODE) -> int:
        self.paths.append(path)
        return super().open(path, flags, mode)

    def stat(self, path: str) -> os.stat_result:
        self.paths.append(path)
        return super().stat(path)

    def open_at(self, dir_fd: int, name: str, flags: int, mode: int = FILE_MODE) -> int:
        self.paths.append(os.path.join(os.readlink(f"/proc/self/fd/{dir_fd}"), name))
        return super().open_at(dir_fd, name, flags, mode)

    def stat_at(self, dir_fd: int, name: str) -> os.stat_result:
        self.paths.append(os.path.join(os.readlink(f"/proc/self/fd/{dir_fd}"), name))
        return super().stat_at(dir_fd, name)

    def outside(self, directory: str) -> list[str]:
        inside = directory.rstrip("/") + "/"
        return [
            p
            for p in self.paths
            if not (p == directory or p.startswith(inside) or p.startswith("/proc/"))
        ]


_FORGED_NAMES = st.sampled_from(
    [
        "../x",
        "..",
        "/etc/passwd",
        "a/b",
        "seg.1.2.3.deadbeef/../x",
        "shmring-1000-other",
        "ring.a.b.1.2",
        "seg.1.2.3.zzzzzzzz",
        "arena.1.2.0000000g",
        "",
        ".",
        "a\x00b",
        "seg.1.2.3.deadbeef",
    ]
)
_FORGED_INTS = st.one_of(
    st.integers(-(2**70), 2**70),
    _INTERESTING,
    st.sampled_from([-1, -(2**63)]),
    st.none(),
    st.floats(allow_nan=True),
    st.text(max_size=4),
    st.booleans(),
)


def fuzz_descriptors(cases: int, seed: int, count: Callable[[], None]) -> None:
    """Forged descriptors: typed errors or a plain status, nothing opened outside the directory."""
    from ..impl.connector import Connector, Route, descriptor_from_dict
    from ..impl.registered.transfer import (
        FieldDescriptor,
        TransferDescriptor,
        TransferReceiver,
    )

    scope = f"fd{uuid.uuid4().hex[:10]}"
    seam = RecordingOs()
    with (
        Connector(scope, ring_capacity=CAPACITY, **_CONNECTOR_POOL) as producer,
        Connector(scope, ring_capacity=CAPACITY, pool_budget_bytes=0, os_facade=seam) as receiver,
        TransferReceiver(scope, os_facade=seam) as transfers,
    ):
        ring_descriptor = producer.put(EDGE, "r", b"r" * 100).to_dict()
        pooled = producer.put(EDGE, "p", b"p" * 2000)  # a slot's, its reference on the ring
        assert pooled.route is Route.POOL, pooled
        pool_descriptor = pooled.to_dict()
        too_large = compute_slot_capacity(MIN_POOL_CLASS) + 1000  # for the slot: a segment
        fallback = producer.put(EDGE, "f", b"f" * too_large)
        assert fallback.route is Route.FALLBACK, fallback
        fallback_descriptor = fallback.to_dict()
        field_template = {
            "name": "x",
            "carrier": "segment",
            "file": "seg.1.2.3.deadbeef",
            "position": 0,
            "key": "",
            "nbytes": 16,
            "dtype": "float32",
            "wire_dtype": "float32",
            "shape": [4],
            "owner_uid": os.getuid(),
            "identity": [0, 0],
        }
        directory = receiver.directory

        @_settings(cases)
        @given(
            st.sampled_from(["ring", "pool", "fallback", "field"]),
            st.dictionaries(
                st.sampled_from(
                    sorted(set(pool_descriptor) | set(fallback_descriptor) | set(field_template))
                ),
                st.one_of(_FORGED_INTS, _FORGED_NAMES, st.lists(_FORGED_INTS, max_size=3)),
                max_size=4,
            ),
            st.sets(
                st.sampled_from(sorted(set(pool_descriptor) | set(field_template))), max_size=2
            ),
        )
        def case(kind: str, changes: dict[str, Any], dropped: set[str]) -> None:
            count()
            base = {
                "ring": ring_descriptor,
                "pool": pool_descriptor,
                "fallback": fallback_descriptor,
                "field": field_template,
            }[kind]
            forged = {k: v for k, v in {**base, **changes}.items() if k not in dropped}
            del seam.paths[:]
            if kind == "field":
                try:
                    field = FieldDescriptor.from_wire(forged)
                except (
                    ShmringError,
                    ValueError,
                ):  # CorruptFrameError, InvalidKeyError, ConfigurationError
                    return
                with contextlib.suppress(ShmringError, FileNotFoundError):
                    transfers.receive(TransferDescriptor(scope, (field,), registered=False))
            else:
                route = {"ring": Route.RING, "pool": Route.POOL}.get(kind, Route.FALLBACK)
                try:
                    descriptor = descriptor_from_dict(route, forged)
                except ShmringError:
                    return
                with contextlib.suppress(ShmringError):
                    receiver.get(descriptor.edge, descriptor.key, descriptor=descriptor)
            outside = seam.outside(directory)
            assert not outside, (
                f"forged {kind} descriptor opened paths outside {directory}: {outside}"
            )

        _run("descriptors", case, seed)


TARGETS: Final = {
    "ring_file": fuzz_ring_file,
    "connector_ring": fuzz_connector_ring,
    "codec": fuzz_codec,
    "fallback_segment": fuzz_fallback_segment,
    "descriptors": fuzz_descriptors,
    "pool_ref": fuzz_pool_ref,
    "pool_slot": fuzz_pool_slot,
}


# -- fixed forged inputs -------------------------------------------------------------------------


def forged_battery(scope: str) -> int:
    """Symlinks, another uid's file, wrong magic and version: clear errors, nothing followed.

    Answers how many cases ran; FuzzFailure on the first that misbehaves.
    """
    from ..impl.connector import Connector, Route
    from ..impl.names import (
        current_producer_identity,
        deployment_directory,
        fallback_segment_path,
        ring_path,
    )
    from ..impl.ring.producer import RingChannel
    from ..impl.ring.reader import RingReader

    ran = 0
    outside = os.path.join("/dev/shm", f"shmring-outside-{uuid.uuid4().hex[:8]}")
    _write(outside, b"not yours")

    def check(condition: bool, message: str) -> None:
        if not condition:
            raise FuzzFailure(f"forged input: {message}")

    try:
        with Connector(scope, ring_capacity=CAPACITY, pool_budget_bytes=0) as receiver:
            receiver.get(EDGE, "join")
            directory = receiver.directory
            me = current_producer_identity()
            # 1. A symlink planted at a ring path: the producer refuses it and falls back.
            with Connector(scope, ring_capacity=CAPACITY, pool_budget_bytes=0) as producer:
                path = ring_path(directory, EDGE[0], EDGE[1], producer.identity)
                os.symlink(outside, path)
                descriptor = producer.put(EDGE, "k", b"payload")
                check(
                    descriptor.route is Route.FALLBACK,
                    f"a symlinked ring path was used: {descriptor}",
                )
                check(EDGE in producer.failed_edges(), "ring setup over a symlink did not fail")
                got = receiver.get(EDGE, "k")
                check(
                    got.delivered and got.value == b"payload",
                    f"fallback after a symlinked ring: {got}",
                )
            os.unlink(path)
            ran += 1
            # 2. A symlink at a ring path a reader attaches: typed error, the target is untouched.
            try:
                os.symlink(outside, os.path.join(directory, "ring.x.y.1.1"))
                try:
                    RingReader.attach(os.path.join(directory, "ring.x.y.1.1")).close()
                    check(False, "a reader attached through a symlink")
                except CorruptFrameError:
                    pass
            finally:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(directory, "ring.x.y.1.1"))
            ran += 1
            # 3. A symlink planted at a fallback segment name: never followed.
            seg = fallback_segment_path(directory, EDGE, "planted")
            os.symlink(outside, seg)
            try:
                try:
                    got = receiver.get(EDGE, "planted")
                    check(not got.delivered, "a symlinked segment was delivered")
                except CorruptFrameError:
                    pass
                except OSError as error:
                    check(
                        False,
                        f"a symlinked segment answered a bare {type(error).__name__}: {error}",
                    )
            finally:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(seg)
            ran += 1
            # 4. A ring file of another uid, and 5./6. wrong magic and version.
            other = ring_path(directory, "o", "p", me)
            with RingChannel.create(other, CAPACITY) as channel:
                channel.put("k", b"x")
                for offset, value, width in (
                    (None, 0, 0),
                    (RING_MAGIC_OFFSET, 0x1234, 8),
                    (RING_VERSION_OFFSET, 99, 4),
                ):
                    if offset is None:
                        if os.getuid() != 0:
                            continue  # only root can give a file away
                        os.chown(other, 1, 1)
                    else:
                        os.chown(other, os.getuid(), os.getgid())
                        with open(other, "r+b") as file:
                            file.seek(offset)
                            original = file.read(width)
                            file.seek(offset)
                            file.write(value.to_bytes(width, "little"))
                    try:
                        RingReader.attach(other).close()
                        check(False, f"attached a ring with a forged header (offset={offset})")
                    except CorruptFrameError as error:
                        check(str(error) != "", "empty error message")
                    if offset is not None:
                        with open(other, "r+b") as file:
                            file.seek(offset)
                            file.write(original)
                    ran += 1
                os.chown(other, os.getuid(), os.getgid())
        # 7. A symlink planted at the deployment directory itself.
        link_scope = f"{scope}l"
        link = deployment_directory(link_scope)
        target_dir = os.path.join("/dev/shm", f"shmring-outside-dir-{uuid.uuid4().hex[:8]}")
        os.mkdir(target_dir, 0o700)
        os.symlink(target_dir, link)
        try:
            try:
                with Connector(link_scope, ring_capacity=CAPACITY, pool_budget_bytes=0) as victim:
                    victim.put(EDGE, "k", b"x")
                check(False, "a connector used a symlinked deployment directory")
            except ConfigurationError:
                pass
            check(
                os.listdir(target_dir) == [],
                f"files created through a symlink: {os.listdir(target_dir)}",
            )
        finally:
            os.unlink(link)
            shutil.rmtree(target_dir, ignore_errors=True)
        ran += 1
        # 8. Forged stage names and scopes.
        for bad_edge in (("a/b", "c"), ("..", "c"), ("a", "b.c"), ("a\x00", "b")):
            with Connector(scope, ring_capacity=CAPACITY, pool_budget_bytes=0) as producer:
                try:
                    producer.put(bad_edge, "k", b"x")
                    check(False, f"put on a forged edge {bad_edge!r}")
                except InvalidKeyError:
                    pass
            ran += 1
        for bad_scope in ("../x", "a/b", "", ".hidden", "x" * 65):
            try:
                Connector(bad_scope)
                check(False, f"scope {bad_scope!r} accepted")
            except ConfigurationError:
                pass
            ran += 1
    finally:
        os.unlink(outside)
    return ran


# -- campaign -------------------------------------------------------------------------------------


def run_fuzz(budget: str, seed: int, progress: Callable[[int, int | None], None]) -> dict[str, int]:
    """Every target with the budget's case counts, plus the forged battery."""
    import logging

    plan = BUDGET_CASES[budget]
    total = sum(plan.values())
    done = 0

    def count() -> None:
        nonlocal done
        done += 1
        if done % 25 == 0:
            progress(done, total)

    logger = logging.getLogger("shmring")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    counts: dict[str, int] = {}
    try:
        progress(0, total)
        for name, target in TARGETS.items():
            before = done
            target(plan[name], seed, count)
            counts[f"fuzz {name}"] = done - before
        counts["forged_cases"] = forged_battery(f"fb{seed % 10000}x{uuid.uuid4().hex[:6]}")
    finally:
        logger.setLevel(level)
    progress(done, total)
    counts["fuzz_cases"] = done
    return counts


__all__ = [
    "BUDGET_CASES",
    "TARGETS",
    "FuzzFailure",
    "Mutation",
    "RecordingOs",
    "apply",
    "forged_battery",
    "make_ring_template",
    "mutations",
    "run_fuzz",
]
