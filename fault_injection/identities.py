"""Borrowed producer identities: live and dead (pid, start time) pairs for one process to publish as.

A fault cell must be cheap, so the producers of a discovery or restart
scenario are connectors in the campaign's own process that publish as other
processes (`seamed_connector(scope, Seams(identity=...))`). Their identities are borrowed from
helper processes started once per campaign: two that stay alive (shells
that exit once the campaign's process is gone),
so receivers' pidfd checks see live producers, and one that was started and
killed, so its identity names a process that exited (a "dead producer"
whose files are still there).

The helpers are killed and reaped at interpreter exit.
"""

from __future__ import annotations

import atexit
import os
import subprocess
import threading
from dataclasses import dataclass

from ..impl.names import ProducerIdentity, read_start_time


@dataclass(frozen=True)
class Identities:
    """Identities a scenario's producers publish as."""

    live_a: ProducerIdentity  # a running helper process
    live_b: ProducerIdentity  # another running helper process
    dead: ProducerIdentity  # a helper that was killed and reaped before any scenario ran


_lock = threading.Lock()
_identities: Identities | None = None
_helpers: list[subprocess.Popen[bytes]] = []


def _start_helper() -> tuple[subprocess.Popen[bytes], ProducerIdentity]:
    # The helper polls for its parent, so it goes away even if the campaign is killed.
    watch = f"while kill -0 {os.getpid()} 2>/dev/null; do sleep 1; done"
    helper = subprocess.Popen(
        ["sh", "-c", watch],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    start_time = read_start_time(helper.pid)
    if start_time is None:  # pragma: no cover - it was just started
        helper.kill()
        helper.wait()
        raise RuntimeError(f"helper process vanished at once: pid={helper.pid}")
    return helper, (helper.pid, start_time)


def _stop_helpers() -> None:
    while _helpers:
        helper = _helpers.pop()
        if helper.poll() is None:
            helper.kill()
        helper.wait()


def borrowed_identities() -> Identities:
    """The campaign's identities (helpers started on first use)."""
    global _identities
    with _lock:
        if _identities is None:
            if not _helpers:
                atexit.register(_stop_helpers)
            first, live_a = _start_helper()
            second, live_b = _start_helper()
            _helpers.extend((first, second))
            third, dead = _start_helper()
            third.kill()
            third.wait()
            _identities = Identities(live_a, live_b, dead)
        return _identities


__all__ = ["Identities", "borrowed_identities"]
