"""The CPU FFT kernel (pencilfft._transforms.kernel, fftw.cc): values, rules, lowering, fallback.

Checked: every FFT type and DCT/DST kind, float32/float64, norms and axes (leading, middle,
trailing, several) against numpy/scipy in float64 and against XLA's kernel; grad, jvp, vmap and
scan of the primitive itself against jnp.fft; that CPU programs call the FFTW custom call and
programs lowered for "cuda" never do (there they are jnp.fft's); the plan cache; and the one
warning and XLA fallback when the kernel cannot be built.  The distributed transforms use the
kernel by default, so the other test files check it in every calling form too.
"""
from __future__ import annotations

import math
import os
from pathlib import Path
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.fft

import pencilfft
from conftest import MPIRUN, make_mesh, put_global, rel_err, to_numpy
from pencilfft._transforms import kernel as _kernel

HAVE_FFTW = _kernel.kernel() == "fftw"
needs_fftw = pytest.mark.skipif(not HAVE_FFTW, reason="the fftw extra is not installed: "
                                "pip install -e \".[mpi,fftw,test]\" runs these tests")
AXES = [(2,), (0,), (1,), (1, 2), (0, 2), (0, 1, 2)]
TOL = {np.float32: 2e-6, np.float64: 1e-14}
SHAPE = (4, 6, 7)  # odd last axis: rfft's half spectrum without a Nyquist bin


def _data(dtype, complex_: bool, shape=SHAPE, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape)
    if complex_:
        x = x + 1j * rng.standard_normal(shape)
        return x.astype(np.result_type(dtype, np.complex64))
    return x.astype(dtype)


def _reference(fft_type, x, axes, norm, sizes):
    x = x.astype(np.complex128 if np.iscomplexobj(x) else np.float64)
    if fft_type == "irfft":
        return np.fft.irfftn(x, s=sizes, axes=axes, norm=norm)
    return getattr(np.fft, fft_type + "n")(x, axes=axes, norm=norm)


def _extra_points(norm: str, n: int, extra: int, forward: bool) -> float:
    """How `extra` more points change an n-point transform's scale (kernel.fft's `extra`)."""
    return _kernel._scale(norm, n * extra, forward) / _kernel._scale(norm, n, forward)


def _input(fft_type, dtype, axes):
    if fft_type == "irfft":
        full = _data(dtype, False)
        half = np.fft.rfftn(full, axes=axes).astype(np.result_type(dtype, np.complex64))
        return half, tuple(SHAPE[a] for a in axes)
    return _data(dtype, fft_type != "rfft"), tuple(SHAPE[a] for a in axes)


@needs_fftw
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("axes", AXES, ids=lambda a: "".join(map(str, a)))
@pytest.mark.parametrize("fft_type", ["fft", "ifft", "rfft", "irfft"])
def test_fourier_values(fft_type, axes, dtype):
    x, sizes = _input(fft_type, dtype, axes)
    for norm in ("backward", "ortho", "forward"):
        f = jax.jit(lambda a, norm=norm: _kernel.fft(a, fft_type, axes, norm, sizes))
        assert _kernel.TARGET in f.lower(x).as_text()
        got = np.asarray(f(x))
        ref = _reference(fft_type, x, axes, norm, sizes)
        assert got.dtype == (np.result_type(dtype, np.complex64) if fft_type != "irfft" else dtype)
        assert got.shape == ref.shape
        assert rel_err(got, ref) < TOL[dtype], (norm, rel_err(got, ref))


@needs_fftw
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("kind", ["dct1", "dct2", "dct3", "dct4", "dst1", "dst2", "dst3", "dst4"])
def test_r2r_values(kind, dtype):
    for complex_ in (False, True):
        x = _data(dtype, complex_, (5, 6, 7))
        for axis, norm, forward in ((2, "backward", True), (0, "ortho", True), (1, "forward", False),
                                    (2, "ortho", False)):
            name = ("" if forward else "i") + kind[:3]
            ref = getattr(scipy.fft, name)(x.astype(np.complex128 if complex_ else np.float64),
                                           type=int(kind[3]), axis=axis, norm=norm)
            f = jax.jit(lambda a, axis=axis, norm=norm, fw=forward: _kernel.r2r(a, kind, axis,
                                                                                  norm, fw))
            assert _kernel.TARGET in f.lower(x).as_text()
            got = np.asarray(f(x))
            assert got.dtype == x.dtype
            assert rel_err(got, ref) < 5 * TOL[dtype], (complex_, axis, norm, forward)


def test_permute_without_the_kernel(monkeypatch):
    """With XLA's FFT (no fftw extra, or PENCILFFT_FFT_KERNEL=xla) `permute` is the transpose:
    a c2c over no axes is no transform (jnp.fft.fftn would read the empty axes as all)."""
    monkeypatch.setenv("PENCILFFT_FFT_KERNEL", "xla")
    x = _data(np.float64, True, (2, 3, 4), seed=11).astype(np.complex64)
    got = jax.jit(lambda a: _kernel.permute(a, (2, 0, 1)))(x)
    assert np.array_equal(np.asarray(got), np.transpose(x, (2, 0, 1)))
    same = jax.jit(lambda a: _kernel.fft(a, "fft", (), "backward", (), (1, 2, 0)))(x)
    assert np.array_equal(np.asarray(same), np.transpose(x, (1, 2, 0)))


@needs_fftw
@pytest.mark.parametrize("dtype", [np.complex64, np.complex128, np.float32],
                         ids=["c64", "c128", "f32"])
def test_permute(dtype):
    """`permute`: jnp.transpose's values, a complex block through FFTW's rank-0 plan (the MPI
    exchange's pack and unpack), real data through XLA's transpose; eagerly, under jit, vmap
    and grad (its transpose is the inverse permutation)."""
    x = _data(np.float64, True, (3, 4, 5, 6), seed=9).astype(dtype) if dtype != np.float32 \
        else _data(np.float32, False, (3, 4, 5, 6), seed=9)
    order = (2, 0, 3, 1)
    ref = np.transpose(x, order)
    f = jax.jit(lambda a: _kernel.permute(a, order))
    assert (_kernel.TARGET in f.lower(x).as_text()) == (dtype != np.float32)
    assert np.array_equal(np.asarray(f(x)), ref)
    assert np.array_equal(np.asarray(_kernel.permute(x, order)), ref)
    assert np.array_equal(np.asarray(jax.vmap(lambda a: _kernel.permute(a, (1, 2, 0)))(x)),
                          np.transpose(x, (0, 2, 3, 1)))
    w = _data(np.float64, False, ref.shape, seed=10).astype(np.float32)
    grads = [jax.grad(lambda a, p=p: jnp.sum(jnp.abs(p(a, order)) ** 2 * w))(x)
             for p in (_kernel.permute, jnp.transpose)]
    assert rel_err(np.asarray(grads[0]), np.asarray(grads[1])) < TOL[np.float32]
    assert np.abs(np.asarray(grads[0])).max() > 0.1  # (not a zero gradient)


@needs_fftw
@pytest.mark.parametrize("fft_type", ["fft", "ifft", "rfft", "irfft"])
def test_kernel_equals_xla(monkeypatch, fft_type):
    x, sizes = _input(fft_type, np.float32, (1, 2))
    ours = np.asarray(jax.jit(lambda a: _kernel.fft(a, fft_type, (1, 2), "ortho", sizes))(x))
    monkeypatch.setenv("PENCILFFT_FFT_KERNEL", "xla")
    g = jax.jit(lambda a: _kernel.fft(a, fft_type, (1, 2), "ortho", sizes))
    assert _kernel.TARGET not in g.lower(x).as_text()
    xla = np.asarray(g(x))
    assert rel_err(ours, xla) < 2e-6


def _jnp_fft(fft_type, axes, norm, sizes):
    if fft_type == "irfft":
        return lambda a: jnp.fft.irfftn(a, s=sizes, axes=axes, norm=norm)
    return lambda a: getattr(jnp.fft, fft_type + "n")(a, axes=axes, norm=norm)


@pytest.mark.parametrize("norm", ["backward", "ortho", "forward"])
@pytest.mark.parametrize("fft_type", ["fft", "ifft", "rfft", "irfft"])
def test_autodiff_and_vmap_of_the_primitive(fft_type, norm):
    """grad, jvp, vmap and scan of the primitive equal jnp.fft's (float64)."""
    axes = (0, 2)
    x, sizes = _input(fft_type, np.float64, axes)
    ours, ref = (lambda a: _kernel.fft(a, fft_type, axes, norm, sizes)), _jnp_fft(fft_type, axes,
                                                                              norm, sizes)
    w = jnp.asarray(_data(np.float64, True, jax.eval_shape(ref, x).shape, seed=1))

    def loss(f):
        return lambda a: jnp.sum(jnp.real(f(a) * w) ** 2 + jnp.imag(f(a)))

    assert rel_err(jax.grad(loss(ours))(x), jax.grad(loss(ref))(x)) < 1e-12
    t = _input(fft_type, np.float64, axes)[0] * 0.5
    assert rel_err(jax.jvp(ours, (x,), (t,))[1], jax.jvp(ref, (x,), (t,))[1]) < 1e-12
    stack = np.stack([x, 2 * x], axis=1)  # the batch axis in the middle: the axes shift
    assert rel_err(jax.vmap(ours, in_axes=1)(stack), jax.vmap(ref, in_axes=1)(stack)) < 1e-12
    scanned = jax.lax.scan(lambda c, a: (c, ours(a)), 0, np.stack([x, x]))[1]
    assert rel_err(scanned[1], ref(x)) < 1e-12


@pytest.mark.parametrize("kind", ["dct1", "dct2", "dst3", "dst4"])
def test_r2r_transpose_is_the_matrix_transpose(kind):
    """The r2r transpose rule (through the "ortho" inverse kind) against scipy's matrix."""
    n = 6
    eye = np.eye(n)
    for norm in ("backward", "ortho", "forward"):
        m = (scipy.fft.dct if kind[:3] == "dct" else scipy.fft.dst)(eye, type=int(kind[3]),
                                                                     axis=0, norm=norm)
        f = lambda a, norm=norm: _kernel.r2r(a, kind, 0, norm, True)  # noqa: E731
        (mt,) = jax.linear_transpose(f, eye)(eye)
        assert rel_err(np.asarray(mt), m.T) < 1e-13, norm
        assert rel_err(jax.vmap(f, in_axes=1, out_axes=1)(eye), m) < 1e-13


def _transforms(mesh):
    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(*mesh.axis_names))
    c = jax.ShapeDtypeStruct((16, 16, 16), np.complex64, sharding=sharding)
    r = jax.ShapeDtypeStruct((16, 16, 16), np.float32, sharding=sharding)
    return [(pencilfft.pfft3d, c), (pencilfft.pifft3d, c), (pencilfft.prfft3d, r),
            (lambda a, **kw: pencilfft.ptransform3d(a, ("dct2", "fft", "dst3"), **kw), r)]


@pytest.mark.parametrize("pdims", [(1, 1), (2, 1), (2, 2), (1, 2)],
                         ids=lambda p: "x".join(map(str, p)))
def test_lowered_programs(pdims):
    """CPU programs call the kernel (with the extra); those lowered for "cuda" never do: there
    the local FFTs are jnp.fft's.  (The compiler-partitioned path lowers its per-device program
    only when XLA compiles for the device: checked on CPU, in the compiled program.)"""
    mesh = make_mesh(pdims)
    for fn, x in _transforms(mesh):
        f = jax.jit(lambda a, fn=fn: fn(a, mesh=mesh))
        cuda = f.trace(x).lower(lowering_platforms=("cuda",)).as_text()
        assert _kernel.TARGET not in cuda
        assert "stablehlo.fft" in cuda
        assert (_kernel.TARGET in f.trace(x).lower().as_text()) == HAVE_FFTW
    auto = make_mesh(pdims, "auto")
    for fn, x in _transforms(auto)[:3]:
        compiled = jax.jit(fn).lower(x).compile().as_text()
        assert (f'custom_call_target="{_kernel.TARGET}"' in compiled) == HAVE_FFTW


# The one-device programs lowered for "cuda" before issue 43 (the FFT and moves XLA fuses),
# read off commit 705d03c on each tested jax release: the ops that move or transform data, in
# program order.  jax's own lowering of the same program changes between releases: on 0.12
# `jnp.fft.irfftn` is one 3-D inverse FFT (0.10: transpose, 2-D inverse, transpose, 1-D).
_GPU_ONE_DEVICE_BY_JAX = {
    (0, 10): {
        ("c2c", "forward"): ["transpose", "fft"],
        ("c2c", "both"): ["transpose", "fft", "transpose", "fft"],
        ("r2c", "forward"): ["transpose", "fft"],
        ("r2c", "both"): ["transpose", "fft", "transpose", "transpose", "fft", "transpose", "fft"],
    },
    (0, 12): {
        ("c2c", "forward"): ["transpose", "fft"],
        ("c2c", "both"): ["transpose", "fft", "transpose", "fft"],
        ("r2c", "forward"): ["transpose", "fft"],
        ("r2c", "both"): ["transpose", "fft", "transpose", "fft"],
    },
}
_GPU_ONE_DEVICE = _GPU_ONE_DEVICE_BY_JAX[(0, 10)]  # the cases


@pytest.mark.parametrize("case", list(_GPU_ONE_DEVICE), ids="-".join)
def test_one_device_gpu_program_is_unchanged(case):
    """The one-device transform in the transposed layout lowered for "cuda" is the program it
    was before the FFTW kernel wrote that layout itself on CPUs (issue 43): split into two FFTs
    each way it held 2 blocks of temporaries on an H100 instead of 1 and took 1.3x the time
    (benchmarks/RESULTS.md, "One GPU").  On CPUs the kernel is called (with the extra)."""
    import re

    release = tuple(int(n) for n in jax.__version__.split(".")[:2])
    if release not in _GPU_ONE_DEVICE_BY_JAX:
        # jax's own lowering of the same program moves its transposes between releases.
        pytest.skip(f"the reference ops were read on jax {sorted(_GPU_ONE_DEVICE_BY_JAX)}, not "
                    f"{jax.__version__}: read them off commit 705d03c on this jax")
    kind, what = case
    real = kind == "r2c"
    x = jax.ShapeDtypeStruct((16, 8, 12), np.float32 if real else np.complex64)
    fwd, inv = ((pencilfft.prfft3d, lambda k: pencilfft.pirfft3d(k, s=(16, 8, 12))) if real
                else (pencilfft.pfft3d, pencilfft.pifft3d))
    f = jax.jit(fwd if what == "forward" else lambda a: inv(fwd(a)))
    cuda = f.trace(x).lower(lowering_platforms=("cuda",)).as_text()
    ops = re.findall(r"stablehlo\.(fft|transpose|custom_call)\b", cuda)
    assert ops == _GPU_ONE_DEVICE_BY_JAX[release][case]
    assert (_kernel.TARGET in f.trace(x).lower().as_text()) == HAVE_FFTW


# Blocks of 16 MiB and more are transformed in chunks along the output's outermost dimension,
# each scaled while in the cache (fftw.cc `Execute`): one block per path at that size.
BIG = (32, 128, 512)  # 16 MiB of complex64, 8 MiB of float32
CHUNKED = {  # name: (fft_type, axes, norm, order, real-space shape)
    "ifft-last": ("ifft", (2,), "backward", None, BIG),
    "ifft-2d-ordered": ("ifft", (1, 2), "backward", (0, 2, 1), BIG),
    "fft-first-ordered": ("fft", (0,), "ortho", (1, 2, 0), BIG),
    "irfft-last": ("irfft", (2,), "backward", None, (64, 128, 512)),
    "irfft-2d": ("irfft", (1, 2), "backward", None, (64, 128, 512)),
}


@needs_fftw
@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("case", list(CHUNKED))
def test_chunked_scaling(monkeypatch, case, threads):
    monkeypatch.setenv("PENCILFFT_FFTW_PLANNER", "estimate")  # (planning 16 MiB: seconds)
    # `threads` per call (3: each runs whole chunks), whatever this machine has: 1 per device
    # holds on 2 cores with 8 devices, not on 16 (a lent machine's suite caught it)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(64)))
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    monkeypatch.setenv("PENCILFFT_THREADS", str(threads * len(jax.local_devices(backend="cpu"))))
    fft_type, axes, norm, order, shape = CHUNKED[case]
    x = _data(np.float32, True, shape, seed=5)
    sizes = tuple(shape[a] for a in axes)
    if fft_type == "irfft":
        x = np.fft.rfftn(x.real, axes=axes).astype(np.complex64)
    f = jax.jit(lambda a: _kernel.fft(a, fft_type, axes, norm, sizes, order))
    assert f"threads = {threads} : i32" in f.lower(x).as_text()
    got = np.asarray(f(x))
    ref = _reference(fft_type, x, axes, norm, sizes)
    ref = ref if order is None else np.transpose(ref, order)
    assert got.shape == ref.shape
    assert rel_err(got, ref) < 1e-5, rel_err(got, ref)


# A 1-D c2c whose output swaps its axis with the input's innermost one runs plane by plane in
# cache-sized blocks, transposing through the cache (fftw.cc `PlaneWise`, issue 55): the forward
# form (the axis written contiguous) and the inverse's (read contiguous), with a batch axis,
# sizes no tile divides, several blocks per plane with a short last one (the 1024-point rows of
# complex128: 64 rows a block, 200 = 3 x 64 + 8), scaled and not, on helper threads, and with
# fewer blocks in all than threads (2 planes of one block each on 3 threads: the third thread's
# share was once cut from the blocks, and planes went untransformed).
PLANE_WISE = {  # name: (input shape, axis, order, norm, extra)
    "forward-batch": ((2, 40, 24, 136), 1, (0, 2, 3, 1), "backward", 1),
    "inverse-batch": ((2, 24, 136, 40), 3, (0, 3, 1, 2), "ortho", 1),
    "forward-blocks": ((200, 3, 1024), 2, (2, 1, 0), "forward", 1),
    "inverse-blocks": ((1024, 3, 200), 0, (2, 1, 0), "backward", 9),
    "forward-few-blocks": ((1, 256, 2, 256), 1, (0, 2, 3, 1), "backward", 1),
    "inverse-few-blocks": ((1, 2, 256, 256), 3, (0, 3, 1, 2), "ortho", 1),
}


@needs_fftw
@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("dtype", [np.complex64, np.complex128], ids=["c64", "c128"])
@pytest.mark.parametrize("case", list(PLANE_WISE))
def test_plane_wise_transposed_call(monkeypatch, case, dtype, threads):
    monkeypatch.setenv("PENCILFFT_FFTW_PLANNER", "estimate")
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(64)))
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    monkeypatch.setenv("PENCILFFT_THREADS", str(threads * len(jax.local_devices(backend="cpu"))))
    shape, axis, order, norm, extra = PLANE_WISE[case]
    x = _data(np.float64, True, shape, seed=7).astype(dtype)
    assert x.nbytes >= 1 << 20  # (smaller calls run FFTW's strided plan)
    ifft = case.startswith("inverse")
    fft_type = "ifft" if ifft else "fft"
    f = jax.jit(lambda a: _kernel.fft(a, fft_type, (axis,), norm, (shape[axis],), order,
                                      extra=extra))
    got = np.asarray(f(x))
    factor = _extra_points(norm, shape[axis], extra, not ifft)
    ref = np.transpose(_reference(fft_type, x, (axis,), norm, None), order) * factor
    assert got.shape == ref.shape
    assert rel_err(got, ref) < TOL[np.float32 if dtype == np.complex64 else np.float64] * 10


@needs_fftw
@pytest.mark.parametrize("kind", ["dct2", "dst3"])
def test_chunked_r2r(monkeypatch, kind):
    monkeypatch.setenv("PENCILFFT_FFTW_PLANNER", "estimate")
    x = _data(np.float32, False, (64, 128, 512), seed=6)  # 16 MiB
    got = np.asarray(jax.jit(lambda a: _kernel.r2r(a, kind, 1, "ortho", True))(x))
    t = int(kind[-1])
    ref = (scipy.fft.dct if kind.startswith("dct") else scipy.fft.dst)(
        x.astype(np.float64), type=t, axis=1, norm="ortho")
    assert rel_err(got, ref) < 1e-5, rel_err(got, ref)


@needs_fftw
def test_plan_cache():
    x = _data(np.float32, True, (3, 5, 9), seed=3)
    f = jax.jit(lambda a: _kernel.fft(a, "fft", (0, 1), "backward", ()))
    f(x).block_until_ready()
    before = _kernel.plan_count()
    for _ in range(3):
        y = f(x)
    assert _kernel.plan_count() == before  # the same shape: planned once
    assert rel_err(y, np.fft.fftn(x, axes=(0, 1))) < 2e-6
    jax.jit(lambda a: _kernel.fft(a, "fft", (0, 1), "backward", ()))(x[:2]).block_until_ready()
    assert _kernel.plan_count() >= before + 1  # a new shape: a new plan


FALLBACK = textwrap.dedent("""
    import warnings, numpy as np, jax
    from pencilfft._transforms import kernel as _kernel
    x = (np.arange(24.0).reshape(2, 3, 4) + 1j).astype(np.complex64)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            y = jax.jit(lambda a: _kernel.fft(a, "fft", (1, 2), "backward", ()))(x)
        kernel = _kernel.kernel()
    assert np.abs(np.asarray(y) - np.fft.fftn(x, axes=(1, 2))).max() < 1e-3
    assert "pencilfft_fftw" not in jax.jit(lambda a: _kernel.fft(a, "fft", (2,), "ortho", ())).lower(x).as_text()
    print(kernel, sum("FFTW kernel is unavailable" in str(w.message) for w in caught))
""")


@pytest.mark.parametrize("case", ["no-compiler", "no-pyfftw", "plain-install", "empty-fftw-dir"])
def test_fallback_warns_once(tmp_path, case):
    """A kernel that cannot be built: XLA's FFT, right values, one warning (none for the plain
    install, without the extra and without asking for FFTW)."""
    env = dict(os.environ, PENCILFFT_CACHE_DIR=str(tmp_path / "cache"))
    env.pop("XLA_FLAGS", None)
    script = FALLBACK
    if case == "no-compiler":
        if not HAVE_FFTW:
            pytest.skip("the fftw extra is not installed: pip install -e \".[mpi,fftw,test]\" "
                        "runs this test")
        bogus = tmp_path / "bin"
        bogus.mkdir()
        (bogus / "c++").write_text("#!/bin/sh\necho 'bogus compiler' >&2\nexit 1\n")
        (bogus / "c++").chmod(0o755)
        env["PATH"] = f"{bogus}:{env['PATH']}"
        env["PENCILFFT_CXX"] = str(bogus / "c++")  # ahead of a CXX the machine may set
    elif case == "empty-fftw-dir":  # a site FFTW named, none there: said, even under "auto"
        (tmp_path / "fftw").mkdir()
        env["PENCILFFT_FFTW_DIR"] = str(tmp_path / "fftw")
    else:  # pyfftw missing; the extra asked for, or not
        env["PENCILFFT_FFT_KERNEL"] = "fftw" if case == "no-pyfftw" else "auto"
        script = "import sys; sys.modules['pyfftw'] = None\n" + FALLBACK
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    warnings = "0" if case == "plain-install" else "1"
    assert out.stdout.split() == ["xla", warnings], out.stdout + out.stderr


SITE_FFTW = """
import pyfftw  # loads the wheel's libgomp, which its FFTW names (a site's FFTW needs none)
import jax, numpy as np
from pencilfft._transforms import kernel as _kernel
x = (np.arange(24.0).reshape(2, 3, 4) + 1j).astype(np.complex64)
y = jax.jit(lambda a: _kernel.fft(a, "fft", (1, 2), "backward", ()))(x)
assert np.abs(np.asarray(y) - np.fft.fftn(x, axes=(1, 2))).max() < 1e-3
print(_kernel.describe())
"""


@needs_fftw
def test_site_fftw_dir(tmp_path):
    """PENCILFFT_FFTW_DIR: the kernel links the FFTW found there (in its lib/: a site's
    prefix), and `describe` names it with FFTW's own version string."""
    folder, libs = _kernel.fftw_libraries()
    site = tmp_path / "fftw" / "lib"
    site.mkdir(parents=True)
    for lib in libs:  # their sonames, found through the kernel's rpath
        (site / Path(lib).name).symlink_to(lib)
    for stem, lib in zip(("libfftw3", "libfftw3f", "libfftw3_omp", "libfftw3f_omp"), libs):
        (site / f"{stem}.so").symlink_to(lib)  # the names a site's FFTW has
    env = dict(os.environ, PENCILFFT_CACHE_DIR=str(tmp_path / "cache"),
               PENCILFFT_FFTW_DIR=str(tmp_path / "fftw"), PENCILFFT_FFT_KERNEL="fftw")
    env.pop("XLA_FLAGS", None)
    out = subprocess.run([sys.executable, "-c", SITE_FFTW], env=env, capture_output=True,
                         text=True, timeout=180)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"fftw (fftw-3.") and f"from {site}," in out.stdout, out.stdout
    assert "unavailable" not in out.stderr, out.stderr


def test_describe_and_settings(monkeypatch):
    assert _kernel.describe().split()[0] == _kernel.kernel()
    monkeypatch.setenv("PENCILFFT_FFT_KERNEL", "xla")
    assert _kernel.kernel() == "xla" and "PENCILFFT_FFT_KERNEL=xla" in _kernel.describe()
    monkeypatch.setenv("PENCILFFT_FFT_KERNEL", "bogus")
    with pytest.raises(ValueError, match="PENCILFFT_FFT_KERNEL"):
        _kernel.kernel()


@MPIRUN
@needs_fftw
def test_distributed_transform_with_kernel(pdims):
    """One distributed transform with the kernel against numpy (the other files do many), also
    under mpirun: every rank builds or loads the kernel (one build under the cache's lock)."""
    mesh = make_mesh(pdims)
    x = _data(np.float32, False, (8, 8, 12))
    xs = put_global(x, pencilfft.real_space_sharding(mesh))
    k = jax.jit(lambda a: pencilfft.prfft3d(a, mesh=mesh, layout="natural"))(xs)
    got = to_numpy(k)[..., :7]
    assert rel_err(got, np.fft.rfftn(x)) < 2e-6


@pytest.mark.parametrize("fft_type,norm,setting", [
    ("ifft", "backward", "auto"), ("irfft", "ortho", "auto"), ("rfft", "forward", "auto"),
    ("ifft", "ortho", "xla")], ids=["ifft-backward", "irfft-ortho", "rfft-forward", "xla"])
def test_extra_points_normalise_as_one_transform(monkeypatch, fft_type, norm, setting):
    """`extra`: the call of a transform split in two that scales for both (the other runs
    unscaled, one scaling pass instead of two, issue 55): the scale of prod(sizes) * extra
    points, with FFTW and with XLA's kernel, and its transpose scaled alike."""
    monkeypatch.setenv("PENCILFFT_FFT_KERNEL", setting)
    axes = (1, 2)
    x, sizes = _input(fft_type, np.float64, axes)
    extra = 7
    f = jax.jit(lambda a: _kernel.fft(a, fft_type, axes, norm, sizes, extra=extra))
    plain = _reference(fft_type, x, axes, norm, sizes)
    factor = _extra_points(norm, math.prod(sizes), extra, fft_type in ("fft", "rfft"))
    assert factor != 1.0
    assert rel_err(f(x), plain * factor) < 1e-12
    g = jax.linear_transpose(f, x)
    ct = np.asarray(f(x))
    plain_t = jax.linear_transpose(lambda a: _kernel.fft(a, fft_type, axes, norm, sizes), x)
    assert rel_err(g(ct)[0], np.asarray(plain_t(ct)[0]) * factor) < 1e-12


# `window`: a piece of a block, read and written in place at a traced offset (the pipelined
# stages, pipeline.py `_Windows`).  Block (2, 8, 6) read as (2, 8, 6) or (2, 8, 2, 3); the
# piece is entries 4..7 of axis 1.
WINDOW_CASES = {
    # name: (fft, order, in_dims, out_dims, in_cut, out_cut, into)
    "fft-in-place": (("fft", "backward", (2,)), None, (2, 8, 6), (2, 8, 6), 1, 1, False),
    "ifft-ortho-in-place": (("ifft", "ortho", (2,)), None, (2, 8, 6), (2, 8, 6), 1, 1, False),
    "pack": (None, (2, 0, 3, 1), (2, 8, 2, 3), (2, 2, 3, 4), 1, -1, False),
    "unpack-into": (None, (1, 0, 3, 2), (4, 2, 3, 2), (2, 8, 2, 3), -1, 1, True),
}


def _window_reference(x, dest, fft, order, in_dims, out_dims, in_cut, out_cut, off, m):
    """`kernel.window` in numpy (float64)."""
    piece = x.astype(np.complex128).reshape(in_dims)
    if in_cut >= 0:
        piece = np.take(piece, range(off, off + m), axis=in_cut)
    if fft is not None:
        fft_type, norm, axes = fft
        piece = getattr(np.fft, fft_type + "n")(piece, axes=axes, norm=norm)
    piece = np.transpose(piece, order or range(piece.ndim))
    if out_cut < 0:
        return piece
    out = dest.astype(np.complex128).reshape(out_dims).copy()
    index = [slice(None)] * out.ndim
    index[out_cut] = slice(off, off + m)
    out[tuple(index)] = piece
    return out.reshape(dest.shape)


@pytest.mark.parametrize("kernel", ["fftw", "xla"])
@pytest.mark.parametrize("dtype", [np.complex64, np.complex128], ids=["c64", "c128"])
@pytest.mark.parametrize("case", list(WINDOW_CASES))
def test_window(monkeypatch, case, dtype, kernel):
    """`window` against numpy: the piece transformed or copied transposed, every other entry of
    the block as it was; eagerly, under jit (the offset traced), vmapped, and lowered through
    XLA's operations where the FFTW kernel is not chosen (the same values)."""
    if kernel == "fftw" and not HAVE_FFTW:
        pytest.skip("the fftw extra is not installed")
    monkeypatch.setenv("PENCILFFT_FFT_KERNEL", kernel)
    jax.clear_caches()
    fft, order, in_dims, out_dims, in_cut, out_cut, into = WINDOW_CASES[case]
    x = _data(np.float64, True, (math.prod(in_dims) // 6, 6), seed=12).astype(dtype)
    dest = _data(np.float64, True, (16, 6), seed=13).astype(dtype) if into else None
    m, off = 4, 4

    def call(a, o, d=None):
        return _kernel.window(a, o, fft=fft, order=order, in_dims=in_dims, out_dims=out_dims,
                              in_cut=in_cut, out_cut=out_cut, m=m, into=d)

    want = _window_reference(x, dest if into else x, fft, order, in_dims, out_dims, in_cut,
                             out_cut, off, m)
    args = (x, np.int32(off)) + ((dest,) if into else ())
    tol = 1e-5 if dtype == np.complex64 else 1e-13
    assert rel_err(np.asarray(jax.jit(call)(*args)), want) < tol
    assert rel_err(np.asarray(call(*args)), want) < tol
    batched = jax.vmap(call, in_axes=(0, None) + ((0,) if into else ()))(
        *((np.stack([a, 2 * a]) if i != 1 else a) for i, a in enumerate(args)))
    assert rel_err(np.asarray(batched[1]), 2 * want) < tol
    if kernel == "fftw":
        assert _kernel.WINDOW_TARGET in jax.jit(call).lower(*args).as_text()


@needs_fftw
def test_window_refuses_a_piece_past_the_block():
    """An offset that puts the piece past the block's end is refused by the kernel, naming
    the call (never a read or write outside the buffer)."""
    x = _data(np.float64, True, (2, 8, 6), seed=14).astype(np.complex64)
    f = jax.jit(lambda a, o: _kernel.window(a, o, fft=("fft", "backward", (2,)), order=None,
                                            in_dims=(2, 8, 6), out_dims=(2, 8, 6), in_cut=1,
                                            out_cut=1, m=4))
    with pytest.raises(Exception, match="pencilfft_fftw_window: bad window"):
        np.asarray(f(x, np.int32(5)))
