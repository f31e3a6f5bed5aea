"""16 MiB put + get in one process: per-key segments (pool off) against the pool, with and without its checksum.

Interleaved rounds, medians; the figures in docs/protocol.md ("Pool") came from this script:
    python benchmarks/pool_inprocess.py
"""

import statistics
import time
import uuid

import numpy as np
from xxhash import xxh3_64_intdigest

from shmring import Connector

value = np.random.default_rng(0).integers(0, 255, 16 << 20, dtype=np.uint8)
buf = bytes(value)


def med(f, n=15):
    ts = []
    for _ in range(n):
        t = time.perf_counter()
        f()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


x = med(lambda: xxh3_64_intdigest(buf))
c = med(lambda: bytearray(buf))
print(f"xxh3_64 over 16 MiB: {16 / x:.0f} MiB/s; fresh bytearray copy: {16 / c:.0f} MiB/s")
configs = {
    "before: per-key segments (pool_budget_bytes=0)": dict(pool_budget_bytes=0),
    "after: pool": dict(),
    "after: pool + pool_checksum": dict(pool_checksum=True),
}
res = {k: ([], [], []) for k in configs}
conns = {k: Connector(f"m{uuid.uuid4().hex[:8]}", **o) for k, o in configs.items()}
try:
    for c in conns.values():  # warm: first files, first mappings
        for _ in range(3):
            d = c.put("a", "b", "k", value)
            c.get("a", "b", "k", descriptor=d)
    for _ in range(30):  # interleaved rounds
        for k, c in conns.items():
            t0 = time.perf_counter()
            d = c.put("a", "b", "k", value)
            t1 = time.perf_counter()
            g = c.get("a", "b", "k", descriptor=d)
            t2 = time.perf_counter()
            assert g.delivered and g.value.nbytes == value.nbytes
            res[k][0].append(t1 - t0)
            res[k][1].append(t2 - t1)
            res[k][2].append(t2 - t0)
    for k, (p, g, t) in res.items():
        m = statistics.median(t)
        print(
            f"{k}: put {statistics.median(p) * 1e3:.2f} ms, get {statistics.median(g) * 1e3:.2f} ms, put+get {m * 1e3:.2f} ms ({16 / m:.0f} MiB/s) route={conns[k].health().pool_puts and 'pool' or 'fallback'}"
        )
finally:
    for c in conns.values():
        c.close()
