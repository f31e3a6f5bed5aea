"""The deployment's stamp and doorbell: `spec.discovery`'s DirectoryState.stamp, mapped.

Design rationale. The stamp is a u64 counter in the small file ``stamp``
(layout: `spec.layout`, discovery stamp file). Writers (a producer
registering or leaving, a receiver pruning) change it under an exclusive
`flock` of that file with read, add one, store. Readers map the file and
load the counter with one aligned 8-byte load: an unchanged poll costs no
system call, no lock and no directory scan. A counter, unlike a directory
mtime, moves even when the clock does not. Every change of the markers is
followed by a bump, so a receiver that read stamp s before its scan and sees
s again afterwards knows the marker set it scanned is still current.

Per-stage doorbells (issue 27). The same file holds a bell per destination
stage (layout: `spec.layout`, the stamp file's stage bells): a put to stage
s bumps s's bell after it publishes, when some receiver of s said it waits
(the slot's interest count), so a receiver sleeps until traffic to its own
stage and is not woken by every put of the deployment. Every receiver of a
stage reads the same word, each against its own snapshot, so all of them
see every wake-up whatever the others do; one that joins later (a
replacement) shares it too. `StageBell` is one stage's view.

Every system call goes through the `OsFacade` the caller gives.
"""

from __future__ import annotations

import contextlib
import fcntl
import mmap
import os
import time
from collections.abc import Callable, Iterable
from typing import Final

from ...spec.layout import (
    DOORBELL_OFFSET,
    DOORBELL_WAITERS_OFFSET,
    STAGE_BELL_INTEREST_OFFSET,
    STAGE_BELL_LENGTH,
    STAGE_BELL_WORD_OFFSET,
    STAGE_BELLS_OFFSET,
    STAMP_FILE_LENGTH,
    STAMP_OFFSET,
    compute_stage_bell_slot,
)
from .. import futex
from ..directory import Directory, as_directory, check_private_file
from ..errors import BrokenError, ClosedError
from ..frame_io import u64_words
from ..futex import FutexWord, fresh_value, full_fence
from ..lifecycle import signals_deferred
from ..names import STAMP_FILE_NAME
from ..os_seam import FILE_MODE, OPEN_FLAGS_EXISTING, OsFacade

_STAMP_WORD: Final = STAMP_OFFSET // 8  # the stamp's index in the file's u64 words


class Stamp:
    """The deployment's strictly increasing directory stamp, mapped.

    `load` is one shared-memory load. `bump` and `prune_and_bump` take the
    stamp file's exclusive lock; `bump` waits for it (producers), the
    receiver's `prune_and_bump` does not.

    The same file holds the deployment's *doorbell*: a futex word every
    connector rings after it publishes (ring frame, fallback segment, retire,
    new producer), so a blocked receive sleeps in the kernel instead of
    polling and wakes as soon as anything may have arrived (`doorbell`,
    `wait`, `ring`), and the count of receivers asleep on it, so that a
    ring costs a system call only when one sleeps (issue 23).
    """

    _fd: int = -1
    _mapping: mmap.mmap | None = None
    _buf: memoryview | None = None
    _doorbell: FutexWord | None = None
    _waiters: FutexWord | None = None  # receivers asleep on the doorbell
    # The fence `ring` makes between its store and the waiter count's load; the
    # interleaving explorer's doorbell world puts its own in (a drain of the
    # actor's store buffer), as it puts its words in: a production stamp keeps this.
    _fence: Callable[[], None] = staticmethod(full_fence)

    def __init__(self, path: str, os_facade: OsFacade) -> None:
        self.path = path
        self._os = os_facade
        self._stage_bells: dict[str, StageBell] = {}  # destination stage -> its bell

    @classmethod
    def open(cls, directory: str | Directory, os_facade: OsFacade) -> Stamp:
        """Open (creating if needed) the stamp file of `directory` and map it."""
        directory = as_directory(directory, os_facade)
        stamp = cls(directory.join(STAMP_FILE_NAME), os_facade)
        try:
            stamp._fd = directory.open(STAMP_FILE_NAME, OPEN_FLAGS_EXISTING | os.O_CREAT, FILE_MODE)
            info = os_facade.fstat(stamp._fd)
            problem = check_private_file(stamp.path, info)
            if problem is not None:
                raise BrokenError(f"stamp file is not trusted: {problem}")
            if info.st_size < STAMP_FILE_LENGTH:
                # Whoever creates it sizes it; a concurrent opener doing the
                # same extends with zeros too, so the counter starts at 0.
                os_facade.ftruncate(stamp._fd, STAMP_FILE_LENGTH)
            stamp._mapping = os_facade.mmap(stamp._fd, STAMP_FILE_LENGTH)
            with memoryview(stamp._mapping) as raw:
                # u64 items: one load or store each (struct would zero-fill, then write bytes)
                stamp._buf = u64_words(raw)
            if futex.AVAILABLE:
                stamp._doorbell = FutexWord(stamp._mapping, DOORBELL_OFFSET)
                stamp._waiters = FutexWord(stamp._mapping, DOORBELL_WAITERS_OFFSET)
        except BaseException:
            # Never replace what propagates (issue 24): a view the stopped frame still
            # exports keeps the mapping until that frame goes; the descriptor closes now.
            try:
                stamp.close()
            except BufferError:
                fd, stamp._fd = stamp._fd, -1
                if fd >= 0:
                    with contextlib.suppress(OSError):
                        os_facade.close(fd)
            raise
        return stamp

    def load(self) -> int:
        """The current stamp (acquire); no system call."""
        buf = self._buf
        if buf is None:
            raise ClosedError(f"stamp is closed: path={self.path!r}")
        value: int = buf[_STAMP_WORD]
        return value

    @signals_deferred
    def bump(self) -> int:
        """Advance the stamp by one under its lock; answer the new value."""
        buf = self._buf
        if buf is None:
            raise ClosedError(f"stamp is closed: path={self.path!r}")
        try:
            # Taken inside the try: an exception from a signal handler the
            # moment flock returns still unlocks (a lock left held on this
            # descriptor blocked the process's next bump on another one for
            # good: issue 24's storm). Unlocking an unheld lock is a no-op.
            self._os.flock(self._fd, fcntl.LOCK_EX)
            value: int = buf[_STAMP_WORD] + 1
            buf[_STAMP_WORD] = value
        finally:
            self._os.flock(self._fd, fcntl.LOCK_UN)
        self.ring()
        return value

    def doorbell(self) -> int | None:
        """The doorbell's value (None without futexes); read it *before* looking for work."""
        doorbell = self._doorbell
        return doorbell.load() if doorbell is not None else None

    def ring(self) -> None:
        """After a publication: a fresh doorbell value, and a wake-up if a receiver sleeps.

        The value is a plain store (`futex.fresh_value`: never the value
        just overwritten, so every receiver comparing with what it read sees
        the ring, and nothing counts to be lost between racing producers);
        spinning receivers see it within a load. The full fence orders it
        (and the publication before it) before the load of the waiter
        count; a receiver adds itself to the count (atomically: a fence of
        its own) before the kernel compares the doorbell with what it read,
        so either it sees the new value and does not sleep, or this load
        sees it counted and the FUTEX_WAKE wakes it. The same fence orders
        the publication before a stage bell's interest load (the put path
        rings the doorbell first).
        """
        doorbell = self._doorbell
        if doorbell is None:
            return
        try:
            doorbell.store(fresh_value(doorbell.load()))
        except ValueError:  # closed under us
            return
        self._fence()
        waiters = self._waiters
        if waiters is not None and waiters.load():
            doorbell.wake()

    def spin(self, seen: int, seconds: float) -> bool:
        """Busy-wait (bounded: `seconds`) until the doorbell moves past `seen`; answer whether it did."""
        doorbell = self._doorbell
        return doorbell.spin_while(seen, seconds) if doorbell is not None else True

    def wait(self, seen: int | None, timeout: float) -> None:
        """Sleep until the doorbell moves past `seen`, or `timeout` seconds.

        Without futexes (`seen` is None), sleeps `timeout`; callers keep the
        timeout short then.
        """
        doorbell, waiters = self._doorbell, self._waiters
        if doorbell is None or waiters is None or seen is None:
            time.sleep(max(timeout, 0.0))
            return
        waiters.add(1)  # before the kernel's compare: a ring from now on wakes us (`ring`)
        try:
            doorbell.wait(seen, timeout)
        finally:
            waiters.add(-1)

    def prune_and_bump(
        self, directory: str | Directory, names: Iterable[str], scanned_at: int
    ) -> int | None:
        """Unlink stale marker `names` and bump once, without waiting for the lock.

        Answers the stamp a receiver may cache afterwards: the new value when
        nothing else changed since `scanned_at` (the stamp it read before
        scanning), otherwise `scanned_at` itself, so that the next refresh
        rescans. None when the lock was busy (nothing pruned; retried at a
        later scan).
        """
        buf = self._buf
        if buf is None:
            raise ClosedError(f"stamp is closed: path={self.path!r}")
        try:
            self._os.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return None
        where = as_directory(directory, self._os)
        try:
            before: int = buf[_STAMP_WORD]
            for name in names:
                with contextlib.suppress(FileNotFoundError):
                    where.unlink(name)
            value = before + 1
            buf[_STAMP_WORD] = value
        finally:
            self._os.flock(self._fd, fcntl.LOCK_UN)
        self.ring()
        return value if before == scanned_at else scanned_at

    def stage_bell(self, stage: str) -> StageBell | None:
        """The bell of destination `stage` (None without futexes, or once closed)."""
        bell = self._stage_bells.get(stage)
        if bell is None:
            mapping = self._mapping
            if mapping is None or not futex.AVAILABLE:
                return None
            bell = StageBell(mapping, compute_stage_bell_slot(stage))
            self._stage_bells[stage] = bell
        return bell

    @signals_deferred
    def close(self) -> None:
        """Unmap and close. Idempotent; never unlinks (see `Membership.leave`)."""
        bells, self._stage_bells = self._stage_bells, {}
        for bell in bells.values():
            bell.close()
        for word in (self._doorbell, self._waiters):
            if word is not None:
                word.close()
        self._doorbell = self._waiters = None
        buf, self._buf = self._buf, None
        if buf is not None:
            buf.release()
        mapping, self._mapping = self._mapping, None
        if mapping is not None:
            mapping.close()
        fd, self._fd = self._fd, -1
        if fd >= 0:
            self._os.close(fd)


class StageBell:
    """One destination stage's doorbell in the stamp file: its futex word and interest count.

    A producer calls `ring` after each publication to the stage: it bumps
    the word (waking its sleepers) only when `interest` is not zero. A
    receiver calls `register` once (before its first snapshot: a put whose
    ring saw no interest published before the snapshot, so the poll after
    it finds the payload), reads `value` before polling and sleeps in
    `wait`; `unregister` at close. Closed with its stamp.
    """

    _word: FutexWord | None = None
    _interest: FutexWord | None = None

    def __init__(self, mapping: mmap.mmap, slot: int) -> None:
        offset = STAGE_BELLS_OFFSET + slot * STAGE_BELL_LENGTH
        self.slot = slot
        self._word = FutexWord(mapping, offset + STAGE_BELL_WORD_OFFSET)
        self._interest = FutexWord(mapping, offset + STAGE_BELL_INTEREST_OFFSET)

    def value(self) -> int | None:
        """The bell's value (None once closed); read it *before* looking for work."""
        word = self._word
        try:
            return word.load() if word is not None else None
        except ValueError:
            return None

    def ring(self) -> None:
        """After a publication to the stage: wake its receivers, if any waits."""
        interest, word = self._interest, self._word
        if interest is not None and word is not None and interest.load():
            word.bump_and_wake()

    def wake(self) -> None:
        """Bump the bell whatever the interest (a cohort's commit, tests)."""
        word = self._word
        if word is not None:
            word.bump_and_wake()

    def register(self) -> None:
        """Count one more receiver waiting on this stage."""
        interest = self._interest
        if interest is not None:
            interest.add(1)

    def unregister(self) -> None:
        """Count one receiver less (each `register` undone once)."""
        interest = self._interest
        if interest is not None and interest.load():
            interest.add(-1)

    def wait(self, seen: int, timeout: float) -> None:
        """Sleep until the bell moves past `seen`, or `timeout` seconds."""
        word = self._word
        if word is not None:
            word.wait(seen, timeout)

    def close(self) -> None:
        """Drop the exports of the stamp's mapping (before it is closed). Idempotent."""
        for word in (self._word, self._interest):
            if word is not None:
                word.close()
        self._word = self._interest = None


__all__ = ["StageBell", "Stamp"]
