"""Benchmarks for pencilfft (not part of the installed package).

* `python -m benchmarks.fft --help`: time distributed 3D FFTs (pencilfft, jaxdecomp,
  jnp.fft.fftn) side by side and append one JSON line per case to a results file;
  `python -m benchmarks.fft table results/*.jsonl` prints those results as tables.
* `python -m benchmarks.plot --help`: strong/weak scaling figures from the result files.
* `python -m benchmarks.steps`, `.memory`, `.pm`: one transform's steps, per-device memory, a
  particle-mesh N-body step; `mpirun -np 2 python -m benchmarks.mpi`: pencilfft beside
  mpi4py-fft with one device per process.
* `python -m benchmarks.chunks`: memory and time of the chunked stages (`chunks=`) beside
  jaxdecomp, and the largest grid that fits (`--fits`).

The FFT benchmark is four modules: `fft` (the command line), `harness` (cases, variants,
input data, the round-robin timing loop, the records; the parsing helpers the other tools
share), `impls` (the implementations, name -> builder) and `report` (the tables).

Nothing here imports jax at import time: the harness must set the number of simulated CPU
devices (and start `jax.distributed` under mpirun/srun) before jax creates its backend.
"""
