"""`FaultyOs`: the OS seam with a fault plan in it.

Design rationale. Production objects take an `OsFacade`; this subclass is
handed to them instead, and `_enter(site)`, which the facade calls before
every system call, counts the call and raises the planned error when the
plan says so. Nothing in `os`, `fcntl` or `mmap` is patched, so a plan
cannot leak into another test, and every object of a scenario shares the
one facade, which makes "the Nth open" a deterministic place.

One method is overridden, to keep the real call's semantics where Linux
differs from "fails before anything happens" (see `sites`): `flock` with
LOCK_UN is never failed and not counted, and EAGAIN planned for a
*blocking* lock is a hit that does not raise (a blocking flock waits, it
never answers EWOULDBLOCK). A planned `close` error reaches the production
seam's own handling (it releases the descriptor and does not raise).

`on_call(site, count)`, when given, runs before the plan is applied: crash
tests use it to SIGKILL the process at a named call.

A plan whose error is `sites.DIRECTORY_REPLACED` raises nothing: from its
call on, the next call made relative to a directory descriptor
(`OsFacade._enter_at`) first renames that directory aside (to
``<path>.replaced-<n>``) and puts a directory open to everyone at its path,
so the descriptor and the path name two different directories from then on
(`replaced` lists (path, aside) pairs).
"""

from __future__ import annotations

import errno
import fcntl
import os
from collections import Counter
from collections.abc import Callable

from shmring.fault_injection.plans import FaultPlan
from shmring.fault_injection.sites import DIRECTORY_REPLACED, LAYER_OS, site
from shmring.impl.os_seam import SITE_FLOCK, OsFacade

CallHook = Callable[[str, int], None]


class FaultyOs(OsFacade):
    """An `OsFacade` that applies one `FaultPlan` (or none: then it only counts).

    `counts[site]` is the number of calls made at each site while counting;
    `hits` the number of planned calls reached; `injected` (site, call, errno)
    of every error raised (not the exceptions: their tracebacks would keep
    the failed call's mappings alive).
    Clear `armed` to stop failing (counting goes on).
    """

    def __init__(self, plan: FaultPlan | None = None, on_call: CallHook | None = None) -> None:
        if plan is not None and site(plan.site).layer != LAYER_OS:
            raise ValueError(f"not an OS plan: {plan}")
        self.plan = plan
        self.armed = plan is not None
        self.on_call = on_call
        self.counts: Counter[str] = Counter()
        self.hits = 0
        self.injected: list[tuple[str, int, int]] = []
        self.replaced: list[tuple[str, str]] = []  # (path, where the directory was moved)
        self._replace_pending = False
        self._blocking_lock = False

    def _enter(self, site_name: str) -> None:
        self.counts[site_name] += 1
        count = self.counts[site_name]
        if self.on_call is not None:
            self.on_call(site_name, count)
        plan = self.plan
        if not self.armed or plan is None or plan.site != site_name or not plan.fires_at(count):
            return
        self.hits += 1
        code = plan.error
        assert isinstance(code, int)
        if site_name == SITE_FLOCK and code == errno.EAGAIN and self._blocking_lock:
            return  # a blocking lock waits; it never answers EWOULDBLOCK
        if code == DIRECTORY_REPLACED:
            self.injected.append((site_name, count, code))
            self._replace_pending = True  # done at the next directory-relative call
            return
        # OSError(EAGAIN, ...) is a BlockingIOError, OSError(EINTR, ...) an
        # InterruptedError: the same classes the real call raises.
        error = OSError(code, f"{os.strerror(code)} [injected by fault plan {plan}]")
        self.injected.append((site_name, count, code))
        raise error

    def _enter_at(self, site_name: str, dir_fd: int) -> None:
        self._enter(site_name)
        if self._replace_pending:
            self._replace_pending = False
            self._replace_directory(dir_fd)

    def _replace_directory(self, dir_fd: int) -> None:
        """Move the directory `dir_fd` names aside and put an open one at its path."""
        path = os.readlink(f"/proc/self/fd/{dir_fd}")
        if path.endswith(" (deleted)") or not os.path.isabs(path):
            return  # already removed: nothing at its path to replace
        aside = f"{path}.replaced-{len(self.replaced)}"
        os.rename(path, aside)
        os.mkdir(path, 0o777)
        os.chmod(path, 0o777)  # past the umask
        self.replaced.append((path, aside))

    def flock(self, fd: int, operation: int) -> None:
        if operation == fcntl.LOCK_UN:
            fcntl.flock(fd, operation)  # never fails on a valid descriptor
            return
        self._blocking_lock = not operation & fcntl.LOCK_NB
        super().flock(fd, operation)


__all__ = ["CallHook", "FaultyOs"]
