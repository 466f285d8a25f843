"""Where a process of a job runs on its node: its share of the node's cores, its accelerators.

Read from what the launcher left in the environment: the node-local rank and size (MPICH's and
Intel MPI's `MPI_LOCALRANKID`/`MPI_LOCALNRANKS`, Open MPI's `OMPI_COMM_WORLD_LOCAL_*`, Slurm's
`SLURM_LOCALID` and task counts) and the accelerators it made visible (`CUDA_VISIBLE_DEVICES`
and its ROCm siblings).  `initialize` (launch.py) binds the CPUs before jax starts its backend
and passes the devices to `jax.distributed.initialize`; `launchers` finds the numbers.
"""
from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

__all__ = ["BIND_ENV", "bind_cpus", "choose_local_device_ids", "cpu_share", "launcher_int",
           "visible_devices"]

# Set to 0 (or false/no/off) to leave the CPU affinity of processes alone under mpirun.
BIND_ENV = "PENCILFFT_BIND_CPUS"
# (local rank, processes on this node), as MPI launchers set them: MPICH/Hydra and Intel MPI,
# Open MPI.
_LOCAL_VARS = (("MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
               ("OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"))
# Which accelerators the launcher left visible to this process.
_VISIBLE_VARS = ("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES")


# ------------------------------------------------------------------------------ CPU binding


def cpu_share(local_rank: int, local_size: int, cpus: Sequence[int]) -> list[int]:
    """The CPUs of process `local_rank` of the `local_size` on a node that has `cpus`: the
    local_rank-th of equal contiguous shares, or one CPU, round-robin, when there are more
    processes than CPUs (leftover CPUs stay unused, as with srun's block distribution)."""
    cpus = sorted(cpus)
    share = len(cpus) // local_size
    if share == 0:
        return [cpus[local_rank % len(cpus)]]
    return cpus[local_rank * share:(local_rank + 1) * share]


def bind_cpus(env: Mapping[str, str]) -> str | None:
    """Pin this process to its share of the node's CPUs if nobody has bound it yet; what was
    done, in words (None: nothing)."""
    if not hasattr(os, "sched_setaffinity"):
        return None  # not Linux
    for rank_var, size_var in _LOCAL_VARS:
        if rank_var in env and size_var in env:
            local_rank, local_size = _local_rank_and_size(env, rank_var, size_var)
            break
    else:
        return None
    cpus = os.sched_getaffinity(0)
    if local_size <= 1 or len(cpus) < (os.cpu_count() or 0):
        return None  # alone on the node, or the launcher chose already
    share = cpu_share(local_rank, local_size, cpus)
    os.sched_setaffinity(0, share)
    return (f"local process {local_rank} of {local_size}: bound to CPUs {share} "
            f"({BIND_ENV}=0 to leave them alone)")


_BIND_WAY_OUT = (f"these launcher variables say which share of the node's cores this process "
                 f"gets: fix the launcher's environment, or set {BIND_ENV}=0 "
                 "(initialize(bind_cpus=False)) to leave the CPU binding alone")


def launcher_int(env: Mapping[str, str], name: str, minimum: int, way_out: str) -> int:
    """The integer in launcher variable `name`, at least `minimum`; a ValueError that names the
    variable, its value and the way out otherwise (not int()'s bare "invalid literal")."""
    text = env[name]
    try:
        value = int(text.strip())
    except ValueError:
        value = None
    if value is None or value < minimum:
        raise ValueError(
            f"environment variable {name}={text!r} must be an integer >= {minimum}; {way_out}"
        )
    return value


def _local_rank_and_size(env: Mapping[str, str], rank_var: str, size_var: str) -> tuple[int, int]:
    """(this process's rank on its node, processes on the node), checked."""
    rank = launcher_int(env, rank_var, 0, _BIND_WAY_OUT)
    size = launcher_int(env, size_var, 1, _BIND_WAY_OUT)
    if rank >= size:
        raise ValueError(
            f"environment variables {rank_var}={env[rank_var]!r} and {size_var}="
            f"{env[size_var]!r}: the local rank must be below the number of processes on the "
            f"node; {_BIND_WAY_OUT}"
        )
    return rank, size


# ----------------------------------------------------------------------------------- devices


def visible_devices(env: Mapping[str, str]) -> list[str] | None:
    """The accelerator ids the launcher made visible to this process, or None if unrestricted."""
    for var in _VISIBLE_VARS:
        if var in env:
            return [d for d in env[var].split(",") if d.strip()]
    return None


def choose_local_device_ids(
    local_rank: int, local_size: int, visible: Sequence[str] | None, shared: bool | None
) -> list[int]:
    """Which of the visible accelerators this process drives (indices into the visible ones).

    Args:
      local_rank, local_size: this process's index among the processes on its node, and
        their number.
      visible: the accelerator ids the launcher made visible (CUDA_VISIBLE_DEVICES ...), or
        None when it did not restrict them.
      shared: True if all processes of the node see the same accelerators, False if each was
        given its own, None if unknown.

    Returns:
      A list for `jax.distributed.initialize(local_device_ids=...)`; the empty list means
      "all visible devices" (jax restricts visibility only for a non-empty list).  The result
      only matters on GPUs: CPU devices ignore it.
    """
    if local_size <= 1:
        return []  # one process per node: it drives every device of the node
    if visible is None:
        return [local_rank]  # nothing known: one device per process, jax's convention
    if shared is False:
        return []  # the launcher already gave this process its own devices
    n = len(visible)
    if n < local_size:
        # Fewer devices than processes: either bound per process (shared unknown) or
        # oversubscribed (several processes share a device).
        return [] if shared is None else [local_rank % n]
    per_process = n // local_size  # leftover devices, if any, stay unused
    return list(range(local_rank * per_process, (local_rank + 1) * per_process))
