"""Real ENOSPC: the transport in a private mount namespace whose /dev/shm is a tiny tmpfs.

Design rationale. An injected ENOSPC proves the code handles the errno; a
real full tmpfs also proves the errno arrives where the code expects it
(fallocate, not a SIGBUS at a later page fault) and that nothing
half-written stays. `unshare --mount --propagation private` gives a child
process its own mount table, so a 256 KiB tmpfs can be mounted over
/dev/shm for that child alone, without touching the machine's. Needs root
(or CAP_SYS_ADMIN) and the `unshare` tool; `available()` says whether the
machine allows it, and the tests skip cleanly otherwise.

The child runs `_child_checks` and prints one JSON object: what each check
saw. Checks:

* ring setup meets ENOSPC: the edge's ring is disabled (NoSpaceError
  recorded), the fallback carries the put, the receiver gets it;
* a fallback segment meets ENOSPC: the put raises NoSpaceError and leaves
  no file (no temporary, no segment), earlier segments still deliver;
* the registered arena meets ENOSPC at set-up: the sender disables it and
  per-transfer segments carry the transfer; a transfer too large for what
  is left raises NoSpaceError and leaves nothing;
* pool slots (4 KiB class, 72 KiB files, a budget far above the tmpfs) fill it: a slot
  file's creation meets a real ENOSPC (at its fallocate, typed, no slot file
  half made), the put falls back (or is refused with NoSpaceError), every
  accepted put is delivered;
* afterwards the tiny /dev/shm is empty.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from typing import Any, Final

TINY_SIZE: Final = "256k"
_TIMEOUT_S: Final = 120


def available() -> tuple[bool, str]:
    """Whether a private mount namespace with a tmpfs can be made here (and why not)."""
    if os.geteuid() != 0:
        return False, "needs root to mount a tmpfs in a private mount namespace"
    if shutil.which("unshare") is None:
        return False, "the unshare tool is not installed"
    probe = subprocess.run(
        [
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            f"mount -t tmpfs -o size={TINY_SIZE},mode=1777 tmpfs /dev/shm",
        ],
        capture_output=True,
        timeout=_TIMEOUT_S,
    )
    if probe.returncode != 0:
        return False, f"cannot mount a tmpfs in a mount namespace: {probe.stderr.decode().strip()}"
    return True, ""


def run_in_tiny_tmpfs() -> dict[str, Any]:
    """Run `_child_checks` under a 256 KiB /dev/shm; answers what it saw (raises if the child failed)."""
    script = (
        f"mount -t tmpfs -o size={TINY_SIZE},mode=1777 tmpfs /dev/shm && "
        f'exec "{sys.executable}" -m shmring.fault_injection.tmpfs --child'
    )
    done = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
        capture_output=True,
        timeout=_TIMEOUT_S,
    )
    lines = done.stdout.decode().strip().splitlines()
    if done.returncode != 0 or not lines:
        raise AssertionError(
            f"tmpfs child failed: rc={done.returncode}\nstdout={done.stdout.decode()}\n"
            f"stderr={done.stderr.decode()[-4000:]}"
        )
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def _child_checks() -> dict[str, Any]:  # pragma: no cover - runs in the namespace
    import errno
    import logging

    logging.getLogger("shmring").setLevel(logging.CRITICAL)
    from ..impl.connector import Connector, Route
    from ..impl.errors import NoSpaceError
    from ..spec.layout import MIN_POOL_CLASS

    seen: dict[str, Any] = {}
    edge = ("enc", "dec")
    with Connector("tiny") as producer, Connector("tiny") as receiver:
        # 1. The default 4 MiB ring cannot be allocated: the edge falls back.
        descriptor = producer.put(edge, "k", b"x" * 100)
        failure = producer.failed_edges().get(edge)
        seen["ring_setup_route"] = descriptor.route.value
        seen["ring_setup_error"] = type(failure).__name__ if failure else None
        seen["ring_setup_errno"] = getattr(failure, "errno", None)
        got = receiver.get(edge, "k")
        seen["ring_setup_delivered"] = got.delivered and got.value == b"x" * 100
        # 2. A segment larger than the space left: NoSpaceError, nothing half-written.
        producer.put(edge, "kept", b"y" * 1000)
        before = sorted(os.listdir(producer.directory))
        try:
            producer.put(edge, "huge", b"z" * 400_000)
            seen["segment_error"] = None
        except NoSpaceError as error:
            seen["segment_error"] = "NoSpaceError"
            seen["segment_errno"] = error.errno
        seen["segment_left_files"] = sorted(set(os.listdir(producer.directory)) - set(before))
        got = receiver.get(edge, "kept")
        seen["segment_kept_delivered"] = got.delivered and got.value == b"y" * 1000
        seen["ring_route_never_used"] = descriptor.route is Route.FALLBACK
    # 3. The registered arena (1 MiB) does not fit; per-transfer segments carry.
    import torch

    from ..impl.registered.transfer import TransferOptions, TransferReceiver, TransferSender
    from .plans import FaultyCudaDriver

    driver = FaultyCudaDriver()
    options = TransferOptions(enable_registered_shm=True, arena_capacity=1024 * 1024)
    with (
        TransferSender("tiny", options, driver=driver) as sender,
        TransferReceiver("tiny") as receiver_t,
    ):
        sent = torch.arange(64, dtype=torch.float32)
        descriptor_t = sender.send({"x": sent})
        stats = sender.statistics()
        seen["arena_disabled"] = stats.arena_disabled
        seen["arena_fields_in_segments"] = stats.fields_in_segments
        got_t = receiver_t.receive_tensors(descriptor_t)
        seen["arena_transfer_delivered"] = bool(torch.equal(got_t["x"], sent))
        del got_t
        listing = set(os.listdir(sender.directory))
        try:
            sender.send({"big": torch.zeros(300_000, dtype=torch.uint8)})
            seen["arena_big_error"] = None
        except NoSpaceError as error:
            seen["arena_big_error"] = "NoSpaceError"
            seen["arena_big_errno"] = error.errno
        seen["arena_big_left_files"] = sorted(set(os.listdir(sender.directory)) - listing)
    seen["registrations_left"] = len(driver.registered_ranges())
    # 4. Pool slots until the tmpfs is full: the slot creation's real ENOSPC.
    pool_class = MIN_POOL_CLASS  # a slot file is a page + the class + the headroom (72 KiB)
    with (
        Connector(
            "tinypool",
            ring_capacity=4096,
            pool_min_bytes=pool_class,
            pool_max_bytes=pool_class,
            pool_budget_bytes=1 << 30,
        ) as producer,
        Connector("tinypool", ring_capacity=4096, pool_budget_bytes=0) as receiver,
    ):
        accepted: dict[str, bytes] = {}
        routes, refused = [], 0
        for index in range(6):
            payload = bytes((index,)) * 40_000
            try:
                routes.append(producer.put(edge, f"p{index}", payload).route.value)
            except NoSpaceError:
                refused += 1
                continue
            accepted[f"p{index}"] = payload
        health = producer.health()
        slot_files = [name for name in os.listdir(producer.directory) if name.startswith("pool.")]
        seen["pool_routes"] = routes
        seen["pool_refused"] = refused
        seen["pool_create_failures"] = health.pool_create_failures
        seen["pool_files_are_slots"] = len(slot_files) == health.pool_slots
        seen["pool_delivered"] = all(
            receiver.get(edge, key).value == value for key, value in accepted.items()
        )
    seen["dev_shm_after"] = sorted(os.listdir("/dev/shm"))
    seen["enospc"] = errno.ENOSPC
    return seen


if __name__ == "__main__":  # pragma: no cover - the namespace child
    if sys.argv[1:] == ["--child"]:
        print(json.dumps(_child_checks()))
        sys.exit(0)
    print(json.dumps(run_in_tiny_tmpfs(), indent=2))
