"""A receiver's discovery cache: `spec.discovery.process_refresh`, over files.

Design rationale. The model keeps a set of markers and a stamp that strictly
increases with every change of the set; a receiver rescans only when the
stamp moved, and records the stamp it read *before* scanning. A producer
that registered during the scan bumped past that stamp, so the next refresh
rescans. Markers of producers found dead are pruned at the scan
(`Stamp.prune_and_bump`), and the other files dead producers left go from
the same listing (`shmring.impl.discovery.gc.reclaim_dead_files`,
`spec.discovery.process_reclaim`).

Every system call goes through the `OsFacade` the caller gives.
"""

from __future__ import annotations

import time

from ..directory import Directory, as_directory
from ..errors import ResourceExhaustedError, ShmringError
from ..lifecycle import deferred_signals
from ..liveness import Liveness
from ..names import ConnectorIdentity, Edge, parse_marker_file_name
from ..os_seam import OsFacade
from .gc import reclaim_dead_files
from .stamp import Stamp


class DiscoveryCache:
    """One receiver's view of the markers: rescanned only when the stamp moved.

    `stamp` may be None (the stamp file could not be opened): then every
    refresh scans, which is slower but never misses a producer.
    """

    def __init__(
        self,
        directory: str | Directory,
        os_facade: OsFacade,
        liveness: Liveness,
        stamp: Stamp | None,
    ) -> None:
        self.directory = as_directory(directory, os_facade)
        self._os = os_facade
        self._liveness = liveness
        self._stamp = stamp
        self.seen_stamp: int | None = None  # stamp read before the last scan (after own pruning)
        self.scans = 0
        self.pruned = 0
        self.reclaimed = 0  # files of dead producers this receiver removed at its scans
        # Rescan at least this often even when the stamp did not move (None: never);
        # set by the owner. The lockstep machines turn it off: the model has no clock.
        self.rescan_seconds: float | None = None
        self._scanned_at = 0.0  # monotonic time of the last scan
        self.reclaim_errors = 0  # reclaims that failed (retried at the next scan)
        self.last_reclaim_error: str | None = None
        # Producers with a live marker at the last scan, per edge; entries are
        # dropped (`release`) once a producer is found closed or dead.
        self.producers: dict[Edge, set[ConnectorIdentity]] = {}

    def refresh_at_join(self) -> None:
        """The first scan, at a connector's join: dead members' leftovers go now.

        A scope whose members all died (a restarted container, its pids
        counted from 1 again in a new pid namespace) gives its space back at
        the next member's join, a producer's included, not at some
        receiver's first get (`spec.discovery.process_join`). Files go
        (`reclaim_dead_files`); stale markers stay for a receiver's scan to
        prune, which moves the stamp. With none stale this is the scan a
        receiver's first get would have made (no stamp seen yet), so a get
        before the stamp moves scans nothing more; with some, the first get
        scans again and prunes them. A failure is counted and left to the
        next refresh.
        """
        stamp = self._stamp
        try:
            current = stamp.load() if stamp is not None else -1
            self._scan(current, prune=False)
        except (OSError, ShmringError) as error:
            self.reclaim_errors += 1
            self.last_reclaim_error = f"{type(error).__name__}: {error}"

    def refresh(self) -> bool:
        """Rescan if the stamp moved (or `rescan_seconds` passed); answer whether it scanned.

        `spec.discovery.process_refresh`: a scan reclaims dead producers' files,
        prunes stale markers (`spec.discovery.is_marker_stale`) and caches the
        stamp read before it (or after its own pruning).

        A killed producer moves no stamp; the periodic rescan is what bounds
        how long its files stay when nothing else changes in the deployment
        (issue 12). It costs one directory scan per `rescan_seconds` of a
        receiver that keeps polling; an unchanged poll in between costs one load.
        """
        stamp = self._stamp
        if stamp is not None:
            current = stamp.load()
            if current == self.seen_stamp and not self._rescan_due():
                return False
        else:
            current = -1
        with deferred_signals():  # readers' rings are attached, dead files removed (`lifecycle`)
            self._scan(current)
        return True

    def _rescan_due(self) -> bool:
        period = self.rescan_seconds
        return period is not None and time.monotonic() - self._scanned_at >= period

    def _scan(self, scanned_at: int, *, prune: bool = True) -> None:
        self.scans += 1
        self._scanned_at = time.monotonic()
        found: dict[Edge, set[ConnectorIdentity]] = {}
        stale: list[str] = []
        names = self.directory.names()
        for name in names:
            parsed = parse_marker_file_name(name)
            if parsed is None:
                continue
            edge, producer = parsed
            try:
                alive = self._liveness.is_alive(producer)
            except ResourceExhaustedError:
                alive = True  # cannot tell now: never prune on a doubt
            if alive:
                found.setdefault(edge, set()).add(producer)
            else:
                stale.append(name)
        # What dead producers left besides markers goes now (`spec.discovery.
        # process_reclaim`), from this scan's own listing: no extra scan.
        try:
            self.reclaimed += reclaim_dead_files(self.directory, names, self._os, self._liveness)
        except (OSError, ShmringError) as error:  # retried at the next scan
            self.reclaim_errors += 1
            self.last_reclaim_error = repr(error)
        seen: int | None = scanned_at
        stamp = self._stamp
        if stamp is None or (stale and not prune):
            seen = None  # the next refresh scans (and prunes)
        elif stale:
            pruned_at = stamp.prune_and_bump(self.directory, stale, scanned_at)
            if pruned_at is not None:
                self.pruned += len(stale)
                seen = pruned_at
        self.seen_stamp = seen
        self.producers = found

    def producers_of(self, edge: Edge) -> list[ConnectorIdentity]:
        """Producers of `edge` known from the last scan, in a stable order."""
        known = self.producers.get(edge)
        return sorted(known) if known else []

    def release(self, edge: Edge, producer: ConnectorIdentity) -> None:
        """Forget `producer` on `edge` (it closed or exited) until a scan shows it again."""
        known = self.producers.get(edge)
        if known is not None:
            known.discard(producer)
            if not known:
                del self.producers[edge]


__all__ = ["DiscoveryCache"]
