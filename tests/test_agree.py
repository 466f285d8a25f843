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
