"""Waiting for a key: the deployment doorbell, the blocking get's loop, skipped segment looks.

The model's gets never wait (`spec.connector.process_get` answers
NOT_FOUND); `get_with_deadline` repeats the non-blocking get until it
answers something final or time runs out. After a miss it watches the
deployment's doorbell (a futex word of the discovery stamp that every
connector rings when it publishes, retires or registers) for at most
`spin_seconds`, polling again as soon as the word moves (plain loads: a
whole poll costs 30-60 Python calls), then sleeps on it, so an idle wait
costs no CPU past its spin and wakes as soon as something may have
arrived. Each sleep is bounded by `MAX_DOORBELL_WAIT_SECONDS`, so what
rings no bell (a producer dying) is still seen promptly. While another
process holds a lock (BUSY), or without futexes, it sleeps in short steps
instead, backing off up to `max_sleep_seconds`.

Each put also rings its destination stage's bell (`discovery.StageBell`,
issue 27) when a receiver of that stage waits on it: `stage_bell` hands a
receiver its stage's bell, so it sleeps until a put to its own stage
(vllm-omni's `get_wakeup_generation` / `wait_for_change`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final, overload

from ..discovery import Stamp
from ..discovery.stamp import StageBell
from .config import ConnectorConfig
from .descriptors import Descriptor
from .edges import Edge, Stage, edge_of, split_edge, validate_key
from .results import FINAL_STATUSES, Delivery, GetStatus

if TYPE_CHECKING:
    from .ring_route import RingRoute

MIN_SLEEP_SECONDS: Final = 0.00005
# The longest a blocked receive sleeps on the doorbell before it looks again
# for what rings no bell (a producer that died).
MAX_DOORBELL_WAIT_SECONDS: Final = 0.05
# A polling get looks for a fallback segment at least this often even when the
# doorbell says nothing was published (producers that cannot ring it).
FALLBACK_RECHECK_SECONDS: Final = 0.001


class Doorbell:
    """The deployment doorbell, once joined (before that, or without a stamp, there is none)."""

    stamp: Stamp | None = None

    def attach(self, stamp: Stamp | None) -> None:
        self.stamp = stamp

    def value(self) -> int | None:
        """The doorbell's value, or None when there is none to wait on."""
        stamp = self.stamp
        if stamp is None:
            return None
        try:
            return stamp.doorbell()
        except ValueError:  # closed under us
            return None

    def ring(self) -> None:
        """Wake receivers blocked in `get_with_deadline` (after a publish or retire)."""
        stamp = self.stamp
        if stamp is not None:
            stamp.ring()

    def stage(self, stage: str) -> StageBell | None:
        """The bell of destination `stage` (None without a stamp or futexes)."""
        stamp = self.stamp
        return stamp.stage_bell(stage) if stamp is not None else None

    def ring_stage(self, stage: str) -> None:
        """After a publication to `stage`: wake the receivers waiting on its bell, if any."""
        stamp = self.stamp
        if stamp is not None:
            bell = stamp.stage_bell(stage)
            if bell is not None:
                bell.ring()

    def wait_for_change(self, generation: int | None, timeout: float) -> bool:
        """Sleep until the bell moves past `generation` or `timeout` (at most a second)."""
        stamp = self.stamp
        if generation is None or stamp is None or self.value() is None:
            return False
        if self.value() == generation:
            stamp.wait(generation, max(0.0, min(timeout, MAX_DOORBELL_WAIT_SECONDS * 20)))
        return self.value() != generation


class FallbackMisses:
    """When a polling get may skip looking for the key's segment (one failing openat).

    Every put rings the doorbell after it publishes, and a ring writes a
    value no ring wrote before (`discovery.stamp.Stamp.ring`: a fresh random
    value, never the one it overwrites, after the publication is visible),
    so when the bell still reads what it read before our last look found
    nothing, nothing was published since by any producer that rings: the
    look would find nothing again (but for a 2**-32 chance per ring that a
    ring writes that very value again: the recheck below bounds it too). A
    producer that cannot ring (its discovery stamp failed) is still found:
    the segment is looked for again at least every `FALLBACK_RECHECK_SECONDS`.
    That bound is why only `get_with_deadline` skips: a plain `get` answers
    at once what the model's get answers, so it always looks.
    """

    # (edge, key, doorbell, time) of the last polling get whose segment look found nothing.
    _miss: tuple[Edge, str, int, float] | None = None

    def unchanged(self, edge: Edge, key: str, bell: int | None) -> bool:
        miss = self._miss
        return (
            bell is not None
            and miss is not None
            and miss[0] == edge
            and miss[1] == key
            and miss[2] == bell
            and time.monotonic() - miss[3] < FALLBACK_RECHECK_SECONDS
        )

    def record(self, edge: Edge, key: str, bell: int) -> None:
        self._miss = (edge, key, bell, time.monotonic())

    def forget(self, key: str) -> None:
        miss = self._miss
        if miss is not None and miss[1] == key:
            self._miss = None


def poll_until(
    poll: Callable[[int | None], Delivery],
    doorbell: Doorbell,
    wake_signature: Callable[[], tuple[int, ...]],
    *,
    deadline: float,
    spin_seconds: float,
    max_sleep_seconds: float,
    wait_for_locks: bool,
) -> Delivery:
    """Call `poll(bell)` until it answers a final result or `deadline` (monotonic) passes.

    `bell` is the doorbell read before the poll. Answers the first final
    result (delivered, stale, producer gone), a BUSY one at once when not
    `wait_for_locks`, or the last one when time runs out.
    """
    start = time.monotonic()
    sleep = MIN_SLEEP_SECONDS
    signature = None
    while True:
        bell = doorbell.value()
        got = poll(bell)
        if got.status in FINAL_STATUSES:
            return got
        if got.status is GetStatus.BUSY and not wait_for_locks:
            return got
        now = time.monotonic()
        if now >= deadline:
            return got
        stamp = doorbell.stamp
        spun = now - start
        if spun < spin_seconds:
            if bell is not None and stamp is not None and got.status is GetStatus.NOT_FOUND:
                # Nothing for the key, and every publish rings the bell after it
                # shows: watch the bell word (a load, no lock, no syscall) instead
                # of polling again, and poll again as soon as it moves.
                stamp.spin(bell, min(spin_seconds - spun, deadline - now))
            continue
        if bell is not None and stamp is not None and got.status is not GetStatus.BUSY:
            stamp.wait(bell, min(deadline - now, MAX_DOORBELL_WAIT_SECONDS))
            continue
        seen = wake_signature()
        if seen != signature:
            signature = seen
            sleep = MIN_SLEEP_SECONDS
        time.sleep(min(sleep, deadline - now))
        sleep = min(sleep * 2, max(max_sleep_seconds, MIN_SLEEP_SECONDS))


class BlockingGets:
    """`Connector`'s waiting half: `get_with_deadline` and the doorbell calls (see above)."""

    # Provided by `Connector`:
    config: ConnectorConfig
    _lock: threading.RLock
    _bell: Doorbell
    _misses: FallbackMisses
    _ring_route: RingRoute

    def _get(
        self,
        edge: Edge,
        key: str,
        descriptor: Descriptor | None,
        bell: int | None,
        borrow: bool = False,
    ) -> Delivery:
        raise NotImplementedError  # `Connector._get`

    def _track_borrowed(self, got: Delivery) -> Delivery:
        raise NotImplementedError  # `Connector._track_borrowed`

    def _require_open(self) -> None:
        raise NotImplementedError  # `Connector._require_open`

    def _join(self) -> Any:
        raise NotImplementedError  # `Connector._join`

    @overload
    def get_with_deadline(
        self,
        source: Stage,
        destination: Stage,
        key: str,
        /,
        *,
        descriptor: Descriptor | None = None,
        deadline: float | None = None,
        timeout: float | None = None,
        wait_for_locks: bool = True,
        borrow: bool = False,
    ) -> Delivery: ...

    @overload
    def get_with_deadline(
        self,
        edge: tuple[Stage, Stage],
        key: str,
        /,
        *,
        descriptor: Descriptor | None = None,
        deadline: float | None = None,
        timeout: float | None = None,
        wait_for_locks: bool = True,
        borrow: bool = False,
    ) -> Delivery: ...

    def get_with_deadline(
        self,
        *args: Any,
        descriptor: Descriptor | None = None,
        deadline: float | None = None,
        timeout: float | None = None,
        wait_for_locks: bool = True,
        borrow: bool = False,
    ) -> Delivery:
        """Like `get`, but wait until `deadline` (a `time.monotonic()` value) or `timeout` seconds.

        See `waiting`: spin, then sleep on the deployment doorbell. Answers
        the first final result (delivered, stale, producer gone) or the last
        one when time runs out (NOT_FOUND or BUSY). With
        `wait_for_locks=False` a BUSY answer is final too: a receive loop
        that polls many keys never spends its deadline on one that another
        process holds. `borrow=True`: a borrowed get (see `Connector.get`).
        """
        if deadline is None:
            deadline = time.monotonic() + (timeout if timeout is not None else 0.0)
        edge, (key,) = split_edge(args, 1, "get_with_deadline")
        if borrow:
            return self._track_borrowed(
                poll_until(
                    lambda bell: self._get(edge, key, descriptor, bell, True),
                    self._bell,
                    lambda: self._wake_signature(edge),
                    deadline=deadline,
                    spin_seconds=self.config.spin_seconds,
                    max_sleep_seconds=self.config.max_sleep_seconds,
                    wait_for_locks=wait_for_locks,
                )
            )
        return poll_until(
            lambda bell: self._get(edge, key, descriptor, bell),
            self._bell,
            lambda: self._wake_signature(edge),
            deadline=deadline,
            spin_seconds=self.config.spin_seconds,
            max_sleep_seconds=self.config.max_sleep_seconds,
            wait_for_locks=wait_for_locks,
        )

    def wakeup_generation(self) -> int | None:
        """The deployment doorbell now (read it before polling); None without one."""
        with self._lock:
            self._require_open()
            self._join()
        return self._bell.value()

    def wait_for_change(self, generation: int | None, timeout: float) -> bool:
        """Sleep until the doorbell moves past `generation` (something was published) or `timeout`.

        Answers whether it moved. One call sleeps at most a second (so a
        death, which rings no bell, is still looked for); without a doorbell
        (None) it answers False at once: the caller keeps its timed poll.
        """
        return self._bell.wait_for_change(generation, timeout)

    def stage_bell(self, stage: Stage) -> StageBell | None:
        """The doorbell of destination `stage`: puts to it ring it (None without futexes).

        A receiver calls `register()` on it once before its first snapshot
        (so producers ring it), reads `value()` before polling, and sleeps
        in `wait(seen, timeout)`; `unregister()` when it stops waiting.
        """
        name = edge_of(stage, stage)[1]  # validated (InvalidKeyError naming a bad stage)
        with self._lock:
            self._require_open()
            self._join()
            return self._bell.stage(name)

    def _wake_signature(self, edge: Edge) -> tuple[int, ...]:
        """Shared-memory counters that move when something may have arrived on `edge`."""
        with self._lock:
            stamp = self._bell.stamp
            return (stamp.load() if stamp is not None else 0, *self._ring_route.wake_values(edge))

    def abandon_get(self, key: str) -> None:
        """Forget what this receiver remembers about looking for `key` (nothing is retired)."""
        with self._lock:
            validate_key(key)
            self._misses.forget(key)
