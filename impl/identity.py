"""Who a process and a producer are: (pid, start time), and the instance of a connector.

A process is (pid, start time in clock ticks since boot, field 22 of
``/proc/<pid>/stat``): a pid reused by a later process has another start
time. A producer (one connector) adds an instance number unique in its
process. `impl.names` re-exports these; the names of files carry them.
"""

from __future__ import annotations

import itertools
import os
from typing import Final

from .os_seam import DEFAULT_OS, OPEN_FLAGS_READONLY, OsFacade

ProducerIdentity = tuple[int, int]  # (pid, start time in clock ticks since boot): a process

# -- producer identity -------------------------------------------------------------

_instances: Final = itertools.count()


def next_instance() -> int:
    """A number no other connector of this process has (0, 1, 2, ...)."""
    return next(_instances)


def process_of(producer: tuple[int, ...]) -> ProducerIdentity:
    """The process part (pid, start time) of a producer or process identity."""
    return (producer[0], producer[1])


def instance_of(producer: tuple[int, ...]) -> int:
    """The instance part of a producer identity; 0 for a bare process identity."""
    return producer[2] if len(producer) > 2 else 0


# -- /proc: the start time of a process ------------------------------------------

# Field 22 of /proc/<pid>/stat (1-based) is the start time; fields after the
# command name (which may hold spaces and parentheses) start at field 3.
_STAT_START_TIME_FIELD: Final = 22
_STAT_FIELDS_BEFORE_STATE: Final = 2
_PROC_STAT_READ_LENGTH: Final = 4096


def read_proc_stat(pid: int, os_facade: OsFacade) -> bytes | None:
    """The ``/proc/<pid>/stat`` line of process `pid`, or None when there is no such process."""
    try:
        fd = os_facade.open(f"/proc/{pid}/stat", OPEN_FLAGS_READONLY)
    except (FileNotFoundError, ProcessLookupError):
        return None
    try:
        return os_facade.read(fd, _PROC_STAT_READ_LENGTH)
    except ProcessLookupError:  # the process exited between open and read
        return None
    finally:
        os_facade.close(fd)


def parse_start_time(stat_line: bytes) -> int:
    """Field 22 of a ``/proc/<pid>/stat`` line; the command name may hold anything."""
    close = stat_line.rfind(b")")
    if close < 0:
        raise ValueError(f"not a /proc stat line: {stat_line[:80]!r}")
    fields = stat_line[close + 1 :].split()
    index = _STAT_START_TIME_FIELD - 1 - _STAT_FIELDS_BEFORE_STATE
    if len(fields) <= index:
        raise ValueError(f"/proc stat line too short: {stat_line[:80]!r}")
    return int(fields[index])


def read_start_time(pid: int, os_facade: OsFacade = DEFAULT_OS) -> int | None:
    """The start time of process `pid`, or None when there is no such process."""
    line = read_proc_stat(pid, os_facade)
    return parse_start_time(line) if line is not None else None


_identity_cache: tuple[int, int] | None = None


def current_producer_identity(os_facade: OsFacade = DEFAULT_OS) -> ProducerIdentity:
    """(pid, start time) of this process; recomputed after a fork changes the pid."""
    global _identity_cache
    pid = os.getpid()
    cached = _identity_cache
    if cached is not None and cached[0] == pid:
        return cached
    start_time = read_start_time(pid, os_facade)
    if start_time is None:  # pragma: no cover - our own /proc entry always exists
        raise RuntimeError(f"cannot read our own start time: pid={pid}")
    _identity_cache = (pid, start_time)
    return _identity_cache
