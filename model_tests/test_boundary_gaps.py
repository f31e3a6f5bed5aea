"""Tests for the survivors of the two fresh mutation samples on `0aaeb5d` (issue 29).

`docs/mutation.md` lists them. Their class is the boundary no test stood
on: the last word of a mapping, a scope of exactly the longest length, a
byte budget filled exactly, descriptor 0 as a pidfd (a daemon that closed
its stdin gets it from its first open), an error message's type name for
a builtin and for a class of ours, a descriptor of every route rebuilt from
its dict field for field, and the numpy protocol's required keys read by
consumers other than numpy.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from shmring.impl import codec
from shmring.impl.connector.descriptors import (
    FallbackDescriptor,
    PoolDescriptor,
    RingDescriptor,
    descriptor_from_dict,
)
from shmring.impl.errors import ConfigurationError, CorruptFrameError, UnsupportedPayloadError
from shmring.impl.fallback.claim import SegmentMappings
from shmring.impl.futex import FutexWord
from shmring.impl.liveness import Liveness, is_liveness_file_name, read_process_status
from shmring.impl.names import MAX_SCOPE_LENGTH, validate_scope
from shmring.impl.os_seam import SITE_PIDFD, OsFacade

# -- the last word of a mapping ---------------------------------------------------------------


def test_a_futex_word_may_be_the_last_word_of_its_mapping() -> None:
    mapping = mmap.mmap(-1, mmap.PAGESIZE)
    try:
        word = FutexWord(mapping, len(mapping) - 4)
        mapping[len(mapping) - 4 : len(mapping)] = (7).to_bytes(4, sys.byteorder)
        assert word.load() == 7
        del word
        for outside in (len(mapping) - 2, len(mapping), -4):
            with pytest.raises(AssertionError):
                FutexWord(mapping, outside)
    finally:
        mapping.close()


# -- the longest scope ---------------------------------------------------------------------------


def test_a_scope_of_exactly_the_longest_length_is_accepted_and_one_more_is_refused() -> None:
    assert validate_scope("s" * MAX_SCOPE_LENGTH) == "s" * MAX_SCOPE_LENGTH
    with pytest.raises(ConfigurationError, match=f"1..{MAX_SCOPE_LENGTH} characters"):
        validate_scope("s" * (MAX_SCOPE_LENGTH + 1))
    with pytest.raises(ConfigurationError):
        validate_scope("")


@pytest.mark.parametrize("scope", ["bad scope", "a..b", ".hidden", "-dash"])
def test_a_refused_scope_is_told_exactly_what_a_scope_may_hold(scope: str) -> None:
    """The message a user reads when a scope is refused (one text for every reason but length)."""
    with pytest.raises(ConfigurationError) as caught:
        validate_scope(scope)
    assert str(caught.value) == (
        "scope may hold only ASCII letters, digits, '_', '-' and single '.', "
        f"and may not start with '.' or '-': scope={scope!r}"
    )


# -- a byte budget filled exactly ----------------------------------------------------------------


def test_segment_mappings_hold_exactly_their_byte_budget() -> None:
    """Two 4 KiB files in an 8 KiB budget are both kept; a third evicts the oldest."""
    size = mmap.PAGESIZE
    cache = SegmentMappings(limit=16, limit_bytes=2 * size)
    maps = [mmap.mmap(-1, size) for _ in range(3)]
    try:
        cache.keep((0, 1, size), maps[0])
        cache.keep((0, 2, size), maps[1])
        assert len(cache) == 2 and not maps[0].closed
        cache.keep((0, 3, size), maps[2])
        assert len(cache) == 2 and maps[0].closed and not maps[1].closed
        assert cache.take((0, 2, size)) is maps[1] and cache.hits == 1
        # Taking one gives its bytes back: the next keep evicts nothing.
        cache.keep((0, 2, size), maps[1])
        assert len(cache) == 2 and not maps[2].closed
    finally:
        cache.close()
        for mapping in maps:
            mapping.close()
    assert len(cache) == 0


# -- descriptor 0 as a pidfd -------------------------------------------------------------------


class _KillsAtThePidfdPoll(OsFacade):
    """Kills the producer when its pidfd is polled: it died right after /proc said it runs.

    The kill is real (SIGKILL); the child is waited for without being reaped
    (WNOWAIT), so /proc would still show it, as a zombie.
    """

    def __init__(self, child: subprocess.Popen[bytes]) -> None:
        self.child = child
        self.pidfd_sites = 0

    def _enter(self, site: str) -> None:
        if site == SITE_PIDFD:
            self.pidfd_sites += 1
            if self.pidfd_sites == 2:  # the first is pidfd_open, the second the poll
                self.child.kill()
                os.waitid(os.P_PID, self.child.pid, os.WEXITED | os.WNOWAIT)


@pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="no pidfd_open on this platform")
def test_descriptor_0_is_a_pidfd_like_any_other() -> None:
    """A process that closed its stdin gets descriptor 0 from its next open, a pidfd too."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        saved = os.dup(0)
    except OSError:  # no stdin at all (a test runner's worker): descriptor 0 is free already
        saved = -1
    try:
        status = None
        for _ in range(100):
            status = read_process_status(child.pid, OsFacade())
            if status is not None:
                break
            time.sleep(0.01)
        assert status is not None
        producer = (child.pid, status[0])
        facade = _KillsAtThePidfdPoll(child)
        liveness = Liveness(facade)
        if saved >= 0:
            os.close(0)
        try:
            answer = liveness.is_alive(producer)
        finally:
            if saved >= 0:
                os.dup2(saved, 0)
            else:
                with contextlib.suppress(OSError):
                    os.close(0)  # the pidfd, if the liveness kept it
        assert facade.pidfd_sites == 2  # the pidfd (descriptor 0) was polled
        assert answer is False  # it died after /proc's answer: the pidfd says so
        assert liveness.pidfd_count == 0
        liveness.close()
    finally:
        if saved >= 0:
            os.close(saved)
        child.kill()
        child.wait()


# -- an error message's type name ------------------------------------------------------------


class _Unregistered:
    pass


def test_an_unsupported_payload_names_its_type_plainly_for_builtins_and_fully_otherwise() -> None:
    with pytest.raises(UnsupportedPayloadError) as caught:
        codec.encode(1j)
    assert "cannot encode an object of type complex " in str(caught.value)
    with pytest.raises(UnsupportedPayloadError) as caught:
        codec.encode({"a": [range(3)]})
    assert "of type range " in str(caught.value)
    with pytest.raises(UnsupportedPayloadError) as caught:
        codec.encode(_Unregistered())
    assert f"of type {__name__}._Unregistered " in str(caught.value)


# -- every descriptor rebuilt from its dict ----------------------------------------------------


@pytest.mark.parametrize("kind", [RingDescriptor, PoolDescriptor, FallbackDescriptor])
def test_every_descriptor_is_rebuilt_from_its_dict_field_for_field(kind: type) -> None:
    producer = (4242, 987654321, 3)
    descriptor = kind(producer, ("stage-a", "stage-b"), "req-1", 8192, 77)
    data = codec.decode(codec.encode(descriptor.to_dict()))
    again = descriptor_from_dict(kind.route, data)
    assert type(again) is kind
    assert again == descriptor
    assert again.producer == producer and again.edge == ("stage-a", "stage-b")


# -- the numpy protocol's required keys --------------------------------------------------------


def test_a_borrowed_array_s_owner_speaks_array_interface_version_3() -> None:
    """numpy reads a missing "version" as 3; other consumers of the protocol require it."""
    import numpy as np

    from shmring.impl.registered.views import borrow

    keep = np.zeros(64, dtype=np.uint8)
    dtype = np.dtype(np.float32)
    view = borrow(keep, 16, dtype, (2, 3))
    interface = view.base.__array_interface__
    assert interface["version"] == 3
    assert interface["shape"] == (2, 3) and interface["typestr"] == dtype.str
    assert interface["data"] == (int(keep.ctypes.data) + 16, False)
    assert interface["strides"] is None and interface["descr"] == dtype.descr


# -- a tensor over a mapping outlives its owner's close ----------------------------------------


def _maps_naming(path: str) -> int:
    with open("/proc/self/maps") as maps:
        return sum(path in line for line in maps)


def test_a_shm_file_is_never_unmapped_under_a_live_tensor(tmp_path: Path) -> None:
    """torch.frombuffer holds no export of what it is given: over the mmap itself, `unmap`
    unmapped under a caller's tensor and the next read of it crashed the process."""
    pytest.importorskip("torch")
    from shmring.impl.registered.shm_file import ShmFile

    shm = ShmFile(str(tmp_path), "f", 4096)
    path = str(tmp_path / "f")
    try:
        shm.tensor[:4] = 7
        kept = shm.tensor[:4]
    finally:
        shm.unmap()
        shm.unlink()
    assert not shm.mapped
    assert kept.tolist() == [7, 7, 7, 7]  # still mapped: the tensor holds it
    assert _maps_naming(path) == 1
    del kept
    assert _maps_naming(path) == 0  # the last view gone, the mapping with it


# -- the names a directory walk tells apart ---------------------------------------------------


@pytest.mark.parametrize(
    ("name", "is_live"),
    [
        ("live.123.456", True),
        ("live.123", False),  # two parts
        ("live.1.2.3", False),  # four parts, every one of them in the right shape
        ("ring.123.456", False),  # three parts, not "live"
        ("live.x.456", False),
        ("live.123.x", False),
    ],
)
def test_a_liveness_file_name_is_exactly_live_pid_start_time(name: str, is_live: bool) -> None:
    """Each condition of the name on its own: three parts, "live", then two numbers."""
    assert is_liveness_file_name(name) is is_live


# -- a decode's error says what was wrong ------------------------------------------------------


def test_an_empty_payload_is_refused_as_one_owned_or_borrowed() -> None:
    import numpy

    from shmring.impl.ring.borrow import BorrowedPayload

    with pytest.raises(CorruptFrameError, match="empty payload"):
        codec.decode(memoryview(b""))
    keep = numpy.zeros(0, numpy.uint8)
    with pytest.raises(CorruptFrameError, match="empty payload"):
        codec.decode_borrowed(BorrowedPayload(keep, int(keep.ctypes.data), 0, label="test"))
