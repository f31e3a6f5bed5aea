"""Which process a shmring object belongs to, and what happens at fork and at exit (issue 24).

Design rationale. Services fork (multiprocessing's fork start method,
pre-fork servers) and exit without closing. A connector, a transfer sender
or receiver, or a borrowed payload copied into a child by `fork` still
names the parent's files: the parent's ring, marker, live file, pool slots
and segments. Before this module a child that used its inherited connector
wrote a second producer's frames into the parent's ring, and its `close()`
removed every file of the parent, so the parent's puts, reported
published, were never delivered. The rule now (docs/protocol.md, "Fork and
exit"): an object belongs to the process that made it.

* `os.register_at_fork(after_in_child=...)` marks every tracked object as
  inherited (`Forkable._forked_in_child`), before any code of the child
  runs. The child's inherited object never writes into the parent's files
  and never removes them: using it raises `ForkedError` (make a connector
  after the fork); its `close()` releases the child's copies of the
  mappings and descriptors and nothing else; exit and gc do nothing to the
  parent's files. The parent notices nothing.
* A borrowed payload (`ring.borrow.Lease`) records the fork generation it
  was made in: one that dies in a child releases its mapping but does not
  mark the parent's frame done (the parent's own copy still holds it).
* At interpreter exit (`atexit`), every tracked object of this process that
  is still open is closed, once, as `close()` would; never an inherited one.

Safe direction: a child that wants to publish makes its own connector (a
new producer identity: its own pid and start time); nothing it does with an
inherited object can cost the parent a frame or a file.

Signals (`deferred_signals`). CPython runs a signal handler in the main
thread between two bytecodes, so a handler that raises (Ctrl-C's
`KeyboardInterrupt`, a SIGTERM handler raising `SystemExit`, a user's own)
can stop our code between the `open` that returned a descriptor and the
statement that records it, or inside the `finally` that unlocks and
closes. Issue 24's storm lost hundreds of descriptors that way (deleted
fallback temporaries, pool slots, rings, the stamp) and once a stamp lock,
which hung the process's next bump for good. Careful ordering narrows such
windows; it cannot close them, because every cleanup is itself Python.
So every section that acquires or releases a descriptor, a lock or a
mapping (creating, attaching, claiming and retiring files; joining,
leaving, closing) runs with the asynchronous signals blocked in the main
thread: a signal that arrives meanwhile stays pending in the kernel, and
its handler runs when the outermost section ends, after the operation
completed or failed on its own. The per-message ring path takes no such
section (it acquires nothing a handler could lose: its lock is released in
a `finally`, and unlocking an unheld lock is a no-op) and pays nothing.
Synchronous signals (SIGBUS, SIGSEGV, ...) are never blocked. Blocking
costs about 2 us per outermost section (two `pthread_sigmask` calls).

The promise is the main thread's: in other threads CPython runs no
handler, so nothing is blocked there. Where another thread of the process
leaves these signals unblocked, the kernel may hand a process-directed
signal to it while the main thread defers, and CPython then runs the
handler in the main thread at its next check, inside the section: the
section degrades to ordered cleanup (no wrong data, typed errors, a
descriptor possibly lost). A service that wants the whole promise blocks
the signals in its other threads, as Python's `signal` documentation
advises for threads that should not receive them.
"""

from __future__ import annotations

import _signal
import atexit
import contextlib
import functools
import gc
import logging
import mmap
import os
import signal
import threading
import weakref
from typing import Any, Final, Protocol, TypeVar

_log: Final = logging.getLogger(__name__)
_F = TypeVar("_F", bound=Any)

# Forks between the process that imported this module and this one (0 there).
_generation = 0
# Live objects to mark at fork (`_forked_in_child`).
_tracked: weakref.WeakSet[Any] = weakref.WeakSet()
# Live objects of this process to close at interpreter exit (untracked by their close()).
_close_at_exit: weakref.WeakSet[Any] = weakref.WeakSet()
# The descriptors this process inherited at its last fork: fd -> (st_dev, st_ino) then.
_inherited_fds: dict[int, tuple[int, int]] = {}


# Never blocked: a fault these raise while blocked kills the process at once.
_SYNCHRONOUS: Final = frozenset(
    int(number)
    for number in (
        signal.SIGBUS,
        signal.SIGSEGV,
        signal.SIGFPE,
        signal.SIGILL,
        signal.SIGTRAP,
        signal.SIGSYS,
        signal.SIGABRT,
        signal.SIGKILL,
        signal.SIGSTOP,
    )
)
DEFERRED_SIGNALS: Final = frozenset(
    int(number) for number in signal.valid_signals() if int(number) not in _SYNCHRONOUS
)
# The thread that runs signal handlers (the forking thread, in a forked child).
_main_thread: Final = [threading.main_thread().ident]


class _Deferral(threading.local):
    """The calling thread's depth of `deferred_signals` sections, and the mask to restore."""

    depth = 0
    saved: Any = None


_deferral: Final = _Deferral()


class _DeferredSignals:
    """`deferred_signals()`: a reentrant section with the asynchronous signals blocked."""

    __slots__ = ()

    def __enter__(self) -> None:
        state = _deferral
        if state.depth == 0 and threading.get_ident() == _main_thread[0]:
            # pthread_sigmask runs the handlers of signals already pending
            # (PyErr_CheckSignals) *after* it changed the mask, and a handler
            # that raises loses the previous mask. So first an empty block: it
            # changes nothing, runs what is pending (a raise stops us here,
            # before the section) and answers the mask to restore.
            saved = _signal.pthread_sigmask(_signal.SIG_BLOCK, ())
            try:
                _signal.pthread_sigmask(_signal.SIG_BLOCK, DEFERRED_SIGNALS)
            except BaseException:  # a signal in between: its handler raised
                _signal.pthread_sigmask(_signal.SIG_SETMASK, saved)
                raise
            state.saved = saved
        state.depth += 1

    def __exit__(self, *exc_info: object) -> None:
        state = _deferral
        state.depth -= 1
        if state.depth == 0 and state.saved is not None:
            saved, state.saved = state.saved, None
            # The deferred handlers run inside this call, after the section.
            _signal.pthread_sigmask(_signal.SIG_SETMASK, saved)


_DEFERRED: Final = _DeferredSignals()


def deferred_signals() -> _DeferredSignals:
    """A section (``with deferred_signals():``) that no signal handler interrupts.

    See the module docstring: the asynchronous signals are blocked in the
    main thread from the outermost section's start to its end; their
    handlers run at its end. Reentrant; elsewhere than the main thread it
    only counts (`deferring`).
    """
    return _DEFERRED


def signals_deferred(function: _F) -> _F:
    """`function` as one `deferred_signals` section (for methods that acquire and record)."""

    @functools.wraps(function)
    def deferred(*args: Any, **kwargs: Any) -> Any:
        with _DEFERRED:
            return function(*args, **kwargs)

    return deferred  # type: ignore[return-value]


def deferring() -> bool:
    """Whether the calling thread is inside a `deferred_signals` section (the explorer asks)."""
    return _deferral.depth > 0


class Forkable(Protocol):
    """An object that belongs to the process that made it."""

    def _forked_in_child(self) -> None:
        """Mark the object inherited (called in the child right after fork; must not raise)."""

    def close(self) -> object: ...


def generation() -> int:
    """How many forks separate this process from the one that loaded shmring (cheap)."""
    return _generation


def is_inherited(made_in: int) -> bool:
    """Whether an object made in fork generation `made_in` was inherited by this process."""
    return made_in != _generation


def track(obj: Forkable, *, close_at_exit: bool = True) -> None:
    """Mark `obj` at fork; with `close_at_exit`, close it at interpreter exit if still open."""
    _tracked.add(obj)
    if close_at_exit:
        _close_at_exit.add(obj)


def closed(obj: object) -> None:
    """`obj` was closed by its owner: nothing to do at exit."""
    _close_at_exit.discard(obj)


def _after_fork_in_child() -> None:
    global _generation
    _generation += 1
    _main_thread[0] = threading.get_ident()
    _close_at_exit.clear()  # the parent's objects are the parent's to close
    _inherited_fds.clear()
    objects = list(_tracked)
    if not objects:
        return
    _snapshot_fds()
    for obj in objects:
        try:
            obj._forked_in_child()
        except Exception:  # noqa: BLE001 - a fork hook must never fail the fork
            _log.exception("marking an inherited shmring object failed: %r", type(obj))


def _snapshot_fds() -> None:
    """Record the descriptors inherited at this fork (only those may be closed as inherited)."""
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return
    for name in names:
        with contextlib.suppress(ValueError, OSError):
            fd = int(name)
            info = os.fstat(fd)
            _inherited_fds[fd] = (info.st_dev, info.st_ino)


def _close_all_at_exit() -> None:
    objects = list(_close_at_exit)
    _close_at_exit.clear()  # once
    for obj in objects:
        try:
            obj.close()
        except Exception:  # noqa: BLE001 - exit goes on; say what was left
            _log.warning("closing %r at interpreter exit failed", obj, exc_info=True)


def release_inherited(root: object) -> tuple[int, int]:
    """Release this process's copies of what inherited `root` maps and holds open.

    Walks the shmring objects reachable from `root` (never beyond them):
    releases the views our objects hold of each mapping (`_release_exports`),
    then closes every mapping (one a borrowed view still exports stays until
    the view dies) and every descriptor held in an attribute ending in
    ``fd`` that this process inherited at its fork and that still names
    the same file. Writes nothing into any mapping and removes no file.
    Answers (mappings closed, descriptors closed).
    """
    descriptors = 0
    seen: set[int] = set()
    stack: list[Any] = [root]
    found: list[mmap.mmap] = []
    while stack:
        obj = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, mmap.mmap):
            found.append(obj)
            continue
        if isinstance(obj, (dict, list, tuple, set, frozenset)) or _is_ours(obj):
            if _is_ours(obj):
                descriptors += _close_inherited_fds(obj)
                _release_exports(obj)
            stack.extend(
                child
                for child in gc.get_referents(obj)
                if id(child) not in seen and _worth_visiting(child)
            )
    # Only now: a mapping closes once every view our objects hold of it is released.
    mappings = 0
    for mapping in found:
        if not mapping.closed:
            with contextlib.suppress(BufferError, ValueError, OSError):
                mapping.close()
                mappings += 1
    return mappings, descriptors


def _release_exports(obj: object) -> None:
    """Drop the exports `obj` holds of a mapping, so the mapping can close (`release_inherited`).

    Two kinds, both read-write windows of a whole mapping and never a
    caller's: a memoryview in the attribute ``_buf`` (a ring's, a pool
    slot's, the stamp's, an arena's), and what an object releases in its
    own ``_release_exports`` (`frame_io.SharedWords`' word views,
    `futex.FutexWord`'s ctypes word). A view something else still exports
    stays (BufferError): the mapping then stays until that dies. A
    borrowed payload's own view is neither, and stays as it is.
    """
    own = getattr(type(obj), "_release_exports", None)
    if own is not None:
        with contextlib.suppress(BufferError, ValueError):
            own(obj)
    view = getattr(obj, "_buf", None)
    if type(view) is memoryview:
        with contextlib.suppress(BufferError, ValueError):
            view.release()


def _is_ours(obj: object) -> bool:
    module = type(obj).__module__ or ""
    return module.startswith("shmring.") and not isinstance(obj, type)


def _worth_visiting(obj: object) -> bool:
    return isinstance(obj, (mmap.mmap, dict, list, tuple, set, frozenset)) or _is_ours(obj)


def _close_inherited_fds(obj: object) -> int:
    closed_here = 0
    names = list(getattr(obj, "__dict__", {}))
    for cls in type(obj).__mro__:
        names.extend(getattr(cls, "__slots__", ()))
    for name in names:
        if not name.endswith("fd"):
            continue
        fd = getattr(obj, name, None)
        if type(fd) is not int or fd < 0 or fd not in _inherited_fds:
            continue
        try:
            info = os.fstat(fd)
        except OSError:
            continue
        if (info.st_dev, info.st_ino) != _inherited_fds.pop(fd):
            continue  # closed and reused since the fork: not the inherited one
        with contextlib.suppress(OSError):
            os.close(fd)
            closed_here += 1
        with contextlib.suppress(AttributeError, TypeError):
            setattr(obj, name, -1)
    return closed_here


def unmasked(error: BufferError) -> BaseException:
    """What a put or get raises for a `BufferError` that reached its boundary (issue 24).

    Our own (`BackPressureError`, a kept view's refusal) is a ShmringError
    already and goes as it is. A bare one is a cleanup that failed while
    something else propagated (an exception a signal handler raised inside
    the operation; a mapping its frame still exported could not close): the
    exception it replaced goes on as raised. A bare one with nothing under
    it is ours and becomes `BrokenError`, with it as the cause.
    """
    from .errors import BrokenError, ShmringError

    if isinstance(error, ShmringError):
        return error
    seen: BaseException = error
    while isinstance(seen, BufferError) and not isinstance(seen, ShmringError):
        context = seen.__context__
        if context is None:
            broken = BrokenError(f"internal buffer error: {error}")
            broken.__cause__ = error
            return broken
        seen = context
    return seen


os.register_at_fork(after_in_child=_after_fork_in_child)
atexit.register(_close_all_at_exit)


__all__ = [
    "DEFERRED_SIGNALS",
    "Forkable",
    "closed",
    "deferred_signals",
    "deferring",
    "signals_deferred",
    "generation",
    "is_inherited",
    "release_inherited",
    "track",
    "unmasked",
]
