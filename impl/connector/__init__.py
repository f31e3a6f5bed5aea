"""The connector: one process's routing between its rings and the fallback.

`shmring.spec.connector` (routing), `spec.producers` (identity, exit vs
close) and `spec.discovery` (markers, stamp, receiver caches) say what a
connector does; this package wires the pieces that do it, one module per
concept:

* `config`: the options, checked once into a frozen `ConnectorConfig`;
* `edges`: an edge and a key as callers pass them (the call shapes);
* `descriptors`: what a put answers, and its dict form across processes;
* `results`: get statuses, `Delivery`, `ConnectorHealth`;
* `joining`: the deployment directory, stamp, liveness, markers, live file;
* `routes`: the route interface both routes offer (prepare, publish with a
  before-visible hook, retire, claim); `ring_route` and `fallback_route`
  implement it;
* `shortage`: what happens when descriptors run short (issue 12);
* `waiting`: the doorbell and the blocking get's loop;
* `facade`: `Connector`, which sequences the routes in the model's steps;
* `seams`: the test seams, out of the production signature.

A receive never waits for another process's lock (BUSY instead, which
`get_with_deadline` retries), and an unchanged empty channel costs one
shared-memory load per producer plus one `open` of the key's segment name:
no lock, no directory scan.

A producer is one connector instance, identified by (pid, process start
time, instance): each connector publishes on its own rings, markers and live
file, so a process may hold any number of producers on one edge, each
discovered like any other and closed on its own. Liveness is the process's,
so every instance of a killed process is dead at once.
"""

from __future__ import annotations

from ...spec.connector import Route
from .config import (
    DEFAULT_FALLBACK_BUDGET,
    DEFAULT_RING_CAPACITY,
    ConnectorConfig,
)
from .descriptors import (
    Descriptor,
    FallbackDescriptor,
    PoolDescriptor,
    RingDescriptor,
    descriptor_from_dict,
)
from .edges import Edge
from .facade import Connector
from .results import ConnectorHealth, Delivery, GetStatus

__all__ = [
    "DEFAULT_FALLBACK_BUDGET",
    "DEFAULT_RING_CAPACITY",
    "Connector",
    "ConnectorConfig",
    "ConnectorHealth",
    "Delivery",
    "Descriptor",
    "Edge",
    "FallbackDescriptor",
    "GetStatus",
    "PoolDescriptor",
    "RingDescriptor",
    "Route",
    "descriptor_from_dict",
]
