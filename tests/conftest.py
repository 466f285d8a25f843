"""Test configuration: simulated CPU devices, float64 support, meshes, and the multi-process set-up.

`PENCILFFT_TEST_DEVICES` (default 8) is the number of simulated CPU devices *per process*; under
`mpirun -np N` the runner sets it to 8/N so that every run sees 8 devices in all.  This must happen
before jax creates its backend, hence at import time of this file.
"""
from __future__ import annotations

import os

_N_LOCAL = int(os.environ.get("PENCILFFT_TEST_DEVICES", "8"))
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={_N_LOCAL}"
    ).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from jax.sharding import AxisType  # noqa: E402

import pencilfft  # noqa: E402

jax.config.update("jax_enable_x64", True)
pencilfft.initialize()  # a no-op in a plain process; starts jax.distributed under mpirun/srun

MULTI_PROCESS = jax.process_count() > 1

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


def rel_err(got, ref) -> float:
    got = np.asarray(got)
    ref = np.asarray(ref)
    scale = np.max(np.abs(ref))
    return float(np.max(np.abs(got - ref)) / (scale if scale > 0 else 1.0))


def tol(dtype) -> float:
    """The acceptance threshold max|err|/max|ref| for a result dtype."""
    return 1e-12 if np.dtype(dtype) in (np.complex128, np.float64) else 1e-5


def pytest_configure(config):
    config.addinivalue_line("markers", "single_process: needs one process; skipped under mpirun")


def pytest_collection_modifyitems(config, items):
    if not MULTI_PROCESS:
        return
    skip = pytest.mark.skip(reason="needs a single process (skipped under mpirun)")
    for item in items:
        if "single_process" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(params=PDIMS, ids=lambda p: "x".join(map(str, p)))
def pdims(request):
    return request.param


@pytest.fixture(params=["explicit", "auto"])
def axis_type(request):
    return request.param
