"""One GPU: pencilfft beside jnp.fft and jaxdecomp, checked against numpy, then timed.

Run on a machine with one CUDA GPU (JAX_PLATFORMS unset or "cuda"):

    python benchmarks/gpu.py --out gpu.jsonl
    python -m benchmarks.gpu table benchmarks/data/gpu-h100.jsonl      # the RESULTS.md table

First the checks, each asserting (a failure stops the run with exit status 1): the complex and
real transforms, both layouts, on no mesh, an Auto and an Explicit 1x1 mesh, eager and under
jit, a gradient, all against numpy's float64 FFT; and the compiled GPU programs hold none of
pencilfft's CPU custom calls and no all-gather.  Then forward + inverse of N^3 complex64 (and
the real transform, float32) for every implementation: median of `--repeats` timed calls after
warm-up, and XLA's memory analysis of each compiled program (bytes per device).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

import pencilfft


def _rel(a, b) -> float:
    a, b = np.asarray(a, dtype=np.complex128), np.asarray(b, dtype=np.complex128)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def check(n: int = 32) -> list[str]:
    """The correctness checks; returns one line per check (each asserts)."""
    lines = []
    rng = np.random.default_rng(0)
    meshes = {"none": None}
    for kind in ("auto", "explicit"):
        t = {"auto": AxisType.Auto, "explicit": AxisType.Explicit}[kind]
        meshes[kind] = jax.make_mesh((1, 1), ("x", "y"), axis_types=(t, t))
    for dtype, tol in (("complex64", 1e-5), ("complex128", 1e-12)):
        x = rng.standard_normal((n, n + 8, n + 16)) + 1j * rng.standard_normal((n, n + 8, n + 16))
        x = x.astype(dtype)
        ref = np.fft.fftn(x.astype(np.complex128))
        for name, mesh in meshes.items():
            xa = jnp.asarray(x) if mesh is None else jax.device_put(
                x, NamedSharding(mesh, P("x", "y")))
            for layout, want in (("transposed", ref.transpose(1, 2, 0)), ("natural", ref)):
                for how, f in (("eager", pencilfft.pfft3d),
                               ("jit", jax.jit(pencilfft.pfft3d, static_argnames="layout"))):
                    k = f(xa, layout=layout)
                    err = _rel(k, want)
                    assert err < tol, (dtype, name, layout, how, err)
                    back = pencilfft.pifft3d(k, layout=layout)
                    err_back = _rel(back, x)
                    assert err_back < tol, (dtype, name, layout, how, "inverse", err_back)
                    lines.append(f"pfft3d/pifft3d {dtype} mesh={name} {layout} {how}: "
                                 f"{err:.1e} / {err_back:.1e}")
    # The real transform (half spectrum along Z) and its inverse.
    for dtype, tol in (("float32", 1e-5), ("float64", 1e-12)):
        x = rng.standard_normal((n, n, n)).astype(dtype)
        ref = np.fft.rfftn(x.astype(np.float64))
        mesh = meshes["explicit"]
        xa = jax.device_put(x, NamedSharding(mesh, P("x", "y")))
        k = jax.jit(pencilfft.prfft3d)(xa)
        err = _rel(k, ref.transpose(1, 2, 0))
        assert err < tol, ("prfft3d", dtype, err)
        back = jax.jit(lambda k: pencilfft.pirfft3d(k, s=x.shape))(k)
        err_back = _rel(back, x)
        assert err_back < tol, ("pirfft3d", dtype, err_back)
        lines.append(f"prfft3d/pirfft3d {dtype}: {err:.1e} / {err_back:.1e}")
    # A gradient: d/dx sum |fft(x)|^2 = 2 N x (Parseval), on the Auto mesh under jit.
    x = rng.standard_normal((n, n, n)).astype(np.float32)
    xa = jax.device_put(x, NamedSharding(meshes["auto"], P("x", "y")))
    g = jax.jit(jax.grad(lambda x: jnp.sum(jnp.abs(pencilfft.pfft3d(x)) ** 2)))(xa)
    err = _rel(g, 2 * n**3 * x)
    assert err < 1e-5, ("grad", err)
    lines.append(f"grad of sum |pfft3d|^2: {err:.1e}")
    # The compiled GPU program: XLA's FFTs only, none of pencilfft's CPU custom calls.
    text = jax.jit(pencilfft.pfft3d).lower(xa).compile().as_text()
    if jax.default_backend() == "cpu":  # a dry run here: the CPU program may call the kernel
        return lines
    assert "pencilfft_" not in text, "a pencilfft CPU custom call in the GPU program"
    assert "all-gather" not in text
    assert "fft(" in text or "fft-" in text or "custom-call" in text
    lines.append("GPU program: no pencilfft custom call, no all-gather")
    return lines


def _numpy_paint(dx: np.ndarray, window: str) -> np.ndarray:
    """float64 numpy: the density of unit particles at lattice site + dx (periodic)."""
    from pencilfft._pm.window import WINDOWS, weights

    X, Y, Z, _ = dx.shape
    s = WINDOWS[window]
    pos = np.stack(np.meshgrid(*map(np.arange, (X, Y, Z)), indexing="ij"), -1) + dx
    t = pos + 1 - s / 2
    base = np.floor(t).astype(int)
    w = [[np.asarray(a, np.float64) for a in weights(t[..., d] - base[..., d], window)]
         for d in range(3)]
    g = np.zeros((X, Y, Z))
    for a in range(s):
        for b in range(s):
            for c in range(s):
                np.add.at(g, ((base[..., 0] + a) % X, (base[..., 1] + b) % Y,
                              (base[..., 2] + c) % Z), w[0][a] * w[1][b] * w[2][c])
    return g


def check_paint(n: int = 16) -> list[str]:
    """paint/readout on the GPU (XLA's scatter and gather there) against numpy; the GPU program
    holds no CPU custom call."""
    lines = []
    rng = np.random.default_rng(1)
    mesh = jax.make_mesh((1, 1), ("x", "y"), axis_types=(AxisType.Explicit,) * 2)
    for window in ("cic", "tsc"):
        dx = rng.normal(size=(n, n, n, 3)) * 0.3
        want = _numpy_paint(dx, window)
        d = jax.device_put(dx, NamedSharding(mesh, P("x", "y")))
        got = jax.jit(lambda d: pencilfft.paint(d, window=window))(d)
        err = _rel(got, want)
        assert err < 1e-12, ("paint", window, err)
        field = rng.normal(size=(n, n, n))
        f = jax.device_put(field, NamedSharding(mesh, P("x", "y")))
        # readout is paint's adjoint: <paint(1), f> == <1, readout(f)>
        back = jax.jit(lambda f, d: pencilfft.readout(f, d, window=window))(f, d)
        adj = abs(float(jnp.sum(got * f)) - float(jnp.sum(back))) / abs(float(jnp.sum(back)))
        assert adj < 1e-12, ("readout adjoint", window, adj)
        lines.append(f"paint/readout {window} float64 on the GPU: {err:.1e} / adjoint {adj:.1e}")
    text = jax.jit(lambda d: pencilfft.paint(d)).lower(d).compile().as_text()
    if jax.default_backend() != "cpu":
        assert "pencilfft_" not in text, "a pencilfft CPU custom call in the GPU paint program"
    lines.append("GPU paint program: no pencilfft custom call")
    return lines


def time_paint(sizes, repeats: int) -> list[dict]:
    """paint + readout (CIC, float32, one particle per cell, 0.3 cells r.m.s.) on one device."""
    mesh = jax.make_mesh((1, 1), ("x", "y"), axis_types=(AxisType.Auto,) * 2)
    rows = []
    for n in sizes:
        dx = jax.device_put(0.3 * jax.random.normal(jax.random.key(0), (n, n, n, 3), jnp.float32),
                            NamedSharding(mesh, P("x", "y")))
        f = jax.jit(lambda d: pencilfft.readout(pencilfft.paint(d), d))
        ms, _ = _median_ms(f, dx, repeats)
        row = {"n": n, "dtype": "float32", "impl": "pencilfft paint+readout", "ms": round(ms, 3),
               "memory": _memory(lambda d: pencilfft.readout(pencilfft.paint(d), d), dx)}
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def _median_ms(f, x, repeats: int) -> tuple[float, float]:
    for _ in range(3):
        jax.block_until_ready(f(x))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(f(x))
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times), min(times)


def _memory(f, x) -> dict:
    m = jax.jit(f).lower(x).compile().memory_analysis()
    if m is None:
        return {}
    return {"temp_bytes": m.temp_size_in_bytes, "output_bytes": m.output_size_in_bytes,
            "argument_bytes": m.argument_size_in_bytes}


def implementations(real: bool):
    """name -> (forward, inverse) on a (1, 1) Auto mesh's array."""
    impls = {}
    if real:
        impls["jnp.fft"] = (jnp.fft.rfftn, lambda k: jnp.fft.irfftn(k))
        impls["pencilfft"] = (pencilfft.prfft3d,
                              lambda k: pencilfft.pirfft3d(k, s=(k.shape[2],) * 3))
        return impls
    impls["jnp.fft"] = (jnp.fft.fftn, jnp.fft.ifftn)
    impls["pencilfft"] = (pencilfft.pfft3d, pencilfft.pifft3d)
    try:
        import jaxdecomp

        impls["jaxdecomp"] = (lambda x: jaxdecomp.fft.pfft3d(x, backend="jax"),
                              lambda k: jaxdecomp.fft.pifft3d(k, backend="jax"))
    except ImportError as e:
        print(f"jaxdecomp not timed: {e}", file=sys.stderr)
    return impls


def time_all(sizes, repeats: int) -> list[dict]:
    mesh = jax.make_mesh((1, 1), ("x", "y"), axis_types=(AxisType.Auto,) * 2)
    rows = []
    for n in sizes:
        for real in (False, True):
            dtype = np.float32 if real else np.complex64
            x = jax.device_put(jnp.ones((n, n, n), dtype) * jnp.arange(n, dtype=dtype),
                               NamedSharding(mesh, P("x", "y")))
            x = x + jax.random.normal(jax.random.key(n), x.shape, dtype).astype(dtype)
            for name, (fwd, inv) in implementations(real).items():
                fj, ij = jax.jit(fwd), jax.jit(inv)
                both = jax.jit(lambda x: inv(fwd(x)))
                k = fj(x)
                back = ij(k)
                err = _rel(back, x) if n <= 256 else float("nan")
                fwd_ms, _ = _median_ms(fj, x, repeats)
                inv_ms, _ = _median_ms(ij, k, repeats)
                both_ms, both_min = _median_ms(both, x, repeats)
                row = {"n": n, "dtype": np.dtype(dtype).name, "impl": name,
                       "forward_ms": round(fwd_ms, 3), "inverse_ms": round(inv_ms, 3),
                       "fwd_inv_one_jit_ms": round(both_ms, 3), "fwd_inv_min_ms": round(both_min, 3),
                       "roundtrip_rel_err": err, "memory_forward": _memory(fwd, x),
                       "memory_fwd_inv": _memory(lambda x: inv(fwd(x)), x),
                       "block_bytes": int(x.nbytes)}
                rows.append(row)
                print(json.dumps(row), flush=True)
                del k, back
            del x
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="128,256,512,1024")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--out", default=None,
                        help="JSON-lines file: one record per row, with the run's info")
    parser.add_argument("--skip-checks", action="store_true")
    parser.add_argument("--paint-sizes", default="128,256",
                        help="grids for paint + readout timings ('' for none)")
    parser.add_argument("--paint-out", default=None, help="JSON-lines file for those rows")
    args = parser.parse_args(argv)
    jax.config.update("jax_enable_x64", True)
    info = {"jax": jax.__version__, "devices": [str(d) for d in jax.devices()],
            "device_kind": jax.devices()[0].device_kind, "pencilfft": pencilfft.__version__}
    try:
        import jaxdecomp

        info["jaxdecomp"] = jaxdecomp.__version__
    except ImportError:
        pass
    print(json.dumps(info), flush=True)
    checks = [] if args.skip_checks else check() + check_paint()
    for line in checks:
        print("ok", line, flush=True)
    if args.paint_sizes:
        paint_rows = time_paint([int(s) for s in args.paint_sizes.split(",")], args.repeats)
        if args.paint_out:
            with open(args.paint_out, "a") as f:
                for r in paint_rows:
                    f.write(json.dumps({**r, "info": info}) + "\n")
    rows = time_all([int(s) for s in args.sizes.split(",")], args.repeats)
    print(f"\n{'n':>5} {'dtype':>9} {'impl':>10} {'fwd ms':>8} {'inv ms':>8} {'f+i 1jit':>9}"
          f" {'temp/block':>10}")
    for r in rows:
        temp = r["memory_fwd_inv"].get("temp_bytes", float("nan")) / r["block_bytes"]
        print(f"{r['n']:>5} {r['dtype']:>9} {r['impl']:>10} {r['forward_ms']:>8.3f} "
              f"{r['inverse_ms']:>8.3f} {r['fwd_inv_one_jit_ms']:>9.3f} {temp:>10.2f}")
    if args.out:
        with open(args.out, "a") as f:
            for r in rows:
                f.write(json.dumps({**r, "info": info, "checks": len(checks)}) + "\n")
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["table"]:
        from benchmarks import results

        print(results.gpu_table([json.loads(line) for p in sys.argv[2:] for line in open(p)
                                 if line.strip()]))
    else:
        sys.exit(main())
