"""Frames codec: a user payload to the bytes of one ring frame or fallback segment, and back.

Design rationale. The codec sits on the latency path of every put and get, so
it lets msgspec do the tree work in C and keeps Python work per message to a
walk that checks types, plus a few struct packs per tensor. Three choices
shape the format:

* Tensor data never goes through msgpack. Each CPU tensor or numpy array
  (a *leaf*) becomes a small msgpack ``Ext`` descriptor in the header and a
  raw, 16-byte aligned region after it. `prepare` sizes the whole encoding
  without touching tensor data, so the ring can decide admission (or size a
  fallback segment) before anything is copied; `EncodePlan.write_into` then
  copies each leaf straight into the destination (an mmap slice), resolving
  conj/neg bits and non-contiguous layouts in that one pass (torch's copy_
  into the destination; through a temporary when the destination is not
  16-byte aligned, because torch faults on unaligned complex stores).
* A payload without leaves is plain msgpack, byte for byte what
  ``msgspec.msgpack.encode`` gives. A framed payload starts with 0xC1, the
  one byte msgpack never uses, so the first byte tells the two apart.
* A user's own ``Ext`` values travel untouched: the descriptor ext code is
  chosen per message (127 unless the payload itself uses 127, then the next
  free code) and written in the prefix, so no user code is ever reserved.

Wire format: `shmring.spec.layout`, the codec block (prefix, leaf
descriptor, shared and own areas). The package, one module per concept:

* `wire`: ext codes, limits, the dtype code table, the struct packers of the
  layout's formats, the lazy torch / numpy tables;
* `scan`: what travels: the walk that counts leaves and refuses the rest;
* `encode`: `prepare` (size first) and `EncodePlan.write_into` (copy second);
* `decode`: `decode`, with the bounds checks that make a forged header harmless;
* `bins`: a borrowed decode's large bins, found by walking the msgpack items;
* `rebuild`: registered objects back from their ``[tag, state]`` pairs.

Ownership on decode. Nothing returned is a view of the input buffer (a ring
frame is reused as soon as the get returns); a leaf of `SHARED_LEAF_LIMIT`
bytes or more gets its own allocation, so a small leaf the receiver keeps
cannot pin a large tensor (`decode`). The one exception is asked for:
`decode_borrowed` (a connector's `get(..., borrow=True)`) hands large leaves
back as views of the claimed payload, which hold it (see `decode`, the module).

What travels, and how it comes back:

* CPU torch tensors (strided; dtypes in `TORCH_DTYPE_NAMES`, any shape and
  strides, conj/neg views, requires_grad) -> contiguous torch tensors of the
  same dtype and shape, without grad.
* numpy ``ndarray`` (exact type; same dtypes minus bfloat16; any byte order)
  -> native-order C-contiguous ndarray, writeable (the receiver owns it;
  a borrowed get's views of the payload are read-only).
* dict (keys str/int/float/bool/None/bytes), list, tuple -> dict, list, list.
* str, int (-2**63 .. 2**64-1), float, bool, None -> the same.
* bytes, bytearray, contiguous memoryview -> bytes.
* msgspec Structs -> their msgpack form: dicts (or lists for
  ``array_like``), or the Struct itself when `decode` is given ``type=``.
* ``msgspec.msgpack.Ext`` (code != -1, the msgpack timestamp) -> an equal Ext.
* ``slice`` -> ``[start, stop, step]`` (a list, as on vllm-omni's wire).
* What msgspec (and so vllm-omni's serializer) encodes natively: a
  dataclass or attrs instance -> a dict of its fields, an ``Enum`` -> its
  value, a ``set`` / ``frozenset`` -> a list of its items; tensors and
  arrays inside stay leaves (`scan.substitute`).
* ``PIL.Image.Image`` and every class registered with
  `shmring.impl.extensions.register_type` -> an object of that class, built
  by its registered decode function (see that module; a tagged two-item
  array on the wire, never pickle). A registered class wins over every
  rule above (a registered dataclass, enum or Struct comes back as itself).

Everything else (GPU, meta, sparse, quantized or nested tensors; numpy
scalars, object or string arrays; datetimes, subclasses of the scalar
types, custom classes) raises `UnsupportedPayloadError` naming the type.
Nothing is ever pickled.

torch and numpy are imported only when a payload holds one of their objects:
a process that only moves bytes and trees never imports either.
"""

from __future__ import annotations

from ...spec.layout import CODEC_FORMAT_VERSION as FORMAT_VERSION
from ...spec.layout import CODEC_FRAMED_MARKER as FRAMED_MARKER
from ...spec.layout import CODEC_REGION_ALIGNMENT as REGION_ALIGNMENT
from .bins import BORROWED_BYTES_MIN
from .decode import decode, decode_borrowed
from .encode import EncodePlan, encode, prepare
from .wire import (
    DEFAULT_LEAF_EXT_CODE,
    DIRECT_BYTES_MIN,
    MAX_NDIM,
    MAX_NESTING,
    NUMPY_DTYPE_NAMES,
    SHARED_AREA_LIMIT,
    SHARED_LEAF_LIMIT,
    TIMESTAMP_EXT_CODE,
    TORCH_DTYPE_NAMES,
)

__all__ = [
    "BORROWED_BYTES_MIN",
    "DEFAULT_LEAF_EXT_CODE",
    "DIRECT_BYTES_MIN",
    "FORMAT_VERSION",
    "FRAMED_MARKER",
    "MAX_NDIM",
    "MAX_NESTING",
    "NUMPY_DTYPE_NAMES",
    "REGION_ALIGNMENT",
    "SHARED_AREA_LIMIT",
    "SHARED_LEAF_LIMIT",
    "TIMESTAMP_EXT_CODE",
    "TORCH_DTYPE_NAMES",
    "EncodePlan",
    "decode",
    "decode_borrowed",
    "encode",
    "prepare",
]
