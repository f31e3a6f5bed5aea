"""What a registry records: its registered ranges, its per-transfer segments, the names it published.

`RegisteredRange` is the bookkeeping of one host range the driver was asked
to register (the arena's as well as a segment's), `RegisteredSegment` one
per-transfer segment with its `shmring.spec.registration` state, and
`PublishedSegment` what the receiver needs to map one. A producer keeps the
names it published so that close unlinks the ones no receiver took
(`prune_taken_names`, `unlink_published`). The lifecycle and its rules are
`shmring.impl.registered.registration`'s, which re-exports everything here.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from ...spec.registration import SEGMENT_ALLOCATED, SEGMENT_REMOVED
from ..directory import Directory
from .member import ScopeMember
from .shm_file import ShmFile

# Published names a producer remembers before it checks which receivers took.
_PUBLISHED_NAMES_PRUNE_AT: Final = 256


def prune_taken_names(names: list[str], directory: Directory) -> list[str]:
    """Drop the published names receivers already unlinked, once the list is long."""
    if len(names) < _PUBLISHED_NAMES_PRUNE_AT:
        return names
    kept = []
    for name in names:
        try:
            directory.stat(name)
        except FileNotFoundError:
            continue
        kept.append(name)
    return kept


def unlink_published(names: list[str], held: ScopeMember) -> None:
    """Unlink the names no receiver took, through the held descriptor (never by path)."""
    directory = held.current()
    if directory is None:
        return
    for name in names:
        with contextlib.suppress(FileNotFoundError):
            directory.unlink(name)


# -- registered ranges and segments ------------------------------------------------------


class RegisteredRange:
    """Bookkeeping for one host range a registry asked the driver to register.

    `registered` is True from a successful register until a successful
    unregister and is never cleared otherwise; `retained` is set when the
    unregister failed for good (the owner must then keep the mapping).
    """

    def __init__(
        self, address: int, length: int, label: str, on_released: Callable[[], None] | None = None
    ) -> None:
        self.address = address
        self.length = length
        self.label = label
        self.registered = False
        self.retained = False
        # Run when a retained range is finally unregistered (at registry close):
        # the owner may then close and unlink its mapping.
        self.on_released = on_released


class RegisteredSegment:
    """One per-transfer segment on the producer side, with its lifecycle state.

    `state` is one of the `shmring.spec.registration` SEGMENT_* names. The
    producer owns the mapping until publish; after publish the receiver owns
    the memory (it maps it by name and unlinks the name).
    """

    def __init__(self, segment_id: int, file: ShmFile) -> None:
        self.segment_id = segment_id
        self.file = file
        self.range = RegisteredRange(file.address, file.length, file.name, self._released_at_close)
        self.state = SEGMENT_ALLOCATED
        self.copied = False  # the copy completed; only copied segments are published

    def _released_at_close(self) -> None:
        """A retained segment's late unregister succeeded: now it may go."""
        self.file.unmap()
        self.file.unlink()
        self.state = SEGMENT_REMOVED

    @property
    def name(self) -> str:
        return self.file.name

    @property
    def path(self) -> str:
        return self.file.path

    @property
    def length(self) -> int:
        return self.file.length

    @property
    def address(self) -> int:
        return self.file.address

    @property
    def registered(self) -> bool:
        return self.range.registered

    @property
    def mapped(self) -> bool:
        return self.file.mapped

    @property
    def linked(self) -> bool:
        return self.file.linked


@dataclass(frozen=True)
class PublishedSegment:
    """What the receiver needs to map a published segment."""

    name: str  # file name in the deployment directory (no path)
    length: int  # file length in bytes
    identity: tuple[int, int]  # the file's (st_dev, st_ino), checked by the receiver
    owner_uid: int  # the file's owner, checked by the receiver


__all__ = [
    "PublishedSegment",
    "RegisteredRange",
    "RegisteredSegment",
    "prune_taken_names",
    "unlink_published",
]
