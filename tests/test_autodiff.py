"""grad, jvp, vjp and vmap through the distributed transforms agree with jnp.fft on one device."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

import pencilfft
from conftest import MPIRUN, make_mesh, put_global, random_field, rel_err, to_numpy, tol

SHAPE = (8, 16, 8)


def local_fft(x, layout):
    k = jnp.fft.fftn(x, axes=(-3, -2, -1))
    return jnp.moveaxis(k, -3, -1) if layout == "transposed" else k


def local_ifft(k, layout):
    k = jnp.moveaxis(k, -1, -3) if layout == "transposed" else k
    return jnp.fft.ifftn(k, axes=(-3, -2, -1))


def loss_pair(layout, mesh):
    """The same scalar function, distributed and local: |pfft|^2 weighted, through the inverse."""
    w = jnp.asarray(np.linspace(0.5, 2.0, 8), jnp.float64)  # breaks symmetry along the last axis

    def distributed(x):
        k = pencilfft.pfft3d(x, layout=layout, mesh=mesh)
        return jnp.sum(jnp.abs(pencilfft.pifft3d(k * w, layout=layout, mesh=mesh)) ** 2)

    def local(x):
        return jnp.sum(jnp.abs(local_ifft(local_fft(x, layout) * w, layout)) ** 2)

    return distributed, local


@pytest.mark.parametrize("layout", ["transposed", "natural"])
def test_grad(pdims, layout):
    mesh = make_mesh(pdims)
    x = random_field(SHAPE, np.complex128, seed=20)
    distributed, local = loss_pair(layout, mesh)
    g = jax.jit(jax.grad(distributed))(put_global(x, pencilfft.real_space_sharding(mesh)))
    g_ref = jax.grad(local)(jnp.asarray(x))
    assert rel_err(to_numpy(g), np.asarray(g_ref)) <= tol(np.complex128)


# Under mpirun: jvp/vjp of the transforms with the mesh known, across processes.
@pytest.mark.parametrize("pdims", [pytest.param((4, 2), marks=MPIRUN), (1, 8), (8,)],
                         ids=["4x2", "1x8", "8"])
def test_jvp_and_vjp(pdims):
    mesh = make_mesh(pdims)
    x = random_field(SHAPE, np.complex128, seed=21)
    t = random_field(SHAPE, np.complex128, seed=22)
    sharding = pencilfft.real_space_sharding(mesh)
    xs, ts = put_global(x, sharding), put_global(t, sharding)
    f = lambda a: pencilfft.pfft3d(a, mesh=mesh)  # noqa: E731
    y, dy = jax.jvp(f, (xs,), (ts,))
    y_ref, dy_ref = jax.jvp(lambda a: local_fft(a, "transposed"), (jnp.asarray(x),), (jnp.asarray(t),))
    assert rel_err(to_numpy(y), np.asarray(y_ref)) <= tol(np.complex128)
    assert rel_err(to_numpy(dy), np.asarray(dy_ref)) <= tol(np.complex128)
    ct = random_field(y.shape, np.complex128, seed=23)
    _, pullback = jax.vjp(f, xs)
    (got,) = pullback(put_global(ct, pencilfft.k_space_sharding(mesh)))
    _, pullback_ref = jax.vjp(lambda a: local_fft(a, "transposed"), jnp.asarray(x))
    (want,) = pullback_ref(jnp.asarray(ct))
    assert rel_err(to_numpy(got), np.asarray(want)) <= tol(np.complex128)


@pytest.mark.parametrize("layout", ["transposed", "natural"])
@pytest.mark.parametrize("pdims", [pytest.param((4, 2), marks=MPIRUN), (8, 1), (8,)],
                         ids=["4x2", "8x1", "8"])
def test_vmap(pdims, layout):
    mesh = make_mesh(pdims)
    x = random_field((3,) + SHAPE, np.complex128, seed=24)
    spec = P(None, *pencilfft.real_space_sharding(mesh).spec)
    xs = put_global(x, NamedSharding(mesh, spec))
    k = jax.vmap(lambda a: pencilfft.pfft3d(a, layout=layout, mesh=mesh))(xs)
    assert rel_err(to_numpy(k), np.asarray(local_fft(jnp.asarray(x), layout))) <= tol(np.complex128)
    back = jax.vmap(lambda a: pencilfft.pifft3d(a, layout=layout, mesh=mesh))(k)
    assert rel_err(to_numpy(back), x) <= tol(np.complex128)
