"""Gaussian initial conditions, their first-order LPT displacement, and their power spectrum.

    python examples/lpt_power.py --n 128 --box 500     # 8 devices (or 8 simulated CPU devices)

A white-noise field is coloured with a power-law spectrum P(k) = A k^-2 on the sharded grid
(`prfft3d`, `rfftfreq3d`, `pirfft3d`), displaced with the Zel'dovich approximation
(psi_k = i k / k^2 delta_k, one inverse transform per component), and measured with
`power_spectrum`: the measured P(k) follows the input one.  The displacement is checked against
numpy on the gathered grid (keep `--n` small for that check).
"""
from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np

import pencilfft

AMPLITUDE = 100.0  # A of P(k) = A k^-2, in the box's units


def initial_conditions(key: jax.Array, mesh, n: int, box: float) -> jax.Array:
    """delta on an n^3 grid of a box of side `box`, sharded in real space, P(k) = A k^-2."""
    with jax.set_mesh(mesh):  # each device draws its own block of the white noise
        white = jax.random.normal(key, (n, n, n),
                                  out_sharding=pencilfft.real_space_sharding(mesh))
    return jax.jit(colour, static_argnums=1)(white, box)


def colour(white: jax.Array, box: float) -> jax.Array:
    """White noise -> a field with P(k) = A k^-2 (as `power_spectrum` measures it)."""
    shape = white.shape[-3:]
    n = shape[0]
    wk = pencilfft.prfft3d(white)                                   # (Y, Z//2+1 padded, X)
    kx, ky, kz = pencilfft.rfftfreq3d(wk, d=box / n, s=shape)       # physical wavenumbers
    k2 = kx**2 + ky**2 + kz**2
    cell_volume = (box / n) ** 3  # power_spectrum's P(k) is per unit volume
    amplitude = jnp.sqrt(jnp.where(k2 > 0, AMPLITUDE / jnp.where(k2 > 0, k2, 1), 0) / cell_volume)
    return pencilfft.pirfft3d(wk * amplitude, shape)


def displacement(delta: jax.Array, box: float) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The Zel'dovich displacement psi (three fields, each sharded like delta): div psi = -delta."""
    shape = delta.shape[-3:]
    dk = pencilfft.prfft3d(delta)
    kvec = pencilfft.rfftfreq3d(dk, d=box / shape[0], s=shape)
    k2 = sum(k**2 for k in kvec)
    # The Nyquist wavenumber's gradient has no real counterpart: zero it (as numpy's below).
    nyquist = np.pi * shape[0] / box
    kvec = [jnp.where(jnp.abs(k) > 0.999 * nyquist, 0, k) for k in kvec]
    inv_k2 = jnp.where(k2 > 0, 1 / jnp.where(k2 > 0, k2, 1), 0)
    return tuple(pencilfft.pirfft3d(1j * k * inv_k2 * dk, shape) for k in kvec)


def reference_displacement(delta: np.ndarray, box: float) -> list[np.ndarray]:
    """numpy's psi on the whole grid."""
    n = delta.shape[0]
    k = np.meshgrid(*[2 * np.pi * np.fft.fftfreq(n, box / n)] * 3, indexing="ij")
    k2 = sum(kk**2 for kk in k)
    dk = np.fft.fftn(delta)
    k = [np.where(np.abs(kk) > 0.999 * np.pi * n / box, 0, kk) for kk in k]
    return [np.fft.ifftn(1j * kk * np.where(k2 > 0, 1 / np.where(k2 > 0, k2, 1), 0) * dk).real
            for kk in k]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=128, help="grid side (default 128)")
    parser.add_argument("--box", type=float, default=500.0, help="box side (default 500)")
    parser.add_argument("--mesh", default="4x2", help="mesh shape P x Q (default 4x2)")
    args = parser.parse_args(argv)
    mesh = jax.make_mesh(tuple(int(p) for p in args.mesh.split("x")), ("x", "y"))

    delta = initial_conditions(jax.random.key(42), mesh, args.n, args.box)
    psi = jax.jit(displacement, static_argnums=1)(delta, args.box)
    k, pk = pencilfft.power_spectrum(delta, box_shape=(args.box,) * 3)

    k, pk = np.asarray(k), np.asarray(pk)
    ratio = pk / (AMPLITUDE / k**2)
    print(f"delta {delta.shape} sharded {delta.sharding.spec}; psi rms "
          f"{float(np.sqrt(sum(np.mean(np.asarray(p) ** 2) for p in psi))):.3g}")
    for kk, p, r in zip(k, pk, ratio):
        print(f"  k {kk:8.4f}  P(k) {p:10.4g}  measured / input {r:5.2f}")
    errors = [np.abs(np.asarray(p) - ref).max() / np.abs(ref).max()
              for p, ref in zip(psi, reference_displacement(np.asarray(delta, np.float64), args.box))]
    print(f"psi against numpy: {max(errors):.1e}")
    if max(errors) > 1e-4:
        print("error: the displacement differs from numpy's")
        return 1
    if not 0.75 < np.median(ratio) < 1.33:  # a power law, up to the sample variance of few modes
        print(f"error: the measured spectrum does not follow the input one (median ratio "
              f"{np.median(ratio):.2f})")
        return 1
    return 0


if __name__ == "__main__":
    jax.config.update("jax_num_cpu_devices", 8)  # 8 simulated devices where there is only a CPU
    raise SystemExit(main())
