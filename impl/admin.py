"""Looking after a deployment: what is in it (`stat`) and what dead producers left (`gc`).

Design rationale. Operators need two answers about a scope without running a
connector: who is publishing and how full their rings and fallback are, and
what a crashed process left behind. Both read the deployment directory
through the OS seam with the same parsers and liveness check the transport
uses (`names.file_owner`, `liveness.Liveness`; a ring is read by a
`RingReader`, whose header check and statistics walk are `ring.frames`),
so `gc` removes exactly what `collect_orphans` would: files of producers
that are not running, and the directory itself once nobody is a member. A
dry run lists the same files and removes nothing.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass

from ..spec.layout import STAMP_OFFSET
from . import discovery
from .directory import Directory, open_deployment_directory
from .errors import ShmringError
from .frame_io import SharedWords
from .liveness import Liveness
from .names import (
    DIRECTORY_PREFIX,
    STAMP_FILE_NAME,
    deployment_directory,
    file_owner,
    is_fallback_segment_file_name,
    parse_fallback_spare_file_name,
    parse_pool_slot_file_name,
    parse_ring_file_name,
    read_segment_owner,
    validate_scope,
)
from .os_seam import DEFAULT_OS, OPEN_FLAGS_READONLY, OsFacade
from .ring.reader import RingReader


@dataclass(frozen=True)
class RingStatus:
    """One ring file as a reader sees it now."""

    name: str  # file name in the deployment directory
    edge: tuple[str, str]  # (source stage, destination stage)
    producer: tuple[int, int]  # (pid, start time)
    alive: bool  # the producer process is running
    capacity: int  # data region bytes
    used_bytes: int  # head - tail
    published_frames: int  # deliverable frames
    claimed_frames: int  # leased frames not yet released
    closed: bool  # the producer closed the ring
    error: str | None = None  # why the ring could not be read, if it could not


@dataclass(frozen=True)
class DeploymentStatus:
    """What one scope holds in shared memory."""

    directory: str  # the deployment directory
    exists: bool  # False: nothing of this scope is in shared memory
    stamp: int | None  # discovery stamp, None when there is no stamp file
    producers: tuple[tuple[int, int], ...]  # identities named by any file, sorted
    live_producers: tuple[tuple[int, int], ...]  # those still running
    rings: tuple[RingStatus, ...]
    segments: int  # fallback segment files
    segment_bytes: int  # their total size on disk
    orphans: tuple[str, ...]  # file names `gc` would remove
    spares: int = 0  # fallback files handed back to their producer for reuse
    spare_bytes: int = 0  # their total size on disk
    pool_slots: int = 0  # pool slot files (`impl.pool`; reaped with their producer)
    pool_slot_bytes: int = 0  # their total size on disk


def _segment_owner(directory: Directory, name: str, os_facade: OsFacade) -> tuple[int, int] | None:
    try:
        fd = directory.open(name, OPEN_FLAGS_READONLY)
    except OSError:
        return None
    try:
        return read_segment_owner(fd, os_facade)
    finally:
        os_facade.close(fd)


def _read_stamp(directory: Directory, os_facade: OsFacade) -> int | None:
    try:
        fd = directory.open(STAMP_FILE_NAME, OPEN_FLAGS_READONLY)
    except OSError:
        return None
    try:
        data = os_facade.read(fd, STAMP_OFFSET + 8)
    finally:
        os_facade.close(fd)
    if len(data) < STAMP_OFFSET + 8:
        return None
    words = SharedWords(memoryview(data))  # the stamp is a u64 word, as discovery maps it
    try:
        value: int = words.u64[STAMP_OFFSET // 8]
    finally:
        words.release()
    return value


def deployment_status(
    scope: str, shm_root: str = "/dev/shm", os_facade: OsFacade = DEFAULT_OS
) -> DeploymentStatus:
    """Read what a scope holds; changes nothing.

    The directory is opened once and checked ours (ConfigurationError
    otherwise); every file is read relative to that descriptor.
    """
    path = deployment_directory(scope, shm_root=shm_root)
    try:
        where = open_deployment_directory(scope, os_facade, shm_root, create=False)
    except FileNotFoundError:
        return DeploymentStatus(path, False, None, (), (), (), 0, 0, ())
    try:
        return _status(where, os_facade)
    finally:
        where.close()


def _status(where: Directory, os_facade: OsFacade) -> DeploymentStatus:
    directory = where.path
    names = sorted(where.names())
    liveness = Liveness(os_facade, directory=where)
    try:
        owners: dict[str, tuple[int, int] | None] = {}
        segments = segment_bytes = spares = spare_bytes = slots = slot_bytes = 0
        for name in names:
            owner = file_owner(name)
            try:
                if owner is None and is_fallback_segment_file_name(name):
                    size = where.stat(name).st_size
                    owner = _segment_owner(where, name, os_facade)
                    segments += 1
                    segment_bytes += size
                elif parse_fallback_spare_file_name(name) is not None:
                    size = where.stat(name).st_size
                    spares += 1
                    spare_bytes += size
                elif parse_pool_slot_file_name(name) is not None:
                    slots += 1
                    slot_bytes += where.stat(name).st_size
            except FileNotFoundError:
                continue  # claimed or removed since the scan
            owners[name] = owner
        identities = sorted({o for o in owners.values() if o is not None})
        alive = {identity: liveness.is_alive(identity) for identity in identities}
        rings = tuple(
            _ring_status(where, name, alive, os_facade)
            for name in owners
            if parse_ring_file_name(name) is not None
        )
        orphans = tuple(
            name for name, owner in owners.items() if owner is not None and not alive[owner]
        )
        return DeploymentStatus(
            directory=directory,
            exists=True,
            stamp=_read_stamp(where, os_facade),
            producers=tuple(identities),
            live_producers=tuple(i for i in identities if alive[i]),
            rings=rings,
            segments=segments,
            segment_bytes=segment_bytes,
            spares=spares,
            spare_bytes=spare_bytes,
            orphans=orphans,
            pool_slots=slots,
            pool_slot_bytes=slot_bytes,
        )
    finally:
        liveness.close()


def _ring_status(
    directory: Directory, name: str, alive: dict[tuple[int, int], bool], os_facade: OsFacade
) -> RingStatus:
    parsed = parse_ring_file_name(name)
    assert parsed is not None
    edge = (parsed.source, parsed.destination)
    producer = parsed.producer
    try:
        reader = RingReader.attach(directory.join(name), os_facade=os_facade, directory=directory)
    except ShmringError as error:
        return RingStatus(name, edge, producer, alive[producer], 0, 0, 0, 0, True, str(error))
    try:
        stats = reader.statistics()
    finally:
        reader.close()
    return RingStatus(
        name=name,
        edge=edge,
        producer=producer,
        alive=alive[producer],
        capacity=stats.capacity,
        used_bytes=stats.used_bytes,
        published_frames=stats.published_frames,
        claimed_frames=stats.claimed_frames,
        closed=stats.closed,
    )


def collect(
    scope: str, shm_root: str = "/dev/shm", dry_run: bool = False, os_facade: OsFacade = DEFAULT_OS
) -> list[str]:
    """Remove (or, dry, list) what dead producers of `scope` left; answers the file names."""
    try:
        where = open_deployment_directory(scope, os_facade, shm_root, create=False)
    except FileNotFoundError:
        return []
    try:
        before = _status(where, os_facade)
        if dry_run:
            return list(before.orphans)
        discovery.collect_orphans(where, os_facade)
        remaining = set(where.names())
        gone = [name for name in before.orphans if name not in remaining]
        if where.is_removed():
            gone.append(os.path.basename(before.directory) + "/")
        return gone
    finally:
        where.close()


def list_scopes(shm_root: str = "/dev/shm", uid: int | None = None) -> list[str]:
    """Every scope of `uid` (default: this one) with a deployment directory under shm_root, sorted.

    What `shmring stat` without `--scope` walks: a directory named
    ``shmring-<uid>-<scope>`` owned by that uid whose scope is valid.
    """
    owner = os.getuid() if uid is None else uid
    prefix = f"{DIRECTORY_PREFIX}{owner}-"
    found = []
    try:
        entries = list(os.scandir(shm_root))
    except FileNotFoundError:
        return []
    for entry in entries:
        if not entry.name.startswith(prefix):
            continue
        try:
            if not entry.is_dir(follow_symlinks=False):
                continue
            if entry.stat(follow_symlinks=False).st_uid != owner:
                continue
            scope = entry.name[len(prefix) :]
            validate_scope(scope)
        except (OSError, ShmringError):
            continue
        found.append(scope)
    return sorted(found)


def status_as_dict(scope: str, status: DeploymentStatus) -> dict[str, object]:
    """`shmring stat --json`: the status's fields, with the scope and the edges spelled out."""
    return {"scope": scope, **asdict(status)}


def format_status(status: DeploymentStatus) -> str:
    """The `shmring stat` text."""
    if not status.exists:
        return f"{status.directory}: nothing in shared memory for this scope"
    lines = [
        f"{status.directory}: stamp={status.stamp} producers={len(status.producers)} "
        f"live={len(status.live_producers)} fallback segments={status.segments} "
        f"({status.segment_bytes:,} bytes) spare files={status.spares} "
        f"({status.spare_bytes:,} bytes) pool slots={status.pool_slots} "
        f"({status.pool_slot_bytes:,} bytes) orphans={len(status.orphans)}"
    ]
    for ring in status.rings:
        who = f"{ring.producer[0]}.{ring.producer[1]}"
        state = "alive" if ring.alive else "dead"
        if ring.error is not None:
            lines.append(
                f"  ring {ring.edge[0]} -> {ring.edge[1]} producer {who} ({state}): unreadable: {ring.error}"
            )
            continue
        percent = 100.0 * ring.used_bytes / ring.capacity if ring.capacity else 0.0
        lines.append(
            f"  ring {ring.edge[0]} -> {ring.edge[1]} producer {who} ({state}{', closed' if ring.closed else ''}): "
            f"{ring.used_bytes:,}/{ring.capacity:,} bytes ({percent:.0f}%), "
            f"{ring.published_frames} published, {ring.claimed_frames} leased"
        )
    return "\n".join(lines)
