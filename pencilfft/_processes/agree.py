"""One decision on every process: the numbers a plan depends on that each process reads for
itself (free memory, say) are agreed across the job before they decide anything.

Every process of an SPMD job must compile the same program: a chunk count chosen from one
process's free memory could differ on another, and the two would then wait for each other in
exchanges that never match.  `least(value, what)` returns the smallest of the values every
process passed, through MPI where it runs (one MPI_Allreduce), else through jax.distributed's
key-value store; a process that never gets there makes the others fail after `TIMEOUT_S`
seconds with an error that says so, never hang.

Every process must ask the same questions in the same order, as SPMD code does: each `what` is
numbered per process, and the n-th question of a kind on one process is matched with the n-th
on the others.
"""
from __future__ import annotations

import itertools
import os
import sys
from collections import defaultdict

import jax

from .._jax_private import distributed_client  # noqa: F401 - the tests look it up here

__all__ = ["least", "TIMEOUT_S"]

TIMEOUT_S = float(os.environ.get("PENCILFFT_AGREE_TIMEOUT", "300"))

# Per kind of question, how many this process asked so far (the key-value store's keys).
_asked: defaultdict[str, itertools.count] = defaultdict(itertools.count)


def least(value: int, what: str) -> int:
    """The smallest `value` over the processes of the job (`value` itself in one process)."""
    if jax.process_count() == 1:
        return value
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
        return int(mpi.COMM_WORLD.allreduce(int(value), op=mpi.MIN))
    client = distributed_client()
    if client is None:
        raise RuntimeError(f"pencilfft: cannot agree on {what} across the {jax.process_count()} "
                           f"processes: neither MPI nor jax.distributed's key-value store runs")
    number = next(_asked[what])
    prefix = f"pencilfft/agree/{what}/{number}"
    client.key_value_set(f"{prefix}/{jax.process_index()}", str(int(value)))
    values = []
    for rank in range(jax.process_count()):
        try:
            values.append(int(client.blocking_key_value_get(f"{prefix}/{rank}",
                                                            int(TIMEOUT_S * 1000))))
        except Exception as e:  # noqa: BLE001 - the store's timeout error
            raise RuntimeError(
                f"pencilfft: process {rank} did not say its {what} within {TIMEOUT_S:g} s "
                f"(PENCILFFT_AGREE_TIMEOUT); every process must make the same calls in the same "
                f"order: {e}") from e
    return min(values)
