"""Per-transfer registered segments and the registry that owns them.

Design rationale. A device-to-host copy runs at full speed only into
page-locked memory. The seed copied into a pinned buffer and then again into
shared memory; here the copy lands directly in a POSIX shared-memory segment
that is CUDA-registered for the duration of the copy. The lifecycle of each
segment is `shmring.spec.registration`, step for step::

    allocated -> registered -> copied -> unregistered -> published

The rules that make it safe:

* Registration bookkeeping (`RegisteredRange.registered`) is cleared only
  after the driver said the unregister succeeded. A failed unregister is
  retried once; if it fails again the range is *retained*: its mapping is
  never closed and its name never unlinked (the driver may still hold the
  pages, and a DMA into an unmapped range corrupts whatever is mapped there
  next), and the registry is *poisoned*: every later registration raises
  `RegistryPoisonedError` until the process restarts.
* A register, copy or synchronize failure unregisters what was registered
  and removes the segment: nothing is published and nothing leaks.
* A transfer of several fields publishes all of them or none.
* Only names built by `shmring.impl.names` are used
  (`registered_segment_file_name`), in the deployment directory; the
  receiver unlinks a segment's name as soon as it has mapped it, and `close`
  unlinks the names no receiver took.

Every OS call goes through the `OsFacade`, every CUDA call through the
`CudaDriver` port, so fault plans reach both.

Model steps (`shmring.spec.registration`) and where they are done here:
`process_allocate` / `process_register` / `process_copy` / `process_unregister`
/ `process_remove` / `process_publish` / `process_transfer` / `process_close`
are the `Registry` methods of the same names (`_abort` is `Registry.abort`);
`process_receive` is the receiver's (`shmring.impl.registered.transfer_receiver`); the
driver steps (`process_host_register` ...) are the drivers' (the simulated one in
`shmring.impl.registered.simulated_driver`, the real one in `shmring.impl.registered.cuda_driver`).
The copies are `shmring.impl.registered.host_copy`'s, the files `shmring.impl.registered.shm_file`'s,
the range and segment records `shmring.impl.registered.segments`'s.
"""

from __future__ import annotations

import contextlib
import errno
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ...spec.registration import (
    SEGMENT_ALLOCATED,
    SEGMENT_COPIED,
    SEGMENT_PUBLISHED,
    SEGMENT_REGISTERED,
    SEGMENT_REMOVED,
    SEGMENT_RETAINED,
    SEGMENT_UNREGISTERED,
    UNREGISTER_ATTEMPTS,
)
from ..directory import Directory
from ..errors import (
    ClosedError,
    NoSpaceError,
    RegistrationError,
    RegistryPoisonedError,
    describe_errno,
)
from ..extras import import_extra
from ..names import DEFAULT_SHM_ROOT, registered_segment_file_name
from ..os_seam import DEFAULT_OS, OsFacade
from .cuda_driver import CudaDriver
from .host_copy import (
    WIRE_DTYPES,
    copy_into_host,
    copy_source,
    copy_to_host_or_gather,
    dtype_name,
    gather_through_host,
    host_view,
    wire_dtype_of,
)

# The copy helpers, ShmFile and the segment records have their own modules;
# they are re-exported here (see __all__) for the importers that still take
# them from registration.
from .member import ScopeMember
from .segments import (
    PublishedSegment,
    RegisteredRange,
    RegisteredSegment,
    prune_taken_names,
    unlink_published,
)
from .shm_file import ShmFile

if TYPE_CHECKING:
    import torch
else:  # the `torch` extra: a MissingExtraError naming it when absent
    torch = import_extra("torch", "the registered transfer (shmring.impl.registered)")


@dataclass(frozen=True)
class RegistryStatistics:
    """Counters of one registry (a process's registered transfer path)."""

    segments_allocated: int  # segments created, ever
    segments_published: int  # segments handed to a receiver, ever
    segments_removed: int  # segments removed after a failed step, ever
    segments_retained: int  # segments kept because their unregister failed for good (now)
    ranges_registered: int  # ranges whose bookkeeping says registered now (arena included)
    unregister_retries: int  # unregisters that needed their second attempt
    poisoned: bool  # no registration until the process restarts


class Registry:
    """The registered ranges and per-transfer segments of one process.

    One registry per process is the intended use: poisoning is per registry,
    and it stands for "this process", which only a restart clears.
    """

    _closed = False
    _poison_cause: str | None = None

    def __init__(
        self,
        scope: str,
        driver: CudaDriver,
        *,
        os_facade: OsFacade = DEFAULT_OS,
        shm_root: str = DEFAULT_SHM_ROOT,
    ) -> None:
        self.scope = scope
        self.driver = driver
        self._os = os_facade
        self._shm_root = shm_root
        self._held = ScopeMember(scope, os_facade, shm_root)
        self._segments: dict[int, RegisteredSegment] = {}
        self._ranges: list[RegisteredRange] = []
        self._published_names: list[str] = []
        self._next_segment_id = 0
        self._allocated = 0
        self._published = 0
        self._removed = 0
        self._retries = 0

    # -- state -----------------------------------------------------------------

    @property
    def poisoned(self) -> bool:
        return self._poison_cause is not None

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def directory(self) -> str:
        """The deployment directory's path (for names in messages and readers).

        Opens (creates) the directory while open, as the first file would.
        """
        return self._held.path if self._closed else self.files.path

    @property
    def files(self) -> Directory:
        """Where this registry's files are created and unlinked: a verified descriptor."""
        return self._held.get()

    def segments(self) -> list[RegisteredSegment]:
        """Every segment allocated and not yet forgotten, in allocation order."""
        return list(self._segments.values())

    def retained(self) -> list[RegisteredRange]:
        return [r for r in self._ranges if r.retained]

    def statistics(self) -> RegistryStatistics:
        return RegistryStatistics(
            segments_allocated=self._allocated,
            segments_published=self._published,
            segments_removed=self._removed,
            segments_retained=len(self.retained()),
            ranges_registered=sum(1 for r in self._ranges if r.registered),
            unregister_retries=self._retries,
            poisoned=self.poisoned,
        )

    def _check_usable(self) -> None:
        if self._closed:
            raise ClosedError(f"registry is closed: scope={self.scope!r}")
        if self._poison_cause is not None:
            raise RegistryPoisonedError(
                "registry poisoned: an earlier unregister failed twice and its mapping is "
                f"retained; no registration until the process restarts (cause: {self._poison_cause})",
                self._poison_cause,
            )

    # -- ranges (also used by the arena) ------------------------------------------------

    def register_range(
        self, address: int, length: int, label: str, on_released: Callable[[], None] | None = None
    ) -> RegisteredRange:
        """Register [address, address + length) with the driver; RegistrationError on failure."""
        self._check_usable()
        entry = RegisteredRange(address, length, label, on_released)
        self.driver.host_register(address, length)
        entry.registered = True
        self._ranges.append(entry)
        return entry

    def unregister_range(self, entry: RegisteredRange) -> None:
        """Unregister, retried once; bookkeeping cleared only on success.

        After UNREGISTER_ATTEMPTS failures the range is retained, the
        registry poisoned, and RegistryPoisonedError raised: the caller must
        keep the mapping (never close, never unlink).
        """
        if not entry.registered or entry.retained:
            raise ValueError(f"range is not registered or already retained: label={entry.label!r}")
        last: RegistrationError | None = None
        for attempt in range(UNREGISTER_ATTEMPTS):
            try:
                self.driver.host_unregister(entry.address)
            except RegistrationError as error:
                last = error.with_traceback(None)
                continue
            if attempt:
                self._retries += 1
            entry.registered = False
            self._ranges.remove(entry)
            return
        assert last is not None
        entry.retained = True
        self._poison_cause = last.cuda_error
        raise RegistryPoisonedError(
            f"unregister failed {UNREGISTER_ATTEMPTS} times, mapping retained: "
            f"label={entry.label!r} error={last.cuda_error}",
            last.cuda_error,
        ) from last

    # -- segment steps (the model's process_* one for one) -------------------------------

    def allocate(self, length: int) -> RegisteredSegment:
        """`process_allocate`: create, size and map a new segment.

        OSError (NoSpaceError for ENOSPC) on failure.
        """
        self._check_usable()
        try:
            file = ShmFile(self.files, registered_segment_file_name(self._os), length, self._os)
        except OSError as error:
            if error.errno == errno.ENOSPC and not isinstance(error, NoSpaceError):
                raise NoSpaceError(
                    f"no space for a segment: length={length} ({describe_errno(errno.ENOSPC)})"
                ) from error
            raise
        segment = RegisteredSegment(self._next_segment_id, file)
        self._segments[segment.segment_id] = segment
        self._next_segment_id += 1
        self._allocated += 1
        return segment

    def register(self, segment: RegisteredSegment) -> None:
        """`process_register`: the driver registers the segment's range; RegistrationError on failure."""
        if segment.state != SEGMENT_ALLOCATED:
            raise ValueError(f"register needs an allocated segment: state={segment.state}")
        self._check_usable()
        self.driver.host_register(segment.address, segment.length)
        segment.range.registered = True
        self._ranges.append(segment.range)
        segment.state = SEGMENT_REGISTERED

    def copy(self, segment: RegisteredSegment, src: torch.Tensor) -> None:
        """`process_copy`: copy `src` (its wire bits) to the start of the segment and synchronize."""
        if segment.state != SEGMENT_REGISTERED:
            raise ValueError(f"copy needs a registered segment: state={segment.state}")
        # No local holds the destination view: a failure's traceback must not keep it alive.
        copy_into_host(self.driver, host_view(segment.file.tensor, 0, src), src)
        segment.state = SEGMENT_COPIED
        segment.copied = True

    def unregister(self, segment: RegisteredSegment) -> None:
        """`process_unregister`: retried once; on final failure the segment is retained.

        RegistryPoisonedError is raised then (the retry rule is `unregister_range`).
        """
        if segment.state not in (SEGMENT_REGISTERED, SEGMENT_COPIED):
            raise ValueError(f"unregister needs a registered segment: state={segment.state}")
        try:
            self.unregister_range(segment.range)
        except RegistryPoisonedError:
            segment.state = SEGMENT_RETAINED
            raise
        segment.state = SEGMENT_UNREGISTERED

    def remove(self, segment: RegisteredSegment) -> None:
        """`process_remove`: unmap and unlink a segment the driver does not hold (a failed transfer's)."""
        if segment.registered or segment.state not in (SEGMENT_ALLOCATED, SEGMENT_UNREGISTERED):
            raise ValueError(
                f"remove needs an unregistered, unpublished segment: state={segment.state} "
                f"registered={segment.registered}"
            )
        segment.file.unmap()
        segment.file.unlink()
        segment.state = SEGMENT_REMOVED
        del self._segments[segment.segment_id]
        self._removed += 1

    def publish(self, segments: Sequence[RegisteredSegment]) -> list[PublishedSegment]:
        """`process_publish`: hand every segment to the receiver; the producer's mapping closes."""
        bad = [
            (s.state, s.copied) for s in segments if s.state != SEGMENT_UNREGISTERED or not s.copied
        ]
        if bad:
            raise ValueError(f"publish needs copied, unregistered segments: (state, copied)={bad}")
        published = []
        for segment in segments:
            segment.file.unmap()
            segment.state = SEGMENT_PUBLISHED
            published.append(
                PublishedSegment(
                    segment.name, segment.length, segment.file.identity, segment.file.owner_uid
                )
            )
            self._remember_published(segment.name)
            del self._segments[segment.segment_id]
            self._published += 1
        return published

    def _remember_published(self, name: str) -> None:
        """Keep the name to unlink at close unless a receiver took it first."""
        self._published_names.append(name)
        self._published_names = prune_taken_names(self._published_names, self.files)

    # -- a whole transfer ------------------------------------------------------------------

    def transfer(self, sources: Sequence[torch.Tensor]) -> list[PublishedSegment]:
        """`process_transfer`: every source through the lifecycle into its own segment; all or none.

        Raises the first failure's error: OSError (allocate) or
        RegistrationError (register, copy, synchronize, unregister), as
        RegistryPoisonedError when some unregister failed for good during
        this transfer.
        """
        if not sources:
            raise ValueError("a transfer needs at least one field")
        self._check_usable()
        segments: list[RegisteredSegment] = []
        failure: BaseException | None = None
        try:
            for src in sources:
                segment = self.allocate(max(1, src.numel() * src.element_size()))
                segments.append(segment)
                self.register(segment)
                self.copy(segment, src)
        except (OSError, RegistrationError) as error:
            failure = error.with_traceback(None)
        if failure is None:
            for segment in segments:
                try:
                    self.unregister(segment)
                except RegistryPoisonedError as error:
                    failure = failure or error.with_traceback(None)
            if failure is None:
                return self.publish(segments)
        self.abort(segments)
        if self.poisoned and not isinstance(failure, RegistryPoisonedError):
            poisoned = RegistryPoisonedError(
                f"transfer failed ({failure}) and an unregister failed for good while cleaning up",
                failure.cuda_error if isinstance(failure, RegistrationError) else None,
            )
            raise poisoned from failure
        raise failure

    def abort(self, segments: Sequence[RegisteredSegment]) -> None:
        """The model's `_abort`: unregister what is registered (retry rule), remove the rest."""
        for segment in segments:
            if segment.registered and segment.state != SEGMENT_RETAINED:
                # Retained on failure; the registry is poisoned then.
                with contextlib.suppress(RegistryPoisonedError):
                    self.unregister(segment)
        for segment in segments:
            if segment.state in (SEGMENT_ALLOCATED, SEGMENT_UNREGISTERED):
                self.remove(segment)

    # -- close ---------------------------------------------------------------------------

    def close(self) -> int:
        """Release everything, as the model's `process_close`. Idempotent.

        A range retained earlier gets one more unregister; segments still
        registered are unregistered under the retry rule; the others are
        removed; published names no receiver took are unlinked. Answers how
        many ranges stay retained (their mappings are kept for the life of
        the process, their names for orphan collection).
        """
        if self._closed:
            return len(self.retained())
        for entry in self.retained():
            try:
                self.driver.host_unregister(entry.address)
            except RegistrationError:
                continue
            entry.registered = False
            entry.retained = False
            self._ranges.remove(entry)
            if entry.on_released is not None:
                entry.on_released()
        for segment in list(self._segments.values()):
            if segment.state in (SEGMENT_REGISTERED, SEGMENT_COPIED):
                with contextlib.suppress(RegistryPoisonedError):  # retained then
                    self.unregister(segment)
        for segment in list(self._segments.values()):
            if segment.state in (SEGMENT_ALLOCATED, SEGMENT_UNREGISTERED):
                self.remove(segment)
            elif segment.state == SEGMENT_REMOVED:
                del self._segments[segment.segment_id]
        unlink_published(self._published_names, self._held)
        self._published_names = []
        self._closed = True
        retained = len(self.retained())
        if not retained:  # a retained file keeps its directory descriptor (unlinked through it)
            self._held.close()  # leaves the scope: the last member out removes the directory
        return retained

    def __enter__(self) -> Registry:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = [
    "WIRE_DTYPES",
    "PublishedSegment",
    "RegisteredRange",
    "RegisteredSegment",
    "Registry",
    "RegistryStatistics",
    "ShmFile",
    "copy_into_host",
    "copy_source",
    "copy_to_host_or_gather",
    "gather_through_host",
    "dtype_name",
    "host_view",
    "prune_taken_names",
    "unlink_published",
    "wire_dtype_of",
]
