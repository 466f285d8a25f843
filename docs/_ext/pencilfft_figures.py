"""The site's figures, drawn while it builds (nothing binary is committed).

Into docs/_generated/ (git-ignored): the concept figures below, and the benchmark figures of
`benchmarks.plot.stored_figures` (from the results stored in benchmarks/data/).  The concept
figures follow the stage lists of pencilfft/_stages.py (`forward_stages`): which mesh axis
splits X, Y and Z at each stage of a pencil and of both slabs; the routes of `pencilfft.fftn`
(any_layout_routes.png) are asked of the N-D planner itself while the site builds.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parents[1] / "_generated"

# Who splits each global axis (X, Y, Z) after each step of the forward transform, and what the
# step did: "a", "b" (the mesh's pencil axes) or "" (whole on every device).  The FFT of a stage
# runs along the axes that are whole there.
PENCIL = [("real space", ("a", "b", ""), "FFT along Z"),
          ("exchange over b", ("a", "", "b"), "FFT along Y"),
          ("exchange over a", ("", "a", "b"), "FFT along X")]
SLAB_X = [("real space", ("a", "", ""), "2-D FFT along Y, Z"),
          ("exchange over a", ("", "a", ""), "FFT along X")]
SLAB_Y = [("real space", ("", "b", ""), "FFT along Z"),
          ("exchange over b", ("", "", "b"), "2-D FFT along X, Y")]
COLOURS = {"a": "#4c72b0", "b": "#dd8452", "": "#e8e8e8"}


def _stages_figure(path: Path) -> None:
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    cases = [("pencils, mesh (a, b) = (4, 2)", PENCIL), ("slab over X, mesh (8, 1)", SLAB_X),
             ("slab over Y, mesh (1, 8)", SLAB_Y)]
    fig, axes = plt.subplots(len(cases), 1, figsize=(9, 6.6))
    for ax, (title, stages) in zip(axes, cases):
        ax.set_xlim(0, 3 * 3.2)
        ax.set_ylim(-0.9, 1.5)
        ax.axis("off")
        ax.set_title(title, loc="left", fontsize=10)
        for i, (name, split, fft) in enumerate(stages):
            x0 = i * 3.2
            ax.text(x0 + 1.2, 1.3, name, ha="center", fontsize=9)
            for j, (axis, who) in enumerate(zip("XYZ", split)):
                ax.add_patch(Rectangle((x0 + j * 0.8, 0.2), 0.8, 0.8, color=COLOURS[who], ec="k"))
                ax.text(x0 + j * 0.8 + 0.4, 0.6, f"{axis}\n{who or 'whole'}", ha="center",
                        va="center", fontsize=8)
            ax.text(x0 + 1.2, -0.3, fft, ha="center", fontsize=8, style="italic")
            if i + 1 < len(stages):
                ax.annotate("", xy=(x0 + 3.05, 0.6), xytext=(x0 + 2.5, 0.6),
                            arrowprops={"arrowstyle": "->"})
    fig.suptitle("Forward transform: which mesh axis splits X, Y, Z at each stage", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _blocks(ax, rows: int, cols: int, label, title: str, xlabel: str, ylabel: str) -> None:
    """A global 2-D view split into rows x cols device blocks, each labelled label(i, j)."""
    from matplotlib.patches import Rectangle

    for i in range(rows):
        for j in range(cols):
            dev = label(i, j)
            ax.add_patch(Rectangle((j / cols, 1 - (i + 1) / rows), 1 / cols, 1 / rows,
                                   color=f"C{dev % 10}", alpha=0.35, ec="k"))
            ax.text((j + 0.5) / cols, 1 - (i + 0.5) / rows, f"dev {dev}", ha="center",
                    va="center", fontsize=7)
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_xticks([])
    ax.set_yticks([])
    ax.set_title(title, fontsize=9)
    ax.set_xlabel(xlabel, fontsize=8)
    ax.set_ylabel(ylabel, fontsize=8)


def _layouts_figure(path: Path) -> None:
    import matplotlib.pyplot as plt

    pa, pb = 4, 2
    dev = lambda i, j: i * pb + j  # noqa: E731 - device (i, j) of the mesh, row-major
    fig, axes = plt.subplots(1, 3, figsize=(10, 3.6))
    _blocks(axes[0], pa, pb, dev, "real space (X, Y, Z): P('x', 'y')\nblock (X/4, Y/2, Z)",
            "Y (split by b = 'y'); Z whole, into the page", "X (split by a = 'x')")
    _blocks(axes[1], pa, pb, dev, "transposed k space (Y, Z, X): P('x', 'y')\nblock (Y/4, Z/2, X)",
            "Z (split by b); X whole, into the page", "Y (split by a)")
    _blocks(axes[2], pa, pb, dev, "natural k space (X, Y, Z): P(None, 'x', 'y')\nblock (X, Y/4, Z/2)",
            "Z (split by b); X whole, in front", "Y (split by a)")
    fig.suptitle("Global arrays on a 4x2 mesh, and the block each device holds", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _batch_figure(path: Path) -> None:
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(7, 3.4))
    for c, ax in enumerate(axes):
        _blocks(ax, 4, 2, lambda i, j, c=c: c * 8 + i * 2 + j,
                f"field {c} of (B=2, X, Y, Z): mesh slice c={c}", "Y (split by 'y')",
                "X (split by 'x')")
    fig.suptitle("Mesh (2, 4, 2) ('c', 'x', 'y'): batch axis 'c' splits the fields; "
                 "exchanges stay inside a slice", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# The routes drawn in any_layout_routes.png: (title, global shape, mesh axis sizes, input
# split, out_sharding (None: fftn's default)); the shapes are benchmarks/nd.py's.
ROUTES = [
    ("fftn of a brick, P('a', 'b', 'c') on a (2, 2, 2) mesh, out_sharding=P('a', 'b', 'c')",
     (256, 256, 256), {"a": 2, "b": 2, "c": 2}, ("a", "b", "c"), ("a", "b", "c")),
    ("fftn of a 2-D slab, P('a', None) on 8 devices (default output)",
     (2048, 2048), {"a": 8}, ("a", None), None),
    ("fftn of a 2-D block, P('a', 'b') on a 4x2 mesh (default output)",
     (2048, 2048), {"a": 4, "b": 2}, ("a", "b"), None),
]
ROUTE_COLOURS = {"a": "#4c72b0", "b": "#dd8452", "c": "#55a868"}
AXIS_NAMES = {2: "XY", 3: "XYZ"}
DOT = "\u00b7"  # between the mesh axes that split one array axis, major first


def route_columns(shape: tuple[int, ...], sizes: dict[str, int], in_spec: tuple,
                  target: tuple | None) -> list[tuple[str, tuple, frozenset, frozenset]]:
    """(what the step did, the split after it, the axes it transformed, the axes transformed
    so far) for the input and each step of `pencilfft.fftn`'s route: the planner's own steps
    (`routes.find_route` on the Problem `fftn` builds, through `numpy_fft._planned`)."""
    import jax
    import numpy as np
    from pencilfft._transforms import numpy_fft

    def spec(entries):
        return tuple(() if e is None else (e,) if isinstance(e, str) else tuple(e) for e in entries)

    call = numpy_fft._call(jax.ShapeDtypeStruct(shape, np.complex64), None, None, None, "c2c",
                           False, "fftn", numpy_fft._all_axes, "auto")
    route, _, problem = numpy_fft._planned(call, tuple(sizes.items()), spec(in_spec),
                                           None if target is None else spec(target), "cpu", True)
    names = AXIS_NAMES[len(shape)]
    split, done = [tuple(s) for s in problem.in_spec], frozenset()
    columns = [("input", tuple(split), frozenset(), done)]
    for step in route.steps:
        now = frozenset()
        if step[0] == "fft":
            now = frozenset(step[1])
            done = done | now
            text = "FFT " + ", ".join(names[i] for i in step[1])
        elif step[0] == "move":
            m, i, j = step[1:4]
            split[i], split[j] = split[i][:-1], split[j] + (m,)
            text = f"{m}: {names[i]} \u2192 {names[j]}"
        elif step[0] == "swap":
            j = step[1]
            split[j] = split[j][:-2] + (split[j][-1], split[j][-2])
            text = f"swap on {names[j]}"
        else:  # take
            m, j = step[1], step[2]
            split[j] = split[j] + (m,)
            text = f"take {m} on {names[j]}"
        columns.append((text, tuple(split), now, done))
    return columns


def _routes_figure(path: Path) -> None:
    import math

    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    drawn = [(title, shape, sizes, route_columns(shape, sizes, in_spec, target))
             for title, shape, sizes, in_spec, target in ROUTES]
    width = 1.3  # of a column
    ncols = max(len(c) for *_, c in drawn)
    fig, axes = plt.subplots(len(drawn), 1, figsize=(1.3 * ncols + 0.4, 7.6),
                             gridspec_kw={"height_ratios": [len(s) + 1.6 for _, s, _, _ in drawn]})
    for ax, (title, shape, sizes, columns) in zip(axes, drawn):
        rows = len(shape)
        names = AXIS_NAMES[rows]
        ax.set_xlim(-0.05, ncols * width)
        ax.set_ylim(-0.9, rows + 0.55)
        ax.axis("off")
        ax.set_title(title, loc="left", fontsize=9)
        for c, (text, split, now, done) in enumerate(columns):
            x0 = c * width
            ax.text(x0 + 0.5, rows + 0.2, text, ha="center", fontsize=7.5,
                    weight="bold" if now else "normal")
            block = []
            for r, who in enumerate(split):
                y0 = rows - 1 - r
                n = len(who) or 1
                for k in range(n):  # one stripe per mesh axis splitting it, major first
                    ax.add_patch(Rectangle((x0 + k / n, y0 + 0.1), 1 / n, 0.8, lw=0,
                                           color=ROUTE_COLOURS.get(who[k], "#999999")
                                           if who else "#eeeeee"))
                ax.add_patch(Rectangle((x0, y0 + 0.1), 1, 0.8, fill=False,
                                       ec="#c0392b" if r in now else "k",
                                       lw=2.2 if r in now else 0.8))
                label = ("k" if r in done else "") + names[r]
                ax.text(x0 + 0.5, y0 + 0.5, f"{label}: {DOT.join(who) or 'whole'}",
                        ha="center", va="center", fontsize=7,
                        bbox={"boxstyle": "round,pad=0.15", "fc": "white", "ec": "none",
                              "alpha": 0.8})
                block.append(shape[r] // math.prod(sizes[m] for m in who))
            ax.text(x0 + 0.5, -0.35, "block " + "\u00d7".join(map(str, block)), ha="center",
                    fontsize=6.5, color="#555555")
            if c + 1 < len(columns):
                ax.annotate("", xy=(x0 + width - 0.04, rows / 2), xytext=(x0 + 1.04, rows / 2),
                            arrowprops={"arrowstyle": "->", "lw": 0.8})
    fig.suptitle("pencilfft.fftn, as the planner routes it: which mesh axes split each array "
                 "axis after each step\n'm: X \u2192 Y': one all_to_all over mesh axis m; kX: "
                 "transformed; red: transformed in that step; block: per device", fontsize=9.5)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def gpu_table(out: Path = OUT) -> Path:
    """benchmarks/data/gpu-h100.jsonl as a Markdown table (docs/benchmarks.md includes it)."""
    import json

    text = (Path(__file__).resolve().parents[2] / "benchmarks" / "data" /
            "gpu-h100.jsonl").read_text()
    rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    data = {"rows": rows, "info": rows[0]["info"]}
    lines = ["| grid | dtype | implementation | forward ms | inverse ms | both in one jit ms |"
             " round-trip error |", "|---|---|---|---|---|---|---|"]
    for r in data["rows"]:
        err = r["roundtrip_rel_err"]
        err = "-" if err != err else f"{err:.1e}"  # NaN: not checked at that size
        lines.append(f"| {r['n']}^3 | {r['dtype']} | {r['impl']} | {r['forward_ms']:.3f} | "
                     f"{r['inverse_ms']:.3f} | {r['fwd_inv_one_jit_ms']:.3f} | {err} |")
    info = data["info"]
    lines.append("")
    lines.append(f"Measured on {info['device_kind']}, jax {info['jax']}, jaxdecomp "
                 f"{info['jaxdecomp']}, pencilfft {info['pencilfft']} (`python -m benchmarks.gpu`).")
    path = out / "gpu_h100_table.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def draw_all(out: Path = OUT) -> list[Path]:
    """Every figure of the site into `out`."""
    import matplotlib

    matplotlib.use("Agg")
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, draw in (("stages.png", _stages_figure), ("layouts.png", _layouts_figure),
                       ("batch.png", _batch_figure), ("any_layout_routes.png", _routes_figure)):
        draw(out / name)
        written.append(out / name)
    from benchmarks.plot import stored_figures

    return written + stored_figures(out) + [gpu_table(out)]


def _builder_inited(app) -> None:
    draw_all()


def setup(app) -> dict[str, Any]:
    app.connect("builder-inited", _builder_inited)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
