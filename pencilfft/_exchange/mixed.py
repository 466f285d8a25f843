"""The exchange of a job of several processes that each hold several CPU devices ("mixed").

jax's cross-process CPU collectives go through gloo over TCP, and "mpi" alone would also send
the chunks that stay inside a process through MPI.  "mixed" decides per mesh axis, when the
per-device body is traced on its mesh (so the same on every process, and on the
compiler-partitioned path too): an axis whose every group of devices lies in one process
exchanges through shared memory (`local`, the whole transpose in one pass); an axis whose groups
span processes exchanges through MPI inside XLA (`mpi`: point-to-point messages, the chunks
between two devices of one process included, which MPI copies within the process).  No XLA
collective is left in the program.  This is what one process per node driving its cores as
devices, under mpirun or srun, gets from exchange="auto".
"""
from __future__ import annotations

import jax

from . import local, mpi
from ._common import traced_mesh, within_processes

__all__ = ["auto", "status", "unavailable_reason", "uses_local"]


def unavailable_reason(mesh_size: int | None, platform: str) -> str | None:
    """Why "mixed" cannot run (None: it can).  The same answer on every process of a job."""
    if platform != "cpu":
        return f"it runs on CPU devices only (the devices are {platform})"
    if jax.process_count() == 1:
        return "the job is one process (exchange='local' is the exchange between its devices)"
    return mpi.unavailable_reason(mesh_size, platform) or local.build_failure()


def auto(platform: str) -> bool:
    """Whether exchange="auto" takes it: several processes of several CPU devices each."""
    return (platform == "cpu" and jax.process_count() > 1 and jax.local_device_count() > 1
            and unavailable_reason(None, platform) is None)


def uses_local(axis_name: str) -> bool:
    """Inside the per-device body being traced: whether the exchange along `axis_name` stays
    inside processes (then `local`, else `mpi`)."""
    return within_processes(traced_mesh(), axis_name)


def status(platform: str | None = None) -> str:
    """One line for `pencilfft check`."""
    why = unavailable_reason(None, platform or jax.default_backend())
    if why is None:
        return ("mixed: the local exchange along mesh axes inside a process, MPI inside XLA "
                "along the others (exchange='auto' and 'mixed')")
    return f"not mixed ({why})"
