"""The tables of benchmarks/RESULTS.md, each made from committed data (benchmarks/data/).

    python -m benchmarks.results            # rewrite every table of RESULTS.md from its data
    python -m benchmarks.results --check    # only say which tables differ (exit status 1)

A table sits between `<!-- table: KIND PATH [PATH ...] -->` and `<!-- end table -->`: KIND
names a maker of `TABLES` (a comparison's), the PATHs (from the repository root) the JSON lines
it reads.  Every table is headed by the CPU model and SIMD flags of the machines its records
were measured on (`harness.cpu_line`).  tests/tooling/test_results.py checks every block against its data, that every kind
has a block (or, awaiting data, the placeholder of `PENDING`) and that no table is pasted.
"""
from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from benchmarks import (async_loop, batch, chunks, device, fft, gpu, harness, kernel, kinds,
                        layouts, margin, memory, mpi, nd, overlap, paint, pm, pm_rss, power,
                        ranks, steady, steps)

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "RESULTS.md"
BLOCK = re.compile(r"<!-- table: (\S+)((?: \S+)+) -->\n(.*?)\n?<!-- end table -->", re.S)

# KIND -> (the table from the records of each PATH, how many PATHs it takes)
TABLES: dict[str, tuple[Callable[..., str], int]] = {
    "fft": (fft.markdown_table, 1),
    "fft-processes": (fft.processes_table, 2),
    "steps": (steps.steps_table, 1),
    "memory": (memory.memory_table, 1),
    "pm": (pm.markdown_table, 1),
    "mpi": (mpi.table, 1),
    "batch": (batch.table, 1),
    "margin": (margin.table, 1),
    "power": (power.table, 1),
    "kinds": (kinds.table, 1),
    "dealias": (kinds.dealias_table, 1),
    "chunks-memory": (chunks.memory_table, 1),
    "chunks-time": (chunks.time_table, 1),
    "chunks-fits": (chunks.fits_table, 1),
    "kernel-block": (kernel.block_table, 1),
    "kernel-mesh": (kernel.mesh_table, 1),
    "kernel-memory": (kernel.memory_table, 1),
    "kernel-single": (kernel.single_table, 1),
    "kernel-allocator": (kernel.allocator_table, 1),
    "gpu": (gpu.gpu_table, 1),
    "layouts": (layouts.table_of, 1),
    "paint": (paint.table, 1),
    "threads16": (device.threads_table, 1),
    "steady": (steady.steady_table, 1),
    "steady-stages": (steady.stages_table, 1),
    "steady-heap": (steady.heap_table, 1),
    "pm-rss": (pm_rss.table, 1),
    "nd": (nd.table, 1),
    "async-loop": (async_loop.table, 1),
    "ranks": (ranks.table, 1),
    "overlap": (overlap.table, 1),
}
# Kinds whose data a lent machine has yet to give: RESULTS.md says so, with the command that
# measures them (a test holds the two together), until a block of that kind replaces it.
PENDING: dict[str, str] = {}


def blocks(text: str) -> list[tuple[str, list[str], str]]:
    """(kind, paths, body) of every table block of a RESULTS.md text, in order."""
    return [(m.group(1), m.group(2).split(), m.group(3)) for m in BLOCK.finditer(text)]


def render(kind: str, paths: Sequence[str], root: Path = ROOT) -> str:
    """The table of `kind` made from the JSON-lines files `paths` (relative to `root`)."""
    if kind not in TABLES:
        raise ValueError(f"unknown table kind {kind!r}; expected one of {sorted(TABLES)}")
    make, n = TABLES[kind]
    if len(paths) != n:
        raise ValueError(f"table kind {kind!r} takes {n} data file(s); got {list(paths)}")
    data = [harness.load_records([root / p]) for p in paths]
    cpu = harness.cpu_line(r for records in data for r in records)
    table = make(*data).strip()
    return table if cpu is None else f"{cpu}\n\n{table}"


def regenerate(text: str, root: Path = ROOT) -> str:
    """`text` with every table block replaced by what its data give."""
    def fill(m: re.Match) -> str:
        kind, paths = m.group(1), m.group(2).split()
        return f"<!-- table: {kind} {' '.join(paths)} -->\n{render(kind, paths, root)}\n<!-- end table -->"
    return BLOCK.sub(fill, text)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.results", description=__doc__.split("\n")[0])
    p.add_argument("--check", action="store_true", help="only report tables that differ")
    p.add_argument("--file", type=Path, default=RESULTS, help="default: benchmarks/RESULTS.md")
    args = p.parse_args(argv)
    text = args.file.read_text()
    new = regenerate(text)
    stale = [f"{k} {' '.join(ps)}" for (k, ps, body), (_, _, fresh) in
             zip(blocks(text), blocks(new)) if body.strip() != fresh.strip()]
    if args.check:
        for s in stale:
            print(f"stale: {s}")
        return 1 if stale else 0
    if new != text:
        args.file.write_text(new)
    print(f"{len(blocks(text))} tables, {len(stale)} rewritten")
    return 0


if __name__ == "__main__":
    sys.exit(main())
