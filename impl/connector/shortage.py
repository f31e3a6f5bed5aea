"""Running short of descriptors: shed what we cache, try again, then a typed error.

Issue 12: under `ulimit -n 64` a reader with 80 producers got a bare
EMFILE from every get, so not even the first producers were served. Each
mapped ring costs two descriptors (ours and the one mmap keeps) and each
producer a pidfd. So when a call runs out, what we cache goes first (least
recently used rings, kept segment mappings; `Liveness` sheds its pidfds
itself) and the call is tried again; only when nothing is left to release
does a typed ResourceExhaustedError (an OSError) reach the caller, after
every producer that could be mapped was looked at.

Nothing here is in the model: `spec.connector` has unbounded descriptors.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final, TypeVar

from ..errors import ResourceExhaustedError, ShmringError, is_exhaustion

T = TypeVar("T")

_TRIES: Final = 4  # shedding halves the caches each time; four rounds leave next to nothing


def retry_short_of_descriptors(what: str, action: Callable[[], T], shed: Callable[[], int]) -> T:
    """Run `action`; out of descriptors, `shed` what we cache and run it again (typed error)."""
    for _ in range(_TRIES):
        try:
            return action()
        except OSError as error:
            if isinstance(error, ShmringError) or not is_exhaustion(error):
                raise
            if not shed():
                raise ResourceExhaustedError(
                    f"out of descriptors for {what}: {error}", error.errno or 0
                ) from error
    raise ResourceExhaustedError(f"out of descriptors for {what}, even after releasing mappings")
