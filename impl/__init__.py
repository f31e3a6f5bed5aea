"""shmring.impl: the transports themselves (mmap, flock, POSIX SHM, CUDA, PyAV).

The public API is re-exported by the top-level `shmring` package.
"""
