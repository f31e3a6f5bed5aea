"""Worker processes for tests: one harness for every test that runs code in another process.

Design rationale. A test that needs a second process (a producer to kill, a
reader that competes, a place that holds views, a lock holder) must never
hang on it and must never leave it behind. Two kinds of child cover every
test:

* `WorkerProcess`: a `multiprocessing` process running a target function of
  an importable module, with a pipe to it. Targets that answer commands run
  `serve(conn, handle)`, which replies ``("ok", value)`` or ``("error", type
  name, message)`` to each command tuple; free-running targets send
  ``(what, value)`` pairs that the test `expect`s. Every wait is bounded
  (`timeout`), `kill` SIGKILLs and reaps, `stop` asks and then kills, and
  both free the process's descriptors at once (long campaigns otherwise
  climbed past descriptor 1024 waiting for garbage collection).
* `ForkedChild`: a bare `os.fork()` of this process, for crash tests that
  need the parent's state (its connectors, its mappings) in a child that
  then dies at a chosen instruction, and for `LockHolder` (a child holding
  a file's flock). It reports JSON lines over a pipe and never returns into
  the test (`os._exit`).

Workers start with "forkserver" unless SHMRING_WORKER_START says otherwise:
the fork server is a clean process started once (preloading the modules
named at its first use), so workers inherit none of the test process's
descriptors, mappings or locks, and a new worker costs a fork rather than a
fresh interpreter. Workers import the standard library, `shmring.impl` and
their own module only; none imports torch unless its module does.

`watchdog` bounds a block of the test itself; `wait_until` polls.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import multiprocessing
import os
import select
import signal
import time
import traceback
from collections.abc import Callable, Iterable, Iterator
from multiprocessing.connection import Connection
from typing import Any

START_METHOD_VARIABLE = "SHMRING_WORKER_START"
_forkserver_preloaded: set[str] = set()


def worker_context(
    method: str | None = None, preload: Iterable[str] = ()
) -> multiprocessing.context.BaseContext:
    """The context workers start in: `method`, else $SHMRING_WORKER_START, else "forkserver".

    `preload` names modules the fork server imports before its first fork
    (only the first forkserver context of a process sets them: the server
    starts once).
    """
    chosen = method or os.environ.get(START_METHOD_VARIABLE, "forkserver")
    context = multiprocessing.get_context(chosen)
    if chosen == "forkserver" and not _forkserver_preloaded:
        modules = list(preload)
        if modules:
            context.set_forkserver_preload(modules)
            _forkserver_preloaded.update(modules)
    return context


class WorkerProcess:
    """`target(*args, conn)` in its own process, and our end of its pipe `conn`."""

    exitcode: int | None = None  # once reaped
    _reaped = False

    def __init__(
        self,
        target: Callable[..., None],
        *args: Any,
        timeout: float = 30.0,
        method: str | None = None,
        preload: Iterable[str] = (),
    ) -> None:
        context = worker_context(method, preload)
        self.timeout = timeout
        self.conn, child = context.Pipe()
        self.process = context.Process(target=target, args=(*args, child), daemon=True)  # type: ignore[attr-defined]
        self.process.start()
        child.close()

    # -- talking -------------------------------------------------------------------------

    def send(self, message: Any) -> None:
        """Send one message without waiting for an answer."""
        self.conn.send(message)

    def receive(self) -> Any:
        """The next message, within `timeout` (else TimeoutError)."""
        if not self.conn.poll(self.timeout):
            raise TimeoutError(f"worker did not answer within {self.timeout}s")
        return self.conn.recv()

    def call(self, *command: Any) -> Any:
        """Send a command to a `serve` loop and answer its value (its error as RuntimeError)."""
        self.send(command)
        return self.answer()

    def answer(self) -> Any:
        """The value of the next `serve` reply (for a command `send` sent earlier)."""
        reply = self.receive()
        if reply[0] == "error":
            raise RuntimeError(f"worker {reply[1]}: {reply[2]}")
        return reply[1]

    def expect(self, what: str) -> Any:
        """The value of the next ``(what, value)`` message; any other message fails the test."""
        said, value = self.receive()
        assert said == what, f"worker said {said!r}, expected {what!r}"
        return value

    # -- ending ---------------------------------------------------------------------------

    def kill(self) -> int:
        """SIGKILL the worker, reap it, answer the monotonic ns by which it was certainly dead. Idempotent."""
        if not self._reaped:
            with contextlib.suppress(ProcessLookupError, TypeError):
                os.kill(self.process.pid, signal.SIGKILL)
            self.process.join(30)
            with contextlib.suppress(OSError):
                self.conn.close()
            self._release()
        return time.monotonic_ns()

    def stop(self, goodbye: Any = ("stop",)) -> None:
        """Send `goodbye` (a `serve` loop stops at ("stop",)), wait for the exit, kill if it overstays. Idempotent."""
        if self._reaped:
            return
        if self.process.exitcode is None:
            with contextlib.suppress(Exception):
                self.send(goodbye)
                if goodbye == ("stop",):
                    self.answer()
            self.process.join(30)
        if self.process.exitcode is None:
            self.kill()
        with contextlib.suppress(OSError):
            self.conn.close()
        self._release()

    def _release(self) -> None:
        """Keep the exit code and free the Process's descriptors (its sentinel pipe) now."""
        if self._reaped or self.process.exitcode is None:
            return  # still running after the kill's join: left to the daemon flag
        self.exitcode = self.process.exitcode
        self.process.close()
        self._reaped = True


def serve(conn: Connection, handle: Callable[[tuple[Any, ...]], Any]) -> None:
    """Worker loop: answer each command tuple with ("ok", handle(command)) or ("error", type, message).

    Ends at ("stop",) (answered) or when the test's end of the pipe closes;
    an error in one command is reported and the loop keeps serving.
    """
    while True:
        try:
            command = conn.recv()
        except EOFError:
            return
        if command == ("stop",):
            conn.send(("ok", None))
            return
        try:
            conn.send(("ok", handle(command)))
        except Exception as error:  # report, keep serving
            conn.send(("error", type(error).__name__, f"{error}\n{traceback.format_exc()}"))


# -- forked children that die --------------------------------------------------------------


Report = Callable[[dict[str, Any]], None]


class ForkedChild:
    """`work(report)` in a forked copy of this process; `report(message)` sends the parent a JSON line."""

    def __init__(self, work: Callable[[Report], None], timeout: float = 60.0) -> None:
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - runs in the child
            code = 0
            try:
                os.close(read_end)

                def report(message: dict[str, Any]) -> None:
                    os.write(write_end, (json.dumps(message) + "\n").encode())

                work(report)
            except BaseException as error:  # noqa: BLE001 - reported to the parent
                with contextlib.suppress(BaseException):
                    os.write(write_end, (json.dumps({"error": repr(error)}) + "\n").encode())
                code = 1
            finally:
                os._exit(code)  # never return into the test
        os.close(write_end)
        self.pid = pid
        self.timeout = timeout
        self.status: int | None = None  # the wait status, once reaped
        self._read_end = read_end
        self._buffer = b""

    def next_report(self) -> dict[str, Any]:
        """The child's next report, within `timeout` (AssertionError if it exits or overstays first)."""
        deadline = time.monotonic() + self.timeout
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"child {self.pid} did not report within {self.timeout} s")
            ready, _, _ = select.select([self._read_end], [], [], left)
            if ready:
                chunk = os.read(self._read_end, 65536)
                if not chunk:
                    raise AssertionError(f"child {self.pid} exited early: {self._buffer!r}")
                self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        message: dict[str, Any] = json.loads(line)
        return message

    def reap(self) -> tuple[int, list[dict[str, Any]]]:
        """Wait for the child to end (TimeoutError, after killing it, if it overstays).

        Answers (its wait status, the reports not read yet).
        """
        deadline = time.monotonic() + self.timeout
        chunks = [self._buffer]
        try:
            while self.status is None:
                ready, _, _ = select.select([self._read_end], [], [], 0.01)
                if ready:
                    chunks.append(os.read(self._read_end, 65536))
                done, raw = os.waitpid(self.pid, os.WNOHANG)
                if done:
                    self.status = raw
                elif time.monotonic() > deadline:
                    self.kill()
                    raise TimeoutError(f"child {self.pid} still running after {self.timeout} s")
            while chunk := os.read(self._read_end, 65536):
                chunks.append(chunk)
        finally:
            self._close()
        lines = b"".join(chunks).decode().splitlines()
        return self.status, [json.loads(line) for line in lines if line]

    def kill(self) -> int:
        """SIGKILL the child and reap it; answers its wait status. Idempotent."""
        if self.status is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
            _, self.status = os.waitpid(self.pid, 0)
        self._close()
        return self.status

    def _close(self) -> None:
        if self._read_end >= 0:
            os.close(self._read_end)
            self._read_end = -1


class LockHolder:
    """A forked child holding the exclusive flock of the file at `path` until `release` or `kill`."""

    def __init__(self, path: str, timeout: float = 60.0) -> None:
        self._go_read, self._go_write = os.pipe()
        go_read = self._go_read

        def hold(report: Report) -> None:  # pragma: no cover - runs in the child
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            fcntl.flock(fd, fcntl.LOCK_EX)
            report({"locked": True})
            os.read(go_read, 1)  # until the test lets go (or the pipe closes)
            fcntl.flock(fd, fcntl.LOCK_UN)

        self._child = ForkedChild(hold, timeout)
        os.close(self._go_read)
        ready = self._child.next_report()
        assert ready == {"locked": True}, f"lock holder did not start: {ready}"

    def release(self) -> None:
        """Let go of the lock; the holder must then exit cleanly. Idempotent."""
        if self._go_write >= 0:
            os.write(self._go_write, b"x")
            self._close()
            status, _ = self._child.reap()
            assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, f"status={status}"

    def kill(self) -> None:
        """SIGKILL the holder (the kernel drops its lock). Idempotent."""
        if self._go_write >= 0:
            self._close()
            self._child.kill()

    def _close(self) -> None:
        os.close(self._go_write)
        self._go_write = -1


@contextlib.contextmanager
def lock_holder(path: str, timeout: float = 60.0) -> Iterator[LockHolder]:
    """Another process holding the flock of `path` for the duration of the block."""
    holder = LockHolder(path, timeout)
    try:
        yield holder
        holder.release()
    finally:
        holder.kill()


def killed_by_sigkill(status: int) -> bool:
    """Whether a wait status is a death by SIGKILL."""
    return os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL


def die() -> None:
    """SIGKILL this process, now (a crash point)."""
    os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(60)  # pragma: no cover - the signal is synchronous for ourselves


# -- the test's own guards ------------------------------------------------------------------


@contextlib.contextmanager
def watchdog(seconds: float) -> Iterator[None]:
    """Raise TimeoutError in the main thread if the block runs longer than `seconds`.

    A guard against hangs (a receive that blocked on a lock, a worker that
    never answers), not a timing assertion.
    """

    def fire(signum: int, frame: object) -> None:
        raise TimeoutError(f"watchdog: still blocked after {seconds} s")

    previous = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def wait_until(predicate: Callable[[], object], timeout: float, interval: float = 0.005) -> bool:
    """Poll `predicate` until it holds or `timeout` passes; answer whether it held."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return bool(predicate())


__all__ = [
    "START_METHOD_VARIABLE",
    "ForkedChild",
    "LockHolder",
    "Report",
    "WorkerProcess",
    "die",
    "killed_by_sigkill",
    "lock_holder",
    "serve",
    "wait_until",
    "watchdog",
    "worker_context",
]
