"""Where a connector message's time goes: Python calls and time per message, one process.

ring_steps.py times shmring's steps one after another with cold caches;
this runs each path in a tight steady-state loop and counts what it
executes, so a change to the connector's hot path can be judged by how
many Python calls (and which) it removes:

* ``raw``: `RingChannel.put` + `RingReader.get` of 64 B bytes;
* ``connector``: `Connector.put` + `Connector.get` of the same 64 B on one edge;
* ``connector-tree``: the same with the bench tree (codec included);
* ``empty-get``: a `Connector.get` of a key nobody published.

For each it reports the median time per message over interleaved rounds,
the Python function calls per message (``sys.setprofile`` call events,
C functions included) and, with ``--top N``, the N functions with the most
internal time under cProfile.

    .venv/bin/python benchmarks/connector_profile.py [--messages N] [--rounds R] [--top N] [--json out.json]
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import json
import os
import pstats
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any

Step = Callable[[int], None]


def build_paths() -> tuple[dict[str, Step], Callable[[], None]]:
    """The measured paths, each a function of the message index; and their cleanup."""
    import torch

    from shmring.impl.connector import Connector
    from shmring.impl.directory import (
        ensure_deployment_directory,
        remove_deployment_directory_if_empty,
    )
    from shmring.impl.names import current_producer_identity, ring_path
    from shmring.impl.ring.producer import RingChannel
    from shmring.impl.ring.reader import RingReader
    from shmring.impl.ring.results import ReceiveStatus

    small = os.urandom(64)
    tree = {"codes": {"audio": torch.arange(28)}, "meta": {"finished": torch.tensor(False)}}
    scope = f"prof{uuid.uuid4().hex[:10]}"
    directory = ensure_deployment_directory(scope)
    identity = current_producer_identity()
    channel = RingChannel.create(
        ring_path(directory, "a", "b", identity), 4 << 20, producer=identity
    )
    reader = RingReader.attach(ring_path(directory, "a", "b", identity))
    connector = Connector(scope + "c")
    delivered = ReceiveStatus.DELIVERED

    def raw(index: int) -> None:
        key = str(index)
        channel.put(key, small)
        if reader.get(key).status is not delivered:
            raise AssertionError("raw ring lost a message")

    def via_connector(index: int) -> None:
        key = str(index)
        connector.put("a", "b", key, small)
        if not connector.get("a", "b", key):
            raise AssertionError("connector lost a message")

    def via_connector_tree(index: int) -> None:
        key = "t" + str(index)
        connector.put("a", "b", key, tree)
        if not connector.get("a", "b", key):
            raise AssertionError("connector lost a tree")

    def empty_get(index: int) -> None:
        if connector.get("a", "b", "absent"):
            raise AssertionError("an absent key was delivered")

    def cleanup() -> None:
        reader.close()
        channel.close()
        connector.close()
        remove_deployment_directory_if_empty(directory)

    paths = {
        "raw ring put+get 64 B": raw,
        "connector put+get 64 B": via_connector,
        "connector put+get tree": via_connector_tree,
        "connector empty get": empty_get,
    }
    return paths, cleanup


def count_calls(step: Step, first: int, messages: int) -> float:
    """Python + C function calls per message (sys.setprofile call events)."""
    calls = 0

    def profiler(frame: Any, event: str, arg: Any) -> None:
        nonlocal calls
        if event == "call" or event == "c_call":
            calls += 1

    sys.setprofile(profiler)
    try:
        for index in range(first, first + messages):
            step(index)
    finally:
        sys.setprofile(None)
    return calls / messages


def top_costs(step: Step, first: int, messages: int, top: int) -> tuple[str, dict[str, Any]]:
    """cProfile's `top` costliest functions, and calls / internal us per message by module."""
    profile = cProfile.Profile()
    profile.enable()
    for index in range(first, first + messages):
        step(index)
    profile.disable()
    out = io.StringIO()
    stats = pstats.Stats(profile, stream=out)
    stats.sort_stats("tottime").print_stats(top)
    modules: dict[str, list[float]] = {}
    for (filename, _, function), (_, calls, internal, _, _) in stats.stats.items():  # type: ignore[attr-defined]
        name = os.path.basename(filename) if filename != "~" else f"builtin {function}"
        if name.startswith("builtin <method") or name.startswith("builtin <built-in"):
            name = "builtins (C)"
        entry = modules.setdefault(name, [0.0, 0.0])
        entry[0] += calls / messages
        entry[1] += internal / messages * 1e6
    by_module = {
        name: {"calls": round(calls, 1), "internal_us_profiled": round(us, 2)}
        for name, (calls, us) in sorted(modules.items(), key=lambda item: -item[1][1])
    }
    return out.getvalue(), by_module


def measure(messages: int, rounds: int, top: int) -> dict[str, Any]:
    paths, cleanup = build_paths()
    clock = time.perf_counter_ns
    times: dict[str, list[float]] = {name: [] for name in paths}
    result: dict[str, Any] = {}
    index = 0
    try:
        for step in paths.values():  # warm every path (ring set-up, discovery, caches)
            for _ in range(50):
                step(index)
                index += 1
        gc.collect()
        gc.disable()
        for _ in range(rounds):
            for name, step in paths.items():  # interleaved: noise hits all alike
                began = clock()
                for _ in range(messages):
                    step(index)
                    index += 1
                times[name].append((clock() - began) / messages / 1000)
        gc.enable()
        for name, step in paths.items():
            calls = count_calls(step, index, 200)
            index += 200
            entry = {"median_us": statistics.median(times[name]), "calls_per_message": calls}
            if top:
                entry["top"], entry["by_module"] = top_costs(step, index, 2000, top)
                index += 2000
            result[name] = entry
    finally:
        gc.enable()
        cleanup()
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=2000, help="messages per path and round")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--top", type=int, default=0, help="print the N costliest functions")
    parser.add_argument("--json", dest="json_path", default=None)
    args = parser.parse_args(argv)
    cpus = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpus[0]})
    result = measure(args.messages, args.rounds, args.top)
    raw = result["raw ring put+get 64 B"]["median_us"]
    print("| path | median us | x raw ring | calls / message |")
    print("|---|---:|---:|---:|")
    for name, entry in result.items():
        print(
            f"| {name} | {entry['median_us']:.2f} | {entry['median_us'] / raw:.2f} "
            f"| {entry['calls_per_message']:.0f} |"
        )
    for name, entry in result.items():
        if "top" in entry:
            print(f"\n## {name}: calls and profiled internal us per message, by module")
            for module, figures in entry["by_module"].items():
                print(
                    f"  {module:28s} {figures['calls']:6.1f} {figures['internal_us_profiled']:7.2f}"
                )
            print(entry["top"])
    if args.json_path:
        with open(args.json_path, "w") as stream:
            json.dump(
                {"messages": args.messages, "rounds": args.rounds, **result}, stream, indent=2
            )
            stream.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
