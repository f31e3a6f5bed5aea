"""A neighbour's actions in the interleaving explorer (issue 22).

Design rationale. `spec.environment` names what a same-uid neighbour may do
to our files and the `Outcome` promised for each. Here a neighbour acts at
a stop point of the producer or the reader (`Scheduler.environment`: the
explorer's interruption machinery, acting instead of raising), at every
stop point in turn (`interleave.explore_interrupts`), and the world checks
the promise:

* `UNLINK_RING` (`neighbour_unlink`, at any stop point): the producer
  notices at its next put (`RingChannel.file_problem`: st_nlink == 0),
  moves the unclaimed frames (`evacuate`: CLOSED first, then each
  PUBLISHED frame retired under the claim lock and copied out) to a
  re-created ring that continues the positions, and puts them there, as
  `RingRoute.replace` does; a reader still mapping the old file sees it
  CLOSED and attaches the new one by path. Lost: nothing. Every version
  put is delivered exactly once (never twice: once claimed from the old
  mapping, or moved), `evacuate` reports no frame lost, and the model's
  invariants hold on whichever ring is current.
* `TRUNCATE_RING` (`neighbour_truncate`, between operations only): the
  reader's next get of the ring is a `CorruptFrameError` (never a crash,
  never wrong bytes) and the producer notices at its next put
  (`file_problem`: the file shrank), drops the ring (`discard_shrunk`,
  counting its unclaimed frames lost) and re-creates it; later puts are
  delivered. A truncation *inside* an operation is the window
  `spec.environment` leaves open (SIGBUS between the size check and the
  access): in one process it would kill the explorer, so that window is
  model_tests/test_hostile_files.py's, with real second processes.
"""

from __future__ import annotations

import os
from typing import Any, Final

from ..impl.errors import CorruptFrameError, ShmringError
from ..impl.ring.producer import RingChannel
from ..impl.ring.reader import RingReader
from ..spec.environment import OUTCOMES, NeighbourAction
from ..spec.ring import PutStatus
from .interleave import Scenario, Scheduler, install_words
from .interleave_scenarios import (
    RETRIES,
    RING_CAPACITY,
    Observer,
    RingWorld,
    _require,
)


def between_operations(label: str) -> bool:
    """A stop point between two operations: where a truncation may land.

    Before a get (the reader checks the file's size first), and before the
    producer's file check that precedes each put. A put's own write after
    its check is the open window.
    """
    return label.startswith("get ") or label.endswith("(file check)")


class NeighbourRingWorld(RingWorld):
    """A ring a neighbour unlinks or truncates once, at the stop point the run names."""

    def __init__(
        self,
        scheduler: Scheduler,
        action: NeighbourAction,
        channel_class: type[RingChannel] = RingChannel,
    ) -> None:
        super().__init__(scheduler, 1, preload=1, channel_class=channel_class)
        self.channel_class = channel_class
        self.scheduler = scheduler
        self.action = action
        self.outcome = OUTCOMES[action]
        self.acted: str | None = None  # the label it acted at
        self.replaced = 0
        self.lost = 0
        self.corrupt = 0  # reader gets answered CorruptFrameError
        self.reader = self.readers[0]
        scheduler.environment = self.neighbour

    # -- the neighbour --------------------------------------------------------------

    def neighbour(self, label: str) -> None:
        """Unscheduled, through the real OS: the neighbour's one action."""
        if self.action is NeighbourAction.TRUNCATE_RING and not between_operations(label):
            return  # inside an operation: the open SIGBUS window (module docstring)
        self.acted = label
        if self.action is NeighbourAction.UNLINK_RING:
            os.unlink(self.path)
        else:
            os.truncate(self.path, RING_CAPACITY // 2)

    # -- the producer's and the reader's side ---------------------------------------------

    def _replace_if_needed(self) -> None:
        """As `RingRoute.replace`: a file the neighbour unlinked or truncated is re-created."""
        problem = self.channel.file_problem()
        if problem is None:
            return
        old = self.channel
        head = old.head
        if "shrank" in problem:
            moved: list[tuple[str, bytes]] = []
            self.lost += old.discard_shrunk()
        else:
            moved, lost = old.evacuate()
            self.lost += lost
        self.channel = self.channel_class.create(
            self.path,
            RING_CAPACITY,
            os_facade=self.os,
            producer=(os.getpid(), 1),
            start_position=head,
        )
        install_words(self.channel, self.scheduler)
        self.replaced += 1
        self.observer.close()
        self.observer = Observer(self.path, RING_CAPACITY)
        self._snapshot = None
        self.states = {}
        for key, payload in moved:
            outcome = self.channel.put(key, payload)
            _require(outcome.status is PutStatus.PUBLISHED, f"moved {key!r}: {outcome.status}")
            self.log.put_done(key, payload, True)

    def put(self, key: str, version: int, *, retries: int = RETRIES) -> PutStatus:
        self.scheduler.point(f"put {key} v{version} (file check)")  # before the check
        self._replace_if_needed()
        return super().put(key, version, retries=retries)

    def _reattach(self) -> bool:
        """A reader of a closed or shrunk ring attaches the file at the path (if there is one)."""
        try:
            reader = RingReader.attach(self.path, os_facade=self.os)
        except (FileNotFoundError, ShmringError):
            return False
        install_words(reader, self.scheduler)
        self.reader.close()
        self.reader = self.readers[0] = reader
        return True

    def get_key(self, who: str, key: str) -> Any:
        for attempt in range(RETRIES + 1):
            try:
                value = self.get(who, self.reader, key, retries=0)
            except CorruptFrameError:
                self.corrupt += 1
                _require(
                    self.action is NeighbourAction.TRUNCATE_RING,
                    "CorruptFrameError without a truncation",
                )
                value = None
                self._reattach()
            if value is not None:
                return value
            if self.reader.producer_closed:
                self._reattach()
            if attempt < RETRIES:
                self.scheduler.yield_turn("not yet")
        return None

    # -- checks ------------------------------------------------------------------------

    def check_step(self, label: str) -> None:
        """The model's checks on the current ring; a shrunk file is not read (SIGBUS)."""
        if os.fstat(self.observer.fd).st_size < len(self.observer.view):
            return  # truncated: only the producer's re-created ring is checked from here
        super().check_step(label)

    def check_end(self) -> None:
        self.check_step("end")
        if self.acted is not None:
            # The producer notices at its next put: one more put after the act.
            self.scheduler.environment = None
            self._replace_if_needed()
            _require(
                self.replaced == 1,
                f"the producer re-created the ring {self.replaced} times after the "
                f"{self.action.name} at {self.acted!r} (promised: {self.outcome.producer})",
            )
        if self.action is NeighbourAction.UNLINK_RING:
            _require(
                self.lost == 0, f"{self.lost} frame(s) lost to an unlink ({self.outcome.lost})"
            )
        else:
            # A truncation's lost frames are only the unclaimed ones it destroyed.
            for key in self.log.live:
                if self.lost:
                    self.log.live[key] = None
        if self.acted is not None:  # the drain reads the ring at the path, as a rescan would
            _require(self._reattach(), "no ring to attach at the path after the re-creation")
        super().check_end()
        self.reader.close()
        self.channel.close()
        left = sorted(os.listdir(self.directory))
        _require(not left, f"files left after every close: {left}")


def _neighbour_scenario(
    action: NeighbourAction, name: str, channel_class: type[RingChannel]
) -> Scenario:
    def build(scheduler: Scheduler) -> NeighbourRingWorld:
        world = NeighbourRingWorld(scheduler, action, channel_class)

        def producer() -> None:
            world.put("k1", 0)
            world.put("k2", 0)
            world.put("k1", 1)  # a re-put: retires v0 (on whichever ring holds it)

        def reader() -> None:
            for key in ("k0", "k1", "k2"):
                world.get_key("R0", key)

        world.actors = [("P", producer), ("R0", reader)]
        return world

    if channel_class is not RingChannel:
        name = f"{name}[{channel_class.__name__}]"
    return Scenario(name, build, f"a neighbour's {action.value!r} at a stop point")


def neighbour_unlink(channel_class: type[RingChannel] = RingChannel) -> Scenario:
    """The ring file unlinked at a stop point of P or R0; nothing lost, nothing twice."""
    return _neighbour_scenario(NeighbourAction.UNLINK_RING, "neighbour_unlink", channel_class)


def neighbour_truncate(channel_class: type[RingChannel] = RingChannel) -> Scenario:
    """The ring file truncated between operations; a typed error, then a new ring."""
    return _neighbour_scenario(NeighbourAction.TRUNCATE_RING, "neighbour_truncate", channel_class)


def explore_neighbour(scenario: Scenario, preemptions: int = 0, **options: Any) -> Any:
    """`explore_interrupts` with the neighbour acting at the stop points its action allows."""
    from .interleave import explore_interrupts

    skip = (
        None if "truncate" not in scenario.name else (lambda label: not between_operations(label))
    )
    return explore_interrupts(scenario, preemptions=preemptions, skip=skip, **options)


NEIGHBOUR_SCENARIOS: Final = (neighbour_unlink(), neighbour_truncate())
