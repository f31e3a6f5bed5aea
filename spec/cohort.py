"""Publication cohorts: the puts of one edge that become visible together, or never.

A producer opens a cohort on an edge (vllm-omni's ``publication_cohort``:
the outputs of one model step), puts several keys, and commits it. The
rule, for every receiver and every route (ring frame, pool slot, fallback
segment):

* inside the cohort (opened, not yet committed) none of its puts is
  deliverable: a get by key or by descriptor answers NOT_FOUND (not STALE:
  the descriptor will be good once the cohort commits);
* the commit makes every one of them deliverable at once (one step);
* a producer that dies inside the cohort never commits it, so none of
  them is ever delivered (`spec.producers`: a dead producer's frames are
  never delivered anyway).

Cohorts are numbered per edge (1, 2, ...). A put inside cohort n stores its
payload as a `CohortMember` of n; a member is deliverable once the edge's
`committed` number reaches n. Opening a cohort while one is open on the
same edge joins it (`depth`): only the outermost commit publishes. Nothing
else changes inside a cohort: routing, re-put (the older version is retired
at once), cancel and close follow `spec.connector` as always. The stored
payload of a member is `COHORT_ENVELOPE_LENGTH` bytes longer (the
implementation's envelope carries the number: `spec.layout`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .layout import COHORT_ENVELOPE_LENGTH

Edge = tuple[str, str]  # (source stage, destination stage)

# -- state -------------------------------------------------------------------


@dataclass
class CohortGate:
    """One edge's cohorts, as its producer numbers them."""

    committed: int = 0  # members of cohorts numbered <= committed are visible; never decreases
    open_number: int = 0  # the cohort open now (> committed), or 0 when none is open
    depth: int = 0  # nested opens of the open cohort; 0 exactly when open_number == 0


@dataclass(frozen=True)
class CohortMember:
    """A payload put inside cohort `number` (the payload token is `payload`)."""

    number: int
    payload: object


@dataclass
class CohortTable:
    """A producer's cohort gates, by edge."""

    gates: dict[Edge, CohortGate] = field(default_factory=dict)


# -- predicates and accessors --------------------------------------------------


def is_open(table: CohortTable, edge: Edge) -> bool:
    """Whether a cohort is open on `edge` (puts there are members)."""
    gate = table.gates.get(edge)
    return gate is not None and gate.depth > 0


def is_pending(table: CohortTable, edge: Edge, payload: object) -> bool:
    """Whether `payload` (a stored payload token) is a member of a cohort not yet committed."""
    if not isinstance(payload, CohortMember):
        return False
    gate = table.gates.get(edge)
    return gate is None or payload.number > gate.committed


def get_payload(payload: object) -> object:
    """The payload token a stored payload carries (a member's own payload)."""
    return payload.payload if isinstance(payload, CohortMember) else payload


def compute_stored_length(table: CohortTable, edge: Edge, payload_length: int) -> int:
    """Bytes a put of `payload_length` encoded bytes stores on `edge` (members carry the envelope)."""
    # Verify the payload length is a byte count
    assert payload_length >= 0
    return payload_length + COHORT_ENVELOPE_LENGTH if is_open(table, edge) else payload_length


def compute_stored_payload(table: CohortTable, edge: Edge, payload: object) -> object:
    """What a put stores on `edge`: a `CohortMember` while a cohort is open there."""
    gate = table.gates.get(edge)
    if gate is None or gate.depth == 0:
        return payload
    return CohortMember(gate.open_number, payload)


# -- transitions ---------------------------------------------------------------


def process_cohort_open(table: CohortTable, edge: Edge) -> int:
    """Open a cohort on `edge` (or join the one open there); answer its number."""
    gate = table.gates.setdefault(edge, CohortGate())
    if gate.depth == 0:
        gate.open_number = gate.committed + 1
    gate.depth += 1
    return gate.open_number


def process_cohort_commit(table: CohortTable, edge: Edge) -> bool:
    """Leave the open cohort of `edge`; the outermost leave commits it. Answers whether it did."""
    gate = table.gates.get(edge)
    # Verify a cohort is open on the edge
    assert gate is not None and gate.depth > 0
    gate.depth -= 1
    if gate.depth:
        return False
    gate.committed = gate.open_number
    gate.open_number = 0
    return True


def process_cohort_close(table: CohortTable) -> None:
    """The producer closed: no cohort stays open (its members were retired with everything)."""
    for gate in table.gates.values():
        gate.depth = 0
        gate.open_number = 0


__all__ = [
    "CohortGate",
    "CohortMember",
    "CohortTable",
    "compute_stored_length",
    "compute_stored_payload",
    "get_payload",
    "is_open",
    "is_pending",
    "process_cohort_close",
    "process_cohort_commit",
    "process_cohort_open",
]
