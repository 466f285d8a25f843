"""The CPU FFT kernel (issues 36, 43): pencilfft's FFTW kernel against XLA's FFT and FFTW's own.

    python -m benchmarks.kernel block --cores 1 --out benchmarks/data/kernel-block.jsonl
    python -m benchmarks.kernel mesh --devices 8 --out benchmarks/data/kernel-mesh.jsonl
    python -m benchmarks.kernel memory --devices 8 --out benchmarks/data/kernel-memory.jsonl
    python -m benchmarks.kernel single --out benchmarks/data/kernel-single.jsonl
    PENCILFFT_MALLOC=glibc python -m benchmarks.kernel allocator --out benchmarks/data/kernel-allocator.jsonl

`block`: a slab block's 2-D and 1-D FFTs: the kernel (FFTW estimate, measure, no huge pages),
XLA's, and pyFFTW on preallocated arrays (FFTW's own time).  `mesh`: forward + inverse under
jit on an Auto mesh: pencilfft's defaults, with XLA's kernel, with XLA's collectives, and
jaxdecomp; `memory`: their XLA temporaries.  `single`: one CPU device beside jnp.fft (natural
layout, one thread too), with the process's resident memory.  `allocator`: page faults, system
time and memory per call under the process's allocator settings (a process per setting).
"""
from __future__ import annotations

import argparse
import functools
import os
import resource
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

import pencilfft
from benchmarks import harness, private
from benchmarks.harness import fmt_dims

BLOCK_VARIANTS = ("fftw-measure", "fftw-4k-pages", "fftw-estimate", "xla", "pyfftw-measure",
                  "pyfftw-estimate")
# pencilfft-fftw: the defaults (FFTW kernel, exchange "auto": the local exchange in one
# process); pencilfft-xla: XLA's FFT kernel; pencilfft-collectives: FFTW with XLA's collectives
# (what "auto" took before the local exchange: pairwise on the pencils, all_to_all on slabs).
MESH_VARIANTS = ("pencilfft-fftw", "pencilfft-xla", "pencilfft-collectives", "jaxdecomp")
# pencilfft: the defaults (layout "transposed"); pencilfft-natural: jnp.fft's own order;
# pencilfft-1-thread: the defaults on one thread (PENCILFFT_THREADS=1).
SINGLE_VARIANTS = ("pencilfft", "pencilfft-natural", "pencilfft-1-thread", "jnp.fft")


def _kernel_env(value: str | None):
    """PENCILFFT_FFT_KERNEL[:PLANNER[:HUGE_PAGES]] while compiling (empty: the default)."""
    kernel, planner, huge = ((value or "") + "::").split(":")[:3]
    return mock.patch.dict(os.environ, PENCILFFT_FFT_KERNEL=kernel, PENCILFFT_FFTW_PLANNER=planner,
                           PENCILFFT_FFTW_HUGE_PAGES=huge)


def _malloc_env() -> str:
    keys = ("MALLOC_MMAP_MAX_", "MALLOC_TRIM_THRESHOLD_", "PENCILFFT_MALLOC")
    return " ".join(f"{k}={os.environ[k]}" for k in keys if k in os.environ) or "nothing set"


def _timed(calls: dict[str, Callable[[], Any]], repeats: int, warmup: int = 2):
    """name -> (median, min) seconds, the calls interleaved by the harness's loop."""
    return {n: (statistics.median(t), min(t))
            for n, t in harness.time_calls(calls, repeats, warmup).items()}


def _base(tool: str, ctx: dict[str, Any]) -> dict[str, Any]:
    return {"tool": tool, "malloc": _malloc_env(), "cores": len(os.sched_getaffinity(0)),
            **harness.stamp(ctx)}


def _complex_grid(shape: Sequence[int]):
    rng = np.random.default_rng(0)
    return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(np.complex64)


def block(args: argparse.Namespace, ctx: dict[str, Any]) -> Iterator[list[dict[str, Any]]]:
    import pyfftw

    kernel = private.kernel
    n = args.shapes[0][0]
    shape = (n // 2, n, n)
    host = _complex_grid(shape)
    x = jax.device_put(host)
    harness.say(args, f"block {shape} complex64, {_malloc_env()}, affinity "
                      f"{sorted(os.sched_getaffinity(0))}, kernel: {kernel.describe()}")
    for axes in ((1, 2), (2,)):
        # Estimated plans first, after forgetting FFTW's wisdom: the kernel and pyFFTW share one
        # libfftw3f, whose ESTIMATE plans reuse what an earlier MEASURE plan learnt.
        pyfftw.forget_wisdom()
        calls: dict[str, Callable[[], object]] = {}
        for effort in ("estimate", "measure"):
            with _kernel_env(f"fftw:{effort}"):
                f = jax.jit(lambda a, axes=axes: kernel.fft(a, "fft", axes, "backward", ()))
                f = f.lower(x).compile()
                assert kernel.TARGET in f.as_text()
                err = float(np.abs(np.asarray(f(x)) - np.fft.fftn(host, axes=axes)).max())
                assert err < 1e-2 * np.sqrt(host.size), err  # (and planned, by this call)
            calls[f"fftw-{effort}"] = functools.partial(f, x)
            a, b = (pyfftw.empty_aligned(shape, np.complex64) for _ in range(2))
            plan = pyfftw.FFTW(a, b, axes=axes, flags=(f"FFTW_{effort.upper()}",), threads=1)
            a[...] = host
            calls[f"pyfftw-{effort}"] = plan  # FFTW's execute alone: preallocated arrays
        with _kernel_env("fftw:measure:0"):  # without the huge pages hint
            f = jax.jit(lambda a, axes=axes: kernel.fft(a, "fft", axes, "backward", ()))
            calls["fftw-4k-pages"] = functools.partial(f.lower(x).compile(), x)
        calls["xla"] = functools.partial(jax.jit(lambda a, axes=axes: jnp.fft.fftn(a, axes=axes))
                                         .lower(x).compile(), x)
        yield [{**_base("kernel-block", ctx), "shape": list(shape), "axes": list(axes),
                "variant": name, "repeats": args.repeats, "median_s": median, "min_s": low}
               for name, (median, low) in _timed(calls, args.repeats).items()]


def _rows(records: Sequence[dict[str, Any]], case: str, variants: Sequence[str],
          ratios: Sequence[tuple[str, Callable[[dict[str, float]], float]]],
          fmt: Callable[[tuple], str], digits: int, note: str) -> str:
    """Median ms per (allocator setting, `case`) and variant, then the `ratios`."""
    head = ["malloc", {"axes": "FFT", "pdims": "mesh"}[case], *(f"{v} ms" for v in variants),
            *(name for name, _ in ratios)]
    rows: dict[tuple, dict[str, float]] = {}
    for r in records:
        rows.setdefault((r["malloc"], tuple(r[case])), {})[r["variant"]] = r["median_s"] * 1e3
    return harness.md_table(head, ([malloc, fmt(key)] + [f"{ms[v]:.{digits}f}" for v in variants]
                                   + [f"{f(ms):.2f}" for _, f in ratios]
                                   for (malloc, key), ms in rows.items()), "ll" + "r" * (len(head) - 2), note)


def block_table(records: Sequence[dict[str, Any]]) -> str:
    """One row per (allocator setting, FFT): median ms of each variant, and the ratios."""
    def own(ms):  # FFTW's own best time
        return min(ms["pyfftw-measure"], ms["pyfftw-estimate"])

    return _rows(records, "axes", BLOCK_VARIANTS,
                 [("ours / FFTW's own", lambda ms: ms["fftw-measure"] / own(ms)),
                  ("XLA / ours", lambda ms: ms["xla"] / ms["fftw-measure"])],
                 lambda axes: f"{len(axes)}-D, axes {axes}", 1, (
        f"{tuple(records[0]['shape'])} complex64, one core (`taskset -c 0`), medians of "
        f"{records[0]['repeats']} interleaved rounds; ours (fftw-measure, the default): "
        f"the FFTW kernel through jit (a fresh output buffer per call, with the huge "
        f"pages hint; fftw-4k-pages: without it); FFTW's own: pyFFTW executing on "
        f"preallocated arrays; load average: {harness.load_range(records)}."))


def _functions(name: str, pdims) -> tuple[Callable, Callable, str | None]:
    """(forward, inverse, PENCILFFT_FFT_KERNEL while compiling) of variant `name`."""
    import jaxdecomp

    if name == "jaxdecomp":
        return jaxdecomp.pfft3d, jaxdecomp.pifft3d, None
    exchange = ("auto" if name != "pencilfft-collectives" else
                "alltoall" if 1 in pdims else "pairwise")
    return (functools.partial(pencilfft.pfft3d, exchange=exchange),
            functools.partial(pencilfft.pifft3d, exchange=exchange),
            "xla" if name == "pencilfft-xla" else "fftw")


def _compiled_pair(name: str, x) -> tuple[Any, Any]:
    """(forward, inverse) of variant `name` compiled for the sharded argument `x` (abstract)."""
    fwd_f, inv_f, env = _functions(name, x.sharding.mesh.axis_sizes)
    with _kernel_env(env):
        fwd = jax.jit(lambda a: fwd_f(a)).lower(x).compile()
        k = jax.ShapeDtypeStruct(fwd.out_info.shape, fwd.out_info.dtype,
                                 sharding=fwd.output_shardings)
        inv = jax.jit(lambda b: inv_f(b)).lower(k).compile()
    return fwd, inv


def _auto(pdims):
    return NamedSharding(harness.make_mesh(pdims, "auto"), P("x", "y"))


def mesh(args: argparse.Namespace, ctx: dict[str, Any]) -> Iterator[list[dict[str, Any]]]:
    kernel = private.kernel
    n = args.shapes[0][0]
    harness.say(args, f"{n}^3 complex64 forward + inverse, {len(jax.devices())} CPU devices, "
                      f"{_malloc_env()}; kernel: {kernel.describe()}")
    host = _complex_grid((n,) * 3)
    for pdims in args.pdims:
        x = jax.device_put(host, _auto(pdims))
        calls = {}
        for name in MESH_VARIANTS:
            if args.one_jit:  # a spectral solve's shape: both directions in one program
                fwd_f, inv_f, env = _functions(name, pdims)
                with _kernel_env(env):
                    both = jax.jit(lambda a, f=fwd_f, i=inv_f: i(f(a) * 2) / 2).lower(x).compile()
                compiled = [both]
                calls[name] = functools.partial(both, x)
            else:
                fwd, inv = compiled = _compiled_pair(name, x)
                calls[name] = lambda fwd=fwd, inv=inv: inv(fwd(x))
            if name != "jaxdecomp":
                uses = all(kernel.TARGET in c.as_text() for c in compiled)
                assert uses == (name != "pencilfft-xla" and kernel.kernel() == "fftw"), name
        for name, f in calls.items():  # each round trip gives the input back
            err = float(np.abs(np.asarray(f()) - host).max())
            assert err < 1e-3, (name, err)
        yield [{**_base("kernel-mesh", ctx), "shape": [n] * 3, "pdims": list(pdims),
                "variant": name, "program": "one jit" if args.one_jit else "two jits",
                "n_devices": len(jax.devices()), "repeats": args.repeats, "median_s": median,
                "min_s": low} for name, (median, low) in _timed(calls, args.repeats, 1).items()]


def _present(records: Sequence[dict[str, Any]]) -> tuple[str, ...]:
    """The variants the records hold (older data files lack pencilfft-collectives)."""
    return tuple(v for v in MESH_VARIANTS if any(r["variant"] == v for r in records))


def mesh_table(records: Sequence[dict[str, Any]]) -> str:
    """One row per (allocator setting, mesh): median ms of a forward + inverse, and ratios."""
    variants = _present(records)
    ratios = [(f"{v.removeprefix('pencilfft-')} / fftw", lambda ms, v=v: ms[v] / ms["pencilfft-fftw"])
              for v in variants if v != "pencilfft-fftw"]
    r0 = records[0]
    program = " in one jit (`pifft3d(pfft3d(x) * 2) / 2`)" if r0.get("program") == "one jit" else ""
    return _rows(records, "pdims", variants, ratios, fmt_dims, 0, (
        f"{fmt_dims(r0['shape'])} complex64, forward + inverse{program}, "
        f"{r0['n_devices']} CPU devices in one process on {r0['cores']} cores, jax.jit "
        f"on an Auto mesh with nothing in scope; medians of {r0['repeats']} "
        f"interleaved rounds; load average: {harness.load_range(records)}."))


def memory(args: argparse.Namespace, ctx: dict[str, Any]) -> Iterator[list[dict[str, Any]]]:
    """Per-device temporaries and output of each compiled direction, in per-device blocks."""
    n = args.shapes[0][0]
    block_bytes = n**3 * np.dtype(np.complex64).itemsize / len(jax.devices())
    for pdims in args.pdims:
        x = jax.ShapeDtypeStruct((n,) * 3, np.complex64, sharding=_auto(pdims))
        yield [{**_base("kernel-memory", ctx), "shape": [n] * 3, "pdims": list(pdims),
                "variant": name, "direction": direction, "n_devices": len(jax.devices()),
                "temp_blocks": c.memory_analysis().temp_size_in_bytes / block_bytes,
                "output_blocks": c.memory_analysis().output_size_in_bytes / block_bytes}
               for name in MESH_VARIANTS
               for direction, c in zip(("forward", "inverse"), _compiled_pair(name, x))]


def memory_table(records: Sequence[dict[str, Any]]) -> str:
    """One row per mesh: temporaries + output per device (forward / inverse), in blocks."""
    cells: dict[tuple, dict[str, list[str]]] = {}
    for r in records:
        row = cells.setdefault(tuple(r["pdims"]), {v: [] for v in MESH_VARIANTS})
        row[r["variant"]].append(f"{r['temp_blocks'] + r['output_blocks']:.2f}")
    variants = _present(records)
    r0 = records[0]
    return harness.md_table(
        ["mesh"] + [f"{v} fwd / inv" for v in variants],
        ([fmt_dims(pdims)] + [" / ".join(row[v]) for v in variants] for pdims, row in cells.items()),
        "l" + "r" * len(variants), (
            f"{fmt_dims(r0['shape'])} complex64 on {r0['n_devices']} CPU devices, "
            f"jax.jit on an Auto mesh: XLA's memory analysis of each compiled direction, "
            f"temporaries + output per device, in blocks of the per-device grid (the "
            f"argument, one more block, is not counted)."))


def _rss_mib() -> tuple[float, float]:
    """(peak, current) resident memory of this process in MiB."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    with open("/proc/self/statm") as f:
        current = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    return peak, current


def _one_device_pair(n: int, layout: str = "transposed"):
    """pfft3d / pifft3d of an N^3 complex64 grid on one CPU device, compiled, and the grid."""
    host = _complex_grid((n,) * 3)
    x = jax.device_put(host)
    fwd = jax.jit(functools.partial(pencilfft.pfft3d, layout=layout)).lower(x).compile()
    k = jax.ShapeDtypeStruct(fwd.out_info.shape, fwd.out_info.dtype)
    inv = jax.jit(functools.partial(pencilfft.pifft3d, layout=layout)).lower(k).compile()
    return fwd, inv, x, host


def allocator(args: argparse.Namespace, ctx: dict[str, Any]) -> Iterator[list[dict[str, Any]]]:
    """Page faults, CPU times and resident memory per call, under this process's allocator."""
    fwd, inv, x, _ = _one_device_pair(args.shapes[0][0])
    for _ in range(args.repeats):  # settle: the heap reaches its size
        inv(fwd(x)).block_until_ready()
    r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    for _ in range(args.repeats):
        inv(fwd(x)).block_until_ready()
    r1, t1 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    peak, current = _rss_mib()
    yield [{**_base("kernel-allocator", ctx), "shape": list(x.shape), "repeats": args.repeats,
            "allocator": private.malloc.describe(),
            "faults_per_call": (r1.ru_minflt - r0.ru_minflt) / args.repeats,
            "sys_ms_per_call": (r1.ru_stime - r0.ru_stime) / args.repeats * 1e3,
            "user_ms_per_call": (r1.ru_utime - r0.ru_utime) / args.repeats * 1e3,
            "wall_ms_per_call": (t1 - t0) / args.repeats * 1e3,
            "peak_rss_mib": peak, "rss_mib": current}]


def allocator_table(records: Sequence[dict[str, Any]]) -> str:
    """One row per run (allocator setting)."""
    r0 = records[0]
    return harness.md_table(
        ["malloc", "page faults / call", "system ms / call", "user ms / call", "wall ms / call",
         "peak RSS MiB", "RSS at end MiB"],
        ([r["malloc"]] + [format(r[k], f) for k, f in (
            ("faults_per_call", ".0f"), ("sys_ms_per_call", ".1f"), ("user_ms_per_call", ".0f"),
            ("wall_ms_per_call", ".0f"), ("peak_rss_mib", ".0f"), ("rss_mib", ".0f"))]
         for r in records), "lrrrrrr",
        f"{fmt_dims(r0['shape'])} complex64, pfft3d + pifft3d on one CPU device, {r0['repeats']} "
        f"calls after {r0['repeats']} to settle, a process per row (malloc: its environment; "
        f"nothing set: pencilfft's own settings); wall times shared the machine (load average "
        f"{harness.load_range(records)}).")


def single(args: argparse.Namespace, ctx: dict[str, Any]) -> Iterator[list[dict[str, Any]]]:
    n = args.shapes[0][0]
    calls, host = {}, None
    for name in args.variants:
        if name == "jnp.fft":
            x = jax.device_put(_complex_grid((n,) * 3))
            fwd = jax.jit(jnp.fft.fftn).lower(x).compile()
            inv = jax.jit(jnp.fft.ifftn).lower(x).compile()
        else:
            with mock.patch.dict(os.environ, PENCILFFT_THREADS="1" if name == "pencilfft-1-thread" else ""):
                fwd, inv, x, host = _one_device_pair(n, "natural" if name == "pencilfft-natural"
                                                     else "transposed")
            assert private.kernel.kernel() != "fftw" or private.kernel.TARGET in fwd.as_text()
        calls[name] = lambda fwd=fwd, inv=inv, x=x: inv(fwd(x))
    host = _complex_grid((n,) * 3) if host is None else host
    for name, f in calls.items():  # each round trip gives the input back
        assert float(np.abs(np.asarray(f()) - host).max()) < 1e-3, name
    harness.say(args, f"{n}^3 complex64 forward + inverse, one CPU device, affinity "
                      f"{sorted(os.sched_getaffinity(0))}; {_malloc_env()}; threads: "
                      f"{private.threads.describe()}; allocator: {private.malloc.describe()}")
    timed = _timed(calls, args.repeats)
    peak, current = _rss_mib()
    yield [{**_base("kernel-single", ctx), "shape": [n] * 3, "variant": name,
            "repeats": args.repeats, "median_s": median, "min_s": low,
            "affinity": len(os.sched_getaffinity(0)), "allocator": private.malloc.describe(),
            "threads": private.threads.threads_per_device(), "peak_rss_mib": peak,
            "rss_mib": current} for name, (median, low) in timed.items()]


def single_table(records: Sequence[dict[str, Any]]) -> str:
    """One row per run: each variant's median ms, the ratios to jnp.fft, the memory."""
    runs: dict[tuple, dict[str, Any]] = {}
    for r in records:
        runs.setdefault((r["machine"].get("loadavg_1m"), r["affinity"], r["malloc"]), {})[r["variant"]] = r
    rows = []
    for (load, cores, malloc), row in runs.items():
        ms = [f"{row[v]['median_s'] * 1e3:.1f}" if v in row else "" for v in SINGLE_VARIANTS]
        ratios = [f"{row[v]['median_s'] / row['jnp.fft']['median_s']:.2f}"
                  if {v, "jnp.fft"} <= set(row) else "" for v in ("pencilfft", "pencilfft-natural")]
        any_r = next(iter(row.values()))
        rows.append([cores, malloc, f"{load:.1f}", *ms, *ratios, f"{any_r['peak_rss_mib']:.0f}",
                     f"{any_r['rss_mib']:.0f}"])
    head = ["cores", "malloc", "load", *(f"{v} ms" for v in SINGLE_VARIANTS),
            "pencilfft / jnp.fft", "natural / jnp.fft", "peak RSS MiB", "RSS at end MiB"]
    repeats = "-".join(str(v) for v in sorted({r["repeats"] for r in records}))
    return harness.md_table(head, rows, "rl" + "r" * (len(head) - 2), (
        f"{fmt_dims(records[0]['shape'])} complex64, forward + inverse, one CPU device "
        f"(jax's default), jax.jit; medians of {repeats} interleaved rounds; "
        f"cores: the process's affinity (1: `taskset -c 0`); malloc: the environment "
        f"(nothing set: pencilfft's own settings, `_malloc`); load: the 1-minute load "
        f"average when the run started (2 cores)."))


# ----------------------------------------------------------------------------------------------
# The command line (benchmarks.harness.main)

OPTIONS = dict(devices=None, cores=None, shapes=["256"],
               pdims=dict(default=["1x8", "8x1", "4x2", "2x4"], type=harness.parse_pxq),
               repeats=11, out=None)
PARTS = {"block": (block, "block"), "mesh": (mesh, "mesh"), "memory": (memory, "memory"),
         "single": (single, "single"), "allocator": (allocator, "allocator")}
PART_DEFAULTS = {"block": dict(repeats=15), "mesh": dict(devices=8, repeats=7),
                 "memory": dict(devices=8), "allocator": dict(repeats=8)}


def add_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--one-jit", action="store_true",
                   help="mesh: both directions in one jitted function (a spectral solve's shape)")
    p.add_argument("--variants", nargs="+", default=list(SINGLE_VARIANTS), choices=SINGLE_VARIANTS,
                   help="single: which variants")


TABLES = {"block": block_table, "mesh": mesh_table, "memory": memory_table,
          "single": single_table, "allocator": allocator_table}


if __name__ == "__main__":
    sys.exit(harness.main(sys.modules[__name__]))
