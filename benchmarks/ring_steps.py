"""Where a host-ring message spends its time, step by step, in one process.

bench_ring.py says how fast each transport is end to end; this says which
part of shmring's own path costs what, so a change to the hot path can be
judged by the step it targets. Everything runs in this process on one core
(no peer, no wake-up), each step timed separately per message, steps
interleaved so noise hits all alike; the table shows medians.

    .venv/bin/python benchmarks/ring_steps.py [--messages N] [--json out.json]

Steps: the codec alone (prepare, write_into, decode; pickle of the same
tree for comparison), the raw ring (put of
an encoded tree through `put_with_writer`, get with decode; put/get of 64 B
and 1 MiB bytes), the connector (put/get of the tree and of 64 B on its own
edge), and the primitives they use (one flock/unlock pair, crc32 and a copy
of 1 MiB).
"""

from __future__ import annotations

import argparse
import fcntl
import gc
import json
import os
import pickle
import statistics
import sys
import time
import uuid
import zlib
from collections.abc import Callable
from typing import cast

KIB = 1024
Writer = Callable[[memoryview], None]  # what put_with_writer takes (write_into's count unused)
MIB = 1024 * KIB


def measure(messages: int) -> dict[str, float]:
    import torch

    from shmring.impl import codec
    from shmring.impl.connector import Connector
    from shmring.impl.directory import (
        ensure_deployment_directory,
        remove_deployment_directory_if_empty,
    )
    from shmring.impl.names import current_producer_identity, ring_path
    from shmring.impl.ring.producer import RingChannel
    from shmring.impl.ring.reader import RingReader
    from shmring.impl.ring.results import ReceiveStatus

    tree = {"codes": {"audio": torch.arange(28)}, "meta": {"finished": torch.tensor(False)}}
    small = os.urandom(64)
    large = os.urandom(MIB)
    encoded = codec.encode(tree)
    scope = f"steps{uuid.uuid4().hex[:10]}"
    directory = ensure_deployment_directory(scope)
    identity = current_producer_identity()
    path = ring_path(directory, "a", "b", identity)
    clock = time.perf_counter_ns
    steps: dict[str, list[int]] = {}

    def timed(name: str, began: int) -> int:
        now = clock()
        steps.setdefault(name, []).append(now - began)
        return clock()

    channel = RingChannel.create(path, 64 * MIB, producer=identity)
    reader = RingReader.attach(path)
    connector = Connector(scope + "c", ring_capacity=4 * MIB)
    scratch = bytearray(len(encoded))
    delivered = ReceiveStatus.DELIVERED
    try:
        gc.collect()
        gc.disable()
        for index in range(messages):
            key = str(index)
            t = clock()
            plan = codec.prepare(tree)
            t = timed("codec.prepare(tree)", t)
            plan.write_into(scratch)
            t = timed("plan.write_into(bytearray)", t)
            codec.decode(encoded)
            t = timed("codec.decode(tree)", t)
            pickle.loads(pickle.dumps(tree, 5))
            t = timed("pickle dumps+loads(tree) (for comparison)", t)
            plan = codec.prepare(tree)
            t = clock()
            channel.put_with_writer(key, plan.nbytes, cast(Writer, plan.write_into))
            t = timed("ring put_with_writer(tree plan)", t)
            got = reader.get(key, decode=codec.decode)
            t = timed("ring get(tree, decode)", t)
            assert got.status is delivered
            channel.put("s" + key, small)
            t = timed("ring put(64 B)", t)
            got = reader.get("s" + key)
            t = timed("ring get(64 B)", t)
            assert got.status is delivered
            connector.put("a", "b", key, tree)
            t = timed("connector put(tree)", t)
            assert connector.get("a", "b", key)
            t = timed("connector get(tree)", t)
            connector.put("a", "b", "s" + key, small)
            t = timed("connector put(64 B)", t)
            assert connector.get("a", "b", "s" + key)
            t = timed("connector get(64 B)", t)
            fcntl.flock(reader._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            fcntl.flock(reader._fd, fcntl.LOCK_UN)
            t = timed("flock + unlock", t)
            if index % 16 == 0:  # the 1 MiB steps are slow; sample them
                channel.put("l" + key, large)
                t = timed("ring put(1 MiB)", t)
                got = reader.get("l" + key)
                t = timed("ring get(1 MiB)", t)
                assert got.status is delivered
                zlib.crc32(large)
                t = timed("zlib.crc32(1 MiB)", t)
                bytearray(large)
                timed("copy 1 MiB (bytearray)", t)
    finally:
        gc.enable()
        reader.close()
        channel.close()
        connector.close()
        remove_deployment_directory_if_empty(directory)
    return {name: statistics.median(samples) / 1000 for name, samples in steps.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=5000)
    parser.add_argument("--json", dest="json_path", default=None)
    args = parser.parse_args(argv)
    cpus = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpus[0]})
    result = measure(args.messages)
    print("| step | median us |")
    print("|---|---:|")
    for name, value in result.items():
        print(f"| {name} | {value:.2f} |")
    if args.json_path:
        with open(args.json_path, "w") as stream:
            json.dump({"median_us": result, "messages": args.messages}, stream, indent=2)
            stream.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
