"""Optional dependencies: the `shmring[...]` extras and the one way to import them.

The base install is numpy, msgspec and xxhash: the ring, the pool and the
fallback carrying msgpack trees and numpy arrays. Everything else is an
extra, imported only where a feature needs it:

- `torch`: tensor payloads (the codec imports torch when a frame holds one)
  and the registered transfer (`shmring.impl.registered`);
- `video`: PyAV, the MP4 encoder (`shmring.impl.registered.video`);
- `cuda`: cuda-python, the real CUDA driver of the registered transfer;
- `check`: the campaign's toolkit (`shmring.check`);
- `all`: every one of them.

`import_extra(module, extra, feature)` imports an optional module or raises
`MissingExtraError` (a `ShmringError`) naming the extra to install.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Final

from .errors import MissingExtraError

# import name -> the extra of pyproject.toml that installs it.
EXTRAS: Final = {"torch": "torch", "av": "video", "cuda": "cuda"}


def import_extra(module: str, feature: str) -> ModuleType:
    """`module`, imported; MissingExtraError naming its extra when it is not installed."""
    try:
        return importlib.import_module(module)
    except ImportError as error:
        if isinstance(error, MissingExtraError):
            raise
        top = module.partition(".")[0]
        raise MissingExtraError(
            feature, top, EXTRAS[top], f"{type(error).__name__}: {error}"
        ) from error
