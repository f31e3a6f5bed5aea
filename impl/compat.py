"""A facade with the call shapes of vllm-omni's ``SharedMemoryConnector``.

Design rationale. A pipeline that already talks to vllm-omni's connector
(and its base, ``OmniConnectorBase``) should switch by changing one import:
same constructor (a config dict), same `put` / `get` / `get_with_deadline`
/ `cleanup` / `abandon_get` / `reap_consumed` / `close` / `health`
signatures and return shapes, the static `serialize_obj` /
`deserialize_obj`, `supports_raw_data`, close on ``__del__`` and as a
context manager. Underneath is one `Connector` (one producer: each facade
publishes on its own rings, so a process may hold several on one edge);
nothing here decides routing, it only translates:

* config: ``stage_id``, ``wakeup_scope``, ``host_ring_bytes``,
  ``fallback_budget_bytes``, ``pool_budget_bytes`` (0: no pool) and
  ``shm_root``, at the top level or nested
  under ``extra`` (the top level wins). Without a scope the stage processes
  of one deployment share their launching parent, so the parent pid names
  it. A scope that is not a valid directory name is replaced by a digest of
  it. The constructor joins the deployment at once, so an unusable
  deployment directory is a ConfigurationError there, not a refused put later.
* put metadata: ``{"host_ring": <descriptor>, "size": n}`` for a ring frame,
  ``{"shm": <descriptor>, "size": n}`` for what the ring does not take (a
  fallback segment, or a pool slot: then ``"pool": True`` and ``name`` is
  the ring file that carries its reference); both
  descriptors are plain dicts (msgpack/JSON friendly) whose ``"name"`` is
  the file's path relative to the shm root, as vllm-omni's segment names
  are (``os.path.join("/dev/shm", name)`` is the file). A refused put
  (back-pressure, no space, an unsupported payload) answers
  ``(False, 0, None)`` as vllm-omni's does, and is logged; an invalid key
  or stage id raises InvalidKeyError.
* get metadata may be the put's metadata, or a dict keyed by the get key
  holding it; anything else (missing, foreign, malformed) falls back to a
  lookup by key. A get answers ``(obj, size)`` or None; a frame another
  process holds locked answers None at once (vllm-omni's non-blocking lock).
* deadlines are `time.monotonic()` values.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import time
from collections.abc import Mapping
from typing import Any, Final

from ..spec.connector import Route
from . import codec, extensions
from .connector import (
    DEFAULT_FALLBACK_BUDGET,
    DEFAULT_RING_CAPACITY,
    Connector,
    Delivery,
    Descriptor,
    descriptor_from_dict,
)
from .connector.config import DEFAULT_POOL_BUDGET_BYTES
from .errors import (
    ConfigurationError,
    CorruptFrameError,
    InvalidKeyError,
    ShmringError,
)
from .names import DEFAULT_SHM_ROOT
from .os_seam import OsFacade

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


# vLLM's RequestOutput / CompletionOutput travel as themselves when vllm is installed.
extensions.register_vllm_types()


class SharedMemoryConnector:
    """vllm-omni's ``SharedMemoryConnector`` (and ``OmniConnectorBase``) over a shmring `Connector`."""

    # As vllm-omni's shared-memory connector: payloads go through `serialize_obj`'s codec.
    supports_raw_data: bool = False
    _connector: Connector | None = None  # set once construction succeeded (see __del__)

    def __init__(self, config: Mapping[str, Any], *, os_facade: OsFacade | None = None) -> None:
        if not isinstance(config, Mapping):
            raise ConfigurationError(f"config must be a dict: config={config!r}")
        self.config = config
        self.stage_id = _config_value(config, "stage_id", -1)
        ring_bytes = _config_value(config, "host_ring_bytes", DEFAULT_RING_CAPACITY)
        budget = _config_value(config, "fallback_budget_bytes", DEFAULT_FALLBACK_BUDGET)
        shm_root = _config_value(config, "shm_root", DEFAULT_SHM_ROOT)
        pool_budget = _config_value(config, "pool_budget_bytes", DEFAULT_POOL_BUDGET_BYTES)
        self.scope = scope_from_config(config)
        connector = Connector(
            self.scope,
            ring_capacity=ring_bytes,
            fallback_budget=budget,
            pool_budget_bytes=pool_budget,
            os_facade=os_facade,
            shm_root=shm_root,
        )
        try:
            connector.join()  # an unusable deployment directory fails here, with its remedy
        except BaseException:
            with contextlib.suppress(OSError, ShmringError):
                connector.close()
            raise
        self.shm_root = shm_root
        self._connector = connector
        self._failed_puts = 0

    @property
    def connector(self) -> Connector:
        """The shmring connector underneath."""
        assert self._connector is not None
        return self._connector

    # -- the wire codec ---------------------------------------------------------------------

    @staticmethod
    def serialize_obj(obj: Any) -> bytes:
        """The payload's wire encoding (shmring's codec; UnsupportedPayloadError if it does not travel)."""
        return codec.encode(obj)

    @staticmethod
    def deserialize_obj(data: bytes | memoryview) -> Any:
        """The object `serialize_obj` encoded (CorruptFrameError for anything else)."""
        return codec.decode(data)

    # -- put / get ----------------------------------------------------------------------

    def put(
        self, from_stage: Any, to_stage: Any, put_key: str, data: Any
    ) -> tuple[bool, int, dict[str, Any] | None]:
        """Publish `data`; answers (ok, payload bytes, metadata for the receiver).

        InvalidKeyError for a key or stage id that cannot name anything; every
        other refusal answers ``(False, 0, None)`` and is logged.
        """
        connector = self.connector
        try:
            descriptor = connector.put(from_stage, to_stage, put_key, data)
        except InvalidKeyError:
            raise
        except ShmringError as error:
            self._failed_puts += 1
            logger.error("shmring: put failed for key=%r: %s", put_key, error)
            return False, 0, None
        name = RING_METADATA_KEY if descriptor.route is Route.RING else SEGMENT_METADATA_KEY
        fields = descriptor.to_dict()
        fields["name"] = os.path.relpath(connector.file_path(descriptor), self.shm_root)
        return True, descriptor.size, {name: fields, "size": descriptor.size}

    def get(
        self, from_stage: Any, to_stage: Any, get_key: str, metadata: Any = None
    ) -> tuple[Any, int] | None:
        """Claim the key's payload; answers (obj, payload bytes) or None (also when locked)."""
        descriptor = self._descriptor(get_key, metadata)
        got = self.connector.get(from_stage, to_stage, get_key, descriptor=descriptor)
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
        """Like `get`, waiting until `deadline` (a `time.monotonic()` value) for an absent key.

        A key that is not there yet is waited for (spin, then the deployment
        doorbell) until the deadline. A key whose frame is there but locked
        by another process (BUSY) answers None at once, as does a deadline
        already past (vllm-omni's semantics: a receive loop polls many keys
        and must never stall on one).
        """
        if time.monotonic() >= deadline:
            return None
        descriptor = self._descriptor(get_key, metadata)
        got = self.connector.get_with_deadline(
            from_stage,
            to_stage,
            get_key,
            descriptor=descriptor,
            deadline=deadline,
            wait_for_locks=False,
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
            if isinstance(data, Mapping) and data.get("pool") is True:
                route = Route.POOL  # what the ring does not take, its reference on the ring
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

    def cleanup(self, request_id: str) -> bool:
        """Retire the exact key `request_id` (never a prefix); answer whether anything was retired."""
        return self.connector.cleanup(request_id) > 0

    def cleanup_prefix(self, prefix: str) -> int:
        """Retire every `prefix` + digits key; answer how many versions."""
        return self.connector.cleanup_prefix(prefix)

    def get_wakeup_generation(self) -> int | None:
        """Snapshot before polling; a later put changes it (see `wait_for_change`). None: no doorbell."""
        return self.connector.wakeup_generation()

    def wait_for_change(self, generation: int | None, *, timeout: float) -> bool:
        """Block until something was published since `generation`, or `timeout`; answer which."""
        return self.connector.wait_for_change(generation, timeout)

    def abandon_get(self, get_key: str) -> None:
        """Stop looking for `get_key`: forget the receive state kept for it (retires nothing)."""
        self.connector.abandon_get(get_key)

    def reap_consumed(self) -> None:
        """Drop the bookkeeping of payloads other processes consumed (their budget frees)."""
        self.connector.reap_consumed()

    def close(self) -> None:
        """Remove everything this connector published. Idempotent."""
        connector = self._connector
        if connector is not None:
            connector.close()

    def __del__(self) -> None:
        # As OmniConnectorBase: a dropped connector closes itself. Never raise here.
        with contextlib.suppress(Exception):
            self.close()

    def health(self) -> dict[str, Any]:
        h = self.connector.health()
        return {
            "status": "closed" if h.closed else "healthy",
            "puts": h.puts,
            "gets": h.gets,
            "bytes_transferred": h.bytes_transferred,
            "host_ring_puts": h.ring_puts,
            "host_ring_gets": h.ring_gets,
            "host_ring_fallbacks": h.fallbacks,
            "pool_puts": h.pool_puts,
            "pool_gets": h.pool_gets,
            "refusals": h.refusals,
            "failed_puts": self._failed_puts,
            "fallback_bytes": h.fallback_bytes,
            "failed_edges": h.failed_edges,
        }

    @staticmethod
    def _make_key(key: str, from_stage: str, to_stage: str, separator: str = "@") -> str:
        """OmniConnectorBase's internal key: ``{key}{separator}{from_stage}_{to_stage}``."""
        return f"{key}{separator}{from_stage}_{to_stage}"

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
