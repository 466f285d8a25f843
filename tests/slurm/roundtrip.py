"""A job step of tests/slurm/jobs.py: srun -n 2, one CPU device per task, as slurm/cpu.slurm.

A forward and inverse pencil FFT of a 32^3 grid over the two tasks, compared with numpy's; the
compiled program is searched for the MPI exchange's custom call; then every task ends with a
clean sys.exit(0), which must stay a clean end of the job (exit status 0).  Prints one line
"REPORT <json>" per task.
"""
from __future__ import annotations

import json
import sys
import time

import pencilfft

pencilfft.initialize()

import jax  # noqa: E402
import numpy as np  # noqa: E402

from pencilfft._exchange import mpi as mpi_exchange  # noqa: E402

mesh = jax.make_mesh((1, jax.process_count()), ("x", "y"))
data = np.random.default_rng(0).standard_normal((32, 32, 32)).astype(np.complex64)
x = pencilfft.scatter(data if jax.process_index() == 0 else None, mesh)
roundtrip = jax.jit(lambda v: pencilfft.pifft3d(pencilfft.pfft3d(v)))
hlo = roundtrip.lower(x).compile().as_text()
k = pencilfft.gather(jax.jit(pencilfft.pfft3d)(x))
back = pencilfft.gather(roundtrip(x))
report = dict(rank=jax.process_index(), processes=jax.process_count(),
              mpi_exchange_in_program=mpi_exchange.TARGET in hlo,
              exchange_status=mpi_exchange.status(), ending_at=time.time())
if back is not None:
    report["roundtrip_error"] = float(np.abs(back - data).max())
    report["forward_error"] = float(np.abs(k - np.moveaxis(np.fft.fftn(data), 0, -1)).max()
                                    / np.abs(k).max())
print("REPORT " + json.dumps(report), flush=True)
sys.exit(0)
