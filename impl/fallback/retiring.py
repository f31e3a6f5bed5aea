"""The fallback writer's retires: a segment taken back, at once or later (`reap`).

Waits are bounded (issue 27, `impl.locks`): a retire whose segment another
process keeps locked past the producer's bound, or whose unlink fails, marks
the segment retired in its frame state and leaves the unlink to `reap`,
retried with a back-off, never raised. `FallbackWriter` (writer.py) is the
one class using this; the retire is `spec.connector`'s retire of a key's
fallback version.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from ...spec.layout import FRAME_KEY_OFFSET, FRAME_STATE_RETIRED, RING_HEADER_LENGTH
from ...spec.ring import is_prefix_match
from ..directory import Directory
from ..frame_io import SharedWords, store_frame_state_release
from ..lifecycle import signals_deferred
from ..names import Edge
from ..os_seam import OPEN_FLAGS_EXISTING, OsFacade
from .segment import BUSY, close_locked, open_locked

if TYPE_CHECKING:
    from .writer import SegmentRecord

# A deferred removal is tried again after this long, doubling up to the most.
_REAP_FIRST_DELAY: Final = 0.1
_REAP_MAX_DELAY: Final = 5.0


@dataclass
class Deferred:
    """A retired segment whose file is still at its name (locked past the bound, or unlink failed)."""

    path: str
    inode: tuple[int, int]  # (st_dev, st_ino) of our file: never remove another one
    length: int  # its charged bytes (no longer in the budget: it is retired)
    attempts: int = 0  # removals tried after the first
    next_try: float = 0.0  # monotonic time of the next try


class Retiring:
    """The retire steps of `FallbackWriter` (which owns the state named here)."""

    _dir: Directory
    _os: OsFacade
    _segments: dict[tuple[Edge, str], SegmentRecord]
    _used: int
    _retired: int
    _claimed: int
    _deferred: dict[str, Deferred]  # path -> retired segment still to remove
    _deferred_total: int
    _unlink_failures: int
    _unlink_retries: int

    if TYPE_CHECKING:

        def _forget_spare(self, generation: int) -> None: ...

    @signals_deferred
    def _retire(self, slot: tuple[Edge, str]) -> int:
        """Retire our unclaimed segment of `slot`; 0 when a reader claimed it first.

        Never waits past the producer's bound: a segment locked longer, or
        whose unlink fails, is marked retired and removed later (`reap`).
        """
        record = self._segments.get(slot)
        if record is None:
            return 0
        held = open_locked(self._dir, record.path, self._os, wait=True)
        retired = 0
        if held is BUSY:
            retired = self._mark_retired(record, None)
        elif held is not None:
            try:
                info = self._os.fstat(held)
                if (info.st_dev, info.st_ino) == record.inode:
                    retired = 1
                    self._forget_spare(record.generation)
                    try:
                        self._dir.unlink(record.path)
                    except FileNotFoundError:
                        pass
                    except OSError:
                        self._unlink_failures += 1
                        self._mark_retired(record, held)
            finally:
                close_locked(self._os, held)
        del self._segments[slot]
        self._used -= record.length
        if retired:
            self._retired += 1
        else:
            self._claimed += 1
        return retired

    def _mark_retired(self, record: SegmentRecord, held: int | None) -> int:
        """Store RETIRED in our segment's frame state and defer its removal; answer 1 (0: gone).

        `held`: the locked descriptor (the unlink failed), or None: another
        process holds the lock, and the store goes without it. A reader
        claiming it afterwards finds it retired (and removes it); one whose
        claim was already under way may still complete it (that get began
        before this retire).
        """
        try:
            fd = self._dir.open(record.path, OPEN_FLAGS_EXISTING)
        except FileNotFoundError:
            return 0  # claimed meanwhile
        try:
            info = self._os.fstat(fd)
            if (info.st_dev, info.st_ino) != record.inode:
                return 0  # claimed, and the name is another segment's now
            mapping = self._os.mmap(fd, RING_HEADER_LENGTH + FRAME_KEY_OFFSET)
            try:
                with memoryview(mapping) as buf:
                    words = SharedWords(buf)
                    try:
                        store_frame_state_release(words, RING_HEADER_LENGTH, FRAME_STATE_RETIRED)
                    finally:
                        words.release()
            finally:
                mapping.close()
        finally:
            self._os.close(fd)
        self._forget_spare(record.generation)
        self._deferred[record.path] = Deferred(
            record.path, record.inode, record.length, next_try=time.monotonic() + _REAP_FIRST_DELAY
        )
        self._deferred_total += 1
        return 1

    @signals_deferred
    def reap(self, force: bool = False) -> int:
        """Remove retired segments left for later (never waits); answer how many went.

        Each is tried again after a back-off (`force`: now, as close does);
        a file no longer ours at its name (a reader removed it) is forgotten.
        """
        removed = 0
        now = time.monotonic()
        for path, deferred in sorted(self._deferred.items()):
            try:
                info = self._dir.stat(path)
                gone = (info.st_dev, info.st_ino) != deferred.inode
            except FileNotFoundError:
                gone = True
            except OSError:
                gone = False
            if gone:  # a reader removed it, or the name is another segment's: forgotten
                del self._deferred[path]
                removed += 1
                continue
            if not force and now < deferred.next_try:
                continue
            held = open_locked(self._dir, path, self._os, wait=False)
            if held is None:
                del self._deferred[path]  # gone: a reader removed it under its lock
                removed += 1
                continue
            if held is not BUSY:
                try:
                    info = self._os.fstat(held)
                    if (info.st_dev, info.st_ino) != deferred.inode:
                        del self._deferred[path]  # the name is another segment's
                        removed += 1
                        continue
                    self._unlink_retries += 1
                    try:
                        self._dir.unlink(path)
                    except FileNotFoundError:
                        pass
                    except OSError:
                        self._unlink_failures += 1
                    else:
                        del self._deferred[path]
                        removed += 1
                        continue
                finally:
                    close_locked(self._os, held)
            deferred.attempts += 1
            delay = min(_REAP_FIRST_DELAY * 2 ** (deferred.attempts - 1), _REAP_MAX_DELAY)
            deferred.next_try = now + delay
        return removed

    def retire(self, edge: Edge, key: str) -> int:
        """Retire the key's unclaimed segment on `edge`; answer 0 or 1."""
        return self._retire((edge, key))

    def retire_key(self, key: str) -> int:
        """Retire the key's unclaimed segments on every edge."""
        return sum(self._retire(slot) for slot in sorted(self._segments) if slot[1] == key)

    def retire_prefix(self, prefix: str) -> int:
        """Retire every unclaimed segment whose key is `prefix` + digits, on every edge."""
        slots = [slot for slot in sorted(self._segments) if is_prefix_match(prefix, slot[1])]
        return sum(self._retire(slot) for slot in slots)
