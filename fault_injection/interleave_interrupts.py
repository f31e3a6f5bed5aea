"""Interrupted operations: an exception raised at every stop point of put and get (issue 24).

Design rationale. A service is interrupted where it stands: a signal
handler that raises (Ctrl-C's KeyboardInterrupt, a SIGTERM handler raising
SystemExit, the user's own exception) runs between any two steps of a put or
a get. That is an environment action, and the explorer's schedule points
are exactly those steps: here, instead of switching actors at one of them,
the explorer raises `interleave.Interrupt` in the actor there
(`interleave.Interruption`, one per run), for every stop point of every
actor in turn (`interleave.explore_interrupts`), under every order of the
actors that switches only where one finishes or yields (or under a
preemption bound). Stop points are the schedule points plus the points
right after a call that took something (a lock, a descriptor, a mapping),
before the caller could record it (`SchedulingOs`).

Each world is one of `interleave_scenarios`' (the ring, the pool route, the
fallback segments) with the same checks at every point (the model's
invariants over the shared memory, no torn or foreign bytes), and an
actor's every operation goes through `attempt`, which says what an
interrupted operation may leave:

* only the raised exception, or a `ShmringError` subclass, leaves an
  operation; the interrupt is never swallowed (an operation that was
  interrupted and returned normally is a failure), and no internal error
  type (BufferError, ValueError, a bare OSError) escapes;
* an interrupted put published or left nothing: a version seen published
  (in a PUBLISHED frame, slot or segment) is delivered exactly once by a
  later get (or the drain), one never published is never delivered, and no
  version is ever delivered twice or torn;
* an interrupted get delivered (the value lost to the caller, as any value
  a raising handler interrupts) or left the frame deliverable: never a
  frame pinned, never one delivered twice;
* no lock stays held: at the end every file in the deployment directory
  takes an exclusive non-blocking flock, and then every actor's own
  objects complete a later operation (the producer a probe put that must
  publish, each reader a get of it that must deliver);
* after every object's close no file is left in the deployment directory.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Callable
from typing import Any, Final

from ..impl.errors import ShmringError
from ..impl.frame_io import SharedWords
from ..impl.ring.frames import segment_problem
from ..impl.ring.producer import RingChannel
from ..impl.ring.reader import RingReader
from ..impl.ring.results import ReceiveStatus
from ..spec.layout import FRAME_KEY_OFFSET, FRAME_STATE_PUBLISHED, RING_HEADER_LENGTH
from ..spec.ring import ConsumeMode, PutStatus
from .interleave import Interrupt, Scenario, Scheduler
from .interleave_scenarios import (
    RETRIES,
    FallbackWorld,
    PoolWorld,
    RingWorld,
    _Plan,
    _require,
    payload_for,
)


class _Outcome:
    """What `attempt` answers for an operation that did not return."""

    def __init__(self, what: str) -> None:
        self.what = what

    def __repr__(self) -> str:
        return self.what


INTERRUPTED: Final = _Outcome("INTERRUPTED")
TYPED_ERROR: Final = _Outcome("TYPED_ERROR")


class Interrupts:
    """The interrupt bookkeeping a world shares with its scripts (`attempt`)."""

    def __init__(self, scheduler: Scheduler, directory: str) -> None:
        self.scheduler = scheduler
        self.directory = directory
        self.interrupted: list[tuple[str, str]] = []  # (who, operation) the interrupt stopped
        self.typed: list[tuple[str, str, str]] = []  # (who, operation, error) typed errors
        self.seen_published: set[bytes] = set()  # payloads seen in a published place
        self.interrupted_puts: list[tuple[str, bytes]] = []  # (key, payload)
        self.interrupted_gets: list[str] = []  # keys

    def attempt(self, who: str, what: str, operation: Callable[[], Any]) -> Any:
        """Run one operation of an actor's script; say how an interrupt or an error left it."""
        before = self.scheduler.interrupted
        try:
            result = operation()
        except Interrupt:
            _require(
                before is None and self.scheduler.interrupted is not None,
                f"{who}'s {what} raised an Interrupt nobody planned",
            )
            self.interrupted.append((who, what))
            return INTERRUPTED
        except ShmringError as error:
            self.typed.append((who, what, repr(error)))
            return TYPED_ERROR
        except AssertionError:
            raise  # a check of the world's own (a changed lease, a wrong descriptor)
        except BaseException as error:
            raise AssertionError(
                f"{who}'s {what} let an internal error escape"
                + ("" if self.scheduler.interrupted is None else " after the interrupt")
                + f": {error!r}"
            ) from error
        planned = self.scheduler.interruption
        _require(
            before is not None
            or self.scheduler.interrupted is None
            or planned is None
            or planned.actor != who,
            f"{who}'s {what} swallowed the interrupt raised in {self.scheduler.interrupted}",
        )
        return result

    def check_locks(self) -> None:
        """Every file in the directory takes an exclusive flock now (nobody holds one)."""
        for name in sorted(os.listdir(self.directory)):
            path = os.path.join(self.directory, name)
            try:
                fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
            except (FileNotFoundError, IsADirectoryError):
                continue
            try:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    raise AssertionError(
                        f"a lock stays held on {name!r} after every actor finished"
                    ) from None
                fcntl.flock(fd, fcntl.LOCK_UN)
            finally:
                os.close(fd)

    def settle(self, log: Any) -> None:
        """What the deliveries must show, given which operation the interrupt stopped.

        A key an interrupted get touched: its newest version was delivered to
        nobody (lost to the caller) or is still deliverable; the drain takes
        it then, and no version is ever delivered twice. A key an interrupted
        put touched: the new version counts as published when it was seen in
        a published place (then it must be delivered exactly once), and the
        put may have retired the version before it.
        """
        for key in self.interrupted_gets:
            log.live[key] = None
        for key, payload in self.interrupted_puts:
            log.live[key] = payload if payload in self.seen_published else None


class InterruptedRingWorld(RingWorld):
    """The ring: producer puts and re-puts, a reader's in-place and lease gets."""

    def __init__(
        self,
        scheduler: Scheduler,
        readers: int,
        preload: int,
        reader_class: type[Any],
        channel_class: type[Any],
    ) -> None:
        super().__init__(
            scheduler,
            readers,
            preload=preload,
            reader_class=reader_class,
            channel_class=channel_class,
        )
        self.interrupts = Interrupts(scheduler, self.directory)

    def put_op(self, who: str, key: str, version: int) -> Any:
        status = self.interrupts.attempt(
            who, f"put {key} v{version}", lambda: self.put(key, version)
        )
        if status is INTERRUPTED:
            self.interrupts.interrupted_puts.append((key, payload_for(key, version)))
        return status

    def get_op(self, who: str, reader: Any, key: str, **options: Any) -> Any:
        value = self.interrupts.attempt(
            who, f"get {key}", lambda: self.get(who, reader, key, **options)
        )
        if value is INTERRUPTED:
            self.interrupts.interrupted_gets.append(key)
        return value

    def check_step(self, label: str) -> None:
        super().check_step(label)
        observer = self.observer
        for _position, offset, header in observer.frames(observer.tail(), observer.head()):
            if header.state == FRAME_STATE_PUBLISHED and header.key_length:
                self.interrupts.seen_published.add(observer.key_and_payload(offset, header)[1])

    def probe(self) -> None:
        """Unscheduled: the producer's next put publishes, each reader's get of it delivers."""
        for index, reader in enumerate(self.readers):
            key = f"z{index}"
            payload = payload_for(key, 0)
            self.log.putting(key, payload)
            outcome = self.channel.put(key, payload)
            _require(
                outcome.status is PutStatus.PUBLISHED,
                f"the producer's put after the interrupt: {outcome.status}",
            )
            self.log.put_done(key, payload, True)
            received = reader.get(key)
            _require(
                received.status is ReceiveStatus.DELIVERED,
                f"reader {index}'s get after the interrupt: {received.status}",
            )
            self.log.deliver(f"probe {index}", key, received.payload)

    def check_end(self) -> None:
        self.check_step("end")
        self.interrupts.check_locks()
        self.interrupts.settle(self.log)
        self.probe()
        super().check_end()
        for reader in self.readers:
            reader.close()
        self.channel.close()
        left = sorted(os.listdir(self.directory))
        _require(not left, f"files left after every close: {left}")


def interrupt_ring(
    reader_class: type[Any] = RingReader, channel_class: type[Any] = RingChannel
) -> Scenario:
    """A re-put and a put against an in-place and a lease get; each stop point raising.

    `reader_class`, `channel_class`: deliberately broken ones (the scenario's name says which).
    """

    def build(scheduler: Scheduler) -> InterruptedRingWorld:
        world = InterruptedRingWorld(
            scheduler, readers=1, preload=1, reader_class=reader_class, channel_class=channel_class
        )
        (reader,) = world.readers
        attempt = world.interrupts.attempt

        def producer() -> None:
            world.put_op("P", "k0", 1)  # a re-put: retires v0 under the claim lock
            world.put_op("P", "k1", 0)

        def consumer() -> None:
            world.get_op("R0", reader, "k0", decode=bytes)  # in place, as the connector
            lease = world.get_op("R0", reader, "k1", mode=ConsumeMode.LEASE)
            if lease is not None and not isinstance(lease, _Outcome):
                attempt("R0", "release k1", lambda: world.release(lease))

        world.actors = [("P", producer), ("R0", consumer)]
        return world

    odd = [
        cls.__name__
        for cls in (reader_class, channel_class)
        if cls not in (RingReader, RingChannel)
    ]
    name = "interrupt_ring" + (f"[{','.join(odd)}]" if odd else "")

    return Scenario(name, build, "ring re-put and put, in-place and lease gets; each point raises")


class InterruptedPoolWorld(PoolWorld):
    """The pool route: two re-puts of a pool key, a borrowed and an owned get."""

    def __init__(self, scheduler: Scheduler) -> None:
        super().__init__(scheduler)
        self.interrupts = Interrupts(scheduler, self.directory)

    def put_op(self, who: str, version: int) -> Any:
        status = self.interrupts.attempt(who, f"pool put v{version}", lambda: self.put(version))
        if status is INTERRUPTED:
            self.interrupts.interrupted_puts.append(
                (self.KEY, payload_for(self.KEY, version, self.PAYLOAD))
            )
        return status

    def get_op(self, who: str, index: int, *, borrow: bool, retries: int = RETRIES) -> Any:
        value = self.interrupts.attempt(
            who,
            "get" + (" (borrow)" if borrow else ""),
            lambda: self.get(who, index, borrow=borrow, retries=retries),
        )
        if value is INTERRUPTED:
            self.interrupts.interrupted_gets.append(self.KEY)
        return value

    def check_step(self, label: str) -> None:
        from ..impl.pool.slots import load_slot_payload_fields, load_slot_state_acquire
        from ..spec import layout

        super().check_step(label)
        start = layout.POOL_SLOT_HEADER_LENGTH
        slots = self._slot_files()
        try:
            for _name, view in slots:
                words = SharedWords(view[:start])
                state = load_slot_state_acquire(words)
                length = load_slot_payload_fields(words)[0]
                words.release()
                if state == layout.POOL_SLOT_PUBLISHED:
                    self.interrupts.seen_published.add(bytes(view[start : start + length]))
        finally:
            for _, view in slots:
                view.release()

    def probe(self) -> None:
        """Unscheduled: a pool put publishes, each reader's owned get of it delivers."""
        for index, (pool, reader) in enumerate(zip(self.pools, self.readers, strict=True)):
            payload = payload_for(self.KEY, 100 + index, self.PAYLOAD)
            self.log.putting(self.KEY, payload)
            position = self.route.publish(self.channel, self.KEY, _Plan(payload), None)
            _require(position is not None, "the producer's pool put after the interrupt failed")
            self.log.put_done(self.KEY, payload, True)
            received = reader.get(
                self.KEY,
                decode=lambda view, pool=pool: pool.decode_owned(self.identity, view, bytes)[1],
            )
            _require(
                received.status is ReceiveStatus.DELIVERED,
                f"reader {index}'s pool get after the interrupt: {received.status}",
            )
            self.log.deliver(f"probe {index}", self.KEY, received.payload)

    def check_end(self) -> None:
        self.check_step("end")
        # A release the interrupt stopped (or never began) is the caller's to
        # retry, as the borrowed payload's finalizer does: it must finish the job.
        for claim in [*self.releasing, *(claim for claim, _ in self.claims)]:
            claim.view.release()
            claim.release()
        self.claims = []
        self.releasing = []
        self.interrupts.check_locks()
        self.interrupts.settle(self.log)
        self.probe()
        super().check_end()  # drains, checks, closes producer and channel, no slot file left
        for pool in self.pools:
            pool.close()
        for reader in self.readers:
            reader.close()
        left = sorted(os.listdir(self.directory))
        _require(not left, f"files left after every close: {left}")


def interrupt_pool() -> Scenario:
    """Pool re-puts against a borrowed and an owned claim; each stop point raising."""

    def build(scheduler: Scheduler) -> InterruptedPoolWorld:
        world = InterruptedPoolWorld(scheduler)
        attempt = world.interrupts.attempt

        def producer() -> None:
            world.put_op("P", 1)
            world.put_op("P", 2)

        def consumer() -> None:
            claim = world.get_op("R0", 0, borrow=True)
            if claim is not None and not isinstance(claim, _Outcome):
                attempt("R0", "release claim", lambda: world.release(claim))
            world.get_op("R0", 1, borrow=False, retries=0)

        world.actors = [("P", producer), ("R0", consumer)]
        return world

    return Scenario(
        "interrupt_pool", build, "pool re-puts, borrowed and owned claims; each point raises"
    )


class InterruptedFallbackWorld(FallbackWorld):
    """The fallback segments: re-puts reusing the kept file against a reader's claims."""

    def __init__(self, scheduler: Scheduler) -> None:
        super().__init__(scheduler)
        self.interrupts = Interrupts(scheduler, self.directory)

    def put_op(self, who: str, version: int) -> Any:
        status = self.interrupts.attempt(who, f"fallback put v{version}", lambda: self.put(version))
        if status is INTERRUPTED:
            self.interrupts.interrupted_puts.append((self.KEY, payload_for(self.KEY, version)))
        return status

    def claim_op(self, who: str, retries: int = RETRIES) -> Any:
        value = self.interrupts.attempt(who, "claim", lambda: self.claim(who, retries=retries))
        if value is INTERRUPTED:
            self.interrupts.interrupted_gets.append(self.KEY)
        return value

    def check_step(self, label: str) -> None:
        super().check_step(label)
        data = self._snapshot
        if data is not None and os.path.exists(self.path):  # a complete segment (checked above)
            fields = segment_problem(memoryview(data), len(data), self.KEY.encode())[2]
            assert fields is not None
            length = fields[4]  # its payload length
            start = RING_HEADER_LENGTH + FRAME_KEY_OFFSET + len(self.KEY)
            self.interrupts.seen_published.add(data[start : start + length])

    def _claim_now(self) -> Any:
        return self.fallback.claim_segment(
            self.directory,
            self.EDGE,
            self.KEY,
            os_facade=self.os,
            is_alive=lambda identity: True,
            decode=bytes,
        )

    def probe(self) -> None:
        """Unscheduled: the writer's next put lands, the reader's claim of it delivers."""
        payload = payload_for(self.KEY, 100)
        self.log.putting(self.KEY, payload)
        self.writer.put(self.EDGE, self.KEY, _Plan(payload))
        self.log.put_done(self.KEY, payload, True)
        claim = self._claim_now()
        _require(
            claim.status is self.fallback.ClaimStatus.DELIVERED,
            f"the claim after the interrupt: {claim.status}",
        )
        self.log.deliver("probe", self.KEY, claim.value)

    def check_end(self) -> None:
        self.check_step("end")
        self.interrupts.check_locks()
        self.interrupts.settle(self.log)
        self.probe()
        super().check_end()  # drains, checks, the writer's close leaves no file


def interrupt_fallback() -> Scenario:
    """Fallback re-puts against a reader's claims; each stop point raising."""

    def build(scheduler: Scheduler) -> InterruptedFallbackWorld:
        world = InterruptedFallbackWorld(scheduler)

        def producer() -> None:
            world.put_op("P", 1)
            world.put_op("P", 2)

        def consumer() -> None:
            world.claim_op("R0")
            world.claim_op("R0")

        world.actors = [("P", producer), ("R0", consumer)]
        return world

    return Scenario(
        "interrupt_fallback", build, "fallback re-puts and claims; each stop point raises"
    )


INTERRUPT_SCENARIOS: Final = (interrupt_ring(), interrupt_pool(), interrupt_fallback())


# -- what the exploration finds in today's code ------------------------------------------

LOCK_HELD: Final = "a lock stays held"
PINNED: Final = "a frame stays pinned"
FILE_LEFT: Final = "a file is left after close"


def classify(failure: str) -> str:
    """A failure's kind (one of the above), or the failure itself when it is of no known kind."""
    if "wait for a lock nobody releases" in failure or "a lock stays held" in failure:
        return LOCK_HELD
    if "frames stay pinned" in failure:
        return PINNED
    if "files left after" in failure:
        return FILE_LEFT
    return failure.split(": ", 1)[1] if failure.startswith("interleaving failure") else failure


def where_label(interrupted: str) -> str:
    """The stop point's label from `RunResult.interrupted` ("P at 'unlock' (its stop point 9)")."""
    return interrupted.split("'")[1] if "'" in interrupted else interrupted


# The open findings (issue 24), by scenario: (actor, stop point label, kind).
# docs/interleavings.md says where each is and what would close it; a change
# that fixes one must remove it here (the test says which), and any other
# failure is new.
KNOWN_OPEN: Final = {
    # Stop points inside a `lifecycle.deferred_signals` section are none (no
    # handler runs there): the fallback's put, claim, retire and reap, the
    # ring's lease claim and the producer's retires all run in one now, which
    # closed the findings `after lock`, `unlock` of the retires, the lease's
    # `after unlock` and the fallback re-put's spare left after close.
    "interrupt_ring": set(),
    "interrupt_pool": {
        # The per-message (owned) claim takes no section (it would cost ~4 us):
        # raised in its `finally` before the unlock runs, the ring lock stays
        # held until this reader's next claim (docs/interleavings.md).
        ("R0", "unlock", LOCK_HELD),
    },
    "interrupt_fallback": set(),
}


# Found only with one preemption (the slow test): the owned claim's unlock on
# the ring as above, and a reader interrupted in the owned pool get's ring
# claim after the slot was released but before the carrier frame's DONE
# (`store frame@0.state`, `after unlock`), which leaves the pool with no
# reusable slot until that reader's connector closes.
KNOWN_OPEN_PREEMPTED: Final = {
    "interrupt_ring": {("R0", "unlock", LOCK_HELD)},
    "interrupt_pool": {
        ("R0", "after unlock", "end check: the producer's pool put after the interrupt failed"),
        (
            "R0",
            "store frame@0.state",
            "end check: the producer's pool put after the interrupt failed",
        ),
    },
    "interrupt_fallback": set(),
}


def findings(report: Any) -> dict[tuple[str, str, str], str]:
    """`explore_interrupts(keep_going=True)`'s failures as {(actor, label, kind): reproducer}."""
    found: dict[tuple[str, str, str], str] = {}
    for code, interrupted, failure, message in report.failures:
        actor = code.partition("@")[0]
        key = (actor, where_label(interrupted), classify(failure))
        found.setdefault(key, message)
    return found
