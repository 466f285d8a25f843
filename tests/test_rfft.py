"""prfft3d / pirfft3d against numpy float64 rfftn / irfftn, and the zero-padded k space.

Contract checked here (see `pencilfft.prfft3d`): the k-space Z axis (Z//2+1 for the real
transforms, Z for the complex ones) is zero-padded at its end to a multiple of the mesh axis that
splits it in k space (Pb), and Y to a multiple of Pa; slicing the padding off gives exactly numpy's
answer, the padded entries are exactly zero, and the inverse with `s` gives the input back.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

import pencilfft
from conftest import (MPIRUN, assert_same_spec, make_mesh, padded_k_shape, put_global, random_field,
                      reference, rel_err, to_numpy, tol, valid)

# Cubic, odd Z, and shapes whose Y or Z//2+1 the mesh does not divide.
SHAPES = [(16, 16, 16), (16, 16, 9), (16, 30, 64), (8, 6, 10), (40, 12, 9)]
# Shapes the complex transforms must pad (Y % Pa or Z % Pb nonzero on some mesh).
UNEVEN = [(16, 30, 64), (8, 6, 10), (40, 12, 9)]


def rreference(x: np.ndarray, layout: str, norm: str = "backward") -> np.ndarray:
    """numpy float64 rfftn of the last three axes, in `layout` order (Y, Z//2+1, X) or natural."""
    k = np.fft.rfftn(x.astype(np.float64), axes=(-3, -2, -1), norm=norm)
    return np.moveaxis(k, -3, -1) if layout == "transposed" else k


def to_natural(k, layout):
    return np.moveaxis(k, -1, -3) if layout == "transposed" else k


def check_spectrum(k: np.ndarray, ref: np.ndarray, padded_shape, dtype) -> None:
    """k has the padded shape, its leading corner is `ref`, and everything else is exactly 0."""
    assert k.shape == tuple(padded_shape), f"k-space shape {k.shape} != {padded_shape}"
    corner = tuple(slice(0, n) for n in ref.shape)
    err = rel_err(k[corner], ref)
    assert err <= tol(dtype), f"relative error {err:.3g} > {tol(dtype):g}"
    pad = np.ones(k.shape, bool)
    pad[corner] = False
    assert np.all(k[pad] == 0), f"{np.count_nonzero(k[pad])} padded entries are nonzero"


def real_sharded(x, mesh):
    return put_global(x, pencilfft.real_space_sharding(mesh, x.ndim))


# ----------------------------------------------------------------------------------------------
# prfft3d / pirfft3d values


# Every shape in the transposed layout; the natural one only differs by a final local move, so it
# gets the padded shapes.  (16, 16, 9) is covered on every mesh by the jit test below.
@pytest.mark.parametrize(
    "shape, layout",
    # Under mpirun: prfft3d/pirfft3d across processes on every mesh (a grid they pad).
    [pytest.param(s, "transposed", marks=MPIRUN) if s == (16, 30, 64) else (s, "transposed")
     for s in SHAPES if s != (16, 16, 9)] + [(s, "natural") for s in UNEVEN[1:]],
    ids=str,
)
def test_rfft_matches_numpy(pdims, shape, layout):
    if not valid(shape, pdims):
        pytest.skip(f"{shape} cannot be split on {pdims}")
    mesh = make_mesh(pdims)
    x = random_field(shape, np.float64, seed=30)
    k = pencilfft.prfft3d(real_sharded(x, mesh), layout=layout)
    assert k.dtype == np.complex128
    assert_same_spec(k, pencilfft.k_space_sharding(mesh, layout).spec)
    check_spectrum(to_numpy(k), rreference(x, layout), padded_k_shape(shape, pdims, layout, True),
                   np.complex128)
    back = pencilfft.pirfft3d(k, shape, layout=layout)
    assert back.shape == shape and back.dtype == np.float64
    assert_same_spec(back, pencilfft.real_space_sharding(mesh).spec)
    assert rel_err(to_numpy(back), x) <= tol(np.float64)


@pytest.mark.parametrize("norm", ["backward", "ortho", "forward"])
@pytest.mark.parametrize("dtype, pdims", [(np.float32, (4, 2)), (np.float64, (8,))],
                         ids=["float32-4x2", "float64-8"])
def test_rfft_norms_and_dtypes(pdims, dtype, norm):
    mesh = make_mesh(pdims)
    shape = (8, 6, 10)  # pads Y on both meshes and Z//2+1 = 6 nowhere
    x = random_field(shape, dtype, seed=31)
    k = pencilfft.prfft3d(real_sharded(x, mesh), norm)
    cdtype = np.complex64 if dtype == np.float32 else np.complex128
    assert k.dtype == cdtype
    check_spectrum(to_numpy(k), rreference(x, "transposed", norm),
                   padded_k_shape(shape, pdims, "transposed", True), cdtype)
    back = pencilfft.pirfft3d(k, shape, norm)
    assert back.dtype == dtype
    assert rel_err(to_numpy(back), x) <= tol(dtype)


def test_rfft_jit_on_auto_and_explicit_meshes(pdims, axis_type):
    layout = "transposed"
    mesh = make_mesh(pdims, axis_type)
    shape = (16, 16, 9)  # Z//2+1 = 5: padded on every mesh with Pb > 1
    x = random_field(shape, np.float32, seed=32)
    fwd = jax.jit(lambda a: pencilfft.prfft3d(a, layout=layout, mesh=mesh))
    bwd = jax.jit(lambda a: pencilfft.pirfft3d(a, shape, layout=layout, mesh=mesh))
    k = fwd(real_sharded(x, mesh))
    assert k.dtype == np.complex64
    assert_same_spec(k, pencilfft.k_space_sharding(mesh, layout).spec)
    check_spectrum(to_numpy(k), rreference(x, layout), padded_k_shape(shape, pdims, layout, True),
                   np.complex64)
    back = bwd(k)
    assert back.dtype == np.float32 and back.shape == shape
    assert_same_spec(back, pencilfft.real_space_sharding(mesh).spec)
    assert rel_err(to_numpy(back), x) <= tol(np.float32)


def test_rfft_jit_finds_explicit_mesh_in_type():
    mesh = make_mesh((4, 2), "explicit")
    shape = (8, 6, 10)
    x = random_field(shape, np.float64, seed=33)
    k = jax.jit(pencilfft.prfft3d)(real_sharded(x, mesh))
    check_spectrum(to_numpy(k), rreference(x, "transposed"),
                   padded_k_shape(shape, (4, 2), "transposed", True), np.complex128)
    back = jax.jit(pencilfft.pirfft3d, static_argnums=1)(k, shape)
    assert rel_err(to_numpy(back), x) <= tol(np.float64)


MESH_LAYOUTS = pytest.mark.parametrize(
    "pdims, layout", [((4, 2), "natural"), ((8, 1), "transposed"), ((8,), "transposed")],
    ids=["4x2-natural", "8x1-transposed", "8-transposed"],
)


@MESH_LAYOUTS
def test_rfft_batch_axes(pdims, layout):
    mesh = make_mesh(pdims)
    shape = (2, 3, 8, 6, 10)
    x = random_field(shape, np.float64, seed=34)
    k = pencilfft.prfft3d(real_sharded(x, mesh), layout=layout)
    assert_same_spec(k, pencilfft.k_space_sharding(mesh, layout, ndim=5).spec)
    check_spectrum(to_numpy(k), rreference(x, layout), padded_k_shape(shape, pdims, layout, True),
                   np.complex128)
    back = pencilfft.pirfft3d(k, shape[-3:], layout=layout)
    assert back.shape == shape
    assert_same_spec(back, pencilfft.real_space_sharding(mesh, 5).spec)
    assert rel_err(to_numpy(back), x) <= tol(np.float64)


@pytest.mark.parametrize("with_s", [True, False], ids=["s", "no_s"])
@pytest.mark.parametrize("layout", ["transposed", "natural"])
def test_pirfft3d_of_exact_spectrum(layout, with_s):
    """The unpadded half spectrum (numpy's, replicated) is accepted too; s is still required."""
    mesh = make_mesh((4, 2))
    shape = (8, 6, 10)
    x = random_field(shape, np.float64, seed=35)
    k = put_global(rreference(x, layout), NamedSharding(mesh, P()))
    if not with_s:
        with pytest.raises(ValueError, match="`s`"):
            pencilfft.pirfft3d(k, None, layout=layout)
        return
    back = pencilfft.pirfft3d(k, shape, layout=layout)
    assert back.shape == shape and back.dtype == np.float64
    assert_same_spec(back, pencilfft.real_space_sharding(mesh).spec)
    assert rel_err(to_numpy(back), x) <= tol(np.float64)


def test_pirfft3d_ignores_padded_entries():
    mesh = make_mesh((4, 2))
    shape = (8, 6, 9)  # k space (8, 6, 8): Y 6 -> 8 and Z//2+1 = 5 -> 6
    x = random_field(shape, np.float64, seed=36)
    k = np.array(to_numpy(pencilfft.prfft3d(real_sharded(x, mesh))))
    pad = np.ones(k.shape, bool)
    pad[:6, :5, :] = False
    k[pad] = 1e3 * (1 + 1j)
    back = pencilfft.pirfft3d(put_global(k, pencilfft.k_space_sharding(mesh)), shape)
    assert rel_err(to_numpy(back), x) <= tol(np.float64)


@pytest.mark.parametrize("layout", ["transposed", "natural"])
def test_rfft_without_mesh_is_exact(layout):
    shape = (6, 10, 9)
    x = random_field(shape, np.float64, seed=37)
    k = pencilfft.prfft3d(jnp.asarray(x), layout=layout)
    ref = rreference(x, layout)
    assert k.shape == ref.shape
    assert rel_err(np.asarray(k), ref) <= tol(np.complex128)
    assert rel_err(np.asarray(pencilfft.pirfft3d(k, shape, layout=layout)), x) <= tol(np.float64)


def test_rfft_shapes_the_mesh_divides_are_not_padded(pdims):
    # Y = 16 divides by every Pa and Z//2+1 = 8 by every Pb.  (The complex transforms on such
    # shapes are checked in test_fft.py.)
    shape = (16, 16, 14)
    mesh = make_mesh(pdims)
    x = random_field(shape, np.float64, seed=38)
    k = pencilfft.prfft3d(real_sharded(x, mesh))
    ref = rreference(x, "transposed")
    assert k.shape == ref.shape
    assert rel_err(to_numpy(k), ref) <= tol(np.complex128)


# ----------------------------------------------------------------------------------------------
# The complex transforms on shapes the mesh does not divide


@pytest.mark.parametrize(
    "shape, layout", [(s, "transposed") for s in UNEVEN] + [((8, 6, 10), "natural")], ids=str
)
def test_complex_padded(pdims, shape, layout):
    if not valid(shape, pdims):
        pytest.skip(f"{shape} cannot be split on {pdims}")
    mesh = make_mesh(pdims)
    x = random_field(shape, np.complex128, seed=39)
    k = pencilfft.pfft3d(real_sharded(x, mesh), layout=layout)
    assert_same_spec(k, pencilfft.k_space_sharding(mesh, layout).spec)
    ref = reference(x, layout)
    check_spectrum(to_numpy(k), ref, padded_k_shape(shape, pdims, layout, False), np.complex128)
    back = pencilfft.pifft3d(k, s=shape, layout=layout)
    assert back.shape == shape
    assert_same_spec(back, pencilfft.real_space_sharding(mesh).spec)
    assert rel_err(to_numpy(back), x) <= tol(np.complex128)
    # The exact spectrum, replicated, with and without s.
    exact = put_global(ref, NamedSharding(mesh, P()))
    for s in (shape, None):
        back = pencilfft.pifft3d(exact, s=s, layout=layout)
        assert back.shape == shape
        assert rel_err(to_numpy(back), x) <= tol(np.complex128)


# ----------------------------------------------------------------------------------------------
# Autodiff and vmap


# One shape per mesh: padded Y and Z//2+1 where the mesh allows, padded Z//2+1 otherwise.
GRAD_SHAPE = {(1, 8): (16, 16, 9), (8, 1): (8, 6, 10), (4, 2): (8, 6, 10), (2, 4): (16, 16, 9),
              (8,): (8, 6, 10)}


def _corner(shape, layout):
    """Index of the unpadded k-space block, in `layout` order."""
    X, Y, Z = shape
    exact = (Y, Z // 2 + 1, X) if layout == "transposed" else (X, Y, Z // 2 + 1)
    return tuple(slice(0, n) for n in exact)


def test_grad_through_prfft3d(pdims):
    shape = GRAD_SHAPE[pdims]
    mesh = make_mesh(pdims)
    layout = "transposed"
    x = random_field(shape, np.float64, seed=40)
    corner = _corner(shape, layout)
    w = np.random.default_rng(41).uniform(0.5, 2.0, rreference(x, layout).shape)
    # The same weights on the padded spectrum, 0 on the padding.  (Slicing the padding off under
    # jit is not an option on an Explicit mesh: jax refuses to slice a sharded axis to a length
    # the mesh axis does not divide.)
    w_padded = np.zeros(padded_k_shape(shape, pdims, layout, True))
    w_padded[corner] = w
    w_padded = put_global(w_padded, pencilfft.k_space_sharding(mesh, layout))

    def distributed(a, weights):  # weights an argument: a multi-process array cannot be closed over
        k = pencilfft.prfft3d(a, layout=layout, mesh=mesh)
        return jnp.sum(weights * jnp.abs(k) ** 2)

    def local(a):
        k = jnp.moveaxis(jnp.fft.rfftn(a), 0, -1)
        return jnp.sum(jnp.asarray(w) * jnp.abs(k) ** 2)

    value, g = jax.jit(jax.value_and_grad(distributed))(real_sharded(x, mesh), w_padded)
    value_ref, g_ref = jax.value_and_grad(local)(jnp.asarray(x))
    assert g.dtype == np.float64 and g.shape == shape
    assert abs(float(to_numpy(value)) - float(value_ref)) <= tol(np.float64) * abs(float(value_ref))
    assert rel_err(to_numpy(g), np.asarray(g_ref)) <= tol(np.float64)


def test_grad_through_pirfft3d(pdims):
    shape = GRAD_SHAPE[pdims]
    mesh = make_mesh(pdims)
    layout = "transposed"
    kshape = padded_k_shape(shape, pdims, layout, True)
    corner = _corner(shape, layout)
    k = random_field(kshape, np.complex128, seed=42)  # padded entries nonzero: they must not count
    w = jnp.asarray(np.random.default_rng(43).uniform(0.5, 2.0, shape))

    def distributed(a):
        return jnp.sum(w * pencilfft.pirfft3d(a, shape, layout=layout, mesh=mesh) ** 2)

    def local(a):
        return jnp.sum(w * jnp.fft.irfftn(jnp.moveaxis(a, -1, 0), s=shape) ** 2)

    ks = put_global(k, pencilfft.k_space_sharding(mesh, layout))
    value, g = jax.jit(jax.value_and_grad(distributed))(ks)
    value_ref, g_ref = jax.value_and_grad(local)(jnp.asarray(k[corner]))
    assert abs(float(to_numpy(value)) - float(value_ref)) <= tol(np.float64) * abs(float(value_ref))
    g = to_numpy(g)
    assert g.shape == kshape and g.dtype == np.complex128
    assert rel_err(g[corner], np.asarray(g_ref)) <= tol(np.complex128)
    pad = np.ones(kshape, bool)
    pad[corner] = False
    assert np.all(g[pad] == 0), "gradient on padded k-space entries must be 0"


@MESH_LAYOUTS
def test_rfft_vmap(pdims, layout):
    mesh = make_mesh(pdims)
    shape = (8, 6, 10)
    x = random_field((3,) + shape, np.float64, seed=44)
    spec = P(None, *pencilfft.real_space_sharding(mesh).spec)
    xs = put_global(x, NamedSharding(mesh, spec))
    k = jax.vmap(lambda a: pencilfft.prfft3d(a, layout=layout, mesh=mesh))(xs)
    check_spectrum(to_numpy(k), rreference(x, layout),
                   padded_k_shape((3,) + shape, pdims, layout, True), np.complex128)
    back = jax.vmap(lambda a: pencilfft.pirfft3d(a, shape, layout=layout, mesh=mesh))(k)
    assert back.shape == (3,) + shape
    assert rel_err(to_numpy(back), x) <= tol(np.float64)


# ----------------------------------------------------------------------------------------------
# Done when: a real-field Poisson solve on a pencil mesh equals numpy's


def numpy_poisson(delta, d=1.0):
    X, Y, Z = delta.shape
    kx = 2 * np.pi * np.fft.fftfreq(X, d)[:, None, None]
    ky = 2 * np.pi * np.fft.fftfreq(Y, d)[None, :, None]
    kz = 2 * np.pi * np.fft.rfftfreq(Z, d)[None, None, :]
    k2 = kx**2 + ky**2 + kz**2
    dk = np.fft.rfftn(delta)
    with np.errstate(divide="ignore", invalid="ignore"):
        phik = np.where(k2 > 0, -dk / k2, 0)
    return np.fft.irfftn(phik, s=delta.shape, axes=(0, 1, 2))


def pencil_poisson(delta, shape):
    delta_k = pencilfft.prfft3d(delta)
    kx, ky, kz = pencilfft.rfftfreq3d(delta_k, s=shape)
    k2 = kx**2 + ky**2 + kz**2
    return pencilfft.pirfft3d(jnp.where(k2 > 0, -delta_k / k2, 0), shape)


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
@pytest.mark.parametrize("shape", [(16, 30, 64), (32, 32, 32)], ids=str)
def test_poisson_solve(shape, jit):
    mesh = make_mesh((4, 2))
    delta = random_field(shape, np.float64, seed=45)
    solve = jax.jit(pencil_poisson, static_argnums=1) if jit else pencil_poisson
    phi = solve(real_sharded(delta, mesh), shape)
    assert phi.shape == shape and phi.dtype == np.float64
    assert_same_spec(phi, pencilfft.real_space_sharding(mesh).spec)
    assert rel_err(to_numpy(phi), numpy_poisson(delta)) <= tol(np.float64)
