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
