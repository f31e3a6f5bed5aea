"""The classes of gap a fresh mutation sample found (issue 29), each pinned by exact checks.

A fresh sample of impl/'s mutants survived where the suite asserted less
than the code promises: counters only ever compared with zero (a counter
that counts down passes), error classification only fed errors already in
the class (every OSError taken as descriptor exhaustion passes), shedding
whose return value and callback nobody read. The tests here fix the class:
nonzero counts are asserted exactly, every classifier meets an error
*outside* its class, every shed's answer is checked against what it closed.
"""

from __future__ import annotations

import errno
import subprocess
import sys
from collections.abc import Iterator

import pytest

from shmring.fault_injection.kit.seams import FaultyOs
from shmring.impl import errors
from shmring.impl.connector import shortage
from shmring.impl.errors import ResourceExhaustedError
from shmring.impl.liveness import Liveness, read_process_status
from shmring.impl.names import ProducerIdentity
from shmring.impl.os_seam import SITE_PIDFD


@pytest.fixture
def sleepers() -> Iterator[list[ProducerIdentity]]:
    """Four live processes other than this one, as (pid, start time)."""
    children = [
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) for _ in range(4)
    ]
    try:
        identities = []
        for child in children:
            status = read_process_status(child.pid, FaultyOs())
            assert status is not None
            identities.append((child.pid, status[0]))
        yield identities
    finally:
        for child in children:
            child.kill()
            child.wait()


# -- error classification: errors outside the class ---------------------------------------------


def test_only_descriptor_and_mapping_shortage_is_exhaustion() -> None:
    for code in (errno.EMFILE, errno.ENFILE, errno.ENOMEM):
        assert errors.is_exhaustion(OSError(code, "short"))
    for code in (errno.EIO, errno.ENOSPC, errno.EACCES, errno.ENOENT, errno.EAGAIN, None):
        assert not errors.is_exhaustion(OSError(code, "not short")), code
    assert not errors.is_exhaustion(ValueError(errno.EMFILE))  # an errno number is not enough


def test_retry_passes_an_error_outside_the_class_through_untouched_and_sheds_nothing() -> None:
    shed_calls: list[int] = []

    def shed() -> int:
        shed_calls.append(1)
        return 1

    for code in (errno.EIO, errno.ENOSPC, errno.EACCES):
        failure = OSError(code, "not a shortage")

        def action(failure: OSError = failure) -> None:
            raise failure

        with pytest.raises(OSError) as raised:
            shortage.retry_short_of_descriptors("a test", action, shed)
        assert raised.value is failure  # not re-typed as ResourceExhaustedError
        assert not isinstance(raised.value, ResourceExhaustedError)
    assert shed_calls == []


def test_retry_sheds_once_per_shortage_and_answers_the_action_s_result() -> None:
    failures = [OSError(errno.EMFILE, "short"), OSError(errno.ENFILE, "short")]
    shed_answers = [3, 1]
    calls = {"action": 0, "shed": 0}

    def action() -> str:
        calls["action"] += 1
        if failures:
            raise failures.pop(0)
        return "done"

    def shed() -> int:
        calls["shed"] += 1
        return shed_answers.pop(0)

    assert shortage.retry_short_of_descriptors("a test", action, shed) == "done"
    assert calls == {"action": 3, "shed": 2}


def test_retry_with_nothing_left_to_shed_raises_the_typed_error_with_the_errno() -> None:
    failure = OSError(errno.ENFILE, "system table full")

    def action() -> None:
        raise failure

    calls = []
    with pytest.raises(ResourceExhaustedError) as raised:
        shortage.retry_short_of_descriptors("a map", action, lambda: calls.append(0) or 0)
    assert raised.value.errno == errno.ENFILE and raised.value.__cause__ is failure
    assert "out of descriptors for a map" in str(raised.value)
    assert calls == [0]
    # Shedding that always frees something ends after the fixed number of tries.
    tries = []
    with pytest.raises(ResourceExhaustedError, match="even after releasing"):
        shortage.retry_short_of_descriptors("a map", action, lambda: tries.append(1) or 1)
    assert len(tries) == shortage._TRIES


def test_a_pidfd_refused_for_a_reason_other_than_exhaustion_sheds_no_pidfd(
    sleepers: list[ProducerIdentity],
) -> None:
    seam = FaultyOs()
    liveness = Liveness(seam)
    try:
        assert liveness.is_alive(sleepers[0]) and liveness.is_alive(sleepers[1])
        assert liveness.pidfd_count == 2
        seam.fail_next(SITE_PIDFD, errno.EIO)  # the pidfd_open of the next new producer
        assert liveness.is_alive(sleepers[2])  # /proc answered
        assert liveness.pidfd_count == 2  # nothing shed: EIO is not a shortage
        assert liveness.is_alive(sleepers[3])
        assert liveness.pidfd_count == 3  # and no cap was set either
        assert liveness.checks == 4
    finally:
        liveness.close()
    assert seam.held_descriptors() == []


def test_a_pidfd_refused_for_want_of_descriptors_sheds_half_and_caps_the_rest(
    sleepers: list[ProducerIdentity],
) -> None:
    seam = FaultyOs()
    liveness = Liveness(seam)
    try:
        for producer in sleepers[:3]:
            assert liveness.is_alive(producer)
        assert liveness.pidfd_count == 3
        seam.fail_next(SITE_PIDFD, errno.EMFILE)
        assert liveness.is_alive(sleepers[3])
        assert liveness.pidfd_count == 1  # 3 // 2 + 1 = 2 closed, the cap is what is left
        for producer in sleepers:  # asked again: /proc or a pidfd, never more than the cap
            assert liveness.is_alive(producer)
            assert liveness.pidfd_count == 1
    finally:
        liveness.close()
    assert seam.held_descriptors() == []


# -- shedding: its answer and its callback --------------------------------------------------


def test_shed_answers_how_many_pidfds_it_closed_least_recently_opened_first(
    sleepers: list[ProducerIdentity],
) -> None:
    seam = FaultyOs()
    liveness = Liveness(seam)
    try:
        for producer in sleepers[:3]:
            assert liveness.is_alive(producer)
        held = seam.held_descriptors()
        assert len(held) == 3
        closes = seam.calls["close"]
        assert liveness.shed(2) == 2
        assert liveness.pidfd_count == 1 and seam.calls["close"] == closes + 2
        assert liveness.shed(5) == 1  # only one was left
        assert liveness.shed(1) == 0
        assert seam.held_descriptors() == []
        assert liveness.checks == 3
    finally:
        liveness.close()


def test_out_of_descriptors_for_proc_the_owner_s_callback_is_asked_and_its_answer_counts(
    sleepers: list[ProducerIdentity],
) -> None:
    asked: list[int] = []
    seam = FaultyOs()
    liveness = Liveness(seam, on_exhausted=lambda: asked.append(1) or 1)
    try:
        seam.fail_open("stat", errno.EMFILE)  # /proc/<pid>/stat, no pidfd to shed yet
        assert liveness.is_alive(sleepers[0])
        assert asked == [1]  # asked once: it released one, the read was tried again
    finally:
        liveness.close()
    assert seam.held_descriptors() == []

    seam = FaultyOs()
    refused: list[int] = []
    liveness = Liveness(seam, on_exhausted=lambda: refused.append(1) or 0)
    try:
        seam.fail_open("stat", errno.EMFILE)
        with pytest.raises(ResourceExhaustedError) as raised:
            liveness.is_alive(sleepers[1])
        assert raised.value.errno == errno.EMFILE and refused == [1]
    finally:
        liveness.close()
    assert seam.held_descriptors() == []  # the pidfd opened for the question is closed
