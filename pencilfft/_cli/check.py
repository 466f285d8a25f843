"""`pencilfft check`: the distributed FFT on every mesh and layout, cross-checked and timed.

For each case: the error of pfft3d against jnp.fft.fftn of the same array, against
jaxdecomp.pfft3d (transposed layout, when jaxdecomp is installed and the grid needs no
padding), the round-trip error of pifft3d(pfft3d(x), s=shape), the median forward time, and its
speedup over jnp.fft.fftn on the sharded array (which all-gathers the grid onto every device).
Both jnp.fft.fftn calls gather the grid onto every device first (`jax.sharding.reshard` to the
replicated sharding), as XLA does when handed a sharded FFT it cannot distribute (every layout
pencilfft takes leaves the last axis whole): the same program, but XLA has nothing to warn
about, where on jax 0.12 it printed `[SPMD] Falling back to replicated execution for tiled FFT
operation` once per program, lines that read as pencilfft gathering.
A spectrum the mesh pads (docs/concepts.md, "Grids the mesh does not divide") is sliced back to the exact
spectrum before the comparison, and its padding must be zero.  Only process 0 prints.
jnp.fft.fftn is called as `_transforms.xla_fft` calls it: its FFT's layouts pinned on CPUs,
as pencilfft's own are (jax 0.11's XLA:CPU refused an unpinned one on this path, aborting the
check); the same computation.

The header says what runs: jax's version and whether it is in the range the suite has passed
on, the exchanges, the local FFT kernel, the CPU threads and the allocator.

A setting of the environment that cannot apply (`PENCILFFT_THREADS=0`,
`PENCILFFT_MALLOC=bogus`, `PENCILFFT_FFT_KERNEL`, `PENCILFFT_FFTW_PLANNER`,
`PENCILFFT_MEMORY_LIMIT`: anything a setting's reader refuses with a ValueError) is reported,
not raised: its header line reads "error: " and the reader's one-line message (the variable,
the value, what is expected), the rest of the header is printed, and the check stops with exit
status 2 and one line saying so, without running a case.  Not "the cases run with the setting
ignored": every transform of the user's own programs raises that same error, so a table of
passed cases would say the opposite of what the user will meet.  Under mpirun the processes
agree on it (`_processes.agree`): if any process has a bad setting, every one stops.

Exit status of `run_check`: 0 every case passed, 1 a case failed or no mesh could be checked,
2 an option or a setting that cannot apply (a mesh of the wrong size or number of axes, a grid
too big for the check's reference, a bad environment variable).
"""
from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

from .._decomposition.rules import check_mesh, process_grids, split_problem
from .._decomposition.sharding import real_space_sharding
from .._exchange import local_status, mpi as _mpi_exchange
from .._jax_private import WHERE_TO_REPORT, jax_support, tested_range
from .._measure import max_rel_err, median_time
from .._native import malloc as _malloc, threads as _threads
from .._processes import agree as _agree, memory as _memory
from .._transforms import kernel as _kernel, xla_fft
from .._transforms.fft import pfft3d, pifft3d

TOLERANCE = {"complex64": 1e-5, "complex128": 1e-12}
# Whole grids alive per device at once while the reference is compared: the sharded input
# gathered by jnp.fft.fftn, its output, and the replicated spectrum and reference.
_REFERENCE_GRIDS = 4


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
    padded: str = ""  # e.g. "Y 32->33": the k-space axes the mesh pads


def default_meshes(n: int) -> list[tuple[int, ...]]:
    return [*process_grids(n), (n,)]


def axis_names(n_axes: int) -> tuple[str, ...]:
    """Mesh axis names: "x", "y" for the axes that split X and Y (the last two); leading axes,
    if a mesh has more, are "b0", "b1", ..."""
    return tuple(f"b{i}" for i in range(n_axes - 2)) + ("x", "y")[: n_axes]


def make_mesh(mesh_shape) -> jax.sharding.Mesh:
    names = axis_names(len(mesh_shape))
    return jax.make_mesh(tuple(mesh_shape), names, axis_types=(AxisType.Explicit,) * len(names))


def _fmt(dims) -> str:
    return "x".join(map(str, dims))


def xy_pdims(mesh_shape) -> tuple[int, ...]:
    """The sizes of the mesh axes that split X and Y in real space: the last two."""
    return tuple(mesh_shape[-2:])


def real_space_problem(shape, mesh_shape) -> str | None:
    """Why the grid cannot be split on the mesh in real space (X by the axis before last, Y by
    the last), e.g. "X=30 not divisible by 4"; None if it can (`_decomposition`'s rule)."""
    xy = xy_pdims(mesh_shape)
    if split_problem(shape, xy) is None:
        return None
    return next(f"{label}={n} not divisible by {p}"
                for label, n, p in zip("XY", shape[:2], xy) if n % p)


def padding(shape, mesh_shape) -> str:
    """The k-space axes a mesh pads, e.g. "Y 32->33" ("" for none): Y to a multiple of the
    axis that splits X in real space, Z to one of the axis that splits Y (docs/concepts.md's rule)."""
    xy = xy_pdims(mesh_shape)
    pa, pb = xy[0], (xy[1] if len(xy) > 1 else 1)
    out = []
    for label, n, p in (("Y", shape[1], pa), ("Z", shape[2], pb)):
        if n % p:
            out.append(f"{label} {n}->{-(-n // p) * p}")
    return ", ".join(out)


def _jaxdecomp_error(x_np, mesh_shape, exact) -> tuple[float | None, str]:
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
    return max_rel_err(exact, jax.device_put(kd, exact.sharding)), ""


def _exact_spectrum(k, exact_shape, replicated):
    """(the exact spectrum, max |padding|): `k` replicated, then sliced (JAX cannot slice a
    sharded axis to a length the mesh does not divide; the recipe of docs/concepts.md)."""

    @jax.jit
    def cut(k):
        whole = jax.sharding.reshard(k, replicated)
        region = tuple(slice(0, n) for n in exact_shape)
        return whole[region], jnp.max(jnp.abs(whole.at[region].set(0)))

    exact, pad = cut(k)
    return exact, float(pad)


def ensemble(x_np: np.ndarray, mesh_shape) -> np.ndarray:
    """The grid checked on `mesh_shape`: x_np itself, or, on a mesh with batch axes (all but the
    last two), an ensemble of differently scaled copies, one leading axis per batch axis."""
    lead = tuple(mesh_shape[:-2])
    if not lead:
        return x_np
    scale = np.arange(1, math.prod(lead) + 1).reshape(lead + (1, 1, 1))
    return (x_np * scale).astype(x_np.dtype)


def check_case(x_np: np.ndarray, mesh_shape, layout: str, dtype: str, repeats: int) -> Row:
    mesh = make_mesh(mesh_shape)
    x_np = ensemble(x_np, mesh_shape)
    shape = tuple(x_np.shape)
    n_lead = len(shape) - 3
    x = jax.make_array_from_callback(shape, real_space_sharding(mesh, len(shape)),
                                     lambda i: x_np[i])
    replicated = NamedSharding(mesh, P())
    fwd = jax.jit(lambda a: pfft3d(a, layout=layout))
    bwd = jax.jit(lambda a: pifft3d(a, s=shape[-3:], layout=layout))
    axes = (-3, -2, -1)
    # jnp.fft.fftn of the sharded array, gathered first (the module's docstring says why).
    fftn_sharded = jax.jit(lambda a: xla_fft.fftn(jax.sharding.reshard(a, replicated), "fft", axes))
    lead = tuple(range(n_lead))
    order = lead + ((n_lead + 1, n_lead + 2, n_lead) if layout == "transposed"
                    else (n_lead, n_lead + 1, n_lead + 2))
    reference = jax.jit(lambda a: jnp.transpose(
        xla_fft.fftn(jax.sharding.reshard(a, replicated), "fft", axes), order))
    k = fwd(x)
    exact, pad = _exact_spectrum(k, tuple(shape[i] for i in order), replicated)
    ref = reference(x)
    err = max_rel_err(exact, ref)
    scale = float(jnp.max(jnp.abs(ref))) or 1.0
    err = max(err, pad / scale)  # the padding must be zero
    padded = padding(shape[-3:], mesh_shape)
    err_jd, note = None, ""
    if layout == "transposed":
        if padded:
            note = "n/a: padded"  # jaxdecomp refuses grids its mesh does not divide
        else:
            err_jd, note = _jaxdecomp_error(x_np, mesh_shape, exact)
    return Row(
        mesh=_fmt(mesh_shape),
        layout=layout,
        err_fftn=err,
        err_jaxdecomp=err_jd,
        err_roundtrip=max_rel_err(bwd(k), x),
        time_s=median_time(fwd, x, repeats=repeats),
        time_fftn_s=median_time(fftn_sharded, x, repeats=repeats),
        note=note,
        padded=padded,
    )


def _mesh_problem(mesh_shape, n: int) -> str | None:
    """Why `mesh_shape` cannot be used with n devices (None if it can)."""
    if math.prod(mesh_shape) != n:
        return f"mesh {_fmt(mesh_shape)} needs {math.prod(mesh_shape)} devices; there are {n}"
    try:
        check_mesh(make_mesh(mesh_shape))
    except (TypeError, ValueError) as e:
        return f"mesh {_fmt(mesh_shape)}: {e}"
    return None


def _reference_problem(shape, dtype: str) -> str | None:
    """The check's reference holds whole grids on every device: refuse a grid that cannot fit
    (XLA would abort the process) before anything is allocated."""
    free = _memory.available(jax.local_devices())
    grid = math.prod(shape) * np.dtype(dtype).itemsize
    need = _REFERENCE_GRIDS * grid
    if free is None or need <= free.per_device:
        return None
    return (f"--shape {_fmt(shape)} is too large for the check: its reference (jnp.fft.fftn on "
            f"the sharded array) gathers the {_memory.gib(grid)} grid onto every device and needs "
            f"about {_memory.gib(need)} per device, but a device has about {_memory.gib(free.per_device)} "
            f"({free.source}); use a smaller --shape")


def jax_line() -> str:
    """jax's version and whether the suite has passed on it, for the header."""
    version, ok = jax_support()
    if ok:
        return f"jax {version} (tested: {tested_range()})"
    return (f"jax {version} (NOT in the tested range {tested_range()}: it may work, or fail "
            f"where the suite would have caught it; please report what you see in "
            f"{WHERE_TO_REPORT})")


class _Settings:
    """The settings the header reads, each reported on its line: its description, or "error: "
    and the message of the ValueError its reader raised (collected in `errors`)."""

    def __init__(self) -> None:
        self.errors: list[str] = []

    def line(self, describe: Callable[[], str]) -> str:
        try:
            return describe()
        except ValueError as e:
            if str(e) not in self.errors:  # one setting read by several lines counts once
                self.errors.append(str(e))
            return f"error: {e}"


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
    if args.repeats < 1:
        raise ValueError(f"`repeats` must be at least 1; got {args.repeats}")
    n = jax.device_count()
    meshes = args.meshes or default_meshes(n)
    lead = jax.process_index() == 0
    console = Console(quiet=not lead, stderr=False)
    console.width = max(console.width, 112)  # the table is wider than a pipe's default 80
    problems = [p for p in (_mesh_problem(m, n) for m in meshes) if p]
    settings = _Settings()
    memory_limit = settings.line(lambda: str(_memory.setting()))  # before it is used below
    if not settings.errors:
        problems += [p for p in [_reference_problem(args.shape, args.dtype)] if p]
    if problems:
        console.print(f"pencilfft check: error: {problems[0]}", style="red", markup=False)
        return 2
    X, Y, Z = args.shape
    rng = np.random.default_rng(0)
    x_np = (rng.standard_normal(args.shape) + 1j * rng.standard_normal(args.shape)).astype(args.dtype)
    console.print(
        f"pencilfft check: grid {X}x{Y}x{Z} {args.dtype}, {n} {jax.devices()[0].platform} devices "
        f"in {jax.process_count()} process(es), {jax_line()}", markup=False, soft_wrap=True)
    lines = [("cross-process exchanges", _mpi_exchange.status),
             ("exchanges between a process's devices", local_status)]
    if jax.devices()[0].platform == "cpu":
        lines += [("local FFT kernel", _kernel.describe),  # docs/howto/cpu-performance.md
                  # the threads of the CPU kernels and the allocator (docs:
                  # cpu-threads-and-allocator)
                  ("CPU threads", _threads.describe), ("allocator", _malloc.describe)]
    if settings.errors:
        console.print(f"memory limit: {memory_limit}", markup=False, soft_wrap=True)
    for label, describe in lines:
        console.print(f"{label}: {settings.line(describe)}", markup=False, soft_wrap=True)
    if settings.errors and not lead:  # only process 0 prints: say it where it is wrong
        for error in settings.errors:
            print(f"pencilfft check (process {jax.process_index()}): error: {error}",
                  file=sys.stderr)
    # Every process stops if one has a bad setting: the others would wait for it forever.
    if _agree.least(int(not settings.errors), "check's settings") == 0:
        console.print("pencilfft check: error: "
                      + ("the setting above cannot apply" if len(settings.errors) == 1 else
                         f"the {len(settings.errors)} settings above cannot apply"
                         if settings.errors else "a setting cannot apply on another process "
                         "(it says which on its stderr)")
                      + "; pencilfft's transforms would raise the same error: no case was run",
                      style="red", markup=False, soft_wrap=True)
        return 2
    tol = TOLERANCE[args.dtype]
    table = Table(title="pfft3d / pifft3d vs jnp.fft.fftn")
    for col in ("mesh", "layout", "err vs fftn", "err vs jaxdecomp", "round trip",
                "pfft3d ms", "fftn(sharded) ms", "speedup", "status"):
        table.add_column(col, justify="right" if col not in ("mesh", "layout", "status") else "left",
                         no_wrap=col == "status")
    failed = checked = 0
    padded = {}
    for mesh_shape in meshes:
        why = real_space_problem(args.shape, mesh_shape)
        if why is not None:
            table.add_row(_fmt(mesh_shape), "-", *["-"] * 6, f"skipped: {why}")
            continue
        for layout in args.layouts:
            row = check_case(x_np, mesh_shape, layout, args.dtype, args.repeats)
            errors = [row.err_fftn, row.err_roundtrip] + (
                [row.err_jaxdecomp] if row.err_jaxdecomp is not None else [])
            ok = all(e <= tol for e in errors)
            failed += not ok
            checked += 1
            if row.padded:
                padded[row.mesh] = row.padded
            table.add_row(
                row.mesh, row.layout, f"{row.err_fftn:.1e}",
                f"{row.err_jaxdecomp:.1e}" if row.err_jaxdecomp is not None else (row.note or "-"),
                f"{row.err_roundtrip:.1e}", f"{row.time_s * 1e3:.1f}",
                f"{row.time_fftn_s * 1e3:.1f}", f"{row.time_fftn_s / row.time_s:.1f}x",
                ("[green]ok" if ok else f"[red]FAIL (> {tol:g})")
                + (" (padded)" if row.padded else ""),
            )
    console.print(table)
    console.print(f"errors: max|err|/max|ref|, tolerance {tol:g}; times: median of {args.repeats} "
                  "forward runs; fftn(sharded): jnp.fft.fftn on the same sharded array, which "
                  "gathers it onto every device")
    if padded:
        console.print("padded: the mesh does not divide the grid in k space ("
                      + "; ".join(f"{m}: {p}" for m, p in padded.items())
                      + "); the spectrum was sliced back to the exact one, and its padding "
                      "checked to be zero", markup=False)
    try:
        import jaxdecomp  # noqa: F401
    except ImportError:
        console.print("err vs jaxdecomp n/a: jaxdecomp is not installed "
                      "(pip install jaxdecomp packaging, or pip install -e '.[test]')",
                      markup=False)  # rich would take "[test]" for a style and drop it
    if not checked:
        console.print(
            f"[red]nothing was checked: no mesh asked for splits the grid {X}x{Y}x{Z} in real "
            "space (X must be divisible by the mesh's second-to-last axis, Y by its last); choose "
            "another --shape or --mesh")
        return 1
    console.print("all checks passed" if not failed else f"[red]{failed} case(s) failed")
    return 1 if failed else 0
