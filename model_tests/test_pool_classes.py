"""Pool size classes with headroom: a power-of-two tensor takes its own class, not the next.

A slot of class 2^k holds 2^k + 64 KiB payload bytes (`layout.
compute_slot_capacity`), so the encoded form of a 2^k-byte tensor (the
codec's header on top) or a tree with one such tensor and small leaves
lands in class 2^k and its file is header + 2^k + 64 KiB, where the old
rule (capacity == class) took class 2^(k+1): twice the memory.
`pool_max_bytes` bounds the class, so the largest payload the pool takes is
`pool_max_bytes` + headroom; the budget bounds the files.

The byte figures are written out (not derived from the layout constants)
so that these tests fail on the old rule rather than follow it.
"""

from __future__ import annotations

import os

import numpy as np

from shmring.impl.connector import Connector
from shmring.impl.connector.config import (
    DEFAULT_POOL_BUDGET_BYTES,
    DEFAULT_POOL_MAX_BYTES,
    DEFAULT_POOL_MIN_BYTES,
)
from shmring.impl.names import parse_pool_slot_file_name
from shmring.spec import pool as pool_spec
from shmring.spec.connector import Route
from shmring.spec.layout import POOL_SLOT_HEADER_LENGTH

EDGE = ("enc", "dec")
KIB = 1024
MIB = 1024 * KIB
HEADROOM = 64 * KIB  # the headroom these tests expect (layout.POOL_CLASS_HEADROOM)


def _slot_files(connector: Connector) -> dict[str, int]:
    directory = connector.directory
    return {
        name: os.stat(os.path.join(directory, name)).st_size
        for name in os.listdir(directory)
        if parse_pool_slot_file_name(name) is not None
    }


def test_the_layout_headroom_is_the_one_these_tests_expect() -> None:
    from shmring.spec.layout import POOL_CLASS_HEADROOM, compute_slot_capacity

    assert POOL_CLASS_HEADROOM == HEADROOM
    assert compute_slot_capacity(16 * MIB) == 16 * MIB + HEADROOM


def test_a_power_of_two_payload_plus_its_header_takes_its_own_class() -> None:
    low, high = DEFAULT_POOL_MIN_BYTES, DEFAULT_POOL_MAX_BYTES
    for size_class in (MIB, 16 * MIB, 256 * MIB):
        assert pool_spec.compute_class(low, high, size_class + 64) == size_class
        assert pool_spec.compute_class(low, high, size_class + HEADROOM) == size_class
        assert pool_spec.compute_class(low, high, size_class + HEADROOM + 1) == 2 * size_class
    # Below the smallest class: the smallest class.
    assert pool_spec.compute_class(low, high, 1) == MIB


def test_pool_max_bytes_bounds_the_class_so_the_pool_takes_at_most_max_plus_headroom() -> None:
    low, high = DEFAULT_POOL_MIN_BYTES, DEFAULT_POOL_MAX_BYTES
    assert pool_spec.compute_class(low, high, high + HEADROOM) == high
    assert pool_spec.compute_class(low, high, high + HEADROOM + 1) is None
    pool = pool_spec.initialize_pool(low, high, DEFAULT_POOL_BUDGET_BYTES)
    assert pool_spec.process_pool_acquire(pool, high + HEADROOM + 1).status is (
        pool_spec.AcquireStatus.TOO_LARGE
    )
    assert pool_spec.process_pool_acquire(pool, high + HEADROOM).status is (
        pool_spec.AcquireStatus.CREATED
    )
    assert pool.used_bytes == POOL_SLOT_HEADER_LENGTH + high + HEADROOM <= pool.budget


def test_a_256_mib_payload_costs_a_256_mib_class_and_seven_fit_the_default_budget() -> None:
    """What a 256 MiB tensor costs now: class 256 MiB, a file of 256 MiB + 68 KiB."""
    low, high = DEFAULT_POOL_MIN_BYTES, DEFAULT_POOL_MAX_BYTES
    nbytes = 256 * MIB + 200  # a tensor and its codec header
    assert pool_spec.compute_class(low, high, nbytes) == 256 * MIB
    assert pool_spec.compute_slot_charge(256 * MIB) == 4 * KIB + 256 * MIB + HEADROOM
    pool = pool_spec.initialize_pool(low, high, DEFAULT_POOL_BUDGET_BYTES)
    statuses = []
    for tag in range(8):  # eight in flight: each published, its carrier pending
        acquired = pool_spec.process_pool_acquire(pool, nbytes)
        statuses.append(acquired.status)
        if acquired.index is not None:
            pool_spec.process_pool_publish(pool, acquired.index, nbytes, tag)
    created = pool_spec.AcquireStatus.CREATED
    assert statuses == [created] * 7 + [pool_spec.AcquireStatus.EXHAUSTED]  # was 3 of 512 MiB
    assert pool.used_bytes == 7 * (4 * KIB + 256 * MIB + HEADROOM) <= DEFAULT_POOL_BUDGET_BYTES


def test_a_16_mib_float32_tensor_lands_in_the_16_mib_class(scope: str) -> None:
    tensor = np.arange(4 * MIB, dtype=np.float32)  # 16 MiB
    with Connector(scope) as producer, Connector(scope) as receiver:
        assert producer.put(EDGE, "t", tensor).route is Route.POOL
        assert _slot_files(producer) == {
            name: POOL_SLOT_HEADER_LENGTH + 16 * MIB + HEADROOM for name in _slot_files(producer)
        }
        assert len(_slot_files(producer)) == 1
        assert producer.health().pool_bytes == 4 * KIB + 16 * MIB + HEADROOM
        got = receiver.get(EDGE, "t")
        assert got.route is Route.POOL
        np.testing.assert_array_equal(got.value, tensor)


def test_a_tree_of_one_1_mib_tensor_and_small_leaves_lands_in_the_1_mib_class(scope: str) -> None:
    tree = {
        "hidden": np.ones(256 * KIB, dtype=np.float32),  # 1 MiB
        "mask": np.zeros(512, dtype=np.bool_),
        "positions": np.arange(256, dtype=np.int64),
        "step": 7,
        "request": "req-17",
        "meta": {"shape": [1, 1024, 256], "dtype": "float32"},
    }
    with Connector(scope) as producer, Connector(scope) as receiver:
        # Over the default 4 MiB ring's quarter: a pool candidate.
        assert producer.put(EDGE, "tree", tree).route is Route.POOL
        sizes = list(_slot_files(producer).values())
        assert sizes == [POOL_SLOT_HEADER_LENGTH + MIB + HEADROOM]
        got = receiver.get(EDGE, "tree").value
        np.testing.assert_array_equal(got["hidden"], tree["hidden"])
        np.testing.assert_array_equal(got["positions"], tree["positions"])
        assert (got["step"], got["request"], got["meta"]) == (7, "req-17", tree["meta"])
        # The next step's tree reuses the slot: same class, no new file.
        producer.put(EDGE, "tree2", tree)
        assert producer.health().pool_slots_created == 1
        assert producer.health().pool_slots_reused == 1
