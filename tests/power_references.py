"""The float64 numpy reference of `power_spectrum`: JaxPM's definition, in our words, shared by
tests/test_power.py and tests/test_brick_power.py (a test file never imports another test file,
tests/test_suite_rules.py).

`reference` is `jaxpm.utils.power_spectrum` of one whole field: fftn(norm="ortho"), bins by
np.digitize of |k| on the N^3 grid, k = mean |k| per bin, pk = per-bin mean of (2 ell + 1)
L_ell(mu) |F|^2 times prod(box / shape), bins 1..n-1.  Two deliberate differences: a mode whose
|k| equals an edge in exact arithmetic goes to the upper bin (np.digitize's rule; JaxPM's own
placement of those modes depends on rounding), and a cross spectrum is the real part of the
binned cross power (JaxPM takes the modulus of the complex sum).
"""
from __future__ import annotations

import numpy as np

from conftest import rel_err, tol

TIE = 1e-9  # relative: |k|^2 within this of an edge^2 counts as on it


def jaxpm_edges(kedges, shape, box):
    kmax = np.pi * np.min(np.asarray(shape) / np.asarray(box))
    if kedges is None or isinstance(kedges, (int, float)):
        if kedges is None:
            dk = 2 * np.pi / np.min(box) * 2
        elif isinstance(kedges, int):
            dk = kmax / (kedges + 1)
        else:
            dk = kedges
        return np.arange(dk, kmax, dk) + dk / 2
    return np.asarray(kedges, float)


SUPPORT = {"ngp": 1, "cic": 2, "tsc": 3, "pcs": 4}


def window_transfer(shape, windows):
    """prod over windows and axes of sinc(k_i / 2)^s on the full grid (k_i in radians per cell),
    written from the windows' definition (nbodykit's CompensateCIC etc., Jing 2005 eq. 18)."""
    w = np.ones(shape)
    for name in windows:
        for axis, n in enumerate(shape):
            k = 2 * np.pi * np.fft.fftfreq(n)
            shape1 = [1, 1, 1]
            shape1[axis] = n
            w = w * (np.sinc(k / (2 * np.pi)) ** SUPPORT[name]).reshape(shape1)
    return w


def reference(field, field2=None, *, box_shape=None, kedges=None, multipoles=0, los=(0, 0, 1),
              jaxpm_cross=False, exact_ties=True, windows=(), shot=None, counts=False):
    """(k, pk) of JaxPM's power_spectrum for one 3-D field (numpy, float64); with `windows`, each
    mode's power divided by their transfer functions; with `shot`, that subtracted from the
    monopole; with `counts`, (k, pk, modes per bin) counted on the whole grid."""
    shape = np.array(field.shape)
    box = shape.astype(float) if box_shape is None else np.asarray(box_shape, float)
    edges = jaxpm_edges(kedges, shape, box)
    kvec = [(2 * np.pi * m / length) * np.fft.fftfreq(m).reshape(s)
            for m, length, s in zip(shape, box, np.eye(3, dtype=int) * -2 + 1)]
    k2 = sum(k ** 2 for k in kvec)
    kmesh = np.sqrt(k2)
    if exact_ties:
        thresholds = np.where(edges > 0, edges ** 2 * (1 - TIE), -np.inf)  # edges <= 0: all
        dig = np.searchsorted(thresholds, k2.ravel(), side="right")
    else:
        dig = np.digitize(kmesh.ravel(), edges)
    n_bins = len(edges) + 1
    count = np.bincount(dig, minlength=n_bins)
    with np.errstate(invalid="ignore"):  # an empty bin is NaN, as in JaxPM
        kavg = (np.bincount(dig, weights=kmesh.ravel(), minlength=n_bins) / count)[1:-1]
    if np.ndim(multipoles) == 0 and multipoles == 0:
        mu = 1.0
    else:
        d = np.asarray(los, float) / np.linalg.norm(los)
        mu = sum(k * c for k, c in zip(kvec, d))
        mu = np.where(kmesh == 0, 0, mu / np.where(kmesh == 0, 1, kmesh))
    f = np.fft.fftn(np.asarray(field, np.float64), norm="ortho")
    if field2 is None:
        power = np.abs(f) ** 2
    else:
        power = f * np.fft.fftn(np.asarray(field2, np.float64), norm="ortho").conj()
    power = power / window_transfer(field.shape, windows)
    pk = []
    for ell in np.atleast_1d(multipoles):
        w = (power * (2 * ell + 1) * np.polynomial.legendre.legval(mu, [0] * ell + [1])).ravel()
        if field2 is None:
            s = np.bincount(dig, weights=w, minlength=n_bins)
        else:
            re = np.bincount(dig, weights=w.real, minlength=n_bins)
            im = np.bincount(dig, weights=w.imag, minlength=n_bins)
            s = np.hypot(re, im) if jaxpm_cross else re
        pk.append(s)
    with np.errstate(invalid="ignore"):
        pk = (np.stack(pk) / count)[:, 1:-1] * np.prod(box / shape)
    if shot is not None:
        pk = pk - shot * (np.atleast_1d(multipoles) == 0)[:, None]
    pk = pk[0] if np.ndim(multipoles) == 0 else pk
    return (kavg, pk, count[1:-1]) if counts else (kavg, pk)


def assert_close(got, ref, dtype, what=""):
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    assert got.shape == ref.shape, (what, got.shape, ref.shape)
    assert np.array_equal(np.isnan(got), np.isnan(ref)), what  # empty bins: NaN in both
    err = rel_err(np.nan_to_num(got), np.nan_to_num(ref))
    assert err <= tol(dtype), (what, err)
