"""A connector's configuration: every option checked once, then frozen.

`spec.connector.initialize_connector` asserts a valid capacity and budget;
the implementation reports a ConfigurationError first, naming the option
and its bad value, for those and for the tuning options the model has no
word for (spare files, wait tuning, retry and rescan periods, shm root).
The checks run in a fixed order (scope, periods, capacity, budget, spare
sizes, pool, wait tuning, shm root), so a call with several bad options
always names the same one.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Final

from ...spec.connector import is_valid_budget
from ...spec.layout import MAX_POOL_CLASS, MIN_POOL_CLASS
from ...spec.pool import is_power_of_two
from ...spec.ring import compute_capacity_error
from ..errors import ConfigurationError
from ..fallback import DEFAULT_SPARE_BYTES, SPARE_MIN_FILE_LENGTH
from ..names import DEFAULT_SHM_ROOT, validate_scope

DEFAULT_RING_CAPACITY: Final = 4 * 1024 * 1024
DEFAULT_FALLBACK_BUDGET: Final = 16 * 1024 * 1024 * 1024
DEFAULT_SPIN_SECONDS: Final = 0.0002  # get_with_deadline watches the doorbell this long
DEFAULT_MAX_SLEEP_SECONDS: Final = 0.001  # then sleeps, backing off up to this between polls
# Bounds of the wait tuning: a longer spin only burns a core, a longer sleep step only adds latency.
MAX_SPIN_SECONDS: Final = 1.0
MAX_SLEEP_SECONDS: Final = 1.0
# No deployment has more shared memory than this; a larger budget is a mistake, not a wish.
MAX_FALLBACK_BUDGET: Final = (1 << 63) - 1
# A failed ring setup (ENOSPC, EMFILE, ...) is tried again after this long,
# doubling after every further failure up to the maximum: space that returns
# gives the edge its ring back, and a full /dev/shm costs one try a minute.
DEFAULT_RING_RETRY_SECONDS: Final = 1.0
MAX_RING_RETRY_SECONDS: Final = 60.0
# A polling receiver rescans the directory at least this often, so what a
# killed producer left (it moves no stamp) is reclaimed within about this
# long even when nothing else in the deployment changes.
DEFAULT_RESCAN_SECONDS: Final = 5.0
# The pool (`impl.pool`): size classes from the smallest that holds what the
# default 4 MiB ring refuses (frames over 1 MiB) up to 1 GiB (256 MiB
# payloads fit), at most 2 GiB of slot files per producer (0 disables it).
DEFAULT_POOL_MIN_BYTES: Final = 1024 * 1024
DEFAULT_POOL_MAX_BYTES: Final = 1024 * 1024 * 1024
DEFAULT_POOL_BUDGET_BYTES: Final = 2 * 1024 * 1024 * 1024


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class ConnectorConfig:
    """The checked options of one `Connector` (see its docstring for what each means)."""

    scope: str  # the deployment's name; a valid directory name (`names.validate_scope`)
    ring_capacity: int = DEFAULT_RING_CAPACITY  # 0 disables rings, else a valid capacity
    fallback_budget: int = DEFAULT_FALLBACK_BUDGET  # most live fallback bytes; 0..2**63-1
    fallback_spare_bytes: int = DEFAULT_SPARE_BYTES  # most bytes of files kept for reuse
    fallback_spare_min_bytes: int = SPARE_MIN_FILE_LENGTH  # smallest file kept for reuse
    shm_root: str = DEFAULT_SHM_ROOT  # an existing directory
    spin_seconds: float = DEFAULT_SPIN_SECONDS  # 0..MAX_SPIN_SECONDS, finite
    max_sleep_seconds: float = DEFAULT_MAX_SLEEP_SECONDS  # 0..MAX_SLEEP_SECONDS, finite
    ring_retry_seconds: float | None = DEFAULT_RING_RETRY_SECONDS  # None: never retry
    rescan_seconds: float | None = DEFAULT_RESCAN_SECONDS  # None: only when the stamp moved
    pool_min_bytes: int = DEFAULT_POOL_MIN_BYTES  # smallest slot class; a power of two
    pool_max_bytes: int = DEFAULT_POOL_MAX_BYTES  # largest slot class; a power of two >= min
    pool_budget_bytes: int = DEFAULT_POOL_BUDGET_BYTES  # most slot file bytes; 0: no pool
    pool_checksum: bool = False  # XXH3-64 of every pool payload, on both sides

    def __post_init__(self) -> None:
        validate_scope(self.scope)
        for option, seconds in (
            ("ring_retry_seconds", self.ring_retry_seconds),
            ("rescan_seconds", self.rescan_seconds),
        ):
            if seconds is not None and (not _is_number(seconds) or not seconds >= 0):
                raise ConfigurationError(
                    f"{option} must be None or a number >= 0: {option}={seconds!r}"
                )
        capacity = self.ring_capacity
        if not _is_count(capacity):
            raise ConfigurationError(f"ring capacity must be an int: capacity={capacity!r}")
        capacity_error = compute_capacity_error(capacity)
        if capacity_error is not None:
            raise ConfigurationError(capacity_error)
        budget = self.fallback_budget
        if not _is_count(budget) or not is_valid_budget(budget):
            raise ConfigurationError(
                f"fallback budget must be an int >= 0 bytes: fallback_budget={budget!r}"
            )
        if budget > MAX_FALLBACK_BUDGET:
            raise ConfigurationError(
                f"fallback budget must be at most 2**63 - 1 bytes: fallback_budget={budget!r}"
            )
        for name, count in (
            ("fallback_spare_bytes", self.fallback_spare_bytes),
            ("fallback_spare_min_bytes", self.fallback_spare_min_bytes),
        ):
            if not _is_count(count) or count < 0:
                raise ConfigurationError(f"{name} must be an int >= 0 bytes: {name}={count!r}")
        for name, count in (
            ("pool_min_bytes", self.pool_min_bytes),
            ("pool_max_bytes", self.pool_max_bytes),
        ):
            if not _is_count(count) or not is_power_of_two(count):
                raise ConfigurationError(
                    f"{name} must be a power of two (an int): {name}={count!r}"
                )
            if not MIN_POOL_CLASS <= count <= MAX_POOL_CLASS:
                raise ConfigurationError(
                    f"{name} must be between {MIN_POOL_CLASS} and {MAX_POOL_CLASS} bytes: "
                    f"{name}={count!r}"
                )
        if self.pool_min_bytes > self.pool_max_bytes:
            raise ConfigurationError(
                f"pool_min_bytes must not exceed pool_max_bytes: "
                f"pool_min_bytes={self.pool_min_bytes!r} pool_max_bytes={self.pool_max_bytes!r}"
            )
        pool_budget = self.pool_budget_bytes
        if not _is_count(pool_budget) or not 0 <= pool_budget <= MAX_FALLBACK_BUDGET:
            raise ConfigurationError(
                f"pool_budget_bytes must be an int between 0 and 2**63 - 1: "
                f"pool_budget_bytes={pool_budget!r}"
            )
        if not isinstance(self.pool_checksum, bool):
            raise ConfigurationError(
                f"pool_checksum must be a bool: pool_checksum={self.pool_checksum!r}"
            )
        waits = (
            ("spin_seconds", self.spin_seconds, MAX_SPIN_SECONDS),
            ("max_sleep_seconds", self.max_sleep_seconds, MAX_SLEEP_SECONDS),
        )
        for name, value, _ in waits:
            if not _is_number(value) or not value >= 0:
                raise ConfigurationError(f"{name} must be a number >= 0: {name}={value!r}")
        for name, value, bound in waits:
            if not math.isfinite(value) or value > bound:
                raise ConfigurationError(
                    f"{name} must be at most {bound} seconds (a longer spin only burns a core, "
                    f"a longer sleep step only adds latency): {name}={value!r}"
                )
        shm_root = self.shm_root
        if not isinstance(shm_root, str) or not os.path.isdir(shm_root):
            what = "does not exist" if not os.path.lexists(str(shm_root)) else "is not a directory"
            raise ConfigurationError(
                f"shm_root {what} (it must be an existing directory, e.g. /dev/shm): "
                f"shm_root={shm_root!r}"
            )
        object.__setattr__(self, "spin_seconds", float(self.spin_seconds))
        object.__setattr__(self, "max_sleep_seconds", float(self.max_sleep_seconds))
