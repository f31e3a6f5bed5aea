"""Registered transfer: GPU tensors copied device-to-host straight into CUDA-registered shared memory.

`cuda_driver` is the driver port (simulated and real), `registration`
the `Registry` of registered segments (`spec.registration`), `shm_file`
and `host_copy` its files and copies, `arena` the registered arena on the
ring engine (`shmring.impl.ring.engine`), `transfer` / `transfer_receiver`
/ `transfer_descriptor` the sender, the receiver and what travels between
them, `views` the borrowed numpy / torch views on the one lease
(`shmring.impl.ring.borrow`), and `video` the PyAV encoder. See
docs/registered.md.
"""
