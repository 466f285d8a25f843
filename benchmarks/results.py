"""The tables of benchmarks/RESULTS.md, each made from committed data (benchmarks/data/).

    python -m benchmarks.results            # rewrite every table of RESULTS.md from its data
    python -m benchmarks.results --check    # only say which tables differ (exit status 1)

A measured table sits in RESULTS.md between two markers,

    <!-- table: KIND PATH [PATH ...] -->
    ...
    <!-- end table -->

where KIND names a table maker of `TABLES` and the PATHs (relative to the repository) are the
JSON-lines files it reads, as the tools wrote them (`--out`).  tests/tooling/test_results.py
checks that every block is what its maker prints from its data, and that RESULTS.md has no
other tables than the descriptive ones it lists.  Only the standard library is imported at
module level (the table makers import nothing heavier).
"""
from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from benchmarks import (batch, chunks, harness, kernel, kinds, layouts, margin, memory,
                        mpi, paint, pm, power, report, steps)

Records = list[dict[str, Any]]
ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "RESULTS.md"
BLOCK = re.compile(r"<!-- table: (\S+)((?: \S+)+) -->\n(.*?)\n?<!-- end table -->", re.S)


def _latest(records: Records, key: Callable[[dict], tuple]) -> dict[tuple, dict]:
    """The last record of each key (re-running a case appends; the newest counts)."""
    out: dict[tuple, dict] = {}
    for r in records:
        out[key(r)] = r
    return out


def processes_table(several: Records, one: Records) -> str:
    """pencilfft (transposed) under several processes against the same case in one process:
    one row per grid and mesh, "median ms (ratio to one process)" per direction."""
    def key(r):
        return (tuple(r["shape"]), tuple(r["pdims"]), r["direction"])

    pick = [r for r in several if r["impl"] == "pencilfft" and r["layout"] == "transposed"
            and r["status"] == "ok"]
    base = _latest([r for r in one if r["impl"] == "pencilfft" and r["layout"] == "transposed"
                    and r["status"] == "ok"], key)
    multi = _latest(pick, key)
    procs = sorted({r["machine"]["process_count"] for r in pick})
    cases = list(dict.fromkeys((k[0], k[1]) for k in multi))
    cases.sort(key=lambda c: (c[0], c[1]))
    head = ["grid", "pdims"] + [f"{d} ms (vs 1 process)" for d in harness.DIRECTIONS]
    lines = ["| " + " | ".join(head) + " |", "|---|---|" + "---:|" * len(harness.DIRECTIONS)]
    for shape, pdims in cases:
        cells = []
        for d in harness.DIRECTIONS:
            r, b = multi.get((shape, pdims, d)), base.get((shape, pdims, d))
            if r is None:
                cells.append("—")
                continue
            ratio = f" ({r['median_s'] / b['median_s']:.2f}x)" if b else ""
            cells.append(report.fmt_ms(r["median_s"]) + ratio)
        lines.append(f"| {harness.fmt_dims(shape)} | {harness.fmt_dims(pdims)} | "
                     + " | ".join(cells) + " |")
    lines.append("")
    lines.append(f"Processes: {', '.join(map(str, procs))}; load average when each case ended: "
                 + harness.load_range(pick) + ".")
    return "\n".join(lines)


STEP_ROWS = (  # (row label, how to find its record: program names for pencils / slabs)
    ("one-device `fftn`", ("fftn-1dev",)),
    ("`pfft3d` (transposed)", ("pfft3d",)),
    ("FFT Z (slab: 2-D FFT over Y, Z)", ("FFT Z", "FFT Y,Z (2-D)")),
    ("+ exchange over y", ("+ exchange over y",)),
    ("+ FFT Y", ("+ FFT Y",)),
    ("+ exchange over x", ("+ exchange over x",)),
    ("+ FFT X", ("+ FFT X",)),
    ("+ FFT X,Y (2-D) and the move (slab over Y)", ("+ FFT X,Y (2-D)",)),
    ("3 local FFTs, no data movement", ("3 local FFTs",)),
    ("bare collective over x (no reordering)", ("bare over x",)),
    ("bare collective over y (no reordering)", ("bare over y",)),
    ("one local pass (copy) over the block", ("local copy",)),
)
_RATIO_ROWS = {"fftn-1dev", "pfft3d", "3 local FFTs"}


def steps_table(records: Records) -> str:
    """benchmarks.steps' cases side by side: one column per (mesh, exchange), the prefixes'
    times with their step costs (or "noise"), the floors, and the floor line."""
    cases: dict[tuple, dict[str, dict]] = {}
    for r in records:
        case = (tuple(r["pdims"]), tuple(sorted(set(r["exchanges"].values()))))
        cases.setdefault(case, {})[r["program"]] = r  # the latest run of a case wins
    head = ["program"] + [f"{harness.fmt_dims(p)} {'/'.join(steps.BARE_NAMES[a] for a in algs)}"
                          for p, algs in cases]
    lines = ["| " + " | ".join(head) + " |", "|---" + "|---:" * len(cases) + "|"]
    for label, names in STEP_ROWS:
        cells = []
        for by in cases.values():
            r = _step_record(by, names)
            if r is None:
                cells.append("—")
            elif r["program"] in _RATIO_ROWS:
                cells.append(f"{report.fmt_ms(r['median_s'])} ({r['ratio_to_fftn_1dev']:.2f})")
            elif r["kind"] == "prefix" and r["program"] not in ("FFT Z", "FFT Y,Z (2-D)"):
                cells.append(f"{report.fmt_ms(r['median_s'])} (step {steps.step_cell(r)})")
            else:
                cells.append(report.fmt_ms(r["median_s"]))
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    floors = []
    for by in cases.values():
        rows = list(by.values())
        floor = steps.floor_seconds(rows)
        floors.append(f"{report.fmt_ms(floor)} ({floor / by['fftn-1dev']['median_s']:.2f})")
    lines.append("| floor: 3 local FFTs + bare exchanges | " + " | ".join(floors) + " |")
    first = next(iter(cases.values()))
    r0 = next(iter(first.values()))
    lines += ["", f"{harness.fmt_dims(r0['shape'])} {r0['dtype']}, medians of {r0['repeats']} "
                  f"interleaved rounds, ms (ratio to the one-device `fftn` of the same run); "
                  f"load average when each case ended: "
                  + ", ".join(harness.load_range(list(by.values())) for by in cases.values()) + "."]
    return "\n".join(lines)


def _step_record(by: dict[str, dict], names: Sequence[str]) -> dict | None:
    for name in names:
        if name.startswith("bare over "):
            axis = name.rsplit(" ", 1)[1]
            algorithm = next(iter(by.values()))["exchanges"].get(axis)
            if algorithm is None:
                return None
            name = f"bare {steps.BARE_NAMES[algorithm]} over {axis}"
        if name in by:
            return by[name]
    return None


def memory_table(records: Records) -> str:
    """benchmarks.memory's peaks in local input blocks: one row per (transform, mesh, layout),
    one column per direction and donation."""
    latest = _latest(records, lambda r: (r["transform"], tuple(r["pdims"]), r["layout"],
                                         r["direction"], r["donate"]))
    rows = list(dict.fromkeys(k[:3] for k in latest))
    transforms = sorted({k[0] for k in rows})
    head = (["transform"] if len(transforms) > 1 else []) + ["pdims", "layout"] + [
        f"{d}{', donated' if donate else ''}" for d in memory.DIRECTIONS for donate in (False, True)]
    lines = ["| " + " | ".join(head) + " |", "|---" * 2 + "|---:" * (len(head) - 2) + "|"]
    for transform, pdims, layout in rows:
        cells = [f"{latest[(transform, pdims, layout, d, donate)]['peak_blocks']:.2f}"
                 for d in memory.DIRECTIONS for donate in (False, True)]
        lead = [transform] if len(transforms) > 1 else []
        lines.append("| " + " | ".join(lead + [harness.fmt_dims(pdims), layout] + cells) + " |")
    r0 = records[0]
    block = r0["block_bytes"] / 2**20
    lines += ["", f"{harness.fmt_dims(r0['shape'])} {r0['dtype']}, exchange {r0['exchange']}; "
                  f"a local block is {block:.3g} MiB."]
    return "\n".join(lines)


def gpu_table(records: Records) -> str:
    """One GPU (`benchmarks/gpu.py --out`): each implementation's times and temporaries."""
    lines = ["| N^3 | dtype | implementation | forward ms | inverse ms | fwd+inv in one jit, ms "
             "| XLA temp per device (fwd+inv), blocks |",
             "|---:|---|---|---:|---:|---:|---:|"]
    for r in records:
        temp = r["memory_fwd_inv"].get("temp_bytes", float("nan")) / r["block_bytes"]
        lines.append(f"| {r['n']} | {r['dtype']} | {r['impl']} | {r['forward_ms']:.2f} | "
                     f"{r['inverse_ms']:.2f} | {r['fwd_inv_one_jit_ms']:.2f} | {temp:.2f} |")
    info = records[0]["info"] if records else {}
    checks = records[0]["checks"] if records else 0
    lines += ["", f"{info.get('device_kind', '?')}, jax {info.get('jax', '?')}, jaxdecomp "
                  f"{info.get('jaxdecomp', 'not installed')}; {checks} correctness checks passed "
                  "before timing."]
    return "\n".join(lines)


# KIND -> (the table from the records of each PATH, how many PATHs it takes)
TABLES: dict[str, tuple[Callable[..., str], int]] = {
    "fft": (report.markdown_table, 1),
    "fft-processes": (processes_table, 2),
    "steps": (steps_table, 1),
    "memory": (memory_table, 1),
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
    "gpu": (gpu_table, 1),
    "layouts": (layouts.table_of, 1),
    "paint": (paint.table, 1),
}


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
    return make(*(harness.load_records([root / p]) for p in paths)).strip()


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
