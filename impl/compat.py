"""A facade with the call shapes of vllm-omni's ``SharedMemoryConnector``.

Design rationale. A pipeline that already talks to vllm-omni's connector
should switch by changing one import: same constructor (a config dict),
same `put` / `get` / `get_with_deadline` / `cleanup` / `close` / `health`
signatures and return shapes. Underneath is one `Connector`; nothing here
decides routing, it only translates:

* config: ``stage_id``, ``wakeup_scope``, ``host_ring_bytes`` and
  ``fallback_budget_bytes``, at the top level or nested under ``extra``
  (the top level wins). Without a scope the stage processes of one
  deployment share their launching parent, so the parent pid names it. A
  scope that is not a valid directory name is replaced by a digest of it.
* put metadata: ``{"host_ring": <descriptor>, "size": n}`` for a ring frame,
  ``{"shm": <descriptor>, "size": n}`` for a fallback segment; both
  descriptors are plain dicts (msgpack/JSON friendly). A refused put
  (back-pressure, no space, an unsupported payload) answers
  ``(False, 0, None)`` as vllm-omni's does, and is logged.
* get metadata may be the put's metadata, or a dict keyed by the get key
  holding it; anything else (missing, foreign, malformed) falls back to a
  lookup by key. A get answers ``(obj, size)`` or None.
* deadlines are `time.monotonic()` values.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import time
from collections.abc import Mapping
from typing import Any, Final

from shmring.impl.connector import (
    DEFAULT_FALLBACK_BUDGET,
    DEFAULT_RING_CAPACITY,
    Connector,
    Delivery,
    Descriptor,
    descriptor_from_dict,
)
from shmring.impl.errors import ConfigurationError, CorruptFrameError, ShmringError
from shmring.impl.os_seam import OsFacade
from shmring.spec.connector import Route

logger = logging.getLogger("shmring.compat")

RING_METADATA_KEY: Final = "host_ring"
SEGMENT_METADATA_KEY: Final = "shm"
_SCOPE_PATTERN: Final = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")
_SCOPE_DIGEST_LENGTH: Final = 24


def _config_value(config: Mapping[str, Any], name: str, default: Any) -> Any:
    """`name` from the top level of `config`, else from ``config["extra"]``, else `default`."""
    if name in config:
        return config[name]
    extra = config.get("extra")
    if isinstance(extra, Mapping) and name in extra:
        return extra[name]
    return default


def scope_from_config(config: Mapping[str, Any]) -> str:
    """The deployment scope for a config: ``wakeup_scope`` if usable, its digest otherwise."""
    scope = _config_value(config, "wakeup_scope", None)
    if scope is None:
        return f"ppid{os.getppid()}"
    text = str(scope)
    if _SCOPE_PATTERN.fullmatch(text) and ".." not in text:
        return text
    return "h" + hashlib.sha256(text.encode("utf-8")).hexdigest()[:_SCOPE_DIGEST_LENGTH]


class SharedMemoryConnector:
    """vllm-omni's ``SharedMemoryConnector`` call shapes over a shmring `Connector`."""

    # vllm-omni's connectors serialize themselves; this one carries raw trees.
    supports_raw_data: bool = False

    def __init__(self, config: Mapping[str, Any], *, os_facade: OsFacade | None = None) -> None:
        if not isinstance(config, Mapping):
            raise ConfigurationError(f"config must be a dict: config={config!r}")
        self.config = config
        self.stage_id = _config_value(config, "stage_id", -1)
        ring_bytes = _config_value(config, "host_ring_bytes", DEFAULT_RING_CAPACITY)
        budget = _config_value(config, "fallback_budget_bytes", DEFAULT_FALLBACK_BUDGET)
        self.scope = scope_from_config(config)
        self._connector = Connector(
            self.scope, ring_capacity=ring_bytes, fallback_budget=budget, os_facade=os_facade
        )
        self._failed_puts = 0

    @property
    def connector(self) -> Connector:
        """The shmring connector underneath."""
        return self._connector

    # -- put / get ----------------------------------------------------------------------

    def put(
        self, from_stage: Any, to_stage: Any, put_key: str, data: Any
    ) -> tuple[bool, int, dict[str, Any] | None]:
        """Publish `data`; answers (ok, payload bytes, metadata for the receiver)."""
        try:
            descriptor = self._connector.put(from_stage, to_stage, put_key, data)
        except ShmringError as error:
            self._failed_puts += 1
            logger.error("shmring: put failed for key=%r: %s", put_key, error)
            return False, 0, None
        name = RING_METADATA_KEY if descriptor.route is Route.RING else SEGMENT_METADATA_KEY
        return True, descriptor.size, {name: descriptor.to_dict(), "size": descriptor.size}

    def get(
        self, from_stage: Any, to_stage: Any, get_key: str, metadata: Any = None
    ) -> tuple[Any, int] | None:
        """Claim the key's payload; answers (obj, payload bytes) or None."""
        descriptor = self._descriptor(get_key, metadata)
        got = self._connector.get(from_stage, to_stage, get_key, descriptor=descriptor)
        return _answer(got)

    def get_with_deadline(
        self,
        from_stage: Any,
        to_stage: Any,
        get_key: str,
        metadata: Any = None,
        *,
        deadline: float,
    ) -> tuple[Any, int] | None:
        """Like `get`, waiting (spin, then sleep) until `deadline`, a `time.monotonic()` value."""
        if time.monotonic() >= deadline:
            return self.get(from_stage, to_stage, get_key, metadata)
        descriptor = self._descriptor(get_key, metadata)
        got = self._connector.get_with_deadline(
            from_stage, to_stage, get_key, descriptor=descriptor, deadline=deadline
        )
        return _answer(got)

    def _descriptor(self, get_key: str, metadata: Any) -> Descriptor | None:
        if isinstance(metadata, Mapping) and get_key in metadata:
            metadata = metadata[get_key]
        if not isinstance(metadata, Mapping):
            return None
        for name, route in (
            (RING_METADATA_KEY, Route.RING),
            (SEGMENT_METADATA_KEY, Route.FALLBACK),
        ):
            data = metadata.get(name)
            if isinstance(data, Mapping) and "producer" in data:
                try:
                    descriptor = descriptor_from_dict(route, data)
                except CorruptFrameError as error:
                    logger.warning(
                        "shmring: ignoring malformed metadata for key=%r: %s", get_key, error
                    )
                    return None
                if descriptor.key != get_key:
                    return None  # metadata of another key: look up by key
                return descriptor
        return None  # vllm-omni's own shm metadata, or anything else: look up by key

    # -- cancellation and shutdown ----------------------------------------------------------

    def cleanup(self, request_id: str) -> int:
        """Retire the exact key `request_id` (never a prefix); answer how many versions."""
        return self._connector.cleanup(request_id)

    def cleanup_prefix(self, prefix: str) -> int:
        """Retire every `prefix` + digits key; answer how many versions."""
        return self._connector.cleanup_prefix(prefix)

    def close(self) -> None:
        """Remove everything this connector published. Idempotent."""
        self._connector.close()

    def health(self) -> dict[str, Any]:
        h = self._connector.health()
        return {
            "status": "closed" if h.closed else "healthy",
            "puts": h.puts,
            "gets": h.gets,
            "bytes_transferred": h.bytes_transferred,
            "host_ring_puts": h.ring_puts,
            "host_ring_gets": h.ring_gets,
            "host_ring_fallbacks": h.fallbacks,
            "refusals": h.refusals,
            "failed_puts": self._failed_puts,
            "fallback_bytes": h.fallback_bytes,
            "failed_edges": h.failed_edges,
        }

    def __enter__(self) -> SharedMemoryConnector:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _answer(got: Delivery) -> tuple[Any, int] | None:
    return (got.value, got.size) if got.delivered else None


__all__ = [
    "RING_METADATA_KEY",
    "SEGMENT_METADATA_KEY",
    "SharedMemoryConnector",
    "scope_from_config",
]
