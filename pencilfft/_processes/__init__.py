"""Several processes: starting them, agreeing across them, their memory, their data.

Holds:

* `launch`: `initialize()` under mpirun/mpiexec, srun or plain python, and what ends the whole
  job when one process fails;
* `agree`: one decision on every process (the least of a value over the job, through MPI or
  jax.distributed's key-value store), asked before anything that must be the same everywhere;
* `memory`: what a device has (detected, or `PENCILFFT_MEMORY_LIMIT`), `MemoryLimitError`, the
  checks of a load and of autotune's grid;
* `io`: `scatter`, `gather`, `save`, `load`: each process gets exactly its blocks.

Data flow: the launcher's environment -> `initialize` -> jax.distributed (and MPI); the
transforms ask `memory.available` (agreed through `agree`) before they choose their chunks.
May import: jax, numpy, the standard library (mpi4py lazily), `_jax_private`,
`_decomposition`.  Not the transforms: they build on this.
"""
