"""What a transfer's two sides agree on: the options, and the descriptor that travels between them.

A `TransferDescriptor` is plain data (``to_wire`` / ``from_wire``, no pickle)
that the pipeline carries by whatever channel it already has; each
`FieldDescriptor` says where one field's bytes are (a frame of the
registered arena or a per-transfer segment, its *carrier*) and how to read
them. `from_wire` and `check` refuse anything malformed or inconsistent with
`CorruptFrameError`, before the receiver maps a byte.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import numpy as np

from ...spec.ring import compute_capacity_error
from ..errors import ConfigurationError, CorruptFrameError
from ..names import validate_scope, validate_transfer_file_name
from .arena import DEFAULT_ARENA_CAPACITY
from .host_copy import WIRE_DTYPES, dtype_name

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

    @classmethod
    def of(cls, options: TransferOptions | None) -> TransferOptions:
        """`options`, or the defaults for None; ConfigurationError for anything else."""
        if options is None:
            return cls()
        if not isinstance(options, cls):
            raise ConfigurationError(f"options must be TransferOptions: options={options!r}")
        return options


# -- descriptors ---------------------------------------------------------------------


def _text(value: object, what: str) -> str:
    """`value` if it is a str; TypeError (a malformed descriptor) otherwise."""
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str: {what}={value!r}")
    return value


def _identity(value: object) -> tuple[int, int]:
    """A file identity (st_dev, st_ino) from its wire form, a list of two ints."""
    if not isinstance(value, (list, tuple)) or len(value) != 2:
        raise ValueError(f"identity must be [st_dev, st_ino]: identity={value!r}")
    return (int(value[0]), int(value[1]))


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
    # The file as the sender made it (issue 22, defect 1): its owner and its
    # (st_dev, st_ino). The receiver maps only a file that is this very one,
    # never another file put at the same name.
    owner_uid: int
    identity: tuple[int, int]

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
            "owner_uid": self.owner_uid,
            "identity": list(self.identity),
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
                owner_uid=int(data["owner_uid"]),
                identity=_identity(data["identity"]),
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
        if self.owner_uid < 0 or len(self.identity) != 2 or min(self.identity) < 0:
            raise CorruptFrameError(f"negative owner uid or file identity: {self}")
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
