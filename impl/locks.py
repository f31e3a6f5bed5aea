"""How long a producer waits for a lock another process holds: a bound, then it defers.

Design rationale (issue 27). A reader holds a ring's lock, or a fallback
segment's, for one claim: a check and one copy of the payload. A producer
must take the same lock to retire an unclaimed version (a re-put, a
cleanup, a close) or to replace a segment. Waiting for it without a bound
lets any process that holds the lock (a reader stopped mid-claim, another
program that took it) stall the producer for as long as it likes: seen
were a re-put held 59.5 s, a cleanup 8 s, a close 6 s. So every producer
call waits at most `PRODUCER_LOCK_WAIT_SECONDS` for each lock it needs,
which covers a reader's claim of a large payload, and then does what it
can without the lock and leaves the rest for later, counted in health:

* a ring frame it could not retire stays as it is (a re-put's newer frame
  already hides it from every reader) and is retired at the next producer
  call that finds the lock free, or at `reap_consumed()`;
* a fallback segment is marked retired in its frame state without the lock
  (no get that starts afterwards delivers it) and its file is removed later
  under the lock (`FallbackWriter.reap`);
* a segment the producer must *replace* (a re-put that takes the fallback)
  cannot be replaced without its lock: that put fails with `BrokenError`,
  nothing changed.

vllm-omni's connector promises that cleanup returns within 0.5 s; with one
lock per key a cleanup stays within it.
"""

from __future__ import annotations

import fcntl
import time
from typing import Final

from .os_seam import OsFacade

PRODUCER_LOCK_WAIT_SECONDS: Final = 0.25  # the most a producer call waits for one lock
_RETRY_SLEEP: Final = 0.0002  # between tries while another process holds it


def lock_exclusive_within(os_facade: OsFacade, fd: int, seconds: float) -> bool:
    """Take `fd`'s exclusive flock, trying for at most `seconds`; answer whether it is held."""
    try:
        os_facade.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        pass
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(_RETRY_SLEEP)
        try:
            os_facade.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            continue
    return False


__all__ = ["PRODUCER_LOCK_WAIT_SECONDS", "lock_exclusive_within"]
