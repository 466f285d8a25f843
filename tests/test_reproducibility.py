"""Which runs give the same bits (issue 67; docs/howto/reproducibility.md says what is promised):
the same program twice in a process, whatever the kernel; and the same program in a new process
of 8 devices, from one process or from a mesh spread over processes (mpirun), with XLA's FFT
kernel or FFTW's estimate planner.  Other meshes, layouts and chunk counts agree to rounding
only: the other test files check their values against numpy."""
from __future__ import annotations

import json
import subprocess
import sys

import jax
import numpy as np
import pytest

from conftest import MPIRUN, RANK, clean_env, make_mesh, put_global, to_numpy
from pencilfft._transforms import kernel as _kernel

HAVE_FFTW = _kernel.kernel() == "fftw"

# The program: rfftn of a seeded float32 field split over a 4x2 mesh and irfftn back, the bits
# of both as one digest.  Run here (in the suite's process: one process, or a rank of mpirun)
# and in a fresh process of 8 devices, the same text; each setting on its own shape, so that
# no program compiled under another kernel or planner earlier in the process is reused.
PROGRAM = '''
import hashlib, os
import jax, numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P
import pencilfft

SETTINGS = {"xla": ({"PENCILFFT_FFT_KERNEL": "xla"}, 24),
            "fftw-estimate": ({"PENCILFFT_FFT_KERNEL": "fftw", "PENCILFFT_FFTW_PLANNER": "estimate",
                               "PENCILFFT_THREADS": "1"}, 20)}


def digest(setting, gather):
    env, n = SETTINGS[setting]
    os.environ.update(env)
    mesh = jax.make_mesh((4, 2), ("x", "y"), axis_types=(jax.sharding.AxisType.Explicit,) * 2)
    data = np.random.default_rng(67).standard_normal((40, n)).astype(np.float32)
    x = jax.make_array_from_callback(data.shape, NamedSharding(mesh, P("x", "y")),
                                     lambda i: data[i])
    k = pencilfft.rfftn(x)
    y = pencilfft.irfftn(k, s=data.shape)
    return hashlib.sha256(gather(k).tobytes() + gather(y).tobytes()).hexdigest()
'''

CHILD = PROGRAM + '''
import json, sys
print(json.dumps({s: digest(s, np.asarray) for s in sys.argv[1:]}))
'''

SETTINGS = ["xla"] + (["fftw-estimate"] if HAVE_FFTW else [])


# Under mpirun: the same call on a mesh spread over processes, twice.
@MPIRUN
def test_the_same_call_twice_gives_the_same_bits():
    """Whatever the kernel (FFTW's measured plans included: each is planned once per process)."""
    mesh = make_mesh((4, 2))
    data = np.random.default_rng(1).standard_normal((24, 40)).astype(np.float32)
    x = put_global(data, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("x", "y")))
    import pencilfft

    first, second = (to_numpy(pencilfft.rfftn(x)) for _ in range(2))
    assert np.array_equal(first, second)


# Under mpirun: the mesh spans the processes here, and the fresh process holds all 8 devices.
@MPIRUN
def test_a_new_process_gives_the_same_bits(monkeypatch, tmp_path):
    """XLA's kernel, and FFTW with the estimate planner (where the fftw extra is installed):
    the same digest here and in a fresh process of 8 devices (one process vs mpirun, when the
    suite runs under mpirun)."""
    names: dict = {}
    exec(compile(PROGRAM, "PROGRAM", "exec"), names)  # noqa: S102 - the child's very text
    here = {}
    for setting in SETTINGS:
        with monkeypatch.context() as m:
            for key, value in names["SETTINGS"][setting][0].items():
                m.setenv(key, value)
            here[setting] = names["digest"](setting, to_numpy)
    if RANK != 0:
        return  # one fresh process is enough: rank 0 starts it
    proc = subprocess.run([sys.executable, "-c", CHILD, *SETTINGS], capture_output=True,
                          text=True, timeout=300, env=clean_env(8), cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    there = json.loads(proc.stdout.strip().splitlines()[-1])
    assert there == here
