"""Memory before work (issue 21): a grid too big for the devices is refused before XLA
allocates it, with a MemoryError that names the grid, the mesh, the estimate, the limit and
the ways out; the limit comes from the devices (GPU memory_stats, the host's RAM and
RLIMIT_AS on CPUs) or from PENCILFFT_MEMORY_LIMIT.

Before, XLA's failed allocation in one process of a 4x2 CPU mesh ended the job minutes later
in a collective "Termination timeout" (SIGABRT).
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest
from conftest import (MPIRUN, RANK, barrier, clean_env, make_mesh, put_global, seeded_data,
                      to_numpy)
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

import pencilfft
from pencilfft._processes import memory as _memory
from pencilfft._transforms import budget as _budget
from pencilfft._processes.memory import MemoryLimitError
from pencilfft._transforms.plan import plan_forward

ENV = _memory.ENV


@pytest.fixture(autouse=True)
def _fresh_cache():
    _budget._fit.cache_clear()  # a plan checked by another test passes from the cache
    yield
    _budget._fit.cache_clear()


def _x(shape=(64, 64, 64), dtype=np.complex64, pdims=(4, 2)):
    return put_global(np.zeros(shape, dtype), pencilfft.real_space_sharding(make_mesh(pdims),
                                                                            len(shape)))


# ------------------------------------------------------------------------------ estimates


@pytest.mark.parametrize("shape,pdims,real,blocks", [
    ((64, 64, 64), (4, 2), False, (1, 1, 1, 2)),  # in, out, buffer, buffers: 4 blocks in all
    ((64, 64, 64), (1, 1), False, (1, 1, 1, 1)),  # one device: the FFT's work buffer only
    ((64, 64, 62), (4, 2), True, (1, 32 / 31, 32 / 31, 2)),  # Z//2+1 = 32 complex vs 62 real
    ((64, 64, 63), (4, 2), True, (1, 32 / 31.5, 32 / 31.5, 2)),  # 32 of Z//2+1 = 32, no padding
])
def test_transform_estimate_in_blocks(shape, pdims, real, blocks):
    dtype = np.float32 if real else np.complex64
    # One device: a numpy array and no mesh (a 1x1 mesh would not span several processes).
    x = np.zeros(shape, dtype) if pdims == (1, 1) else _x(shape, dtype, pdims)
    # (XLA's collectives: the local exchange needs one buffer less, the test below)
    plan = plan_forward(x, norm="backward", layout="transposed", mesh=None, real=real,
                        exchange="alltoall")
    est = _budget.transform_estimate(plan, forward=True)
    block = est.in_bytes
    got = (1, est.out_bytes / block, est.buffer_bytes / block, est.buffers)
    assert got == pytest.approx(blocks)
    assert block == np.prod(shape) * (4 if real else 8) // np.prod(pdims)


def test_estimate_of_a_padded_spectrum_counts_the_padding():
    """30x32x18 on 3x2 pads Y 32 -> 33: the k-space block is 33/32 of the real-space one."""
    mesh = jax.make_mesh((3, 2), ("x", "y"), devices=jax.devices()[:6],
                         axis_types=(AxisType.Explicit,) * 2)
    x = jax.ShapeDtypeStruct((30, 32, 18), np.complex64,
                             sharding=pencilfft.real_space_sharding(mesh))
    plan = plan_forward(x, norm="backward", layout="transposed", mesh=mesh, real=False)
    est = _budget.transform_estimate(plan, forward=True)
    assert est.out_bytes / est.in_bytes == pytest.approx(33 / 32)


@pytest.mark.parametrize("layout", ["transposed", "natural"])
@pytest.mark.parametrize("pdims", [(4, 2), (8, 1)], ids=["4x2", "8x1"])
def test_estimate_is_close_to_what_xla_allocates(pdims, layout):
    """The estimate (4 blocks for c2c) is what README "Memory" states; XLA's memory analysis
    of the compiled transform (what benchmarks.memory measures) stays within 0.9-1.25 of it:
    the check refuses what clearly cannot fit, not what is close."""
    mesh = make_mesh(pdims)
    x = jax.ShapeDtypeStruct((64, 64, 64), np.complex64,
                             sharding=pencilfft.real_space_sharding(mesh))
    analysis = jax.jit(lambda a: pencilfft.pfft3d(a, layout=layout)).lower(x).compile()
    ma = analysis.memory_analysis()
    measured = ma.argument_size_in_bytes + ma.output_size_in_bytes + ma.temp_size_in_bytes
    plan = plan_forward(x, norm="backward", layout=layout, mesh=mesh, real=False)
    estimate = _budget.transform_estimate(plan, forward=True).total
    assert 0.9 <= measured / estimate <= 1.25, (measured, estimate)


# ---------------------------------------------------------------------------- the setting


@pytest.mark.parametrize("text,expected", [
    ("", None), ("auto", None), ("off", "off"), ("0", "off"), ("none", "off"),
    ("123456", 123456), ("2GiB", 2 << 30), ("512M", 512 << 20), ("1.5g", 3 << 29),
    ("64 KiB", 64 << 10), ("3TB", 3 << 40),
])
def test_setting(monkeypatch, text, expected):
    monkeypatch.setenv(ENV, text)
    assert _memory.setting() == expected


@pytest.mark.parametrize("text", ["lots", "-1GiB", "2 GB please", "1e9"])
def test_bad_setting_names_the_variable(monkeypatch, text):
    monkeypatch.setenv(ENV, text)
    with pytest.raises(ValueError, match=re.escape(f"environment variable {ENV} must be a size "
                                                   f"in bytes per device") + f".*got {text!r}"):
        _memory.setting()


class _FakeDevice:
    platform = "gpu"

    def __init__(self, id, stats):
        self.id, self._stats = id, stats

    def memory_stats(self):
        if isinstance(self._stats, Exception):
            raise self._stats
        return self._stats


def test_gpu_memory_is_the_allocators_limit_minus_its_use(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    devices = [_FakeDevice(0, {"bytes_limit": 80 << 30, "bytes_in_use": 10 << 30}),
               _FakeDevice(1, {"bytes_limit": 80 << 30, "bytes_in_use": 30 << 30})]
    free = _memory.available(devices)
    assert free.per_device == 50 << 30  # the fullest device decides
    assert free.source == "GPU 1: memory_stats() bytes_limit - bytes_in_use"


@pytest.mark.parametrize("stats", [None, {}, {"bytes_in_use": 5}, RuntimeError("unsupported")])
def test_gpu_without_memory_stats_skips_the_check(monkeypatch, stats):
    monkeypatch.delenv(ENV, raising=False)
    devices = [_FakeDevice(0, {"bytes_limit": 1 << 30}), _FakeDevice(1, stats)]
    assert _memory.available(devices) is None


def test_cpu_memory_is_the_hosts_shared_by_the_devices(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    monkeypatch.setattr(_memory, "host_free", lambda: (8 << 30, "8 GiB of RAM available"))
    devices = jax.local_devices()[:2]  # every run of the suite has at least 2 per process
    free = _memory.available(devices)
    assert free.per_device == 4 << 30
    assert free.source == "CPU: 8 GiB of RAM available, shared by this process's 2 devices"


def test_host_free_reads_the_os():
    """On Linux the available RAM at least; the least of RAM, RLIMIT_AS, cgroup."""
    free = _memory.host_free()
    if sys.platform.startswith("linux"):
        assert free is not None and free[0] > 0
        assert "of RAM available" in free[1] or "left under" in free[1]


# ------------------------------------------------------------------------------ the checks


@pytest.mark.usefixtures("xla_collectives")  # its numbers: 2 exchange buffers
def test_transform_too_big_is_refused_before_xla(monkeypatch):
    """64^3 complex64 on 4x2: blocks of 256 KiB; 768 KiB more per device do not fit in 100."""
    monkeypatch.setenv(ENV, "100KiB")
    x = _x()
    with pytest.raises(MemoryLimitError) as info:
        pencilfft.pfft3d(x)
    assert isinstance(info.value, MemoryError)
    message = str(info.value)
    assert message.startswith(
        "pfft3d of a 64x64x64 complex64 grid on a 4x2 mesh needs about 0.75 MiB more per device "
        "(output 0.25 MiB, 2 exchange buffers of 0.25 MiB; not counting the 0.25 MiB input block "
        "already in memory); in 64 pieces per stage (`chunks`=64, the least chunking can reach) "
        "it would still need about 0.258 MiB, but a device has about 0.0977 MiB "
        "(PENCILFFT_MEMORY_LIMIT=100KiB)."
    ), message
    for way_out in ("prfft3d/pirfft3d: half the memory", "a mesh with more devices",
                    "jax.jit(pfft3d, donate_argnums=0)", f"{ENV}=off turns this check off"):
        assert way_out in message
    monkeypatch.setenv(ENV, "800KiB")  # enough: the refusal was not cached
    assert pencilfft.pfft3d(x).shape == (64, 64, 64)


R2C, MORE, DONATE = "real-to-complex", "a mesh with more devices", "donate_argnums=0"


@pytest.mark.parametrize("call,needs,present,absent", [
    # under jit the input may be donated (invisible here): the output takes its place
    (lambda x: jax.jit(lambda v: pencilfft.pfft3d(v))(x), "0.5 MiB more per device (2 exchange buffers",
     [R2C, MORE], [DONATE]),
    (lambda x: pencilfft.prfft3d(x.real), "0.398 MiB more per device (output 0.133 MiB",
     [MORE], [R2C, DONATE]),
    (lambda x: pencilfft.pifft3d(x), "pifft3d of a 64x64x64 complex64 grid on a 4x2 mesh",
     [R2C, MORE, "jax.jit(pifft3d, donate_argnums=0)"], []),
    (lambda x: pencilfft.pfft3d(np.zeros((64, 64, 64), np.complex64), mesh=x.sharding.mesh),
     "1 MiB more per device (input 0.25 MiB, output", [MORE], []),  # numpy: not on devices yet
    (lambda x: pencilfft.pfft3d(np.zeros((8, 8, 8), np.complex64)),
     "on one device (no mesh) needs about 0.0117 MiB", [MORE], []),
], ids=["jit", "r2c", "inverse", "numpy", "one-device"])
@pytest.mark.usefixtures("xla_collectives")
def test_every_transform_and_input_kind_is_checked(monkeypatch, call, needs, present, absent):
    monkeypatch.setenv(ENV, "1KiB")
    with pytest.raises(MemoryLimitError) as info:
        call(_x())
    message = " ".join(str(info.value).split())
    assert needs in message, message
    assert all(way in message for way in present), message
    assert not any(way in message for way in absent), message


# Issue 38: under jit an input the program makes is allocated by it and counts; an argument of the
# jitted function is already in memory and does not (counting it would refuse what fits).
# 64^3 on 4x2: blocks of 256 KiB complex (128 KiB real, 133 KiB half spectrum).
@MPIRUN  # every rank decides alike (the limit is the same), before any collective
@pytest.mark.parametrize("transform", ["pfft3d", "prfft3d"])
def test_under_jit_an_input_made_in_the_program_is_counted(monkeypatch, transform):
    """200 KiB: the made input alone is more (refused, naming it and the grid); the resident
    argument's output and pieces fit (runs, the values numpy's).  Before, both ran into XLA."""
    monkeypatch.setenv(ENV, "200KiB")
    real = transform == "prfft3d"
    data = seeded_data((64, 64, 64), np.float32 if real else np.complex64)
    x = put_global(data, pencilfft.real_space_sharding(make_mesh((4, 2)), 3))
    f = getattr(pencilfft, transform)
    with pytest.raises(MemoryLimitError) as info:
        jax.jit(lambda v: f(2 * v))(x)
    message = str(info.value)
    assert message.startswith(f"{transform} of a 64x64x64 {data.dtype.name} grid on a 4x2 mesh "
                              f"needs about "), message
    assert f"(input {'0.125' if real else '0.25'} MiB" in message, message
    assert "a device has about 0.195 MiB (PENCILFFT_MEMORY_LIMIT=200KiB)" in message, message
    k = jax.jit(lambda v: f(v))(x)  # the argument: in memory already
    ref = (np.fft.rfftn if real else np.fft.fftn)(data.astype(np.float64 if real else np.complex128))
    got = to_numpy(k)[:, : ref.shape[2]]  # transposed: (Y, Zc, X), Zc padded for the mesh
    np.testing.assert_allclose(got, np.moveaxis(ref, 0, -1), rtol=0, atol=1e-5 * np.abs(ref).max())


@MPIRUN
def test_under_jit_a_made_input_that_fits_chunked_runs(monkeypatch):
    """400 KiB: the made input (256 KiB) and an unchunked transform do not fit together, 4 pieces
    in the input's place do (the 12 GB case of issue 38 at test size): it runs, chunked."""
    monkeypatch.setenv(ENV, "400KiB")
    data = seeded_data((64, 64, 64), np.complex64)
    x = put_global(data, pencilfft.real_space_sharding(make_mesh((4, 2)), 3))
    plan = plan_forward(x, norm="backward", layout="natural", mesh=None, chunks="auto")
    seen = []
    jax.jit(lambda v: seen.append(_budget.fit_chunks(plan, True, 2 * v).chunks) or v)(x)
    assert seen == [4]
    k = jax.jit(lambda v: pencilfft.pfft3d(2 * v, layout="natural"))(x)
    ref = np.fft.fftn(2 * data.astype(np.complex128))
    np.testing.assert_allclose(to_numpy(k), ref, rtol=0, atol=1e-5 * np.abs(ref).max())


def test_a_limit_set_after_compiling_applies_once_the_cache_is_cleared(monkeypatch):
    """The check runs while tracing (README "Too big for memory"): a compiled function is not
    traced again until its cache is cleared."""
    x = _x()
    f = jax.jit(lambda v: pencilfft.pfft3d(v * 2))
    monkeypatch.setenv(ENV, "1GiB")
    f(x)
    monkeypatch.setenv(ENV, "1KiB")
    f(x)  # jit's cache: not traced, not checked
    f.clear_cache()
    with pytest.raises(MemoryLimitError, match="PENCILFFT_MEMORY_LIMIT=1KiB"):
        f(x)


def test_compiler_partitioned_path_is_not_checked(monkeypatch):
    """Under jit with no mesh in scope (an Auto mesh, jaxdecomp's way) the devices are known
    only when XLA partitions: nothing to check at trace time."""
    monkeypatch.setenv(ENV, "1KiB")
    mesh = make_mesh((4, 2), "auto")
    x = put_global(np.zeros((16, 16, 16), np.complex64), NamedSharding(mesh, P("x", "y")))
    assert jax.jit(pencilfft.pfft3d)(x).shape == (16, 16, 16)


def test_check_off_and_cached(monkeypatch):
    calls = []
    real = _budget.available
    monkeypatch.setattr(_budget, "available", lambda d: calls.append(1) or real(d))
    monkeypatch.setenv(ENV, "off")
    pencilfft.pfft3d(_x())
    assert calls == []  # off: not even asked
    monkeypatch.setenv(ENV, "1GiB")
    x = _x()
    for _ in range(3):
        pencilfft.pfft3d(x)
    assert calls == [1]  # once per plan


@MPIRUN  # the refusal reaches every rank
def test_load_too_big_is_refused_on_every_rank(monkeypatch, shared_dir):
    path = os.path.join(shared_dir, "field.npy")
    if RANK == 0:
        np.save(path, seeded_data((64, 64, 64), np.float32))
    barrier()
    monkeypatch.setenv(ENV, "100KiB")
    with pytest.raises(MemoryLimitError, match=r"loading '.*field\.npy' \(global shape \(64, 64, "
                                               r"64\), float32\) on a 4x2 mesh needs about 0\.25 "
                                               r"MiB per device \(its block, and the host copy it "
                                               r"is read into\), but a device has about 0\.0977"):
        pencilfft.load(path, make_mesh((4, 2)))
    monkeypatch.setenv(ENV, "1MiB")
    assert pencilfft.load(path, make_mesh((4, 2))).shape == (64, 64, 64)


@MPIRUN  # on every rank, before any collective
def test_autotune_too_big_is_refused_before_it_allocates(monkeypatch):
    monkeypatch.setenv(ENV, "100KiB")
    with pytest.raises(MemoryLimitError, match=r"autotune: pfft3d/pifft3d of a 64x64x64 "
                                               r"complex64 grid on 8 devices needs about 1\.25 "
                                               r"MiB per device"):
        pencilfft.autotune((64, 64, 64), repeats=1, exchanges=("alltoall",))


# ------------------------------------------------------------------- under an address limit

_CHILD = textwrap.dedent(
    """
    import json, os, resource
    import jax, numpy as np
    import pencilfft

    mesh = jax.make_mesh((4, 2), ("x", "y"))
    sharding = pencilfft.real_space_sharding(mesh)
    small = jax.device_put(np.ones((32, 32, 32), np.complex64), sharding)
    pencilfft.pfft3d(small)  # compiled before the limit: XLA's own start-up is not the point
    # ulimit -v: 2 GiB of address space more than now, and room for a thread per core (its
    # stack and malloc arena, `_native.threads.THREAD_BYTES`): the small round trip's threads,
    # XLA's and the kernels', are started under the limit, more of them on more cores (16
    # cores aborted with 2 GiB alone: libgomp and std::thread could not start one)
    used = int(open("/proc/self/status").read().split("VmSize:")[1].split()[0]) * 1024
    room = (2 << 30) + (os.cpu_count() or 1) * (136 << 20)
    resource.setrlimit(resource.RLIMIT_AS, (used + room, resource.RLIM_INFINITY))
    report = {}
    big = jax.ShapeDtypeStruct((1024, 1024, 1024), np.complex64, sharding=sharding)
    # 1024^3 on 4x2 (the issue's case): 2 GiB per device under jit, 16 GiB in all, unchunked
    # (chunks="auto" fits it in pieces: see tests/test_chunks.py)
    try:
        jax.jit(lambda a: pencilfft.pfft3d(a, chunks=1)).lower(big)
        report["big"] = "no error"
    except MemoryError as e:
        report["big"] = type(e).__name__ + ": " + str(e)
    k = jax.jit(lambda a: pencilfft.pifft3d(pencilfft.pfft3d(a)))(small)
    report["small"] = float(np.abs(np.asarray(k) - 1).max())
    print(json.dumps(report))
    """
)


def test_address_space_limit_is_seen():
    """`ulimit -v` (RLIMIT_AS) as in the issue: the big grid is refused naming RLIMIT_AS,
    a small one still runs under the same limit (no false refusal)."""
    if not sys.platform.startswith("linux"):
        pytest.skip("reads /proc/self/status")
    env = clean_env(8)
    env.pop(ENV, None)
    proc = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True,
                          timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    import json

    report = json.loads(proc.stdout.strip().splitlines()[-1])
    # (1 GiB with the local exchange, the child's "auto" in one process; 2 with XLA's collectives)
    assert re.match(r"MemoryLimitError: pfft3d of a 1024x1024x1024 complex64 grid on a 4x2 mesh "
                    r"needs about [12] GiB more per device", report["big"]), report
    assert re.search(r"of address space left under RLIMIT_AS \(ulimit -v \d+\), .* in use, "
                     r"shared by this process's 8 devices\)", report["big"]), report
    assert report["small"] < 1e-5
