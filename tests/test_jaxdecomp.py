"""Value-for-value cross-check against jaxdecomp (its JAX backend) in the transposed layout.

jaxdecomp wants a 2-axis Auto mesh and X, Y, Z divisible by what splits them; the shape below
suits all four meshes.  Its k space is (Y, Z, X), like pencilfft's transposed layout, in the same sharding (as the
README promises), and each library's inverse must accept the other's forward output.
"""
from __future__ import annotations

import jax
import numpy as np
import pytest

import pencilfft
from conftest import MPIRUN, make_mesh, put_global, random_field, reference, rel_err, to_numpy, tol

jaxdecomp = pytest.importorskip("jaxdecomp")

JD_PDIMS = [(1, 8), (8, 1), (4, 2), (2, 4)]
SHAPE = (16, 32, 8)

pdims_2axes = pytest.mark.parametrize("pdims", JD_PDIMS, ids=lambda p: "x".join(map(str, p)))


def setup(pdims, dtype, seed=70):
    mesh = make_mesh(pdims, "auto")
    x = random_field(SHAPE, dtype, seed=seed)
    return mesh, x, put_global(x, pencilfft.real_space_sharding(mesh))


@pdims_2axes
# Under mpirun: pencilfft beside jaxdecomp when both span processes, every mesh.
@pytest.mark.parametrize("dtype", [pytest.param(np.complex64, marks=MPIRUN), np.complex128])
def test_forward_matches_jaxdecomp(pdims, dtype):
    mesh, x, xs = setup(pdims, dtype)
    k_jd = jaxdecomp.pfft3d(xs)
    k_pf = pencilfft.pfft3d(xs)
    assert k_pf.shape == k_jd.shape == reference(x, "transposed").shape
    assert k_pf.dtype == k_jd.dtype == dtype
    assert rel_err(to_numpy(k_pf), to_numpy(k_jd)) <= tol(dtype)
    # Both against numpy, so agreement is not agreement on a wrong answer.
    assert rel_err(to_numpy(k_pf), reference(x, "transposed")) <= tol(dtype)


@pdims_2axes
def test_pencilfft_inverts_jaxdecomp(pdims):
    mesh, x, xs = setup(pdims, np.complex64, seed=71)
    k_jd = jaxdecomp.pfft3d(xs)  # pencilfft's inverse takes any sharding
    back = pencilfft.pifft3d(k_jd)
    assert back.shape == SHAPE
    assert back.sharding.is_equivalent_to(pencilfft.real_space_sharding(mesh), 3)
    assert rel_err(to_numpy(back), x) <= tol(np.complex64)


@pdims_2axes
def test_jaxdecomp_inverts_pencilfft(pdims):
    mesh, x, xs = setup(pdims, np.complex64, seed=72)
    k_pf = pencilfft.pfft3d(xs)
    k_jd = jaxdecomp.pfft3d(xs)
    # Same shardings on pencils and (1, P) slabs.  On (P, 1) slabs jaxdecomp splits Z where
    # pencilfft splits Y (as on every other mesh: "Y by the first axis, Z by the second"), and
    # jaxdecomp's inverse cannot reshard its input, so it gets ours in its own sharding.
    if pdims[1] > 1:
        assert k_pf.sharding.is_equivalent_to(k_jd.sharding, 3), (
            f"k-space sharding {k_pf.sharding.spec} != jaxdecomp's {k_jd.sharding.spec} on {pdims}"
        )
    else:
        k_pf = jax.device_put(k_pf, k_jd.sharding)
    back = jaxdecomp.pifft3d(k_pf)
    assert back.shape == SHAPE
    assert rel_err(to_numpy(back), x) <= tol(np.complex64)


@pdims_2axes
@pytest.mark.parametrize("dtype", [np.complex64, np.complex128])
def test_fftfreq3d_matches_jaxdecomp(pdims, dtype):
    mesh, x, xs = setup(pdims, dtype, seed=73)
    k_jd = jaxdecomp.pfft3d(xs)
    k_pf = pencilfft.pfft3d(xs)
    for d in (1.0, 0.5):
        mine = pencilfft.fftfreq3d(k_pf, d)
        theirs = jaxdecomp.fftfreq3d(k_jd, d)  # (kx, ky, kz) as (1,1,X), (Y,1,1), (1,Z,1)
        assert len(theirs) == 3
        for name, a, b in zip("xyz", mine, theirs):
            assert a.shape == b.shape, f"k{name}: {a.shape} vs jaxdecomp {b.shape}"
            assert a.dtype == b.dtype, f"k{name}: {a.dtype} vs jaxdecomp {b.dtype}"
            assert rel_err(to_numpy(a), to_numpy(b)) <= tol(a.dtype), f"k{name} values"


@pdims_2axes
def test_pencilfft_on_explicit_mesh_matches_jaxdecomp_on_auto(pdims):
    """jaxdecomp needs an Auto mesh; pencilfft must give the same answer on an Explicit one."""
    auto_mesh, x, xs_auto = setup(pdims, np.complex128, seed=74)
    k_jd = to_numpy(jaxdecomp.pfft3d(xs_auto))
    mesh = make_mesh(pdims, "explicit")
    k = pencilfft.pfft3d(put_global(x, pencilfft.real_space_sharding(mesh)))
    assert k.sharding.is_equivalent_to(pencilfft.k_space_sharding(mesh), 3)
    assert rel_err(to_numpy(k), k_jd) <= tol(np.complex128)
    back = pencilfft.pifft3d(put_global(k_jd, pencilfft.k_space_sharding(mesh)))
    assert rel_err(to_numpy(back), x) <= tol(np.complex128)


# ----------------------------------------------------------------------------------------------
# pencilfft.compat's transposes and batch meshes beside jaxdecomp's (issues 19 and 22)


@pdims_2axes
@pytest.mark.parametrize("contiguous", [True])
def test_compat_transposes_match_jaxdecomp(pdims, contiguous):
    """In jaxdecomp's default setting only: jaxdecomp 0.3.1 caches its lowerings without the
    setting, so after one use in a process it fails to compile in the other (MLIR verifier
    error).  test_compat_clients checks both settings against numpy."""
    import pencilfft.compat as compat

    mesh = make_mesh(pdims, "auto")
    x = put_global(random_field((16, 32, 8), np.float64, seed=72),
                   jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(*mesh.axis_names)))
    saved = (jaxdecomp.config.transpose_axis_contiguous, compat.config.transpose_axis_contiguous)
    try:
        jaxdecomp.config.update("transpose_axis_contiguous", contiguous)
        compat.config.update("transpose_axis_contiguous", contiguous)
        theirs, ours = x, x
        for name in ("transposeXtoY", "transposeYtoZ", "transposeZtoY", "transposeYtoX"):
            # Fresh functions: the setting is read when tracing, which jit's cache ignores.
            theirs = jax.jit(lambda v, f=getattr(jaxdecomp, name): f(v))(theirs)
            ours = jax.jit(lambda v, f=getattr(compat, name): f(v))(ours)
            np.testing.assert_array_equal(to_numpy(ours), to_numpy(theirs))
            assert ours.sharding.is_equivalent_to(theirs.sharding, 3), (name, ours.sharding,
                                                                         theirs.sharding)
    finally:
        jaxdecomp.config.update("transpose_axis_contiguous", saved[0])
        compat.config.update("transpose_axis_contiguous", saved[1])


@pytest.mark.parametrize("mesh_shape", [pytest.param((2, 2, 2), marks=MPIRUN), (2, 1, 4)],
                         ids=["2x2x2", "2x1x4"])
def test_batched_vmap_matches_jaxdecomp(mesh_shape):
    """An ensemble on a 3-axis Auto mesh (c, x, y), as jaxdecomp's users write it."""
    from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

    mesh = jax.make_mesh(mesh_shape, ("c", "x", "y"), axis_types=(AxisType.Auto,) * 3)
    data = random_field((4, 16, 16, 8), np.complex128, seed=73)
    x = put_global(data, NamedSharding(mesh, P("c", "x", "y")))
    try:
        theirs = jax.jit(jax.vmap(jaxdecomp.fft.pfft3d))(x)
    except NotImplementedError as e:  # jaxdecomp 0.3.2-0.3.4 (jax 0.11+): no batching rule
        pytest.skip(f"jaxdecomp {jaxdecomp.__version__} cannot vmap pfft3d: {e}")
    ours = jax.jit(jax.vmap(pencilfft.pfft3d))(x)
    assert rel_err(to_numpy(ours), to_numpy(theirs)) <= 1e-12
    assert ours.sharding.is_equivalent_to(theirs.sharding, 4)
    assert (pencilfft.get_fft_output_sharding(x.sharding)
            .is_equivalent_to(jaxdecomp.get_fft_output_sharding(x.sharding), 4))
    back = jax.jit(jax.vmap(pencilfft.pifft3d))(theirs)
    assert rel_err(to_numpy(back), data) <= 1e-12
    halo_theirs = jax.jit(jax.vmap(lambda v: jaxdecomp.halo_exchange(v, (2, 2), (True, True))))(x)
    import pencilfft.compat as compat  # jaxdecomp's values on a mesh axis of size 1 too

    halo_ours = jax.jit(jax.vmap(lambda v: compat.halo_exchange(v, (2, 2), (True, True))))(x)
    np.testing.assert_array_equal(to_numpy(halo_ours), to_numpy(halo_theirs))
