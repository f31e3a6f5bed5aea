"""A deterministic interleaving explorer: producer and readers as cooperative actors.

Design rationale. The lockstep machines apply whole operations; the
cross-process histories leave the schedule inside an operation to the
kernel's luck. A reader that copied a frame's bytes just *after* releasing
the claim lock passed both (issue 14). Here the real `impl` code runs in
threads of one process over one real mapping, and only one thread holds the
baton at a time: every call of the OS seam (`SchedulingOs._enter`) and every
load or store of a shared word (`ScheduledWords`, which replaces a channel's
`SharedWords`) is a schedule point where the explorer picks who runs next.
Nothing in `impl` changes: the facade goes in where a fault plan's goes
(the `os_facade` argument) and the words replace the object's `_words`
(`install_words`), so a production object, which has neither, pays nothing.

Exploration is CHESS's iterative context bounding: a depth-first walk of
the schedule tree by re-execution, every schedule with at most `k`
preemptions (a switch away from an actor that could have gone on); switches
at an actor's end or block are free. Spin loops are made finite the CHESS
way: an actor whose last non-blocking `flock` failed is not scheduled at its
next `flock` until some lock was released, and a blocking `flock` is made of
non-blocking tries, so no actor ever waits in the kernel holding the baton.
Larger scenarios take PCT-style random schedules (random actor priorities,
`depth - 1` random priority drops).

A schedule is a list of decisions, one per schedule point: the actor that
runs next. `Schedule.encode` writes it as runs (`P*3 R0*2` is "P for 3
steps, then R0 for 2"); `replay(scenario, text)` reruns it, and so does
`python -m shmring.fault_injection.interleave --scenario NAME --schedule
TEXT`. Scenarios live in `interleave_scenarios`; see docs/interleavings.md.
"""

from __future__ import annotations

import fcntl
import mmap
import random
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

from ..impl.frame_io import SharedWords
from ..impl.lifecycle import deferring
from ..impl.os_seam import FILE_MODE, OsFacade, SharedMapping

# An actor that does not reach its next schedule point within this many
# seconds is stuck (a real wait in the kernel): the run fails, it does not hang.
_STUCK_AFTER_S: Final = 20.0


class InterleavingFailure(AssertionError):
    """A schedule broke a promise; the message carries the reproducer."""


class _Stuck(Exception):
    pass


class Interrupt(Exception):  # noqa: N818 - the user's exception, not an error of ours
    """What an interruption raises at its stop point (as a raising signal handler would)."""


@dataclass(frozen=True)
class Interruption:
    """Raise `Interrupt` in actor `actor` at its `point`-th stop point (1-based), once.

    An actor's stop points are its schedule points plus the points right
    after a call that took something (a lock, a descriptor, a mapping),
    where a signal handler can run before the caller records it
    (`SchedulingOs`). Written `R0@17`.
    """

    actor: str
    point: int

    def encode(self) -> str:
        return f"{self.actor}@{self.point}"

    @classmethod
    def decode(cls, text: str) -> Interruption:
        actor, _, point = text.partition("@")
        return cls(actor, int(point))


# -- the actors' side ------------------------------------------------------------


class _Actor:
    __slots__ = (
        "body",
        "error",
        "failed_lock_epoch",
        "ident",
        "index",
        "label",
        "name",
        "points",
        "state",
        "at_lock",
        "turn",
        "wait_steps",
    )

    def __init__(self, index: int, name: str, body: Callable[[], object]) -> None:
        self.index = index
        self.name = name
        self.body = body
        self.turn = threading.Semaphore(0)  # released when this actor gets the baton
        self.state = "new"  # "ready", "done"
        self.label = "start"  # the schedule point it waits at
        self.ident = 0
        self.error: BaseException | None = None
        self.failed_lock_epoch = -1  # lock epoch of its last failed try-lock
        self.wait_steps = -1  # yielded at this step: runnable once another actor moved
        self.at_lock = False  # waits at a try-lock that failed since the last unlock
        self.points = 0  # stop points reached (an `Interruption` counts these)


@dataclass
class Decision:
    """One schedule point: who could run, who ran before, who was chosen."""

    enabled: tuple[int, ...]  # actor indexes that could run
    previous: int | None  # the actor that reached the point (None: it finished or blocked)
    chosen: int
    label: str  # what the previous actor was about to do


@dataclass
class RunResult:
    """One schedule, run to its end."""

    decisions: list[Decision]
    failure: str | None  # None when every check held
    steps: int
    interruption: Interruption | None = None  # the one planned for this run
    interrupted: str | None = None  # where it was raised (None: the run never got there)
    stop_labels: dict[str, list[str]] = field(default_factory=dict)  # per actor, in order


class Scheduler:
    """Hands the baton from actor to actor at schedule points."""

    def __init__(self) -> None:
        self._actors: list[_Actor] = []
        self._running: _Actor | None = None
        self._free = False  # after a failure: points are no-ops, actors run to their end
        self._prefix: Sequence[int] = ()
        self._policy: Callable[[Scheduler, int | None, tuple[int, ...]], int] = default_policy
        self.decisions: list[Decision] = []
        self.steps = 0
        self.lock_epoch = 0  # bumped at every unlock and close
        self.failure: str | None = None
        self.check: Callable[[str], None] | None = None  # run at every schedule point
        self.interruption: Interruption | None = None  # raise there, once
        self.interrupted: str | None = None  # where it was raised: "R0 at 'unlock' (point 7)"
        # A world whose environment acts otherwise (a neighbour unlinking a
        # file): called there with the stop point's label instead of raising.
        self.environment: Callable[[str], None] | None = None
        self.stop_labels: dict[str, list[str]] = {}  # per actor: each stop point's label
        self._finished = threading.Event()

    # -- called by actors (through the seams) ------------------------------------

    @property
    def current(self) -> _Actor | None:
        actor = self._running
        if actor is None or self._free or actor.ident != threading.get_ident():
            return None
        return actor

    def point(self, label: str) -> None:
        """A schedule point: check the invariants, then maybe give the baton away."""
        actor = self.current
        if actor is None:
            return
        self.steps += 1
        actor.label = label
        if self.check is not None:
            try:
                self.check(label)
            except AssertionError as error:
                self.fail(f"invariant broken at {actor.name} {label}: {error}")
                return
        self._stop(actor, label)
        self._hand_over(actor)

    def stop(self, label: str) -> None:
        """A stop point that is no schedule point: an interruption may raise here, nothing else.

        Right after a call that took something (a lock, a descriptor) and
        before the caller could record it: where a signal handler runs when
        the call returns. No switch happens here, so the schedules (and the
        bounded search's tree) are the same with or without these points.
        """
        actor = self.current
        if actor is not None:
            self._stop(actor, label)

    def _stop(self, actor: _Actor, label: str) -> None:
        if self.environment is None and deferring():
            # Inside a `lifecycle.deferred_signals` section no signal handler runs
            # (its signal waits for the section's end): no interrupt can land here.
            # A neighbour's action (`environment`) is another process's: it can.
            return
        actor.points += 1
        self.stop_labels.setdefault(actor.name, []).append(label)
        planned = self.interruption
        if (
            planned is not None
            and self.interrupted is None
            and planned.actor == actor.name
            and planned.point == actor.points
        ):
            self.interrupted = f"{actor.name} at '{label}' (its stop point {actor.points})"
            if self.environment is not None:
                self.environment(label)
                return
            raise Interrupt(f"interrupted at {label!r}")

    def alone(self) -> bool:
        """Whether every actor but the running one has finished (nobody left to wake it)."""
        actor = self.current
        return all(other.state == "done" for other in self._actors if other is not actor)

    def wait_for_unlock(self, label: str) -> None:
        """A try-lock point of an actor whose last try failed: wait until some lock is released."""
        actor = self.current
        if actor is None or actor.failed_lock_epoch != self.lock_epoch:
            self.point(label)
            return
        self.steps += 1
        actor.label = label + " (waits for an unlock)"
        self._stop(actor, actor.label)
        actor.at_lock = True
        self._hand_over(actor)
        actor.at_lock = False

    def yield_turn(self, label: str) -> None:
        """The actor cannot progress until another one moves (a retry loop's back-off)."""
        actor = self.current
        if actor is None:
            return
        self.steps += 1
        actor.label = label + " (yields)"
        self._stop(actor, actor.label)
        actor.wait_steps = self.steps
        self._hand_over(actor)

    def lock_failed(self) -> None:
        actor = self.current
        if actor is not None:
            actor.failed_lock_epoch = self.lock_epoch

    def lock_released(self) -> None:
        self.lock_epoch += 1

    def fail(self, message: str) -> None:
        """Record the first failure and let every actor run free to its end."""
        if self.failure is None:
            self.failure = message
        self._release_all()

    # -- the baton -------------------------------------------------------------------

    def _runnable(self, actor: _Actor) -> bool:
        """Ready, and not waiting at a try-lock for an unlock that has not happened."""
        return actor.state == "ready" and not (
            actor.at_lock and actor.failed_lock_epoch == self.lock_epoch
        )

    def _hand_over(self, actor: _Actor) -> None:
        runnable = [other for other in self._actors if self._runnable(other)]
        # A yielded actor runs again once another one took a step, or when it is alone.
        eager = [other for other in runnable if other.wait_steps < self.steps]
        enabled = tuple(other.index for other in (eager or runnable))
        previous = actor.index if actor.index in enabled else None
        chosen = self._choose(previous, enabled, actor.label)
        if chosen is None:
            return
        nxt = self._actors[chosen]
        nxt.wait_steps = -1
        if nxt is actor:
            return
        self._running = nxt
        nxt.turn.release()
        if actor.state == "done":
            return
        if not actor.turn.acquire(timeout=_STUCK_AFTER_S):
            self.fail(f"{actor.name} never got the baton back (a stuck actor?)")

    def _choose(self, previous: int | None, enabled: tuple[int, ...], label: str) -> int | None:
        if not enabled:
            waiting = [a.name for a in self._actors if a.state == "ready"]
            if waiting:
                self.fail(f"deadlock: {waiting} all wait for a lock nobody releases")
            return None
        depth = len(self.decisions)
        if depth < len(self._prefix):
            chosen = self._prefix[depth]
            if chosen not in enabled:
                self.fail(
                    f"schedule diverged at decision {depth}: {chosen} not runnable "
                    f"(runnable {enabled}); the code under test is not deterministic"
                )
                return None
        else:
            chosen = self._policy(self, previous, enabled)
        self.decisions.append(Decision(enabled, previous, chosen, label))
        return chosen

    def _release_all(self) -> None:
        self._free = True
        for actor in self._actors:
            actor.turn.release()

    # -- the main thread ----------------------------------------------------------------

    def run(
        self,
        actors: Sequence[tuple[str, Callable[[], object]]],
        prefix: Sequence[int] = (),
        policy: Callable[[Scheduler, int | None, tuple[int, ...]], int] | None = None,
    ) -> None:
        """Run the actors to their end under the schedule `prefix`, then `policy`."""
        self._prefix = prefix
        if policy is not None:
            self._policy = policy
        self._actors = [_Actor(i, name, body) for i, (name, body) in enumerate(actors)]
        parked = threading.Semaphore(0)
        threads = [
            threading.Thread(target=self._actor_main, args=(actor, parked), daemon=True)
            for actor in self._actors
        ]
        for thread in threads:
            thread.start()
        for _ in threads:
            parked.acquire()  # every actor is ready before the first one runs
        first = self._choose(None, tuple(a.index for a in self._actors), "start")
        if first is not None:
            self._running = self._actors[first]
            self._running.turn.release()
        if not self._finished.wait(_STUCK_AFTER_S * 2):
            self.fail("the schedule did not finish (a stuck actor?)")
        self._release_all()
        for thread in threads:
            thread.join(_STUCK_AFTER_S)

    def _actor_main(self, actor: _Actor, parked: threading.Semaphore) -> None:
        actor.ident = threading.get_ident()
        actor.state = "ready"
        parked.release()
        actor.turn.acquire()
        try:
            actor.body()
        except BaseException as error:  # reported as the schedule's failure
            actor.error = error
            self.fail(f"{actor.name} raised {error!r}")
        finally:
            actor.state = "done"
            actor.label = "done"
            if all(a.state == "done" for a in self._actors):
                self._finished.set()
            elif not self._free and self._running is actor:
                self._hand_over(actor)


def default_policy(scheduler: Scheduler, previous: int | None, enabled: tuple[int, ...]) -> int:
    """Go on with the actor that ran (no preemption), else the first runnable one."""
    return previous if previous is not None else enabled[0]


# -- the seams: OS facade and shared words ------------------------------------------


class SchedulingOs(OsFacade):
    """The OS seam with a schedule point before every call.

    A blocking `flock` becomes non-blocking tries with a schedule point
    before each (the actor is not scheduled again until a lock was released),
    and a call that hands something to the others (LOCK_UN, close, rename,
    unlink) is followed by one more point: code that runs right after such a
    release, unprotected, is where ordering bugs hide.
    """

    def __init__(self, scheduler: Scheduler) -> None:
        self._scheduler = scheduler

    def _enter(self, site: str) -> None:
        self._scheduler.point(site)

    def flock(self, fd: int, operation: int) -> None:
        scheduler = self._scheduler
        if operation & fcntl.LOCK_UN:
            scheduler.point("unlock")
            fcntl.flock(fd, operation)
            scheduler.lock_released()
            scheduler.point("after unlock")
            return
        if scheduler.current is None:
            fcntl.flock(fd, operation)
            return
        blocking = not operation & fcntl.LOCK_NB
        while True:
            scheduler.wait_for_unlock("lock" if blocking else "try-lock")
            try:
                fcntl.flock(fd, operation | fcntl.LOCK_NB)
            except BlockingIOError:
                scheduler.lock_failed()
                if not blocking:
                    raise
                continue
            scheduler.stop("after lock")  # taken: a handler may run before the caller's `try`
            return

    def ofd_lock(self, fd: int, *, exclusive: bool = True) -> None:
        super().ofd_lock(fd, exclusive=exclusive)
        self._scheduler.stop("after ofd lock")

    # Calls that hand the caller a descriptor or a mapping: a stop point right
    # after each, before the caller can record what it got.

    def open(self, path: str, flags: int, mode: int = FILE_MODE) -> int:
        fd = super().open(path, flags, mode)
        self._scheduler.stop("after open")
        return fd

    def open_at(self, dir_fd: int, name: str, flags: int, mode: int = FILE_MODE) -> int:
        fd = super().open_at(dir_fd, name, flags, mode)
        self._scheduler.stop("after open")
        return fd

    def open_directory(self, path: str) -> int:
        fd = super().open_directory(path)
        self._scheduler.stop("after open")
        return fd

    def mmap(self, fd: int, length: int, *, writable: bool = True) -> mmap.mmap:
        mapping = super().mmap(fd, length, writable=writable)
        self._scheduler.stop("after mmap")
        return mapping

    def map_shared(self, fd: int, length: int) -> SharedMapping:
        mapping = super().map_shared(fd, length)
        self._scheduler.stop("after mmap")
        return mapping

    def pidfd_open(self, pid: int) -> int:
        fd = super().pidfd_open(pid)
        self._scheduler.stop("after pidfd_open")
        return fd

    def close(self, fd: int) -> None:
        super().close(fd)
        self._scheduler.lock_released()  # closing may drop a lock
        self._scheduler.point("after close")

    def rename(self, source: str, target: str) -> None:
        super().rename(source, target)
        self._scheduler.point("after rename")  # a name changed hands: others may act on it

    def unlink(self, path: str) -> None:
        super().unlink(path)
        self._scheduler.point("after unlink")


def _word_name(width: int, index: int) -> str:
    """A shared word's field, from spec.layout: 'head', 'frame@96.state', ..."""
    from ..spec import layout

    offset = index * width
    names = {
        (8, layout.RING_HEAD_OFFSET): "head",
        (8, layout.RING_TAIL_OFFSET): "tail",
        (8, layout.RING_WAKEUP_SEQUENCE_OFFSET): "wakeup",
        (4, layout.RING_STATE_OFFSET): "ring state",
    }
    name = names.get((width, offset))
    if name is not None:
        return name
    data = offset - layout.RING_HEADER_LENGTH
    for field_width, field_offset, field_name in (
        (4, layout.FRAME_LENGTH_OFFSET, "length"),
        (2, layout.FRAME_STATE_OFFSET, "state"),
        (4, layout.FRAME_HOLDER_PID_OFFSET, "holder"),
    ):
        start = data - field_offset
        if width == field_width and start >= 0 and start % layout.FRAME_ALIGNMENT == 0:
            return f"frame@{start}.{field_name}"
    return f"u{width * 8}[{index}]"


class _ScheduledItems:
    """One of SharedWords' typed views, with a schedule point before every item access."""

    __slots__ = ("_items", "_name_of", "_names", "_point", "_width")

    def __init__(
        self,
        items: memoryview,
        width: int,
        point: Callable[[str], None],
        name_of: Callable[[int, int], str] = _word_name,
    ) -> None:
        self._items = items
        self._width = width
        self._point = point
        self._name_of = name_of
        self._names: dict[int, str] = {}

    def _name(self, index: int) -> str:
        name = self._names.get(index)
        if name is None:
            name = self._names[index] = self._name_of(self._width, index)
        return name

    def __getitem__(self, index: int) -> int:
        self._point("load " + self._name(index))
        value: int = self._items[index]
        return value

    def __setitem__(self, index: int, value: int) -> None:
        self._point("store " + self._name(index))
        self._items[index] = value


class ScheduledWords(SharedWords):
    """`SharedWords` whose every load and store is a schedule point (same memory).

    `name_of(width, index)` labels a word; the default reads the ring layout
    (a pool slot's header passes its own).
    """

    __slots__ = ("_inner",)

    def __init__(
        self,
        inner: SharedWords,
        scheduler: Scheduler,
        name_of: Callable[[int, int], str] = _word_name,
    ) -> None:
        self._inner = inner
        point = scheduler.point
        self.u16 = _ScheduledItems(inner.u16, 2, point, name_of)  # type: ignore[assignment]
        self.u32 = _ScheduledItems(inner.u32, 4, point, name_of)  # type: ignore[assignment]
        self.u64 = _ScheduledItems(inner.u64, 8, point, name_of)  # type: ignore[assignment]

    def release(self) -> None:
        self._inner.release()


def install_words(owner: Any, scheduler: Scheduler) -> None:
    """Give `owner` (a ring channel or reader, an arena or arena reader) scheduled words.

    The object's `_words` is what every named accessor of `frame_io` is
    handed; the replacement reads and writes the same memory.
    """
    words = owner._words
    assert isinstance(words, SharedWords) and not isinstance(words, ScheduledWords)
    owner._words = ScheduledWords(words, scheduler)


# -- scenarios ------------------------------------------------------------------------


class World(Protocol):
    """One scenario's objects for one schedule (built unscheduled, torn down after)."""

    actors: list[tuple[str, Callable[[], object]]]

    def check_step(self, label: str) -> None:
        """Invariants over the shared memory; raise AssertionError when one breaks."""

    def check_end(self) -> None:
        """After every actor finished: what was delivered against what was put."""

    def close(self) -> None:
        """Remove everything the world made."""


@dataclass(frozen=True)
class Scenario:
    name: str
    build: Callable[[Scheduler], World]
    summary: str = ""


# -- running and exploring ---------------------------------------------------------------


@dataclass(frozen=True)
class Schedule:
    """A run's decisions by actor name, as runs: 'P*3 R0*2' (P three steps, then R0 two)."""

    names: tuple[str, ...]

    def encode(self) -> str:
        runs: list[tuple[str, int]] = []
        for name in self.names:
            if runs and runs[-1][0] == name:
                runs[-1] = (name, runs[-1][1] + 1)
            else:
                runs.append((name, 1))
        return " ".join(f"{name}*{count}" for name, count in runs)

    @classmethod
    def decode(cls, text: str) -> Schedule:
        names: list[str] = []
        for run in text.split():
            name, _, count = run.partition("*")
            names.extend([name] * int(count or 1))
        return cls(tuple(names))


def run_schedule(
    scenario: Scenario,
    prefix: Sequence[int] = (),
    policy: Callable[[Scheduler, int | None, tuple[int, ...]], int] | None = None,
    interruption: Interruption | None = None,
) -> RunResult:
    """Build the scenario's world, run one schedule, check the end, tear down.

    With an `interruption`, that actor's stop point raises `Interrupt`
    instead (the world's scripts say what an interrupted operation may leave).
    """
    scheduler = Scheduler()
    scheduler.interruption = interruption
    world = scenario.build(scheduler)
    try:
        scheduler.check = world.check_step
        scheduler.run(world.actors, prefix, policy)
        failure = scheduler.failure
        if failure is None:
            try:
                world.check_end()
            except AssertionError as error:
                failure = f"end check: {error}"
    finally:
        scheduler.check = None
        world.close()
    return RunResult(
        scheduler.decisions,
        failure,
        scheduler.steps,
        interruption,
        scheduler.interrupted,
        {name: list(labels) for name, labels in scheduler.stop_labels.items()},
    )


def _names(world_actors: Sequence[tuple[str, Callable[[], object]]]) -> list[str]:
    return [name for name, _ in world_actors]


@dataclass
class Report:
    """What an exploration did."""

    scenario: str
    mode: str  # "bounded k=2" or "pct d=3"
    schedules: int = 0
    steps: int = 0
    seconds: float = 0.0
    exhaustive: bool = False  # the bounded tree was walked to its end
    failure: str | None = None
    reproducer: str | None = None  # the failing schedule (Schedule.encode)
    interruption: str | None = None  # the failing run's `Interruption.encode`, if any
    interrupted: str | None = None  # where the failing run's interrupt was raised
    stop_points: int = 0  # interruptions tried (`explore_interrupts`)
    # explore_interrupts(keep_going=True): every failing interruption, as
    # (its Interruption.encode, where it was raised, the failure, the reproducer).
    failures: list[tuple[str, str, str, str]] = field(default_factory=list)

    @property
    def per_second(self) -> float:
        return self.schedules / self.seconds if self.seconds > 0 else 0.0


@dataclass
class _Node:
    enabled: tuple[int, ...]
    previous: int | None
    chosen: int
    tried: set[int] = field(default_factory=set)

    @property
    def preempts(self) -> bool:
        return self.previous is not None and self.chosen != self.previous


def _actor_names(scenario: Scenario) -> list[str]:
    scheduler = Scheduler()
    world = scenario.build(scheduler)
    try:
        return _names(world.actors)
    finally:
        world.close()


def _describe(scenario: Scenario, result: RunResult, names: list[str]) -> tuple[str, str]:
    chosen = Schedule(tuple(names[d.chosen] for d in result.decisions))
    text = chosen.encode()
    switches = []
    for index, decision in enumerate(result.decisions):
        before = result.decisions[index - 1].chosen if index else None
        if decision.chosen != before:
            who = names[before] if before is not None else "-"
            switches.append(f"  #{index}: {who} at '{decision.label}' -> {names[decision.chosen]}")
    planned = result.interruption
    if _is_registered(scenario):
        rerun = (
            f"rerun: python -m shmring.fault_injection.interleave --scenario {scenario.name} "
            f"--schedule '{text}'"
        ) + ("" if planned is None else f" --interrupt {planned.encode()}")
    else:
        extra = "" if planned is None else f", interrupt={planned.encode()!r}"
        rerun = f"rerun: shmring.fault_injection.interleave.replay(<scenario>, {text!r}{extra})"
    interrupted = ""
    if planned is not None:
        interrupted = f"interrupt: {planned.encode()}: raised in {result.interrupted or 'never'}\n"
    message = (
        f"interleaving failure in scenario {scenario.name}: {result.failure}\n"
        f"schedule: {text}\n" + interrupted + ""
        "switches (the last 40):\n" + "\n".join(switches[-40:]) + "\n" + rerun
    )
    return message, text


def explore_bounded(
    scenario: Scenario,
    preemptions: int,
    *,
    max_schedules: int | None = None,
    seconds: float | None = None,
    interruption: Interruption | None = None,
) -> Report:
    """Every schedule with at most `preemptions` preemptions (depth-first, by re-execution).

    With an `interruption`, every one of those schedules raises it there.
    """
    report = Report(scenario.name, f"bounded k={preemptions}")
    names = _actor_names(scenario)
    started = time.perf_counter()
    path: list[_Node] = []
    prefix: list[int] = []
    while True:
        result = run_schedule(scenario, prefix, interruption=interruption)
        report.schedules += 1
        report.steps += result.steps
        if result.failure is None:
            for node, decision in zip(path, result.decisions, strict=False):
                if node.enabled != decision.enabled:
                    result = RunResult(
                        result.decisions,
                        "replay diverged: the code under test is not deterministic",
                        result.steps,
                        interruption,
                        result.interrupted,
                    )
                    break
        if result.failure is not None:
            report.failure, report.reproducer = _describe(scenario, result, names)
            report.interruption = None if interruption is None else interruption.encode()
            report.interrupted = result.interrupted
            break
        for decision in result.decisions[len(path) :]:
            path.append(
                _Node(decision.enabled, decision.previous, decision.chosen, {decision.chosen})
            )
        used = [0]
        for node in path:
            used.append(used[-1] + node.preempts)
        while path:
            node = path[-1]
            budget = preemptions - used[len(path) - 1]
            alternative = next(
                (
                    c
                    for c in node.enabled
                    if c not in node.tried
                    and (node.previous is None or c == node.previous or budget > 0)
                ),
                None,
            )
            if alternative is not None:
                node.tried.add(alternative)
                node.chosen = alternative
                break
            path.pop()
        if not path:
            report.exhaustive = True
            break
        prefix = [node.chosen for node in path]
        elapsed = time.perf_counter() - started
        if (max_schedules is not None and report.schedules >= max_schedules) or (
            seconds is not None and elapsed >= seconds
        ):
            break
    report.seconds = time.perf_counter() - started
    return report


class PctPolicy:
    """PCT (Burckhardt et al.): random actor priorities, `depth - 1` random priority drops."""

    def __init__(self, rng: random.Random, actors: int, depth: int, steps: int) -> None:
        order = list(range(actors))
        rng.shuffle(order)
        self.priority = {actor: depth + rank for rank, actor in enumerate(order)}
        points = rng.sample(range(1, max(steps, depth) + 1), depth - 1) if depth > 1 else []
        self.drops = {step: depth - 1 - i for i, step in enumerate(sorted(points))}

    def __call__(self, scheduler: Scheduler, previous: int | None, enabled: tuple[int, ...]) -> int:
        drop = self.drops.get(len(scheduler.decisions))
        if drop is not None and previous is not None:
            self.priority[previous] = drop
        return max(enabled, key=self.priority.__getitem__)


def explore_random(
    scenario: Scenario,
    schedules: int,
    *,
    depth: int = 3,
    seed: int = 0,
    seconds: float | None = None,
) -> Report:
    """`schedules` PCT schedules of depth `depth` (seeded: the same seed, the same schedules)."""
    report = Report(scenario.name, f"pct d={depth}")
    names = _actor_names(scenario)
    rng = random.Random(f"{scenario.name}:{seed}")
    started = time.perf_counter()
    expected = run_schedule(scenario).steps  # the length of a run, for the drop points
    for _ in range(schedules):
        policy = PctPolicy(rng, len(names), depth, expected)
        result = run_schedule(scenario, (), policy)
        report.schedules += 1
        report.steps += result.steps
        if result.failure is not None:
            report.failure, report.reproducer = _describe(scenario, result, names)
            break
        if seconds is not None and time.perf_counter() - started >= seconds:
            break
    report.seconds = time.perf_counter() - started
    return report


def replay(scenario: Scenario | str, schedule: str, interrupt: str | None = None) -> RunResult:
    """Rerun one schedule (as `Schedule.encode` wrote it); the result says what failed.

    `interrupt` ('R0@17', as a failure printed it) raises there again.
    """
    if isinstance(scenario, str):
        scenario = scenario_named(scenario)
    names = _actor_names(scenario)
    prefix = [names.index(name) for name in Schedule.decode(schedule).names]
    interruption = None if interrupt is None else Interruption.decode(interrupt)
    return run_schedule(scenario, prefix, interruption=interruption)


def explore_interrupts(
    scenario: Scenario,
    *,
    actors: Sequence[str] | None = None,
    preemptions: int = 0,
    max_schedules: int | None = None,
    skip: Callable[[str], bool] | None = None,
    keep_going: bool = False,
) -> Report:
    """Every stop point of every actor (or of `actors`), one interrupt per run.

    A clean run under the default policy counts each actor's stop points;
    then, for each actor and each of its points, every schedule with at most
    `preemptions` preemptions runs with `Interrupt` raised there (at 0: every
    order of the actors that switches only where one finishes or yields).
    `max_schedules` caps each point's bounded walk; `skip(label)` leaves out
    the stop points whose label it accepts. The first failure stops
    the exploration; its reproducer names the schedule and the interruption.
    With `keep_going`, every stop point is tried and each failing one (its
    first failing schedule) is listed in `Report.failures`; `failure` is the first.
    """
    report = Report(scenario.name, f"interrupts k={preemptions}")
    started = time.perf_counter()
    clean = run_schedule(scenario)
    report.schedules += 1
    report.steps += clean.steps
    if clean.failure is not None:
        report.failure, report.reproducer = _describe(scenario, clean, _actor_names(scenario))
        report.seconds = time.perf_counter() - started
        return report
    exhaustive = True
    for actor, labels in clean.stop_labels.items():
        if actors is not None and actor not in actors:
            continue
        for point, label in enumerate(labels, 1):
            if skip is not None and skip(label):
                continue
            interruption = Interruption(actor, point)
            walk = explore_bounded(
                scenario, preemptions, max_schedules=max_schedules, interruption=interruption
            )
            report.schedules += walk.schedules
            report.steps += walk.steps
            report.stop_points += 1
            exhaustive = exhaustive and walk.exhaustive
            if walk.failure is not None:
                if report.failure is None:
                    report.failure, report.reproducer = walk.failure, walk.reproducer
                    report.interruption = interruption.encode()
                    report.interrupted = walk.interrupted
                report.failures.append(
                    (
                        interruption.encode(),
                        walk.interrupted or "",
                        walk.failure.splitlines()[0],
                        walk.failure,
                    )
                )
                if not keep_going:
                    report.seconds = time.perf_counter() - started
                    return report
    report.exhaustive = exhaustive and not report.failures
    report.seconds = time.perf_counter() - started
    return report


def registered_scenarios() -> tuple[Scenario, ...]:
    """Every scenario the command line knows (interleavings, interrupts, liveness, neighbours)."""
    from .interleave_doorbell import DOORBELL_SCENARIOS
    from .interleave_interrupts import INTERRUPT_SCENARIOS
    from .interleave_liveness import LIVENESS_SCENARIOS
    from .interleave_neighbours import NEIGHBOUR_SCENARIOS
    from .interleave_scenarios import SCENARIOS

    return (
        *SCENARIOS,
        *INTERRUPT_SCENARIOS,
        *LIVENESS_SCENARIOS,
        *DOORBELL_SCENARIOS,
        *NEIGHBOUR_SCENARIOS,
    )


def _is_registered(scenario: Scenario) -> bool:
    return any(registered.name == scenario.name for registered in registered_scenarios())


def scenario_named(name: str) -> Scenario:
    scenarios = registered_scenarios()
    for scenario in scenarios:
        if scenario.name == name:
            return scenario
    raise KeyError(f"no interleaving scenario named {name!r}: {[s.name for s in scenarios]}")


# -- the `shmring check` section ------------------------------------------------------------

# Per budget: the preemption bound, the most schedules one bounded walk may
# take (None: to its end), and the PCT schedules (depth 3) per scenario.
BUDGETS: Final = {
    "quick": (1, None, 25),
    "standard": (2, 20_000, 300),
    "deep": (3, 200_000, 3_000),
}


def run_interleavings(
    budget: str, seed: int, progress: Callable[[int, int | None], None]
) -> dict[str, int]:
    """The `shmring check` section: every registered scenario under `budget`."""
    from .interleave_scenarios import SCENARIOS

    counts = explore_scenarios(SCENARIOS, budget, seed, progress)
    counts.update(explore_environment(budget, seed))
    return counts


def explore_environment(budget: str, seed: int) -> dict[str, int]:
    """The environment's scenarios under `budget` (raises InterleavingFailure on a failure).

    Interrupts: every stop point of `interrupt_*` at one preemption less than
    the budget's bound, every failure one of `KNOWN_OPEN` (counted) or a new
    one (raised). The liveness verdict and the doorbell's ring (a store
    buffer modelled): bounded and PCT as the other scenarios. A
    neighbour's unlink and truncation: every stop point it may act at, at
    one preemption less than the bound.
    """
    from .interleave_doorbell import DOORBELL_SCENARIOS
    from .interleave_interrupts import (
        INTERRUPT_SCENARIOS,
        KNOWN_OPEN,
        KNOWN_OPEN_PREEMPTED,
        findings,
    )
    from .interleave_liveness import LIVENESS_SCENARIOS
    from .interleave_neighbours import NEIGHBOUR_SCENARIOS, explore_neighbour

    preemptions, cap, random_schedules = BUDGETS[budget]
    environment = max(preemptions - 1, 0)
    counts: dict[str, int] = {}
    points = schedules = known = 0
    for scenario in INTERRUPT_SCENARIOS:
        report = explore_interrupts(
            scenario, preemptions=environment, max_schedules=cap, keep_going=True
        )
        allowed = KNOWN_OPEN[scenario.name] | (
            KNOWN_OPEN_PREEMPTED[scenario.name] if environment else set()
        )
        found = findings(report)
        new = [found[key] for key in found if key not in allowed]
        if new:
            raise InterleavingFailure(new[0])
        points += report.stop_points
        schedules += report.schedules
        known += len(found)
    counts["interrupted stop points"] = points
    counts["interrupted schedules"] = schedules
    counts["interrupt findings open (KNOWN_OPEN)"] = known
    for scenario in (*LIVENESS_SCENARIOS, *DOORBELL_SCENARIOS):
        for report in (
            explore_bounded(scenario, preemptions, max_schedules=cap),
            explore_random(scenario, random_schedules, depth=3, seed=seed),
        ):
            if report.failure is not None:
                raise InterleavingFailure(report.failure)
            counts[f"{scenario.name} schedules"] = (
                counts.get(f"{scenario.name} schedules", 0) + report.schedules
            )
    for scenario in NEIGHBOUR_SCENARIOS:
        report = explore_neighbour(scenario, environment, max_schedules=cap)
        if report.failure is not None:
            raise InterleavingFailure(report.failure)
        counts[f"{scenario.name} schedules"] = report.schedules
    return counts


def explore_scenarios(
    chosen: Sequence[Scenario],
    budget: str,
    seed: int,
    progress: Callable[[int, int | None], None],
) -> dict[str, int]:
    """Each scenario: bounded exhaustive, then PCT; raises InterleavingFailure on a failure."""
    preemptions, cap, random_schedules = BUDGETS[budget]
    counts: dict[str, int] = {}
    schedules = 0
    seconds = 0.0
    exhaustive = 0
    for index, scenario in enumerate(chosen):
        progress(index, len(chosen))
        reports = [
            explore_bounded(scenario, preemptions, max_schedules=cap),
            explore_random(scenario, random_schedules, depth=3, seed=seed),
        ]
        for report in reports:
            if report.failure is not None:
                raise InterleavingFailure(report.failure)
            schedules += report.schedules
            seconds += report.seconds
        exhaustive += reports[0].exhaustive
        counts[f"{scenario.name} schedules"] = reports[0].schedules + reports[1].schedules
    progress(len(chosen), len(chosen))
    counts["schedules"] = schedules
    counts["schedules/s"] = int(schedules / seconds) if seconds > 0 else 0
    counts[f"scenarios exhaustive to k={preemptions}"] = exhaustive
    counts["scenarios"] = len(chosen)
    return counts


def main(argv: Sequence[str] | None = None) -> int:
    import argparse

    scenarios = registered_scenarios()
    parser = argparse.ArgumentParser(
        prog="python -m shmring.fault_injection.interleave",
        description="Rerun one schedule of an interleaving scenario, or explore one.",
    )
    parser.add_argument("--scenario", choices=[s.name for s in scenarios])
    parser.add_argument("--schedule", help="a schedule as a failure printed it: 'P*3 R0*2 ...'")
    parser.add_argument(
        "--interrupt", help="with --schedule: raise at this stop point, as printed: 'R0@17'"
    )
    parser.add_argument(
        "--interrupts",
        action="store_true",
        help="explore: raise at every stop point in turn (with --preemptions)",
    )
    parser.add_argument("--preemptions", type=int, default=2, help="bound for --explore")
    parser.add_argument("--random", type=int, default=0, help="PCT schedules for --explore")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--list", action="store_true", help="list the scenarios")
    args = parser.parse_args(argv)
    if args.list or args.scenario is None:
        for scenario in scenarios:
            print(f"{scenario.name}: {scenario.summary}")
        return 0
    scenario = scenario_named(args.scenario)
    if args.schedule is not None:
        result = replay(scenario, args.schedule, args.interrupt)
        if result.failure is None:
            print(f"{scenario.name}: the schedule ran to its end; every check held")
            return 0
        print(_describe(scenario, result, _actor_names(scenario))[0])
        return 1
    if args.interrupts:
        reports = [explore_interrupts(scenario, preemptions=args.preemptions)]
    else:
        reports = [explore_bounded(scenario, args.preemptions)]
    if args.random:
        reports.append(explore_random(scenario, args.random, seed=args.seed))
    status = 0
    for report in reports:
        points = f", {report.stop_points} stop points" if report.stop_points else ""
        print(
            f"{report.scenario} {report.mode}: {report.schedules} schedules{points} "
            f"({report.per_second:.0f}/s){' exhaustive' if report.exhaustive else ''}"
        )
        if report.failure is not None:
            print(report.failure)
            status = 1
    return status


if __name__ == "__main__":
    raise SystemExit(main())
