"""pencilfft._transforms.r2r (DCT/DST types 1-4 along one axis) against scipy.fft in float64.

Checked: values and dtypes of forward/backward for every kind, norm, axis and odd/even/prime/1
lengths, real and complex input; the round trip; jit, vmap and shard_map; that
`jax.linear_transpose` gives the matrix transpose (and, for "ortho", the inverse); gradients;
and the error messages.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.fft
from jax.sharding import NamedSharding, PartitionSpec as P

from conftest import make_mesh, put_global, random_field, rel_err, to_numpy, tol
from pencilfft._transforms import r2r as _r2r

# Per-device math only (one shard_map case aside): one process; under mpirun the distributed
# transforms that use it are tested by test_kinds.py.

NORMS = ("backward", "ortho", "forward")
LENGTHS = (1, 2, 5, 8, 17)


def scipy_forward(x, kind, axis, norm):
    f = scipy.fft.dct if kind.startswith("dct") else scipy.fft.dst
    return f(x, type=int(kind[3]), axis=axis, norm=norm)


def scipy_backward(x, kind, axis, norm):
    f = scipy.fft.idct if kind.startswith("dct") else scipy.fft.idst
    return f(x, type=int(kind[3]), axis=axis, norm=norm)


def scipy_matrix(kind, n, norm):
    """The dense matrix of scipy's forward transform on length-n vectors (y = M @ x)."""
    return scipy_forward(np.eye(n), kind, 0, norm)


def shape_with(n, axis):
    """(2, 2, 2) with length n on `axis`: (2, 2, n) once that axis is moved last, whatever the
    axis, and that also of a complex (2, n) once its real and imaginary parts are stacked, so
    the eagerly compiled operations are reused across tests (keeps the run fast)."""
    shape = [2, 2, 2]
    shape[axis] = n
    return tuple(shape)


def assert_close(got, ref, dtype):
    err = rel_err(got, ref)
    assert err < tol(dtype), f"max|err|/max|ref| = {err:.3g}"


@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("kind, n", [(k, n) for k in _r2r.KINDS for n in LENGTHS
                                     if n >= _r2r.min_length(k)])  # dct1: N >= 2
def test_matches_scipy_float64(kind, n, norm, axis):
    x = random_field(shape_with(n, axis), np.float64, seed=n)
    for ours, theirs in ((_r2r.forward, scipy_forward), (_r2r.backward, scipy_backward)):
        y = ours(jnp.asarray(x), kind, axis, norm)
        assert y.dtype == jnp.float64 and y.shape == x.shape
        assert_close(y, theirs(x, kind, axis, norm), np.float64)


@pytest.mark.parametrize("n", [17, 16])  # the complex paths of types 4 differ for odd/even N
@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("kind", _r2r.KINDS)
def test_complex_input(kind, norm, n):
    x = random_field((2, n), np.complex128, seed=1)
    for ours, theirs in ((_r2r.forward, scipy_forward), (_r2r.backward, scipy_backward)):
        y = ours(jnp.asarray(x), kind, 1, norm)
        assert y.dtype == jnp.complex128
        ref = theirs(x.real, kind, 1, norm) + 1j * theirs(x.imag, kind, 1, norm)
        assert_close(y, ref, np.complex128)
        # complex64 stays complex64, at single precision
        y32 = ours(jnp.asarray(x.astype(np.complex64)), kind, 1, norm)
        assert y32.dtype == jnp.complex64
        assert_close(y32, ref, np.complex64)


@pytest.mark.parametrize("kind, n", [(k, n) for k in _r2r.KINDS for n in (1, 2, 3, 4, 6)
                                     if n >= _r2r.min_length(k)])
def test_complex_short_lengths(kind, n):
    """The direct complex formulations (no real/imaginary stacking) at small odd/even N."""
    axis = 1
    x = random_field(shape_with(n, axis), np.complex128, seed=n)
    for ours, theirs in ((_r2r.forward, scipy_forward), (_r2r.backward, scipy_backward)):
        y = ours(jnp.asarray(x), kind, axis, "backward")
        assert y.dtype == jnp.complex128 and y.shape == x.shape
        ref = theirs(x.real, kind, axis, "backward") + 1j * theirs(x.imag, kind, axis, "backward")
        assert_close(y, ref, np.complex128)


@pytest.mark.parametrize("n", [5, 6])
@pytest.mark.parametrize("kind", _r2r.KINDS)
def test_complex_linear_transpose_jit_vmap(kind, n):
    """Complex input: jax.linear_transpose gives M^T (no conjugation), and jit/vmap agree."""
    m = scipy_matrix(kind, n, "ortho")
    ct = random_field((n, 2), np.complex128, seed=6)
    transpose = jax.linear_transpose(lambda v: _r2r.forward(v, kind, 0, "ortho"),
                                     jnp.zeros((n, 2), jnp.complex128))
    (got,) = jax.jit(transpose)(jnp.asarray(ct))
    assert_close(got, m.T @ ct, np.complex128)
    mapped = jax.jit(jax.vmap(lambda v: _r2r.forward(v, kind, 0, "ortho"), 1, 1))(ct)
    assert_close(mapped, m @ ct, np.complex128)


@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("kind", _r2r.KINDS)
@pytest.mark.parametrize("n", [17, 16])
def test_float32(kind, norm, n):
    x = random_field((2, 2, n), np.float32, seed=2)
    for ours, theirs in ((_r2r.forward, scipy_forward), (_r2r.backward, scipy_backward)):
        y = ours(jnp.asarray(x), kind, -1, norm)
        assert y.dtype == jnp.float32
        assert_close(y, theirs(x.astype(np.float64), kind, -1, norm), np.float32)


@pytest.mark.parametrize("n", [2, 5, 8])
@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("kind", _r2r.KINDS)
def test_round_trip(kind, norm, n):
    x = jnp.asarray(random_field(shape_with(n, -1), np.float64, seed=3))
    assert_close(_r2r.backward(_r2r.forward(x, kind, -1, norm), kind, -1, norm), x, np.float64)
    assert_close(_r2r.forward(_r2r.backward(x, kind, -1, norm), kind, -1, norm), x, np.float64)


@pytest.mark.parametrize("kind", _r2r.KINDS)
def test_jit_and_vmap(kind):
    x = jnp.asarray(random_field((2, 8, 2), np.float64, seed=4))
    eager = _r2r.forward(x, kind, 1, "ortho")
    jitted = jax.jit(_r2r.forward, static_argnums=(1, 2, 3))(x, kind, 1, "ortho")
    mapped = jax.vmap(lambda v: _r2r.forward(v, kind, 0, "ortho"))(x)
    assert_close(eager, scipy_forward(np.asarray(x), kind, 1, "ortho"), np.float64)
    np.testing.assert_allclose(jitted, eager, rtol=1e-13, atol=1e-13)
    np.testing.assert_allclose(mapped, eager, rtol=1e-13, atol=1e-13)
    back = jax.jit(jax.vmap(lambda v: _r2r.backward(v, kind, 0, "ortho")))(eager)
    assert_close(back, x, np.float64)


@pytest.mark.parametrize("kind", ["dct2", "dst3", "dct1"])
def test_shard_map(kind):
    """Per-device blocks: the transformed axis is local, the other one split over 8 devices."""
    mesh = make_mesh((8,))
    x = random_field((16, 7), np.float64, seed=5)
    f = jax.jit(jax.shard_map(functools.partial(_r2r.forward, kind=kind, axis=1, norm="ortho"),
                              mesh=mesh, in_specs=P("x"), out_specs=P("x")))
    y = f(put_global(x, NamedSharding(mesh, P("x"))))
    assert_close(to_numpy(y), scipy_forward(x, kind, 1, "ortho"), np.float64)


# An odd length with every norm; an even one (where the real FFTs have a Nyquist bin) with one.
@pytest.mark.parametrize("norm, n", [(norm, 5) for norm in NORMS] + [("ortho", 6)])
@pytest.mark.parametrize("kind", _r2r.KINDS)
def test_linear_transpose(kind, norm, n):
    m = scipy_matrix(kind, n, norm)
    ct = random_field((n, 2), np.float64, seed=6)
    transpose = jax.linear_transpose(lambda v: _r2r.forward(v, kind, 0, norm),
                                     jnp.zeros((n, 2), jnp.float64))
    (got,) = jax.jit(transpose)(jnp.asarray(ct))
    assert_close(got, m.T @ ct, np.float64)
    if norm == "ortho":  # orthogonal: the transpose is the inverse
        assert_close(got, scipy_backward(ct, kind, 0, norm), np.float64)
        assert_close(m.T @ m, np.eye(n), np.float64)


@pytest.mark.parametrize("kind, norm", [("dct1", "backward"), ("dct2", "ortho"),
                                        ("dst3", "forward"), ("dst4", "backward")])
def test_grad(kind, norm):
    n = 7
    m = scipy_matrix(kind, n, norm)
    x = random_field((n,), np.float64, seed=7)
    loss = jax.jit(lambda v: jnp.sum(_r2r.forward(v, kind, 0, norm) ** 2))
    grad = jax.jit(jax.grad(loss))(jnp.asarray(x))
    assert_close(grad, 2 * m.T @ (m @ x), np.float64)
    # and, independently of scipy, a central finite difference along a random direction
    d = random_field((n,), np.float64, seed=8)
    eps = 1e-5
    fd = (float(loss(x + eps * d)) - float(loss(x - eps * d))) / (2 * eps)
    assert abs(fd - float(grad @ d)) < 1e-6 * max(1.0, abs(fd))


def test_min_length():
    assert _r2r.min_length("dct1") == 2
    assert all(_r2r.min_length(k) == 1 for k in _r2r.KINDS if k != "dct1")


def test_unknown_kind():
    x = jnp.zeros((4,))
    for fn in (_r2r.forward, _r2r.backward):
        with pytest.raises(ValueError, match=r"kind.*dct1, dct2.*dst4.*'dct5'"):
            fn(x, "dct5", 0, "ortho")
    with pytest.raises(ValueError, match=r"kind.*'fft'"):
        _r2r.min_length("fft")


def test_axis_too_short():
    with pytest.raises(ValueError, match=r"dct1.*length 1"):
        _r2r.forward(jnp.zeros((3, 1)), "dct1", 1, "ortho")
    with pytest.raises(ValueError, match=r"dct1.*length 1"):
        _r2r.backward(jnp.zeros((1, 3)), "dct1", 0, "backward")
    with pytest.raises(ValueError, match=r"dst2.*length 0"):
        _r2r.forward(jnp.zeros((0, 3)), "dst2", 0, "backward")


def test_bad_norm_and_axis():
    x = jnp.zeros((4, 3))
    for fn in (_r2r.forward, _r2r.backward):
        with pytest.raises(ValueError, match=r"norm.*'orthonormal'"):
            fn(x, "dct2", 0, "orthonormal")
    with pytest.raises(ValueError, match=r"axis 2"):
        _r2r.forward(x, "dct2", 2, "ortho")
