"""shmring.fault_injection: fault plans, the seams that carry them, and the suites.

* `sites`: every injectable site (the OS seam's and the CUDA port's) with the errors it can answer.
* `plans`: the frozen `FaultPlan` and the faulty CUDA driver; `kit`: the test kit (the faulty OS seam, payloads, worker processes, the lockstep base).
* `scenarios` / `lockstep`: deterministic runs of the transport, compared with the model.
* `campaign`: the SQLite-style cell loop and the `shmring check` entry points
  (`run_faults`, `run_crash`, `run_fuzz`).
* `crash`: SIGKILL at named points; `fuzz`: corrupted bytes and forged input;
  `tmpfs`: real ENOSPC in a private mount namespace.
* `interleave` / `interleave_scenarios`: producer and readers as cooperative
  actors over one real mapping, every schedule up to a preemption bound
  (`run_interleavings`; docs/interleavings.md); `interleave_interrupts`,
  `interleave_liveness`, `interleave_neighbours`: the environment's actions
  there (an exception raised at every stop point, the liveness verdict
  against a re-joining member, a neighbour's unlink and truncation).

docs/faults.md is the catalogue and the reader's guide.
"""
