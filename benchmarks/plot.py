"""The figures of every benchmark: strong and weak scaling and bar charts of `benchmarks.fft`
records, and the documentation's figures from the committed data.

    python -m benchmarks.plot results/*.jsonl --outdir plots/
    python -m benchmarks.plot --stored --outdir DIR          # docs/benchmarks.md's figures

"ok" records only; a series is an implementation (and layout), the fastest mesh standing for
its device count: strong_<grid>_<dtype>.png (time vs devices, each series' ideal t0 n0 / n
dashed) and efficiency_*.png, weak_<points per device>ppd_<dtype>.png (two grids or more),
bars_<grid>_<dtype>.png (every mesh).  `--stored` (the docs build calls `stored_figures`): the
8-device, H100, mpirun and memory figures of benchmarks/data/.
"""
from __future__ import annotations

import argparse
import math
import sys
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib
import numpy as np

matplotlib.use("Agg")  # files only: works on login and compute nodes without a display
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib import colormaps  # noqa: E402

from benchmarks.fft import IMPLS, LAYOUT_FREE, ONE_LAYOUT  # noqa: E402
from benchmarks.harness import DIRECTIONS, fmt_dims, load_records  # noqa: E402

Record = dict[str, Any]
DATA = Path(__file__).resolve().parent / "data"


def series_label(r: Record) -> str:
    """'pencilfft [natural]' for implementations with two layouts, else the implementation."""
    if r["impl"] in LAYOUT_FREE or r["impl"] in ONE_LAYOUT:
        return r["impl"]
    return f"{r['impl']} [{r['layout']}]"


def _slots() -> tuple[dict[str, int], int]:
    """label -> its tab20 colour (a dark and a light shade per hue), and the next free hue."""
    slots, hue = {}, 0
    for impl in IMPLS:
        if impl in LAYOUT_FREE or impl in ONE_LAYOUT:
            slots[impl] = 2 * hue
        else:
            slots[f"{impl} [transposed]"], slots[f"{impl} [natural]"] = 2 * hue, 2 * hue + 1
        hue += 1
    return slots, hue


def all_series() -> list[str]:
    """Every series label the implementations can give, in the tables' order."""
    return list(_slots()[0])


def series_color(label: str):
    """A colour of its own for every series, the same in every figure."""
    tab20 = colormaps["tab20"].colors
    slots, hue = _slots()
    return tab20[slots[label]] if label in slots else tab20[2 * hue] if 2 * hue < len(tab20) else "0.5"


def _series_order(label: str) -> tuple[int, str]:
    impl = label.split(" ")[0]
    return (list(IMPLS).index(impl) if impl in IMPLS else len(IMPLS), label)


def best_by_devices(records: Sequence[Record]) -> dict[str, dict[int, Record]]:
    """label -> {n_devices: fastest record}; the fastest mesh stands for its device count."""
    out: dict[str, dict[int, Record]] = defaultdict(dict)
    for r in records:
        pts = out[series_label(r)]
        n = r["n_devices"]
        if n not in pts or r["median_s"] < pts[n]["median_s"]:
            pts[n] = r
    return dict(sorted(out.items(), key=lambda kv: _series_order(kv[0])))


def _figure(ncols: int, nrows: int = 1):
    return plt.subplots(nrows, ncols, figsize=(5.5 * ncols, 4.2 * nrows), squeeze=False)


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=120, bbox_inches="tight")  # "tight": keeps the outside legend
    plt.close(fig)
    return path


def _log2_axis(ax, ns: Sequence[int], label: str, fmt: str = "{}") -> None:
    ax.set_xscale("log", base=2)
    ax.set(xticks=sorted(set(ns)), xticklabels=[fmt.format(n) for n in sorted(set(ns))], xlabel=label)
    ax.grid(True, which="both", alpha=0.3)


def _legend(ax, last: bool) -> None:
    """One legend per figure row, outside the last panel, so that it hides no data."""
    if last and ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0)


def _bars(ax, groups: Sequence[str], series: dict[str, list[float]], colors=None) -> None:
    """Grouped bars: one group per x tick, one bar per series in it (NaN: none)."""
    width = 0.8 / max(len(series), 1)
    for i, (label, vals) in enumerate(series.items()):
        ax.bar(np.arange(len(groups)) + (i - (len(series) - 1) / 2) * width, vals, width,
               label=label, **({"color": colors(label)} if colors else {}))
    ax.set(xticks=np.arange(len(groups)), xticklabels=groups)


def _groups(records: Sequence[Record], key) -> dict[Any, list[Record]]:
    out: dict[Any, list[Record]] = defaultdict(list)
    for r in records:
        out[key(r)].append(r)
    return out


def _per_grid(records: Sequence[Record]):
    """(shape, dtype, its records, their directions) for every (grid, dtype) measured."""
    for (shape, dtype), recs in _groups(records, lambda r: (tuple(r["shape"]), r["dtype"])).items():
        yield shape, dtype, recs, [d for d in DIRECTIONS if any(r["direction"] == d for r in recs)]


def _plot_times(ax, series: dict[str, dict[int, Record]]):
    """Every series' time vs devices on `ax`: what was drawn, and every device count."""
    drawn, ns_all = [], []
    for label, pts in series.items():
        ns = sorted(pts)
        ns_all += ns
        t = [pts[n]["median_s"] for n in ns]
        (line,) = ax.plot(ns, t, "o-", label=label, color=series_color(label))
        drawn.append((label, ns, t, line.get_color()))
    return drawn, ns_all


def plot_strong(records: Sequence[Record], outdir: Path) -> list[Path]:
    """Time and efficiency vs devices, one figure pair per (grid, dtype)."""
    written = []
    for shape, dtype, recs, dirs in _per_grid(records):
        fig_t, ax_t = _figure(len(dirs))
        fig_e, ax_e = _figure(len(dirs))
        any_eff = False
        for j, d in enumerate(dirs):
            drawn, ns_all = _plot_times(ax_t[0, j], best_by_devices([r for r in recs if r["direction"] == d]))
            ideal = False
            for label, ns, t, color in drawn:
                if len(ns) > 1:  # an ideal needs a second device count to scale to
                    n0, t0 = ns[0], t[0]
                    ax_t[0, j].plot(ns, [t0 * n0 / n for n in ns], "--", color=color, alpha=0.6)
                    ax_e[0, j].plot(ns, [t0 * n0 / (tt * n) for tt, n in zip(t, ns)], "o-",
                                    color=color, label=label)
                    any_eff = ideal = True
            if ideal:  # one legend entry for all the dashed lines
                ax_t[0, j].plot([], [], "--", color="0.4", label="ideal t0·n0/n (dashed)")
            for ax in (ax_t[0, j], ax_e[0, j]):
                _log2_axis(ax, ns_all or [1], "devices")
            ax_t[0, j].set(yscale="log", ylabel="median time per transform [s]", title=(
                f"strong scaling {fmt_dims(shape)} {dtype}, {d}"
                + ("\n(dashed: ideal)" if ideal else "\n(one device count: no ideal)")))
            _legend(ax_t[0, j], j == len(dirs) - 1)
            ax_e[0, j].axhline(1.0, color="k", lw=0.8, ls="--")
            ax_e[0, j].set(ylim=(0, None), ylabel="parallel efficiency t0·n0 / (t·n)",
                           title=f"efficiency {fmt_dims(shape)} {dtype}, {d}")
            _legend(ax_e[0, j], j == len(dirs) - 1)
        tag = f"{fmt_dims(shape)}_{dtype}"
        written.append(_save(fig_t, outdir / f"strong_{tag}.png"))
        if any_eff:
            written.append(_save(fig_e, outdir / f"efficiency_{tag}.png"))
        else:
            plt.close(fig_e)
    return written


def plot_weak(records: Sequence[Record], outdir: Path) -> list[Path]:
    """Time and weak efficiency vs devices at fixed points per device (needs >= 2 grids)."""
    written = []
    for (ppd, dtype), recs in _groups(records, lambda r: (r["n_points"] / r["n_devices"],
                                                          r["dtype"])).items():
        if len({tuple(r["shape"]) for r in recs}) < 2:
            continue  # one grid only: that is strong scaling, not weak
        dirs = [d for d in DIRECTIONS if any(r["direction"] == d for r in recs)]
        fig, axes = _figure(len(dirs), 2)
        for j, d in enumerate(dirs):
            drawn, ns_all = _plot_times(axes[0, j], best_by_devices([r for r in recs if r["direction"] == d]))
            for label, ns, t, color in drawn:
                axes[0, j].axhline(t[0], color=color, ls="--", alpha=0.4)
                axes[1, j].plot(ns, [t[0] / tt for tt in t], "o-", color=color, label=label)
            for ax in axes[:, j]:
                _log2_axis(ax, ns_all, "devices")
            e = math.log2(ppd)
            axes[0, j].set(yscale="log", ylabel="median time per transform [s]", title=(
                f"weak scaling, {f'2^{e:.0f}' if e.is_integer() else f'{ppd:.3g}'} points/device, "
                f"{dtype}, {d}\n(dashed: ideal, constant time)"))
            _legend(axes[0, j], j == len(dirs) - 1)
            axes[1, j].axhline(1.0, color="k", lw=0.8, ls="--")
            axes[1, j].set(ylim=(0, None), ylabel="weak efficiency t0 / t")
        written.append(_save(fig, outdir / f"weak_{int(ppd)}ppd_{dtype}.png"))
    return written


def plot_bars(records: Sequence[Record], outdir: Path) -> list[Path]:
    """Median time of every series on every mesh of one grid (one machine, several meshes)."""
    written = []
    for shape, dtype, recs, dirs in _per_grid(records):
        fig, axes = _figure(len(dirs))
        for j, d in enumerate(dirs):
            rs = [r for r in recs if r["direction"] == d]
            meshes = sorted({tuple(r["pdims"]) for r in rs}, key=lambda p: (math.prod(p), p))
            labels = sorted({series_label(r) for r in rs}, key=_series_order)
            ax = axes[0, j]
            _bars(ax, [fmt_dims(m) for m in meshes], {label: [
                min((r["median_s"] * 1e3 for r in rs if tuple(r["pdims"]) == m
                     and series_label(r) == label), default=math.nan) for m in meshes]
                for label in labels}, series_color)
            ax.set(xlabel="mesh (pdims)", ylabel="median time [ms]", yscale="log",
                   title=f"{fmt_dims(shape)} {dtype}, {d}")
            ax.grid(True, axis="y", which="both", alpha=0.3)
            _legend(ax, j == len(dirs) - 1)
        written.append(_save(fig, outdir / f"bars_{fmt_dims(shape)}_{dtype}.png"))
    return written


# The documentation's figures, from the stored results in benchmarks/data/
def _stored_cpu8(outdir: Path) -> list[Path]:
    """ci-cpu8.jsonl: bars per mesh (the existing bar chart) and time against grid size."""
    keep = ("pencilfft", "pencilfft-r2c", "jaxdecomp", "fftn-sharded")
    recs = [r for r in load_records([DATA / "ci-cpu8.jsonl"])
            if r.get("status") == "ok" and r.get("median_s") and r["impl"] in keep]
    written = [path.rename(outdir / f"stored_cpu8_{path.name}") for path in plot_bars(recs, outdir)]
    fig, axes = _figure(2)
    for j, d in enumerate(DIRECTIONS):
        ax = axes[0, j]
        by: dict[str, dict[int, float]] = defaultdict(dict)
        for r in recs:
            if r["direction"] == d:
                n, label = r["shape"][0], series_label(r)
                by[label][n] = min(by[label].get(n, math.inf), r["median_s"] * 1e3)
        for label in sorted(by, key=_series_order):
            ns = sorted(by[label])
            ax.plot(ns, [by[label][n] for n in ns], "o-", label=label, color=series_color(label))
        _log2_axis(ax, [n for pts in by.values() for n in pts], "grid", "{}^3")
        ax.set(yscale="log", ylabel="median time [ms] (fastest mesh)",
               title=f"8 simulated CPU devices, complex64, {d}")
        _legend(ax, j == 1)
    written.append(_save(fig, outdir / "stored_cpu8_grid.png"))
    return written


def _stored_gpu(outdir: Path) -> list[Path]:
    """gpu-h100.jsonl: time against grid size on one H100, complex64 and float32."""
    rows = load_records([DATA / "gpu-h100.jsonl"])
    dtypes = sorted({r["dtype"] for r in rows})
    fig, axes = _figure(len(dtypes))
    for j, dtype in enumerate(dtypes):
        ax = axes[0, j]
        for impl, color in (("pencilfft", "C0"), ("jnp.fft", "C1"), ("jaxdecomp", "C2")):
            pts = sorted((r["n"], r["fwd_inv_one_jit_ms"]) for r in rows
                         if r["impl"] == impl and r["dtype"] == dtype)
            if pts:  # (jaxdecomp has no real transforms: no float32 line)
                ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=impl, color=color)
        _log2_axis(ax, [r["n"] for r in rows], "grid", "{}^3")
        ax.set(yscale="log", ylabel="forward + inverse in one jit [ms]",
               title=f"{rows[0]['info']['device_kind']}, {dtype}")
        ax.legend(fontsize=8, loc="upper left")  # each panel: their implementations differ
    return [_save(fig, outdir / "stored_gpu_h100.png")]


def _stored_mpi(outdir: Path) -> list[Path]:
    """mpi-np*-xla.jsonl: one CPU device per process, pencilfft's transports and mpi4py-fft."""
    recs = load_records([DATA / "mpi-np2-xla.jsonl", DATA / "mpi-np4-xla.jsonl"])
    cases = sorted({(r["shape"][0], r["processes"], tuple(r["pdims"])) for r in recs})
    fig, axes = _figure(1)
    fig.set_size_inches(9, 4.2)
    ax = axes[0, 0]
    _bars(ax, [f"{n}^3\n{p} proc. {fmt_dims(m)}" for n, p, m in cases], {row: [
        next((r["median_ms"] for r in recs if r["row"] == row and
              (r["shape"][0], r["processes"], tuple(r["pdims"])) == c), math.nan) for c in cases]
        for row in ("pencilfft/auto", "pencilfft/alltoall", "mpi4py-fft")})
    ax.tick_params(axis="x", labelsize=8)
    ax.set(ylabel="forward + inverse [ms]", yscale="log",
           title="mpirun, one CPU device per process (2-core VM)")
    ax.grid(True, axis="y", which="both", alpha=0.3)
    _legend(ax, True)
    return [_save(fig, outdir / "stored_mpi.png")]


def _stored_memory(outdir: Path) -> list[Path]:
    """memory-*.jsonl: XLA's peak per device, in blocks, forward c2c, transposed layout."""
    sets = {"auto (pairwise on CPUs)": "memory-256.jsonl", "alltoall (GPUs' auto)":
            "memory-256-alltoall.jsonl", "local (one CPU process)": "memory-local.jsonl"}
    meshes = [(1, 8), (2, 4), (4, 2), (8, 1)]
    fig, axes = _figure(2)
    for j, donate in enumerate((False, True)):
        ax = axes[0, j]
        series = {}
        for label, name in sets.items():
            recs = [r for r in load_records([DATA / name]) if r["transform"] == "c2c" and
                    r["layout"] == "transposed" and r["direction"] == "forward" and
                    r["donate"] == donate]
            series[label] = [next((r["peak_blocks"] for r in recs if tuple(r["pdims"]) == m),
                                  math.nan) for m in meshes]
        _bars(ax, [fmt_dims(m) for m in meshes], series)
        ax.set(xlabel="mesh (pdims)", ylabel="peak memory per device [blocks]",
               title="pfft3d 256^3 complex64, " + ("input donated" if donate else "input kept"))
        ax.grid(True, axis="y", alpha=0.3)
        _legend(ax, j == 1)
    return [_save(fig, outdir / "stored_memory.png")]


def stored_figures(outdir: Path) -> list[Path]:
    """Every figure of docs/benchmarks.md, from benchmarks/data/."""
    outdir.mkdir(parents=True, exist_ok=True)
    return _stored_cpu8(outdir) + _stored_gpu(outdir) + _stored_mpi(outdir) + _stored_memory(outdir)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.plot", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("files", nargs="*", type=Path, help="JSON-lines results (benchmarks.fft --out)")
    p.add_argument("--stored", action="store_true",
                   help="draw the documentation's figures from benchmarks/data/ instead")
    p.add_argument("--outdir", type=Path, default=Path("plots"), help="where the PNGs go (default: plots/)")
    p.add_argument("--impls", nargs="+", default=None, metavar="IMPL", help="only these implementations")
    p.add_argument("--dtypes", nargs="+", default=None, metavar="DTYPE", help="only these dtypes")
    p.add_argument("--tag", default=None, help="only records with this --tag")
    p.add_argument("--kinds", nargs="+", choices=["strong", "weak", "bars"], default=["strong", "weak", "bars"],
                   help="which figures (default: all; efficiency comes with strong)")
    args = p.parse_args(argv)
    if args.stored:
        print("\n".join(map(str, stored_figures(args.outdir))))
        return 0
    if not args.files:
        p.error("give result files, or --stored")
    records = [r for r in load_records(args.files) if r.get("status") == "ok" and r.get("median_s")
               and (not args.impls or r["impl"] in args.impls)
               and (not args.dtypes or r["dtype"] in args.dtypes)
               and (args.tag is None or r.get("tag") == args.tag)]
    if not records:
        print("error: no successful measurements in " + " ".join(map(str, args.files)), file=sys.stderr)
        return 1
    args.outdir.mkdir(parents=True, exist_ok=True)
    makers = {"strong": plot_strong, "weak": plot_weak, "bars": plot_bars}
    for kind in args.kinds:
        for path in makers[kind](records, args.outdir):
            print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
