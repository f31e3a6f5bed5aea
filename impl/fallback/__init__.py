"""Per-key fallback segments: one POSIX shared-memory file per (edge, key).

The modules: `segment` (the lock rule below, and the reuse limits),
`writer` (the producer's put), `spares` and `retiring` (its
kept files, its retires and deferred removals: mixins of the writer), `claim` (the readers: claim
exactly once, kept mappings, the gc's removal of a dead owner's segment).
Names are `shmring.impl.names`' (`fallback_segment_file_name`, ...).

Design rationale. Frames the ring does not take (too large, or the ring is
full, disabled or failed) travel in a file of their own in the deployment
directory, named for the edge and a digest of the key::

    fb.<source stage>.<destination stage>.<blake2b-128 of the key, hex>

A receiver finds a key's segment by name (no directory scan). The file has
the ring's layout, so it is read and validated by the same code paths: a
ring header (magic, version, capacity = the frame's length, and the *owner's*
producer identity) followed by exactly one data frame whose `position`
field holds the segment's generation (the descriptor names it) and whose
length is stored last::

    0                    RING_HEADER_LENGTH                      file end
    +--- ring header ----+--- one data frame (key, payload, fill) ---+

Writing. The producer creates a private temporary file (O_CREAT|O_EXCL|
O_NOFOLLOW, 0600), reserves its space with fallocate (ENOSPC surfaces here
as `NoSpaceError`, never later as SIGBUS; the temporary is removed, so
nothing half-written is left), fills it through a mapping, and only then
renames it onto the segment name. A reader therefore sees either no file or
a complete one.

Claiming: flock, not rename. Exactly one reader must claim a segment, a
stale descriptor must be able to look at a segment *without* taking it, and
a producer must be able to retire or replace its own unclaimed version
exactly once. The rule that gives all three:

    The segment name is changed (unlinked, renamed away, or replaced by a
    rename) only by a process that holds the exclusive `flock` of the file
    the name currently points at, and has checked under that lock that the
    file is still *at the name* (`stat` of the name shows the inode that
    `fstat` of its descriptor shows).

A reader opens the name, takes the lock *without waiting* (held: answer
BUSY, a receive never waits for another process), validates the frame,
checks the owner is alive, the generation (for a descriptor), decodes the
payload into owned memory, and only then takes the name away: that one step
is the commit, so a reader killed mid-claim leaves the segment claimable by
the next one. A stale descriptor reads the header under the lock and
leaves. The producer's re-put renames onto the name and its retire unlinks
it, each under the lock of the file there (waiting: readers hold it for one
copy), and a file found no longer at the name under the lock means a reader
claimed it first. With rename-to-claim instead, a reader holding a stale
descriptor would have to take the newer segment away before it could see
its generation, and putting it back races with the producer's own retire.

Reuse (hand-back). Making a large file is most of a large put's cost on
tmpfs: fallocate zeroes every page and the first write faults each one into
the new mapping (about 12 ms of a 16 MiB put here), and the reader's unlink
frees them again. So a producer keeps a file of at least `spare_min` bytes
mapped after publishing it (up to `spare_bytes` of them) and writes
RING_STATE_SPARE_WANTED into its header. The reader that claims such a
segment commits by renaming it to the producer's spare name
(``fbspare.<pid>.<start time>.<generation>``) instead of unlinking it (if
that rename fails it unlinks, and the producer forgets the file). A later
put of the same file size renames a spare back to a temporary name (one
process wins that rename), checks it is the inode it kept, and writes into
the mapping it still has: no fallocate, no fresh page. The producer writes
only into a file it took back, and a file leaves a reader's hands only at
its commit, after its last read, so nobody reads what is being rewritten.
A file the producer's own re-put or retire unlinks is forgotten at once;
close removes the spares. Spare names carry the owner, so `shmring gc` and
the last member's close remove those of a killed producer.

Readers never register anything with Python's resource tracker: this module
uses plain open/mmap, never `multiprocessing.shared_memory`.

Budget. A segment is charged `compute_fallback_charge(key, payload_length)`
bytes: what its file occupies on tmpfs, a ring header plus one frame in
whole pages (issue 12: payload bytes undercounted a 1 KiB message 3x), and
a put is admitted exactly when `compute_budget_allows(used, replaced,
charge, budget)` holds, as in
`shmring.spec.connector`. Readers free bytes in another process, so the
producer's `used` can only be too high; before refusing it drops segments a
reader claimed (`refresh`, one stat per segment) and asks again, so it
refuses exactly when the model would.

Every system call goes through the `OsFacade` the caller gives.
"""

from .claim import (
    Claim,
    ClaimStatus,
    MappingKey,
    SegmentMappings,
    claim_segment,
    remove_if_orphaned,
)
from .segment import DEFAULT_SPARE_BYTES, SPARE_MIN_FILE_LENGTH
from .writer import (
    FallbackStatistics,
    FallbackWriter,
    PayloadPlan,
    SegmentRecord,
)

__all__ = [
    "DEFAULT_SPARE_BYTES",
    "SPARE_MIN_FILE_LENGTH",
    "Claim",
    "ClaimStatus",
    "FallbackStatistics",
    "FallbackWriter",
    "MappingKey",
    "PayloadPlan",
    "SegmentMappings",
    "SegmentRecord",
    "claim_segment",
    "remove_if_orphaned",
]
