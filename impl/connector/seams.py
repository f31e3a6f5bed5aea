"""The test seams of a `Connector`, kept out of its production signature.

Two things only tests need: publishing as another process (a fault
campaign's one process stands in for several producers, live or dead, by
their (pid, start time)) and a hook handed to every ring the connector
creates (crash tests stop the producer at a stage of a put,
`channel.HOOK_*`). A production caller never wants either, so
`Connector(...)` does not take them; a test builds its connector with
`seamed_connector(scope, Seams(...), **options)`, which takes every
`Connector` option too. The OS port (`os_facade`) stays a `Connector`
option: every shmring object (rings, transfers, registries, the compat
facade) takes it the same way, and fault plans hand one facade to all the
objects of a scenario.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..os_seam import OsFacade
from ..ring.producer import PublishHook
from .config import ConnectorConfig
from .facade import Connector


@dataclass(frozen=True)
class Seams:
    """What a test changes about a connector; the defaults change nothing."""

    identity: tuple[int, int] | None = None  # publish as this (pid, start time), not ourselves
    publish_hook: PublishHook | None = None  # called by every ring at each stage of a put


def seamed_connector(
    scope: str, seams: Seams, *, os_facade: OsFacade | None = None, **options: Any
) -> Connector:
    """A `Connector(scope, os_facade=..., **options)` with `seams` applied (tests only)."""
    connector = Connector.__new__(Connector)
    connector._setup(ConnectorConfig(scope, **options), os_facade, seams)
    return connector
