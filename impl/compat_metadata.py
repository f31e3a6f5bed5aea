"""The vllm-omni facade's metadata: what a put hands the receiver, and which receiver a get's names.

A put's metadata is ``{"host_ring": <descriptor>, "size": n}`` for a ring
frame and ``{"shm": <descriptor>, "size": n}`` for what the ring does not
take (`compat` has the whole shape). A get's metadata may be that, or a
dict keyed by the get key holding it; anything else is looked up by key.
A descriptor's ``name`` may name another scope's deployment of the same
uid under the same shm root: `ForeignReceivers` keeps a receiver for each
of the last `MAX_FOREIGN_SCOPES` such scopes.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any, Final

from ..spec.connector import Route
from .connector import Connector, Descriptor, descriptor_from_dict
from .errors import ConfigurationError, CorruptFrameError, ShmringError
from .names import DIRECTORY_PREFIX, deployment_directory
from .os_seam import OsFacade

logger = logging.getLogger("shmring.compat")

RING_METADATA_KEY: Final = "host_ring"
SEGMENT_METADATA_KEY: Final = "shm"
# Receivers of other scopes a facade keeps open, for descriptors naming them.
MAX_FOREIGN_SCOPES: Final = 4


def put_metadata(descriptor: Descriptor, name: str) -> dict[str, Any]:
    """The metadata a put answers for `descriptor`, whose file is `name` under the shm root."""
    key = RING_METADATA_KEY if descriptor.route is Route.RING else SEGMENT_METADATA_KEY
    fields = descriptor.to_dict()
    fields["name"] = name
    return {key: fields, "size": descriptor.size}


def descriptor_in_metadata(get_key: str, metadata: Any) -> tuple[Descriptor, Any] | None:
    """The descriptor of `get_key` that `metadata` carries and its ``name``; None: look up by key.

    None for vllm-omni's own shm metadata, metadata of another key, a
    malformed descriptor (logged) or anything else.
    """
    if isinstance(metadata, Mapping) and get_key in metadata:
        metadata = metadata[get_key]
    if not isinstance(metadata, Mapping):
        return None
    for name, route in ((RING_METADATA_KEY, Route.RING), (SEGMENT_METADATA_KEY, Route.FALLBACK)):
        data = metadata.get(name)
        if not isinstance(data, Mapping) or "producer" not in data:
            continue
        if data.get("pool") is True:
            route = Route.POOL  # what the ring does not take, its reference on the ring
        try:
            descriptor = descriptor_from_dict(route, data)
        except CorruptFrameError as error:
            logger.warning("shmring: ignoring malformed metadata for key=%r: %s", get_key, error)
            return None
        if descriptor.key != get_key:
            return None  # metadata of another key: look up by key
        return descriptor, data.get("name")
    return None


class ForeignReceivers:
    """Receivers in the deployments descriptors name (other scopes, same uid and shm root).

    At most `MAX_FOREIGN_SCOPES`, least recently used closed first; `close`
    closes them all.
    """

    def __init__(self, shm_root: str, os_facade: OsFacade | None) -> None:
        self.shm_root = shm_root
        self._os_facade = os_facade
        self._receivers: OrderedDict[str, Connector] = OrderedDict()  # scope -> its receiver

    def __len__(self) -> int:
        return len(self._receivers)

    def receiver(self, directory: str, get_key: str) -> Connector | None:
        """The receiver of deployment `directory`, joined once and kept.

        None (the get answers None) for a name that is not one of this uid's
        deployments, a deployment that is gone, or one whose directory is
        not ours to trust (another owner, open to others: refused).
        """
        prefix = f"{DIRECTORY_PREFIX}{os.getuid()}-"
        scope = directory[len(prefix) :] if directory.startswith(prefix) else ""
        path = os.path.join(self.shm_root, directory)
        receivers = self._receivers
        try:
            if not scope or deployment_directory(scope, self.shm_root) != path:
                raise ConfigurationError(f"not a deployment of this uid: name={directory!r}")
            receiver = receivers.get(scope)
            if receiver is not None:
                receivers.move_to_end(scope)
                return receiver
            if not os.path.isdir(path):
                return None  # its producers are gone: nothing to find
            receiver = self._joined(scope)
        except ConfigurationError as error:
            logger.warning("shmring: refusing the descriptor of key=%r: %s", get_key, error)
            return None
        receivers[scope] = receiver
        while len(receivers) > MAX_FOREIGN_SCOPES:
            _, oldest = receivers.popitem(last=False)
            with contextlib.suppress(OSError, ShmringError):
                oldest.close()
        return receiver

    def _joined(self, scope: str) -> Connector:
        """A receive-only connector of `scope`, joined (closed again if joining fails)."""
        receiver = Connector(
            scope,
            ring_capacity=0,
            pool_budget_bytes=0,
            os_facade=self._os_facade,
            shm_root=self.shm_root,
        )
        try:
            receiver.join()
        except BaseException:
            with contextlib.suppress(OSError, ShmringError):
                receiver.close()
            raise
        return receiver

    def close(self) -> None:
        """Close every kept receiver (errors suppressed: a close retried later finishes them)."""
        receivers, self._receivers = self._receivers, OrderedDict()
        for receiver in receivers.values():
            with contextlib.suppress(OSError, ShmringError):
                receiver.close()


__all__ = [
    "MAX_FOREIGN_SCOPES",
    "RING_METADATA_KEY",
    "SEGMENT_METADATA_KEY",
    "ForeignReceivers",
    "descriptor_in_metadata",
    "put_metadata",
]
