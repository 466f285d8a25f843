"""fftfreq3d / rfftfreq3d: values, broadcast shapes, dtypes and shardings, and kernels built from
them applied to sharded k without any communication."""
from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

import pencilfft
from conftest import MPIRUN, make_mesh, padded_k_shape, put_global, rel_err, to_numpy, tol, valid

# Where X, Y, Z sit among k's last three axes.
POSITION = {"transposed": (2, 0, 1), "natural": (0, 1, 2)}
COLLECTIVES = ("all-gather", "all-to-all", "collective-permute", "all-reduce", "reduce-scatter")


def sharded_k(shape, pdims, layout, real, dtype=np.complex128, mesh=None):
    """A k-space array (zeros) as the forward transform of a real-space `shape` would return it."""
    mesh = mesh or make_mesh(pdims)
    kshape = padded_k_shape(shape, pdims, layout, real)
    return put_global(np.zeros(kshape, dtype), pencilfft.k_space_sharding(mesh, layout)), mesh


def expected_vectors(shape, kshape, layout, real, d=1.0):
    """(kx, ky, kz) as numpy: 2*pi*fftfreq (rfftfreq along Z), 0 on padding, broadcast shapes."""
    d = (d,) * 3 if np.ndim(d) == 0 else tuple(d)
    X, Y, Z = shape
    freqs = [np.fft.fftfreq(X, d[0]), np.fft.fftfreq(Y, d[1]),
             (np.fft.rfftfreq if real else np.fft.fftfreq)(Z, d[2])]
    out = []
    for f, pos in zip(freqs, POSITION[layout]):
        n = kshape[pos]
        v = np.zeros(n)
        v[: f.size] = 2 * np.pi * f
        shape3 = [1, 1, 1]
        shape3[pos] = n
        out.append(v.reshape(shape3))
    return out


def check_vectors(vectors, shape, kshape, layout, real, mesh, fdtype, d=1.0):
    spec = tuple(pencilfft.k_space_sharding(mesh, layout).spec) + (None,) * 3
    for name, v, want, pos in zip("xyz", vectors, expected_vectors(shape, kshape, layout, real, d),
                                  POSITION[layout]):
        assert v.shape == want.shape, f"k{name}: shape {v.shape} != {want.shape}"
        assert v.dtype == fdtype, f"k{name}: dtype {v.dtype} != {fdtype}"
        vspec = [None, None, None]
        vspec[pos] = spec[pos]
        assert v.sharding.is_equivalent_to(NamedSharding(mesh, P(*vspec)), 3), (
            f"k{name}: sharding {v.sharding.spec} != {P(*vspec)}"
        )
        got = to_numpy(v)
        assert np.all(np.isfinite(got)), f"k{name} has non-finite entries"
        n = shape["xyz".index(name)]
        n = n // 2 + 1 if (real and name == "z") else n
        flat, flat_want = got.reshape(-1), want.reshape(-1)
        assert rel_err(flat[:n], flat_want[:n]) <= tol(fdtype), f"k{name} values"
        assert np.all(flat[n:] == 0), f"k{name}: padded entries are not 0"


@pytest.mark.parametrize("real", [False, True], ids=["fftfreq3d", "rfftfreq3d"])
@pytest.mark.parametrize("layout", ["transposed", "natural"])
@pytest.mark.parametrize("shape", [(16, 16, 9), (8, 6, 10), (16, 16, 16)], ids=str)
def test_values_shapes_and_sharding(pdims, shape, layout, real):
    if not valid(shape, pdims):
        pytest.skip(f"{shape} cannot be split on {pdims}")
    k, mesh = sharded_k(shape, pdims, layout, real)
    f = pencilfft.rfftfreq3d if real else pencilfft.fftfreq3d
    vectors = f(k, s=shape, layout=layout)
    check_vectors(vectors, shape, k.shape, layout, real, mesh, np.float64)


@pytest.mark.parametrize("real", [False, True], ids=["fftfreq3d", "rfftfreq3d"])
@pytest.mark.parametrize("d", [0.25, (0.5, 2.0, 0.1), np.array([0.5, 2.0, 0.1])],
                         ids=["scalar", "tuple", "array"])
@pytest.mark.parametrize("dtype", [np.complex64, np.complex128])
def test_dtype_and_spacing(dtype, d, real):
    pdims, shape, layout = (4, 2), (8, 6, 10), "transposed"
    k, mesh = sharded_k(shape, pdims, layout, real, dtype)
    f = pencilfft.rfftfreq3d if real else pencilfft.fftfreq3d
    fdtype = np.float32 if dtype == np.complex64 else np.float64
    check_vectors(f(k, d, s=shape), shape, k.shape, layout, real, mesh, fdtype, d)


@MPIRUN  # one representative of fftfreq3d on every mesh, across processes
def test_fftfreq3d_of_exact_k_needs_no_s(pdims):
    shape = (16, 16, 16)  # no padding on any mesh
    k, mesh = sharded_k(shape, pdims, "transposed", False)
    check_vectors(pencilfft.fftfreq3d(k), shape, k.shape, "transposed", False, mesh, np.float64)


@MPIRUN  # one representative of rfftfreq3d across processes (a padded half spectrum)
def test_on_a_real_transform_output():
    mesh = make_mesh((4, 2))
    shape = (8, 6, 9)
    x = np.random.default_rng(50).standard_normal(shape)
    k = pencilfft.prfft3d(put_global(x, pencilfft.real_space_sharding(mesh)))
    check_vectors(pencilfft.rfftfreq3d(k, s=shape), shape, k.shape, "transposed", True, mesh,
                  np.float64)


@pytest.mark.parametrize("real", [False, True], ids=["fftfreq3d", "rfftfreq3d"])
def test_under_jit(pdims, axis_type, real):
    shape, layout = (16, 16, 9), "natural"
    mesh = make_mesh(pdims, axis_type)
    k, _ = sharded_k(shape, pdims, layout, real, np.complex64, mesh=mesh)
    f = pencilfft.rfftfreq3d if real else pencilfft.fftfreq3d
    # The vectors alone leave the jit, k unused: only a concrete mesh tells jit the devices
    # (an Explicit mesh in the tracer's type is abstract).  Used with k, the type is enough:
    # see the kernel tests below.
    vectors = jax.jit(lambda a: f(a, s=shape, layout=layout, mesh=mesh))(k)
    check_vectors(vectors, shape, k.shape, layout, real, mesh, np.float32)


# ----------------------------------------------------------------------------------------------
# Kernels on sharded k are local


def assert_no_collectives(compiled_text: str, what: str) -> None:
    found = sorted({c for c in COLLECTIVES if re.search(rf"\b{c}(-start)?\(", compiled_text)})
    assert not found, f"{what} compiles to communication: {found}"


def kernels(k, kx, ky, kz):
    """The gradient kernels i*k_j*k and a Poisson kernel -k/|k|^2 (0 where |k| = 0)."""
    k2 = kx**2 + ky**2 + kz**2
    poisson = jnp.where(k2 > 0, -k / jnp.where(k2 > 0, k2, 1), 0)
    return k * (1j * kx), k * (1j * ky), k * (1j * kz), poisson


def numpy_kernels(k, vectors):
    kx, ky, kz = vectors
    k2 = kx**2 + ky**2 + kz**2
    with np.errstate(divide="ignore", invalid="ignore"):
        poisson = np.where(k2 > 0, -k / k2, 0)
    return k * (1j * kx), k * (1j * ky), k * (1j * kz), poisson


@pytest.mark.parametrize("real", [False, True], ids=["fftfreq3d", "rfftfreq3d"])
@pytest.mark.parametrize("layout", ["transposed", "natural"])
def test_kernels_need_no_communication(pdims, layout, real):
    shape = (16, 16, 9)
    mesh = make_mesh(pdims)
    kshape = padded_k_shape(shape, pdims, layout, real)
    k_np = np.random.default_rng(51).standard_normal(kshape) + 1j
    k = put_global(k_np, pencilfft.k_space_sharding(mesh, layout))
    f = pencilfft.rfftfreq3d if real else pencilfft.fftfreq3d
    vectors = f(k, s=shape, layout=layout)
    # The vectors passed in as arguments, as a time-stepping code would keep them.
    fn = jax.jit(kernels)
    text = fn.lower(k, *vectors).compile().as_text()
    assert_no_collectives(text, "kernels with the vectors as arguments")
    outs = fn(k, *vectors)
    for got, want in zip(outs, numpy_kernels(k_np, expected_vectors(shape, kshape, layout, real))):
        assert got.sharding.is_equivalent_to(k.sharding, 3), f"{got.sharding.spec}"
        assert rel_err(to_numpy(got), want) <= tol(np.complex128)
    # The vectors computed inside the same jit.
    fn_inside = jax.jit(lambda a: kernels(a, *f(a, s=shape, layout=layout)))
    assert_no_collectives(fn_inside.lower(k).compile().as_text(), "kernels with the vectors inside")


@pytest.mark.parametrize("real", [False, True], ids=["fftfreq3d", "rfftfreq3d"])
def test_kernels_inside_jit_on_auto_mesh(real):
    shape, layout, pdims = (8, 6, 10), "transposed", (4, 2)
    mesh = make_mesh(pdims, "auto")
    k, _ = sharded_k(shape, pdims, layout, real, mesh=mesh)
    f = pencilfft.rfftfreq3d if real else pencilfft.fftfreq3d
    fn = jax.jit(lambda a: kernels(a, *f(a, s=shape, layout=layout, mesh=mesh)))
    assert_no_collectives(fn.lower(k).compile().as_text(), "kernels on an Auto mesh")
