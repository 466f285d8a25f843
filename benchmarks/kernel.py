"""The CPU FFT kernel (issue 36): pencilfft's FFTW kernel against XLA's FFT and FFTW's own time.

    taskset -c 0 python -m benchmarks.kernel block            # one core: the slab block
    MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=100000000000 taskset -c 0 python -m benchmarks.kernel block
    python -m benchmarks.kernel mesh --devices 8              # 256^3, 8 CPU devices, 4 meshes

`block`: the 256^3 grid's slab block (128, 256, 256) complex64, a 2-D FFT over axes (1, 2) and a
1-D FFT along the last axis: `_kernel.fft` with the FFTW kernel (planner estimate and measure),
jnp.fft.fftn (XLA's kernel), and pyFFTW's FFTW object executing on preallocated aligned arrays
(FFTW's own time, no allocation).  `mesh`: 256^3 complex64 forward + inverse, jax.jit of
pfft3d/pifft3d on an array sharded over an Auto mesh with nothing in scope (the
compiler-partitioned path, as jaxdecomp's users call it): pencilfft with the FFTW kernel, with
XLA's kernel (PENCILFFT_FFT_KERNEL=xla while compiling) and jaxdecomp.pfft3d/pifft3d.

Times are medians over `--repeats` interleaved rounds (every variant once per round, the first
one rotating), after a warm-up; the load average is printed with each table, for the record.
Only the standard library is imported at module level: `--devices` must come before jax starts.
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import os
import statistics
import time
from collections.abc import Callable


@contextlib.contextmanager
def _kernel_env(value: str | None):
    """PENCILFFT_FFT_KERNEL (and planner) set while tracing and compiling a variant."""
    old = {k: os.environ.get(k) for k in ("PENCILFFT_FFT_KERNEL", "PENCILFFT_FFTW_PLANNER")}
    kernel, _, planner = (value or "").partition(":")
    for key, val in (("PENCILFFT_FFT_KERNEL", kernel), ("PENCILFFT_FFTW_PLANNER", planner)):
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
                warmup: int = 2) -> dict[str, float]:
    """Median seconds per call of each function, the calls interleaved round-robin."""
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
    return {n: statistics.median(t) for n, t in times.items()}


def _load() -> str:
    return " ".join(f"{v:.2f}" for v in os.getloadavg())


def _malloc_env() -> str:
    keys = ("MALLOC_MMAP_MAX_", "MALLOC_TRIM_THRESHOLD_")
    set_ = [f"{k}={os.environ[k]}" for k in keys if k in os.environ]
    return " ".join(set_) or "glibc defaults"


def block(args: argparse.Namespace) -> None:
    import jax
    import jax.numpy as jnp
    import numpy as np
    import pyfftw

    from pencilfft import _kernel

    shape = (128, 256, 256)
    rng = np.random.default_rng(0)
    host = (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(np.complex64)
    x = jax.device_put(host)
    print(f"block {shape} complex64, {_malloc_env()}, affinity {sorted(os.sched_getaffinity(0))}, "
          f"kernel: {_kernel.describe()}")
    print("| FFT | pencilfft fftw (estimate) | pencilfft fftw (measure) | XLA | pyFFTW "
          "(estimate) | pyFFTW (measure) | fftw/pyFFTW | XLA/fftw | load |")
    print("|---|---|---|---|---|---|---|---|---|")
    for axes in ((1, 2), (2,)):
        fns: dict[str, Callable[[], object]] = {}
        for name, env in (("fftw-e", "fftw:estimate"), ("fftw-m", "fftw:measure")):
            with _kernel_env(env):
                f = jax.jit(lambda a, axes=axes: _kernel.fft(a, "fft", axes, "backward", ()))
                f = f.lower(x).compile()
                err = float(np.abs(np.asarray(f(x)) - np.fft.fftn(host, axes=axes)).max())
                assert err < 1e-2 * np.sqrt(host.size), err
            fns[name] = functools.partial(f, x)
        fns["xla"] = functools.partial(jax.jit(lambda a, axes=axes: jnp.fft.fftn(a, axes=axes))
                                       .lower(x).compile(), x)
        for name, effort in (("pyfftw-e", "FFTW_ESTIMATE"), ("pyfftw-m", "FFTW_MEASURE")):
            a = pyfftw.empty_aligned(shape, np.complex64)
            b = pyfftw.empty_aligned(shape, np.complex64)
            plan = pyfftw.FFTW(a, b, axes=axes, flags=(effort,), threads=1)
            a[...] = host
            fns[name] = plan
        t = interleaved(fns, args.repeats)
        ms = {k: 1e3 * v for k, v in t.items()}
        best_fftw = min(ms["pyfftw-e"], ms["pyfftw-m"])
        print(f"| {len(axes)}-D axes {axes} | {ms['fftw-e']:.1f} | {ms['fftw-m']:.1f} | "
              f"{ms['xla']:.1f} | {ms['pyfftw-e']:.1f} | {ms['pyfftw-m']:.1f} | "
              f"{ms['fftw-e'] / best_fftw:.2f} | {ms['xla'] / ms['fftw-e']:.2f} | {_load()} |")


def mesh(args: argparse.Namespace) -> None:
    import jax
    import numpy as np
    from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

    import jaxdecomp
    import pencilfft
    from pencilfft import _kernel

    n = args.size
    print(f"{n}^3 complex64 forward + inverse, {len(jax.devices())} CPU devices, jax.jit on an "
          f"Auto mesh, nothing in scope; {_malloc_env()}; kernel: {_kernel.describe()}")
    print("| mesh | pencilfft fftw (ms) | pencilfft xla (ms) | jaxdecomp (ms) | xla/fftw | "
          "jaxdecomp/fftw | load |")
    print("|---|---|---|---|---|---|---|")
    rng = np.random.default_rng(0)
    host = (rng.standard_normal((n,) * 3) + 1j * rng.standard_normal((n,) * 3)).astype(np.complex64)
    for pdims in args.pdims:
        m = jax.make_mesh(pdims, ("x", "y"), axis_types=(AxisType.Auto,) * 2)
        x = jax.device_put(host, NamedSharding(m, P("x", "y")))
        fns = {}
        for name, env in (("fftw", "fftw"), ("xla", "xla")):
            with _kernel_env(env):
                fwd = jax.jit(lambda a: pencilfft.pfft3d(a)).lower(x).compile()
                k = fwd(x)
                inv = jax.jit(lambda b: pencilfft.pifft3d(b)).lower(k).compile()
            fns[name] = (lambda fwd=fwd, inv=inv: inv(fwd(x)))
        jfwd = jax.jit(lambda a: jaxdecomp.pfft3d(a)).lower(x).compile()
        jinv = jax.jit(lambda b: jaxdecomp.pifft3d(b)).lower(jfwd(x)).compile()
        fns["jaxdecomp"] = lambda: jinv(jfwd(x))
        for name, f in fns.items():  # each round trip gives the input back
            err = float(np.abs(np.asarray(f()) - host).max())
            assert err < 1e-3, (name, err)
        t = {k: 1e3 * v for k, v in interleaved(fns, args.repeats, warmup=1).items()}
        print(f"| {pdims[0]}x{pdims[1]} | {t['fftw']:.0f} | {t['xla']:.0f} | "
              f"{t['jaxdecomp']:.0f} | {t['xla'] / t['fftw']:.2f} | "
              f"{t['jaxdecomp'] / t['fftw']:.2f} | {_load()} |", flush=True)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.kernel", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="what", required=True)
    b = sub.add_parser("block", help="one slab block: kernel vs XLA vs pyFFTW")
    b.add_argument("--repeats", type=int, default=15)
    m = sub.add_parser("mesh", help="256^3 on CPU devices: pencilfft fftw/xla vs jaxdecomp")
    m.add_argument("--devices", type=int, default=8)
    m.add_argument("--size", type=int, default=256)
    m.add_argument("--pdims", nargs="+", default=["1x8", "8x1", "4x2", "2x4"],
                   type=lambda s: tuple(int(v) for v in s.split("x")))
    m.add_argument("--repeats", type=int, default=7)
    args = p.parse_args(argv)
    if args.what == "mesh":
        from benchmarks.harness import configure_devices

        configure_devices(args.devices)
        mesh(args)
    else:
        block(args)


if __name__ == "__main__":
    main()
