"""Every message impl logs, word for word: the suite's oracle for log records.

A test that reaches a log call checks the words it cares about ("refusing
the descriptor"), so a message whose text a mutant changed around them
("XXshmring: refusing ...XX") passed every test (seed 2205163994). Checking
each message exactly in each test would repeat the text in many places;
instead the suite holds it once, here, and `conftest.py` fails any test
during which impl logs a record that is not in `MESSAGES` as it stands:
logger, level and format string, exactly.

`test_log_messages.py` keeps the table and impl's source in step (every log
call in impl is here, and nothing else is), so a new message joins the table
when it is written.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from typing import Final

import pytest

# (logger name, level, format string) of every log call in impl.
MESSAGES: Final[frozenset[tuple[str, int, str]]] = frozenset(
    {
        ("shmring.compat", logging.ERROR, "shmring: get failed for key=%r: %s"),
        ("shmring.compat", logging.ERROR, "shmring: put failed for key=%r: %s"),
        (
            "shmring.compat",
            logging.WARNING,
            "shmring: SharedMemoryConnector ignores the unknown config key %r",
        ),
        ("shmring.compat", logging.WARNING, "shmring: ignoring malformed metadata for key=%r: %s"),
        ("shmring.compat", logging.WARNING, "shmring: refusing the descriptor of key=%r: %s"),
        ("shmring.connector", logging.WARNING, "shmring: cannot create %s: %s"),
        ("shmring.connector", logging.WARNING, "shmring: cannot hold our liveness file in %s: %s"),
        ("shmring.connector", logging.WARNING, "shmring: discovery stamp unavailable in %s: %s"),
        ("shmring.connector", logging.WARNING, "shmring: ring %s names producer=%s"),
        ("shmring.connector", logging.WARNING, "shmring: ignoring a corrupt ring %s: %s"),
        (
            "shmring.connector",
            logging.WARNING,
            "shmring: re-creating the ring of edge %s -> %s: %s",
        ),
        (
            "shmring.connector",
            logging.WARNING,
            "shmring: ring setup failed for edge %s -> %s; using per-key segments "
            "(retried after a back-off): %s",
        ),
        ("shmring.connector", logging.WARNING, "shmring: dropping the old ring of %s -> %s: %s"),
        (
            "shmring.discovery",
            logging.WARNING,
            "shmring: could not remove the empty deployment directory %s: %s; "
            "remedy: the next member to leave, or `shmring gc`, removes it",
        ),
        ("shmring.impl.lifecycle", logging.ERROR, "marking an inherited shmring object failed: %r"),
        ("shmring.impl.lifecycle", logging.WARNING, "closing %r at interpreter exit failed"),
        ("shmring.transfer", logging.WARNING, "shmring: cannot hold our liveness file in %s: %s"),
        (
            "shmring.transfer",
            logging.WARNING,
            "shmring: registered transfer path off for scope=%r, using the copying path: %s",
        ),
        (
            "shmring.transfer",
            logging.WARNING,
            "shmring: no device memory to make a strided source contiguous "
            "(scope=%r), this transfer takes the copying path: %s",
        ),
        (
            "shmring.ring",
            logging.WARNING,
            "shmring: ring %s: its header was overwritten (%s); could not trust it, "
            "so close retires the frames this producer recorded and removes the file",
        ),
        (
            "shmring.ring",
            logging.WARNING,
            "shmring: could not retire the frames of ring %s (its contents are corrupt: "
            "%s); the file is removed anyway",
        ),
    }
)


def impl_directory() -> str:
    """The directory impl's modules are loaded from (the mutation copy's, under mutmut)."""
    from shmring import impl

    return os.path.dirname(os.path.abspath(impl.__file__)) + os.sep


class ImplRecordCheck(logging.Handler):
    """A handler that keeps every record impl logged that `MESSAGES` does not hold.

    Only records made by impl's own code count (a test may log through a
    shmring logger itself); their text is judged before any formatting, so
    the arguments a record carries do not matter here.
    """

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.directory = impl_directory()
        self.wrong: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if not os.path.abspath(record.pathname).startswith(self.directory):
            return
        if (record.name, record.levelno, record.msg) not in MESSAGES:
            self.wrong.append(
                f"{record.name} {logging.getLevelName(record.levelno)} {record.msg!r} "
                f"({os.path.basename(record.pathname)}:{record.lineno})"
            )


@pytest.fixture(scope="session")
def impl_records() -> Iterator[ImplRecordCheck]:
    """The check, on the "shmring" logger for the whole session."""
    check = ImplRecordCheck()
    logger = logging.getLogger("shmring")
    logger.addHandler(check)
    try:
        yield check
    finally:
        logger.removeHandler(check)


@pytest.fixture(autouse=True)
def impl_logs_known_messages(impl_records: ImplRecordCheck) -> Iterator[None]:
    """Fail a test during which impl logged a message that `MESSAGES` does not hold.

    Tests check the words of a message they care about; a message changed
    around those words (or at a log call no test looks at) passed them all.
    Every record impl makes in this process is held to the one table of
    its messages: logger, level and format string, exactly.
    """
    impl_records.wrong.clear()
    yield
    wrong, impl_records.wrong = impl_records.wrong, []
    assert not wrong, f"impl logged messages model_tests/log_messages.py does not hold: {wrong}"


__all__ = [
    "MESSAGES",
    "ImplRecordCheck",
    "impl_directory",
    "impl_logs_known_messages",
    "impl_records",
]
