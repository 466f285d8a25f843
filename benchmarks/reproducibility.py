"""Which runs give bit-identical transforms (issue 67): one run's results, saved to compare.

    python -m benchmarks.reproducibility --out /tmp/repro --tag one-8 --mesh 8
    mpirun -np 2 python -m benchmarks.reproducibility --out /tmp/repro --tag mpi2-8 --mesh 8
    python -m benchmarks.reproducibility --out /tmp/repro --tag one-4x2 --mesh 4x2
    python -m benchmarks.reproducibility --compare /tmp/repro

A run computes, on `--mesh` (8 devices in all: "8", "4x2", "2x4", or "1" for one device,
no mesh) with `--chunks`, three transforms of fixed seeded data (the same on every run):

* `rfftn2d`: `pencilfft.rfftn` of a (256, 256) float32 field split over the rows (P(x), or
  P(x, y) on a 2-axis mesh): the 2-D case of issue 67;
* `fftn3d`: `pencilfft.fftn` of a (64, 64, 64) complex64 field split the same way;
* `pfft3d`: `pencilfft.pfft3d` of that field in `real_space_sharding(mesh)`;

each twice in the run (the second call must give the first's bits: printed), gathered, and
saved as .npy under `--out/--tag/`.  The kernel and its settings are the environment's
(PENCILFFT_FFT_KERNEL, PENCILFFT_FFTW_PLANNER, PENCILFFT_THREADS): tag the run with them.
`--compare` groups the runs saved there by identical bits, case by case, and prints each
group's largest difference from the first group's and from numpy's float64 transform (both
relative to the largest entry).
docs/concepts.md ("Reproducibility") gives the measured table.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
from pathlib import Path

import numpy as np

CASES = ("rfftn2d", "fftn3d", "pfft3d")


def _data(case: str) -> np.ndarray:
    rng = np.random.default_rng(67)
    if case == "rfftn2d":
        return rng.standard_normal((256, 256)).astype(np.float32)
    shape = (64, 64, 64)
    return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(np.complex64)


def _reference(case: str) -> np.ndarray:
    x = _data(case).astype(np.complex128 if case != "rfftn2d" else np.float64)
    if case == "rfftn2d":
        return np.fft.rfftn(x)
    k = np.fft.fftn(x)
    return np.moveaxis(k, 0, -1) if case == "pfft3d" else k  # pfft3d's (Y, Z, X)


def _run(args) -> None:
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    # 8 CPU devices in all, before jax starts: 8 / N per process under mpirun -np N.
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" not in flags:
        nproc = int(os.environ.get("OMPI_COMM_WORLD_SIZE") or os.environ.get("PMI_SIZE") or 1)
        os.environ["XLA_FLAGS"] = (f"{flags} --xla_force_host_platform_device_count="
                                   f"{8 // nproc}").strip()
    import jax
    from jax.sharding import NamedSharding, PartitionSpec as P

    import pencilfft
    from pencilfft._transforms import kernel

    pencilfft.initialize()
    rank = jax.process_index()
    out = Path(args.out) / args.tag
    results = {}
    if args.mesh == "1":
        mesh = None
    else:
        pdims = tuple(int(n) for n in args.mesh.split("x"))
        mesh = jax.make_mesh(pdims, ("x", "y")[:len(pdims)])
    for case in CASES:
        data = _data(case)
        if mesh is None:
            if case == "pfft3d":
                call = pencilfft.pfft3d
            else:
                call = pencilfft.rfftn if case == "rfftn2d" else pencilfft.fftn
            x = jax.device_put(data, jax.devices()[0])
            run = lambda a: call(a, chunks=args.chunks)  # noqa: E731
        else:
            if case == "pfft3d":
                sharding = pencilfft.real_space_sharding(mesh)
                call = pencilfft.pfft3d
            else:
                sharding = NamedSharding(mesh, P(*mesh.axis_names))
                call = pencilfft.rfftn if case == "rfftn2d" else pencilfft.fftn
            x = jax.make_array_from_callback(data.shape, sharding, lambda i: data[i])
            run = lambda a: call(a, chunks=args.chunks)  # noqa: E731
        first, second = _gathered(run(x)), _gathered(run(x))
        results[case] = {"again_identical": bool(np.array_equal(first, second)),
                         "sha256": hashlib.sha256(first.tobytes()).hexdigest()[:16]}
        if rank == 0:
            out.mkdir(parents=True, exist_ok=True)
            np.save(out / f"{case}.npy", first)
    if rank == 0:
        meta = {"tag": args.tag, "mesh": args.mesh, "chunks": args.chunks,
                "processes": jax.process_count(), "kernel": kernel.describe(),
                "env": {k: v for k, v in os.environ.items()
                        if k.startswith("PENCILFFT_") and k != "PENCILFFT_NO_WARN_JAX_VERSION"},
                "jax": jax.__version__, "results": results}
        (out / "run.json").write_text(json.dumps(meta, indent=1))
        print(json.dumps(meta))


def _gathered(y) -> np.ndarray:
    import jax

    if jax.process_count() > 1 and not y.is_fully_addressable:
        from jax.experimental import multihost_utils

        return np.asarray(multihost_utils.process_allgather(y, tiled=True))
    return np.asarray(y)


def _compare(folder: Path) -> None:
    """Per case, the runs grouped by identical bits: each group's runs, its largest difference
    from the first group (relative to the largest entry) and from numpy's float64 transform."""
    runs = sorted((json.loads(p.read_text()) for p in folder.glob("*/run.json")),
                  key=lambda m: m["tag"])
    if not runs:
        raise SystemExit(f"no runs under {folder}")
    for case in CASES:
        ref = _reference(case)
        groups: list[tuple[np.ndarray, list[str]]] = []
        for meta in runs:
            y = np.load(folder / meta["tag"] / f"{case}.npy")
            tag = meta["tag"] + ("" if meta["results"][case]["again_identical"]
                                 else " (its 2nd call differs)")
            for bits, tags in groups:
                if np.array_equal(y, bits):
                    tags.append(tag)
                    break
            else:
                groups.append((y, [tag]))
        print(f"\n{case}: {len(runs)} runs, {len(groups)} different results")
        first = groups[0][0]
        scale = np.max(np.abs(first))
        for i, (bits, tags) in enumerate(groups):
            diff = np.max(np.abs(bits - first)) / scale
            err = np.max(np.abs(bits - ref)) / np.max(np.abs(ref))
            print(f"  [{i}] vs [0]: {diff:.1e}  vs numpy: {err:.1e}  {', '.join(tags)}")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="/tmp/pencilfft-repro")
    parser.add_argument("--tag", help="this run's name (a folder under --out)")
    parser.add_argument("--mesh", default="8", help='"8", "4x2", "2x4" or "1" (one device)')
    parser.add_argument("--chunks", type=int, default=1)
    parser.add_argument("--compare", metavar="FOLDER", help="compare the runs saved there")
    args = parser.parse_args(argv)
    if args.compare:
        _compare(Path(args.compare))
    else:
        if not args.tag:
            parser.error("--tag is required to run")
        _run(args)


if __name__ == "__main__":
    main()
