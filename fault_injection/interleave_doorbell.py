"""The deployment doorbell in the interleaving explorer: a ring against a receiver falling asleep
(issue 23).

Design rationale. A ring is a plain store of a fresh value, a full fence,
then a load of the waiter count and a FUTEX_WAKE only when it is not zero
(`impl.discovery.stamp.Stamp.ring`); a receiver adds itself to the count
before the kernel compares the doorbell with what it read
(`Stamp.wait`). That is Dekker's pattern, and it holds only with the fence:
x86 lets a load pass an earlier store still in the store buffer, so
without it the producer can read "nobody sleeps" while its ring is not yet
visible, and the receiver, counted a moment later, compares the old value
and sleeps with nobody to wake it. A sequentially consistent explorer
never sees that schedule, so this world models the store buffer (x86-TSO):
a plain `store` of an actor goes into its own buffer and reaches memory at
its next fence, atomic operation or system call (or at its end); its own
loads see it at once, everyone else's see memory. That is the latest a
store may become visible, the schedule that breaks a missing fence.

The actors run the real code: the producer P publishes (a plain store, as
a ring frame's head is) and calls the real `Stamp.ring`; the receiver R
runs the real `connector.waiting.poll_until` without a spin, so each miss
sleeps in the real `Stamp.wait`, whose futex word is this world's: asleep,
R cannot run until a `wake`; asleep with every other actor finished is the
lost wake-up (the real one sleeps to its bound, `MAX_DOORBELL_WAIT_SECONDS`,
before it looks again), recorded and checked at the end. The world goes in
through the stamp's seams (`_doorbell`, `_waiters`, `_fence`), as the
other worlds' words go in through `_words`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Final

from ..impl.connector.results import Delivery, GetStatus
from ..impl.connector.waiting import Doorbell, poll_until
from ..impl.discovery.stamp import Stamp
from ..impl.os_seam import DEFAULT_OS
from .interleave import Scenario, Scheduler
from .interleave_scenarios import _require


class StoreBuffers:
    """Each actor's pending plain stores, oldest first (x86-TSO's per-CPU FIFO)."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler
        self._pending: dict[str, list[tuple[ScheduledWord, int]]] = {}

    def _actor(self) -> str | None:
        actor = self.scheduler.current
        return actor.name if actor is not None else None

    def store(self, word: ScheduledWord, value: int) -> None:
        who = self._actor()
        if who is None:  # building or tearing down the world: straight to memory
            word.memory = value
            return
        self._pending.setdefault(who, []).append((word, value))

    def load(self, word: ScheduledWord) -> int:
        """What the running actor reads: its own latest pending store, else memory."""
        who = self._actor()
        for pending, value in reversed(self._pending.get(who or "", [])):
            if pending is word:
                return value
        return word.memory

    def drain(self) -> None:
        """The running actor's buffer reaches memory, in order (a fence, a locked op, a syscall)."""
        for word, value in self._pending.pop(self._actor() or "", []):
            word.memory = value

    def drain_all(self) -> None:
        for pending in self._pending.values():
            for word, value in pending:
                word.memory = value
        self._pending.clear()


class ScheduledWord:
    """A u32 of the world, with the futex calls of `impl.futex.FutexWord`; each a schedule point."""

    def __init__(self, world: DoorbellWorld, name: str, value: int) -> None:
        self.world = world
        self.name = name
        self.memory = value
        self.asleep: set[str] = set()  # actors in `wait` on this word

    def _point(self, what: str) -> None:
        self.world.scheduler.point(f"{what} {self.name}")

    def load(self) -> int:
        self._point("load")
        return self.world.buffers.load(self)

    def store(self, value: int) -> None:
        self._point("store")
        self.world.buffers.store(self, value & 0xFFFFFFFF)

    def add(self, delta: int) -> None:
        """FUTEX_WAKE_OP's add: a locked instruction in the kernel (drains, then adds in memory)."""
        self._point("add")
        self.world.buffers.drain()
        self.memory = (self.memory + delta) & 0xFFFFFFFF

    def wake(self) -> None:
        """FUTEX_WAKE: every actor asleep on the word may run again."""
        self._point("wake")
        self.world.buffers.drain()
        self.world.wakes += bool(self.asleep)
        self.asleep.clear()

    def wait(self, expected: int, timeout: float) -> None:
        """FUTEX_WAIT: the kernel compares memory with `expected`; equal, the actor sleeps."""
        self._point("wait")
        scheduler = self.world.scheduler
        self.world.buffers.drain()
        actor = scheduler.current
        if actor is None or self.memory != expected:
            return
        self.asleep.add(actor.name)
        self.world.sleeps += 1
        while actor.name in self.asleep:
            if scheduler.alone():
                # Nobody left to wake it: the real receiver sleeps to its bound.
                self.asleep.discard(actor.name)
                self.world.lost_wakeups.append(
                    f"{actor.name} asleep on {self.name}={self.memory:#x} (it read "
                    f"{expected:#x}) with nobody left to wake it"
                )
                return
            scheduler.yield_turn(f"asleep on {self.name}")

    def spin_while(self, expected: int, seconds: float) -> bool:
        return self.load() != expected

    def close(self) -> None:
        """Nothing to release: the world owns no mapping."""


class DoorbellWorld:
    """One producer ringing after a publication, one receiver waiting for it."""

    def __init__(self, scheduler: Scheduler, stamp_class: type[Stamp] = Stamp) -> None:
        self.scheduler = scheduler
        self.buffers = StoreBuffers(scheduler)
        self.published = ScheduledWord(self, "publication", 0)  # a ring frame's head, say
        self.stamp = stamp_class("(the doorbell world's stamp)", DEFAULT_OS)
        self.stamp._doorbell = ScheduledWord(self, "doorbell", 0x5EED)  # type: ignore[assignment]
        self.stamp._waiters = ScheduledWord(self, "waiters", 0)  # type: ignore[assignment]
        if stamp_class._fence is Stamp._fence:  # the production fence: this world's instead
            self.stamp._fence = self.fence  # type: ignore[method-assign]
        self.delivered: list[GetStatus] = []
        self.lost_wakeups: list[str] = []
        self.sleeps = 0  # waits that slept (the kernel's compare held)
        self.wakes = 0  # wakes that found a sleeper
        self.actors: list[tuple[str, Callable[[], object]]] = [
            ("P", self.producer),
            ("R", self.receiver),
        ]

    def fence(self) -> None:
        self.scheduler.point("fence")
        self.buffers.drain()

    # -- the actors ------------------------------------------------------------------

    def producer(self) -> None:
        try:
            self.published.store(1)
            self.stamp.ring()
        finally:
            # A store buffer drains in the end, fence or not: at some later point.
            self.scheduler.point("store buffer drains")
            self.buffers.drain()

    def receiver(self) -> None:
        doorbell = Doorbell()
        doorbell.attach(self.stamp)

        def poll(bell: int | None) -> Delivery:
            found = self.published.load() == 1
            return Delivery(GetStatus.DELIVERED if found else GetStatus.NOT_FOUND)

        got = poll_until(
            poll,
            doorbell,
            tuple,
            deadline=time.monotonic() + 3600.0,
            spin_seconds=0.0,  # straight to the sleep: the spin only shortens the race
            max_sleep_seconds=0.001,
            wait_for_locks=True,
        )
        self.delivered.append(got.status)

    # -- checks ----------------------------------------------------------------------

    def check_step(self, label: str) -> None:
        """Nothing to check between steps: the promise is about the end (`check_end`)."""

    def check_end(self) -> None:
        self.buffers.drain_all()
        _require(self.delivered == [GetStatus.DELIVERED], f"R got {self.delivered}")
        _require(not self.lost_wakeups, f"lost wake-up: {'; '.join(self.lost_wakeups)}")
        waiters = self.stamp._waiters
        assert waiters is not None
        _require(waiters.memory == 0, f"waiter count left at {waiters.memory}")  # type: ignore[attr-defined]

    def close(self) -> None:
        self.buffers.drain_all()


def doorbell_ring(stamp_class: type[Stamp] = Stamp) -> Scenario:
    """P publishes and rings while R polls, misses and falls asleep on the doorbell.

    `stamp_class`: a deliberately broken stamp (the scenario's name says which).
    """

    def build(scheduler: Scheduler) -> DoorbellWorld:
        return DoorbellWorld(scheduler, stamp_class)

    name = "doorbell_ring"
    if stamp_class is not Stamp:
        name = f"{name}[{stamp_class.__name__}]"
    return Scenario(name, build, "a ring without a system call against a receiver falling asleep")


DOORBELL_SCENARIOS: Final[tuple[Scenario, ...]] = (doorbell_ring(),)

__all__: Final[Any] = ["DOORBELL_SCENARIOS", "DoorbellWorld", "doorbell_ring"]
