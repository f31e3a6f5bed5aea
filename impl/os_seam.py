"""The OS seam: every side effect a fault plan may target goes through here.

Design rationale. Fault injection must reach each system call the transport
makes (create, truncate, map, lock, stamp, unlink, scan, pidfd) without
monkeypatching `os` or `fcntl`: patches leak between tests, miss calls made
through aliases, and cannot be shipped to a worker process. Instead each
connector, channel, segment and registry holds one `OsFacade`; production
uses the plain one, and `shmring.fault_injection` installs a subclass whose
`_enter(site)` hook raises the planned error before the real call runs (trio's
`FakeNet` plugs in the same way, through `set_custom_socket_factory`).

Every public method names its site in `SITES`; `_enter` is called with that
name before anything happens, so an injected error leaves no partial effect
from the call it replaces.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import mmap
import os
import select
import struct
import weakref
from typing import Final, TypeAlias

SITE_OPEN: Final = "open"
SITE_CLOSE: Final = "close"
SITE_FTRUNCATE: Final = "ftruncate"
SITE_FALLOCATE: Final = "fallocate"
SITE_MMAP: Final = "mmap"
SITE_FLOCK: Final = "flock"
SITE_UNLINK: Final = "unlink"
SITE_MKDIR: Final = "mkdir"
SITE_RMDIR: Final = "rmdir"
SITE_STAT: Final = "stat"
SITE_SCANDIR: Final = "scandir"
SITE_PIDFD: Final = "pidfd"
SITE_READ: Final = "read"
SITE_WRITE: Final = "write"
SITE_RENAME: Final = "rename"

SITES: Final = (
    SITE_OPEN,
    SITE_CLOSE,
    SITE_FTRUNCATE,
    SITE_FALLOCATE,
    SITE_MMAP,
    SITE_FLOCK,
    SITE_UNLINK,
    SITE_MKDIR,
    SITE_RMDIR,
    SITE_STAT,
    SITE_SCANDIR,
    SITE_PIDFD,
    SITE_READ,
    SITE_WRITE,
    SITE_RENAME,
)

# Files are private to the user and never followed through a symlink.
FILE_MODE: Final = 0o600
DIR_MODE: Final = 0o700
OPEN_FLAGS_CREATE: Final = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
OPEN_FLAGS_EXISTING: Final = os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC
OPEN_FLAGS_READONLY: Final = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
# A deployment directory is held open by descriptor; never through a symlink.
OPEN_FLAGS_DIRECTORY: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# struct flock (l_type, l_whence, l_start, l_len, l_pid), native layout; l_pid is 0 for OFD locks.
_FLOCK_FORMAT: Final = "hhqqi4x"


class OsFacade:
    """Thin wrappers over the system calls the transports make.

    Subclasses override `_enter` to inject faults; nothing else should need
    overriding. Methods return exactly what the wrapped call returns.
    """

    def _enter(self, site: str) -> None:
        """Hook run before every call; production does nothing."""

    def _enter_at(self, site: str, dir_fd: int) -> None:
        """Hook run before every call relative to a directory descriptor.

        Production only runs `_enter`; a fault plan may also act on the
        directory itself here (replace it between two calls).
        """
        self._enter(site)

    # -- files ---------------------------------------------------------------

    def open(self, path: str, flags: int, mode: int = FILE_MODE) -> int:
        self._enter(SITE_OPEN)
        return os.open(path, flags, mode)

    def close(self, fd: int) -> None:
        """Release `fd`; EIO or EINTR from close(2) is not raised.

        Linux releases the descriptor even when close reports an error, and
        on shared memory no write is pending that the error could be about,
        so a caller has nothing to act on; raising it only turned finished
        work (a claimed segment, a mapped file) into failures and leaks, as
        the fault campaign showed. EBADF (closing twice: a bug) is raised.
        """
        try:
            self._enter(SITE_CLOSE)
        except OSError as error:
            if error.errno == errno.EBADF:
                raise
        try:
            os.close(fd)
        except OSError as error:
            if error.errno == errno.EBADF:
                raise

    def ftruncate(self, fd: int, length: int) -> None:
        self._enter(SITE_FTRUNCATE)
        os.ftruncate(fd, length)

    def fallocate(self, fd: int, length: int) -> None:
        """Reserve `length` bytes now, so ENOSPC shows at setup, not at a page fault."""
        self._enter(SITE_FALLOCATE)
        os.posix_fallocate(fd, 0, length)

    def mmap(self, fd: int, length: int, *, writable: bool = True) -> mmap.mmap:
        self._enter(SITE_MMAP)
        prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
        return mmap.mmap(fd, length, flags=mmap.MAP_SHARED, prot=prot)

    def map_shared(self, fd: int, length: int) -> SharedMapping:
        """Map `length` bytes of `fd` read-write, shared, *holding no descriptor* (site mmap).

        Python's `mmap.mmap` keeps a dup of the descriptor for as long as the
        mapping lives: two descriptors per mapped file, which put a limit of
        26 outstanding pool slots on a producer at ``ulimit -n 64`` (issue 22,
        defect 5). This maps through libc's mmap(2) instead, so the caller may
        close `fd` at once; the answer is a ctypes byte array over the
        mapping (take `memoryview(answer)`), unmapped when the last reference
        to it (views and arrays made from it included) is gone.
        """
        self._enter(SITE_MMAP)
        return map_shared_without_descriptor(fd, length)

    def fstat(self, fd: int) -> os.stat_result:
        self._enter(SITE_STAT)
        return os.fstat(fd)

    def file_size(self, fd: int) -> int:
        """The size of `fd`'s file (the `stat` site): `lseek` to its end, no stat_result.

        A quarter of `fstat`'s price where only the size is wanted (a
        reader's truncation check at every get, issue 23); it moves the
        descriptor's offset, so only for descriptors nothing reads or
        writes by offset (mapped files).
        """
        self._enter(SITE_STAT)
        return os.lseek(fd, 0, os.SEEK_END)

    def stat(self, path: str) -> os.stat_result:
        self._enter(SITE_STAT)
        return os.stat(path, follow_symlinks=False)

    def read(self, fd: int, length: int) -> bytes:
        self._enter(SITE_READ)
        return os.read(fd, length)

    def write(self, fd: int, data: bytes) -> int:
        self._enter(SITE_WRITE)
        return os.write(fd, data)

    def unlink(self, path: str) -> None:
        self._enter(SITE_UNLINK)
        os.unlink(path)

    def rename(self, source: str, target: str) -> None:
        self._enter(SITE_RENAME)
        os.rename(source, target)

    # -- files relative to a directory descriptor ------------------------------
    #
    # Every file of a deployment is reached through these: the descriptor was
    # opened once, O_DIRECTORY | O_NOFOLLOW, and verified ours, so no later
    # call re-resolves the directory's path (which another uid could have
    # re-created meanwhile). `name` is a single path component.

    def open_at(self, dir_fd: int, name: str, flags: int, mode: int = FILE_MODE) -> int:
        self._enter_at(SITE_OPEN, dir_fd)
        return os.open(name, flags, mode, dir_fd=dir_fd)

    def stat_at(self, dir_fd: int, name: str) -> os.stat_result:
        self._enter_at(SITE_STAT, dir_fd)
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)

    def exists_at(self, dir_fd: int, name: str) -> bool:
        """Whether `name` in the directory names anything (a symlink too); no descriptor, no raise.

        The `stat` site. A get's look for a segment that is not there costs
        this one call instead of a failed open, its exception and the
        signal mask's three calls around it (issue 23).
        """
        self._enter_at(SITE_STAT, dir_fd)
        return os.access(name, os.F_OK, dir_fd=dir_fd, follow_symlinks=False)

    def unlink_at(self, dir_fd: int, name: str) -> None:
        self._enter_at(SITE_UNLINK, dir_fd)
        os.unlink(name, dir_fd=dir_fd)

    def rename_at(self, dir_fd: int, source: str, target: str) -> None:
        self._enter_at(SITE_RENAME, dir_fd)
        os.rename(source, target, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)

    def scandir_at(self, dir_fd: int) -> list[str]:
        """The names in the directory `dir_fd` names (not `.` and `..`)."""
        self._enter_at(SITE_SCANDIR, dir_fd)
        return os.listdir(dir_fd)

    def open_directory(self, path: str) -> int:
        """A descriptor for the directory at `path`; ELOOP / ENOTDIR for anything else."""
        self._enter(SITE_OPEN)
        return os.open(path, OPEN_FLAGS_DIRECTORY)

    # -- locks ---------------------------------------------------------------

    def flock(self, fd: int, operation: int) -> None:
        """`fcntl.flock`; callers on a receive path always pass LOCK_NB."""
        self._enter(SITE_FLOCK)
        fcntl.flock(fd, operation)

    def ofd_lock(self, fd: int, *, exclusive: bool = True) -> None:
        """Take an open-file-description lock on all of `fd`'s file without waiting.

        BlockingIOError when another open file description holds a
        conflicting one. Unlike a POSIX record lock it is not dropped when
        this process closes another descriptor of the file, and unlike
        either it is released by the kernel when the last descriptor of the
        description closes, at any death, in every pid namespace.
        """
        self._enter(SITE_FLOCK)
        kind = fcntl.F_WRLCK if exclusive else fcntl.F_RDLCK
        fcntl.fcntl(fd, fcntl.F_OFD_SETLK, struct.pack(_FLOCK_FORMAT, kind, os.SEEK_SET, 0, 0, 0))

    def ofd_lock_held(self, fd: int) -> bool:
        """Whether another open file description holds a lock on `fd`'s file (F_OFD_GETLK).

        Takes nothing: the kernel answers whether a write lock could be placed.
        """
        self._enter(SITE_FLOCK)
        probe = struct.pack(_FLOCK_FORMAT, fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0)
        answer = fcntl.fcntl(fd, fcntl.F_OFD_GETLK, probe)
        return bool(struct.unpack(_FLOCK_FORMAT, answer)[0] != fcntl.F_UNLCK)

    # -- directories ---------------------------------------------------------

    def mkdir(self, path: str, mode: int = DIR_MODE) -> None:
        self._enter(SITE_MKDIR)
        os.mkdir(path, mode)

    def rmdir(self, path: str) -> None:
        self._enter(SITE_RMDIR)
        os.rmdir(path)

    # Relative to the shm root's descriptor (the teardown's last steps): these
    # run `_enter` only, since `_enter_at` may act on the directory it is given,
    # and the shm root is no deployment directory.

    def stat_in_parent(self, parent_fd: int, name: str) -> os.stat_result:
        """lstat of the entry `name` of the directory `parent_fd` names."""
        self._enter(SITE_STAT)
        return os.stat(name, dir_fd=parent_fd, follow_symlinks=False)

    def rmdir_in_parent(self, parent_fd: int, name: str) -> None:
        """rmdir the entry `name` of the directory `parent_fd` names."""
        self._enter(SITE_RMDIR)
        os.rmdir(name, dir_fd=parent_fd)

    def open_parent_directory(self, path: str) -> int:
        """A descriptor for the directory at `path`, which may be reached through a symlink.

        For the shm root a deployment directory lives in (``/dev/shm`` is a
        symlink to ``/run/shm`` on some systems); never for a deployment
        directory itself (`open_directory`).
        """
        self._enter(SITE_OPEN)
        return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)

    def scandir(self, path: str) -> list[os.DirEntry[str]]:
        self._enter(SITE_SCANDIR)
        with os.scandir(path) as entries:
            return list(entries)

    # -- processes -----------------------------------------------------------

    def pidfd_open(self, pid: int) -> int:
        self._enter(SITE_PIDFD)
        return os.pidfd_open(pid)

    def pidfd_alive(self, pidfd: int, poller: select.poll | None = None) -> bool:
        """A pidfd becomes readable when its process exits.

        `poll`, not `select`: select cannot watch a descriptor numbered 1024
        or more, which a process with many open files reaches. `poller` is
        one `pidfd_poller(pidfd)` made earlier and kept by whoever keeps the
        pidfd (dropped with it): making one per question costs about as much
        as the poll itself.
        """
        self._enter(SITE_PIDFD)
        if poller is None:
            poller = self.pidfd_poller(pidfd)
        return not poller.poll(0)

    def pidfd_poller(self, pidfd: int) -> select.poll:
        """A poll object watching `pidfd` (for `pidfd_alive`); valid while that pidfd is open."""
        poller = select.poll()
        poller.register(pidfd, select.POLLIN)
        return poller


# -- mappings that hold no descriptor ------------------------------------------------

_LIBC: Final = ctypes.CDLL(None, use_errno=True)
_LIBC_MMAP: Final = _LIBC.mmap
_LIBC_MMAP.restype = ctypes.c_void_p
_LIBC_MMAP.argtypes = (
    ctypes.c_void_p,
    ctypes.c_size_t,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_long,  # off_t on LP64 Linux
)
_LIBC_MUNMAP: Final = _LIBC.munmap
_LIBC_MUNMAP.restype = ctypes.c_int
_LIBC_MUNMAP.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
_MAP_FAILED: Final = ctypes.c_void_p(-1).value

#: What `OsFacade.map_shared` answers: a ctypes byte array over the mapping.
SharedMapping: TypeAlias = "ctypes.Array[ctypes.c_ubyte]"


def _unmap(address: int, length: int) -> None:
    _LIBC_MUNMAP(address, length)


def map_shared_without_descriptor(fd: int, length: int) -> SharedMapping:
    """`OsFacade.map_shared` without the seam: mmap(2) through libc, freed with its last reference."""
    if length <= 0:
        raise ValueError(f"cannot map an empty range: length={length}")
    address = _LIBC_MMAP(None, length, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_SHARED, fd, 0)
    if address is None or address == _MAP_FAILED:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))
    array = (ctypes.c_ubyte * length).from_address(address)
    # munmap once nothing (our array, a memoryview, a numpy array made from
    # one) refers to the array: refcounting makes that prompt.
    weakref.finalize(array, _unmap, address, length).atexit = False
    return array


#: The facade production code uses when none is given.
DEFAULT_OS: Final = OsFacade()


__all__ = [
    "DEFAULT_OS",
    "DIR_MODE",
    "FILE_MODE",
    "OPEN_FLAGS_CREATE",
    "OPEN_FLAGS_DIRECTORY",
    "OPEN_FLAGS_EXISTING",
    "OPEN_FLAGS_READONLY",
    "SITES",
    "OsFacade",
    "SharedMapping",
    "map_shared_without_descriptor",
]
