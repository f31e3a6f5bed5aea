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

The API in three modules: this one is the producer side (`TransferSender`)
and the one import point of every public name; the options and the
descriptors are `shmring.impl.registered.transfer_descriptor`'s, the consumer side
`shmring.impl.registered.transfer_receiver`'s. A registered send is
`shmring.spec.registration.process_transfer` (`Registry.transfer`) for the
fields the arena does not take, and the arena's reserve / copy / commit
(`shmring.impl.registered.arena.RegisteredArena`) for the fields it does.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ...spec.registration import CUDA_ERROR_MEMORY_ALLOCATION
from .. import lifecycle
from ..directory import Directory
from ..errors import (
    ClosedError,
    ConfigurationError,
    ForkedError,
    RegistrationError,
    RegistryPoisonedError,
)
from ..extras import import_extra
from ..names import (
    DEFAULT_SHM_ROOT,
    registered_segment_file_name,
    validate_scope,
)
from ..os_seam import DEFAULT_OS, OsFacade
from .arena import (
    ArenaFrameDescriptor,
    ArenaReservation,
    RegisteredArena,
)
from .cuda_driver import (
    CUDA_ERROR_INSUFFICIENT_DRIVER,
    CudaDriver,
    default_driver,
)
from .host_copy import (
    copy_to_host_or_gather,
    dtype_name,
    host_view,
    wire_dtype_of,
)
from .member import ScopeMember
from .registration import Registry, prune_taken_names, unlink_published
from .shm_file import ShmFile
from .transfer_descriptor import (
    CARRIER_ARENA,
    CARRIER_SEGMENT,
    CARRIERS,
    FieldDescriptor,
    TransferDescriptor,
    TransferOptions,
)
from .transfer_receiver import TransferReceiver, restore_tensor

if TYPE_CHECKING:
    import torch
else:  # the `torch` extra: a MissingExtraError naming it when absent
    torch = import_extra("torch", "the registered transfer (shmring.impl.registered)")

logger = logging.getLogger("shmring.transfer")

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
    _inherited = False  # inherited through fork (`impl.lifecycle`)
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
        options = TransferOptions.of(options)
        self.scope = validate_scope(scope)
        self.options = options
        self._os = os_facade
        self._shm_root = shm_root
        self._held = ScopeMember(self.scope, os_facade, shm_root)
        self._driver = driver
        if options.enable_registered_shm and driver is None:
            self._driver = default_driver()
        self._arena_disabled: str | None = None
        self._registered_disabled: str | None = None
        self._published_names: list[str] = []
        self._registered = 0
        self._plain = 0
        self._fell_back = 0
        self._in_arena = 0
        self._in_segments = 0
        lifecycle.track(self)  # a fork child's copy is the parent's (`_forked_in_child`)

    def _forked_in_child(self) -> None:
        """`lifecycle`: in a forked child this sender is the parent's: ForkedError, close releases."""
        self._inherited = True
        self._closed = True

    @property
    def directory(self) -> str:
        """The deployment directory's path (for names in messages and readers).

        Opens (creates) the directory while open, as the first file would.
        """
        return self._held.path if self._closed else self.files.path

    @property
    def files(self) -> Directory:
        """Where this sender's segments are created and unlinked: a verified descriptor.

        The sender is a member of its scope while open (`member.ScopeMember`):
        no connector's close tears this directory down meanwhile. Joined
        again (a private directory, or ConfigurationError for one not ours)
        when a neighbour removed the one held.
        """
        return self._held.get()

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
            if self._inherited:
                raise ForkedError(
                    f"sender inherited through fork: scope={self.scope!r}; "
                    f"make a new TransferSender in this process after the fork"
                )
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
                assert arena is not None
                descriptors.append(
                    self._field(
                        name,
                        tensor,
                        CARRIER_ARENA,
                        frame.arena,
                        frame.position,
                        frame.key,
                        (arena.owner_uid, arena.identity),
                    )
                )
                self._in_arena += 1
            else:
                segment = next(segments)
                made = (segment.owner_uid, segment.identity)
                descriptors.append(
                    self._field(name, tensor, CARRIER_SEGMENT, segment.name, 0, "", made)
                )
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
                    self.files, registered_segment_file_name(self._os), max(1, nbytes), self._os
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
            self._published_names.append(file.name)
            made = (file.owner_uid, file.identity)
            descriptors.append(self._field(name, tensor, CARRIER_SEGMENT, file.name, 0, "", made))
            self._in_segments += 1
        self._published_names = prune_taken_names(self._published_names, self.files)
        return descriptors

    @staticmethod
    def _field(
        name: str,
        tensor: torch.Tensor,
        carrier: str,
        file: str,
        position: int,
        key: str,
        made: tuple[int, tuple[int, int]],
    ) -> FieldDescriptor:
        """The field's descriptor; `made` is the file's (owner uid, (st_dev, st_ino))."""
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
            owner_uid=made[0],
            identity=made[1],
        )

    def close(self) -> None:
        """Close the arena and the registry, unlink untaken segments. Idempotent.

        RegistryPoisonedError from the arena's unregister propagates after
        everything else is closed (the arena's mapping is then retained).
        """
        lifecycle.closed(self)
        if self._inherited:  # the parent's arena, registry and segments: release mappings only
            lifecycle.release_inherited(self)
            return
        if self._closed:
            return
        self._closed = True
        poisoned: RegistryPoisonedError | None = None
        if self._arena is not None:
            try:
                self._arena.close()
            except RegistryPoisonedError as error:
                poisoned = error
        unlink_published(self._published_names, self._held)
        self._published_names = []
        if self._registry is not None:
            self._registry.close()
        self._held.close()  # leaves the scope: the last member out removes the directory
        if poisoned is not None:
            raise poisoned

    def __enter__(self) -> TransferSender:
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
