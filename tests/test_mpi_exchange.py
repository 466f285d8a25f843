"""exchange="mpi": blocks sent by mpi4py from the host, CPU processes with one device each.

Where it cannot run (one process with several devices, the mesh left to the compiler), it is
refused with a message that says why; under `mpirun` with one device per process (children
started here, tests/mp/mpi_exchange_child.py) it gives the results of the other exchanges, under
jit, grad, jvp, vmap and scan, with no XLA collective left in the program.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

import pencilfft
from conftest import MPIRUN, clean_env, make_mesh, put_global, random_field, tol

CHILD = Path(__file__).parent / "mp" / "mpi_exchange_child.py"


@MPIRUN  # under mpirun -np 2 and 4 every process holds several devices too
def test_refused_with_several_devices_per_process():
    mesh = make_mesh((4, 2))
    x = put_global(random_field((8, 8, 8), np.complex64), pencilfft.real_space_sharding(mesh))
    with pytest.raises(ValueError, match=r"`exchange`='mpi' cannot run here: "):
        pencilfft.pfft3d(x, exchange="mpi")
    with pytest.raises(ValueError, match=r"`exchange`='mpi' cannot run here: "):
        jax.jit(lambda v: pencilfft.pifft3d(v, exchange="mpi"))(pencilfft.pfft3d(x))


def test_refused_when_the_compiler_picks_the_mesh():
    mesh = make_mesh((4, 2), "auto")
    x = put_global(random_field((8, 8, 8), np.complex64), NamedSharding(mesh, P("x", "y")))
    with pytest.raises(ValueError, match=r"`exchange`='mpi' needs the mesh when the transform is "
                                         r"traced .* pass `mesh=`, call it under `jax.set_mesh"):
        jax.jit(lambda v: pencilfft.pfft3d(v, exchange="mpi"))(x)


def test_unknown_exchange_names_the_choices():
    with pytest.raises(ValueError, match=r"`exchange` must be one of \('auto', 'alltoall', "
                                         r"'pairwise', 'mpi'\); got 'gloo'"):
        pencilfft.pfft3d(jnp.zeros((4, 4, 4), jnp.complex64), exchange="gloo")


def test_one_device_needs_no_exchange():
    """Without a mesh nothing moves: "mpi" is accepted and the result is fftn's."""
    x = random_field((4, 6, 5), np.complex64)
    k = pencilfft.pfft3d(x, exchange="mpi", layout="natural")
    np.testing.assert_allclose(np.asarray(k), np.fft.fftn(x.astype(np.complex128)),
                               rtol=0, atol=tol(np.complex64) * float(np.abs(x).sum()))


@MPIRUN  # the choices depend on the processes' devices
def test_autotune_offers_it_only_where_it_runs():
    from pencilfft import _autotune

    assert _autotune._default_exchanges(jax.devices()) == ("alltoall", "pairwise")


@pytest.mark.parametrize("np_,pdims", [(2, "2x1"), (2, "1x2"), (4, "2x2")])
def test_under_mpirun_one_device_per_process(np_, pdims):
    mpirun = Path(sys.executable).parent / "mpirun"
    if not mpirun.exists():
        pytest.skip(f"no mpirun next to {sys.executable}")
    try:
        done = subprocess.run([str(mpirun), "-np", str(np_), sys.executable, str(CHILD), pdims],
                              env=clean_env(1), capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"mpirun -np {np_} still running after 300 s:\n{e.stdout}\n{e.stderr}")
    reports = [json.loads(line.split("REPORT ", 1)[1])
               for line in done.stdout.splitlines() if "REPORT " in line]
    assert done.returncode == 0 and len(reports) == 1, (done.returncode, done.stdout[-3000:],
                                                        done.stderr[-3000:])
    (report,) = reports
    assert report.pop("devices") == 1
    assert report.pop("hlo all-to-all") == 0 and report.pop("hlo collective-permute") == 0
    assert report.pop("hlo callbacks") >= 1
    assert len(report) == 31
    bad = {k: v for k, v in report.items() if not v < 5 * tol(np.complex64)}
    assert not bad, bad
