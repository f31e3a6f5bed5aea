"""The host ring's reader, `RingReader` (see `shmring.impl.ring` for the rationale)."""

from __future__ import annotations

import errno
import stat
from collections import deque
from collections.abc import Callable
from typing import Any

from ...spec.index import ReaderIndex
from ...spec.layout import (
    DATA_FRAME_TYPE,
    FRAME_ALIGNMENT,
    FRAME_HEADER_LENGTH,
    FRAME_STATE_CLAIMED,
    FRAME_STATE_DONE,
    FRAME_STATE_PUBLISHED,
    RING_HEADER_LENGTH,
    RING_STATE_CLOSED,
    RING_STATE_OPEN,
)
from ...spec.ring import (
    ConsumeMode,
)
from ..directory import Directory, check_private_file
from ..errors import (
    ClosedError,
    CorruptFrameError,
    ProducerGoneError,
)
from ..frame_io import (
    SharedWords,
    load_head_acquire,
    load_ring_state_acquire,
    load_tail_acquire,
    load_wakeup_sequence_acquire,
    store_frame_state_release,
)
from ..lifecycle import deferred_signals, signals_deferred
from ..os_seam import (
    DEFAULT_OS,
    OPEN_FLAGS_EXISTING,
    OsFacade,
)
from .claim import ReaderClaim
from .frames import (
    RING_FILE,
    frame_problem,
    load_frame_fields,
    load_positions,
    read_checked_ring_header,
    walk_frames,
)
from .mapping import (
    _PAGE_SIZE,
    _data_offset,
    _FrameShapes,
)
from .results import (
    _NOT_FOUND,
    _STALE,
    Received,
    RingStatistics,
)

# -- reader --------------------------------------------------------------------


class RingReader(ReaderClaim):
    """The reader side of one ring: maps an existing ring file without owning it.

    Attach with `RingReader.attach`. Never unlinks the file and never touches
    Python's resource tracker (it uses plain open/mmap, not
    `multiprocessing.shared_memory`). `get` follows `spec.ring.process_get`,
    plus BUSY when another process holds the ring lock; its claim step is
    `claim.ReaderClaim`'s.
    """

    def __init__(self, path: str, os_facade: OsFacade, directory: Directory | None = None) -> None:
        super().__init__(path, os_facade, directory)
        self.producer: tuple[int, int] = (0, 0)  # (pid, start time) from the ring header
        self.instance = 0  # the producer's connector instance, from the ring header
        # The index, `spec.index.ReaderIndex` (docs/protocol.md, "Finding a key").
        self._seen_head = 0  # head at the last complete scan: a get scans only when head moved
        self._scanned_to = 0  # a frame boundary; every frame below it was seen by a scan
        # key bytes -> position of the newest frame of the key a scan saw PUBLISHED.
        # Only a candidate: a claim reads the frame header there and checks it.
        self._index: dict[bytes, int] = {}
        # The entries in scan order, to drop those the tail passed (two deques, no tuples).
        self._order_positions: deque[int] = deque()
        self._order_keys: deque[bytes] = deque()
        self._gets = 0
        self._busy = 0
        self._skipped = 0
        # Why this reader dropped its mapping: the file shrank under it (issue 22).
        self.shrunk: str | None = None
        self.identity: tuple[int, int] = (0, 0)  # (st_dev, st_ino) of the file mapped

    @classmethod
    def attach(
        cls, path: str, *, os_facade: OsFacade = DEFAULT_OS, directory: Directory | None = None
    ) -> RingReader:
        """Map the ring file at `path` read-write and validate its header.

        CorruptFrameError: not a regular file of ours (a symlink included),
        or the header is not a valid ring header. ProducerGoneError: the file
        is gone, or its producer closed the ring.
        """
        reader = cls(path, os_facade, directory)
        try:
            reader._fd = reader._dir.open(path, OPEN_FLAGS_EXISTING)
        except FileNotFoundError as error:
            raise ProducerGoneError(f"ring file is gone: path={path!r}") from error
        except OSError as error:
            if error.errno == errno.ELOOP:
                raise CorruptFrameError(f"ring path is a symlink: path={path!r}") from error
            raise
        try:
            reader._map_and_validate()
        except BaseException:
            reader._release_mapping()
            raise
        return reader

    def _map_and_validate(self) -> None:
        path = self.path
        info = self._os.fstat(self._fd)
        if not stat.S_ISREG(info.st_mode):
            raise CorruptFrameError(f"ring path is not a regular file: path={path!r}")
        untrusted = check_private_file(path, info)  # ours, 0600: before any byte is read
        if untrusted is not None:
            raise CorruptFrameError(f"ring file is not trusted: {untrusted}")
        size = info.st_size
        if size < RING_HEADER_LENGTH:
            raise CorruptFrameError(f"ring file shorter than its header: size={size} path={path!r}")
        self._file_length = size
        self.identity = (info.st_dev, info.st_ino)
        self._mapping = self._os.mmap(self._fd, size)
        buf = self._buf = memoryview(self._mapping)
        header, problem = read_checked_ring_header(buf, size, RING_FILE)
        if problem is not None:
            raise CorruptFrameError(f"{problem} path={path!r}")
        capacity = header.capacity
        if header.state == RING_STATE_CLOSED:
            raise ProducerGoneError(f"ring closed by its producer: path={path!r}")
        if header.state != RING_STATE_OPEN:
            raise CorruptFrameError(f"bad ring state: state={header.state} path={path!r}")
        self._words = SharedWords(buf)  # the size is a header plus an aligned capacity
        self._capacity = capacity
        self._shapes = _FrameShapes(capacity)
        self.producer = (header.producer_pid, header.producer_start_time)
        self.instance = header.producer_instance
        shrunk = self._shrink_problem()  # truncated since the fstat above: never fault it in
        if shrunk is not None:
            raise CorruptFrameError(shrunk)
        bytes(buf[::_PAGE_SIZE])  # fault every page in once, not on the receive path
        tail, _head = self._load_positions()
        self._scanned_to = tail
        self._seen_head = tail  # forces a scan on the first get that sees a frame

    # -- scan ------------------------------------------------------------------

    def _load_positions(self) -> tuple[int, int]:
        """(tail, head), consistent with each other, validated."""
        return load_positions(self._require_words(), self._capacity, self.path)

    def _scan(self, buf: memoryview, words: SharedWords) -> None:
        """`spec.index.process_index_scan`: index the frames published since the last scan.

        Without the lock (`frames.walk_frames`). Entries the tail passed go
        first; then each frame from where the last scan ended (or the tail)
        up to the head: a data frame seen PUBLISHED becomes its key's entry,
        one seen in another state drops an older entry of its key.
        """
        capacity = self._capacity
        tail, head = load_positions(words, capacity, self.path)
        index = self._index
        positions = self._order_positions
        keys = self._order_keys
        if len(positions) != len(keys):
            # An exception raised between the two deques' updates (a signal handler's,
            # issue 24): start the index again from the tail rather than pair them wrongly.
            positions.clear()
            keys.clear()
            index.clear()
            self._scanned_to = tail
        while positions and positions[0] < tail:
            old_position = positions.popleft()
            old_key = keys.popleft()
            if index.get(old_key) == old_position:
                del index[old_key]
        frames, end, complete = walk_frames(
            buf, words, capacity, self._shapes, max(self._scanned_to, tail), head, self.path
        )
        for position, _, fields, key in frames:
            if fields[1] == DATA_FRAME_TYPE:
                if fields[2] == FRAME_STATE_PUBLISHED:
                    index[key] = position
                    positions.append(position)
                    keys.append(key)
                else:
                    older = index.get(key)
                    if older is not None and older < position:
                        del index[key]  # a newer version exists: the older one is not deliverable
        self._scanned_to = end
        if complete:
            self._seen_head = head  # else the next get scans again

    # -- get -------------------------------------------------------------------

    def get(
        self,
        key: str,
        position: int | None = None,
        *,
        mode: ConsumeMode = ConsumeMode.COPY_OUT,
        decode: Callable[[memoryview], Any] | None = None,
    ) -> Received:
        """Claim the key's deliverable frame (or the descriptor's exact frame), once.

        COPY_OUT: the payload is copied before the frame is marked DONE; the
        answer holds `bytes`, or what `decode(view)` returned. `decode` gets a
        read-only memoryview *borrowed* from the mapping for the duration of
        the call and must return independently owned memory. If anything made
        from the view (a slice, `memoryview()`, numpy.frombuffer,
        torch.frombuffer) outlives the call, the get raises BufferError and
        the frame stays CLAIMED, so the ring never rewrites what it shows. If
        `decode` raises, the frame stays deliverable, except for a payload
        that does not decode (CorruptFrameError, UnsupportedPayloadError):
        that frame is RETIRED (consumed, as vllm-omni does) and the error raised.

        LEASE: the answer's payload is a `Lease` borrowing the payload in
        place; the frame is DONE when the lease is released. LEASE with
        `decode` (a connector's borrowed get): `decode` gets the payload as
        a `borrow.BorrowedPayload` and the answer holds what it returned;
        the frame is CLAIMED (this process its holder) until the last view
        made from the payload dies, then DONE. If `decode` raises, the frame
        stays deliverable (unless something made from it outlives the
        failure: then it is claimed until that dies), or is RETIRED for a
        payload that does not decode, as in COPY_OUT.

        With `position` (a descriptor) only that exact frame may be claimed;
        anything else answers STALE. BUSY: another process holds the ring
        lock; nothing changed.

        A get by key finds the frame through the reader's index
        (`spec.index.process_indexed_get`): it indexes the frames published
        since its last scan only when the head moved, then claims the
        index's candidate after checking the frame header there (key,
        position, state), so a stale entry costs a miss, never a wrong
        frame. A get with a descriptor checks the exact frame it names, and
        answers STALE when the index (caught up like a get by key's) holds
        a newer frame of the key. A get on an unchanged channel
        whose index has nothing for the key takes no lock and makes one
        system call: the fstat that refuses a ring file a neighbour
        truncated (CorruptFrameError, and the mapping is dropped) before a
        byte of it is touched, where touching it would be SIGBUS.
        """
        buf = self._buf
        words = self._words
        if buf is None:
            if self.shrunk is not None:
                raise CorruptFrameError(self.shrunk)
            raise ClosedError(f"ring reader is closed: path={self.path!r}")
        # The one system call of a poll: a file a neighbour truncated is never touched.
        if self._shrunk_now():
            self._drop_shrunk()
        key_bytes = key.encode("utf-8")
        if position is None:
            if load_head_acquire(words) != self._seen_head:
                self._scan(buf, words)
            found = self._index.get(key_bytes)
            if found is None:
                return _NOT_FOUND
            miss = _NOT_FOUND
        else:
            if not self._names_frame(buf, words, key_bytes, position):
                return _STALE
            # A newer frame of the key supersedes this one even while its
            # producer could not retire it (a busy lock defers the retire:
            # `engine._retire_positions`), so the index catches up first.
            if load_head_acquire(words) != self._seen_head:
                self._scan(buf, words)
            newest = self._index.get(key_bytes)
            if newest is not None and newest != position:
                return _STALE
            found = position
            miss = _STALE
        ring_state = load_ring_state_acquire(words)
        if ring_state != RING_STATE_OPEN:
            if ring_state == RING_STATE_CLOSED:
                return miss  # a closed ring delivers nothing; its producer retires the rest
            raise CorruptFrameError(f"bad ring state: state={ring_state} path={self.path!r}")
        if mode is ConsumeMode.LEASE:
            # A lease claimed and lost before its object exists pins the frame for
            # good: no signal handler runs inside the claim (`lifecycle`, issue 24).
            with deferred_signals():
                return self._claim(buf, key_bytes, found, mode, decode, miss)
        return self._claim(buf, key_bytes, found, mode, decode, miss)

    def is_replaced(self) -> bool:
        """Whether the ring's name now names another file (its producer re-created the ring)."""
        try:
            here = self._dir.stat(self.path)
        except FileNotFoundError:
            return False
        return (here.st_dev, here.st_ino) != self.identity

    def _drop_shrunk(self) -> None:
        """The file shrank (`_shrink_problem`): unmap it and raise CorruptFrameError, now and at every later get."""
        self.shrunk = self._shrink_problem() or f"ring file shrank: path={self.path!r}"
        self._release_mapping()
        raise CorruptFrameError(self.shrunk)

    def _names_frame(
        self, buf: memoryview, words: SharedWords | None, key_bytes: bytes, position: int
    ) -> bool:
        """Whether a descriptor's `position` holds a frame of `key_bytes` now, by a lock-free look.

        Aligned, in [tail, head), far enough from the end of the data region
        for a data frame's header, and that header (read before the tail is
        loaded again: a frame the tail passed may be rewritten) names this
        key at this position. The claim checks it all again under the lock.
        """
        assert words is not None
        capacity = self._capacity
        if position % FRAME_ALIGNMENT:
            return False
        tail, head = load_positions(words, capacity, self.path)
        if not tail <= position < head or position % capacity + FRAME_HEADER_LENGTH > capacity:
            return False
        offset = RING_HEADER_LENGTH + position % capacity
        if not self._header_names(buf, offset, key_bytes, position):
            return False
        return load_tail_acquire(words) <= position

    def release(self, position: int) -> None:
        """Mark the CLAIMED frame at `position` DONE (for a lease object that was lost).

        Prefer `Lease.release()`, which also drops the borrowed view.
        """
        buf = self._require_buf()
        words = self._words
        if self._shrunk_now():
            self._drop_shrunk()
        capacity = self._capacity
        tail, head = self._load_positions()
        offset = _data_offset(position, capacity)
        fields = load_frame_fields(buf, offset, capacity)
        state = fields[2]
        problem = frame_problem(position, head, fields, capacity, self._shapes)
        if not tail <= position < head or problem is not None or state != FRAME_STATE_CLAIMED:
            raise CorruptFrameError(
                f"no claimed frame to release at position={position}: state={state} "
                f"problem={problem}; path={self.path!r}"
            )
        store_frame_state_release(words, offset, FRAME_STATE_DONE)

    # -- inspection --------------------------------------------------------------

    def index_snapshot(self) -> ReaderIndex:
        """A copy of this reader's index in the model's terms (`spec.index.ReaderIndex`).

        What `spec.invariants.check_reader_index` checks against the ring: the
        position every frame below `scanned_to` was seen at, key by key. For
        inspection (the lockstep machines, the interleaving explorer); a get
        never reads it.
        """
        return ReaderIndex(
            scanned_to=self._scanned_to,
            entries={
                key.decode("utf-8", "surrogateescape"): position
                for key, position in self._index.items()
            },
        )

    @property
    def producer_closed(self) -> bool:
        """The producer closed the ring: nothing on it will be delivered.

        Asked after every miss of a connector's get on each of the edge's
        rings, so it loads the word itself (ClosedError once this reader is closed).
        """
        words = self._words
        if words is None:
            if self.shrunk is not None:
                return True  # unmapped: nothing on it will be delivered
            raise ClosedError(f"ring channel is closed: path={self.path!r}")
        return load_ring_state_acquire(words) == RING_STATE_CLOSED

    @property
    def wakeup_sequence(self) -> int:
        """Bumped by the producer after every publication (and at close).

        CorruptFrameError (and unmapped) once the file shrank.
        """
        words = self._require_words()
        if self._shrunk_now():
            self._drop_shrunk()
        return load_wakeup_sequence_acquire(words)

    def statistics(self) -> RingStatistics:
        """A lock-free walk of the ring (`frames.walk_frames`); frames moving meanwhile may be counted in either state."""
        buf = self._require_buf()
        words = self._words
        assert words is not None
        if self._shrunk_now():
            self._drop_shrunk()
        capacity = self._capacity
        tail, head = self._load_positions()
        published = claimed = 0
        frames, _, _ = walk_frames(buf, words, capacity, self._shapes, tail, head, self.path)
        for _, _, fields, _ in frames:
            if fields[1] == DATA_FRAME_TYPE:
                published += fields[2] == FRAME_STATE_PUBLISHED
                claimed += fields[2] == FRAME_STATE_CLAIMED
        used = head - tail
        return RingStatistics(
            capacity=capacity,
            head=head,
            tail=tail,
            used_bytes=used,
            free_bytes=capacity - used,
            published_frames=published,
            claimed_frames=claimed,
            closed=load_ring_state_acquire(words) == RING_STATE_CLOSED,
            puts=0,
            refused_not_admitted=0,
            refused_full=0,
            retired=0,
            gets=self._gets,
            busy=self._busy,
            locks=self._locks,
            skipped=self._skipped,
        )

    @signals_deferred
    def close(self) -> None:
        """Drop the mapping and descriptor; never unlinks. Idempotent.

        Leases still held keep their frames CLAIMED and their views valid: the
        mapping is unmapped when the last borrowed view dies.
        """
        self._release_mapping()

    def __enter__(self) -> RingReader:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"RingReader(path={self.path!r}, capacity={self._capacity}, producer={self.producer})"
        )
