"""Joining a deployment: the directory, its stamp, this producer's live file, leaving.

What `spec.discovery` and `spec.producers` assume exists once a connector
takes part: the verified deployment directory (held through `Membership`,
so the last connector to leave removes it), the discovery stamp and its
doorbell (`Stamp`; without one every get scans and no ring is set up), the
receiver's marker cache (`DiscoveryCache`, rescanned only when the stamp
moved), pidfd liveness, the producer's marker writer (`Registrar`) and its
fallback writer. A connector joins at its first put or get (or `join()`).

The live file says "this producer's connector is open" (`spec.producers.
is_delivering`: alive *and* not closed); a receiver holding a fallback
descriptor of a producer whose live file is gone answers PRODUCER_GONE.
Each connector is its own producer (pid, start time, instance), so the
live file is its own: no count is shared between connectors of a process.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass

from ..directory import DeploymentDirectory, open_deployment_directory
from ..discovery import DiscoveryCache, Membership, Registrar, Stamp
from ..errors import ConfigurationError, ShmringError
from ..fallback import FallbackWriter
from ..liveness import Liveness, hold_liveness_file, release_liveness_file
from ..names import ConnectorIdentity, live_file_name
from ..os_seam import FILE_MODE, OPEN_FLAGS_CREATE, OsFacade
from .config import ConnectorConfig

logger = logging.getLogger("shmring.connector")


@dataclass
class Deployment:
    """What a joined connector holds of its deployment (one per connector)."""

    directory: DeploymentDirectory  # the verified directory descriptor
    membership: Membership  # our shared lock on ``members``; the last to leave removes the dir
    stamp: Stamp | None  # discovery stamp and doorbell; None when it could not be opened
    liveness: Liveness  # pidfd liveness of every producer we asked about
    discovery: DiscoveryCache  # the receiver's marker cache
    registrar: Registrar | None  # the producer's markers; None without a stamp (no rings)
    writer: FallbackWriter  # the producer's per-key segments, with the budget
    live_path: str | None = None  # our live file, once created (removed at close)
    left: bool = False  # `leave` ran and closed what it could
    os_facade: OsFacade | None = None  # set while we hold our liveness file (released at `leave`)

    @classmethod
    def join(
        cls,
        config: ConnectorConfig,
        identity: ConnectorIdentity,
        os_facade: OsFacade,
        on_exhausted: Callable[[], int],
    ) -> Deployment:
        """Join `config.scope`'s directory; ConfigurationError (with its remedy) when unusable."""

        def ensure() -> DeploymentDirectory:
            try:
                return open_deployment_directory(config.scope, os_facade, config.shm_root)
            except ConfigurationError as error:
                raise ConfigurationError(
                    f"{error}; remedy: remove that path (if it is yours) or pick another "
                    f"scope or shm_root"
                ) from error

        membership: Membership | None = None
        holds_liveness = False
        try:
            # Inside the try (issue 24): an exception (a signal handler's) right after the
            # join returned must still leave the membership, or its lock keeps the directory.
            membership = Membership.join(None, os_facade, ensure_directory=ensure)
            directory = membership.directory
            assert isinstance(directory, DeploymentDirectory)
            try:
                hold_liveness_file(directory, os_facade)
                holds_liveness = True
            except OSError as error:
                # Without it (nothing is left of it) observers in our own pid
                # namespace still judge us by (pid, start time); others cannot.
                logger.warning("shmring: cannot hold our liveness file in %s: %s", directory, error)
            try:
                stamp: Stamp | None = Stamp.open(directory, os_facade)
            except (OSError, ShmringError) as error:
                # Discovery is unavailable: no rings of ours, and every get
                # scans. The fallback still carries everything.
                logger.warning("shmring: discovery stamp unavailable in %s: %s", directory, error)
                stamp = None
            liveness = Liveness(os_facade, identity, on_exhausted=on_exhausted, directory=directory)
            discovery = DiscoveryCache(directory, os_facade, liveness, stamp)
            # What dead members left (a restarted container's predecessors,
            # in any pid namespace) goes now, not at some receiver's scan.
            discovery.refresh_at_join()
            discovery.rescan_seconds = config.rescan_seconds
            registrar = Registrar(directory, os_facade, stamp, identity) if stamp else None
            writer = FallbackWriter(
                directory,
                identity,
                config.fallback_budget,
                os_facade,
                spare_bytes=config.fallback_spare_bytes,
                spare_min=config.fallback_spare_min_bytes,
            )
            deployment = cls(directory, membership, stamp, liveness, discovery, registrar, writer)
        except BaseException:
            if membership is not None:
                if holds_liveness:
                    release_liveness_file(membership.directory, os_facade)  # type: ignore[arg-type]
                membership.leave()
                membership.directory.close()
            raise
        deployment.os_facade = os_facade if holds_liveness else None
        return deployment

    # -- the live file ---------------------------------------------------------------

    def ensure_live_file(self, identity: ConnectorIdentity, os_facade: OsFacade) -> None:
        """Say "this producer's connector is open" (for fallback descriptors after close)."""
        if self.live_path is not None:
            return
        path = os.path.join(self.directory.path, live_file_name(identity))
        try:
            fd = self.directory.open(path, OPEN_FLAGS_CREATE, FILE_MODE)
        except FileExistsError:
            pass  # left by our own earlier, failed close
        except OSError as error:
            logger.warning("shmring: cannot create %s: %s", path, error)
            return
        else:
            os_facade.close(fd)
        self.live_path = path

    def is_live(self, producer: ConnectorIdentity) -> bool:
        """Whether `producer`'s live file exists (its connector was not closed)."""
        try:
            self.directory.stat(live_file_name(producer))
        except FileNotFoundError:
            return False
        return True

    def release_live_file(self) -> None:
        """Remove our live file (OSError other than "already gone" propagates; retried later)."""
        path = self.live_path
        if path is None:
            return
        if not self.left:
            with contextlib.suppress(FileNotFoundError):
                self.directory.unlink(path)
        self.live_path = None

    # -- leaving ---------------------------------------------------------------------

    def leave(self) -> None:
        """Close the stamp and pidfds, leave the membership; close the directory last.

        The directory stays open while the live file's unlink must be retried.
        Idempotent.
        """
        self.liveness.close()
        if self.stamp is not None:
            self.stamp.close()
        if self.os_facade is not None:
            os_facade, self.os_facade = self.os_facade, None
            release_liveness_file(self.directory, os_facade)
        self.membership.leave()
        if self.live_path is None and not self.left:
            self.directory.close()
            self.left = True
