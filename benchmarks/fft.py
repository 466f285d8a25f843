"""Command line of the FFT benchmark: distributed 3D FFTs, pencilfft against jaxdecomp and jnp.fft.fftn.

    python -m benchmarks.fft --devices 8 --shapes 64 --pdims 4x2 1x8 --repeats 10
    mpirun -np 2 python -m benchmarks.fft --devices 4 --shapes 64 --pdims 4x2
    srun python -m benchmarks.fft --shapes 1024 --pdims 4x8          (one task per GPU)
    python -m benchmarks.fft table results/*.jsonl --format markdown

This module is the command line only: the arguments, the run (progress, the results file, the
per-case tables) and the `table` subcommand.  What a case, a variant and a record are, and how
the variants are timed, is `benchmarks.harness`; the implementations are `benchmarks.impls`; the
tables `benchmarks.report`.  Records are appended to `--out`, one JSON line per (variant,
direction), by process 0 only.

Only the standard library is imported at module level: `--devices` must take effect before jax
creates its backend.
"""
from __future__ import annotations

import argparse
import datetime
import json
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.harness import (DIRECTIONS, DTYPES, IMPLS, LAYOUTS, configure_devices, fmt_dims,
                                load_records, machine_info, make_cases, parse_pdims, parse_shape,
                                run_case, variant_plan, versions)
from benchmarks.impls import IMPLEMENTATIONS
from benchmarks.report import markdown_table, rich_table


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.fft",
        description=(
            "Time distributed 3D FFTs (forward and inverse) for several global shapes, meshes, "
            "layouts and dtypes; pencilfft side by side with jaxdecomp and jnp.fft.fftn.  "
            "Results: one JSON line per (case, implementation, direction) appended to --out, and "
            "a table on the terminal.  `python -m benchmarks.fft table FILE...` prints saved "
            "results.  Works in one process (--devices N simulates N CPU devices) and under "
            "mpirun/srun (one process per GPU)."
        ),
        epilog="Implementations:\n" + "\n".join(f"  {k:<20} {v}" for k, v in IMPLS.items()),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    g = p.add_argument_group("what to run")
    g.add_argument("--shapes", "--shape", nargs="+", type=parse_shape, default=[parse_shape("64")],
                   metavar="N|XxYxZ", help="global grid shapes (default: 64)")
    g.add_argument("--pdims", nargs="+", type=parse_pdims, default=["auto"], metavar="PxQ|P|auto",
                   help="meshes: PxQ = pencils on a 2-axis mesh (X split P ways, Y Q ways), "
                        "P = slabs on a 1-axis mesh, auto = most square PxQ using every device "
                        "(default: auto)")
    g.add_argument("--layouts", nargs="+", choices=LAYOUTS, default=list(LAYOUTS),
                   help="k-space layouts (default: both); jaxdecomp runs only 'transposed', "
                        "naive-pencil only 'natural', the fftn baselines are layout-free and "
                        "always run")
    g.add_argument("--dtypes", nargs="+", choices=DTYPES, default=["complex64"],
                   help="k-space precision (default: complex64); complex128 turns on jax x64; "
                        "pencilfft-r2c takes the matching real input")
    g.add_argument("--impls", nargs="+", choices=list(IMPLS), default=list(IMPLS),
                   help="implementations (default: all; unavailable ones are noted as skipped)")
    g.add_argument("--skip", nargs="+", choices=list(IMPLS), default=[], metavar="IMPL",
                   help="implementations to leave out, e.g. --skip fftn-sharded (slow: it gathers)")
    g.add_argument("--directions", nargs="+", choices=DIRECTIONS, default=list(DIRECTIONS),
                   help="default: both")
    g.add_argument("--norm", choices=["backward", "ortho", "forward"], default="backward")
    g.add_argument("--axis-type", choices=["explicit", "auto"], default="explicit",
                   help="axis type of pencilfft's and naive-pencil's mesh (jaxdecomp and fftn always "
                        "get an Auto mesh: jaxdecomp 0.3 fails on Explicit axes)")
    t = p.add_argument_group("how")
    t.add_argument("--repeats", type=int, default=10, help="timed runs per variant and direction (default: 10)")
    t.add_argument("--warmup", type=int, default=2, help="untimed runs first (default: 2)")
    t.add_argument("--seed", type=int, default=0, help="seed of the input data")
    t.add_argument("--check", action=argparse.BooleanOptionalAction, default=True,
                   help="compare every forward result with numpy.fft and the round trip with the "
                        "input, after the timings (default: on; under several processes only up to "
                        "256^3 points, since every process gathers the whole array)")
    t.add_argument("--devices", type=int, default=None, metavar="N",
                   help="simulated CPU devices per process (sets jax_num_cpu_devices unless XLA_FLAGS "
                        "already has --xla_force_host_platform_device_count); ignored on GPU")
    o = p.add_argument_group("output")
    o.add_argument("--out", type=Path, default=Path("results/fft.jsonl"),
                   help="JSON-lines file the records are appended to (default: results/fft.jsonl)")
    o.add_argument("--tag", default="", help="free label stored in every record (e.g. strong, weak)")
    o.add_argument("--markdown", action="store_true",
                   help="also print the results as a markdown table (for benchmarks/RESULTS.md)")
    o.add_argument("--quiet", action="store_true", help="no progress bar and no per-case tables")
    o.add_argument("--dry-run", action="store_true",
                   help="check the arguments, print the plan and exit without starting jax")
    return p


def selected_impls(args: argparse.Namespace) -> list[str]:
    """--impls less --skip, in --impls order."""
    return [i for i in args.impls if i not in set(args.skip)]


def print_plan(args: argparse.Namespace) -> None:
    """What --dry-run prints: the cases and variants, nothing measured."""
    cases = make_cases(args, args.devices)
    variants = variant_plan(selected_impls(args), args.layouts)
    print(f"{len(cases)} case(s) x {len(variants)} variant(s) x {len(args.directions)} direction(s); "
          f"{args.warmup} warm-up + {args.repeats} timed runs each; results -> {args.out}")
    for c in cases:
        print(f"  case {c.label}")
    for impl, lay in variants:
        print(f"  variant {impl} [{lay}]")


def run(args: argparse.Namespace, argv: Sequence[str] = ()) -> int:
    """The benchmark proper (jax started here); `argv` is recorded as the command."""
    configure_devices(args.devices)
    import jax

    import pencilfft

    pencilfft.initialize()  # starts jax.distributed under mpirun/srun; a no-op otherwise
    if "complex128" in args.dtypes:
        jax.config.update("jax_enable_x64", True)
    from rich.console import Console
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                               TimeElapsedColumn, TimeRemainingColumn)

    is_main = jax.process_index() == 0
    # Batch logs are not terminals: rich would wrap the tables to 80 columns.
    console = Console(quiet=not is_main, width=None if sys.stdout.isatty() else 200)
    if args.devices and jax.default_backend() == "cpu" and jax.local_device_count() != args.devices:
        console.print(f"[yellow]note: --devices {args.devices} asked, but this process has "
                      f"{jax.local_device_count()} CPU devices (XLA_FLAGS or an earlier jax start decided)")
    cases = make_cases(args, jax.device_count(), exact=jax.process_count() > 1)
    builders = {impl: IMPLEMENTATIONS[impl] for impl in selected_impls(args)}
    context = {
        "timestamp": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine_info(),
        "versions": versions(),
        "command": "python -m benchmarks.fft " + shlex.join(argv),
    }
    m = context["machine"]
    console.print(f"[bold]{m['device_count']} x {m['device_kind']}[/] ({m['backend']}, "
                  f"{m['process_count']} process(es), host {m['hostname']}); jax {context['versions']['jax']}")
    n_variants = len(variant_plan(list(builders), args.layouts))
    total = len(cases) * (n_variants + args.warmup + args.repeats)
    records: list[dict[str, Any]] = []
    if is_main:  # fail now, not after the first case, if the results file cannot be written
        args.out.parent.mkdir(parents=True, exist_ok=True)
        open(args.out, "a", encoding="utf-8").close()
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), TimeRemainingColumn(), console=console,
                  disable=not is_main or args.quiet) as progress:
        task = progress.add_task("starting", total=total)

        def step(desc: str) -> None:
            progress.update(task, description=desc, advance=1)

        for case in cases:
            recs = run_case(case, args, builders, step, context)
            records.extend(recs)
            if is_main:
                with open(args.out, "a", encoding="utf-8") as f:
                    for r in recs:
                        f.write(json.dumps(r) + "\n")
                if not args.quiet:
                    progress.console.print(rich_table(recs, title=case.label))
        progress.update(task, description="done")
    if is_main:
        if args.quiet or len(cases) > 1:
            console.print(rich_table(records, title="all cases"))
        console.print(f"{len(records)} records appended to {args.out}")
        bad = [r for r in records if r["status"] in ("error", "wrong")]
        for r in bad:
            console.print(f"[red]{r['status']}[/]: {r['impl']} [{r['layout']}] {r['direction']} "
                          f"{fmt_dims(r['shape'])} pdims {fmt_dims(r['pdims'])}: {r['note']}")
        if args.markdown:
            print(markdown_table(records))
    return 0


def table_main(argv: Sequence[str]) -> int:
    """`python -m benchmarks.fft table FILE...`: saved results as a rich or markdown table."""
    p = argparse.ArgumentParser(prog="python -m benchmarks.fft table",
                                description="Print saved benchmark results (JSON lines) as a table.")
    p.add_argument("files", nargs="+", type=Path, help="results files written by --out")
    p.add_argument("--format", choices=["rich", "markdown", "markdown-long"], default="rich",
                   help="rich: terminal table; markdown: one column per implementation, "
                        "cells 'median ms (speedup vs fftn on one device)'; markdown-long: every field")
    p.add_argument("--status", nargs="+", default=None, metavar="STATUS",
                   help="keep only these statuses (ok skipped error wrong)")
    a = p.parse_args(argv)
    records = load_records(a.files)
    if a.status:
        records = [r for r in records if r["status"] in a.status]
    if a.format == "rich":
        from rich.console import Console

        Console(width=None if sys.stdout.isatty() else 200).print(rich_table(records))
    else:
        print(markdown_table(records, "long" if a.format == "markdown-long" else "pivot"))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """The command line: `table ...` or a benchmark run (`--dry-run`: only the plan)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "table":
        return table_main(argv[1:])
    args = build_parser().parse_args(argv)
    if args.repeats < 1 or args.warmup < 0:
        raise SystemExit("error: --repeats must be >= 1 and --warmup >= 0")
    if not selected_impls(args):
        raise SystemExit("error: every implementation is skipped")
    if args.dry_run:
        print_plan(args)
        return 0
    return run(args, argv)


if __name__ == "__main__":
    sys.exit(main())
