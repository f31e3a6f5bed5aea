"""shmring: host shared-memory transports for multi-process inference pipelines.

`shmring.spec` is the model, `shmring.impl` the implementation; this package
re-exports the implementation's public API.

Importing ``shmring`` is cheap: every name loads on first use, so
``import shmring`` (and so ``import shmring.spec``) imports no part of the
implementation, nor msgspec, numpy or torch; the codec imports torch only
when a payload holds a tensor. The base install is numpy, msgspec and
xxhash; torch, PyAV, cuda-python and the checking toolkit are extras
(`shmring.impl.extras`), and a feature used without its extra raises
`MissingExtraError` naming it.
"""

from __future__ import annotations

import importlib
import os
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# In a source checkout the subpackages other than shmring.check live in sibling
# folders (pyproject.toml's package-dir: spec/ is shmring.spec, impl/ is
# shmring.impl, ...). Python run from the checkout's root (`python -m pytest`,
# `python -m shmring.fault_injection.fault_cells`) puts the root first on
# sys.path, so it finds this folder before the installed (editable) package:
# the siblings are searched too. An installed shmring (a wheel, or the
# editable install's link tree) holds them inside this folder and skips this.
_HERE = os.path.dirname(os.path.abspath(__file__))
if not os.path.isdir(os.path.join(_HERE, "spec")):
    _CHECKOUT = os.path.dirname(_HERE)
    if os.path.isfile(os.path.join(_CHECKOUT, "spec", "__init__.py")):
        __path__.append(_CHECKOUT)

# name -> module that defines it, loaded on first attribute access.
_LAZY: dict[str, str] = {
    "BackPressureError": "shmring.impl.errors",
    "BrokenError": "shmring.impl.errors",
    "ClosedError": "shmring.impl.errors",
    "ConfigurationError": "shmring.impl.errors",
    "CorruptFrameError": "shmring.impl.errors",
    "DirectoryReplacedError": "shmring.impl.errors",
    "FileAccessError": "shmring.impl.errors",
    "ForkedError": "shmring.impl.errors",
    "FrameTooLargeError": "shmring.impl.errors",
    "InvalidKeyError": "shmring.impl.errors",
    "MissingExtraError": "shmring.impl.errors",
    "NoSpaceError": "shmring.impl.errors",
    "ProducerGoneError": "shmring.impl.errors",
    "RegistrationError": "shmring.impl.errors",
    "RegistryPoisonedError": "shmring.impl.errors",
    "ResourceExhaustedError": "shmring.impl.errors",
    "ShmringError": "shmring.impl.errors",
    "StaleDescriptorError": "shmring.impl.errors",
    "UnsupportedPayloadError": "shmring.impl.errors",
    "Connector": "shmring.impl.connector",
    "ConnectorHealth": "shmring.impl.connector",
    "Delivery": "shmring.impl.connector",
    "Descriptor": "shmring.impl.connector",
    "FallbackDescriptor": "shmring.impl.connector",
    "GetStatus": "shmring.spec.status",
    "PutStatus": "shmring.spec.status",
    "PoolDescriptor": "shmring.impl.connector",
    "RingDescriptor": "shmring.impl.connector",
    "Route": "shmring.impl.connector",
    "descriptor_from_dict": "shmring.impl.connector",
    "SharedMemoryConnector": "shmring.impl.compat",
    "register_type": "shmring.impl.extensions",
    "unregister_type": "shmring.impl.extensions",
}

if TYPE_CHECKING:
    from shmring.impl.compat import SharedMemoryConnector
    from shmring.impl.connector import (
        Connector,
        ConnectorHealth,
        Delivery,
        Descriptor,
        FallbackDescriptor,
        PoolDescriptor,
        RingDescriptor,
        Route,
        descriptor_from_dict,
    )
    from shmring.impl.errors import (
        BackPressureError,
        BrokenError,
        ClosedError,
        ConfigurationError,
        CorruptFrameError,
        DirectoryReplacedError,
        FileAccessError,
        ForkedError,
        FrameTooLargeError,
        InvalidKeyError,
        MissingExtraError,
        NoSpaceError,
        ProducerGoneError,
        RegistrationError,
        RegistryPoisonedError,
        ResourceExhaustedError,
        ShmringError,
        StaleDescriptorError,
        UnsupportedPayloadError,
    )
    from shmring.impl.extensions import register_type, unregister_type
    from shmring.spec.status import GetStatus, PutStatus


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'shmring' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "BackPressureError",
    "BrokenError",
    "ClosedError",
    "ConfigurationError",
    "Connector",
    "ConnectorHealth",
    "CorruptFrameError",
    "Delivery",
    "Descriptor",
    "DirectoryReplacedError",
    "FallbackDescriptor",
    "FileAccessError",
    "ForkedError",
    "FrameTooLargeError",
    "GetStatus",
    "InvalidKeyError",
    "MissingExtraError",
    "NoSpaceError",
    "ProducerGoneError",
    "PutStatus",
    "RegistrationError",
    "PoolDescriptor",
    "RegistryPoisonedError",
    "ResourceExhaustedError",
    "RingDescriptor",
    "Route",
    "SharedMemoryConnector",
    "ShmringError",
    "StaleDescriptorError",
    "UnsupportedPayloadError",
    "__version__",
    "register_type",
    "unregister_type",
    "descriptor_from_dict",
]
