"""What an operation answers: one status vocabulary for every level and route.

Issue 23: the ring, the pool, the fallback, the connector and the
deployment each had their own enum for the same answers (two `GetStatus`,
two `ClaimStatus`, a fallback's OWNER_GONE that the connector mapped to
PRODUCER_GONE). Now every model step and every implementation returns
these two enums; the old names (`spec.ring.GetStatus`,
`spec.connector.ConnectorGetStatus`, `spec.discovery.DeploymentGetStatus`,
`spec.pool.ClaimStatus`, `impl.ring.results.ReceiveStatus`,
`impl.fallback.claim.ClaimStatus`, the connector's `GetStatus`) are this
module's enums under another name, so a status compares by identity across
levels, and the public API (`shmring.GetStatus`, `shmring.PutStatus`)
re-exports them. vllm-omni's shapes (a value or None, a dict) are the
compatibility facade's one table (`impl.compat`), not another enum.

Which level answers which member is each step's docstring; BUSY is the
implementation's only addition to the model's answers (another process
holds a lock: nothing changed, the model's step did not run).
"""

from __future__ import annotations

import enum


class GetStatus(enum.Enum):
    """What a get or claim found (ring, pool slot, fallback segment, connector, deployment)."""

    DELIVERED = "delivered"  # claimed by this get, exactly once; the payload is the caller's
    NOT_FOUND = "not found"  # no deliverable version of the key
    STALE = "stale"  # the descriptor's frame or segment is gone or superseded
    PRODUCER_GONE = "producer gone"  # its producer exited or closed (a segment of it is removed)
    CORRUPT = "corrupt"  # a pool reference naming no slot, another generation or a bad state
    BUSY = "busy"  # another process holds the lock; nothing changed, retry later
    CLOSED = "closed"  # this connector was closed


class PutStatus(enum.Enum):
    """What a put answered: the ring's answers, then the connector's."""

    PUBLISHED = "published"  # the frame is on the ring
    NOT_ADMITTED = "not admitted"  # too large for this ring (or ring disabled): use the fallback
    FULL = "full"  # admissible but no space now: use the fallback
    CLOSED = "closed"  # the ring (or the connector) was closed
    ACCEPTED = "accepted"  # the connector carried it: on the ring, in a pool slot or a segment
    REFUSED = "refused"  # back-pressure: the fallback budget is spent
