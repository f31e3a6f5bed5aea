"""shmring's errors as another process meets them, and the message every one of them carries.

An error that crosses a process boundary is pickled: a process pool, a
multiprocessing queue, vllm's workers. Before, `DirectoryReplacedError`
and `MissingExtraError` could not be unpickled at all (a pool's result
thread dies on that), `NoSpaceError` and its OSError siblings came back with
errno and message swapped, and `RegistrationError` lost its `cuda_error`.
"""

from __future__ import annotations

import errno
import inspect
import pickle
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from typing import Any

import pytest

from shmring.impl import errors

# One instance of every error class impl defines, as impl raises it.
MADE: dict[str, Any] = {
    "ShmringError": lambda: errors.ShmringError("root: value=1"),
    "ConfigurationError": lambda: errors.ConfigurationError("ring capacity out of range: 1000"),
    "MissingExtraError": lambda: errors.MissingExtraError("video", "av", "video", "no wheel"),
    "ClosedError": lambda: errors.ClosedError("connector is closed: scope='s'"),
    "ForkedError": lambda: errors.ForkedError("inherited through fork: pid=1"),
    "BrokenError": lambda: errors.BrokenError("the other side changed"),
    "ProducerGoneError": lambda: errors.ProducerGoneError("producer exited: pid=7"),
    "CorruptFrameError": lambda: errors.CorruptFrameError("bad magic: 0x0"),
    "StaleDescriptorError": lambda: errors.StaleDescriptorError("not published: position=3"),
    "FrameTooLargeError": lambda: errors.FrameTooLargeError("frame too large: 1 GiB"),
    "UnsupportedPayloadError": lambda: errors.UnsupportedPayloadError("cannot encode: set"),
    "InvalidKeyError": lambda: errors.InvalidKeyError("key too long: 300 bytes"),
    "BackPressureError": lambda: errors.BackPressureError("ring full: edge a -> b"),
    "NoSpaceError": lambda: errors.NoSpaceError("no space: path='/dev/shm/x'", errno.EDQUOT),
    "DirectoryReplacedError": lambda: errors.DirectoryReplacedError("replaced: path='/d'"),
    "ResourceExhaustedError": lambda: errors.ResourceExhaustedError("out of fds", errno.ENFILE),
    "FileAccessError": lambda: errors.FileAccessError("denied: remedy", errno.EACCES, "/dev/shm/f"),
    "RegistrationError": lambda: errors.RegistrationError("register failed", "cudaErrorUnknown"),
    "RegistryPoisonedError": lambda: errors.RegistryPoisonedError("poisoned", "cudaErrorX"),
}


def _what(error: BaseException) -> tuple[object, ...]:
    """What a catcher of `error` reads from it."""
    return (
        type(error),
        str(error),
        error.args,
        getattr(error, "errno", None),
        getattr(error, "strerror", None),
        getattr(error, "filename", None),
        getattr(error, "cuda_error", None),
        tuple(getattr(error, name, None) for name in ("feature", "module", "extra")),
    )


def test_every_error_class_is_made_here() -> None:
    defined = {
        name
        for name, value in vars(errors).items()
        if inspect.isclass(value) and issubclass(value, errors.ShmringError)
    }
    assert defined == set(MADE)


@pytest.mark.parametrize("name", sorted(MADE))
def test_an_error_survives_pickling_as_it_was_raised(name: str) -> None:
    error = MADE[name]()
    assert type(error).__name__ == name
    assert _what(pickle.loads(pickle.dumps(error))) == _what(error)


def _raise(name: str) -> None:
    raise MADE[name]()


def test_errors_raised_in_a_pool_worker_reach_the_caller_as_they_were_raised() -> None:
    """A real process boundary: each error raised in a spawned worker, caught in this process."""
    with ProcessPoolExecutor(max_workers=1, mp_context=get_context("spawn")) as pool:
        futures = {name: pool.submit(_raise, name) for name in sorted(MADE)}
        for name, future in futures.items():
            caught = future.exception(timeout=120)
            assert caught is not None
            assert _what(caught) == _what(MADE[name]()), name


@pytest.mark.parametrize("message", [None, "", 7, b"bytes"], ids=["None", "empty", "int", "bytes"])
@pytest.mark.parametrize(
    "make",
    [
        errors.ShmringError,
        errors.CorruptFrameError,
        errors.NoSpaceError,
        errors.DirectoryReplacedError,
        errors.ResourceExhaustedError,
        lambda message: errors.FileAccessError(message, errno.EIO),
        errors.RegistrationError,
    ],
    ids=["root", "corrupt", "no-space", "replaced", "exhausted", "access", "registration"],
)
def test_an_error_without_a_message_is_refused(make: Any, message: object) -> None:
    """Every error names what went wrong: one made with no text would say nothing."""
    with pytest.raises(TypeError, match=r"needs a message \(a non-empty str\): ") as refused:
        make(message)
    assert str(refused.value).endswith(repr(message))


def test_a_missing_extra_names_the_feature_the_module_and_the_command() -> None:
    """Word for word, with a detail and without one (the default adds nothing)."""
    bare = errors.MissingExtraError("video encoding", "av", "video")
    assert (
        str(bare) == "video encoding needs av, which is not installed: pip install 'shmring[video]'"
    )
    assert (bare.feature, bare.module, bare.extra) == ("video encoding", "av", "video")
    detailed = errors.MissingExtraError("video encoding", "av", "video", "ImportError: no av")
    assert str(detailed) == (
        "video encoding needs av, which is not installed (ImportError: no av): "
        "pip install 'shmring[video]'"
    )
    assert isinstance(bare, ImportError) and isinstance(bare, errors.ConfigurationError)
