"""The transforms as jaxdecomp's users call them: `jax.jit` on arrays sharded over an Auto mesh
with no mesh in scope (no `mesh=`, no `jax.set_mesh`), so the mesh is only known when XLA
partitions the program (pencilfft/_partitioned.py).  Every result is checked against numpy in
float64, and the compiled programs must hold no all-gather.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

import pencilfft
from conftest import (MPIRUN, PDIMS, make_mesh, padded_k_shape, put_global, random_field,
                      rel_err, to_numpy, tol)

# X and Y divide every 8-device mesh; Z = 12 does not divide 8 (c2c padded on 1x8) and the r2c
# half spectrum Z//2+1 = 7 divides no mesh axis: the padded pencils are exercised too.
SHAPE = (8, 8, 12)
EVEN = (8, 8, 8)
IDS = ["x".join(map(str, p)) for p in PDIMS]


def auto_input(data: np.ndarray, pdims, batch: int = 0) -> jax.Array:
    mesh = make_mesh(pdims, "auto")
    spec = P(*([None] * batch), *mesh.axis_names)
    return put_global(data, NamedSharding(mesh, spec))


def k_ref(x: np.ndarray, layout: str, real: bool) -> np.ndarray:
    k = (np.fft.rfftn if real else np.fft.fftn)(x.astype(np.float64 if real else np.complex128),
                                                axes=(-3, -2, -1))
    return np.moveaxis(k, -3, -1) if layout == "transposed" else k


def exact(k: np.ndarray, want: np.ndarray) -> np.ndarray:
    """The exact spectrum of the shape of `want` sliced out of a padded one (the padding is at
    the end of each axis, and must be zero)."""
    cut = k[tuple(slice(0, n) for n in want.shape)]
    assert np.count_nonzero(k) == np.count_nonzero(cut)
    return cut


def transforms(real: bool, layout: str, shape=SHAPE):
    if real:
        return (functools.partial(pencilfft.prfft3d, layout=layout),
                functools.partial(pencilfft.pirfft3d, s=shape, layout=layout))
    return (functools.partial(pencilfft.pfft3d, layout=layout),
            functools.partial(pencilfft.pifft3d, s=shape, layout=layout))


def all_gathers(fn, *args) -> int:
    return jax.jit(fn).lower(*args).compile().as_text().count("all-gather(")


# complex128 (x64, on in the whole suite) in the transposed layout, complex64 in both.
CASES = [("transposed", "complex128"), ("transposed", "complex64"), ("natural", "complex64")]


# Under mpirun: the compiler-partitioned path on multi-process arrays, every mesh, c2c and r2c.
@pytest.mark.parametrize("layout,dtype",
                         [pytest.param(*c, marks=MPIRUN) if c == CASES[1] else c for c in CASES],
                         ids=["-".join(c) for c in CASES])
@pytest.mark.parametrize("real", [False, True], ids=["c2c", "r2c"])
@pytest.mark.parametrize("pdims", PDIMS, ids=IDS)
def test_forward_and_round_trip(pdims, real, layout, dtype):
    in_dtype = np.float64 if real and dtype == "complex128" else np.float32 if real else dtype
    data = random_field(SHAPE, in_dtype, seed=1)
    x = auto_input(data, pdims)
    fwd, inv = transforms(real, layout)
    k, back = jax.jit(lambda v: (fwd(v), inv(fwd(v))))(x)
    # The spectrum has the padded global shape of the eager call (the mesh's sizes are in the
    # input's type), evenly split as pencilfft's k-space sharding.
    assert k.shape == padded_k_shape(SHAPE, pdims, layout, real) and k.dtype == dtype
    assert k.sharding.is_equivalent_to(pencilfft.k_space_sharding(x.sharding.mesh, layout), 3)
    want = k_ref(data, layout, real)
    assert rel_err(exact(to_numpy(k), want), want) <= tol(dtype)
    assert back.sharding.is_equivalent_to(pencilfft.real_space_sharding(x.sharding.mesh), 3)
    assert rel_err(to_numpy(back), data) <= tol(dtype)


@pytest.mark.parametrize("real", [False, True], ids=["c2c", "r2c"])
@pytest.mark.parametrize("pdims", PDIMS, ids=IDS)
def test_compiled_program_exchanges_and_never_gathers(pdims, real):
    """fwd -> kernel -> inv in one jit: only the transforms' exchanges, no all-gather."""
    x = auto_input(random_field(SHAPE, np.float32 if real else np.complex64, seed=2), pdims)
    opts = dict(exchange="alltoall")
    fwd = functools.partial(pencilfft.prfft3d if real else pencilfft.pfft3d, **opts)
    inv = functools.partial(pencilfft.pirfft3d, s=SHAPE, **opts) if real else \
        functools.partial(pencilfft.pifft3d, **opts)
    text = jax.jit(lambda v: inv(fwd(v) * 2.0)).lower(x).compile().as_text()
    n_exchanges = sum(n > 1 for n in pdims)
    assert text.count("all-gather(") == 0
    assert text.count("all-to-all(") == 2 * n_exchanges


def test_pairwise_exchange_and_default_choice():
    x = auto_input(random_field(SHAPE, np.complex64, seed=3), (4, 2))
    f = lambda v: pencilfft.pifft3d(pencilfft.pfft3d(v, exchange="pairwise"), exchange="pairwise")  # noqa: E731
    text = jax.jit(f).lower(x).compile().as_text()
    assert text.count("all-gather(") == 0 and text.count("all-to-all(") == 0
    assert text.count("collective-permute-start(") + text.count("collective-permute(") == 2 * (3 + 1)
    np.testing.assert_allclose(to_numpy(jax.jit(f)(x)), to_numpy(x), atol=1e-5)


def poisson(k, ks):
    """-k / |k|^2 (0 at k = 0): the PM gravity kernel, local on every device."""
    k2 = sum(kk**2 for kk in ks)
    return k * jnp.where(k2 > 0, -1.0 / jnp.where(k2 > 0, k2, 1.0), 0.0)


def np_poisson(x: np.ndarray) -> np.ndarray:
    ks = np.meshgrid(*(2 * np.pi * np.fft.fftfreq(n) for n in x.shape), indexing="ij")
    k2 = sum(kk**2 for kk in ks)
    kernel = np.where(k2 > 0, -1.0 / np.where(k2 > 0, k2, 1.0), 0.0)
    return np.fft.ifftn(np.fft.fftn(x) * kernel).real


@pytest.mark.parametrize("pdims", [pytest.param((4, 2), marks=MPIRUN), (8, 1), (8,)],
                         ids=["4x2", "8x1", "8"])
def test_scan_of_poisson_steps_with_frequencies(pdims):
    """A PM-like loop: lax.scan over fft -> fftfreq3d kernel -> ifft, 3 steps."""
    shape = (8, 8, 8)
    data = random_field(shape, np.float64, seed=4)
    x = auto_input(data, pdims)

    def step(field, _):
        k = pencilfft.pfft3d(field)
        return pencilfft.pifft3d(poisson(k, pencilfft.fftfreq3d(k))).real, None

    f = jax.jit(lambda v: jax.lax.scan(step, v, None, length=3)[0])
    want = np_poisson(np_poisson(np_poisson(data)))
    assert all_gathers(f, x) == 0
    assert rel_err(to_numpy(f(x)), want) <= tol(np.float64)


@pytest.mark.parametrize("real", [False, True], ids=["c2c", "r2c"])
# Under mpirun: gradients through the partitioner across processes.
@pytest.mark.parametrize("pdims", [pytest.param((4, 2), marks=MPIRUN), (1, 8), (8,)],
                         ids=["4x2", "1x8", "8"])
def test_grad_and_vjp(pdims, real):
    data = random_field(SHAPE, np.float64 if real else np.complex128, seed=5)
    x = auto_input(data, pdims)
    fwd, inv = transforms(real, "transposed")
    w = jnp.asarray(np.linspace(0.5, 2.0, SHAPE[0]))  # breaks the symmetry along k's last axis
    local_fwd = jnp.fft.rfftn if real else jnp.fft.fftn

    def loss(v, f, finv):
        return jnp.sum(jnp.abs(finv(f(v) * w)) ** 2)

    g = jax.jit(jax.grad(functools.partial(loss, f=fwd, finv=inv)))(x)
    local_inv = (lambda k: jnp.fft.irfftn(jnp.moveaxis(k, -1, -3), s=SHAPE)) if real else \
        (lambda k: jnp.fft.ifftn(jnp.moveaxis(k, -1, -3)))
    g_ref = jax.grad(functools.partial(
        loss, f=lambda v: jnp.moveaxis(local_fwd(v), -3, -1), finv=local_inv))(jnp.asarray(data))
    assert rel_err(to_numpy(g), np.asarray(g_ref)) <= tol(np.complex128)

    # The cotangent has the padded shape of the output; its padding does not reach x.
    ct = random_field(padded_k_shape(SHAPE, pdims, "transposed", real), np.complex128, seed=6)
    pullback = jax.jit(lambda v, c: jax.vjp(fwd, v)[1](c)[0])
    exact_ct = ct[tuple(slice(0, n) for n in k_ref(data, "transposed", real).shape)]
    want = jax.vjp(lambda v: jnp.moveaxis(local_fwd(v), -3, -1), jnp.asarray(data))[1](exact_ct)[0]
    assert rel_err(to_numpy(pullback(x, jnp.asarray(ct))), np.asarray(want)) <= tol(np.complex128)


@pytest.mark.parametrize("pdims", [(4, 2), (8, 1)], ids=["4x2", "8x1"])
def test_jvp(pdims):
    data, tangent = (random_field(SHAPE, np.complex128, seed=s) for s in (7, 8))
    x, t = auto_input(data, pdims), auto_input(tangent, pdims)
    y, dy = jax.jit(lambda a, b: jax.jvp(pencilfft.pfft3d, (a,), (b,)))(x, t)
    assert rel_err(to_numpy(y), k_ref(data, "transposed", False)) <= tol(np.complex128)
    assert rel_err(to_numpy(dy), k_ref(tangent, "transposed", False)) <= tol(np.complex128)


@pytest.mark.parametrize("layout", ["transposed", "natural"])
@pytest.mark.parametrize("pdims", [(4, 2), (1, 8), (8,)], ids=["4x2", "1x8", "8"])
def test_vmap_and_batch_axes(pdims, layout):
    data = random_field((2,) + EVEN, np.complex64, seed=9)
    x = auto_input(data, pdims, batch=1)
    fwd, inv = transforms(False, layout, EVEN)
    vmapped = jax.jit(jax.vmap(lambda v: inv(fwd(v) * 3.0)))
    assert all_gathers(vmapped, x) == 0
    assert rel_err(to_numpy(vmapped(x)), 3.0 * data) <= tol(np.complex64)
    k = jax.jit(fwd)(x)  # a leading batch axis without vmap (EVEN: see the README on padding)
    assert rel_err(to_numpy(k), k_ref(data, layout, False)) <= tol(np.complex64)


def test_eager_vmap_of_a_concrete_auto_array():
    data = random_field((2,) + EVEN, np.complex128, seed=10)
    k = jax.vmap(pencilfft.pfft3d)(auto_input(data, (4, 2), batch=1))
    assert rel_err(to_numpy(k), k_ref(data, "transposed", False)) <= tol(np.complex128)


def test_jit_with_in_and_out_shardings():
    mesh = make_mesh((2, 4), "auto")
    data = random_field(SHAPE, np.complex128, seed=11)
    real, k_sh = NamedSharding(mesh, P("x", "y")), NamedSharding(mesh, P("x", "y", None))
    f = jax.jit(pencilfft.pfft3d, in_shardings=real, out_shardings=k_sh)
    k = f(data)
    assert k.sharding == k_sh
    assert rel_err(np.asarray(k), k_ref(data, "transposed", False)) <= tol(np.complex128)
    g = jax.jit(lambda v: pencilfft.pifft3d(pencilfft.pfft3d(v)), in_shardings=real,
                out_shardings=real)
    assert all_gathers(g, data) == 0
    assert rel_err(np.asarray(g(data)), data) <= tol(np.complex128)


def test_input_made_inside_the_jit():
    """with_sharding_constraint on an Auto mesh."""
    data = random_field(SHAPE, np.complex128, seed=12)
    mesh = make_mesh((4, 2), "auto")
    f = jax.jit(lambda v: pencilfft.pfft3d(
        jax.lax.with_sharding_constraint(2.0 * v, NamedSharding(mesh, P("x", "y")))))
    assert all_gathers(f, data) == 0
    assert rel_err(np.asarray(f(data)), k_ref(2.0 * data, "transposed", False)) <= 1e-12


def test_one_device_program_runs_the_local_transform():
    data = random_field(SHAPE, np.complex128, seed=13)
    k = jax.jit(pencilfft.pfft3d)(data)  # a numpy input: one device
    assert len(k.sharding.device_set) == 1
    assert rel_err(np.asarray(k), k_ref(data, "transposed", False)) <= tol(np.complex128)


def test_mesh_dependent_size_error_names_the_argument():
    """X = 6 does not split over 'x' (= 4): found only when jit partitions the program."""
    data = random_field((6, 8, 8), np.complex64, seed=14)
    x = put_global(data, NamedSharding(make_mesh((4, 2), "auto"), P(None, "y")))
    with pytest.raises(Exception, match=r"`x.shape\[0\]` \(X=6\) must be divisible by mesh axis 'x'"):
        jax.jit(pencilfft.pfft3d)(x)
