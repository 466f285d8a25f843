"""Tables of FFT benchmark records: a rich table for the terminal, markdown for RESULTS.md.

`markdown_table(records)` pivots (one column per implementation, the latest record of each
case), `markdown_table(records, "long")` and `rich_table` show every record and field.  The
records are `benchmarks.harness`'s (RECORD_FIELDS); `fmt_ms` is shared with the other tools'
tables.  rich is imported only when a rich table is made.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from benchmarks.harness import DIRECTIONS, IMPLS, LAYOUT_FREE, LAYOUTS, fmt_dims

if TYPE_CHECKING:
    from rich.table import Table


def fmt_ms(s: float | None) -> str:
    """Seconds as milliseconds, 3 significant digits (whole ms from 1 s up); '' for None."""
    return "" if s is None else f"{s * 1e3:.3g}" if s < 1 else f"{s * 1e3:.0f}"


def _num(x: float | None, fmt: str) -> str:
    return "" if x is None else format(x, fmt)


def _mib(b: int | None) -> str:
    return "" if b is None else f"{b / 2**20:.1f}"


LONG_COLUMNS = ("grid", "dtype", "pdims", "impl", "layout", "dir", "compile s", "median ms",
                "min ms", "max ms", "GFlop/s", "MiB/dev", "speedup", "rel err", "status")


def long_row(r: dict[str, Any]) -> list[str]:
    status = r["status"] if r["status"] == "ok" else f"{r['status']}: {r['note']}"
    return [fmt_dims(r["shape"]), r["dtype"], fmt_dims(r["pdims"]), r["impl"], r["layout"],
            r["direction"][:3], _num(r["compile_s"], ".2f"), fmt_ms(r["median_s"]), fmt_ms(r["min_s"]),
            fmt_ms(r["max_s"]), _num(r["gflops"], ".3g"), _mib(r["mem_bytes"]),
            _num(r["speedup_vs_fftn_1dev"], ".2f"), _num(r["max_rel_err"], ".1e"), status]


def rich_table(records: Sequence[dict[str, Any]], title: str = "") -> Table:
    from rich.table import Table

    table = Table(title=title or None)
    for col in LONG_COLUMNS:
        table.add_column(col, justify="left" if col in ("impl", "layout", "status", "dtype") else "right",
                         overflow="fold")
    for r in records:
        style = {"ok": None, "skipped": "dim", "wrong": "red", "error": "red"}.get(r["status"])
        table.add_row(*long_row(r), style=style)
    return table


def _latest(records: Iterable[dict[str, Any]]) -> dict[tuple, dict[str, Any]]:
    """One record per (shape, dtype, pdims, impl, layout, direction): the last one wins."""
    out = {}
    for r in records:
        out[(tuple(r["shape"]), r["dtype"], tuple(r["pdims"]), r["impl"], r["layout"], r["direction"])] = r
    return out


def _cell(r: dict[str, Any] | None) -> str:
    if r is None:
        return "—"
    if r["status"] == "skipped":
        return "n/a"
    if r["status"] == "error" or r["median_s"] is None:
        return "error"
    s = f"{fmt_ms(r['median_s'])}"
    if r.get("speedup_vs_fftn_1dev"):
        s += f" ({r['speedup_vs_fftn_1dev']:.2f}x)"
    return s + (" WRONG" if r["status"] == "wrong" else "")


PIVOT_LEGEND = ("Median time in ms over the timed runs (speedup: the same case's `jnp.fft.fftn` on one "
                "device divided by this time); n/a: not available here; —: not run.")


def markdown_table(records: Sequence[dict[str, Any]], style: str = "pivot") -> str:
    """Markdown for RESULTS.md.

    pivot: one row per (grid, dtype, pdims, layout, direction), one column per implementation,
      cells "median ms (speedup vs fftn on 1 device)"; the layout-free fftn baselines appear in
      every layout row of their case.  n/a = not available here, — = not run.
    long: one row per record, every measurement.
    """
    if style == "long":
        lines = ["| " + " | ".join(LONG_COLUMNS) + " |", "|" + "---|" * len(LONG_COLUMNS)]
        lines += ["| " + " | ".join(c.replace("|", "/") for c in long_row(r)) + " |" for r in records]
        return "\n".join(lines)
    latest = _latest(records)
    impls = [i for i in IMPLS if any(k[3] == i for k in latest)]
    impls += sorted({k[3] for k in latest} - set(impls))
    # An implementation skipped everywhere (e.g. cuDecomp on a CPU machine) gets a footnote,
    # not a column of n/a.
    absent = {i: r["note"] for k, r in latest.items() if (i := k[3]) in impls}
    absent = {i: note for i, note in absent.items()
              if all(r["status"] == "skipped" for k, r in latest.items() if k[3] == i)}
    impls = [i for i in impls if i not in absent]
    rows = []
    for (shape, dtype, pdims, impl, layout, direction) in latest:
        if impl in LAYOUT_FREE:
            continue
        key = (shape, dtype, pdims, layout, direction)
        if key not in rows:
            rows.append(key)
    if not rows:  # only baselines were run
        rows = list(dict.fromkeys((k[0], k[1], k[2], k[4], k[5]) for k in latest))
    order = {d: i for i, d in enumerate(DIRECTIONS)}
    rows.sort(key=lambda k: (math.prod(k[0]), k[0], k[1], k[2], LAYOUTS.index(k[3]) if k[3] in LAYOUTS else 9,
                             order.get(k[4], 9)))
    head = ["grid", "dtype", "pdims", "layout", "dir"] + impls
    lines = [PIVOT_LEGEND, "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for shape, dtype, pdims, layout, direction in rows:
        cells = []
        for impl in impls:
            lay = "natural" if impl in LAYOUT_FREE else layout
            cells.append(_cell(latest.get((shape, dtype, pdims, impl, lay, direction))))
        lines.append("| " + " | ".join([fmt_dims(shape), dtype, fmt_dims(pdims), layout, direction] + cells) + " |")
    if absent:
        lines += [""] + [f"Not available here: `{i}` ({note})." for i, note in absent.items()]
    return "\n".join(lines)
