"""float64 numpy references of painting and readout on the lattice (particles at lattice site +
displacement, periodic), shared by tests/test_paint.py and tests/test_gpu.py: a test file never
imports another test file (tests/test_suite_rules.py)."""
from __future__ import annotations

import itertools

import numpy as np

from pencilfft._pm.window import weights as window_weights

SUPPORT = {"ngp": 1, "cic": 2, "tsc": 3, "pcs": 4}


def _stencil(dx, window):
    """float64 numpy: (cell indices, weight) of each of the s^3 cells the particles at lattice
    site + dx touch (periodic)."""
    X, Y, Z, _ = dx.shape
    s = SUPPORT[window]
    pos = np.stack(np.meshgrid(np.arange(X), np.arange(Y), np.arange(Z), indexing="ij"), -1) + dx
    t = pos + 1 - s / 2
    base = np.floor(t).astype(int)
    W = [[np.asarray(a) for a in window_weights(t[..., d] - base[..., d], window)] for d in range(3)]
    for a, b, c in itertools.product(range(s), repeat=3):
        idx = ((base[..., 0] + a) % X, (base[..., 1] + b) % Y, (base[..., 2] + c) % Z)
        yield idx, W[0][a] * W[1][b] * W[2][c]


def numpy_paint(dx, window, w=None):
    """float64 numpy: the density of particles at site + dx, periodic."""
    g = np.zeros(dx.shape[:3])
    w = np.ones(dx.shape[:3]) if w is None else w
    for idx, weight in _stencil(dx, window):
        np.add.at(g, idx, w * weight)
    return g


def numpy_read(f, dx, window):
    """float64 numpy: f at the particles at site + dx (the adjoint of `numpy_paint`)."""
    out = np.zeros(dx.shape[:3])
    for idx, weight in _stencil(dx, window):
        out += f[idx] * weight
    return out
