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
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import logging
import mmap
import os
import weakref
from typing import Any, Final, Protocol

_log: Final = logging.getLogger(__name__)

# Forks between the process that imported this module and this one (0 there).
_generation = 0
# Live objects to mark at fork (`_forked_in_child`).
_tracked: weakref.WeakSet[Any] = weakref.WeakSet()
# Live objects of this process to close at interpreter exit (untracked by their close()).
_close_at_exit: weakref.WeakSet[Any] = weakref.WeakSet()
# The descriptors this process inherited at its last fork: fd -> (st_dev, st_ino) then.
_inherited_fds: dict[int, tuple[int, int]] = {}


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
    closes every mapping (one a borrowed view still exports stays until
    the view dies) and every descriptor held in an attribute ending in
    ``fd`` that this process inherited at its fork and that still names
    the same file. Writes nothing into any mapping and removes no file.
    Answers (mappings closed, descriptors closed).
    """
    mappings = descriptors = 0
    seen: set[int] = set()
    stack: list[Any] = [root]
    while stack:
        obj = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, mmap.mmap):
            if not obj.closed:
                with contextlib.suppress(BufferError, ValueError, OSError):
                    obj.close()
                    mappings += 1
            continue
        if isinstance(obj, (dict, list, tuple, set, frozenset)) or _is_ours(obj):
            if _is_ours(obj):
                descriptors += _close_inherited_fds(obj)
            stack.extend(
                child
                for child in gc.get_referents(obj)
                if id(child) not in seen and _worth_visiting(child)
            )
    return mappings, descriptors


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
    "Forkable",
    "closed",
    "generation",
    "is_inherited",
    "release_inherited",
    "track",
    "unmasked",
]
