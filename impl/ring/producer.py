"""The host ring's producer, `RingChannel` (see `shmring.impl.ring` for the rationale)."""

from __future__ import annotations

import errno
from collections.abc import Callable

from ...spec.layout import (
    FRAME_KEY_OFFSET,
    RING_CAPACITY_DISABLED,
    RING_HEADER_LENGTH,
    RING_STATE_OPEN,
    compute_ring_file_length,
)
from ...spec.ring import (
    PutStatus,
    compute_capacity_error,
    is_prefix_match,
)
from ..directory import Directory
from ..errors import (
    ConfigurationError,
    NoSpaceError,
)
from ..frame_io import (
    SharedWords,
    compute_checksum,
    store_head_release,
    store_tail_release,
    write_ring_header,
)
from ..names import current_producer_identity, instance_of
from ..os_seam import (
    DEFAULT_OS,
    FILE_MODE,
    OPEN_FLAGS_CREATE,
    OsFacade,
)
from .borrow import call_with_view
from .closing import ChannelClosing
from .engine import (
    HOOK_FIELDS_WRITTEN,
    HOOK_LENGTH_STORED,
    HOOK_PAYLOAD_WRITTEN,
    HOOK_RESERVED,
    PublishHook,
    RingProducer,
)
from .mapping import (
    _PAGE_SIZE,
    _ZERO_FILL,
    Buffer,
    _new_outcome,
)
from .results import (
    _PUT_CLOSED,
    PutOutcome,
    RingStatistics,
)

# -- producer ------------------------------------------------------------------


class RingChannel(RingProducer, ChannelClosing):
    """The producer side of one ring: creates, publishes into, and owns the file.

    Create with `RingChannel.create`. The ring mechanics are the producer
    engine's (`engine.RingProducer`); this class adds the file's lifetime
    (its end, `close` included, is `closing.ChannelClosing`'s) and the
    bytes of a put. `put` / `put_with_writer` follow
    `spec.ring.process_put` step for step; `cancel`, `cancel_prefix` and
    `close` follow `process_cancel`, `process_cancel_prefix` and
    `process_close`. Only this object unlinks the file.
    """

    _unsettled: bool = False  # a put may have stopped between a shared store and its record

    def __init__(
        self,
        path: str,
        capacity: int,
        os_facade: OsFacade,
        producer: tuple[int, ...],
        publish_hook: PublishHook | None,
        directory: Directory | None = None,
    ) -> None:
        super().__init__(path, os_facade, directory)
        # (pid, start time) or (pid, start time, instance), written in the ring header
        self.producer = producer
        self._publish_hook = publish_hook
        self._start_producer(capacity)

    # -- setup -----------------------------------------------------------------

    @classmethod
    def create(
        cls,
        path: str,
        capacity: int,
        *,
        os_facade: OsFacade = DEFAULT_OS,
        producer: tuple[int, ...] | None = None,
        publish_hook: PublishHook | None = None,
        directory: Directory | None = None,
        start_position: int = 0,
    ) -> RingChannel:
        """Create the ring file at `path` (it must not exist) and map it.

        The file is made with O_CREAT|O_EXCL|O_NOFOLLOW and mode 0600, so a
        symlink or an existing file at `path` is refused (FileExistsError).
        Its space is reserved with fallocate (ENOSPC shows here as
        NoSpaceError, not later as SIGBUS) and every page is touched once, so
        puts never page-fault. On any failure nothing is left behind.

        `producer` is the (pid, start time[, instance]) written into the
        header; the default is this process (`names.current_producer_identity`),
        instance 0.
        `publish_hook` is a test seam called at the HOOK_* stages of each put;
        production passes None. `directory` (a connector's verified deployment
        directory) is where `path` is created and unlinked, by descriptor.
        `start_position` (aligned) is where head and tail start: a ring that
        replaces one a neighbour unlinked continues its positions, so a
        descriptor of the old ring never names a frame of the new one.
        """
        error = compute_capacity_error(capacity)
        if error is not None:
            raise ConfigurationError(error)
        if capacity == RING_CAPACITY_DISABLED:
            raise ConfigurationError(f"a disabled ring has no channel: capacity={capacity}")
        if producer is None:
            producer = current_producer_identity(os_facade)
        channel = cls(path, capacity, os_facade, producer, publish_hook, directory)
        file_length = channel._file_length = compute_ring_file_length(capacity)
        channel._fd = channel._dir.open(path, OPEN_FLAGS_CREATE, FILE_MODE)
        channel._unlink_pending = True
        try:
            os_facade.ftruncate(channel._fd, file_length)
            try:
                os_facade.fallocate(channel._fd, file_length)
            except OSError as error_:
                if error_.errno in (errno.ENOSPC, errno.EDQUOT):
                    raise NoSpaceError(
                        f"no space for a ring file: capacity={capacity} path={path!r}", error_.errno
                    ) from error_
                raise
            channel._mapping = os_facade.mmap(channel._fd, file_length)
            buf = channel._buf = memoryview(channel._mapping)
            channel._words = SharedWords(buf)
            # Fault every page in once, here, rather than on the put path.
            buf[::_PAGE_SIZE] = bytes(len(range(0, file_length, _PAGE_SIZE)))
            write_ring_header(
                buf, capacity, producer[0], producer[1], RING_STATE_OPEN, instance_of(producer)
            )
            if start_position:
                store_tail_release(channel._words, start_position)
                store_head_release(channel._words, start_position)
                channel._head = channel._tail = start_position
        except BaseException:
            channel._closed = True
            channel._teardown()
            raise
        return channel

    # -- put -------------------------------------------------------------------

    def put(self, key: str, payload: Buffer) -> PutOutcome:
        """Publish a copy of `payload` (bytes-like) under `key`; see `spec.ring.process_put`.

        The caller may reuse `payload` as soon as put returns.
        """
        data = payload if isinstance(payload, bytes) else memoryview(payload).cast("B")
        return self._put(key, len(data), data, None)

    def put_parts(self, key: str, head: bytes, body: Buffer) -> PutOutcome:
        """Publish the payload `head` + `body` under `key` without joining the two first.

        What `put(key, head + body)` publishes, byte for byte and with the
        same checksum, with one copy of `body` instead of two (a codec's
        header and a large bytes payload: `codec.EncodePlan.parts`).
        """
        data = body if isinstance(body, bytes) else memoryview(body).cast("B")
        return self._put(key, len(head) + len(data), data, None, head)

    def put_with_writer(
        self, key: str, payload_length: int, writer: Callable[[memoryview], None]
    ) -> PutOutcome:
        """Publish `payload_length` bytes that `writer` fills in place.

        `writer` gets a writable memoryview of exactly `payload_length` bytes
        *borrowed* from the ring mapping; it is valid only during the call
        and nothing made from it may be kept (BufferError if something is:
        nothing is published). If `writer` raises, nothing is published.
        Lets a codec encode straight into shared memory with no intermediate
        copy.
        """
        if payload_length < 0:
            raise ValueError(
                f"payload length must not be negative: payload_length={payload_length}"
            )
        return self._put(key, payload_length, None, writer)

    def _put(
        self,
        key: str,
        payload_length: int,
        payload: bytes | memoryview | None,
        writer: Callable[[memoryview], None] | None,
        prefix: bytes = b"",
    ) -> PutOutcome:
        """`spec.ring.process_put` on the engine: admit, `_reserve`, write the bytes, `_commit`.

        The payload is `prefix` + `payload` (`prefix` empty but for `put_parts`),
        or what `writer` writes.
        """
        if self._closed:
            return _PUT_CLOSED
        key_bytes = key.encode("utf-8")
        key_length = len(key_bytes)
        frame_length = self._shapes[key_length, payload_length]
        if frame_length < 0:  # the model's is_admitted said no
            self._refused_not_admitted += 1
            return PutOutcome(PutStatus.NOT_ADMITTED, None, -frame_length)
        if self._unsettled:  # an earlier put stopped part way (an exception): read the ring back
            self._settle(self.path)
        self._unsettled = True  # until the record matches the ring again (`_commit` returned)
        head = self._head
        padding = self._reserve(head, frame_length)
        if padding < 0:
            self._unsettled = False
            return PutOutcome(PutStatus.FULL, None, frame_length)
        position = head + padding
        buf = self._buf
        assert buf is not None  # open while not closed

        # The bytes: key, payload, zero fill (the slot reads "unpublished" since _reserve).
        offset = RING_HEADER_LENGTH + position % self._capacity
        key_start = offset + FRAME_KEY_OFFSET
        payload_start = key_start + key_length
        payload_end = payload_start + payload_length
        buf[key_start:payload_start] = key_bytes
        if writer is None:
            assert payload is not None
            if prefix:
                body_start = payload_start + len(prefix)
                buf[payload_start:body_start] = prefix
                buf[body_start:payload_end] = payload
                # Over what was written (as for a writer): the frame's bytes.
                checksum = compute_checksum(key_bytes, buf[payload_start:payload_end])
            else:
                buf[payload_start:payload_end] = payload
                checksum = compute_checksum(key_bytes, payload)
        else:
            # The one kept-view guard (`borrow.call_with_view`): a view the
            # writer keeps (a slice, an array) would alias the frame after it
            # is published, so nothing is.
            assert self._mapping is not None
            _, kept = call_with_view(
                self._mapping, payload_start, payload_end, writer, writable=True
            )
            if kept:
                raise BufferError(
                    f"writer kept a view of ring storage; nothing published: key={key!r}"
                )
            checksum = compute_checksum(key_bytes, buf[payload_start:payload_end])
        fill = offset + frame_length - payload_end
        if fill:
            buf[payload_end : payload_end + fill] = _ZERO_FILL[:fill]
        hook = self._publish_hook
        if hook is not None:
            hook(HOOK_PAYLOAD_WRITTEN)

        retired = self._commit(
            position, padding, frame_length, key, key_length, payload_length, checksum, True
        )
        self._unsettled = False
        return _new_outcome(
            PutOutcome, (PutStatus.PUBLISHED, position, frame_length, padding, retired)
        )

    def published_since(self, key: str, head: int) -> int | None:
        """The position of the key's frame published at or after `head`, if any (issue 24).

        For a caller whose put an exception stopped: whether the ring
        published it after all (the record read back first, `_settle`).
        """
        if self._closed:
            return None
        if self._unsettled:
            self._settle(self.path)
            self._unsettled = False
        position = self._published.get(key)
        return position if position is not None and position >= head else None

    # -- retire ----------------------------------------------------------------

    def cancel(self, key: str) -> int:
        """Retire the key's unclaimed frame; answer how many (0 or 1). See `process_cancel`.

        Waits for another process's ring lock at most `locks.PRODUCER_LOCK_WAIT_SECONDS`;
        a frame it could not lock stays, answers 0, and is retired later (`reap`).
        """
        if self._closed:
            return 0
        if self._deferred:
            self._retry_deferred()
        return self._retire_key(key)

    def reap(self) -> int:
        """Retire the frames a busy lock left (never waits); answer how many."""
        if self._closed:
            return 0
        return self._retry_deferred()

    def cancel_prefix(self, prefix: str) -> int:
        """Retire every unclaimed frame whose key is `prefix` + digits. See `process_cancel_prefix`."""
        if self._closed:
            return 0
        if self._deferred:
            self._retry_deferred()
        candidates = [(k, p) for k, p in self._published.items() if is_prefix_match(prefix, k)]
        if not candidates:
            return 0
        return self._retire_positions(candidates)

    def __enter__(self) -> RingChannel:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- inspection --------------------------------------------------------------

    def statistics(self) -> RingStatistics:
        published, claimed = self._count_unreclaimed()
        used = self._head - self._tail
        return RingStatistics(
            capacity=self._capacity,
            head=self._head,
            tail=self._tail,
            used_bytes=used,
            free_bytes=self._capacity - used,
            published_frames=published,
            claimed_frames=claimed,
            closed=self._closed,
            puts=self._puts,
            refused_not_admitted=self._refused_not_admitted,
            refused_full=self._refused_full,
            retired=self._retired,
            reclaimed_from_dead_holders=self._reclaimed_from_dead_holders,
            gets=0,
            busy=0,
            locks=self._locks,
        )

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"head={self._head} tail={self._tail}"
        return f"RingChannel(path={self.path!r}, capacity={self._capacity}, {state})"


__all__ = [
    "HOOK_FIELDS_WRITTEN",
    "HOOK_LENGTH_STORED",
    "HOOK_PAYLOAD_WRITTEN",
    "HOOK_RESERVED",
    "PublishHook",
    "RingChannel",
]
