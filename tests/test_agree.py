"""One decision on every process (`pencilfft._processes.agree`): what each process reads for itself (its
free memory) is agreed across the job before it decides a plan.

Marked `mpirun`: only there do processes differ (in one process the value is its own).
"""
from __future__ import annotations

import sys

import jax
import pytest

from conftest import MPIRUN, RANK
from pencilfft._processes import agree as _agree, memory as _memory


@MPIRUN
@pytest.mark.parametrize("transport", ["mpi", "key-value store"])
def test_the_least_value_wins_on_every_process(transport, monkeypatch):
    if transport == "key-value store":  # as under srun without MPI: jax.distributed's store
        monkeypatch.delitem(sys.modules, "mpi4py.MPI", raising=False)
        if jax.process_count() > 1 and _agree.distributed_client() is None:
            pytest.fail("a multi-process job without jax.distributed's client")
    assert _agree.least(100 + 7 * RANK, "a test value") == 100
    assert _agree.least(50 - RANK, "a test value") == 50 - (jax.process_count() - 1)


@MPIRUN
def test_detected_free_memory_is_the_least_over_processes(monkeypatch):
    """Each process sees another amount; every one plans with the smallest, so all pick the
    same chunk count (issue 43: different counts compiled different programs and hung)."""
    monkeypatch.delenv(_memory.ENV, raising=False)
    monkeypatch.setattr(_memory, "host_free", lambda: ((8 + RANK) << 30, "test"))
    devices = jax.local_devices()
    free = _memory.available(devices)
    assert free.per_device == (8 << 30) // len(devices)
    if jax.process_count() > 1:
        assert "the least over" in free.source


@MPIRUN
def test_a_process_that_cannot_tell_leaves_the_check_off(monkeypatch):
    monkeypatch.delenv(_memory.ENV, raising=False)
    monkeypatch.setattr(_memory, "host_free", lambda: None if RANK == 0 else (8 << 30, "test"))
    assert _memory.available(jax.local_devices()) is None


# ----------------------------------------------------------------------------------------------
# Plans that would differ between processes: one error on every process, never a hang


def _spanning_field(shape=(64, 64, 64)):
    """A complex field on a 4x2 mesh of every process's devices (8 in all)."""
    import numpy as np

    import pencilfft
    from conftest import make_mesh, put_global

    mesh = make_mesh((4, 2))
    data = np.zeros(shape, np.complex64)
    return put_global(data, pencilfft.real_space_sharding(mesh))


@MPIRUN
@pytest.mark.parametrize("how", ["eager", "jit"])
@pytest.mark.parametrize("limits", [(None, "3MiB"), ("off", "3MiB"), ("4MiB", "3MiB")],
                         ids=["unset-3MiB", "off-3MiB", "4MiB-3MiB"])
def test_different_memory_limits_fail_alike_on_every_process(how, limits, monkeypatch):
    """Issue 51: PENCILFFT_MEMORY_LIMIT set differently on two ranks made them choose different
    chunk counts and spin forever.  Now every process raises the same error, naming the chunk
    counts and each process's setting (in one process there is nothing to compare: it runs)."""
    import pencilfft

    limit = limits[min(RANK, 1)]
    if limit is None:
        monkeypatch.delenv(_memory.ENV, raising=False)
    else:
        monkeypatch.setenv(_memory.ENV, limit)
    x = _spanning_field()
    f = pencilfft.pfft3d if how == "eager" else jax.jit(pencilfft.pfft3d)
    if jax.process_count() == 1:
        f(x).block_until_ready()
        return
    with pytest.raises(_agree.DifferentPlansError) as info:
        f(x)
    text = str(info.value)
    assert "processes of this job decided pfft3d of a 64x64x64 complex64 grid differently" in text
    assert f"PENCILFFT_MEMORY_LIMIT: process 0: {limits[0] or '(not set)'!r}" in text
    assert "process 1: '3MiB'" in text


@MPIRUN
@pytest.mark.parametrize("op", ["pfft3d", "halo_exchange"])
def test_an_exchange_one_process_cannot_build_fails_alike(op, monkeypatch):
    """A handler that builds on one process and not on another (a node without the MPI
    compiler, say) would leave them in different exchanges: the same error on both, from the
    transforms' plan and from the neighbour sends of halos (and power spectra, painting)."""
    import pencilfft
    from pencilfft._exchange import local as _local, mpi as _mpi

    if jax.process_count() == 1 or _mpi.unavailable_reason(None, "cpu") is not None:
        pytest.skip("needs processes that can run the MPI exchange")  # (alike on every one)
    if RANK == 1:
        monkeypatch.setattr(_mpi, "_library", lambda: "its handler could not be built (test)")
        monkeypatch.setattr(_local, "_library", lambda: "its handler could not be built (test)")
    x = _spanning_field((16, 16, 16))
    if op == "pfft3d":
        with pytest.raises(_agree.DifferentPlansError,
                           match=r"exchanges: process 0: \('(mixed|mpi)'"):
            pencilfft.pfft3d(x)
    else:
        with pytest.raises(_agree.DifferentPlansError,
                           match=r"sends through MPI inside XLA: process 0: True, process 1: "
                                 r"False.*why not: process 0: None, process 1: 'its handler"):
            pencilfft.halo_exchange(x.real, (1, 1))


@MPIRUN
def test_each_process_may_transform_its_own_devices_alone():
    """A transform on one process's own device compares nothing with the others: processes may
    run as many of them as they like, in any order, without waiting for each other."""
    import numpy as np

    import pencilfft
    from conftest import barrier

    data = np.ones((8, 8, 8), np.complex64)
    for _ in range(1 + RANK):
        assert np.allclose(np.asarray(pencilfft.pfft3d(data))[0, 0, 0], 512)
    barrier()


@MPIRUN
@pytest.mark.parametrize("transport", ["mpi", "key-value store"])
def test_same_compares_every_process(transport, monkeypatch):
    if transport == "key-value store":
        monkeypatch.delitem(sys.modules, "mpi4py.MPI", raising=False)
    _agree.same({"chunks": 2}, "a test plan", settings={"X": RANK})
    if jax.process_count() == 1:
        return
    with pytest.raises(_agree.DifferentPlansError,
                       match=r"chunks: process 0: 0, process 1: 1.*X: process 0: 0, process 1: 1"):
        _agree.same({"chunks": RANK}, "a test plan", settings={"X": RANK})
