"""Padded (dealiased) transforms: `padding=` on pfft3d/pifft3d/prfft3d/pirfft3d/ptransform3d,
against a numpy reference of the same rule and against the exact convolution."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pencilfft
from conftest import (MPIRUN, PDIMS, check_directional_derivative, make_mesh, put_global,
                      random_field, rel_err, to_numpy)

N = (16, 16, 16)
M = (24, 24, 24)  # the 3/2 grid: every 8-device mesh splits it


# ------------------------------------------------------------------------------ numpy reference


def np_pad(k, axis, m, half=False):
    """The N-mode spectrum zero-padded to the m-point grid's along `axis` (Nyquist split)."""
    k = np.moveaxis(k, axis, 0)
    n = (k.shape[0] - 1) * 2 if half else k.shape[0]  # even n for half spectra in these tests
    if half:
        out = np.zeros((m // 2 + 1,) + k.shape[1:], k.dtype)
        out[: n // 2 + 1] = k
        out[n // 2] = 0.5 * k[n // 2].real  # -N/2 is implicit: the real part, halved
    else:
        out = np.zeros((m,) + k.shape[1:], k.dtype)
        out[: n // 2] = k[: n // 2]
        out[m - n // 2 + 1:] = k[n // 2 + 1:]
        out[n // 2] = out[m - n // 2] = 0.5 * k[n // 2]
    return np.moveaxis(out * (m / n), 0, axis)


def np_truncate(k, axis, n, half=False):
    """The fine spectrum's n lowest modes along `axis` (Nyquist summed, or doubled if `half`)."""
    k = np.moveaxis(k, axis, 0)
    m = (k.shape[0] - 1) * 2 if half else k.shape[0]
    if m == n:  # an axis without padding
        return np.moveaxis(k, 0, axis)
    if half:
        out = k[: n // 2 + 1].copy()
        out[n // 2] = 2 * out[n // 2].real  # + its implicit conjugate at -N/2
    else:
        out = np.concatenate([k[: n // 2], k[n // 2: n // 2 + 1] + k[m - n // 2: m - n // 2 + 1],
                              k[m - n // 2 + 1:]])
    return np.moveaxis(out * (n / m), 0, axis)


def np_inverse(k, m_shape):
    for axis, m in enumerate(m_shape):
        k = np_pad(k, axis, m)
    return np.fft.ifftn(k)


def np_forward(u, n_shape):
    k = np.fft.fftn(u)
    for axis, n in enumerate(n_shape):
        k = np_truncate(k, axis, n)
    return k


def spectrum(shape, seed, band=None):
    """A random N-mode spectrum (natural order); `band`: zero beyond |k| < band on each axis."""
    k = random_field(shape, np.complex128, seed)
    if band is not None:
        for axis, n in enumerate(shape):
            f = np.abs(np.fft.fftfreq(n, 1 / n))
            shape1 = [1, 1, 1]
            shape1[axis] = n
            k = k * (f < band).reshape(shape1)
    return k


def k_placed(k, pdims):
    """A natural-order spectrum as pencilfft's transposed k-space array on `pdims`."""
    kt = k.transpose(1, 2, 0)
    if pdims is None:
        return jnp.asarray(kt)
    return put_global(kt, pencilfft.k_space_sharding(make_mesh(pdims)))


def product_spectrum(k1, k2, pdims, padding):
    u1 = pencilfft.pifft3d(k_placed(k1, pdims), s=N, padding=padding)
    u2 = pencilfft.pifft3d(k_placed(k2, pdims), s=N, padding=padding)
    kw = pencilfft.pfft3d(u1 * u2, padding=padding)
    return to_numpy(kw).transpose(2, 0, 1), u1  # natural order


# ------------------------------------------------------------------------------ tests


@pytest.mark.parametrize("pdims", PDIMS + [None], ids=lambda p: "x".join(map(str, p)) if p else "1dev")
def test_dealiased_product_equals_numpy_reference(pdims):
    k1, k2 = spectrum(N, 1), spectrum(N, 2)
    got, u1 = product_spectrum(k1, k2, pdims, 1.5)
    assert u1.shape == M
    assert rel_err(to_numpy(u1), np_inverse(k1, M)) < 1e-12
    want = np_forward(np_inverse(k1, M) * np_inverse(k2, M), N)
    assert got.shape == N and rel_err(got, want) < 1e-12


@pytest.mark.parametrize("pdims", [(4, 2), (1, 8), (8,)], ids=lambda p: "x".join(map(str, p)))
def test_three_halves_rule_removes_aliasing(pdims):
    """Band-limited fields (|k| < N/2 per axis): the 3/2-rule product is the exact convolution
    (computed here on a 2N grid, where nothing aliases), to round-off; without padding the
    same product aliases."""
    k1, k2 = spectrum(N, 3, band=8), spectrum(N, 4, band=8)
    twice = tuple(2 * n for n in N)
    exact = np_forward(np_inverse(k1, twice) * np_inverse(k2, twice), N)
    dealiased, _ = product_spectrum(k1, k2, pdims, 1.5)
    assert rel_err(dealiased, exact) < 1e-12
    aliased, _ = product_spectrum(k1, k2, pdims, 1)
    assert rel_err(aliased, exact) > 1e-2


def test_band_limited_values_are_kept():
    """On the 3/2 grid, fine[::3] equals the unpadded inverse's coarse[::2]."""
    k = spectrum(N, 5)
    mesh = (4, 2)
    fine = to_numpy(pencilfft.pifft3d(k_placed(k, mesh), s=N, padding=1.5))
    coarse = to_numpy(pencilfft.pifft3d(k_placed(k, mesh)))
    assert rel_err(fine[::3, ::3, ::3], coarse[::2, ::2, ::2]) < 1e-12


# Under mpirun: one representative of the padded (3/2-rule) transforms across processes.
@pytest.mark.parametrize("pdims", [pytest.param((4, 2), marks=MPIRUN), (2, 4), (1, 8), (8,), None],
                         ids=lambda p: "x".join(map(str, p)) if p else "1dev")
@pytest.mark.parametrize("layout", ["transposed", "natural"])
def test_real_to_complex_round_trip_and_reference(pdims, layout):
    x = random_field(N, np.float64, 6)
    mesh = make_mesh(pdims) if pdims else None
    k = pencilfft.prfft3d(put_global(x, pencilfft.real_space_sharding(mesh)) if mesh else x,
                          layout=layout)
    fine = pencilfft.pirfft3d(k, N, layout=layout, padding=1.5)
    assert fine.shape == M and fine.dtype == np.float64
    coarse = to_numpy(pencilfft.pirfft3d(k, N, layout=layout))
    assert rel_err(to_numpy(fine)[::3, ::3, ::3], coarse[::2, ::2, ::2]) < 1e-12
    back = pencilfft.prfft3d(fine, layout=layout, padding=1.5)
    assert back.shape == k.shape and rel_err(to_numpy(back), to_numpy(k)) < 1e-12
    # against numpy: the full spectrum padded, inverted, truncated to the half spectrum
    full = np.fft.fftn(x)
    want = np_inverse(full, M).real
    assert rel_err(to_numpy(fine), want) < 1e-12


@pytest.mark.parametrize("norm", ["backward", "ortho", "forward"])
def test_per_axis_padding_and_norms(norm):
    n, padding = (16, 8, 12), (1.5, 1, 2)
    grid = (24, 8, 24)
    x = random_field(grid, np.complex128, 7)
    mesh = make_mesh((4, 2))
    k = pencilfft.pfft3d(put_global(x, pencilfft.real_space_sharding(mesh)), norm,
                         padding=padding)
    assert k.shape == (8, 12, 16)  # (Y, Z, X) of the N modes
    scale = {"backward": 1.0, "ortho": np.sqrt(np.prod(grid) / np.prod(n)),
             "forward": np.prod(grid) / np.prod(n)}[norm]
    want = np.fft.fftn(x, norm=norm) * scale
    for axis, m in enumerate(n):
        want = np_truncate(want, axis, m)
    assert rel_err(to_numpy(k).transpose(2, 0, 1), want) < 1e-12
    back = pencilfft.pifft3d(k, norm, s=n, padding=padding)
    assert back.shape == grid
    assert rel_err(to_numpy(pencilfft.pfft3d(back, norm, padding=padding)), to_numpy(k)) < 1e-12


def test_padding_with_r2r_kinds_on_the_fourier_axes():
    kinds = ("dct2", "fft", "rfft")
    x = random_field((16, 24, 24), np.float64, 8)  # X unpadded (a DCT axis), Y and Z 3/2
    mesh = make_mesh((4, 2))
    k = pencilfft.ptransform3d(put_global(x, pencilfft.real_space_sharding(mesh)), kinds,
                               padding=(1, 1.5, 1.5))
    back = pencilfft.pitransform3d(k, kinds, s=(16, 16, 16), padding=(1, 1.5, 1.5))
    assert back.shape == x.shape
    again = pencilfft.ptransform3d(back, kinds, padding=(1, 1.5, 1.5))
    assert rel_err(to_numpy(again), to_numpy(k)) < 1e-12


def test_jit_auto_mesh_no_gather_and_gradient():
    mesh = make_mesh((4, 2), "auto")
    u = put_global(random_field(M, np.float64, 9), pencilfft.real_space_sharding(mesh))

    def f(v):
        return pencilfft.pifft3d(pencilfft.pfft3d(v, padding=1.5), s=N, padding=1.5)

    compiled = jax.jit(f).lower(u).compile().as_text()
    assert "all-gather" not in compiled
    want = np_inverse(np_forward(to_numpy(u), N), M)
    assert rel_err(to_numpy(jax.jit(f)(u)), want) < 1e-12
    check_directional_derivative(lambda v: jnp.sum(jnp.abs(f(v)) ** 2 * jnp.cos(v)), u, 10)


@pytest.mark.parametrize("call,err,match", [
    (lambda: pencilfft.ptransform3d(np.zeros((8, 8, 12)), ("dct2", "fft", "fft"), padding=1.5),
     ValueError, r"`padding\[0\]` = 1.5 on a 'dct2' axis"),
    (lambda: pencilfft.pfft3d(np.zeros((12, 12, 13)), padding=1.5), ValueError,
     r"`x.shape\[-1\]` = 13 is not `padding\[2\]` = 1.5 times a whole number"),
    (lambda: pencilfft.pifft3d(np.zeros((8, 9, 8), np.complex64), s=(8, 8, 9), padding=(1, 1, 1.5)),
     ValueError, r"`s\[2\]` = 9 times `padding\[2\]` = 1.5 is not a whole number"),
    (lambda: pencilfft.pfft3d(np.zeros((8, 8, 8)), padding=0.5), ValueError,
     r"`padding` must be one factor >= 1"),
    (lambda: pencilfft.pfft3d(np.zeros((8, 8, 8)), padding="1.5"), TypeError,
     r"`padding` must be a number or 3 numbers"),
])
def test_padding_errors(call, err, match):
    with pytest.raises(err, match=match):
        call()


def test_padded_grid_the_mesh_cannot_split():
    mesh = make_mesh((4, 2))
    k = put_global(np.zeros((4, 4, 4), np.complex128), pencilfft.k_space_sharding(mesh))
    with pytest.raises(ValueError, match=r"the padded grid \(6, 6, 6\).*must be divisible by mesh axis 'x'"):
        pencilfft.pifft3d(k, s=(4, 4, 4), padding=1.5)


@pytest.mark.parametrize("pdims", [(4, 2), (8, 1), (1, 8), None],
                         ids=lambda p: "x".join(map(str, p)) if p else "1dev")
def test_padded_half_spectrum_is_the_half_of_the_padded_full_one(pdims):
    """prfft3d(padding) of a real field on the padded grid is the first Z//2+1 planes of
    pfft3d(padding) of the same field: the kz = N/2 plane sums +N/2 and -N/2 as the complex
    transform does (and is Hermitian in (kx, ky)), on every path."""
    u = random_field(M, np.float64, 12)
    placed = (put_global(u, pencilfft.real_space_sharding(make_mesh(pdims))) if pdims
              else jnp.asarray(u))
    half = to_numpy(pencilfft.prfft3d(placed, padding=1.5, layout="natural"))
    full = to_numpy(pencilfft.pfft3d(placed, padding=1.5, layout="natural"))
    want = np_forward(u, N)
    assert rel_err(full, want) < 1e-12
    assert rel_err(half[..., : N[2] // 2 + 1], want[..., : N[2] // 2 + 1]) < 1e-12
