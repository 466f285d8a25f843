"""Benchmarks for pencilfft (not part of the installed package).

* `python -m benchmarks.fft --help`: time distributed 3D FFTs (pencilfft, jaxdecomp,
  jnp.fft.fftn) side by side and append one JSON line per case to a results file;
  `python -m benchmarks.fft table results/*.jsonl` prints those results as tables.
* `python -m benchmarks.plot --help`: strong/weak scaling figures from the result files.

Nothing here imports jax at import time: the harness must set the number of simulated CPU
devices (and start `jax.distributed` under mpirun/srun) before jax creates its backend.
"""
