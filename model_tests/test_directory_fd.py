"""The deployment directory held by a verified descriptor (issue 12, part 1)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from shmring.impl.connector import Connector, GetStatus
from shmring.impl.directory import DeploymentDirectory, open_deployment_directory
from shmring.impl.errors import (
    ConfigurationError,
    CorruptFrameError,
    DirectoryReplacedError,
    ShmringError,
)
from shmring.impl.names import deployment_directory, fallback_segment_path
from shmring.impl.os_seam import OsFacade

EDGE = ("src", "dst")


def test_a_symlink_or_an_open_directory_is_refused_typed(scope: str, tmp_path: object) -> None:
    path = deployment_directory(scope)
    target = os.path.join(str(tmp_path), "elsewhere")
    os.mkdir(target, 0o700)
    os.symlink(target, path)
    try:
        with pytest.raises(ConfigurationError, match="not a directory"):
            open_deployment_directory(scope)
    finally:
        os.unlink(path)
    os.mkdir(path, 0o700)
    os.chmod(path, 0o755)
    try:
        with pytest.raises(ConfigurationError, match="mode is not 0700"):
            open_deployment_directory(scope)
        with pytest.raises(ConfigurationError):
            Connector(scope).put(EDGE, "k", b"x")
    finally:
        os.rmdir(path)


def test_files_follow_the_descriptor_not_the_path_once_the_directory_is_replaced(
    scope: str,
) -> None:
    directory = open_deployment_directory(scope)
    aside = directory.path + ".aside"
    try:
        os.rename(directory.path, aside)
        os.mkdir(directory.path, 0o700)  # a stranger at the path (here: looks like ours)
        with pytest.raises(DirectoryReplacedError):
            directory.verify()
        fd = directory.open("probe", os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        os.close(fd)
        assert os.listdir(aside) == ["probe"] and os.listdir(directory.path) == []
        directory.unlink("probe")
        with pytest.raises(ValueError, match="not a file of"):
            directory.open("/etc/passwd", os.O_RDONLY)
    finally:
        directory.close()
        os.rmdir(aside)
        os.rmdir(directory.path)


def test_a_removed_directory_refuses_new_files_and_the_join_opens_it_again(scope: str) -> None:
    directory = open_deployment_directory(scope)
    os.rmdir(directory.path)
    try:
        assert directory.is_removed()
        with pytest.raises(FileNotFoundError):
            directory.open("members", os.O_RDWR | os.O_CREAT, 0o600)
        assert not os.path.exists(directory.path)  # nothing was created anywhere
        with Connector(scope) as connector:  # joins afresh
            connector.put(EDGE, "k", b"x" * 10)
            assert connector.get(EDGE, "k").status is GetStatus.DELIVERED
    finally:
        directory.close()
    assert not os.path.exists(deployment_directory(scope))


def test_a_segment_not_mode_0600_is_never_delivered_and_is_removed(scope: str) -> None:
    with (
        Connector(scope, ring_capacity=4096, pool_budget_bytes=0) as producer,
        Connector(scope, ring_capacity=4096) as receiver,
    ):
        producer.put(EDGE, "big", {"v": b"x" * 3000})  # > capacity / 4: a fallback segment
        path = fallback_segment_path(producer.directory, EDGE, "big")
        os.chmod(path, 0o644)  # changed by someone: its bytes are not ours to trust
        with pytest.raises(CorruptFrameError, match="not trusted"):
            receiver.get(EDGE, "big")
        assert not os.path.exists(path)


@pytest.mark.root
def test_a_segment_owned_by_another_uid_is_never_delivered(scope: str) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to give a file to another uid")
    with (
        Connector(scope, ring_capacity=4096, pool_budget_bytes=0) as producer,
        Connector(scope, ring_capacity=4096) as receiver,
    ):
        producer.put(EDGE, "big", {"v": b"x" * 3000})
        path = fallback_segment_path(producer.directory, EDGE, "big")
        os.chown(path, 4242, 4242)
        with pytest.raises(CorruptFrameError, match="not ours: uid=4242"):
            receiver.get(EDGE, "big")
        assert not os.path.exists(path)


def test_connector_file_operations_all_go_through_the_directory_descriptor(scope: str) -> None:
    """No open/stat/unlink/rename/scandir by a path inside the deployment directory."""

    class PathCalls(OsFacade):
        def __init__(self) -> None:
            self.paths: list[str] = []

        def open(self, path: str, flags: int, mode: int = 0o600) -> int:
            self.paths.append(path)
            return super().open(path, flags, mode)

        def stat(self, path: str) -> os.stat_result:
            self.paths.append(path)
            return super().stat(path)

        def unlink(self, path: str) -> None:
            self.paths.append(path)
            super().unlink(path)

        def rename(self, source: str, target: str) -> None:
            self.paths.append(source)
            super().rename(source, target)

    seam = PathCalls()
    directory = deployment_directory(scope)
    with Connector(scope, ring_capacity=4096, os_facade=seam) as producer:
        receiver = Connector(scope, ring_capacity=4096, os_facade=seam)
        try:
            producer.put(EDGE, "small", b"s" * 10)
            producer.put(EDGE, "big", {"v": b"x" * 3000})
            for key in ("small", "big"):
                assert receiver.get(EDGE, key).status is GetStatus.DELIVERED
        finally:
            receiver.close()
    inside = [p for p in seam.paths if p.startswith(directory + "/")]
    assert inside == [], inside
    assert isinstance(DirectoryReplacedError("x"), ShmringError)
    assert isinstance(DeploymentDirectory, type)


def _untrusted_transfer_files(directory: str) -> list[str]:
    """An arena and a segment, each in a 0644 file (a mode we never create)."""
    from shmring.impl.names import arena_file_name, registered_segment_file_name

    names = [arena_file_name(), registered_segment_file_name()]
    for name in names:
        fd = os.open(os.path.join(directory, name), os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        os.ftruncate(fd, 1 << 16)
        os.fchmod(fd, 0o644)
        os.close(fd)
    return names


def test_registered_transfer_readers_refuse_files_that_are_not_ours_issue_12(
    scope: str,
) -> None:
    """Arena and segment readers check owner and mode before trusting the bytes."""
    from shmring.impl.directory import ensure_deployment_directory
    from shmring.impl.registered.arena import ArenaReader
    from shmring.impl.registered.views import map_segment

    directory = ensure_deployment_directory(scope)
    arena, segment = _untrusted_transfer_files(directory)
    try:
        with pytest.raises(CorruptFrameError, match="arena file not trusted: mode is not 0600"):
            ArenaReader(directory, arena)
        with pytest.raises(CorruptFrameError, match="segment not trusted: mode is not 0600"):
            map_segment(directory, segment)
        if os.geteuid() == 0:  # another uid's file, mode 0600: refused for its owner
            for name in (arena, segment):
                os.chmod(os.path.join(directory, name), 0o600)
                os.chown(os.path.join(directory, name), 65534, 65534)
            with pytest.raises(CorruptFrameError, match="not ours: uid=65534"):
                ArenaReader(directory, arena)
            with pytest.raises(CorruptFrameError, match="not ours: uid=65534"):
                map_segment(directory, segment)
        assert os.path.exists(os.path.join(directory, segment)), "a refused segment is left alone"
    finally:
        for name in (arena, segment):
            os.unlink(os.path.join(directory, name))
        os.rmdir(directory)


def test_an_empty_directory_is_removed_and_anything_else_answers_why_not(tmp_path: Path) -> None:
    """`remove_deployment_directory_if_empty`: True only when it removed the directory."""
    from shmring.impl.directory import remove_deployment_directory_if_empty

    empty = tmp_path / "empty"
    empty.mkdir()
    assert remove_deployment_directory_if_empty(str(empty)) is True
    assert not empty.exists()
    assert remove_deployment_directory_if_empty(str(empty)) is False  # gone already
    full = tmp_path / "full"
    full.mkdir()
    (full / "left").write_bytes(b"")
    assert remove_deployment_directory_if_empty(str(full)) is False  # ENOTEMPTY
    assert (full / "left").exists()
    plain = tmp_path / "plain"
    plain.write_bytes(b"")
    with pytest.raises(NotADirectoryError):  # any other refusal is the caller's to see
        remove_deployment_directory_if_empty(str(plain))
