"""A transfer component's place in its scope: a member, like a connector (`ScopeMember`).

Design rationale. A `TransferSender` and its `Registry` create files in the
deployment directory, so they are members of the scope exactly as a
`Connector` is (issue 22, defect 1; issue 26, "the registered path has no
liveness file"):

* each holds a shared lock on ``members`` (`shmring.impl.discovery.
  Membership`) for as long as it is open, so no connector's close and no
  `shmring gc` tears the directory down while a sender lives (teardown is
  the last member's, under the exclusive lock);
* the process holds its liveness file ``live.<pid>.<start time>`` (an OFD
  lock, `shmring.impl.liveness.hold_liveness_file`), so a receiver's reclaim,
  `gc` and `stat` in any pid namespace judge a sender's segments and arena by
  the kernel's lock verdict, the connector's, and never remove a live
  sender's files;
* every file goes through the verified directory descriptor the membership
  holds. When that directory was removed anyway (a same-uid neighbour's
  ``rm -rf``: st_nlink == 0, the kernel refuses new files there) the next
  `get` joins again, which creates a private directory or refuses one not
  ours with ConfigurationError: never a file in a directory we did not verify.

Joined on first use (the first file), left at `close`.
"""

from __future__ import annotations

import contextlib
import logging

from ..directory import DeploymentDirectory, open_deployment_directory
from ..discovery.gc import remove_unused_directory
from ..discovery.membership import Membership
from ..errors import ConfigurationError, ShmringError
from ..liveness import hold_liveness_file, release_liveness_file
from ..names import deployment_directory
from ..os_seam import OsFacade

logger = logging.getLogger("shmring.transfer")


class ScopeMember:
    """The deployment directory of a transfer component, held as a member of the scope."""

    _membership: Membership | None = None
    _holds_liveness = False
    _join_failed = False  # a join failed: what it made may be left (removed at `close`)

    def __init__(self, scope: str, os_facade: OsFacade, shm_root: str) -> None:
        self.scope = scope
        self._os = os_facade
        self._shm_root = shm_root
        self.reopened = 0  # times the held directory was found removed and joined again

    def _ensure(self) -> DeploymentDirectory:
        try:
            return open_deployment_directory(self.scope, self._os, self._shm_root)
        except ConfigurationError as error:
            raise ConfigurationError(
                f"{error}; remedy: remove that path (if it is yours) or pick another "
                f"scope or shm_root"
            ) from error

    def get(self) -> DeploymentDirectory:
        """The verified directory we are a member of, joined (again) when needed (one fstat)."""
        held = self.current()
        if held is not None:
            try:
                removed = held.is_removed()
            except OSError:
                removed = False  # cannot tell (an injected fault): the verified one is kept
            if not removed:
                return held
        if self._membership is not None:
            self._leave(teardown=False)
            self.reopened += 1
        try:
            membership = Membership.join(None, self._os, ensure_directory=self._ensure)
        except BaseException:
            # It may have made the directory (and ``members``) before it
            # failed: `close` removes them if no member uses them.
            self._join_failed = True
            raise
        directory = membership.directory
        assert isinstance(directory, DeploymentDirectory)
        try:
            hold_liveness_file(directory, self._os)
            self._holds_liveness = True
        except OSError as error:
            # Without it observers in our own pid namespace still judge us by
            # (pid, start time); others cannot (as for a connector).
            logger.warning(
                "shmring: cannot hold our liveness file in %s: %s", directory.path, error
            )
        except BaseException:
            membership.leave()
            directory.close()
            raise
        self._membership = membership
        return directory

    @property
    def path(self) -> str:
        return deployment_directory(self.scope, self._shm_root)

    @property
    def joined(self) -> bool:
        return self._membership is not None and self._membership.joined

    def current(self) -> DeploymentDirectory | None:
        """The directory held now, never joined or re-created here (None: none held)."""
        membership = self._membership
        if membership is None:
            return None
        directory = membership.directory
        assert isinstance(directory, DeploymentDirectory)
        return directory if directory.fd >= 0 else None

    def _leave(self, teardown: bool) -> None:
        membership, self._membership = self._membership, None
        if membership is None:
            return
        directory = membership.directory
        assert isinstance(directory, DeploymentDirectory)
        try:
            if self._holds_liveness:
                self._holds_liveness = False
                release_liveness_file(directory, self._os)
        finally:
            try:
                if teardown:
                    membership.leave()  # the last member out removes the directory
                else:
                    membership.abandon()
            finally:
                directory.close()

    def close(self) -> None:
        """Release the liveness file and leave; the last member out tears the directory down.

        After a join that failed (an OS error once it made the directory or
        ``members``), what it made goes too if no member uses it: as `shmring
        gc` removes an unused directory, by the teardown protocol.
        """
        self._leave(teardown=True)
        if self._join_failed:
            self._join_failed = False
            self._remove_if_unused()

    def _remove_if_unused(self) -> None:
        try:
            directory = open_deployment_directory(
                self.scope, self._os, self._shm_root, create=False
            )
        except (OSError, ShmringError):
            return  # none there, or not ours: nothing of ours to remove
        try:
            with contextlib.suppress(OSError, ShmringError):
                remove_unused_directory(directory, self._os)
        finally:
            directory.close()


__all__ = ["ScopeMember"]
