"""Garbage collection: what dead producers left, and the directory nobody uses.

Design rationale. A killed producer leaves its files behind and moves no
stamp. Files named for their owner (`shmring.impl.names.file_owner`: rings,
markers, live files, fallback temporaries and spares, registered segments and
arenas) go when that owner is not running; fallback segments carry their
owner in their header and are removed under the fallback's lock rule
(`shmring.impl.fallback.claim.remove_if_orphaned`), the one thing this module
needs from the fallback: the segment's name may change only under the
exclusive lock of the file it names, or a reader mid-claim would lose it.
Liveness is (pid, start time) checked through a pidfd, so a live producer,
or a restarted one reusing a pid, is never touched: the safe direction of
every doubt is "alive". Receivers reclaim from their own scans
(`reclaim_dead_files`, `spec.discovery.process_reclaim`); `shmring gc` and
the last member's close run `collect_orphans` / `remove_dead_files`.

Every system call goes through the `OsFacade` the caller gives.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
from collections.abc import Iterable

from ..directory import DeploymentDirectory, Directory, as_directory
from ..errors import ResourceExhaustedError
from ..fallback.claim import remove_if_orphaned
from ..liveness import Liveness, liveness_files_last
from ..names import (
    MEMBERS_FILE_NAME,
    STAMP_FILE_NAME,
    ProducerIdentity,
    file_owner,
    is_fallback_segment_file_name,
    parse_marker_file_name,
)
from ..os_seam import OPEN_FLAGS_EXISTING, OsFacade


def teardown_if_empty(
    directory: str | Directory, os_facade: OsFacade, members_fd: int = -1
) -> bool:
    """With ``members`` locked exclusively: remove stamp, members and the directory if nothing else is there.

    `members_fd` is the descriptor of ``members`` we hold exclusively (-1:
    there was none). A deployment directory is torn down as a protocol
    (issue 22, defect 8; `DeploymentDirectory.lock_teardown`): under its
    teardown lock (another teardown of it running now: nothing to do),
    only while ``members`` still names the file we hold (else a member joined
    through a newer one after an earlier teardown unlinked ours: we are not
    the last), and the directory itself by its parent's descriptor, checked
    to be this very inode. A join racing it either keeps the directory alive
    (its ``members`` appeared: ENOTEMPTY) or finds it removed and makes a new
    one.
    """
    where = as_directory(directory, os_facade)
    if not isinstance(where, DeploymentDirectory):
        return _teardown_by_path(where, os_facade)
    if where.fd < 0 or not where.lock_teardown():
        return False
    try:
        if where.is_removed():
            return False
        names = set(where.names())
        if not names <= {STAMP_FILE_NAME, MEMBERS_FILE_NAME}:
            return False
        if MEMBERS_FILE_NAME in names and not _names_held(where, os_facade, members_fd):
            return False
        for name in (STAMP_FILE_NAME, MEMBERS_FILE_NAME):
            if name in names:
                with contextlib.suppress(FileNotFoundError):
                    where.unlink(name)
        return where.remove()
    finally:
        where.unlock_teardown()


def _names_held(where: Directory, os_facade: OsFacade, members_fd: int) -> bool:
    """Whether ``members`` names the file `members_fd` holds (False for none held)."""
    if members_fd < 0:
        return False
    try:
        named = where.stat(MEMBERS_FILE_NAME)
    except FileNotFoundError:
        return False
    held = os_facade.fstat(members_fd)
    return (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino)


def _teardown_by_path(where: Directory, os_facade: OsFacade) -> bool:
    """A standalone directory named by its path (rings and tests, never a connector's)."""
    try:
        names = set(where.names())
    except FileNotFoundError:
        return False
    if not names <= {STAMP_FILE_NAME, MEMBERS_FILE_NAME}:
        return False
    for name in (STAMP_FILE_NAME, MEMBERS_FILE_NAME):
        if name in names:
            with contextlib.suppress(FileNotFoundError):
                where.unlink(name)
    try:
        os_facade.rmdir(where.path)
    except FileNotFoundError:
        return False
    except OSError as error:
        if error.errno in (errno.ENOTEMPTY, errno.EEXIST):
            return False  # something appeared meanwhile; its owner cleans up
        raise
    return True


def collect_orphans(
    directory: str | Directory, os_facade: OsFacade, liveness: Liveness | None = None
) -> int:
    """Remove what dead producers left in `directory`; answer how many files went.

    Markers, rings, live files and fallback files (segments and their
    temporaries) of producers that are not running are removed; then, if no
    connector is a member any more and nothing else is left, the stamp, the
    members file and the directory go too.
    """
    removed = remove_dead_files(directory, os_facade, liveness)
    return removed + remove_unused_directory(directory, os_facade)


def reclaim_dead_files(
    directory: Directory, names: Iterable[str], os_facade: OsFacade, liveness: Liveness
) -> int:
    """Remove the files among `names` of producers found dead, markers aside; answer how many.

    `spec.discovery.process_reclaim` (`get_dead_with_files`), from a scan's listing.

    Markers are the scan's to prune (they move the stamp). Files named for
    their owner (rings, live files, temporaries, spares, transfer files) go
    when that owner is not running; fallback segments carry their owner in
    their header, so they are read (under their lock) only when some owner
    was found dead. Identity is (pid, start time) checked through a pidfd
    (`Liveness`), so a live producer, or a restarted one reusing a pid, is
    never touched: the safe direction of every doubt is "alive".
    """
    removed = 0
    dead: set[ProducerIdentity] = set()
    segments: list[str] = []
    for name in liveness_files_last(list(names)):
        if parse_marker_file_name(name) is not None:
            continue
        owner = file_owner(name)
        if owner is None:
            if is_fallback_segment_file_name(name):
                segments.append(name)
            continue
        try:
            if liveness.is_alive(owner):
                continue
        except ResourceExhaustedError:
            continue  # cannot tell now: never remove on a doubt
        dead.add(owner)
        with contextlib.suppress(FileNotFoundError):
            directory.unlink(name)
            removed += 1
    if dead:
        for name in segments:
            removed += remove_if_orphaned(
                directory, name, os_facade, lambda owner: owner not in dead
            )
    return removed


def remove_dead_files(
    directory: str | Directory, os_facade: OsFacade, liveness: Liveness | None
) -> int:
    """Markers, rings, live files and fallback files of producers not running; answers how many went."""
    where = as_directory(directory, os_facade)
    own = liveness is None
    if liveness is None:
        liveness = Liveness(os_facade, directory=where)
    removed = 0
    try:
        try:
            names = where.names()
        except FileNotFoundError:
            return 0
        for name in liveness_files_last(names):
            owner = file_owner(name)
            if owner is not None:
                if not liveness.is_alive(owner):
                    with contextlib.suppress(FileNotFoundError):
                        where.unlink(name)
                        removed += 1
            elif is_fallback_segment_file_name(name):
                removed += remove_if_orphaned(where, name, os_facade, liveness.is_alive)
    finally:
        if own:
            liveness.close()
    return removed


def remove_unused_directory(directory: str | Directory, os_facade: OsFacade) -> int:
    """Tear the directory down if no member holds ``members``; answer files removed (0 or 2)."""
    where = as_directory(directory, os_facade)
    try:
        fd = where.open(MEMBERS_FILE_NAME, OPEN_FLAGS_EXISTING)
    except FileNotFoundError:
        fd = -1
    try:
        if fd >= 0:
            try:
                os_facade.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return 0
        return 2 if teardown_if_empty(where, os_facade, fd) else 0
    finally:
        if fd >= 0:
            os_facade.close(fd)


__all__ = [
    "collect_orphans",
    "reclaim_dead_files",
    "remove_dead_files",
    "remove_unused_directory",
    "teardown_if_empty",
]
