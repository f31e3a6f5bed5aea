"""The transfer API: send named tensors to another process, receive numpy views.

Design rationale. One sender and one receiver per process pair, and a small
descriptor (plain data, no pickle) that travels between them by whatever
channel the pipeline already has. Two opt-in switches, both off by default:

* `enable_registered_shm`: GPU tensors are copied device-to-host directly
  into CUDA-registered shared memory: a frame of the registered arena when
  the arena admits the payload and has room, else a per-transfer registered
  segment (`registration`). CPU tensors, and machines without CUDA, take the
  plain copy path (an unregistered segment), unless the driver accepts host
  sources (the simulated driver, for tests and CPU benchmarks).
* `enable_borrowed_frames`: the receiver gets borrowed views (`views`) over
  the shared memory instead of copies; they keep it alive as long as any
  derived object lives.

bfloat16 travels as its uint16 bits (the copy reinterprets, nothing is
widened on the device) and `restore_tensor` brings it back with a dtype view.
A transfer of several fields publishes all of them or none.

Two failures of the registered path send a transfer down the copying path
instead of to the caller (docs/registered.md, "Falling back"): a driver older
than the bindings (`cudaErrorInsufficientDriver`: the registered path is
switched off for this sender, logged once), and a failed device allocation
while a strided source is made contiguous on the device (this transfer only;
the copying path then gathers on the host, `copy_to_host_or_gather`).
Both are counted in `SenderStatistics`.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
import torch

from shmring.impl.arena import (
    DEFAULT_ARENA_CAPACITY,
    ArenaFrameDescriptor,
    ArenaReader,
    ArenaReservation,
    RegisteredArena,
)
from shmring.impl.cuda_driver import CUDA_ERROR_INSUFFICIENT_DRIVER, CudaDriver, default_driver
from shmring.impl.directory import (
    ensure_deployment_directory,
    remove_deployment_directory_if_empty,
)
from shmring.impl.errors import (
    ClosedError,
    ConfigurationError,
    CorruptFrameError,
    RegistrationError,
    RegistryPoisonedError,
)
from shmring.impl.names import (
    DEFAULT_SHM_ROOT,
    deployment_directory,
    registered_segment_file_name,
    validate_scope,
    validate_transfer_file_name,
)
from shmring.impl.os_seam import DEFAULT_OS, OsFacade
from shmring.impl.registration import (
    WIRE_DTYPES,
    Registry,
    ShmFile,
    copy_to_host_or_gather,
    dtype_name,
    host_view,
    prune_taken_names,
    wire_dtype_of,
)
from shmring.impl.views import borrow_mapped, copy_mapped, map_segment, unlink_segment
from shmring.spec.registration import CUDA_ERROR_MEMORY_ALLOCATION
from shmring.spec.ring import compute_capacity_error

logger = logging.getLogger("shmring.transfer")

CARRIER_ARENA: Final = "arena"  # a frame of the registered arena
CARRIER_SEGMENT: Final = "segment"  # a per-transfer segment (registered or not)
CARRIERS: Final = (CARRIER_ARENA, CARRIER_SEGMENT)

_TORCH_DTYPES: Final = {dtype_name(dtype): dtype for dtype in WIRE_DTYPES}


# -- options ------------------------------------------------------------------------


@dataclass(frozen=True)
class TransferOptions:
    """Switches of the registered transfer path; both default off."""

    enable_registered_shm: bool = False  # D2H straight into CUDA-registered shared memory
    enable_borrowed_frames: bool = False  # receivers borrow views instead of copying out
    # Bytes of the registered arena (a valid ring capacity); 0 disables it, and
    # every registered transfer takes a per-transfer segment.
    arena_capacity: int = DEFAULT_ARENA_CAPACITY

    def __post_init__(self) -> None:
        for name in ("enable_registered_shm", "enable_borrowed_frames"):
            value = getattr(self, name)
            if not isinstance(value, bool):
                raise ConfigurationError(
                    f"{name} must be a bool: {name}={value!r} ({type(value).__name__})"
                )
        capacity = self.arena_capacity
        if not isinstance(capacity, int) or isinstance(capacity, bool):
            raise ConfigurationError(f"arena_capacity must be an int: arena_capacity={capacity!r}")
        error = compute_capacity_error(capacity)
        if error is not None:
            raise ConfigurationError(f"arena_capacity: {error}")


# -- descriptors ---------------------------------------------------------------------


def _text(value: object, what: str) -> str:
    """`value` if it is a str; TypeError (a malformed descriptor) otherwise."""
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str: {what}={value!r}")
    return value


@dataclass(frozen=True)
class FieldDescriptor:
    """Where one field's bytes are and how to read them."""

    name: str  # the field's name in the transfer
    carrier: str  # CARRIER_ARENA or CARRIER_SEGMENT
    file: str  # arena or segment file name in the deployment directory
    position: int  # arena frame position; 0 for a segment
    key: str  # arena frame key; "" for a segment
    nbytes: int  # payload bytes
    dtype: str  # the sender's torch dtype name ("bfloat16", "float32", ...)
    wire_dtype: str  # numpy dtype name of the bits that travel ("uint16" for bfloat16)
    shape: tuple[int, ...]

    def to_wire(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "carrier": self.carrier,
            "file": self.file,
            "position": self.position,
            "key": self.key,
            "nbytes": self.nbytes,
            "dtype": self.dtype,
            "wire_dtype": self.wire_dtype,
            "shape": list(self.shape),
        }

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> FieldDescriptor:
        try:
            field = cls(
                name=str(data["name"]),
                carrier=_text(data["carrier"], "carrier"),
                file=validate_transfer_file_name(data["file"]),
                position=int(data["position"]),
                key=str(data["key"]),
                nbytes=int(data["nbytes"]),
                dtype=_text(data["dtype"], "dtype"),
                wire_dtype=_text(data["wire_dtype"], "wire_dtype"),
                shape=tuple(int(d) for d in data["shape"]),
            )
        except (KeyError, TypeError, ValueError, OverflowError) as error:
            raise CorruptFrameError(
                f"malformed field descriptor: {error}: {dict(data)!r}"
            ) from error
        field.check()
        return field

    def check(self) -> None:
        """CorruptFrameError unless the descriptor is self-consistent."""
        if self.carrier not in CARRIERS or self.dtype not in _TORCH_DTYPES:
            raise CorruptFrameError(f"unknown carrier or dtype: {self}")
        if WIRE_DTYPES[_TORCH_DTYPES[self.dtype]] != self.wire_dtype:
            raise CorruptFrameError(f"wire dtype does not match dtype: {self}")
        if any(d < 0 for d in self.shape) or self.position < 0:
            raise CorruptFrameError(f"negative shape or position: {self}")
        expected = int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.wire_dtype).itemsize
        if self.nbytes != expected:
            raise CorruptFrameError(
                f"nbytes={self.nbytes} differs from shape and dtype ({expected}): {self}"
            )


@dataclass(frozen=True)
class TransferDescriptor:
    """One transfer: what the receiver needs, as plain data."""

    scope: str  # deployment scope of the files
    fields: tuple[FieldDescriptor, ...]
    registered: bool  # whether the registered path carried it

    def to_wire(self) -> dict[str, Any]:
        return {
            "scope": self.scope,
            "registered": self.registered,
            "fields": [f.to_wire() for f in self.fields],
        }

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> TransferDescriptor:
        try:
            scope = validate_scope(data["scope"])
            fields = tuple(FieldDescriptor.from_wire(f) for f in data["fields"])
            registered = bool(data["registered"])
        except (KeyError, TypeError) as error:
            raise CorruptFrameError(f"malformed transfer descriptor: {error}") from error
        return cls(scope=scope, fields=fields, registered=registered)


# -- sender ---------------------------------------------------------------------------


@dataclass(frozen=True)
class SenderStatistics:
    """Counters of one sender."""

    transfers_registered: int  # transfers the registered path carried
    transfers_plain: int  # transfers the plain copy path carried
    fields_in_arena: int  # fields that went into arena frames
    fields_in_segments: int  # fields that went into per-transfer segments (registered or not)
    arena_disabled: str | None  # why the arena could not be set up, if it could not
    # Transfers the registered path was chosen for and the copying path
    # carried, after a failure the registered path cannot serve (counted in
    # transfers_plain too).
    transfers_fell_back: int
    registered_disabled: str | None  # why the registered path is off for this sender, if it is


class TransferSender:
    """Producer side: copies tensors into shared memory and describes them.

    Owns its registry, its arena and the segments it has not published yet.
    Published memory belongs to the receiver.
    """

    _closed = False
    _arena: RegisteredArena | None = None
    _registry: Registry | None = None

    def __init__(
        self,
        scope: str,
        options: TransferOptions | None = None,
        *,
        driver: CudaDriver | None = None,
        os_facade: OsFacade = DEFAULT_OS,
        shm_root: str = DEFAULT_SHM_ROOT,
    ) -> None:
        options = TransferOptions() if options is None else options
        if not isinstance(options, TransferOptions):
            raise ConfigurationError(f"options must be TransferOptions: options={options!r}")
        self.scope = validate_scope(scope)
        self.options = options
        self._os = os_facade
        self._shm_root = shm_root
        self._directory: str | None = None
        self._driver = driver
        if options.enable_registered_shm and driver is None:
            self._driver = default_driver()
        self._arena_disabled: str | None = None
        self._registered_disabled: str | None = None
        self._published_paths: list[str] = []
        self._registered = 0
        self._plain = 0
        self._fell_back = 0
        self._in_arena = 0
        self._in_segments = 0

    @property
    def directory(self) -> str:
        if self._directory is None:
            self._directory = ensure_deployment_directory(self.scope, self._os, self._shm_root)
        return self._directory

    @property
    def driver(self) -> CudaDriver | None:
        """The CUDA driver port of the registered path (None: copying path only)."""
        return self._driver

    @property
    def registry(self) -> Registry | None:
        return self._registry

    @property
    def arena(self) -> RegisteredArena | None:
        return self._arena

    def statistics(self) -> SenderStatistics:
        return SenderStatistics(
            transfers_registered=self._registered,
            transfers_plain=self._plain,
            fields_in_arena=self._in_arena,
            fields_in_segments=self._in_segments,
            arena_disabled=self._arena_disabled,
            transfers_fell_back=self._fell_back,
            registered_disabled=self._registered_disabled,
        )

    def uses_registered_path(self, tensors: list[torch.Tensor]) -> bool:
        """Registered path: switched on, a driver, and every tensor one the driver copies from."""
        driver = self._driver
        if not self.options.enable_registered_shm or driver is None:
            return False
        if self._registered_disabled is not None:
            return False
        return all(t.is_cuda or driver.accepts_host_sources for t in tensors)

    def send(self, fields: Mapping[str, torch.Tensor]) -> TransferDescriptor:
        """Copy every field into shared memory; all are published or none.

        Raises OSError (NoSpaceError), RegistrationError, or
        RegistryPoisonedError once an unregister failed for good (then no
        registered transfer works until the process restarts).
        """
        if self._closed:
            raise ClosedError(f"sender is closed: scope={self.scope!r}")
        if not fields:
            raise ValueError("a transfer needs at least one field")
        names = list(fields)
        tensors = [fields[name] for name in names]
        for name, tensor in zip(names, tensors, strict=True):
            if not isinstance(tensor, torch.Tensor):
                raise ConfigurationError(
                    f"field {name!r} is not a torch.Tensor: {type(tensor).__name__}"
                )
            wire_dtype_of(tensor.dtype)
        registered = self.uses_registered_path(tensors)
        if registered:
            try:
                descriptors = self._send_registered(names, tensors)
            except RegistrationError as error:
                # Nothing of the failed attempt is published (all or none).
                if not self._falls_back(error, tensors):
                    raise
                registered = False
                self._fell_back += 1
        if registered:
            self._registered += 1
        else:
            descriptors = self._send_plain(names, tensors)
            self._plain += 1
        return TransferDescriptor(self.scope, tuple(descriptors), registered=registered)

    def _falls_back(self, error: RegistrationError, tensors: list[torch.Tensor]) -> bool:
        """Whether the copying path carries a transfer the registered path failed; logs why."""
        if isinstance(error, RegistryPoisonedError):
            return False  # the registered path's own safety rule: never silently bypassed
        if error.cuda_error == CUDA_ERROR_INSUFFICIENT_DRIVER:
            # Old driver, newer bindings: no registration will ever work in
            # this process, the copying path does. Once, for good.
            self._registered_disabled = f"{type(error).__name__}: {error}"
            logger.warning(
                "shmring: registered transfer path off for scope=%r, using the copying path: %s",
                self.scope,
                error,
            )
            return True
        if error.cuda_error == CUDA_ERROR_MEMORY_ALLOCATION and any(
            not t.is_contiguous() for t in tensors
        ):
            # Making a strided source contiguous on the device needs a device
            # allocation the size of the payload; the copying path gathers on
            # the host instead.
            logger.warning(
                "shmring: no device memory to make a strided source contiguous "
                "(scope=%r), this transfer takes the copying path: %s",
                self.scope,
                error,
            )
            return True
        return False

    def _ensure_registry(self) -> Registry:
        if self._registry is None:
            assert self._driver is not None
            self._registry = Registry(
                self.scope, self._driver, os_facade=self._os, shm_root=self._shm_root
            )
        return self._registry

    def _ensure_arena(self, registry: Registry) -> RegisteredArena | None:
        if self._arena is None and self._arena_disabled is None and self.options.arena_capacity:
            try:
                self._arena = RegisteredArena(registry, self.options.arena_capacity)
            except RegistryPoisonedError:
                raise
            except (OSError, RegistrationError) as error:
                # Set-up failure disables the arena for this sender, once;
                # per-transfer segments carry the traffic.
                self._arena_disabled = f"{type(error).__name__}: {error}"
        return self._arena

    def _send_registered(
        self, names: list[str], tensors: list[torch.Tensor]
    ) -> list[FieldDescriptor]:
        registry = self._ensure_registry()
        arena = self._ensure_arena(registry)
        slots: list[ArenaReservation | None] = []
        try:
            for tensor in tensors:
                reservation = (
                    arena.reserve(tensor.numel() * tensor.element_size()) if arena else None
                )
                if isinstance(reservation, ArenaReservation):
                    assert arena is not None
                    arena.copy_into(reservation, tensor)
                    slots.append(reservation)
                else:
                    slots.append(None)
            rest = [t for t, slot in zip(tensors, slots, strict=True) if slot is None]
            segments = iter(registry.transfer(rest) if rest else [])
        except BaseException:
            if arena is not None:
                arena.abort()
            raise
        frames = iter(arena.commit() if arena is not None else [])
        descriptors = []
        for name, tensor, slot in zip(names, tensors, slots, strict=True):
            if slot is not None:
                frame: ArenaFrameDescriptor = next(frames)
                descriptors.append(
                    self._field(name, tensor, CARRIER_ARENA, frame.arena, frame.position, frame.key)
                )
                self._in_arena += 1
            else:
                segment = next(segments)
                descriptors.append(self._field(name, tensor, CARRIER_SEGMENT, segment.name, 0, ""))
                self._in_segments += 1
        return descriptors

    def _send_plain(self, names: list[str], tensors: list[torch.Tensor]) -> list[FieldDescriptor]:
        """The copying path: an unregistered segment per field, filled by torch `copy_`.

        A strided device source whose device-side contiguous copy finds no
        memory is gathered on the host instead (`copy_to_host_or_gather`).
        """
        files: list[ShmFile] = []
        try:
            for tensor in tensors:
                nbytes = tensor.numel() * tensor.element_size()
                file = ShmFile(
                    self.directory, registered_segment_file_name(self._os), max(1, nbytes), self._os
                )
                files.append(file)
                copy_to_host_or_gather(host_view(file.tensor, 0, tensor), tensor)
        except BaseException:
            for file in files:
                file.unmap()
                file.unlink()
            raise
        descriptors = []
        for name, tensor, file in zip(names, tensors, files, strict=True):
            file.unmap()
            self._published_paths.append(file.path)
            descriptors.append(self._field(name, tensor, CARRIER_SEGMENT, file.name, 0, ""))
            self._in_segments += 1
        self._published_paths = prune_taken_names(self._published_paths, self._os)
        return descriptors

    @staticmethod
    def _field(
        name: str, tensor: torch.Tensor, carrier: str, file: str, position: int, key: str
    ) -> FieldDescriptor:
        return FieldDescriptor(
            name=name,
            carrier=carrier,
            file=file,
            position=position,
            key=key,
            nbytes=tensor.numel() * tensor.element_size(),
            dtype=dtype_name(tensor.dtype),
            wire_dtype=wire_dtype_of(tensor.dtype),
            shape=tuple(tensor.shape),
        )

    def close(self) -> None:
        """Close the arena and the registry, unlink untaken segments. Idempotent.

        RegistryPoisonedError from the arena's unregister propagates after
        everything else is closed (the arena's mapping is then retained).
        """
        if self._closed:
            return
        self._closed = True
        poisoned: RegistryPoisonedError | None = None
        if self._arena is not None:
            try:
                self._arena.close()
            except RegistryPoisonedError as error:
                poisoned = error
        for path in self._published_paths:
            with contextlib.suppress(FileNotFoundError):
                self._os.unlink(path)
        self._published_paths = []
        if self._registry is not None:
            self._registry.close()
        if self._directory is not None:
            remove_deployment_directory_if_empty(self._directory, self._os)
        if poisoned is not None:
            raise poisoned

    def __enter__(self) -> TransferSender:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# -- receiver --------------------------------------------------------------------------


def restore_tensor(array: np.ndarray, dtype: str) -> torch.Tensor:
    """The sender's tensor over `array`'s memory (no copy); bfloat16 by a dtype view of the uint16 bits."""
    if dtype not in _TORCH_DTYPES:
        raise CorruptFrameError(f"unknown dtype: dtype={dtype!r}")
    tensor = torch.from_numpy(array)
    target = _TORCH_DTYPES[dtype]
    return tensor if tensor.dtype == target else tensor.view(target)


class TransferReceiver:
    """Consumer side: maps what a descriptor names; borrows or copies it out."""

    _closed = False

    def __init__(
        self,
        scope: str,
        options: TransferOptions | None = None,
        *,
        os_facade: OsFacade = DEFAULT_OS,
        shm_root: str = DEFAULT_SHM_ROOT,
    ) -> None:
        options = TransferOptions() if options is None else options
        if not isinstance(options, TransferOptions):
            raise ConfigurationError(f"options must be TransferOptions: options={options!r}")
        self.scope = validate_scope(scope)
        self.options = options
        self._os = os_facade
        self._directory = deployment_directory(scope, shm_root)
        self._readers: dict[str, ArenaReader] = {}

    def _reader(self, name: str) -> ArenaReader:
        reader = self._readers.get(name)
        if reader is None:
            reader = ArenaReader(self._directory, name, self._os)
            self._readers[name] = reader
        return reader

    def receive(self, descriptor: TransferDescriptor) -> dict[str, np.ndarray]:
        """Every field as a numpy array of its wire dtype.

        With `enable_borrowed_frames` the arrays are borrowed views: the
        receiver owns the memory until the last object derived from an array
        dies (see `views.LeaseOwner`); they may be written. Otherwise they are
        independent copies and the shared memory is released before this
        returns. When a system call fails (mapping a segment, opening the
        arena) nothing is taken and the same descriptor may be received again.
        """
        if self._closed:
            raise ClosedError(f"receiver is closed: scope={self.scope!r}")
        if descriptor.scope != self.scope:
            raise CorruptFrameError(
                f"descriptor for scope={descriptor.scope!r}, receiver scope={self.scope!r}"
            )
        borrowed = self.options.enable_borrowed_frames
        for field in descriptor.fields:
            field.check()
        # 1. Every system call first (arena readers, segment mappings), so an
        #    OS failure here takes nothing: all fields stay for a retry.
        mapped: dict[str, Any] = {}
        received: dict[str, np.ndarray] = {}
        try:
            for field in descriptor.fields:
                if field.carrier == CARRIER_ARENA:
                    self._reader(field.file)
                else:
                    mapped[field.name] = map_segment(
                        self._directory, field.file, self._os, unlink=False
                    )
            # 2. Take every field (no system call).
            for field in descriptor.fields:
                if field.carrier == CARRIER_ARENA:
                    frame = ArenaFrameDescriptor(
                        field.file, field.position, field.key, field.nbytes
                    )
                    reader = self._reader(field.file)
                    take = reader.borrow if borrowed else reader.copy
                    received[field.name] = take(frame, field.wire_dtype, field.shape)
                else:
                    take_mapped = borrow_mapped if borrowed else copy_mapped
                    mapping = mapped.pop(field.name)
                    received[field.name] = take_mapped(
                        mapping, field.file, field.wire_dtype, field.shape
                    )
        except BaseException:
            received.clear()  # release what was taken; the traceback must not hold leases
            for mapping in mapped.values():
                mapping.close()
            raise
        # 3. The commit: taken segments' names go. A name that cannot be
        #    removed now is removed by the sender's close; what was taken stays taken.
        for field in descriptor.fields:
            if field.carrier != CARRIER_ARENA:
                with contextlib.suppress(OSError):
                    unlink_segment(self._directory, field.file, self._os)
        return received

    def receive_tensors(self, descriptor: TransferDescriptor) -> dict[str, torch.Tensor]:
        """Like `receive`, with each field restored to its torch dtype (bfloat16 by dtype view)."""
        arrays = self.receive(descriptor)
        by_name = {f.name: f for f in descriptor.fields}
        return {name: restore_tensor(array, by_name[name].dtype) for name, array in arrays.items()}

    def close(self) -> None:
        """Drop the arena mappings; live borrowed views keep theirs. Idempotent."""
        self._closed = True
        for reader in self._readers.values():
            reader.close()
        self._readers.clear()

    def __enter__(self) -> TransferReceiver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = [
    "CARRIERS",
    "CARRIER_ARENA",
    "CARRIER_SEGMENT",
    "FieldDescriptor",
    "SenderStatistics",
    "TransferDescriptor",
    "TransferOptions",
    "TransferReceiver",
    "TransferSender",
    "restore_tensor",
]
