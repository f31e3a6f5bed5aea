"""Fault plans: frozen data naming one failure, and the seams that carry them.

A `FaultPlan` says: at `site`, the `nth` call (counted from 1 over the whole
scenario run, every object of the run sharing one seam) and, in persistent
mode, every later call answers `error`. A plan is plain data, so a failing
cell prints it and `FaultPlan.parse` reads it back (`open#3:ENOSPC:transient`).

Two seams apply plans:

* `kit.seams.FaultyOs` (OS calls, through `OsFacade._enter`), and
* `FaultyCudaDriver` below (CUDA calls, through the simulated driver's own
  `_enter` hook), which fails "from the nth call on", a shape the simulated
  driver's `fail(nth=...)` does not offer.

Both count calls per site whether or not a plan is armed, so a fault-free run
tells the campaign how many cells a site needs (`calls + 1`: the last one
reaches no call and ends the loop).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Final

from ..impl.registered.cuda_driver import SimulatedCudaDriver, driver_error
from .sites import (
    DIRECTORY_REPLACED,
    DIRECTORY_SITES,
    LAYER_CUDA,
    MODE_PERSISTENT,
    MODE_TRANSIENT,
    MODES,
    FaultError,
    error_name,
    parse_error,
    site,
)

_SEPARATOR: Final = ":"


@dataclass(frozen=True)
class FaultPlan:
    """Fail the `nth` call at `site` (and every later one when persistent) with `error`."""

    site: str  # an os_seam SITE_* or spec.registration CALL_* name
    nth: int  # 1-based index of the first failing call at that site
    mode: str  # MODE_TRANSIENT or MODE_PERSISTENT
    error: FaultError  # errno value (OS) or CUDA error name (driver)

    def __post_init__(self) -> None:
        entry = site(self.site)  # KeyError for an unknown site
        if self.nth < 1:
            raise ValueError(f"a plan fails call 1 or later: nth={self.nth}")
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}: mode={self.mode!r}")
        if (entry.layer == LAYER_CUDA) != isinstance(self.error, str):
            raise ValueError(f"error does not fit site {self.site!r}: error={self.error!r}")
        if self.error == DIRECTORY_REPLACED and self.site not in DIRECTORY_SITES:
            raise ValueError(f"no directory-relative call at site {self.site!r}")

    def fires_at(self, count: int) -> bool:
        """Whether the `count`-th call at the site fails."""
        if self.mode == MODE_TRANSIENT:
            return count == self.nth
        return count >= self.nth

    def __str__(self) -> str:
        return _SEPARATOR.join((f"{self.site}#{self.nth}", error_name(self.error), self.mode))

    @classmethod
    def parse(cls, text: str) -> FaultPlan:
        """Read back `str(plan)`: ``site#nth:ERROR:mode``."""
        try:
            where, error, mode = text.split(_SEPARATOR)
            name, nth = where.split("#")
            return cls(name, int(nth), mode, parse_error(error))
        except (ValueError, KeyError) as failure:
            raise ValueError(f"not a fault plan: {text!r} ({failure})") from failure


class FaultyCudaDriver(SimulatedCudaDriver):
    """The simulated driver, failing calls as one `FaultPlan` says.

    `hits` counts planned calls reached (whether they raised or not);
    `armed` may be cleared to let teardown run without faults.
    """

    def __init__(self, plan: FaultPlan | None = None) -> None:
        super().__init__()
        if plan is not None and site(plan.site).layer != LAYER_CUDA:
            raise ValueError(f"not a driver plan: {plan}")
        self.plan = plan
        self.armed = plan is not None
        self.counts: Counter[str] = Counter()
        self.hits = 0

    def _enter(self, call: str) -> None:
        self.counts[call] += 1
        plan = self.plan
        if (
            self.armed
            and plan is not None
            and plan.site == call
            and plan.fires_at(self.counts[call])
        ):
            self.hits += 1
            assert isinstance(plan.error, str)
            super()._enter(call)  # keeps the driver's own call counters
            raise driver_error(call, plan.error, f"injected by fault plan {plan}")
        super()._enter(call)


__all__ = ["MODE_PERSISTENT", "MODE_TRANSIENT", "FaultPlan", "FaultyCudaDriver"]
