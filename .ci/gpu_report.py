"""Write RESULTS/report.md from what `.ci/gpu_check` left in RESULTS (also after a cut run).

    python .ci/gpu_report.py RESULTS

Sections: environment, the CUDA tests and the CPU tests of the same files
(counts from the JUnit XML), the video ablation (every shape's ratios, E/A,
the route checks) and whether the seed's small-shape regression is gone.
Reads only files; a missing one is reported as missing, never invented.
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path

# The seed (vllm-project/vllm-omni PR #7355) measured its registered path on one
# H200 42-49% slower than the existing path on small shapes and 43-45% faster on
# large ones. Its per-shape figures belong next to ours; they are not restated
# here (transcribe them from the seed's table when comparing).
SEED_SMALL_SHAPE_REGRESSION = "+42..+49% (registered path vs existing path, seed, H200)"


def counts(path: Path) -> str:
    if not path.exists():
        return f"no {path.name} (step not run, or cut before pytest wrote it)"
    try:  # pytest writes the XML at its end: a run killed while writing leaves half a file
        root = ElementTree.parse(path).getroot()
    except ElementTree.ParseError as error:
        return f"{path.name} unreadable ({error}): the step was cut while pytest wrote it"
    suite = root if root.tag == "testsuite" else next(iter(root), None)
    if suite is None:
        return f"{path.name} holds no test suite"
    get = lambda key: int(suite.get(key, "0"))  # noqa: E731
    tests, failures, errors, skipped = get("tests"), get("failures"), get("errors"), get("skipped")
    passed = tests - failures - errors - skipped
    return (
        f"{tests} tests: {passed} passed, {failures} failed, {errors} errors, {skipped} skipped "
        f"({float(suite.get('time', '0')):.1f} s)"
    )


def bench_section(path: Path) -> list[str]:
    if not path.exists():
        return [f"no {path.name} (bench not run, or cut before its first shape)"]
    data = json.loads(path.read_text())
    lines = [
        f"device {data['device']} ({data['device_name']}), driver {data['driver']}, "
        f"torch {data['torch']}, repeats {data['repeats']} (small {data['small_repeats']}), "
        f"complete: {data['complete']}",
        "",
        data.get("table", ""),
        "",
        f"| W x H x T | payload MiB | E/A | target <= {data['e_over_a_target']} | routes |",
        "|---|---|---|---|---|",
    ]
    for shape in data["shapes_done"]:
        ratio = data["e_over_a"].get(shape)
        problems = [p for key, p in data["route_problems"].items() if key.startswith(shape + " ")]
        lines.append(
            f"| {shape} | {data['payload_bytes'][shape] / 2**20:.1f} | "
            + (
                f"{ratio:.2f} | {'met' if ratio <= data['e_over_a_target'] else 'MISSED'}"
                if ratio
                else "- | -"
            )
            + f" | {'ok' if not problems else 'FAILED: ' + str(problems)} |"
        )
    for shape, why in data["shapes_left_out"].items():
        mib = data["payload_bytes"][shape] / 2**20
        lines.append(f"| {shape} | {mib:.1f} | left out: {why} | | |")
    small = data["small_shapes"]
    lines += [
        "",
        f"Seed's small-shape regression: {SEED_SMALL_SHAPE_REGRESSION}.",
        f"Small shapes measured here: {', '.join(small) or 'none'}; regression gone "
        f"(E/A <= {data['e_over_a_target']} on every one): "
        + (
            str(data["small_shape_regression_gone"])
            if data["device"] == "cuda"
            else "not judged (a CPU run has no cudaHostRegister cost)"
        )
        + ".",
        f"Route checks (A copying path; B-E registered, asynchronous, page-locked; E arena for "
        f"small payloads): {'ok' if data['routes_ok'] else 'FAILED'}.",
    ]
    return lines


def main(results: Path) -> int:
    out = ["# GPU check report", ""]
    summary = results / "summary.txt"
    out += [
        "## Steps",
        "",
        "```",
        summary.read_text().strip() if summary.exists() else "(none)",
        "```",
        "",
    ]
    environment = results / "environment.txt"
    out += ["## Environment", "", "```"]
    out += [environment.read_text().strip() if environment.exists() else "(missing)", "```", ""]
    out += [
        "## Tests",
        "",
        f"- CUDA tests (real driver, `-m cuda`): {counts(results / 'cuda-tests.xml')}",
        f"- CPU tests of the same files (`-m 'not cuda'`): {counts(results / 'cpu-tests.xml')}",
        "",
        "## Video ablation",
        "",
    ]
    bench = results / "bench_video_gpu.json"
    if not bench.exists() and (results / "bench_video_cpu.json").exists():
        out += [
            "No GPU run: the CPU run through the simulated driver (checks the script only;"
            " its ratios say nothing about cudaHostRegister).",
            "",
        ]
        bench = results / "bench_video_cpu.json"
    out += bench_section(bench)
    (results / "report.md").write_text("\n".join(out) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
