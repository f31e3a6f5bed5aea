"""What `pool_checksum` costs at 1, 16 and 256 MiB, against the copy (issue 22, "Also").

One process, one producer and one reader connector per setting (pool on,
owned results, descriptor gets), rounds interleaved between the settings,
medians of the repeats. Besides put + get it times the two passes the
checksum adds (XXH3-64 over the payload, once per side) against one copy of
the payload into fresh memory. The decision rule (issue 22): the checksum is
on by default only if it costs at most 10% of the large-payload throughput.
docs/performance.md ("Pool payload checksum") holds the figures:

    python benchmarks/pool_checksum.py [--repeats-scale 1.0]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
import uuid

import numpy as np
from xxhash import xxh3_64_intdigest

from shmring import Connector

MIB = 1 << 20
SIZES = (1 * MIB, 16 * MIB, 256 * MIB)
REPEATS = {1 * MIB: 41, 16 * MIB: 21, 256 * MIB: 7}


def _median_seconds(action, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        action()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure(size: int, repeats: int) -> dict[str, float]:
    value = np.random.default_rng(size).integers(0, 255, size, dtype=np.uint8)
    raw = value.data
    hashing = _median_seconds(lambda: xxh3_64_intdigest(raw), repeats)
    copying = _median_seconds(lambda: bytearray(raw), repeats)
    pool = {"pool_max_bytes": 1 << 30, "pool_budget_bytes": 4 * size + (8 << 20)}
    scope = f"ck{uuid.uuid4().hex[:8]}"
    settings = {"off": False, "on": True}
    connectors = {
        name: Connector(f"{scope}{name}", pool_checksum=checksum, **pool)
        for name, checksum in settings.items()
    }
    readers = {name: Connector(f"{scope}{name}") for name in settings}
    totals: dict[str, list[float]] = {name: [] for name in settings}
    try:
        for name, producer in connectors.items():  # warm: the slot file, the mappings
            for _ in range(2):
                got = readers[name].get(
                    "a", "b", "k", descriptor=producer.put("a", "b", "k", value)
                )
                assert got.delivered
        for _ in range(repeats):
            for name, producer in connectors.items():
                start = time.perf_counter()
                descriptor = producer.put("a", "b", "k", value)
                got = readers[name].get("a", "b", "k", descriptor=descriptor)
                totals[name].append(time.perf_counter() - start)
                assert got.delivered and got.value.nbytes == size
                del got
        assert all(producer.health().pool_puts > 0 for producer in connectors.values())
    finally:
        for connector in [*connectors.values(), *readers.values()]:
            connector.close()
    off = statistics.median(totals["off"])
    on = statistics.median(totals["on"])
    return {
        "size_mib": size / MIB,
        "repeats": repeats,
        "xxh3_gbps": size / hashing / 1e9,
        "copy_gbps": size / copying / 1e9,
        "hash_vs_copy": hashing / copying,
        "put_get_off_ms": off * 1e3,
        "put_get_on_ms": on * 1e3,
        "throughput_off_gbps": size / off / 1e9,
        "throughput_on_gbps": size / on / 1e9,
        "throughput_loss": 1 - off / on,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats-scale", type=float, default=1.0)
    args = parser.parse_args()
    print(json.dumps({"loadavg": os.getloadavg()[0], "cpus": os.cpu_count()}))
    for size in SIZES:
        repeats = max(3, int(REPEATS[size] * args.repeats_scale) | 1)
        print(json.dumps({k: round(v, 3) for k, v in measure(size, repeats).items()}))


if __name__ == "__main__":
    main()
