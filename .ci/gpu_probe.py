"""The GPU check's probes (issue 21): the environment first, then /dev/shm against the bench.

    python .ci/gpu_probe.py env SUMMARY ENVFILE [CARRIED]
    python .ci/gpu_probe.py shm [--remount]

`env` appends a line per fact to SUMMARY as soon as it is known (python,
torch, CUDA available, device name, driver, cuda-bindings, /dev/shm size,
then which modules import), so a probe that hangs still leaves what it
found; it writes ENVFILE (shell assignments: HAS_CUDA, MISSING = the
candidate imports that fail here). CARRIED is gpu_prepare's carried.txt:
its `import=NAME` fields are the candidates (default: av, msgspec).

`shm` prints what the video bench needs of /dev/shm for its largest seed
shape, what is there, and what the bench will run (`--fit-shm`: a shape that
does not fit is shrunk to fewer frames, or left out). If it does not fit,
`--remount` asks `mount -o remount,size=...` for the need plus 512 MiB and
measures again. Exit status 0: the largest shape fits (now); 3: it does not,
and the bench shrinks; anything else: the probe failed.
"""

from __future__ import annotations

import importlib
import os
import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

CANDIDATES = ("av", "msgspec")
# What the image has (KINDS.md) and the check imports; reported, never installed.
EXPECTED = ("numpy", "pytest", "hypothesis", "xxhash")
REMOUNT_SLACK_MIB = 512  # asked beyond the largest shape's need


def candidates(carried: Path | None) -> list[str]:
    if carried is None or not carried.exists():
        return list(CANDIDATES)
    return re.findall(r"\bimport=(\S+)", carried.read_text()) or list(CANDIDATES)


def shm_line() -> str:
    try:
        stats = os.statvfs("/dev/shm")
    except OSError as error:
        return f"/dev/shm: unavailable ({error})"
    size, free = stats.f_blocks * stats.f_frsize, stats.f_bavail * stats.f_frsize
    return f"/dev/shm: size {size / 2**20:.0f} MiB, free {free / 2**20:.0f} MiB"


def driver_version() -> str:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return "no nvidia-smi"
    try:
        out = subprocess.run(
            [smi, "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=15,
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"nvidia-smi failed ({error})"
    return (out.stdout.strip() or out.stderr.strip() or f"nvidia-smi rc={out.returncode}").replace(
        "\n", "; "
    )


def probe_env(summary: Path, envfile: Path, carried: Path | None) -> int:
    with summary.open("a") as out:

        def say(line: str) -> None:
            print(f"probe: {line}", file=out, flush=True)
            print(f"probe: {line}", flush=True)

        say(f"python {platform.python_version()} ({sys.executable}), {platform.platform()}")
        say(shm_line())
        say(f"driver (nvidia-smi): {driver_version()}")
        has_cuda = False
        try:
            import torch

            has_cuda = bool(torch.cuda.is_available())
            say(
                f"torch {torch.__version__} (CUDA build {torch.version.cuda}), CUDA available: {has_cuda}"
            )
            if has_cuda:
                p = torch.cuda.get_device_properties(0)
                say(
                    f"device 0 of {torch.cuda.device_count()}: {p.name}, capability "
                    f"{p.major}.{p.minor}, {p.total_memory / 2**30:.1f} GiB"
                )
            else:
                say("device: none")
        except Exception as error:  # report, do not stop: the steps say what fails
            say(f"torch: FAILED to import ({type(error).__name__}: {error})")
        try:
            import cuda.bindings
            from cuda.bindings import runtime

            line = f"cuda-bindings {cuda.bindings.__version__}"
            if has_cuda:  # without a device the runtime answers an error, not a version
                line += (
                    f", driver API {runtime.cudaDriverGetVersion()[1]},"
                    f" runtime {runtime.cudaRuntimeGetVersion()[1]}"
                )
            say(line)
        except Exception as error:
            say(f"cuda-bindings: MISSING ({type(error).__name__}: {error})")
        missing = []
        for name in EXPECTED + tuple(candidates(carried)):
            try:
                module = importlib.import_module(name)
            except Exception as error:
                missing.append(name)
                say(f"import {name}: MISSING ({type(error).__name__})")
            else:
                say(f"import {name}: {getattr(module, '__version__', 'present')}")
    candidate_missing = [name for name in missing if name in candidates(carried)]
    envfile.write_text(f"HAS_CUDA={int(has_cuda)}\nMISSING='{' '.join(candidate_missing)}'\n")
    return 0


def shm_plan(bench: Any) -> tuple[bool, list[str]]:
    """Whether the largest seed shape fits in /dev/shm now, and what the bench will run."""
    arena = bench.ARENA_MIB * 2**20
    largest = max(bench.SHAPES, key=bench.payload_bytes)
    need = bench.shm_needed(largest, arena)
    available = bench.shm_available()
    _, left_out, shrunk = bench.fit_shapes(list(bench.SHAPES), arena, available)
    lines = [
        f"largest seed shape {largest} needs {need / 2**20:.0f} MiB of /dev/shm "
        f"(payload + {bench.ARENA_MIB} MiB arena + margin); {available / 2**20:.0f} MiB free"
    ]
    lines += [f"the bench runs {shape}: {why}" for shape, why in shrunk.items()]
    lines += [f"the bench leaves out {shape}: {why}" for shape, why in left_out.items()]
    return need <= available, lines


def probe_shm(remount: bool) -> int:
    """0: the largest shape fits (after a remount, if one was needed); 3: the bench shrinks."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    import bench_video as bench

    fits, lines = shm_plan(bench)
    print("\n".join(lines), flush=True)
    if fits or not remount:
        return 0 if fits else 3
    largest = max(bench.SHAPES, key=bench.payload_bytes)
    size_mib = bench.shm_needed(largest, bench.ARENA_MIB * 2**20) // 2**20 + REMOUNT_SLACK_MIB
    command = ["mount", "-o", f"remount,size={size_mib}m", "/dev/shm"]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=10)
        answer = (
            "done" if done.returncode == 0 else f"failed: {(done.stderr or done.stdout).strip()}"
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        answer = f"failed: {error}"
    print(f"{' '.join(command)}: {answer}", flush=True)
    fits, lines = shm_plan(bench)
    print("\n".join(lines), flush=True)
    return 0 if fits else 3


def main(argv: list[str]) -> int:
    if argv[:1] == ["env"] and len(argv) in (3, 4):
        return probe_env(Path(argv[1]), Path(argv[2]), Path(argv[3]) if len(argv) == 4 else None)
    if argv in (["shm"], ["shm", "--remount"]):
        return probe_shm(remount=argv[1:] == ["--remount"])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
