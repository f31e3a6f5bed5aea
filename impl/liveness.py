"""Liveness: whether a producer process, or a frame's lease holder, still runs.

Design rationale. A producer's identity is (pid, start time, instance);
liveness belongs to the process part (pid, start time), so every instance of
a killed process is dead at once. `Liveness` opens a pidfd for a producer
once, checks ``/proc/<pid>/stat`` field 22 against the recorded start time
*after* opening it (so the pidfd is known to name that process and not a
later one reusing the pid), and from then on asks the pidfd, which becomes
readable when the process exits. Where pidfds are not available it reads the
start time and state from /proc on every check (a zombie counts as dead).

The safe direction of every doubt is "alive": a producer wrongly found dead
would have its files removed under it, a lease holder wrongly found dead
would have a live view's bytes handed back to the producer. So
`is_holder_alive` answers alive on any OS error, discovery and the garbage
collector read a check that ran out of descriptors (ResourceExhaustedError)
as alive, and only a process surely gone is dead (then for good).

Used by discovery (`spec.discovery`: which markers are stale, whose files
the garbage collector reclaims), the fallback claim (OWNER_GONE), and the
ring engine's dead-holder policy (`is_holder_alive`,
`spec.leases.process_holder_exit`). Every system call goes through the
`OsFacade` the caller gives.
"""

from __future__ import annotations

import contextlib
import errno
import os
import select
from collections.abc import Callable
from typing import Final

from ..spec.layout import FRAME_HOLDER_NONE
from .errors import ResourceExhaustedError, is_exhaustion
from .names import ProducerIdentity, parse_start_time, process_of, read_proc_stat
from .os_seam import OsFacade

_DEAD_PROCESS_STATES: Final = (b"Z", b"X", b"x")


def read_process_status(pid: int, os_facade: OsFacade) -> tuple[int, bytes] | None:
    """(start time, state letter) of process `pid` from /proc, or None when there is none."""
    line = read_proc_stat(pid, os_facade)
    if line is None:
        return None
    close = line.rfind(b")")
    if close < 0:
        return None
    state = line[close + 2 : close + 3]
    return parse_start_time(line), state


def is_holder_alive(pid: int, os_facade: OsFacade) -> bool:
    """Whether the lease holder `pid` may still run; False only when it surely does not.

    A pidfd answers first (ProcessLookupError: no such process; readable: it
    exited, a zombie included), /proc when pidfds are unavailable. The pid is
    all a frame records, so a reused pid makes a dead holder look alive: the
    frame's reclaim waits for that process too, which is late but never
    unsafe. An unknown holder (0) and any OS error answer alive for the same
    reason: a wrong "dead" would hand a live view's bytes to the producer.
    """
    if pid == FRAME_HOLDER_NONE or pid == os.getpid():
        return True
    try:
        pidfd = os_facade.pidfd_open(pid)
    except ProcessLookupError:
        return False
    except OSError:  # ENOSYS, EMFILE, ...: /proc answers
        pidfd = -1
    if pidfd >= 0:
        try:
            return os_facade.pidfd_alive(pidfd)
        except OSError:
            return True
        finally:
            with contextlib.suppress(OSError):
                os_facade.close(pidfd)
    try:
        status = read_process_status(pid, os_facade)
    except OSError:
        return True
    return status is not None and status[1] not in _DEAD_PROCESS_STATES


class Liveness:
    """Which producers are still running, by (pid, start time).

    Not thread-safe; the owning connector serializes calls. Holds one pidfd
    per live producer it was asked about; `forget` and `close` release them.
    """

    _closed: bool = False

    def __init__(
        self,
        os_facade: OsFacade,
        own_identity: tuple[int, ...] | None = None,
        on_exhausted: Callable[[], int] | None = None,
    ) -> None:
        self._os = os_facade
        self._own = process_of(own_identity) if own_identity is not None else None
        # Called when /proc cannot be opened for want of descriptors: the
        # owner releases what it caches and answers how many it released.
        self.on_exhausted = on_exhausted
        self._pidfds: dict[ProducerIdentity, int] = {}  # in least recently opened order
        # A kept poll object per pidfd (`OsFacade.pidfd_poller`), dropped with its pidfd.
        self._pollers: dict[ProducerIdentity, select.poll] = {}
        self._pidfd_cap: int | None = None  # after EMFILE: hold at most this many pidfds
        self._dead: set[ProducerIdentity] = set()
        self._pidfd_supported = hasattr(os, "pidfd_open")
        self.checks = 0  # liveness questions answered (statistics)

    def is_alive(self, producer: tuple[int, ...]) -> bool:
        """Whether the process (pid, start time) is running; False once is False forever.

        `producer` may be a producer's (pid, start time, instance): only its
        process part matters, so all instances of a process live and die together.
        """
        self.checks += 1
        producer = process_of(producer)
        if producer == self._own:
            return True
        if producer in self._dead:
            return False
        pidfd = self._pidfds.get(producer)
        if pidfd is not None:
            try:
                poller = self._pollers.get(producer)
                if poller is None:
                    poller = self._pollers[producer] = self._os.pidfd_poller(pidfd)
                alive = self._os.pidfd_alive(pidfd, poller)
            except OSError:
                # Cannot poll the pidfd now: ask /proc. A get asks after it
                # claimed a frame, and an error here would lose the frame.
                alive = self._proc_alive(producer)
            if alive:
                return True
            self._mark_dead(producer)
            return False
        alive = self._first_check(producer)
        if not alive:
            self._mark_dead(producer)
        return alive

    def _first_check(self, producer: ProducerIdentity) -> bool:
        pid, start_time = producer
        if pid <= 0:
            return False
        pidfd = -1
        if self._pidfd_supported:
            try:
                pidfd = self._os.pidfd_open(pid)
            except ProcessLookupError:
                return False
            except OSError as error:
                if error.errno in (errno.ENOSYS, errno.EPERM, errno.EINVAL):
                    self._pidfd_supported = False
                elif is_exhaustion(error):
                    # Out of descriptors: hold fewer pidfds from now on (each
                    # producer costs one); /proc answers for the others.
                    self.shed(len(self._pidfds) // 2 + 1)
                    self._pidfd_cap = len(self._pidfds)
                # Otherwise (ENOMEM, ...) /proc answers this time;
                # the next question tries a pidfd again.
        try:
            # The pidfd was opened first: if the start time matches now, the
            # pidfd names this very process, not a later one with its pid.
            if not self._proc_alive(producer):
                return False
            if pidfd >= 0:
                try:
                    polled = self._os.pidfd_alive(pidfd)
                except OSError:
                    polled = True  # /proc just said it runs
                if not polled:
                    return False
        except BaseException:
            if pidfd >= 0:
                self._os.close(pidfd)
            raise
        if pidfd >= 0:
            if self._pidfd_cap is not None and len(self._pidfds) >= self._pidfd_cap:
                self._os.close(pidfd)  # short of descriptors: /proc answers for this one
            else:
                self._pidfds[producer] = pidfd
        return True

    @property
    def pidfd_count(self) -> int:
        """Pidfds held now (each is a descriptor)."""
        return len(self._pidfds)

    def shed(self, count: int) -> int:
        """Close up to `count` pidfds, least recently opened first; answer how many.

        Verdicts are kept: a producer found dead stays dead, a live one is
        asked again through /proc or a new pidfd.
        """
        closed = 0
        while self._pidfds and closed < count:
            producer = next(iter(self._pidfds))
            self.forget(producer)
            closed += 1
        return closed

    def _proc_alive(self, producer: ProducerIdentity) -> bool:
        """/proc's answer: the pid runs, with this start time, and is not a zombie.

        Out of descriptors, our pidfds go first, then what the owner caches
        (`on_exhausted`); ResourceExhaustedError when nothing could be freed.
        """
        pid, start_time = producer
        for _ in range(3):
            try:
                status = read_process_status(pid, self._os)
                break
            except OSError as error:
                if not is_exhaustion(error):
                    raise
                freed = self.shed(len(self._pidfds))
                if not freed and self.on_exhausted is not None:
                    freed = self.on_exhausted()
                if not freed:
                    raise ResourceExhaustedError(
                        f"no descriptor to read /proc/{pid}/stat: {error}", error.errno or 0
                    ) from error
        else:
            raise ResourceExhaustedError(f"no descriptor to read /proc/{pid}/stat")
        return (
            status is not None and status[0] == start_time and status[1] not in _DEAD_PROCESS_STATES
        )

    def _mark_dead(self, producer: ProducerIdentity) -> None:
        self._dead.add(producer)
        self.forget(producer)

    def forget(self, producer: tuple[int, ...]) -> None:
        """Drop the pidfd of `producer`'s process (its verdict, if dead, is kept)."""
        process = process_of(producer)
        self._pollers.pop(process, None)  # it watches the descriptor closed below
        pidfd = self._pidfds.pop(process, None)
        if pidfd is not None:
            self._os.close(pidfd)

    def close(self) -> None:
        """Close every pidfd. Idempotent."""
        self._closed = True
        self._pollers.clear()
        while self._pidfds:
            _, pidfd = self._pidfds.popitem()
            with contextlib.suppress(OSError):
                self._os.close(pidfd)


__all__ = ["Liveness", "is_holder_alive", "read_process_status"]
