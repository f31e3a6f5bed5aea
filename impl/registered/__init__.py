"""Registered transfer: GPU tensors copied device-to-host straight into CUDA-registered shared memory.

`driver_port` is the CUDA driver port, `cuda_driver` the real driver
and `simulated_driver` the simulated one, `registration` the `Registry`
of registered segments (`spec.registration`) and `segments` what it
records, `shm_file` and `host_copy` its files and copies, `arena` the
registered arena on the ring engine (`shmring.impl.ring.engine`) and
`arena_reader` its receiver side, `transfer` / `transfer_receiver`
/ `transfer_descriptor` the sender, the receiver and what travels between
them, `views` the borrowed numpy / torch views on the one lease
(`shmring.impl.ring.borrow`), and `video` the PyAV encoder. See
docs/registered.md.
"""
