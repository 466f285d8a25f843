"""Which launcher started this process, and what `jax.distributed.initialize` needs from it.

* MPI (MPICH/Hydra, Open MPI, Intel MPI, srun with a PMI plug-in): the MPI ranks are the jax
  process ids, so that `pencilfft.scatter`/`gather` can map jax processes to MPI ranks; rank 0
  picks a free port for the coordinator and broadcasts it (`mpi_arguments`, which starts MPI);
* SLURM without MPI (`srun python ...`): jax's own SLURM detection, with the local devices
  fixed for the case of one task driving several GPUs (`slurm_arguments`); where MPI cannot
  span the tasks of a step, `srun_mpi_hint` says why and what to do;
* `multiprocessing` (spawn, forkserver, a `ProcessPoolExecutor` worker): not a member of the
  job at all, although it inherited its parent's launcher variables (`multiprocessing_child`).

Only reads the environment (and starts MPI in `mpi_arguments`); `initialize` (launch.py)
decides and starts jax.
"""
from __future__ import annotations

import functools
import os
import re
import socket
import sys
from collections.abc import Mapping

from .placement import choose_local_device_ids, launcher_int, visible_devices

__all__ = ["launched_by_mpi", "mpi_arguments", "multiprocessing_child", "running_mpi",
           "slurm_arguments", "slurm_step", "srun_mpi_hint"]


def running_mpi():
    """mpi4py's MPI module if MPI is running in this process, else None.  Never imports
    mpi4py: MPI must already have been started (by `initialize`, jax's mpi4py cluster
    detection or the user), so that asking never starts MPI as a side effect."""
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is None or not mpi.Is_initialized() or mpi.Is_finalized():
        return None
    return mpi


@functools.cache
def process_hosts() -> tuple[str, ...] | None:
    """Each MPI rank's host name, in rank order (one allgather, the first time: `initialize`
    asks while every process is there), or None without MPI.  Which processes share a node
    decides whether an exchange between them crosses a network (pipelined stages, "auto")."""
    mpi = running_mpi()
    if mpi is None:
        return None
    return tuple(mpi.COMM_WORLD.allgather(socket.gethostname()))


# Variables that MPI launchers set in every rank's environment (MPICH/Hydra and Intel MPI: PMI_*,
# MPI_LOCALNRANKS; Open MPI: OMPI_COMM_WORLD_*; PMIx launchers incl. srun --mpi=pmix: PMIX_RANK).
_MPI_SIZE_VARS = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE")
_MPI_MARKER_VARS = _MPI_SIZE_VARS + (
    "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "MPI_LOCALNRANKS"
)
# What jax's SLURM detection needs (jax/_src/clusters/slurm_cluster.py).
SLURM_VARS = (
    "SLURM_JOB_ID", "SLURM_STEP_NODELIST", "SLURM_NTASKS", "SLURM_PROCID", "SLURM_LOCALID"
)

_SLURM_WAY_OUT = ("SLURM sets it in every task of a job step: run under srun, or unset the "
                  "SLURM_* variables for a plain process, or pass coordinator_address, "
                  "num_processes and process_id to initialize()")


def multiprocessing_child() -> str | None:
    """This process's name when `multiprocessing` started it (spawn, forkserver, fork, a
    `ProcessPoolExecutor` worker), else None.

    Such a child inherits its parent's environment, launcher variables and all, but it is no
    process of the job: it must not start MPI (under mpirun, `PMI_Init` fails and the child
    dies) nor join jax's coordinator (which then aborts the parent: "unexpectedly tried to
    connect with a different incarnation").  A spawn or forkserver child runs the main
    module again, `initialize()` at its top included, while multiprocessing prepares it:
    then `parent_process()` is still None and only the process being prepared ("inheriting",
    multiprocessing's own test for a main module imported in a child) tells.
    """
    process = sys.modules.get("multiprocessing.process")
    if process is None:
        return None  # never imported: not started by it
    current = process.current_process()
    if process.parent_process() is not None or getattr(current, "_inheriting", False):
        return current.name
    return None


# --------------------------------------------------------------------------------------- MPI


def launched_by_mpi(env: Mapping[str, str]) -> bool:
    return any(v in env for v in _MPI_MARKER_VARS)


def mpi_arguments(env: Mapping[str, str], overrides: dict) -> dict | None:
    """Arguments for jax.distributed.initialize from MPI, or None for a 1-rank job.

    Explicit values instead of `cluster_detection_method="mpi4py"`: the same ranks, but
    the coordinator port is a free one chosen by rank 0 (mpi4py detection hashes the host
    name, so two jobs on one node can pick the same port), and local devices follow
    `placement.choose_local_device_ids`.
    """
    sizes = [env[v] for v in _MPI_SIZE_VARS if v in env]
    if sizes and all(s.strip() == "1" for s in sizes):
        return None  # mpirun -np 1: a plain single process; do not even start MPI
    try:
        from mpi4py import MPI
    except ImportError as e:
        raise ImportError(
            f"this process was started by an MPI launcher but mpi4py cannot be imported ({e}); "
            "pip install 'pencilfft[mpi]' (or mpi4py built for that MPI library), or pass "
            "coordinator_address, num_processes and process_id to pencilfft.initialize"
        ) from e

    comm = MPI.COMM_WORLD
    if comm.Get_size() == 1:
        # The MPI library did not join the launcher's job: srun with a PMI plug-in this MPI
        # does not speak (then SLURM detection takes over), or mpi4py built against another
        # MPI than the mpirun used (then every process would silently run alone).
        if sizes and not all(v in env for v in SLURM_VARS):
            raise RuntimeError(
                f"the launcher started {sizes[0]} processes but MPI.COMM_WORLD has size 1 in "
                "this one: mpirun and mpi4py belong to different MPI libraries (mpi4py uses "
                f"{MPI.Get_library_version().splitlines()[0].strip()!r}); launch with the "
                "mpirun/mpiexec of that library"
            )
        return None
    kwargs = dict(overrides)
    kwargs.setdefault("num_processes", comm.Get_size())
    kwargs.setdefault("process_id", comm.Get_rank())
    if "coordinator_address" not in kwargs and "JAX_COORDINATOR_ADDRESS" not in env:
        address = None
        if comm.Get_rank() == 0:
            port = env.get("JAX_COORDINATOR_PORT") or str(_free_port())
            address = f"{socket.gethostname()}:{port}"
        kwargs["coordinator_address"] = comm.bcast(address, root=0)
    # Node-local rank and size; collective, so every rank computes it even if overridden.
    local = comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        visible = visible_devices(env)
        shared = len({tuple(v) if v is not None else None for v in local.allgather(visible)}) == 1
        ids = choose_local_device_ids(local.Get_rank(), local.Get_size(), visible, shared)
    finally:
        local.Free()
    if "local_device_ids" not in kwargs and "JAX_LOCAL_DEVICE_IDS" not in env:
        kwargs["local_device_ids"] = ids
    return kwargs


def _free_port() -> int:
    """A TCP port that is free now (the coordinator binds it a moment later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]


# ------------------------------------------------------------------------------------- SLURM

# The fix, wherever srun without an MPI plug-in shows.  PMI-2 is what the mpich wheel of
# pencilfft[mpi] speaks (its `srun --mpi=pmix` stops at start-up: "Runtime environment uses
# unsupported PMI version PMIx"), and Intel MPI; Open MPI 4/5 as sites build it speaks PMIx.
_SRUN_MPI_FIX = (
    "start the step with `srun --mpi=pmi2` (or export SLURM_MPI_TYPE=pmi2 before srun): PMI-2 "
    "is what the mpich of pencilfft[mpi] and Intel MPI speak; a site's Open MPI built with "
    "PMIx takes `--mpi=pmix`. `srun --mpi=list` shows the cluster's plug-ins; pencilfft's "
    "slurm/ scripts take PENCILFFT_SRUN_MPI"
)


def srun_mpi_hint(mpi_size: int | None = None, env: Mapping[str, str] | None = None) -> str | None:
    """Why MPI cannot span the tasks of this Slurm job, and the fix; None when that is not so.

    srun gives the tasks of a step a way to find each other (a PMI plug-in) only when asked
    (`srun --mpi=...`, SLURM_MPI_TYPE, or the cluster's MpiDefault, often `none`).  Without
    one, MPI in each task finds no launcher and starts as its own one-rank world, although
    the step has N tasks (jax still starts across them, from Slurm's variables), and
    everything that needs MPI then sees one process.  Every place that can meet this calls
    this one function: the MPI exchange's reason (`pencilfft check`), `scatter`/`gather`/
    `save`/`load`, `initialize(verbose=True)`, the benchmarks.

    Args:
      mpi_size: the size of MPI.COMM_WORLD as the caller sees it; None: this process's if MPI
        runs (MPI is never started here), else unknown.
      env: the environment (default: os.environ).

    Returns:
      One sentence naming the cause (the step's task count, the plug-in or its absence) and
      the fix (`srun --mpi=pmi2`, SLURM_MPI_TYPE), or None outside Slurm, in a one-task step,
      or when MPI spans the tasks.
    """
    env = os.environ if env is None else env
    if mpi_size is None and (mpi := running_mpi()) is not None:
        mpi_size = mpi.COMM_WORLD.Get_size()
    if mpi_size not in (None, 1):
        return None  # MPI spans several processes: a plug-in works
    step_tasks = _int_or_none(env.get("SLURM_STEP_NUM_TASKS"))
    if "SLURM_STEP_NUM_TASKS" not in env and "SLURM_STEP_ID" not in env:
        # Not in a job step: python run from the batch script itself, without srun.
        job_tasks = _int_or_none(env.get("SLURM_NTASKS"))
        if (job_tasks is None or job_tasks <= 1 or "SLURM_JOB_ID" not in env
                or launched_by_mpi(env)):
            return None
        return (f"Slurm job {env['SLURM_JOB_ID']} has {job_tasks} tasks (SLURM_NTASKS="
                f"{job_tasks}) but this process runs in its batch script, outside any job step, "
                f"so it is alone; run it with srun: {_SRUN_MPI_FIX}")
    if step_tasks is None or step_tasks <= 1:
        return None
    plugin = env.get("SLURM_MPI_TYPE", "")
    if mpi_size is None and launched_by_mpi(env):
        return None  # a plug-in gave this task its PMI variables; MPI is not started yet
    if plugin and plugin != "none":
        cause = f"with the MPI plug-in {plugin} (SLURM_MPI_TYPE), which this MPI library does not speak"
    elif plugin:
        cause = "with SLURM_MPI_TYPE=none, i.e. without an MPI plug-in"
    else:
        cause = ("without an MPI plug-in (no PMI variables in the environment: no `srun --mpi=...`, "
                 "no SLURM_MPI_TYPE, and the cluster's MpiDefault is none)")
    seen = ("is its own one-rank MPI world (MPI.COMM_WORLD has 1 rank here)" if mpi_size == 1
            else "would be its own one-rank MPI world, so pencilfft.initialize() started jax from "
                 "Slurm's variables and left MPI alone")
    return (f"srun started {step_tasks} tasks in this job step (SLURM_STEP_NUM_TASKS={step_tasks}) "
            f"{cause}: each task {seen}; {_SRUN_MPI_FIX}")


def slurm_step(env: Mapping[str, str]) -> bool:
    """Whether this process is one of several tasks of a SLURM job step, by the variables
    jax's SLURM detection reads (a ValueError naming SLURM_NTASKS when it is not a count)."""
    return (all(v in env for v in SLURM_VARS)
            and launcher_int(env, "SLURM_NTASKS", 1, _SLURM_WAY_OUT) > 1)


def _int_or_none(text: str | None) -> int | None:
    try:
        return int(text.strip()) if text is not None else None
    except ValueError:
        return None


def slurm_arguments(env: Mapping[str, str], overrides: dict) -> dict:
    """Arguments for jax.distributed.initialize under srun (jax's SLURM detection + devices).

    jax's SLURM detection restricts every process to device [SLURM_LOCALID]: right for one
    task per GPU with all GPUs visible, wrong for one task per node driving several GPUs
    (it would use one) and for tasks bound to their own GPUs (--gpus-per-task: the index
    may not exist).  See `placement.choose_local_device_ids`.
    """
    kwargs = dict(overrides)
    kwargs["cluster_detection_method"] = "slurm"
    if "local_device_ids" not in kwargs and "JAX_LOCAL_DEVICE_IDS" not in env:
        local_size = _slurm_tasks_on_this_node(env)
        if local_size is not None:
            visible = visible_devices(env)
            shared = None
            if visible is not None and env.get("SLURM_GPUS_ON_NODE", "").isdigit():
                # All GPUs of the node visible to each task -> shared; fewer -> bound per task.
                shared = len(visible) >= int(env["SLURM_GPUS_ON_NODE"])
            kwargs["local_device_ids"] = choose_local_device_ids(
                launcher_int(env, "SLURM_LOCALID", 0, _SLURM_WAY_OUT), local_size, visible,
                shared
            )
    return kwargs


def _slurm_tasks_on_this_node(env: Mapping[str, str]) -> int | None:
    """Number of tasks of this job step on this node, or None when SLURM does not say.

    SLURM_STEP_TASKS_PER_NODE / SLURM_TASKS_PER_NODE look like "4(x2),2": 4 tasks on each of
    the first two nodes, 2 on the third; SLURM_NODEID is this node's position in that list.
    """
    node = 0
    if "SLURM_NODEID" in env:
        node = launcher_int(env, "SLURM_NODEID", 0, _SLURM_WAY_OUT)
    for var in ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"):
        counts = _expand_tasks_per_node(env.get(var, ""))
        if counts and node < len(counts):
            return counts[node]
    per_node = env.get("SLURM_NTASKS_PER_NODE", "")
    return int(per_node) if per_node.isdigit() else None


def _expand_tasks_per_node(value: str) -> list[int]:
    """"4(x2),2" -> [4, 4, 2]; [] if the value is empty or not in that format."""
    counts: list[int] = []
    for item in filter(None, value.split(",")):
        m = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", item)
        if m is None:
            return []
        counts += [int(m.group(1))] * int(m.group(2) or 1)
    return counts

