"""The receiver half of the ring route: the rings of the producers we read, and the ring claim.

`spec.discovery.get_candidates` and the ring half of `spec.connector.
process_get`, in four steps each a function here:

1. **find** (`_candidates`): the edge's producers in discovery's order,
   each with its mapped ring and its decoder; kept per edge until discovery
   changes (`scanned`), a producer is released or descriptors are shed, so
   a later get asks neither discovery nor the mapping table;
2. **claim** (`_claim_one`): `RingReader.get`, which claims the frame once
   under the ring's lock and decodes it (`decoders`); liveness is asked
   before the payload is decoded, so a frame of a producer that exited is
   left unclaimed and its ring unmapped;
3. **sort the answer** (`_Look`): DELIVERED ends the get; BUSY, a damaged
   ring (CorruptFrameError) or a shortage of descriptors are remembered and
   the next producer is tried; a ring its producer re-created (a neighbour
   unlinked or truncated the file, issue 22) is looked at once more;
4. **keep** (`_keep_readers`): the resolved list, when the pass saw every
   producer.

Only the exact frame a descriptor names is read for a get with a
descriptor, after the producer was found delivering (`claim_descriptor`).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from typing import Any

from ...spec.ring import ConsumeMode
from ..errors import ClosedError, CorruptFrameError, ProducerGoneError, ResourceExhaustedError
from ..lifecycle import deferred_signals
from ..names import ConnectorIdentity, ring_path
from ..os_seam import OsFacade
from ..ring.reader import RingReader
from ..ring.results import ReceiveStatus
from .cohort import CohortGates, CohortPending
from .decoders import Decoder, ProducerExited, frame_borrower, frame_decoder
from .descriptors import RingDescriptor
from .edges import Edge
from .joining import Deployment
from .results import BUSY, GONE, NOT_FOUND, STALE, Delivery, new_delivery
from .shortage import retry_short_of_descriptors

logger = logging.getLogger("shmring.connector")
_LEASE = ConsumeMode.LEASE
_DELIVERED = ReceiveStatus.DELIVERED
_BUSY = ReceiveStatus.BUSY

# (producer, its mapped ring or None before it is resolved, its decoder)
Candidate = tuple[ConnectorIdentity, Any, Any]
# What one claim on one producer's ring came to (`_claim_one`).
_MISS, _GOT, _WAS_BUSY, _DAMAGED, _DROPPED, _RECREATED, _LIST_STALE = range(7)
_GONE = (_DROPPED, _RECREATED)  # the candidate's reader is no longer the one resolved


class _Look:
    """One pass over an edge's candidates: what was seen besides a delivery.

    The defaults are class attributes: a pass that delivers at its first
    ring sets none of them (one store per get, issue 23's lean path).
    """

    busy = False
    corrupt: CorruptFrameError | None = None
    exhausted: ResourceExhaustedError | None = None
    complete = True  # every producer resolved (nothing short of descriptors)

    def __init__(self, sheds: int) -> None:
        self.sheds = sheds  # `shed` runs before the pass: a list kept after another is stale

    def answer(self) -> tuple[None, bool, CorruptFrameError | ResourceExhaustedError | None]:
        """No delivery: (None, whether some ring was BUSY, the error to raise if nothing else delivers)."""
        return None, self.busy, self.corrupt if self.corrupt is not None else self.exhausted


class RingReaders:
    """The mapped rings of the producers a connector reads (see the module docstring)."""

    _deployment: Deployment | None
    _os: OsFacade
    pool: Any
    cohorts: CohortGates | None
    _shed: Callable[[], int]  # the connector's `_shed_descriptors`

    def _init_readers(self) -> None:
        self.readers: dict[tuple[Edge, ConnectorIdentity], RingReader] = {}  # LRU first
        # Per edge, the candidates a get by key visits, in discovery's order;
        # dropped whenever discovery scans or a producer is released.
        self._edge_readers: dict[Edge, list[Candidate]] = {}
        self._sheds = 0  # times `shed` ran (a kept candidate list may be stale)
        # Discovery's producers per edge at the scan `scanned` last saw (its own dict).
        self._known: dict[Edge, set[ConnectorIdentity]] = {}
        # The reader whose `get` runs now: its decode may run short of descriptors
        # and shed (liveness's /proc read, a pool slot's mapping), never this one.
        self._claiming: RingReader | None = None

    # -- a get by key ---------------------------------------------------------------------

    def claim_by_key(
        self, edge: Edge, key: str, borrow: bool = False
    ) -> tuple[Delivery | None, bool, Exception | None]:
        """The ring half of a get by key: the first live candidate's frame, claimed once.

        `borrow`: the frame is decoded in place and stays CLAIMED while the
        value's large leaves live (`RingReader.get` in LEASE mode).
        Answers (the delivery or None, whether some ring was BUSY, the error
        to raise if nothing else delivers). A damaged ring does not stop
        the edge's other rings; a shortage of descriptors serves the
        producers that could be mapped. A ring found re-created under its
        producer's identity is looked at once more in the same get, as the
        model's get finds the frames that moved to it.
        """
        again = True
        while True:
            answer = self._claim_pass(edge, key, borrow, again)
            if answer == _LIST_STALE:
                self._edge_readers.clear()  # a kept reader was dropped under us: resolve afresh
            elif answer == _RECREATED:
                again = False
            else:
                return answer  # type: ignore[return-value]

    def _claim_pass(self, edge: Edge, key: str, borrow: bool, again: bool) -> Any:
        """One pass of `claim_by_key` over the edge's candidates (kept, or resolved now)."""
        kept = self._edge_readers.get(edge)
        candidates = kept if kept is not None else self._candidates(edge)
        look = _Look(self._sheds)
        resolved: list[Candidate] = []
        last = len(candidates) - 1
        for index, (producer, reader, decode) in enumerate(candidates):
            if kept is not None:
                if self.readers.get((edge, producer)) is not reader:
                    return _LIST_STALE
            else:
                reader, decode = self._resolve(edge, producer, look)
                if reader is None:
                    continue
                resolved.append((producer, reader, decode))
            kind, got = self._claim_one(edge, producer, reader, decode, key, borrow, look, kept)
            if kind == _GOT:
                if kept is None and index == last:
                    self._keep_readers(edge, resolved, look)
                return got, False, None
            if kind == _RECREATED and again:
                return _RECREATED
            if kind in _GONE and kept is None:
                resolved.pop()
        if kept is None:
            self._keep_readers(edge, resolved, look)
        return look.answer()

    def _candidates(self, edge: Edge) -> list[Candidate]:
        """Find: `spec.discovery.get_candidates`, the edge's producers in discovery's order."""
        deployment = self._deployment
        assert deployment is not None  # joined
        return [(producer, None, None) for producer in deployment.discovery.producers_of(edge)]

    def _resolve(
        self, edge: Edge, producer: ConnectorIdentity, look: _Look
    ) -> tuple[RingReader | None, Decoder | None]:
        """A candidate's mapped ring and its owned decoder; (None, None) when it has none."""
        try:
            reader = self._reader(edge, producer)
        except ResourceExhaustedError as error:
            look.exhausted = look.exhausted or error
            look.complete = False
            return None, None
        if reader is None:
            return None, None
        deployment = self._deployment
        assert deployment is not None  # joined
        decode = frame_decoder(self.pool, producer, self.cohorts, edge, deployment.liveness)
        return reader, decode

    def _claim_one(
        self,
        edge: Edge,
        producer: ConnectorIdentity,
        reader: RingReader,
        decode: Decoder,
        key: str,
        borrow: bool,
        look: _Look,
        kept: list[Candidate] | None,
    ) -> tuple[int, Delivery | None]:
        """Claim: `spec.ring.process_get` on one producer's ring, and what came of it."""
        self._claiming = reader
        try:
            if borrow:
                deployment = self._deployment
                assert deployment is not None  # joined
                borrower = frame_borrower(
                    self.pool, producer, self.cohorts, edge, deployment.liveness
                )
                got = reader.get(key, mode=_LEASE, decode=borrower)
            else:
                got = reader.get(key, decode=decode)
        except CohortPending:
            return _MISS, None  # a member of a cohort not committed yet: not there for now
        except CorruptFrameError as error:
            return self._damaged(edge, producer, reader, error, look, kept), None
        except ProducerExited:
            self.release(edge, producer)  # a dead producer's frame is never delivered
            return _DROPPED, None
        finally:
            self._claiming = None
        if got.status is _DELIVERED:
            return _GOT, self._delivered(edge, producer, reader, got.payload, borrow, kept)
        if got.status is _BUSY:
            look.busy = True
            return _WAS_BUSY, None
        if reader.producer_closed:
            # Re-created under the same identity (a neighbour unlinked the file,
            # issue 22): its frames moved to the new file, looked at once more.
            return (_RECREATED if self._release_closed(edge, producer, reader) else _DROPPED), None
        return _MISS, None

    def _damaged(
        self,
        edge: Edge,
        producer: ConnectorIdentity,
        reader: RingReader,
        error: CorruptFrameError,
        look: _Look,
        kept: list[Candidate] | None,
    ) -> int:
        """A claim that met a damaged ring: reported if nothing else delivers, the edge goes on."""
        if reader.shrunk is not None:
            # Truncated by a neighbour (issue 22): unmapped, released, reported; a
            # ring its producer re-creates is attached afresh at a later get.
            self._release_closed(edge, producer, reader)
            look.corrupt = look.corrupt or error
            return _DROPPED
        if kept is not None and reader.producer_closed:
            return _RECREATED if self._release_closed(edge, producer, reader) else _MISS
        look.corrupt = look.corrupt or error
        return _DAMAGED

    def _delivered(
        self,
        edge: Edge,
        producer: ConnectorIdentity,
        reader: RingReader,
        payload: Any,
        borrow: bool,
        kept: list[Candidate] | None,
    ) -> Delivery:
        """`spec.connector._deliver`: the claimed frame's value as the connector's Delivery."""
        if kept is not None:  # most recently used last, as `_reader` does (the ring that delivered)
            readers = self.readers
            # `del` then store: no call in between for a handler to stop (issue 24)
            if (edge, producer) in readers:
                del readers[edge, producer]
            readers[edge, producer] = reader
        if borrow:
            size, value, lease, route = payload
            return new_delivery(value, size, route, producer, lease)
        size, value, route = payload
        return new_delivery(value, size, route, producer)

    def _keep_readers(self, edge: Edge, resolved: list[Candidate], look: _Look) -> None:
        """Keep: the candidates a get by key resolved, for the next gets on the edge.

        Later gets visit this list instead of asking discovery and `_reader`
        per producer; it is dropped whenever discovery scans, a producer is
        released, descriptors are shed or the connector closes. Kept only
        when the pass saw every producer with nothing short or shed.
        """
        if look.complete and self._sheds == look.sheds:
            self._edge_readers[edge] = resolved

    # -- a get with a descriptor -----------------------------------------------------------

    def claim_descriptor(
        self, edge: Edge, key: str, descriptor: RingDescriptor, borrow: bool = False
    ) -> Delivery:
        """The exact frame a ring descriptor names, claimed once (PRODUCER_GONE first)."""
        deployment = self._deployment
        assert deployment is not None  # joined
        producer = descriptor.producer
        if producer not in deployment.discovery.producers.get(
            edge, ()
        ) or not deployment.liveness.is_alive(producer):
            self.release(edge, producer)
            return GONE
        reader = self._reader(edge, producer)
        if reader is None:
            return GONE
        self._claiming = reader
        try:
            if borrow:
                borrower = frame_borrower(self.pool, producer, self.cohorts, edge)
                got = reader.get(key, descriptor.position, mode=_LEASE, decode=borrower)
                if got.status is _DELIVERED:
                    return self._delivered(edge, producer, reader, got.payload, True, None)
            else:
                decode = frame_decoder(self.pool, producer, self.cohorts, edge)
                got = reader.get(key, descriptor.position, decode=decode)
        except CohortPending:
            return NOT_FOUND  # its cohort is not committed: the descriptor is good later
        except CorruptFrameError:
            if reader.shrunk is not None:
                self._release_closed(edge, producer, reader)  # truncated: attached afresh later
            raise
        finally:
            self._claiming = None
        if got.status is _DELIVERED:
            return self._delivered(edge, producer, reader, got.payload, False, None)
        if got.status is _BUSY:
            return BUSY
        return STALE

    # -- the mapped rings --------------------------------------------------------------------

    def _reader(self, edge: Edge, producer: ConnectorIdentity) -> RingReader | None:
        """The mapped ring of `producer` on `edge`; None (and released) when it is gone."""
        readers = self.readers
        reader = readers.get((edge, producer))
        if reader is not None:
            # Most recently used last; `del` and the store run no call in between,
            # so no signal handler can stop us with the reader out (issue 24).
            del readers[(edge, producer)]
            readers[(edge, producer)] = reader
        if reader is None:
            deployment = self._deployment
            assert deployment is not None  # joined
            directory = deployment.directory
            path = ring_path(directory.path, edge[0], edge[1], producer)
            with deferred_signals():  # a descriptor and a mapping, kept (`lifecycle`)
                try:
                    reader = retry_short_of_descriptors(
                        "a ring mapping",
                        lambda: RingReader.attach(path, os_facade=self._os, directory=directory),
                        self._shed,
                    )
                except ProducerGoneError:
                    self.release(edge, producer)
                    return None
                except CorruptFrameError as error:
                    logger.warning("shmring: ignoring a corrupt ring %s: %s", path, error)
                    self.release(edge, producer)
                    return None
                if (*reader.producer, reader.instance) != producer:
                    named = (*reader.producer, reader.instance)
                    reader.close()
                    logger.warning("shmring: ring %s names producer=%s", path, named)
                    self.release(edge, producer)
                    return None
                self.readers[(edge, producer)] = reader
        elif reader.producer_closed:
            if self._release_closed(edge, producer, reader):
                return self._reader(edge, producer)  # the re-created ring, attached now
            return None
        return reader

    def _release_closed(self, edge: Edge, producer: ConnectorIdentity, reader: RingReader) -> bool:
        """Drop the reader of a ring that closed or shrank; answer whether its producer re-created it.

        A producer that re-created its ring (issue 22: a neighbour unlinked
        or truncated the file) keeps its name and identity, so discovery
        keeps listing it and the slot's pool mappings stay; only this
        mapping goes, and the next get attaches the new file by path.
        """
        if reader.is_replaced():
            self._edge_readers.pop(edge, None)
            if self.readers.get((edge, producer)) is reader:
                del self.readers[(edge, producer)]
            reader.close()
            return True
        self.release(edge, producer)
        return False

    # -- receiver: releasing mapped rings ------------------------------------------------------

    def scanned(self) -> None:
        """After a discovery scan: for the edges whose producers changed, forget the kept
        candidates and unmap the rings of producers discovery no longer lists.

        A get by key visits only the producers discovery still lists, so a
        producer that left would otherwise stay mapped (fd and mapping of a
        deleted file) until this connector closes. Only what changed is
        looked at (issue 25): an edge whose producers the scan found the same
        keeps its candidates, since the scan itself found each of them alive
        (it prunes the markers of dead ones: their edges change). A listed
        producer that closed is released after a miss (`claim_by_key`).
        """
        deployment = self._deployment
        assert deployment is not None  # joined
        known = deployment.discovery.producers
        before, self._known = self._known, known
        changed = {
            edge for edge in before.keys() | known.keys() if before.get(edge) != known.get(edge)
        }
        for edge in changed:
            self._edge_readers.pop(edge, None)
        for edge, producer in [slot for slot in self.readers if slot[0] in changed]:
            if producer not in known.get(edge, ()):
                self.release(edge, producer)

    def release(self, edge: Edge, producer: ConnectorIdentity) -> None:
        """Drop our mapping of a producer that closed or exited (on `edge`; its reader is in
        no other edge's candidates, which stay kept)."""
        self._edge_readers.pop(edge, None)
        reader = self.readers.pop((edge, producer), None)
        if reader is not None:
            reader.close()
        if self.pool is not None:
            self.pool.release_producer(producer)
        if self._deployment is not None:
            self._deployment.discovery.release(edge, producer)

    def shed(self) -> int:
        """Unmap half of the mapped rings (least recently used first); answers how many.

        Never the ring a claim runs on (`_claiming`): its frame is locked and
        mid-decode, and unmapping it would lose the claim.
        """
        self._sheds += 1
        self._edge_readers.clear()  # it holds readers closed below
        idle = [slot for slot, reader in self.readers.items() if reader is not self._claiming]
        count = (len(idle) + 1) // 2
        for slot in idle[:count]:
            self.readers.pop(slot).close()
        return count

    def close_readers(self) -> None:
        """Unmap every ring we read. Idempotent."""
        self._edge_readers.clear()
        for slot in list(self.readers):
            self.readers.pop(slot).close()

    def wake_values(self, edge: Edge) -> list[int]:
        """The wakeup sequences of the rings we read on `edge` (they move when a frame arrives)."""
        values = []
        for (reader_edge, _), reader in self.readers.items():
            if reader_edge == edge:
                with contextlib.suppress(ClosedError, CorruptFrameError):
                    values.append(reader.wakeup_sequence)  # a shrunk ring: its get reports it
        return values
