"""power_spectrum against JaxPM's definition (a float64 numpy reference written here), on one
device and on every mesh class, in every calling form, with batch axes, padded grids, float32,
gradients, and the compiled programs free of all-gathers.

The reference is `jaxpm.utils.power_spectrum` in our words: fftn(norm="ortho") of the whole
field, bins by np.digitize of |k| on the N^3 grid, k = mean |k| per bin, pk = per-bin mean of
(2 ell + 1) L_ell(mu) |F|^2 times prod(box / shape), bins 1..n-1.  Two deliberate differences:
a mode whose |k| equals an edge in exact arithmetic goes to the upper bin (np.digitize's rule;
JaxPM's own placement of those modes depends on rounding, and its default edges put many modes
exactly on edges), and a cross spectrum is the real part of the binned cross power (JaxPM takes
the modulus of the complex sum).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

import pencilfft
from conftest import (check_directional_derivative, make_mesh, put_global, random_field,
                      rel_err, to_numpy)
from power_references import TIE, assert_close, jaxpm_edges, reference, window_transfer

SHAPE = (16, 16, 16)
PADDED = (16, 14, 12)  # on 4x2: k-space Y (14 by 4) and Z//2+1 (7 by 2) padded for the mesh


def check(result, fields, field2s=None, dtype=np.float64, **kw):
    """result (k, pk) against the reference of each field of `fields` (..., X, Y, Z)."""
    k, pk = (to_numpy(r) for r in result)
    fields = np.asarray(fields)
    lead = fields.shape[:-3]
    flat = fields.reshape((-1,) + fields.shape[-3:])
    flat2 = None if field2s is None else np.asarray(field2s).reshape(flat.shape)
    refs = [reference(f, None if flat2 is None else flat2[i], **kw) for i, f in enumerate(flat)]
    assert_close(k, refs[0][0], dtype, "k")
    assert_close(pk, np.stack([r[1] for r in refs]).reshape(lead + refs[0][1].shape), dtype, "pk")


def no_all_gather(fn, *args):
    text = jax.jit(fn).lower(*args).compile().as_text()
    assert "all-gather" not in text, "the compiled power spectrum gathers"
    from pencilfft._exchange import mpi

    # the sum over devices: XLA's all-reduce, or ours through MPI (several processes)
    assert ("all-reduce" in text or mpi.ALLREDUCE_TARGET in text or jax.device_count() == 1)


# ---------------------------------------------------------------------------------------------
# The reference itself


def test_reference_is_jaxpm_where_no_mode_lies_on_an_edge():
    """With edges no mode lies on, the tie rule changes nothing: the reference is JaxPM's
    np.digitize; with the default edges (on which many modes lie) it puts them in the upper bin
    as exact arithmetic does, where JaxPM's rounding scatters them."""
    x = random_field(SHAPE, np.float64, 3)
    for kedges in (0.3, np.array([0.2, 0.55, 0.9, 1.7, 2.5])):
        ours, literal = reference(x, kedges=kedges), reference(x, kedges=kedges, exact_ties=False)
        np.testing.assert_allclose(ours[1], literal[1], rtol=1e-13)
    n = np.fft.fftfreq(16) * 16  # default edges on a unit-cell box: (2j + 3) * 2 pi / 16
    m2 = n[:, None, None] ** 2 + n[None, :, None] ** 2 + n[None, None, :] ** 2
    edges = jaxpm_edges(None, SHAPE, SHAPE)
    k2 = m2 * (2 * np.pi / 16) ** 2
    exact = np.searchsorted([(2 * j + 3) ** 2 for j in range(len(edges))], m2, side="right")
    assert np.array_equal(np.searchsorted(edges ** 2 * (1 - TIE), k2, side="right"), exact)


# ---------------------------------------------------------------------------------------------
# One device (numpy input, no mesh): the arguments


ONE_DEVICE = {
    "default": dict(),
    "int-poles-oblique": dict(kedges=5, multipoles=(0, 2, 4), los=(1, 1, 1)),
    "float-box-quadrupole": dict(kedges=0.05, multipoles=2, los=(0, 1, 0),
                                 box_shape=(100.0, 50.0, 80.0)),
    # edges from 0 (the DC mode in the first bin), not uniform: the binary search
    "array-monopole-list": dict(kedges=[0.0, 0.4, 0.8, 1.2, 2.0], multipoles=[0]),
    "uniform-array-from-below-0": dict(kedges=np.linspace(-0.2, 2.2, 7), multipoles=(0, 2)),
    # no mode has 1.27 <= |k| / (2 pi / 16) < 1.30: an empty bin, NaN in k and pk
    "empty-bin": dict(kedges=[0.3, 0.5, 0.51, 1.0]),
    # odd Y and Z (no Nyquist plane along them), even X: the mirrors' mu along an oblique los
    "odd-grid": dict(shape=(12, 15, 13), kedges=4, multipoles=(1, 2, 3), los=(1, 2, 3)),
}


@pytest.mark.parametrize("case", list(ONE_DEVICE))
def test_one_device(case):
    kw = dict(ONE_DEVICE[case])
    x = random_field(kw.pop("shape", SHAPE), np.float64, 1)
    got = pencilfft.power_spectrum(x, **kw)
    check(got, x, **kw)
    if case == "empty-bin":
        assert np.isnan(np.asarray(got[0])[1]) and np.isnan(np.asarray(got[1])[1])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_cross_spectrum_is_the_real_part(dtype):
    """Odd multipoles of a cross spectrum are where the real part (ours) and JaxPM's modulus
    differ; even ones agree closely but not exactly."""
    x, y = random_field(SHAPE, dtype, 1), random_field(SHAPE, dtype, 2)
    y = (0.5 * x + y).astype(dtype)  # correlated
    kw = dict(multipoles=(0, 1, 2), los=(0, 1, 1), kedges=0.4)
    got = pencilfft.power_spectrum(x, y, **kw)
    assert got[1].dtype == dtype
    check(got, x, y, dtype=dtype, **kw)
    modulus = reference(x, y, jaxpm_cross=True, **kw)[1]
    assert rel_err(np.asarray(got[1])[1], modulus[1]) > 0.1  # ell = 1: not the modulus


# ---------------------------------------------------------------------------------------------
# Every mesh class, grids the mesh does not divide


MESHES = [
    pytest.param((4, 2), SHAPE, np.float64, marks=pytest.mark.mpirun, id="4x2"),
    pytest.param((4, 2), (16, 14, 13), np.float32, id="4x2-padded-oddZ-f32"),
    pytest.param((1, 8), (16, 16, 12), np.float64, id="1x8-padded"),
    pytest.param((8, 1), PADDED, np.float64, id="8x1-padded"),
    pytest.param((8,), SHAPE, np.float32, id="8-f32"),
]
POLES = dict(multipoles=(0, 2, 4), los=(0, 1, 1), kedges=6)


@pytest.mark.parametrize("pdims,shape,dtype", MESHES)
def test_meshes(pdims, shape, dtype):
    """Eagerly on an Explicit mesh (under mpirun the mesh spans the processes)."""
    mesh = make_mesh(pdims)
    data = random_field(shape, dtype, 4)
    x = put_global(data, pencilfft.real_space_sharding(mesh))
    got = pencilfft.power_spectrum(x, **POLES)
    assert got[1].dtype == dtype and got[1].shape == (3, 5)
    check(got, data, dtype=dtype, **POLES)


# ---------------------------------------------------------------------------------------------
# Calling forms, batch axes, gradients: compiled once each


def _pk(x):
    return pencilfft.power_spectrum(x, **POLES)


def _cross(x, y):
    return pencilfft.power_spectrum(x, y, **POLES)


@pytest.mark.parametrize("form", [
    pytest.param("jit-no-mesh", marks=pytest.mark.mpirun), "jit-explicit", "set-mesh",
    "eager-auto"])
def test_calling_forms(form):
    """On the padded grid (uneven blocks when the partitioner decides the mesh)."""
    mesh = make_mesh((4, 2), "explicit" if form == "jit-explicit" else "auto")
    data = random_field(PADDED, np.float64, 5)
    x = put_global(data, pencilfft.real_space_sharding(mesh))
    if form == "eager-auto":
        return check(_pk(x), data, **POLES)
    if form == "set-mesh":
        with jax.set_mesh(mesh):
            check(jax.jit(_pk)(x), data, **POLES)
            no_all_gather(_pk, x)
        return
    check(jax.jit(_pk)(x), data, **POLES)
    no_all_gather(_pk, x)


def test_cross_under_jit_with_no_mesh():
    mesh = make_mesh((4, 2), "auto")
    a, b = random_field(SHAPE, np.float64, 6), random_field(SHAPE, np.float64, 7)
    sharding = pencilfft.real_space_sharding(mesh)
    x, y = put_global(a, sharding), put_global(b, sharding)
    check(jax.jit(_cross)(x, y), a, b, **POLES)
    no_all_gather(_cross, x, y)


def test_vmap_over_fields():
    """vmap over an axis the mesh does not split (a 4x2 mesh), as the 4-D call."""
    mesh = make_mesh((4, 2))
    data = random_field((2,) + SHAPE, np.float64, 8)
    x = put_global(data, NamedSharding(mesh, P(None, "x", "y")))
    fn = jax.vmap(lambda f: _pk(f)[1])
    pk = jax.jit(fn)(x)
    refs = np.stack([reference(d, **POLES)[1] for d in data])
    assert_close(to_numpy(pk), refs, np.float64)
    no_all_gather(fn, x)


@pytest.mark.parametrize("form", ["eager", pytest.param("jit-no-mesh", marks=pytest.mark.mpirun),
                                  "vmap", "vmap-explicit"])
def test_batch_mesh(form):
    """A (2, 2, 2) mesh: the batch axis splits two fields, one spectrum each, never mixed."""
    explicit = form in ("eager", "vmap-explicit")
    kind = jax.sharding.AxisType.Explicit if explicit else jax.sharding.AxisType.Auto
    mesh = jax.make_mesh((2, 2, 2), ("c", "x", "y"), axis_types=(kind,) * 3)
    data = random_field((2,) + SHAPE, np.float64, 9)
    x = put_global(data, pencilfft.real_space_sharding(mesh))
    if form == "eager":
        return check(_pk(x), data, **POLES)
    if form == "jit-no-mesh":
        check(jax.jit(_pk)(x), data, **POLES)
        return no_all_gather(_pk, x)
    fn = jax.vmap(lambda f: _pk(f)[1])
    refs = np.stack([reference(d, **POLES)[1] for d in data])
    assert_close(to_numpy(jax.jit(fn)(x)), refs, np.float64)
    no_all_gather(fn, x)


@pytest.mark.parametrize("axis_type", ["explicit", "auto"])
def test_gradient(axis_type):
    """Finite differences along a random direction, for an auto and a cross spectrum with
    multipoles: with the mesh known (Explicit, shard_map) and left to the partitioner (Auto, no
    mesh in scope: the binning's transpose runs there)."""
    mesh = make_mesh((4, 2), axis_type)
    sharding = pencilfft.real_space_sharding(mesh)
    x = put_global(random_field(PADDED, np.float64, 10), sharding)
    y = put_global(random_field(PADDED, np.float64, 11), sharding)
    w = jnp.asarray(random_field((3, 5), np.float64, 12))
    check_directional_derivative(lambda a: jnp.sum(w * _pk(a)[1]), x)
    check_directional_derivative(lambda a: jnp.sum(w * _cross(a, y)[1]), x, seed=1)
    no_all_gather(jax.grad(lambda a: jnp.sum(w * _pk(a)[1])), x)


# ---------------------------------------------------------------------------------------------
# Errors


@pytest.mark.parametrize("kwargs,error,match", [
    (dict(kedges=1), ValueError, r"`kedges` as an int .* at least 2; got 1"),
    (dict(kedges=0.0), ValueError, r"`kedges` as a float is the bin width dk, finite and > 0"),
    (dict(kedges=2.0), ValueError, r"`kedges`=2.0 gives 1 bin edge\(s\) below the Nyquist"),
    (dict(kedges=[0.5]), ValueError, r"`kedges` as an array must be 1-D with at least 2 edges"),
    (dict(kedges=[0.5, 0.2, 0.9]), ValueError, r"`kedges` must be finite and strictly increasing"),
    (dict(kedges="fine"), TypeError, r"`kedges` must be None, an int, a float or an array"),
    (dict(multipoles=-2), ValueError, r"`multipoles` must be >= 0"),
    (dict(multipoles=(0, 1.5)), TypeError, r"`multipoles` must be an int or a sequence of ints"),
    (dict(multipoles=2, los=(0, 0, 0)), ValueError, r"`los` \(the line of sight\) must not be zero"),
    (dict(multipoles=2, los=(0, 1)), ValueError, r"`los` must be 3 finite numbers"),
    (dict(box_shape=(1.0, -2.0, 1.0)), ValueError, r"`box_shape` must be 3 finite positive"),
])
def test_bad_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        pencilfft.power_spectrum(np.zeros(SHAPE), **kwargs)


def test_bad_fields():
    with pytest.raises(ValueError, match=r"`field` must be a 3-D field \(X, Y, Z\), or "
                                         r"\(\.\.\., X, Y, Z\).*got shape \(16, 16\)"):
        pencilfft.power_spectrum(np.zeros((16, 16)))
    with pytest.raises(ValueError, match=r"`field2` must have the shape of `field` "
                                         r"\(16, 16, 16\); got \(16, 16, 8\)"):
        pencilfft.power_spectrum(np.zeros(SHAPE), np.zeros((16, 16, 8)))
    with pytest.raises(TypeError, match=r"`field` must be real"):
        pencilfft.power_spectrum(np.zeros(SHAPE, np.complex64))
    with pytest.raises(TypeError, match=r"`field` must be an array"):
        pencilfft.power_spectrum([[[1.0]]])
    mesh = make_mesh((4, 2))
    x = put_global(np.zeros(SHAPE), pencilfft.real_space_sharding(mesh))
    y = put_global(np.zeros(SHAPE), NamedSharding(mesh, P("y", "x")))
    with pytest.raises(ValueError, match=r"`field2` must be sharded as `field` \(P\('x', 'y', "
                                         r"None\) on mesh \{'x': 4, 'y': 2\}\); got P\('y', 'x'\)"):
        pencilfft.power_spectrum(x, y)


# ---------------------------------------------------------------------------------------------
# For analysts: mode counts, window compensation, shot noise (nbodykit's FFTPower options)


def check_options(result, fields, field2s=None, dtype=np.float64, *, windows=(), shot=None,
                  **kw):
    """(k, pk, nmodes) against the reference (counts on the whole grid, power divided by the
    windows' transfer functions, the shot noise off the monopole)."""
    k, pk, nmodes = (to_numpy(r) for r in result)
    fields = np.asarray(fields)
    lead = fields.shape[:-3]
    flat = fields.reshape((-1,) + fields.shape[-3:])
    flat2 = None if field2s is None else np.asarray(field2s).reshape(flat.shape)
    refs = [reference(f, None if flat2 is None else flat2[i], windows=windows, shot=shot,
                      counts=True, **kw) for i, f in enumerate(flat)]
    assert_close(k, refs[0][0], dtype, "k")
    assert_close(pk, np.stack([r[1] for r in refs]).reshape(lead + refs[0][1].shape), dtype, "pk")
    assert nmodes.dtype == np.int32 and np.array_equal(nmodes, refs[0][2]), (nmodes, refs[0][2])


def test_counts_are_the_full_grids_modes():
    """The half spectrum's weights count every mode of the full grid once: the counts of all
    bins (the outer ones included) sum to X * Y * Z, on even and odd grids."""
    for shape in ((16, 16, 16), (12, 15, 13), (8, 6, 10)):
        x = np.zeros(shape)
        edges = np.linspace(-1.0, 2 * np.pi, 9)  # every mode in a returned bin
        *_, nmodes = pencilfft.power_spectrum(x, kedges=edges, return_counts=True)
        assert int(np.sum(nmodes)) == np.prod(shape), shape


ANALYST = {
    "counts": dict(kw=dict(kedges=0.3)),
    "cic-poles": dict(kw=dict(multipoles=(0, 2), los=(0, 1, 1)), compensation="cic",
                      windows=("cic", "cic")),
    "tsc-shot-box": dict(kw=dict(box_shape=(100.0, 50.0, 80.0), kedges=0.12),
                         compensation="tsc", windows=("tsc", "tsc"), shot_noise=3.5, shot=3.5),
    # nbodykit's V / N, subtracted from the monopole only; odd grid, NGP and PCS
    "pcs-nparticles-odd": dict(shape=(12, 15, 13), kw=dict(multipoles=(2, 0, 4), kedges=4),
                               compensation="pcs", windows=("pcs", "pcs"), n_particles=777,
                               shot=12 * 15 * 13 / 777),
    "ngp-int-multipole": dict(kw=dict(multipoles=0), compensation="nnb", windows=("ngp", "ngp")),
}


@pytest.mark.parametrize("case", list(ANALYST))
def test_analyst_options_one_device(case):
    c = dict(ANALYST[case])
    x = random_field(c.pop("shape", SHAPE), np.float64, 21)
    kw, windows, shot = c.pop("kw"), c.pop("windows", ()), c.pop("shot", None)
    got = pencilfft.power_spectrum(x, return_counts=True, **kw, **c)
    check_options(got, x, windows=windows, shot=shot, **kw)
    # without return_counts: JaxPM's (k, pk), the same numbers
    k, pk = pencilfft.power_spectrum(x, **kw, **c)
    np.testing.assert_array_equal(np.asarray(pk), np.asarray(got[1]))


def test_cross_spectrum_compensates_each_field():
    """One window per field: the cross power divided by W_cic(k) W_tsc(k); one name for both."""
    x, y = random_field(SHAPE, np.float64, 22), random_field(SHAPE, np.float64, 23)
    kw = dict(multipoles=(0, 2), kedges=0.4)
    got = pencilfft.power_spectrum(x, y, compensation=("cic", "tsc"), shot_noise=0.25,
                                   return_counts=True, **kw)
    check_options(got, x, y, windows=("cic", "tsc"), shot=0.25, **kw)
    got = pencilfft.power_spectrum(x, y, compensation=("cic", None), return_counts=True, **kw)
    check_options(got, x, y, windows=("cic",), **kw)
    got = pencilfft.power_spectrum(x, y, compensation="tsc", return_counts=True, **kw)
    check_options(got, x, y, windows=("tsc", "tsc"), **kw)


OPTIONS = dict(compensation="cic", n_particles=4096, return_counts=True, **POLES)
OPTIONS_REF = dict(windows=("cic", "cic"), shot=16 ** 3 / 4096, **POLES)


@pytest.mark.parametrize("form", [pytest.param("eager-4x2", marks=pytest.mark.mpirun),
                                  "jit-no-mesh-padded", "batch-mesh-f32", "vmap-shot-traced"])
def test_analyst_options_on_meshes(form):
    """The options in every path of the binning: shard_map (mesh known), the partitioner's
    uneven blocks (padded grid, nothing in scope), a batch mesh, vmap with a traced shot noise."""
    if form == "batch-mesh-f32":
        mesh = jax.make_mesh((2, 2, 2), ("c", "x", "y"), axis_types=(AxisType.Explicit,) * 3)
        data = random_field((2,) + SHAPE, np.float32, 24)
        x = put_global(data, pencilfft.real_space_sharding(mesh))
        return check_options(pencilfft.power_spectrum(x, **OPTIONS), data, dtype=np.float32,
                             **OPTIONS_REF)
    shape = PADDED if form == "jit-no-mesh-padded" else SHAPE
    mesh = make_mesh((4, 2), "auto" if form == "jit-no-mesh-padded" else "explicit")
    data = random_field(shape, np.float64, 25)
    x = put_global(data, pencilfft.real_space_sharding(mesh))
    ref = dict(OPTIONS_REF, shot=np.prod(shape) / 4096)
    if form == "eager-4x2":
        return check_options(pencilfft.power_spectrum(x, **OPTIONS), data, **ref)
    if form == "jit-no-mesh-padded":
        fn = lambda f: pencilfft.power_spectrum(f, **OPTIONS)
        check_options(jax.jit(fn)(x), data, **ref)
        return no_all_gather(fn, x)
    # vmap over two fields with a shot noise that is itself traced (one per field)
    opts = {k: v for k, v in OPTIONS.items() if k != "n_particles"}
    fn = jax.vmap(lambda f, s: pencilfft.power_spectrum(f, shot_noise=s, **opts)[1])
    pair = put_global(np.stack([data, 2 * data]), NamedSharding(mesh, P(None, "x", "y")))
    got = to_numpy(jax.jit(fn)(pair, jnp.asarray([1.0, 2.0])))
    refs = np.stack([reference(d, windows=("cic", "cic"), shot=s, **POLES)[1]
                     for d, s in ((data, 1.0), (2 * data, 2.0))])
    assert_close(got, refs, np.float64)


def test_compensation_gradient():
    """The compensation is in the binning's weights: its transpose (jax.grad) carries it."""
    mesh = make_mesh((4, 2), "auto")
    x = put_global(random_field(PADDED, np.float64, 26), pencilfft.real_space_sharding(mesh))
    w = jnp.asarray(random_field((3, 5), np.float64, 27))
    check_directional_derivative(
        lambda a: jnp.sum(w * pencilfft.power_spectrum(a, compensation="tsc", **POLES)[1]), x)


@pytest.mark.parametrize("kwargs,error,match", [
    (dict(compensation="lanczos"), ValueError,
     r"`compensation` must be None, a window name \('ngp', 'cic', 'tsc', 'pcs'\); got 'lanczos'"),
    (dict(compensation=("cic", "cic")), ValueError,
     r"`compensation` must be None, a window name .*; got \('cic', 'cic'\)"),
    (dict(compensation=2), TypeError, r"`compensation` must be None, a window name"),
    (dict(shot_noise="poisson"), TypeError, r"`shot_noise` must be a real number .*'poisson'"),
    (dict(shot_noise=float("nan")), ValueError, r"`shot_noise` must be finite; got nan"),
    (dict(shot_noise=True), TypeError, r"`shot_noise` must be a real number"),
    (dict(n_particles=0), ValueError, r"`n_particles` must be > 0 .*; got 0"),
    (dict(n_particles=2.5), TypeError, r"`n_particles` must be an int .*; got 2.5"),
    (dict(n_particles=10, shot_noise=1.0), ValueError,
     r"give `shot_noise` .* or `n_particles` .*, not both"),
    (dict(return_counts="yes"), TypeError, r"`return_counts` must be True or False; got 'yes'"),
])
def test_bad_analyst_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        pencilfft.power_spectrum(np.zeros(SHAPE), **kwargs)
    if "compensation" in kwargs and isinstance(kwargs["compensation"], str):
        with pytest.raises(ValueError, match=r"or a pair \(window of `field`, window of "
                                             r"`field2`\), each a name or None; got"):
            pencilfft.power_spectrum(np.zeros(SHAPE), np.zeros(SHAPE),
                                     compensation=(kwargs["compensation"], None))


# ---------------------------------------------------------------------------------------------
# The how-to's compensation snippet, as written


def _python_block(page: str, containing: str) -> str:
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "howto" / page).read_text()
    blocks = [b for b in re.findall(r"```python\n(.*?)```", text, re.S) if containing in b]
    assert len(blocks) == 1, f"{page}: {len(blocks)} python blocks hold {containing!r}"
    return blocks[0]


def test_painting_compensation_snippet():
    """docs/howto/painting.md's deconvolution runs as written (with a `dx` as the page's), gives
    numpy's rfftn(rho) / W(k), and its sentence holds: the power of the deconvolved field is
    power_spectrum(rho, compensation=...)'s."""
    mesh = make_mesh((4, 2))
    dx = put_global(random_field(SHAPE + (3,), np.float64, 31) * 0.4,
                    pencilfft.displacement_sharding(mesh))
    scope = {"pencilfft": pencilfft, "dx": dx}
    exec(_python_block("painting.md", "window_compensation"), scope)
    rho, rho_k = to_numpy(scope["rho"]), to_numpy(scope["rho_k"])
    ref = np.fft.rfftn(rho) / window_transfer(SHAPE, ("tsc",))[:, :, :SHAPE[2] // 2 + 1]
    got = np.moveaxis(rho_k, -1, 0)[:, :, :SHAPE[2] // 2 + 1]  # transposed (Y, Z', X), padded
    assert rel_err(got, ref) < 1e-12
    # |rho_k|^2 binned (numpy's ortho norm and cell volume: / N) against the one-pass option
    kw = dict(kedges=0.4)
    k, pk = pencilfft.power_spectrum(scope["rho"], compensation="tsc", **kw)
    full = np.fft.fftn(rho) / window_transfer(SHAPE, ("tsc",))
    deconvolved = np.fft.ifftn(full).real  # the deconvolved field, whose plain spectrum it is
    assert_close(pk, reference(deconvolved, **kw)[1], np.float64, "pk")
