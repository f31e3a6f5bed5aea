"""Scope directory teardown is a protocol (issue 22, defect 8).

The last member out removes the directory, under the teardown lock (an
exclusive flock on the directory's own inode), relative to its parent's
descriptor after checking the entry is that very inode; a join racing it
either joins the surviving directory or makes a fresh one. Never a
best-effort rmdir by path that can take a directory someone else just made.

* A deterministic interleaving, through the OS seam: at the leaver's rmdir
  another member joins and leaves (a complete teardown of its own) and a
  joiner makes a fresh directory at the path. The path-based rmdir removed
  the joiner's directory; the protocol leaves it.
* Two processes churn join/leave in one scope (thousands of teardowns): no
  failure of any kind, and every join is in the directory the path names.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import textwrap

import pytest

from shmring.impl.admin import collect
from shmring.impl.directory import open_deployment_directory
from shmring.impl.discovery import Membership
from shmring.impl.names import MEMBERS_FILE_NAME, deployment_directory
from shmring.impl.os_seam import SITE_FLOCK, SITE_RMDIR, OsFacade

WAIT_S = 300.0


class _AtRmdir(OsFacade):
    """An OS seam that runs `hook` once, right before the first rmdir it is asked for."""

    def __init__(self, hook: object) -> None:
        super().__init__()
        self.hook = hook

    def _enter(self, site: str) -> None:
        hook, self.hook = self.hook, None
        if site == SITE_RMDIR and callable(hook):
            hook()
        elif hook is not None:
            self.hook = hook


def _join(scope: str, os_facade: OsFacade) -> Membership:
    return Membership.join(
        None, os_facade, ensure_directory=lambda: open_deployment_directory(scope, os_facade)
    )


def _mkdir_as_stranger(path: str) -> None:
    """Another uid (nobody) makes `path`, mode 0777: a squatter at our directory's name."""

    def drop() -> None:
        os.setgroups([])
        os.setgid(65534)
        os.setuid(65534)

    subprocess.run(
        ["/bin/sh", "-c", 'mkdir "$1" 2>/dev/null && chmod 0777 "$1"; exit 0', "sh", path],
        check=True,
        preexec_fn=drop,
        timeout=60,
        env={},
    )


@pytest.mark.parametrize(
    "maker",
    [
        "joiner",
        pytest.param(
            "stranger",
            marks=pytest.mark.skipif(os.geteuid() != 0, reason="another uid needs root"),
        ),
    ],
)
def test_a_teardown_never_removes_a_directory_it_did_not_verify(scope: str, maker: str) -> None:
    """`maker` puts a fresh directory at the path: a joiner of ours, or another uid (a squatter).

    The path-based rmdir removed either (the squatter's too, as root; an
    ordinary uid got EPERM from the sticky shm root instead).
    """
    path = deployment_directory(scope)
    seen: dict[str, int] = {}

    def meanwhile() -> None:
        # Between the leaver's check and its rmdir: another process joins the
        # directory (the leaver unlinked ``members``, so it makes a new one)
        # and leaves as the last member of that one; then a third process's
        # join makes a fresh directory at the path (its mkdir, nothing in it yet).
        other = _join(scope, OsFacade())
        other.leave()
        other.directory.close()  # type: ignore[attr-defined]
        if maker == "stranger":
            _mkdir_as_stranger(path)
        else:
            with contextlib.suppress(FileExistsError):  # the first is still there: joined then
                os.mkdir(path, 0o700)
        seen["inode"] = os.stat(path).st_ino

    leaver = _join(scope, _AtRmdir(meanwhile))
    try:
        leaver.leave()
        assert "inode" in seen, "the leaver never reached its rmdir"
        # Whatever the joiner found or made at the path is still there.
        assert os.path.isdir(path) and os.stat(path).st_ino == seen["inode"]
        if os.stat(path).st_uid == os.getuid():
            joiner = _join(scope, OsFacade())  # and a join there works
            joiner.leave()
            joiner.directory.close()  # type: ignore[attr-defined]
    finally:
        leaver.directory.close()  # type: ignore[attr-defined]
        collect(scope)  # what the interleaving left (an orphan ``members``) goes
        if os.path.isdir(path):
            os.rmdir(path)
    assert not os.path.exists(path)


_CHURN = textwrap.dedent(
    """
    import collections, json, os, sys, traceback
    scope, kind, rounds, go = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    if kind == "sender":
        import torch
        from shmring.impl.registered.transfer import TransferSender
    else:
        from shmring.impl.connector import Connector
    from shmring.impl.names import deployment_directory
    path = deployment_directory(scope)
    failures = collections.Counter()
    first = None
    directories = set()
    print("ready", flush=True)
    while not os.path.exists(go):
        pass
    for _ in range(rounds):
        try:
            if kind == "sender":
                member = TransferSender(scope)
                identity = member.files.identity
            else:
                member = Connector(scope)
                member.join()
                identity = member._deployment.directory.identity
            here = os.stat(path)
            if (here.st_dev, here.st_ino) != identity:  # joined, so the path names ours
                failures["joined a directory the path does not name"] += 1
            directories.add(identity)
            member.close()
        except Exception as error:
            failures[f"{type(error).__name__} errno={getattr(error, 'errno', None)}"] += 1
            first = first or traceback.format_exc()
    print(json.dumps({"failures": failures, "directories": sorted(directories), "first": first}))
    """
)


@pytest.mark.parametrize("kinds", [("connector", "connector"), ("sender", "connector")])
def test_two_processes_churning_join_and_leave_never_fail(
    scope: str, tmp_path: object, kinds: tuple[str, str]
) -> None:
    rounds = 3000
    go = os.path.join(str(tmp_path), "go")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", _CHURN, scope, kind, str(rounds), go],
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        for kind in kinds
    ]
    try:
        for worker in workers:
            assert worker.stdout is not None
            assert worker.stdout.readline().strip() == "ready"
        open(go, "w").close()  # both start together
        answers = []
        for worker in workers:
            out, _ = worker.communicate(timeout=WAIT_S)
            assert worker.returncode == 0
            answers.append(json.loads(out))
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
                worker.wait()
    for answer in answers:
        assert answer["failures"] == {}, answer["first"]
    directories = {tuple(d) for answer in answers for d in answer["directories"]}
    teardowns = len(directories) - 1
    assert teardowns > 0  # the loop really tore down (thousands, typically)
    assert not os.path.exists(deployment_directory(scope))  # the last one out removed it


_WITHOUT_STDIN = textwrap.dedent(
    """
    import os, sys
    from shmring.impl.connector import Connector

    os.close(0)  # a service started without stdin: the next descriptor opened is 0
    with Connector(sys.argv[1], ring_capacity=1 << 16) as connector:
        connector.put(("a", "b"), "k", b"v")  # joins: the directory is opened first
        held = connector._deployment.directory.fd
        assert connector.get(("a", "b"), "k").value == b"v"
    print(held, os.path.exists(connector.directory))
    """
)


def test_a_process_without_stdin_tears_its_deployment_down(scope: str) -> None:
    """Descriptor 0 is a descriptor like any other: a deployment directory held as fd 0 is removed at close."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    result = subprocess.run(
        [sys.executable, "-c", _WITHOUT_STDIN, scope],
        capture_output=True,
        text=True,
        env=env,
        timeout=WAIT_S,
    )
    assert result.returncode == 0, result.stderr
    held, exists = result.stdout.split()
    assert held == "0"  # the directory really was descriptor 0
    assert exists == "False"
    assert not os.path.exists(deployment_directory(scope))


class _UnlinksMembersAtFirstLock(OsFacade):
    """An OS seam that unlinks `members` once, right before the first flock: a teardown's unlink
    landing between a joiner's open of the file and its lock."""

    def __init__(self, path: str) -> None:
        super().__init__()
        self.path: str | None = path

    def _enter(self, site: str) -> None:
        path = self.path
        if site == SITE_FLOCK and path is not None:
            self.path = None
            os.unlink(path)


def test_a_join_whose_members_file_was_unlinked_before_its_lock_starts_over(scope: str) -> None:
    """The lock then sits on a file no one else finds (nlink 0): the join opens `members` again."""
    setup = Membership.join(
        None, OsFacade(), ensure_directory=lambda: open_deployment_directory(scope, OsFacade())
    )
    members = os.path.join(setup.directory.path, MEMBERS_FILE_NAME)
    try:
        seam = _UnlinksMembersAtFirstLock(members)
        member = Membership.join(setup.directory, seam)
        try:
            assert seam.path is None  # the unlink happened
            assert isinstance(member, Membership) and member.joined
            held = os.fstat(member._fd)
            assert held.st_nlink == 1  # the lock is on the file at the name, not the lost one
            assert (held.st_dev, held.st_ino) == (os.stat(members).st_dev, os.stat(members).st_ino)
        finally:
            member.leave()
    finally:
        setup.leave()
        setup.directory.close()
    assert not os.path.exists(deployment_directory(scope))
