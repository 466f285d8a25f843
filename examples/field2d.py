"""A 2-D field on 8 devices: jnp.fft's calls on a sharded array, without a gather.

    python examples/field2d.py --n 2048        # 8 devices: GPUs, or 8 simulated CPU devices

Solves the Poisson equation lap(phi) = delta on a periodic 2-D grid, split by rows over 8
devices and then over a 4x2 mesh (both axes split), with `pencilfft.rfft2`/`irfft2`: the code is
jnp.fft's, plus `out_sharding` to get the potential back in the field's layout.  Each result is
checked against numpy on the gathered grid (keep `--n` small for that check).
"""
from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

import pencilfft


def potential(delta: jax.Array, sharding: NamedSharding) -> jax.Array:
    """phi with lap(phi) = delta (zero mean), returned in `sharding` (delta's, say)."""
    n0, n1 = delta.shape
    dk = pencilfft.rfft2(delta)                                  # (n0, n1//2+1), as jnp's
    k0 = 2 * jnp.pi * jnp.fft.fftfreq(n0)[:, None]
    k1 = 2 * jnp.pi * jnp.fft.rfftfreq(n1)[None, :]
    k2 = k0**2 + k1**2
    phik = jnp.where(k2 > 0, -dk / jnp.where(k2 > 0, k2, 1), 0)
    return pencilfft.irfft2(phik, s=delta.shape, out_sharding=sharding)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=256, help="grid points per axis")
    n = parser.parse_args().n
    data = np.random.default_rng(0).standard_normal((n, n)).astype(np.float32)
    k = np.fft.fftn(data.astype(np.float64))
    k0, k1 = np.meshgrid(*[2 * np.pi * np.fft.fftfreq(n)] * 2, indexing="ij")
    k2 = k0**2 + k1**2
    ref = np.fft.ifftn(np.where(k2 > 0, -k / np.where(k2 > 0, k2, 1), 0)).real
    for shape, names, spec in [((8,), ("x",), P("x")), ((4, 2), ("x", "y"), P("x", "y"))]:
        mesh = jax.make_mesh(shape, names)
        sharding = NamedSharding(mesh, spec)
        delta = jax.device_put(data, sharding)
        phi = jax.jit(potential, static_argnums=1)(delta, sharding)
        err = np.abs(np.asarray(phi) - ref).max() / np.abs(ref).max()
        print(f"mesh {shape}: phi {phi.shape} sharded {phi.sharding.spec}, error vs numpy "
              f"{err:.1e}")
        if err > 1e-4:
            raise SystemExit(1)


if __name__ == "__main__":
    main()
