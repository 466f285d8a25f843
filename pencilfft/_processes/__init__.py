"""Several processes: starting them, agreeing across them, their memory, their data.

Holds:

* `launch`: `initialize()` under mpirun/mpiexec, srun or plain python: it puts together
  - `launchers`: which launcher started this process (MPI, SLURM, a coordinator given by hand,
    or `multiprocessing`, whose children are no processes of the job) and the arguments of
    `jax.distributed.initialize`; `srun_mpi_hint`;
  - `placement`: each process's share of its node's cores and its accelerators;
  - `mpich`: the `mpich` wheel's network layer (OFI) chosen under `srun --mpi=pmi2`, before MPI
    starts;
  - what ends the whole job when one process fails, each through `ending` (say why, let the
    launcher read it, `MPI.COMM_WORLD.Abort`): `exits` (an uncaught exception, a non-zero
    exit, with Python's exit semantics), `signals` (SIGTERM, SIGINT), `callback_watch` (a
    process stuck after a failed jax callback);
  - `gloo_chatter`: gloo's connection messages kept off standard output;
* `agree`: one decision on every process (the least of a value over the job; the same
  decisions, compared under MPI by one allreduce of a digest, the texts gathered only where
  they differ; else through jax.distributed's key-value store), asked before anything that
  must be the same everywhere;
* `memory`: what a device has (detected, or `PENCILFFT_MEMORY_LIMIT`), `MemoryLimitError`, the
  check of autotune's grid;
* `io`: `scatter`, `gather`, `save`, `load` (any rank, any NamedSharding): each process gets
  exactly its blocks; it puts together
  - `blocks`: where an array goes (a Mesh's real-space sharding, or any NamedSharding, checked
    against the shape and the memory: `Layout.check_memory`) and which process holds, sends or
    writes each block;
  - `transport`: one call's private communicator, the agreements that raise one error on
    every process, the messages;
  - `npyfile`: the .npy header, `save`'s temporary file and its atomic rename.

Data flow: the launcher's environment -> `initialize` -> jax.distributed (and MPI); the
transforms ask `memory.available` (agreed through `agree`) before they choose their chunks.
May import: jax, numpy, the standard library (mpi4py lazily), `_jax_private`,
`_decomposition`.  Not the transforms: they build on this.
"""
