"""Reference measurements next to the transports: a copy, a futex round trip, a blocked get's wake.

Design rationale. Two of issue 13's targets are not ratios between
transports but against what the machine itself does:

* borrowed receive must reach 0.9x "the single-thread copy bandwidth on the
  producer side alone": `copy_bandwidth` is that producer side, one process
  copying the payload (a `bytes`) into a mapped shared-memory buffer, the
  one copy a sender cannot avoid. It copies into pages already faulted in
  (``warm``: a reused buffer, what a pooled path aims for), into a fresh
  file's pages (``fresh``: a new tmpfs file per copy, what a file per message
  pays) and, for the bursts, into a rotating working set of as many mapped
  buffers as the burst has messages in flight (``rotating xN``: what the pool
  writes when N slots are in flight; at 16 MiB one reused buffer and the
  payload together fit this machine's 32 MiB L3, N of them do not);
* `get_with_deadline` must wake within 2x "a futex round trip": `futex_*` is
  a plain round trip between the two pinned workers over two futex words
  (`shmring.impl.futex.FutexWord`, the primitive the connector's doorbell
  uses), each side asleep in FUTEX_WAIT when the other wakes it; `wake_*`
  is a receiver blocked in `Connector.get_with_deadline` (idle long past
  its spin, asleep on the doorbell) and the time from the producer's `put`
  call to the receiver holding the value, one-way, on the one monotonic
  clock both processes read. The receiver first waits for a key that never
  comes and reports the CPU time that idle wait took per second of wall
  time ("idle-cheap": a busy loop would be ~1.0).

Both sides of each probe run in the bench's two pinned workers; the parent
sequences them as it does the transports (`bench_ring.run_probes`).
"""

from __future__ import annotations

import gc
import mmap
import os
import time
from multiprocessing.connection import Connection
from typing import Any

# The futex probe's two words, each the first word of its own file (no layout
# to share): "<prefix>-ping" (a wakes b) and "<prefix>-pong" (b wakes a).
FUTEX_FILE_BYTES = 4096
FUTEX_WORDS = ("ping", "pong")
WAIT_SLICE_S = 1.0  # one FUTEX_WAIT; the loop re-checks the word after each


def copy_bandwidth(path: str, size: int, copies: int, fresh: bool, rotate: int = 1) -> list[float]:
    """MiB/s of `copies` single-thread copies of a `size`-byte payload into a shm mapping.

    `fresh`: every copy goes into a new file at `path` (created, sized,
    mapped, copied into, unmapped, unlinked; only the copy is timed, its page
    faults included). Otherwise one file is mapped, written once untimed and
    copied into `copies` times; with `rotate` > 1, that many files
    (``path.0`` ...) and the copies go round them (at least one round).
    """
    from _transports import make_bytes

    if fresh:
        return _fresh_copies(path, size, copies, make_bytes(size))
    payload = make_bytes(size)
    paths = [path] if rotate == 1 else [f"{path}.{index}" for index in range(rotate)]
    rates: list[float] = []
    mappings: list[mmap.mmap] = []
    try:
        for target_path in paths:
            mappings.append(_map_new(target_path, size))
            mappings[-1][:size] = payload  # untimed: fault the pages in
        gc.collect()
        for index in range(max(copies, rotate)):
            target = mappings[index % rotate]
            began = time.perf_counter_ns()
            target[:size] = payload
            elapsed = time.perf_counter_ns() - began
            rates.append(size / (elapsed / 1e9) / (1 << 20))
    finally:
        for mapping in mappings:
            mapping.close()
        for target_path in paths[: len(mappings)]:
            os.unlink(target_path)
    return rates


def _fresh_copies(path: str, size: int, copies: int, payload: bytes) -> list[float]:
    """`copy_bandwidth`'s fresh kind: a new file per copy, only the copy timed."""
    rates: list[float] = []
    gc.collect()
    for _ in range(copies):
        target = _map_new(path, size)
        try:
            began = time.perf_counter_ns()
            target[:size] = payload
            elapsed = time.perf_counter_ns() - began
        finally:
            target.close()
            os.unlink(path)
        rates.append(size / (elapsed / 1e9) / (1 << 20))
    return rates


def _map_new(path: str, size: int) -> mmap.mmap:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        os.ftruncate(fd, size)
        return mmap.mmap(fd, size)
    finally:
        os.close(fd)


def futex_word_paths(prefix: str) -> tuple[str, str]:
    """The ping and pong files of the futex probe named `prefix` (the parent makes both)."""
    ping, pong = (f"{prefix}-{word}" for word in FUTEX_WORDS)
    return ping, pong


def _word(path: str) -> tuple[mmap.mmap, Any]:
    """The futex word at the start of the file at `path`, and its mapping."""
    from shmring.impl.futex import FutexWord

    fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW)
    try:
        mapping = mmap.mmap(fd, FUTEX_FILE_BYTES)
    finally:
        os.close(fd)
    return mapping, FutexWord(mapping, 0)


def _words(prefix: str) -> tuple[tuple[mmap.mmap, mmap.mmap], Any, Any]:
    ping_path, pong_path = futex_word_paths(prefix)
    ping_map, ping = _word(ping_path)
    pong_map, pong = _word(pong_path)
    return (ping_map, pong_map), ping, pong


def _close_words(mappings: tuple[mmap.mmap, mmap.mmap], *words: Any) -> None:
    for word in words:
        word.close()
    for mapping in mappings:
        mapping.close()


def _wait_change(word: Any, seen: int, deadline: float) -> int:
    """Sleep on `word` until it no longer holds `seen`; its new value."""
    while (value := word.load()) == seen:
        if time.monotonic() > deadline:
            raise TimeoutError("futex probe: the peer did not wake us")
        word.wait(seen, WAIT_SLICE_S)
    return int(value)


def futex_echo(control: Connection, prefix: str, count: int, timeout_s: float) -> None:
    """Worker b: sleep until a's word moves, then move ours and wake a; `count` times."""
    mappings, ping, pong = _words(prefix)
    try:
        seen = ping.load()
        control.send(("armed", None))
        deadline = time.monotonic() + timeout_s
        for _ in range(count):
            seen = _wait_change(ping, seen, deadline)
            pong.bump_and_wake()
    finally:
        _close_words(mappings, ping, pong)


def futex_ping(prefix: str, warm: int, count: int, gap_s: float, timeout_s: float) -> list[int]:
    """Worker a: idle `gap_s` (b is asleep), wake b, sleep until b wakes us; round trips in ns."""
    mappings, ping, pong = _words(prefix)
    clock = time.perf_counter_ns
    samples: list[int] = []
    try:
        deadline = time.monotonic() + timeout_s
        for index in range(warm + count):
            time.sleep(gap_s)
            seen = pong.load()
            began = clock()
            ping.bump_and_wake()
            _wait_change(pong, seen, deadline)
            if index >= warm:
                samples.append(clock() - began)
    finally:
        _close_words(mappings, ping, pong)
    return samples


def wake_receive(
    control: Connection, scope: str, warm: int, count: int, idle_s: float, timeout_s: float
) -> dict[str, Any]:
    """Worker b: an idle wait first (CPU per wall second), then `warm + count` blocked gets.

    Answers the receive times (ns, `perf_counter_ns`, once the value is
    held) of the timed gets and the idle wait's CPU fraction.
    """
    from shmring.impl.connector import Connector

    with Connector(scope) as connector:
        connector.join()
        control.send(("armed", None))
        wall0, cpu0 = time.monotonic(), time.process_time()
        idle = connector.get_with_deadline("a", "b", "never", timeout=idle_s)
        wall, cpu = time.monotonic() - wall0, time.process_time() - cpu0
        if idle:
            raise AssertionError("wake probe: a key nobody put was delivered")
        received: list[int] = []
        clock = time.perf_counter_ns
        for index in range(warm + count):
            got = connector.get_with_deadline("a", "b", str(index), timeout=timeout_s)
            now = clock()
            if not got:
                raise TimeoutError(f"wake probe: message {index}: {got.status}")
            if index >= warm:
                received.append(now)
        spin_s = connector.config.spin_seconds
    return {
        "received_ns": received,
        "idle_cpu_fraction": cpu / wall if wall > 0 else None,
        "idle_wall_s": wall,
        "spin_seconds": spin_s,
    }


def wake_send(
    scope: str, warm: int, count: int, gap_s: float, idle_s: float, timeout_s: float
) -> dict[str, Any]:
    """Worker a: after b's idle wait, idle before each put (b is asleep); put times in ns.

    The idle gap before each put is `gap_s`, and at least 10x the
    receiver's spin (`spin_seconds`), so every get is asleep when woken.
    """
    from shmring.impl.connector import Connector

    payload = b"w" * 64
    started: list[int] = []
    returned: list[int] = []
    clock = time.perf_counter_ns
    with Connector(scope) as connector:
        connector.join()
        gap = max(gap_s, 10 * connector.config.spin_seconds)
        time.sleep(idle_s)
        for index in range(warm + count):
            time.sleep(gap)
            began = clock()
            connector.put("a", "b", str(index), payload)
            done = clock()
            if index >= warm:
                started.append(began)
                returned.append(done)
        # Stay open (a closed producer's frames are not delivered) until b has the last one.
        deadline = time.monotonic() + timeout_s
        while not _all_taken(connector) and time.monotonic() < deadline:
            time.sleep(0.001)
    return {"put_started_ns": started, "put_returned_ns": returned, "gap_s": gap}


def _all_taken(connector: Any) -> bool:
    """Whether the consumer claimed and finished every frame of our ring a -> b."""
    ring = connector.ring("a", "b")
    if ring is None:
        return True
    stats = ring.statistics()
    return bool(stats.published_frames == 0 and stats.claimed_frames == 0)


def ring_lockstep_rate(max_examples: int | None) -> dict[str, Any]:
    """Steps per second of the ring lockstep machine (spec vs impl), one run in this process.

    The suite's own run (`model_tests/test_ring_lockstep.py`, the "ring-ci"
    profile) unless `max_examples` is given (fewer examples of the same
    profile: the smoke run). Answers the steps, seconds and rate, or why it
    did not run (the test dependencies are not installed, or the machine
    failed: then model and implementation disagree, which the suite reports).
    """
    try:
        from hypothesis import settings

        from shmring.model_tests import ring_machine
        from shmring.model_tests.machine_runs import run_machine
    except ImportError as error:
        return {"not_run": f"the lockstep machine needs the test dependencies ({error})"}
    profile = ring_machine.CI_PROFILE
    if max_examples is not None:
        profile = f"{ring_machine.CI_PROFILE}-bench-{max_examples}"
        settings.register_profile(
            profile, settings.get_profile(ring_machine.CI_PROFILE), max_examples=max_examples
        )
    run = run_machine(ring_machine, ring_machine.RingLockstepMachine, profile)
    if run.error is not None:
        return {"not_run": f"the machine failed: {type(run.error).__name__}: {run.error}"}
    return {
        "profile": profile,
        "steps": run.steps,
        "seconds": run.seconds,
        "steps_per_s": run.steps / run.seconds if run.seconds > 0 else None,
        # Per CPU second of this process: the same run less the time other
        # processes took the core (the machine is shared).
        "cpu_seconds": run.cpu_seconds,
        "steps_per_cpu_s": run.steps / run.cpu_seconds if run.cpu_seconds > 0 else None,
    }
