"""shmring.fault_injection: fault plans, the seams that carry them, and the suites."""
