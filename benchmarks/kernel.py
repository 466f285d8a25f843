"""The CPU FFT kernel (issue 36): pencilfft's FFTW kernel against XLA's FFT and FFTW's own time.

    taskset -c 0 python -m benchmarks.kernel block --out benchmarks/data/kernel-block.jsonl
    MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=100000000000 \
        taskset -c 0 python -m benchmarks.kernel block --out benchmarks/data/kernel-block.jsonl
    python -m benchmarks.kernel mesh --devices 8 --out benchmarks/data/kernel-mesh.jsonl
    python -m benchmarks.kernel memory --devices 8 --out benchmarks/data/kernel-memory.jsonl
    python -m benchmarks.kernel single --out benchmarks/data/kernel-single.jsonl
    taskset -c 0 python -m benchmarks.kernel single --out benchmarks/data/kernel-single.jsonl
    PENCILFFT_MALLOC=glibc python -m benchmarks.kernel allocator --out benchmarks/data/kernel-allocator.jsonl

`block`: the 256^3 grid's slab block (128, 256, 256) complex64, a 2-D FFT over axes (1, 2) and a
1-D FFT along the last axis: `_kernel.fft` with the FFTW kernel (planner estimate and measure),
jnp.fft.fftn (XLA's kernel), and pyFFTW's FFTW object executing on preallocated aligned arrays
(FFTW's own time, no allocation).  `mesh`: 256^3 complex64 forward + inverse, jax.jit of
pfft3d/pifft3d on an array sharded over an Auto mesh with nothing in scope (the
compiler-partitioned path, as jaxdecomp's users call it): pencilfft with its defaults (the FFTW
kernel and, in one process, the local exchange), with XLA's kernel (PENCILFFT_FFT_KERNEL=xla
while compiling), with FFTW and XLA's collectives (pencilfft-collectives: the exchange "auto"
took before the local one), and jaxdecomp.pfft3d/pifft3d.
`memory`: the same programs compiled (not run), each direction's per-device temporaries and
output from XLA's memory analysis, in blocks of the per-device grid.
`single` (issue 43): one CPU device (jax's default), 256^3 complex64 forward + inverse, jax.jit
of pfft3d/pifft3d beside jnp.fft.fftn/ifftn, pencilfft with its defaults (the FFTW kernel on
`_threads.threads_per_device()` threads, the allocator settings of `_malloc`), in the natural
layout (jnp.fft's order) and on one thread (PENCILFFT_THREADS=1 while compiling); run it again with PENCILFFT_MALLOC=glibc for glibc's
defaults (they are process-wide: one setting per process).  Each record keeps the process's
peak and current resident memory at the end.
`allocator` (issue 43): page faults, system time and resident memory per call of the same
transform under the process's allocator settings (a process per setting).

Times are medians over `--repeats` interleaved rounds (every variant once per round, the first
one rotating), after a warm-up; each record keeps the load average, the allocator settings and
the command.  Tables (`block_table`, `mesh_table`): `python -m benchmarks.results`.
Only the standard library is imported at module level: `--devices` must come before jax starts.
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import os
import json
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any


@contextlib.contextmanager
def _kernel_env(value: str | None):
    """PENCILFFT_FFT_KERNEL[:PLANNER[:HUGE_PAGES]] set while tracing and compiling a variant."""
    keys = ("PENCILFFT_FFT_KERNEL", "PENCILFFT_FFTW_PLANNER", "PENCILFFT_FFTW_HUGE_PAGES")
    old = {k: os.environ.get(k) for k in keys}
    for key, val in zip(keys, ((value or "") + "::").split(":")):
        if val:
            os.environ[key] = val
        else:
            os.environ.pop(key, None)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def interleaved(fns: dict[str, Callable[[], object]], repeats: int,
                warmup: int = 2) -> dict[str, tuple[float, float]]:
    """(median, min) seconds per call of each function, the calls interleaved round-robin."""
    import jax

    names = list(fns)
    for name in names:
        for _ in range(warmup):
            jax.block_until_ready(fns[name]())
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(repeats):
        for name in names[r % len(names):] + names[:r % len(names)]:
            t0 = time.perf_counter()
            jax.block_until_ready(fns[name]())
            times[name].append(time.perf_counter() - t0)
    return {n: (statistics.median(t), min(t)) for n, t in times.items()}


def _malloc_env() -> str:
    keys = ("MALLOC_MMAP_MAX_", "MALLOC_TRIM_THRESHOLD_", "PENCILFFT_MALLOC")
    set_ = [f"{k}={os.environ[k]}" for k in keys if k in os.environ]
    return " ".join(set_) or "nothing set"


def _base(tool: str) -> dict[str, Any]:
    from benchmarks import harness

    return {"tool": tool, "malloc": _malloc_env(), "cores": len(os.sched_getaffinity(0)),
            "machine": {**harness.machine_info(), "loadavg_1m": harness.loadavg()},
            "versions": harness.versions(),
            "command": " ".join(["python -m benchmarks.kernel"] + sys.argv[1:])}


def block(args: argparse.Namespace) -> list[dict[str, Any]]:
    import jax
    import jax.numpy as jnp
    import numpy as np
    import pyfftw

    from pencilfft._transforms import kernel as _kernel

    shape = (128, 256, 256)
    rng = np.random.default_rng(0)
    host = (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(np.complex64)
    x = jax.device_put(host)
    print(f"block {shape} complex64, {_malloc_env()}, affinity {sorted(os.sched_getaffinity(0))}, "
          f"kernel: {_kernel.describe()}", flush=True)
    records = []
    for axes in ((1, 2), (2,)):
        # Estimated plans first, after forgetting FFTW's wisdom: the kernel and pyFFTW share one
        # libfftw3f, whose ESTIMATE plans reuse what an earlier MEASURE plan learnt.
        pyfftw.forget_wisdom()
        fns: dict[str, Callable[[], object]] = {}
        for effort in ("estimate", "measure"):
            with _kernel_env(f"fftw:{effort}"):
                f = jax.jit(lambda a, axes=axes: _kernel.fft(a, "fft", axes, "backward", ()))
                f = f.lower(x).compile()
                assert _kernel.TARGET in f.as_text()
                err = float(np.abs(np.asarray(f(x)) - np.fft.fftn(host, axes=axes)).max())
                assert err < 1e-2 * np.sqrt(host.size), err  # (and planned, by this call)
            fns[f"fftw-{effort}"] = functools.partial(f, x)
            a = pyfftw.empty_aligned(shape, np.complex64)
            b = pyfftw.empty_aligned(shape, np.complex64)
            plan = pyfftw.FFTW(a, b, axes=axes, flags=(f"FFTW_{effort.upper()}",), threads=1)
            a[...] = host
            fns[f"pyfftw-{effort}"] = plan  # FFTW's execute alone: preallocated arrays
        with _kernel_env("fftw:measure:0"):  # without the huge pages hint
            f = jax.jit(lambda a, axes=axes: _kernel.fft(a, "fft", axes, "backward", ()))
            fns["fftw-4k-pages"] = functools.partial(f.lower(x).compile(), x)
        fns["xla"] = functools.partial(jax.jit(lambda a, axes=axes: jnp.fft.fftn(a, axes=axes))
                                       .lower(x).compile(), x)
        base = _base("kernel-block")
        for name, (median, low) in interleaved(fns, args.repeats).items():
            records.append({**base, "shape": list(shape), "axes": list(axes), "variant": name,
                            "repeats": args.repeats, "median_s": median, "min_s": low})
        print(json.dumps({r["variant"]: round(r["median_s"] * 1e3, 1) for r in records[-6:]}),
              flush=True)
    return records


BLOCK_VARIANTS = ("fftw-measure", "fftw-4k-pages", "fftw-estimate", "xla", "pyfftw-measure",
                  "pyfftw-estimate")


def _rows(records: Sequence[dict[str, Any]], case: str, variants: Sequence[str],
          ratios: Sequence[tuple[str, Callable[[dict[str, float]], float]]],
          fmt: Callable[[tuple], str], digits: int) -> list[str]:
    """A table of median ms, one row per (allocator setting, `case` value), one column per
    variant, then the `ratios` (name, function of the row's {variant: ms})."""
    head = ["malloc", {"axes": "FFT", "pdims": "mesh"}[case], *(f"{v} ms" for v in variants), *(name for name, _ in ratios)]
    lines = ["| " + " | ".join(head) + " |", "|---|---|" + "---:|" * (len(head) - 2)]
    rows: dict[tuple, dict[str, float]] = {}
    for r in records:
        rows.setdefault((r["malloc"], tuple(r[case])), {})[r["variant"]] = r["median_s"] * 1e3
    for (malloc, key), ms in rows.items():
        cells = [f"{ms[v]:.{digits}f}" for v in variants] + [f"{f(ms):.2f}" for _, f in ratios]
        lines.append(f"| {malloc} | {fmt(key)} | " + " | ".join(cells) + " |")
    return lines


def block_table(records: Sequence[dict[str, Any]]) -> str:
    """One row per (allocator setting, FFT): median ms of each variant, and the ratios."""
    from benchmarks import harness

    def own(ms):  # FFTW's own best time
        return min(ms["pyfftw-measure"], ms["pyfftw-estimate"])

    lines = _rows(records, "axes", BLOCK_VARIANTS,
                  [("ours / FFTW's own", lambda ms: ms["fftw-measure"] / own(ms)),
                   ("XLA / ours", lambda ms: ms["xla"] / ms["fftw-measure"])],
                  lambda axes: f"{len(axes)}-D, axes {axes}", 1)
    lines += ["", f"(128, 256, 256) complex64, one core (`taskset -c 0`), medians of "
                  f"{records[0]['repeats']} interleaved rounds; ours (fftw-measure, the default): "
                  f"the FFTW kernel through jit (a fresh output buffer per call, with the huge "
                  f"pages hint; fftw-4k-pages: without it); FFTW's own: pyFFTW executing on "
                  f"preallocated arrays; load average: {harness.load_range(records)}."]
    return "\n".join(lines)


def mesh(args: argparse.Namespace) -> list[dict[str, Any]]:
    import jax
    import numpy as np
    from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

    from pencilfft._transforms import kernel as _kernel

    n = args.size
    print(f"{n}^3 complex64 forward + inverse, {len(jax.devices())} CPU devices, jax.jit on an "
          f"Auto mesh, nothing in scope; {_malloc_env()}; kernel: {_kernel.describe()}",
          flush=True)
    rng = np.random.default_rng(0)
    host = (rng.standard_normal((n,) * 3) + 1j * rng.standard_normal((n,) * 3)).astype(np.complex64)
    records = []
    for pdims in args.pdims:
        m = jax.make_mesh(pdims, ("x", "y"), axis_types=(AxisType.Auto,) * 2)
        x = jax.device_put(host, NamedSharding(m, P("x", "y")))
        fns = {}
        for name in MESH_VARIANTS:
            if args.one_jit:  # a spectral solve's shape: both directions in one program
                fwd_f, inv_f, env = _functions(name, pdims)
                with _kernel_env(env):
                    both = jax.jit(lambda a, f=fwd_f, i=inv_f: i(f(a) * 2) / 2).lower(x).compile()
                compiled = [both]
                fns[name] = (lambda both=both: both(x))
            else:
                fwd, inv = compiled = _compiled_pair(name, x)
                fns[name] = (lambda fwd=fwd, inv=inv: inv(fwd(x)))
            if name != "jaxdecomp":
                uses = all(_kernel.TARGET in c.as_text() for c in compiled)
                assert uses == (name != "pencilfft-xla" and _kernel.kernel() == "fftw"), name
        for name, f in fns.items():  # each round trip gives the input back
            err = float(np.abs(np.asarray(f()) - host).max())
            assert err < 1e-3, (name, err)
        base = _base("kernel-mesh")
        case = [{**base, "shape": [n] * 3, "pdims": list(pdims), "variant": name,
                 "program": "one jit" if args.one_jit else "two jits",
                 "n_devices": len(jax.devices()), "repeats": args.repeats, "median_s": median,
                 "min_s": low}
                for name, (median, low) in interleaved(fns, args.repeats, warmup=1).items()]
        print(json.dumps({r["variant"]: round(r["median_s"] * 1e3) for r in case}
                         | {"pdims": pdims}), flush=True)
        records += case
    return records


# pencilfft-fftw: the defaults (FFTW kernel, exchange "auto": the local exchange in one
# process); pencilfft-xla: XLA's FFT kernel; pencilfft-collectives: FFTW with XLA's collectives
# (what "auto" took before the local exchange: pairwise on the pencils, all_to_all on slabs).
MESH_VARIANTS = ("pencilfft-fftw", "pencilfft-xla", "pencilfft-collectives", "jaxdecomp")


def _functions(name: str, pdims) -> tuple[Callable, Callable, str | None]:
    """(forward, inverse, PENCILFFT_FFT_KERNEL while compiling) of variant `name`."""
    import jaxdecomp
    import pencilfft

    if name == "jaxdecomp":
        return jaxdecomp.pfft3d, jaxdecomp.pifft3d, None
    exchange = ("auto" if name != "pencilfft-collectives" else
                "alltoall" if 1 in pdims else "pairwise")
    return (functools.partial(pencilfft.pfft3d, exchange=exchange),
            functools.partial(pencilfft.pifft3d, exchange=exchange),
            "xla" if name == "pencilfft-xla" else "fftw")


def _compiled_pair(name: str, x) -> tuple[Any, Any]:
    """(forward, inverse) of variant `name` compiled for the sharded argument `x` (abstract)."""
    import jax

    fwd_f, inv_f, env = _functions(name, x.sharding.mesh.axis_sizes)
    with _kernel_env(env):
        fwd = jax.jit(lambda a: fwd_f(a)).lower(x).compile()
        k = jax.ShapeDtypeStruct(fwd.out_info.shape, fwd.out_info.dtype,
                                 sharding=fwd.output_shardings)
        inv = jax.jit(lambda b: inv_f(b)).lower(k).compile()
    return fwd, inv


def _present(records: Sequence[dict[str, Any]]) -> tuple[str, ...]:
    """The variants the records hold (older data files lack pencilfft-collectives)."""
    return tuple(v for v in MESH_VARIANTS if any(r["variant"] == v for r in records))


def memory(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Per-device temporaries and output of each compiled direction, in per-device blocks."""
    import jax
    import numpy as np
    from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

    n = args.size
    block = n**3 * np.dtype(np.complex64).itemsize / len(jax.devices())
    records = []
    for pdims in args.pdims:
        m = jax.make_mesh(pdims, ("x", "y"), axis_types=(AxisType.Auto,) * 2)
        x = jax.ShapeDtypeStruct((n,) * 3, np.complex64, sharding=NamedSharding(m, P("x", "y")))
        for name in MESH_VARIANTS:
            for direction, c in zip(("forward", "inverse"), _compiled_pair(name, x)):
                ma = c.memory_analysis()
                records.append({**_base("kernel-memory"), "shape": [n] * 3, "pdims": list(pdims),
                                "variant": name, "direction": direction,
                                "n_devices": len(jax.devices()),
                                "temp_blocks": ma.temp_size_in_bytes / block,
                                "output_blocks": ma.output_size_in_bytes / block})
        print(json.dumps({f"{r['variant']} {r['direction'][:3]}":
                          round(r["temp_blocks"] + r["output_blocks"], 2)
                          for r in records[-2 * len(MESH_VARIANTS):]} | {"pdims": pdims}),
              flush=True)
    return records


def memory_table(records: Sequence[dict[str, Any]]) -> str:
    """One row per mesh: temporaries + output per device (forward / inverse), in blocks."""
    from benchmarks import harness

    cells: dict[tuple, dict[str, list[str]]] = {}
    for r in records:
        row = cells.setdefault(tuple(r["pdims"]), {v: [] for v in MESH_VARIANTS})
        row[r["variant"]].append(f"{r['temp_blocks'] + r['output_blocks']:.2f}")
    variants = _present(records)
    lines = ["| mesh | " + " | ".join(f"{v} fwd / inv" for v in variants) + " |",
             "|---|" + "---:|" * len(variants)]
    for pdims, row in cells.items():
        lines.append(f"| {harness.fmt_dims(pdims)} | "
                     + " | ".join(" / ".join(row[v]) for v in variants) + " |")
    r0 = records[0]
    lines += ["", f"{harness.fmt_dims(r0['shape'])} complex64 on {r0['n_devices']} CPU devices, "
                  f"jax.jit on an Auto mesh: XLA's memory analysis of each compiled direction, "
                  f"temporaries + output per device, in blocks of the per-device grid (the "
                  f"argument, one more block, is not counted)."]
    return "\n".join(lines)


def mesh_table(records: Sequence[dict[str, Any]]) -> str:
    """One row per (allocator setting, mesh): median ms of a forward + inverse, and ratios."""
    from benchmarks import harness

    variants = _present(records)
    ratios = [(f"{v.removeprefix('pencilfft-')} / fftw",
               lambda ms, v=v: ms[v] / ms["pencilfft-fftw"])
              for v in variants if v != "pencilfft-fftw"]
    lines = _rows(records, "pdims", variants, ratios, harness.fmt_dims, 0)
    r0 = records[0]
    program = (" in one jit (`pifft3d(pfft3d(x) * 2) / 2`)" if r0.get("program") == "one jit"
               else "")
    lines += ["", f"{harness.fmt_dims(r0['shape'])} complex64, forward + inverse{program}, "
                  f"{r0['n_devices']} CPU devices in one process on {r0['cores']} cores, jax.jit "
                  f"on an Auto mesh with nothing in scope; medians of {r0['repeats']} "
                  f"interleaved rounds; load average: {harness.load_range(records)}."]
    return "\n".join(lines)


@contextlib.contextmanager
def _threads_env(value: str | None):
    """PENCILFFT_THREADS set (or unset: None) while tracing and compiling a variant."""
    old = os.environ.get("PENCILFFT_THREADS")
    if value is None:
        os.environ.pop("PENCILFFT_THREADS", None)
    else:
        os.environ["PENCILFFT_THREADS"] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("PENCILFFT_THREADS", None)
        else:
            os.environ["PENCILFFT_THREADS"] = old


def _rss_mib() -> tuple[float, float]:
    """(peak, current) resident memory of this process in MiB."""
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    with open("/proc/self/statm") as f:
        current = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    return peak, current


def allocator(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Page faults, system and user CPU time per forward + inverse call, and resident memory, of
    one CPU device's 256^3 complex64 pfft3d/pifft3d, under this process's allocator settings
    (run once per setting: they are process-wide).  Page faults and system time do not depend
    on other work sharing the machine, unlike wall time."""
    import resource

    import jax
    import numpy as np

    import pencilfft
    from pencilfft._native import malloc as _malloc

    n = args.size
    x = jax.device_put((np.ones((n,) * 3) + 1j).astype(np.complex64))
    fwd = jax.jit(pencilfft.pfft3d).lower(x).compile()
    k = jax.ShapeDtypeStruct(fwd.out_info.shape, fwd.out_info.dtype)
    inv = jax.jit(pencilfft.pifft3d).lower(k).compile()
    for _ in range(args.repeats):  # settle: the heap reaches its size
        inv(fwd(x)).block_until_ready()
    r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    for _ in range(args.repeats):
        inv(fwd(x)).block_until_ready()
    r1, t1 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    peak, current = _rss_mib()
    record = {**_base("kernel-allocator"), "shape": [n] * 3, "repeats": args.repeats,
              "allocator": _malloc.describe(),
              "faults_per_call": (r1.ru_minflt - r0.ru_minflt) / args.repeats,
              "sys_ms_per_call": (r1.ru_stime - r0.ru_stime) / args.repeats * 1e3,
              "user_ms_per_call": (r1.ru_utime - r0.ru_utime) / args.repeats * 1e3,
              "wall_ms_per_call": (t1 - t0) / args.repeats * 1e3,
              "peak_rss_mib": peak, "rss_mib": current}
    print(json.dumps({k: (round(v, 1) if isinstance(v, float) else v) for k, v in record.items()
                      if k in ("malloc", "faults_per_call", "sys_ms_per_call", "user_ms_per_call",
                               "wall_ms_per_call", "peak_rss_mib", "rss_mib")}), flush=True)
    return [record]


def allocator_table(records: Sequence[dict[str, Any]]) -> str:
    """One row per run (allocator setting)."""
    from benchmarks import harness

    lines = ["| malloc | page faults / call | system ms / call | user ms / call | wall ms / call "
             "| peak RSS MiB | RSS at end MiB |", "|---|---:|---:|---:|---:|---:|---:|"]
    for r in records:
        lines.append(f"| {r['malloc']} | {r['faults_per_call']:.0f} | {r['sys_ms_per_call']:.1f} "
                     f"| {r['user_ms_per_call']:.0f} | {r['wall_ms_per_call']:.0f} "
                     f"| {r['peak_rss_mib']:.0f} | {r['rss_mib']:.0f} |")
    r0 = records[0]
    lines += ["", f"{harness.fmt_dims(r0['shape'])} complex64, pfft3d + pifft3d on one CPU device, "
                  f"{r0['repeats']} calls after {r0['repeats']} to settle, a process per row "
                  f"(malloc: its environment; nothing set: pencilfft's own settings); wall times "
                  f"shared the machine (load average {harness.load_range(records)})."]
    return "\n".join(lines)


# pencilfft: the defaults (layout "transposed": k-space (Y, Z, X); on one device the FFT
# writes that order itself since issue 43, a transposing pass each way before);
# pencilfft-natural: layout "natural", jnp.fft's own order; pencilfft-1-thread: the defaults on
# one thread (PENCILFFT_THREADS=1).
SINGLE_VARIANTS = ("pencilfft", "pencilfft-natural", "pencilfft-1-thread", "jnp.fft")


def single(args: argparse.Namespace) -> list[dict[str, Any]]:
    import jax
    import jax.numpy as jnp
    import numpy as np

    import pencilfft
    from pencilfft._native import malloc as _malloc, threads as _threads
    from pencilfft._transforms import kernel as _kernel

    n = args.size
    rng = np.random.default_rng(0)
    host = (rng.standard_normal((n,) * 3) + 1j * rng.standard_normal((n,) * 3)).astype(np.complex64)
    x = jax.device_put(host)
    fns = {}
    for name in args.variants:
        if name == "jnp.fft":
            fwd = jax.jit(jnp.fft.fftn).lower(x).compile()
            inv = jax.jit(jnp.fft.ifftn).lower(x).compile()
        else:
            layout = "natural" if name == "pencilfft-natural" else "transposed"
            with _threads_env("1" if name == "pencilfft-1-thread" else None):
                fwd = jax.jit(functools.partial(pencilfft.pfft3d, layout=layout))
                fwd = fwd.lower(x).compile()
                k = jax.ShapeDtypeStruct(fwd.out_info.shape, fwd.out_info.dtype)
                inv = jax.jit(functools.partial(pencilfft.pifft3d, layout=layout))
                inv = inv.lower(k).compile()
            assert _kernel.kernel() != "fftw" or _kernel.TARGET in fwd.as_text()
        fns[name] = (lambda fwd=fwd, inv=inv: inv(fwd(x)))
    for name, f in fns.items():  # each round trip gives the input back
        err = float(np.abs(np.asarray(f()) - host).max())
        assert err < 1e-3, (name, err)
    print(f"{n}^3 complex64 forward + inverse, one CPU device, affinity "
          f"{sorted(os.sched_getaffinity(0))}; {_malloc_env()}; kernel: {_kernel.describe()}; "
          f"threads: {_threads.describe()}; allocator: {_malloc.describe()}", flush=True)
    timed = interleaved(fns, args.repeats)
    peak, current = _rss_mib()
    base = _base("kernel-single")
    records = [{**base, "shape": [n] * 3, "variant": name, "repeats": args.repeats,
                "median_s": median, "min_s": low, "affinity": len(os.sched_getaffinity(0)),
                "allocator": _malloc.describe(), "threads": _threads.threads_per_device(),
                "peak_rss_mib": peak, "rss_mib": current}
               for name, (median, low) in timed.items()]
    print(json.dumps({r["variant"]: round(r["median_s"] * 1e3, 1) for r in records}
                     | {"peak_rss_mib": round(peak), "rss_mib": round(current)}), flush=True)
    return records


def single_table(records: Sequence[dict[str, Any]]) -> str:
    """One row per run (cores, allocator setting): median ms of each variant, the ratio to
    jnp.fft, and the process's resident memory."""
    from benchmarks import harness

    head = ["cores", "malloc", "load", *(f"{v} ms" for v in SINGLE_VARIANTS),
            "pencilfft / jnp.fft", "natural / jnp.fft", "peak RSS MiB", "RSS at end MiB"]
    lines = ["| " + " | ".join(head) + " |", "|---:|---|" + "---:|" * (len(head) - 2)]
    runs: dict[tuple, dict[str, Any]] = {}
    for r in records:
        key = (r["machine"].get("loadavg_1m"), r["affinity"], r["malloc"])
        runs.setdefault(key, {})[r["variant"]] = r
    for (load, cores, malloc), row in runs.items():
        ms = {v: f"{row[v]['median_s'] * 1e3:.1f}" if v in row else "" for v in SINGLE_VARIANTS}
        ratios = [f"{row[v]['median_s'] / row['jnp.fft']['median_s']:.2f}"
                  if {v, "jnp.fft"} <= set(row) else "" for v in ("pencilfft", "pencilfft-natural")]
        any_r = next(iter(row.values()))
        lines.append(f"| {cores} | {malloc} | {load:.1f} | " + " | ".join(ms.values()) + " | "
                     + " | ".join(ratios) + f" | {any_r['peak_rss_mib']:.0f} | "
                     f"{any_r['rss_mib']:.0f} |")
    r0 = records[0]
    repeats = "-".join(str(v) for v in sorted({r["repeats"] for r in records}))
    lines += ["", f"{harness.fmt_dims(r0['shape'])} complex64, forward + inverse, one CPU device "
                  f"(jax's default), jax.jit; medians of {repeats} interleaved rounds; "
                  f"cores: the process's affinity (1: `taskset -c 0`); malloc: the environment "
                  f"(nothing set: pencilfft's own settings, `_malloc`); load: the 1-minute load "
                  f"average when the run started (2 cores)."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.kernel", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="what", required=True)
    b = sub.add_parser("block", help="one slab block: kernel vs XLA vs pyFFTW")
    b.add_argument("--repeats", type=int, default=15)
    m = sub.add_parser("mesh", help="256^3 on CPU devices: pencilfft variants vs jaxdecomp")
    m.add_argument("--repeats", type=int, default=7)
    m.add_argument("--one-jit", action="store_true",
                   help="both directions in one jitted function (a spectral solve's shape; "
                        "default: a jit each, as the issue's target)")
    mem = sub.add_parser("memory", help="per-device memory of the compiled mesh programs")
    s = sub.add_parser("single", help="one CPU device: pencilfft vs jnp.fft (issue 43)")
    s.add_argument("--repeats", type=int, default=11)
    al = sub.add_parser("allocator", help="one CPU device: page faults and memory per call")
    al.add_argument("--repeats", type=int, default=8)
    al.add_argument("--size", type=int, default=256)
    s.add_argument("--size", type=int, default=256)
    s.add_argument("--variants", nargs="+", default=list(SINGLE_VARIANTS),
                   choices=SINGLE_VARIANTS)
    for q in (m, mem):
        q.add_argument("--devices", type=int, default=8)
        q.add_argument("--size", type=int, default=256)
        q.add_argument("--pdims", nargs="+", default=[(1, 8), (8, 1), (4, 2), (2, 4)],
                       type=lambda s: tuple(int(v) for v in s.split("x")))
    for q in (b, m, mem, s, al):
        q.add_argument("--out", type=Path, help="append JSON records to this file")
    args = p.parse_args(argv)
    from benchmarks import steps

    if args.what in ("mesh", "memory"):
        from benchmarks.harness import configure_devices

        configure_devices(args.devices)
        run, table = (mesh, mesh_table) if args.what == "mesh" else (memory, memory_table)
        records = run(args)
        print(table(records))
    elif args.what == "single":
        records = single(args)
        print(single_table(records))
    elif args.what == "allocator":
        records = allocator(args)
        print(allocator_table(records))
    else:
        records = block(args)
        print(block_table(records))
    steps.write_records(args.out, records)


if __name__ == "__main__":
    main()
