"""Whether a benchmark case fits in /dev/shm and memory now, and if not, the reason to print.

Design rationale. The large cases (256 MiB messages, bursts of many 16 MiB
or 256 MiB ones) hold gigabytes at once, and every transport keeps what is
in flight in memory: tmpfs files (the connector's pool slots, fallback and
per-key segments, iceoryx2's data segment) or its own buffers (zmq, the
Queue's pipe). A case that would exhaust /dev/shm (a private 8 GiB tmpfs
under /work/bin/iso) or the machine's memory is skipped with the reason
instead of failing half-way or pushing other jobs into swap. `compute_shortfall`
is the arithmetic, pure, so a test can check it; `space_shortfall` asks the
machine.
"""

from __future__ import annotations

import contextlib
import os

KIB = 1024
MIB = 1024 * KIB
GIB = 1024 * MIB
SHM_ROOT = "/dev/shm"
CHECK_FROM = 256 * MIB  # cases holding less than this at once are not checked
SHM_MARGIN = 512 * MIB  # kept free in /dev/shm beside the case (spares, rings, others' files)
MEMORY_MARGIN = 2 * GIB  # the producer's payload, the receiver's copy, the workers themselves


def compute_shortfall(
    need: int, shm_free: int, memory_available: int | None, shm_root: str = SHM_ROOT
) -> str | None:
    """Why a case holding `need` bytes at once cannot run with this much free, or None."""
    if need < CHECK_FROM:
        return None
    if shm_free < need + SHM_MARGIN:
        return (
            f"skipped: it holds up to {need / GIB:.2f} GiB at once; {shm_root} has "
            f"{shm_free / GIB:.2f} GiB free (needs {(need + SHM_MARGIN) / GIB:.2f})"
        )
    if memory_available is not None and memory_available < need + MEMORY_MARGIN:
        return (
            f"skipped: it holds up to {need / GIB:.2f} GiB at once; "
            f"{memory_available / GIB:.2f} GiB of memory available "
            f"(needs {(need + MEMORY_MARGIN) / GIB:.2f})"
        )
    return None


def space_shortfall(size: int, in_flight: int) -> str | None:
    """Why a case holding `in_flight` messages of `size` bytes at once cannot run now, or None."""
    need = size * in_flight
    if need < CHECK_FROM:
        return None
    info = os.statvfs(SHM_ROOT)
    return compute_shortfall(need, info.f_bavail * info.f_frsize, memory_available_bytes())


def memory_available_bytes() -> int | None:
    """MemAvailable from /proc/meminfo, or None where there is none."""
    with contextlib.suppress(OSError), open("/proc/meminfo") as stream:
        for line in stream:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * KIB
    return None
