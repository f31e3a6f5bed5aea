"""Issue 22, defect 6: every OS error leaving the public API is a typed shmring error.

EMFILE while joining a scope used to be a bare OSError (from the members
file, or the directory itself), a refused open inside a pre-created 0700
directory of our own uid a bare PermissionError, and `ResourceExhaustedError`
could not be imported from `shmring`. Each error now names the file and the
remedy.
"""

from __future__ import annotations

import errno
import inspect
import logging
import os

import pytest

import shmring
from shmring.fault_injection.kit.seams import FaultyOs
from shmring.impl import errors
from shmring.impl.connector import Connector
from shmring.impl.errors import FileAccessError, ResourceExhaustedError, ShmringError
from shmring.impl.names import deployment_directory

EDGE = ("a", "b")


def test_every_shmring_error_class_is_exported_from_shmring() -> None:
    """Issue 22: ResourceExhaustedError (and others) could not be imported from `shmring`."""
    classes = [
        value
        for value in vars(errors).values()
        if inspect.isclass(value) and issubclass(value, ShmringError)
    ]
    assert ResourceExhaustedError in classes
    missing = [cls.__name__ for cls in classes if getattr(shmring, cls.__name__, None) is not cls]
    assert missing == []
    assert not [cls.__name__ for cls in classes if cls.__name__ not in shmring.__all__]


def _fill_descriptors() -> list[int]:
    """Open /dev/null until the process is out of descriptors; answers what it holds."""
    held: list[int] = []
    try:
        while True:
            held.append(os.open("/dev/null", os.O_RDONLY | os.O_CLOEXEC))
    except OSError as error:
        assert error.errno == errno.EMFILE
    return held


def test_emfile_while_joining_a_scope_is_resource_exhausted_naming_the_file(scope: str) -> None:
    """Real EMFILE (every descriptor taken): a typed error naming the path and the remedy."""
    connector = Connector(scope, ring_capacity=4096)
    held = _fill_descriptors()
    try:
        with pytest.raises(ResourceExhaustedError) as raised:
            connector.join()
        assert raised.value.errno == errno.EMFILE
        message = str(raised.value)
        assert deployment_directory(scope) in message and "remedy" in message
        for fd in held[:16]:  # descriptors again: the join succeeds
            os.close(fd)
        del held[:16]
        connector.join()
    finally:
        for fd in held:
            os.close(fd)
        connector.close()


def test_emfile_at_the_members_file_is_resource_exhausted(scope: str) -> None:
    faulty = FaultyOs()
    faulty.fail_open("members", errno.EMFILE)
    with Connector(scope, ring_capacity=4096, os_facade=faulty) as connector:
        with pytest.raises(ResourceExhaustedError, match="members.*remedy"):
            connector.join()
        assert faulty.fired["open members"] == 1
        connector.put(EDGE, "k", {"v": 1})  # joins now
        assert connector.get(EDGE, "k").value == {"v": 1}


@pytest.mark.parametrize("code", [errno.EACCES, errno.EPERM, errno.EROFS])
def test_a_refused_open_in_a_pre_created_0700_directory_of_ours_is_typed(
    scope: str, code: int
) -> None:
    """A directory we made beforehand (0700, our uid) whose members file the OS refuses.

    As root the refusal is injected through the seam (root passes every mode
    check); for another uid a ``members`` file of mode 0400 does it for real.
    """
    path = deployment_directory(scope)
    os.mkdir(path, 0o700)
    faulty = FaultyOs()
    faulty.fail_open("members", code)
    try:
        with Connector(scope, ring_capacity=4096, os_facade=faulty) as connector:
            with pytest.raises(FileAccessError) as raised:
                connector.join()
            assert raised.value.errno == code
            assert isinstance(raised.value, OSError)
            message = str(raised.value)
            assert "members" in message and path in message and "remedy" in message
    finally:
        if os.path.isdir(path):
            for name in os.listdir(path):
                os.unlink(os.path.join(path, name))
            os.rmdir(path)


def test_close_out_of_descriptors_never_raises_and_says_what_it_left(
    scope: str, caplog: pytest.LogCaptureFixture
) -> None:
    """EMFILE at the teardown's directory scan (the last member out): close does not raise.

    Seen in a process that ran out of descriptors: a bare EMFILE from
    `close()`. What it could not remove (the empty directory) is logged
    with the remedy; the next member to leave, or gc, removes it.
    """
    faulty = FaultyOs()
    connector = Connector(scope, ring_capacity=4096, os_facade=faulty)
    connector.put(EDGE, "k", {"v": 1})
    faulty.fail_every("scandir", errno.EMFILE)
    with caplog.at_level(logging.WARNING, logger="shmring"):
        connector.close()
    faulty.disarm()
    assert any("remedy" in record.getMessage() for record in caplog.records), caplog.text
    assert os.path.isdir(deployment_directory(scope))  # left, and said so
    with Connector(scope, ring_capacity=4096) as other:
        other.join()  # the last one out removes what the first left
    assert not os.path.exists(deployment_directory(scope))


@pytest.mark.parametrize(
    ("site", "code", "expected"),
    [
        ("unlink", errno.EIO, FileAccessError),
        ("flock", errno.EMFILE, ResourceExhaustedError),
    ],
)
def test_an_os_error_close_reports_is_typed_and_a_second_close_finishes(
    scope: str, site: str, code: int, expected: type[ShmringError]
) -> None:
    """What close cannot do it reports typed (an OSError still), and the next close retries it."""
    faulty = FaultyOs()
    connector = Connector(scope, ring_capacity=4096, os_facade=faulty)
    connector.put(EDGE, "k", {"v": 1})
    connector.put(EDGE, "big", {"v": b"x" * 3000})
    faulty.fail_every(site, code)
    with pytest.raises(expected) as raised:
        connector.close()
    assert isinstance(raised.value, OSError) and raised.value.errno == code
    assert "remedy" in str(raised.value)
    faulty.disarm()
    assert connector.close() == 0
    assert not os.path.exists(deployment_directory(scope))
