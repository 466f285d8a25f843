"""ptransform3d / pitransform3d: a transform kind per axis (FFT, rFFT, DCT-I..IV, DST-I..IV),
against scipy.fft in float64 on every mesh kind, in every calling form, and their errors."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.fft as sf
from jax.sharding import PartitionSpec as P

import pencilfft
from conftest import (MPIRUN, check_directional_derivative, make_mesh, put_global, random_field,
                      rel_err, to_numpy)

R2R = ("dct1", "dct2", "dct3", "dct4", "dst1", "dst2", "dst3", "dst4")
MESHES = [(4, 2), (1, 8), (8,), None]  # pencils, a slab over Y, a slab over X, one device
SHAPES = [(8, 16, 10), (8, 8, 9)]  # the second padded in k space on most meshes


def one_axis(x, kind, axis, norm, forward=True):
    """scipy's / numpy's 1-D transform of `kind` along `axis` (float64 reference)."""
    if kind == "fft":
        return (np.fft.fft if forward else np.fft.ifft)(x, axis=axis, norm=norm)
    if kind == "rfft":
        return np.fft.rfft(x, axis=axis, norm=norm)
    fn = {("dct", True): sf.dct, ("dct", False): sf.idct,
          ("dst", True): sf.dst, ("dst", False): sf.idst}[(kind[:3], forward)]
    return fn(x, type=int(kind[3]), axis=axis, norm=norm)


def reference(x, kinds, norm="backward", layout="transposed"):
    """The 3-D transform of the last three axes, Z first, in `layout` order."""
    k = np.asarray(x)
    for axis, kind in zip((-1, -2, -3), reversed(kinds)):
        k = one_axis(k, kind, axis, norm)
    return np.moveaxis(k, -3, -1) if layout == "transposed" else k


def exact(k, kinds, shape, layout="transposed"):
    """`k` without the mesh's zero padding (global shapes)."""
    x, y, z = shape
    zc = z // 2 + 1 if kinds[2] == "rfft" else z
    return k[..., :y, :zc, :x] if layout == "transposed" else k[..., :x, :y, :zc]


def data(shape, kinds, seed=0):
    dtype = np.complex128 if "fft" in kinds and "rfft" not in kinds else np.float64
    return random_field(shape, dtype, seed)


def placed(x, pdims):
    if pdims is None:
        return jnp.asarray(x)
    return put_global(x, pencilfft.real_space_sharding(make_mesh(pdims)))


def check(kinds, pdims, shape, norm="backward", layout="transposed"):
    x = data(shape, kinds)
    xs = placed(x, pdims)
    k = pencilfft.ptransform3d(xs, kinds, norm, layout=layout)
    ref = reference(x, kinds, norm, layout)
    got = exact(to_numpy(k), kinds, shape, layout)
    assert got.shape == ref.shape
    assert rel_err(got, ref) < 1e-12, (kinds, pdims, norm)
    if "fft" not in kinds and "rfft" not in kinds:
        assert k.dtype == np.float64  # real stays real
    back = pencilfft.pitransform3d(k, kinds, norm, s=shape, layout=layout)
    assert back.dtype == x.dtype
    assert rel_err(to_numpy(back), x) < 1e-12


# Every DCT/DST along X, Y and Z in turn (FFTs along the other two): on one device all 24, on
# the meshes the kind moves along the axes so that each mesh sees each kind once.
@pytest.mark.parametrize("kind", R2R)
@pytest.mark.parametrize("axis", [0, 1, 2])
def test_each_kind_on_each_axis_one_device(kind, axis):
    kinds = ["fft"] * 3
    kinds[axis] = kind
    check(tuple(kinds), None, SHAPES[1])


KIND_MESHES = [pytest.param(i, kind, pdims, id=f"{kind}-{'x'.join(map(str, pdims))}")
               for i, kind in enumerate(R2R) for pdims in MESHES[:3]]


@pytest.mark.parametrize("i,kind,pdims", KIND_MESHES)
def test_each_kind_on_meshes(i, kind, pdims):
    kinds = ["fft"] * 3
    kinds[i % 3] = kind
    check(tuple(kinds), pdims, SHAPES[i % 2])


@pytest.mark.parametrize("norm", ["backward", "ortho", "forward"])
@pytest.mark.parametrize("kinds", [("dct2", "dct2", "dct2"), ("dst1", "dct4", "dst3"),
                                   ("dct1", "dst2", "dct3"), ("dst4", "fft", "rfft"),
                                   ("dct2", "fft", "fft")])
def test_norms_and_mixed_kinds(kinds, norm):
    check(kinds, (4, 2), SHAPES[0], norm)


# Under mpirun: one representative of ptransform3d/pitransform3d across processes (DCT, DST and
# rfft through the pencil exchanges), both layouts.
@pytest.mark.parametrize("pdims", [pytest.param(p, marks=MPIRUN) if p == (4, 2) else p
                                   for p in MESHES],
                         ids=lambda p: "x".join(map(str, p)) if p else "1dev")
@pytest.mark.parametrize("layout", ["transposed", "natural"])
def test_layouts_and_rfft_with_r2r(pdims, layout):
    check(("dct3", "dst2", "rfft"), pdims, SHAPES[1], "ortho", layout)


def test_common_cases_equal_the_fft_functions():
    x = random_field((8, 16, 10), np.float64, 3)
    xs = placed(x, (4, 2))
    np.testing.assert_array_equal(to_numpy(pencilfft.ptransform3d(xs, ("fft",) * 3)),
                                  to_numpy(pencilfft.pfft3d(xs)))
    np.testing.assert_array_equal(to_numpy(pencilfft.ptransform3d(xs, ("fft", "fft", "rfft"))),
                                  to_numpy(pencilfft.prfft3d(xs)))


def test_complex_input_to_r2r_kinds():
    x = random_field((8, 16, 10), np.complex128, 4)
    kinds = ("dct2", "dst3", "dct1")
    k = pencilfft.ptransform3d(placed(x, (2, 4)), kinds)
    assert k.dtype == np.complex128
    assert rel_err(exact(to_numpy(k), kinds, x.shape), reference(x, kinds)) < 1e-12


def test_float32_precision_and_dtype():
    x = random_field((8, 16, 10), np.float32, 5)
    kinds = ("dct2", "dct4", "dst2")
    k = pencilfft.ptransform3d(placed(x, (4, 2)), kinds)
    assert k.dtype == np.float32
    assert rel_err(exact(to_numpy(k), kinds, x.shape), reference(x.astype(np.float64), kinds)) < 1e-5


# ------------------------------------------------------------------------------ calling forms

KINDS = ("dct2", "fft", "fft")


# Under mpirun: the compiler-partitioned path with DCTs on multi-process arrays.
@pytest.mark.parametrize("form", [pytest.param("jit-auto-no-mesh", marks=MPIRUN), "jit-explicit",
                                  "set_mesh"])
def test_calling_forms(form):
    x = data((8, 16, 10), KINDS, 6)
    ref = reference(x, KINDS)
    if form == "jit-auto-no-mesh":  # the compiler-partitioned path
        xs = put_global(x, pencilfft.real_space_sharding(make_mesh((4, 2), "auto")))
        f = jax.jit(lambda v: pencilfft.pitransform3d(pencilfft.ptransform3d(v, KINDS), KINDS))
        text = f.lower(xs).compile().as_text()
        assert "all-gather" not in text
        k = jax.jit(lambda v: pencilfft.ptransform3d(v, KINDS))(xs)
        back = f(xs)
    else:
        mesh = make_mesh((4, 2))
        xs = put_global(x, pencilfft.real_space_sharding(mesh))
        if form == "set_mesh":
            with jax.set_mesh(mesh):
                k = jax.jit(lambda v: pencilfft.ptransform3d(v, KINDS))(xs)
        else:
            k = jax.jit(lambda v: pencilfft.ptransform3d(v, KINDS))(xs)
        back = jax.jit(lambda v: pencilfft.pitransform3d(v, KINDS))(k)
    assert rel_err(to_numpy(k), ref) < 1e-12
    assert rel_err(to_numpy(back), x) < 1e-12


def test_vmap_and_scan():
    x = random_field((3, 8, 16, 10), np.float64, 7)
    kinds = ("dst2", "dct1", "dct2")
    mesh = make_mesh((4, 2))
    xs = put_global(x, jax.sharding.NamedSharding(mesh, P(None, "x", "y")))
    k = jax.jit(jax.vmap(lambda v: pencilfft.ptransform3d(v, kinds)))(xs)
    assert rel_err(to_numpy(k), reference(x, kinds)) < 1e-12

    def body(c, v):
        return c + jnp.sum(pencilfft.ptransform3d(v, kinds) ** 2), None

    total, _ = jax.jit(lambda v: jax.lax.scan(body, 0.0, v))(xs)
    assert abs(float(total) - np.sum(reference(x, kinds) ** 2)) < 1e-9 * np.sum(reference(x, kinds) ** 2)


def dense(kind, n, norm):
    """The n x n matrix of a 1-D transform (scipy applied to the identity)."""
    return one_axis(np.eye(n), kind, 0, norm)


@pytest.mark.parametrize("pdims", [(4, 2), (1, 8), None], ids=lambda p: "x".join(map(str, p)) if p else "1dev")
@pytest.mark.parametrize("norm", ["backward", "ortho"])
def test_adjoint_is_the_transpose(pdims, norm):
    """jax.grad / linear_transpose give the transpose of the matrix, which for unnormalized DCTs
    is not the inverse (for orthonormal ones it is)."""
    kinds = ("dct1", "dst2", "dct3")
    shape = (8, 16, 8)
    x = data(shape, kinds, 8)
    xs = placed(x, pdims)
    f = jax.jit(lambda v: pencilfft.ptransform3d(v, kinds, norm))
    ct = random_field(shape[1:] + shape[:1], np.float64, 9)  # (Y, Z, X)
    ct_placed = jnp.asarray(ct) if pdims is None else put_global(
        ct, pencilfft.k_space_sharding(make_mesh(pdims)))
    # (inside jit: jax's eager autodiff refuses Explicit meshes outside `jax.set_mesh`)
    got = to_numpy(jax.jit(lambda c: jax.linear_transpose(f, xs)(c)[0])(ct_placed))
    mats = [dense(kind, n, norm) for kind, n in zip(kinds, shape)]
    want = np.einsum("yzx,xa,yb,zc->abc", ct, mats[0], mats[1], mats[2])
    assert rel_err(got, want) < 1e-12
    inverse = to_numpy(pencilfft.pitransform3d(ct_placed, kinds, norm))
    if norm == "ortho":
        assert rel_err(got, inverse) < 1e-12
    else:
        assert rel_err(got, inverse) > 0.1


def test_gradient_against_finite_differences():
    kinds = ("dct2", "fft", "rfft")
    mesh = make_mesh((4, 2))
    x = put_global(random_field((8, 8, 6), np.float64, 10), pencilfft.real_space_sharding(mesh))

    def loss(v):
        k = pencilfft.ptransform3d(v, kinds, "ortho")
        return jnp.sum(jnp.abs(k) ** 2 * jnp.cos(jnp.abs(k)))

    check_directional_derivative(loss, x, seed=11)
    # forward mode agrees with reverse mode
    v = put_global(random_field(x.shape, np.float64, 12), x.sharding)
    tangent = jax.jit(lambda a, b: jax.jvp(loss, (a,), (b,))[1])(x, v)
    slope = jax.jit(lambda a, b: jnp.sum(jax.grad(loss)(a) * b))(x, v)
    assert abs(float(tangent) - float(slope)) < 1e-9 * abs(float(slope))


# ------------------------------------------------------------------------------ wavenumbers


# Under mpirun: wavenumbers3d across processes.
@pytest.mark.parametrize("pdims", [pytest.param((4, 2), marks=MPIRUN), (1, 8), None],
                         ids=lambda p: "x".join(map(str, p)) if p else "1dev")
def test_wavenumbers_per_kind(pdims):
    shape = (8, 8, 9)
    d = (0.5, 1.0, 2.0)
    for kinds in [("dct1", "dst1", "dct2"), ("dst2", "dct3", "dct4"), ("dst3", "dst4", "rfft"),
                  ("fft", "fft", "fft")]:
        x = data(shape, kinds)
        k = pencilfft.ptransform3d(placed(x, pdims), kinds)
        kx, ky, kz = pencilfft.wavenumbers3d(k, kinds, d, s=shape)
        for vec, axis, kind, n, h in zip((kx, ky, kz), (2, 0, 1), kinds, shape, d):
            v = to_numpy(vec).reshape(-1)
            assert to_numpy(vec).shape[axis] == k.shape[axis]
            m = np.arange(n)
            want = {
                "fft": 2 * np.pi * np.fft.fftfreq(n, h), "rfft": 2 * np.pi * np.fft.rfftfreq(n, h),
                "dct1": np.pi * m / ((n - 1) * h), "dct2": np.pi * m / (n * h),
                "dst1": np.pi * (m + 1) / ((n + 1) * h), "dst2": np.pi * (m + 1) / (n * h),
            }.get(kind, np.pi * (m + 0.5) / (n * h))
            np.testing.assert_allclose(v[: len(want)], want, rtol=1e-6)
            assert not v[len(want):].any()  # mesh padding holds 0


def test_channel_poisson_solve():
    """A channel-flow style Poisson problem: walls along X (homogeneous Neumann, cell-centred:
    DCT-II diagonalises the 2nd difference with mirrored ghosts), periodic Y and Z (FFTs)."""
    shape, d = (16, 8, 12), (0.1, 0.2, 0.3)
    kinds = ("dct2", "fft", "fft")
    mesh = make_mesh((4, 2))
    f = random_field(shape, np.float64, 11)
    f -= f.mean()  # solvable: the Neumann problem needs a zero-mean source
    fh = pencilfft.ptransform3d(put_global(f, pencilfft.real_space_sharding(mesh)), kinds)
    kx, ky, kz = pencilfft.wavenumbers3d(fh, kinds, d)
    lam = sum(-(2 / h * jnp.sin(kv * h / 2)) ** 2 for kv, h in zip((kx, ky, kz), d))
    uh = jnp.where(lam == 0, 0, fh / jnp.where(lam == 0, 1, lam))
    u = to_numpy(pencilfft.pitransform3d(uh, kinds)).real
    # the discrete Laplacian of u, in numpy: mirrored ghosts along X, wrap-around along Y and Z
    ux = np.concatenate([u[:1], u, u[-1:]], axis=0)
    lap = (ux[2:] - 2 * u + ux[:-2]) / d[0] ** 2
    for axis, h in ((1, d[1]), (2, d[2])):
        lap += (np.roll(u, 1, axis) - 2 * u + np.roll(u, -1, axis)) / h ** 2
    assert rel_err(lap, f) < 1e-10


# ------------------------------------------------------------------------------ errors


@pytest.mark.parametrize("kinds,err,match", [
    (("dct5", "fft", "fft"), ValueError, r"`kinds\[0\]` = 'dct5' is not a transform kind"),
    (("rfft", "fft", "fft"), ValueError, r"`kinds\[0\]` = 'rfft'.*along Z only"),
    (("fft", "fft"), ValueError, r"`kinds` must name 3 transforms"),
    ("dct2", TypeError, r"`kinds` must be 3 strings"),
    ((1, 2, 3), TypeError, r"`kinds` must be 3 strings"),
])
def test_bad_kinds(kinds, err, match):
    with pytest.raises(err, match=match):
        pencilfft.ptransform3d(np.zeros((8, 8, 8)), kinds)


def test_kind_that_does_not_fit_the_data():
    with pytest.raises(TypeError, match=r"`x` must be real for a real-to-complex transform"):
        pencilfft.ptransform3d(np.zeros((8, 8, 8), np.complex64), ("dct2", "fft", "rfft"))
    with pytest.raises(ValueError, match=r"dct1 needs at least 2 points; `x` has 1 along axis Z"):
        pencilfft.ptransform3d(np.zeros((8, 8, 1)), ("fft", "fft", "dct1"))
    with pytest.raises(ValueError, match=r"`s` \(the real-space shape"):
        pencilfft.pitransform3d(np.zeros((8, 5, 8), np.complex64), ("dct2", "fft", "rfft"))
    mesh = make_mesh((4, 2))
    with pytest.raises(ValueError, match=r"`x.shape\[0\]` \(X=6\) must be divisible by mesh axis 'x'"):
        pencilfft.ptransform3d(np.zeros((6, 8, 8)), ("dct2", "fft", "fft"), mesh=mesh)


def test_memory_limit_names_the_transform(monkeypatch):
    monkeypatch.setenv("PENCILFFT_MEMORY_LIMIT", "1KiB")
    with pytest.raises(pencilfft.MemoryLimitError, match=r"^ptransform3d of a 8x8x8"):
        pencilfft.ptransform3d(np.zeros((8, 8, 8)), ("dct2", "fft", "fft"))
