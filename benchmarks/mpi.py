"""Several processes, one CPU device each: pencilfft beside mpi4py-fft, and where the time goes.

    mpirun -np 2 python -m benchmarks.mpi --shapes 128 256 --pdims 2x1 --repeats 10 \\
        --out benchmarks/data/mpi-np2.jsonl
    python -m benchmarks.mpi table benchmarks/data/mpi-np2.jsonl      # the RESULTS.md table

The CPU-cluster setting of issue 14: one process per core, launched by mpirun, each process one
jax CPU device (`pencilfft.initialize()`; cross-process collectives are gloo's, jax's default).
For each grid and process grid PxQ (X split P ways, Y Q ways), complex64, on the same processes
in one run, interleaved round-robin so that load drifts hit every row alike:

* `pencilfft/<exchange>`: `jax.jit(lambda v: pifft3d(pfft3d(v)))` (forward + inverse), for
  `exchange` auto, alltoall, pairwise (jax's gloo collectives across processes) and mpi (MPI
  inside XLA, our custom call, issue 37; "auto" picks it here when it is built);
* `mpi4py-fft`: `PFFT(comm, shape, axes=(0, 1, 2), grid=(P, Q), backend="fftw")`, `forward`
  then `backward` (only if mpi4py_fft is installed; it needs FFTW);
and the breakdown of one exchange and of the local work:
* `exchange: jax all_to_all`: one `jax.lax.all_to_all` of the per-device block over the mesh
  axis of the first exchange (what a pencilfft exchange sends, without its local reordering);
* `exchange: pencilfft mpi`: the same bytes through our custom call in a jit program
  (chunk-major block, no reordering);
* `exchange: MPI Alltoall`: `comm.Alltoall` of the same bytes between the same processes;
* `local FFTs`: forward + inverse FFTs of lengths Z, Y, X over one per-device block with no
  data movement (the compute floor of the transform).

A time is the median over `--repeats` calls after `--warmup`, every call started together
(a barrier before it), and the largest over the processes.  One JSON record per row, with the
load average when the run ended (others may share the cores) and glibc's malloc settings.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
from collections.abc import Callable, Sequence
from typing import Any

from benchmarks import harness

EXCHANGES = ("auto", "alltoall", "pairwise", "mpi")
ROWS = tuple(f"pencilfft/{e}" for e in EXCHANGES) + (
    "mpi4py-fft", "exchange: jax all_to_all", "exchange: pencilfft mpi", "exchange: MPI Alltoall",
    "local FFTs")


def _timer(comm, repeats: int, warmup: int) -> Callable[[Callable[[], Any]], float]:
    """Median seconds of a call, every call started after a barrier, max over the processes."""
    import jax
    from mpi4py import MPI

    from pencilfft._measure import time_once

    def timed(call: Callable[[], Any]) -> float:
        for _ in range(warmup):
            jax.block_until_ready(call())
        times = []
        for _ in range(repeats):
            comm.Barrier()
            times.append(time_once(call)[0])
        return comm.allreduce(statistics.median(times), op=MPI.MAX)

    return timed


def _programs(shape: tuple[int, int, int], pdims: tuple[int, int], comm) -> dict[str, Callable]:
    """Row name -> a call that runs it once (inputs built here, outside the timing)."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import AxisType, PartitionSpec as P

    import pencilfft

    X, Y, Z = shape
    pa, pb = pdims
    mesh = jax.make_mesh(pdims, ("x", "y"), axis_types=(AxisType.Explicit,) * 2)
    sharding = pencilfft.real_space_sharding(mesh)
    rng = np.random.default_rng(comm.rank)
    block = (X // pa, Y // pb, Z)
    local = (rng.standard_normal(block) + 1j * rng.standard_normal(block)).astype(np.complex64)
    x = jax.make_array_from_callback(shape, sharding, lambda idx: local)
    calls: dict[str, Callable] = {}
    for exchange in EXCHANGES:
        f = jax.jit(lambda v, e=exchange: pencilfft.pifft3d(pencilfft.pfft3d(v, exchange=e),
                                                            exchange=e))
        calls[f"pencilfft/{exchange}"] = lambda f=f: f(x)

    try:
        from mpi4py_fft import PFFT, newDistArray
    except ImportError:
        pass
    else:
        grid = (pa, pb) if pb > 1 else (pa,)
        plan = PFFT(comm, shape, axes=(0, 1, 2), dtype=np.complex64, grid=grid, backend="fftw")
        u = newDistArray(plan, False)
        u[:] = local[: u.shape[0], : u.shape[1], : u.shape[2]]
        uh = newDistArray(plan, True)

        def mpi4py_fft():
            plan.forward(u, uh)
            plan.backward(uh, u)

        calls["mpi4py-fft"] = mpi4py_fft

    # One exchange: over "y" for pencils (the first one), over "x" for slabs.
    name, n = ("y", pb) if pb > 1 else ("x", pa)
    a2a = jax.jit(jax.shard_map(lambda b: jax.lax.all_to_all(b, name, 2, 2, tiled=True),
                                mesh=mesh, in_specs=P("x", "y"), out_specs=P("x", "y")))
    calls["exchange: jax all_to_all"] = lambda: a2a(x)
    calls["exchange: pencilfft mpi"] = _mpi_call(mesh, name, n, x)
    coords = np.argwhere(mesh.devices == jax.local_devices()[0])[0]
    sub = comm.Split(color=int(coords[0] if name == "y" else coords[1]), key=comm.rank)
    send = np.ascontiguousarray(local.reshape(block[:2] + (n, Z // n)).transpose(2, 0, 1, 3))
    recv = np.empty_like(send)
    calls["exchange: MPI Alltoall"] = lambda: sub.Alltoall(send, recv)

    lb = jnp.asarray(local)

    @jax.jit
    def ffts(b):
        for length in (Z, Y, X):  # rows of each FFT's length: a free reshape, no transpose
            b = jnp.fft.ifft(jnp.fft.fft(b.reshape(-1, length), axis=-1), axis=-1)
        return b.reshape(block)

    calls["local FFTs"] = lambda: ffts(lb)
    return calls


def _mpi_call(mesh, name: str, n: int, x) -> Callable:
    """One exchange of x's per-device block through our custom call (chunk-major: the block
    split along its first axis, which holds the same bytes as the all_to_all row's)."""
    import jax
    from jax.sharding import PartitionSpec as P

    from pencilfft import _exchange
    from pencilfft._exchange import mpi as _mpi_exchange

    def body(b):
        with _exchange.in_mesh(mesh):
            return _mpi_exchange.exchange(b.reshape((n, -1)), name, n).reshape(b.shape)

    f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("x", "y"), out_specs=P("x", "y")))
    return lambda: f(x)


def run(args: argparse.Namespace) -> int:
    import pencilfft

    pencilfft.initialize()
    import jax
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    if jax.local_device_count() != 1:
        raise SystemExit(f"benchmarks.mpi wants one device per process; this one has "
                         f"{jax.local_device_count()} (unset XLA_FLAGS' device count)")
    timed = _timer(comm, args.repeats, args.warmup)
    versions = {"jax": jax.__version__, "pencilfft": pencilfft.__version__}
    try:
        import mpi4py_fft
        versions["mpi4py_fft"] = mpi4py_fft.__version__
    except ImportError:
        pass
    records = []
    for n in args.shapes:
        shape = (n, n, n)
        for pdims in args.pdims:
            if pdims[0] * pdims[1] != comm.size:
                raise SystemExit(f"--pdims {pdims[0]}x{pdims[1]} needs {pdims[0] * pdims[1]} "
                                 f"processes; mpirun started {comm.size}")
            calls = _programs(shape, pdims, comm)
            times: dict[str, list[float]] = {name: [] for name in calls}
            for _ in range(args.rounds):  # round-robin: drifting load hits every row alike
                for name, call in calls.items():
                    times[name].append(timed(call))
            for name in calls:
                records.append(dict(
                    row=name, shape=list(shape), pdims=list(pdims), processes=comm.size,
                    dtype="complex64", median_ms=1e3 * statistics.median(times[name]),
                    repeats=args.repeats, rounds=args.rounds, versions=versions,
                    machine=platform.node(), cores=os.cpu_count(),
                    date=datetime.date.today().isoformat(), command=" ".join(sys.argv),
                    load=os.getloadavg()[0], malloc={k: v for k, v in os.environ.items()
                                                     if k.startswith("MALLOC_")}))
    if comm.rank == 0:
        for r in records:
            line = json.dumps(r)
            print(line)
            if args.out:
                with open(args.out, "a") as f:
                    f.write(line + "\n")
    return 0


def table(records: Sequence[dict]) -> str:
    """Markdown: one row per measurement, one column per grid and process grid."""
    cases = list(dict.fromkeys((tuple(r["shape"]), tuple(r["pdims"])) for r in records))
    by = {(tuple(r["shape"]), tuple(r["pdims"]), r["row"]): r["median_ms"] for r in records}
    head = ["", *(f"{s[0]}^3, {p[0]}x{p[1]}" for s, p in cases)]
    lines = ["| " + " | ".join(head) + " |", "|---" + "|---:" * len(cases) + "|"]
    for row in ROWS:
        if not any((s, p, row) in by for s, p in cases):
            continue
        cells = []
        for s, p in cases:
            ms = by.get((s, p, row))
            ref = by.get((s, p, "mpi4py-fft"))
            if ms is None:
                cells.append("—")
            elif ref and row.startswith("pencilfft/"):
                cells.append(f"{ms:.3g} ({ms / ref:.2f}x)")
            else:
                cells.append(f"{ms:.3g}")
        lines.append(f"| {row} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["table"]:
        p = argparse.ArgumentParser(prog="python -m benchmarks.mpi table")
        p.add_argument("file")
        print(table(harness.load_records([p.parse_args(argv[1:]).file])))
        return 0
    p = argparse.ArgumentParser(prog="python -m benchmarks.mpi", description=__doc__.split("\n")[0])
    p.add_argument("--shapes", type=int, nargs="+", default=[128])
    p.add_argument("--pdims", type=harness.parse_pxq, nargs="+", default=None,
                   help="process grids PxQ (default: Nx1, a slab over all processes)")
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3, help="round-robin rounds (median of them)")
    p.add_argument("--out", default=None, help="append JSON lines here (rank 0)")
    args = p.parse_args(argv)
    if args.pdims is None:
        from mpi4py import MPI

        args.pdims = [(MPI.COMM_WORLD.size, 1)]
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
