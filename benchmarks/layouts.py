"""CPU layouts side by side: processes x devices per process, each with the exchange it takes.

    python -m benchmarks.layouts --devices 8 --shapes 128 256 --pdims 4x2 --out benchmarks/data/layouts.jsonl
    mpirun -np 2 python -m benchmarks.layouts --devices 4 --shapes 128 256 --pdims 4x2 \\
        --out benchmarks/data/layouts.jsonl

Forward + inverse in one jit on an Explicit mesh per exchange that can run ("auto", "alltoall";
under mpirun also "mpi"), in the harness's loop (a barrier before each call under mpirun, the
slowest process counted), with XLA's temporaries and the collectives the program holds.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
from typing import Any

import jax
import numpy as np

import pencilfft
from benchmarks import harness, private

COLLECTIVES = ("all-to-all", "collective-permute", "all-gather", "all-reduce")
CUSTOM_CALLS = ("pencilfft_local_exchange", "pencilfft_mpi_exchange")


def run_case(shape, pdims: tuple[int, int], args: argparse.Namespace, ctx: dict[str, Any]) -> list[dict]:
    comm = None
    if jax.process_count() > 1:
        from mpi4py import MPI

        comm = MPI.COMM_WORLD
    mesh = harness.make_mesh(pdims)
    rng = np.random.default_rng(0)
    data = (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(np.complex64)
    x = jax.make_array_from_callback(shape, pencilfft.real_space_sharding(mesh), lambda idx: data[idx])
    calls, info = {}, {}
    for e in ["auto", "mpi", "alltoall"] if comm else ["auto", "alltoall"]:
        f = jax.jit(lambda v, e=e: pencilfft.pifft3d(pencilfft.pfft3d(v, exchange=e), exchange=e))
        compiled = f.lower(x).compile()
        text = compiled.as_text()
        info[e] = {"collectives": [c for c in COLLECTIVES if c in text],
                   "custom_calls": sorted(t for t in CUSTOM_CALLS if t in text),
                   "temp_blocks": round(compiled.memory_analysis().temp_size_in_bytes
                                        / (x.nbytes / mesh.size), 3)}
        calls[e] = lambda f=f: f(x)
        shard = f(x).addressable_shards[0]
        err = float(np.abs(np.asarray(shard.data) - data[shard.index]).max())
        if err > 1e-3:
            raise AssertionError(f"exchange={e}: forward + inverse is off by {err}")
    return [{"layout": f"{jax.process_count()} x {jax.local_device_count()}",
             "processes": jax.process_count(), "devices_per_process": jax.local_device_count(),
             "cores": len(os.sched_getaffinity(0)), "shape": shape[0], "pdims": harness.fmt_dims(pdims),
             "exchange": e, "ms": round(1e3 * t[0], 2), "kernel": private.kernel.kernel(),
             "loadavg": harness.loadavg(), **info[e]}
            for e, t in harness.median_times(calls, args.repeats, args.warmup, comm).items()]


def table_of(rows) -> str:
    """The RESULTS.md table of the records: every layout beside 1 process x N devices."""
    ones: dict = {}
    for r in rows:  # the median over the runs of 1 x N, "auto": the reference of every row
        if r["processes"] == 1 and r["exchange"] == "auto":
            ones.setdefault((r["shape"], r["pdims"]), []).append(r["ms"])
    base = {key: statistics.median(v) for key, v in ones.items()}
    body = []
    for r in rows:
        ref = base.get((r["shape"], r["pdims"]))
        body.append([r["layout"], f"{r['shape']}^3", r["pdims"], r["exchange"], f"{r['ms']:.1f}",
                     f"{r['ms'] / ref:.2f}x" if ref else "n/a",
                     ", ".join(r["collectives"]) or "none", f"{r['temp_blocks']:.2f}", r["loadavg"]])
    return harness.md_table(["layout (processes x devices)", "grid", "mesh", "exchange",
                             "ms (fwd+inv)", "vs 1 process, auto", "collectives", "temp blocks",
                             "load"], body, "llllrrlrr")


OPTIONS = dict(devices=8, shapes=["128", "256"], pdims=dict(default=["4x2"], type=harness.parse_pxq),
               repeats=10, warmup=2, out=None)
TABLES = {"layouts": table_of}


if __name__ == "__main__":
    sys.exit(harness.main(sys.modules[__name__]))
