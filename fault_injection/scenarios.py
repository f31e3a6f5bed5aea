"""Fault scenarios: short, deterministic runs of the transport that a plan can break.

Design rationale. A campaign fails call N of some site and runs a scenario;
the scenario must therefore make the same calls in the same order every
time (no clocks, no randomness, no other processes), so "call N" names one
place. Each scenario is a function of an `Env` (the faulty OS seam, the
faulty CUDA driver, a fresh scope, borrowed producer identities) that:

1. runs its operations while faults may fire, comparing every answer with
   the model (`lockstep.Deployment` for connectors, `spec.ring` for the
   arena, `spec.registration` for registered transfers) and accepting only
   documented errors;
2. calls `env.disarm()`: from here on nothing fails, and the calls counted
   so far are the ones a plan can target;
3. checks that the state the faults left agrees with the model, drains
   (every version the model holds is delivered exactly once, byte for
   byte), and closes everything, which must now succeed.

The campaign checks resources (files, descriptors, mappings, locks,
registrations) around the call. A scenario raises `ScenarioFailure` (an
AssertionError) naming the broken promise.

Scenarios, in `SCENARIOS` order: ring traffic with wraparound; fallback
traffic (too large, full ring, budget refusals, re-puts across routes);
fallback files kept for reuse (hand-back, reuse, replacement, close);
discovery with several producers (one of them dead); close; restart (a
closed and a dead producer's keys reused by a new one); the last three
again with a pool at every producer (`*_pool`: the same operations, the
model's `spec.pool` deciding which large puts take a slot); registered
transfer (per-transfer segments, CUDA driver); registered arena with leases.
"""

from __future__ import annotations

import contextlib
import os
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

from ..impl.liveness import is_liveness_file_name
from ..impl.names import (
    DEFAULT_SHM_ROOT,
    MEMBERS_FILE_NAME,
    STAMP_FILE_NAME,
    deployment_directory,
    parse_pool_slot_file_name,
)
from ..spec.layout import MIN_POOL_CLASS
from ..spec.pool import compute_slot_charge
from .identities import Identities
from .kit.payloads import tagged_payload
from .kit.seams import FaultyOs
from .lockstep import (
    DOCUMENTED_ERRORS,
    Deployment,
    Ledger,
    ScenarioFailure,
    require,
)
from .plans import FaultyCudaDriver
from .sites import MODE_PERSISTENT

Edge = tuple[str, str]
EDGE: Final = ("enc", "dec")
OTHER_EDGE: Final = ("dec", "out")
SMALL_CAPACITY: Final = 4096  # the smallest ring: frames up to 1 KiB, wraps after a few
# The pool scenario's pool: one class of the smallest slot, room for two slots.
POOL_CONFIG: Final = (MIN_POOL_CLASS, MIN_POOL_CLASS, 2 * compute_slot_charge(MIN_POOL_CLASS))


@dataclass
class Env:
    """What a scenario runs against."""

    scope: str
    os: FaultyOs
    driver: FaultyCudaDriver
    identities: Identities
    shm_root: str = DEFAULT_SHM_ROOT
    reached: Counter[str] = field(default_factory=Counter)  # calls per site before disarm
    disarmed: bool = False

    @property
    def directory(self) -> str:
        return deployment_directory(self.scope, self.shm_root)

    def armed(self) -> bool:
        return not self.disarmed

    def disarm(self) -> None:
        """Faults stop here; the calls counted so far are the ones a plan may target."""
        if self.disarmed:
            return
        self.disarmed = True
        self.os.armed = False
        self.driver.armed = False
        self.reached = Counter(self.os.counts) + Counter(self.driver.counts)

    def fault_hit(self) -> bool:
        return bool(self.os.hits or self.driver.hits)

    def persistent(self) -> bool:
        plan = self.os.plan or self.driver.plan
        return plan is not None and plan.mode == MODE_PERSISTENT


@dataclass(frozen=True)
class Outcome:
    """What one scenario run did (the cell's record)."""

    scenario: str
    operations: int  # operations attempted
    accepted: int  # puts / transfers accepted
    refused: int  # puts refused (back-pressure, the model agreeing)
    delivered: int  # payloads delivered (during the run and the drain)
    failed: tuple[str, ...]  # "operation: ErrorType" for every documented error that escaped
    reached: tuple[tuple[str, int], ...]  # (site, calls) made before the faults stopped


def _outcome(name: str, env: Env, ledger: Ledger) -> Outcome:
    return Outcome(
        name,
        ledger.operations,
        ledger.accepted,
        ledger.refused,
        ledger.delivered,
        tuple(ledger.failed),
        tuple(sorted(env.reached.items())),
    )


def _run_deployment(
    name: str,
    env: Env,
    capacity: int,
    budget: int,
    body: Callable[[Deployment], None],
    *,
    drain: bool = True,
    keep_fallback_files: bool = False,
    pool: tuple[int, int, int] | None = None,
) -> Outcome:
    ledger = Ledger()
    deployment = Deployment(
        env.scope,
        env.os,
        capacity,
        budget,
        ledger,
        env.armed,
        keep_fallback_files=keep_fallback_files,
        pool=pool,
    )
    try:
        body(deployment)
        env.disarm()
        deployment.retry_closes()
        deployment.check_all()
        if drain:
            deployment.drain("r")
        deployment.close_all()
    except BaseException:
        env.disarm()
        deployment.abandon()
        raise
    return _outcome(name, env, ledger)


# -- connector scenarios ----------------------------------------------------------------------


def ring_wrap(env: Env) -> Outcome:
    """One producer, one receiver, a 4 KiB ring that wraps, fills and takes re-puts."""

    def body(d: Deployment) -> None:
        a = env.identities.live_a
        d.start_producer(a)
        d.start_receiver("r")
        sizes = (600, 700, 900, 500, 800, 900, 900)
        published = [
            d.put(a, EDGE, f"k{i}", tagged_payload(i, size)) for i, size in enumerate(sizes[:2])
        ]
        d.get("r", EDGE, "k0")
        published.append(d.put(a, EDGE, "k2", tagged_payload(2, sizes[2])))
        published.append(d.put(a, EDGE, "k3", tagged_payload(3, sizes[3])))
        d.get("r", EDGE, "k1")
        d.get("r", EDGE, "k2", published[2])
        for i in (4, 5, 6):  # no gets between: the ring fills, the last ones fall back
            published.append(d.put(a, EDGE, f"k{i}", tagged_payload(i, sizes[i])))
        d.put(a, EDGE, "k4", tagged_payload(40, 300))  # re-put: the older version is retired
        d.get("r", EDGE, "k3")
        d.get("r", EDGE, "k4", published[4])  # stale descriptor
        d.get("r", EDGE, "k4")
        d.put(a, EDGE, "k7", tagged_payload(7, 200))
        d.get("r", EDGE, "k5")

    return _run_deployment("ring_wrap", env, SMALL_CAPACITY, 1 << 20, body)


def fallback_traffic(env: Env) -> Outcome:
    """Frames the ring does not admit, a spent budget, and re-puts that move a key across routes."""

    def body(d: Deployment) -> None:
        a = env.identities.live_a
        d.start_producer(a)
        d.start_receiver("r")
        first = d.put(a, EDGE, "big0", tagged_payload(10, 1500))  # > capacity / 4: fallback
        d.put(a, EDGE, "big1", tagged_payload(11, 1500))
        d.put(a, EDGE, "big2", tagged_payload(12, 1500))  # past the budget: refused
        d.get("r", EDGE, "big0", first)
        d.put(a, EDGE, "big2", tagged_payload(13, 1500))  # room again
        d.put(a, EDGE, "big1", tagged_payload(14, 200))  # re-put small: ring, segment retired
        d.put(a, EDGE, "small", tagged_payload(15, 100))
        d.put(
            a, EDGE, "small", tagged_payload(16, 2000)
        )  # re-put large: segment, ring frame retired
        d.get("r", EDGE, "big1")
        d.get("r", EDGE, "small")
        d.put(a, OTHER_EDGE, "big0", tagged_payload(17, 1200))

    # two segments fit (each is charged its file's pages: 4 KiB), a third does not
    return _run_deployment("fallback_traffic", env, SMALL_CAPACITY, 2 * 4096 + 1000, body)


def fallback_reuse(env: Env) -> Outcome:
    """Fallback files kept for reuse: handed back at a claim, reused, replaced, left at close."""

    def body(d: Deployment) -> None:
        a = env.identities.live_a
        d.start_producer(a)
        d.start_receiver("r")
        first = d.put(a, EDGE, "s0", tagged_payload(30, 1500))  # a kept file
        d.get("r", EDGE, "s0", first)  # claimed: handed back to the producer
        d.put(a, EDGE, "s1", tagged_payload(31, 1500))  # written into s0's file
        d.put(a, EDGE, "s1", tagged_payload(32, 1500))  # re-put: replaces the kept file
        d.get("r", EDGE, "s1")
        d.put(a, EDGE, "s2", tagged_payload(33, 1500))  # reuse again
        d.put(a, EDGE, "s3", tagged_payload(34, 1700))  # another size: a new file
        d.get("r", EDGE, "s3")  # handed back; still a spare at close
        d.get("r", EDGE, "s2")

    return _run_deployment(
        "fallback_reuse", env, SMALL_CAPACITY, 3 * 4096, body, keep_fallback_files=True
    )


def pool_traffic(env: Env) -> Outcome:
    """Payloads the ring does not admit, in pool slots: created, exhausted, claimed, reused.

    The pool has one class (4 KiB) and room for two slots: the producer's
    slot create (open, ftruncate, fallocate, mmap), the receiver's slot open,
    fstat and mmap, the carrier's ring frames, a pool that is full (the put
    falls back), a slot reused once its carrier was consumed, a re-put that
    retires a pool version, and a close that unlinks the slot files.
    """

    def body(d: Deployment) -> None:
        a = env.identities.live_a
        d.start_producer(a)
        d.start_receiver("r")
        first = d.put(a, EDGE, "p0", tagged_payload(50, 1500))  # a new slot
        d.put(a, EDGE, "p1", tagged_payload(51, 2000))  # the second slot
        d.put(a, EDGE, "p2", tagged_payload(52, 3000))  # the pool is full: fallback
        d.get("r", EDGE, "p0", first)  # the receiver maps slot 0, claims it, DONE
        d.put(a, EDGE, "p3", tagged_payload(53, 1800))  # slot 0 again: no file created
        d.put(a, EDGE, "p1", tagged_payload(54, 2500))  # re-put: the older version retired
        d.get("r", EDGE, "p3")  # slot 0, already mapped
        d.put(a, EDGE, "s", tagged_payload(55, 100))  # small: the ring itself
        d.get("r", EDGE, "p1")
        d.get("r", EDGE, "p2")
        d.put(a, EDGE, "p4", tagged_payload(56, 3500))  # a slot whose carrier is gone
        d.get("r", EDGE, "p4")
        d.put(a, EDGE, "p5", tagged_payload(57, 1200))  # pending when its producer closes
        if not env.fault_hit():  # the run took the pool where the scenario says it does
            sent, got = d.producers[a].health(), d.receivers["r"].health()
            require(  # p2 and the re-put of p1 fall back (both slots' carriers pending)
                (sent.pool_puts, sent.pool_fallbacks, sent.pool_slots_created) == (5, 2, 2)
                and sent.pool_slots_reused == 3
                and (got.pool_gets, got.pool_mapping_hits) == (3, 2),
                lambda: f"pool_traffic missed the pool: producer {sent}, receiver {got}",
            )
        d.close_producer(a)  # unlinks the slot files (the receiver still maps some)

    return _run_deployment("pool_traffic", env, SMALL_CAPACITY, 1 << 20, body, pool=POOL_CONFIG)


def discovery(env: Env) -> Outcome:
    """Two live producers and a dead one on one edge; the receiver finds each once it is there."""
    return _discovery("discovery", env, None)


def discovery_pool(env: Env) -> Outcome:
    """`discovery` with a pool at every producer: the large payloads take slots (the model's
    `spec.pool` says where), the dead producer's slot files are reclaimed with its ring."""
    return _discovery("discovery_pool", env, POOL_CONFIG)


def _discovery(name: str, env: Env, pool: tuple[int, int, int] | None) -> Outcome:
    def body(d: Deployment) -> None:
        ids = env.identities
        a, b, dead = ids.live_a, ids.live_b, ids.dead
        d.start_producer(a)
        d.start_receiver("r")
        d.put(a, EDGE, "a0", tagged_payload(20, 300))
        d.get("r", EDGE, "a0")
        d.start_producer(b)
        d.put(b, EDGE, "b0", tagged_payload(21, 400))
        d.put(b, EDGE, "b1", tagged_payload(22, 1500))  # fallback (a slot with a pool)
        d.get("r", EDGE, "b0")  # the stamp moved: one rescan finds b
        d.start_producer(dead)
        d.put(dead, EDGE, "d0", tagged_payload(23, 300))
        d.put(dead, EDGE, "d1", tagged_payload(24, 1500))
        _require_pool_puts(env, d, pool, {b: 1, dead: 1})
        d.exit_producer(dead)  # its identity names a process that exited
        d.get("r", EDGE, "d0")  # never delivered; its marker is pruned
        d.get("r", EDGE, "d1")
        if pool is not None and not env.fault_hit():  # that scan reclaimed its slot files too
            left = _slot_files_of(env.directory, dead)
            require(not left, f"the dead producer's slot files after a scan: {left}")
        d.put(a, EDGE, "a1", tagged_payload(25, 500))
        d.get("r", EDGE, "b1")
        d.get("r", EDGE, "a1")

    return _run_deployment(name, env, SMALL_CAPACITY, 1 << 20, body, pool=pool)


def _slot_files_of(directory: str, producer: tuple[int, ...]) -> list[str]:
    return sorted(
        name
        for name in _entries(directory)
        if (parsed := parse_pool_slot_file_name(name)) is not None
        and parsed[0][:2] == tuple(producer[:2])
    )


def _require_pool_puts(
    env: Env, d: Deployment, pool: tuple[int, int, int] | None, expected: dict[Any, int]
) -> None:
    """With a pool and no fault so far: each producer's large puts took a slot, as the model did."""
    if pool is None or env.fault_hit():
        return
    took = {producer: d.producers[producer].health().pool_puts for producer in expected}
    require(took == expected, lambda: f"pool puts {took}, the scenario expects {expected}")


def close(env: Env) -> Outcome:
    """A producer with frames on both routes closes under faults; the retry removes everything."""
    return _close("close", env, None)


def close_pool(env: Env) -> Outcome:
    """`close` with a pool: the large frame is a pool version, its slot file unlinked at close."""
    return _close("close_pool", env, POOL_CONFIG)


def _close(name: str, env: Env, pool: tuple[int, int, int] | None) -> Outcome:
    def body(d: Deployment) -> None:
        a = env.identities.live_a
        d.start_producer(a)
        d.start_receiver("r")
        d.put(a, EDGE, "c0", tagged_payload(30, 300))
        d.put(a, EDGE, "c1", tagged_payload(31, 1500))
        d.put(a, OTHER_EDGE, "c2", tagged_payload(32, 300))
        d.get("r", EDGE, "c0")
        _require_pool_puts(env, d, pool, {a: 1})
        d.close_producer(a)
        env.disarm()
        d.producers[a].close()  # the retry: idempotent, finishes what failed
        d.closing.clear()
        for edge, key in ((EDGE, "c1"), (OTHER_EDGE, "c2")):
            got = d.get("r", edge, key)
            require(got is not None and not got.delivered, f"closed producer's {key!r} delivered")

    return _run_deployment(name, env, SMALL_CAPACITY, 1 << 20, body, drain=False, pool=pool)


def restart(env: Env) -> Outcome:
    """A closed producer and a dead one are followed by a new one that reuses their keys."""
    return _restart("restart", env, None)


def restart_pool(env: Env) -> Outcome:
    """`restart` with a pool: the closed producer's pool version is gone with it, the new one's
    large re-put takes a slot of its own."""
    return _restart("restart_pool", env, POOL_CONFIG)


def _restart(name: str, env: Env, pool: tuple[int, int, int] | None) -> Outcome:
    def body(d: Deployment) -> None:
        ids = env.identities
        a, b, dead = ids.live_a, ids.live_b, ids.dead
        d.start_producer(a)
        d.start_receiver("r")
        old = d.put(a, EDGE, "r0", tagged_payload(40, 300))
        d.put(a, EDGE, "r1", tagged_payload(41, 1500))
        _require_pool_puts(env, d, pool, {a: 1})
        d.close_producer(a)
        d.start_producer(dead)
        d.put(dead, EDGE, "r2", tagged_payload(42, 300))
        d.exit_producer(dead)
        d.start_producer(b)  # the restarted producer
        d.put(b, EDGE, "r0", tagged_payload(43, 200))
        d.put(b, EDGE, "r1", tagged_payload(44, 300))
        d.get("r", EDGE, "r0", old)  # the closed producer's descriptor
        d.get("r", EDGE, "r0")
        d.get("r", EDGE, "r2")  # the dead producer's key: never delivered
        d.put(b, EDGE, "r2", tagged_payload(45, 1500))
        _require_pool_puts(env, d, pool, {b: 1})
        d.get("r", EDGE, "r2")

    return _run_deployment(name, env, SMALL_CAPACITY, 1 << 20, body, pool=pool)


def pid_reuse(env: Env) -> Outcome:
    """A same-pid predecessor left frames: a liveness verdict keyed by pid alone delivers them.

    The predecessor's identity is a live helper's pid with another start
    time (the helper reused its pid); the helper itself is its successor
    and publishes the same keys after it (issues 26 and 29). The
    predecessor's frames are never delivered and its files go at the
    receiver's scan; the successor's are delivered. Under every fault.
    """

    def body(d: Deployment) -> None:
        successor = env.identities.live_a
        predecessor = (successor[0], successor[1] - 1)  # same pid, an earlier process
        d.start_producer(predecessor)
        d.start_receiver("r")
        d.put(predecessor, EDGE, "p0", tagged_payload(50, 300))
        d.put(predecessor, EDGE, "p1", tagged_payload(51, 1500))
        d.exit_producer(predecessor)
        d.start_producer(successor)
        d.put(successor, EDGE, "p1", tagged_payload(52, 300))
        d.get("r", EDGE, "p0")  # the predecessor's key: never delivered
        d.get("r", EDGE, "p1")  # the successor's version
        d.put(successor, EDGE, "p0", tagged_payload(53, 1500))
        d.get("r", EDGE, "p0")

    return _run_deployment("pid_reuse", env, SMALL_CAPACITY, 1 << 20, body)


# -- registered transfer ---------------------------------------------------------------------


def _tensors(tag: int) -> dict[str, Any]:
    import torch

    return {
        "x": torch.arange(40, dtype=torch.float32) + tag,
        "h": (torch.arange(24, dtype=torch.float32) * tag).to(torch.bfloat16).reshape(4, 6),
    }


def _same(sent: dict[str, Any], got: dict[str, Any]) -> bool:
    import torch

    return set(sent) == set(got) and all(
        torch.equal(
            sent[name], torch.as_tensor(got[name]).reshape(sent[name].shape).view(sent[name].dtype)
        )
        for name in sent
    )


def _entries(directory: str) -> set[str]:
    """The directory's files but a member's own (``members``, ``stamp``, liveness files).

    A transfer sender is a member of its scope from its first file on, so
    those stay after a failed send; they are no file of the transfer.
    """
    try:
        names = set(os.listdir(directory))
    except FileNotFoundError:
        return set()
    return {
        name
        for name in names
        if name not in (MEMBERS_FILE_NAME, STAMP_FILE_NAME) and not is_liveness_file_name(name)
    }


def registered_transfer(env: Env) -> Outcome:
    """Registered transfers through per-transfer segments, in lockstep with `spec.registration`."""
    from ..impl.errors import RegistryPoisonedError
    from ..impl.registered.transfer import TransferOptions, TransferReceiver, TransferSender
    from ..spec import registration as spec

    ledger = Ledger()
    options = TransferOptions(enable_registered_shm=True, arena_capacity=0)
    model = spec.initialize_registry()
    plan = env.driver.plan
    if plan is not None:  # the model's driver answers the same faults
        assert isinstance(plan.error, str)
        last = plan.nth if plan.mode != MODE_PERSISTENT else plan.nth + 64
        for nth in range(plan.nth, last + 1):
            spec.process_arm_fault(model.driver, plan.site, plan.error, nth)
    sender = TransferSender(env.scope, options, driver=env.driver, os_facade=env.os)
    receiver = TransferReceiver(env.scope, options, os_facade=env.os)
    sent: list[tuple[Any, dict[str, Any]]] = []
    pending: list[tuple[Any, dict[str, Any]]] = []

    def lengths(fields: dict[str, Any]) -> list[int]:
        return [t.numel() * t.element_size() for t in fields.values()]

    try:
        for tag in range(1, 4):
            ledger.operations += 1
            fields = _tensors(tag)
            before = _entries(env.directory)
            allocated = sender.registry.statistics().segments_allocated if sender.registry else 0
            try:
                descriptor = sender.send(fields)
            except BaseException as error:  # noqa: BLE001 - judged below
                require(isinstance(error, DOCUMENTED_ERRORS), f"send: undocumented {error!r}")
                ledger.failed.append(f"send {tag}: {type(error).__name__}")
                done = (
                    sender.registry.statistics().segments_allocated - allocated
                    if sender.registry
                    else 0
                )
                os_errors = {done: "EIO"} if isinstance(error, OSError) else None
                expected = spec.process_transfer(model, lengths(fields), os_errors)
                require(
                    expected.status is not spec.TransferStatus.PUBLISHED,
                    f"send {tag} raised {error!r}, model published",
                )
                require(
                    (expected.status in (spec.TransferStatus.POISONED, spec.TransferStatus.REFUSED))
                    == isinstance(error, RegistryPoisonedError),
                    f"send {tag}: {type(error).__name__}, model {expected.status}",
                )
                retained = (
                    {s.name for s in sender.registry.segments()} if sender.registry else set()
                )
                left = _entries(env.directory) - before - retained
                require(not left, f"failed send {tag} left files: {sorted(left)}")
            else:
                expected = spec.process_transfer(model, lengths(fields))
                require(
                    expected.status is spec.TransferStatus.PUBLISHED,
                    f"send {tag} published, model {expected.status} ({expected.step} {expected.error})",
                )
                ledger.accepted += 1
                sent.append((descriptor, fields))
            registry = sender.registry
            if registry is not None:
                stats = registry.statistics()
                require(
                    stats.poisoned == model.poisoned
                    and stats.segments_retained == len(spec.get_retained(model)),
                    f"after send {tag}: registry {stats}, model poisoned={model.poisoned} "
                    f"retained={len(spec.get_retained(model))}",
                )
                require(
                    len(env.driver.registered_ranges()) == len(model.driver.ranges),
                    f"after send {tag}: driver holds {env.driver.registered_ranges()}, model {model.driver.ranges}",
                )
        for index, (descriptor, fields) in enumerate(sent[:2]):  # the last one is never taken
            ledger.operations += 1
            try:
                got = (
                    receiver.receive(descriptor)
                    if index % 2
                    else receiver.receive_tensors(descriptor)
                )
            except BaseException as error:  # noqa: BLE001 - judged below
                require(isinstance(error, DOCUMENTED_ERRORS), f"receive: undocumented {error!r}")
                ledger.failed.append(f"receive {index}: {type(error).__name__}")
                names = {field.file for field in descriptor.fields}
                gone = sorted(names - _entries(env.directory))
                require(
                    not gone, f"failed receive {index} consumed segments {gone} of {sorted(names)}"
                )
                pending.append((descriptor, fields))
                continue
            require(_same(fields, got), f"receive {index}: bytes differ from what was sent")
            ledger.delivered += 1
            del got
        env.disarm()
        for descriptor, fields in pending:
            got = receiver.receive(
                descriptor
            )  # a failed receive took nothing: it is all still there
            require(_same(fields, got), "receive after the faults: bytes differ")
            ledger.delivered += 1
            del got
        sender.close()
        if sender.registry is not None:
            sender.registry.close()  # a retained range gets its last unregister
        receiver.close()
    except BaseException:
        env.disarm()
        with contextlib.suppress(BaseException):
            sender.close()
        if sender.registry is not None:
            with contextlib.suppress(BaseException):
                sender.registry.close()
        receiver.close()
        raise
    require(
        not env.driver.registered_ranges(), f"driver still holds {env.driver.registered_ranges()}"
    )
    return _outcome("registered_transfer", env, ledger)


def arena_leases(env: Env) -> Outcome:
    """The registered arena in lease mode, against `spec.ring`: leases pin frames, a full arena refuses."""
    import torch

    from ..impl.registered.arena import ArenaReader, RegisteredArena
    from ..impl.registered.registration import Registry
    from ..spec import ring as ring_spec
    from ..spec.layout import FRAME_STATE_DONE
    from ..spec.ring import ConsumeMode, GetStatus, PutStatus

    ledger = Ledger()
    registry = Registry(env.scope, env.driver, os_facade=env.os)
    model = ring_spec.initialize_ring(SMALL_CAPACITY)
    arena: RegisteredArena | None = None
    reader: ArenaReader | None = None
    leases: dict[int, Any] = {}
    payloads: dict[int, bytes] = {}
    descriptors: dict[int, Any] = {}

    def failed(what: str, error: BaseException) -> None:
        require(isinstance(error, DOCUMENTED_ERRORS), f"{what}: undocumented {error!r}")
        require(env.armed(), f"{what}: {error!r} after the faults stopped")
        ledger.failed.append(f"{what}: {type(error).__name__}")

    def put(tag: int, nbytes: int) -> None:
        assert arena is not None
        ledger.operations += 1
        src = (torch.arange(nbytes, dtype=torch.int32) * tag).to(torch.uint8)
        key = f"refused-{tag}"
        try:
            got = arena.put(src)
        except BaseException as error:  # noqa: BLE001 - judged below
            failed(f"arena put {tag}", error)
            return
        if not isinstance(got, PutStatus):
            key = got.key  # the arena numbers its frames itself
        expected = ring_spec.process_put(model, key, nbytes, tag)
        if isinstance(got, PutStatus):
            require(got is expected.status, f"arena put {tag}: {got}, model {expected.status}")
            ledger.refused += 1
            return
        require(
            expected.status is PutStatus.PUBLISHED and got.position == expected.position,
            f"arena put {tag}: published at {got.position}, model {expected}",
        )
        ledger.accepted += 1
        payloads[got.position] = bytes(src.numpy())
        descriptors[got.position] = got

    def take(position: int, lease: bool) -> None:
        assert reader is not None
        ledger.operations += 1
        descriptor = descriptors[position]
        nbytes = len(payloads[position])
        try:
            got = (reader.borrow if lease else reader.copy)(descriptor, "uint8", (nbytes,))
        except BaseException as error:  # noqa: BLE001 - judged below
            failed(f"arena take {position}", error)
            return
        mode = ConsumeMode.LEASE if lease else ConsumeMode.COPY_OUT
        expected = ring_spec.process_get(model, descriptor.key, position, mode)
        require(expected.status is GetStatus.DELIVERED, f"take {position}: model {expected}")
        require(got.tobytes() == payloads[position], f"take {position}: bytes differ")
        ledger.delivered += 1
        if lease:
            leases[position] = got

    def drop(position: int) -> None:
        del leases[position]  # the last view dies: the frame is done
        ring_spec.process_release(model, position)
        assert arena is not None
        require(
            arena.frame_state(position) == FRAME_STATE_DONE, f"dropped lease {position} not done"
        )

    try:
        try:
            arena = RegisteredArena(registry, SMALL_CAPACITY)
            reader = ArenaReader(registry.directory, arena.name, env.os)
        except BaseException as error:  # noqa: BLE001 - judged below
            failed("arena setup", error)
        if arena is not None and reader is not None:
            for tag, nbytes in enumerate((700, 600, 900), start=1):
                put(tag, nbytes)
            for position in sorted(descriptors):
                take(position, lease=True)
            put(4, 900)  # leases pin the arena: full
            for position in sorted(leases)[1:]:
                drop(position)  # out of order: the first lease still pins the tail
            put(5, 800)
            if leases:
                drop(min(leases))
            put(6, 800)  # wraps
            for position in sorted(descriptors):
                frame = ring_spec.get_frame_at(model, position)
                if frame is not None and ring_spec.is_deliverable(frame):
                    take(position, lease=False)
            ledger.operations += 1
            for position in sorted(leases):
                drop(position)
            try:
                arena.close()
            except BaseException as error:  # noqa: BLE001 - judged below
                failed("arena close", error)
        env.disarm()
        leases.clear()
        if reader is not None:
            reader.close()
        if arena is not None:
            arena.close()  # idempotent: finishes a close that failed
        registry.close()  # a retained arena gets its last unregister here
    except BaseException:
        env.disarm()
        leases.clear()
        if reader is not None:
            reader.close()
        with contextlib.suppress(BaseException):
            if arena is not None:
                arena.close()
        with contextlib.suppress(BaseException):
            registry.close()
        raise
    require(
        not env.driver.registered_ranges(), f"driver still holds {env.driver.registered_ranges()}"
    )
    return _outcome("arena_leases", env, ledger)


Scenario = Callable[[Env], Outcome]

SCENARIOS: Final[dict[str, Scenario]] = {
    "ring_wrap": ring_wrap,
    "fallback_traffic": fallback_traffic,
    "fallback_reuse": fallback_reuse,
    "pool_traffic": pool_traffic,
    "discovery": discovery,
    "discovery_pool": discovery_pool,
    "close": close,
    "close_pool": close_pool,
    "restart": restart,
    "restart_pool": restart_pool,
    "pid_reuse": pid_reuse,
    "registered_transfer": registered_transfer,
    "arena_leases": arena_leases,
}


__all__ = ["EDGE", "SCENARIOS", "Env", "Outcome", "Scenario", "ScenarioFailure"]
