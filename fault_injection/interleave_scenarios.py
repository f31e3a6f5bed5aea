"""The interleaving explorer's scenarios: small worlds of one producer and its readers.

Design rationale. Each scenario builds, unscheduled, a world over real
mappings (a ring file, a fallback directory, an arena, a pool's slots and
their ring), gives every actor a short script of real `impl` calls, and
checks two things:

* at every schedule point, the shared memory as the model sees it: the ring
  header and frames decoded with `spec.layout` into a `spec.ring.RingState`
  and passed to `spec.invariants` (positions, tiling, one deliverable
  version per key), plus what the model cannot say about bytes: every frame
  between tail and head carries its own position and checksum and one of
  the payloads put under its key, states only move forward, head and tail
  never go back, and a live lease's bytes never change;
* at the end, after a drain that takes whatever is still deliverable: every
  delivered payload is one that was put under that key, byte for byte, no
  version is delivered twice, the newest version of each key is delivered
  exactly once (or was retired by a cancel or close that said so), and
  nothing stays pinned or left behind.

Scenario factories take the classes to run, so tests can hand them a
deliberately broken reader or producer (see `test_interleave`).
"""

from __future__ import annotations

import contextlib
import mmap
import os
import shutil
import tempfile
from collections.abc import Callable
from typing import Any, Final

from ..impl import frame_io
from ..impl.frame_io import FrameHeader, SharedWords, compute_checksum
from ..impl.ring.frames import segment_problem
from ..impl.ring.producer import RingChannel
from ..impl.ring.reader import RingReader
from ..impl.ring.results import ReceiveStatus
from ..spec import invariants
from ..spec.layout import (
    DATA_FRAME_TYPE,
    FRAME_ALIGNMENT,
    FRAME_HEADER_LENGTH,
    FRAME_KEY_OFFSET,
    FRAME_STATE_CLAIMED,
    FRAME_STATE_DONE,
    FRAME_STATE_PUBLISHED,
    FRAME_STATE_RETIRED,
    PADDING_FRAME_TYPE,
    RING_HEADER_LENGTH,
    RING_STATE_CLOSED,
)
from ..spec.ring import ConsumeMode, Frame, PutStatus, RingState
from .interleave import (
    Scenario,
    ScheduledWords,
    Scheduler,
    SchedulingOs,
    install_words,
)
from .kit.payloads import tagged_payload

SHM_ROOT: Final = "/dev/shm"
RING_CAPACITY: Final = 4096
# 2-byte keys and 900-byte payloads: 944-byte frames, four fill a 4 KiB ring
# (admission stops at 1024), so the fifth put needs a reclaim and wraps.
PAYLOAD_LENGTH: Final = 900
# How often a script retries an answer that depends on another actor (BUSY, FULL, not yet put).
RETRIES: Final = 3

_FORWARD: Final = {
    FRAME_STATE_PUBLISHED: {FRAME_STATE_CLAIMED, FRAME_STATE_DONE, FRAME_STATE_RETIRED},
    FRAME_STATE_CLAIMED: {FRAME_STATE_DONE},
    FRAME_STATE_DONE: set(),
    FRAME_STATE_RETIRED: set(),
}


def payload_for(key: str, version: int, length: int = PAYLOAD_LENGTH) -> bytes:
    """The kit's tagged bytes for version `version` of `key` (a torn or foreign copy shows)."""
    return tagged_payload(f"{key}/v{version}", length)


def _named(name: str, *classes: type[Any]) -> str:
    """The scenario's name; with a class that is not the real one, the name says which."""
    odd = [cls.__name__ for cls in classes if cls not in (RingChannel, RingReader)]
    return f"{name}[{','.join(odd)}]" if odd else name


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise AssertionError(message)


class Observer:
    """A private read-only mapping of a ring-layout file (ring or arena), read for the checks.

    Unscheduled, and through `frame_io`'s accessors and header readers, so no
    layout fact is restated here.
    """

    def __init__(self, path: str, capacity: int) -> None:
        self.capacity = capacity
        self._fd = os.open(path, os.O_RDONLY)
        self._map = mmap.mmap(self._fd, 0, prot=mmap.PROT_READ)
        self.view = memoryview(self._map)
        self._words = SharedWords(self.view)

    @property
    def fd(self) -> int:
        """The observer's descriptor of the file (to fstat it)."""
        return self._fd

    def head(self) -> int:
        return frame_io.load_head_acquire(self._words)

    def tail(self) -> int:
        return frame_io.load_tail_acquire(self._words)

    def closed(self) -> bool:
        return frame_io.load_ring_state_acquire(self._words) == RING_STATE_CLOSED

    def frames(self, tail: int, head: int) -> list[tuple[int, int, FrameHeader]]:
        """(position, offset, header) of each frame from `tail` to `head`, as the headers say.

        A data frame too close to the end for a whole header reads as its
        first three fields and zeros. The walk stops at a length that cannot
        tile (`check_ring_frames_tile` says what is wrong with it).
        """
        found: list[tuple[int, int, FrameHeader]] = []
        position = tail
        while position < head and len(found) <= self.capacity // FRAME_ALIGNMENT:
            offset = RING_HEADER_LENGTH + position % self.capacity
            length, frame_type, state = frame_io.load_frame_prefix(self.view, offset)
            if (
                frame_type == DATA_FRAME_TYPE
                and self.capacity - position % self.capacity >= FRAME_HEADER_LENGTH
            ):
                header = frame_io.read_frame_header(self.view, offset)
            else:
                header = FrameHeader(length, frame_type, state, 0, 0, 0, 0)
            found.append((position, offset, header))
            if length <= 0 or length % FRAME_ALIGNMENT:
                break
            position += length
        return found

    def key_and_payload(self, offset: int, header: FrameHeader) -> tuple[bytes, bytes]:
        key_start = offset + FRAME_KEY_OFFSET
        payload_start = key_start + header.key_length
        return (
            bytes(self.view[key_start:payload_start]),
            bytes(self.view[payload_start : payload_start + header.payload_length]),
        )

    def close(self) -> None:
        self._words.release()
        self.view.release()
        self._map.close()
        os.close(self._fd)


# -- the ring ----------------------------------------------------------------------


class Deliveries:
    """What was put and what was delivered, checked against each other at the end."""

    def __init__(self) -> None:
        self.versions: dict[str, list[bytes]] = {}  # key -> payloads put (in order)
        self.live: dict[str, bytes | None] = {}  # key -> the newest version not retired
        self.delivered: list[tuple[str, str, bytes]] = []  # (who, key, payload)

    def putting(self, key: str, payload: bytes) -> None:
        """Before a put: its bytes may appear in shared memory from now on."""
        self.versions.setdefault(key, []).append(payload)

    def put_done(self, key: str, payload: bytes, published: bool) -> None:
        if published:
            self.live[key] = payload

    def retired(self, key: str) -> None:
        """A cancel or close answered that it retired the key's live version."""
        self.live[key] = None

    def deliver(self, who: str, key: str, payload: bytes) -> None:
        self.delivered.append((who, key, payload))

    def check_payload(self, key: str, payload: bytes, where: str) -> None:
        _require(
            payload in self.versions.get(key, ()),
            f"{where}: bytes for key={key!r} are no version put under it: {payload[:24]!r}...",
        )

    def check(self) -> None:
        seen: set[bytes] = set()
        for who, key, payload in self.delivered:
            self.check_payload(key, payload, f"{who} delivered")
            _require(payload not in seen, f"{who} delivered {key!r} {payload[:12]!r} twice")
            seen.add(payload)
        for key, newest in self.live.items():
            if newest is not None:
                _require(newest in seen, f"the newest version of {key!r} was never delivered")


class RingWorld:
    """A ring file, its producer, readers and a private read-only mapping for the checks."""

    def __init__(
        self,
        scheduler: Scheduler,
        readers: int,
        *,
        channel_class: type[RingChannel] = RingChannel,
        reader_class: type[RingReader] = RingReader,
        preload: int = 0,
    ) -> None:
        self.directory = tempfile.mkdtemp(prefix="shmring-il-", dir=SHM_ROOT)
        self.path = os.path.join(self.directory, "ring")
        self.os = SchedulingOs(scheduler)
        self.log = Deliveries()
        self.channel = channel_class.create(
            self.path, RING_CAPACITY, os_facade=self.os, producer=(os.getpid(), 1)
        )
        self.readers = [reader_class.attach(self.path, os_facade=self.os) for _ in range(readers)]
        self.observer = Observer(self.path, RING_CAPACITY)
        for index in range(preload):
            key = f"k{index}"
            payload = payload_for(key, 0)
            self.log.putting(key, payload)
            outcome = self.channel.put(key, payload)
            assert outcome.status is PutStatus.PUBLISHED, outcome
            self.log.put_done(key, payload, True)
        install_words(self.channel, scheduler)
        for reader in self.readers:
            install_words(reader, scheduler)
        self.states: dict[int, int] = {}  # position -> state last seen, for [tail, head)
        self.head = self.tail = 0
        self.leases: list[tuple[Any, bytes]] = []  # (lease, its payload) while not released
        self._snapshot: tuple[bytes, int] | None = None  # what the last check_step saw
        self.closed_retired = 0  # ring_cancel_close: what the producer's close answered
        self.live_at_close: list[str] = []  # ring_cancel_close: keys live when it closed
        self.actors: list[tuple[str, Callable[[], object]]] = []

    # -- scripts' helpers -------------------------------------------------------------

    def put(self, key: str, version: int, *, retries: int = RETRIES) -> PutStatus:
        """Put a new version; retry FULL (a reader may free space) with a yield between."""
        payload = payload_for(key, version)
        self.log.putting(key, payload)
        scheduler = self.os._scheduler
        for attempt in range(retries + 1):
            scheduler.point(f"put {key} v{version}")
            outcome = self.channel.put(key, payload)
            if outcome.status is not PutStatus.FULL:
                break
            if attempt < retries:
                scheduler.yield_turn("full")
        self.log.put_done(key, payload, outcome.status is PutStatus.PUBLISHED)
        return outcome.status

    def get(
        self,
        who: str,
        reader: RingReader,
        key: str,
        *,
        mode: ConsumeMode = ConsumeMode.COPY_OUT,
        retries: int = RETRIES,
        descriptor: tuple[int, bytes] | None = None,
        decode: Callable[[memoryview], Any] | None = None,
    ) -> Any:
        """Get until delivered; BUSY and NOT_FOUND are retried after a yield.

        `descriptor` (position, the payload put there): a get of exactly that
        frame, which must deliver exactly those bytes or answer STALE.
        """
        scheduler = self.os._scheduler
        position = None if descriptor is None else descriptor[0]
        for attempt in range(retries + 1):
            scheduler.point(f"get {key}" + ("" if position is None else f"@{position}"))
            received = reader.get(key, position, mode=mode, decode=decode)
            if received.status is ReceiveStatus.STALE:
                break  # final: the descriptor's frame is gone for good
            if received.status is ReceiveStatus.DELIVERED:
                if descriptor is not None:
                    _require(
                        received.position == position and received.payload == descriptor[1],
                        f"{who}'s descriptor get of {key!r}@{position} delivered the frame at "
                        f"{received.position}: {received.payload[:16]!r}",
                    )
                if mode is ConsumeMode.LEASE:
                    lease = received.payload
                    payload = bytes(lease.view)
                    self.leases.append((lease, payload))
                    self.log.deliver(who, key, payload)
                    return lease
                self.log.deliver(who, key, received.payload)
                return received.payload
            if attempt < retries:
                scheduler.yield_turn(received.status.value)
        return None

    def release(self, lease: Any) -> None:
        self.os._scheduler.point(f"release lease @{lease.position}")
        self.leases = [(held, payload) for held, payload in self.leases if held is not lease]
        lease.release()

    # -- checks ----------------------------------------------------------------------

    def decode(self) -> RingState:
        """The ring as the model sees it, read from the shared memory."""
        observer = self.observer
        tail, head = observer.tail(), observer.head()
        frames: list[Frame] = []
        for position, offset, header in observer.frames(tail, head):
            if header.frame_type != DATA_FRAME_TYPE:
                frames.append(Frame(position, header.length, header.frame_type, header.state))
                continue
            key_bytes, payload = observer.key_and_payload(offset, header)
            _require(header.position == position, f"frame at {position} says {header.position}")
            _require(
                compute_checksum(key_bytes, payload) == header.checksum,
                f"torn or foreign frame at position={position}: checksum mismatch",
            )
            key = key_bytes.decode("utf-8", "replace")
            self.log.check_payload(key, payload, f"frame at position={position}")
            frames.append(
                Frame(
                    position,
                    header.length,
                    header.frame_type,
                    header.state,
                    key,
                    header.payload_length,
                    payload,
                )
            )
        return RingState(RING_CAPACITY, head, tail, frames, observer.closed())

    def check_step(self, label: str) -> None:
        # Unchanged memory (most points are loads) was checked already.
        snapshot = (bytes(self.observer.view), len(self.leases))
        if snapshot == self._snapshot:
            return
        self._snapshot = snapshot
        ring = self.decode()
        invariants.check_ring_positions(ring)
        invariants.check_ring_frames_tile(ring)
        invariants.check_ring_one_version_per_key(ring)
        _require(ring.head >= self.head and ring.tail >= self.tail, "head or tail went back")
        self.head, self.tail = ring.head, ring.tail
        states = {}
        for frame in ring.frames:
            if frame.frame_type == PADDING_FRAME_TYPE:
                continue
            before = self.states.get(frame.position)
            _require(
                before is None or frame.state == before or frame.state in _FORWARD[before],
                f"frame at {frame.position} went from state {before} to {frame.state}",
            )
            states[frame.position] = frame.state
        self.states = states
        for lease, payload in self.leases:
            if not lease.released:
                _require(
                    bytes(lease.view) == payload,
                    f"the bytes under a live lease at {lease.position} changed",
                )

    def check_index(self, reader: RingReader) -> None:
        """The reader's index, between two of its gets, against the ring as the model sees it.

        `spec.invariants.check_reader_index`: every entry at or above the tail
        names a frame of its key there, every deliverable frame the reader has
        seen is its key's entry, and nothing it answers is a frame the model
        would not deliver. Called by a reader's own script (its index is its
        own business mid-get), unscheduled.
        """
        invariants.check_reader_index(self.decode(), reader.index_snapshot())

    def drain(self) -> None:
        """Unscheduled: release every lease, take what is still deliverable, reclaim all."""
        for lease, _ in self.leases:
            lease.release()
        self.leases = []
        for key in self.log.versions:
            while True:
                received = self.readers[0].get(key)
                if received.status is not ReceiveStatus.DELIVERED:
                    break
                self.log.deliver("drain", key, received.payload)
        if not self.channel.closed:
            self.channel._reclaim()
            _require(
                self.channel.tail == self.channel.head,
                f"frames stay pinned after the drain: tail={self.channel.tail} "
                f"head={self.channel.head}",
            )

    def check_end(self) -> None:
        self.check_step("end")
        self.drain()
        self.log.check()
        ring = self.decode()
        invariants.check_ring_closed_holds_nothing(ring)

    def close(self) -> None:
        for lease, _ in self.leases:
            with contextlib.suppress(BufferError):
                lease.release()
        self.observer.close()
        for reader in self.readers:
            reader.close()
        self.channel.close()
        shutil.rmtree(self.directory, ignore_errors=True)


def ring_scenario(
    summary: str, readers: int, preload: int = 0
) -> Callable[[Callable[[RingWorld, Scheduler], None]], Callable[..., Scenario]]:
    """Make a scenario factory of a script that gives a fresh `RingWorld` its actors.

    The factory takes the classes to run (`channel_class`, `reader_class`), so
    a test can hand it a deliberately broken one; the scenario's name then
    says which.
    """

    def factory_of(script: Callable[[RingWorld, Scheduler], None]) -> Callable[..., Scenario]:
        def factory(
            channel_class: type[RingChannel] = RingChannel,
            reader_class: type[RingReader] = RingReader,
        ) -> Scenario:
            def build(scheduler: Scheduler) -> RingWorld:
                world = RingWorld(
                    scheduler,
                    readers,
                    channel_class=channel_class,
                    reader_class=reader_class,
                    preload=preload,
                )
                script(world, scheduler)
                return world

            return Scenario(_named(script.__name__, channel_class, reader_class), build, summary)

        factory.__name__ = factory.__qualname__ = script.__name__
        factory.__doc__ = script.__doc__
        return factory

    return factory_of


@ring_scenario("two readers claim k0 while the producer re-puts it", readers=2, preload=1)
def ring_claim_race(world: RingWorld, scheduler: Scheduler) -> None:
    """Two readers race for k0 while the producer re-puts it: one claim, or one retire."""
    r0, r1 = world.readers
    world.actors = [
        ("P", lambda: world.put("k0", 1)),
        ("R0", lambda: world.get("R0", r0, "k0", retries=1)),
        # R1 decodes in place under the lock (the connector's path).
        ("R1", lambda: world.get("R1", r1, "k0", retries=1, decode=bytes)),
    ]


@ring_scenario("puts of k0, k1 against a reader's scan and claims", readers=1)
def ring_publish(world: RingWorld, scheduler: Scheduler) -> None:
    """The reader scans and claims while the producer publishes two frames."""
    (r0,) = world.readers

    def producer() -> None:
        world.put("k0", 0)
        world.put("k1", 0)

    def reader() -> None:
        world.get("R0", r0, "k1", retries=2)
        world.get("R0", r0, "k0", retries=1)

    world.actors = [("P", producer), ("R0", reader)]


@ring_scenario("claim k0 of a full ring while k4 wraps onto it", readers=1, preload=4)
def ring_wrap_reclaim(world: RingWorld, scheduler: Scheduler) -> None:
    """A full ring: the put of k4 needs the reader's claim of k0, then pads and wraps onto it."""
    (r0,) = world.readers
    world.actors = [
        ("P", lambda: world.put("k4", 0)),
        ("R0", lambda: world.get("R0", r0, "k0", retries=0)),
    ]


@ring_scenario("leases of k0, k1 released k1 first; puts wait for space", readers=1, preload=4)
def ring_lease_release(world: RingWorld, scheduler: Scheduler) -> None:
    """Two leases released out of order while the producer waits for space."""
    (r0,) = world.readers

    def reader() -> None:
        first = world.get("R0", r0, "k0", mode=ConsumeMode.LEASE, retries=0)
        second = world.get("R0", r0, "k1", mode=ConsumeMode.LEASE, retries=0)
        if second is not None:
            world.release(second)
        if first is not None:
            world.release(first)

    def producer() -> None:
        world.put("k4", 0)
        world.put("k5", 0)

    world.actors = [("P", producer), ("R0", reader)]


@ring_scenario("cancel k0 and close against claims of k0 and k1", readers=2, preload=2)
def ring_cancel_close(world: RingWorld, scheduler: Scheduler) -> None:
    """The producer cancels k0 and closes while two readers claim k0 and k1."""
    r0, r1 = world.readers

    def producer() -> None:
        scheduler.point("cancel k0")
        if world.channel.cancel("k0"):
            world.log.retired("k0")
        scheduler.point("close")
        live = [key for key, payload in world.log.live.items() if payload is not None]
        retired = world.channel.close()
        # close answers how many it retired; the readers' claims account for the rest
        world.closed_retired = retired
        world.live_at_close = live

    world.actors = [
        ("P", producer),
        ("R0", lambda: world.get("R0", r0, "k0", retries=0)),
        ("R1", lambda: world.get("R1", r1, "k1", retries=0)),
    ]
    world.check_end = lambda: _check_cancel_close(world)  # type: ignore[method-assign]


def _check_cancel_close(world: RingWorld) -> None:
    """Every key put is delivered once or retired once: never both, never neither."""
    world.check_step("end")
    ring = world.decode()
    invariants.check_ring_closed_holds_nothing(ring)
    delivered = {key for _, key, _ in world.log.delivered}
    retired_by_close = world.closed_retired
    live_at_close = world.live_at_close
    undelivered_live = [key for key in live_at_close if key not in delivered]
    _require(
        retired_by_close == len(undelivered_live),
        f"close retired {retired_by_close} but {undelivered_live} were live and undelivered",
    )
    for key in ("k0",):
        if world.log.live.get(key) is None:  # cancelled
            _require(key not in delivered, f"{key} was cancelled and delivered")
    world.log.live = {}  # the counts above are the exactly-once check after a close
    world.log.check()


@ring_scenario(
    "a descriptor get of k0 v0 against its re-put and a get by key", readers=2, preload=2
)
def ring_descriptor(world: RingWorld, scheduler: Scheduler) -> None:
    """A descriptor get of k0's first version against a re-put and a get by key."""
    r0, r1 = world.readers
    first = (0, payload_for("k0", 0))  # k0 v0 was preloaded at position 0

    def producer() -> None:
        world.put("k0", 1)
        world.put("k2", 0)

    world.actors = [
        ("P", producer),
        ("R0", lambda: world.get("R0", r0, "k0", descriptor=first, retries=1)),
        ("R1", lambda: world.get("R1", r1, "k0", retries=1)),
    ]


@ring_scenario(
    "a slow reader's index against a fast reader and a producer lapping the ring",
    readers=2,
    preload=4,
)
def ring_lap(world: RingWorld, scheduler: Scheduler) -> None:
    """A slow reader's index names k0 while a fast one takes it and k4 is written over it."""
    fast, slow = world.readers

    def slow_reader() -> None:
        world.get("R1", slow, "k1", retries=0)  # indexes k0..k3 first
        world.get("R1", slow, "k0", retries=0)  # k0 may be gone, and k4 over it

    world.actors = [
        ("P", lambda: world.put("k4", 0)),
        ("R0", lambda: world.get("R0", fast, "k0", retries=0)),
        ("R1", slow_reader),
    ]


@ring_scenario(
    "a get through a reader's index against a competing claim, a reclaim and a re-put",
    readers=2,
    preload=4,
)
def ring_index_race(world: RingWorld, scheduler: Scheduler) -> None:
    """R1's index names k0 v0 while R0 claims it and the producer reclaims it and re-puts k0 over it.

    The ring is full (k0..k3), so the re-put waits until k0 v0 is claimed,
    then reclaims it and wraps onto its bytes: R1's entry for position 0 may
    be live, claimed, reclaimed or overwritten by k0 v1 when R1 claims
    through it. The claim checks the frame at the entry (tail, state, header)
    and answers only k0 v0 while it is deliverable, k0 v1 once scanned, or
    a miss; R1's index is checked after each of its gets.
    """
    fast, indexed = world.readers

    def indexed_reader() -> None:
        world.get("R1", indexed, "k1", retries=0)  # indexes k0..k3, claims k1
        world.check_index(indexed)
        world.get("R1", indexed, "k0", retries=1)  # through the entry for k0 v0
        world.check_index(indexed)

    world.actors = [
        ("P", lambda: world.put("k0", 1)),
        ("R0", lambda: world.get("R0", fast, "k0", retries=0)),
        ("R1", indexed_reader),
    ]


RING_SCENARIOS: Final = (
    ring_claim_race,
    ring_publish,
    ring_wrap_reclaim,
    ring_lease_release,
    ring_cancel_close,
    ring_descriptor,
    ring_lap,
    ring_index_race,
)


# -- the fallback: claim and hand-back ------------------------------------------------


class _Plan:
    """A `PayloadPlan` of ready bytes."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.nbytes = len(data)

    def write_into(self, buf: Any) -> int:
        buf[: self.nbytes] = self.data
        return self.nbytes


class FallbackWorld:
    """One producer's fallback directory, files kept for reuse, readers claiming one key."""

    EDGE: Final = ("a", "b")
    KEY: Final = "k"

    def __init__(
        self, scheduler: Scheduler, claim_segment: Callable[..., Any] | None = None
    ) -> None:
        from ..impl import fallback
        from ..impl.names import fallback_segment_path

        self.fallback = fallback
        self.claim_segment = claim_segment or fallback.claim_segment
        self.directory = tempfile.mkdtemp(prefix="shmring-il-", dir=SHM_ROOT)
        self.os = SchedulingOs(scheduler)
        self.scheduler = scheduler
        self.log = Deliveries()
        self.writer = fallback.FallbackWriter(
            self.directory, (os.getpid(), 1), 1 << 20, self.os, spare_min=0
        )
        self.path = fallback_segment_path(self.directory, self.EDGE, self.KEY)
        self._snapshot: bytes | None = None
        self.put(0, scheduled=False)
        self.actors: list[tuple[str, Callable[[], object]]] = []

    def put(self, version: int, *, scheduled: bool = True) -> None:
        payload = payload_for(self.KEY, version)
        self.log.putting(self.KEY, payload)
        if scheduled:
            self.scheduler.point(f"fallback put v{version}")
        self.writer.put(self.EDGE, self.KEY, _Plan(payload))
        self.log.put_done(self.KEY, payload, True)

    def claim(self, who: str, *, retries: int = RETRIES) -> None:
        for attempt in range(retries + 1):
            self.scheduler.point("claim")
            claim = self.claim_segment(
                self.directory,
                self.EDGE,
                self.KEY,
                os_facade=self.os,
                is_alive=lambda identity: True,
                decode=bytes,
            )
            if claim.status is self.fallback.ClaimStatus.DELIVERED:
                self.log.deliver(who, self.KEY, claim.value)
                return
            if attempt < retries:
                self.scheduler.yield_turn(claim.status.value)

    def check_step(self, label: str) -> None:
        """The file at the segment name, if any, is a complete segment of a version put."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW)
        except FileNotFoundError:
            return
        try:
            size = os.fstat(fd).st_size
            data = os.pread(fd, size, 0)
        finally:
            os.close(fd)
        if data == self._snapshot:
            return  # unchanged since the last check
        self._snapshot = data
        problem, _header, fields = segment_problem(memoryview(data), size, self.KEY.encode())
        _require(problem is None, f"the file at the segment name is not a segment: {problem}")
        assert fields is not None
        payload_length, checksum = fields[4], fields[6]
        start = RING_HEADER_LENGTH + FRAME_KEY_OFFSET + len(self.KEY)
        payload = data[start : start + payload_length]
        _require(compute_checksum(self.KEY.encode(), payload) == checksum, "torn segment")
        self.log.check_payload(self.KEY, payload, "the segment at its name")

    def check_end(self) -> None:
        self.check_end_common()

    def check_end_common(self) -> None:
        self.check_step("end")
        while True:
            claim = self.fallback.claim_segment(
                self.directory,
                self.EDGE,
                self.KEY,
                os_facade=self.os,
                is_alive=lambda identity: True,
                decode=bytes,
            )
            if claim.status is not self.fallback.ClaimStatus.DELIVERED:
                _require(claim.status is self.fallback.ClaimStatus.NOT_FOUND, f"drain: {claim}")
                break
            self.log.deliver("drain", self.KEY, claim.value)
        self.log.check()
        self.writer.close()
        left = sorted(os.listdir(self.directory))
        _require(not left, f"files left after the writer's close: {left}")

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.writer.close()
        shutil.rmtree(self.directory, ignore_errors=True)


def fallback_scenario(
    summary: str,
) -> Callable[[Callable[[FallbackWorld, Scheduler], None]], Callable[..., Scenario]]:
    """Make a scenario factory of a script that gives a fresh `FallbackWorld` its actors.

    The factory takes the `claim_segment` to run (default: the real one), so a
    test can hand it a deliberately broken one; the scenario's name then says
    which.
    """

    def factory_of(script: Callable[[FallbackWorld, Scheduler], None]) -> Callable[..., Scenario]:
        def factory(claim_segment: Callable[..., Any] | None = None) -> Scenario:
            def build(scheduler: Scheduler) -> FallbackWorld:
                world = FallbackWorld(scheduler, claim_segment)
                script(world, scheduler)
                return world

            name = script.__name__
            if claim_segment is not None:
                name = f"{name}[{claim_segment.__qualname__}]"
            return Scenario(name, build, summary)

        factory.__name__ = factory.__qualname__ = script.__name__
        factory.__doc__ = script.__doc__
        return factory

    return factory_of


@fallback_scenario("a re-put against a claim and its hand-back")
def fallback_claim_race(world: FallbackWorld, scheduler: Scheduler) -> None:
    """One re-put against one claim: the smallest hand-back race, explored exhaustively."""
    world.actors = [
        ("P", lambda: world.put(1)),
        ("R0", lambda: world.claim("R0", retries=1)),
    ]


@fallback_scenario("two claims of a kept segment against two re-puts reusing it")
def fallback_handback(world: FallbackWorld, scheduler: Scheduler) -> None:
    """Re-put of a kept file while two readers claim the key and hand its file back."""

    def producer() -> None:
        world.put(1)
        world.put(2)

    world.actors = [
        ("P", producer),
        ("R0", lambda: world.claim("R0", retries=1)),
        ("R1", lambda: world.claim("R1", retries=1)),
    ]


@fallback_scenario("a cleanup's retire against a claim of the same segment")
def fallback_retire_race(world: FallbackWorld, scheduler: Scheduler) -> None:
    """The producer retires its segment (a cleanup) while a reader claims it: exactly one wins."""

    def producer() -> None:
        scheduler.point("fallback retire")
        if world.writer.retire(world.EDGE, world.KEY):
            world.log.retired(world.KEY)

    world.actors = [("P", producer), ("R0", lambda: world.claim("R0", retries=1))]
    world.check_end = lambda: _check_retire_race(world)  # type: ignore[method-assign]


def _check_retire_race(world: FallbackWorld) -> None:
    retired = world.log.live.get(world.KEY) is None
    delivered = [payload for _, _, payload in world.log.delivered]
    _require(
        len(delivered) + retired == 1,
        f"retired={retired} and delivered {len(delivered)} times: exactly one may win",
    )
    world.check_end_common()


# -- the arena: out-of-order release ------------------------------------------------------


class ArenaWorld:
    """A small registered arena (simulated driver), one reader borrowing three frames."""

    NBYTES: Final = 900  # 960-byte frames: four fill a 4 KiB arena

    def __init__(self, scheduler: Scheduler, arena_class: type[Any] | None = None) -> None:
        import uuid

        import numpy as np
        import torch

        from ..impl.registered.arena import ArenaReader, RegisteredArena
        from ..impl.registered.cuda_driver import SimulatedCudaDriver
        from ..impl.registered.registration import Registry

        self.np = np
        self.torch = torch
        self.scheduler = scheduler
        self.os = SchedulingOs(scheduler)
        self.registry = Registry(
            f"il{uuid.uuid4().hex[:12]}", SimulatedCudaDriver(), os_facade=self.os
        )
        self.arena = (arena_class or RegisteredArena)(self.registry, RING_CAPACITY)
        self.reader = ArenaReader(self.registry.directory, self.arena.name, self.os)
        self.descriptors: list[Any] = []
        self.fills: dict[int, int] = {}  # position -> the byte its payload is filled with
        for _ in range(3):
            self.put(scheduled=False)
        install_words(self.arena, scheduler)
        install_words(self.reader, scheduler)
        self.views: list[tuple[Any, int]] = []  # (borrowed array, its fill byte)
        self.released = 0
        self.actors: list[tuple[str, Callable[[], object]]] = []
        self.observer = Observer(
            os.path.join(self.registry.directory, self.arena.name), RING_CAPACITY
        )
        self.head = self.tail = 0
        self._snapshot: tuple[bytes, int] | None = None

    def put(self, *, scheduled: bool = True, retries: int = RETRIES) -> None:
        from ..impl.registered.arena import ArenaFrameDescriptor

        fill = len(self.descriptors) + 1
        source = self.torch.full((self.NBYTES,), fill, dtype=self.torch.uint8)
        for attempt in range(retries + 1):
            if scheduled:
                self.scheduler.point(f"arena put #{fill}")
            result = self.arena.put(source)
            if isinstance(result, ArenaFrameDescriptor):
                self.descriptors.append(result)
                self.fills[result.position] = fill
                return
            if attempt < retries and scheduled:
                self.scheduler.yield_turn("full")
        self.descriptors.append(None)

    def borrow(self, index: int) -> None:
        self.scheduler.point(f"borrow #{index + 1}")
        descriptor = self.descriptors[index]
        array = self.reader.borrow(descriptor, "uint8", (self.NBYTES,))
        self.views.append((array, self.fills[descriptor.position]))

    def drop(self, index: int) -> None:
        self.scheduler.point(f"drop view #{index + 1}")
        array, fill = self.views[index]
        self.views[index] = (None, fill)
        _require(bool((array == fill).all()), f"a borrowed frame changed before its drop #{index}")
        del array  # the last view: the frame is DONE now

    def check_step(self, label: str) -> None:
        observer = self.observer
        snapshot = (bytes(observer.view), sum(array is not None for array, _ in self.views))
        if snapshot == self._snapshot:
            return  # unchanged memory was checked already
        self._snapshot = snapshot
        tail, head = observer.tail(), observer.head()
        frames: list[Frame] = []
        for position, offset, header in observer.frames(tail, head):
            if header.frame_type == DATA_FRAME_TYPE:
                key, _ = observer.key_and_payload(offset, header)
                frames.append(
                    Frame(
                        position,
                        header.length,
                        header.frame_type,
                        header.state,
                        key.decode(),
                        header.payload_length,
                    )
                )
            else:
                frames.append(Frame(position, header.length, header.frame_type, header.state))
        ring = RingState(RING_CAPACITY, head, tail, frames, False)
        invariants.check_ring_positions(ring)
        invariants.check_ring_frames_tile(ring)
        _require(head >= self.head and tail >= self.tail, "arena head or tail went back")
        self.head, self.tail = head, tail
        for array, fill in self.views:
            if array is not None:
                _require(bool((array == fill).all()), "the bytes of a live borrowed frame changed")

    def check_end(self) -> None:
        self.check_step("end")
        _require(all(array is None for array, _ in self.views), "a view was never dropped")
        for descriptor in self.descriptors[len(self.views) :]:  # the drain
            if descriptor is not None:
                copied = self.reader.copy(descriptor, "uint8", (self.NBYTES,))
                fill = self.fills[descriptor.position]
                _require(bool((copied == fill).all()), f"frame #{fill} holds other bytes")
        self.arena.reclaim()
        _require(
            self.arena.tail == self.arena.head,
            f"frames stay pinned: tail={self.arena.tail} head={self.arena.head}",
        )
        published = [d for d in self.descriptors if d is not None]
        _require(len(published) >= 4, f"no put found space after the releases: {published}")

    def close(self) -> None:
        self.views = []
        self.observer.close()
        self.reader.close()
        self.arena.close()
        self.registry.close()


def arena_out_of_order(arena_class: type[Any] | None = None) -> Scenario:
    """Frames borrowed 1, 2, 3 and dropped 3, 1, 2 while the producer puts into the space."""

    def build(scheduler: Scheduler) -> ArenaWorld:
        world = ArenaWorld(scheduler, arena_class)

        def reader() -> None:
            for index in range(3):
                world.borrow(index)
            for index in (2, 0, 1):
                world.drop(index)

        def producer() -> None:
            world.put()
            world.put()

        world.actors = [("P", producer), ("R0", reader)]
        return world

    name = (
        "arena_out_of_order"
        if arena_class is None
        else f"arena_out_of_order[{arena_class.__name__}]"
    )
    return Scenario(name, build, "arena leases dropped out of order under puts")


# -- the pool: a slot's reuse against its claims ------------------------------------------


def _slot_word_name(width: int, index: int) -> str:
    """A pool slot header's word, from spec.layout: 'slot.state', 'slot.generation', ..."""
    from ..spec import layout

    names = {
        (8, layout.POOL_GENERATION_OFFSET): "generation",
        (4, layout.POOL_STATE_OFFSET): "state",
        (4, layout.POOL_HOLDER_PID_OFFSET): "holder",
        (8, layout.POOL_PAYLOAD_LENGTH_OFFSET): "length",
        (8, layout.POOL_CHECKSUM_OFFSET): "checksum",
        (4, layout.POOL_FLAGS_OFFSET): "flags",
    }
    return "slot." + names.get((width, index * width), f"u{width * 8}[{index}]")


class PoolWorld:
    """A producer's pool of two slots, the ring carrying their references, two reader pairs.

    Each pair is a `RingReader` and a `PoolReader` (its own slot mappings);
    `get(who, index, borrow=...)` names the pair.

    The real `PoolRoute.publish` (acquire with its reuse check, payload into
    the slot, slot publish, the reference on the ring, `carried`) and the
    real `PoolReader.claim` / `decode_owned` inside the ring's claim, as the
    connector runs them. Every OS call is a point (`SchedulingOs`), and so
    is every load and store of the ring's words and of each slot header's
    words, on both sides: the producer's and each reader's slot mapping and
    a borrowed claim's own header words get `ScheduledWords` as they appear.
    """

    KEY: Final = "k"
    PAYLOAD: Final = 2000  # more than the 4 KiB ring admits (1024): a pool candidate
    CLASS: Final = 4096

    def __init__(self, scheduler: Scheduler, producer_class: type[Any] | None = None) -> None:
        from ..impl.connector.config import ConnectorConfig
        from ..impl.connector.pool_route import PoolRoute
        from ..impl.directory import PathDirectory
        from ..impl.pool import PoolProducer, PoolReader
        from ..spec.pool import compute_slot_charge

        self.scheduler = scheduler
        self.directory = tempfile.mkdtemp(prefix="shmring-il-", dir=SHM_ROOT)
        self.os = SchedulingOs(scheduler)
        self.log = Deliveries()
        self.identity = (os.getpid(), 1, 0)
        self.ring_path = os.path.join(self.directory, "ring")
        self.channel = RingChannel.create(
            self.ring_path, RING_CAPACITY, os_facade=self.os, producer=(os.getpid(), 1)
        )
        folder = PathDirectory(self.directory, self.os)
        config = ConnectorConfig(
            "il",
            pool_min_bytes=self.CLASS,
            pool_max_bytes=self.CLASS,
            pool_budget_bytes=2 * compute_slot_charge(self.CLASS),
        )
        self.route = PoolRoute(config, self.identity, self.os)
        self.producer = (producer_class or PoolProducer)(
            folder,
            self.identity,
            self.os,
            min_class=self.CLASS,
            max_class=self.CLASS,
            budget=config.pool_budget_bytes,
            checksum=False,  # a rewritten payload must be caught by the checks, not the reader
        )
        self.route.producer = self.producer
        self.pools = [PoolReader(folder, self.os) for _ in range(2)]
        self.readers = [RingReader.attach(self.ring_path, os_facade=self.os) for _ in range(2)]
        self._scheduled = False
        self._wrap_slots()
        self.put(0)  # v0 in slot 0, carried by the ring (unscheduled: not yet installed)
        install_words(self.channel, scheduler)
        for reader in self.readers:
            install_words(reader, scheduler)
        self._scheduled = True
        self.claims: list[tuple[Any, bytes]] = []  # (borrowed claim, its payload) while held
        self.releasing: list[Any] = []  # claims whose release is under way
        self.observer = Observer(self.ring_path, RING_CAPACITY)
        self._slot_maps: dict[str, tuple[int, mmap.mmap]] = {}
        self._snapshot: tuple[bytes, ...] | None = None
        self.actors: list[tuple[str, Callable[[], object]]] = []

    def _words(self, words: SharedWords) -> SharedWords:
        if not self._scheduled or isinstance(words, ScheduledWords):
            return words
        return ScheduledWords(words, self.scheduler, _slot_word_name)

    def _wrap_slots(self) -> None:
        """Slot words scheduled as each mapping appears (instance attributes, as install_words)."""
        producer = self.producer
        acquire = producer.acquire

        def scheduled_acquire(nbytes: int) -> Any:
            for slot in producer.slots.values():  # the reuse check loads these
                slot.mapping.words = self._words(slot.mapping.words)
            slot = acquire(nbytes)
            if slot is not None:
                slot.mapping.words = self._words(slot.mapping.words)
            return slot

        producer.acquire = scheduled_acquire  # type: ignore[method-assign]
        for pool in self.pools:
            mapped = pool._slot

            def scheduled_slot(producer_id: Any, index: int, mapped: Any = mapped) -> Any:
                slot = mapped(producer_id, index)
                slot.mapping.words = self._words(slot.mapping.words)
                return slot

            pool._slot = scheduled_slot  # type: ignore[method-assign]

    # -- scripts' helpers -------------------------------------------------------------

    def put(self, version: int, *, retries: int = RETRIES) -> bool:
        """A pool put of a new version; no slot to be had (EXHAUSTED) is retried after a yield."""
        payload = payload_for(self.KEY, version, self.PAYLOAD)
        self.log.putting(self.KEY, payload)
        position = None
        for attempt in range(retries + 1):
            self.scheduler.point(f"pool put v{version}")
            position = self.route.publish(self.channel, self.KEY, _Plan(payload), None)
            if position is not None:
                break
            if attempt < retries:
                self.scheduler.yield_turn("no slot")
        self.log.put_done(self.KEY, payload, position is not None)
        return position is not None

    def get(self, who: str, index: int, *, borrow: bool, retries: int = RETRIES) -> Any:
        """A get of the key whose carrier is a pool reference: borrowed (the claim is held) or owned."""
        pool, reader = self.pools[index], self.readers[index]
        if borrow:  # as `ring_route.borrow_pool_ref`: the carrier DONE at once, the slot CLAIMED

            def decode(view: memoryview) -> Any:
                claim = pool.claim(self.identity, bytes(view))
                claim._words = self._words(claim._words)
                return claim

        else:  # as `ring_route.pool_decoder`

            def decode(view: memoryview) -> Any:
                return pool.decode_owned(self.identity, view, bytes)[1]

        for attempt in range(retries + 1):
            self.scheduler.point(f"get {self.KEY}" + (" (borrow)" if borrow else ""))
            received = reader.get(self.KEY, decode=decode)
            if received.status is ReceiveStatus.DELIVERED:
                value = received.payload
                if borrow:
                    payload = bytes(value.view)
                    self.claims.append((value, payload))
                    self.log.deliver(who, self.KEY, payload)
                else:
                    self.log.deliver(who, self.KEY, value)
                return value
            if attempt < retries:
                self.scheduler.yield_turn(received.status.value)
        return None

    def release(self, claim: Any) -> None:
        self.scheduler.point("release claim")
        payload = next(payload for held, payload in self.claims if held is claim)
        _require(bytes(claim.view) == payload, "a borrowed slot payload changed before its release")
        self.claims = [(held, data) for held, data in self.claims if held is not claim]
        self.releasing.append(claim)  # an interrupted release leaves it to a retry
        claim.view.release()
        claim.release()
        self.releasing.remove(claim)

    # -- checks ----------------------------------------------------------------------

    def _slot_files(self) -> list[tuple[str, memoryview]]:
        from ..spec.layout import POOL_SLOT_HEADER_LENGTH

        found = []
        for name in sorted(os.listdir(self.directory)):
            if not name.startswith("pool."):
                continue
            held = self._slot_maps.get(name)
            if held is None:
                fd = os.open(os.path.join(self.directory, name), os.O_RDONLY)
                if os.fstat(fd).st_size < POOL_SLOT_HEADER_LENGTH:
                    os.close(fd)
                    continue  # being created: not yet truncated to its length
                held = self._slot_maps[name] = (fd, mmap.mmap(fd, 0, prot=mmap.PROT_READ))
            found.append((name, memoryview(held[1])))
        return found

    def check_step(self, label: str) -> None:
        from ..impl.pool.slots import load_slot_payload_fields, load_slot_state_acquire
        from ..spec import layout

        slots = self._slot_files()
        snapshot = (
            bytes(self.observer.view),
            *(bytes(view) for _, view in slots),
            bytes(len(self.claims)),
        )
        if snapshot == self._snapshot:
            for _, view in slots:
                view.release()
            return  # unchanged memory was checked already
        self._snapshot = snapshot
        try:
            tail, head = self.observer.tail(), self.observer.head()
            frames: list[Frame] = []
            for position, offset, header in self.observer.frames(tail, head):
                if header.frame_type != DATA_FRAME_TYPE:
                    frames.append(Frame(position, header.length, header.frame_type, header.state))
                    continue
                key = self.observer.key_and_payload(offset, header)[0].decode()
                frames.append(
                    Frame(
                        position,
                        header.length,
                        header.frame_type,
                        header.state,
                        key,
                        header.payload_length,
                    )
                )
            ring = RingState(RING_CAPACITY, head, tail, frames, self.observer.closed())
            invariants.check_ring_positions(ring)
            invariants.check_ring_frames_tile(ring)
            invariants.check_ring_one_version_per_key(ring)
            start = layout.POOL_SLOT_HEADER_LENGTH
            for name, view in slots:
                words = SharedWords(view[:start])  # read through the pool's own accessors
                state = load_slot_state_acquire(words)
                length = load_slot_payload_fields(words)[0]
                words.release()
                if state in (layout.POOL_SLOT_PUBLISHED, layout.POOL_SLOT_CLAIMED):
                    self.log.check_payload(
                        self.KEY, bytes(view[start : start + length]), f"{name}, {state=}"
                    )
            for claim, payload in self.claims:
                _require(
                    bytes(claim.view) == payload,
                    "the bytes of a claimed slot changed under its holder (the slot was reused)",
                )
        finally:
            for _, view in slots:
                view.release()

    def check_end(self) -> None:
        self.check_step("end")
        _require(not self.claims, "a borrowed claim was never released")
        while True:  # the drain
            received = self.readers[0].get(
                self.KEY,
                decode=lambda view: self.pools[0].decode_owned(self.identity, view, bytes)[1],
            )
            if received.status is not ReceiveStatus.DELIVERED:
                break
            self.log.deliver("drain", self.KEY, received.payload)
        self.log.check()
        self.producer.close()
        self.channel.close()
        left = sorted(name for name in os.listdir(self.directory) if name != "ring")
        _require(not left, f"files left after the pool's close: {left}")

    def close(self) -> None:
        for claim, _ in self.claims:
            with contextlib.suppress(BufferError):
                claim.view.release()
        self.claims = []
        for fd, mapping in self._slot_maps.values():
            mapping.close()
            os.close(fd)
        self.observer.close()
        for pool in self.pools:
            pool.close()
        for reader in self.readers:
            reader.close()
        self.producer.close()
        self.channel.close()
        shutil.rmtree(self.directory, ignore_errors=True)


def pool_reuse_race(producer_class: type[Any] | None = None) -> Scenario:
    """Two re-puts of a pool key look for a reusable slot while R0 borrows and R1 copies it.

    R0's borrowed claim holds the slot CLAIMED with its carrier already DONE
    (the case the reuse check's second half is for); R1's owned claim runs
    inside the ring claim and gives the slot back DONE.
    """

    def build(scheduler: Scheduler) -> PoolWorld:
        world = PoolWorld(scheduler, producer_class)

        def producer() -> None:
            world.put(1)
            world.put(2)

        def reader() -> None:
            claim = world.get("R0", 0, borrow=True)
            if claim is not None:
                world.release(claim)
            world.get("R0", 1, borrow=False, retries=0)

        world.actors = [("P", producer), ("R0", reader)]
        return world

    name = "pool_reuse_race"
    if producer_class is not None:
        name = f"{name}[{producer_class.__name__}]"
    return Scenario(name, build, "a slot's reuse check against a borrowed and an owned claim")


SCENARIOS: Final = (
    ring_claim_race(),
    ring_publish(),
    ring_wrap_reclaim(),
    ring_lease_release(),
    ring_cancel_close(),
    ring_descriptor(),
    ring_lap(),
    ring_index_race(),
    fallback_claim_race(),
    fallback_handback(),
    fallback_retire_race(),
    arena_out_of_order(),
    pool_reuse_race(),
)
