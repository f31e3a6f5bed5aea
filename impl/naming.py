"""Where shmring files live, what they are called, and who made them.

Design rationale. Everything a deployment puts in shared memory sits in one
private directory, ``<shm_root>/shmring-<uid>-<scope>/`` (mode 0700, owned by
us, never a symlink), so two users or two deployments cannot see, clobber or
redirect each other's files, and a garbage collector can find everything a
deployment left behind with one directory scan. Names are built only from
validated parts: a scope or stage name can never smuggle in a path separator,
``..``, a NUL byte, or a dot that would make a ring name ambiguous.

A ring file is named for its edge and its producer's identity::

    ring.<source stage>.<destination stage>.<pid>.<start time>.<instance>

Stage names may not contain ``.``, so the name parses back unambiguously
(`parse_ring_file_name`). A producer is one connector instance; its identity
(`ConnectorIdentity`) is (pid, start time, instance). The process part
(`ProducerIdentity`, (pid, start time)) owns files and answers liveness: the
start time (field 22 of ``/proc/<pid>/stat``, clock ticks since boot) tells a
reused pid from the process that first had it, and every instance of a
process dies with it. The instance numbers the connectors a process made
(`next_instance`), so one process may hold any number of producers on one
edge. A name without the instance (a ring made by a bare `RingChannel`)
reads as instance 0.

Every system call goes through the `OsFacade` given by the caller.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import re
import stat
from dataclasses import dataclass
from typing import Final

from shmring.impl.errors import ConfigurationError, DirectoryReplacedError, InvalidKeyError
from shmring.impl.os_seam import DEFAULT_OS, DIR_MODE, FILE_MODE, OPEN_FLAGS_READONLY, OsFacade

DEFAULT_SHM_ROOT: Final = "/dev/shm"
DIRECTORY_PREFIX: Final = "shmring-"
RING_FILE_PREFIX: Final = "ring"
NAME_SEPARATOR: Final = "."

MAX_SCOPE_LENGTH: Final = 64
MAX_STAGE_NAME_LENGTH: Final = 64

# A scope is the last part of the directory name, so "-" is harmless there.
_SCOPE_PATTERN: Final = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
# Stage names sit between dots in a ring file name: no dot allowed.
_STAGE_PATTERN: Final = re.compile(r"[A-Za-z0-9_-]+")
_RING_NAME_PATTERN: Final = re.compile(
    r"ring\.([A-Za-z0-9_-]+)\.([A-Za-z0-9_-]+)\.([0-9]+)\.([0-9]+)(?:\.([0-9]+))?"
)

# Field 22 of /proc/<pid>/stat (1-based) is the start time; fields after the
# command name (which may hold spaces and parentheses) start at field 3.
_STAT_START_TIME_FIELD: Final = 22

# Registered-transfer files: seg.<pid>.<start time>.<counter>.<token> and
# arena.<pid>.<start time>.<token> (see impl/registration.py).
SEGMENT_FILE_PREFIX: Final = "seg"
ARENA_FILE_PREFIX: Final = "arena"
TRANSFER_FILE_PATTERN: Final = re.compile(
    r"(seg|arena)\.([0-9]+)\.([0-9]+)(\.[0-9]+)?\.[0-9a-f]{8}"
)


def parse_transfer_file_owner(name: str) -> tuple[int, int] | None:
    """The producer identity in a segment or arena file name, or None."""
    match = TRANSFER_FILE_PATTERN.fullmatch(name)
    if match is None:
        return None
    return (int(match.group(2)), int(match.group(3)))


_STAT_FIELDS_BEFORE_STATE: Final = 2
_PROC_STAT_READ_LENGTH: Final = 4096

ProducerIdentity = tuple[int, int]  # (pid, start time in clock ticks since boot): a process
ConnectorIdentity = tuple[int, int, int]  # (pid, start time, instance): one producer

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


# -- validation ----------------------------------------------------------------


def validate_scope(scope: object) -> str:
    """Answer `scope` if it can name a deployment directory; ConfigurationError otherwise."""
    if not isinstance(scope, str):
        raise ConfigurationError(f"scope must be a str: scope={scope!r}")
    if not scope or len(scope) > MAX_SCOPE_LENGTH:
        raise ConfigurationError(f"scope must be 1..{MAX_SCOPE_LENGTH} characters: scope={scope!r}")
    if ".." in scope or _SCOPE_PATTERN.fullmatch(scope) is None:
        raise ConfigurationError(
            "scope may hold only ASCII letters, digits, '_', '-' and single '.', "
            f"and may not start with '.' or '-': scope={scope!r}"
        )
    return scope


def validate_stage_name(name: object) -> str:
    """Answer `name` if it can name a stage in a ring file name; InvalidKeyError otherwise."""
    if not isinstance(name, str):
        raise InvalidKeyError(f"stage name must be a str: name={name!r}")
    if not name or len(name) > MAX_STAGE_NAME_LENGTH:
        raise InvalidKeyError(
            f"stage name must be 1..{MAX_STAGE_NAME_LENGTH} characters: name={name!r}"
        )
    if _STAGE_PATTERN.fullmatch(name) is None:
        raise InvalidKeyError(
            f"stage name may hold only ASCII letters, digits, '_' and '-': name={name!r}"
        )
    return name


# -- names ---------------------------------------------------------------------


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
    validate_stage_name(source)
    validate_stage_name(destination)
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
    match = _RING_NAME_PATTERN.fullmatch(name)
    if match is None:
        return None
    source, destination, pid, start_time, instance = match.groups()
    if len(source) > MAX_STAGE_NAME_LENGTH or len(destination) > MAX_STAGE_NAME_LENGTH:
        return None
    return RingFileName(
        source, destination, (int(pid), int(start_time)), int(instance) if instance else 0
    )


def ring_path(directory: str, source: str, destination: str, producer: tuple[int, ...]) -> str:
    return os.path.join(directory, ring_file_name(source, destination, producer))


# -- the deployment directory ----------------------------------------------------
#
# Why a descriptor. The directory is created (or found) and checked once; if
# later calls named files by path again, a directory removed by the last
# member's teardown and re-created meanwhile by another uid (`mkdir -m 0777`)
# would receive our files, and its owner could read and unlink them: the
# capture probe of issue 12 saw 0.6% of joins land there. So the directory is
# opened once, O_DIRECTORY | O_NOFOLLOW, checked with fstat (our uid, mode
# 0700, a directory), and every file operation is relative to that
# descriptor. A descriptor keeps naming the inode it was opened on: a
# replacement at the path cannot redirect it, and the kernel refuses to create
# anything in a removed directory (ENOENT), which `Membership.join` answers by
# joining again. The safe direction: a check that fails is a
# ConfigurationError or a re-join, never a file in a directory not ours.


class Directory:
    """Where a component's files live; every file operation goes through here.

    `path` is for names in messages and for the files of the directory;
    operations accept a bare name or a path inside this directory.
    """

    path: str

    def name_of(self, path_or_name: str) -> str:
        """The single component `path_or_name` names in this directory."""
        head, name = os.path.split(path_or_name)
        if head and head != self.path:
            raise ValueError(f"not a file of {self.path!r}: path={path_or_name!r}")
        if not name or name in (".", ".."):
            raise ValueError(f"not a file name: name={path_or_name!r}")
        return name

    def join(self, name: str) -> str:
        return os.path.join(self.path, name)

    def open(self, name: str, flags: int, mode: int = FILE_MODE) -> int:
        raise NotImplementedError

    def stat(self, name: str) -> os.stat_result:
        raise NotImplementedError

    def unlink(self, name: str) -> None:
        raise NotImplementedError

    def rename(self, source: str, target: str) -> None:
        raise NotImplementedError

    def names(self) -> list[str]:
        raise NotImplementedError

    def verify(self) -> None:
        """Raise DirectoryReplacedError if the path no longer names this directory."""


class PathDirectory(Directory):
    """A directory named by its path on every call: standalone rings and tests.

    Connectors never use it: they hold a `DeploymentDirectory`.
    """

    def __init__(self, path: str, os_facade: OsFacade = DEFAULT_OS) -> None:
        self.path = path
        self._os = os_facade

    def open(self, name: str, flags: int, mode: int = FILE_MODE) -> int:
        return self._os.open(self.join(self.name_of(name)), flags, mode)

    def stat(self, name: str) -> os.stat_result:
        return self._os.stat(self.join(self.name_of(name)))

    def unlink(self, name: str) -> None:
        self._os.unlink(self.join(self.name_of(name)))

    def rename(self, source: str, target: str) -> None:
        self._os.rename(self.join(self.name_of(source)), self.join(self.name_of(target)))

    def names(self) -> list[str]:
        return [entry.name for entry in self._os.scandir(self.path)]


def as_directory(directory: str | Directory, os_facade: OsFacade = DEFAULT_OS) -> Directory:
    """`directory` itself, or a `PathDirectory` for a plain path."""
    if isinstance(directory, Directory):
        return directory
    return PathDirectory(directory, os_facade)


class DeploymentDirectory(Directory):
    """The deployment directory, held by a verified descriptor (see above).

    Owned by one connector (or one gc / stat run); `close` releases the
    descriptor. Idempotent cleanup through the class default `fd = -1`.
    """

    fd: int = -1

    def __init__(self, path: str, fd: int, identity: tuple[int, int], os_facade: OsFacade) -> None:
        self.path = path
        self.fd = fd
        self.identity = identity  # (st_dev, st_ino) verified when opened
        self._os = os_facade

    @classmethod
    def open_verified(cls, path: str, os_facade: OsFacade = DEFAULT_OS) -> DeploymentDirectory:
        """Open the directory at `path` and check it is ours (uid, 0700, a directory).

        FileNotFoundError when nothing is there; ConfigurationError for a
        symlink, a file, or a directory not ours or open to others.
        """
        try:
            fd = os_facade.open_directory(path)
        except OSError as error:
            if error.errno in (errno.ELOOP, errno.ENOTDIR):
                raise ConfigurationError(
                    f"deployment directory is not a directory (symlink?): path={path!r}"
                ) from error
            raise
        try:
            info = os_facade.fstat(fd)
            check_private_directory_info(path, info)
        except BaseException:
            os_facade.close(fd)
            raise
        return cls(path, fd, (info.st_dev, info.st_ino), os_facade)

    def _require_fd(self) -> int:
        fd = self.fd
        if fd < 0:
            raise DirectoryReplacedError(f"deployment directory is closed: path={self.path!r}")
        return fd

    def open(self, name: str, flags: int, mode: int = FILE_MODE) -> int:
        return self._os.open_at(self._require_fd(), self.name_of(name), flags, mode)

    def stat(self, name: str) -> os.stat_result:
        return self._os.stat_at(self._require_fd(), self.name_of(name))

    def unlink(self, name: str) -> None:
        self._os.unlink_at(self._require_fd(), self.name_of(name))

    def rename(self, source: str, target: str) -> None:
        self._os.rename_at(self._require_fd(), self.name_of(source), self.name_of(target))

    def names(self) -> list[str]:
        return self._os.scandir_at(self._require_fd())

    def is_removed(self) -> bool:
        """Whether the directory was removed (the kernel then refuses new files in it)."""
        return self._os.fstat(self._require_fd()).st_nlink == 0

    def verify(self) -> None:
        """DirectoryReplacedError unless the path still names this very directory."""
        fd = self._require_fd()
        try:
            here = self._os.stat(self.path)
        except FileNotFoundError:
            here = None
        if here is None or (here.st_dev, here.st_ino) != self.identity:
            raise DirectoryReplacedError(
                f"deployment directory was removed or replaced: path={self.path!r}"
            )
        if self._os.fstat(fd).st_nlink == 0:  # pragma: no cover - the path check sees it first
            raise DirectoryReplacedError(f"deployment directory was removed: path={self.path!r}")

    def remove_if_empty(self) -> bool:
        """rmdir the path if it still names this directory and nothing is in it."""
        try:
            self.verify()
        except DirectoryReplacedError:
            return False
        return remove_deployment_directory_if_empty(self.path, self._os)

    def close(self) -> None:
        fd, self.fd = self.fd, -1
        if fd >= 0:
            self._os.close(fd)


def ensure_deployment_directory(
    scope: str,
    os_facade: OsFacade = DEFAULT_OS,
    shm_root: str = DEFAULT_SHM_ROOT,
) -> str:
    """Create (or accept) the deployment directory and answer its path.

    For components that still name files by path (the registered-transfer
    path, see docs/threat-model.md); connectors, readers, gc and stat use
    `open_deployment_directory`. An existing directory is accepted only if it
    is a real directory, ours, mode 0700.
    """
    path = deployment_directory(scope, shm_root)
    created = False
    with contextlib.suppress(FileExistsError):
        os_facade.mkdir(path, DIR_MODE)
        created = True
    try:
        check_private_directory(path, os_facade)
    except BaseException:
        if created:  # ours and still empty: do not leave it behind
            with contextlib.suppress(OSError):
                os_facade.rmdir(path)
        raise
    return path


def open_deployment_directory(
    scope: str,
    os_facade: OsFacade = DEFAULT_OS,
    shm_root: str = DEFAULT_SHM_ROOT,
    *,
    create: bool = True,
) -> DeploymentDirectory:
    """Create (or accept) the deployment directory and hold it by a verified descriptor.

    An existing directory is accepted only if it is a real directory (not a
    symlink), owned by our uid, and closed to group and others; anything else
    is a ConfigurationError naming the path, since a directory we do not
    control could redirect or expose every file placed in it.
    FileNotFoundError when `create` is False and there is none.
    """
    path = deployment_directory(scope, shm_root)
    created = False
    if create:
        with contextlib.suppress(FileExistsError):
            os_facade.mkdir(path, DIR_MODE)
            created = True
    try:
        return DeploymentDirectory.open_verified(path, os_facade)
    except FileNotFoundError:
        if not create:
            raise
        # removed between our mkdir and open: the caller joins again
        raise DirectoryReplacedError(
            f"deployment directory vanished while joining: path={path!r}"
        ) from None
    except BaseException:
        if created:  # ours and still empty: do not leave it behind
            with contextlib.suppress(OSError):
                os_facade.rmdir(path)
        raise


def check_private_directory(path: str, os_facade: OsFacade = DEFAULT_OS) -> None:
    """Refuse a directory that is a symlink, not ours, or open to others."""
    check_private_directory_info(path, os_facade.stat(path))  # lstat: never follows


def check_private_directory_info(path: str, info: os.stat_result) -> None:
    """Refuse what `info` describes unless it is a directory of ours, mode 0700."""
    if not stat.S_ISDIR(info.st_mode):
        raise ConfigurationError(
            f"deployment directory is not a directory (symlink?): path={path!r}"
        )
    uid = os.getuid()
    if info.st_uid != uid:
        raise ConfigurationError(
            f"deployment directory is owned by uid={info.st_uid}, not by us (uid={uid}): path={path!r}"
        )
    if stat.S_IMODE(info.st_mode) != DIR_MODE:
        raise ConfigurationError(
            f"deployment directory mode is not 0700: mode={oct(stat.S_IMODE(info.st_mode))} path={path!r}"
        )


def check_private_file(path: str, info: os.stat_result) -> str | None:
    """Why the file `info` describes may not be trusted, or None when it may.

    A file whose bytes a reader trusts (ring, segment, arena, spare) must be a
    regular file (never a link: it was opened O_NOFOLLOW), owned by our uid,
    mode 0600: anything else was made or changed by someone who is not us.
    """
    if not stat.S_ISREG(info.st_mode):
        return f"not a regular file: path={path!r}"
    if info.st_uid != os.getuid():
        return f"not ours: uid={info.st_uid} path={path!r}"
    if stat.S_IMODE(info.st_mode) != FILE_MODE:
        return f"mode is not 0600: mode={oct(stat.S_IMODE(info.st_mode))} path={path!r}"
    return None


def remove_deployment_directory_if_empty(path: str, os_facade: OsFacade = DEFAULT_OS) -> bool:
    """rmdir `path` when nothing is left in it; answer whether it was removed."""
    try:
        os_facade.rmdir(path)
    except FileNotFoundError:
        return False
    except OSError as error:
        if error.errno in (errno.ENOTEMPTY, errno.EEXIST):
            return False
        raise
    return True


# -- producer identity ---------------------------------------------------------


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
    try:
        fd = os_facade.open(f"/proc/{pid}/stat", OPEN_FLAGS_READONLY)
    except (FileNotFoundError, ProcessLookupError):
        return None
    try:
        line = os_facade.read(fd, _PROC_STAT_READ_LENGTH)
    except ProcessLookupError:  # the process exited between open and read
        return None
    finally:
        os_facade.close(fd)
    return parse_start_time(line)


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


__all__ = [
    "ConnectorIdentity",
    "DEFAULT_SHM_ROOT",
    "MAX_SCOPE_LENGTH",
    "MAX_STAGE_NAME_LENGTH",
    "ProducerIdentity",
    "RingFileName",
    "DeploymentDirectory",
    "Directory",
    "PathDirectory",
    "as_directory",
    "check_private_directory",
    "check_private_directory_info",
    "check_private_file",
    "open_deployment_directory",
    "current_producer_identity",
    "deployment_directory",
    "ensure_deployment_directory",
    "instance_of",
    "next_instance",
    "parse_ring_file_name",
    "parse_start_time",
    "process_of",
    "read_start_time",
    "remove_deployment_directory_if_empty",
    "ring_file_name",
    "ring_path",
    "validate_scope",
    "validate_stage_name",
]
