"""Child processes for tests/test_agree.py: ranks started with different environments.

    mpirun -np 1 python agree_child.py : -np 1 -env JAX_ENABLE_X64 1 python agree_child.py

Each rank builds the same complex128 data as a global array (complex64 where JAX_ENABLE_X64
is off), calls the N-D names on it, eagerly and under jax.jit, and prints what each call raised
as lines "REPORT <json>" on stdout.  Before issue 68 both ranks passed the agreement and waited
in the exchanges forever (the parent's time-out ends that).
"""
from __future__ import annotations

import json

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

import pencilfft
from pencilfft._processes.agree import DifferentPlansError


def _report(**values) -> None:
    print("REPORT " + json.dumps(values), flush=True)


def main() -> None:
    pencilfft.initialize()
    rank = jax.process_index()
    n = len(jax.devices())
    mesh = jax.make_mesh((n // 2, 2), ("x", "y"))
    data = np.zeros((8, 8, 16), np.complex128)
    x = jax.make_array_from_callback(data.shape, NamedSharding(mesh, P("x", "y")),
                                     lambda index: data[index])
    for name, call in (("fftn", pencilfft.fftn), ("jit(ifftn)", jax.jit(pencilfft.ifftn))):
        try:
            call(x).block_until_ready()
            _report(rank=rank, call=name, error=None)
        except DifferentPlansError as e:
            _report(rank=rank, call=name, x64=bool(jax.config.jax_enable_x64), error=str(e))


if __name__ == "__main__":
    main()
