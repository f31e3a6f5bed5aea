"""Borrowed views: numpy arrays over shared memory that keep the memory alive.

Design rationale. A receiver that borrows a payload gets a plain
`numpy.ndarray` whose base chain ends in a `LeaseOwner`. The owner is not an
ndarray subclass and carries no attribute the user has to preserve: it
exposes `__array_interface__`, so numpy makes the array with `base = owner`,
and everything derived from that array keeps the owner alive by the ordinary
reference chain:

    np.asarray(a), a[1:], a.reshape(...), a.view(np.uint8)  -> base chain -> owner
    torch.from_numpy(a), .view(torch.bfloat16)              -> storage holds a -> owner
    av.VideoFrame.from_numpy_buffer(a)                      -> AVBuffer holds a -> owner

The seed's early design tied the mapping's life to an ndarray-subclass
attribute and crashed once `np.asarray` had dropped it; here the only way to
lose the memory is to drop every object that can reach it. When the owner
dies (CPython frees it right after the last reference goes) it releases the
lease: an arena frame is marked done in its shared header (the producer may
then reuse it), a per-transfer segment is unmapped. `shmring.spec.leases` is
the model; the lease itself (export, release once, counts) is the one of
`shmring.impl.ring.borrow`, which the host ring's leases use too.

The owner holds a numpy export of the mapping (`_keep`), so the mapping
object cannot be closed under a live view: `mmap.close` raises BufferError
instead of unmapping memory someone still reads.

A per-transfer segment is unlinked as soon as the receiver has mapped it, so
a receiver that dies leaves no name behind.
"""

from __future__ import annotations

import contextlib
import mmap
import os
from typing import Any

import numpy as np

from ..directory import open_private_file
from ..errors import CorruptFrameError
from ..os_seam import DEFAULT_OS, OsFacade
from ..ring.borrow import CollectedLease, LeaseStatistics, ReleaseHook, lease_statistics


class LeaseOwner(CollectedLease):
    """Owns one borrowed payload's memory for as long as any view of it lives.

    Who owns the memory: this object, through `_keep` (an export of the
    shared mapping). For how long: until the last object derived from the
    borrowed array dies; then `__del__` releases the lease (the arena frame
    becomes done, or the segment mapping is closed). Whether it may be
    written: yes, by the receiver that holds the lease; nobody else writes
    the payload while the lease lives, and after release the bytes belong to
    the producer again (an arena frame is reused), so no view may be kept
    past its owner, which the reference chain guarantees.

    The numpy face of the one lease (`shmring.impl.ring.borrow.Lease`): the
    same export, release-once and counting; it ends by collection instead of
    by an explicit `release()` (`borrow.CollectedLease`, as a connector's
    borrowed get does).
    """

    def __init__(
        self,
        keep: np.ndarray,
        payload_offset: int,
        dtype: np.dtype[Any],
        shape: tuple[int, ...],
        *,
        release: ReleaseHook | None = None,
        mapping_to_close: mmap.mmap | None = None,
        label: str = "",
    ) -> None:
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if payload_offset < 0 or payload_offset + nbytes > keep.nbytes:
            raise CorruptFrameError(
                f"payload outside its mapping: offset={payload_offset} nbytes={nbytes} "
                f"mapped={keep.nbytes} ({label})"
            )
        self.__array_interface__ = {
            "version": 3,
            "shape": tuple(shape),
            "typestr": dtype.str,
            "descr": dtype.descr,
            "data": (int(keep.ctypes.data) + payload_offset, False),
            "strides": None,
        }
        super().__init__(keep, release=release, mapping_to_close=mapping_to_close, label=label)

    def __repr__(self) -> str:
        return f"<LeaseOwner {self.label} live={self._keep is not None}>"


def borrow(
    keep: np.ndarray,
    payload_offset: int,
    dtype: np.dtype[Any] | str,
    shape: tuple[int, ...],
    *,
    release: ReleaseHook | None = None,
    mapping_to_close: mmap.mmap | None = None,
    label: str = "",
) -> np.ndarray:
    """A writable array over `keep[payload_offset:]` whose base is a new `LeaseOwner`.

    `release(keep)` runs once, right after the last derived object dies and
    before the export is dropped; then `mapping_to_close` (if given) is
    closed.
    """
    owner = LeaseOwner(
        keep,
        payload_offset,
        np.dtype(dtype),
        tuple(int(d) for d in shape),
        release=release,
        mapping_to_close=mapping_to_close,
        label=label,
    )
    return np.asarray(owner)


def lease_owner_of(array: np.ndarray) -> LeaseOwner | None:
    """The owner at the end of `array`'s base chain, if it is a borrowed view."""
    base: object = array
    while isinstance(base, np.ndarray):
        base = base.base
    return base if isinstance(base, LeaseOwner) else None


# -- per-transfer segments, receiver side ------------------------------------------


def check_made(path: str, info: os.stat_result, made: tuple[int, tuple[int, int]]) -> None:
    """CorruptFrameError unless `info` is the file a descriptor names: (owner uid, (st_dev, st_ino)).

    Issue 22, defect 1: a file put at a descriptor's name by anyone else (a
    neighbour's replacement, a re-created directory's plant) is never read.
    """
    owner_uid, identity = made
    if info.st_uid != owner_uid or (info.st_dev, info.st_ino) != tuple(identity):
        raise CorruptFrameError(
            f"not the file the descriptor names: path={path!r} is uid={info.st_uid} "
            f"(st_dev, st_ino)=({info.st_dev}, {info.st_ino}), the descriptor says "
            f"uid={owner_uid} (st_dev, st_ino)={tuple(identity)}; it was replaced, nothing is read"
        )


def map_segment(
    directory: str,
    name: str,
    os_facade: OsFacade = DEFAULT_OS,
    *,
    unlink: bool = True,
    made: tuple[int, tuple[int, int]] | None = None,
) -> mmap.mmap:
    """Map a published segment read-write and (by default) unlink its name at once.

    The caller owns the mapping. With `unlink` the name is gone when this
    returns, so a receiver that dies later leaves nothing in the directory;
    a receiver taking several segments at once maps them all first and
    unlinks the names only when every one is taken (`unlink_segment`), so a
    failure on a later one consumes none. With `made` (the descriptor's
    owner uid and file identity) any other file at the name is refused
    (`check_made`) before it is mapped.
    """
    path = os.path.join(directory, name)
    fd, info = open_private_file(path, os_facade, "segment")
    try:
        if made is not None:
            check_made(path, info, made)
        if info.st_size <= 0:
            raise CorruptFrameError(
                f"segment is not a non-empty regular file: path={path!r} size={info.st_size}"
            )
        mapping = os_facade.mmap(fd, info.st_size)
        if unlink:
            try:
                unlink_segment(directory, name, os_facade)
            except BaseException:
                mapping.close()
                raise
    finally:
        os_facade.close(fd)
    return mapping


def unlink_segment(directory: str, name: str, os_facade: OsFacade = DEFAULT_OS) -> None:
    """Remove a taken segment's name; already gone (another receiver) is fine."""
    with contextlib.suppress(FileNotFoundError):
        os_facade.unlink(os.path.join(directory, name))


def borrow_mapped(
    mapping: mmap.mmap, name: str, dtype: np.dtype[Any] | str, shape: tuple[int, ...]
) -> np.ndarray:
    """A borrowed view of a mapped segment; takes over `mapping` (closed when the last view dies)."""
    try:
        keep = np.frombuffer(mapping, dtype=np.uint8)
    except BaseException:
        mapping.close()
        raise
    return borrow(keep, 0, dtype, shape, mapping_to_close=mapping, label=f"segment {name}")


def copy_mapped(
    mapping: mmap.mmap, name: str, dtype: np.dtype[Any] | str, shape: tuple[int, ...]
) -> np.ndarray:
    """An independently owned copy of a mapped segment; closes `mapping`."""
    try:
        wire = np.dtype(dtype)
        count = int(np.prod(shape, dtype=np.int64))
        if count * wire.itemsize > len(mapping):
            raise CorruptFrameError(
                f"segment shorter than its payload: name={name!r} length={len(mapping)} "
                f"needed={count * wire.itemsize}"
            )
        copied = np.frombuffer(mapping, dtype=wire, count=count).reshape(shape).copy()
    finally:
        mapping.close()
    return copied


def borrow_segment(
    directory: str,
    name: str,
    dtype: np.dtype[Any] | str,
    shape: tuple[int, ...],
    os_facade: OsFacade = DEFAULT_OS,
) -> np.ndarray:
    """A borrowed view of a published segment; the mapping closes when the last view dies."""
    return borrow_mapped(map_segment(directory, name, os_facade), name, dtype, shape)


def copy_segment(
    directory: str,
    name: str,
    dtype: np.dtype[Any] | str,
    shape: tuple[int, ...],
    os_facade: OsFacade = DEFAULT_OS,
) -> np.ndarray:
    """An independently owned copy of a published segment; the mapping is closed on return."""
    return copy_mapped(map_segment(directory, name, os_facade), name, dtype, shape)


__all__ = [
    "LeaseOwner",
    "LeaseStatistics",
    "borrow",
    "borrow_mapped",
    "borrow_segment",
    "copy_mapped",
    "copy_segment",
    "lease_owner_of",
    "lease_statistics",
    "map_segment",
    "unlink_segment",
]
