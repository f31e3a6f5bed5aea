"""A facade with the call shapes of vllm-omni's ``SharedMemoryConnector``.

Design rationale. A pipeline that already talks to vllm-omni's connector
(and its base, ``OmniConnectorBase``) should switch by changing one import:
same constructor (a config dict), same `put` / `get` / `get_with_deadline`
/ `cleanup` / `abandon_get` / `reap_consumed` / `close` / `health`
signatures and return shapes, the static `serialize_obj` /
`deserialize_obj` (a subclass may override them: `put` and `get` go through
the overrides), `supports_raw_data`, `publication_cohort`, the wake-up calls
(`get_wakeup_generation` / `wait_for_change`, `wait_for_data` /
`event_notifications_enabled`), close on ``__del__`` and as a context
manager. Underneath is one `Connector` (one producer: each facade publishes
on its own rings, so a process may hold several on one edge); nothing here
decides routing, it only translates. vllm-omni's own connector tests are
this module's spec; where they and the seed's ring design differ the seed
wins (docs/conformance.md has every behaviour, and why):

* config: ``stage_id``, ``wakeup_scope``, ``host_ring_bytes``,
  ``fallback_budget_bytes``, ``pool_budget_bytes`` (0: no pool),
  ``shm_root`` and vllm-omni's ``shm_threshold_bytes``, ``raw_tensor_shm``,
  ``shm_event_notifications``, ``shm_notification_namespace``, at the top
  level or nested under ``extra`` (the top level wins); each value is
  checked (ConfigurationError naming it), an unknown key is logged as a
  warning naming it. The environment's ``VLLM_OMNI_SHM_WAKEUP`` (``0``:
  no wake-ups) and ``VLLM_OMNI_SHM_COHORT_NAMESPACE`` are read as
  vllm-omni reads them. Without a scope the stage processes of one
  deployment share their launching parent, so the parent pid names it. A
  scope that is not a valid directory name is replaced by a digest of it.
  The constructor joins the deployment at once, so an unusable deployment
  directory is a ConfigurationError there, not a refused put later.
* put metadata: ``{"host_ring": <descriptor>, "size": n}`` for a ring frame,
  ``{"shm": <descriptor>, "size": n}`` for what the ring does not take (a
  fallback segment, or a pool slot: then ``"pool": True`` and ``name`` is
  the ring file that carries its reference); both
  descriptors are plain dicts (msgpack/JSON friendly) whose ``"name"`` is
  the file's path relative to the shm root, as vllm-omni's segment names
  are (``os.path.join("/dev/shm", name)`` is the file). A refused put
  (back-pressure, no space, an unsupported payload, a closed connector)
  answers ``(False, 0, None)`` as vllm-omni's does, and is logged; an
  invalid key or stage id raises InvalidKeyError.
* get metadata may be the put's metadata, or a dict keyed by the get key
  holding it; anything else (missing, foreign, malformed) falls back to a
  lookup by key. A descriptor's ``name`` finds its file whatever this
  receiver's scope (the same uid's deployment under the same shm root; a
  directory of another owner is refused). A get answers ``(obj, size)`` or
  None; a frame another process holds locked answers None at once
  (vllm-omni's non-blocking lock); a payload that does not decode is
  removed, logged and answered None.
* deadlines are `time.monotonic()` values.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Iterator, Mapping
from typing import Any

from . import codec, extensions
from .compat_config import (
    DEFAULT_THRESHOLD_BYTES,
    KNOWN_CONFIG_KEYS,
    PASSIVE_CONFIG_KEYS,
    _check_config,
    _config_value,
    scope_from_config,
)
from .compat_metadata import (
    RING_METADATA_KEY,
    SEGMENT_METADATA_KEY,
    ForeignReceivers,
    descriptor_in_metadata,
    put_metadata,
)
from .compat_wakeups import StageWakeups
from .connector import (
    DEFAULT_FALLBACK_BUDGET,
    DEFAULT_RING_CAPACITY,
    Connector,
    Delivery,
    Descriptor,
)
from .connector.config import DEFAULT_POOL_BUDGET_BYTES
from .errors import (
    ConfigurationError,
    InvalidKeyError,
    ShmringError,
    UnsupportedPayloadError,
)
from .names import DEFAULT_SHM_ROOT
from .os_seam import OsFacade

logger = logging.getLogger("shmring.compat")


class SerializedPayload:
    """What a put sends when a subclass overrides `serialize_obj`: the bytes it made.

    The receiving facade hands them to its own `deserialize_obj` (a plain
    `Connector` receives this object).
    """

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data

    def __repr__(self) -> str:
        return f"SerializedPayload({len(self.data)} bytes)"


def _decode_serialized(state: Any) -> SerializedPayload:
    if not isinstance(state, bytes):
        raise TypeError(f"serialized payload state must be bytes: {type(state).__name__}")
    return SerializedPayload(state)


extensions.register_type(
    SerializedPayload, lambda payload: payload.data, _decode_serialized, name="shmring.serialized"
)
# vLLM's RequestOutput / CompletionOutput travel as themselves when vllm is installed.
extensions.register_vllm_types()


def _base_serialize(obj: Any) -> bytes:
    return codec.encode(obj)


def _base_deserialize(data: bytes | memoryview) -> Any:
    return extensions.restore_vllm_outputs(codec.decode(data))


class SharedMemoryConnector(StageWakeups):
    """vllm-omni's ``SharedMemoryConnector`` (and ``OmniConnectorBase``) over a shmring `Connector`."""

    # As vllm-omni's shared-memory connector: payloads go through `serialize_obj`'s codec.
    supports_raw_data: bool = False
    _connector: Connector | None = None  # set once construction succeeded (see __del__)
    _closed: bool = False

    def __init__(self, config: Mapping[str, Any], *, os_facade: OsFacade | None = None) -> None:
        if not isinstance(config, Mapping):
            raise ConfigurationError(f"config must be a dict: config={config!r}")
        _check_config(config)
        self.config = config
        self.stage_id = _config_value(config, "stage_id", -1)
        ring_bytes = _config_value(config, "host_ring_bytes", DEFAULT_RING_CAPACITY)
        budget = _config_value(config, "fallback_budget_bytes", DEFAULT_FALLBACK_BUDGET)
        shm_root = _config_value(config, "shm_root", DEFAULT_SHM_ROOT)
        pool_budget = _config_value(config, "pool_budget_bytes", DEFAULT_POOL_BUDGET_BYTES)
        self._threshold = _config_value(config, "shm_threshold_bytes", DEFAULT_THRESHOLD_BYTES)
        self.raw_tensor_shm = _config_value(config, "raw_tensor_shm", False)
        notifications = _config_value(config, "shm_event_notifications", False)
        self.scope = scope_from_config(config)
        self._os_facade = os_facade
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
        self._failed_gets = 0
        self._foreign = ForeignReceivers(shm_root, os_facade)
        cls = type(self)
        self._own_serialize = cls.serialize_obj is not SharedMemoryConnector.serialize_obj
        self._own_deserialize = cls.deserialize_obj is not SharedMemoryConnector.deserialize_obj
        self._data_seen: int | None = None  # `wait_for_data`'s last look at the stage bell
        if notifications:
            bell = (
                self._bell()
            )  # vllm-omni binds its socket at construction: puts from now on count
            self._data_seen = bell.value() if bell is not None else None

    @property
    def connector(self) -> Connector:
        """The shmring connector underneath."""
        assert self._connector is not None
        return self._connector

    @property
    def threshold(self) -> int:
        """vllm-omni's ``shm_threshold_bytes`` (default 64 KiB), read-only.

        It decided inline-or-SHM in vllm-omni's first connector and nothing
        in its current one; here the seed's ring decides (what it admits,
        ``host_ring_bytes`` / 4, rides the ring): kept for code that reads it.
        """
        return self._threshold  # type: ignore[no-any-return]

    # -- the wire codec ---------------------------------------------------------------------

    @staticmethod
    def serialize_obj(obj: Any) -> bytes:
        """The payload's wire encoding (shmring's codec; UnsupportedPayloadError if it does not travel)."""
        return _base_serialize(obj)

    @staticmethod
    def deserialize_obj(data: bytes | memoryview) -> Any:
        """The object `serialize_obj` encoded (CorruptFrameError for anything else).

        As vllm-omni's serializer: dicts shaped like vLLM's ``RequestOutput``
        / ``CompletionOutput`` come back as those classes when ``vllm.outputs``
        imports (`extensions.restore_vllm_outputs`).
        """
        return _base_deserialize(data)

    def _outgoing(self, data: Any) -> Any:
        """What a put publishes: `data`, or the bytes of an overridden `serialize_obj`."""
        if not self._own_serialize:
            return data
        blob = self.serialize_obj(data)
        if not isinstance(blob, (bytes, bytearray, memoryview)):
            raise UnsupportedPayloadError(
                f"serialize_obj must answer bytes: got {type(blob).__name__}"
            )
        return SerializedPayload(bytes(blob))

    def _incoming(self, value: Any) -> Any:
        """What a get answers for a received value: through `deserialize_obj` (overridden or not)."""
        if type(value) is SerializedPayload:
            return self.deserialize_obj(value.data)
        if self._own_deserialize:
            # An override reads bytes: the encoding the sender's serialize_obj made.
            return self.deserialize_obj(codec.encode(value))
        return extensions.restore_vllm_outputs(value)

    # -- put / get ----------------------------------------------------------------------

    def put(
        self, from_stage: Any, to_stage: Any, put_key: str, data: Any
    ) -> tuple[bool, int, dict[str, Any] | None]:
        """Publish `data`; answers (ok, payload bytes, metadata for the receiver).

        InvalidKeyError for a key or stage id that cannot name anything; every
        other refusal answers ``(False, 0, None)`` and is logged (after
        `close`, quietly: vllm-omni's answer).
        """
        if self._closed:
            return False, 0, None
        connector = self.connector
        try:
            descriptor = connector.put(from_stage, to_stage, put_key, self._outgoing(data))
        except InvalidKeyError:
            raise
        except ShmringError as error:
            self._failed_puts += 1
            logger.error("shmring: put failed for key=%r: %s", put_key, error)
            return False, 0, None
        name = os.path.relpath(connector.file_path(descriptor), self.shm_root)
        return True, descriptor.size, put_metadata(descriptor, name)

    def get(
        self, from_stage: Any, to_stage: Any, get_key: str, metadata: Any = None
    ) -> tuple[Any, int] | None:
        """Claim the key's payload; answers (obj, payload bytes) or None (also when locked)."""
        if self._closed:
            return None
        receiver, descriptor = self._receiver(get_key, metadata)
        if receiver is None:
            return None
        try:
            got = receiver.get(from_stage, to_stage, get_key, descriptor=descriptor)
        except InvalidKeyError:
            raise
        except (ShmringError, OSError) as error:
            return self._failed_get(get_key, error)
        return self._answer(got, get_key)

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
        if self._closed or time.monotonic() >= deadline:
            return None
        receiver, descriptor = self._receiver(get_key, metadata)
        if receiver is None:
            return None
        try:
            got = receiver.get_with_deadline(
                from_stage,
                to_stage,
                get_key,
                descriptor=descriptor,
                deadline=deadline,
                wait_for_locks=False,
            )
        except InvalidKeyError:
            raise
        except (ShmringError, OSError) as error:
            return self._failed_get(get_key, error)
        return self._answer(got, get_key)

    def _answer(self, got: Delivery, get_key: str) -> tuple[Any, int] | None:
        if not got.delivered:
            return None
        try:
            return self._incoming(got.value), got.size
        except Exception as error:  # noqa: BLE001 - an override's failure: vllm-omni logs it
            return self._failed_get(get_key, error)

    def _failed_get(self, get_key: str, error: BaseException) -> None:
        """A get that failed (vllm-omni's answer: None, logged, counted in health).

        A payload that does not decode is gone (retired, its file removed);
        any other failure (a damaged ring, a claim whose commit failed) left
        the payload where it was, for a later get.
        """
        self._failed_gets += 1
        logger.error("shmring: get failed for key=%r: %s", get_key, error)
        return None

    def _receiver(self, get_key: str, metadata: Any) -> tuple[Connector | None, Descriptor | None]:
        """The connector to get through and the descriptor the metadata names (None: by key)."""
        handle = descriptor_in_metadata(get_key, metadata)
        if handle is None:
            return self.connector, None
        descriptor, name = handle
        directory = name.split("/", 1)[0] if isinstance(name, str) else None
        if directory is None or directory == os.path.basename(self.connector.directory):
            return self.connector, descriptor
        return self._foreign.receiver(directory, get_key), descriptor

    # -- publication cohorts ---------------------------------------------------------------

    @contextlib.contextmanager
    def publication_cohort(self, from_stage: Any, to_stage: Any) -> Iterator[None]:
        """Keep the edge's puts inside the block invisible until all of them are made.

        On leaving the block every put made inside it becomes visible to
        every receiver at once, on every route; a producer killed inside the
        block publishes none of them (`spec.cohort`). A closed connector's
        block does nothing.
        """
        if self._closed:
            yield
            return
        with self.connector.publication_cohort(from_stage, to_stage):
            yield

    # -- cancellation and shutdown ----------------------------------------------------------

    def cleanup(self, request_id: str) -> bool:
        """Retire the exact key `request_id` (never a prefix); answer whether anything was retired.

        Returns within `locks.PRODUCER_LOCK_WAIT_SECONDS` per lock another
        process holds; what that lock kept it from doing is finished later
        (`reap_consumed`, the next put, close), counted in `health()`.
        """
        if self._closed:
            return False
        return self.connector.cleanup(request_id) > 0

    def cleanup_prefix(self, prefix: str) -> int:
        """Retire every `prefix` + digits key; answer how many versions."""
        if self._closed:
            return 0
        return self.connector.cleanup_prefix(prefix)

    def abandon_get(self, get_key: str) -> None:
        """Stop looking for `get_key`: forget the receive state kept for it (retires nothing)."""
        if not self._closed:
            self.connector.abandon_get(get_key)

    def reap_consumed(self) -> None:
        """Drop the bookkeeping of payloads other processes consumed (their budget frees).

        Also finishes what a lock another process held, or a failed unlink,
        left for later (never waits, never raises for it); also after close.
        """
        connector = self._connector
        if connector is not None:
            connector.reap_consumed()

    def close(self) -> None:
        """Remove everything this connector published. Idempotent; a later call retries what failed."""
        self._closed = True
        connector = self._connector
        bell, self._stage_bell = self._stage_bell, None
        if connector is not None and connector.inherited:
            bell = None  # a fork child's copy: the parent's waiter count is the parent's
        if bell is not None:
            with contextlib.suppress(OSError, ValueError):
                bell.unregister()
        foreign = getattr(self, "_foreign", None)
        if foreign is not None:
            foreign.close()
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
            "threshold": self._threshold,
            "host_ring_puts": h.ring_puts,
            "host_ring_gets": h.ring_gets,
            "host_ring_fallbacks": h.fallbacks,
            "pool_puts": h.pool_puts,
            "pool_gets": h.pool_gets,
            "refusals": h.refusals,
            "failed_puts": self._failed_puts,
            "failed_gets": self._failed_gets,
            "fallback_bytes": h.fallback_bytes,
            "failed_edges": h.failed_edges,
            "deferred_retires": h.deferred_retires,
            "deferred_pending": h.deferred_pending,
            "unlink_failures": h.unlink_failures,
            "unlink_retries": h.unlink_retries,
            "cohorts_committed": h.cohorts_committed,
        }

    @staticmethod
    def _make_key(key: str, from_stage: str, to_stage: str, separator: str = "@") -> str:
        """OmniConnectorBase's internal key: ``{key}{separator}{from_stage}_{to_stage}``."""
        return f"{key}{separator}{from_stage}_{to_stage}"

    def __enter__(self) -> SharedMemoryConnector:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


__all__ = [
    "KNOWN_CONFIG_KEYS",
    "PASSIVE_CONFIG_KEYS",
    "RING_METADATA_KEY",
    "SEGMENT_METADATA_KEY",
    "SerializedPayload",
    "SharedMemoryConnector",
    "scope_from_config",
]
