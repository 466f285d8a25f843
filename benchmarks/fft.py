"""Benchmark harness: distributed 3D FFTs, pencilfft against jaxdecomp and jnp.fft.fftn.

    python -m benchmarks.fft --devices 8 --shapes 64 --pdims 4x2 1x8 --repeats 10
    mpirun -np 2 python -m benchmarks.fft --devices 4 --shapes 64 --pdims 4x2
    srun python -m benchmarks.fft --shapes 1024 --pdims 4x8          (one task per GPU)
    python -m benchmarks.fft table results/*.jsonl --format markdown

A *case* is one (global shape, dtype, mesh).  Within a case every implementation/layout (a
*variant*) gets the same input data, is compiled once per direction (compile time measured
separately), warmed up, then timed `--repeats` times with `block_until_ready`.  The variants run
round-robin (repeat r of every variant before repeat r+1 of any, the starting variant rotating
each round) so that drift of the machine (thermal, other users, the OS) spreads over all of them
instead of favouring whichever ran first.  Each (variant, direction) becomes one JSON line in
`--out`, written by process 0 only.

Under mpirun/srun each process builds only its own blocks of the input (a seeded generator per
block, `jax.make_array_from_callback`), the per-repeat times are the maximum over processes, and
the single-device baseline is skipped.

Only the standard library is imported at module level: `--devices` must take effect before jax
creates its backend.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import functools
import importlib
import inspect
import json
import math
import os
import platform
import shlex
import socket
import statistics
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

SCHEMA = 1

# Implementation name -> what it runs.  Order = column order in the tables.
IMPLS: dict[str, str] = {
    "pencilfft": "pencilfft.pfft3d / pifft3d (complex-to-complex), exchange='auto'",
    "pencilfft-jit": "pencilfft.pfft3d / pifft3d called as jaxdecomp's users do: jax.jit on an "
                     "array sharded over an Auto mesh, no mesh= and no mesh in scope (the "
                     "compiler-partitioned path)",
    "pencilfft-a2a": "the same with exchange='alltoall' on every mesh axis (the first version)",
    "pencilfft-r2c": "pencilfft.prfft3d / pirfft3d (real-to-complex, half spectrum), if present",
    "naive-pencil": "plain shard_map pencil: jnp.fft.fft along strided axes 0 and 1, all_to_all "
                    "without local reordering (natural layout; the 'before' of issue 6)",
    "jaxdecomp": "jaxdecomp.pfft3d / pifft3d, backend='jax' (XLA collectives)",
    "jaxdecomp-cudecomp": "jaxdecomp.pfft3d / pifft3d, backend='cudecomp' (GPU build only)",
    "fftn-sharded": "jnp.fft.fftn / ifftn on the sharded array (XLA gathers the whole array)",
    "fftn-1dev": "jnp.fft.fftn / ifftn on one device: the reference for speedups",
}
BASELINE = "fftn-1dev"
# Implementations whose output order does not depend on `--layouts`: their results are in
# natural order and they run once per case whatever layouts were asked for.
LAYOUT_FREE = ("fftn-sharded", "fftn-1dev")
# Implementations that have a single layout: run only when that layout is asked for.
ONE_LAYOUT = {"naive-pencil": "natural", "jaxdecomp": "transposed", "jaxdecomp-cudecomp": "transposed"}
DIRECTIONS = ("forward", "inverse")
LAYOUTS = ("transposed", "natural")
DTYPES = ("complex64", "complex128")
REAL_DTYPE = {"complex64": "float32", "complex128": "float64"}
# Acceptance of --check, max|err| / max|ref|, per precision (loose: 256^3 single precision
# accumulates ~log2(N) roundings).
CHECK_TOL = {"complex64": 1e-4, "complex128": 1e-10}
# Largest global array (points) --check gathers onto every process under mpirun/srun.
CHECK_MAX_POINTS_MP = 256**3

# Every record has these keys (values may be None for skipped/failed variants).
RECORD_FIELDS = (
    "schema", "timestamp", "tag", "status", "note",
    "impl", "layout", "direction", "shape", "n_points", "dtype", "input_dtype", "norm",
    "pdims", "axis_type", "mesh_devices", "n_devices",
    "repeats", "warmup", "lower_s", "compile_s", "median_s", "min_s", "max_s", "mean_s", "std_s",
    "times_s", "flops", "gflops", "gflops_per_device", "speedup_vs_fftn_1dev",
    "mem_argument_bytes", "mem_output_bytes", "mem_temp_bytes", "mem_alias_bytes", "mem_bytes",
    "max_rel_err", "machine", "versions", "command",
)
# Of these, the ones that must be positive numbers in an "ok" record (speedup_vs_fftn_1dev
# too, except under several processes, where there is no one-device baseline: None).
POSITIVE_FIELDS = (
    "n_points", "mesh_devices", "n_devices", "repeats", "compile_s", "median_s", "min_s",
    "max_s", "flops", "gflops", "gflops_per_device",
)


class Skip(Exception):
    """A variant that cannot run here (not installed, wrong mesh, too big...): noted, not an error."""


# --------------------------------------------------------------------------------------------
# Parsing and planning (no jax needed: `--dry-run` and the slurm tests use only this part)
# --------------------------------------------------------------------------------------------

def parse_shape(text: str) -> tuple[int, int, int]:
    """'128' -> (128, 128, 128); '256x128x64' -> (256, 128, 64)."""
    parts = text.lower().split("x")
    try:
        dims = tuple(int(p) for p in parts)
    except ValueError:
        raise argparse.ArgumentTypeError(f"shape {text!r}: expected N or XxYxZ, e.g. 128 or 256x128x64")
    if len(dims) == 1:
        dims = dims * 3
    if len(dims) != 3 or min(dims) < 1:
        raise argparse.ArgumentTypeError(f"shape {text!r}: expected N or XxYxZ with positive sizes")
    return dims  # type: ignore[return-value]


def parse_pdims(text: str) -> tuple[int, ...] | str:
    """'4x2' -> (4, 2) (pencils); '8' -> (8,) (slabs on a 1-axis mesh); 'auto' kept as is."""
    if text == "auto":
        return text
    try:
        dims = tuple(int(p) for p in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"pdims {text!r}: expected PxQ (e.g. 4x2), P (e.g. 8) or auto")
    if len(dims) not in (1, 2) or min(dims) < 1:
        raise argparse.ArgumentTypeError(f"pdims {text!r}: expected 1 or 2 positive sizes")
    return dims


def square_pdims(n: int) -> tuple[int, int]:
    """The most square (P, Q) with P * Q = n and P <= Q (slurm/common.sh has the same rule)."""
    if n < 1:
        raise ValueError(f"need n >= 1 devices, got {n}")
    p = int(math.isqrt(n))
    while n % p:
        p -= 1
    return p, n // p


def fmt_dims(dims: Sequence[int]) -> str:
    return "x".join(str(d) for d in dims)


def fft_flops(shape: Sequence[int], real: bool) -> float:
    """Nominal flop count of one 3D transform: 5 N log2 N (complex), 2.5 N log2 N (real-to-complex).

    The usual convention (FFTW's benchFFT): it ignores the algorithm actually used, so GFlop/s
    is a speed normalised by problem size, comparable across sizes, not a hardware count.
    """
    n = math.prod(shape)
    return (2.5 if real else 5.0) * n * math.log2(n) if n > 1 else 0.0


def validate_case(shape: Sequence[int], pdims: Sequence[int]) -> str | None:
    """Why this (shape, mesh) cannot be benchmarked, or None.

    The library's own rule (`pencilfft._decomposition.split_problem`): the real-space input is
    split X over the first mesh axis and Y over the second, and these must divide exactly.
    """
    from pencilfft._decomposition import split_problem

    problem = split_problem(shape, pdims, ("x", "y"))
    return None if problem is None else problem[1]


def variant_plan(impls: Sequence[str], layouts: Sequence[str]) -> list[tuple[str, str]]:
    """The (impl, layout) pairs of one case, before anything is known about the machine."""
    out = []
    for impl in impls:
        if impl in LAYOUT_FREE:
            out.append((impl, "natural"))
        elif impl in ONE_LAYOUT:
            out.extend((impl, lay) for lay in layouts if lay == ONE_LAYOUT[impl])
        else:
            out.extend((impl, lay) for lay in layouts)
    return out


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


@dataclasses.dataclass(frozen=True)
class Case:
    shape: tuple[int, int, int]
    dtype: str
    pdims: tuple[int, ...]

    @property
    def label(self) -> str:
        return f"{fmt_dims(self.shape)} {self.dtype} pdims {fmt_dims(self.pdims)}"


def resolve_pdims(pdims: Sequence[tuple[int, ...] | str], n_devices: int | None) -> list[tuple[int, ...]]:
    """Replace 'auto' by the most square mesh of `n_devices` (left as 'auto' if unknown yet)."""
    out: list[tuple[int, ...]] = []
    for pd in pdims:
        pd2 = square_pdims(n_devices) if pd == "auto" and n_devices else pd
        if pd2 not in out:
            out.append(pd2)  # type: ignore[arg-type]
    return out


def make_cases(args: argparse.Namespace, n_devices: int | None, exact: bool = False) -> list[Case]:
    """All cases in run order; raises SystemExit with a clear message on an impossible one.

    `exact`: every mesh must use all `n_devices` (several processes: a process left out of a
    mesh would have nothing to run).
    """
    cases = []
    for shape in args.shapes:
        for dtype in args.dtypes:
            for pd in resolve_pdims(args.pdims, n_devices):
                if pd == "auto":
                    cases.append(Case(shape, dtype, ("auto",)))  # type: ignore[arg-type]
                    continue
                why = validate_case(shape, pd)
                if why:
                    raise SystemExit(f"error: shape {fmt_dims(shape)} on pdims {fmt_dims(pd)}: {why}")
                if n_devices is not None and math.prod(pd) > n_devices:
                    raise SystemExit(f"error: pdims {fmt_dims(pd)} needs {math.prod(pd)} devices; "
                                     f"there are {n_devices}")
                if exact and math.prod(pd) != n_devices:
                    raise SystemExit(f"error: pdims {fmt_dims(pd)} uses {math.prod(pd)} of the "
                                     f"{n_devices} devices; with several processes every mesh "
                                     "must use all of them")
                cases.append(Case(shape, dtype, pd))
    return cases


def selected_impls(args: argparse.Namespace) -> list[str]:
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


# --------------------------------------------------------------------------------------------
# jax side
# --------------------------------------------------------------------------------------------

def configure_devices(n: int | None) -> None:
    """Ask for `n` simulated CPU devices per process, if jax's backend does not exist yet.

    XLA_FLAGS wins when it already sets a count (the test suite and mpirun runners do); the
    option only affects the CPU backend, so it is harmless on GPU machines.
    """
    if n is None or "xla_force_host_platform_device_count" in os.environ.get("XLA_FLAGS", ""):
        return
    import jax

    try:
        jax.config.update("jax_num_cpu_devices", n)
    except RuntimeError:
        pass  # backend already up (e.g. called in-process from the tests): the count is fixed


def machine_info() -> dict[str, Any]:
    """Where the numbers come from; stored in every record."""
    import jax

    dev = jax.devices()[0]
    env = {k: os.environ[k] for k in ("SLURM_JOB_ID", "SLURM_JOB_PARTITION", "SLURM_JOB_NUM_NODES",
                                      "SLURM_NTASKS", "SLURM_JOB_CONSTRAINTS", "XLA_FLAGS")
           if k in os.environ}
    return {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "backend": jax.default_backend(),
        "device_kind": dev.device_kind,
        "device_count": jax.device_count(),
        "local_device_count": jax.local_device_count(),
        "process_count": jax.process_count(),
        "env": env,
    }


def versions() -> dict[str, Any]:
    import jax
    import jaxlib

    out: dict[str, Any] = {"jax": jax.__version__, "jaxlib": jaxlib.__version__}
    try:
        import pencilfft

        out["pencilfft"] = getattr(pencilfft, "__version__", None)
    except Exception:  # noqa: BLE001 - a broken pencilfft is reported by its variants
        out["pencilfft"] = None
    try:
        from importlib.metadata import version

        out["jaxdecomp"] = version("jaxdecomp")
    except Exception:  # noqa: BLE001
        out["jaxdecomp"] = None
    out["git_commit"] = _git_commit()
    return out


def _git_commit() -> str | None:
    """HEAD of the checkout the harness runs from, '+dirty' if tracked files changed.

    GIT_OPTIONAL_LOCKS=0: `git status` must not rewrite the index of a tree someone else uses.
    """
    root = Path(__file__).resolve().parent.parent
    env = dict(os.environ, GIT_OPTIONAL_LOCKS="0")
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, env=env,
                              capture_output=True, text=True, timeout=10)
        if head.returncode:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               env=env, capture_output=True, text=True, timeout=10)
        return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None


def make_input(shape: Sequence[int], sharding: Any, dtype: str, seed: int):
    """A global random array built block by block: no process ever holds more than its blocks.

    Each block's generator is seeded with (seed, block start): the data are reproducible for a
    given block structure whatever the number of processes.
    """
    import jax
    import numpy as np

    real = np.dtype(dtype).kind == "f"
    rdt = np.dtype(dtype) if real else np.dtype(REAL_DTYPE[dtype])

    def block(idx: tuple[slice, ...]) -> np.ndarray:
        starts = [s.indices(n)[0] for s, n in zip(idx, shape)]
        bshape = [len(range(*s.indices(n))) for s, n in zip(idx, shape)]
        rng = np.random.default_rng([seed, *starts])
        if real:
            return rng.standard_normal(bshape, dtype=rdt)
        out = np.empty(bshape, dtype)  # filled in place: no complex128 temporary
        out.real = rng.standard_normal(bshape, dtype=rdt)
        out.imag = rng.standard_normal(bshape, dtype=rdt)
        return out

    return jax.make_array_from_callback(tuple(shape), sharding, block)


def _host_memory_available() -> int | None:
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def fits_on_one_device(nbytes: int, copies: int, n_sharing_host: int = 1) -> bool:
    """Would `copies` arrays of `nbytes` fit on one device (with `n_sharing_host` doing the same)?

    GPU: against the device's memory limit.  CPU devices share host RAM: against half of what
    is free, divided among the simulated devices that would do it at the same time.
    """
    import jax

    dev = jax.local_devices()[0]
    try:
        stats = dev.memory_stats() or {}
    except Exception:  # noqa: BLE001 - some backends do not implement it
        stats = {}
    limit = stats.get("bytes_limit")
    if limit:
        return copies * nbytes <= 0.9 * limit
    avail = _host_memory_available()
    return avail is None or copies * nbytes * n_sharing_host <= 0.5 * avail


def _cudecomp_available() -> bool:
    """jaxdecomp built with cuDecomp registers its XLA custom calls; the CPU wheel registers none."""
    import jax

    if jax.default_backend() != "gpu":
        return False
    try:
        from jaxdecomplib import _jaxdecomp

        return bool(_jaxdecomp.registrations())
    except Exception:  # noqa: BLE001
        return False


@dataclasses.dataclass
class Variant:
    """One implementation/layout inside a case, with its compiled programs and measurements."""

    impl: str
    layout: str
    real_input: bool = False
    n_devices: int = 0
    status: str = "ok"  # ok | skipped | error | wrong
    note: str = ""
    fns: dict[str, Callable] = dataclasses.field(default_factory=dict)  # direction -> python fn
    x: Any = None  # the forward's input; the inverse's input is each forward's output
    compiled: dict[str, Any] = dataclasses.field(default_factory=dict)
    lower_s: dict[str, float] = dataclasses.field(default_factory=dict)
    compile_s: dict[str, float] = dataclasses.field(default_factory=dict)
    mem: dict[str, dict[str, int | None]] = dataclasses.field(default_factory=dict)
    times: dict[str, list[float]] = dataclasses.field(default_factory=dict)
    err: dict[str, float | None] = dataclasses.field(default_factory=dict)

    def fail(self, status: str, exc: BaseException | str) -> None:
        self.status = status
        msg = exc if isinstance(exc, str) else f"{type(exc).__name__}: {exc}"
        self.note = " ".join(str(msg).split())[:400]
        self.compiled.clear()
        self.x = None

    @property
    def ok(self) -> bool:
        """Built, compiled and (so far) correct."""
        return self.status == "ok"

    @property
    def ran(self) -> bool:
        """Ran to the end: correct or not, its timings are real ("wrong" is set by the check)."""
        return self.status in ("ok", "wrong")


class CaseRunner:
    """Builds, compiles, times and checks every variant of one case."""

    def __init__(self, case: Case, args: argparse.Namespace, impls: Sequence[str]):
        import jax

        self.case = case
        self.args = args
        self.impls = impls
        self.single_process = jax.process_count() == 1
        self._inputs: dict[Any, Any] = {}

    # -- meshes and inputs -------------------------------------------------------------------
    def mesh(self, axis_type: str):
        import jax
        from jax.sharding import AxisType

        pd = self.case.pdims
        kind = {"explicit": AxisType.Explicit, "auto": AxisType.Auto}[axis_type]
        devices = jax.devices()[: math.prod(pd)]
        return jax.make_mesh(pd, ("x", "y")[: len(pd)], axis_types=(kind,) * len(pd), devices=devices)

    def input(self, sharding, real: bool):
        """The case's input on `sharding` (cached: variants with equal shardings share it)."""
        dtype = REAL_DTYPE[self.case.dtype] if real else self.case.dtype
        key = (sharding, dtype)
        if key not in self._inputs:
            self._inputs[key] = make_input(self.case.shape, sharding, dtype, self.args.seed)
        return self._inputs[key]

    # -- building each implementation ----------------------------------------------------------
    def build(self, impl: str, layout: str) -> Variant:
        """A Variant with fns/args for both directions, or one marked skipped."""
        v = Variant(impl, layout, real_input=impl == "pencilfft-r2c")
        try:
            getattr(self, "_build_" + impl.replace("-", "_"))(v)
        except Skip as e:
            v.fail("skipped", str(e))
        except Exception as e:  # noqa: BLE001 - a broken implementation must not stop the others
            v.fail("error", e)
        return v

    def _pencilfft_common(self, v: Variant, fwd_name: str, inv_name: str,
                          exchange: str = "auto") -> None:
        try:
            import pencilfft
        except Exception as e:  # noqa: BLE001
            raise Skip(f"pencilfft not importable ({type(e).__name__}: {e})")
        if not (hasattr(pencilfft, fwd_name) and hasattr(pencilfft, inv_name)):
            raise Skip(f"pencilfft.{fwd_name}/{inv_name} not available in this version")
        mesh = self.mesh(self.args.axis_type)
        fwd, inv = getattr(pencilfft, fwd_name), getattr(pencilfft, inv_name)
        if "exchange" in inspect.signature(fwd).parameters:
            fwd = functools.partial(fwd, exchange=exchange)
            inv = functools.partial(inv, exchange=exchange)
        elif exchange != "auto":
            raise Skip(f"pencilfft.{fwd_name} has no `exchange` option in this version")
        norm, lay, shape = self.args.norm, v.layout, self.case.shape
        x = self.input(pencilfft.real_space_sharding(mesh), v.real_input)
        v.n_devices = mesh.size
        v.fns["forward"] = lambda a: fwd(a, norm, layout=lay, mesh=mesh)
        if v.real_input:  # pirfft3d(k, s, norm, *, layout, mesh)
            v.fns["inverse"] = lambda k: inv(k, shape, norm, layout=lay, mesh=mesh)
        elif "s" in inspect.signature(inv).parameters:  # s: crops a padded spectrum back
            v.fns["inverse"] = lambda k: inv(k, norm, s=shape, layout=lay, mesh=mesh)
        else:
            v.fns["inverse"] = lambda k: inv(k, norm, layout=lay, mesh=mesh)
        v.x = x

    def _build_pencilfft(self, v: Variant) -> None:
        self._pencilfft_common(v, "pfft3d", "pifft3d")

    def _build_pencilfft_jit(self, v: Variant) -> None:
        from jax.sharding import NamedSharding, PartitionSpec as P

        import pencilfft

        mesh = self.mesh("auto")
        norm, lay = self.args.norm, v.layout
        v.n_devices = mesh.size
        v.fns["forward"] = lambda a: pencilfft.pfft3d(a, norm, layout=lay)
        v.fns["inverse"] = lambda k: pencilfft.pifft3d(k, norm, layout=lay)
        v.x = self.input(NamedSharding(mesh, P(*mesh.axis_names)), False)

    def _build_pencilfft_a2a(self, v: Variant) -> None:
        self._pencilfft_common(v, "pfft3d", "pifft3d", exchange="alltoall")

    def _build_pencilfft_r2c(self, v: Variant) -> None:
        self._pencilfft_common(v, "prfft3d", "pirfft3d")

    def _require(self, v: Variant, impl: str, module: str, layout: str):
        """`module`, imported, for an implementation that has one layout and needs a 2-axis mesh.

        Raises Skip (with the reason) when it is not importable, for the other layout, and on a
        1-axis mesh.
        """
        try:
            mod = importlib.import_module(module)
        except Exception as e:  # noqa: BLE001
            raise Skip(f"{module} not importable ({type(e).__name__}: {e})")
        if v.layout != layout:
            raise Skip(f"{impl} has only the {layout} layout")
        if len(self.case.pdims) != 2:
            n = self.case.pdims[0]
            raise Skip(f"{impl} needs a 2-axis mesh (e.g. pdims {n}x1 instead of {n})")
        return mod

    def _build_naive_pencil(self, v: Variant) -> None:
        """The pencil FFT users write first: jnp.fft.fft along each axis in place, all_to_all.

        Per device, forward: FFT over Z (contiguous), all_to_all over "y" (Z split, Y whole),
        FFT over Y (strided), all_to_all over "x" (Y split, X whole), FFT over X (strided); no
        local reordering anywhere.  Natural order out, split P(None, "x", "y") like pencilfft's
        natural layout.  The inverse is the exact reverse.  Each 1-D transform applies its own
        norm factor, so the three compose to numpy's 3D `norm`.
        """
        import jax
        import jax.numpy as jnp
        from jax.sharding import PartitionSpec as P

        pencilfft = self._require(v, "naive-pencil", "pencilfft", "natural")
        (x_, y_, z_), (pa, pb) = self.case.shape, self.case.pdims
        bad = [f"{name}={n} by {axis} ({p})" for name, n, axis, p in
               (("X", x_, "x", pa), ("Y", y_, "y", pb), ("Z", z_, "y", pb), ("Y", y_, "x", pa)) if n % p]
        if bad:
            raise Skip("naive-pencil needs X, Y split by x and Y, Z split by y exactly; not divisible: "
                       + ", ".join(bad))
        mesh = self.mesh(self.args.axis_type)
        norm = self.args.norm

        def pencil(b, fft, axes, exchanges):
            """FFT along axes[0]; then per exchange (mesh axis, split, concat) the next axis."""
            b = fft(b, axis=axes[0], norm=norm)
            for axis, (name, split, concat) in zip(axes[1:], exchanges):
                b = jax.lax.all_to_all(b, name, split_axis=split, concat_axis=concat, tiled=True)
                b = fft(b, axis=axis, norm=norm)
            return b

        # forward: Z; Y whole (Z split over y); X whole (Y split over x).  inverse: the reverse.
        fwd_block = functools.partial(pencil, fft=jnp.fft.fft, axes=(2, 1, 0),
                                      exchanges=(("y", 2, 1), ("x", 1, 0)))
        inv_block = functools.partial(pencil, fft=jnp.fft.ifft, axes=(0, 1, 2),
                                      exchanges=(("x", 0, 1), ("y", 1, 2)))

        real_spec, k_spec = P("x", "y", None), P(None, "x", "y")
        v.n_devices = mesh.size
        v.fns["forward"] = jax.shard_map(fwd_block, mesh=mesh, in_specs=real_spec, out_specs=k_spec)
        v.fns["inverse"] = jax.shard_map(inv_block, mesh=mesh, in_specs=k_spec, out_specs=real_spec)
        v.x = self.input(pencilfft.real_space_sharding(mesh), False)

    def _jaxdecomp_common(self, v: Variant, backend: str) -> None:
        from jax.sharding import NamedSharding, PartitionSpec as P

        jaxdecomp = self._require(v, "jaxdecomp", "jaxdecomp", "transposed")
        mesh = self.mesh("auto")  # jaxdecomp 0.3.1 fails on Explicit axes
        norm = self.args.norm
        v.n_devices = mesh.size
        v.fns["forward"] = lambda a: jaxdecomp.pfft3d(a, norm, backend=backend)
        v.fns["inverse"] = lambda k: jaxdecomp.pifft3d(k, norm, backend=backend)
        v.x = self.input(NamedSharding(mesh, P("x", "y")), False)

    def _build_jaxdecomp(self, v: Variant) -> None:
        self._jaxdecomp_common(v, "jax")

    def _build_jaxdecomp_cudecomp(self, v: Variant) -> None:
        if not _cudecomp_available():
            raise Skip("needs a GPU and jaxdecomp built with cuDecomp")
        self._jaxdecomp_common(v, "cudecomp")

    def _fftn_fns(self, v: Variant) -> None:
        import jax.numpy as jnp

        norm = self.args.norm
        v.fns["forward"] = lambda a: jnp.fft.fftn(a, norm=norm)
        v.fns["inverse"] = lambda k: jnp.fft.ifftn(k, norm=norm)

    def _nbytes(self) -> int:
        import numpy as np

        return math.prod(self.case.shape) * np.dtype(self.case.dtype).itemsize

    def _build_fftn_sharded(self, v: Variant) -> None:
        import jax
        from jax.sharding import NamedSharding, PartitionSpec as P

        # Every device ends up holding the whole array (input gathered, output, temp).
        if not fits_on_one_device(self._nbytes(), 3, jax.local_device_count()):
            raise Skip("the global array does not fit on one device (fftn gathers it)")
        mesh = self.mesh("auto")
        v.n_devices = mesh.size
        self._fftn_fns(v)
        v.x = self.input(NamedSharding(mesh, P(*mesh.axis_names)), False)

    def _build_fftn_1dev(self, v: Variant) -> None:
        import jax
        from jax.sharding import NamedSharding, PartitionSpec as P

        if not self.single_process:
            raise Skip("one-device baseline skipped with several processes")
        if not fits_on_one_device(self._nbytes(), 4):
            raise Skip("the global array does not fit on one device")
        mesh = self.mesh("auto")
        # The same data as the sharded variants (same blocks), moved whole to one device.
        x = self.input(NamedSharding(mesh, P(*mesh.axis_names)), False)
        v.n_devices = 1
        self._fftn_fns(v)
        v.x = jax.device_put(x, jax.devices()[0])

    # -- compile, time, check ------------------------------------------------------------------
    def compile(self, v: Variant) -> None:
        """Lower+compile both directions, timed; the inverse is compiled for the forward's output.

        The forward is compiled even when only the inverse is timed: it makes the inverse's input.
        """
        import jax

        try:
            arg = v.x
            for d in DIRECTIONS:
                if d == "inverse":
                    if "inverse" not in self.args.directions:
                        break
                    arg = jax.block_until_ready(v.compiled["forward"](v.x))
                t0 = time.perf_counter()
                lowered = jax.jit(v.fns[d]).lower(arg)
                t1 = time.perf_counter()
                v.compiled[d] = lowered.compile()
                t2 = time.perf_counter()
                v.lower_s[d], v.compile_s[d] = t1 - t0, t2 - t0
                v.mem[d] = memory_stats(v.compiled[d])
                v.times[d] = []
            del arg
        except Exception as e:  # noqa: BLE001
            v.fail("error", e)

    def time_round(self, variants: Sequence[Variant], record: bool) -> None:
        """One forward then one inverse (of that forward's output) per variant; times kept if `record`.

        Only the inputs stay resident between calls: spectra are dropped after their inverse,
        so memory does not grow with the number of variants (matters at scale on GPUs).
        """
        from pencilfft._measure import time_once

        dirs = self.args.directions
        for v in variants:
            if not v.ok:
                continue
            try:
                t_fwd, k = time_once(v.compiled["forward"], v.x)
                if "inverse" in dirs:
                    t_inv, back = time_once(v.compiled["inverse"], k)
                    del back
            except Exception as e:  # noqa: BLE001
                v.fail("error", e)
                continue
            del k
            if record:
                if "forward" in dirs:
                    v.times["forward"].append(t_fwd)
                if "inverse" in dirs:
                    v.times["inverse"].append(t_inv)

    def check(self, v: Variant) -> None:
        """Forward vs numpy (in natural order, padding cropped) and inverse(forward) vs input."""
        import numpy as np

        from pencilfft._measure import max_rel_err

        x = to_numpy(v.x)
        ref_fn = np.fft.rfftn if v.real_input else np.fft.fftn
        ref = ref_fn(x.astype(np.complex128 if not v.real_input else np.float64), norm=self.args.norm)
        k_dev = v.compiled["forward"](v.x)
        k = to_numpy(k_dev)
        if v.layout == "transposed" and v.impl not in LAYOUT_FREE:
            k = k.transpose(2, 0, 1)  # (Y, Z, X) -> (X, Y, Z)
        if any(a < b for a, b in zip(k.shape, ref.shape)):
            v.status = "wrong"
            v.note = f"forward output shape {k.shape} (natural order) smaller than {ref.shape}"
            return
        k = k[tuple(slice(0, n) for n in ref.shape)]  # pencilfft may zero-pad Y/Z to the mesh
        errs = [max_rel_err(k, ref)]
        if "inverse" in v.compiled:
            back = to_numpy(v.compiled["inverse"](k_dev))
            errs.append(max_rel_err(back[tuple(slice(0, n) for n in x.shape)], x))
        v.err = {"forward": errs[0], "inverse": errs[-1]}
        if max(errs) > CHECK_TOL[self.case.dtype]:
            v.status, v.note = "wrong", f"max rel err {max(errs):.2e} > {CHECK_TOL[self.case.dtype]:.0e}"


def to_numpy(x):
    """The whole global array on every process (a collective call under mpirun/srun)."""
    import numpy as np

    if x.is_fully_addressable:
        return np.asarray(x)
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def memory_stats(compiled) -> dict[str, int | None]:
    """Per-device bytes of the compiled program: arguments, outputs, temporaries (None if unknown)."""
    keys = ("argument", "output", "temp", "alias")
    try:
        ma = compiled.memory_analysis()
    except Exception:  # noqa: BLE001 - not implemented on every backend
        ma = None
    if ma is None:
        return {k: None for k in keys} | {"total": None}
    out = {k: getattr(ma, f"{k}_size_in_bytes", None) for k in keys}
    parts = [out[k] for k in ("argument", "output", "temp")]
    out["total"] = sum(parts) if all(p is not None for p in parts) else None
    return out


def gather_max(values: Any):
    """Elementwise max over processes (NaN-aware): the slowest process sets the time."""
    import jax
    import numpy as np

    arr = np.asarray(values, dtype=np.float64)
    if jax.process_count() == 1:
        return arr
    from jax.experimental import multihost_utils

    allv = np.asarray(multihost_utils.process_allgather(arr))
    with warnings.catch_warnings():  # all-NaN entries (variants that did not run) stay NaN
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanmax(allv, axis=0)


def run_case(case: Case, args: argparse.Namespace, impls: Sequence[str], step: Callable[[str], None],
             context: dict[str, Any]) -> list[dict[str, Any]]:
    """Every variant of one case, interleaved; returns the records (one per variant and direction)."""
    import numpy as np

    runner = CaseRunner(case, args, impls)
    variants = []
    for impl, layout in variant_plan(impls, args.layouts):
        step(f"{case.label}: compile {impl} [{layout}]")
        v = runner.build(impl, layout)
        if v.ok:
            runner.compile(v)
        variants.append(v)

    dirs = list(args.directions)
    for r in range(args.warmup + args.repeats):
        step(f"{case.label}: {'warm-up' if r < args.warmup else 'repeat'} {r - args.warmup + 1 if r >= args.warmup else r + 1}")
        live = [v for v in variants if v.ok]
        k = r % len(live) if live else 0
        runner.time_round(live[k:] + live[:k], record=r >= args.warmup)

    # Agree across processes: slowest process per repeat, slowest compile.
    shape = (len(variants), len(dirs), args.repeats)
    t = np.full(shape, np.nan)
    c = np.full(shape[:2] + (2,), np.nan)
    for i, v in enumerate(variants):
        for j, d in enumerate(dirs):
            ts = v.times.get(d, [])
            if v.ok and len(ts) == args.repeats:
                t[i, j] = ts
            if d in v.compile_s:
                c[i, j] = (v.lower_s[d], v.compile_s[d])
    t, c = gather_max(t), gather_max(c)

    # Correctness after timing (its gathers must not disturb the measurements).  Under several
    # processes every process gathers the whole array: only for moderate sizes.
    check = args.check and (runner.single_process or math.prod(case.shape) <= CHECK_MAX_POINTS_MP)
    if check:
        for v in variants:
            if v.ok:
                try:
                    runner.check(v)
                except Exception as e:  # noqa: BLE001
                    v.note = f"check failed to run: {type(e).__name__}: {e}"[:400]

    base = {d: float(np.median(t[i, j])) for i, v in enumerate(variants) if v.impl == BASELINE and v.ok
            for j, d in enumerate(dirs) if not np.isnan(t[i, j]).any()}
    records = []
    for i, v in enumerate(variants):
        for j, d in enumerate(dirs):
            times = None if np.isnan(t[i, j]).any() or not v.ran else [float(x) for x in t[i, j]]
            records.append(make_record(case, v, d, times, c[i, j], base.get(d), args, context))
    return records


def make_record(case: Case, v: Variant, direction: str, times: list[float] | None, comp,
                base_median: float | None, args: argparse.Namespace, context: dict[str, Any]) -> dict[str, Any]:
    """One JSON line; every key of RECORD_FIELDS present."""
    import numpy as np

    flops = fft_flops(case.shape, v.real_input)
    mem = v.mem.get(direction, {})
    status, note = v.status, v.note
    if times is None and v.ran:  # e.g. failed on another process, or direction not compiled
        status, note = "error", note or "no timings"
    med = statistics.median(times) if times else None
    rec = {
        "schema": SCHEMA,
        "timestamp": context["timestamp"],
        "tag": args.tag,
        "status": status,
        "note": note,
        "impl": v.impl,
        "layout": v.layout,
        "direction": direction,
        "shape": list(case.shape),
        "n_points": math.prod(case.shape),
        "dtype": case.dtype,
        "input_dtype": REAL_DTYPE[case.dtype] if v.real_input and direction == "forward" else case.dtype,
        "norm": args.norm,
        "pdims": list(case.pdims),
        "axis_type": args.axis_type if v.impl.startswith(("pencilfft", "naive-pencil")) else "auto",
        "mesh_devices": math.prod(case.pdims),
        "n_devices": v.n_devices or None,
        "repeats": args.repeats,
        "warmup": args.warmup,
        "lower_s": None if np.isnan(comp[0]) else float(comp[0]),
        "compile_s": None if np.isnan(comp[1]) else float(comp[1]),
        "median_s": med,
        "min_s": min(times) if times else None,
        "max_s": max(times) if times else None,
        "mean_s": statistics.fmean(times) if times else None,
        "std_s": statistics.pstdev(times) if times else None,
        "times_s": times,
        "flops": flops,
        "gflops": flops / med / 1e9 if med else None,
        "gflops_per_device": flops / med / 1e9 / v.n_devices if med and v.n_devices else None,
        "speedup_vs_fftn_1dev": base_median / med if med and base_median else None,
        "mem_argument_bytes": mem.get("argument"),
        "mem_output_bytes": mem.get("output"),
        "mem_temp_bytes": mem.get("temp"),
        "mem_alias_bytes": mem.get("alias"),
        "mem_bytes": mem.get("total"),
        "max_rel_err": v.err.get(direction),
        "machine": context["machine"],
        "versions": context["versions"],
        "command": context["command"],
    }
    return rec


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
    impls = selected_impls(args)
    context = {
        "timestamp": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine_info(),
        "versions": versions(),
        "command": "python -m benchmarks.fft " + shlex.join(argv),
    }
    m = context["machine"]
    console.print(f"[bold]{m['device_count']} x {m['device_kind']}[/] ({m['backend']}, "
                  f"{m['process_count']} process(es), host {m['hostname']}); jax {context['versions']['jax']}")
    n_variants = len(variant_plan(impls, args.layouts))
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
            recs = run_case(case, args, impls, step, context)
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


# --------------------------------------------------------------------------------------------
# Reading results back, tables (rich on the terminal, markdown for RESULTS.md)
# --------------------------------------------------------------------------------------------

def load_records(paths: Iterable[str | Path]) -> list[dict[str, Any]]:
    """All records of JSON-lines files, in file order; a clear error names a bad line."""
    out = []
    for path in paths:
        with open(path, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise SystemExit(f"error: {path}:{n}: not a JSON record ({e})")
    return out


def _ms(s: float | None) -> str:
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
            r["direction"][:3], _num(r["compile_s"], ".2f"), _ms(r["median_s"]), _ms(r["min_s"]),
            _ms(r["max_s"]), _num(r["gflops"], ".3g"), _mib(r["mem_bytes"]),
            _num(r["speedup_vs_fftn_1dev"], ".2f"), _num(r["max_rel_err"], ".1e"), status]


def rich_table(records: Sequence[dict[str, Any]], title: str = ""):
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
    s = f"{_ms(r['median_s'])}"
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


def table_main(argv: Sequence[str]) -> int:
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
