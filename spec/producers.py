"""Producer identity, exit and restart.

A producer is one connector instance publishing on one or more edges. Its
identity is (pid, process start time, instance): a pid alone may be reused
by a later process, the pair (the *process*) may not, and the instance
numbers the connectors one process made, so a process may hold any number
of producers, several on the same edge, each with its own rings, fallback
segments and markers (see `connector`), each closing on its own.

A producer leaves in one of two ways:

* `process_producer_close`: it closes its connector (everything it holds is
  retired) and removes its markers. Other producers of its process go on.
* `process_producer_exit`: its process dies (SIGKILL, crash), and with it
  every producer of that process (`spec.discovery.process_exit_process`).
  Nothing it published is ever delivered again, not even to a new producer
  that reuses its keys or its pid; its files and markers are removed by the
  first scan of the deployment that finds it dead (any connector's
  scan: `discovery.process_refresh`, `discovery.process_reclaim`), or by
  `shmring gc`.

Liveness is an oracle the environment controls. Whether a producer's
process runs is the environment's fact (`ProducerState.alive`); what an
observer may learn of it is a *verdict* (`get_verdict`). Observers and
producers live in pid namespaces (containers sharing one shm root): a
producer's recorded (pid, start time) means something only in the namespace
it was made in (`ProducerState.namespace`), where the observer reads that
namespace's process table (`ProcessTable`: pid -> start time of a running
process; the fast path). In any other namespace the pid names another
process or none, so the verdict there is the kernel's: a lock the producer
holds for its whole life, which the kernel drops at its death in every
namespace (`get_lock_held`). Both properties hold for every observer:

* safety: a live producer is never judged dead (`is_verdict_safe`);
* liveness: a dead one is judged dead at the next look
  (`is_verdict_complete`); its frames are never delivered, its files go at
  the next reclaim.

A verdict by pid alone from another namespace (`get_pid_verdict`) is what
these rule out: pid 1 there is another process, with another start time.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import connector as connector_spec
from .connector import ConnectorState

# (pid, process start time in clock ticks, instance); the first two name the process
ProducerId = tuple[int, ...]
ProcessId = tuple[int, int]  # (pid, process start time): what lives and dies


@dataclass
class ProducerState:
    """One producer process."""

    identity: ProducerId  # unique over the deployment's whole history
    connector: ConnectorState  # its rings and fallback segments
    alive: bool = True  # False once it exited or closed; never becomes True again
    closed: bool = False  # True when it left through close (not a crash)
    namespace: int = 0  # the pid namespace its (pid, start time) was recorded in


# A pid namespace's running processes: pid -> start time (the environment's).
ProcessTable = dict[int, int]


# -- predicates --------------------------------------------------------------


def get_process(identity: ProducerId) -> ProcessId:
    """The process a producer belongs to: (pid, start time)."""
    return (identity[0], identity[1])


def is_same_process(a: ProducerId, b: ProducerId) -> bool:
    """Same pid *and* same start time (any instances); a reused pid is another process."""
    return get_process(a) == get_process(b)


def is_pid_reuse(a: ProducerId, b: ProducerId) -> bool:
    return a[0] == b[0] and a[1] != b[1]


def is_delivering(producer: ProducerState) -> bool:
    """Only a live producer's frames may be delivered."""
    return producer.alive and not producer.connector.closed


def get_lock_held(producer: ProducerState) -> bool:
    """The kernel's answer: the producer's liveness lock is held exactly while it runs.

    A clean close releases it too (then the producer is no longer alive).
    """
    return producer.alive


def get_pid_verdict(producer: ProducerState, table: ProcessTable) -> bool:
    """(pid, start time) looked up in one namespace's process table."""
    return table.get(producer.identity[0]) == producer.identity[1]


def get_verdict(
    producer: ProducerState, observer_namespace: int, tables: dict[int, ProcessTable]
) -> bool:
    """What an observer in `observer_namespace` judges: alive (True) or dead.

    The fast path, (pid, start time), only in the producer's own namespace;
    the lock everywhere else.
    """
    if observer_namespace == producer.namespace:
        return get_pid_verdict(producer, tables.get(observer_namespace, {}))
    return get_lock_held(producer)


def is_table_faithful(producers: list[ProducerState], tables: dict[int, ProcessTable]) -> bool:
    """The environment's tables agree with the producers: each live one runs in its namespace.

    A dead producer's pid may be reused there, but never with its start time.
    """
    for producer in producers:
        pid, start_time = producer.identity[0], producer.identity[1]
        running = tables.get(producer.namespace, {}).get(pid) == start_time
        if running != producer.alive:
            return False
    return True


def is_verdict_safe(
    producers: list[ProducerState], observer_namespace: int, tables: dict[int, ProcessTable]
) -> bool:
    """Safety: no live producer is judged dead by this observer."""
    return all(get_verdict(p, observer_namespace, tables) for p in producers if p.alive)


def is_verdict_complete(
    producers: list[ProducerState], observer_namespace: int, tables: dict[int, ProcessTable]
) -> bool:
    """Liveness: every dead producer is judged dead by this observer."""
    return not any(get_verdict(p, observer_namespace, tables) for p in producers if not p.alive)


# -- transitions -------------------------------------------------------------


def initialize_producer(
    identity: ProducerId,
    ring_capacity: int,
    fallback_budget: int,
    pool: tuple[int, int, int] | None = None,
) -> ProducerState:
    """A producer; `pool` = (min class, max class, budget) gives its connector a pool."""
    # Verify the identity is (pid, start time[, instance]) with a positive pid
    assert len(identity) in (2, 3) and identity[0] > 0 and all(part >= 0 for part in identity)
    return ProducerState(
        identity=identity,
        connector=connector_spec.initialize_connector(
            ring_capacity, fallback_budget, *(pool or ())
        ),
    )


def process_producer_exit(producer: ProducerState) -> None:
    """The process died without closing. Its frames become undeliverable."""
    # Verify the producer was alive
    assert producer.alive
    producer.alive = False


def process_producer_close(producer: ProducerState) -> int:
    """Clean shutdown: retire everything; answers how many versions were retired."""
    # Verify the producer was alive
    assert producer.alive
    retired = connector_spec.process_close(producer.connector)
    producer.alive = False
    producer.closed = True
    return retired
