"""The `pencilfft` command: `pencilfft check` runs and cross-checks the distributed FFT.

Kept free of module-level jax work: the CPU device count must be set before jax creates its
backend, so everything that touches devices happens inside `main`.
"""
from __future__ import annotations

import argparse
import os
import sys

DEFAULT_DEVICES = 8


def _pdims(text: str) -> tuple[int, ...]:
    try:
        dims = tuple(int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"mesh must look like 4x2 or 8; got {text!r}") from None
    if not 1 <= len(dims) <= 2 or min(dims) < 1:
        raise argparse.ArgumentTypeError(f"mesh must have 1 or 2 positive sizes; got {text!r}")
    return dims


def _shape(text: str) -> tuple[int, int, int]:
    try:
        dims = tuple(int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"shape must look like 64 or 64x32x16; got {text!r}") from None
    if len(dims) == 1:
        dims = dims * 3
    if len(dims) != 3 or min(dims) < 1:
        raise argparse.ArgumentTypeError(f"shape must be N or XxYxZ; got {text!r}")
    return dims


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pencilfft", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    check = sub.add_parser(
        "check",
        help="run distributed forward+inverse 3D FFTs and cross-check them",
        description="Run pfft3d/pifft3d on every mesh and layout asked for, compare with "
        "jnp.fft.fftn (and jaxdecomp.pfft3d when installed), and print errors and timings. "
        "Exits with status 1 if any error exceeds the tolerance.",
    )
    check.add_argument("--shape", type=_shape, default=(64, 64, 64),
                       help="global grid, N or XxYxZ (default 64)")
    check.add_argument("--mesh", "--pdims", dest="meshes", type=_pdims, nargs="+",
                       help="meshes like 4x2 1x8 8 (default: every 2-D factorisation of the "
                       "device count, and the 1-axis mesh)")
    check.add_argument("--dtype", choices=["complex64", "complex128"], default="complex64")
    check.add_argument("--layout", dest="layouts", nargs="+", choices=["transposed", "natural"],
                       default=["transposed", "natural"])
    check.add_argument("--devices", type=int, default=None,
                       help="simulated CPU devices per process when running on CPU (default: "
                       f"{DEFAULT_DEVICES} in all, split over the MPI processes); ignored when "
                       "XLA_FLAGS already sets a count")
    check.add_argument("--repeats", type=int, default=5, help="timed runs per case (median)")
    return parser


def _world_size() -> int:
    for var in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS"):
        if os.environ.get(var, "").isdigit():
            return max(1, int(os.environ[var]))
    return 1


def _configure_cpu_devices(requested: int | None) -> None:
    """Give the CPU backend several devices, unless the user's XLA_FLAGS already does."""
    if "xla_force_host_platform_device_count" in os.environ.get("XLA_FLAGS", ""):
        return
    import jax

    n = requested if requested is not None else max(1, DEFAULT_DEVICES // _world_size())
    jax.config.update("jax_num_cpu_devices", n)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _configure_cpu_devices(args.devices)
    from . import initialize

    initialize()
    if args.command == "check":
        from ._check import run_check

        return run_check(args)
    return 2  # pragma: no cover - argparse rejects unknown commands


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
