"""Dealiasing with the N-D names (issue 67): `dealias_mask` (the 2/3 rule) and `pad_spectrum` /
`truncate_spectrum` (the 3/2 rule) against a float64 numpy reference, the product of two
band-limited 2-D fields computed exactly; real and complex, 1- and 2-axis meshes, Explicit and
Auto, under jit; the mask's values and sharding; no all-gather in the compiled programs; the
errors, each naming its argument."""
from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

import pencilfft
from conftest import MPIRUN, make_mesh, put_global, rel_err, to_numpy

N = (16, 32)  # the coarse grid: both lengths and their 3/2 (24, 48) divide over 8 devices
M = (24, 48)
TOL = 1e-12  # float64


# ----------------------------------------------------------------------------------------------
# The numpy reference


def freqs(n: int) -> np.ndarray:
    """Signed integer frequencies of an n-point transform."""
    return np.rint(np.fft.fftfreq(n) * n).astype(int)


def band_limited(shape, cut, real: bool, seed: int) -> np.ndarray:
    """A random field whose modes are |m| < cut[i] / 2 along each axis i (cut = n: every mode
    but an even n's Nyquist; cut = 2n/3: the 2/3 rule's)."""
    rng = np.random.default_rng(seed)
    k = np.fft.fftn(rng.standard_normal(shape) + (0 if real else 1j * rng.standard_normal(shape)))
    for i, n in enumerate(shape):
        view = [1] * len(shape)
        view[i] = n
        k = k * (2 * np.abs(freqs(n)) < cut[i]).reshape(view)
    x = np.fft.ifftn(k)
    return x.real if real else x


def exact_product_spectrum(u, v, keep) -> np.ndarray:
    """fftn of u * v computed without aliasing (on a grid twice as long, where the product of
    two fields of modes |m| < n/2 fits), its modes |m| < keep[i] / 2 along each axis (others
    zero), in the n-point layout."""
    shape = u.shape
    fine = tuple(2 * n for n in shape)

    def on_fine(x):
        k = np.fft.fftn(x)
        kf = np.zeros(fine, complex)
        kf[np.ix_(*(freqs(n) % f for n, f in zip(shape, fine)))] = k
        return np.fft.ifftn(kf) * np.prod(fine) / np.prod(shape)

    kf = np.fft.fftn(on_fine(u) * on_fine(v)) * np.prod(shape) / np.prod(fine)
    out = kf[np.ix_(*(freqs(n) % f for n, f in zip(shape, fine)))]
    for i, n in enumerate(shape):
        view = [1] * len(shape)
        view[i] = n
        out = out * (2 * np.abs(freqs(n)) < keep[i]).reshape(view)
    return out


def half(k: np.ndarray) -> np.ndarray:
    """The rfftn half of a full spectrum (last axis)."""
    return k[..., : k.shape[-1] // 2 + 1]


# ----------------------------------------------------------------------------------------------
# The dealiased products, as a user writes them (one compiled function per case)


def product_32(u, v, real: bool):
    """u * v dealiased by the 3/2 rule: padded spectra, the product on the 3/2 grid, cut."""
    if real:
        a = pencilfft.irfftn(pencilfft.pad_spectrum(pencilfft.rfftn(u), real=True), s=M)
        b = pencilfft.irfftn(pencilfft.pad_spectrum(pencilfft.rfftn(v), real=True), s=M)
        return pencilfft.truncate_spectrum(pencilfft.rfftn(a * b), real=True)
    a = pencilfft.ifftn(pencilfft.pad_spectrum(pencilfft.fftn(u)))
    b = pencilfft.ifftn(pencilfft.pad_spectrum(pencilfft.fftn(v)))
    return pencilfft.truncate_spectrum(pencilfft.fftn(a * b))


def product_23(u, v, real: bool):
    """u * v dealiased by the 2/3 rule: the product on the grid, its spectrum masked."""
    k = pencilfft.rfftn(u * v) if real else pencilfft.fftn(u * v)
    return k * pencilfft.dealias_mask(k, real=real)


MESHES = {"1-axis": ((8,), P("x")), "2-axis": ((4, 2), P("x", "y"))}
# The 3/2 rule (the padding moves data) on both meshes, real and complex, on Explicit meshes
# and, on the 2-axis one, on Auto (the partitioner's path); the 2/3 rule (a local mask) twice.
CASES = [("3/2", mesh, real, "explicit") for mesh in MESHES for real in (True, False)] + [
    ("3/2", "2-axis", True, "auto"), ("3/2", "2-axis", False, "auto"),
    ("2/3", "1-axis", True, "explicit"), ("2/3", "2-axis", False, "auto")]
CASES = [pytest.param(*c, id=f"{c[0]}-{c[1]}-{'real' if c[2] else 'complex'}-{c[3]}",
                      marks=[MPIRUN] if c == ("3/2", "2-axis", True, "explicit") else [])
         for c in CASES]


# Under mpirun (one case): the moves of the padding are collective permutes across processes.
@pytest.mark.parametrize("rule, mesh_name, real, kind", CASES)
def test_dealiased_product_is_the_exact_truncated_product(rule, mesh_name, real, kind):
    pdims, spec = MESHES[mesh_name]
    mesh = make_mesh(pdims, kind)
    # 3/2: fields of every mode but Nyquist, the product's modes |m| < n/2 kept; 2/3: fields
    # of modes |m| < n/3, the product's |m| < n/3 kept.
    cut = N if rule == "3/2" else tuple(2 * n / 3 for n in N)
    u, v = (band_limited(N, cut, real, seed) for seed in (0, 1))
    want = exact_product_spectrum(u, v, cut)
    want = half(want) if real else want
    sharding = NamedSharding(mesh, spec)
    f = jax.jit(product_32 if rule == "3/2" else product_23, static_argnums=2)
    got = f(put_global(u, sharding), put_global(v, sharding), real)
    assert got.shape == want.shape
    assert rel_err(to_numpy(got), want) < TOL
    if kind == "explicit":  # the spectrum's own layout (an Auto jit's result is XLA's choice)
        k = (pencilfft.rfftn if real else pencilfft.fftn)(put_global(u, sharding))
        assert got.sharding.is_equivalent_to(k.sharding, 2), (got.sharding.spec, k.sharding.spec)


def test_the_product_aliases_without_dealiasing():
    """The reference tells the rules apart: the plain product on the n-point grid differs."""
    u, v = (band_limited(N, N, True, seed) for seed in (0, 1))
    plain = half(np.fft.fftn(u * v))
    assert rel_err(plain, half(exact_product_spectrum(u, v, N))) > 1e-2


# ----------------------------------------------------------------------------------------------
# The mask


def mask_reference(shape, axes, n, real, keep) -> np.ndarray:
    mask = np.ones([1] * len(shape), bool)
    for j, (i, m) in enumerate(zip(axes, n)):
        f = np.arange(m // 2 + 1) if real and j == len(axes) - 1 else freqs(m)
        view = [1] * len(shape)
        view[i] = f.size
        mask = mask & (2 * np.abs(f) * keep[1] < keep[0] * m).reshape(view)
    return mask


# (k's shape, its spec on a 4x2 mesh, axes, s, real, keep as (p, q), what the call passes)
MASKS = [
    ((48, 25), P(("x", "y")), None, None, True, (2, 3), {}),  # |m| < 16: 3|m| < 48 exactly
    ((48, 25), P("x"), None, (48, 49), True, (2, 3), {"s": (48, 49)}),  # odd: 3|m| < 49
    ((2, 24, 40), P("y", "x"), (1, 2), None, False, (1, 2), {"axes": (1, 2), "keep": 0.5}),
]


@pytest.mark.parametrize("shape, spec, axes, s, real, keep, kwargs", MASKS,
                         ids=["even-real", "odd-s-real", "batch-complex-half"])
@pytest.mark.parametrize("form", ["array", "jit", "shape"])
def test_mask_values_and_sharding(shape, spec, axes, s, real, keep, kwargs, form):
    """Values against numpy; the mask split like k along `axes`, whole (length 1) elsewhere."""
    mesh = make_mesh((4, 2))
    k = put_global(np.zeros(shape, np.complex128), NamedSharding(mesh, spec))
    call = lambda a: pencilfft.dealias_mask(a, real=real, **kwargs)  # noqa: E731
    # Under jit the mask uses no value of k: jax then takes its devices from the arguments it
    # keeps (as for jnp.zeros_like; or from jax.set_mesh).
    mask = {"array": lambda: call(k), "jit": lambda: jax.jit(call, keep_unused=True)(k),
            "shape": lambda: call(jax.ShapeDtypeStruct(k.shape, k.dtype,
                                                       sharding=k.sharding))}[form]()
    axes = tuple(range(len(shape))) if axes is None else axes
    n = s or tuple(shape[i] if j < len(axes) - 1 or not real else 2 * (shape[i] - 1)
                   for j, i in enumerate(axes))
    want = mask_reference(shape, axes, n, real, keep)
    assert mask.dtype == bool and mask.shape == want.shape
    np.testing.assert_array_equal(to_numpy(mask), want)
    k_spec = tuple(spec) + (None,) * (len(shape) - len(spec))
    want_spec = P(*(k_spec[i] if i in axes else None for i in range(len(shape))))
    assert mask.sharding.is_equivalent_to(NamedSharding(mesh, want_spec), len(shape)), (
        mask.sharding.spec, want_spec)


# ----------------------------------------------------------------------------------------------
# The padding maps


@pytest.mark.parametrize("norm", [None, "ortho", "forward"])
def test_pad_and_truncate_against_numpy(norm):
    """One device, odd and even lengths, one padding factor per axis: the padded spectrum is
    numpy's transform of the band-limited field sampled on the longer grid, and truncation
    gives the spectrum back (Nyquist zero)."""
    shape, padding = (9, 8, 6), (1.0, 1.5, 2.0)  # the first axis not transformed
    fine = (8 * 3 // 2, 6 * 2)
    x = band_limited(shape, shape, True, 2)
    k = np.fft.rfftn(x, axes=(1, 2), norm=norm)
    kp = pencilfft.pad_spectrum(k, axes=(1, 2), norm=norm, padding=padding[1:], real=True)
    # the field on the fine grid: its values from the spectrum's Fourier series, exactly
    ix = [np.arange(m) / m for m in fine]
    ky, kz = freqs(8), freqs(6)
    full = np.fft.fftn(x, axes=(1, 2))
    series = np.einsum("ajk,pj,qk->apq", full, np.exp(2j * np.pi * np.outer(ix[0], ky)),
                       np.exp(2j * np.pi * np.outer(ix[1], kz))).real / 48
    assert kp.shape == (9, 12, 7)
    assert rel_err(np.asarray(kp), np.fft.rfftn(series, axes=(1, 2), norm=norm)) < TOL
    back = pencilfft.truncate_spectrum(kp, s=(8, 6), axes=(1, 2), norm=norm,
                                       padding=padding[1:], real=True)
    assert rel_err(np.asarray(back), k) < TOL


def test_pad_is_linear_under_grad_and_vmap():
    """jax.vjp of a sharded pad_spectrum is the local one's; vmap over a batch is axes=(1, 2)."""
    mesh = make_mesh((4, 2))
    k_np = np.fft.fftn(band_limited((2, 16, 32), (2, 16, 32), False, 3), axes=(1, 2))
    k = put_global(k_np, NamedSharding(mesh, P("y", "x")))
    pad = lambda a: pencilfft.pad_spectrum(a, axes=(1, 2))  # noqa: E731
    y, vjp = jax.vjp(jax.jit(pad), k)
    w = put_global(np.ones(y.shape, np.complex128) * (1 + 2j), y.sharding)
    y_local, vjp_local = jax.vjp(pad, jnp.asarray(k_np))
    assert rel_err(to_numpy(y), np.asarray(y_local)) < TOL
    assert rel_err(to_numpy(vjp(w)[0]), np.asarray(vjp_local(jnp.asarray(to_numpy(w)))[0])) < TOL
    batched = jax.jit(jax.vmap(pencilfft.pad_spectrum))(k)
    assert rel_err(to_numpy(batched), to_numpy(y)) < TOL


@pytest.mark.parametrize("kind", ["explicit", "auto"])
def test_compiled_programs_gather_nothing(kind):
    """k * mask is local; padding moves blocks by collective permutes, never a gather."""
    mesh = make_mesh((4, 2), kind)
    k = put_global(np.zeros((16, 32), np.complex128), NamedSharding(mesh, P(None, ("y", "x"))))
    masked = jax.jit(lambda a: a * pencilfft.dealias_mask(a)).lower(k).compile().as_text()
    for op in ("all-gather", "all-to-all", "collective-permute", "all-reduce"):
        assert op not in masked, op
    padded = jax.jit(lambda a: pencilfft.truncate_spectrum(pencilfft.pad_spectrum(a)))
    text = padded.lower(k).compile().as_text()
    assert "collective-permute" in text
    for op in ("all-gather", "all-to-all", "all-reduce"):
        assert op not in text, op


# ----------------------------------------------------------------------------------------------
# Errors


K2 = np.zeros((16, 9), np.complex64)  # rfftn of (16, 16)
ERRORS = [
    (lambda: pencilfft.dealias_mask([1, 2, 3]), TypeError, "`k`"),
    (lambda: pencilfft.dealias_mask(K2, real=True, keep=0), ValueError, "`keep`"),
    (lambda: pencilfft.dealias_mask(K2, real=True, keep="2/3"), TypeError, "`keep`"),
    (lambda: pencilfft.dealias_mask(K2, s=(16, 20), real=True), ValueError, "`s`"),
    (lambda: pencilfft.dealias_mask(K2, axes=(0, 2)), ValueError, "`axes`"),
    (lambda: pencilfft.pad_spectrum(K2, real=True, padding=0.5), ValueError, "`padding`"),
    (lambda: pencilfft.pad_spectrum(K2, real=True, padding=(1.5, 1.5, 1.5)), ValueError,
     "`padding`"),
    (lambda: pencilfft.pad_spectrum(K2, s=(15, 16), real=True), ValueError, "`s`"),
    (lambda: pencilfft.pad_spectrum(K2, s=(16, 16), real=True, padding=1.1), ValueError,
     "`s[0]`"),
    (lambda: pencilfft.pad_spectrum(K2, norm="none", real=True), ValueError, "`norm`"),
    (lambda: pencilfft.pad_spectrum(jax.ShapeDtypeStruct((16, 9), np.complex64)), TypeError,
     "`k`"),
    (lambda: pencilfft.truncate_spectrum(K2, s=(16, 16), real=True), ValueError, "`k` has 16"),
    (lambda: pencilfft.truncate_spectrum(np.zeros((24, 13), np.int32)), TypeError, "`k`"),
]


@pytest.mark.parametrize("call, error, named", ERRORS, ids=[f"{e[2]}-{i}" for i, e in
                                                            enumerate(ERRORS)])
def test_errors_name_the_argument(call, error, named):
    with pytest.raises(error, match=re.escape(named)):
        call()


def test_a_split_the_padded_length_does_not_fit_is_refused():
    mesh = make_mesh((8,))
    k = put_global(np.zeros((8, 16), np.complex128), NamedSharding(mesh, P("x")))
    with pytest.raises(ValueError, match=r"12 entries along axis 0.*do not divide"):
        pencilfft.pad_spectrum(k)  # 8 -> 12 over 8 devices
