"""shmring: host shared-memory transports for multi-process inference pipelines.

`shmring.spec` is the model, `shmring.impl` the implementation; this package
re-exports the implementation's public API.
"""

__version__ = "0.1.0"
