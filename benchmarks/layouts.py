"""CPU layouts side by side: processes x devices per process, each with the exchange it takes.

    python -m benchmarks.layouts --devices 8 --shapes 128 256 --pdims 4x2 \\
        --out benchmarks/data/layouts.jsonl                        # 1 process x 8 devices
    mpirun -np 2 python -m benchmarks.layouts --devices 4 --shapes 128 256 --pdims 4x2 \\
        --out benchmarks/data/layouts.jsonl                        # 2 processes x 4 devices
    python -m benchmarks.layouts table benchmarks/data/layouts.jsonl

One JSON record per (layout, grid, exchange): forward + inverse of a complex64 grid in one
`jax.jit` (`pifft3d(pfft3d(x))`) on an Explicit mesh, the median of `--repeats` calls after
`--warmup` (every call started together after an MPI barrier under mpirun, and the largest time
over the processes), XLA's memory analysis per device, and which collectives the compiled
program holds (issue 43 asks for none: the exchanges are our custom calls).  Under mpirun every
exchange that can run is timed, interleaved round-robin: "auto" (which takes "mixed" with
several devices per process, "mpi" with one), "mpi" (every chunk through MPI, those between a
process's own devices too) and "alltoall" (XLA's collectives, gloo across processes).  In one
process: "auto" (the local exchange) and "alltoall".  The load average when the run ended is
recorded: other work on the machine slows every row.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any

COLLECTIVES = ("all-to-all", "collective-permute", "all-gather", "all-reduce")


def _args(argv):
    p = argparse.ArgumentParser(prog="python -m benchmarks.layouts", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--devices", type=int, default=8, help="CPU devices per process")
    p.add_argument("--shapes", type=int, nargs="+", default=[128, 256])
    p.add_argument("--pdims", default="4x2")
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--out", type=Path)
    return p.parse_args(argv)


def run(argv=None) -> list[dict[str, Any]]:
    args = _args(argv)
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                               f" --xla_force_host_platform_device_count={args.devices}")
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax
    import numpy as np
    from jax.sharding import AxisType

    import pencilfft
    from pencilfft._transforms import kernel as _kernel
    from pencilfft._measure import time_once

    pencilfft.initialize()
    nproc, rank = jax.process_count(), jax.process_index()
    comm = None
    if nproc > 1:
        from mpi4py import MPI

        comm = MPI.COMM_WORLD
    pdims = tuple(int(v) for v in args.pdims.split("x"))
    mesh = jax.make_mesh(pdims, ("x", "y"), axis_types=(AxisType.Explicit,) * 2)
    exchanges = ["auto", "mpi", "alltoall"] if nproc > 1 else ["auto", "alltoall"]
    records = []
    for n in args.shapes:
        shape = (n, n, n)
        rng = np.random.default_rng(0)
        data = (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(np.complex64)
        x = jax.make_array_from_callback(shape, pencilfft.real_space_sharding(mesh),
                                         lambda idx: data[idx])
        calls, info = {}, {}
        for e in exchanges:
            f = jax.jit(lambda v, e=e: pencilfft.pifft3d(pencilfft.pfft3d(v, exchange=e),
                                                         exchange=e))
            compiled = f.lower(x).compile()
            text = compiled.as_text()
            m = compiled.memory_analysis()
            info[e] = {"collectives": [c for c in COLLECTIVES if c in text],
                       "custom_calls": sorted({t for t in ("pencilfft_local_exchange",
                                                           "pencilfft_mpi_exchange")
                                               if t in text}),
                       "temp_blocks": round(m.temp_size_in_bytes / (x.nbytes / mesh.size), 3)}
            calls[e] = lambda f=f: f(x)
            back = f(x)
            err = float(np.abs(np.asarray(back.addressable_shards[0].data)
                               - data[back.addressable_shards[0].index]).max())
            if err > 1e-3:
                raise AssertionError(f"exchange={e}: forward + inverse is off by {err}")
        for call in calls.values():
            for _ in range(args.warmup):
                jax.block_until_ready(call())
        times: dict[str, list[float]] = {e: [] for e in calls}
        for _ in range(args.repeats):  # round-robin: load drifts hit every exchange alike
            for e, call in calls.items():
                if comm is not None:
                    comm.Barrier()
                times[e].append(time_once(call)[0])
        for e in calls:
            t = statistics.median(times[e])
            if comm is not None:
                t = comm.allreduce(t, op=MPI.MAX)
            records.append({
                "layout": f"{nproc} x {args.devices}", "processes": nproc,
                "devices_per_process": args.devices, "cores": len(os.sched_getaffinity(0)),
                "shape": n, "pdims": args.pdims, "exchange": e, "ms": round(1e3 * t, 2),
                "kernel": _kernel.kernel(), "loadavg": round(os.getloadavg()[0], 2), **info[e]})
    if rank == 0:
        for r in records:
            print(json.dumps(r), flush=True)
        if args.out:
            with open(args.out, "a") as fh:
                for r in records:
                    fh.write(json.dumps(r) + "\n")
    return records


def table_of(rows) -> str:
    """The RESULTS.md table of `--out`'s records: every layout beside 1 process x 8 devices."""
    ones: dict = {}
    for r in rows:  # the median over the runs of 1 x N, "auto": the reference of every row
        if r["processes"] == 1 and r["exchange"] == "auto":
            ones.setdefault((r["shape"], r["pdims"]), []).append(r["ms"])
    base = {key: statistics.median(v) for key, v in ones.items()}
    out = ["| layout (processes x devices) | grid | mesh | exchange | ms (fwd+inv) | "
           "vs 1 process, auto | collectives | temp blocks | load |",
           "|---|---|---|---|---:|---:|---|---:|---:|"]
    for r in rows:
        ref = base.get((r["shape"], r["pdims"]))
        ratio = f"{r['ms'] / ref:.2f}x" if ref else "n/a"
        out.append(f"| {r['layout']} | {r['shape']}^3 | {r['pdims']} | {r['exchange']} | "
                   f"{r['ms']:.1f} | {ratio} | {', '.join(r['collectives']) or 'none'} | "
                   f"{r['temp_blocks']:.2f} | {r['loadavg']} |")
    return "\n".join(out)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "table":
        print(table_of([json.loads(line) for p in sys.argv[2:] for line in open(p)
                        if line.strip()]))
    else:
        run(sys.argv[1:])
