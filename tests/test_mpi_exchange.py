"""exchange="mpi": MPI inside XLA (our custom call), CPU processes with one device each.

Where it cannot run (one process with several devices, no MPI running), it is refused with a
message that says why; under `mpirun` with one device per process (children started here,
tests/mp/mpi_exchange_child.py) "auto" picks it, and it gives the results of the other
exchanges, under jit, grad, jvp, vmap, scan, chunks, padding, in the compiler-partitioned
transform and with independent transforms in one program, with no XLA collective or host
callback left in the program and no more memory than gloo's; halo_exchange's sends go the
same way.  Its lowering for other platforms is XLA's all_to_all.
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
from conftest import MPIRUN, clean_env, make_mesh, put_global, random_field, to_numpy, tol

CHILD = Path(__file__).parent / "mp" / "mpi_exchange_child.py"


@MPIRUN  # under mpirun -np 2 and 4 every process holds several devices: "mpi" runs there
@pytest.mark.parametrize("exchange", ["mpi", "mixed", "local"])
def test_runs_where_it_can_and_says_why_where_it_cannot(exchange):
    """One process: "mpi" and "mixed" are refused (no MPI, one process).  Several processes of
    several devices each: "mpi" sends everything through MPI (a process's own devices too),
    "mixed" uses the local exchange along the axis inside processes, and "local" is refused
    along the axis that spans processes; the results are numpy's."""
    mesh = make_mesh((4, 2))
    data = random_field((8, 8, 8), np.complex64)
    x = put_global(data, pencilfft.real_space_sharding(mesh))
    runs = jax.process_count() > 1 if exchange != "local" else jax.process_count() == 1
    if not runs:
        why = {"mpi": "MPI is not running", "mixed": "the job is one process",
               "local": "its devices are in several processes"}[exchange]
        with pytest.raises(ValueError, match=rf"`exchange`='{exchange}' cannot run.*{why}"):
            pencilfft.pfft3d(x, exchange=exchange)
        return
    k = jax.jit(lambda v: pencilfft.pfft3d(v, exchange=exchange))(x)
    want = np.fft.fftn(data.astype(np.complex128)).transpose(1, 2, 0)
    got = to_numpy(k)
    assert np.abs(got - want).max() / np.abs(want).max() < tol(np.complex64)
    back = to_numpy(jax.jit(lambda v: pencilfft.pifft3d(v, exchange=exchange))(k))
    assert np.abs(back - data).max() < 1e-4


def test_refused_when_the_compiler_picks_the_mesh():
    """The compiler-partitioned transform takes it where it runs; here it does not (no MPI):
    refused at the call, not from inside XLA's partitioner."""
    mesh = make_mesh((4, 2), "auto")
    x = put_global(random_field((8, 8, 8), np.complex64), NamedSharding(mesh, P("x", "y")))
    with pytest.raises(ValueError, match=r"`exchange`='mpi' cannot run here: "):
        jax.jit(lambda v: pencilfft.pfft3d(v, exchange="mpi"))(x)


def test_unknown_exchange_names_the_choices():
    with pytest.raises(ValueError, match=r"`exchange` must be one of \('auto', 'alltoall', "
                                         r"'pairwise', 'mpi', 'local', 'mixed'\); got 'gloo'"):
        pencilfft.pfft3d(jnp.zeros((4, 4, 4), jnp.complex64), exchange="gloo")


def test_one_device_needs_no_exchange():
    """Without a mesh nothing moves: "mpi" is accepted and the result is fftn's."""
    x = random_field((4, 6, 5), np.complex64)
    k = pencilfft.pfft3d(x, exchange="mpi", layout="natural")
    np.testing.assert_allclose(np.asarray(k), np.fft.fftn(x.astype(np.complex128)),
                               rtol=0, atol=tol(np.complex64) * float(np.abs(x).sum()))


@MPIRUN  # the choices depend on the processes' devices
def test_autotune_offers_it_only_where_it_runs():
    from pencilfft._transforms import autotune as _autotune
    from pencilfft._exchange import local as _local_exchange

    built = _local_exchange.unavailable_reason(8, "cpu") is None
    offered = _autotune._default_exchanges(jax.devices())
    if jax.process_count() == 1:
        assert offered == ("alltoall", "pairwise") + (("local",) if built else ())
    else:  # several processes of several devices: every device through MPI, or mixed
        assert offered == ("alltoall", "pairwise", "mpi") + (("mixed",) if built else ())


@pytest.mark.parametrize("op", ["exchange", "shift", "allreduce"])
def test_other_platforms_lower_to_xla_collectives(op):
    """Only the CPU lowering holds our custom call (it is never chosen elsewhere, but a program
    lowered for GPUs must not name it): there the exchange is XLA's all_to_all, the shift a
    collective_permute, the sum an all_reduce.  On CPUs the call is there, and nothing else
    moves."""
    from pencilfft import _exchange
    from pencilfft._exchange import mpi as _mpi_exchange

    mesh = make_mesh((4, 2))
    calls = {"exchange": (lambda y: _mpi_exchange.exchange(y, "x", 4), _mpi_exchange.TARGET,
                          "all_to_all", P("x", "y")),
             "shift": (lambda y: _mpi_exchange.shift(y, "x", 4, 1, True),
                       _mpi_exchange.SHIFT_TARGET, "collective_permute", P("x", "y")),
             "allreduce": (lambda y: _mpi_exchange.allreduce(y, "x", 4),
                           _mpi_exchange.ALLREDUCE_TARGET, "all_reduce", P(None, "y"))}
    call, target, collective, out_spec = calls[op]

    def body(y):
        with _exchange.in_mesh(mesh):
            return call(y)

    f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("x", "y"), out_specs=out_spec))
    x = jax.ShapeDtypeStruct((16, 8, 4), np.complex64, sharding=NamedSharding(mesh, P("x", "y")))
    cuda = f.trace(x).lower(lowering_platforms=("cuda",)).as_text()
    assert target not in cuda and collective in cuda
    if _mpi_exchange._load() is None:  # the handler builds here (mpicxx of the mpi extra)
        cpu = f.trace(x).lower(lowering_platforms=("cpu",)).as_text()
        assert target in cpu and collective not in cpu


def test_failed_build_warns_once_and_says_why(monkeypatch, tmp_path):
    from pencilfft._exchange import mpi as _mpi_exchange

    monkeypatch.setenv("PENCILFFT_MPICXX", str(tmp_path / "no-such-mpicxx"))
    monkeypatch.setenv("PENCILFFT_CACHE_DIR", str(tmp_path))
    _mpi_exchange._library.cache_clear()
    try:
        with pytest.warns(RuntimeWarning, match="use jax's gloo collectives instead") as record:
            why = _mpi_exchange._load()
            assert _mpi_exchange._load() == why  # decided once: one warning
        assert len(record) == 1
        assert why.startswith("its handler could not be built")
    finally:
        _mpi_exchange._library.cache_clear()


def _mpirun(np_: int, timeout: int, *args: str) -> subprocess.CompletedProcess:
    mpirun = Path(sys.executable).parent / "mpirun"
    if not mpirun.exists():
        pytest.skip(f"no mpirun next to {sys.executable}")
    try:
        return subprocess.run([str(mpirun), "-np", str(np_), sys.executable, str(CHILD), *args],
                              env=clean_env(1), capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"mpirun -np {np_} still running after {timeout} s:\n{e.stdout}\n{e.stderr}")


def test_a_failing_rank_ends_the_job(tmp_path):
    """Rank 0 waits inside the exchange for a rank that has failed: the job ends."""
    done = _mpirun(2, 120, "fail", str(tmp_path))
    assert done.returncode != 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rank0", "rank1"], done.stderr[-2000:]
    assert "rank 1 fails on purpose" in done.stderr, done.stderr[-2000:]


# Both pencil axes across processes, one device each: each axis's exchange crosses processes
# (a slab's one exchange, or 2x1 and 1x2 on 2 processes, add nothing to it; slabs across
# processes run in the mpirun steps).
@pytest.mark.parametrize("np_,pdims", [(4, "2x2")])
def test_under_mpirun_one_device_per_process(np_, pdims):
    done = _mpirun(np_, 300, pdims)
    reports = [json.loads(line.split("REPORT ", 1)[1])
               for line in done.stdout.splitlines() if "REPORT " in line]
    assert done.returncode == 0 and len(reports) == 1, (done.returncode, done.stdout[-3000:],
                                                        done.stderr[-3000:])
    (report,) = reports
    assert report.pop("devices") == 1
    assert report.pop("status").startswith("MPI inside XLA")
    assert report.pop("auto picks") == ["mpi", "mpi"]
    exchanges = pdims.split("x").count("2")  # mesh axes that exchange
    for key in ("hlo", "partitioned hlo"):  # the compiled programs: our calls only
        assert report.pop(key) == {"mpi calls": exchanges, "xla collectives": 0,
                                   "host callbacks": 0}, key
    for key in ("halo hlo periodic", "halo hlo open X"):  # halo_exchange's sends: ours too
        assert report.pop(key) == {"mpi shifts": 2 * exchanges, "xla collectives": 0}, key
    # power_spectrum: one sum for the fields' bins and one for the counts, over each of the two
    # pencil axes (a group of one returns at once)
    assert report.pop("power hlo") == {"mpi sums": 4, "xla collectives": 0}
    # One user function used twice in a program: one key, yet a tag per call, on every process.
    calls = exchanges * 2
    assert report.pop("shared function") == {"calls": calls, "keys": exchanges, "tags": calls,
                                             "same tags on every process": True}
    temp = report.pop("temp bytes")  # per-device memory of the compiled forward
    assert temp["auto"] == temp["mpi"] <= temp["alltoall"], temp
    assert len(report) == 35
    bad = {k: v for k, v in report.items() if not v < 5 * tol(np.complex64)}
    assert not bad, bad


@MPIRUN  # several processes of several devices each: "auto" takes "mixed" there
@pytest.mark.parametrize("pdims", [(4, 2), (2, 4)])
def test_auto_leaves_no_xla_collective_and_gives_their_values_and_gradients(pdims):
    """What "auto" compiles holds none of XLA's collectives under mpirun (the local exchange
    inside processes, MPI between them), and gives the values and gradients of XLA's
    all_to_all; two independent transforms in one program (two calls, two tags) too."""
    mesh = make_mesh(pdims)
    data = random_field((8, 16, 8), np.complex64, seed=3)
    x = put_global(data, pencilfft.real_space_sharding(mesh))
    y = put_global(random_field((8, 16, 8), np.complex64, seed=4),
                   pencilfft.real_space_sharding(mesh))

    def program(exchange):
        def loss(a, b):
            ka = pencilfft.pfft3d(a, exchange=exchange)
            kb = pencilfft.pfft3d(b, exchange=exchange)  # independent of ka
            return jnp.sum(jnp.abs(ka * jnp.conj(kb)) ** 2).real
        return jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))

    text = program("auto").lower(x, y).compile().as_text()
    if jax.process_count() > 1:
        assert not [c for c in ("all-to-all", "collective-permute", "all-gather") if c in text]
        assert "pencilfft_mpi_exchange" in text
    got, want = program("auto")(x, y), program("alltoall")(x, y)
    assert np.allclose(float(got[0]), float(want[0]), rtol=1e-5)
    for g, w in zip(got[1], want[1]):
        g, w = to_numpy(g), to_numpy(w)
        assert np.abs(g - w).max() <= 1e-5 * np.abs(w).max()
