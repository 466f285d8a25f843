"""Test configuration: simulated CPU devices, float64 support, meshes, and the multi-process set-up.

`PENCILFFT_TEST_DEVICES` (default 8) is the number of simulated CPU devices *per process*; under
`mpirun -np N` the runner sets it to 8/N so that every run sees 8 devices in all.  This must happen
before jax creates its backend, hence at import time of this file.

Every run refuses `with mesh:` (JAX_DISALLOW_MESH_CONTEXT_MANAGER=1, unless the environment says
otherwise): jax has deprecated that idiom and will make it an error, so neither pencilfft nor its
tests may enter one; `jax.set_mesh` is the way.  `PENCILFFT_TEST_QUICK=1` (`bash tests/run.sh
--quick`) keeps only the quick subset, `QUICK_FILES`.
"""
from __future__ import annotations

import os
import shutil
import tempfile

_N_LOCAL = int(os.environ.get("PENCILFFT_TEST_DEVICES", "8"))
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={_N_LOCAL}"
    ).strip()
# The suite compiles thousands of small programs, and LLVM's optimization of their machine code
# took about a sixth of its time.  Turned off here (and in the children below): XLA's own passes,
# the partitioning, the collectives, buffer assignment and so memory_analysis() are those users
# get, which is what the tests read; only how fast the generated loops run differs.
# PENCILFFT_TEST_LLVM_OPT=1 keeps XLA's default.
TEST_XLA_FLAGS = "" if os.environ.get("PENCILFFT_TEST_LLVM_OPT") == "1" else (
    "--xla_backend_optimization_level=0")
if TEST_XLA_FLAGS and "xla_backend_optimization_level" not in os.environ["XLA_FLAGS"]:
    os.environ["XLA_FLAGS"] += " " + TEST_XLA_FLAGS
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("JAX_DISALLOW_MESH_CONTEXT_MANAGER", "1")
# The suite runs on newer jax too (Python 3.12, 3.13): its children's stderr is read, so the
# warning about a jax outside the tested releases is silenced (tests/test_dependencies.py
# checks the warning itself with an environment of its own).
os.environ.setdefault("PENCILFFT_NO_WARN_JAX_VERSION", "1")

import jax  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from jax.sharding import AxisType, NamedSharding  # noqa: E402

import pencilfft  # noqa: E402
from pencilfft._decomposition.rules import fits, round_up  # noqa: E402

jax.config.update("jax_enable_x64", True)
# The environment is read when jax is imported; a plugin may have imported it before this file.
DISALLOW_MESH_CONTEXT = os.environ["JAX_DISALLOW_MESH_CONTEXT_MANAGER"].lower() not in ("0", "false")
if "jax_disallow_mesh_context_manager" in jax.config.values:  # a jax that still has `with mesh:`
    jax.config.update("jax_disallow_mesh_context_manager", DISALLOW_MESH_CONTEXT)
pencilfft.initialize()  # a no-op in a plain process; starts jax.distributed under mpirun/srun

MULTI_PROCESS = jax.process_count() > 1
RANK = jax.process_index()  # pencilfft.initialize() makes it the MPI rank

# The meshes every transform is tested on: pencils, slabs both ways, and a 1-axis mesh.
PDIMS = [(1, 8), (8, 1), (4, 2), (2, 4), (8,)]


def make_mesh(pdims, axis_type: str = "explicit"):
    """A mesh over all (global) devices; axis names 'x' ('y')."""
    names = ("x", "y")[: len(pdims)]
    kind = {"explicit": AxisType.Explicit, "auto": AxisType.Auto}[axis_type]
    return jax.make_mesh(tuple(pdims), names, axis_types=(kind,) * len(pdims))


def put_global(data: np.ndarray, sharding) -> jax.Array:
    """A global jax.Array from a numpy array every process holds (fine for test sizes)."""
    return jax.make_array_from_callback(data.shape, sharding, lambda idx: data[idx])


def to_numpy(x: jax.Array) -> np.ndarray:
    """The whole global array as numpy on every process."""
    if MULTI_PROCESS and not x.is_fully_addressable:
        from jax.experimental import multihost_utils

        return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return np.asarray(x)


def random_field(shape, dtype, seed=0) -> np.ndarray:
    """Standard normal data (complex when `dtype` is), the same on every process."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape)
    if np.issubdtype(np.dtype(dtype), np.complexfloating):
        x = x + 1j * rng.standard_normal(shape)
    return x.astype(dtype)


def seeded_data(shape, dtype, seed: int = 0) -> np.ndarray:
    """Data of any dtype the loaders take (integers too), the same on every rank."""
    rng = np.random.default_rng(seed)
    dtype = np.dtype(dtype)
    if dtype.kind in "iu":
        return rng.integers(-1000 if dtype.kind == "i" else 0, 1000, size=shape).astype(dtype)
    x = rng.standard_normal(shape)
    if dtype.kind == "c":
        x = x + 1j * rng.standard_normal(shape)
    return x.astype(dtype)


def root_only(data: np.ndarray, root: int = 0):
    """`data` on rank `root`, None on the others (what scatter's callers pass)."""
    return data if RANK == root else None


def barrier() -> None:
    """All ranks meet here (a no-op in one process)."""
    if MULTI_PROCESS:
        from mpi4py import MPI

        MPI.COMM_WORLD.Barrier()


def valid(shape, pdims) -> bool:
    """Whether a real-space array of global `shape` can be split on `pdims` (the library's rule)."""
    return fits(shape, pdims)


def reference(x: np.ndarray, layout: str, norm: str = "backward") -> np.ndarray:
    """numpy float64 fftn of the last three axes, in `layout` order (global shapes)."""
    k = np.fft.fftn(x.astype(np.complex128), axes=(-3, -2, -1), norm=norm)
    return np.moveaxis(k, -3, -1) if layout == "transposed" else k


def halo_reference(x: np.ndarray, pdims, extents, periods, like_jaxdecomp=False) -> np.ndarray:
    """numpy halo exchange of x (global (..., X, Y, Z), padded blocks on `pdims`: (Px, Py), or
    (Px, Py, Pz) for a brick), region by region.

    Every block is cut into 3 x 3 regions (low halo, middle, high halo along X and Y; 3 x 3 x 3
    with Z on a brick); each halo
    region takes the cells of the neighbouring block in that direction as they were before the
    call: the low halo of width h that block's slice [-2h:-h], the high one its [h:2h] (for
    h <= the interior: the neighbour's edge cells, i.e. np.pad(wrap) of the interior grid).
    Beyond a non-periodic edge a halo keeps its values (`like_jaxdecomp`: becomes 0); along a
    mesh axis of size 1 it wraps within the block (`like_jaxdecomp`: nothing moves along it).
    """
    pdims = tuple(pdims) + (1,) * (2 - len(pdims))
    lead = x.ndim - 3
    blocks = [x.shape[lead + i] // n for i, n in enumerate(pdims)]
    parts = []  # per axis: (destination slice, neighbour offset, source slice)
    for n, b, h in zip(pdims, blocks, extents):
        if h == 0 or (like_jaxdecomp and n == 1):
            parts.append([(slice(0, b), 0, slice(0, b))])
        else:
            parts.append([(slice(0, h), -1, slice(b - 2 * h, b - h)),
                          (slice(h, b - h), 0, slice(h, b - h)),
                          (slice(b - h, b), 1, slice(h, 2 * h))])
    whole = (slice(None),) * (3 - len(pdims))  # Z on a 2-axis mesh

    def at(block, slices):
        return (Ellipsis,) + tuple(slice(k * b + s.start, k * b + s.stop)
                                   for k, b, s in zip(block, blocks, slices)) + whole

    out = x.copy()
    for block in np.ndindex(*pdims):
        for regions in np.ndindex(*(len(p) for p in parts)):
            chosen = [parts[a][r] for a, r in enumerate(regions)]
            if all(off == 0 for _, off, _ in chosen):
                continue
            dst = at(block, [d for d, _, _ in chosen])
            src, beyond = [], False
            for k, n, (_, off, _), periodic in zip(block, pdims, chosen, periods):
                beyond |= not (0 <= k + off < n) and not periodic
                src.append((k + off) % n)
            if beyond:
                out[dst] = 0 if like_jaxdecomp else x[dst]
            else:
                out[dst] = x[at(src, [s for _, _, s in chosen])]
    return out


def padded_k_shape(shape, pdims, layout, real):
    """The global k-space shape the contract promises: Y up to a multiple of Pa, Z (or Z//2+1)
    of Pb.  Written out here rather than read from the plan, so that the tests check it."""
    pa, pb = pdims[0], (pdims[1] if len(pdims) == 2 else 1)
    *batch, X, Y, Z = shape
    yp = round_up(Y, pa)
    zp = round_up(Z // 2 + 1 if real else Z, pb)
    return tuple(batch) + ((yp, zp, X) if layout == "transposed" else (X, yp, zp))


def assert_same_spec(arr, spec):
    """arr is split as `spec` says (mesh axes of size 1 may be named or not)."""
    want = NamedSharding(arr.sharding.mesh, spec)
    assert arr.sharding.is_equivalent_to(want, arr.ndim), f"sharding {arr.sharding.spec} != {spec}"


# Launcher variables that must not leak from this (maybe mpirun-started) process into children.
_LAUNCHER_PREFIXES = (
    "PMI_", "PMIX_", "OMPI_", "MPI_LOCAL", "HYD", "SLURM_", "JAX_COORDINATOR", "JAX_LOCAL"
)


def clean_env(devices: int, **extra: str) -> dict[str, str]:
    """The environment for a child process with `devices` simulated CPU devices and none of
    this process's launcher variables (a child must not join this job)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(_LAUNCHER_PREFIXES)}
    env.update(
        XLA_FLAGS=f"--xla_force_host_platform_device_count={devices} {TEST_XLA_FLAGS}".strip(),
        JAX_PLATFORMS="cpu",
        PYTHONUNBUFFERED="1",
        **extra,
    )
    return env


def rel_err(got, ref) -> float:
    got = np.asarray(got)
    ref = np.asarray(ref)
    scale = np.max(np.abs(ref))
    return float(np.max(np.abs(got - ref)) / (scale if scale > 0 else 1.0))


def check_directional_derivative(loss, x: jax.Array, seed: int = 0, eps: float = 1e-6) -> None:
    """jax.grad(loss) at the real array x against a central finite difference along a random
    direction (the scalars involved are replicated: this works under mpirun too, where
    jax.test_util.check_grads cannot fetch the sharded arrays)."""
    import jax.numpy as jnp

    v = put_global(random_field(x.shape, np.float64, seed), x.sharding)
    f = jax.jit(loss)
    slope = float(jax.jit(lambda a, b: jnp.sum(jax.grad(loss)(a) * b))(x, v))
    fd = (float(f(x + eps * v)) - float(f(x - eps * v))) / (2 * eps)
    assert abs(slope - fd) <= 1e-6 * max(1.0, abs(fd)), (slope, fd)


def tol(dtype) -> float:
    """The acceptance threshold max|err|/max|ref| for a result dtype."""
    return 1e-12 if np.dtype(dtype) in (np.complex128, np.float64) else 1e-5


# What runs where.  Every test runs in the single-process step (8 simulated devices, one
# process): that is where each public function is checked in every calling form, on every mesh
# class, against a float64 reference.  Under mpirun (np 2 and np 4, tests/run.sh) only the tests
# marked `mpirun` run: what can differ when a mesh spans processes (exchanges across processes,
# the compiler-partitioned path on multi-process arrays, initialize/abort/signals, the loaders,
# halos, batch meshes, compat, autotune and the CLI across processes) plus one representative
# case of every public function, on every mesh but the one-axis (8,) (`_again_under_mpirun`).
# A test marked `mpirun` says why in a comment or its docstring.
# Running the rest again under mpirun would check nothing new: a process's share of a
# computation does not depend on how many devices the others hold.
MPIRUN = pytest.mark.mpirun


def mpirun_for(*values):
    """Parametrize values of which the ones given here also run under mpirun: use as
    `parametrize("layout", mpirun_for("transposed") + ["natural"])`."""
    return [pytest.param(v, marks=MPIRUN) for v in values]


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "mpirun: also runs under mpirun -np 2 and -np 4 (tests/run.sh); unmarked "
        "tests run in the single-process step only (see tests/conftest.py)")


# What `mpirun -np 4` adds to `-np 2`: a 2x2 grid of processes, so that both mesh axes of a
# pencil mesh span processes (under -np 2 one of them stays inside each process).  That changes
# the exchanges (transforms, halos, sums), what each process loads, and how ranks fail; the rest
# (the CLI, compat, chunking, batch meshes, autotune, ...) runs the same code on either grid, so
# it runs under -np 2 only; so does a test of those files marked
# `pytest.mark.mpirun(process_grid=False)` (what it checks is summed or agreed over every process
# alike, whatever their grid).
PROCESS_GRID_FILES = {"test_agree.py", "test_fft.py", "test_rfft.py", "test_padding.py",
                      "test_partitioned.py", "test_halo.py", "test_power.py", "test_io.py",
                      "test_distributed.py", "test_reliability.py", "test_mpi_exchange.py",
                      "test_r2r.py", "test_paint.py",
                      "test_brick_power.py", "test_brick_paint.py"}


# The quick subset (`bash tests/run.sh --quick`, or PENCILFFT_TEST_QUICK=1 with pytest): the
# core cases, a few minutes on 2 cores.  The transforms (complex and real, every mesh class and
# layout, against numpy float64) and the set-up across processes, what most changes would break
# first; the rest of the public functions are checked by the whole suite.
QUICK_FILES = {"test_fft.py", "test_rfft.py", "test_distributed.py"}
QUICK = os.environ.get("PENCILFFT_TEST_QUICK", "0") == "1"


def _again_under_mpirun(item) -> bool:
    """Marked `mpirun`, and not on the one-axis mesh (8,): that mesh differs from (8, 1) only in
    naming one axis, which is planned the same however the devices are spread over processes.
    With more than 2 processes, only what a 2-D grid of processes changes (`PROCESS_GRID_FILES`)."""
    marker = item.get_closest_marker("mpirun")
    if not marker:
        return False
    if jax.process_count() > 2 and (item.path.name not in PROCESS_GRID_FILES
                                    or marker.kwargs.get("process_grid") is False):
        return False
    pdims = getattr(getattr(item, "callspec", None), "params", {}).get("pdims")
    return pdims is None or len(pdims) != 1


def pytest_ignore_collect(collection_path, config):
    """In the quick subset, the other test files are not even imported (collecting all of them
    takes a while)."""
    if QUICK and collection_path.suffix == ".py" and collection_path.name.startswith("test_"):
        return collection_path.name not in QUICK_FILES or None
    return None


def pytest_collection_modifyitems(config, items):
    if not MULTI_PROCESS and not QUICK:
        return
    keep, drop = [], []
    for item in items:
        wanted = not QUICK or item.path.name in QUICK_FILES
        if MULTI_PROCESS:
            wanted = wanted and _again_under_mpirun(item)
        (keep if wanted else drop).append(item)
    config.hook.pytest_deselected(items=drop)
    items[:] = keep


@pytest.fixture(params=PDIMS, ids=lambda p: "x".join(map(str, p)))
def pdims(request):
    return request.param


@pytest.fixture(params=["explicit", "auto"])
def axis_type(request):
    return request.param


@pytest.fixture
def xla_collectives(monkeypatch):
    """exchange="auto" as where neither the local nor the mixed exchange runs (no C++
    compiler): for tests whose numbers are those of XLA's collectives (the memory check's)."""
    from pencilfft._exchange import local, mixed

    monkeypatch.setattr(local, "auto", lambda platform: False)
    monkeypatch.setattr(mixed, "auto", lambda platform: False)


@pytest.fixture
def shared_dir():
    """One temporary directory for all ranks (pytest's tmp_path differs between processes)."""
    path = tempfile.mkdtemp(prefix="pencilfft-io-") if RANK == 0 else None
    if MULTI_PROCESS:
        from mpi4py import MPI

        path = MPI.COMM_WORLD.bcast(path, root=0)
    yield path
    barrier()
    if RANK == 0:
        shutil.rmtree(path, ignore_errors=True)
