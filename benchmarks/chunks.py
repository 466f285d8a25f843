"""Chunked stages (issue 27): memory and time of pencilfft's `chunks=` beside jaxdecomp.

    python -m benchmarks.chunks --parts memory --out benchmarks/data/chunks-256.jsonl
    python -m benchmarks.chunks --parts time --out benchmarks/data/chunks-256.jsonl
    python -m benchmarks.chunks table --format fits benchmarks/data/chunks-256.jsonl

Per mesh, layout and chunk count (ints and "auto": what a call does by default, its resolved
count recorded): `memory` compiles only (XLA's analysis, `memory.analyse`'s peak) the forward
with the input kept and donated, the round trip in one jit and `prfft3d`, in *complex blocks*
(one device's block of the complex grid); `time` runs the forwards and `jaxdecomp.pfft3d` in
the harness's loop, each output compared with the unchunked one.  `fits`: the largest N^3 whose
blocks * N^3 * itemsize / P fit a device of 40 and 80 GiB on 8, 64 and 512 devices.
"""
from __future__ import annotations

import argparse
import functools
import math
import os
import statistics
import sys
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

import pencilfft
from benchmarks import harness, memory, private
from benchmarks.harness import Program, fmt_dims, fmt_ms

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


def parse_chunks(text: str) -> int | str:
    """'4' -> 4, 'auto' kept."""
    if text == "auto":
        return text
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"chunks {text!r}: expected an int >= 1 or auto")
    return int(text)


def chunks_label(chunks: int | str | None) -> str:
    return JAXDECOMP if chunks is None else f"chunks={chunks}"


def pencilfft_fns(layout: str, shape: Sequence[int], exchange: str,
                  chunks: int | str) -> dict[str, Callable[[Any], Any]]:
    """measure -> the pencilfft program it compiles (`r2c_forward` takes real input)."""
    opts = {"layout": layout, "exchange": exchange, "chunks": chunks}
    forward = functools.partial(pencilfft.pfft3d, **opts)
    return {"forward": forward, "forward_donated": forward,
            "roundtrip": lambda x: pencilfft.pifft3d(forward(x), s=tuple(shape), **opts),
            "r2c_forward": functools.partial(pencilfft.prfft3d, **opts)}


def jaxdecomp_fns() -> dict[str, Callable[[Any], Any]]:
    """measure -> jaxdecomp's program (no r2c: jaxdecomp has none)."""
    from jaxdecomp import fft

    return {"forward": fft.pfft3d, "forward_donated": fft.pfft3d,
            "roundtrip": lambda x: fft.pifft3d(fft.pfft3d(x))}


def resolved_chunks(shape: Sequence[int], mesh, layout: str, exchange: str, chunks: int | str,
                    dtype: str, real: bool = False) -> int:
    """The chunk count pencilfft's memory check gives a forward call with `chunks`."""
    in_dtype = harness.REAL_DTYPE[dtype] if real else dtype
    x = jax.ShapeDtypeStruct(tuple(shape), in_dtype, sharding=pencilfft.real_space_sharding(mesh))
    plan = private.plan_forward(x, norm="backward", layout=layout, mesh=mesh, real=real,
                                exchange=exchange, chunks=chunks)
    return private.fit_chunks(plan, True, x).chunks


def _structs(shape, dtype: str, sharding) -> dict[str, Any]:
    """measure -> its abstract argument on `sharding` (no data; real for `r2c_forward`)."""
    return {m: jax.ShapeDtypeStruct(tuple(shape), harness.REAL_DTYPE[dtype] if m == "r2c_forward"
                                    else dtype, sharding=sharding) for m in MEASURES}


def _record(part: str, impl: str, case: harness.Case, layout: str, chunks, resolved,
            args: argparse.Namespace, ctx: dict[str, Any]) -> dict[str, Any]:
    return {"tool": TOOL, "part": part, "impl": impl, "shape": list(case.shape),
            "dtype": case.dtype, "pdims": list(case.pdims),
            "exchange": args.exchange if impl == PENCILFFT else None, "layout": layout,
            "chunks": chunks, "chunks_resolved": resolved,
            "memory_limit_env": os.environ.get("PENCILFFT_MEMORY_LIMIT"), **harness.stamp(ctx)}


def memory_records(case: harness.Case, args: argparse.Namespace,
                   ctx: dict[str, Any]) -> list[dict[str, Any]]:
    """Peak bytes and complex blocks of every measure, per (layout, chunks) and jaxdecomp."""
    mesh = harness.make_mesh(case.pdims)
    block = math.prod(case.shape) * np.dtype(case.dtype).itemsize // mesh.size  # complex block
    variants = [(PENCILFFT, layout, chunks, pencilfft_fns(layout, case.shape, args.exchange, chunks),
                 _structs(case.shape, case.dtype, pencilfft.real_space_sharding(mesh)))
                for layout in args.layouts for chunks in args.chunks]
    if args.jaxdecomp and len(case.pdims) == 2:
        auto = NamedSharding(harness.make_mesh(case.pdims, "auto"), P("x", "y"))
        variants.append((JAXDECOMP, "transposed", None, jaxdecomp_fns(),
                         _structs(case.shape, case.dtype, auto)))
    records = []
    for impl, layout, chunks, fns, structs in variants:
        sizes = {m: memory.analyse(fn, structs[m], m == "forward_donated") for m, fn in fns.items()}
        resolved = (resolved_chunks(case.shape, mesh, layout, args.exchange, chunks, case.dtype)
                    if impl == PENCILFFT else None)
        records.append({**_record("memory", impl, case, layout, chunks, resolved, args, ctx),
                        "block_bytes": block, "bytes": sizes,
                        "blocks": {m: s["peak"] / block for m, s in sizes.items()}})
    return records


def time_records(case: harness.Case, args: argparse.Namespace,
                 ctx: dict[str, Any]) -> list[dict[str, Any]]:
    """The forwards, interleaved, each compared with the unchunked output of its layout."""
    mesh = harness.make_mesh(case.pdims)
    x = harness.make_input(case.shape, pencilfft.real_space_sharding(mesh), case.dtype, args.seed)
    programs, meta = [], []
    for layout in args.layouts:
        for chunks in args.chunks:
            fn = pencilfft_fns(layout, case.shape, args.exchange, chunks)["forward"]
            programs.append(Program(f"{layout} {chunks_label(chunks)}", "full", fn, x))
            meta.append((PENCILFFT, layout, chunks, resolved_chunks(
                case.shape, mesh, layout, args.exchange, chunks, case.dtype)))
    if args.jaxdecomp and len(case.pdims) == 2:
        xa = jax.device_put(x, NamedSharding(harness.make_mesh(case.pdims, "auto"), P("x", "y")))
        programs.append(Program(JAXDECOMP, "full", jaxdecomp_fns()["forward"], xa))
        meta.append((JAXDECOMP, "transposed", None, None))
    harness.compile_programs(programs)
    harness.time_programs(programs, args.repeats, args.warmup)

    # Every output against the unchunked one of its layout (jaxdecomp: the transposed one),
    # after the timing, one output alive at a time.
    refs = {layout: np.asarray(p.compiled(p.arg)) for p, (impl, layout, chunks, _) in
            zip(programs, meta) if impl == PENCILFFT and chunks == 1}
    records = []
    for p, (impl, layout, chunks, resolved) in zip(programs, meta):
        ref, err = refs.get(layout), None
        if ref is not None:
            got = np.asarray(p.compiled(p.arg))
            err = (float(np.max(np.abs(got - ref)) / np.max(np.abs(ref)))
                   if got.shape == ref.shape else None)
            del got
        records.append({
            **_record("time", impl, case, layout, chunks, resolved, args, ctx), "program": p.name,
            "direction": "forward", "median_s": statistics.median(p.times),
            "mad_s": harness.mad(p.times), "min_s": min(p.times), "max_s": max(p.times),
            "times_s": p.times, "repeats": args.repeats, "warmup": args.warmup,
            "max_rel_diff_vs_chunks1": err})
    return records


# Tables (made from committed records by benchmarks.results)
def _latest(records, part: str) -> dict[tuple, dict[str, Any]]:
    """(impl, pdims, layout, chunks) -> the newest `part` record, pencilfft's first."""
    out = harness.latest((r for r in records if r.get("tool") == TOOL and r["part"] == part),
                         lambda r: (r["impl"], tuple(r["pdims"]), r["layout"], r["chunks"]))
    if not any(k[0] == PENCILFFT for k in out):
        raise SystemExit(f"error: no pencilfft {part} records of benchmarks.chunks")
    return dict(sorted(out.items(), key=lambda kv: kv[0][0] != PENCILFFT))


def _columns(latest) -> list[tuple[tuple, str]]:
    """(pdims, layout) of the pencilfft records, in the order they were run."""
    return list(dict.fromkeys((k[1], k[2]) for k in latest if k[0] == PENCILFFT))


def _rows(latest, with_jaxdecomp: bool = True) -> list[tuple[str, int | str | None]]:
    rows = [(PENCILFFT, c) for c in dict.fromkeys(k[3] for k in latest if k[0] == PENCILFFT)]
    return rows + ([(JAXDECOMP, None)] if with_jaxdecomp else [])


def _col_name(pdims, layout: str) -> str:
    return f"{fmt_dims(pdims)} {layout[0].upper()}"


def _get(latest, impl: str, pdims, layout: str, chunks) -> dict | None:
    """The record of a cell: jaxdecomp has only the transposed column of a mesh."""
    return None if impl == JAXDECOMP and layout != "transposed" else latest.get((impl, pdims, layout, chunks))


def memory_table(records) -> str:
    """Peak blocks per (measure, chunks) and (mesh, layout); T transposed, N natural."""
    latest = _latest(records, "memory")
    cols = _columns(latest)
    rows = []
    for m in MEASURES:
        for impl, chunks in _rows(latest, m != "r2c_forward"):
            cells = [_get(latest, impl, pdims, layout, chunks) for pdims, layout in cols]
            rows.append([MEASURE_NAMES[m], chunks_label(chunks)] + [
                "—" if r is None else f"{r['blocks'][m]:.2f}" for r in cells])
    r0 = next(iter(latest.values()))
    autos = sorted({r["chunks_resolved"] for k, r in latest.items() if k[3] == "auto"})
    limit = {r.get("memory_limit_env") for r in latest.values()}
    return harness.md_table(["measure", "program"] + [_col_name(*c) for c in cols], rows,
                            "ll" + "r" * len(cols), (
        f"{fmt_dims(r0['shape'])} {r0['dtype']}, exchange {r0['exchange']}; "
        f"T = transposed, N = natural layout (jaxdecomp: transposed only, no r2c); "
        f"a complex block is {r0['block_bytes'] / 2**20:.3g} MiB (the r2c input is "
        f"half of one); chunks=auto resolved to {', '.join(map(str, autos))} "
        f"(PENCILFFT_MEMORY_LIMIT {'unset' if limit == {None} else sorted(map(str, limit))})."))


def time_table(records) -> str:
    """Forward ms (ratio to chunks=1) per chunk count and (mesh, layout)."""
    latest = _latest(records, "time")
    cols = _columns(latest)
    rows = []
    for impl, chunks in _rows(latest):
        cells = []
        for pdims, layout in cols:
            r, base = _get(latest, impl, pdims, layout, chunks), latest.get((PENCILFFT, pdims, layout, 1))
            ratio = f" ({r['median_s'] / base['median_s']:.2f})" if r and base else ""
            cells.append("—" if r is None else fmt_ms(r["median_s"]) + ratio)
        rows.append([chunks_label(chunks)] + cells)
    r0 = next(iter(latest.values()))
    diffs = [r["max_rel_diff_vs_chunks1"] for r in latest.values()
             if r["max_rel_diff_vs_chunks1"] is not None]
    return harness.md_table(["program"] + [_col_name(*c) for c in cols], rows, "l" + "r" * len(cols), (
        f"{fmt_dims(r0['shape'])} {r0['dtype']} forward, exchange "
        f"{r0['exchange']}, median of {r0['repeats']} interleaved rounds (after "
        f"{r0['warmup']} untimed), ms (ratio to chunks=1 of the same column; jaxdecomp: "
        f"to pencilfft chunks=1 transposed); T = transposed, N = natural; largest "
        f"relative difference from the chunks=1 output {max(diffs):.1e}; load average "
        f"when each mesh ended: {harness.load_range(latest.values())}."))


def largest_cube(blocks: float, devices: int, device_bytes: int, itemsize: int = 8) -> int:
    """The largest power-of-two N with blocks * N^3 * itemsize / devices <= device_bytes."""
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
    """(row label, the largest blocks measured, their range) per FIT_ROWS."""
    latest = _latest(records, "memory")
    out = []
    for label, impl, chunks, m in FIT_ROWS:
        found = [r["blocks"][m] for k, r in latest.items()
                 if k[0] == impl and k[3] == chunks and r["blocks"].get(m) is not None]
        lo, worst = (min(found), max(found)) if found else (None, None)
        spread = "" if not found else f"{worst:.2f}" if lo == worst else f"{lo:.2f}-{worst:.2f}"
        out.append((label, worst, spread))
    return out


def fits_table(records) -> str:
    """The largest cube that fits, per FIT_ROWS, device count and device memory."""
    r0 = next(iter(_latest(records, "memory").values()))
    itemsize = np.dtype(r0["dtype"]).itemsize
    rows = [[label, f"{worst:.2f} ({spread})"] + [
        f"{largest_cube(worst, p, g << 30, itemsize)}^3 ({max_side(worst, p, g << 30, itemsize)})"
        for p in FIT_DEVICES for g in FIT_GIB]
        for label, worst, spread in fit_blocks(records) if worst is not None]
    head = ["program", "blocks (measured range)"] + [f"{p} x {g} GiB" for p in FIT_DEVICES for g in FIT_GIB]
    return harness.md_table(head, rows, "l" + "r" * (len(head) - 1), (
        f"Per-device bytes = blocks x N^3 x {itemsize} / P ({r0['dtype']}, exchange "
        f"{r0['exchange']}; r2c: float32 "
        f"input, its blocks counted in the same complex unit), blocks = the largest "
        f"measured over the meshes and layouts of the memory table "
        f"({fmt_dims(r0['shape'])} on {math.prod(r0['pdims'])} CPU devices); "
        f"in brackets the largest N of any size. Ignores XLA's and the runtime's "
        f"reserve, and assumes the block counts measured there hold at every size "
        f"and device count."))


# ----------------------------------------------------------------------------------------------
# The command line (benchmarks.harness.main)

OPTIONS = dict(devices=8, shapes=["256"], pdims=["4x2", "2x4", "1x8", "8x1"],
               dtypes=dict(default=["complex64"], choices=harness.DTYPES), exchange="alltoall",
               repeats=7, warmup=1, seed=0, out=None)


def add_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--layouts", nargs="+", choices=harness.LAYOUTS, default=list(harness.LAYOUTS))
    p.add_argument("--chunks", nargs="+", type=parse_chunks, default=[1, 2, 4, 8, "auto"],
                   help="chunk counts, ints and auto (default: 1 2 4 8 auto)")
    p.add_argument("--parts", nargs="+", choices=("memory", "time"), default=["memory", "time"],
                   help="memory (compile only) and/or time (default: both)")
    p.add_argument("--no-jaxdecomp", dest="jaxdecomp", action="store_false",
                   help="leave jaxdecomp out")


def run(args: argparse.Namespace, ctx: dict[str, Any]) -> Iterator[list[dict[str, Any]]]:
    if jax.process_count() > 1:
        raise SystemExit("error: run this tool in a single process")
    try:
        import jaxdecomp  # noqa: F401
    except Exception as e:  # noqa: BLE001
        harness.say(args, f"jaxdecomp not importable ({type(e).__name__}: {e}): no jaxdecomp rows")
        args.jaxdecomp = False
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*donated buffers were not usable")
        for case in harness.make_cases(args, jax.device_count()):
            yield ((memory_records(case, args, ctx) if "memory" in args.parts else [])
                   + (time_records(case, args, ctx) if "time" in args.parts else []))
            harness.say(args, f"{case.label} done (load {harness.loadavg()})")


def report(args: argparse.Namespace, records: list[dict[str, Any]]) -> str:
    return "\n\n".join(TABLES[t](records) for t, part in (("memory", "memory"), ("time", "time"),
                                                          ("fits", "memory")) if part in args.parts)


TABLES = {"memory": memory_table, "time": time_table, "fits": fits_table}


if __name__ == "__main__":
    sys.exit(harness.main(sys.modules[__name__]))
