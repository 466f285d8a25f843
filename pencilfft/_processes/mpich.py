"""The network layer of the `mpich` wheel under `srun --mpi=pmi2`, chosen before MPI starts.

The `mpich` package on PyPI (pencilfft[mpi]) is MPICH built with two network layers, UCX (its
default) and OFI (libfabric).  Under `srun --mpi=pmi2` its ranks exchange their addresses
through Slurm's pmi2 plug-in, speaking the PMI-1 wire protocol to it, and across nodes that
failed in 1 to 2 jobs of 3 with the UCX layer (issue 65): `mpi/pmi2: value not properly
terminated in client request`, then `MPIDI_UCX_comm_addr_exchange ... Invalid parameter`, or a
hang.  The cause, measured on a cluster of namespace nodes (tests/multinode/):

* Slurm's plug-in reads a PMI-1 request with a single `read()` of at most 1024 bytes
  (src/plugins/mpi/pmi2/pmi1.c, `handle_pmi1_cmd`: "TODO: read until newline");
* MPICH puts each rank's UCX address as segments of up to 1022 characters, hex with runs
  coded short; the address is padded with whatever memory held before, so a segment's length
  changes from run to run, and with jax and pencilfft imported first (more of the heap is
  non-zero) the `cmd=put ... value=...` line passed 1024 bytes in about one job of three;
* the line is then cut, and both halves are refused.

OFI's addresses are a few dozen bytes: every request fits.  So where this process is an `srun
--mpi=pmi2` task running the wheel's MPICH and nobody chose a layer, `prepare` selects OFI
(`MPICH_CH4_NETMOD=ofi`) before MPI starts.  libfabric then picks the fabric (Omni-Path's
psm2, InfiniBand's verbs, EFA, or TCP), as UCX would have.  Under MPICH's own mpiexec (hydra
serves PMI itself and reads whole lines), with a site's MPI (not the wheel), or with
MPICH_CH4_NETMOD set, nothing changes.
"""
from __future__ import annotations

import importlib.metadata
import os
from collections.abc import MutableMapping

__all__ = ["prepare", "WHY_OFI"]

NETMOD = "MPICH_CH4_NETMOD"
WHY_OFI = (f"{NETMOD}=ofi: srun's pmi2 plug-in reads each PMI-1 request in one read of 1024 "
           "bytes, and the mpich wheel's default UCX addresses can pass that (the job then "
           "fails in MPI_Init, 'value not properly terminated in client request'); set "
           f"{NETMOD} yourself to choose (docs/troubleshooting.md)")


def _wheel_mpich() -> bool:
    """Whether mpi4py will load the `mpich` wheel's library: the wheel is installed here and
    nothing points mpi4py elsewhere (a site MPI: Intel MPI's root, MPI4PY_LIBMPI)."""
    try:
        importlib.metadata.distribution("mpich")
    except importlib.metadata.PackageNotFoundError:
        return False
    return "MPI4PY_LIBMPI" not in os.environ and "I_MPI_ROOT" not in os.environ


def srun_pmi2_task(env: MutableMapping[str, str]) -> bool:
    """Whether this process is a task of `srun --mpi=pmi2` (Slurm serves its PMI), not a rank
    of MPICH's mpiexec (which sets MPI_LOCALRANKID) inside an allocation."""
    return (env.get("SLURM_MPI_TYPE") == "pmi2" and "PMI_FD" in env
            and "MPI_LOCALRANKID" not in env)


def prepare(env: MutableMapping[str, str] | None = None) -> str | None:
    """Choose the mpich wheel's OFI layer where UCX can fail under srun's pmi2 (see above).

    Called before MPI starts (mpi4py's import).  Returns what was set and why (for
    `initialize(verbose=True)`), or None where nothing was changed.
    """
    env = os.environ if env is None else env
    if NETMOD in env or not srun_pmi2_task(env) or not _wheel_mpich():
        return None
    env[NETMOD] = "ofi"
    return WHY_OFI
