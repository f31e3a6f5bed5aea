"""The fleet with its real parts (issue 28): shards of `shmring check` sharing a Redis
example database, against a real `redis-server` on a private port.

A deliberately failing lockstep machine is found by one shard, which saves the
example into Redis; the other shard's next run of that unit (the rerun command the
failure printed) replays it first: it fails in its very first example, where the same
run without the database needs several. Skips, saying why, where `redis-server` or the
`redis` client (`pip install 'shmring[redis]'`) is absent; `.ci/setup` installs both.
"""

from __future__ import annotations

import contextlib
import json
import shlex
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, rule

from shmring import cli
from shmring.check import sections

REDIS_SERVER = shutil.which("redis-server")
FAILING_FROM = 5_000


class FleetProbeMachine(RuleBasedStateMachine):
    """Fails on a large drawn value: found by search (Hypothesis tries the simplest
    example first, which holds), then shrunk to the smallest failing value."""

    # Per run: examples started, and (at which example, on which value) the first
    # failure came (shrinking, which starts more, comes after it).
    examples: list[int] = []
    first_failure: list[tuple[int, int] | None] = []

    def __init__(self) -> None:
        super().__init__()
        FleetProbeMachine.examples[-1] += 1

    @rule(value=st.integers(0, 10_000))
    def draw(self, value: int) -> None:
        if value >= FAILING_FROM:
            if FleetProbeMachine.first_failure[-1] is None:
                FleetProbeMachine.first_failure[-1] = (FleetProbeMachine.examples[-1], value)
            raise AssertionError(f"deliberately failing plan: value={value}")

    @rule()
    def idle(self) -> None:
        pass


class FleetSteadyMachine(RuleBasedStateMachine):
    """The other shard's unit: always holds."""

    @rule(value=st.integers())
    def draw(self, value: int) -> None:
        assert isinstance(value, int)


@pytest.fixture
def redis_url(tmp_path: Path) -> Iterator[str]:
    if REDIS_SERVER is None:
        pytest.skip("no redis-server on PATH (Debian: apt-get install redis-server)")
    try:
        import hypothesis.extra.redis  # noqa: F401
        import redis
    except ImportError as error:
        pytest.skip(f"no Redis client: pip install 'shmring[redis]' ({error})")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen(
        [REDIS_SERVER, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no", "--dir", str(tmp_path)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )  # fmt: skip
    url = f"redis://127.0.0.1:{port}/0"
    client = redis.Redis.from_url(url)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(
                        f"redis-server did not start: rc={server.poll()}"
                    ) from None
                time.sleep(0.05)
        yield url
    finally:
        with contextlib.suppress(Exception):
            client.close()
        server.terminate()
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


@pytest.fixture
def fleet_machines(monkeypatch: pytest.MonkeyPatch) -> None:
    """The campaign's lockstep section holds the two machines above (this process)."""
    monkeypatch.setattr(
        sections,
        "LOCKSTEP_MACHINES",
        (
            (__name__, "FleetProbeMachine", 400, 10),
            (__name__, "FleetSteadyMachine", 40, 5),
        ),
    )
    FleetProbeMachine.examples = []
    FleetProbeMachine.first_failure = []


def _run(tmp_path: Path, name: str, *argv: str) -> tuple[int, dict[str, Any]]:
    report = tmp_path / f"{name}.json"
    if "--workers" not in argv:
        argv = (*argv, "--workers", "1")  # in this process, where the machines are
    FleetProbeMachine.examples.append(0)
    FleetProbeMachine.first_failure.append(None)
    status = cli.main([*argv, "--report", str(report)])
    return status, json.loads(report.read_text())


def test_a_failure_one_shard_found_is_replayed_first_by_the_other(
    tmp_path: Path, redis_url: str, fleet_machines: None
) -> None:
    import redis

    shards = {}
    for shard in ("1/2", "2/2"):
        argv = ["check", "--only", "lockstep", "--unit", "lockstep:*/0", "--shard", shard]
        shards[shard] = _run(tmp_path, shard.replace("/", "of"), *argv, "--database", redis_url)
    ran = {
        shard: [unit["unit"] for unit in report["units"]] for shard, (_, report) in shards.items()
    }
    assert sorted(sum(ran.values(), [])) == ["lockstep:fleetprobe/0", "lockstep:fleetsteady/0"]
    (finder,) = [shard for shard, units in ran.items() if units == ["lockstep:fleetprobe/0"]]
    (other,) = [shard for shard in shards if shard != finder]
    status, report = shards[finder]
    assert status == 1 and [f["unit"] for f in report["failures"]] == ["lockstep:fleetprobe/0"]
    assert "deliberately failing plan" in report["failures"][0]["message"]
    assert shards[other][0] == 0
    assert redis.Redis.from_url(redis_url).dbsize() > 0  # the example went to the server

    # The other shard's next run: the failure's own rerun command, with the fleet's database.
    rerun = shlex.split(report["failures"][0]["rerun"])
    assert "check" in rerun and "lockstep:fleetprobe/0" in rerun, rerun
    status, again = _run(tmp_path, "replay", *rerun[1:], "--database", redis_url)
    assert status == 1 and [f["unit"] for f in again["failures"]] == ["lockstep:fleetprobe/0"]
    # The same run without the database has to search for it.
    status, alone = _run(tmp_path, "alone", *rerun[1:], "--database", "none")
    assert status == 1 and [f["unit"] for f in alone["failures"]] == ["lockstep:fleetprobe/0"]
    runs = dict(
        zip(["1/2", "2/2", "replay", "alone"], FleetProbeMachine.first_failure, strict=True)
    )
    found, replayed, searched = runs[finder], runs["replay"], runs["alone"]
    assert found is not None and replayed is not None and searched is not None, runs
    # The replaying run's very first example is the finder's shrunk one (the
    # smallest failing value); the finder and the run without the database
    # start from the simplest example, which holds, and search.
    assert replayed == (1, FAILING_FROM), runs
    assert found[0] > 1 and searched[0] > 1, runs
