"""Invariants of the model, one `check_*` function each.

Every invariant is also written as a comment on the field it governs. Tests
call these after every step (model alone, and model next to the
implementation); the bounded explorer calls them on every reachable state.
A violated invariant raises `InvariantViolation` naming the invariant and the
values that broke it.
"""

from __future__ import annotations

from collections import Counter

from .cohort import CohortMember, get_payload
from .connector import ConnectorState, PoolRef, compute_fallback_charge
from .discovery import DeploymentState, DirectoryState, get_candidates
from .index import ReaderIndex, get_index_answer
from .layout import (
    ADMISSION_DIVISOR,
    DATA_FRAME_TYPE,
    FRAME_ALIGNMENT,
    FRAME_STATE_DONE,
    PADDING_FRAME_TYPE,
    compute_frame_length,
    compute_slot_capacity,
)
from .pool import (
    PoolState,
    SlotState,
    compute_slot_charge,
    is_holder_alive,
    is_power_of_two,
)
from .producers import ProducerId, is_delivering
from .ring import (
    RingState,
    compute_key_length,
    get_deliverable_frame,
    get_frame_at,
    is_deliverable,
    is_valid_capacity,
)


class InvariantViolation(AssertionError):
    """An invariant of the model does not hold."""


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise InvariantViolation(message)


# -- ring ------------------------------------------------------------------


# The ring's checks run after every step of the ring, arena and connector
# machines (on every frame of every ring), so they format a message only when
# the check fails; `_require` takes one already formatted.


def check_ring_positions(ring: RingState) -> None:
    """tail <= head and head - tail <= capacity; positions never negative."""
    if not is_valid_capacity(ring.capacity):
        raise InvariantViolation(f"invalid capacity: capacity={ring.capacity}")
    if not 0 <= ring.tail <= ring.head:
        raise InvariantViolation(f"tail after head: tail={ring.tail} head={ring.head}")
    if ring.head - ring.tail > ring.capacity:
        raise InvariantViolation(
            f"ring over capacity: head={ring.head} tail={ring.tail} capacity={ring.capacity}"
        )


def check_ring_frames_tile(ring: RingState) -> None:
    """Unreclaimed frames tile [tail, head) with aligned lengths; none crosses the end."""
    capacity = ring.capacity
    limit = capacity // ADMISSION_DIVISOR
    position = ring.tail
    for frame in ring.frames:
        if frame.position != position:
            raise InvariantViolation(
                f"gap or overlap at position={position}: frame at {frame.position}"
            )
        if not (frame.length > 0 and frame.length % FRAME_ALIGNMENT == 0):
            raise InvariantViolation(
                f"unaligned frame length={frame.length} at position={frame.position}"
            )
        offset = frame.position % capacity
        if offset + frame.length > capacity:
            raise InvariantViolation(
                f"frame crosses the end of the data region: position={frame.position} "
                f"length={frame.length} capacity={capacity}"
            )
        if frame.frame_type == PADDING_FRAME_TYPE:
            if offset + frame.length != capacity:
                raise InvariantViolation(
                    f"padding does not end at the data region's end: position={frame.position}"
                )
            if frame.state != FRAME_STATE_DONE:
                raise InvariantViolation("padding frame not done")
        else:
            if frame.frame_type != DATA_FRAME_TYPE:
                raise InvariantViolation(f"unknown frame type={frame.frame_type}")
            expected = compute_frame_length(compute_key_length(frame.key), frame.payload_length)
            if frame.length != expected:
                raise InvariantViolation(
                    f"frame length={frame.length} differs from computed length={expected}"
                )
            if frame.length > limit:
                raise InvariantViolation(
                    f"frame larger than the admission limit: length={frame.length}"
                )
        position += frame.length
    if position != ring.head:
        raise InvariantViolation(f"frames end at {position}, head is {ring.head}")


def check_ring_one_version_per_key(ring: RingState) -> None:
    """A key has at most one deliverable frame."""
    keys = [frame.key for frame in ring.frames if is_deliverable(frame)]
    if len(set(keys)) != len(keys):
        repeated = sorted(key for key, count in Counter(keys).items() if count > 1)
        raise InvariantViolation(f"keys with more than one deliverable version: {repeated}")


def check_ring_closed_holds_nothing(ring: RingState) -> None:
    """A closed ring has no deliverable frame."""
    if ring.closed:
        live = [frame.key for frame in ring.frames if is_deliverable(frame)]
        _require(not live, f"closed ring still delivers keys={live}")


def check_ring(ring: RingState) -> None:
    check_ring_positions(ring)
    check_ring_frames_tile(ring)
    check_ring_one_version_per_key(ring)
    check_ring_closed_holds_nothing(ring)


# -- a reader's index of a ring (spec.index) ----------------------------------


def check_reader_index(ring: RingState, index: ReaderIndex) -> None:
    """The index is a derived view of the ring: sound, complete below `scanned_to`, bounded.

    * It never passes the head, and holds no entry at or above `scanned_to`.
    * An entry at or above the tail names a data frame of its key starting
      exactly there (one below the tail is stale: allowed, never answered).
    * Sound: what it answers for a key is the key's deliverable frame or
      nothing (`get_index_answer`); never a frame the model would not deliver.
    * Complete: every deliverable frame starting below `scanned_to` is its
      key's entry (the reader never misses a frame it has seen).
    * Bounded: no more entries than data frames the ring holds, plus the
      stale ones below the tail (at most the frames the ring held at the scan).
    """
    scanned_to = index.scanned_to
    if not 0 <= scanned_to <= ring.head:
        raise InvariantViolation(
            f"index scanned past the head: scanned_to={scanned_to} head={ring.head}"
        )
    for key, position in index.entries.items():
        if position >= scanned_to:
            raise InvariantViolation(
                f"index entry not yet seen: key={key!r} position={position} scanned_to={scanned_to}"
            )
        if position >= ring.tail:
            frame = get_frame_at(ring, position)
            if frame is None or frame.frame_type != DATA_FRAME_TYPE or frame.key != key:
                raise InvariantViolation(
                    f"index entry names no frame of its key: key={key!r} position={position} "
                    f"found={frame}"
                )
        answer = get_index_answer(ring, index, key)
        if answer is not None and answer is not get_deliverable_frame(ring, key):
            raise InvariantViolation(
                f"index answers a frame the model would not deliver: key={key!r} "
                f"position={answer.position}"
            )
    for frame in ring.frames:
        if frame.position >= scanned_to:
            break
        if is_deliverable(frame) and index.entries.get(frame.key) != frame.position:
            raise InvariantViolation(
                f"index misses a frame it has seen: key={frame.key!r} position={frame.position} "
                f"entry={index.entries.get(frame.key)} scanned_to={scanned_to}"
            )
    live = sum(1 for frame in ring.frames if frame.frame_type == DATA_FRAME_TYPE)
    stale = sum(1 for position in index.entries.values() if position < ring.tail)
    if len(index.entries) - stale > live:
        raise InvariantViolation(
            f"index larger than the ring: entries={len(index.entries)} stale={stale} frames={live}"
        )


# -- connector ---------------------------------------------------------------


def check_connector_routes(conn: ConnectorState) -> None:
    """Rings only where usable; an (edge, key) is deliverable on one route at most."""
    if conn.ring_capacity == 0:
        _require(not conn.rings, f"disabled ring capacity but rings={sorted(conn.rings)}")
    both = sorted(set(conn.rings) & conn.failed_edges)
    _require(not both, f"edges both failed and set up: {both}")
    for (edge, key), segment in conn.fallback.items():
        _require(
            (segment.edge, segment.key) == (edge, key), f"segment filed under the wrong key={key}"
        )
        ring = conn.rings.get(edge)
        if ring is not None:
            live = [f for f in ring.frames if f.key == key and is_deliverable(f)]
            _require(not live, f"key={key!r} on edge={edge} deliverable on ring and fallback")


def check_connector_budget(conn: ConnectorState) -> None:
    """fallback_bytes is the sum of live segments and never exceeds the budget."""
    total = sum(segment.length for segment in conn.fallback.values())
    _require(
        conn.fallback_bytes == total,
        f"fallback_bytes={conn.fallback_bytes} but segments sum to {total}",
    )
    _require(
        conn.fallback_bytes <= conn.fallback_budget,
        f"fallback over budget: bytes={conn.fallback_bytes} budget={conn.fallback_budget}",
    )
    for segment in conn.fallback.values():
        expected = compute_fallback_charge(segment.key, segment.payload_length)
        _require(segment.length == expected, f"segment length={segment.length} expected={expected}")
        _require(
            segment.generation < conn.next_generation,
            f"generation={segment.generation} not below next={conn.next_generation}",
        )


def check_connector_health(conn: ConnectorState) -> None:
    """Every accepted put went one way; ring gets are gets."""
    h = conn.health
    _require(
        h.puts == h.ring_puts + h.fallbacks + h.pool_puts,
        f"puts={h.puts} != ring {h.ring_puts} + fallback {h.fallbacks} + pool {h.pool_puts}",
    )
    _require(0 <= h.ring_gets <= h.gets, f"ring_gets={h.ring_gets} gets={h.gets}")
    _require(
        h.ring_gets + h.pool_gets <= h.gets, f"ring+pool gets > gets={h.gets}: pool={h.pool_gets}"
    )
    _require(h.gets <= h.puts, f"more gets={h.gets} than puts={h.puts}")


def check_connector_closed(conn: ConnectorState) -> None:
    if conn.closed:
        _require(not conn.fallback, f"closed connector holds segments={sorted(conn.fallback)}")
        for ring in conn.rings.values():
            _require(ring.closed, "closed connector with an open ring")


def check_connector_pool(conn: ConnectorState) -> None:
    """The pool's invariants; a pending carrier names a slot that is PUBLISHED or being read."""
    pool = conn.pool
    if pool is None:
        _require(not conn.carriers, f"carriers={sorted(conn.carriers)} without a pool")
        return
    check_pool(pool)
    for index, (edge, position) in conn.carriers.items():
        _require(index in pool.slots, f"carrier of a removed slot={index}")
        ring = conn.rings.get(edge)
        frame = get_frame_at(ring, position) if ring is not None else None
        if frame is not None and is_deliverable(frame):
            slot = pool.slots[index]
            _require(
                slot.carrier_pending
                and get_payload(frame.payload) == PoolRef(index, slot.generation),
                f"deliverable carrier at position={position} names slot={index} "
                f"generation={slot.generation} state={slot.state}",
            )
            _require(
                slot.state is SlotState.PUBLISHED,
                f"deliverable carrier of slot={index} in state={slot.state}",
            )


def check_connector_cohorts(conn: ConnectorState) -> None:
    """An open cohort is numbered past the committed ones; no member names a later cohort."""
    for edge, gate in conn.cohorts.gates.items():
        _require(
            (gate.depth == 0) == (gate.open_number == 0),
            f"cohort of {edge}: depth={gate.depth} open_number={gate.open_number}",
        )
        _require(
            gate.open_number == 0 or gate.open_number == gate.committed + 1,
            f"cohort of {edge}: open_number={gate.open_number} committed={gate.committed}",
        )
    if conn.closed:
        open_edges = sorted(edge for edge, gate in conn.cohorts.gates.items() if gate.depth)
        _require(not open_edges, f"closed with cohorts open on {open_edges}")
        return
    deliverable: list[tuple[tuple[str, str], object]] = [
        (edge, frame.payload)
        for edge, ring in conn.rings.items()
        for frame in ring.frames
        if is_deliverable(frame)
    ]
    deliverable += [(segment.edge, segment.payload) for segment in conn.fallback.values()]
    for edge, payload in deliverable:
        if isinstance(payload, CohortMember):
            member_gate = conn.cohorts.gates.get(edge)
            last = 0 if member_gate is None else max(member_gate.committed, member_gate.open_number)
            _require(
                payload.number <= last,
                f"member of cohort {payload.number} on {edge} past the gate's last={last}",
            )


def check_connector(conn: ConnectorState) -> None:
    for ring in conn.rings.values():
        check_ring(ring)
    check_connector_pool(conn)
    check_connector_routes(conn)
    check_connector_budget(conn)
    check_connector_health(conn)
    check_connector_closed(conn)
    check_connector_cohorts(conn)


# -- pool --------------------------------------------------------------------


def check_pool(pool: PoolState) -> None:
    """Bytes within budget and summed; indices and generations below their counters."""
    total = sum(compute_slot_charge(slot.size_class) for slot in pool.slots.values())
    _require(
        pool.used_bytes == total, f"pool used_bytes={pool.used_bytes} but slots sum to {total}"
    )
    _require(
        pool.used_bytes <= pool.budget,
        f"pool over budget: used={pool.used_bytes} budget={pool.budget}",
    )
    if pool.closed:
        _require(not pool.slots, f"closed pool holds slots={sorted(pool.slots)}")
    for index, slot in pool.slots.items():
        _require(slot.index == index, f"slot filed under index={index} names {slot.index}")
        _require(index < pool.next_index, f"slot index={index} not below {pool.next_index}")
        _require(
            slot.generation < pool.next_generation,
            f"slot generation={slot.generation} not below {pool.next_generation}",
        )
        size_class = slot.size_class
        _require(
            is_power_of_two(size_class) and pool.min_class <= size_class <= pool.max_class,
            f"slot class={size_class} outside the classes",
        )
        capacity = compute_slot_capacity(size_class)
        _require(
            slot.payload_length <= capacity,
            f"slot={index} payload_length={slot.payload_length} > capacity={capacity}",
        )
        if slot.state is SlotState.FREE:
            _require(not slot.carrier_pending, f"free slot={index} with a pending carrier")
        if slot.state in (SlotState.CLAIMED, SlotState.DONE):
            _require(slot.holder is not None, f"slot={index} {slot.state} without a holder")
        if slot.state is SlotState.PUBLISHED:
            _require(slot.generation > 0, f"published slot={index} without a generation")


def check_pool_step(before: PoolState, after: PoolState) -> None:
    """A slot that may still be read is never rewritten: same generation and payload."""
    for index, old in before.slots.items():
        new = after.slots.get(index)
        may_be_read = old.carrier_pending or (
            old.state is SlotState.CLAIMED and is_holder_alive(before, old.holder)
        )
        if not may_be_read:
            continue
        _require(new is not None, f"slot={index} removed while it may be read")
        assert new is not None
        _require(
            (new.generation, new.payload, new.payload_length)
            == (old.generation, old.payload, old.payload_length),
            f"slot={index} rewritten while it may be read: generation "
            f"{old.generation} -> {new.generation}",
        )


# -- producers and discovery -------------------------------------------------


def check_markers_follow_rings(dep: DeploymentState) -> None:
    """A marker exists only for a ready ring of a producer that has not closed."""
    for identity, edge in dep.directory.markers:
        producer = dep.producers.get(identity)
        _require(producer is not None, f"marker of unknown producer={identity}")
        assert producer is not None
        _require(not producer.closed, f"closed producer={identity} still has a marker")
        _require(
            edge in producer.connector.rings,
            f"marker before ring ready: producer={identity} edge={edge}",
        )


def check_receivers_behind_stamp(dep: DeploymentState) -> None:
    """A receiver never caches a stamp the directory has not reached."""
    for name, receiver in dep.receivers.items():
        if receiver.seen_stamp is not None:
            _require(
                receiver.seen_stamp <= dep.directory.stamp,
                f"receiver={name} seen_stamp={receiver.seen_stamp} ahead of stamp={dep.directory.stamp}",
            )
        _require(
            receiver.scans <= dep.directory.stamp + 1,
            f"receiver={name} scanned more than the stamp moved",
        )


def check_dead_producers_undeliverable(dep: DeploymentState) -> None:
    """No receiver can be served a frame of a producer that is not alive."""
    dead: list[ProducerId] = [p for p, s in dep.producers.items() if not is_delivering(s)]
    for identity in dead:
        connector = dep.producers[identity].connector
        keys = [
            (edge, f.key)
            for edge, ring in connector.rings.items()
            for f in ring.frames
            if is_deliverable(f)
        ]
        keys += list(connector.fallback)
        for name, receiver in dep.receivers.items():
            for edge, key in keys:
                served = [p for p, _ in get_candidates(dep, receiver, edge, key)]
                _require(
                    identity not in served,
                    f"receiver={name} could be served dead producer={identity} key={key!r}",
                )


def check_files_of_known_producers(dep: DeploymentState) -> None:
    """Files belong to producers of the deployment; a closed producer left none."""
    for identity in dep.directory.files:
        producer = dep.producers.get(identity)
        _require(producer is not None, f"files of unknown producer={identity}")
        assert producer is not None
        _require(not producer.closed, f"closed producer={identity} still has files")


def check_reclaimed_after_scan(dep: DeploymentState) -> None:
    """After a reclaim (every scan does one) no file of a dead producer remains."""
    dead = sorted(p for p in dep.directory.files if not dep.producers[p].alive)
    _require(not dead, f"files of dead producers remain after reclaim: {dead}")


def check_reclaim_step(before: DeploymentState, after: DeploymentState) -> None:
    """Across one transition: a reclaim never removes a live producer's files."""
    for identity in before.directory.files - after.directory.files:
        producer = after.producers[identity]
        _require(
            not producer.alive,
            f"files of live producer={identity} were removed",
        )


def check_stamp_step(before: DirectoryState, after: DirectoryState) -> None:
    """Across one transition: the stamp never goes back, and moves whenever markers change."""
    _require(after.stamp >= before.stamp, f"stamp went back: {before.stamp} -> {after.stamp}")
    if after.markers != before.markers:
        _require(after.stamp > before.stamp, f"markers changed but stamp stayed {after.stamp}")


def check_deployment(dep: DeploymentState) -> None:
    for producer in dep.producers.values():
        check_connector(producer.connector)
    check_markers_follow_rings(dep)
    check_receivers_behind_stamp(dep)
    check_dead_producers_undeliverable(dep)
    check_files_of_known_producers(dep)


# -- registration (registered transfer path) ---------------------------------
# Imported here so the ring part above reads on its own.

from .layout import FRAME_STATE_CLAIMED as _FRAME_STATE_CLAIMED  # noqa: E402
from .leases import SOURCE_ARENA_FRAME, LeaseTable  # noqa: E402
from .registration import (  # noqa: E402
    CUDA_SUCCESS,
    DRIVER_CALLS,
    REGISTERED_STATES,
    SEGMENT_PUBLISHED,
    SEGMENT_REMOVED,
    SEGMENT_RETAINED,
    SEGMENT_STATES,
    DriverState,
    RegistryState,
    is_overlapping,
)


def check_registration_driver(driver: DriverState) -> None:
    """Registered ranges are non-empty and never overlap; faults are well formed."""
    ranges = sorted(driver.ranges.items())
    for start, length in ranges:
        _require(length > 0, f"empty registered range at address={start:#x}")
    for (start_a, length_a), (start_b, length_b) in zip(ranges, ranges[1:], strict=False):
        _require(
            not is_overlapping(start_a, length_a, start_b, length_b),
            f"overlapping registered ranges: {start_a:#x}+{length_a} and {start_b:#x}+{length_b}",
        )
    for fault in driver.faults:
        _require(
            fault.call is None or fault.call in DRIVER_CALLS, f"fault on unknown call={fault.call}"
        )
        _require(fault.error != CUDA_SUCCESS, "a fault that answers cudaSuccess")
        _require(
            fault.nth >= 0 and fault.seen >= 0,
            f"fault counters negative: nth={fault.nth} seen={fault.seen}",
        )


def check_registration_segments(registry: RegistryState) -> None:
    """Bookkeeping, mapping and name agree with each segment's lifecycle state."""
    for segment in registry.segments.values():
        sid = segment.segment_id
        _require(segment.state in SEGMENT_STATES, f"segment={sid} in unknown state={segment.state}")
        _require(segment.length > 0, f"segment={sid} has length={segment.length}")
        _require(
            segment.registered == (segment.state in REGISTERED_STATES),
            f"segment={sid} state={segment.state} but registered={segment.registered}",
        )
        if segment.registered:
            # Never closed or unlinked while the driver may hold it.
            _require(
                segment.mapped and segment.linked,
                f"registered segment={sid} mapped={segment.mapped} linked={segment.linked}",
            )
        if segment.state == SEGMENT_REMOVED:
            _require(
                not segment.mapped and not segment.linked,
                f"removed segment={sid} still mapped={segment.mapped} linked={segment.linked}",
            )
        if segment.state == SEGMENT_PUBLISHED:
            _require(not segment.mapped, f"published segment={sid} still mapped by the producer")
            _require(segment.copied, f"published segment={sid} was never copied into")


def check_registration_driver_agrees(registry: RegistryState) -> None:
    """The driver holds a segment's range only while the bookkeeping says registered."""
    for segment in registry.segments.values():
        if segment.address in registry.driver.ranges:
            _require(
                segment.registered,
                f"driver holds segment={segment.segment_id} (state={segment.state}) "
                "but the registry cleared its bookkeeping",
            )


def check_registration_poison(registry: RegistryState) -> None:
    """A retained segment poisons the registry; an open poisoned registry retains one."""
    retained = [s.segment_id for s in registry.segments.values() if s.state == SEGMENT_RETAINED]
    if retained:
        _require(registry.poisoned, f"segments={retained} retained but registry not poisoned")
    if registry.poisoned and not registry.closed:
        _require(bool(retained), "registry poisoned with no retained segment")
    _require(
        all(sid < registry.next_segment_id for sid in registry.segments),
        f"segment id at or past next_segment_id={registry.next_segment_id}",
    )


def check_registration(registry: RegistryState) -> None:
    check_registration_driver(registry.driver)
    check_registration_segments(registry)
    check_registration_driver_agrees(registry)
    check_registration_poison(registry)


# -- leases (borrowed views) -------------------------------------------------


def check_leases_views(table: LeaseTable) -> None:
    """Every live view holds a live lease that counts it; a lease ends with its last view."""
    for view_id, view in table.views.items():
        _require(
            view.lease_id in table.leases, f"view={view_id} holds unknown lease={view.lease_id}"
        )
        lease = table.leases[view.lease_id]
        _require(not lease.released, f"view={view_id} alive but lease={lease.lease_id} released")
        _require(
            view_id in lease.live_views, f"lease={lease.lease_id} does not count view={view_id}"
        )
    for lease in table.leases.values():
        for view_id in lease.live_views:
            _require(view_id in table.views, f"lease={lease.lease_id} counts dead view={view_id}")
        _require(
            lease.released == (not lease.live_views),
            f"lease={lease.lease_id} released={lease.released} with live views={sorted(lease.live_views)}",
        )


def check_leases_released_once(table: LeaseTable) -> None:
    """Each lease is released at most once, and the order records exactly the released ones."""
    order = table.released_order
    _require(len(order) == len(set(order)), f"a lease released twice: order={order}")
    released = {lease.lease_id for lease in table.leases.values() if lease.released}
    _require(
        set(order) == released, f"release order={order} differs from released={sorted(released)}"
    )


def check_leases_one_per_frame(table: LeaseTable) -> None:
    """No two live leases hold the same arena frame."""
    positions = [
        lease.position
        for lease in table.leases.values()
        if not lease.released and lease.source == SOURCE_ARENA_FRAME
    ]
    repeated = sorted({p for p in positions if positions.count(p) > 1 and p is not None})
    _require(not repeated, f"arena frames leased twice: positions={repeated}")


def check_leases(table: LeaseTable) -> None:
    check_leases_views(table)
    check_leases_released_once(table)
    check_leases_one_per_frame(table)


def check_leases_against_ring(table: LeaseTable, ring: RingState) -> None:
    """A frame is claimed in the ring exactly while one live lease holds it."""
    live = {
        lease.position
        for lease in table.leases.values()
        if not lease.released and lease.source == SOURCE_ARENA_FRAME
    }
    claimed = {
        frame.position
        for frame in ring.frames
        if frame.frame_type == DATA_FRAME_TYPE and frame.state == _FRAME_STATE_CLAIMED
    }
    _require(
        live == claimed,
        f"leased positions={sorted(p for p in live if p is not None)} "
        f"differ from claimed frames={sorted(claimed)}",
    )


# -- borrowed gets (spec.borrowing) ---------------------------------------------

from .borrowing import BorrowState, get_claimed_frames  # noqa: E402
from .leases import SOURCE_RING_FRAME  # noqa: E402


def check_borrows(conn: ConnectorState, borrows: BorrowState) -> None:
    """A ring frame is CLAIMED exactly while a live borrowed lease holds it.

    (Every lease-mode claim of a connector is a borrowed get's.) The lease
    table keeps its own rules: views hold live leases, each released once.
    """
    check_leases_views(borrows.table)
    check_leases_released_once(borrows.table)
    live_frames = {
        lease.lease_id
        for lease in borrows.table.leases.values()
        if not lease.released and lease.source == SOURCE_RING_FRAME
    }
    _require(
        set(borrows.frames) == live_frames,
        f"ring-frame leases={sorted(live_frames)} differ from held frames={sorted(borrows.frames)}",
    )
    for edge, ring in sorted(conn.rings.items()):
        claimed = sorted(
            frame.position
            for frame in ring.frames
            if frame.frame_type == DATA_FRAME_TYPE and frame.state == _FRAME_STATE_CLAIMED
        )
        held = get_claimed_frames(borrows, edge)
        _require(claimed == held, f"edge={edge}: claimed frames={claimed} but borrowed={held}")
