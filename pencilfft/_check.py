"""`pencilfft check`: the distributed FFT on every mesh and layout, cross-checked and timed.

For each case: the error of pfft3d against jnp.fft.fftn of the same array, against
jaxdecomp.pfft3d (transposed layout, when jaxdecomp is installed), the round-trip error of
pifft3d(pfft3d(x)), the median forward time, and its speedup over jnp.fft.fftn on the sharded
array (which all-gathers the grid onto every device).  Only process 0 prints.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, NamedSharding

from ._decomposition import fits, process_grids
from ._fft import pfft3d, pifft3d
from ._measure import max_rel_err, median_time
from ._sharding import real_space_sharding

TOLERANCE = {"complex64": 1e-5, "complex128": 1e-12}


@dataclass
class Row:
    mesh: str
    layout: str
    err_fftn: float
    err_jaxdecomp: float | None  # None: not applicable or not installed
    err_roundtrip: float
    time_s: float
    time_fftn_s: float
    note: str = ""


def default_meshes(n: int) -> list[tuple[int, ...]]:
    return [*process_grids(n), (n,)]


def _jaxdecomp_error(x_np, mesh_shape, k, dtype) -> tuple[float | None, str]:
    try:
        import jaxdecomp
    except ImportError:
        return None, "n/a"
    if len(mesh_shape) != 2:
        return None, ""
    # jaxdecomp 0.3 needs Auto mesh axes (it fails on the Explicit default of jax.make_mesh).
    auto = jax.make_mesh(mesh_shape, ("x", "y"), axis_types=(AxisType.Auto,) * 2)
    xa = jax.make_array_from_callback(x_np.shape, real_space_sharding(auto), lambda i: x_np[i])
    try:
        kd = jax.jit(jaxdecomp.pfft3d)(xa)
    except Exception as e:  # report, do not abort the whole check
        return None, f"jaxdecomp failed: {type(e).__name__}"
    kd = jax.device_put(kd, NamedSharding(k.sharding.mesh, k.sharding.spec))
    return max_rel_err(k, kd), ""


def check_case(x_np: np.ndarray, mesh_shape, layout: str, dtype: str, repeats: int) -> Row:
    names = ("x", "y")[: len(mesh_shape)]
    mesh = jax.make_mesh(mesh_shape, names, axis_types=(AxisType.Explicit,) * len(names))
    x = jax.make_array_from_callback(x_np.shape, real_space_sharding(mesh), lambda i: x_np[i])
    fwd = jax.jit(lambda a: pfft3d(a, layout=layout))
    bwd = jax.jit(lambda a: pifft3d(a, layout=layout))
    fftn_sharded = jax.jit(lambda a: jnp.fft.fftn(a))
    k = fwd(x)
    ref = fftn_sharded(x)
    if layout == "transposed":
        ref = jax.jit(lambda r: jnp.transpose(r, (1, 2, 0)), out_shardings=k.sharding)(ref)
    else:
        ref = jax.device_put(ref, k.sharding)
    err_jd, note = (None, "")
    if layout == "transposed":
        err_jd, note = _jaxdecomp_error(x_np, mesh_shape, k, dtype)
    return Row(
        mesh="x".join(map(str, mesh_shape)),
        layout=layout,
        err_fftn=max_rel_err(k, ref),
        err_jaxdecomp=err_jd,
        err_roundtrip=max_rel_err(bwd(k), x),
        time_s=median_time(fwd, x, repeats=repeats),
        time_fftn_s=median_time(fftn_sharded, x, repeats=repeats),
        note=note,
    )


def run_check(args: argparse.Namespace) -> int:
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError as e:
        raise ImportError(
            f"`pencilfft check` prints its report with rich ({e}): pip install 'pencilfft[cli]'"
        ) from e

    if args.dtype == "complex128":
        jax.config.update("jax_enable_x64", True)
    n = jax.device_count()
    meshes = args.meshes or default_meshes(n)
    lead = jax.process_index() == 0
    console = Console(quiet=not lead)
    console.width = max(console.width, 112)  # the table is wider than a pipe's default 80
    bad = [m for m in meshes if int(np.prod(m)) != n]
    if bad:
        console.print(f"[red]mesh {bad[0]} needs {int(np.prod(bad[0]))} devices; there are {n}")
        return 2
    X, Y, Z = args.shape
    rng = np.random.default_rng(0)
    x_np = (rng.standard_normal(args.shape) + 1j * rng.standard_normal(args.shape)).astype(args.dtype)
    console.print(
        f"pencilfft check: grid {X}x{Y}x{Z} {args.dtype}, {n} {jax.devices()[0].platform} devices "
        f"in {jax.process_count()} process(es), jax {jax.__version__}"
    )
    tol = TOLERANCE[args.dtype]
    table = Table(title="pfft3d / pifft3d vs jnp.fft.fftn")
    for col in ("mesh", "layout", "err vs fftn", "err vs jaxdecomp", "round trip",
                "pfft3d ms", "fftn(sharded) ms", "speedup", "status"):
        table.add_column(col, justify="right" if col not in ("mesh", "layout", "status") else "left")
    failed = 0
    for mesh_shape in meshes:
        pa, pb = mesh_shape[0], (mesh_shape[1] if len(mesh_shape) == 2 else 1)
        if not fits(args.shape, mesh_shape):
            table.add_row("x".join(map(str, mesh_shape)), "-", *["-"] * 6,
                          f"skipped: X={X} % {pa} or Y={Y} % {pb}")
            continue
        for layout in args.layouts:
            row = check_case(x_np, mesh_shape, layout, args.dtype, args.repeats)
            errors = [row.err_fftn, row.err_roundtrip] + (
                [row.err_jaxdecomp] if row.err_jaxdecomp is not None else [])
            ok = all(e <= tol for e in errors)
            failed += not ok
            table.add_row(
                row.mesh, row.layout, f"{row.err_fftn:.1e}",
                f"{row.err_jaxdecomp:.1e}" if row.err_jaxdecomp is not None else (row.note or "-"),
                f"{row.err_roundtrip:.1e}", f"{row.time_s * 1e3:.1f}",
                f"{row.time_fftn_s * 1e3:.1f}", f"{row.time_fftn_s / row.time_s:.1f}x",
                "[green]ok" if ok else f"[red]FAIL (> {tol:g})",
            )
    console.print(table)
    console.print(f"errors: max|err|/max|ref|, tolerance {tol:g}; times: median of {args.repeats} "
                  "forward runs; fftn(sharded): jnp.fft.fftn on the same sharded array")
    try:
        import jaxdecomp  # noqa: F401
    except ImportError:
        console.print("err vs jaxdecomp n/a: jaxdecomp is not installed "
                      "(pip install jaxdecomp packaging, or pip install -e '.[test]')",
                      markup=False)  # rich would take "[test]" for a style and drop it
    console.print("all checks passed" if not failed else f"[red]{failed} case(s) failed")
    return 1 if failed else 0
