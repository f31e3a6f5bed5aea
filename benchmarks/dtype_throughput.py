"""Large tensors of two dtypes through the Connector, two processes: why u8 and f32 differed.

Issue 23 saw a 256 MiB uint8 tensor travel at 1,054 MB/s where float32 of
the same size reached 5,129 in the same run, the uint8 figure spreading by
more than 2x over rounds. This puts torch tensors of each dtype (same byte
count, same values pattern) through `Connector.put` / `get_with_deadline`
between a producer and a consumer process pinned to different cores, the
dtypes alternating message by message and the order flipped every round,
and records per message, in the consumer: the get's time, what the owned
copy advised (`codec.fresh.statistics`) and the kernel's transparent huge
page counters for the get (`/proc/vmstat`: huge pages faulted, faults that
fell back to 4 KiB pages, direct compaction stalls).

Round 0 is a warm-up unless ``--cold``: the consumer imports torch at its
first tensor decode (the codec imports it lazily) and the producer creates
its pool slots at its first puts, and under load the import alone took 5 s
here, so whichever dtype goes first pays it (the issue's run measured
uint8 first). Warm-up rows are reported with ``warm-up`` and kept out of
the medians.

    .venv/bin/python benchmarks/dtype_throughput.py [--mib 256] [--rounds 6] [--cold] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import sys
import time
import uuid
from typing import Any

MIB = 1 << 20
DTYPES = ("uint8", "float32")
VMSTAT = ("thp_fault_alloc", "thp_fault_fallback", "compact_stall", "compact_fail")


def vmstat() -> dict[str, int]:
    found: dict[str, int] = {}
    with open("/proc/vmstat") as stream:
        for line in stream:
            name, _, value = line.partition(" ")
            if name in VMSTAT:
                found[name] = int(value)
    return found


def make_tensor(dtype: str, nbytes: int) -> Any:
    import torch

    kind = getattr(torch, dtype)
    count = nbytes // torch.tensor([], dtype=kind).element_size()
    return torch.arange(count, dtype=torch.int64).remainder(251).to(kind)


def producer(scope: str, nbytes: int, rounds: int, cpu: int, pipe: Any) -> None:
    os.sched_setaffinity(0, {cpu})
    from shmring.impl.connector import Connector

    tensors = {dtype: make_tensor(dtype, nbytes) for dtype in DTYPES}
    with Connector(scope, ring_capacity=64 * MIB) as connector:
        pipe.send("ready")
        for round_ in range(rounds):
            order = DTYPES if round_ % 2 == 0 else DTYPES[::-1]
            for dtype in order:
                if pipe.recv() != "next":
                    return
                began = time.monotonic_ns()
                pipe.send(began)
                connector.put("p", "c", f"{round_}.{dtype}", tensors[dtype])
                pipe.send((time.monotonic_ns() - began) / 1e6)
        pipe.recv()  # the consumer is done: close only now (the pool's slots are ours)


def consumer(
    scope: str, nbytes: int, rounds: int, cpu: int, pipe: Any, out: Any, warm_up: bool
) -> None:
    os.sched_setaffinity(0, {cpu})
    import gc

    from shmring.impl.codec import fresh
    from shmring.impl.connector import Connector

    rows = []
    with Connector(scope, ring_capacity=64 * MIB) as connector:
        for round_ in range(rounds):
            order = DTYPES if round_ % 2 == 0 else DTYPES[::-1]
            for position, dtype in enumerate(order):
                gc.collect()
                advised = dict(fresh.statistics)
                pipe.send("next")
                sent = pipe.recv()
                before = vmstat()
                got = connector.get_with_deadline("p", "c", f"{round_}.{dtype}", timeout=120)
                received = time.monotonic_ns()
                after = vmstat()
                put_ms = pipe.recv()
                if not got:
                    raise RuntimeError(f"round {round_} {dtype}: {got.status}")
                value = got.value
                if (
                    str(value.dtype) != f"torch.{dtype}"
                    or value.numel() * value.element_size() != nbytes
                ):
                    raise RuntimeError(f"round {round_} {dtype}: got {value.dtype} {value.shape}")
                rows.append(
                    {
                        "round": round_,
                        "warm_up": round_ == 0 and warm_up,
                        "dtype": dtype,
                        "first_in_round": position == 0,
                        "route": got.route.name.lower() if got.route else None,
                        "mb_s": nbytes / ((received - sent) / 1e9) / 1e6,
                        "ms": (received - sent) / 1e6,
                        "put_ms": put_ms,
                        "advised": fresh.statistics["advised"] - advised["advised"],
                        "refused": fresh.statistics["refused"] - advised["refused"],
                        **{name: after[name] - before.get(name, 0) for name in after},
                    }
                )
                del value, got
        pipe.send("done")
    out.send(rows)


def run(nbytes: int, rounds: int, warm_up: bool = True) -> list[dict[str, Any]]:
    context = multiprocessing.get_context("spawn")
    cpus = sorted(os.sched_getaffinity(0))
    scope = f"dtype{uuid.uuid4().hex[:8]}"
    to_producer, producer_end = context.Pipe()
    results, results_end = context.Pipe()
    consumer_pipe, consumer_end = context.Pipe()
    p = context.Process(target=producer, args=(scope, nbytes, rounds, cpus[0], producer_end))
    p.start()
    if to_producer.recv() != "ready":
        raise RuntimeError("producer failed")
    c = context.Process(
        target=consumer,
        args=(scope, nbytes, rounds, cpus[-1], consumer_end, results_end, warm_up),
    )
    c.start()
    # Relay: the consumer asks for the next message, the producer stamps and puts it.
    while True:
        message = consumer_pipe.recv()
        to_producer.send(message)
        if message == "done":
            break
        consumer_pipe.send(to_producer.recv())  # the producer's clock before its put
        consumer_pipe.send(to_producer.recv())  # and how long the put took
    rows: list[dict[str, Any]] = results.recv()
    c.join(60)
    p.join(60)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--cold", action="store_true", help="time round 0 too (no warm-up)")
    parser.add_argument("--json", dest="json_path", default=None)
    args = parser.parse_args(argv)
    load = os.getloadavg()[0]
    rows = run(args.mib * MIB, args.rounds + (0 if args.cold else 1), warm_up=not args.cold)
    print(f"load {load:.2f}; {args.mib} MiB tensors, {args.rounds} rounds")
    print(
        "| round | dtype | first | MB/s | ms | put ms | huge pages | fallbacks | compact stalls |"
    )
    print("|---:|---|---|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        print(
            f"| {row['round']}{' (warm-up)' if row['warm_up'] else ''} | {row['dtype']} "
            f"| {'yes' if row['first_in_round'] else ''} "
            f"| {row['mb_s']:.0f} | {row['ms']:.1f} | {row['put_ms']:.1f} "
            f"| {row.get('thp_fault_alloc', '-')} "
            f"| {row.get('thp_fault_fallback', '-')} | {row.get('compact_stall', '-')} |"
        )
    for dtype in DTYPES:
        rates = [row["mb_s"] for row in rows if row["dtype"] == dtype and not row["warm_up"]]
        print(
            f"{dtype}: median {statistics.median(rates):.0f} MB/s, {min(rates):.0f}..{max(rates):.0f}"
        )
    if args.json_path:
        with open(args.json_path, "w") as stream:
            json.dump(
                {"load": load, "load_after": os.getloadavg()[0], "mib": args.mib, "rows": rows},
                stream,
                indent=2,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
