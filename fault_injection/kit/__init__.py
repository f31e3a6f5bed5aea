"""The test kit: the scaffolding every suite of shmring shares, each piece once.

* `seams`: `CountingOs` (counts the calls through the OS seam) and `FaultyOs`
  (fails the planned ones: a campaign's `FaultPlan`, or faults a test arms).
* `payloads`: `tagged_payload` / `payload_tag`, bytes that say which put
  they came from.
* `processes`: `WorkerProcess` (a multiprocessing worker with a bounded
  pipe, `serve` for its command loop), `ForkedChild` (a fork that dies at a
  crash point and reports JSON lines), `lock_holder`, `watchdog`.
* `machines`: the block every lockstep machine module declares (`Tally` of
  labels and steps, `register_profiles`) and `rarely`, the one way a rule
  acts on one draw in N.

Why here. The kit sits in `shmring.fault_injection` because both suites use
it and that is the lower of the two: the fault campaign (`shmring check`)
ships it and already never imports `model_tests`, while `model_tests`
imports `fault_injection`. The model (`spec/`) and the implementation
(`impl/`) never import the kit; the kit imports `impl` only for the seam it
subclasses (`impl.os_seam.OsFacade`). The package's `__init__` imports
nothing, so a worker process that needs payloads does not import Hypothesis.
"""
