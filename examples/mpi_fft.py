"""A distributed FFT across processes: scatter, transform, save, load, gather.

    mpirun -np 2 python examples/mpi_fft.py --n 64 --out /tmp
    JAX_PLATFORMS=cpu XLA_FLAGS=--xla_force_host_platform_device_count=4 mpirun -np 2 \\
        python examples/mpi_fft.py --n 16 --out /tmp        # on a machine without GPUs

Every process runs this same script (JAX's multi-controller model); every pencilfft call in
it is collective.  Rank 0 checks the round trip and the saved spectrum against numpy.
"""
from __future__ import annotations

import argparse
import os

import jax
import numpy as np

import pencilfft


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=64, help="grid side (default 64)")
    parser.add_argument("--out", default=".", help="folder for spectrum.npy (a shared one)")
    args = parser.parse_args(argv)

    pencilfft.initialize()            # first, before anything else touches jax devices

    n_dev = jax.device_count()        # all processes' devices
    pdims = (2, n_dev // 2) if n_dev % 2 == 0 else (1, n_dev)
    mesh = jax.make_mesh(pdims, ("x", "y"))
    rank = jax.process_index()        # = the MPI rank under mpirun/srun

    # One process has the whole array in memory and sends every process its blocks.
    shape = (args.n,) * 3
    data = (np.random.default_rng(0).standard_normal(shape, dtype=np.float32)
            if rank == 0 else None)
    x = pencilfft.scatter(data, mesh)             # global (n, n, n), real-space sharding

    k = pencilfft.pfft3d(x)                       # distributed FFT, k space (Y, Z, X)
    path = os.path.join(args.out, "spectrum.npy")
    pencilfft.save(path, k)                       # a plain .npy file: numpy.load reads it
    k2 = pencilfft.load(path, k.sharding)         # each process reads its own blocks
    y = pencilfft.pifft3d(k2)

    back = pencilfft.gather(y)                    # numpy array on rank 0, None on the others
    if rank == 0:
        want = np.fft.fftn(data).transpose(1, 2, 0)
        spectrum_err = np.abs(np.load(path) - want).max() / np.abs(want).max()
        err = np.abs(back.real - data).max()
        print(f"{jax.process_count()} processes, {n_dev} devices, mesh {pdims}: "
              f"spectrum error {spectrum_err:.1e}, round trip error {err:.1e}")
        if spectrum_err > 1e-5 or err > 1e-5:
            print("error: the distributed transform differs from numpy's")
            return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
