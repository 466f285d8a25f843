"""How many threads pencilfft's CPU kernels use: one rule for every kernel of this process.

The FFTW kernel (`_transforms.kernel`, fftw.cc), the local exchange's copies (`_exchange.local`,
local.cc) and any later CPU kernel (a particle painter, say) ask here, so that the devices
of a process share its cores without oversubscribing them:

* `available_cores()`: the cores pencilfft may use in this process.  $PENCILFFT_THREADS if set
  (a positive integer; capped, with one warning per process, at the CPUs this process may run
  on: more threads than cores only fight over them), else the CPUs this process may run on
  (`os.sched_getaffinity`), divided by the number of processes an MPI launcher started on this
  node when the process is not bound (its affinity is the whole machine: `mpirun -np 2`
  without binding on 2 cores gives each rank 1, not 2, so the ranks do not fight over the
  cores).  A bound process (srun, mpirun --bind-to) already sees only its own cores.
* `threads_per_device()`: the threads of one call of a per-device kernel, available_cores()
  divided by the CPU devices of this process (they may all run a kernel at once), at least 1.
  One device (jax's default on a CPU): every core; 8 devices on 2 cores: 1 each.

Under an address-space limit (`ulimit -v`, RLIMIT_AS) the count, PENCILFFT_THREADS's too, is
also capped so that the threads' reservations (a stack, and the malloc arena glibc may map for
a thread) fit in a quarter of the address space left: libgomp, which runs FFTW's threads,
aborts the process when it cannot create one (seen with 16 cores under the memory test's
limit).

Environment variables are read at every call (a compiled program keeps the count it was
lowered with).  The only state kept here: which capped values were warned about (once per
process each).
"""
from __future__ import annotations

import functools
import os
import warnings

__all__ = ["available_cores", "threads_per_device", "describe"]

# MPI launchers' counts of the processes they started on this node (MPICH's and Intel MPI's
# Hydra, Open MPI; the first one set wins).  Not Slurm's SLURM_NTASKS_PER_NODE: a batch
# script's own python sees it too, and srun binds its tasks anyway.
_LOCAL_RANKS = ("MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE")


def _env_threads() -> int | None:
    text = os.environ.get("PENCILFFT_THREADS", "").strip()
    if not text:
        return None
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(f"environment variable PENCILFFT_THREADS must be a positive integer "
                         f"(the cores pencilfft's CPU kernels may use in this process); "
                         f"got {text!r}")
    return value


def _local_ranks() -> int:
    for name in _LOCAL_RANKS:
        text = os.environ.get(name, "").strip()
        if text.isdigit() and int(text) > 0:
            return int(text)
    return 1


def _affinity() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


# What one more thread may reserve in address space: its stack (glibc's default, 8 MiB) and the
# malloc arena glibc may map for it (64 MiB, reserved as 128 MiB to align it).
THREAD_BYTES = 136 << 20


def _address_space_cap() -> int | None:
    """The threads that fit under RLIMIT_AS (a quarter of what is left), None without one."""
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY or soft < 0:
        return None
    used = 0
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmSize:"):
                    used = int(line.split()[1]) * 1024
    except OSError:
        pass
    return max(1, (soft - used) // 4 // THREAD_BYTES)


def _env_cap() -> tuple[int, str]:
    """The most threads PENCILFFT_THREADS may ask for here, and why, in words."""
    cores, cap = _affinity(), _address_space_cap()
    if cap is not None and cap < cores:
        return cap, (f"the {cap} thread(s) whose stacks and malloc arenas fit in a quarter of "
                     f"the address space the limit (ulimit -v) leaves")
    return cores, f"the {cores} CPU(s) this process may run on (os.sched_getaffinity)"


@functools.cache
def _warn_capped(value: int, cap: int, why: str) -> None:
    """One warning per process for each capped value (the count is read at every lowering)."""
    warnings.warn(f"pencilfft: environment variable PENCILFFT_THREADS={value} asks for more "
                  f"threads than this process can run at once; using {cap}, {why}",
                  RuntimeWarning, stacklevel=4)


def available_cores() -> int:
    """The cores pencilfft's CPU kernels may use in this process, all devices together."""
    env = _env_threads()
    if env is not None:
        # Capped, not refused.  More threads than the cores the process may run on never help
        # these kernels (each thread computes; PENCILFFT_THREADS=1000 on 57 cores made 1057 OS
        # threads and ran 4x slower, issue 51) and, under an address-space limit, make libgomp
        # abort the process.  But a job script is often run on several kinds of node, or
        # copied from a bigger one: an HPC user expects such a job to run at the speed the node
        # allows and to be told, not to die at its first transform for a setting that costs
        # only speed.  Hence the cap and one warning naming the variable, the value and the cap.
        cap, why = _env_cap()
        if env > cap:
            _warn_capped(env, cap, why)
            return max(1, cap)
        return env
    cores = _affinity()
    if cores >= (os.cpu_count() or cores):  # not bound: the node's ranks share every core
        cores //= _local_ranks()
    cap = _address_space_cap()
    return max(1, cores if cap is None else min(cores, cap))


def local_cpu_devices() -> int:
    import jax

    try:
        return max(1, len(jax.local_devices(backend="cpu")))
    except RuntimeError:  # no CPU backend
        return 1


def threads_per_device() -> int:
    """The threads one call of a per-device CPU kernel may use: `available_cores()` shared by
    the CPU devices of this process (each may run a kernel at the same time), at least 1."""
    return max(1, available_cores() // local_cpu_devices())


def describe() -> str:
    """One line for `pencilfft check`: the cores, the devices and the threads per call."""
    env = _env_threads()
    if env is None:
        how = f"the {_affinity()} CPUs this process may run on" + (
            f", shared by {_local_ranks()} processes of this node"
            if _local_ranks() > 1 and _affinity() >= (os.cpu_count() or 1) else "")
    elif env > _env_cap()[0]:
        how = f"PENCILFFT_THREADS={env}, capped at {_env_cap()[1]}"
    else:
        how = "PENCILFFT_THREADS"
    return (f"{available_cores()} cores ({how}) for {local_cpu_devices()} CPU device(s): "
            f"{threads_per_device()} thread(s) per FFT call, {available_cores()} for the local "
            f"exchange's copies")
