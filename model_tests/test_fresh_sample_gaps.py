"""Tests for the classes of gap two fresh mutation samples found on `8db5655` (issue 29).

`docs/mutation.md` lists the 13 survivors of seeds 1404266398 and
4174988594. Each test here names the promise such a mutant broke unnoticed,
for the whole class rather than the one line: text a user reads (`shmring
stat`), an OS error's file name in either of its types, an extra's
submodule, the error a put re-raises for a failed cleanup, a reader's own
release, an image state bad in one field only, the doorbell when the kernel
refuses its one-call wake, the forked child's release of what it inherited,
the pool reader's bound on mapped slots, and a file name unlinked once.
"""

from __future__ import annotations

import ctypes
import errno
import json
import mmap
import os
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from shmring.impl import admin, futex, lifecycle
from shmring.impl.connector import Connector
from shmring.impl.errors import (
    BackPressureError,
    BrokenError,
    CorruptFrameError,
    FileAccessError,
    MissingExtraError,
    NoSpaceError,
    ResourceExhaustedError,
    typed_os_error,
)
from shmring.impl.names import deployment_directory
from shmring.impl.os_seam import DEFAULT_OS, SITE_UNLINK, OsFacade
from shmring.impl.ring.producer import RingChannel
from shmring.impl.ring.reader import RingReader
from shmring.impl.ring.results import ReceiveStatus
from shmring.spec.ring import ConsumeMode

EDGE = ("a", "b")

# -- `shmring stat`: the text of a ring, closed or not -------------------------------------


def _ring(closed: bool, error: str | None = None) -> admin.RingStatus:
    return admin.RingStatus(
        name="ring.a.b.1.2",
        edge=EDGE,
        producer=(1, 2),
        alive=not closed,
        capacity=4096,
        used_bytes=1024,
        published_frames=3,
        claimed_frames=1,
        closed=closed,
        error=error,
    )


def _status(*rings: admin.RingStatus) -> admin.DeploymentStatus:
    return admin.DeploymentStatus(
        directory="/dev/shm/shmring-x",
        exists=True,
        stamp=7,
        producers=((1, 2),),
        live_producers=(),
        rings=rings,
        segments=0,
        segment_bytes=0,
        orphans=(),
    )


def test_stat_text_of_an_open_a_closed_and_an_unreadable_ring() -> None:
    """The whole text, word for word; a ring after an unreadable one is listed too."""
    text = admin.format_status(
        _status(_ring(False), _ring(True), _ring(False, error="bad header"), _ring(False))
    )
    assert text.splitlines() == [
        "/dev/shm/shmring-x: stamp=7 producers=1 live=0 fallback segments=0 (0 bytes) "
        "spare files=0 (0 bytes) pool slots=0 (0 bytes) orphans=0",
        "  ring a -> b producer 1.2 (alive): 1,024/4,096 bytes (25%), 3 published, 1 leased",
        "  ring a -> b producer 1.2 (dead, closed): 1,024/4,096 bytes (25%), 3 published, 1 leased",
        "  ring a -> b producer 1.2 (alive): unreadable: bad header",
        "  ring a -> b producer 1.2 (alive): 1,024/4,096 bytes (25%), 3 published, 1 leased",
    ]


def test_stat_of_a_ring_its_producer_closed_says_so(scope: str) -> None:
    """A closed ring file still at its name (a neighbour put it back): stat names why it is unreadable."""
    with Connector(scope) as keeper:  # keeps the deployment directory after the producer leaves
        keeper.put(("x", "y"), "k", b"keeps the directory")
        with Connector(scope, ring_capacity=64 * 1024) as producer:
            producer.put(EDGE, "k", b"v")
            ring = producer.ring(EDGE)
            assert ring is not None
            name = os.path.basename(ring.path)
            kept = os.path.join(deployment_directory(scope), "kept-ring")
            os.link(ring.path, kept)
        os.rename(kept, os.path.join(deployment_directory(scope), name))
        try:
            status = admin.deployment_status(scope)
            (closed,) = (ring for ring in status.rings if ring.name == name)
            assert closed.edge == EDGE and closed.error is not None
            assert "closed by its producer" in closed.error
            assert f"unreadable: {closed.error}" in admin.format_status(status)
        finally:
            os.unlink(os.path.join(deployment_directory(scope), name))


# -- an OS error's file name, str or bytes ---------------------------------------------------


@pytest.mark.parametrize(
    ("filename", "expected"),
    [
        ("seg.1", "/dev/shm/d/seg.1"),
        (b"seg.1", "/dev/shm/d/seg.1"),
        ("/elsewhere/f", "/elsewhere/f"),
        (b"/elsewhere/f", "/elsewhere/f"),
        (None, "/dev/shm/d"),
        ("", "/dev/shm/d"),
        (b"", "/dev/shm/d"),
    ],
    ids=["str", "bytes", "absolute-str", "absolute-bytes", "none", "empty-str", "empty-bytes"],
)
def test_a_refused_file_is_named_whatever_type_its_name_has(
    filename: str | bytes | None, expected: str
) -> None:
    typed = typed_os_error(
        OSError(errno.EACCES, "Permission denied", filename), "opening", "/dev/shm/d"
    )
    assert type(typed) is FileAccessError
    assert typed.errno == errno.EACCES
    assert typed.filename == expected
    assert f"path={expected!r}" in str(typed) and "while opening" in str(typed)


@pytest.mark.parametrize(
    ("code", "kind"),
    [
        (errno.EMFILE, ResourceExhaustedError),
        (errno.ENFILE, ResourceExhaustedError),
        (errno.ENOMEM, ResourceExhaustedError),
        (errno.ENOSPC, NoSpaceError),
        (errno.EDQUOT, NoSpaceError),
        (errno.EROFS, FileAccessError),
        (errno.EIO, FileAccessError),
    ],
)
def test_each_os_error_becomes_its_one_typed_error_with_its_errno(
    code: int, kind: type[OSError]
) -> None:
    typed = typed_os_error(OSError(code, os.strerror(code), b"f"), "mapping", "/d")
    assert type(typed) is kind
    assert typed.errno == code
    assert "path='/d/f'" in str(typed)


def test_an_os_error_without_errno_is_an_access_error_naming_errno_zero() -> None:
    typed = typed_os_error(OSError("no errno"), "reading", "/d")
    assert type(typed) is FileAccessError and typed.errno == 0


def test_a_shmring_error_is_answered_as_it_is() -> None:
    error = NoSpaceError("full")
    assert typed_os_error(error, "writing", "/d") is error


# -- an extra's submodule -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("module", "top", "extra"),
    [
        ("torch._shmring_absent", "torch", "torch"),
        ("torch._shmring_absent.deeper", "torch", "torch"),
        ("av._shmring_absent.codec", "av", "video"),
    ],
)
def test_a_missing_submodule_of_an_extra_names_the_extra(module: str, top: str, extra: str) -> None:
    from shmring.impl.extras import import_extra

    with pytest.raises(MissingExtraError) as caught:
        import_extra(module, "a feature")
    assert (caught.value.module, caught.value.extra) == (top, extra)
    assert f"pip install 'shmring[{extra}]'" in str(caught.value)
    assert isinstance(caught.value.__cause__, ImportError)
    # The message keeps what the import said, so a broken install is told from a missing one.
    cause = caught.value.__cause__
    assert f"({type(cause).__name__}: {cause})" in str(caught.value), str(caught.value)


def test_an_installed_submodule_of_an_extra_is_imported() -> None:
    from shmring.impl.extras import import_extra

    assert import_extra("torch.nn", "a feature").__name__ == "torch.nn"


# -- a BufferError at a put's or get's boundary -------------------------------------------


def _raised_while(first: BaseException, *then: BufferError) -> BufferError:
    """The last of `then`, raised while handling the one before it (first: `first`)."""
    caught: BaseException = first
    for error in then:
        try:
            try:
                raise caught
            except BaseException:
                raise error  # noqa: B904 - the implicit context is the point
        except BufferError as raised:
            caught = raised
    assert isinstance(caught, BufferError)
    return caught


def test_a_failed_cleanup_gives_way_to_the_error_it_replaced() -> None:
    interrupt = KeyboardInterrupt()
    error = _raised_while(interrupt, BufferError("cannot close exported pointers exist"))
    assert error.__context__ is interrupt
    assert lifecycle.unmasked(error) is interrupt


def test_a_chain_of_failed_cleanups_gives_way_to_the_first_real_error() -> None:
    real = ValueError("the handler's own error")
    error = _raised_while(real, BufferError("first cleanup"), BufferError("second cleanup"))
    assert lifecycle.unmasked(error) is real


def test_a_failed_cleanup_over_our_own_buffer_error_answers_ours() -> None:
    ours = BackPressureError("budget spent")
    error = _raised_while(ours, BufferError("cleanup"))
    assert lifecycle.unmasked(error) is ours


def test_a_bare_buffer_error_with_nothing_under_it_is_broken_with_it_as_cause() -> None:
    bare = BufferError("ours, alone")
    answer = lifecycle.unmasked(bare)
    assert type(answer) is BrokenError
    assert answer.__cause__ is bare and "ours, alone" in str(answer)


def test_our_own_buffer_error_goes_as_it_is() -> None:
    ours = BackPressureError("budget spent")
    assert lifecycle.unmasked(ours) is ours


# -- a ring reader's own release ----------------------------------------------------------


def test_a_reader_releases_a_claimed_frame_by_position_once(tmp_path: Path) -> None:
    path = str(tmp_path / "ring")
    with RingChannel.create(path, 4096) as ring:
        ring.put("k", b"payload")
        other = ring.put("other", b"o").position
        assert other is not None
        reader = RingReader.attach(path, os_facade=DEFAULT_OS)
        try:
            got = reader.get("k", mode=ConsumeMode.LEASE)
            assert got.status is ReceiveStatus.DELIVERED
            lease = got.payload
            position = lease.position
            assert reader.statistics().claimed_frames == 1
            reader.release(position)
            after = reader.statistics()
            assert (after.claimed_frames, after.published_frames) == (0, 1)
            with pytest.raises(CorruptFrameError, match="no claimed frame"):
                reader.release(position)  # DONE now: not claimed
            with pytest.raises(CorruptFrameError, match="no claimed frame"):
                reader.release(other)  # published, never claimed
            assert reader.statistics().published_frames == 1
            with pytest.raises(CorruptFrameError, match="no claimed frame"):
                reader.release(1 << 20)  # past the head
            lease.release()
        finally:
            reader.close()


# -- an image state bad in one field only ------------------------------------------------


_GOOD_IMAGE: dict[str, Any] = {"mode": "L", "size": [2, 3], "data": b"\x01" * 6}


@pytest.mark.parametrize(
    "bad",
    [
        {"mode": "no such mode"},
        {"size": ["2", 3]},
        {"size": [2, "3"]},
        {"size": [-1, 0], "data": b""},
        {"size": [0, -1], "data": b""},
        {"data": bytearray(6)},
        {"data": b"\x01" * 5},
    ],
    ids=[
        "mode",
        "width-type",
        "height-type",
        "width-negative",
        "height-negative",
        "data-type",
        "data-length",
    ],
)
def test_an_image_state_bad_in_one_field_is_refused(bad: dict[str, Any]) -> None:
    pytest.importorskip("PIL")
    from shmring.impl import extensions

    image = extensions._decode_image(dict(_GOOD_IMAGE))
    assert (image.mode, image.size, image.tobytes()) == ("L", (2, 3), b"\x01" * 6)
    with pytest.raises(ValueError, match="bad image"):
        extensions._decode_image({**_GOOD_IMAGE, **bad})


# -- the doorbell when the kernel refuses FUTEX_WAKE_OP ----------------------------------


def _refusing_wake_op(code: int) -> Callable[..., int]:
    """The futex syscall, refusing FUTEX_WAKE_OP with `code` (the seam: `futex._syscall`)."""
    real = futex._syscall
    assert real is not None

    def syscall(number: int, pointer: Any, operation: int, *rest: Any) -> int:
        if operation == futex._FUTEX_WAKE_OP:
            ctypes.set_errno(code)
            return -1
        return int(real(number, pointer, operation, *rest))

    return syscall


@pytest.mark.skipif(not futex.AVAILABLE, reason="no futex syscall on this platform")
@pytest.mark.parametrize(
    ("code", "atomic_after"),
    [(errno.ENOSYS, False), (errno.EINVAL, False), (errno.EFAULT, True), (errno.EAGAIN, True)],
    ids=["ENOSYS", "EINVAL", "EFAULT", "EAGAIN"],
)
def test_a_refused_wake_op_still_rings_once_and_wakes_and_only_for_good_reasons_stops_trying(
    code: int, atomic_after: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(futex._Wake, "atomic", True)
    monkeypatch.setattr(futex, "_syscall", _refusing_wake_op(code))
    mapping = mmap.mmap(-1, 64)
    word = futex.FutexWord(mapping, 8)
    try:
        word.bump_and_wake()
        seen = word.load()
        assert seen == 1  # one ring, one increment: the plain path after the refusal
        assert futex._Wake.atomic is atomic_after
        monkeypatch.setattr(futex._Wake, "atomic", True)  # refused again on the next ring
        waiter = threading.Thread(target=word.wait, args=(seen, 30.0))
        waiter.start()
        waiter.join(0.2)  # asleep by now (were it not, the changed word ends its wait at once)
        word.bump_and_wake()
        waiter.join(20.0)
        assert not waiter.is_alive()  # the plain FUTEX_WAKE woke it
        assert word.load() == 2
        word.add(5)  # a counter's add takes the same way round
        assert word.load() == 7
        assert futex._Wake.atomic is atomic_after
    finally:
        word.close()
        mapping.close()


# -- a forked child releases what it inherited -------------------------------------------

_FORKED_RELEASE = textwrap.dedent(
    """
    import json, os, sys
    from shmring.impl import lifecycle
    from shmring.impl.connector import Connector

    scope = sys.argv[1]
    directory = os.path.realpath(sys.argv[2])

    def mapped():
        with open("/proc/self/maps") as maps:
            return sum(directory in line for line in maps)

    def held():
        names = (os.path.realpath(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd"))
        return sum(name.startswith(directory) for name in names)

    with Connector(scope, ring_capacity=64 * 1024) as parent, Connector(scope) as receiver:
        parent.put(("a", "b"), "small", {"v": 1})
        parent.put(("a", "b"), "large", {"v": b"x" * 300_000})  # a pool slot
        assert receiver.get(("a", "b"), "large").value == {"v": b"x" * 300_000}
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(read)
            before = (mapped(), held())
            closed = lifecycle.release_inherited(parent)
            closed_receiver = lifecycle.release_inherited(receiver)
            again = lifecycle.release_inherited(parent)
            after = (mapped(), held())
            os.write(write, json.dumps([before, closed, closed_receiver, again, after]).encode())
            os._exit(0)
        os.close(write)
        with os.fdopen(read) as answer:
            answered = answer.read()
        os.waitpid(pid, 0)
        assert receiver.get(("a", "b"), "small").value == {"v": 1}  # the parent's files intact
    print(answered)
    """
)


def test_a_forked_child_releases_every_mapping_and_descriptor_it_inherited(scope: str) -> None:
    result = subprocess.run(
        [sys.executable, "-c", _FORKED_RELEASE, scope, deployment_directory(scope)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    before, closed, closed_receiver, again, after = json.loads(result.stdout)
    assert before[0] > 0 and before[1] > 0  # the child began with the parent's mappings and fds
    assert closed[0] > 0 and closed[1] > 0
    assert closed_receiver[0] > 0
    assert again == [0, 0]  # nothing twice
    assert after == [0, 0]  # nothing of the deployment stays mapped or open in the child


# -- the pool reader's bound on mapped slots ----------------------------------------------


def test_a_pool_reader_keeps_at_most_its_bound_of_slots_least_recently_used_out(
    scope: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from shmring.impl.pool import consumer

    monkeypatch.setattr(consumer, "MAX_MAPPED_SLOTS", 2)
    payload = b"p" * 300_000
    with Connector(scope, ring_capacity=1 << 16) as producer, Connector(scope) as reader:
        for index in range(4):
            producer.put(EDGE, f"k{index}", payload)  # all outstanding: four slots
        pool = None
        newest = []
        mapped = []
        for index in range(4):
            assert reader.get(EDGE, f"k{index}").value == payload
            pool = reader._ring_route.pool
            assert pool is not None
            newest.append(list(pool._slots)[-1])
            mapped.append(pool._slots[newest[-1]].mapping)
        assert pool is not None
        assert len(set(newest)) == 4  # four distinct slots were read
        assert list(pool._slots) == newest[-2:]  # the two most recent, the bound exactly
        closed = [slot._buf is None for slot in mapped]
        assert closed == [True, True, False, False]  # the evicted two are closed


# -- a name unlinked once -----------------------------------------------------------------


class _RefusingUnlink(OsFacade):
    """Refuses the first `refusals` unlinks with EBUSY (a fault through the OS seam)."""

    def __init__(self, refusals: int) -> None:
        self.refusals = refusals

    def _enter(self, site: str) -> None:
        if site == SITE_UNLINK and self.refusals > 0:
            self.refusals -= 1
            raise OSError(errno.EBUSY, "refused by the plan")


def test_a_shm_file_unlinks_its_name_once_and_never_a_neighbours_file_put_there(
    tmp_path: Path,
) -> None:
    pytest.importorskip("torch")
    from shmring.impl.registered.shm_file import ShmFile

    shm = ShmFile(str(tmp_path), "f", 4096)
    try:
        assert shm.linked
        shm.unlink()
        assert not shm.linked and not (tmp_path / "f").exists()
        (tmp_path / "f").write_bytes(b"a neighbour's file at the same name")
        shm.unlink()  # ours is gone already: the neighbour's stays
        assert (tmp_path / "f").read_bytes() == b"a neighbour's file at the same name"
    finally:
        shm.unmap()


def test_a_shm_file_whose_unlink_failed_keeps_its_name_and_retries(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from shmring.impl.registered.shm_file import ShmFile

    shm = ShmFile(str(tmp_path), "f", 4096, os_facade=_RefusingUnlink(1))
    try:
        with pytest.raises(OSError) as caught:
            shm.unlink()
        assert caught.value.errno == errno.EBUSY
        assert shm.linked and (tmp_path / "f").exists()
        shm.unlink()
        assert not shm.linked and not (tmp_path / "f").exists()
    finally:
        shm.unmap()
