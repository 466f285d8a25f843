"""The `pencilfft` command: `pencilfft check` runs and cross-checks the distributed FFT.

Kept free of module-level jax work: the CPU device count must be set before jax creates its
backend, so everything that touches devices happens inside `main`.  Every option is checked
here or in `run_check`: a bad value is a one-line message and exit status 2, never a traceback.
"""
from __future__ import annotations

import argparse
import os
import re
import sys

DEFAULT_DEVICES = 8
# Set by MPI launchers and srun in every process (MPICH/Intel MPI, Open MPI, PMIx, SLURM).
_RANK_VARS = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID")
_SIZE_VARS = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS")
_FORCED_COUNT = re.compile(r"--xla_force_host_platform_device_count=(\S*)")


class UsageError(Exception):
    """A command-line value that cannot apply here (said once, exit status 2)."""


def _sizes(text: str, what: str, example: str) -> tuple[int, ...]:
    try:
        dims = tuple(int(v) for v in text.lower().split("x"))
    except ValueError:
        dims = ()
    if not dims or min(dims) < 1:
        raise argparse.ArgumentTypeError(
            f"{what} must look like {example} (positive sizes joined by 'x'); got {text!r}")
    return dims


def _pdims(text: str) -> tuple[int, ...]:
    """A mesh shape, e.g. 4x2 (pencils), 8 (slabs): any number of axes here; which numbers
    of axes the transforms take is checked against the library when the mesh is built."""
    return _sizes(text, "mesh", "4x2 or 8")


def _shape(text: str) -> tuple[int, int, int]:
    dims = _sizes(text, "shape", "64 or 64x32x16")
    if len(dims) == 1:
        dims = dims * 3
    if len(dims) != 3:
        raise argparse.ArgumentTypeError(f"shape must be N or XxYxZ (3 sizes); got {text!r}")
    return dims


def _at_least_one(what: str):
    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            n = 0
        if n < 1:
            raise argparse.ArgumentTypeError(f"{what} must be an integer >= 1; got {text!r}")
        return n
    parse.__name__ = what  # argparse names the type in some messages
    return parse


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pencilfft", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    check = sub.add_parser(
        "check",
        help="run distributed forward+inverse 3D FFTs and cross-check them",
        description="Run pfft3d/pifft3d on every mesh and layout asked for, compare with "
        "jnp.fft.fftn (and jaxdecomp.pfft3d when installed), and print errors and timings. "
        "Grids a mesh does not divide in k space are checked too (the padded spectrum, sliced "
        "back to the exact one). The reference gathers the grid onto every device: keep "
        "--shape modest. Exit status: 0 all checks passed, 1 a check failed or nothing could "
        "be checked, 2 a bad option.",
    )
    check.add_argument("--shape", type=_shape, default=(64, 64, 64),
                       help="global grid, N or XxYxZ (default 64)")
    check.add_argument("--mesh", "--pdims", dest="meshes", type=_pdims, nargs="+",
                       help="meshes like 4x2 1x8 8 (default: every 2-D factorisation of the "
                       "device count, and the 1-axis mesh); meshes the grid cannot be split on "
                       "in real space (X by the first axis, Y by the second) are skipped")
    check.add_argument("--dtype", choices=["complex64", "complex128"], default="complex64")
    check.add_argument("--layout", dest="layouts", nargs="+", choices=["transposed", "natural"],
                       default=["transposed", "natural"])
    check.add_argument("--devices", type=_at_least_one("--devices"), default=None,
                       help="simulated CPU devices per process (default: "
                       f"{DEFAULT_DEVICES} in all, split over the MPI processes); refused where "
                       "it cannot apply: on GPUs, or when XLA_FLAGS sets another count")
    check.add_argument("--repeats", type=_at_least_one("--repeats"), default=5,
                       help="timed runs per case (median; default 5)")
    return parser


def _launcher_int(names: tuple[str, ...]) -> int | None:
    for var in names:
        if os.environ.get(var, "").strip().isdigit():
            return int(os.environ[var])
    return None


def _world_size() -> int:
    return max(1, _launcher_int(_SIZE_VARS) or 1)


def _configure_cpu_devices(requested: int | None) -> None:
    """Give the CPU backend several devices, unless the user's XLA_FLAGS already does.

    `--devices` must take effect or be refused: XLA_FLAGS setting another count, or a
    platform without CPU devices, would silently ignore it.
    """
    forced = _FORCED_COUNT.search(os.environ.get("XLA_FLAGS", ""))
    if forced:
        if requested is not None and forced.group(1) != str(requested):
            raise UsageError(
                f"--devices {requested} cannot apply: XLA_FLAGS already sets "
                f"--xla_force_host_platform_device_count={forced.group(1)} (drop one of the two)"
            )
        return
    platforms = os.environ.get("JAX_PLATFORMS", "").lower()
    if requested is not None and platforms and "cpu" not in platforms.split(","):
        raise UsageError(f"--devices sets simulated CPU devices, but JAX_PLATFORMS={platforms} "
                         "selects no CPU; leave --devices out")
    import jax

    n = requested if requested is not None else max(1, DEFAULT_DEVICES // _world_size())
    jax.config.update("jax_num_cpu_devices", n)


def _check_devices_applied(requested: int | None) -> None:
    """After jax started: --devices applies to CPU devices only."""
    import jax

    if requested is not None and jax.default_backend() != "cpu":
        raise UsageError(f"--devices sets simulated CPU devices, but this run uses "
                         f"{jax.default_backend()} devices; leave --devices out")


def _say_once(message: str) -> None:
    """An error on stderr, once per job (process 0, or the only process)."""
    if (_launcher_int(_RANK_VARS) or 0) == 0:
        print(f"pencilfft check: error: {message}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        _configure_cpu_devices(args.devices)
        from .._processes.launch import initialize

        initialize()
        _check_devices_applied(args.devices)
        if args.command == "check":
            from .check import run_check

            return run_check(args)
    except UsageError as e:
        _say_once(str(e))
        return 2
    return 2  # pragma: no cover - argparse rejects unknown commands


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
