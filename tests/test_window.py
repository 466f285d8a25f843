"""window_compensation: its values against float64 numpy, eagerly and under jit, on a sharded
spectrum's wavenumbers, and its argument checks (issue 57: the spectrum itself, passed instead
of its wavenumber vectors, used to broadcast silently into a meaningless array).
"""
from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

import pencilfft

from conftest import make_mesh, to_numpy

SUPPORT = {"ngp": 1, "cic": 2, "tsc": 3, "pcs": 4}
SHAPE = (8, 4, 6)


def numpy_compensation(shape, window):
    """float64: prod_i (sin(k_i/2) / (k_i/2))^s over the half spectrum (X, Y, Z//2+1)."""
    ks = [2 * np.pi * np.fft.fftfreq(shape[0]), 2 * np.pi * np.fft.fftfreq(shape[1]),
          2 * np.pi * np.fft.rfftfreq(shape[2])]
    out = np.ones((len(ks[0]), len(ks[1]), len(ks[2])))
    for axis, k in enumerate(ks):
        half = k / 2
        w = np.where(half == 0, 1.0, np.sin(half) / np.where(half == 0, 1, half))
        out = out * (w ** SUPPORT[window]).reshape([-1 if a == axis else 1 for a in range(3)])
    return out


def _numpy_kvecs(shape):
    return (2 * np.pi * np.fft.fftfreq(shape[0])[:, None, None],
            2 * np.pi * np.fft.fftfreq(shape[1])[None, :, None],
            2 * np.pi * np.fft.rfftfreq(shape[2])[None, None, :])


@pytest.mark.parametrize("window", list(SUPPORT))
def test_against_numpy(window):
    ref = numpy_compensation(SHAPE, window)
    kvecs = _numpy_kvecs(SHAPE)
    np.testing.assert_allclose(np.asarray(pencilfft.window_compensation(kvecs, window)), ref,
                               rtol=1e-12)
    # a list, and under jit
    got = jax.jit(lambda a, b, c: pencilfft.window_compensation([a, b, c], window))(*kvecs)
    np.testing.assert_allclose(np.asarray(got), ref, rtol=1e-12)


def test_on_a_sharded_spectrum():
    """rfftfreq3d's vectors of a sharded half spectrum (layout (Y, Z, X)), under jit: the
    compensation broadcasts against the spectrum and is sharded like it."""
    shape = (16, 8, 8)
    mesh = make_mesh((4, 2))
    x = jax.device_put(np.ones(shape), NamedSharding(mesh, P("x", "y")))

    @jax.jit
    def divided(x):
        k = pencilfft.prfft3d(x)
        w = pencilfft.window_compensation(pencilfft.rfftfreq3d(k, s=shape), "tsc")
        return k, w, k / w

    k, w, d = divided(x)
    ref = numpy_compensation(shape, "tsc").transpose(1, 2, 0)  # (Y, Z//2+1, X)
    assert w.shape == d.shape == k.shape
    np.testing.assert_allclose(to_numpy(w)[:, : shape[2] // 2 + 1], ref, rtol=1e-12)
    np.testing.assert_allclose(to_numpy(d)[:, : shape[2] // 2 + 1],
                               to_numpy(k)[:, : shape[2] // 2 + 1] / ref, rtol=1e-12)


_SPECTRUM = np.ones((4, 3, 8), np.complex64)
_K = _numpy_kvecs((8, 4, 6))


@pytest.mark.parametrize("kvecs,error,message", [
    (_SPECTRUM, TypeError,
     "`kvecs` must be a tuple or list of the three wavenumber arrays (kx, ky, kz); got an array "
     "of shape (4, 3, 8) and dtype complex64 (the spectrum itself?"),
    (np.stack([np.zeros(4)] * 3), TypeError, "`kvecs` must be a tuple or list"),
    (_K[:2], ValueError, "`kvecs` must hold three wavenumber arrays (kx, ky, kz); got 2"),
    ((_K[0], _K[1], _SPECTRUM), TypeError,
     "`kvecs[2]` must hold real wavenumbers (integer or float); got dtype complex64"),
    ((_K[0], _K[1], _K[2] > 0), TypeError, "`kvecs[2]` must hold real wavenumbers"),
    ((_K[0], "ky", _K[2]), TypeError,
     "`kvecs[1]` must be a real array of wavenumbers (3 dimensions); got a str"),
    ((np.zeros(4),) * 3, ValueError,
     "`kvecs[0]` must have 3 dimensions (e.g. kx of shape (X, 1, 1), as pencilfft.rfftfreq3d "
     "returns); got shape (4,): reshape 1-D vectors"),
    ((_K[0], _K[1], np.zeros((1, 5, 1))), ValueError,
     "`kvecs` must broadcast against each other; got shapes [(8, 1, 1), (1, 4, 1), (1, 5, 1)]"),
])
@pytest.mark.parametrize("form", ["eager", "jit"])
def test_wrong_kvecs(kvecs, error, message, form):
    call = pencilfft.window_compensation
    if form == "jit":  # the checks read shapes and dtypes only: the same under jit
        arrays = [a for a in (kvecs if isinstance(kvecs, tuple) else (kvecs,))
                  if isinstance(a, np.ndarray)]
        if len(arrays) != (len(kvecs) if isinstance(kvecs, tuple) else 1):
            pytest.skip("a non-array element cannot be a jit argument")
        if isinstance(kvecs, tuple):
            call = jax.jit(lambda *ks: pencilfft.window_compensation(ks))
            with pytest.raises(error, match=re.escape(message)):
                call(*kvecs)
            return
        call = jax.jit(pencilfft.window_compensation)
    with pytest.raises(error, match=re.escape(message)):
        call(kvecs)


def test_wrong_window():
    with pytest.raises(ValueError, match=re.escape("`window` must be one of")):
        pencilfft.window_compensation(_K, "lanczos")
    with pytest.raises(TypeError, match=re.escape("`window` must be one of")):
        pencilfft.window_compensation(_K, 2)


def test_jnp_arrays_and_integers():
    """jax arrays and integer wavenumbers (k = 0 only) are taken as they are."""
    ks = tuple(jnp.asarray(k) for k in _K)
    np.testing.assert_allclose(np.asarray(pencilfft.window_compensation(ks, "cic")),
                               numpy_compensation((8, 4, 6), "cic"), rtol=1e-12)
    zero = np.zeros((1, 1, 1), np.int32)
    assert float(pencilfft.window_compensation((zero, zero, zero), "pcs")[0, 0, 0]) == 1.0
