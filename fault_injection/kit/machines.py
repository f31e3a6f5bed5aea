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
* `rarely`: a rule that acts on about one draw in `odds`. Hypothesis picks
  uniformly among the rules whose `precondition` holds and has no rule
  weights, so a rule that ends a run (close, kill) would otherwise end most
  runs within a few steps. The odds are the rule's first draw, so they
  shrink to "not now"; whether the rule may act at all stays a
  `precondition`, which reads state only.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

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


__all__ = ["DEFAULT_HEALTH_CHECKS", "Tally", "one_in", "rarely", "register_profiles"]
