"""paint / readout (lattice form): against a float64 numpy reference, on every mesh kind.

Checked: the four windows against numpy (np.add.at over the s^3 cells of every particle, whole
periodic grid) on pencils, slabs both ways and a 1-axis mesh; eager, jit with an Explicit mesh,
jit with an Auto mesh and nothing in scope, jit on one device; float32; readout as paint's
transpose; grad in dx, weights and field against plain-JAX autodiff on one device (which checks
the kernel's jvp/transpose rules and the halo folds); vmap; the halo policy (eager ValueError,
NaN under jit); argument errors; the kernel against XLA's scatter/gather and across thread
counts; programs lowered for cuda hold no CPU custom call; the example script; eager calls
through one cached program (no compilation on the second call); NaN and inf in positions and
weights; capacity capped at the particles a device holds; complex fields; the max_displacement
advice, followed (issue 51).
"""
from __future__ import annotations

import contextlib
import functools
import os
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

import pencilfft
from pencilfft._pm import kernel as _paint_kernel
from pencilfft._pm.window import weights as window_weights

from conftest import clean_env, make_mesh, put_global, to_numpy
from paint_references import SUPPORT, numpy_paint, numpy_read

SHAPE = (32, 32, 8)


def displacements(seed=0, rms=0.3, shape=SHAPE):
    return np.random.default_rng(seed).normal(size=shape + (3,)) * rms


def _spec(pdims):
    return P(*("x", "y")[: len(pdims)])


# Shared compiled functions (one compile per window).
@functools.cache
def _paint_read(window):
    return jax.jit(lambda d, f: (pencilfft.paint(d, window=window),
                                 pencilfft.readout(f, d, window=window)))


# Every window on pencils; each other mesh kind once with an even and an odd support.
@pytest.mark.parametrize("window,pdims", [(w, (4, 2)) for w in ("ngp", "cic", "tsc", "pcs")]
                         + [("cic", (1, 8)), ("pcs", (1, 8)), ("cic", (8,)), ("pcs", (8,))],
                         ids=lambda v: "x".join(map(str, v)) if isinstance(v, tuple) else v)
def test_against_numpy(window, pdims):
    _check_against_numpy(window, pdims)


@pytest.mark.mpirun
def test_across_processes():
    """The halo sends between processes (MPI or gloo under mpirun)."""
    _check_against_numpy("cic", (4, 2))


def _check_against_numpy(window, pdims):
    dx = displacements(rms=0.3)
    f = np.random.default_rng(1).normal(size=SHAPE)
    mesh = make_mesh(pdims)
    sh = NamedSharding(mesh, _spec(pdims))
    g, r = _paint_read(window)(put_global(dx, sh), put_global(f, sh))
    assert g.sharding.spec[:2] == tuple(_spec(pdims)) + (None,) * (2 - len(pdims))
    np.testing.assert_allclose(to_numpy(g), numpy_paint(dx, window), atol=1e-12)
    np.testing.assert_allclose(to_numpy(r), numpy_read(f, dx, window), atol=1e-12)


@pytest.mark.parametrize("form", ["eager", "jit-auto-no-mesh", "jit-one-device", "set-mesh"])
def test_calling_forms(form):
    dx = displacements(seed=2)
    ref = numpy_paint(dx, "cic")
    if form == "jit-one-device":
        g = jax.jit(pencilfft.paint)(jnp.asarray(dx))
    elif form == "eager":
        g = pencilfft.paint(put_global(dx, NamedSharding(make_mesh((2, 4)), P("x", "y"))))
    elif form == "set-mesh":
        mesh = make_mesh((2, 4))
        with jax.set_mesh(mesh):
            g = jax.jit(pencilfft.paint)(put_global(dx, NamedSharding(mesh, P("x", "y"))))
    else:
        mesh = make_mesh((4, 2), "auto")
        g = jax.jit(pencilfft.paint)(put_global(dx, NamedSharding(mesh, P("x", "y"))))
        text = jax.jit(pencilfft.paint).lower(
            put_global(dx, NamedSharding(mesh, P("x", "y")))).compile().as_text()
        assert "all-gather" not in text  # painted where the particles are
    np.testing.assert_allclose(to_numpy(g), ref, atol=1e-12)


def test_float32_and_weights():
    dx = displacements(seed=3).astype(np.float32)
    w = np.random.default_rng(4).uniform(0.5, 1.5, SHAPE).astype(np.float32)
    sh = NamedSharding(make_mesh((4, 2)), P("x", "y"))
    g = jax.jit(lambda d, w: pencilfft.paint(d, w, "tsc"))(put_global(dx, sh), put_global(w, sh))
    assert g.dtype == np.float32
    np.testing.assert_allclose(to_numpy(g), numpy_paint(dx.astype(float), "tsc", w), atol=2e-5)


def test_scalar_weight_grad_and_closure():
    """A scalar weight (replicated in shard_map) gets the summed gradient; a concrete dx closed
    over by a jitted function works (and is checked eagerly)."""
    sh = NamedSharding(make_mesh((4, 2)), P("x", "y"))
    dx = put_global(displacements(seed=31), sh)
    rho = numpy_paint(displacements(seed=31), "cic")
    got = jax.jit(jax.grad(lambda w: jnp.sum(pencilfft.paint(dx, w) ** 2)))(2.0)
    np.testing.assert_allclose(float(got), 4 * np.sum(rho ** 2), rtol=1e-10)


def _loss(dx, w, f, window, distributed):
    """A scalar through paint and readout (the gradient of each reaches dx, w and f)."""
    if distributed:
        g = pencilfft.paint(dx, w, window)
        r = pencilfft.readout(f * g, dx, window)
    else:  # plain JAX on one device: XLA's scatter/gather, differentiated by jax itself
        v = (w * jnp.ones(dx.shape[:3], dx.dtype))[None]
        g = _paint_kernel.paint_block_xla(dx, v, offset=(0, 0), shape=dx.shape[:3],
                                          window=window, deriv=False)[0]
        r = _paint_kernel.read_block_xla((f * g)[None], dx, offset=(0, 0), window=window,
                                         deriv=False)[0]
    return jnp.sum(r * jnp.cos(dx[..., 0])) + jnp.sum(g ** 2)


@pytest.mark.parametrize("window", [pytest.param("cic", marks=pytest.mark.mpirun), "tsc"])
def test_grad(window):
    shape = (16, 16, 8)
    dx = displacements(seed=5, rms=0.4, shape=shape)
    w = np.random.default_rng(6).uniform(0.5, 1.5, shape)
    f = np.random.default_rng(7).normal(size=shape)
    sh = NamedSharding(make_mesh((4, 2)), P("x", "y"))
    args = [put_global(a, sh) for a in (dx, w, f)]
    got = jax.jit(jax.grad(functools.partial(_loss, window=window, distributed=True),
                           argnums=(0, 1, 2)))(*args)
    ref = jax.jit(jax.grad(functools.partial(_loss, window=window, distributed=False),
                           argnums=(0, 1, 2)))(*map(jnp.asarray, (dx, w, f)))
    for a, b in zip(got, ref):
        np.testing.assert_allclose(to_numpy(a), np.asarray(b), rtol=1e-9, atol=1e-9)


def test_adjoint_and_vmap():
    """<paint(dx, w), f> = <w, readout(f, dx)>; vmap over an ensemble of displacements."""
    dx = displacements(seed=8, rms=0.5)
    w = np.random.default_rng(9).normal(size=SHAPE)
    f = np.random.default_rng(10).normal(size=SHAPE)
    mesh = make_mesh((2, 4))
    sh = NamedSharding(mesh, P("x", "y"))
    a = np.vdot(to_numpy(pencilfft.paint(put_global(dx, sh), put_global(w, sh), "tsc")), f)
    b = np.vdot(w, to_numpy(pencilfft.readout(put_global(f, sh), put_global(dx, sh), "tsc")))
    assert abs(a - b) < 1e-10 * abs(a)
    ens = np.stack([dx, displacements(seed=11)])
    with jax.set_mesh(mesh):
        got = jax.jit(jax.vmap(lambda d: pencilfft.paint(d)))(
            put_global(ens, NamedSharding(mesh, P(None, "x", "y"))))
    for i in range(2):
        np.testing.assert_allclose(to_numpy(got)[i], numpy_paint(ens[i], "cic"), atol=1e-12)
    fields = np.stack([f, -2 * f])
    with jax.set_mesh(mesh):
        got = jax.jit(jax.vmap(lambda g, d: pencilfft.readout(g, d)))(
            put_global(fields, NamedSharding(mesh, P(None, "x", "y"))),
            put_global(ens, NamedSharding(mesh, P(None, "x", "y"))))
    for i in range(2):
        np.testing.assert_allclose(to_numpy(got)[i], numpy_read(fields[i], ens[i], "cic"),
                                   atol=1e-12)


def test_interlace():
    """Interlacing: (F1 + F2 exp(-i k.h)) / 2 of the paintings at x and x - 1/2 (numpy)."""
    dx = displacements(seed=30, shape=(16, 16, 8))
    k1 = np.fft.rfftn(numpy_paint(dx, "tsc"))
    k2 = np.fft.rfftn(numpy_paint(dx - 0.5, "tsc"))
    kv = np.meshgrid(*[2 * np.pi * np.fft.fftfreq(16)] * 2, 2 * np.pi * np.fft.rfftfreq(8),
                     indexing="ij")
    ref = np.fft.irfftn((k1 + k2 * np.exp(-0.5j * sum(kv))) / 2, s=(16, 16, 8), axes=(0, 1, 2))
    sh = NamedSharding(make_mesh((4, 2)), P("x", "y"))
    g = jax.jit(lambda d: pencilfft.paint(d, window="tsc", interlace=True))(put_global(dx, sh))
    np.testing.assert_allclose(to_numpy(g), ref, atol=1e-12)


def test_halo_policy():
    """Beyond the halo: ValueError eagerly (with the numbers), NaN under jit; never wrapped."""
    dx = displacements(seed=12, rms=0.1)
    dx[3, 5, 2, 0] = 2.7
    sh = NamedSharding(make_mesh((4, 2)), P("x", "y"))
    with pytest.raises(ValueError, match=r"2\.7 cells.*halo of 2 cells"):
        pencilfft.paint(put_global(dx, sh), max_displacement=1.0)
    g = jax.jit(lambda d: pencilfft.paint(d, max_displacement=1.0))(put_global(dx, sh))
    assert np.isnan(to_numpy(g)).any()
    r = jax.jit(lambda f, d: pencilfft.readout(f, d, max_displacement=1.0))(
        put_global(np.ones(SHAPE), sh), put_global(dx, sh))
    assert np.isnan(to_numpy(r)).any()
    # with a bound that covers it, right
    g = pencilfft.paint(put_global(dx, sh), max_displacement=3.0)
    np.testing.assert_allclose(to_numpy(g), numpy_paint(dx, "cic"), atol=1e-12)
    # a Z displacement (never split) of any size is right
    dz = displacements(seed=12, rms=0.1)
    dz[1, 1, 1, 2] = 7.3
    np.testing.assert_allclose(to_numpy(pencilfft.paint(put_global(dz, sh))),
                               numpy_paint(dz, "cic"), atol=1e-12)


def test_errors():
    dx = jnp.zeros(SHAPE + (3,))
    with pytest.raises(ValueError, match="`window` must be one of"):
        pencilfft.paint(dx, window="linear")
    with pytest.raises(ValueError, match=r"`dx` must have shape \(X, Y, Z, 3\)"):
        pencilfft.paint(jnp.zeros(SHAPE))
    with pytest.raises(TypeError, match="`dx` must be float32 or float64"):
        pencilfft.paint(jnp.zeros(SHAPE + (3,), jnp.int32))
    with pytest.raises(ValueError, match="`weights` must be a scalar or have the grid's shape"):
        pencilfft.paint(dx, jnp.ones((4, 4, 4)))
    with pytest.raises(ValueError, match="`field` must have shape"):
        pencilfft.readout(jnp.ones((8, 8, 8)), dx)
    with pytest.raises(ValueError, match="`max_displacement`"):
        pencilfft.paint(dx, max_displacement=-1)
    sh = NamedSharding(make_mesh((8,)), P("x"))
    with pytest.raises(ValueError, match=r"needs a halo of 5 cells.*more than the 4 cells"):
        pencilfft.paint(put_global(np.zeros(SHAPE + (3,)), sh), max_displacement=4)


@pytest.mark.skipif(_paint_kernel.kernel() != "native", reason="no C++ compiler")
def test_kernel_threads_and_xla(monkeypatch):
    """The kernel equals XLA's scatter/gather, and its result is the same for any thread count
    above one (bitwise) and within rounding of one thread's."""
    from pencilfft._native import threads as _threads

    rng = np.random.default_rng(13)
    dx = jnp.asarray(rng.normal(size=(12, 6, 10, 3)) * 2)
    v = jnp.asarray(rng.normal(size=(2, 12, 6, 10)))
    kw = dict(offset=(2, 0), shape=(16, 6, 10), window="pcs", deriv=False, absolute=False)
    outs = {}
    for t in ("1", "2", "3"):  # threads per device call (the shared rule gives 1 here)
        monkeypatch.setattr(_threads, "threads_per_device", lambda t=t: int(t))
        outs[t] = np.asarray(jax.jit(lambda d, v: _paint_kernel.paint_p.bind(d, v, **kw))(dx, v))
    ref = np.asarray(_paint_kernel.paint_block_xla(dx, v, **kw))
    np.testing.assert_allclose(outs["1"], ref, atol=1e-12)
    np.testing.assert_array_equal(outs["2"], outs["3"])
    np.testing.assert_allclose(outs["2"], ref, atol=1e-12)
    for deriv in (False, True):
        g = jnp.asarray(rng.normal(size=(2, 16, 6, 10)))
        kr = dict(offset=(2, 0), window="tsc", deriv=deriv, absolute=False)
        got = jax.jit(lambda g, d: _paint_kernel.read_p.bind(g, d, **kr))(g, dx)
        np.testing.assert_allclose(got, _paint_kernel.read_block_xla(g, dx, **kr), atol=1e-12)


def test_gpu_program_has_no_cpu_call():
    mesh = make_mesh((4, 2))
    sh = NamedSharding(mesh, P("x", "y"))
    dx = put_global(displacements(), sh)
    f = jax.jit(lambda d: pencilfft.readout(pencilfft.paint(d), d))
    cuda = f.trace(dx).lower(lowering_platforms=("cuda",)).as_text()
    assert all(t not in cuda for t in _paint_kernel.TARGETS)
    assert "scatter" in cuda and "gather" in cuda
    cpu = f.trace(dx).lower().as_text()
    assert all((t in cpu) == (_paint_kernel.kernel() == "native") for t in _paint_kernel.TARGETS)
    pos = put_global(_catalog(), NamedSharding(mesh, P(("x", "y"))))
    cat = jax.jit(lambda q: pencilfft.readout(pencilfft.paint(q, shape=CAT_SHAPE), q))
    cuda = cat.trace(pos).lower(lowering_platforms=("cuda",)).as_text()
    assert all(t not in cuda for t in _paint_kernel.TARGETS) and "all_to_all" in cuda


def test_example_runs():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = clean_env(8, PYTHONPATH=root)
    done = subprocess.run([sys.executable, os.path.join(root, "examples", "pm_step.py"),
                           "--n", "16", "--steps", "2"], capture_output=True, text=True,
                          env=env, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "max |force - reference|" in done.stdout


# ----------------------------------------------------------------------------------------------
# Catalogs: absolute positions (N, 3) in any order


def numpy_paint_catalog(pos, shape, window, w=None):
    s = SUPPORT[window]
    t = pos + 1 - s / 2
    base = np.floor(t).astype(int)
    W = [[np.asarray(a) for a in window_weights(t[:, d] - base[:, d], window)] for d in range(3)]
    w = np.ones(len(pos)) if w is None else w
    g = np.zeros(shape)
    for a in range(s):
        for b in range(s):
            for c in range(s):
                idx = tuple((base[:, d] + o) % shape[d] for d, o in enumerate((a, b, c)))
                np.add.at(g, idx, w * W[0][a] * W[1][b] * W[2][c])
    return g


def numpy_read_catalog(f, pos, window):
    s = SUPPORT[window]
    t = pos + 1 - s / 2
    base = np.floor(t).astype(int)
    W = [[np.asarray(a) for a in window_weights(t[:, d] - base[:, d], window)] for d in range(3)]
    out = np.zeros(len(pos))
    for a in range(s):
        for b in range(s):
            for c in range(s):
                idx = tuple((base[:, d] + o) % f.shape[d] for d, o in enumerate((a, b, c)))
                out += f[idx] * W[0][a] * W[1][b] * W[2][c]
    return out


CAT_SHAPE = (16, 16, 8)


def _catalog(seed=20, n=2048):
    return np.random.default_rng(seed).uniform(-3, 20, size=(n, 3))  # wraps around the box


@functools.cache
def _catalog_fns(window):
    return (jax.jit(lambda q, w: pencilfft.paint(q, w, window, shape=CAT_SHAPE)),
            jax.jit(lambda f, q: pencilfft.readout(f, q, window)))


@pytest.mark.parametrize("window,pdims", [pytest.param("cic", (4, 2), marks=pytest.mark.mpirun),
                                          ("pcs", (8,)), ("tsc", (1, 8)),
                                          pytest.param("cic", None, id="one-device")])
def test_catalog_against_numpy(window, pdims):
    pos = _catalog()
    w = np.random.default_rng(21).uniform(0.5, 1.5, len(pos))
    f = np.random.default_rng(22).normal(size=CAT_SHAPE)
    paint, read = _catalog_fns(window)
    if pdims is None:
        g, r = paint(jnp.asarray(pos), jnp.asarray(w)), read(jnp.asarray(f), jnp.asarray(pos))
    else:
        mesh = make_mesh(pdims)
        names = ("x", "y")[: len(pdims)]
        ps = NamedSharding(mesh, P(names))
        g = paint(put_global(pos, ps), put_global(w, ps))
        r = read(put_global(f, NamedSharding(mesh, P(*names))), put_global(pos, ps))
    np.testing.assert_allclose(to_numpy(g), numpy_paint_catalog(pos, CAT_SHAPE, window, w),
                               atol=1e-12)
    np.testing.assert_allclose(to_numpy(r), numpy_read_catalog(f, pos, window), atol=1e-12)


def test_catalog_grad_and_capacity():
    """grad in the positions, weights and field equals one device's; a full bucket: ValueError
    eagerly (with the numbers), NaN under jit."""
    mesh = make_mesh((4, 2))
    ps = NamedSharding(mesh, P(("x", "y")))
    fs = NamedSharding(mesh, P("x", "y"))
    pos = _catalog(seed=23)
    w = np.random.default_rng(24).uniform(0.5, 1.5, len(pos))
    f = np.random.default_rng(25).normal(size=CAT_SHAPE)

    def loss(q, w, f):
        g = pencilfft.paint(q, w, "cic", shape=CAT_SHAPE)
        return jnp.sum(g ** 2) + jnp.sum(pencilfft.readout(f * g, q, "cic") * jnp.cos(q[:, 0]))

    grad = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
    got = grad(put_global(pos, ps), put_global(w, ps), put_global(f, fs))
    ref = grad(*map(jnp.asarray, (pos, w, f)))
    for a, b in zip(got, ref):
        np.testing.assert_allclose(to_numpy(a), np.asarray(b), rtol=1e-9, atol=1e-9)
    crowded = put_global(np.sort(pos, axis=0), ps)  # every device's particles bound for a few
    with pytest.raises(ValueError, match=r"more than `capacity` \(64\)"):
        pencilfft.paint(crowded, shape=CAT_SHAPE, capacity=64)
    g = jax.jit(lambda q: pencilfft.paint(q, shape=CAT_SHAPE, capacity=64))(crowded)
    assert np.isnan(to_numpy(g)).any()
    r = jax.jit(lambda f, q: pencilfft.readout(f, q, capacity=64))(put_global(f, fs), crowded)
    assert np.isnan(to_numpy(r)).any()


FALLBACK = """
import warnings, numpy as np, jax, jax.numpy as jnp
import pencilfft
from pencilfft._pm import kernel as _paint_kernel
dx = jnp.asarray(np.random.default_rng(0).normal(size=(8, 8, 8, 3)) * 0.3)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    for _ in range(2):
        g = jax.jit(pencilfft.paint)(dx)
assert abs(float(g.sum()) - 512) < 1e-3
print(_paint_kernel.kernel(), sum("paint kernel is unavailable" in str(w.message) for w in caught))
"""


def test_fallback_without_compiler(tmp_path):
    """No C++ compiler: XLA's scatter/gather, right values, one warning."""
    bogus = tmp_path / "bin"
    bogus.mkdir()
    (bogus / "c++").write_text("#!/bin/sh\necho 'bogus compiler' >&2\nexit 1\n")
    (bogus / "c++").chmod(0o755)
    env = clean_env(1, PENCILFFT_CACHE_DIR=str(tmp_path / "cache"),
                    PATH=f"{bogus}:{os.environ['PATH']}", PENCILFFT_FFT_KERNEL="xla",
                    PENCILFFT_CXX=str(bogus / "c++"),  # ahead of a CXX the machine may set
                    PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    out = subprocess.run([sys.executable, "-c", FALLBACK], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["xla", "1"], out.stdout + out.stderr[-2000:]


# ----------------------------------------------------------------------------------------------
# Eager calls, non-finite inputs, capacity, complex fields, displacement advice (issue 51)


@contextlib.contextmanager
def _compilations():
    """The programs jax lowered or compiled inside the block (jax.monitoring's events; the
    lowering is counted too, as a persistent compilation cache would skip the compile)."""
    seen = []

    def listener(event, secs, **kwargs):
        if event in ("/jax/core/compile/backend_compile_duration",
                     "/jax/core/compile/jaxpr_to_mlir_module_duration"):
            seen.append(event)

    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        yield seen
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)


# the eager checks are reduced over every process, which all raise alike (whatever their grid:
# -np 2 only, this test's 6 programs compiled twice took 31 s under -np 4)
@pytest.mark.mpirun(process_grid=False)
def test_eager_calls_reuse_one_program():
    """An eager call runs one cached program: the second call with new values of the same
    shapes compiles nothing (dispatching op by op compiled ~100 programs per call, and took
    seconds), and gives what jax.jit gives; so does an eager jax.grad through paint."""
    mesh = make_mesh((4, 2))
    sh, ps = NamedSharding(mesh, P("x", "y")), NamedSharding(mesh, P(("x", "y")))
    f3 = put_global(np.random.default_rng(40).normal(size=(3,) + CAT_SHAPE),
                    NamedSharding(mesh, P(None, "x", "y")))
    calls = {  # f3 an argument: under mpirun a jitted function cannot close over it
        "lattice paint": lambda d, q, f3: pencilfft.paint(d, 2.0, "tsc"),
        "lattice readout": lambda d, q, f3: pencilfft.readout(f3, d),
        "interlaced": lambda d, q, f3: pencilfft.paint(d, interlace=True),
        "catalog paint": lambda d, q, f3: pencilfft.paint(q, shape=CAT_SHAPE),
        "catalog readout": lambda d, q, f3: pencilfft.readout(f3, q, "pcs"),
        "grad in the weights": lambda d, q, f3: jax.grad(  # its derivative compiled once too
            lambda w: jnp.sum(pencilfft.paint(d, w) ** 2))(f3[0]),
    }
    for name, call in calls.items():
        first = [put_global(displacements(seed=41, shape=CAT_SHAPE), sh),
                 put_global(_catalog(seed=42), ps), f3]
        second = [put_global(displacements(seed=43, shape=CAT_SHAPE), sh),
                  put_global(_catalog(seed=44), ps), f3]
        with jax.set_mesh(mesh):  # jax.grad's scalar loss needs the mesh in scope
            call(*first)
            with _compilations() as compiled:
                got = call(*second)
            want = jax.jit(call)(*second)
        assert compiled == [], f"{name}: the second eager call compiled {len(compiled)} programs"
        np.testing.assert_allclose(to_numpy(got), to_numpy(want), atol=1e-12)
    with _compilations() as compiled:  # another static setting: its own program
        pencilfft.paint(second[0], 2.0, "cic")
    assert compiled


def test_capacity_is_capped():
    """capacity beyond the particles a device holds is capped there (no 20 GB buffers, nothing
    dropped); a non-int or non-positive capacity is refused."""
    from pencilfft._pm.catalog import plan_catalog

    mesh = make_mesh((4, 2))
    assert plan_catalog(CAT_SHAPE, 2048, mesh, "cic", 10**9).capacity == 2048 // 8
    assert plan_catalog(CAT_SHAPE, 2048, mesh, "cic", 100).capacity == 100
    ps = NamedSharding(mesh, P(("x", "y")))
    pos = np.sort(_catalog(seed=45), axis=0)  # every device's particles bound for a few
    f = np.random.default_rng(46).normal(size=CAT_SHAPE)
    fs = NamedSharding(mesh, P("x", "y"))
    g = pencilfft.paint(put_global(pos, ps), shape=CAT_SHAPE, capacity=10**9)
    np.testing.assert_allclose(to_numpy(g), numpy_paint_catalog(pos, CAT_SHAPE, "cic"),
                               atol=1e-12)
    r = jax.jit(lambda f, q: pencilfft.readout(f, q, capacity=10**9))(put_global(f, fs),
                                                                      put_global(pos, ps))
    np.testing.assert_allclose(to_numpy(r), numpy_read_catalog(f, pos, "cic"), atol=1e-12)
    with pytest.raises(TypeError, match=r"`capacity` must be a positive int.*float"):
        pencilfft.paint(put_global(pos, ps), shape=CAT_SHAPE, capacity=2.5)
    with pytest.raises(ValueError, match=r"`capacity` must be a positive int.*got 0"):
        pencilfft.paint(put_global(pos, ps), shape=CAT_SHAPE, capacity=0)


# the non-finite counts are summed over every process, which all raise (whatever their grid)
@pytest.mark.mpirun(process_grid=False)
@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_non_finite_inputs(bad):
    """NaN or inf in dx (any component; 8192 sites: jnp.max drops NaN from arrays of 4096
    elements or more on XLA:CPU, jax 0.10.2) or in the weights: ValueError eagerly, naming the
    argument; under jit NaN in the result, never a value painted in the wrong place."""
    mesh = make_mesh((4, 2))
    sh = NamedSharding(mesh, P("x", "y"))
    ones = put_global(np.ones(SHAPE), sh)
    for comp in (0, 2):
        dx = displacements(seed=47, rms=0.1)
        dx[9, 3, 4, comp] = bad
        with pytest.raises(ValueError, match=r"`dx` holds 1 NaN or infinite values"):
            pencilfft.paint(put_global(dx, sh))
        with pytest.raises(ValueError, match=r"`dx` holds 1 NaN or infinite values"):
            pencilfft.readout(ones, put_global(dx, sh))
        g = to_numpy(jax.jit(pencilfft.paint)(put_global(dx, sh)))
        assert np.isnan(g[8:16, 0:16]).all()  # the block of the device holding site (9, 3)
        assert np.isfinite(g[24:, 16:]).all()  # two blocks away: no halo reaches it
        r = to_numpy(jax.jit(pencilfft.readout)(ones, put_global(dx, sh)))
        assert np.isnan(r[8:16, 0:16]).all() and np.isfinite(r[16:]).all()
    dx = displacements(seed=47, rms=0.1)
    w = np.ones(SHAPE)
    w[20, 20, 1] = bad
    with pytest.raises(ValueError, match=r"`weights` holds 1 NaN or infinite values"):
        pencilfft.paint(put_global(dx, sh), put_global(w, sh))
    with pytest.raises(ValueError, match=r"`weights` must be finite.*got (nan|inf)"):
        pencilfft.paint(put_global(dx, sh), float(bad))
    g = to_numpy(jax.jit(pencilfft.paint)(put_global(dx, sh), put_global(w, sh)))
    assert not np.isfinite(g[19:22, 19:22]).all() and np.isfinite(g[:16]).all()
    # a concrete dx closed over by a traced function is checked when it is traced
    dx[0, 0, 0, 1] = bad
    with pytest.raises(ValueError, match=r"`dx` holds 1 NaN"):
        jax.jit(lambda w: pencilfft.paint(put_global(dx, sh), w))(1.0)
    # catalogs: the particle's value is NaN under jit, the others right
    pos = _catalog(seed=48)
    pos[7, 1] = bad
    ps = NamedSharding(mesh, P(("x", "y")))
    with pytest.raises(ValueError, match=r"`positions`: 1 particles have a NaN or infinite"):
        pencilfft.paint(put_global(pos, ps), shape=CAT_SHAPE)
    with pytest.raises(ValueError, match=r"`positions`: 1 particles have a NaN or infinite"):
        pencilfft.readout(put_global(np.ones(CAT_SHAPE), sh), put_global(pos, ps))
    f = np.random.default_rng(49).normal(size=CAT_SHAPE)
    r = to_numpy(jax.jit(pencilfft.readout)(put_global(f, sh), put_global(pos, ps)))
    assert np.isnan(r[7])
    keep = np.arange(len(pos)) != 7
    np.testing.assert_allclose(r[keep], numpy_read_catalog(f, pos[keep], "cic"), atol=1e-12)
    g = to_numpy(jax.jit(lambda q: pencilfft.paint(q, shape=CAT_SHAPE))(put_global(pos, ps)))
    assert np.isnan(g).any()
    with pytest.raises(ValueError, match=r"`dx` holds 1 NaN"):  # one device, no halo at all
        pencilfft.paint(jnp.asarray(dx))


@pytest.mark.parametrize("dtype", [np.complex128, np.complex64])
def test_complex_field_readout(dtype):
    """readout is linear: a complex field is read as its real and imaginary parts (lattice and
    catalogs, eagerly and under jit), against numpy; a field of no numbers: TypeError."""
    rng = np.random.default_rng(50)
    real = np.float64 if dtype == np.complex128 else np.float32
    mesh = make_mesh((4, 2))
    sh, ps = NamedSharding(mesh, P("x", "y")), NamedSharding(mesh, P(("x", "y")))
    f = (rng.normal(size=(2,) + CAT_SHAPE) + 1j * rng.normal(size=(2,) + CAT_SHAPE)).astype(dtype)
    fg = put_global(f, NamedSharding(mesh, P(None, "x", "y")))
    dx = displacements(seed=51, shape=CAT_SHAPE).astype(real)
    pos = _catalog(seed=52).astype(real)
    tol = 1e-12 if dtype == np.complex128 else 2e-5
    for form in ("eager", "jit"):
        read = pencilfft.readout if form == "eager" else jax.jit(pencilfft.readout)
        got = read(fg, put_global(dx, sh))
        assert got.dtype == dtype and got.shape == f.shape
        for c in range(2):
            want = (numpy_read(f[c].real, dx.astype(float), "cic")
                    + 1j * numpy_read(f[c].imag, dx.astype(float), "cic"))
            np.testing.assert_allclose(to_numpy(got)[c], want, atol=tol * 10)
        got = read(fg, put_global(pos, ps))
        assert got.dtype == dtype and got.shape == (2, len(pos))
        for c in range(2):
            want = (numpy_read_catalog(f[c].real.astype(float), pos.astype(float), "cic")
                    + 1j * numpy_read_catalog(f[c].imag.astype(float), pos.astype(float), "cic"))
            np.testing.assert_allclose(to_numpy(got)[c], want, atol=tol * 10)
    with pytest.raises(TypeError, match=r"`field` must hold real or complex numbers"):
        pencilfft.readout(np.full(CAT_SHAPE, "a"), jnp.zeros(CAT_SHAPE + (3,)))


@pytest.mark.parametrize("dtype", [np.int32, np.bool_])
def test_a_field_of_integers_or_bools_is_refused(dtype):
    """Issue 68: readout took an int32 or bool field (cast to float32) where painting.md says
    any dtype but real or complex is a TypeError naming `field`; now it is, at the call."""
    with pytest.raises(TypeError, match=rf"`field` must hold real or complex numbers .*got "
                                        rf"dtype {np.dtype(dtype).name}"):
        pencilfft.readout(np.ones(CAT_SHAPE, dtype), jnp.zeros(CAT_SHAPE + (3,)))


def _advice(message):
    """The max_displacement an error message advises, or None."""
    found = re.search(r"pass max_displacement >= ([0-9.e+-]+)", message)
    return None if found is None else float(found.group(1))


@pytest.mark.parametrize("interlace", [False, True])
def test_displacement_advice_can_be_followed(interlace):
    """Blocks of 8 cells along X (32 split 4 ways): a displacement the mesh can cover gets the
    max_displacement that covers it, and following it works; one it cannot (8.5 cells with CIC)
    gets, in the first message, the largest max_displacement this mesh allows and the ways out.
    The message reports the user's own displacement, with interlacing too."""
    sh = NamedSharding(make_mesh((4, 2)), P("x", "y"))
    for m in (5.5, -5.5, 7.6, -7.6, 8.5):  # the default halo takes |dx| < 5
        dx = displacements(seed=53, rms=0.1)
        dx[11, 5, 2, 0] = m
        with pytest.raises(ValueError) as info:
            pencilfft.paint(put_global(dx, sh), interlace=interlace)
        message = str(info.value)
        assert f"the largest displacement along a split axis is {abs(m):g} cells" in message
        advice = _advice(message)
        if advice is None:
            assert "more than any halo on this mesh takes" in message, message
            assert "max_displacement must stay below" in message
            assert "fewer devices along X" in message and "catalog" in message
            assert abs(m) >= 8 - (0.5 if interlace and m < 0 else 0)
            continue
        g = pencilfft.paint(put_global(dx, sh), max_displacement=advice, interlace=interlace)
        if not interlace:
            np.testing.assert_allclose(to_numpy(g), numpy_paint(dx, "cic"), atol=1e-12)
    # a max_displacement no block takes: the bound that fits, in the first message
    with pytest.raises(ValueError, match=rf"max_displacement must be below "
                       rf"{7.5 if interlace else 8:g};.*fewer devices along X"):
        pencilfft.paint(put_global(displacements(seed=54), sh), max_displacement=8.5,
                        interlace=interlace)


def test_interlaced_message_names_the_users_displacement():
    """Interlacing paints a copy at dx - 1/2: a particle at dx = -1.8 is reported as 1.8 cells
    (the copy's 2.3 said as such), not as an unexplained 2.3."""
    dx = displacements(seed=55, rms=0.1)
    dx[3, 5, 2, 0] = -1.8
    sh = NamedSharding(make_mesh((4, 2)), P("x", "y"))
    with pytest.raises(ValueError, match=r"is 1\.8 cells \(with interlace=True: 2\.3 cells for "
                       r"the copy painted 0\.5 cell lower\).*pass max_displacement >= 1\.8"):
        pencilfft.paint(put_global(dx, sh), max_displacement=1.0, interlace=True)
    pencilfft.paint(put_global(dx, sh), max_displacement=1.8, interlace=True)


def _glibc_in_use():
    """Bytes of live blocks in glibc's malloc (all arenas and mmaps), or None (not glibc 2.33+)."""
    import ctypes

    class MallInfo2(ctypes.Structure):
        _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks",
                                                   "hblkhd", "usmblks", "fsmblks", "uordblks",
                                                   "fordblks", "keepcost")]
    try:
        f = ctypes.CDLL("libc.so.6").mallinfo2
    except (OSError, AttributeError):
        return None
    f.restype = MallInfo2
    m = f()
    return m.uordblks + m.hblkhd


def test_repeated_calls_hold_no_more_memory():
    """Issue 57: the RSS of a long PM run crept up.  The cause is glibc keeping freed blocks in
    the arenas of XLA's threads (measured in benchmarks/pm_rss.py: the bytes of live blocks stay
    flat; what grows, and levels off, is the free memory kept).  What this guards: nothing of
    pencilfft's grows per call: no live heap block (the kernel's handler, its threads), no
    eager program or replicated weight kept per call, jitted or eager."""
    if _glibc_in_use() is None:
        pytest.skip("needs glibc 2.33+ (mallinfo2)")
    from pencilfft._pm import paint as _paint_mod

    mesh = make_mesh((4, 2))
    sh = NamedSharding(mesh, P("x", "y"))
    dx = put_global(displacements(seed=50, shape=(32, 32, 32)).astype(np.float32), sh)
    f3 = put_global(np.ones((3, 32, 32, 32), np.float32), NamedSharding(mesh, P(None, "x", "y")))
    jitted = jax.jit(lambda d, f: pencilfft.readout(f * pencilfft.paint(d, window="tsc"), d))
    eager = lambda d, f: pencilfft.readout(f * pencilfft.paint(d, window="tsc"), d)  # noqa: E731
    for call in (jitted, eager):
        for _ in range(5):  # compiled, and the allocator's pools filled
            jax.block_until_ready(call(dx, f3))
        programs = _paint_mod._eager_program._cache_size()
        kept = (len(_paint_mod._REPLICATED), len(_paint_mod._CHECKS))
        before = _glibc_in_use()
        for _ in range(40):
            jax.block_until_ready(call(dx, f3))
        grown = _glibc_in_use() - before
        # 40 calls of 32^3: a density grid (128 KiB over the 8 devices) kept per call would be
        # 5 MiB; jax's own bookkeeping moves by a few hundred KiB
        assert grown < 2 * 2**20, f"{grown / 2**20:.2f} MiB more in use after 40 calls"
        assert _paint_mod._eager_program._cache_size() == programs
        assert (len(_paint_mod._REPLICATED), len(_paint_mod._CHECKS)) == kept
