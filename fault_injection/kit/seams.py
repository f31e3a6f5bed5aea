"""The test seams: `CountingOs` counts the calls made through the OS seam, `FaultyOs` fails some.

Design rationale. Production objects take an `OsFacade`; tests hand them one
of these subclasses instead, and `_enter(site)`, which the facade calls
before every system call, counts the call and raises the planned error when
a plan says so. Nothing in `os`, `fcntl` or `mmap` is patched, so a plan
cannot leak into another test, and every object of a scenario shares the
one facade, which makes "the Nth open" a deterministic place.

`FaultyOs` takes its faults two ways, on the one counter:

* a `FaultPlan` (the fault campaign's cells): the plan's site fails at the
  calls `plan.fires_at(count)` names, counted from the facade's creation
  (`counts`); `on_call(site, count)`, when given, runs first (crash tests
  SIGKILL the process there);
* faults a test arms from where it stands: `fail_next(site, code, nth)`
  fails the nth call at `site` from now, `fail_every(site, code)` every call
  there until disarmed, `fail_open(prefix, code)` the next open of a file
  whose name starts with `prefix` (a failed open is not counted: it never
  reached the seam's call).

The real call's semantics are kept where Linux differs from "fails before
anything happens" (see `sites`): an unlock (`flock` with LOCK_UN) is never
failed and not counted by a plan (`calls` counts it: it is a call the code
made), and EAGAIN planned for a *blocking* lock is a hit that does not raise
(a blocking flock waits, it never answers EWOULDBLOCK). A planned `close`
error reaches the production seam's own handling (it releases the
descriptor and does not raise).

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

from ...impl.os_seam import FILE_MODE, SITE_FLOCK, OsFacade
from ..plans import FaultPlan
from ..sites import DIRECTORY_REPLACED, LAYER_OS, site

CallHook = Callable[[str, int], None]


class CountingOs(OsFacade):
    """An `OsFacade` that counts every call made through it, per site (unlocks included); fails nothing.

    It also keeps the descriptors opened through it and not yet closed
    through it, each with the identity (device, inode) of what it named
    when opened: `held_descriptors()` answers those still open on the same
    object. A leak check built on it sees what *this seam's* users opened
    and kept, never the rest of the process (another test's descriptors
    closed later by gc under xdist neither fail nor mask it). A descriptor
    closed some other way, or closed and reused for another file, is not
    held: the identity check tells them apart.
    """

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()
        self._opened: dict[int, tuple[int, int]] = {}  # fd -> (st_dev, st_ino) at open

    def _enter(self, site_name: str) -> None:
        self.calls[site_name] += 1

    def total(self) -> int:
        """Calls made through this facade, all sites together."""
        return sum(self.calls.values())

    # -- descriptors held -----------------------------------------------------------------

    def _track(self, fd: int) -> int:
        info = os.fstat(fd)
        self._opened[fd] = (info.st_dev, info.st_ino)
        return fd

    def held_descriptors(self) -> list[int]:
        """Descriptors opened through this seam and still open on what they named then."""
        held = []
        for fd, identity in sorted(self._opened.items()):
            try:
                info = os.fstat(fd)
            except OSError:
                continue  # closed outside the seam
            if (info.st_dev, info.st_ino) == identity:
                held.append(fd)
        return held

    def open(self, path: str, flags: int, mode: int = FILE_MODE) -> int:
        return self._track(super().open(path, flags, mode))

    def open_at(self, dir_fd: int, name: str, flags: int, mode: int = FILE_MODE) -> int:
        return self._track(super().open_at(dir_fd, name, flags, mode))

    def open_directory(self, path: str) -> int:
        return self._track(super().open_directory(path))

    def pidfd_open(self, pid: int) -> int:
        return self._track(super().pidfd_open(pid))

    def close(self, fd: int) -> None:
        super().close(fd)  # EBADF raises and leaves `fd` to the identity check
        self._opened.pop(fd, None)


class FaultyOs(CountingOs):
    """A `CountingOs` that applies one `FaultPlan` (or none) and the faults a test arms on it.

    `calls[site]` counts every call (as `CountingOs`); `counts[site]` the
    calls a plan counts (unlocks excepted); `hits` the planned calls reached;
    `injected` (site, call, errno) of every planned error raised (not the
    exceptions: their tracebacks would keep the failed call's mappings
    alive); `fired` the armed faults that fired, by site or
    ``"open <prefix>"``; `opened` the names of the files opened, in order.
    `armed` is true while anything may still fire; clear it (or call
    `disarm`) to stop failing (counting goes on); set it to arm the plan again.
    """

    def __init__(self, plan: FaultPlan | None = None, on_call: CallHook | None = None) -> None:
        super().__init__()
        if plan is not None and site(plan.site).layer != LAYER_OS:
            raise ValueError(f"not an OS plan: {plan}")
        self.plan = plan
        self._plan_armed = plan is not None
        self.on_call = on_call
        self.counts: Counter[str] = Counter()
        self.hits = 0
        self.injected: list[tuple[str, int, int]] = []
        self.replaced: list[tuple[str, str]] = []  # (path, where the directory was moved)
        self.fired: Counter[str] = Counter()
        self.opened: list[str] = []
        self._site_faults: list[list[object]] = []  # [site, errno, calls left before it fires]
        self._every: dict[str, int] = {}  # site -> errno of every call there
        self._open_faults: dict[str, int] = {}  # file name prefix -> errno
        self._replace_pending = False
        self._blocking_lock = False

    # -- arming --------------------------------------------------------------------------

    @property
    def armed(self) -> bool:
        return self._plan_armed or bool(self._site_faults or self._open_faults or self._every)

    @armed.setter
    def armed(self, value: bool) -> None:
        self._plan_armed = value
        if not value:
            self._site_faults.clear()
            self._open_faults.clear()
            self._every.clear()

    def disarm(self) -> None:
        """Nothing fails from now on; counting goes on."""
        self.armed = False

    def fail_next(self, site_name: str, code: int, nth: int = 1) -> None:
        """The `nth` call at `site_name` from now raises OSError(code), once (an unlock never fails)."""
        self._site_faults.append([site_name, code, nth])

    def fail_every(self, site_name: str, code: int) -> None:
        """Every call at `site_name` raises OSError(code) until disarmed (an unlock never fails)."""
        self._every[site_name] = code

    def fail_open(self, prefix: str, code: int) -> None:
        """The next open of a file whose name starts with `prefix` raises OSError(code), once."""
        self._open_faults[prefix] = code

    # -- the hooks ----------------------------------------------------------------------

    def _enter(self, site_name: str) -> None:
        self.calls[site_name] += 1
        self.counts[site_name] += 1
        count = self.counts[site_name]
        if self.on_call is not None:
            self.on_call(site_name, count)
        self._armed_faults(site_name)
        plan = self.plan
        if not self._plan_armed or plan is None or plan.site != site_name:
            return
        if not plan.fires_at(count):
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

    def _armed_faults(self, site_name: str) -> None:
        """Raise a `fail_every` fault of `site_name`, or the first `fail_next` countdown that is due."""
        code = self._every.get(site_name)
        if code is not None:
            self.fired[site_name] += 1
            raise OSError(code, f"injected at every {site_name}: {os.strerror(code)}")
        for fault in self._site_faults:
            if fault[0] != site_name:
                continue
            fault[2] = int(fault[2]) - 1  # type: ignore[call-overload]
            if fault[2] == 0:
                self._site_faults.remove(fault)
                code = int(fault[1])  # type: ignore[call-overload]
                self.fired[site_name] += 1
                raise OSError(code, f"injected at {site_name}: {os.strerror(code)}")

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

    # -- calls with their own rules -----------------------------------------------------

    def _open_fault(self, name: str) -> int | None:
        for prefix, code in list(self._open_faults.items()):
            if name.startswith(prefix):
                del self._open_faults[prefix]
                self.fired[f"open {prefix}"] += 1
                return code
        return None

    def open(self, path: str, flags: int, mode: int = FILE_MODE) -> int:
        name = os.path.basename(path)
        code = self._open_fault(name)
        if code is not None:
            raise OSError(code, f"injected open: {os.strerror(code)}", path)
        fd = super().open(path, flags, mode)
        self.opened.append(name)
        return fd

    def open_at(self, dir_fd: int, name: str, flags: int, mode: int = FILE_MODE) -> int:
        code = self._open_fault(name)
        if code is not None:
            raise OSError(code, f"injected open: {os.strerror(code)}", name)
        fd = super().open_at(dir_fd, name, flags, mode)
        self.opened.append(name)
        return fd

    def flock(self, fd: int, operation: int) -> None:
        if operation == fcntl.LOCK_UN:
            self.calls[SITE_FLOCK] += 1
            fcntl.flock(fd, operation)  # never fails on a valid descriptor
            return
        self._blocking_lock = not operation & fcntl.LOCK_NB
        super().flock(fd, operation)


__all__ = ["CallHook", "CountingOs", "FaultyOs"]
