"""The liveness verdict in the interleaving explorer: a member's join, leave and re-join
against an observer's verdict, at every schedule point (issue 26).

Design rationale. The verdict (`impl.liveness`) is the kernel's: a member
holds an open-file-description lock on its liveness file
``live.<pid>.<start time>`` for as long as it is a member, and an observer
in another pid namespace keeps a descriptor of that file and asks
F_OFD_GETLK (held: alive; free: dead). A session found a real bug exactly
here: an observer kept the descriptor, the member left (its file unlinked,
the lock dropped) and joined again (a new file, a new lock), and the kept
inode's free lock read as dead, for good; the fix looks the name up again
(`Liveness._still_named`). This world runs the real `hold_liveness_file` /
`release_liveness_file` of a member (M) and the real `Liveness.is_alive`
of observers (O0, O1) through `SchedulingOs`, so every open, read, lock,
lock test, fstat, stat, unlink and close is a schedule point, and checks
the safety half of the verdict's promise: the member's process runs for
the whole run, so no answer of any observer is ever "dead" (a wrong dead is
what removes a live member's files). At the end, with the member joined
again, a fresh question of every observer still answers alive, and after
the member's last leave no file is left.

The observers are made to stand in another pid namespace (their recorded
namespace is one no process has), so the lock verdict answers, not the
(pid, start time) fast path: in one process the pid always names a live
process, which would hide every bug of the lock verdict.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from typing import Any, Final

from ..impl import liveness as liveness_module
from ..impl.directory import PathDirectory
from ..impl.names import current_producer_identity
from .interleave import Scenario, Scheduler, SchedulingOs
from .interleave_scenarios import SHM_ROOT, _require

# No process's pid namespace: an observer with it is "in another namespace".
FOREIGN_NAMESPACE: Final = (0, 0)


class LivenessWorld:
    """A deployment directory, a member that joins, leaves and re-joins, observers asking."""

    def __init__(
        self,
        scheduler: Scheduler,
        observers: int,
        liveness_class: type[Any] = liveness_module.Liveness,
    ) -> None:
        self.scheduler = scheduler
        self.directory_path = tempfile.mkdtemp(prefix="shmring-il-", dir=SHM_ROOT)
        self.os = SchedulingOs(scheduler)
        self.directory = PathDirectory(self.directory_path, self.os)
        self.member = current_producer_identity()  # this process: alive for the whole run
        self.holds = 0  # the member's holds now (hold_liveness_file is counted)
        self.verdicts: list[tuple[str, bool]] = []  # (who, answer) in order
        self.observers = []
        for _ in range(observers):
            observer = liveness_class(self.os, own_identity=(1, 1), directory=self.directory)
            observer._namespace = FOREIGN_NAMESPACE  # the lock verdict answers, not the pid
            self.observers.append(observer)
        self.actors: list[tuple[str, Callable[[], object]]] = []

    # -- scripts' helpers -------------------------------------------------------------

    def join(self) -> None:
        self.scheduler.point("join")
        liveness_module.hold_liveness_file(self.directory, self.os)
        self.holds += 1

    def leave(self) -> None:
        self.scheduler.point("leave")
        liveness_module.release_liveness_file(self.directory, self.os)
        self.holds -= 1

    def ask(self, who: str, index: int) -> bool:
        self.scheduler.point(f"{who} asks")
        alive = self.observers[index].is_alive(self.member)
        self.verdicts.append((who, alive))
        _require(alive, f"{who} declared the live member {self.member} dead")
        return alive

    # -- checks ----------------------------------------------------------------------

    def check_step(self, label: str) -> None:
        """Nothing shared to decode: every answer is checked as it is given (`ask`)."""

    def check_end(self) -> None:
        dead = [who for who, alive in self.verdicts if not alive]
        _require(not dead, f"a live member was declared dead by {dead}")
        _require(self.verdicts, "no observer ever asked")
        if self.holds:
            for index, observer in enumerate(self.observers):
                _require(
                    observer.is_alive(self.member),
                    f"observer {index}'s question after the member joined again: dead",
                )
        while self.holds:
            liveness_module.release_liveness_file(self.directory, self.os)
            self.holds -= 1
        for observer in self.observers:
            observer.close()
        left = sorted(os.listdir(self.directory_path))
        _require(not left, f"files left after the member's last leave: {left}")

    def close(self) -> None:
        while self.holds:
            liveness_module.release_liveness_file(self.directory, self.os)
            self.holds -= 1
        for observer in self.observers:
            observer.close()
        shutil.rmtree(self.directory_path, ignore_errors=True)


def liveness_rejoin(liveness_class: type[Any] = liveness_module.Liveness) -> Scenario:
    """M joins, leaves, joins again; O0 and O1 ask about it before, between and after.

    `liveness_class`: a deliberately broken verdict (the scenario's name says which).
    """

    def build(scheduler: Scheduler) -> LivenessWorld:
        world = LivenessWorld(scheduler, observers=2, liveness_class=liveness_class)

        def member() -> None:
            world.join()
            world.leave()
            world.join()

        def observer(who: str, index: int) -> Callable[[], None]:
            def script() -> None:
                for _ in range(3):
                    world.ask(who, index)
                    scheduler.yield_turn("asked")  # the member moves before the next question

            return script

        world.actors = [("M", member), ("O0", observer("O0", 0)), ("O1", observer("O1", 1))]
        return world

    name = "liveness_rejoin"
    if liveness_class is not liveness_module.Liveness:
        name = f"{name}[{liveness_class.__name__}]"
    return Scenario(name, build, "a member's join, leave, re-join against two observers' verdicts")


LIVENESS_SCENARIOS: Final = (liveness_rejoin(),)
