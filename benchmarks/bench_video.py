"""GPU-ready RGB frames to MP4 in a consumer process: the A/B/C/D/E ablation.

Reproduces the seed's measurement with shmring's implementation. A producer
process holds T x H x W x 3 uint8 frames (on the GPU with --device cuda, in
CPU memory with --device cpu, where the "device-to-host" copy is a host copy
through the simulated driver); a consumer process receives them and encodes
an MP4 with PyAV (libx264, ultrafast, CRF 18, 24 fps). Variants, cumulative:

  A  existing path: D2H into a pinned staging buffer, copy into an
     unregistered shm segment, receiver copies out, planar (gbrp) PyAV input
  B  + D2H directly into a CUDA-registered per-transfer segment
  C  + the receiver borrows the segment (no copy-out)
  D  + borrowed PyAV frames (VideoFrame.from_numpy_buffer, rgb24)
  E  D + the registered arena (payloads it admits skip allocate+register)

All variants run side by side in one run: every repeat runs every shape and
every variant (variant order rotated per repeat), after one untimed warm-up
each; the table shows medians. `total` is producer send start to consumer
reply (encode included); `transfer` is the host transfer work alone: the
producer's send (D2H included) plus the consumer's receive and release,
each timed inside its process (no pipe or scheduling latency). Ratios are
against A (and E against D).

    .venv/bin/python benchmarks/bench_video.py --repeats 5 --json results.json
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import platform
import statistics
import sys
import time
import uuid
import zlib
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import torch

SHAPES = ("448x256x4", "672x384x4", "1344x768x1", "448x256x16", "1344x768x122", "1344x768x362")
VARIANTS = ("A", "B", "C", "D", "E")
TIMEOUT_S = 600.0
# Payloads up to this size are "small" (the default arena admits them).
SMALL_PAYLOAD_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True)
class Variant:
    name: str
    registered: bool  # D2H straight into registered shm
    borrowed: bool  # receiver borrows instead of copying out
    frame_input: str  # PyAV frame input (see shmring.impl.video)
    arena: bool  # registered arena on
    staging: bool  # pinned staging buffer before the shm copy (the seed's A)


def variants() -> dict[str, Variant]:
    from shmring.impl.video import FRAME_INPUT_BORROWED, FRAME_INPUT_PLANAR

    return {
        "A": Variant(
            "A",
            registered=False,
            borrowed=False,
            frame_input=FRAME_INPUT_PLANAR,
            arena=False,
            staging=True,
        ),
        "B": Variant(
            "B",
            registered=True,
            borrowed=False,
            frame_input=FRAME_INPUT_PLANAR,
            arena=False,
            staging=False,
        ),
        "C": Variant(
            "C",
            registered=True,
            borrowed=True,
            frame_input=FRAME_INPUT_PLANAR,
            arena=False,
            staging=False,
        ),
        "D": Variant(
            "D",
            registered=True,
            borrowed=True,
            frame_input=FRAME_INPUT_BORROWED,
            arena=False,
            staging=False,
        ),
        "E": Variant(
            "E",
            registered=True,
            borrowed=True,
            frame_input=FRAME_INPUT_BORROWED,
            arena=True,
            staging=False,
        ),
    }


def parse_shape(text: str) -> tuple[int, int, int]:
    width, height, frames = (int(part) for part in text.lower().split("x"))
    return width, height, frames


# -- consumer process ----------------------------------------------------------------


def consume(conn: Connection, scope: str) -> None:
    """Receive, encode, release; answer (mp4 length, crc32, receive s, encode s, release s)."""
    from shmring.impl.transfer import TransferDescriptor, TransferOptions, TransferReceiver
    from shmring.impl.video import encode_rgb_to_mp4

    receivers = {
        borrowed: TransferReceiver(scope, TransferOptions(enable_borrowed_frames=borrowed))
        for borrowed in (False, True)
    }
    while True:
        request = conn.recv()
        if request is None:
            break
        wire, borrowed, frame_input = request
        started = time.perf_counter()
        descriptor = TransferDescriptor.from_wire(wire)
        frames = receivers[borrowed].receive(descriptor)["frames"]
        received = time.perf_counter()
        data = encode_rgb_to_mp4(frames, frame_input=frame_input)
        encoded = time.perf_counter()
        del frames  # releases the lease: arena frame done, segment unmapped
        released = time.perf_counter()
        conn.send(
            (
                len(data),
                zlib.crc32(data),
                received - started,
                encoded - received,
                released - encoded,
            )
        )
    for receiver in receivers.values():
        receiver.close()
    conn.send("closed")


# -- producer ---------------------------------------------------------------------------


class Producer:
    """One sender per variant, kept for the whole run (the arena persists)."""

    def __init__(self, scope: str, device: str, arena_bytes: int) -> None:
        from shmring.impl.cuda_driver import SimulatedCudaDriver
        from shmring.impl.transfer import TransferOptions, TransferSender

        self.device = device
        driver = None if device == "cuda" else SimulatedCudaDriver()
        self.variants = variants()
        self.senders = {}
        for name, variant in self.variants.items():
            options = TransferOptions(
                enable_registered_shm=variant.registered,
                enable_borrowed_frames=variant.borrowed,
                arena_capacity=arena_bytes if variant.arena else 0,
            )
            self.senders[name] = TransferSender(scope, options, driver=driver)
        self.staging: dict[tuple[int, ...], torch.Tensor] = {}

    def send(self, name: str, frames: torch.Tensor) -> dict[str, Any]:
        variant = self.variants[name]
        source = frames
        if variant.staging:
            staging = self.staging.get(tuple(frames.shape))
            if staging is None:
                staging = torch.empty(
                    frames.shape, dtype=frames.dtype, pin_memory=self.device == "cuda"
                )
                self.staging[tuple(frames.shape)] = staging
            staging.copy_(frames, non_blocking=True)
            if self.device == "cuda":
                torch.cuda.current_stream().synchronize()
            source = staging
        return self.senders[name].send({"frames": source}).to_wire()

    def close(self) -> None:
        for sender in self.senders.values():
            sender.close()


def run(args: argparse.Namespace) -> dict[str, Any]:
    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    scope = f"bench{uuid.uuid4().hex[:8]}"
    context = multiprocessing.get_context("spawn")
    conn, child = context.Pipe()
    consumer = context.Process(target=consume, args=(child, scope), daemon=True)
    consumer.start()
    producer = Producer(scope, device, args.arena_mib * 1024 * 1024)
    shapes = [parse_shape(s) for s in args.shapes.split(",")]
    names = [v for v in VARIANTS if v in args.variants]
    samples: dict[str, dict[str, list[tuple[float, float]]]] = {
        s: {v: [] for v in names} for s in args.shapes.split(",")
    }
    digests: dict[str, dict[str, int]] = {s: {} for s in samples}

    def one(shape_key: str, frames: torch.Tensor, name: str) -> tuple[float, float]:
        variant = producer.variants[name]
        if device == "cuda":
            torch.cuda.synchronize()
        started = time.perf_counter()
        wire = producer.send(name, frames)
        sent = time.perf_counter()
        conn.send((wire, variant.borrowed, variant.frame_input))
        if not conn.poll(TIMEOUT_S):
            raise TimeoutError(f"consumer did not answer for {shape_key} {name}")
        length, crc, receive_s, encode_s, release_s = conn.recv()
        total = time.perf_counter() - started
        digests[shape_key].setdefault(name, crc)
        # Host transfer work: producer send (D2H included) + consumer receive + release.
        return total, (sent - started) + receive_s + release_s

    try:
        generator = torch.Generator().manual_seed(0)
        for key, (width, height, count) in zip(samples, shapes, strict=True):
            frames = torch.randint(
                0, 256, (count, height, width, 3), dtype=torch.uint8, generator=generator
            )
            # Smooth content so the encoder does realistic work, not noise.
            frames = (frames // 64 * 64).to(device)
            for name in names:
                one(key, frames, name)  # warm-up: arena set-up, first mappings, codec init
            small = count * height * width * 3 <= SMALL_PAYLOAD_BYTES
            repeats = args.small_repeats if small and args.small_repeats else args.repeats
            for repeat in range(repeats):
                order = names[repeat % len(names) :] + names[: repeat % len(names)]
                for name in order:
                    samples[key][name].append(one(key, frames, name))
            del frames
            print(f"  {key}: done", file=sys.stderr, flush=True)
    finally:
        conn.send(None)
        if conn.poll(TIMEOUT_S):
            conn.recv()
        consumer.join(TIMEOUT_S)
        if consumer.is_alive():
            consumer.kill()
        producer.close()
    return {
        "device": device,
        "device_name": torch.cuda.get_device_name()
        if device == "cuda"
        else platform.processor() or platform.machine(),
        "cpu_count": multiprocessing.cpu_count(),
        "torch": torch.__version__,
        "repeats": args.repeats,
        "small_repeats": args.small_repeats or args.repeats,
        "arena_mib": args.arena_mib,
        "samples": samples,
        "mp4_crc32": digests,
        "medians": {
            shape: {
                name: {
                    "total_ms": 1000 * statistics.median(t for t, _ in runs),
                    "transfer_ms": 1000 * statistics.median(p for _, p in runs),
                }
                for name, runs in by_variant.items()
            }
            for shape, by_variant in samples.items()
        },
    }


def table(result: dict[str, Any]) -> str:
    medians = result["medians"]
    names = list(next(iter(medians.values())))
    lines = [
        f"device={result['device']} ({result['device_name']}), cpus={result['cpu_count']}, "
        f"repeats={result['repeats']} (small payloads: {result['small_repeats']}), medians; "
        "ratio = variant/A (E/D last)",
        "",
        "| W x H x T | A total ms | " + " | ".join(f"{n}/A" for n in names if n != "A") + " | E/D "
        "| A transfer ms | "
        + " | ".join(f"{n}/A xfer" for n in names if n != "A")
        + " | E/D xfer |",
        "|---" * (2 + 2 * (len(names) - 1) + 3) + "|",
    ]
    for shape, by_variant in medians.items():
        a_total = by_variant["A"]["total_ms"]
        a_transfer = by_variant["A"]["transfer_ms"]
        ratios = [by_variant[n]["total_ms"] / a_total for n in names if n != "A"]
        e_d = (
            by_variant["E"]["total_ms"] / by_variant["D"]["total_ms"]
            if {"D", "E"} <= set(by_variant)
            else float("nan")
        )
        transfer = [by_variant[n]["transfer_ms"] / a_transfer for n in names if n != "A"]
        e_d_transfer = (
            by_variant["E"]["transfer_ms"] / by_variant["D"]["transfer_ms"]
            if {"D", "E"} <= set(by_variant)
            else float("nan")
        )
        lines.append(
            f"| {shape} | {a_total:.1f} | "
            + " | ".join(f"{r:.2f}" for r in ratios)
            + f" | {e_d:.2f} | {a_transfer:.1f} | "
            + " | ".join(f"{r:.2f}" for r in transfer)
            + f" | {e_d_transfer:.2f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    parser.add_argument(
        "--shapes", default=",".join(SHAPES), help="W x H x T list, comma separated"
    )
    parser.add_argument("--variants", default="".join(VARIANTS))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--small-repeats",
        type=int,
        default=0,
        help="repeats for payloads of at most 16 MiB (cheap, and noisier); default: --repeats",
    )
    parser.add_argument("--arena-mib", type=int, default=64, help="registered arena size for E")
    parser.add_argument("--json", help="write all samples and medians here")
    args = parser.parse_args(argv)
    result = run(args)
    text = table(result)
    print(text)
    if args.json:
        with open(args.json, "w") as out:
            json.dump(dict(result, table=text), out, indent=1)
    same = {shape: len({d.get("D"), d.get("E")}) == 1 for shape, d in result["mp4_crc32"].items()}
    if not all(same.values()):
        print(f"warning: D and E gave different MP4 bytes: {same}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
