"""Gaussian initial conditions, their Zel'dovich displacement, the particles painted, and the
power spectra of both.

    python examples/lpt_power.py --n 128 --box 500     # 8 devices (or 8 simulated CPU devices)

`gaussian_field` draws a field with the power-law spectrum P(k) = A k^-2 on the sharded grid
(each device its own block), `zeldovich_displacement` gives the particles' displacement
psi_k = i k / k^2 delta_k, `paint` puts one particle per cell at q + D psi, and
`power_spectrum` measures both: the field's P(k) follows the input within cosmic variance (a
chi-squared over the bins with their mode counts), and the painted particles' CIC-compensated
P(k) follows D^2 P(k) at large scales.  The displacement is checked against numpy on the gathered grid (keep `--n` small
for that check).
"""
from __future__ import annotations

import argparse

import jax
import numpy as np

import pencilfft

AMPLITUDE = 100.0  # A of P(k) = A k^-2, in the box's units
GROWTH = 0.1  # D(a): the particles are displaced by D psi, early (small displacements)


def power(k):
    """The input spectrum, a function of |k| (radians per unit of the box)."""
    return AMPLITUDE * k ** -2.0


def reference_displacement(delta: np.ndarray, box: float) -> np.ndarray:
    """numpy's psi (X, Y, Z, 3) on the whole grid, each Nyquist component of k zeroed."""
    n = delta.shape[0]
    k = np.meshgrid(*[2 * np.pi * np.fft.fftfreq(n, box / n)] * 3, indexing="ij")
    k2 = sum(kk**2 for kk in k)
    dk = np.fft.fftn(delta)
    k = [np.where(np.abs(kk) > 0.999 * np.pi * n / box, 0, kk) for kk in k]
    return np.stack([np.fft.ifftn(1j * kk * np.where(k2 > 0, 1 / np.where(k2 > 0, k2, 1), 0)
                                  * dk).real for kk in k], axis=-1)


def chi2_per_bin(pk: np.ndarray, nmodes: np.ndarray, expected: np.ndarray) -> float:
    """chi^2 / dof of a measured spectrum: each bin's variance is 2 P^2 / N (N modes, k and -k
    counted apart, as `power_spectrum`'s counts and nbodykit's do)."""
    return float(np.mean((pk - expected) ** 2 / (2 * expected**2 / nmodes)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=128, help="grid side (default 128)")
    parser.add_argument("--box", type=float, default=500.0, help="box side (default 500)")
    parser.add_argument("--mesh", default="4x2", help="mesh shape P x Q (default 4x2)")
    args = parser.parse_args(argv)
    mesh = jax.make_mesh(tuple(int(p) for p in args.mesh.split("x")), ("x", "y"))
    box, shape = (args.box,) * 3, (args.n,) * 3

    delta = pencilfft.gaussian_field(jax.random.key(42), shape, power, box_shape=box, mesh=mesh)
    psi = pencilfft.zeldovich_displacement(delta, box_shape=box)      # (n, n, n, 3), box units
    rho = pencilfft.paint(GROWTH * psi * (args.n / args.box))       # in cells: one per cell
    k, pk, nmodes = pencilfft.power_spectrum(delta, box_shape=box, return_counts=True)
    _, pk_particles = pencilfft.power_spectrum(rho, box_shape=box, compensation="cic")

    k, pk, nmodes = np.asarray(k), np.asarray(pk), np.asarray(nmodes)
    ratio = pk / power(k)
    ratio_particles = np.asarray(pk_particles) / (GROWTH**2 * power(k))
    print(f"delta {delta.shape} sharded {delta.sharding.spec}; psi {psi.shape} sharded "
          f"{psi.sharding.spec}, rms {float(np.sqrt(np.mean(np.asarray(psi) ** 2))):.3g}")
    for kk, p, n, r, rp in zip(k, pk, nmodes, ratio, ratio_particles):
        print(f"  k {kk:8.4f}  modes {n:7d}  P(k) {p:10.4g}  measured / input {r:5.2f}  "
              f"particles / D^2 input {rp:5.2f}")
    reference = reference_displacement(np.asarray(delta, np.float64), args.box)
    error = np.abs(np.asarray(psi) - reference).max() / np.abs(reference).max()
    print(f"psi against numpy: {error:.1e}")
    if error > 1e-4:
        print("error: the displacement differs from numpy's")
        return 1
    chi2 = chi2_per_bin(pk, nmodes, power(k))  # P(k) at the bins' mean k: close enough here
    print(f"chi2 / dof of the field's P(k) against the input: {chi2:.2f}")
    if not chi2 < 3:
        print("error: the measured spectrum does not follow the input one")
        return 1
    if not 0.7 < ratio_particles[0] < 1.4:  # the largest scales: linear, window compensated
        print(f"error: the particles' spectrum does not follow the input at large scales "
              f"({ratio_particles[0]:.2f})")
        return 1
    return 0


if __name__ == "__main__":
    jax.config.update("jax_num_cpu_devices", 8)  # 8 simulated devices where there is only a CPU
    raise SystemExit(main())
