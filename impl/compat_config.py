"""What a `SharedMemoryConnector` config and environment mean: checked, with vllm-omni's defaults.

The config keys at the top level or nested under ``extra`` (the top level
wins), each value checked (ConfigurationError naming it), an unknown key
logged as a warning naming it; the environment's ``VLLM_OMNI_SHM_WAKEUP``
and ``VLLM_OMNI_SHM_COHORT_NAMESPACE`` read as vllm-omni reads them; the
deployment scope a config names. `impl.compat` (the facade) is the one user;
docs/conformance.md has every behaviour, and why.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
from collections.abc import Mapping
from typing import Any, Final

from .errors import ConfigurationError

logger = logging.getLogger("shmring.compat")  # the facade's logger: one name for its warnings

_SCOPE_PATTERN: Final = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")
_SCOPE_DIGEST_LENGTH: Final = 24
# vllm-omni's defaults and environment variables.
DEFAULT_THRESHOLD_BYTES: Final = 65536
WAKEUP_ENVIRONMENT: Final = "VLLM_OMNI_SHM_WAKEUP"
COHORT_NAMESPACE_ENVIRONMENT: Final = "VLLM_OMNI_SHM_COHORT_NAMESPACE"
_COHORT_NAMESPACE_PATTERN: Final = re.compile(r"[a-zA-Z0-9_-]{1,64}")
_STAGE_ID_PATTERN: Final = re.compile(r"-?[0-9]+")
# The config keys this facade reads, and those vllm-omni's stage plans add to
# every connector's config that mean nothing to a shared-memory connector.
KNOWN_CONFIG_KEYS: Final = frozenset(
    {
        "stage_id",
        "wakeup_scope",
        "host_ring_bytes",
        "fallback_budget_bytes",
        "pool_budget_bytes",
        "shm_root",
        "extra",
        "shm_threshold_bytes",
        "raw_tensor_shm",
        "shm_event_notifications",
        "shm_notification_namespace",
    }
)
PASSIVE_CONFIG_KEYS: Final = frozenset({"role", "device", "name"})


def _config_value(config: Mapping[str, Any], name: str, default: Any) -> Any:
    """`name` from the top level of `config`, else from ``config["extra"]``, else `default`."""
    if name in config:
        return config[name]
    extra = config.get("extra")
    if isinstance(extra, Mapping) and name in extra:
        return extra[name]
    return default


def _digest_scope(scope: object) -> str:
    text = str(scope)
    if _SCOPE_PATTERN.fullmatch(text) and ".." not in text:
        return text
    return "h" + hashlib.sha256(text.encode("utf-8")).hexdigest()[:_SCOPE_DIGEST_LENGTH]


def scope_from_config(config: Mapping[str, Any]) -> str:
    """The deployment scope for a config: ``wakeup_scope`` if usable, its digest otherwise.

    Without a ``wakeup_scope``, vllm-omni's ``shm_notification_namespace``
    names it (its notifications and its data are one deployment here); with
    neither, the launching parent's pid.
    """
    scope = _config_value(config, "wakeup_scope", None)
    namespace = _config_value(config, "shm_notification_namespace", None)
    if scope is None and namespace is not None:
        scope = namespace
    if scope is None:
        return f"ppid{os.getppid()}"
    return _digest_scope(scope)


def _check_config(config: Mapping[str, Any]) -> None:
    """ConfigurationError for a bad value of a key vllm-omni accepts; a warning for unknown keys."""
    for where in (config, config.get("extra")):
        if not isinstance(where, Mapping):
            continue
        for key in where:
            if key in KNOWN_CONFIG_KEYS or key in PASSIVE_CONFIG_KEYS:
                continue
            logger.warning("shmring: SharedMemoryConnector ignores the unknown config key %r", key)
    stage_id = _config_value(config, "stage_id", -1)
    if not (
        stage_id is None
        or (isinstance(stage_id, int) and not isinstance(stage_id, bool))
        or (isinstance(stage_id, str) and _STAGE_ID_PATTERN.fullmatch(stage_id))
    ):
        raise ConfigurationError(
            f"stage_id must be an int, a decimal string or None: stage_id={stage_id!r}"
        )
    threshold = _config_value(config, "shm_threshold_bytes", DEFAULT_THRESHOLD_BYTES)
    if not isinstance(threshold, int) or isinstance(threshold, bool) or threshold < 0:
        raise ConfigurationError(
            f"shm_threshold_bytes must be an int >= 0: shm_threshold_bytes={threshold!r}"
        )
    for name in ("raw_tensor_shm", "shm_event_notifications"):
        value = _config_value(config, name, False)
        if not isinstance(value, bool):
            raise ConfigurationError(f"{name} must be a bool: {name}={value!r}")
    scope = _config_value(config, "wakeup_scope", None)
    namespace = _config_value(config, "shm_notification_namespace", None)
    if namespace is not None:
        if not isinstance(namespace, str) or not namespace:
            raise ConfigurationError(
                f"shm_notification_namespace must be a non-empty str: "
                f"shm_notification_namespace={namespace!r}"
            )
        if scope is not None and _digest_scope(scope) != _digest_scope(namespace):
            raise ConfigurationError(
                "shm_notification_namespace names the deployment whose puts wake this "
                f"connector, so it must be its wakeup_scope: wakeup_scope={scope!r} "
                f"shm_notification_namespace={namespace!r}"
            )
    wakeup = os.environ.get(WAKEUP_ENVIRONMENT, "1")
    if wakeup not in ("0", "1"):
        raise ConfigurationError(
            f"{WAKEUP_ENVIRONMENT} must be 0 or 1: {WAKEUP_ENVIRONMENT}={wakeup!r}"
        )
    cohort_namespace = os.environ.get(COHORT_NAMESPACE_ENVIRONMENT, "")
    if cohort_namespace and not _COHORT_NAMESPACE_PATTERN.fullmatch(cohort_namespace):
        raise ConfigurationError(
            f"{COHORT_NAMESPACE_ENVIRONMENT} must be 1-64 letters, digits, '-' or '_': "
            f"{COHORT_NAMESPACE_ENVIRONMENT}={cohort_namespace!r}"
        )


def _wakeups_enabled() -> bool:
    """vllm-omni's switch: ``VLLM_OMNI_SHM_WAKEUP=0`` turns wake-ups off (read at every call)."""
    return os.environ.get(WAKEUP_ENVIRONMENT, "1") == "1"


def _receiving_stage(stage_id: Any) -> str | None:
    """The stage whose puts wake this connector: a stage id >= 0, as its decimal string."""
    try:
        number = int(stage_id)
    except (TypeError, ValueError):
        return None  # non-numeric stage names keep the timed poll, as in vllm-omni
    if isinstance(stage_id, bool) or number < 0:
        return None
    return str(number)
