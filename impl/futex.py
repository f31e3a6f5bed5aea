"""Futex wait and wake on a 32-bit word of a shared mapping (Linux).

Design rationale. A blocking receive must not spin while idle, and must wake
as soon as something arrives, whichever process sends it. Linux futexes on a
word of a MAP_SHARED mapping do exactly that across processes: the waiter
sleeps in the kernel only while the word still holds the value it saw, and a
waker's FUTEX_WAKE ends every such sleep. Python has no futex binding, so
this module calls `syscall(SYS_futex, ...)` through ctypes; where that is not
available (another OS or architecture) `AVAILABLE` is False and callers fall
back to sleeping in short steps.

The word is read and written with plain aligned 32-bit loads and stores. A
waker always increments the word *and then* calls FUTEX_WAKE; two wakers
racing may lose one increment, but not the wake call, so a waiter already
asleep is always woken. The one window left (a waiter that read the word
after the first increment and goes to sleep after the second waker's wake)
is closed by callers waiting with a bounded timeout.
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import platform
import sys
from typing import Final

_SYS_FUTEX: Final = {"x86_64": 202, "aarch64": 98}.get(platform.machine())
_FUTEX_WAIT: Final = 0
_FUTEX_WAKE: Final = 1
_WAKE_ALL: Final = 0x7FFFFFFF

AVAILABLE: Final = sys.platform == "linux" and _SYS_FUTEX is not None


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


_syscall = ctypes.CDLL(None, use_errno=True).syscall if AVAILABLE else None


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

    def bump_and_wake(self) -> None:
        """Change the word, then wake every process waiting on it."""
        word = self._word
        if word is None:
            return
        word.value = (word.value + 1) & 0xFFFFFFFF
        if _syscall is not None:
            _syscall(_SYS_FUTEX, self._pointer, _FUTEX_WAKE, _WAKE_ALL, None, None, 0)

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
