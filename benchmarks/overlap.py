"""The network hidden behind the FFT (issue 66): pipelined stages against today's, across nodes
whose link is the bottleneck, beside mpi4py-fft.

    python -m benchmarks.overlap --nodes 2 4 --shape 256 --out benchmarks/data/overlap.jsonl
    python -m benchmarks.overlap table benchmarks/data/overlap.jsonl

As root: a cluster of namespace nodes on this machine (tests/multinode/cluster.sh: one core a
node where there are enough, a private Slurm), and for each node count, mesh and link rate one
job `srun -N n -n n --mpi=pmi2` of this module's `child` part (one process a node, one CPU device
each, complex64, forward + inverse), its link limited with `tc` (a token bucket, 1 MB burst,
both ways on every node's veth).  The rates: unlimited first, where the round trip T0 is
CPU-bound (FFTs, packs and the TCP stack) and the bytes a node receives per round trip are
counted (on its eth0, /proc/net/dev); then Rb, the rate at which those bytes take T0 on the
wire, and `--factors` of it (default 2, 1, 1/2: the link time below, at and above T0).

The child times, interleaved (`harness.median_times`, median of --repeats, --rounds rounds):

* `today`: pfft3d/pifft3d with `pipeline=False` (chunks "auto", as before issue 66);
* `chunked`: `pipeline=False, chunks=P` (the same pieces, one at a time);
* `pipelined`: `pipeline=True, chunks=P` (P: --pieces, default what "auto" takes: pieces of
  about 512 KiB, `plan.pipeline_pieces`);
* `pipelined, N pieces` for each N of --compare-pieces (default 16), and `pipelined, poll U us`
  for each U of --compare-polls (the MPI progress thread's interval, `mpi.poll_interval_us`);
* `mpi4py-fft` (if installed; its own FFTW plans and MPI Alltoallw);
* `exchange alone`: one exchange of the whole block through pencilfft's MPI custom call (the
  rate it reaches against the link's: no storm of small messages).

MPI crosses the bridge over TCP (FI_PROVIDER=tcp: libfabric would take shared memory between
namespaces of one machine; `pencilfft.initialize()` picks MPICH's OFI layer under srun).  The
table gives, per case and rate, the link floor (bytes received per round trip / rate), each
row's median, the pipelined time over max(link floor, T0) and over today's and mpi4py-fft's;
`table` adds what each program holds per device beside its input and output (XLA's
`memory_analysis().temp_size_in_bytes`, in MiB and in pieces) and the compared rows.  Nothing
is asserted: it measures.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from benchmarks import harness

ROOT = Path(__file__).resolve().parents[1]
CLUSTER = ROOT / "tests" / "multinode" / "cluster.sh"
ROWS = ("today", "chunked", "pipelined", "mpi4py-fft", "exchange alone")
USES_JAX = False  # the parent drives the cluster; each child is a task of a job


def _link_bytes() -> int:
    with open("/proc/net/dev") as f:
        for line in f:
            name, _, fields = line.partition(":")
            if name.strip() == "eth0":
                return int(fields.split()[0])
    return 0


def child(args: argparse.Namespace, ctx: dict[str, Any]) -> Iterator[list[dict[str, Any]]]:
    """One task of a job: the rows, timed together; rank 0 prints them."""
    import jax
    import numpy as np
    from jax.sharding import PartitionSpec as P

    import pencilfft
    from benchmarks import mpi as mpi_bench
    from pencilfft._exchange import mpi
    from pencilfft._transforms import plan

    harness.start(args)
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    ctx = harness.context("benchmarks.overlap", sys.argv[1:])
    shape, pdims = args.shapes[0], args.pdims_child
    mesh = harness.make_mesh(pdims)
    x = harness.make_input(shape, pencilfft.real_space_sharding(mesh), "complex64", 0)

    block = math.prod(shape) * 8 // comm.size  # bytes per device (complex64)
    pieces = (plan.pipeline_pieces(block, max(pdims)) if args.pieces == "auto"  # as "auto"
              else int(args.pieces))
    temps: dict[str, int] = {}

    def roundtrip(row, **kw):
        f = jax.jit(lambda v: pencilfft.pifft3d(pencilfft.pfft3d(v, exchange="mpi", **kw),
                                                exchange="mpi", **kw))
        temps[row] = f.lower(x).compile().memory_analysis().temp_size_in_bytes
        return lambda: jax.block_until_ready(f(x))

    def polled(f, us):
        def call():
            before = mpi.poll_interval_us(us)
            try:
                return f()
            finally:
                mpi.poll_interval_us(before)
        return call

    calls = {"today": roundtrip("today", pipeline=False),
             "chunked": roundtrip("chunked", pipeline=False, chunks=pieces),
             "pipelined": roundtrip("pipelined", pipeline=True, chunks=pieces)}
    for other in args.compare_pieces:  # the same pipeline in other piece counts
        calls[f"pipelined, {other} pieces"] = roundtrip(f"pipelined, {other} pieces",
                                                        pipeline=True, chunks=other)
    for us in args.compare_polls:  # the progress thread's interval (mpi.cc)
        calls[f"pipelined, poll {us} us"] = polled(
            roundtrip(f"pipelined, poll {us} us", pipeline=True, chunks=pieces), us)
    local = np.asarray(x.addressable_data(0))
    if mpi_bench.mpi4py_fft_version():
        calls["mpi4py-fft"] = mpi_bench._mpi4py_fft(comm, shape, pdims, local)
    name, n = ("y", pdims[1]) if pdims[1] > 1 else ("x", pdims[0])
    one = mpi_bench._mpi_call(mesh, name, n, x)
    calls["exchange alone"] = lambda: jax.block_until_ready(one())
    # Bytes this node receives per round trip (once, outside the timing).
    calls["today"]()
    comm.Barrier()
    before = _link_bytes()
    comm.Barrier()
    calls["today"]()
    comm.Barrier()
    received = max(comm.allgather(_link_bytes() - before))
    comm.Barrier()
    before = _link_bytes()
    comm.Barrier()
    calls["exchange alone"]()
    comm.Barrier()
    exchanged = max(comm.allgather(_link_bytes() - before))
    times = harness.median_times(calls, args.repeats, args.warmup, comm, args.rounds)
    records = [{"row": row, "shape": list(shape), "pdims": list(pdims), "processes": comm.size,
                "pieces": pieces, "rate": args.rate, "median_s": statistics.median(t),
                "temp_bytes": temps.get(row), "block_bytes": block,
                "rounds_s": t, "bytes_per_roundtrip": received, "bytes_per_exchange": exchanged,
                **harness.stamp(ctx)} for row, t in times.items()]
    if comm.rank == 0:
        print("RECORDS " + json.dumps(records), flush=True)
    return iter(())


class Cluster:
    """tests/multinode/cluster.sh's cluster, up for the run and down however it ends."""

    def __init__(self, nodes: int):
        out = subprocess.run(["bash", str(CLUSTER), "up", str(nodes)], capture_output=True,
                             text=True, timeout=120)
        if out.returncode:
            raise SystemExit(f"the cluster did not come up:\n{out.stdout}\n{out.stderr}")
        self.env = dict(line.split("=", 1) for line in out.stdout.splitlines() if "=" in line)
        self.dir = self.env["MN_DIR"]

    def limit(self, rate: str) -> None:
        subprocess.run(["bash", str(CLUSTER), "limit", self.dir, rate], check=True, timeout=60)

    def job(self, nodes: int, argv: Sequence[str], timeout: float) -> subprocess.CompletedProcess:
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("SLURM_", "PMI_", "MPICH_", "UCX_", "FI_", "XLA_"))}
        env.update(SLURM_CONF=self.env["SLURM_CONF"], JAX_PLATFORMS="cpu", FI_PROVIDER="tcp",
                   XLA_FLAGS="--xla_force_host_platform_device_count=1", PYTHONPATH=str(ROOT),
                   PATH=f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}")
        command = (f"cd {shlex.quote(str(ROOT))} && srun -N {nodes} -n {nodes} --mpi=pmi2 "
                   f"--kill-on-bad-exit=1 {shlex.join([sys.executable, *argv])}")
        return subprocess.run([self.env["MN_EXEC"], "node1", command], env=env,
                              capture_output=True, text=True, timeout=timeout)

    def down(self) -> None:
        subprocess.run(["bash", str(CLUSTER), "down", self.dir], timeout=120)


def _bits(rate_bps: float) -> str:
    return f"{max(int(rate_bps // 1e6), 1)}mbit"


def run(args: argparse.Namespace, ctx: dict[str, Any]) -> Iterator[list[dict[str, Any]]]:
    """For each node count: a cluster, then each mesh at each rate, a job of `child`."""
    if os.geteuid() != 0:
        raise SystemExit("benchmarks.overlap needs root (network namespaces, tc, Slurm)")
    # SIGTERM (a kill, a batch system's end) unwinds like Ctrl-C: the cluster comes down.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    for nodes in args.nodes:
        meshes = [(nodes, 1)] + ([(2, nodes // 2)] if nodes >= 4 else [])
        cluster = Cluster(nodes)
        try:
            for pdims in meshes:
                def job(rate_label: str) -> list[dict[str, Any]]:
                    argv = ["-m", "benchmarks.overlap", "child", "--shapes",
                            harness.fmt_dims(args.shapes[0]), "--pdims-child",
                            harness.fmt_dims(pdims), "--pieces", str(args.pieces),
                            "--repeats", str(args.repeats), "--rounds", str(args.rounds),
                            "--rate", rate_label,
                            "--compare-pieces", *map(str, args.compare_pieces),
                            "--compare-polls", *map(str, args.compare_polls)]
                    harness.say(args, f"{nodes} nodes, {harness.fmt_dims(pdims)}, link "
                                      f"{rate_label} ...")
                    done = cluster.job(nodes, argv, args.timeout)
                    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("RECORDS ")]
                    if done.returncode or not lines:
                        raise SystemExit(f"the job failed (exit {done.returncode}):\n"
                                         f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
                    records = json.loads(lines[-1][len("RECORDS "):])
                    for r in records:
                        r.update(nodes=nodes, command=f"python -m benchmarks.overlap "
                                 f"{' '.join(sys.argv[1:])}")
                    return records

                cluster.limit("none")
                free = job("unlimited")
                yield free
                t0 = next(r["median_s"] for r in free if r["row"] == "today")
                rb = free[0]["bytes_per_roundtrip"] * 8 / t0
                for factor in args.factors:
                    rate = _bits(rb * factor)
                    cluster.limit(rate)
                    records = job(rate)
                    for r in records:
                        r.update(rb_bps=rb, factor=factor, t0_s=t0)
                    yield records
                cluster.limit("none")
        finally:
            cluster.down()


def _rate_bps(label: str) -> float | None:
    return None if label == "unlimited" else float(label[:-4]) * 1e6


def table(records: Sequence[dict]) -> str:
    """Markdown: one row per case and rate (the unlimited one first)."""
    cases: dict[tuple, dict[str, dict]] = {}
    for r in records:
        cases.setdefault((r["nodes"], tuple(r["pdims"]), tuple(r["shape"]), r["rate"]), {})[
            r["row"]] = r
    rows = []
    t0s = {key[:3]: by["today"]["median_s"] for key, by in cases.items()
           if key[3] == "unlimited" and "today" in by}
    for (nodes, pdims, shape, rate), by in cases.items():
        if "today" not in by or "pipelined" not in by:
            continue
        t0 = t0s.get((nodes, pdims, shape))
        bps = _rate_bps(rate)
        received = by["today"]["bytes_per_roundtrip"]
        floor = received * 8 / bps if bps else None
        bound = max(floor or 0.0, t0 or 0.0)
        piped, today = by["pipelined"]["median_s"], by["today"]["median_s"]
        ref = by.get("mpi4py-fft", {}).get("median_s")
        ex = by.get("exchange alone")
        reached = (f"{ex['bytes_per_exchange'] * 8 / ex['median_s'] / bps:.0%}"
                   if ex and bps and ex.get("bytes_per_exchange") else "—")
        rows.append([f"{nodes} nodes, {harness.fmt_dims(pdims)}, {shape[0]}^3", rate,
                     harness.fmt_ms(floor), harness.fmt_ms(t0), harness.fmt_ms(today),
                     harness.fmt_ms(by["chunked"]["median_s"]) if "chunked" in by else "—",
                     harness.fmt_ms(piped), f"{piped / bound:.2f}x" if bound else "—",
                     f"{piped / today:.2f}x", harness.fmt_ms(ref),
                     f"{piped / ref:.2f}x" if ref else "—", reached])
    main = harness.md_table(
        ["case", "link", "link floor", "T0 (unlimited, today)", "today", "chunked",
         "pipelined", "pipelined / max(floor, T0)", "pipelined / today", "mpi4py-fft",
         "pipelined / mpi4py-fft", "exchange alone / link"], rows, "ll" + "r" * 10,
        note=f"ms, forward + inverse, complex64, one process per node of namespace "
             f"nodes on one machine (one core a node where there are enough), MPI over TCP; "
             f"load {harness.load_range(records)}.")
    return "\n\n".join(t for t in (main, _memory_table(cases), _compared_table(cases)) if t)


def _memory_table(cases: dict) -> str:
    """Per case: what today's, the chunked and the pipelined programs hold beside input and
    output, in MiB and in pieces of the pipelined plan."""
    rows = []
    for (nodes, pdims, shape, rate), by in cases.items():
        if rate != "unlimited" or not all(by.get(r, {}).get("temp_bytes") is not None
                                          for r in ("today", "chunked", "pipelined")):
            continue
        pieces = by["pipelined"]["pieces"]
        piece = by["pipelined"]["block_bytes"] / pieces
        mib = {r: by[r]["temp_bytes"] / 2**20 for r in ("today", "chunked", "pipelined")}
        rows.append([f"{nodes} nodes, {harness.fmt_dims(pdims)}, {shape[0]}^3", str(pieces),
                     f"{piece / 2**20:.2f}", *(f"{v:.1f}" for v in mib.values()),
                     f"{(by['pipelined']['temp_bytes'] - by['chunked']['temp_bytes']) / piece:+.1f}"])
    if not rows:
        return ""
    return harness.md_table(
        ["case", "pieces", "piece (MiB)", "today (MiB)", "chunked (MiB)", "pipelined (MiB)",
         "pipelined - chunked (pieces)"], rows, "l" + "r" * 6,
        note="per device, beside the input and the output: XLA's memory_analysis() of the "
             "compiled round trip (temp_size_in_bytes).")


def _compared_table(cases: dict) -> str:
    """Per case and rate: the pipelined row beside the compared ones (other piece counts, other
    progress intervals)."""
    names = list(dict.fromkeys(row for by in cases.values() for row in by
                               if row.startswith("pipelined, ")))
    if not names:
        return ""
    rows = []
    for (nodes, pdims, shape, rate), by in cases.items():
        if "pipelined" not in by:
            continue
        rows.append([f"{nodes} nodes, {harness.fmt_dims(pdims)}, {shape[0]}^3", rate,
                     f"{harness.fmt_ms(by['pipelined']['median_s'])} "
                     f"({by['pipelined']['pieces']} pieces)",
                     *(harness.fmt_ms(by[n]["median_s"]) if n in by else "—" for n in names)])
    return harness.md_table(["case", "link", "pipelined", *names], rows,
                            "ll" + "r" * (1 + len(names)), note="ms, forward + inverse.")


OPTIONS = dict(shapes=["256"], repeats=5, warmup=1, out=None, quiet=False)


def add_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--nodes", nargs="+", type=int, default=[2, 4],
                   help="node counts (one cluster each; default 2 4)")
    p.add_argument("--factors", nargs="+", type=float, default=[2.0, 1.0, 0.5],
                   help="link rates as multiples of Rb (default 2 1 0.5)")
    p.add_argument("--pieces", default="auto",
                   help="pieces per stage (default: what \"auto\" takes, about 512 KiB each)")
    p.add_argument("--compare-pieces", nargs="*", type=int, default=[16],
                   help="other piece counts, pipelined (default 16: issue 66's first choice)")
    p.add_argument("--compare-polls", nargs="*", type=int, default=[],
                   help="the MPI progress thread's intervals (us) to time, pipelined")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    p.add_argument("--timeout", type=float, default=1800, help="seconds per job")
    p.add_argument("--pdims-child", type=harness.parse_pxq, help=argparse.SUPPRESS)
    p.add_argument("--rate", default="unlimited", help=argparse.SUPPRESS)


PARTS = {"run": (run, "overlap"), "child": (child, "overlap")}
TABLES = {"overlap": table}


if __name__ == "__main__":
    sys.exit(harness.main(sys.modules[__name__]))
