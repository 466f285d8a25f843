"""Solve the Poisson equation  lap(phi) = delta  on a sharded grid, three ways.

    python examples/poisson.py --n 128          # 8 devices: GPUs, or 8 simulated CPU devices

In a periodic box with the complex transforms (`pfft3d`/`pifft3d`) and with the real-to-complex
ones (`prfft3d`/`pirfft3d`: half the memory, communication and work), and in a box with
Dirichlet walls (phi = 0 on them) with sine series (`ptransform3d` with DST-I along every axis).
Each is checked against numpy on the gathered grid (keep `--n` small for that check: it needs
the whole grid on the host).
"""
from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np

import pencilfft


def potential(delta: jax.Array) -> jax.Array:
    """phi with lap(phi) = delta (zero mean), through the complex transforms."""
    dk = pencilfft.pfft3d(delta)                   # k space, global order (Y, Z, X)
    kx, ky, kz = pencilfft.fftfreq3d(dk)           # broadcast against dk, sharded like it
    k2 = kx**2 + ky**2 + kz**2
    phik = jnp.where(k2 > 0, -dk / jnp.where(k2 > 0, k2, 1), 0)
    return pencilfft.pifft3d(phik).real            # back to (X, Y, Z), sharded like delta


def potential_r2c(delta: jax.Array) -> jax.Array:
    """The same through the real-to-complex transforms."""
    shape = delta.shape[-3:]
    dk = pencilfft.prfft3d(delta)                  # (Y, Z//2+1 padded, X)
    kx, ky, kz = pencilfft.rfftfreq3d(dk, s=shape)
    k2 = kx**2 + ky**2 + kz**2
    return pencilfft.pirfft3d(jnp.where(k2 > 0, -dk / jnp.where(k2 > 0, k2, 1), 0), shape)


def potential_dirichlet(delta: jax.Array) -> jax.Array:
    """phi with lap(phi) = delta and phi = 0 on the walls: a sine series (DST-I) per axis."""
    kinds = ("dst1", "dst1", "dst1")
    dk = pencilfft.ptransform3d(delta, kinds)      # real in, real out: every kind is a sine
    kx, ky, kz = pencilfft.wavenumbers3d(dk, kinds)  # pi (m + 1) / (n + 1): never 0
    k2 = kx**2 + ky**2 + kz**2
    return pencilfft.pitransform3d(jnp.where(k2 > 0, -dk / jnp.where(k2 > 0, k2, 1), 0), kinds)


def reference(delta: np.ndarray) -> np.ndarray:
    """numpy's answer on the whole grid."""
    k = np.fft.fftn(delta)
    kx, ky, kz = np.meshgrid(*[2 * np.pi * np.fft.fftfreq(n) for n in delta.shape], indexing="ij")
    k2 = kx**2 + ky**2 + kz**2
    return np.fft.ifftn(np.where(k2 > 0, -k / np.where(k2 > 0, k2, 1), 0)).real


def reference_dirichlet(delta: np.ndarray) -> np.ndarray:
    """The Dirichlet solve as the periodic one of the odd extension (0, x, 0, -x reversed) of
    the grid along every axis, cut back to the interior."""
    ext = delta
    for axis in range(3):
        a = np.moveaxis(ext, axis, 0)
        zero = np.zeros((1,) + a.shape[1:])
        ext = np.moveaxis(np.concatenate([zero, a, zero, -a[::-1]]), 0, axis)
    n = delta.shape
    return reference(ext)[1:n[0] + 1, 1:n[1] + 1, 1:n[2] + 1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=128, help="grid side (default 128)")
    parser.add_argument("--mesh", default="4x2", help="mesh shape P x Q (default 4x2)")
    args = parser.parse_args(argv)
    pdims = tuple(int(p) for p in args.mesh.split("x"))

    mesh = jax.make_mesh(pdims, ("x", "y")[: len(pdims)])
    shape = (args.n,) * 3
    with jax.set_mesh(mesh):                       # each device draws only its own block
        delta = jax.random.normal(jax.random.key(0), shape,
                                  out_sharding=pencilfft.real_space_sharding(mesh))
    periodic, walls = reference(np.asarray(delta)), reference_dirichlet(np.asarray(delta))
    for name, solve, ref in (("c2c", potential, periodic), ("r2c", potential_r2c, periodic),
                             ("dirichlet", potential_dirichlet, walls)):
        phi = jax.jit(solve)(delta)
        assert phi.sharding.is_equivalent_to(pencilfft.real_space_sharding(mesh), 3), name
        err = float(np.abs(np.asarray(phi) - ref).max() / np.abs(ref).max())
        print(f"{name}: phi {phi.shape} sharded {phi.sharding.spec}, error vs numpy {err:.1e}")
        if err > 1e-4:
            print(f"error: {name} differs from numpy by {err:.1e}")
            return 1
    return 0


if __name__ == "__main__":
    jax.config.update("jax_num_cpu_devices", 8)  # 8 simulated devices where there is only a CPU
    raise SystemExit(main())
