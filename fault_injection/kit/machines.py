"""The lockstep base: what every lockstep machine module declares, written once.

A lockstep machine (model_tests/*_machine.py) applies each rule to the model
and to the implementation and compares the answers. Around its rules every
machine module needs the same few things, which live here:

* `Tally`: the labelled states it reached and the rules it ran in this
  process. The label tests assert that a CI run reached every label (so a
  change that makes, say, wraparound unreachable cannot pass unnoticed);
  `hypothesis.event()` alone only reaches the statistics printout.
  `model_tests.machine_runs.run_machine` clears and reads it.
* `register_profiles`: the two Hypothesis profiles of a machine, a CI one
  (derandomized, no example database, so every CI run is the same run) and
  a long one for campaigns; neither has a deadline (a step maps files and
  may start processes).
* `bounded_shrinking`: the campaign's bound on Hypothesis's shrink phase
  (`SHRINK_SECONDS`); a failure whose shrink was cut says so in a note.
* `rarely`: a rule that acts on about one draw in `odds`. Hypothesis picks
  uniformly among the rules whose `precondition` holds and has no rule
  weights, so a rule that ends a run (close, kill) would otherwise end most
  runs within a few steps. The odds are the rule's first draw, so they
  shrink to "not now"; whether the rule may act at all stays a
  `precondition`, which reads state only.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Final

from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import multiple, rule

DEFAULT_HEALTH_CHECKS: tuple[HealthCheck, ...] = (HealthCheck.too_slow,)


class Tally:
    """The labels reached and the rules run by one machine module in this process."""

    def __init__(self) -> None:
        self.events: Counter[str] = Counter()  # label -> times reached
        self.steps: Counter[str] = Counter()  # rule -> times it acted

    def label(self, name: str) -> None:
        """Record that the run reached the labelled state `name`."""
        event(name)
        self.events[name] += 1

    def step(self, name: str) -> None:
        """Record that rule `name` acted (a rule that did nothing is not a step)."""
        self.steps[name] += 1

    def clear(self) -> None:
        self.events.clear()
        self.steps.clear()


def register_profiles(
    ci_name: str,
    long_name: str,
    *,
    ci: dict[str, Any],
    long: dict[str, Any],
    health_checks: Iterable[HealthCheck] = DEFAULT_HEALTH_CHECKS,
) -> None:
    """Register a machine's CI profile (derandomized, no database) and its long profile.

    `ci` and `long` give the sizes (max_examples, stateful_step_count) and
    anything else the machine needs; `health_checks` are suppressed in both.
    """
    common: dict[str, Any] = {"deadline": None, "suppress_health_check": list(health_checks)}
    settings.register_profile(ci_name, **{"derandomize": True, "database": None, **common, **ci})
    settings.register_profile(long_name, **{**common, **long})


# How long the campaign lets Hypothesis shrink one failure. Its own bound is
# five minutes; one arena-machine failure took 132 s to shrink, most of a
# quick campaign, for an example that was already readable after a few.
SHRINK_SECONDS: Final = 30.0
# What Hypothesis reports when its shrink deadline stops it (engine.py).
_SHRINK_STOPPED: Final = "stopped because it is making very slow progress"


@dataclass
class ShrinkBound:
    """One bounded run's record: `cut` once Hypothesis stopped shrinking at the bound."""

    seconds: float
    cut: bool = False

    def note(self) -> str:
        return (
            f"shrinking was cut after {self.seconds:g} s (the campaign's bound, "
            f"fault_injection.kit.machines.SHRINK_SECONDS): the example shown is the "
            f"smallest found by then, not a minimal one; rerun the unit to shrink further"
        )


@contextlib.contextmanager
def bounded_shrinking(seconds: float = SHRINK_SECONDS) -> Iterator[ShrinkBound]:
    """Hypothesis runs inside stop shrinking a failure after `seconds`; the failure says so.

    The bound is Hypothesis's own shrink deadline
    (`hypothesis.internal.conjecture.engine.MAX_SHRINKING_SECONDS`, five
    minutes, left module-level so that it can be changed), set for the runs
    inside and restored after. When it stops a shrink, Hypothesis reports a
    warning through its reporter; that warning sets `cut` and the exception
    the run raises gets `ShrinkBound.note()` as a note, which the campaign's
    failure report prints with the traceback. Other reports pass through.
    """
    from hypothesis.internal.conjecture import engine
    from hypothesis.reporting import current_reporter, with_reporter

    bound = ShrinkBound(seconds)
    outer = current_reporter()

    def reporter(value: object) -> None:
        if _SHRINK_STOPPED in str(value):
            bound.cut = True
        else:
            outer(value)

    previous = engine.MAX_SHRINKING_SECONDS
    engine.MAX_SHRINKING_SECONDS = seconds  # type: ignore[assignment]
    try:
        with with_reporter(reporter):
            yield bound
    except BaseException as error:
        if bound.cut:
            error.add_note(bound.note())
        raise
    finally:
        engine.MAX_SHRINKING_SECONDS = previous


def one_in(odds: int) -> st.SearchStrategy[bool]:
    """True about once in `odds` draws; shrinks to False."""
    return st.sampled_from([False] * (odds - 1) + [True])


def rarely(odds: int | str, **arguments: Any) -> Callable[[Callable[..., Any]], Any]:
    """`rule(**arguments)` for a rule that acts on about one draw in `odds`, and does nothing otherwise.

    `odds` is a number, drawn as the rule's first argument (``now``), or the
    name of the machine's attribute that holds it, so a subclass can make
    the rule more or less frequent: then it is the first draw of the rule's
    body (an argument's strategy is fixed when the class is made). A rule
    with a target adds nothing to its bundle when it does not act.
    """
    targeted = "target" in arguments or "targets" in arguments

    def decorate(function: Callable[..., Any]) -> Any:
        idle: Any = multiple() if targeted else None

        def act_on_argument(self: Any, now: bool, **drawn: Any) -> Any:
            return function(self, **drawn) if now else idle

        def act_on_draw(self: Any, rarity: st.DataObject, **drawn: Any) -> Any:
            now = rarity.draw(one_in(getattr(self, str(odds))), label=f"{function.__name__} now?")
            return function(self, **drawn) if now else idle

        act: Callable[..., Any]
        if isinstance(odds, int):
            act, strategies = act_on_argument, {"now": one_in(odds), **arguments}
        else:
            act, strategies = act_on_draw, {"rarity": st.data(), **arguments}
        act.__name__ = function.__name__
        act.__qualname__ = function.__qualname__
        act.__doc__ = function.__doc__
        return rule(**strategies)(act)  # type: ignore[no-untyped-call]

    return decorate


__all__ = [
    "DEFAULT_HEALTH_CHECKS",
    "SHRINK_SECONDS",
    "ShrinkBound",
    "Tally",
    "bounded_shrinking",
    "one_in",
    "rarely",
    "register_profiles",
]
