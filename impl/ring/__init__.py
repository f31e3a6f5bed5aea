"""The ring engine and the host ring: one producer's mmap ring of frames on one edge.

Modules: `results` (what a put or get answers), `mapping` (the shared file
and the pieces both sides use), `engine` (`RingProducer`: the one producer
engine, reserve / commit / reclaim / dead holders, under the host ring and
the registered arena), `producer` (`RingChannel`) and `closing` (how its
ring ends, and a file a neighbour damaged), `frames` (the one header check
and frame walker), `reader` (`RingReader`: scan, index) and `claim` (the
claim step of its get), `borrow` (`Lease`, the one lease, and the one
kept-view guard). The rationale below holds for all of them.

Design rationale. The model (`shmring.spec.ring`) says *what* a ring does;
this module does it over a POSIX shared-memory file that several processes
map. The producer (`RingChannel`) creates and owns the file; readers
(`RingReader`) map it without owning it. Layout numbers come from
`shmring.spec.layout`, decisions (admission, padding, space, prefix match)
from the model's pure helpers, and every header load/store from
`shmring.impl.frame_io`, so the model and this file cannot drift apart on a
number.

Who writes what
---------------
* Only the producer writes frame bytes, head, tail, the wake-up sequence and
  the ring state. It keeps its own record of the frames between tail and
  head (position, length, key), so it never trusts lengths read back from
  shared memory.
* A frame's *state* is the one field several processes write. States only
  move forward: PUBLISHED -> CLAIMED -> DONE, PUBLISHED -> DONE, PUBLISHED ->
  RETIRED; DONE and RETIRED are final. Every change *out of* PUBLISHED (a
  reader's claim, the producer's retire) happens under an exclusive `flock`
  of the ring file, so a frame is claimed or retired exactly once. CLAIMED ->
  DONE is made only by the lease holder and needs no lock.
* Readers take the lock with LOCK_NB and answer BUSY when it is held: a
  receive never waits for another process. The producer may block briefly
  (a reader holds the lock only to check a header and copy one payload).

Publication (why a reader never sees a torn frame, even after SIGKILL)
-----------------------------------------------------------------------
A put writes, in this order: the slot's length field is zeroed; key and
payload bytes (and zero fill); the header fields other than length; the
length (`store_frame_length_release`); then head (`store_head_release`);
then the wake-up sequence. Readers trust only frames that start below the
head they loaded (acquire) *and* have a non-zero, self-consistent length.

* Killed before the head store: head still ends before the new frame, so no
  reader looks at it, whatever state its bytes are in. The zeroed length is
  a second guard for anyone who walks past head: it reads "nothing here".
* Killed after the head store: the frame (and any padding before it) was
  complete, because head is stored after the last byte of both.
* Padding and the frame it precedes are covered by one head store.
Stores become visible in program order (x86-64 TSO; see `frame_io` for the
aarch64 argument), which is all the argument needs.

Reclaim and overwrite (why a lock-free scan never reads recycled bytes)
-----------------------------------------------------------------------
Reclaim advances the tail over DONE, RETIRED and padding frames and stores
the tail *before* the put writes into the space it freed. Any byte of the
frame at position p can only be rewritten as part of position p + capacity
or later, which requires tail > p first. So a reader that reads a frame at
p and *then* loads tail <= p knows no overwrite had begun when it read:
the tail acts as a sequence lock. Readers re-check the tail after every
header they read without the lock and after every header they check under
it; a frame that moved under them is STALE / NOT_FOUND (or the scan restarts
at the new tail), never a false corruption report and never a torn value.
A PUBLISHED or CLAIMED frame is never reclaimed, so once a reader has seen
it PUBLISHED under the lock its bytes stay put until the reader marks it.

Cheap empty polls
-----------------
A reader keeps an index key -> position of the frames it saw PUBLISHED,
built by an incremental lock-free scan from where it stopped last time up to
the head. When head has not moved, a get answers NOT_FOUND or STALE from the
index with one shared-memory load after one fstat (a file a neighbour
truncated is refused before it is touched): no lock. The lock is taken only
to claim a frame the index names.

Validation
----------
Everything read from shared memory (ring header, head and tail, frame
length, type, state, key length, payload length, position, checksum) is
checked before use, and every offset is bounded by the capacity, so a
corrupted file gives `CorruptFrameError` and never a read outside the
mapping. A frame whose checksum fails is retired (so the ring keeps
flowing) and reported.

A channel or reader object is not thread-safe; use one per thread.
"""
