"""How a producer's ring ends: `close`, and a file a neighbour unlinked or truncated (issue 22).

`ChannelClosing` is the end of `RingChannel`'s file, each a method here:
`close` (`spec.ring.process_close`: CLOSED first, then every unclaimed
frame retired, unmapped, unlinked); `file_problem`, which tells a ring
whose file a same-uid neighbour unlinked or truncated; `evacuate` (an
unlinked file's unclaimed frames moved out under the claim lock) and
`discard_shrunk` (a truncated one dropped untouched); `_teardown`, the
unmap and the unlink a failed one retries at the next close.
"""

from __future__ import annotations

import logging
import struct
from typing import TYPE_CHECKING

from ...spec.layout import (
    FRAME_KEY_OFFSET,
    FRAME_STATE_PUBLISHED,
    FRAME_STATE_RETIRED,
    RING_STATE_CLOSED,
    compute_ring_file_length,
)
from ..errors import ShmringError
from ..frame_io import (
    bump_wakeup_sequence_release,
    load_frame_state_acquire,
    store_frame_state_release,
    store_ring_state_release,
)
from ..lifecycle import signals_deferred
from ..locks import PRODUCER_LOCK_WAIT_SECONDS, lock_exclusive_within
from .frames import RING_FILE, load_frame_fields, read_checked_ring_header
from .mapping import (
    _UNLOCK,
    _data_offset,
    _RingFile,
)

logger = logging.getLogger("shmring.ring")


class ChannelClosing(_RingFile):
    """The end of `RingChannel`'s ring and file (see the module docstring)."""

    _unlink_pending: bool = False
    unlink_failures: int = 0  # unlinks of the ring file that failed (each retried at a later close)
    close_problems: int = 0  # corrupt contents close met (logged; never raised)
    # The producer engine's (`engine.RingProducer`).
    _closed: bool
    _published: dict[str, int]
    _deferred: list[tuple[str, int]]

    if TYPE_CHECKING:  # `engine.RingProducer` defines it

        def _retire_positions(
            self, candidates: list[tuple[str, int]], closing: bool = False
        ) -> int: ...

    # -- a file a neighbour unlinked or truncated (issue 22) -------------------------

    def file_problem(self) -> str | None:
        """Why this ring's file no longer carries frames, or None; one fstat.

        A same-uid neighbour may unlink the file (readers then never find
        what is published: defect 4) or truncate it (touching the mapping
        is then SIGBUS: defect 3). The connector asks before each put and
        replaces the ring (`RingRoute.replace`).
        """
        if self._fd < 0:
            return None
        try:
            info = self._os.fstat(self._fd)
        except OSError:
            return None  # cannot tell (an injected fault): the put goes on as before
        if info.st_size < self._file_length:
            return (
                f"ring file shrank under its mapping (a neighbour truncated it): "
                f"size={info.st_size} mapped={self._file_length} path={self.path!r}"
            )
        if info.st_nlink == 0:
            return f"ring file was unlinked by a neighbour: path={self.path!r}"
        return None

    @signals_deferred
    def evacuate(self) -> tuple[list[tuple[str, bytes, int]], int]:
        """Close a ring whose file was unlinked and answer (its unclaimed frames, frames lost).

        The frames are (key, payload, position) in publication order, each retired
        here under the ring lock, so a reader of the old mapping never
        claims one that is re-put elsewhere. CLOSED is stored first (no
        claim starts); past `PRODUCER_LOCK_WAIT_SECONDS` of another holder
        nothing is moved and the unclaimed frames count as lost. The name
        is never unlinked: it is gone, or a new ring's. A truncated file is
        never touched (`file_problem` first): every frame counts as lost.
        """
        if self._fd >= 0 and self._shrunk_now():
            return [], self.discard_shrunk()
        published = sorted(self._published.items(), key=lambda item: item[1])
        self._closed = True
        self._published.clear()
        self._deferred.clear()
        self._unlink_pending = False
        moved: list[tuple[str, bytes, int]] = []
        lost = len(published)
        try:
            buf, words = self._buf, self._words
            if buf is None or words is None:
                return moved, lost
            store_ring_state_release(words, RING_STATE_CLOSED)
            bump_wakeup_sequence_release(words)
            if not published or not lock_exclusive_within(
                self._os, self._fd, PRODUCER_LOCK_WAIT_SECONDS
            ):
                return moved, lost
            try:
                capacity = self._capacity
                for key, position in published:
                    offset = _data_offset(position, capacity)
                    if load_frame_state_acquire(words, offset) != FRAME_STATE_PUBLISHED:
                        lost -= 1  # claimed meanwhile: delivered, not lost
                        continue
                    key_length, payload_length = load_frame_fields(buf, offset, capacity)[3:5]
                    start = offset + FRAME_KEY_OFFSET + key_length
                    moved.append((key, bytes(buf[start : start + payload_length]), position))
                    store_frame_state_release(words, offset, FRAME_STATE_RETIRED)
                    lost -= 1
            finally:
                self._os.flock(self._fd, _UNLOCK)
            return moved, lost
        finally:
            self._teardown()

    @signals_deferred
    def discard_shrunk(self) -> int:
        """Drop a ring whose file shrank, never touching the mapping; answer the frames lost.

        The name is unlinked only while it still names this file.
        """
        lost = len(self._published)
        self._closed = True
        self._published.clear()
        self._deferred.clear()
        if self._unlink_pending and self._fd >= 0:
            try:
                here = self._dir.stat(self.path)
                mine = self._os.fstat(self._fd)
                if (here.st_dev, here.st_ino) != (mine.st_dev, mine.st_ino):
                    self._unlink_pending = False  # the name is someone else's now
            except FileNotFoundError:
                self._unlink_pending = False
            except OSError:
                pass  # cannot tell: unlinked by name as any close would
        self._teardown(defer_unlink=True)
        return lost

    # -- close -----------------------------------------------------------------

    @signals_deferred
    def close(self) -> int:
        """Mark the ring CLOSED, retire everything unclaimed, unmap, unlink.

        Answers how many frames it retired (0 when already closed), like
        `process_close`. The CLOSED mark comes first, so readers stop
        claiming even if retiring fails (a fault in the lock, say); a reader
        already holding the lock finishes its claim first, which orders that
        claim before the close. Idempotent; a failed unlink never escapes:
        the file is kept (`unlink_pending`) and the next close retries it.
        Readers keep their own mappings and see a CLOSED ring.
        """
        if self._closed:
            self._teardown(defer_unlink=True)
            return 0
        if self._fd >= 0 and self._shrunk_now():
            self.discard_shrunk()  # truncated by a neighbour: touching it would be SIGBUS
            return 0
        self._closed = True
        retired = 0
        try:
            buf = self._buf
            words = self._words
            if buf is not None:
                self._report_overwritten_header(buf)
                store_ring_state_release(words, RING_STATE_CLOSED)
                bump_wakeup_sequence_release(words)
                # Frames an earlier retire left (a busy lock) are retired with the rest.
                pending = [*self._published.items(), *self._deferred]
                self._deferred.clear()
                retired = self._retire_positions(pending, closing=True)
        except (ValueError, OverflowError, IndexError, struct.error, ShmringError) as error:
            # Issue 22, defect 7: contents a neighbour scribbled never make close
            # raise; the CLOSED mark (first) and the unlink (below) still happen.
            self.close_problems += 1
            logger.warning(
                "shmring: could not retire the frames of ring %s (its contents are corrupt: "
                "%s); the file is removed anyway",
                self.path,
                error,
            )
        finally:
            self._published.clear()
            self._teardown(defer_unlink=True)
        return retired

    def _report_overwritten_header(self, buf: memoryview) -> None:
        """Log (and count) a header that no longer says what `create` wrote (issue 22)."""
        _, problem = read_checked_ring_header(
            buf, compute_ring_file_length(self._capacity), RING_FILE
        )
        if problem is not None:
            self.close_problems += 1
            logger.warning(
                "shmring: ring %s: its header was overwritten (%s); could not trust it, "
                "so close retires the frames this producer recorded and removes the file",
                self.path,
                problem,
            )

    @property
    def unlink_pending(self) -> bool:
        """The ring file is still linked: its unlink failed and the next close retries it."""
        return self._unlink_pending

    def _teardown(self, defer_unlink: bool = False) -> None:
        try:
            self._release_mapping()
        finally:
            if self._unlink_pending:
                try:
                    self._dir.unlink(self.path)
                except FileNotFoundError:
                    pass
                except OSError:
                    if not defer_unlink:
                        raise
                    self.unlink_failures += 1
                    return  # kept; the next close retries
                self._unlink_pending = False
