"""Tensor bits into host memory: the wire dtypes, host views, and the copies that fill them.

Both transfer paths land a tensor's bits in shared memory the same way: the
registered path through the CUDA driver port (`copy_into_host`, used by the
per-transfer segments of `shmring.impl.registered.registration` and by the registered
arena), the copying path through torch's own ``copy_``
(`copy_to_host_or_gather`). bfloat16 travels as its uint16 bits: the copy
reinterprets (`copy_source`), nothing is widened on the device.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from ..errors import RegistrationError, UnsupportedPayloadError
from ..extras import import_extra
from .cuda_driver import CudaDriver

if TYPE_CHECKING:
    import torch
else:  # the `torch` extra: a MissingExtraError naming it when absent
    torch = import_extra("torch", "the registered transfer (shmring.impl.registered)")

# What travels for each torch dtype: the numpy dtype name of the bits. bfloat16
# has no numpy dtype; its bits travel as uint16 and a dtype view restores it.
WIRE_DTYPES: Final = {
    torch.bool: "bool",
    torch.uint8: "uint8",
    torch.int8: "int8",
    torch.int16: "int16",
    torch.int32: "int32",
    torch.int64: "int64",
    torch.float16: "float16",
    torch.float32: "float32",
    torch.float64: "float64",
    torch.bfloat16: "uint16",
}
# The dtype the copy runs in: same bits, a dtype every torch copy kernel has.
_COPY_DTYPES: Final = {torch.bfloat16: torch.int16}
# Torch dtype for each wire dtype, to view the host bytes (uint16 bits copy as int16).
_HOST_DTYPES: Final = {
    "bool": torch.bool,
    "uint8": torch.uint8,
    "int8": torch.int8,
    "int16": torch.int16,
    "int32": torch.int32,
    "int64": torch.int64,
    "float16": torch.float16,
    "float32": torch.float32,
    "float64": torch.float64,
    "uint16": torch.int16,
}


def dtype_name(dtype: torch.dtype) -> str:
    """`torch.bfloat16` -> "bfloat16"."""
    return str(dtype).removeprefix("torch.")


def wire_dtype_of(dtype: torch.dtype) -> str:
    """The numpy dtype name whose bits carry `dtype`; UnsupportedPayloadError if none."""
    try:
        return WIRE_DTYPES[dtype]
    except KeyError:
        raise UnsupportedPayloadError(f"tensor dtype has no wire form: dtype={dtype}") from None


def copy_source(src: torch.Tensor) -> torch.Tensor:
    """`src` reinterpreted in the dtype the copy runs in (bfloat16 bits as int16; nothing widened)."""
    wire_dtype_of(src.dtype)
    copy_dtype = _COPY_DTYPES.get(src.dtype)
    return src if copy_dtype is None else src.view(copy_dtype)


def host_view(buffer: torch.Tensor, offset: int, src: torch.Tensor) -> torch.Tensor:
    """A tensor over `buffer[offset:]` shaped like `src` in its copy dtype (shares memory)."""
    source = copy_source(src)
    nbytes = source.numel() * source.element_size()
    return buffer[offset : offset + nbytes].view(source.dtype).view(source.shape)


def copy_to_host_or_gather(dst: torch.Tensor, src: torch.Tensor) -> None:
    """Copy `src` into the host tensor `dst` (its `host_view`); synchronous.

    torch copies a strided device source by making it contiguous *on the
    device* first (an allocation the size of the payload). Only when that
    allocation fails is the source gathered on the host instead
    (`gather_through_host`): the gather copies the whole storage span the
    view covers, which for a column of a large tensor is the large tensor,
    so it is the way out of a full device, not the default.
    """
    source = copy_source(src)
    try:
        dst.copy_(source)
    except torch.cuda.OutOfMemoryError:
        if source.is_contiguous():
            raise  # nothing to make contiguous: the allocation was not ours
        gather_through_host(dst, source)


def gather_through_host(dst: torch.Tensor, source: torch.Tensor) -> None:
    """`dst.copy_(source)` through a host copy of the storage span `source` covers.

    The span is contiguous in the source's storage, so copying it needs no
    temporary on its device; the strided view is then taken of the host copy.
    The span can be larger than the payload (a slice with a step): host
    memory is spent, not device memory. Works for any device (tested on CPU).
    """
    if source.numel() == 0:
        return
    first = source.storage_offset()
    last = first + sum(
        (n - 1) * step for n, step in zip(source.shape, source.stride(), strict=True)
    )
    span = source.as_strided((last - first + 1,), (1,), first)  # no copy: the storage itself
    staged = torch.empty(span.shape, dtype=span.dtype)  # pageable: the copy is synchronous
    staged.copy_(span)
    dst.copy_(staged.as_strided(source.shape, source.stride(), 0))


def copy_into_host(driver: CudaDriver, dst: torch.Tensor, src: torch.Tensor) -> None:
    """Copy `src` into `dst` through the driver and wait for it; RegistrationError on failure.

    The error is re-raised without the driver's frames so no traceback keeps a
    view of the destination mapping alive.
    """
    failure: RegistrationError | None = None
    try:
        driver.copy_to_host(dst, copy_source(src))
        driver.synchronize()
    except RegistrationError as error:
        failure = error
    finally:
        del dst
    if failure is not None:
        raise failure.with_traceback(None)
