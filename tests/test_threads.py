"""Threads and the allocator of the CPU kernels (issue 43): `_threads`, `_malloc`, and the FFTW
kernel's and local exchange's values on several threads.

Checked: the rule (PENCILFFT_THREADS, the affinity, the launcher's local ranks, the devices of
the process), its errors; every FFT kind and precision through FFTW's threaded plans against
numpy in float64, and the plan cache's key holding the thread count; the scaling pass split
over threads; the local exchange on a pool of several threads; PENCILFFT_MALLOC's settings and
errors.  No timing here (benchmarks/kernel.py `single`, RESULTS.md issue 43).
"""
from __future__ import annotations

import os
import subprocess
import sys
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.fft

import pencilfft
from conftest import make_mesh, put_global, rel_err, to_numpy
from pencilfft._native import malloc as _malloc, threads as _threads
from pencilfft._transforms import kernel as _kernel

HAVE_FFTW = _kernel.kernel() == "fftw"
needs_fftw = pytest.mark.skipif(not HAVE_FFTW, reason="the fftw extra is not installed: "
                                "pip install -e \".[mpi,fftw,test]\" runs these tests")
TOL = {np.float32: 3e-6, np.float64: 1e-14}
# Large enough for FFTW to split (and for the scaling pass: 2 x 2^18 reals), small enough to be
# quick.
SHAPE = (8, 64, 520)


# ----------------------------------------------------------------------------------------------
# The rule


@pytest.mark.parametrize("env, affinity, ranks, devices, cores, per_device", [
    (None, 2, None, 1, 2, 2),     # one device: every core
    (None, 2, None, 8, 2, 1),     # more devices than cores: one each
    (None, 32, None, 8, 32, 4),   # a node with more cores than devices
    (None, 32, "4", 1, 8, 8),     # 4 unbound ranks of a launcher share the node
    ("6", 32, "4", 4, 6, 1),      # PENCILFFT_THREADS wins (up to the affinity: below)
], ids=["1dev", "8dev-2cores", "8dev-32cores", "4ranks", "env"])
def test_rule(monkeypatch, env, affinity, ranks, devices, cores, per_device):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(affinity)))
    monkeypatch.setattr(os, "cpu_count", lambda: 32 if affinity == 32 else 2)
    monkeypatch.setattr(_threads, "local_cpu_devices", lambda: devices)
    for name in ("PENCILFFT_THREADS", *_threads._LOCAL_RANKS):
        monkeypatch.delenv(name, raising=False)
    if env is not None:
        monkeypatch.setenv("PENCILFFT_THREADS", env)
    if ranks is not None:
        monkeypatch.setenv("MPI_LOCALNRANKS", ranks)
    assert _threads.available_cores() == cores
    assert _threads.threads_per_device() == per_device
    assert f"{per_device} thread(s) per FFT call" in _threads.describe()


def test_bound_process_keeps_its_cores(monkeypatch):
    """A process bound to fewer cores than the machine has already sees only its own."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    monkeypatch.delenv("PENCILFFT_THREADS", raising=False)
    monkeypatch.setenv("MPI_LOCALNRANKS", "4")
    assert _threads.available_cores() == 2


@pytest.mark.parametrize("left_mib, cores", [(1024, 1), (8448, 15), (65536, 32)])
def test_address_space_limit_caps_the_threads(monkeypatch, left_mib, cores):
    """Under `ulimit -v` the threads' reservations (stack and malloc arena, 136 MiB each) fit
    in a quarter of the address space left: libgomp aborts the process when it cannot create
    a thread (seen on 16 cores under test_memory's limit)."""
    import resource

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(32)))
    monkeypatch.setattr(os, "cpu_count", lambda: 32)
    monkeypatch.delenv("PENCILFFT_THREADS", raising=False)
    for name in _threads._LOCAL_RANKS:
        monkeypatch.delenv(name, raising=False)
    with open("/proc/self/status") as f:
        used = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
    limit = used + (left_mib << 20)  # (15.5 threads' worth for 8448: room for VmSize to move)
    monkeypatch.setattr(resource, "getrlimit", lambda which: (limit, resource.RLIM_INFINITY))
    assert _threads.available_cores() == cores


@pytest.fixture
def cores(monkeypatch):
    """The affinity mask this test pretends to have: `cores(n)`."""
    def pretend(n: int) -> None:
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(n)))
        monkeypatch.setattr(os, "cpu_count", lambda: n)
    return pretend


def _no_address_space_limit(monkeypatch):
    import resource

    monkeypatch.setattr(resource, "getrlimit",
                        lambda which: (resource.RLIM_INFINITY, resource.RLIM_INFINITY))


def test_more_threads_than_cores_are_capped_with_one_warning(monkeypatch, cores):
    """PENCILFFT_THREADS=1000 was taken as it was: 1057 OS threads on 57 cores, 4x slower (issue
    51).  Capped at the affinity, with one warning per process naming the variable, the value
    and the cap, however often the count is read (it is at every lowering)."""
    cores(4)
    _no_address_space_limit(monkeypatch)
    monkeypatch.setattr(_threads, "local_cpu_devices", lambda: 2)
    monkeypatch.setenv("PENCILFFT_THREADS", "1000")
    _threads._warn_capped.cache_clear()
    with pytest.warns(RuntimeWarning) as record:
        assert _threads.available_cores() == 4
        assert _threads.threads_per_device() == 2
        assert "4 cores (PENCILFFT_THREADS=1000, capped at the 4 CPU(s) this process may run " \
               "on (os.sched_getaffinity)) for 2 CPU device(s)" in _threads.describe()
    assert [str(w.message) for w in record] == [
        "pencilfft: environment variable PENCILFFT_THREADS=1000 asks for more threads than this "
        "process can run at once; using 4, the 4 CPU(s) this process may run on "
        "(os.sched_getaffinity)"]
    monkeypatch.setenv("PENCILFFT_THREADS", "4")  # up to the affinity: as asked, no warning
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _threads.available_cores() == 4
        assert _threads.describe().startswith("4 cores (PENCILFFT_THREADS) ")


def test_more_threads_than_the_address_space_allows_are_capped(monkeypatch, cores):
    """Under `ulimit -v` PENCILFFT_THREADS is held to the threads that fit, as the default is
    (libgomp aborts the process when it cannot create one)."""
    import resource

    cores(32)
    with open("/proc/self/status") as f:
        used = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
    limit = used + (1024 << 20)  # room for one thread
    monkeypatch.setattr(resource, "getrlimit", lambda which: (limit, resource.RLIM_INFINITY))
    monkeypatch.setenv("PENCILFFT_THREADS", "16")
    _threads._warn_capped.cache_clear()
    with pytest.warns(RuntimeWarning, match=r"PENCILFFT_THREADS=16 .*; using 1, the 1 "
                                            r"thread\(s\) whose stacks .* \(ulimit -v\)"):
        assert _threads.available_cores() == 1


def test_capped_thread_count_warns_once_in_a_fresh_process():
    """The whole path in a process of its own: a transform lowered twice, one warning."""
    code = ("import os, jax, numpy as np, pencilfft\n"
            "from pencilfft._transforms import kernel\n"
            "x = np.ones((4, 4, 4), np.complex64)\n"
            "for n in (4, 8):\n"
            "    jax.jit(lambda a: kernel.fft(a, 'fft', (0, 1, 2), 'backward', ()))(x[:n])\n"
            "print(len(os.sched_getaffinity(0)))\n")
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    out = subprocess.run([sys.executable, "-c", code], env={**env, "PENCILFFT_THREADS": "1000"},
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    warned = [line for line in out.stderr.splitlines() if "PENCILFFT_THREADS=1000" in line]
    assert len(warned) == 1, out.stderr
    assert f"using {out.stdout.split()[-1]}, the {out.stdout.split()[-1]} CPU(s)" in warned[0]


@pytest.mark.parametrize("value", ["0", "-2", "two", "1.5"])
def test_bad_thread_count(monkeypatch, value):
    monkeypatch.setenv("PENCILFFT_THREADS", value)
    with pytest.raises(ValueError, match=rf"PENCILFFT_THREADS.*positive integer.*{value!r}"):
        _threads.available_cores()


def test_default_counts_this_process():
    assert _threads.local_cpu_devices() == len(jax.local_devices(backend="cpu"))
    assert 1 <= _threads.threads_per_device() <= max(_threads.available_cores(), 1)


# ----------------------------------------------------------------------------------------------
# The FFTW kernel on several threads


def _x(dtype, complex_: bool, shape=SHAPE):
    rng = np.random.default_rng(1)
    x = rng.standard_normal(shape)
    if complex_:
        x = x + 1j * rng.standard_normal(shape)
        return x.astype(np.result_type(dtype, np.complex64))
    return x.astype(dtype)


@needs_fftw
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("axes", [(0, 1, 2), (1,)], ids=["012", "1"])
@pytest.mark.parametrize("fft_type", ["fft", "ifft", "rfft", "irfft"])
def test_threaded_fourier_values(monkeypatch, cores, fft_type, axes, dtype):
    cores(64)  # more threads than this machine's cores: capped otherwise
    monkeypatch.setenv("PENCILFFT_THREADS", str(3 * len(jax.local_devices(backend="cpu"))))
    monkeypatch.setenv("PENCILFFT_FFTW_PLANNER", "estimate")  # quick plans, threads all the same
    sizes = tuple(SHAPE[a] for a in axes)
    if fft_type == "irfft":
        x = np.fft.rfftn(_x(dtype, False), axes=axes).astype(np.result_type(dtype, np.complex64))
        ref = np.fft.irfftn(x.astype(np.complex128), s=sizes, axes=axes)
    else:
        x = _x(dtype, fft_type != "rfft")
        wide = x.astype(np.complex128 if np.iscomplexobj(x) else np.float64)
        ref = getattr(np.fft, fft_type + "n")(wide, axes=axes)
    before = _kernel.plan_count()
    f = jax.jit(lambda a: _kernel.fft(a, fft_type, axes, "backward", sizes))
    assert "threads = 3 : i32" in f.lower(x).as_text()
    got = np.asarray(f(x))
    assert rel_err(got, ref) < TOL[dtype]
    assert _kernel.plan_count() > before or fft_type == "irfft"  # planned for 3 threads
    again = _kernel.plan_count()
    np.asarray(f(x))
    assert _kernel.plan_count() == again  # and cached


@needs_fftw
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("kind", ["dct2", "dst3"])
def test_threaded_r2r_values(monkeypatch, cores, kind, dtype):
    cores(64)
    monkeypatch.setenv("PENCILFFT_THREADS", str(2 * len(jax.local_devices(backend="cpu"))))
    monkeypatch.setenv("PENCILFFT_FFTW_PLANNER", "estimate")
    x = _x(dtype, True)
    f = jax.jit(lambda a: _kernel.r2r(a, kind, 1, "ortho", True))
    assert "threads = 2 : i32" in f.lower(x).as_text()
    ref = getattr(scipy.fft, kind[:3])(x.astype(np.complex128), type=int(kind[3]), axis=1,
                                       norm="ortho")
    assert rel_err(np.asarray(f(x)), ref) < 5 * TOL[dtype]


@needs_fftw
def test_thread_count_is_part_of_the_plan_key(monkeypatch, cores):
    cores(64)
    monkeypatch.setenv("PENCILFFT_FFTW_PLANNER", "estimate")
    x = _x(np.float32, True, (4, 8, 24))
    devices = len(jax.local_devices(backend="cpu"))
    counts = []
    for threads in (1, 2, 1):
        monkeypatch.setenv("PENCILFFT_THREADS", str(threads * devices))
        jax.jit(lambda a: _kernel.fft(a, "fft", (1, 2), "ortho", ()))(x).block_until_ready()
        counts.append(_kernel.plan_count())
    assert counts[1] == counts[0] + 1  # a new count: a new plan
    assert counts[2] == counts[1]  # the first one still cached


@pytest.mark.parametrize("threads", [1, 5], ids=["1", "5"])
def test_local_exchange_on_threads(monkeypatch, cores, threads):
    """A slab transform between the devices of this process with the copying pool at 1 and 5
    threads (the pool grows to the largest count asked)."""
    cores(64)
    monkeypatch.setenv("PENCILFFT_THREADS", str(threads))
    n = len(jax.devices())
    mesh = make_mesh((n, 1) if n > 1 else (1, 1))
    x = _x(np.float32, True, (4 * n, 8, 6))
    xs = put_global(x, pencilfft.real_space_sharding(mesh))
    got = to_numpy(jax.jit(lambda a: pencilfft.pfft3d(a, mesh=mesh, layout="natural",
                                                      exchange="auto"))(xs))
    assert rel_err(got, np.fft.fftn(x.astype(np.complex128))) < 3e-6


# ----------------------------------------------------------------------------------------------
# The allocator


def test_malloc_setting(monkeypatch):
    monkeypatch.setenv("PENCILFFT_MALLOC", "Bogus")  # named as given (was lower-cased)
    with pytest.raises(ValueError, match=r"PENCILFFT_MALLOC.*pencilfft, glibc.*'Bogus'"):
        _malloc.configure()
    monkeypatch.setenv("PENCILFFT_MALLOC", "glibc")
    assert "glibc" in _malloc.describe()


@pytest.mark.parametrize("version, old", [("2.28", True), ("2.36", True), ("2.37.9", True),
                                          ("2.38", False), ("2.41", False), ("3.0", False),
                                          ("unknown", False)])
def test_which_glibc_fragments_aligned_blocks(version, old):
    assert _malloc.fragments_aligned_blocks(version) is old


def test_allocator_line_names_an_old_glibc():
    """`pencilfft check`'s allocator line says when this glibc grows the heap in steps."""
    if _malloc.setting() != "pencilfft" or _malloc._user_choice():
        pytest.skip("the environment chose the allocator's settings")
    version = _malloc.glibc_version()
    if version is None:
        pytest.skip("not glibc")
    old = _malloc.fragments_aligned_blocks(version)
    assert ("glibc before 2.38" in _malloc.describe()) is old


SCRIPT = """
import sys, jax, numpy as np
from pencilfft._native import malloc as _malloc
from pencilfft._transforms import kernel as _kernel
x = np.ones((4, 4, 4), np.complex64)
y = jax.jit(lambda a: _kernel.fft(a, "fft", (0, 1, 2), "backward", ()))(x)
assert abs(complex(np.asarray(y)[0, 0, 0]) - 64) < 1e-4
print(_malloc.describe())
"""


@pytest.mark.parametrize("env, expect", [
    ({}, "freed memory kept"),
    ({"PENCILFFT_MALLOC": "glibc"}, "glibc's defaults (PENCILFFT_MALLOC=glibc)"),
    ({"MALLOC_MMAP_MAX_": "0"}, "MALLOC_MMAP_MAX_ is set; pencilfft changes nothing"),
], ids=["default", "off", "user"])
def test_malloc_in_a_fresh_process(env, expect):
    """The first CPU program of a process makes the settings, unless turned off or the user
    chose (a process of its own: they are process-wide)."""
    base = {k: v for k, v in os.environ.items()
            if k not in ("PENCILFFT_MALLOC", "MALLOC_MMAP_MAX_", "MALLOC_TRIM_THRESHOLD_",
                         "XLA_FLAGS")}
    out = subprocess.run([sys.executable, "-c", SCRIPT], env={**base, **env},
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert expect in out.stdout, out.stdout


# ----------------------------------------------------------------------------------------------
# The output written transposed (the one-device transform's layout, `_kernel.fft`'s order)


ORDERS = [(1, 2, 0), (2, 0, 1)]


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("order", ORDERS, ids=lambda o: "".join(map(str, o)))
@pytest.mark.parametrize("axes", [(0, 1, 2), (1, 2), (0,)], ids=["012", "12", "0"])
@pytest.mark.parametrize("fft_type", ["fft", "ifft", "rfft", "irfft"])
def test_output_in_order(fft_type, axes, order, dtype):
    """jnp.transpose(FFT(x), order) in one call, every kind and precision, against numpy (and
    against XLA's kernel where FFTW is absent: the same function)."""
    shape = (6, 5, 8)
    sizes = tuple(shape[a] for a in axes)
    if fft_type == "irfft":
        full = _x(dtype, False, shape)
        x = np.fft.rfftn(full, axes=axes).astype(np.result_type(dtype, np.complex64))
        ref = np.fft.irfftn(x.astype(np.complex128), s=sizes, axes=axes)
    else:
        x = _x(dtype, fft_type != "rfft", shape)
        wide = x.astype(np.complex128 if np.iscomplexobj(x) else np.float64)
        ref = getattr(np.fft, fft_type + "n")(wide, axes=axes)
    f = jax.jit(lambda a: _kernel.fft(a, fft_type, axes, "ortho" if dtype == np.float64
                                      else "backward", sizes, order))
    norm = "ortho" if dtype == np.float64 else "backward"
    if norm == "ortho":
        ref = ref * (1 / np.sqrt(np.prod(sizes)) if fft_type in ("fft", "rfft")
                     else np.sqrt(np.prod(sizes)))
    text = f.lower(x).as_text()
    if HAVE_FFTW:  # one custom call writes the order (XLA's kernel: jnp.fft, then a transpose)
        assert _kernel.TARGET in text and "stablehlo.transpose" not in text
    got = np.asarray(f(x))
    assert got.shape == tuple(ref.shape[a] for a in order)
    assert rel_err(got, np.transpose(ref, order)) < TOL[dtype]


def test_output_in_order_grad_and_vmap():
    x = _x(np.float32, True, (4, 6, 5))
    order = (1, 2, 0)

    def ours(a):
        return jnp.sum(jnp.abs(_kernel.fft(a, "fft", (0, 1, 2), "backward", (), order)) ** 2
                       * jnp.arange(4.0))

    def ref(a):
        return jnp.sum(jnp.abs(jnp.transpose(jnp.fft.fftn(a), order)) ** 2 * jnp.arange(4.0))

    assert rel_err(np.asarray(jax.grad(ours)(x)), np.asarray(jax.grad(ref)(x))) < 1e-5
    xs = np.stack([x, 2 * x])
    got = jax.vmap(lambda a: _kernel.fft(a, "fft", (1, 2), "backward", (), order))(xs)
    want = np.stack([np.transpose(np.fft.fftn(v, axes=(1, 2)), order) for v in xs])
    assert rel_err(np.asarray(got), want) < 3e-6


def test_bad_order():
    with pytest.raises(ValueError, match="not a permutation"):
        _kernel.fft(np.zeros((2, 3, 4), np.complex64), "fft", (0,), "backward", (), (0, 0, 1))


@pytest.mark.parametrize("real", [False, True], ids=["c2c", "r2c"])
def test_one_device_transposed_layout_in_one_call(real):
    """pfft3d on one device in the transposed layout: one FFTW call each way, no transposing
    pass (issue 43), the values numpy's."""
    shape = (8, 6, 10)
    x = _x(np.float32, not real, shape)
    one = jax.devices()[0]
    x1 = jax.device_put(x, one)
    if real:
        fwd, bwd = pencilfft.prfft3d, lambda k: pencilfft.pirfft3d(k, shape)
        ref = np.fft.rfftn(x.astype(np.float64))
    else:
        fwd, bwd = pencilfft.pfft3d, pencilfft.pifft3d
        ref = np.fft.fftn(x.astype(np.complex128))
    k = jax.jit(fwd)(x1)
    assert rel_err(np.asarray(k), np.transpose(ref, (1, 2, 0))) < 3e-6
    assert rel_err(np.asarray(jax.jit(bwd)(k)), x) < 3e-6
    if HAVE_FFTW:
        for fn, arg in ((fwd, x1), (bwd, k)):
            ops = [line for line in jax.jit(fn).lower(arg).compile().as_text()
                   .split("ENTRY")[1].splitlines() if " = " in line]
            assert sum("fusion(" in op or "transpose(" in op or "copy(" in op
                       for op in ops) == 0, ops
