"""The vllm-omni facade's wake-up calls: a receiver's stage bell, waited on.

vllm-omni's `get_wakeup_generation` / `wait_for_change` (a put to the
receiver's stage since a snapshot) and `wait_for_data` /
`event_notifications_enabled` (its event notifications), over this
receiver's stage bell (`discovery.StageBell`, issue 27), registered once,
before any snapshot, so every put to the stage from then on rings it.
`compat.SharedMemoryConnector` takes them from `StageWakeups`.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Final

from .compat_config import _receiving_stage, _wakeups_enabled
from .discovery.stamp import StageBell

if TYPE_CHECKING:
    from .connector import Connector

# One wait on a stage bell sleeps at most this long before it looks again.
_MAX_BELL_WAIT_SECONDS: Final = 1.0


class StageWakeups:
    """The wake-up calls of `compat.SharedMemoryConnector`, on its stage bell."""

    _closed: bool = False
    _stage_bell: StageBell | None = None  # this receiver's stage bell, once registered
    _data_seen: int | None = None  # `wait_for_data`'s last look at the stage bell
    stage_id: Any

    @property
    def connector(self) -> Connector:
        """The shmring connector underneath (the facade's own)."""
        raise NotImplementedError

    def _bell(self) -> StageBell | None:
        """This receiver's stage bell, registered once (None: no stage, no futexes, or closed)."""
        bell = self._stage_bell
        if bell is not None and bell.value() is not None:
            return bell
        if self._closed:
            return None
        stage = _receiving_stage(self.stage_id)
        if stage is None:
            return None
        bell = self.connector.stage_bell(stage)
        if bell is not None:
            bell.register()  # before any snapshot: puts to the stage ring it from here on
            self._stage_bell = bell
        return bell

    def get_wakeup_generation(self) -> int | None:
        """Snapshot before polling; a put to this connector's stage changes it (`wait_for_change`).

        None when there is nothing to wait on: ``stage_id`` None, negative or
        not a number, ``VLLM_OMNI_SHM_WAKEUP=0``, or this connector closed
        (the caller keeps its timed poll), as in vllm-omni.
        """
        if self._closed or not _wakeups_enabled():
            return None
        bell = self._bell()
        return bell.value() if bell is not None else None

    def wait_for_change(self, generation: int | None, *, timeout: float) -> bool:
        """Block until a put to this connector's stage since `generation`, or `timeout`; answer which.

        Puts to other stages do not wake it. False at once without a bell
        (see `get_wakeup_generation`) or once closed.
        """
        if generation is None or self._closed or not _wakeups_enabled():
            return False
        bell = self._bell()
        if bell is None:
            return False
        return self._wait_past(bell, generation, timeout) is not None

    @property
    def event_notifications_enabled(self) -> bool:
        """Whether `wait_for_data` can wait (``shm_event_notifications`` on, a stage id >= 0)."""
        return self._data_seen is not None and not self._closed

    def wait_for_data(self, timeout: float) -> bool:
        """vllm-omni's event notification: True once a put to this stage arrived since the last call.

        A put made since the previous call (or since construction) answers
        True at once; otherwise it waits up to `timeout`. False when event
        notifications are off (``shm_event_notifications``).
        """
        seen = self._data_seen
        if seen is None or self._closed:
            return False
        bell = self._bell()
        if bell is None:
            return False
        current = self._wait_past(bell, seen, timeout)
        if current is None:
            return False
        self._data_seen = current
        return True

    def _wait_past(self, bell: StageBell, seen: int, timeout: float) -> int | None:
        """The bell's value once it differs from `seen`; None at `timeout`, or once closed."""
        deadline = time.monotonic() + max(timeout, 0.0)
        while True:
            current = bell.value()
            if current is None or self._closed:
                return None
            if current != seen:
                return current
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            bell.wait(seen, min(left, _MAX_BELL_WAIT_SECONDS))


__all__ = ["StageWakeups"]
