"""The pooled large-payload path: one producer's slot files, reused, for what the ring refuses.

Design rationale (issue 13). A payload the ring does not admit used to get
its own per-key segment file: a file created, fallocated, page-faulted and
unlinked per message (or one of 16 spares), so throughput depended on a
spare budget and fell apart with many large messages in flight. A pool
keeps slot files in power-of-two size classes (each holding its class plus
`layout.POOL_CLASS_HEADROOM`, so a power-of-two tensor with its codec header
takes its own class, not twice its size), mapped once by the producer
and once per consumer, and reuses a slot as soon as no consumer may read it
(`spec.pool`): copy once per side, no file created on the steady path, as
many messages in flight as the budget holds. The ring carries a small
reference frame per message (`refs`), so every key rule stays the ring's;
per-key segments remain the last resort (no slot, ring full).

Modules: `slots` (header words, creation, the one validator), `refs` (the
reference bytes), `producer` (`PoolProducer`: acquire / publish / abandon /
close), `consumer` (`PoolReader`: claim and `PoolClaim`, the borrow hook).
docs/protocol.md ("Pool") maps each model step to its function.
"""

from .consumer import PoolClaim, PoolReader
from .producer import OwnedSlot, PoolProducer, PoolStatistics
from .refs import PoolRef, decode_ref, encode_ref, is_pool_ref

__all__ = [
    "OwnedSlot",
    "PoolClaim",
    "PoolProducer",
    "PoolReader",
    "PoolRef",
    "PoolStatistics",
    "decode_ref",
    "encode_ref",
    "is_pool_ref",
]
