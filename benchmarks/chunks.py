"""Chunked stages (issue 27): memory and time of pencilfft's `chunks=` beside jaxdecomp.

    python -m benchmarks.chunks --parts memory --out benchmarks/data/chunks-256.jsonl
    python -m benchmarks.chunks --parts time --out benchmarks/data/chunks-256.jsonl
    python -m benchmarks.chunks --fits benchmarks/data/chunks-256.jsonl

For every mesh (`--pdims`), layout (`--layouts`) and chunk count (`--chunks`: ints and "auto"),
one process (simulated CPU devices, `--devices`) measures:

* memory (`--parts memory`, compile only, nothing allocated): per-device peak of XLA's
  `memory_analysis()` (arguments + outputs + temporaries - aliased outputs, as
  `benchmarks.memory` computes it) of the forward `pfft3d` with the input kept and donated
  (`jax.jit(f, donate_argnums=0)`), of the round trip `pifft3d(pfft3d(x))` in one jit (input
  kept), and of `prfft3d` on float32 input (kept).  All in *complex blocks*: one device's block
  of the complex grid, X*Y*Z*itemsize/P bytes (the r2c input is half a block);
* time (`--parts time`): the forward `pfft3d` of every (layout, chunks) of a mesh and
  `jaxdecomp.pfft3d` (its one layout, transposed; on an Auto mesh, as jaxdecomp 0.3.1 needs),
  compiled ahead of time (compile excluded), interleaved round-robin (`steps.time_programs`),
  medians; each output is compared with the unchunked one of its layout.

"auto" is what the call does by default: 1 unless the memory check (`PENCILFFT_MEMORY_LIMIT`,
or the device/host memory) says the unchunked transform does not fit; each record stores the
count it resolved to (`chunks_resolved`) and the setting of `PENCILFFT_MEMORY_LIMIT`.

`--fits PATH...` reads memory records and prints "the grid that fits": the largest
power-of-two cube N^3 whose per-device bytes, blocks * N^3 * itemsize / P, fit a device of
40 and 80 GiB on 8, 64 and 512 devices (`fits_table`).  Only the standard library is imported
at module level: `--devices` must act before jax starts.
"""
from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from benchmarks import harness, memory, steps
from benchmarks.report import fmt_ms

TOOL = "chunks"
MEASURES = ("forward", "forward_donated", "roundtrip", "r2c_forward")
MEASURE_NAMES = {
    "forward": "forward, kept",
    "forward_donated": "forward, donated",
    "roundtrip": "round trip, kept",
    "r2c_forward": "prfft3d, kept",
}
JAXDECOMP = "jaxdecomp"
PENCILFFT = "pencilfft"
DEFAULT_CHUNKS = (1, 2, 4, 8, "auto")
# The grid that fits: devices, device memory (GiB), and the rows (label, impl, chunks, measure).
FIT_DEVICES = (8, 64, 512)
FIT_GIB = (40, 80)
FIT_ROWS = (
    ("pencilfft default (chunks=1), c2c kept", PENCILFFT, 1, "forward"),
    ("pencilfft default (chunks=1), c2c donated", PENCILFFT, 1, "forward_donated"),
    ("pencilfft default (chunks=1), r2c kept", PENCILFFT, 1, "r2c_forward"),
    ("pencilfft chunks=8, c2c kept", PENCILFFT, 8, "forward"),
    ("pencilfft chunks=8, c2c donated", PENCILFFT, 8, "forward_donated"),
    ("pencilfft chunks=8, r2c kept", PENCILFFT, 8, "r2c_forward"),
    ("jaxdecomp, c2c kept", JAXDECOMP, None, "forward"),
    ("jaxdecomp, c2c donated", JAXDECOMP, None, "forward_donated"),
)


# ----------------------------------------------------------------------------------------------
# Parsing


def parse_chunks(text: str) -> int | str:
    """'4' -> 4, 'auto' kept."""
    if text == "auto":
        return text
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"chunks {text!r}: expected an int >= 1 or auto")
    if n < 1:
        raise argparse.ArgumentTypeError(f"chunks {text!r}: expected an int >= 1 or auto")
    return n


def chunks_label(chunks: int | str | None) -> str:
    return JAXDECOMP if chunks is None else f"chunks={chunks}"


# ----------------------------------------------------------------------------------------------
# The programs (functions of a global array; the mesh comes from its sharding)


def pencilfft_fns(layout: str, shape: Sequence[int], exchange: str,
                  chunks: int | str) -> dict[str, Callable[[Any], Any]]:
    """measure -> the pencilfft program it compiles (`r2c_forward` takes real input)."""
    import pencilfft

    opts = {"layout": layout, "exchange": exchange, "chunks": chunks}

    def forward(x):
        return pencilfft.pfft3d(x, **opts)

    def roundtrip(x):
        return pencilfft.pifft3d(pencilfft.pfft3d(x, **opts), s=tuple(shape), **opts)

    def r2c_forward(x):
        return pencilfft.prfft3d(x, **opts)

    return {"forward": forward, "forward_donated": forward, "roundtrip": roundtrip,
            "r2c_forward": r2c_forward}


def jaxdecomp_fns() -> dict[str, Callable[[Any], Any]]:
    """measure -> jaxdecomp's program (no r2c: jaxdecomp has none)."""
    import jaxdecomp

    def forward(x):
        return jaxdecomp.fft.pfft3d(x)

    def roundtrip(x):
        return jaxdecomp.fft.pifft3d(jaxdecomp.fft.pfft3d(x))

    return {"forward": forward, "forward_donated": forward, "roundtrip": roundtrip}


def resolved_chunks(shape: Sequence[int], mesh, layout: str, exchange: str, chunks: int | str,
                    dtype: str, real: bool = False) -> int:
    """The count a forward call with `chunks` runs in, as pencilfft's memory check decides it
    for an input of `shape` on `mesh` not yet on the devices ("auto": 1 unless it does not fit)."""
    import jax

    import pencilfft
    from pencilfft._transforms.budget import fit_chunks
    from pencilfft._transforms.plan import plan_forward

    in_dtype = harness.REAL_DTYPE[dtype] if real else dtype
    x = jax.ShapeDtypeStruct(tuple(shape), in_dtype, sharding=pencilfft.real_space_sharding(mesh))
    plan = plan_forward(x, norm="backward", layout=layout, mesh=mesh, real=real,
                        exchange=exchange, chunks=chunks)
    return fit_chunks(plan, True, x).chunks


def complex_block_bytes(shape: Sequence[int], dtype: str, n_devices: int) -> int:
    """One device's block of the complex grid: the unit of every memory number here."""
    import numpy as np

    return math.prod(shape) * np.dtype(dtype).itemsize // n_devices


def _structs(shape, dtype: str, sharding) -> dict[str, Any]:
    """measure -> its abstract global argument on `sharding` (no data): complex, or the real
    input of `r2c_forward`."""
    import jax

    complex_ = jax.ShapeDtypeStruct(tuple(shape), dtype, sharding=sharding)
    real = jax.ShapeDtypeStruct(tuple(shape), harness.REAL_DTYPE[dtype], sharding=sharding)
    return {"forward": complex_, "forward_donated": complex_, "roundtrip": complex_,
            "r2c_forward": real}


def _memory_record(impl: str, pdims, layout: str, chunks, resolved, block: int,
                   sizes: dict[str, dict[str, int]], args: argparse.Namespace,
                   context: dict[str, Any]) -> dict[str, Any]:
    """One memory record: per measure the bytes of `memory.analyse` and the peak in blocks."""
    return {
        "tool": TOOL, "part": "memory", "timestamp": context["timestamp"], "impl": impl,
        "shape": list(args.shape), "dtype": args.dtype, "pdims": list(pdims),
        "exchange": args.exchange if impl == PENCILFFT else None, "layout": layout,
        "chunks": chunks, "chunks_resolved": resolved, "block_bytes": block,
        "blocks": {m: s["peak"] / block for m, s in sizes.items()},
        "bytes": sizes,
        "memory_limit_env": os.environ.get("PENCILFFT_MEMORY_LIMIT"),
        "machine": {**context["machine"], "loadavg_1m": harness.loadavg()},
        "versions": context["versions"], "command": context["command"],
    }


def memory_records(pdims: Sequence[int], args: argparse.Namespace,
                   context: dict[str, Any]) -> list[dict[str, Any]]:
    """One record per (layout, chunks) of pencilfft and one of jaxdecomp on mesh `pdims`:
    peak bytes and complex blocks of every measure (compile only)."""
    import pencilfft
    from jax.sharding import NamedSharding, PartitionSpec as P

    mesh = steps.make_mesh(pdims)
    block = complex_block_bytes(args.shape, args.dtype, mesh.size)
    structs = _structs(args.shape, args.dtype, pencilfft.real_space_sharding(mesh))
    records = []
    for layout in args.layouts:
        for chunks in args.chunks:
            fns = pencilfft_fns(layout, args.shape, args.exchange, chunks)
            sizes = {m: memory.analyse(fns[m], structs[m], m == "forward_donated")
                     for m in MEASURES}
            resolved = resolved_chunks(args.shape, mesh, layout, args.exchange, chunks, args.dtype)
            records.append(_memory_record(PENCILFFT, pdims, layout, chunks, resolved, block,
                                          sizes, args, context))
    if args.jaxdecomp and len(pdims) == 2:
        auto = steps.make_mesh(pdims, "auto")
        structs = _structs(args.shape, args.dtype, NamedSharding(auto, P("x", "y")))
        fns = jaxdecomp_fns()
        sizes = {m: memory.analyse(fn, structs[m], m == "forward_donated") for m, fn in fns.items()}
        records.append(_memory_record(JAXDECOMP, pdims, "transposed", None, None, block, sizes,
                                      args, context))
    return records


def time_records(pdims: Sequence[int], args: argparse.Namespace,
                 context: dict[str, Any]) -> list[dict[str, Any]]:
    """The forward of every (layout, chunks) and jaxdecomp's on mesh `pdims`, interleaved;
    one record each, with its largest relative difference from the unchunked output."""
    import jax
    import numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P

    import pencilfft

    mesh = steps.make_mesh(pdims)
    x = harness.make_input(tuple(args.shape), pencilfft.real_space_sharding(mesh), args.dtype,
                           args.seed)
    programs, meta = [], []
    for layout in args.layouts:
        for chunks in args.chunks:
            fn = pencilfft_fns(layout, args.shape, args.exchange, chunks)["forward"]
            programs.append(steps.Program(f"{layout} {chunks_label(chunks)}", "full", fn, x))
            meta.append((PENCILFFT, layout, chunks,
                         resolved_chunks(args.shape, mesh, layout, args.exchange, chunks,
                                         args.dtype)))
    if args.jaxdecomp and len(pdims) == 2:
        auto = steps.make_mesh(pdims, "auto")
        xa = jax.device_put(x, NamedSharding(auto, P("x", "y")))
        programs.append(steps.Program(JAXDECOMP, "full", jaxdecomp_fns()["forward"], xa))
        meta.append((JAXDECOMP, "transposed", None, None))
    steps.compile_programs(programs)
    steps.time_programs(programs, args.repeats, args.warmup)
    load = harness.loadavg()

    # Every output against the unchunked one of its layout (jaxdecomp: the transposed one),
    # after the timing, one output alive at a time.
    refs: dict[str, Any] = {}
    errs = []
    for p, (impl, layout, chunks, _) in zip(programs, meta):
        if impl == PENCILFFT and chunks == 1:
            refs[layout] = np.asarray(p.compiled(p.arg))
    for p, (impl, layout, chunks, _) in zip(programs, meta):
        ref = refs.get(layout)
        if ref is None:
            errs.append(None)
            continue
        got = np.asarray(p.compiled(p.arg))
        errs.append(float(np.max(np.abs(got - ref)) / np.max(np.abs(ref)))
                    if got.shape == ref.shape else None)
        del got
    records = []
    for p, (impl, layout, chunks, resolved), err in zip(programs, meta, errs):
        records.append({
            "tool": TOOL, "part": "time", "timestamp": context["timestamp"], "impl": impl,
            "program": p.name, "shape": list(args.shape), "dtype": args.dtype,
            "pdims": list(pdims), "exchange": args.exchange if impl == PENCILFFT else None,
            "layout": layout, "chunks": chunks, "chunks_resolved": resolved,
            "direction": "forward", "median_s": statistics.median(p.times),
            "mad_s": steps.mad(p.times), "min_s": min(p.times), "max_s": max(p.times),
            "times_s": p.times, "repeats": args.repeats, "warmup": args.warmup,
            "max_rel_diff_vs_chunks1": err,
            "memory_limit_env": os.environ.get("PENCILFFT_MEMORY_LIMIT"),
            "machine": {**context["machine"], "loadavg_1m": load},
            "versions": context["versions"], "command": context["command"],
        })
    return records


# ----------------------------------------------------------------------------------------------
# Tables (made from committed records by benchmarks.results)


def _latest(records, part: str) -> dict[tuple, dict[str, Any]]:
    """(impl, pdims, layout, chunks) -> the newest record of `part` (re-runs append); the
    pencilfft records first.  SystemExit if there is none."""
    out = {}
    for r in records:
        if r.get("tool") == TOOL and r["part"] == part:
            out[(r["impl"], tuple(r["pdims"]), r["layout"], r["chunks"])] = r
    if not any(k[0] == PENCILFFT for k in out):
        raise SystemExit(f"error: no pencilfft {part} records of benchmarks.chunks")
    return dict(sorted(out.items(), key=lambda kv: kv[0][0] != PENCILFFT))


def _columns(latest) -> list[tuple[tuple, str]]:
    """(pdims, layout) of the pencilfft records, in the order they were run."""
    return list(dict.fromkeys((k[1], k[2]) for k in latest if k[0] == PENCILFFT))


def _chunk_rows(latest) -> list:
    return list(dict.fromkeys(k[3] for k in latest if k[0] == PENCILFFT))


def _col_name(pdims, layout: str) -> str:
    return f"{harness.fmt_dims(pdims)} {layout[0].upper()}"


def memory_table(records) -> str:
    """Peak per device in complex blocks: one row per (measure, chunks) and jaxdecomp's, one
    column per (mesh, layout); T = transposed, N = natural."""
    latest = _latest(records, "memory")
    cols = _columns(latest)
    head = ["measure", "program"] + [_col_name(*c) for c in cols]
    lines = ["| " + " | ".join(head) + " |", "|---|---" + "|---:" * len(cols) + "|"]
    for m in MEASURES:
        rows = [(PENCILFFT, c) for c in _chunk_rows(latest)]
        if m != "r2c_forward":
            rows.append((JAXDECOMP, None))
        for impl, chunks in rows:
            cells = []
            for pdims, layout in cols:
                lay = "transposed" if impl == JAXDECOMP else layout
                r = latest.get((impl, pdims, lay, chunks))
                if r is None or (impl == JAXDECOMP and layout != "transposed"):
                    cells.append("—")
                else:
                    cells.append(f"{r['blocks'][m]:.2f}")
            lines.append(f"| {MEASURE_NAMES[m]} | {chunks_label(chunks)} | " + " | ".join(cells)
                         + " |")
    r0 = next(iter(latest.values()))
    autos = sorted({r["chunks_resolved"] for k, r in latest.items() if k[3] == "auto"})
    limit = {r.get("memory_limit_env") for r in latest.values()}
    lines += ["", f"{harness.fmt_dims(r0['shape'])} {r0['dtype']}, exchange {r0['exchange']}; "
                  f"T = transposed, N = natural layout (jaxdecomp: transposed only, no r2c); "
                  f"a complex block is {r0['block_bytes'] / 2**20:.3g} MiB (the r2c input is "
                  f"half of one); chunks=auto resolved to {', '.join(map(str, autos))} "
                  f"(PENCILFFT_MEMORY_LIMIT {'unset' if limit == {None} else sorted(map(str, limit))})."]
    return "\n".join(lines)


def time_table(records) -> str:
    """Forward medians in ms (ratio to chunks=1 of the same mesh and layout): one row per
    chunk count and jaxdecomp's, one column per (mesh, layout)."""
    latest = _latest(records, "time")
    cols = _columns(latest)
    head = ["program"] + [_col_name(*c) for c in cols]
    lines = ["| " + " | ".join(head) + " |", "|---" + "|---:" * len(cols) + "|"]
    rows = [(PENCILFFT, c) for c in _chunk_rows(latest)] + [(JAXDECOMP, None)]
    for impl, chunks in rows:
        cells = []
        for pdims, layout in cols:
            lay = "transposed" if impl == JAXDECOMP else layout
            r = latest.get((impl, pdims, lay, chunks))
            base = latest.get((PENCILFFT, pdims, layout, 1))
            if r is None or (impl == JAXDECOMP and layout != "transposed"):
                cells.append("—")
                continue
            cell = fmt_ms(r["median_s"])
            if base is not None:
                cell += f" ({r['median_s'] / base['median_s']:.2f})"
            cells.append(cell)
        lines.append(f"| {chunks_label(chunks)} | " + " | ".join(cells) + " |")
    r0 = next(iter(latest.values()))
    diffs = [r["max_rel_diff_vs_chunks1"] for r in latest.values()
             if r["max_rel_diff_vs_chunks1"] is not None]
    lines += ["", f"{harness.fmt_dims(r0['shape'])} {r0['dtype']} forward, exchange "
                  f"{r0['exchange']}, median of {r0['repeats']} interleaved rounds (after "
                  f"{r0['warmup']} untimed), ms (ratio to chunks=1 of the same column; jaxdecomp: "
                  f"to pencilfft chunks=1 transposed); T = transposed, N = natural; largest "
                  f"relative difference from the chunks=1 output {max(diffs):.1e}; load average "
                  f"when each mesh ended: {harness.load_range(latest.values())}."]
    return "\n".join(lines)


def largest_cube(blocks: float, devices: int, device_bytes: int, itemsize: int = 8) -> int:
    """The largest power-of-two N whose N^3 grid fits: blocks * N^3 * itemsize / devices
    <= device_bytes (0 if not even N = 1 does)."""
    if blocks * itemsize > device_bytes * devices:
        return 0
    n = 1
    while blocks * (2 * n) ** 3 * itemsize <= device_bytes * devices:
        n *= 2
    return n


def max_side(blocks: float, devices: int, device_bytes: int, itemsize: int = 8) -> int:
    """The largest integer N (any N) with blocks * N^3 * itemsize / devices <= device_bytes."""
    n = int((device_bytes * devices / (blocks * itemsize)) ** (1 / 3)) + 1
    while blocks * n ** 3 * itemsize > device_bytes * devices:
        n -= 1
    return n


def fit_blocks(records) -> list[tuple[str, float | None, str]]:
    """(row label, blocks, their measured range) per FIT_ROWS: blocks is the largest over the
    measured meshes and layouts."""
    latest = _latest(records, "memory")
    out = []
    for label, impl, chunks, m in FIT_ROWS:
        found = [(r["blocks"][m], _col_name(k[1], k[2])) for k, r in latest.items()
                 if k[0] == impl and k[3] == chunks and r["blocks"].get(m) is not None]
        if not found:
            out.append((label, None, ""))
            continue
        worst = max(b for b, _ in found)
        lo = min(b for b, _ in found)
        out.append((label, worst, f"{lo:.2f}-{worst:.2f}" if lo != worst else f"{worst:.2f}"))
    return out


def fits_table(records) -> str:
    """The largest power-of-two cube that fits per row of FIT_ROWS, devices and device memory
    (in brackets the largest N of any size)."""
    latest = _latest(records, "memory")
    r0 = next(iter(latest.values()))
    import numpy as np

    itemsize = np.dtype(r0["dtype"]).itemsize
    head = ["program", "blocks (measured range)"] + [f"{p} x {g} GiB" for p in FIT_DEVICES
                                                    for g in FIT_GIB]
    lines = ["| " + " | ".join(head) + " |", "|---|---:" + "|---:" * (len(head) - 2) + "|"]
    for label, worst, spread in fit_blocks(records):
        if worst is None:
            continue
        cells = [f"{largest_cube(worst, p, g << 30, itemsize)}^3 "
                 f"({max_side(worst, p, g << 30, itemsize)})" for p in FIT_DEVICES for g in FIT_GIB]
        lines.append(f"| {label} | {worst:.2f} ({spread}) | " + " | ".join(cells) + " |")
    lines += ["", f"Per-device bytes = blocks x N^3 x {itemsize} / P ({r0['dtype']}, exchange "
                  f"{r0['exchange']}; r2c: float32 "
                  f"input, its blocks counted in the same complex unit), blocks = the largest "
                  f"measured over the meshes and layouts of the memory table "
                  f"({harness.fmt_dims(r0['shape'])} on {math.prod(r0['pdims'])} CPU devices); "
                  f"in brackets the largest N of any size. Ignores XLA's and the runtime's "
                  f"reserve, and assumes the block counts measured there hold at every size "
                  f"and device count."]
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------
# Command line


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.chunks",
                                description=__doc__.split("\n")[0])
    steps.add_common_options(p, ["4x2", "2x4", "1x8", "8x1"])
    p.set_defaults(exchange="alltoall")
    p.add_argument("--layouts", nargs="+", choices=harness.LAYOUTS, default=list(harness.LAYOUTS))
    p.add_argument("--chunks", nargs="+", type=parse_chunks, default=list(DEFAULT_CHUNKS),
                   help="chunk counts, ints and auto (default: 1 2 4 8 auto)")
    p.add_argument("--parts", nargs="+", choices=("memory", "time"), default=["memory", "time"],
                   help="memory (compile only) and/or time (default: both)")
    p.add_argument("--repeats", type=int, default=7, help="timed rounds (default: 7)")
    p.add_argument("--warmup", type=int, default=1, help="untimed rounds first (default: 1)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-jaxdecomp", dest="jaxdecomp", action="store_false",
                   help="leave jaxdecomp out")
    p.add_argument("--fits", nargs="+", type=Path, metavar="PATH",
                   help="only print the grid-that-fits table of these records (no jax run)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = build_parser()
    args = p.parse_args(argv)
    if args.fits:
        print(fits_table(harness.load_records(args.fits)))
        return 0
    if args.repeats < 1 or args.warmup < 0:
        p.error("--repeats must be >= 1 and --warmup >= 0")
    if args.jaxdecomp:
        try:
            import jaxdecomp  # noqa: F401
        except Exception as e:  # noqa: BLE001
            print(f"jaxdecomp not importable ({type(e).__name__}: {e}): no jaxdecomp rows",
                  file=sys.stderr)
            args.jaxdecomp = False
    meshes = steps.start_jax(args)
    context = steps.run_context("benchmarks.chunks", argv)
    records = []
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*donated buffers were not usable")
        for pdims in meshes:
            case = []
            if "memory" in args.parts:
                case += memory_records(pdims, args, context)
            if "time" in args.parts:
                case += time_records(pdims, args, context)
            steps.write_records(args.out, case)
            records += case
            print(f"{harness.fmt_dims(pdims)} done (load {harness.loadavg()})", file=sys.stderr,
                  flush=True)
    if "memory" in args.parts:
        print(memory_table(records) + "\n")
    if "time" in args.parts:
        print(time_table(records) + "\n")
    if "memory" in args.parts:
        print(fits_table(records))
    return 0


if __name__ == "__main__":
    sys.exit(main())
