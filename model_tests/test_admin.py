"""`shmring stat` and `shmring gc`: what a deployment holds, and what dead producers left."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from shmring import cli
from shmring.impl import admin, names

PRODUCER = textwrap.dedent(
    """
    import sys
    from shmring.impl.connector import Connector
    connector = Connector(
        sys.argv[1], ring_capacity=64 * 1024, fallback_spare_min_bytes=0, pool_budget_bytes=0
    )
    connector.put("a", "b", "small", b"x" * 100)
    connector.put("a", "b", "large", b"y" * 40_000)  # over a quarter of the ring: fallback
    connector.put("a", "b", "kept", b"z" * 40_000)
    assert connector.get("a", "b", "kept").value == b"z" * 40_000  # handed back: a spare file
    print("ready", flush=True)
    sys.stdin.read()  # wait to be killed
    """
)


@pytest.fixture
def killed_producer(scope: str):
    """A producer that published on the ring and the fallback, then died by SIGKILL."""
    process = subprocess.Popen(
        [sys.executable, "-c", PRODUCER, scope],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        assert process.stdout.readline().strip() == "ready"
        pid = process.pid
        os.kill(pid, signal.SIGKILL)
        process.wait(timeout=30)
        yield pid
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=30)
        for stream in (process.stdin, process.stdout):
            if stream is not None:
                stream.close()
        admin.collect(scope)  # whatever the test left


def test_stat_of_an_unknown_scope_says_nothing_is_there(scope: str) -> None:
    status = admin.deployment_status(scope)
    assert not status.exists
    assert admin.format_status(status) == (
        f"{names.deployment_directory(scope)}: nothing in shared memory for this scope"
    )


def test_stat_shows_the_dead_producer_its_ring_and_its_segment(
    scope: str, killed_producer: int
) -> None:
    status = admin.deployment_status(scope)
    assert status.exists
    assert [pid for pid, _ in status.producers] == [killed_producer]
    assert status.live_producers == ()
    (ring,) = status.rings
    assert ring.edge == ("a", "b") and not ring.alive
    assert ring.capacity == 64 * 1024 and ring.published_frames == 1 and ring.used_bytes > 0
    assert status.segments == 1 and status.segment_bytes >= 40_000
    assert status.spares == 1 and status.spare_bytes >= 40_000
    assert any(name.startswith("fbspare.") for name in status.orphans)
    assert len(status.orphans) >= 4  # ring, marker, segment, spare (and the live file)
    assert "spare files=1" in admin.format_status(status)


def test_gc_dry_run_lists_and_removes_nothing(
    scope: str, killed_producer: int, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = names.deployment_directory(scope)
    before = sorted(os.listdir(directory))
    assert cli.main(["gc", "--scope", scope, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("would remove ")
    assert sorted(os.listdir(directory)) == before
    assert all(name in out for name in admin.deployment_status(scope).orphans)


def test_gc_removes_everything_a_dead_producer_left(
    scope: str, killed_producer: int, capsys: pytest.CaptureFixture[str]
) -> None:
    orphans = admin.deployment_status(scope).orphans
    assert cli.main(["gc", "--scope", scope]) == 0
    out = capsys.readouterr().out
    assert out.startswith("removed ")
    assert all(name in out for name in orphans)
    assert not os.path.exists(names.deployment_directory(scope))


def test_gc_leaves_a_live_producers_files(scope: str) -> None:
    from shmring.impl.connector import Connector

    with Connector(scope, ring_capacity=64 * 1024) as connector:
        connector.put("a", "b", "k", b"z")
        assert admin.collect(scope) == []
        status = admin.deployment_status(scope)
        assert status.live_producers == status.producers and len(status.producers) == 1
        assert status.rings[0].alive and status.rings[0].published_frames == 1


def test_bad_scope_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["stat", "--scope", "../etc"]) == 2
    assert "../etc" in capsys.readouterr().err


def test_gc_knows_the_owner_of_every_kind_of_file() -> None:
    """Registered-transfer segments and arenas carry their producer in the name, like rings."""
    me = names.current_producer_identity()
    assert names.file_owner(names.registered_segment_file_name()) == me
    assert names.file_owner(names.arena_file_name()) == me
    assert names.file_owner(names.ring_file_name("a", "b", me)) == me
    assert names.file_owner(names.marker_file_name(("a", "b"), me)) == me
    assert names.file_owner("stamp") is None
    assert names.file_owner("seg.12.34.5.nothex!") is None
