"""The distributed transforms (pfft3d & co. and jnp.fft's N-D names): plan, stages, runner.

The data's path, one module a step:

* `plan`: a frozen `Plan` from shapes, dtypes and the mesh alone (validation with messages that
  name the argument, padding, layouts, exchanges); nothing traced;
* `stages`: the forward transform of a per-device block as a list of stages (local FFT,
  truncate, pad, exchange, move), each with its inverse; `chunks`: the same chain in pieces
  written back in place; `pipeline`: those pieces pipelined (one piece's exchange in flight
  while the next piece's FFT and pack run and the last one's unpack and FFT); `budget`: the
  per-device memory of a plan, and the chunk count that fits;
* `transpose`: the local reordering around an exchange (`pencilfft._exchange` moves the data);
* `kernel` (+ `fftw.cc`), `xla_fft` and `r2r`: every local FFT as one primitive, FFTW on
  CPUs, XLA's elsewhere (`xla_fft`: jnp.fft's, its layouts pinned on CPUs); the DCTs and DSTs;
* `partitioned`: the runner: a plan's stages in `shard_map` where the mesh is known, on one
  device, or through `custom_partitioning` where XLA's partitioner decides the mesh;
* `routes`: the one planner, the cheapest route of exchanges between any two shardings (for
  every transform, pfft3d's included); `numpy_fft`: jnp.fft's N-D names (`fftn`, `rfftn`, ...)
  on arrays of any rank in any sharding, run along such a route;
* `fft`: the public transforms (plan, then the runner); `freq`: wavenumbers sharded like the
  spectrum; `dealias`: the N-D names' dealiasing, the 2/3 rule's mask and the 3/2 rule's
  padding, sharded like the spectrum; `autotune`: the fastest mesh, exchange and layout, timed.

May import: jax, numpy, `_jax_private`, `_measure`, `_decomposition`, `_native`, `_processes`
(memory), `_exchange`.  The particle-mesh tools, `compat` and the CLI build on this.
"""
