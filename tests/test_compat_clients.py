"""The ways jaxdecomp's clients call it, through pencilfft.compat (issue 22).

JaxPM pads 4-cell blocks by 8 and exchanges halos wider than the interior; jax-power and
jaxdecomp's own tests call `jaxdecomp.fft.pfft3d`; DISCO-DJ and jaxdecomp's tests set
`config.update(...)`, which changes the k-space layout; JaxPM 0.1.6 imports `get_output_specs`
and `FftType`; jaxdecomp's tests use the transposes, `validate_spec_matches_mesh` and `finalize`.
Every pattern is checked against numpy (and against jaxdecomp itself in test_jaxdecomp.py).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

import pencilfft
import pencilfft.compat as compat
from conftest import (MPIRUN, PDIMS, halo_reference, make_mesh, put_global, random_field, rel_err,
                      to_numpy, tol)

IDS = ["x".join(map(str, p)) for p in PDIMS]
MESHES_2 = [(1, 8), (8, 1), (4, 2), (2, 4)]
IDS_2 = ["x".join(map(str, p)) for p in MESHES_2]


@pytest.fixture(autouse=True)
def restore_config():
    """compat.config is jaxdecomp's global settings object: every test leaves it as it found it."""
    saved = vars(compat.config).copy()
    yield
    vars(compat.config).update(saved)


# ----------------------------------------------------------------------------------------------
# config.update


@pytest.mark.parametrize("contiguous", [True, False])
@pytest.mark.parametrize("pdims", MESHES_2, ids=IDS_2)
def test_transpose_axis_contiguous_chooses_the_layout(pdims, contiguous):
    """True: (Y, Z, X), jaxdecomp's default; False: (X, Y, Z), split (-, a, b) as jaxdecomp's
    (on a (P, 1) mesh pencilfft splits Y where jaxdecomp splits Z)."""
    compat.config.update("transpose_axis_contiguous", contiguous)
    mesh = make_mesh(pdims, "auto")
    data = random_field((8, 16, 8), np.complex128, seed=1)
    x = put_global(data, pencilfft.real_space_sharding(mesh))
    ref = np.fft.fftn(data)
    want = np.moveaxis(ref, 0, -1) if contiguous else ref
    for f in (compat.pfft3d, jax.jit(lambda v: compat.fft.pfft3d(v))):
        k = f(x)
        assert rel_err(to_numpy(k), want) <= tol(k.dtype)
        layout = "transposed" if contiguous else "natural"
        assert k.sharding.is_equivalent_to(pencilfft.k_space_sharding(mesh, layout), 3)
        assert compat.get_fft_output_sharding(x.sharding).is_equivalent_to(k.sharding, 3)
        assert rel_err(to_numpy(jax.jit(lambda v: compat.pifft3d(v))(k)), data) <= tol(k.dtype)
    # fftfreq3d follows the spectrum's axes: (last, first, second), as jaxdecomp's.
    k0, k1, k2 = compat.fftfreq3d(k)
    n = k.shape
    assert (k0.shape, k1.shape, k2.shape) == ((1, 1, n[2]), (n[0], 1, 1), (1, n[1], 1))
    for vec, size in ((k0, n[2]), (k1, n[0]), (k2, n[1])):
        np.testing.assert_allclose(to_numpy(vec).ravel(), 2 * np.pi * np.fft.fftfreq(size))


def test_config_settings():
    assert compat.config.transpose_axis_contiguous is True  # jaxdecomp's default
    for backend in compat.HaloCommBackend:
        compat.config.update("halo_comm_backend", backend)  # cuDecomp's transports: ignored
    compat.config.update("transpose_comm_backend", compat.TRANSPOSE_COMM_MPI_A2A)
    assert compat.config.transpose_comm_backend == compat.TRANSPOSE_COMM_MPI_A2A
    with pytest.raises(ValueError, match="'no_such_key' is not a valid configuration key"):
        compat.config.update("no_such_key", 1)
    with pytest.raises(ValueError, match="`halo_comm_backend` must be one of"):
        compat.config.update("halo_comm_backend", "nccl")
    with pytest.raises(TypeError, match="`transpose_axis_contiguous` must be a bool"):
        compat.config.update("transpose_axis_contiguous", "no")


# ----------------------------------------------------------------------------------------------
# The transposes


FORWARD, BACKWARD = (2, 0, 1), (1, 2, 0)


@pytest.mark.parametrize("contiguous", [True, False])
# Explicit meshes of every shape; Auto on a pencil and a slab (the Auto path is the same code
# for every mesh shape).  Under mpirun: compat's transposes across processes (4x2).
@pytest.mark.parametrize("pdims,axis_type", [
    pytest.param(p, t, marks=MPIRUN) if p == (4, 2) else (p, t)
    for p in MESHES_2 for t in ("explicit", "auto") if t == "explicit" or p in ((4, 2), (1, 8))],
    ids=lambda v: "x".join(map(str, v)) if isinstance(v, tuple) else v)
def test_transposes_against_numpy(pdims, axis_type, contiguous):
    """X -> Y -> Z -> Y -> X, with jaxdecomp's global orders and splits, eagerly and under jit."""
    compat.config.update("transpose_axis_contiguous", contiguous)
    mesh = make_mesh(pdims, axis_type)
    a, b = mesh.axis_names
    data = random_field((8, 16, 24), np.float64, seed=2)
    x = put_global(data, NamedSharding(mesh, P(a, b)))
    perm_f, perm_b = (FORWARD, BACKWARD) if contiguous else ((0, 1, 2), (0, 1, 2))
    steps = [(compat.transposeXtoY, perm_f, P(b, a) if contiguous else P(a, None, b)),
             (compat.transposeYtoZ, perm_f, P(a, b) if contiguous else P(None, a, b)),
             (compat.transposeZtoY, perm_b, P(b, a) if contiguous else P(a, None, b)),
             (compat.transposeYtoX, perm_b, P(a, b))]
    want, y, yj = data, x, x
    for f, perm, spec in steps:
        want = want.transpose(perm)
        # A fresh function: the setting is read when tracing (jit's cache does not know it).
        y, yj = f(y), jax.jit(lambda v, f=f: f(v))(yj)
        for got in (y, yj):
            np.testing.assert_array_equal(to_numpy(got), want)
            assert got.sharding.is_equivalent_to(NamedSharding(mesh, spec), 3), (f, got.sharding)
    np.testing.assert_array_equal(to_numpy(y), data)


@pytest.mark.parametrize("pdims", [(4, 2), (8, 1)], ids=["4x2", "8x1"])
def test_transposes_x_to_z_batch_grad(pdims):
    """The one-exchange X <-> Z pair, a batch (vmap and 4-D), and the adjoint under grad."""
    mesh = make_mesh(pdims, "auto")
    a, b = mesh.axis_names
    data = random_field((2, 8, 16, 24), np.float64, seed=3)
    x = put_global(data, NamedSharding(mesh, P(None, a, b)))
    z = jax.jit(compat.transposeXtoZ)(x)
    np.testing.assert_array_equal(to_numpy(z), data.transpose(0, 2, 3, 1))
    np.testing.assert_array_equal(to_numpy(jax.jit(jax.vmap(compat.transposeXtoZ))(x)),
                                  data.transpose(0, 2, 3, 1))
    np.testing.assert_array_equal(to_numpy(jax.jit(compat.transposeZtoX)(z)), data)
    w = put_global(random_field(z.shape, np.float64, seed=4), z.sharding)
    g = jax.jit(jax.grad(lambda v, c: jnp.sum(compat.transposeXtoZ(v) * c)))(x, w)
    np.testing.assert_array_equal(to_numpy(g), to_numpy(w).transpose(0, 3, 1, 2))


def test_transpose_errors():
    mesh = make_mesh((4, 2), "auto")
    x = put_global(np.zeros((8, 16, 5)), NamedSharding(mesh, P("x", "y")))
    with pytest.raises(ValueError, match=r"`x.shape\[2\]` \(=5\) must be divisible by mesh axis 'y' \(=2\)"):
        compat.transposeXtoY(x)
    with pytest.raises(ValueError, match="`backend` must be one of"):
        compat.transposeXtoY(x, backend="nccl")


# ----------------------------------------------------------------------------------------------
# Module paths and helpers


def test_fft_submodule_and_real_transforms():
    mesh = make_mesh((2, 4), "auto")
    data = random_field((8, 8, 14), np.float64, seed=5)  # Z//2+1 = 8: split by 'y' (=4)
    x = put_global(data, pencilfft.real_space_sharding(mesh))
    assert compat.fft.pfft3d is compat.pfft3d and compat.fft.fftfreq3d is compat.fftfreq3d
    k = compat.fft.prfft3d(x)  # jaxdecomp 0.3 raises "Not implemented"; here: the half spectrum
    ref = np.moveaxis(np.fft.rfftn(data), 0, -1)
    assert rel_err(to_numpy(k), ref) <= 1e-12
    kx, ky, kz = compat.fft.rfftfreq3d(k)
    np.testing.assert_allclose(to_numpy(kz).ravel(), 2 * np.pi * np.fft.rfftfreq(14))
    assert rel_err(to_numpy(compat.fft.pirfft3d(k)), data) <= 1e-12


def test_get_output_specs_both_signatures():
    mesh = make_mesh((4, 2), "auto")
    spec = P("x", "y")
    assert compat.get_output_specs(compat.FftType.FFT, compat.PENCILS, spec) == ("x", "y", None)
    assert compat.get_output_specs(compat.FftType.FFT, spec, mesh=mesh) == ("x", "y", None)
    assert compat.get_output_specs(compat.FftType.IFFT, spec, mesh, "jax") == ("x", "y", None)
    compat.config.update("transpose_axis_contiguous", False)
    assert compat.get_output_specs(compat.FftType.FFT, compat.PENCILS, spec) == (None, "x", "y")
    assert compat.get_output_specs(compat.FftType.IFFT, P(None, "x", "y"), mesh=mesh) == ("x", "y", None)
    with pytest.raises(TypeError, match="`fft_type` must be a jax.lax.FftType"):
        compat.get_output_specs("fft", spec, mesh=mesh)


def test_validate_spec_matches_mesh_and_lifecycle():
    mesh = make_mesh((4, 2), "auto")
    compat.validate_spec_matches_mesh(P("x", "y"), mesh)
    compat.validate_spec_matches_mesh(P("x", None), make_mesh((8, 1), "auto"))
    # jaxdecomp's words (tests/test_compat.py compares every branch with jaxdecomp's)
    with pytest.raises(ValueError, match="At position 0: spec has 'y' but mesh expects 'x'"):
        compat.validate_spec_matches_mesh(P("y", "x"), mesh)
    with pytest.raises(ValueError, match="At position 1: spec has None but mesh axis 'y' has size 2"):
        compat.validate_spec_matches_mesh(P("x"), mesh)
    compat.init()
    compat.finalize()


# ----------------------------------------------------------------------------------------------
# JaxPM's painting: paint into padded blocks, exchange the halos, fold them back


def _paint_exchange_fold(blocks, pad, h, mesh, like_jaxdecomp=True):
    """JaxPM's sequence on a (..., X, Y, Z) array of padded blocks: exchange halos of width h,
    fold the inner h cells of each received halo into the interior, cut the pads off."""
    spec = P(*mesh.axis_names)

    def fold(b):
        for axis in (0, 1):
            b = jnp.moveaxis(b, axis, 0)
            b = b.at[pad:pad + h].add(b[:h]).at[-(pad + h):-pad].add(b[-h:])
            b = jnp.moveaxis(b, 0, axis)
        return b[pad:-pad, pad:-pad]

    exchanged = compat.halo_exchange(blocks, (h, h), (True, True))
    return jax.shard_map(fold, mesh=mesh, in_specs=spec, out_specs=spec)(exchanged)


def _numpy_paint_exchange_fold(data, pdims, pad, h):
    ex = halo_reference(data, pdims, (h, h), (True, True), like_jaxdecomp=True)
    bx, by = data.shape[0] // pdims[0], data.shape[1] // pdims[1]
    out = []
    for i in range(pdims[0]):
        row = []
        for j in range(pdims[1]):
            b = ex[i * bx:(i + 1) * bx, j * by:(j + 1) * by].copy()
            for axis in (0, 1):
                b = np.moveaxis(b, axis, 0)
                b[pad:pad + h] += b[:h]
                b[-(pad + h):-pad] += b[-h:]
                b = np.moveaxis(b, 0, axis)
            row.append(b[pad:-pad, pad:-pad])
        out.append(np.concatenate(row, 1))
    return np.concatenate(out, 0)


# (interior cells, pad, halo): JaxPM's 4-cell blocks padded by 8, 1-cell blocks by 2.
WIDE = [(4, 8, 8), (4, 8, 4), (1, 2, 2), (2, 4, 2)]


# Under mpirun: JaxPM's painting pattern across processes (4-cell blocks padded by 8).
@pytest.mark.parametrize("interior,pad,h",
                         [pytest.param(*w, marks=MPIRUN) if w == WIDE[0] else w for w in WIDE],
                         ids=[f"n{n}-p{p}-h{h}" for n, p, h in WIDE])
@pytest.mark.parametrize("pdims", [(4, 2), (2, 4)], ids=["4x2", "2x4"])
def test_jaxpm_wide_halos_paint_exchange_fold(pdims, interior, pad, h):
    """Under jit on an Auto mesh with nothing in scope (JaxPM's call), against numpy."""
    mesh = make_mesh(pdims, "auto")
    block = interior + 2 * pad
    data = random_field((pdims[0] * block, pdims[1] * block, 3), np.float64, seed=6)
    x = put_global(data, NamedSharding(mesh, P("x", "y")))
    got = jax.jit(lambda v: _paint_exchange_fold(v, pad, h, mesh))(x)
    np.testing.assert_allclose(to_numpy(got), _numpy_paint_exchange_fold(data, pdims, pad, h),
                               rtol=1e-14, atol=1e-14)


@MPIRUN  # a JaxPM-like client under multi-controller
def test_painting_with_halos_conserves_mass_and_matches_one_device():
    """The physics behind the pattern: each device deposits into its padded block up to h cells
    beyond its interior; after the exchange and the fold, the grid equals the periodic sum of
    the deposits computed on one device."""
    pdims, n, pad = (4, 2), 4, 4
    h = pad // 2
    mesh = make_mesh(pdims, "auto")
    rng = np.random.default_rng(7)
    block = n + 2 * pad
    blocks = np.zeros((pdims[0] * block, pdims[1] * block, 2))
    grid = np.zeros((pdims[0] * n, pdims[1] * n, 2))
    for i in range(pdims[0]):
        for j in range(pdims[1]):
            deposit = rng.standard_normal((n + 2 * h, n + 2 * h, 2))
            blocks[i * block + pad - h:i * block + pad + n + h,
                   j * block + pad - h:j * block + pad + n + h] = deposit
            rows = np.arange(i * n - h, (i + 1) * n + h) % grid.shape[0]
            cols = np.arange(j * n - h, (j + 1) * n + h) % grid.shape[1]
            np.add.at(grid, (rows[:, None], cols[None, :]), deposit)
    x = put_global(blocks, NamedSharding(mesh, P("x", "y")))
    got = to_numpy(jax.jit(lambda v: _paint_exchange_fold(v, pad, h, mesh))(x))
    np.testing.assert_allclose(got, grid, rtol=1e-13, atol=1e-13)
