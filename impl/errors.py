"""One error tree for shmring.

`ShmringError` is the root. As in trio, `ClosedError` means *you* closed the
object, while `BrokenError` / `ProducerGoneError` mean the other side changed
(the cause, when there is one, is in `__cause__`). Each error also inherits
the builtin a caller would catch without knowing shmring (PyAV's
`InvalidDataError(FFmpegError, ValueError)` is the pattern), and messages
carry the offending value: ``"ring capacity out of range: capacity=1000"``.
"""

from __future__ import annotations

import errno as _errno
import os
from typing import Any


def _require_message(error: BaseException, message: object) -> None:
    """TypeError unless `message` is text that says something: every error names what went wrong."""
    if not isinstance(message, str) or not message:
        raise TypeError(f"{type(error).__name__} needs a message (a non-empty str): {message!r}")


def _rebuild(cls: type[ShmringError], args: tuple[object, ...], state: dict[str, object]) -> Any:
    """An error `ShmringError.__reduce__` sent, made again without its class's own __init__."""
    base = OSError if issubclass(cls, OSError) else Exception  # the one whose layout it has
    error = base.__new__(cls, *args)
    base.__init__(error, *args)
    error.__dict__.update(state)
    return error


class ShmringError(Exception):
    """Root of every error shmring raises on purpose.

    Its message is a non-empty str (TypeError otherwise). Every error
    survives pickling as it is, with its extra attributes (`errno`,
    `cuda_error`, `feature`): an error that crossed to another process
    (multiprocessing, a process pool) is the error that was raised.
    """

    def __init__(self, message: str, *args: object) -> None:
        _require_message(self, message)
        super().__init__(message, *args)

    def __reduce__(self) -> tuple[Any, ...]:
        args = self.args
        if isinstance(self, OSError) and self.filename is not None:
            args = (*args, self.filename)
        return (_rebuild, (type(self), args, dict(self.__dict__)))


class ConfigurationError(ShmringError, ValueError):
    """A configuration value is invalid (ring size, budget, scope, option type)."""


class MissingExtraError(ConfigurationError, ImportError):
    """A feature was used whose optional dependency (a `shmring[...]` extra) is not installed.

    The message names the feature, the missing module and the command that
    installs it: ``pip install 'shmring[video]'``. It is an ImportError too,
    so code that probes an optional import with ``except ImportError`` keeps working.
    """

    def __init__(self, feature: str, module: str, extra: str, detail: str = "") -> None:
        self.feature = feature
        self.module = module
        self.extra = extra
        suffix = f" ({detail})" if detail else ""
        super().__init__(
            f"{feature} needs {module}, which is not installed{suffix}: "
            f"pip install 'shmring[{extra}]'"
        )


class ClosedError(ShmringError, RuntimeError):
    """The object was closed by its owner and cannot be used any more."""


class ForkedError(ClosedError):
    """The object was inherited through fork: it belongs to the parent (issue 24).

    In the child it never writes into nor removes the parent's files; make
    a connector (sender, receiver) after the fork. `close()` releases the
    child's copies of its mappings only.
    """


class BrokenError(ShmringError, RuntimeError):
    """The other side changed under us (corruption, unexpected state)."""


class ProducerGoneError(BrokenError):
    """The producer of a channel exited or closed it."""


class CorruptFrameError(BrokenError, ValueError):
    """A header, frame, descriptor or segment failed validation."""


class StaleDescriptorError(ShmringError, LookupError):
    """The descriptor's frame is no longer deliverable (received already, reclaimed, reused).

    The ring's STALE (`spec.ring.GetStatus.STALE`) where the API answers
    values, not statuses (the arena reader, the transfer receiver). Nothing
    was taken; nothing is corrupt.
    """


class FrameTooLargeError(ShmringError, ValueError):
    """A frame is larger than anything that can carry it."""


class UnsupportedPayloadError(ShmringError, TypeError):
    """The payload holds an object the codec does not carry (never pickled)."""


class InvalidKeyError(ShmringError, ValueError):
    """A key or name is malformed (separators, `..`, too long, wrong type)."""


class BackPressureError(ShmringError, BufferError):
    """The fallback byte budget is spent; retry after readers drain it."""


class NoSpaceError(ShmringError, OSError):
    """The OS has no space for a segment (ENOSPC and friends)."""

    def __init__(self, message: str, errno: int = _errno.ENOSPC) -> None:
        _require_message(self, message)
        OSError.__init__(self, errno, message)


class DirectoryReplacedError(BrokenError, OSError):
    """The deployment directory was removed or replaced under us (another uid, a teardown).

    Nothing was created in the directory now at the path; a connector joins
    again (and then refuses a directory that is not ours with ConfigurationError).
    """

    def __init__(self, message: str) -> None:
        _require_message(self, message)
        OSError.__init__(self, _errno.ESTALE, message)


class ResourceExhaustedError(ShmringError, OSError):
    """The process or system is out of descriptors or mappings (EMFILE, ENFILE, ENOMEM).

    Raised only when nothing at all could be served: what could still be
    mapped was delivered first, and cached mappings were released (least
    recently used first) before giving up. Nothing was lost; retry later.
    """

    def __init__(self, message: str, errno: int = _errno.EMFILE) -> None:
        _require_message(self, message)
        OSError.__init__(self, errno, message)


class FileAccessError(ShmringError, OSError):
    """The OS refused an operation on a file of ours (EACCES, EPERM, EROFS, EIO, ...).

    Not a shortage (ResourceExhaustedError) nor a full filesystem
    (NoSpaceError). The message names the file, the errno and the remedy;
    `errno` and `filename` are the OS error's.
    """

    def __init__(self, message: str, errno: int, filename: str | None = None) -> None:
        _require_message(self, message)
        OSError.__init__(self, errno, message)
        self.filename = filename


#: errno values that mean "out of descriptors or mappings", not "this file is bad".
EXHAUSTION_ERRNOS = frozenset((_errno.EMFILE, _errno.ENFILE, _errno.ENOMEM))


def is_exhaustion(error: BaseException) -> bool:
    """Whether `error` is an OSError for a lack of descriptors or mappings."""
    return isinstance(error, OSError) and error.errno in EXHAUSTION_ERRNOS


class RegistrationError(ShmringError, RuntimeError):
    """A CUDA host registration step failed; carries the CUDA error name."""

    def __init__(self, message: str, cuda_error: str | None = None) -> None:
        super().__init__(message)
        self.cuda_error = cuda_error


class RegistryPoisonedError(RegistrationError):
    """An unregister failed for good: no new registration until the process restarts."""


_NO_SPACE_ERRNOS = frozenset((_errno.ENOSPC, _errno.EDQUOT))


def typed_os_error(error: OSError, what: str, directory: str) -> OSError:
    """`error` (a bare OSError met while `what`) as the shmring error a caller sees.

    Issue 22, defect 6: no OS error leaves the public API untyped. The
    answer names the file (`error.filename`, inside `directory` when it is a
    bare name, else `directory`) and the remedy: ResourceExhaustedError for
    a lack of descriptors or mappings, NoSpaceError for a full filesystem,
    FileAccessError for anything else. A shmring error is answered as it is.
    """
    if isinstance(error, ShmringError):
        return error
    code = error.errno or 0
    name = error.filename
    if isinstance(name, bytes):
        name = os.fsdecode(name)
    if isinstance(name, str) and name and not os.path.isabs(name):
        name = os.path.join(directory, name)
    path = name if isinstance(name, str) and name else directory
    reason = f"{describe_errno(code)} while {what}: path={path!r}"
    if code in EXHAUSTION_ERRNOS:
        return ResourceExhaustedError(
            f"{reason}; remedy: raise the descriptor limit (ulimit -n, RLIMIT_NOFILE) or "
            f"close other files, then retry",
            code,
        )
    if code in _NO_SPACE_ERRNOS:
        return NoSpaceError(
            f"{reason}; remedy: free space under the shm root (or make it larger), then retry",
            code,
        )
    return FileAccessError(
        f"{reason}; remedy: check that path's owner, mode and filesystem (read-only?), "
        f"or pick another scope or shm_root",
        code,
        path,
    )


def describe_errno(code: int) -> str:
    """`ENOSPC (No space left on device)` for an errno value."""
    name = _errno.errorcode.get(code, str(code))
    return f"{name} ({os.strerror(code)})"


__all__ = [
    "BackPressureError",
    "BrokenError",
    "ClosedError",
    "ConfigurationError",
    "CorruptFrameError",
    "DirectoryReplacedError",
    "EXHAUSTION_ERRNOS",
    "FileAccessError",
    "ForkedError",
    "FrameTooLargeError",
    "InvalidKeyError",
    "MissingExtraError",
    "NoSpaceError",
    "ProducerGoneError",
    "RegistrationError",
    "ResourceExhaustedError",
    "RegistryPoisonedError",
    "ShmringError",
    "StaleDescriptorError",
    "UnsupportedPayloadError",
    "describe_errno",
    "is_exhaustion",
    "typed_os_error",
]
