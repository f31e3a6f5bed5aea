"""Publication cohorts (`spec.cohort`): puts of one edge that become visible together, or never.

Design rationale. A cohort (vllm-omni's ``publication_cohort``: the outputs
of one model step) must not be seen in part, on any route, by any receiver,
in any process, and must never be seen at all when its producer dies inside
it. Publishing the members one after another cannot give that (a receiver
polls between two publications), so a member is published at once, as any
put, but *tagged*: its payload sits behind a 16-byte envelope naming its
cohort (layout: `spec.layout`, publication cohorts). A receiver that meets
an envelope looks at the producer's *gate* of that edge, one u64 in a small
file of the producer's (``cohort.<src>.<dst>.<p>.<instance>``), and delivers
the member only once the gate has reached its number; otherwise the member
is left exactly as it is (`CohortPending`, raised from the route's decode
callback, like a dead producer's frame) and the get answers NOT_FOUND. The
commit is the producer's one store of the gate: every member becomes
deliverable in that instant. A producer killed inside the cohort never
stores it (and its frames are undeliverable anyway: `spec.producers`).

The producer numbers cohorts per edge (`CohortWriter`); a put checks one
dict that is empty outside cohorts. A receiver maps gates read-only, checked
ours like every mapped file, and keeps the mappings (`CohortGates`). Puts of
other edges, and puts of this edge by other producers, are not members.

A borrowed get (``borrow=True``) of a member gets an owned copy: members are
a model step's outputs, small, and the envelope sits in front of the leaves.

Every system call goes through the `OsFacade` the caller gives.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
import struct
import weakref
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Final

from ...spec.layout import (
    CODEC_FRAMED_MARKER,
    COHORT_ENVELOPE_FORMAT,
    COHORT_ENVELOPE_LENGTH,
    COHORT_ENVELOPE_VERSION,
    COHORT_GATE_COMMITTED_OFFSET,
    COHORT_GATE_FILE_LENGTH,
)
from .. import codec
from ..directory import Directory, check_private_file
from ..errors import CorruptFrameError
from ..frame_io import u64_words
from ..names import ConnectorIdentity, Edge, cohort_gate_file_name
from ..os_seam import FILE_MODE, OPEN_FLAGS_CREATE, OPEN_FLAGS_READONLY, OsFacade

_ENVELOPE: Final = struct.Struct(COHORT_ENVELOPE_FORMAT)
_GATE_WORD: Final = COHORT_GATE_COMMITTED_OFFSET // 8
MAX_KEPT_GATES: Final = 32  # receiver-side gate mappings kept (least recently used out)


class CohortPending(Exception):
    """A member of a cohort its producer has not committed: left as it is, not delivered."""


def is_member(view: Any) -> bool:
    """Whether a stored payload (bytes-like, at least one byte) starts with a cohort envelope."""
    return (
        len(view) >= COHORT_ENVELOPE_LENGTH
        and view[0] == CODEC_FRAMED_MARKER
        and view[1] == COHORT_ENVELOPE_VERSION
    )


def member_number(view: Any) -> int:
    """The cohort number of a member's envelope (CorruptFrameError for a malformed one)."""
    marker, version, zero, reserved, number = _ENVELOPE.unpack_from(view)
    if zero or reserved or number == 0:
        raise CorruptFrameError(
            f"corrupt cohort envelope: reserved={zero}/{reserved} number={number}"
        )
    return int(number)


# -- producer ---------------------------------------------------------------------


class MemberPlan:
    """An encoding (`codec.EncodePlan`) behind the envelope of cohort `number`.

    What the routes ask of a plan (`nbytes`, `whole`, `parts`, `write_into`),
    for the envelope followed by the inner plan's bytes.
    """

    __slots__ = ("_envelope", "_inner", "leaf_count", "nbytes")

    def __init__(self, inner: codec.EncodePlan, number: int) -> None:
        self._inner = inner
        self._envelope = _ENVELOPE.pack(CODEC_FRAMED_MARKER, COHORT_ENVELOPE_VERSION, 0, 0, number)
        self.nbytes = COHORT_ENVELOPE_LENGTH + inner.nbytes
        self.leaf_count = inner.leaf_count

    def whole(self) -> bytes | None:
        inner = self._inner.whole()
        return None if inner is None else self._envelope + inner

    def parts(self) -> tuple[bytes, Any] | None:
        parts = self._inner.parts()
        return None if parts is None else (self._envelope + parts[0], parts[1])

    def write_into(self, buf: Any) -> int:
        view = memoryview(buf).cast("B") if not isinstance(buf, memoryview) else buf
        if view.format != "B" or view.ndim != 1:
            view = view.cast("B")
        view[:COHORT_ENVELOPE_LENGTH] = self._envelope
        with view[COHORT_ENVELOPE_LENGTH:] as rest:
            self._inner.write_into(rest)
        return self.nbytes


class _Gate:
    """The producer's gate of one edge: its file, mapped, and the cohort open on it."""

    __slots__ = ("committed", "depth", "fd", "mapping", "name", "number", "words")

    def __init__(self, name: str, fd: int, mapping: mmap.mmap, words: memoryview) -> None:
        self.name = name
        self.fd = fd
        self.mapping = mapping
        self.words = words
        self.committed = 0  # the gate's value (we are its only writer)
        self.number = 0  # the cohort open now; 0 when none
        self.depth = 0  # nested opens of it


class CohortWriter:
    """One producer's cohort gates (`spec.cohort`'s CohortTable). Not thread-safe: the connector's lock.

    `numbers` is what a put reads: edge -> number of the cohort open there
    (empty outside cohorts).
    """

    def __init__(self, directory: Directory, producer: ConnectorIdentity, os_facade: OsFacade):
        self._dir = directory
        self._producer = producer
        self._os = os_facade
        self._gates: dict[Edge, _Gate] = {}
        self.numbers: dict[Edge, int] = {}
        self.committed = 0  # cohorts committed (health)

    def open(self, edge: Edge) -> int:
        """`spec.cohort.process_cohort_open`: open (or join) the edge's cohort; its number."""
        gate = self._gates.get(edge)
        if gate is None:
            gate = self._create(edge)
            self._gates[edge] = gate
        if gate.depth == 0:
            gate.number = gate.committed + 1
        gate.depth += 1
        self.numbers[edge] = gate.number
        return gate.number

    def commit(self, edge: Edge) -> bool:
        """`spec.cohort.process_cohort_commit`: the outermost leave stores the gate (the commit)."""
        gate = self._gates.get(edge)
        if gate is None or gate.depth == 0:
            return False
        gate.depth -= 1
        if gate.depth:
            return False
        gate.committed = gate.number
        gate.number = 0
        del self.numbers[edge]
        gate.words[_GATE_WORD] = gate.committed  # one aligned 8-byte store: every member shows
        self.committed += 1
        return True

    def _create(self, edge: Edge) -> _Gate:
        name = cohort_gate_file_name(edge, self._producer)
        fd = self._dir.open(name, OPEN_FLAGS_CREATE, FILE_MODE)
        try:
            self._os.ftruncate(fd, COHORT_GATE_FILE_LENGTH)
            mapping = self._os.mmap(fd, COHORT_GATE_FILE_LENGTH)
        except BaseException:
            with contextlib.suppress(OSError):
                self._os.close(fd)
            with contextlib.suppress(OSError):
                self._dir.unlink(name)
            raise
        with memoryview(mapping) as raw:
            words = u64_words(raw)
        return _Gate(name, fd, mapping, words)

    def close(self) -> list[BaseException]:
        """Unmap and remove every gate file; answers the failures (a later close retries them)."""
        self.numbers.clear()
        failures: list[BaseException] = []
        for edge, gate in list(self._gates.items()):
            if gate.mapping is not None:
                gate.words.release()
                gate.mapping.close()
                gate.mapping = None  # type: ignore[assignment]
            if gate.fd >= 0:
                with contextlib.suppress(OSError):
                    self._os.close(gate.fd)
                gate.fd = -1
            try:
                self._dir.unlink(gate.name)
            except FileNotFoundError:
                pass
            except OSError as error:
                failures.append(error)
                continue
            del self._gates[edge]
        return failures


# -- receiver ---------------------------------------------------------------------


class CohortGates:
    """A receiver's read-only view of producers' gates. Not thread-safe: the connector's lock."""

    def __init__(self, directory: Directory, os_facade: OsFacade) -> None:
        self._dir = directory
        self._os = os_facade
        # (edge, producer) -> (mapping, u64 words), least recently used first
        self._kept: OrderedDict[tuple[Edge, ConnectorIdentity], tuple[mmap.mmap, memoryview]] = (
            OrderedDict()
        )

    def committed(self, edge: Edge, producer: ConnectorIdentity) -> int:
        """The producer's gate of `edge` (0 when it has none: nothing committed)."""
        slot = (edge, producer)
        kept = self._kept.get(slot)
        if kept is None:
            kept = self._map(edge, producer)
            if kept is None:
                return 0
            self._kept[slot] = kept
            while len(self._kept) > MAX_KEPT_GATES:
                _, (mapping, words) = self._kept.popitem(last=False)
                words.release()
                mapping.close()
        else:
            self._kept.move_to_end(slot)
        return int(kept[1][_GATE_WORD])

    def _map(self, edge: Edge, producer: ConnectorIdentity) -> tuple[mmap.mmap, memoryview] | None:
        name = cohort_gate_file_name(edge, producer)
        try:
            fd = self._dir.open(name, OPEN_FLAGS_READONLY)
        except FileNotFoundError:
            return None  # closed (its members went with it) or died before its first cohort
        try:
            info = self._os.fstat(fd)
            problem = check_private_file(os.path.join(self._dir.path, name), info)
            if problem is not None or info.st_size < COHORT_GATE_FILE_LENGTH:
                raise CorruptFrameError(f"cohort gate is not trusted: {problem or info.st_size}")
            mapping = self._os.mmap(fd, COHORT_GATE_FILE_LENGTH, writable=False)
        finally:
            self._os.close(fd)
        with memoryview(mapping) as raw:
            return mapping, u64_words(raw)

    def open_member(self, edge: Edge, producer: ConnectorIdentity, view: Any) -> memoryview:
        """The payload behind a member's envelope, once its cohort is committed; else `CohortPending`."""
        number = member_number(view)
        if self.committed(edge, producer) < number:
            raise CohortPending(number)
        return memoryview(view)[COHORT_ENVELOPE_LENGTH:]

    def decoder(
        self, edge: Edge, producer: ConnectorIdentity, decode: Callable[[Any], Any] = codec.decode
    ) -> Callable[[memoryview], Any]:
        """`decode` for a stored payload of `producer` on `edge` that may be a member."""

        def decode_member(view: memoryview) -> Any:
            if is_member(view):
                with self.open_member(edge, producer, view) as inner:
                    return decode(inner)
            return decode(view)

        return decode_member

    def borrowed(self, edge: Edge, producer: ConnectorIdentity, payload: Any) -> tuple[int, Any]:
        """A member met by a borrowed get: (stored bytes, an owned copy of its value).

        `payload` is the claimed `BorrowedPayload`; nothing keeps it, so its
        release runs as soon as the caller drops it (the frame is DONE then).
        """
        size = payload.nbytes
        head = ctypes.string_at(payload.address, min(size, COHORT_ENVELOPE_LENGTH))
        number = member_number(head)
        if self.committed(edge, producer) < number:
            raise CohortPending(number)
        import numpy  # a borrowed get decodes with numpy anyway

        whole = numpy.asarray(payload)
        try:
            with memoryview(whole)[COHORT_ENVELOPE_LENGTH:] as inner:
                return size, codec.decode(inner)
        finally:
            del whole

    def close(self) -> None:
        """Unmap every kept gate. Idempotent."""
        while self._kept:
            _, (mapping, words) = self._kept.popitem()
            words.release()
            mapping.close()


def is_borrowed_member(payload: Any) -> bool:
    """Whether a claimed `BorrowedPayload` holds a cohort member."""
    size = payload.nbytes
    return size >= COHORT_ENVELOPE_LENGTH and is_member(
        ctypes.string_at(payload.address, COHORT_ENVELOPE_LENGTH)
    )


def _gone() -> weakref.ref[Any]:
    """A weak reference whose object is already gone (a borrowed get that holds nothing)."""

    class _Nothing:
        pass

    return weakref.ref(_Nothing())


NOTHING_HELD: Final = _gone()

__all__ = [
    "NOTHING_HELD",
    "CohortGates",
    "CohortPending",
    "CohortWriter",
    "MemberPlan",
    "is_borrowed_member",
    "is_member",
    "member_number",
]
