"""The registry of injectable sites: every OS call and every CUDA driver call.

Design rationale. A fault campaign is only as good as its list of places to
fail. The list is not written here by hand: OS sites are
`shmring.impl.os_seam.SITES` and CUDA sites are
`shmring.spec.registration.DRIVER_CALLS`, the names the seams themselves
use. What this module adds is the *catalogue*: for each site, the errors the
real call can answer (errno values for OS calls, CUDA error names for the
driver) and how a failure behaves, so that the campaign injects only what
the world can do:

* An OS call fails *before* it runs (nothing happened), except `close`:
  Linux releases the descriptor even when close(2) reports an error, and the
  production seam releases it and absorbs EIO/EINTR (see `OsFacade.close`);
  a close cell checks that nothing above the seam notices.
* Unlocking (`flock` with LOCK_UN) never fails on Linux for a valid
  descriptor; it is not injectable, and it does not count as a call.
* EINTR is injected only where Python does not retry it (PEP 475 retries
  open, read, write, flock, ftruncate, fallocate, ... after a signal whose
  handler returns): `close`.
* EAGAIN at `flock` means "another process holds the lock". Transient only:
  a persistent one is a lock held forever, which the locked-reader tests
  cover with a real second process (the producer then waits its full lock
  timeout, far too long for a campaign cell).

A site no transport code reaches would be listed in `UNREACHED` (none is
now: `write` is reached since issue 26, a member's liveness file records
its pid namespace at the join, and the seam's `utime`, which nothing
called, is gone); the suite checks that no scenario reaches a listed one,
so the day the transport starts using it, the test fails until it gets a
catalogue entry.
"""

from __future__ import annotations

import errno
from dataclasses import dataclass
from typing import Final

from ..impl import os_seam
from ..spec import registration as registration_spec

LAYER_OS: Final = "os"
LAYER_CUDA: Final = "cuda"

MODE_TRANSIENT: Final = "transient"  # the Nth call fails, later ones succeed
MODE_PERSISTENT: Final = "persistent"  # the Nth call and every later one fail
MODES: Final = (MODE_TRANSIENT, MODE_PERSISTENT)

FaultError = int | str  # an errno value (OS sites) or a CUDA error name (driver sites)

#: Not an errno: the fault kind "the deployment directory was replaced between
#: two calls". At the planned call nothing fails; before the next call made
#: relative to a directory descriptor, that directory is renamed aside and a
#: directory open to everyone (mode 0777) is put at its path, as another uid
#: would after a teardown. Only the sites in `DIRECTORY_SITES` carry it.
DIRECTORY_REPLACED: Final = -1
DIRECTORY_REPLACED_NAME: Final = "DIRECTORY_REPLACED"


@dataclass(frozen=True)
class Site:
    """One injectable place and the errors the real call can answer there."""

    name: str  # the seam's site name (os_seam.SITE_* or spec.registration.CALL_*)
    layer: str  # LAYER_OS or LAYER_CUDA
    errors: tuple[FaultError, ...]  # in order of importance: the first is the quick budget's
    transient_only: tuple[FaultError, ...] = ()  # errors never injected persistently (see above)
    note: str = ""  # how a failure at this site behaves, for the catalogue

    def errors_for(self, mode: str, depth: int) -> tuple[FaultError, ...]:
        """The first `depth` errors (0: all) that may be injected in `mode`."""
        chosen = self.errors if depth <= 0 else self.errors[:depth]
        if mode == MODE_PERSISTENT:
            chosen = tuple(e for e in chosen if e not in self.transient_only)
        return chosen


_E = errno
OS_CATALOGUE: Final = {
    os_seam.SITE_OPEN: Site(
        os_seam.SITE_OPEN,
        LAYER_OS,
        (_E.ENOSPC, _E.EMFILE, _E.EACCES, _E.EPERM, _E.EIO, _E.ENFILE),
        note="create or open a ring, segment, marker, stamp, members, live or /proc file",
    ),
    os_seam.SITE_CLOSE: Site(
        os_seam.SITE_CLOSE,
        LAYER_OS,
        (_E.EIO, _E.EINTR),
        note="released all the same; the seam absorbs the error (close(2) semantics)",
    ),
    os_seam.SITE_FTRUNCATE: Site(
        os_seam.SITE_FTRUNCATE,
        LAYER_OS,
        (_E.ENOSPC, _E.EIO, _E.EPERM),
        note="size a new ring, segment or stamp file",
    ),
    os_seam.SITE_FALLOCATE: Site(
        os_seam.SITE_FALLOCATE,
        LAYER_OS,
        (_E.ENOSPC, _E.EIO, _E.EPERM),
        note="reserve a file's space: where a full /dev/shm shows",
    ),
    os_seam.SITE_MMAP: Site(
        os_seam.SITE_MMAP,
        LAYER_OS,
        (_E.ENOMEM, _E.EMFILE, _E.EACCES, _E.EAGAIN, _E.EPERM, _E.ENFILE),
        note="map a ring, segment, arena or stamp (Python's mmap keeps a dup of the descriptor)",
    ),
    os_seam.SITE_FLOCK: Site(
        os_seam.SITE_FLOCK,
        LAYER_OS,
        (_E.EAGAIN, _E.ENOLCK),
        transient_only=(_E.EAGAIN,),
        note="take a ring, segment, stamp or members lock (unlocking never fails)",
    ),
    os_seam.SITE_UNLINK: Site(
        os_seam.SITE_UNLINK,
        LAYER_OS,
        (_E.EIO, _E.EPERM, _E.EACCES, _E.EBUSY),
        note="remove a ring, segment, marker or temporary; claim a segment (the commit)",
    ),
    os_seam.SITE_MKDIR: Site(
        os_seam.SITE_MKDIR,
        LAYER_OS,
        (_E.ENOSPC, _E.EACCES, _E.EPERM, _E.EIO),
        note="create the deployment directory",
    ),
    os_seam.SITE_RMDIR: Site(
        os_seam.SITE_RMDIR,
        LAYER_OS,
        (_E.EIO, _E.EPERM, _E.EACCES, _E.EBUSY),
        note="the last member removes the deployment directory",
    ),
    os_seam.SITE_STAT: Site(
        os_seam.SITE_STAT,
        LAYER_OS,
        (_E.EIO, _E.EACCES),
        note="stat/fstat; lseek (a mapped ring's size) and faccessat (a get's segment look): validate a file, check st_nlink under a lock, refresh the budget",
    ),
    os_seam.SITE_SCANDIR: Site(
        os_seam.SITE_SCANDIR,
        LAYER_OS,
        (_E.EIO, _E.EMFILE, _E.EACCES, _E.ENFILE),
        note="discovery scan and teardown check of the deployment directory",
    ),
    os_seam.SITE_PIDFD: Site(
        os_seam.SITE_PIDFD,
        LAYER_OS,
        (_E.EMFILE, _E.ENOMEM, _E.EIO, _E.ENFILE),
        note="open a producer's pidfd, or poll it for liveness",
    ),
    os_seam.SITE_READ: Site(
        os_seam.SITE_READ,
        LAYER_OS,
        (_E.EIO, _E.EACCES),
        note="read /proc/<pid>/stat or a segment header",
    ),
    os_seam.SITE_WRITE: Site(os_seam.SITE_WRITE, LAYER_OS, (_E.ENOSPC, _E.EIO)),
    os_seam.SITE_RENAME: Site(
        os_seam.SITE_RENAME,
        LAYER_OS,
        (_E.ENOSPC, _E.EIO, _E.EPERM, _E.EBUSY),
        note="publish a fallback segment (temporary onto its name)",
    ),
}

_R = registration_spec
CUDA_CATALOGUE: Final = {
    _R.CALL_HOST_REGISTER: Site(
        _R.CALL_HOST_REGISTER,
        LAYER_CUDA,
        (_R.CUDA_ERROR_MEMORY_ALLOCATION, _R.CUDA_ERROR_UNKNOWN, _R.CUDA_ERROR_INVALID_VALUE),
        note="page-lock a segment or the arena",
    ),
    _R.CALL_HOST_UNREGISTER: Site(
        _R.CALL_HOST_UNREGISTER,
        LAYER_CUDA,
        (_R.CUDA_ERROR_UNKNOWN, _R.CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED),
        note="retried once; failing twice retains the mapping and poisons the registry",
    ),
    _R.CALL_COPY_TO_HOST: Site(
        _R.CALL_COPY_TO_HOST,
        LAYER_CUDA,
        (_R.CUDA_ERROR_UNKNOWN, _R.CUDA_ERROR_INVALID_VALUE),
        note="the device-to-host copy into the registered segment or arena frame",
    ),
    _R.CALL_SYNCHRONIZE: Site(
        _R.CALL_SYNCHRONIZE,
        LAYER_CUDA,
        (_R.CUDA_ERROR_UNKNOWN,),
        note="wait for the copy before publishing",
    ),
}

#: Sites that take a descriptor (or a mapping, which keeps one): where EMFILE
#: and ENFILE are cells of their own in the fast suite (`test_named_faults`).
DESCRIPTOR_SITES: Final = (os_seam.SITE_OPEN, os_seam.SITE_MMAP, os_seam.SITE_PIDFD)
EXHAUSTION_ERRORS: Final = (_E.EMFILE, _E.ENFILE)

#: Sites with directory-relative calls: where DIRECTORY_REPLACED is a cell kind
#: (`fault_injection.replaced` runs those cells; its promises differ from the
#: lockstep scenarios', so it is not in the catalogue's error lists).
DIRECTORY_SITES: Final = (
    os_seam.SITE_OPEN,
    os_seam.SITE_STAT,
    os_seam.SITE_UNLINK,
    os_seam.SITE_RENAME,
    os_seam.SITE_SCANDIR,
)

#: OS sites the transport never calls (checked by the suite, see module doc).
UNREACHED: Final[frozenset[str]] = frozenset()


def all_sites() -> tuple[Site, ...]:
    """Every site of both seams, OS first, in the seams' own order."""
    missing = [name for name in os_seam.SITES if name not in OS_CATALOGUE]
    missing += [name for name in registration_spec.DRIVER_CALLS if name not in CUDA_CATALOGUE]
    if missing:
        raise AssertionError(
            f"sites without a catalogue entry (add them to fault_injection/sites.py): {missing}"
        )
    return tuple(OS_CATALOGUE[name] for name in os_seam.SITES) + tuple(
        CUDA_CATALOGUE[name] for name in registration_spec.DRIVER_CALLS
    )


def site(name: str) -> Site:
    found = OS_CATALOGUE.get(name) or CUDA_CATALOGUE.get(name)
    if found is None:
        raise KeyError(f"no such injectable site: site={name!r}")
    return found


def error_name(error: FaultError) -> str:
    """`ENOSPC` for an errno, the CUDA name as is."""
    if error == DIRECTORY_REPLACED:
        return DIRECTORY_REPLACED_NAME
    if isinstance(error, int):
        return errno.errorcode.get(error, str(error))
    return error


def parse_error(text: str) -> FaultError:
    """Inverse of `error_name`."""
    if text.startswith("cudaError"):
        return text
    if text == DIRECTORY_REPLACED_NAME:
        return DIRECTORY_REPLACED
    code = getattr(errno, text, None)
    if not isinstance(code, int):
        raise ValueError(f"not an errno name nor a CUDA error name: error={text!r}")
    return code


__all__ = [
    "CUDA_CATALOGUE",
    "DIRECTORY_REPLACED",
    "DIRECTORY_REPLACED_NAME",
    "DESCRIPTOR_SITES",
    "DIRECTORY_SITES",
    "EXHAUSTION_ERRORS",
    "LAYER_CUDA",
    "LAYER_OS",
    "MODES",
    "MODE_PERSISTENT",
    "MODE_TRANSIENT",
    "OS_CATALOGUE",
    "UNREACHED",
    "FaultError",
    "Site",
    "all_sites",
    "error_name",
    "parse_error",
    "site",
]
