"""Fields processes share are stored and loaded whole: a reader never sees 0 or a torn value.

`struct.pack_into` zero-fills its target and writes byte by byte; a stress
run of the ring once read head = 0 that way. Here a writer process flips
each shared field between two values that differ in every byte while this
process loads it as fast as it can; every load must be one of the two.
"""

from __future__ import annotations

import mmap
import multiprocessing
import time
from collections.abc import Callable

import pytest

from shmring.impl import frame_io
from shmring.impl.frame_io import SharedWords
from shmring.spec.layout import RING_HEADER_LENGTH

OFFSET = RING_HEADER_LENGTH + 64  # a frame's offset in the data region
SECONDS = 0.4

# (store, load, two values differing in every byte)
FIELDS: dict[str, tuple[Callable[..., object], Callable[..., int], int, int]] = {
    "head": (
        frame_io.store_head_release,
        frame_io.load_head_acquire,
        0x0101010101010101,
        0xFEFEFEFEFEFEFEFE,
    ),
    "tail": (
        frame_io.store_tail_release,
        frame_io.load_tail_acquire,
        0x0202020202020202,
        0xFDFDFDFDFDFDFDFD,
    ),
    "ring state": (
        frame_io.store_ring_state_release,
        frame_io.load_ring_state_acquire,
        0x01010101,
        0xFEFEFEFE,
    ),
    "frame length": (
        lambda words, value: frame_io.store_frame_length_release(words, OFFSET, value),
        lambda words: frame_io.load_frame_length_acquire(words, OFFSET),
        0x01010101,
        0xFEFEFEFE,
    ),
    "frame state": (
        lambda words, value: frame_io.store_frame_state_release(words, OFFSET, value),
        lambda words: frame_io.load_frame_state_acquire(words, OFFSET),
        0x0101,
        0xFEFE,
    ),
    "holder pid": (
        lambda words, value: frame_io.store_frame_holder_pid(words, OFFSET, value),
        lambda words: frame_io.load_frame_holder_pid(words, OFFSET),
        0x01010101,
        0xFEFEFEFE,
    ),
}


def _flip(mapping: mmap.mmap, field: str, ready: object, stop: object) -> None:
    store, _, a, b = FIELDS[field]
    words = SharedWords(memoryview(mapping))
    ready.set()  # type: ignore[attr-defined]
    while not stop.is_set():  # type: ignore[attr-defined]
        for _ in range(2000):
            store(words, a)
            store(words, b)
    words.release()


@pytest.mark.parametrize("field", sorted(FIELDS))
def test_a_concurrent_reader_sees_the_old_or_the_new_value_never_a_mix(field: str) -> None:
    _, load, a, b = FIELDS[field]
    mapping = mmap.mmap(-1, RING_HEADER_LENGTH + 4096)  # shared with the forked writer
    context = multiprocessing.get_context("fork")
    ready, stop = context.Event(), context.Event()
    words = SharedWords(memoryview(mapping))
    FIELDS[field][0](words, a)
    writer = context.Process(target=_flip, args=(mapping, field, ready, stop), daemon=True)
    writer.start()
    try:
        assert ready.wait(30), "writer did not start"
        seen: dict[int, int] = {}
        deadline = time.monotonic() + SECONDS
        while time.monotonic() < deadline:
            for _ in range(2000):
                value = load(words)
                seen[value] = seen.get(value, 0) + 1
    finally:
        stop.set()
        writer.join(30)
        if writer.exitcode is None:
            writer.kill()
            writer.join(30)
        writer.close()
        words.release()
        mapping.close()
    torn = {hex(value): count for value, count in seen.items() if value not in (a, b)}
    assert not torn, f"{field}: loads saw values never stored: {torn}"
    assert seen.get(a) and seen.get(b), f"{field}: the writer's flips were not observed: {seen}"
