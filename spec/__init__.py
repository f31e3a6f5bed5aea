"""shmring.spec: the executable model of shmring's transports.

Pure Python, no I/O. Reviewers read it to learn what the transports promise;
tests run it next to the implementation. Nothing here imports numpy, torch,
mmap, ctypes, cuda or shmring.impl (a test enforces it).

Reading order: layout, ring, index, connector (and cohort), producers, discovery, registration,
leases, invariants, contracts. docs/model.md walks through it. The bounded
explorer that walks every reachable state of the model is checking machinery,
not model: it lives in `shmring.check.explore`.
"""
