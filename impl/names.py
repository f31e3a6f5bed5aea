"""What every shmring file is called, how its name parses back, and who made it.

Design rationale. A deployment's files sit in one private directory
(`shmring.impl.directory`); what each file is, and which process owns it,
is read from its name alone, so that discovery, the garbage collector,
`shmring stat` and the last member's teardown agree on every file without
opening it. This module is the one place those names are built and parsed:
each kind of file has one pattern in the parse table (`_FILE_NAMES`), and
every specific parser below uses that same pattern. Names are built only
from validated parts (`shmring.impl.name_checks`: a scope or stage name can
never smuggle in a path separator, ``..``, a NUL byte, or a dot), so every
name parses back unambiguously.

The names, ``<p>`` being ``<pid>.<start time>`` of the owning process::

    stamp, members                          discovery's shared files (nobody's)
    ring.<src>.<dst>.<p>[.<instance>]       a producer's ring on an edge
    marker.<src>.<dst>.<p>[.<instance>]     that ring is ready (discovery)
    live.<p>[.<instance>]                   that producer's connector is open
    fb.<src>.<dst>.<blake2b-128 of key>     a fallback segment (owner in its header)
    fbtmp.<p>.<generation>                  a fallback segment being written
    fbspare.<p>.<generation>                a fallback segment handed back for reuse
    seg.<p>[.<counter>].<token>             a registered-transfer segment
    arena.<p>[.<counter>].<token>           a registered arena
    pool.<p>.<instance>.<index>             a slot of that producer's pool (`impl.pool`)
    cohort.<src>.<dst>.<p>.<instance>       that producer's publication cohort gate of an edge

A producer is one connector instance; its identity (`ConnectorIdentity`) is
(pid, start time, instance). The process part (`ProducerIdentity`, (pid,
start time)) owns files and answers liveness (`shmring.impl.liveness`): the
start time (field 22 of ``/proc/<pid>/stat``, clock ticks since boot) tells a
reused pid from the process that first had it, and every instance of a
process dies with it. The instance numbers the connectors a process made
(`next_instance`), so one process may hold any number of producers on one
edge. A name without the instance (a ring made by a bare `RingChannel`)
reads as instance 0.

Every system call goes through the `OsFacade` given by the caller.
"""

from __future__ import annotations

import enum
import functools
import hashlib
import os
import re
import secrets
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from ..spec.layout import RING_HEADER_LENGTH, RING_MAGIC
from .errors import ConfigurationError, InvalidKeyError
from .frame_io import read_ring_header
from .identity import (  # re-exported (__all__): who a process and a producer are
    ProducerIdentity,
    current_producer_identity,
    instance_of,
    next_instance,
    parse_start_time,
    process_of,
    read_proc_stat,
    read_start_time,
)
from .name_checks import (  # the checks of user-given names (validate_*, MAX_*: re-exported)
    _STAGE,
    MAX_SCOPE_LENGTH,
    MAX_STAGE_NAME_LENGTH,
    _validate_edge,
    validate_scope,
    validate_stage_name,
)
from .os_seam import DEFAULT_OS, OsFacade

if TYPE_CHECKING:
    from .directory import Directory

DEFAULT_SHM_ROOT: Final = "/dev/shm"
DIRECTORY_PREFIX: Final = "shmring-"
NAME_SEPARATOR: Final = "."

STAMP_FILE_NAME: Final = "stamp"
MEMBERS_FILE_NAME: Final = "members"
RING_FILE_PREFIX: Final = "ring"
MARKER_FILE_PREFIX: Final = "marker"
LIVE_FILE_PREFIX: Final = "live"
FALLBACK_SEGMENT_FILE_PREFIX: Final = "fb"
FALLBACK_TEMP_FILE_PREFIX: Final = "fbtmp"
FALLBACK_SPARE_FILE_PREFIX: Final = "fbspare"
REGISTERED_SEGMENT_FILE_PREFIX: Final = "seg"
ARENA_FILE_PREFIX: Final = "arena"
POOL_SLOT_FILE_PREFIX: Final = "pool"
COHORT_GATE_FILE_PREFIX: Final = "cohort"

KEY_DIGEST_SIZE: Final = 16  # bytes of blake2b in a fallback segment name

ConnectorIdentity = tuple[int, int, int]  # (pid, start time, instance): one producer
Edge = tuple[str, str]  # (source stage, destination stage)

# -- the parse table -------------------------------------------------------------
#
# One pattern per kind of file. Where a name carries its owner, the groups
# `pid` and `start` hold it (and `instance`, where there is one).

_OWNER: Final = r"(?P<pid>[0-9]+)\.(?P<start>[0-9]+)"
_INSTANCE: Final = r"(?:\.(?P<instance>[0-9]+))?"
# A ring's stage names are as long as `validate_stage_name` allows, no longer.
_RING_STAGE: Final = f"[A-Za-z0-9_-]{{1,{MAX_STAGE_NAME_LENGTH}}}"

_RING_PATTERN: Final = re.compile(
    rf"ring\.(?P<source>{_RING_STAGE})\.(?P<destination>{_RING_STAGE})\.{_OWNER}{_INSTANCE}"
)
_MARKER_PATTERN: Final = re.compile(
    rf"marker\.(?P<source>{_STAGE})\.(?P<destination>{_STAGE})\.{_OWNER}{_INSTANCE}"
)
_LIVE_PATTERN: Final = re.compile(rf"live\.{_OWNER}{_INSTANCE}")
_FALLBACK_SEGMENT_PATTERN: Final = re.compile(rf"fb\.{_STAGE}\.{_STAGE}\.[0-9a-f]{{32}}")
_FALLBACK_TEMP_PATTERN: Final = re.compile(rf"fbtmp\.{_OWNER}\.[0-9]+")
_FALLBACK_SPARE_PATTERN: Final = re.compile(rf"fbspare\.{_OWNER}\.[0-9]+")
_REGISTERED_SEGMENT_PATTERN: Final = re.compile(rf"seg\.{_OWNER}(?:\.[0-9]+)?\.[0-9a-f]{{8}}")
_ARENA_PATTERN: Final = re.compile(rf"arena\.{_OWNER}(?:\.[0-9]+)?\.[0-9a-f]{{8}}")
_POOL_SLOT_PATTERN: Final = re.compile(rf"pool\.{_OWNER}\.(?P<instance>[0-9]+)\.(?P<index>[0-9]+)")
_COHORT_GATE_PATTERN: Final = re.compile(
    rf"cohort\.(?P<source>{_STAGE})\.(?P<destination>{_STAGE})\.{_OWNER}\.(?P<instance>[0-9]+)"
)


class FileKind(enum.Enum):
    """What a file in the deployment directory is, read from its name."""

    STAMP = "stamp"
    MEMBERS = "members"
    RING = "ring"
    MARKER = "marker"
    LIVE = "live"
    FALLBACK_SEGMENT = "fallback segment"
    FALLBACK_TEMP = "fallback temporary"
    FALLBACK_SPARE = "fallback spare"
    REGISTERED_SEGMENT = "registered segment"
    ARENA = "arena"
    POOL_SLOT = "pool slot"
    COHORT_GATE = "cohort gate"


_FILE_NAMES: Final[tuple[tuple[FileKind, re.Pattern[str]], ...]] = (
    (FileKind.STAMP, re.compile(re.escape(STAMP_FILE_NAME))),
    (FileKind.MEMBERS, re.compile(re.escape(MEMBERS_FILE_NAME))),
    (FileKind.RING, _RING_PATTERN),
    (FileKind.MARKER, _MARKER_PATTERN),
    (FileKind.LIVE, _LIVE_PATTERN),
    (FileKind.FALLBACK_SEGMENT, _FALLBACK_SEGMENT_PATTERN),
    (FileKind.FALLBACK_TEMP, _FALLBACK_TEMP_PATTERN),
    (FileKind.FALLBACK_SPARE, _FALLBACK_SPARE_PATTERN),
    (FileKind.REGISTERED_SEGMENT, _REGISTERED_SEGMENT_PATTERN),
    (FileKind.ARENA, _ARENA_PATTERN),
    (FileKind.POOL_SLOT, _POOL_SLOT_PATTERN),
    (FileKind.COHORT_GATE, _COHORT_GATE_PATTERN),
)


@dataclass(frozen=True)
class ParsedFileName:
    """A deployment file name, parsed."""

    kind: FileKind
    # The process named in the file name. None for the shared files (stamp,
    # members) and for fallback segments, which carry their owner in their
    # header (`parse_segment_owner`).
    owner: ProducerIdentity | None


def _owner_in(match: re.Match[str]) -> ProducerIdentity | None:
    groups = match.groupdict()
    if groups.get("pid") is None:
        return None
    return int(groups["pid"]), int(groups["start"])


@functools.lru_cache(maxsize=4096)  # a discovery scan parses every name of the directory again
def parse_file_name(name: str) -> ParsedFileName | None:
    """What the file `name` is and who owns it, or None for a name no shmring file has."""
    for kind, pattern in _FILE_NAMES:
        match = pattern.fullmatch(name)
        if match is not None:
            return ParsedFileName(kind, _owner_in(match))
    return None


def file_owner(name: str) -> ProducerIdentity | None:
    """The process a deployment file belongs to, read from its name.

    Rings, markers, live files, fallback temporaries and spares, and
    registered segments and arenas carry their owner in the name; fallback
    segments carry it in their header (None here, as for the shared files
    and for names no shmring file has).
    """
    parsed = parse_file_name(name)
    return parsed.owner if parsed is not None else None


def _parse_identity(match: re.Match[str]) -> ConnectorIdentity:
    instance = match.group("instance")
    return int(match.group("pid")), int(match.group("start")), int(instance) if instance else 0


def _directory_path(directory: str | Directory) -> str:
    return directory if isinstance(directory, str) else directory.path


# -- the deployment directory and rings ----------------------------------------


def deployment_directory(
    scope: str, shm_root: str = DEFAULT_SHM_ROOT, uid: int | None = None
) -> str:
    """``<shm_root>/shmring-<uid>-<scope>`` for a validated scope."""
    validate_scope(scope)
    owner = os.getuid() if uid is None else uid
    return os.path.join(shm_root, f"{DIRECTORY_PREFIX}{owner}-{scope}")


def ring_file_name(source: str, destination: str, producer: tuple[int, ...]) -> str:
    """The ring file's name (no directory) for an edge and a producer identity.

    `producer` is (pid, start time, instance), or (pid, start time) for a
    ring outside any connector (its name carries no instance).
    """
    _validate_edge((source, destination))
    if len(producer) not in (2, 3) or not all(
        isinstance(part, int) and part >= 0 for part in producer
    ):
        raise ConfigurationError(
            f"producer identity must be (pid > 0, start time >= 0[, instance >= 0]): producer={producer!r}"
        )
    if producer[0] <= 0:
        raise ConfigurationError(f"producer pid must be > 0: producer={producer!r}")
    return NAME_SEPARATOR.join((RING_FILE_PREFIX, source, destination, *map(str, producer)))


@dataclass(frozen=True)
class RingFileName:
    """The parts of a ring file name."""

    source: str  # source stage
    destination: str  # destination stage
    producer: ProducerIdentity  # (pid, start time) of the process that created the ring
    instance: int = 0  # which of that process's connectors (0 when the name has none)

    @property
    def identity(self) -> ConnectorIdentity:
        """(pid, start time, instance) of the producer."""
        return (*self.producer, self.instance)


def parse_ring_file_name(name: str) -> RingFileName | None:
    """The parts of a ring file name, or None when `name` is not one."""
    match = _RING_PATTERN.fullmatch(name)
    if match is None:
        return None
    pid, start_time, instance = _parse_identity(match)
    return RingFileName(match["source"], match["destination"], (pid, start_time), instance)


def ring_path(directory: str, source: str, destination: str, producer: tuple[int, ...]) -> str:
    return os.path.join(directory, ring_file_name(source, destination, producer))


# -- discovery: markers and live files -------------------------------------------


def marker_file_name(edge: Edge, producer: tuple[int, ...]) -> str:
    """``marker.<src>.<dst>.<pid>.<start time>[.<instance>]`` for validated stage names."""
    return NAME_SEPARATOR.join((MARKER_FILE_PREFIX, *_validate_edge(edge), *map(str, producer)))


@functools.lru_cache(maxsize=4096)  # a discovery scan parses every name of the directory again
def parse_marker_file_name(name: str) -> tuple[Edge, ConnectorIdentity] | None:
    """(edge, producer (pid, start time, instance)) of a marker file name, or None."""
    match = _MARKER_PATTERN.fullmatch(name)
    if match is None:
        return None
    return (match["source"], match["destination"]), _parse_identity(match)


def cohort_gate_file_name(edge: Edge, producer: ConnectorIdentity) -> str:
    """``cohort.<src>.<dst>.<pid>.<start time>.<instance>``: a producer's cohort gate of an edge."""
    return NAME_SEPARATOR.join(
        (COHORT_GATE_FILE_PREFIX, *_validate_edge(edge), *map(str, producer))
    )


def live_file_name(producer: tuple[int, ...]) -> str:
    """``live.<pid>.<start time>[.<instance>]``: that producer's connector is open (not closed)."""
    return NAME_SEPARATOR.join((LIVE_FILE_PREFIX, *map(str, producer)))


def parse_live_file_name(name: str) -> ProducerIdentity | None:
    """The process (pid, start time) a live file belongs to, or None."""
    match = _LIVE_PATTERN.fullmatch(name)
    return _owner_in(match) if match is not None else None


# -- fallback segments, their temporaries and spares -----------------------------


@functools.lru_cache(maxsize=4096)
def fallback_segment_file_name(edge: Edge, key: str) -> str:
    """``fb.<src>.<dst>.<digest of key>``: where the key's fallback segment on `edge` lives."""
    digest = hashlib.blake2b(key.encode("utf-8"), digest_size=KEY_DIGEST_SIZE).hexdigest()
    return NAME_SEPARATOR.join((FALLBACK_SEGMENT_FILE_PREFIX, *_validate_edge(edge), digest))


def fallback_segment_path(directory: str | Directory, edge: Edge, key: str) -> str:
    return os.path.join(_directory_path(directory), fallback_segment_file_name(edge, key))


def is_fallback_segment_file_name(name: str) -> bool:
    return _FALLBACK_SEGMENT_PATTERN.fullmatch(name) is not None


def fallback_temp_file_name(producer: tuple[int, ...], generation: int) -> str:
    """Where a producer writes its segment of `generation` before renaming it into place."""
    pid, start_time = producer[:2]  # generations are unique per process
    return NAME_SEPARATOR.join(
        (FALLBACK_TEMP_FILE_PREFIX, str(pid), str(start_time), str(generation))
    )


def parse_fallback_temp_file_name(name: str) -> ProducerIdentity | None:
    """The producer that made temporary file `name`, or None when it is not one."""
    match = _FALLBACK_TEMP_PATTERN.fullmatch(name)
    return _owner_in(match) if match is not None else None


def fallback_spare_file_name(producer: tuple[int, ...], generation: int) -> str:
    """Where a reader hands back the producer's segment of `generation` for reuse."""
    pid, start_time = producer[:2]  # generations are unique per process
    return NAME_SEPARATOR.join(
        (FALLBACK_SPARE_FILE_PREFIX, str(pid), str(start_time), str(generation))
    )


def parse_fallback_spare_file_name(name: str) -> ProducerIdentity | None:
    """The producer a handed-back segment `name` belongs to, or None when it is not one."""
    match = _FALLBACK_SPARE_PATTERN.fullmatch(name)
    return _owner_in(match) if match is not None else None


def parse_segment_owner(header: bytes | memoryview) -> ProducerIdentity | None:
    """The owner (pid, start time) a fallback segment's ring header records.

    None when `header` is shorter than a ring header or its magic is not a
    ring's: such a file tells no owner.
    """
    if len(header) < RING_HEADER_LENGTH:
        return None
    ring_header = read_ring_header(memoryview(header))
    if ring_header.magic != RING_MAGIC:
        return None
    return ring_header.producer_pid, ring_header.producer_start_time


def read_segment_owner(fd: int, os_facade: OsFacade) -> ProducerIdentity | None:
    """`parse_segment_owner` of the fallback segment open at `fd` (read from its start)."""
    return parse_segment_owner(os_facade.read(fd, RING_HEADER_LENGTH))


# -- registered-transfer segments and arenas ---------------------------------------

_counter = 0


# -- pool slots ----------------------------------------------------------------


def pool_slot_file_name(producer: tuple[int, ...], index: int) -> str:
    """``pool.<pid>.<start time>.<instance>.<index>``: slot `index` of that producer's pool.

    Indices are never reused within a producer's life, so a name is one file.
    """
    pid, start_time, instance = producer[0], producer[1], instance_of(producer)
    return NAME_SEPARATOR.join(
        (POOL_SLOT_FILE_PREFIX, str(pid), str(start_time), str(instance), str(index))
    )


def parse_pool_slot_file_name(name: str) -> tuple[ConnectorIdentity, int] | None:
    """(producer, slot index) of a pool slot file name, or None when it is not one."""
    match = _POOL_SLOT_PATTERN.fullmatch(name)
    if match is None:
        return None
    return _parse_identity(match), int(match.group("index"))


def _next_counter() -> int:
    global _counter
    _counter += 1
    return _counter


def registered_segment_file_name(os_facade: OsFacade = DEFAULT_OS) -> str:
    """A fresh registered-transfer segment name: never reused, tells its producer."""
    pid, start_time = current_producer_identity(os_facade)
    return NAME_SEPARATOR.join(
        (
            REGISTERED_SEGMENT_FILE_PREFIX,
            str(pid),
            str(start_time),
            str(_next_counter()),
            secrets.token_hex(4),
        )
    )


def arena_file_name(os_facade: OsFacade = DEFAULT_OS) -> str:
    """A fresh registered arena name: never reused, tells its producer."""
    pid, start_time = current_producer_identity(os_facade)
    return NAME_SEPARATOR.join((ARENA_FILE_PREFIX, str(pid), str(start_time), secrets.token_hex(4)))


def validate_transfer_file_name(name: object) -> str:
    """A segment or arena name as built here; InvalidKeyError for anything else (no paths)."""
    if isinstance(name, str):
        parsed = parse_file_name(name)
        if parsed is not None and parsed.kind in (FileKind.REGISTERED_SEGMENT, FileKind.ARENA):
            return name
    raise InvalidKeyError(f"not a shmring segment or arena name: name={name!r}")


__all__ = [
    "COHORT_GATE_FILE_PREFIX",
    "cohort_gate_file_name",
    "ARENA_FILE_PREFIX",
    "DEFAULT_SHM_ROOT",
    "FALLBACK_SEGMENT_FILE_PREFIX",
    "FALLBACK_SPARE_FILE_PREFIX",
    "FALLBACK_TEMP_FILE_PREFIX",
    "KEY_DIGEST_SIZE",
    "LIVE_FILE_PREFIX",
    "MARKER_FILE_PREFIX",
    "MAX_SCOPE_LENGTH",
    "MAX_STAGE_NAME_LENGTH",
    "MEMBERS_FILE_NAME",
    "REGISTERED_SEGMENT_FILE_PREFIX",
    "RING_FILE_PREFIX",
    "STAMP_FILE_NAME",
    "ConnectorIdentity",
    "Edge",
    "FileKind",
    "ParsedFileName",
    "ProducerIdentity",
    "RingFileName",
    "arena_file_name",
    "current_producer_identity",
    "deployment_directory",
    "fallback_segment_file_name",
    "fallback_segment_path",
    "fallback_spare_file_name",
    "fallback_temp_file_name",
    "file_owner",
    "instance_of",
    "is_fallback_segment_file_name",
    "live_file_name",
    "marker_file_name",
    "next_instance",
    "parse_fallback_spare_file_name",
    "parse_fallback_temp_file_name",
    "parse_file_name",
    "parse_live_file_name",
    "parse_marker_file_name",
    "parse_pool_slot_file_name",
    "pool_slot_file_name",
    "parse_ring_file_name",
    "parse_segment_owner",
    "parse_start_time",
    "process_of",
    "read_proc_stat",
    "read_segment_owner",
    "read_start_time",
    "registered_segment_file_name",
    "ring_file_name",
    "ring_path",
    "validate_scope",
    "validate_stage_name",
    "validate_transfer_file_name",
]
