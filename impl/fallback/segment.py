"""The fallback segment file's lock rule, shared by its writer, its readers and the gc.

Design rationale. Exactly one reader must claim a segment, a stale
descriptor must be able to look at a segment *without* taking it, and a
producer must be able to retire or replace its own unclaimed version
exactly once. The rule that gives all three (the package docstring says
why flock and not rename):

    The segment name is changed (unlinked, renamed away, or replaced by a
    rename) only by a process that holds the exclusive `flock` of the file
    the name currently points at, and has checked under that lock that the
    file is still *at the name* (`stat` of the name shows the inode that
    `fstat` of its descriptor shows).

`open_locked` is that rule, once. A producer's wait for the lock is
bounded (`impl.locks.PRODUCER_LOCK_WAIT_SECONDS`): past it `open_locked`
answers BUSY and the producer defers what needs the lock (`writer`). The
reuse limits shared by a writer's spares and a reader's kept mappings are
here too.

Every system call goes through the `OsFacade` the caller gives.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import time
from typing import Final

from ..directory import Directory
from ..errors import CorruptFrameError
from ..locks import PRODUCER_LOCK_WAIT_SECONDS
from ..os_seam import OPEN_FLAGS_READONLY, OsFacade

# Segments of at least this many bytes are kept for reuse (below it a fresh
# file costs less than the bookkeeping), up to the writer's spare budget.
SPARE_MIN_FILE_LENGTH: Final = 1024 * 1024
DEFAULT_SPARE_BYTES: Final = 256 * 1024 * 1024
# The most files kept for reuse at once (each holds a descriptor and a mapping).
MAX_SPARES: Final = 16
# Bounded retries of an open+lock that found the file replaced under it.
_MAX_REOPENS: Final = 16
# The producer waits for a reader's lock (one copy) in short sleeps, up to the bound.
_LOCK_RETRY_SLEEP: Final = 0.0002


class Busy:
    """Another process holds the segment's lock (a reader answers BUSY)."""


BUSY: Final = Busy()


def open_locked(
    where: Directory, path: str, os_facade: OsFacade, *, wait: bool
) -> int | None | Busy:
    """Open the file at `path` and hold its exclusive lock, checked still linked.

    None: no file at `path`. `BUSY`: locked by someone else, and `wait` is
    False or the lock stayed held for `PRODUCER_LOCK_WAIT_SECONDS` (the
    producer's bound). Otherwise the descriptor; closing it drops the lock.
    """
    deadline = 0.0
    for _ in range(_MAX_REOPENS):
        try:
            fd = where.open(path, OPEN_FLAGS_READONLY)
        except FileNotFoundError:
            return None
        except OSError as error:
            if error.errno != errno.ELOOP:
                raise
            # Someone planted a symlink at the segment name; it is never followed.
            with contextlib.suppress(FileNotFoundError):
                where.unlink(path)
            raise CorruptFrameError(
                f"fallback segment path is a symlink; removed: path={path!r}"
            ) from error
        busy = False
        try:
            while True:
                try:
                    os_facade.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    now = time.monotonic()
                    if not deadline:
                        deadline = now + PRODUCER_LOCK_WAIT_SECONDS
                    if not wait or now > deadline:  # past the bound: the caller defers
                        busy = True
                        break
                    time.sleep(_LOCK_RETRY_SLEEP)
            if not busy and is_at(where, path, os_facade.fstat(fd)):
                return fd
        except BaseException:
            os_facade.close(fd)
            raise
        # Closed once, here (a close inside the `try` and again in its `except` was
        # EBADF escaping when an interrupt came between them: issue 24's explorer).
        os_facade.close(fd)
        if busy:
            return BUSY
        # unlinked or replaced under us: look again
    return BUSY


def close_locked(os_facade: OsFacade, fd: int) -> None:
    """Close a locked segment descriptor, also when an exception interrupts the close (issue 24).

    A signal handler's exception raised inside `close` (before or after the
    system call) would leave the descriptor, and so the lock, for the life
    of the process, and every later retire of the segment deferred. The
    close is tried again (EBADF: the interrupted one had closed it); the
    first such exception is raised after it.
    """
    pending: BaseException | None = None
    for _ in range(3):
        try:
            os_facade.close(fd)
            break
        except OSError as error:
            if error.errno == errno.EBADF and pending is not None:
                break  # the interrupted try had closed it
            raise
        except BaseException as error:  # noqa: BLE001 - raised below, once it is closed
            pending = pending or error
    if pending is not None:
        try:
            raise pending
        finally:
            pending = None  # no frame -> exception -> traceback -> frame cycle


def is_at(where: Directory, path: str, info: os.stat_result) -> bool:
    """Whether the file `info` describes is the one linked at `path` now."""
    if info.st_nlink == 0:
        return False
    try:
        here = where.stat(path)
    except FileNotFoundError:
        return False
    return (here.st_dev, here.st_ino) == (info.st_dev, info.st_ino)


__all__ = [
    "BUSY",
    "DEFAULT_SPARE_BYTES",
    "MAX_SPARES",
    "SPARE_MIN_FILE_LENGTH",
    "Busy",
    "close_locked",
    "is_at",
    "open_locked",
]
