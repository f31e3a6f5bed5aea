"""Where a deployment's files live: the private directory and every operation on it.

Design rationale. Everything a deployment puts in shared memory sits in one
private directory, ``<shm_root>/shmring-<uid>-<scope>/`` (mode 0700, owned by
us, never a symlink; its name is `shmring.impl.names.deployment_directory`),
so two users or two deployments cannot see, clobber or redirect each other's
files, and a garbage collector finds everything a deployment left behind with
one directory scan. This module opens and checks that directory and is the
one way every component reaches a file in it (`Directory`); what the files
are called, and who made each, is `shmring.impl.names`.

Every system call goes through the `OsFacade` given by the caller.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat

from .errors import ConfigurationError, CorruptFrameError, DirectoryReplacedError, ShmringError
from .names import DEFAULT_SHM_ROOT, deployment_directory
from .os_seam import DEFAULT_OS, DIR_MODE, FILE_MODE, OPEN_FLAGS_EXISTING, OsFacade

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

    def may_exist(self, name: str) -> bool:
        """False only when `name` is surely absent now (a cheap look); True when it may be there."""
        return True

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

    def may_exist(self, name: str) -> bool:
        """One faccessat; a failing one (a fault, a closed directory) cannot tell: True."""
        try:
            return self._os.exists_at(self._require_fd(), self.name_of(name))
        except (OSError, ShmringError):
            return True

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

    # -- teardown (issue 22, defect 8) --------------------------------------------
    #
    # The last member out removes the directory, and only it: holding
    # ``members`` exclusively (no member holds it shared), it takes the
    # teardown lock, an exclusive flock on the directory's own inode (the
    # one thing every remover of this directory shares: ``members`` may have
    # been unlinked and made again meanwhile, the directory inode cannot),
    # and removes the directory relative to its parent's descriptor once the
    # parent's entry is checked to name this very inode. Every remover holds
    # the teardown lock while it checks and removes, so between the check
    # and the rmdir no cooperating process can remove this directory and put
    # another (a joiner's fresh one) at its name: the rmdir never takes a
    # directory it did not verify.

    def lock_teardown(self) -> bool:
        """Take the teardown lock without waiting; False: another teardown of it runs now."""
        try:
            self._os.flock(self._require_fd(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True

    def unlock_teardown(self) -> None:
        with contextlib.suppress(OSError):
            self._os.flock(self._require_fd(), fcntl.LOCK_UN)

    def remove(self) -> bool:
        """rmdir this very directory by its parent's descriptor; answer whether it went.

        Only under the teardown lock (`lock_teardown`), with nothing left in
        it. False, and nothing done, when the directory was removed already,
        when the parent's entry names another inode (removed and re-made
        meanwhile), or when something appeared in it (ENOTEMPTY).
        """
        if self.is_removed():
            return False
        name = os.path.basename(self.path)
        parent = self._os.open_parent_directory(os.path.dirname(self.path))
        try:
            try:
                here = self._os.stat_in_parent(parent, name)
            except FileNotFoundError:
                return False
            if (here.st_dev, here.st_ino) != self.identity:
                return False
            try:
                self._os.rmdir_in_parent(parent, name)
            except FileNotFoundError:
                return False
            except OSError as error:
                if error.errno in (errno.ENOTEMPTY, errno.EEXIST):
                    return False  # something appeared meanwhile; its owner cleans up
                raise
            return True
        finally:
            self._os.close(parent)

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


def open_private_file(path: str, os_facade: OsFacade, what: str) -> tuple[int, os.stat_result]:
    """Open an existing file whose bytes a reader will trust: (fd, its fstat), the caller closes.

    CorruptFrameError (`what` names the file) when `check_private_file`
    refuses it; the descriptor is closed then.
    """
    fd = os_facade.open(path, OPEN_FLAGS_EXISTING)
    try:
        info = os_facade.fstat(fd)
        untrusted = check_private_file(path, info)  # a file another uid made or changed
        if untrusted is not None:
            raise CorruptFrameError(f"{what} not trusted: {untrusted}")
    except BaseException:
        os_facade.close(fd)
        raise
    return fd, info


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


__all__ = [
    "DeploymentDirectory",
    "Directory",
    "PathDirectory",
    "as_directory",
    "check_private_directory",
    "check_private_directory_info",
    "check_private_file",
    "ensure_deployment_directory",
    "open_deployment_directory",
    "remove_deployment_directory_if_empty",
]
