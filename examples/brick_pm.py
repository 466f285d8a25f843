"""A particle-mesh force step on a brick: the grid split over X, Y and Z by a (2, 2, 2) mesh.

    python examples/brick_pm.py            (8 simulated CPU devices, a 32^3 grid)
    python examples/brick_pm.py --n 64

Bricks (every device a box of the grid, P(a, b, c)) have the least surface per volume, hence
the smallest halos, which is what split particle codes use.  One step: paint the particles
(one per cell, the particle of site (i, j, k) at (i, j, k) + dx, dx split P(a, b, c, None)),
`pencilfft.rfftn` (any layout in, the spectrum split over X and Y), the Poisson kernel and a
gradient, `pencilfft.irfftn` back to the brick P(a, b, c), and readout of the three force
components at the particles.  The same step on a 4x2 pencil mesh gives the same forces (checked:
the script exits 1 if they differ).  Units are grid cells; lap(phi) = density - 1.
"""
from __future__ import annotations

import argparse
import os
import sys

# Simulated CPU devices (before jax starts): on GPUs drop this line and use the real ones.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

import pencilfft  # noqa: E402


def forces(dx, field: NamedSharding, spectrum: P):
    """-grad(phi) at the particles, (3, X, Y, Z) split like dx's (X, Y, Z): `field` is the
    real-space sharding (the brick's or the pencils'), `spectrum` the split of the half
    spectrum (X, Y, Z//2+1), which must divide its axes."""
    shape = dx.shape[:3]
    rho = pencilfft.paint(dx)                                    # (X, Y, Z), split as `field`
    k = pencilfft.rfftn(rho, out_sharding=spectrum)
    kx, ky, kz = (2 * np.pi * np.fft.fftfreq(shape[0])[:, None, None],
                  2 * np.pi * np.fft.fftfreq(shape[1])[None, :, None],
                  2 * np.pi * np.fft.rfftfreq(shape[2])[None, None, :])
    k2 = kx**2 + ky**2 + kz**2
    inv_k2 = jnp.asarray(np.where(k2 == 0, 0, 1 / np.where(k2 == 0, 1, k2)), k.real.dtype)
    phi = -k * inv_k2                                            # lap(phi) = rho - 1
    f = jnp.stack([pencilfft.irfftn(-1j * jnp.asarray(w, k.real.dtype) * phi, s=shape,
                                    out_sharding=field) for w in (kx, ky, kz)])
    return pencilfft.readout(f, dx)                              # (3, X, Y, Z)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=32, help="grid cells per side (default 32)")
    n = parser.parse_args().n
    shape = (n, n, n)
    dx = (np.random.default_rng(0).standard_normal(shape + (3,)) * 0.4).astype(np.float32)

    brick = jax.make_mesh((2, 2, 2), ("a", "b", "c"))
    field = NamedSharding(brick, P("a", "b", "c"))
    spectrum = P("a", ("b", "c"), None)                          # Z//2+1 left whole
    d = jax.device_put(dx, NamedSharding(brick, P("a", "b", "c", None)))
    f = jax.jit(forces, static_argnums=(1, 2))(d, field, spectrum)
    print(f"brick: dx {d.shape} split {d.sharding.spec}, forces {f.shape} split "
          f"{f.sharding.spec}")

    pencils = jax.make_mesh((4, 2), ("x", "y"))
    field_p = NamedSharding(pencils, P("x", "y"))
    d_p = jax.device_put(dx, NamedSharding(pencils, P("x", "y")))
    f_p = jax.jit(forces, static_argnums=(1, 2))(d_p, field_p, P("x", "y", None))

    err = float(np.abs(np.asarray(f) - np.asarray(f_p)).max() / np.abs(np.asarray(f_p)).max())
    print(f"max |force on the brick - on pencils| / max |force| = {err:.1e}")
    return 0 if err < 1e-5 else 1


if __name__ == "__main__":
    sys.exit(main())
