"""Borrowing shared memory: ONE kept-view guard and ONE lease.

Design rationale. Three paths hand a caller memory that lives in a shared
mapping: a producer's writer fills a payload in place, a reader's decoder
reads one in place, and a lease hands a payload out until it is given back.
Each must know whether the caller kept something made from that memory (a
slice, `memoryview()`, numpy.frombuffer, torch.frombuffer): a writer's kept
view would see the ring rewrite it, a decoder's likewise, and a lease given
back while a view lives would let the producer reuse bytes someone still
reads. The one guard, `views_outlive`, answers that for all three: every
view made from a lent memoryview holds a reference to the object that
exported it, so releasing the lent view and counting the exporter's
references tells whether any lives (CPython frees exports by reference
count, so the answer is exact, not a heuristic).

`Lease` is the one lease: a borrowed payload, the export that pins its
memory, and the release that gives it back, run exactly once. It ends one of
two ways, both the model's (`shmring.spec.leases`): the host ring hands the
caller the lease itself, which ends when `release()` is called and no view
of it lives (`spec.ring.process_release`); `views.LeaseOwner` (numpy arrays
of arena frames and segments) ends when the last view of it dies
(`spec.leases.process_drop`). A connector's borrowed get
(`get(..., borrow=True)`, `spec.borrowing`) ends the second way:
`BorrowedPayload` is the claimed payload, lent to numpy, whose views the
codec makes the value's large leaves (`codec.decode_borrowed`); the last
one to die stores DONE in the frame or closes the segment's mapping.
`lease_statistics` counts all of them.
"""

from __future__ import annotations

import mmap
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, TypeVar

from ...spec.layout import (
    FRAME_STATE_DONE,
)
from .. import lifecycle
from ..errors import (
    ClosedError,
)
from ..frame_io import (
    store_frame_state_in_header,
)

_T = TypeVar("_T")
ReleaseHook = Callable[[Any], None]  # gets the lease's export (`keep`), once

# -- the kept-view guard --------------------------------------------------------


# pragma: no mutate start
# (mutmut's trampoline around this function would hold two more references
# to `exporter` and make every lease look kept: docs/mutation.md)
def views_outlive(view: memoryview | None, exporter: object, expected: int) -> bool:
    """Release the lent `view` (None: released before); whether anything made from it still lives.

    `expected` is what `sys.getrefcount(exporter)` answered in the caller
    while nothing was lent (so the caller's own references cancel out). A
    view that refuses release (something exported it) counts as kept.
    """
    if view is not None:
        try:
            view.release()
        except BufferError:
            return True
    # One more reference than the caller's count: our parameter.
    return sys.getrefcount(exporter) > expected + 1
    # pragma: no mutate end


def call_with_view(
    mapping: mmap.mmap,
    start: int,
    end: int,
    use: Callable[[memoryview], _T],
    *,
    writable: bool,
    on_kept: Callable[[], object] | None = None,
) -> tuple[_T, bool]:
    """`use(mapping[start:end])` with a fresh export; answers (what it returned, kept).

    `kept` is True when something made from the view outlives the call
    (`views_outlive`); the caller decides what that costs (nothing published,
    a frame pinned). `on_kept` runs when something was kept, also when `use`
    raised (its error then propagates): so a frame can be pinned either way.
    """
    baseline = sys.getrefcount(mapping)
    whole = memoryview(mapping)  # type: ignore[arg-type]
    view = (whole if writable else whole.toreadonly())[start:end]
    whole.release()
    try:
        value = use(view)
    except BaseException:
        if views_outlive(view, mapping, baseline) and on_kept is not None:
            on_kept()
        raise
    kept = views_outlive(view, mapping, baseline)
    if kept and on_kept is not None:
        on_kept()
    return value, kept


# -- the lease ------------------------------------------------------------------


class _Counters:
    lock = threading.Lock()
    taken = 0
    released = 0


@dataclass(frozen=True)
class LeaseStatistics:
    """Leases of this process (all receivers together)."""

    taken: int  # leases handed out, ever
    released: int  # leases given back (released, or their last view died), ever
    live: int  # taken - released: leases some object still holds


def lease_statistics() -> LeaseStatistics:
    with _Counters.lock:
        return LeaseStatistics(
            _Counters.taken, _Counters.released, _Counters.taken - _Counters.released
        )


def mark_frame_done(keep: Any) -> None:
    """The release of a ring or arena frame: DONE in its shared header (`keep` starts at the frame)."""
    with memoryview(keep) as frame:
        store_frame_state_in_header(frame, FRAME_STATE_DONE)


# References to a ring lease's export inside `release` while nothing is lent:
# the lease's slot, the local, getrefcount's argument.
_OWN_REFERENCES: Final = 3


class Lease:
    """One borrowed payload of a shared mapping, given back exactly once.

    Who owns the memory: the mapping's producer; the lease pins it through
    `_keep`, an export of the mapping that starts at the frame (so `close`
    of the mapping never unmaps it). For how long: until the lease ends;
    then `release(keep)` runs once (a frame becomes DONE, so the producer
    may reuse its bytes) and `mapping_to_close`, if any, is closed. Whether
    it may be written: a host-ring lease's `view` is read-only; a
    `views.LeaseOwner` array may be written by its holder. Nobody else
    writes the payload while the lease lives.

    A host-ring lease (this class) ends at `release()`: `view` is a
    read-only memoryview *borrowed* from the reader's mapping; every view
    made from it (slices, `memoryview()`, numpy.frombuffer,
    torch.frombuffer) keeps the lease's export alive, and while one lives
    `release()` raises BufferError and the frame stays CLAIMED: call it
    again once they are gone. An unreleased lease pins the ring at its
    position: release it, or use it as a context manager. The views stay
    valid after the reader is closed (the mapping lives on until the last
    of them dies).
    """

    __slots__ = ("_keep", "_made_in", "_mapping", "_release", "_view", "label", "position")

    def __init__(
        self,
        keep: Any,
        payload_offset: int | None = None,
        *,
        release: ReleaseHook | None = mark_frame_done,
        mapping_to_close: mmap.mmap | None = None,
        label: str = "",
        position: int | None = None,
    ) -> None:
        # The one export every view of the payload derives from.
        self._keep: Any = keep
        self._made_in = lifecycle.generation()  # a fork child's copy never releases the frame
        self._release = release
        self._mapping = mapping_to_close
        self.label = label
        self.position = position  # a frame's position (its descriptor); None for a segment
        self._view: memoryview | None = (
            None
            if payload_offset is None
            else memoryview(keep).cast("B")[payload_offset:].toreadonly()
        )
        with _Counters.lock:
            _Counters.taken += 1

    @property
    def view(self) -> memoryview:
        view = self._view
        if view is None:
            raise ClosedError(f"lease already released: position={self.position}")
        return view

    @property
    def released(self) -> bool:
        return self._keep is None

    def release(self) -> None:
        """Give the frame back (DONE). Idempotent; BufferError while views of it live."""
        view, self._view = self._view, None
        keep = self._keep
        if keep is None:
            return
        if views_outlive(view, keep, _OWN_REFERENCES):
            raise BufferError(
                f"views of the lease's payload still live; frame stays claimed: position={self.position}"
            )
        del keep
        self._end()

    def _end(self) -> None:
        """Run the release once, then close the mapping the lease owns; count it."""
        keep = getattr(self, "_keep", None)  # unset: a subclass refused it before __init__ ran
        self._keep = None
        if keep is None:
            return
        release, self._release = self._release, None
        mapping, self._mapping = self._mapping, None
        try:
            if release is not None and not lifecycle.is_inherited(self._made_in):
                release(keep)
        finally:
            del keep
            if mapping is not None:
                mapping.close()
            with _Counters.lock:
                _Counters.released += 1

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()

    def __repr__(self) -> str:
        view = self._view
        state = "released" if self._keep is None else f"{0 if view is None else len(view)} bytes"
        return f"Lease(position={self.position}, {state})"


class CollectedLease(Lease):
    """A lease that ends when the last object holding it dies (`spec.leases.process_drop`).

    Not released by a call: `release()` raises TypeError. Its views are
    ordinary references to it (numpy's base chain, a tensor's storage, a
    memoryview's exporter), so CPython ends it right after the last one goes.
    """

    def release(self) -> None:
        raise TypeError("this lease ends when the last view of it dies, not by release()")

    def __del__(self) -> None:
        self._end()


def _array_interface(address: int, nbytes: int, readonly: bool) -> dict[str, Any]:
    return {
        "version": 3,
        "shape": (nbytes,),
        "typestr": "|u1",
        "data": (address, readonly),
        "strides": None,
    }


class BorrowedPayload(CollectedLease):
    """One claimed payload lent in place: a connector's borrowed get (`borrow=True`).

    Who owns the memory: the producer's ring frame (or a fallback segment's
    mapping, already unlinked); this object pins it through `keep`, an export
    of the mapping, so neither the reader's nor the connector's close unmaps
    it. For how long: until the last object made from it dies (numpy's
    `__array_interface__` makes it the base of `numpy.asarray(payload)`; the
    codec's borrowed leaves are views of that array); then the armed
    `release(keep)` runs once (a ring frame becomes DONE and the producer may
    reclaim it) and `mapping_to_close` (a segment's mapping) is closed.
    Whether it may be written: `numpy.asarray(payload)` is read-only, and so
    is every numpy array and memoryview the codec derives from it; torch has
    no read-only tensors, so borrowed tensors come from `tensor_face` and
    are writable: a write lands in the claimed frame, which no one else reads
    while it lives (never write one; take an owned get to modify data).

    The release is armed only when the claim commits (`arm`): a claim that
    fails after the payload was built gives nothing back for it.
    """

    def __init__(
        self,
        keep: Any,
        address: int,
        nbytes: int,
        *,
        mapping_to_close: mmap.mmap | None = None,
        label: str = "",
        position: int | None = None,
    ) -> None:
        self.address = address  # the payload's first byte in this process
        self.nbytes = nbytes
        self.__array_interface__ = _array_interface(address, nbytes, True)
        super().__init__(
            keep, release=None, mapping_to_close=mapping_to_close, label=label, position=position
        )

    def arm(self, release: ReleaseHook | None) -> None:
        """The claim committed: `release(keep)` runs when the last view dies."""
        self._release = release

    def disown(self) -> None:
        """Nothing was borrowed after all: the caller keeps the mapping; nothing runs at the end."""
        self._release = None
        self._mapping = None

    def __repr__(self) -> str:
        live = self._keep is not None
        return f"<BorrowedPayload {self.label} position={self.position} live={live}>"


class _TensorFace:
    """A writable face of part of a `BorrowedPayload` for torch (which has no read-only tensors)."""

    __slots__ = ("__array_interface__", "payload")

    def __init__(self, payload: BorrowedPayload, start: int, nbytes: int) -> None:
        self.payload = payload  # keeps the lease alive for as long as the tensor lives
        self.__array_interface__ = _array_interface(payload.address + start, nbytes, False)


def tensor_face(payload: BorrowedPayload, start: int, nbytes: int) -> object:
    """An `__array_interface__` object over `payload[start:start + nbytes]`, writable, holding it."""
    if start < 0 or start + nbytes > payload.nbytes:
        raise ValueError(
            f"face outside its payload: start={start} nbytes={nbytes} payload={payload.nbytes}"
        )
    return _TensorFace(payload, start, nbytes)


__all__ = [
    "BorrowedPayload",
    "CollectedLease",
    "Lease",
    "LeaseStatistics",
    "ReleaseHook",
    "call_with_view",
    "lease_statistics",
    "mark_frame_done",
    "tensor_face",
    "views_outlive",
]
