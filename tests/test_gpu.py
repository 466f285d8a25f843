"""pencilfft on one GPU against numpy in float64 (skipped without a GPU): both transforms and
layouts, on no mesh and on Auto and Explicit 1x1 meshes, eager and under jit, a gradient, paint and
readout; and the compiled GPU programs hold none of pencilfft's CPU custom calls and no
all-gather.  The lent GPU machine runs this file before its timings (benchmarks/device.py):

    JAX_PLATFORMS=cuda python -m pytest -q tests/test_gpu.py
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

import pencilfft
from paint_references import numpy_paint, numpy_read

N = 32
TOL = {"complex64": 1e-5, "complex128": 1e-12, "float32": 1e-5, "float64": 1e-12}


@pytest.fixture(autouse=True)
def _on_a_gpu():
    if jax.default_backend() != "gpu":
        pytest.skip("needs a GPU")


def rel(a, b) -> float:
    a, b = np.asarray(a, dtype=np.complex128), np.asarray(b, dtype=np.complex128)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def put(x, mesh: str | None):
    """`x` on the GPU: a plain array (mesh None) or split P("x", "y") over a 1x1 mesh."""
    if mesh is None:
        return jnp.asarray(x)
    kind = {"auto": AxisType.Auto, "explicit": AxisType.Explicit}[mesh]
    m = jax.make_mesh((1, 1), ("x", "y"), axis_types=(kind, kind))
    return jax.device_put(x, NamedSharding(m, P("x", "y")))


@pytest.mark.parametrize("mesh", [None, "auto", "explicit"])
@pytest.mark.parametrize("dtype", ["complex64", "complex128"])
@pytest.mark.parametrize("layout", ["transposed", "natural"])
def test_complex_transform(mesh, dtype, layout):
    rng = np.random.default_rng(0)
    shape = (N, N + 8, N + 16)
    x = (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dtype)
    ref = np.fft.fftn(x.astype(np.complex128))
    want = ref.transpose(1, 2, 0) if layout == "transposed" else ref
    for f in (pencilfft.pfft3d, jax.jit(pencilfft.pfft3d, static_argnames="layout")):
        k = f(put(x, mesh), layout=layout)
        assert rel(k, want) < TOL[dtype]
        assert rel(pencilfft.pifft3d(k, layout=layout), x) < TOL[dtype]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_real_transform(dtype):
    x = np.random.default_rng(1).standard_normal((N, N, N)).astype(dtype)
    k = jax.jit(pencilfft.prfft3d)(put(x, "explicit"))
    assert rel(k, np.fft.rfftn(x.astype(np.float64)).transpose(1, 2, 0)) < TOL[dtype]
    assert rel(jax.jit(lambda k: pencilfft.pirfft3d(k, s=x.shape))(k), x) < TOL[dtype]


def test_gradient_and_the_gpu_program():
    """d/dx sum |fft(x)|^2 = 2 N x (Parseval); XLA's FFTs only in the program."""
    x = np.random.default_rng(2).standard_normal((N, N, N)).astype(np.float32)
    xa = put(x, "auto")
    g = jax.jit(jax.grad(lambda v: jnp.sum(jnp.abs(pencilfft.pfft3d(v)) ** 2)))(xa)
    assert rel(g, 2 * N**3 * x) < 1e-5
    text = jax.jit(pencilfft.pfft3d).lower(xa).compile().as_text()
    assert "pencilfft_" not in text and "all-gather" not in text


@pytest.mark.parametrize("window", ["cic", "tsc"])
def test_paint_and_readout(window):
    """XLA's scatter and gather on the GPU, no CPU custom call."""
    rng = np.random.default_rng(3)
    dx, f = rng.normal(size=(16, 16, 16, 3)) * 0.3, rng.normal(size=(16, 16, 16))
    d = put(dx, "explicit")
    paint = jax.jit(lambda d: pencilfft.paint(d, window=window))
    assert rel(paint(d), numpy_paint(dx, window)) < 1e-12
    got = jax.jit(lambda f, d: pencilfft.readout(f, d, window=window))(put(f, "explicit"), d)
    assert rel(got, numpy_read(f, dx, window)) < 1e-12
    assert "pencilfft_" not in paint.lower(d).compile().as_text()
