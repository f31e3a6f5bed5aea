"""Futex wait and wake on a 32-bit word of a shared mapping (Linux).

Design rationale. A blocking receive must not spin while idle, and must wake
as soon as something arrives, whichever process sends it. Linux futexes on a
word of a MAP_SHARED mapping do exactly that across processes: the waiter
sleeps in the kernel only while the word still holds the value it saw, and a
waker's FUTEX_WAKE ends every such sleep. Python has no futex binding, so
this module calls `syscall(SYS_futex, ...)` through ctypes; where that is not
available (another OS or architecture) `AVAILABLE` is False and callers fall
back to sleeping in short steps.

Two ways to ring a word. `bump_and_wake` increments it and wakes every
waiter in ONE system call, FUTEX_WAKE_OP with the word as both of its
words: the kernel adds one with a locked instruction (a full fence on x86:
everything the waker stored before, a ring frame say, is visible before the
new value) and then wakes, so the word counts rings exactly (mod 2**32)
even when wakers in several processes race (the stage bells count so).
Python has no atomic read-modify-write on shared memory (the `atomics`
wheel costs 6-22 us per operation here, more than the system call), which
is why the kernel does it. Where FUTEX_WAKE_OP is refused the word is
incremented with a plain load and store, then FUTEX_WAKE: two wakers
racing may then lose one increment (never the wake call), and callers
bound every wait in time.

The deployment doorbell rings without a system call when nobody sleeps on
it (issue 23, `discovery.stamp.Stamp.ring`): `store` of a `fresh_value`
(a plain store: no count to lose, and a value no ring wrote before, so a
receiver comparing with what it read sees every ring), `full_fence`, then
`wake` only when the waiter count says someone sleeps. The fence is what
makes the count safe to read: without it the store may still sit in this
CPU's store buffer when the count is loaded, a receiver registering at
that moment reads the old value and sleeps, and nobody wakes it (the
interleaving explorer's `doorbell` scenario finds exactly that schedule
when the fence is taken out). Readers load the word with plain aligned
32-bit loads.
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import platform
import random
import sys
import threading
import time
from typing import Final

_SYS_FUTEX: Final = {"x86_64": 202, "aarch64": 98}.get(platform.machine())
_FUTEX_WAIT: Final = 0
_FUTEX_WAKE: Final = 1
_FUTEX_WAKE_OP: Final = 5
_WAKE_ALL: Final = 0x7FFFFFFF
# FUTEX_WAKE_OP's operation word (linux/futex.h FUTEX_OP): op FUTEX_OP_ADD (1)
# with oparg 1 on the second word, compare FUTEX_OP_CMP_EQ (0) with 0: "add one".
# (When the old value was 0, once per 2**32 rings, the compare holds and the
# kernel wakes one waiter more, which is already being woken: harmless.)
_ADD_ONE: Final = (1 << 28) | (1 << 12)

AVAILABLE: Final = sys.platform == "linux" and _SYS_FUTEX is not None


# The full fence: a new lock's acquire and release. POSIX lists sem_wait /
# sem_post and the pthread mutex calls among the functions that "synchronize
# memory" with other threads of control (XBD 4.12), and CPython's lock is
# one of them (3.13's PyMutex: a sequentially consistent compare-and-swap);
# on x86-64 each is a locked instruction. A new lock each time (97 ns, as
# one kept lock costs) because a kept one can be left held: a signal
# handler raising between the two calls left it so, and the next ring
# waited for it forever (`fault_injection/test_interrupts.py`'s storm
# found it); a handler that rings while this thread is inside the fence
# would wait too. Where a machine orders memory more weakly than these
# calls promise in practice, a missed wake costs a receiver at most its
# bounded sleep (`connector.waiting.MAX_DOORBELL_WAIT_SECONDS`), never a
# message.
_new_lock: Final = threading.Lock


def full_fence() -> None:
    """Order every store this thread made before it against every load after it."""
    lock = _new_lock()
    lock.acquire()
    lock.release()


_values: Final = random.Random()  # reseeded in a forked child (below)
os.register_at_fork(after_in_child=_values.seed)


def fresh_value(current: int) -> int:
    """A random u32 other than `current`: what a plain-store ring writes (see above)."""
    value = _values.getrandbits(32)
    return value ^ 1 if value == current else value


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


_syscall = ctypes.CDLL(None, use_errno=True).syscall if AVAILABLE else None


class _Wake:
    atomic = True  # FUTEX_WAKE_OP works here (False once the kernel refused it)


class FutexWord:
    """A u32 at `offset` of a writable shared mapping that processes wait on and wake.

    The object holds an export of the mapping: call `close()` before the
    mapping is closed.
    """

    _word: ctypes.c_uint32 | None = None

    def __init__(self, mapping: mmap.mmap, offset: int) -> None:
        # Verify the word is aligned and inside the mapping
        assert offset % 4 == 0 and 0 <= offset <= len(mapping) - 4
        self._word = ctypes.c_uint32.from_buffer(mapping, offset)
        self._address = ctypes.addressof(self._word)
        self._pointer = ctypes.c_void_p(self._address)  # made once: every put wakes

    def load(self) -> int:
        """The word's value; no system call."""
        word = self._word
        if word is None:
            raise ValueError("futex word is closed")
        return int(word.value)

    def spin_while(self, expected: int, seconds: float) -> bool:
        """Load the word until it differs from `expected` or `seconds` pass; answer whether it moved.

        A bounded busy wait with no system call (the clock is the vDSO's):
        what a receiver does for a few hundred microseconds before it sleeps
        in `wait`, so a message arriving meanwhile is seen within a load or
        two instead of one whole poll later.
        """
        word = self._word
        if word is None:
            return True  # closed: let the caller look (and see it closed)
        expected &= 0xFFFFFFFF
        if word.value != expected:
            return True
        clock = time.monotonic
        until = clock() + seconds
        while clock() < until:
            if word.value != expected:
                return True
        return word.value != expected

    def store(self, value: int) -> None:
        """Write `value` with one plain aligned store; no system call, wakes nobody."""
        word = self._word
        if word is not None:
            word.value = value

    def wake(self) -> None:
        """Wake every process waiting on the word (one FUTEX_WAKE); the word is left as it is."""
        if self._word is not None and _syscall is not None:
            _syscall(_SYS_FUTEX, self._pointer, _FUTEX_WAKE, _WAKE_ALL, None, None, 0)

    def bump_and_wake(self) -> None:
        """Change the word, then wake every process waiting on it."""
        word = self._word
        if word is None:
            return
        if _syscall is not None and _Wake.atomic:
            pointer = self._pointer
            # futex(word, FUTEX_WAKE_OP, wake all, wake none on word 2, word 2 = word, add one)
            if _syscall(_SYS_FUTEX, pointer, _FUTEX_WAKE_OP, _WAKE_ALL, 0, pointer, _ADD_ONE) >= 0:
                return
            # Never an error here: the caller has published already. Refused
            # for good (ENOSYS, EINVAL): the plain path from now on; else this once.
            if ctypes.get_errno() in (errno.ENOSYS, errno.EINVAL):
                _Wake.atomic = False
        word.value = (word.value + 1) & 0xFFFFFFFF
        if _syscall is not None:
            _syscall(_SYS_FUTEX, self._pointer, _FUTEX_WAKE, _WAKE_ALL, None, None, 0)

    def add(self, delta: int) -> None:
        """Add `delta` (-2048..2047) to the word atomically, waking nobody (a shared counter)."""
        # Verify the delta fits FUTEX_WAKE_OP's 12-bit signed operand
        assert -2048 <= delta <= 2047
        word = self._word
        if word is None:
            return
        if _syscall is not None and _Wake.atomic:
            pointer = self._pointer
            operation = (1 << 28) | ((delta & 0xFFF) << 12)  # FUTEX_OP_ADD, oparg = delta
            # futex(word, FUTEX_WAKE_OP, wake none, wake none on word 2, word 2 = word, add delta)
            if _syscall(_SYS_FUTEX, pointer, _FUTEX_WAKE_OP, 0, 0, pointer, operation) >= 0:
                return
            if ctypes.get_errno() in (errno.ENOSYS, errno.EINVAL):
                _Wake.atomic = False
        word.value = (word.value + delta) & 0xFFFFFFFF

    def wait(self, expected: int, timeout: float) -> None:
        """Sleep while the word still holds `expected`, at most `timeout` seconds.

        Returns early when woken, when the word already differs, or on a
        signal; the caller re-checks what it waits for in every case.
        """
        word = self._word
        if word is None or timeout <= 0 or _syscall is None:
            return
        seconds = int(timeout)
        spec = _Timespec(seconds, int((timeout - seconds) * 1e9))
        result = _syscall(
            _SYS_FUTEX,
            ctypes.c_void_p(self._address),
            _FUTEX_WAIT,
            ctypes.c_uint32(expected & 0xFFFFFFFF),
            ctypes.byref(spec),
            None,
            0,
        )
        if result != 0:
            code = ctypes.get_errno()
            if code not in (errno.EAGAIN, errno.ETIMEDOUT, errno.EINTR):
                raise OSError(code, f"futex wait failed: {errno.errorcode.get(code, code)}")

    def close(self) -> None:
        """Drop the export of the mapping. Idempotent."""
        self._word = None

    _release_exports = close  # `lifecycle.release_inherited` in a forked child
