"""Contracts of the model's pure integer and string helpers, for CrossHair.

Each `contract_*` function states preconditions as leading asserts (which
CrossHair reads as preconditions), calls one helper, and states the
postcondition as trailing asserts. CrossHair (`--analysis_kind=asserts`)
explores every path and reports a counterexample if a postcondition can
fail; the test suite and `shmring check` run it time-bounded and require
each contract to be confirmed (every path explored) or at least to have no
counterexample within the budget.

Sizes are bounded to the protocol's ranges so the solver works on what the
ring can actually see.
"""

from __future__ import annotations

from .connector import compute_budget_allows
from .layout import (
    FRAME_ALIGNMENT,
    FRAME_HEADER_LENGTH,
    MAX_KEY_LENGTH,
    MAX_RING_CAPACITY,
    MIN_RING_CAPACITY,
    RING_CAPACITY_ALIGNMENT,
    align,
    compute_frame_length,
)
from .ring import (
    compute_free_space,
    compute_has_space,
    compute_padding,
    is_admitted,
    is_prefix_match,
)

_POSITION_LIMIT = 1 << 48


_MIN_UNITS = MIN_RING_CAPACITY // RING_CAPACITY_ALIGNMENT
_MAX_UNITS = MAX_RING_CAPACITY // RING_CAPACITY_ALIGNMENT


def contract_align(value: int) -> int:
    """align() rounds up to the next multiple of FRAME_ALIGNMENT, never by a whole step."""
    assert 0 <= value < _POSITION_LIMIT
    result = align(value, FRAME_ALIGNMENT)
    assert result % FRAME_ALIGNMENT == 0
    assert value <= result < value + FRAME_ALIGNMENT
    return result


def contract_frame_length(key_length: int, payload_length: int) -> int:
    """A frame holds header, key and payload, aligned, with less than one step of fill."""
    assert 0 <= key_length <= MAX_KEY_LENGTH
    assert 0 <= payload_length < _POSITION_LIMIT
    length = compute_frame_length(key_length, payload_length)
    used = FRAME_HEADER_LENGTH + key_length + payload_length
    assert length % FRAME_ALIGNMENT == 0
    assert used <= length < used + FRAME_ALIGNMENT
    return length


def contract_free_space(capacity_units: int, head: int, used: int) -> int:
    """Free space is between 0 and the capacity, and adds up with the used bytes."""
    assert _MIN_UNITS <= capacity_units <= _MAX_UNITS
    assert 0 <= used <= capacity_units * RING_CAPACITY_ALIGNMENT
    assert used <= head < _POSITION_LIMIT
    capacity = capacity_units * RING_CAPACITY_ALIGNMENT
    free = compute_free_space(capacity, head, head - used)
    assert 0 <= free <= capacity
    assert free + used == capacity
    return free


def contract_padding(capacity_units: int, head_units: int, frame_units: int) -> int:
    """After padding the frame starts where it fits before the end of the region."""
    assert _MIN_UNITS <= capacity_units <= _MAX_UNITS
    assert 0 <= head_units < _POSITION_LIMIT
    assert 0 < frame_units <= capacity_units
    capacity = capacity_units * RING_CAPACITY_ALIGNMENT
    head = head_units * FRAME_ALIGNMENT
    frame = frame_units * FRAME_ALIGNMENT
    padding = compute_padding(capacity, head, frame)
    offset = head % capacity
    assert 0 <= padding < capacity
    assert padding == 0 or padding == capacity - offset
    assert (head + padding) % capacity + frame <= capacity
    # No padding when the frame fits, exact fit included
    assert (padding == 0) == (offset + frame <= capacity)
    return padding


def contract_has_space(
    capacity_units: int, head_units: int, used_units: int, frame_units: int
) -> bool:
    """When there is space, publishing keeps head - tail within the capacity."""
    assert _MIN_UNITS <= capacity_units <= _MAX_UNITS
    assert 0 <= used_units <= capacity_units
    assert used_units <= head_units < _POSITION_LIMIT
    assert 0 < frame_units <= capacity_units
    capacity = capacity_units * RING_CAPACITY_ALIGNMENT
    head = head_units * FRAME_ALIGNMENT
    tail = head - used_units * FRAME_ALIGNMENT
    frame = frame_units * FRAME_ALIGNMENT
    fits = compute_has_space(capacity, head, tail, frame)
    if fits:
        padding = compute_padding(capacity, head, frame)
        assert head + padding + frame - tail <= capacity
    return fits


def contract_admission(capacity_units: int, key_length: int, payload_length: int) -> bool:
    """An admitted frame is at most a quarter of the ring and its key fits the header."""
    assert capacity_units == 0 or _MIN_UNITS <= capacity_units <= _MAX_UNITS
    assert 0 <= key_length < 2 * MAX_KEY_LENGTH
    assert 0 <= payload_length < _POSITION_LIMIT
    capacity = capacity_units * RING_CAPACITY_ALIGNMENT
    frame = compute_frame_length(key_length, payload_length)
    admitted = is_admitted(capacity, key_length, frame)
    if admitted:
        assert capacity > 0
        assert key_length <= MAX_KEY_LENGTH
        assert 4 * frame <= capacity
    return admitted


def contract_prefix_match(prefix: str, key: str) -> bool:
    """A prefix match is the prefix followed by one or more ASCII digits, nothing else."""
    assert len(prefix) <= 6 and len(key) <= 10
    matched = is_prefix_match(prefix, key)
    rest = key[len(prefix) :]
    digits = rest != "" and all(c in "0123456789" for c in rest)
    assert matched == (key.startswith(prefix) and digits)
    return matched


def contract_budget(used: int, replaced: int, length: int, budget: int) -> bool:
    """A segment is allowed exactly when the live bytes stay within the budget."""
    assert 0 <= replaced <= used <= budget < _POSITION_LIMIT
    assert 0 <= length < _POSITION_LIMIT
    allowed = compute_budget_allows(used, replaced, length, budget)
    assert allowed == (used - replaced + length <= budget)
    return allowed


CONTRACTS = (
    contract_align,
    contract_frame_length,
    contract_free_space,
    contract_padding,
    contract_has_space,
    contract_admission,
    contract_prefix_match,
    contract_budget,
)
