"""Several processes, one CPU device each: pencilfft beside mpi4py-fft, and where the time goes.

    mpirun -np 2 python -m benchmarks.mpi --shapes 128 256 --pdims 2x1 --repeats 10 \\
        --out benchmarks/data/mpi-np2.jsonl
    python -m benchmarks.mpi table benchmarks/data/mpi-np2.jsonl

Issue 14's cluster setting (one process per core under mpirun, `pencilfft.initialize()`).  Per
grid and process grid, complex64, forward + inverse: `pencilfft/<exchange>` (auto, alltoall,
pairwise: gloo; mpi: MPI inside XLA), `mpi4py-fft` (if installed); and one exchange's bytes as a
bare `jax.lax.all_to_all`, through our MPI custom call and as `comm.Alltoall`, and the local
FFTs alone (the compute floor).  A time: the median of `--rounds` rounds of `harness.median_times`.
"""
from __future__ import annotations

import argparse
import importlib
import os
import statistics
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

import pencilfft
from benchmarks import harness, private

EXCHANGES = ("auto", "alltoall", "pairwise", "mpi")
ROWS = tuple(f"pencilfft/{e}" for e in EXCHANGES) + (
    "mpi4py-fft", "exchange: jax all_to_all", "exchange: pencilfft mpi", "exchange: MPI Alltoall",
    "local FFTs")


def mpi4py_fft_version() -> str | None:
    try:
        return importlib.import_module("mpi4py_fft").__version__
    except ImportError:
        return None


def _programs(shape: tuple[int, int, int], pdims: tuple[int, int], comm) -> dict[str, Callable]:
    """Row name -> a call that runs it once (inputs built here, outside the timing)."""
    X, Y, Z = shape
    pa, pb = pdims
    mesh = harness.make_mesh(pdims)
    rng = np.random.default_rng(comm.rank)
    block = (X // pa, Y // pb, Z)
    local = (rng.standard_normal(block) + 1j * rng.standard_normal(block)).astype(np.complex64)
    x = jax.make_array_from_callback(shape, pencilfft.real_space_sharding(mesh), lambda idx: local)
    calls: dict[str, Callable] = {}
    for exchange in EXCHANGES:
        f = jax.jit(lambda v, e=exchange: pencilfft.pifft3d(pencilfft.pfft3d(v, exchange=e),
                                                            exchange=e))
        calls[f"pencilfft/{exchange}"] = lambda f=f: f(x)
    if mpi4py_fft_version():
        calls["mpi4py-fft"] = _mpi4py_fft(comm, shape, pdims, local)

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
    calls.update(_stage_calls(x, mesh))
    return calls


def _stage_calls(x, mesh) -> dict[str, Callable]:
    """pencilfft/mpi's forward and inverse, stage by stage ("stage fwd 1: FFT over (2, 3)", ...),
    each on the block it gets in the transform; an exchange in its three parts: the pack into
    chunk-major order and the unpack after it (`transpose._chunk_major` and `_interleave`,
    through `kernel.permute` as `transpose_blocks` runs them for "mpi") around the MPI send."""
    plan = private.plan_forward(x, norm="backward", layout="transposed", mesh=mesh,
                                exchange="mpi")
    stages = private.stages_of(plan)
    spec = P(tuple(mesh.axis_names))
    # Every device's block as one row of a global array: any block shape, B = 1 per device.
    blocks = jax.jit(jax.shard_map(lambda v: v[None], mesh=mesh, in_specs=P("x", "y"),
                                   out_specs=spec))(x)

    def program(fn):
        def body(b):
            with private.in_mesh(mesh):
                return fn(b)
        return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=spec, out_specs=spec))

    def pieces(stage):
        """(label, function) of one stage: an mpi exchange as pack, send, unpack."""
        if not isinstance(stage, private.Exchange):
            axes = getattr(stage, "axes", None)
            name = getattr(stage, "name", type(stage).__name__)
            return [(name + (f" over {axes}" if axes else ""), stage.forward)]
        e, n = stage, stage.n

        def pack(b):
            return private.chunk_major(b, n, e.split, e.order, private.kernel.permute)

        def send(y):
            return private.ALGORITHMS["mpi"].send(y, e.axis_name, n)

        def unpack(y):
            chunked = [0] * len(e.order)  # the block's lengths before the exchange gathered
            for i, ax in enumerate(e.order):
                chunked[ax] = y.shape[1 + i]
            return private.interleave(y, e.gather, e.order, chunked, chunked[e.gather] * n,
                                      private.kernel.permute)

        return [(f"pack for the exchange over {e.axis_name}", pack),
                (f"MPI send over {e.axis_name}", send), ("unpack", unpack)]

    calls: dict[str, Callable] = {}
    for direction, seq in (("fwd", stages), ("inv", tuple(s.inverse() if isinstance(
            s, private.Exchange) else _Backward(s) for s in reversed(stages)))):
        b = blocks
        i = 0
        for stage in seq:
            for label, fn in pieces(stage):
                i += 1
                f = program(fn)
                arg = b
                calls[f"stage {direction} {i}: {label}"] = lambda f=f, arg=arg: f(arg)
                b = f(b)
    return calls


class _Backward:
    """A stage's backward map as a forward one (for `_stage_calls`)."""

    def __init__(self, stage):
        self.stage = stage
        self.axes = getattr(stage, "axes", None)
        self.name = f"inverse {type(stage).__name__}"

    def forward(self, k):
        return self.stage.backward(k)


def _mpi4py_fft(comm, shape, pdims, local) -> Callable[[], None]:
    from mpi4py_fft import PFFT, newDistArray

    plan = PFFT(comm, shape, axes=(0, 1, 2), dtype=np.complex64,
                grid=pdims if pdims[1] > 1 else pdims[:1], backend="fftw")
    u, uh = newDistArray(plan, False), newDistArray(plan, True)
    u[:] = local[: u.shape[0], : u.shape[1], : u.shape[2]]

    def call():
        plan.forward(u, uh)
        plan.backward(uh, u)

    return call


def _mpi_call(mesh, name: str, n: int, x) -> Callable:
    """One exchange of x's block through our MPI custom call (the all_to_all row's bytes)."""
    def body(b):
        with private.in_mesh(mesh):
            return private.mpi_exchange(b.reshape((n, -1)), name, n).reshape(b.shape)

    f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("x", "y"), out_specs=P("x", "y")))
    return lambda: f(x)


def run(args: argparse.Namespace, ctx: dict[str, Any]) -> Iterator[list[dict[str, Any]]]:
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    if (hint := private.srun_mpi_hint(comm.size)) is not None:  # srun without an MPI plug-in
        raise SystemExit(f"benchmarks.mpi needs MPI across the tasks: {hint}")
    if jax.local_device_count() != 1:
        raise SystemExit(f"benchmarks.mpi wants one device per process; this one has "
                         f"{jax.local_device_count()} (unset XLA_FLAGS' device count)")
    for shape in args.shapes:
        for pdims in args.pdims or [(comm.size, 1)]:
            if pdims[0] * pdims[1] != comm.size:
                raise SystemExit(f"--pdims {pdims[0]}x{pdims[1]} needs {pdims[0] * pdims[1]} "
                                 f"processes; MPI.COMM_WORLD has {comm.size} (mpirun -np N, or "
                                 f"srun -n N --mpi=pmi2)")
            times = harness.median_times(_programs(shape, pdims, comm), args.repeats, args.warmup,
                                         comm, args.rounds)
            yield [{"row": name, "shape": list(shape), "pdims": list(pdims), "processes": comm.size,
                    "dtype": "complex64", "median_ms": 1e3 * statistics.median(t),
                    "repeats": args.repeats, "rounds": args.rounds,
                    "malloc": {k: v for k, v in os.environ.items() if k.startswith("MALLOC_")},
                    **harness.stamp(ctx), "versions": {**ctx["versions"],
                                                       "mpi4py_fft": mpi4py_fft_version()}}
                   for name, t in times.items()]


def table(records: Sequence[dict]) -> str:
    """Markdown: one row per measurement, one column per grid and process grid."""
    cases = list(dict.fromkeys((tuple(r["shape"]), tuple(r["pdims"])) for r in records))
    by = {(tuple(r["shape"]), tuple(r["pdims"]), r["row"]): r["median_ms"] for r in records}
    rows = []
    stage_rows = [r["row"] for r in records if r["row"].startswith("stage ")]
    for row in (*ROWS, *dict.fromkeys(stage_rows)):
        if not any((s, p, row) in by for s, p in cases):
            continue
        cells = []
        for s, p in cases:
            ms, ref = by.get((s, p, row)), by.get((s, p, "mpi4py-fft"))
            ratio = f" ({ms / ref:.2f}x)" if ms is not None and ref and row.startswith("pencilfft/") else ""
            cells.append("—" if ms is None else f"{ms:.3g}{ratio}")
        rows.append([row] + cells)
    return harness.md_table(["", *(f"{s[0]}^3, {p[0]}x{p[1]}" for s, p in cases)], rows,
                            "l" + "r" * len(cases))


OPTIONS = dict(shapes=["128"], pdims=dict(default=None, type=harness.parse_pxq, help=(
    "process grids PxQ (default: Nx1, a slab over all processes)")), repeats=10, warmup=2, out=None)


def add_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--rounds", type=int, default=3, help="round-robin rounds (median of them)")


TABLES = {"mpi": table}


if __name__ == "__main__":
    sys.exit(harness.main(sys.modules[__name__]))
