"""gaussian_field and zeldovich_displacement against float64 numpy references, on one device and
on every mesh class (the same key gives the same field on all of them), eagerly and under jit,
with batch axes; the measured P(k) of a generated field against its input within cosmic
variance (a chi-squared over the bins, with the mode counts of power_spectrum); and
displacement_sharding, the sharding of `paint`'s dx.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

import pencilfft
from conftest import make_mesh, put_global, random_field, rel_err, to_numpy, tol

SHAPE = (16, 16, 16)
BOX = (100.0, 80.0, 120.0)
AMPLITUDE = 50.0


def power_law(k):
    return AMPLITUDE * k ** -2.0


# ---------------------------------------------------------------------------------------------
# The references (numpy, float64, the whole grid)


def kgrid(shape, box, half=True):
    """Physical wavenumbers (kx, ky, kz) of numpy's rfftn (half=True) or fftn grid."""
    ks = [2 * np.pi * np.fft.fftfreq(n, b / n) for n, b in zip(shape, box)]
    if half:
        ks[2] = 2 * np.pi * np.fft.rfftfreq(shape[2], box[2] / shape[2])
    return np.meshgrid(*ks, indexing="ij")


def reference_field(white, box, power):
    """JaxPM's linear_field in numpy: rfftn(white) * sqrt(P(|k|) N / V), k = 0 zeroed, irfftn."""
    shape = white.shape[-3:]
    k = np.sqrt(sum(c ** 2 for c in kgrid(shape, box)))
    amp = np.zeros_like(k)
    amp[k > 0] = np.sqrt(power(k[k > 0]) * np.prod(shape) / np.prod(box))
    return np.fft.irfftn(np.fft.rfftn(np.asarray(white, np.float64), axes=(-3, -2, -1)) * amp,
                         s=shape, axes=(-3, -2, -1))


def reference_displacement(delta, box):
    """psi_k = i k / k^2 delta_k on the whole grid, each Nyquist component of k zeroed."""
    shape = delta.shape[-3:]
    kvec = kgrid(shape, box, half=False)
    k2 = sum(c ** 2 for c in kvec)
    inv = np.where(k2 > 0, 1 / np.where(k2 > 0, k2, 1), 0)
    dk = np.fft.fftn(delta, axes=(-3, -2, -1))
    out = []
    for c, n, b in zip(kvec, shape, box):
        c = np.where(np.abs(c) > np.pi * (n - 1) / b, 0, c)
        out.append(np.fft.ifftn(1j * c * inv * dk, axes=(-3, -2, -1)).real)
    return np.stack(out, axis=-1)


def white_noise(key, shape, dtype=jnp.float64):
    """The white noise gaussian_field draws: jax's normal numbers, the same on any mesh."""
    return np.asarray(jax.random.normal(key, shape, dtype), np.float64)


def assert_close(got, ref, dtype, what=""):
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    assert got.shape == ref.shape, (what, got.shape, ref.shape)
    err = rel_err(got, ref)
    assert err <= 10 * tol(dtype), (what, err)


def no_all_gather(fn, *args):
    text = jax.jit(fn).lower(*args).compile().as_text()
    assert "all-gather" not in text, "the compiled program gathers"


# ---------------------------------------------------------------------------------------------
# gaussian_field: the same field on every mesh, in every calling form


MESHES = [
    pytest.param(None, np.float64, id="one-device"),
    pytest.param((4, 2), np.float64, marks=pytest.mark.mpirun, id="4x2"),
    pytest.param((8,), np.float32, id="8-f32"),  # a 1-axis mesh (slabs)
]


@pytest.mark.parametrize("pdims,dtype", MESHES)
def test_gaussian_field_on_meshes(pdims, dtype):
    # one device with a raw key (jax.random.PRNGKey): the same numbers as a typed one
    key = jax.random.key(3) if pdims is not None else jax.random.PRNGKey(3)
    mesh = None if pdims is None else make_mesh(pdims)
    got = pencilfft.gaussian_field(key, SHAPE, power_law, box_shape=BOX, mesh=mesh, dtype=dtype)
    assert got.shape == SHAPE and got.dtype == dtype
    if mesh is not None:
        assert got.sharding.is_equivalent_to(pencilfft.real_space_sharding(mesh), 3)
    ref = reference_field(white_noise(key, SHAPE, dtype), BOX, power_law)
    assert_close(to_numpy(got), ref, dtype)
    assert abs(float(np.mean(to_numpy(got)))) < 1e-5 * np.abs(ref).max()  # k = 0 mode zeroed


@pytest.mark.parametrize("form", ["jit-mesh", "jit-set-mesh", "eager-ambient-auto"])
def test_gaussian_field_calling_forms(form):
    key = jax.random.key(4)
    mesh = make_mesh((4, 2), "auto" if form == "eager-ambient-auto" else "explicit")

    def make(k, mesh=None):
        return pencilfft.gaussian_field(k, SHAPE, power_law, box_shape=BOX, mesh=mesh)

    if form == "jit-mesh":
        got = jax.jit(lambda k: make(k, mesh))(key)
        no_all_gather(lambda k: make(k, mesh), key)
    else:
        with jax.set_mesh(mesh):
            got = jax.jit(make)(key) if form == "jit-set-mesh" else make(key)
    assert got.sharding.is_equivalent_to(pencilfft.real_space_sharding(mesh), 3), form
    ref = reference_field(white_noise(key, SHAPE), BOX, power_law)
    assert_close(to_numpy(got), ref, np.float64, form)


def test_gaussian_field_gradient_in_the_power():
    """d/dA of sum(delta^2) for P = A k^-2 is sum(delta^2) / A (delta scales as sqrt(A)): the
    field is differentiable in the spectrum's parameters (under jit, as explicit meshes need)."""
    mesh = make_mesh((4, 2))

    def loss(a):
        d = pencilfft.gaussian_field(jax.random.key(10), SHAPE, lambda k: a * k ** -2.0,
                                     box_shape=BOX, mesh=mesh)
        return jnp.sum(d ** 2)

    value, slope = jax.jit(jax.value_and_grad(loss))(2.0)
    assert float(slope) == pytest.approx(float(value) / 2.0, rel=1e-10)


def test_gaussian_field_power_as_array():
    """An array on prfft3d's k grid (here made from rfftfreq3d, padded for a 4x2 mesh: Z//2+1 =
    9 rows by 2) gives the field of the callable."""
    mesh = make_mesh((4, 2))
    key = jax.random.key(5)
    probe = pencilfft.prfft3d(put_global(np.zeros(SHAPE), pencilfft.real_space_sharding(mesh)))
    kx, ky, kz = pencilfft.rfftfreq3d(probe, d=tuple(b / n for b, n in zip(BOX, SHAPE)), s=SHAPE)
    k = jnp.sqrt(kx ** 2 + ky ** 2 + kz ** 2)
    table = jnp.where(k > 0, power_law(jnp.where(k > 0, k, 1)), 0)
    got = pencilfft.gaussian_field(key, SHAPE, table, box_shape=BOX, mesh=mesh)
    ref = reference_field(white_noise(key, SHAPE), BOX, power_law)
    assert_close(to_numpy(got), ref, np.float64)


def test_gaussian_field_batch_mesh():
    """(2, X, Y, Z) on a (2, 2, 2) mesh: two independent fields, the batch axis split."""
    mesh = jax.make_mesh((2, 2, 2), ("c", "x", "y"), axis_types=(AxisType.Explicit,) * 3)
    key = jax.random.key(6)
    got = pencilfft.gaussian_field(key, (2,) + SHAPE, power_law, box_shape=BOX, mesh=mesh)
    assert got.sharding.is_equivalent_to(pencilfft.real_space_sharding(mesh), 4)
    ref = reference_field(white_noise(key, (2,) + SHAPE), BOX, power_law)
    assert_close(to_numpy(got), ref, np.float64)
    assert rel_err(ref[0], ref[1]) > 0.5  # independent fields


# ---------------------------------------------------------------------------------------------
# The measured spectrum within cosmic variance


def binned_input(shape, box, kedges, power):
    """(modes per bin, mean of P over each bin's modes, 2 sum(P^2) / N^2) on the whole grid,
    bins as power_spectrum's (edges[i-1] <= |k| < edges[i], the outer ones dropped)."""
    kmodes = np.sqrt(sum(c ** 2 for c in kgrid(shape, box, half=False))).ravel()
    dig = np.digitize(kmodes, kedges)
    n = len(kedges) + 1
    p = np.zeros_like(kmodes)
    p[kmodes > 0] = power(kmodes[kmodes > 0])
    count = np.bincount(dig, minlength=n)[1:-1]
    mean = np.bincount(dig, weights=p, minlength=n)[1:-1] / count
    var = 2 * np.bincount(dig, weights=p ** 2, minlength=n)[1:-1] / count ** 2
    return count, mean, var


CHI2_SHAPE = (32, 32, 32)
CHI2_BOX = (200.0, 200.0, 200.0)
# edges between the fundamental's multiples (no mode on an edge), up to the Nyquist wavenumber
CHI2_EDGES = (np.arange(1, 16) + 0.5) * 2 * np.pi / 200.0
# chi2/dof over 14 bins: 1.00 on average over 200 numpy realizations of this test's field,
# 99th percentile 2.35; these keys give 0.64-0.69, a power off by 2 gives about 576.
CHI2_BOUND = 3.0


def spectrum_chi2(pk, nmodes, shape, box, edges, power):
    count, mean, var = binned_input(shape, box, edges, power)
    assert np.array_equal(np.asarray(nmodes), count), "power_spectrum's mode counts"
    return float(np.sum((np.asarray(pk) - mean) ** 2 / var) / len(count))


def test_measured_spectrum_within_cosmic_variance():
    """On 8 devices (4x2), a 32^3 field of P(k) = A k^-2: chi2/dof of its measured P(k) below
    the bound, for several keys; the same data with the power off by a factor 2 (a generator
    normalised wrongly by sqrt(2) in amplitude) is far above it."""
    mesh = make_mesh((4, 2))
    make = jax.jit(lambda key: pencilfft.power_spectrum(
        pencilfft.gaussian_field(key, CHI2_SHAPE, power_law, box_shape=CHI2_BOX, mesh=mesh),
        box_shape=CHI2_BOX, kedges=CHI2_EDGES, return_counts=True))
    for seed in (0, 1, 2):
        k, pk, nmodes = make(jax.random.key(seed))
        chi2 = spectrum_chi2(pk, nmodes, CHI2_SHAPE, CHI2_BOX, CHI2_EDGES, power_law)
        assert 0.2 < chi2 < CHI2_BOUND, (seed, chi2)
        for wrong in (2.0, 0.5):
            bad = spectrum_chi2(wrong * np.asarray(pk), nmodes, CHI2_SHAPE, CHI2_BOX, CHI2_EDGES,
                                power_law)
            assert bad > 10 * CHI2_BOUND, (seed, wrong, bad)


# ---------------------------------------------------------------------------------------------
# Zel'dovich displacement


@pytest.mark.parametrize("pdims,shape,box", [
    pytest.param((4, 2), SHAPE, BOX, marks=pytest.mark.mpirun, id="4x2"),
    pytest.param((8,), (16, 12, 10), None, id="8-cells"),
    pytest.param(None, (9, 8, 7), (9.0, 4.0, 7.0), id="one-device-odd"),
])
def test_zeldovich_displacement(pdims, shape, box):
    data = random_field(shape, np.float64, 7)
    mesh = None if pdims is None else make_mesh(pdims)
    x = data if mesh is None else put_global(data, pencilfft.real_space_sharding(mesh))
    psi = pencilfft.zeldovich_displacement(x, box_shape=box)
    assert psi.shape == shape + (3,) and psi.dtype == np.float64
    if mesh is not None:
        assert psi.sharding.is_equivalent_to(pencilfft.displacement_sharding(mesh), 4)
    ref = reference_displacement(data, box if box is not None else shape)
    assert_close(to_numpy(psi), ref, np.float64)
    # div psi = -delta, on the modes without a Nyquist component
    if mesh is not None:
        jitted = jax.jit(lambda d: pencilfft.zeldovich_displacement(d, box_shape=box))(x)
        assert_close(to_numpy(jitted), ref, np.float64, "jit")


def test_zeldovich_then_paint():
    """A field's displacement, in cells, painted on the lattice: the density of the Zel'dovich
    particles, whose linear part is delta (small displacements)."""
    mesh = make_mesh((4, 2))
    delta = pencilfft.gaussian_field(jax.random.key(8), SHAPE, lambda k: 1e-4 * k ** -2,
                                     mesh=mesh)
    psi = pencilfft.zeldovich_displacement(delta)  # cells: box_shape None
    rho = pencilfft.paint(psi)
    d, r = to_numpy(delta), to_numpy(rho) - 1
    # CIC smooths: compare at large scales, where the window is ~1
    low = sum(c ** 2 for c in kgrid(SHAPE, SHAPE)) < 0.5
    lo = lambda f: np.fft.irfftn(np.fft.rfftn(f) * low, s=SHAPE, axes=(0, 1, 2))
    assert rel_err(lo(r), lo(d)) < 0.1


# ---------------------------------------------------------------------------------------------
# displacement_sharding


@pytest.mark.parametrize("pdims,names,spec", [
    ((4, 2), ("x", "y"), P("x", "y", None, None)),
    ((8,), ("x",), P("x", None, None, None)),
    ((2, 2, 2), ("c", "x", "y"), P("c", "x", "y", None, None)),
])
def test_displacement_sharding(pdims, names, spec):
    mesh = jax.make_mesh(pdims, names, axis_types=(AxisType.Explicit,) * len(pdims))
    assert pencilfft.displacement_sharding(mesh).spec == spec
    if len(pdims) == 2:
        assert pencilfft.displacement_sharding(mesh, 5).spec == P(None, "x", "y", None, None)
        dx = put_global(random_field(SHAPE + (3,), np.float32, 9) * 0.3,
                        pencilfft.displacement_sharding(mesh))
        ref = pencilfft.paint(np.asarray(dx))  # one device
        assert_close(to_numpy(pencilfft.paint(dx)), np.asarray(ref), np.float32)
        assert_close(to_numpy(jax.jit(pencilfft.paint)(dx)), np.asarray(ref), np.float32)


# ---------------------------------------------------------------------------------------------
# Wrong inputs


@pytest.mark.parametrize("args,kwargs,error,match", [
    ((0, SHAPE, power_law), {}, TypeError, r"`key` must be one PRNG key .*got int"),
    ((jax.random.split(jax.random.key(0)), SHAPE, power_law), {}, TypeError,
     r"`key` must be one PRNG key .*got an array of shape \(2,\)"),
    ((jax.random.key(0), (16, 16), power_law), {}, ValueError,
     r"`shape` must be \(\.\.\., X, Y, Z\), positive, with at least 3 axes .*got \(16, 16\)"),
    ((jax.random.key(0), (16, 16, 0), power_law), {}, ValueError, r"`shape` must be"),
    ((jax.random.key(0), "16", power_law), {}, TypeError, r"`shape` must be a sequence of ints"),
    ((jax.random.key(0), SHAPE, "flat"), {}, TypeError,
     r"`power` must be a callable P\(k\) or a real array"),
    ((jax.random.key(0), SHAPE, np.ones((3, 3))), {}, ValueError,
     r"`power` must broadcast against the k grid of the half spectrum \(16, 9, 16\).*\(3, 3\)"),
    ((jax.random.key(0), SHAPE, lambda k: k * 1j), {}, TypeError,
     r"`power` must be a callable returning a real array \(P\(k\)\); got dtype complex"),
    ((jax.random.key(0), SHAPE, lambda k: np.ones(7)), {}, ValueError,
     r"the result of the callable `power` must broadcast against the k grid"),
    ((jax.random.key(0), SHAPE, power_law), dict(dtype=np.int32), TypeError,
     r"`dtype` must be float32 or float64; got <class 'numpy.int32'>"),
    ((jax.random.key(0), SHAPE, power_law), dict(box_shape=(1.0, 0.0, 1.0)), ValueError,
     r"`box_shape` must be 3 finite positive numbers"),
])
def test_gaussian_field_wrong_inputs(args, kwargs, error, match):
    with pytest.raises(error, match=match):
        pencilfft.gaussian_field(*args, **kwargs)


def test_gaussian_field_shape_too_small_for_batch_mesh():
    mesh = jax.make_mesh((2, 2, 2), ("c", "x", "y"), axis_types=(AxisType.Explicit,) * 3)
    with pytest.raises(ValueError, match=r"at least 4 axes \(one leading axis per batch axis"):
        pencilfft.gaussian_field(jax.random.key(0), SHAPE, power_law, mesh=mesh)


@pytest.mark.parametrize("arg,kwargs,error,match", [
    (np.zeros(SHAPE, np.complex64), {}, TypeError, r"`delta` must be real .*complex64"),
    (np.zeros((16, 16)), {}, ValueError, r"`delta` must be a 3-D field .*got shape \(16, 16\)"),
    ([[[1.0]]], {}, TypeError, r"`delta` must be an array .*got list"),
    (np.zeros(SHAPE), dict(box_shape=(1.0, 2.0)), ValueError, r"`box_shape` must be 3 finite"),
])
def test_zeldovich_wrong_inputs(arg, kwargs, error, match):
    with pytest.raises(error, match=match):
        pencilfft.zeldovich_displacement(arg, **kwargs)


@pytest.mark.parametrize("ndim,error,match", [
    (3, ValueError, r"`ndim` must be at least 4 \(the global dimensions \(\.\.\., X, Y, Z, C\)\); "
                    r"got 3"),
    ("4", TypeError, r"`ndim` must be an integer >= 4 .*got '4' \(str\)"),
])
def test_displacement_sharding_wrong_ndim(ndim, error, match):
    with pytest.raises(error, match=match):
        pencilfft.displacement_sharding(make_mesh((4, 2)), ndim)
    mesh = jax.make_mesh((2, 2, 2), ("c", "x", "y"), axis_types=(AxisType.Explicit,) * 3)
    with pytest.raises(ValueError, match=r"`ndim` \(=4\) is too small for the mesh's batch "
                                         r"axes \('c',\) .*expected at least 5"):
        pencilfft.displacement_sharding(mesh, 4)


# ---------------------------------------------------------------------------------------------
# docs/howto/power-spectra.md's blocks, as written (on a 16^3 grid instead of 64^3)


def test_power_spectra_page_runs():
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "howto" / "power-spectra.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    fields = [b for b in blocks if "gaussian_field(" in b]
    options = [b for b in blocks if "return_counts=True" in b and "n_particles" in b]
    dx = [b for b in blocks if "displacement_sharding(mesh)" in b]
    assert len(fields) == len(options) == len(dx) == 1
    scope: dict = {}
    exec(fields[0].replace("64", "16"), scope)
    assert scope["delta"].shape == (16, 16, 16) and scope["psi"].shape == (16, 16, 16, 3)
    assert scope["psi"].sharding.spec == P("x", "y", None, None)
    ratio = np.asarray(scope["pk_rho"])[:3] / (0.01 * 1e3 * np.asarray(scope["k"])[:3] ** -2.0)
    assert np.all((0.5 < ratio) & (ratio < 2)), ratio  # the particles follow D^2 P at large scales
    scope.update(n=16 ** 3, p_shot=1.0)
    exec(options[0], scope)
    exec(dx[0].replace("64", "16"), scope)
    assert scope["dx"].sharding.spec == P("x", "y", None, None)
    assert float(np.asarray(scope["rho"]).mean()) == pytest.approx(1.0)
