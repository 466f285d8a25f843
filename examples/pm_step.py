"""A particle-mesh N-body run written with pencilfft alone: Zel'dovich initial conditions (LPT)
and drift-kick-drift leapfrog steps on a grid split over a device mesh.

    python examples/pm_step.py --n 64 --steps 10            (8 simulated CPU devices, 4x2)
    python examples/pm_step.py --n 16 --steps 2 --pdims 2x4

Units are grid cells; one particle per cell, the particle of site (i, j, k) at (i, j, k) + dx.
The toy cosmology is a static box with lap(phi) = delta (the density contrast), so forces are
-grad(phi); see docs/howto/painting.md for what each call does.  At the end the forces of the
distributed run are compared with the same code on one device.
"""
from __future__ import annotations

import argparse
import os
import sys


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=32, help="grid cells per side (default 32)")
    p.add_argument("--steps", type=int, default=5, help="leapfrog steps (default 5)")
    p.add_argument("--pdims", default="4x2", help="mesh, e.g. 4x2 (default) or 8")
    p.add_argument("--sigma", type=float, default=0.3, help="initial rms displacement (cells)")
    p.add_argument("--window", default="cic", help="ngp, cic, tsc or pcs (default cic)")
    return p.parse_args(argv)


args = parse_args()
pdims = tuple(int(v) for v in args.pdims.split("x"))
n_dev = 1
for v in pdims:
    n_dev *= v
# Simulated CPU devices (before jax starts): on GPUs drop this line and use the real ones.
os.environ.setdefault("XLA_FLAGS", f"--xla_force_host_platform_device_count={n_dev}")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

import pencilfft  # noqa: E402

SHAPE = (args.n,) * 3


def gradient_kernels(k):
    """kx, ky, kz of the half spectrum, 1/k^2 (0 at k = 0), and the 4th-order finite-difference
    gradient kernels i (8 sin k - sin 2k) / 6."""
    kx, ky, kz = pencilfft.rfftfreq3d(k, s=SHAPE)
    k2 = kx**2 + ky**2 + kz**2
    inv_k2 = jnp.where(k2 == 0, 0, 1 / jnp.where(k2 == 0, 1, k2))
    grads = [1j * (8 * jnp.sin(w) - jnp.sin(2 * w)) / 6 for w in (kx, ky, kz)]
    return k2, inv_k2, grads


def lpt(noise, sigma: float):
    """Zel'dovich displacements from white noise: dx = -grad(lap^-1 delta), delta smoothed."""
    k = pencilfft.prfft3d(noise)
    k2, inv_k2, grads = gradient_kernels(k)
    delta = k * jnp.exp(-0.5 * k2 * 1.5**2)
    dx = jnp.stack([pencilfft.pirfft3d(g * delta * inv_k2, SHAPE) for g in grads], axis=-1)
    return dx * (sigma / jnp.std(dx))


def forces(dx):
    """-grad(phi) at the particles, lap(phi) = density - 1: paint, FFT, kernels, 3 inverse
    FFTs, one readout of the 3 components.  (X, Y, Z, 3), split like dx."""
    rho = pencilfft.paint(dx, window=args.window)            # (X, Y, Z), mean 1
    k = pencilfft.prfft3d(rho)
    _, inv_k2, grads = gradient_kernels(k)
    f = jnp.stack([pencilfft.pirfft3d(g * k * inv_k2, SHAPE) for g in grads])  # (3, X, Y, Z)
    return jnp.moveaxis(pencilfft.readout(f, dx, window=args.window), 0, -1)


def leapfrog(dx, v, steps: int, dt: float = 0.1):
    def dkd(state, _):
        dx, v = state
        dx = dx + 0.5 * dt * v
        v = v + dt * forces(dx)
        return (dx + 0.5 * dt * v, v), None

    return jax.lax.scan(dkd, (dx, v), None, length=steps)[0]


def main() -> int:
    mesh = jax.make_mesh(pdims, ("x", "y")[: len(pdims)])
    field = NamedSharding(mesh, P(*("x", "y")[: len(pdims)]))
    noise = jax.device_put(np.random.default_rng(0).standard_normal(SHAPE).astype(np.float32),
                           field)
    dx = jax.jit(lambda n: lpt(n, args.sigma))(noise)
    v = jnp.zeros_like(dx)
    dx, v = jax.jit(leapfrog, static_argnums=2)(dx, v, args.steps)
    f = jax.jit(forces)(dx)
    rho = jax.jit(lambda d: pencilfft.paint(d, window=args.window))(dx)
    print(f"grid {SHAPE}, mesh {pdims}, {args.steps} steps: max |dx| = "
          f"{float(jnp.max(jnp.abs(dx))):.3f} cells, density in "
          f"[{float(rho.min()):.3f}, {float(rho.max()):.3f}], mean {float(rho.mean()):.6f}")
    # The same forces on one device (no mesh: pencilfft runs the one-device algorithm).
    one = jax.devices()[0]
    f1 = jax.jit(forces)(jax.device_put(np.asarray(dx), one))
    err = float(np.max(np.abs(np.asarray(f) - np.asarray(f1))) / np.max(np.abs(np.asarray(f1))))
    print(f"max |force - reference| / max |reference| = {err:.2e} (reference: one device)")
    return 0 if err < 1e-4 else 1


if __name__ == "__main__":
    sys.exit(main())
