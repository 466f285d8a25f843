"""The implementations the FFT benchmark compares: `IMPLEMENTATIONS`, name -> builder.

A builder (`benchmarks.harness.Builder`) gets the case's `CaseRunner` (its mesh, input data and
arguments) and a fresh `Variant`, and fills the variant's `fns` (direction -> function of a global
array), `x` (the forward's input) and `n_devices`; or raises `Skip` with the reason the
implementation cannot run here.  The harness compiles, times and checks what it fills in.

The names, their descriptions and order (`harness.IMPLS`) and their layout rules
(`harness.LAYOUT_FREE`, `harness.ONE_LAYOUT`) are the harness's: the records and tables use them
without importing anything of an implementation.

Only the standard library is imported at module level: jax must not start before the harness
has set the number of devices.
"""
from __future__ import annotations

import functools
import importlib
import inspect
import math
import os
from types import ModuleType

from benchmarks.harness import Builder, CaseRunner, Skip, Variant


# --------------------------------------------------------------------------------------------
# pencilfft
# --------------------------------------------------------------------------------------------

def _pencilfft(runner: CaseRunner, v: Variant, fwd_name: str, inv_name: str,
               exchange: str = "auto") -> None:
    """pencilfft.<fwd_name> / <inv_name> on the `--axis-type` mesh, mesh= passed explicitly.

    Older pencilfft versions lack some names and options: a Skip says which, so the harness
    can time any checkout.
    """
    try:
        import pencilfft
    except Exception as e:  # noqa: BLE001
        raise Skip(f"pencilfft not importable ({type(e).__name__}: {e})")
    if not (hasattr(pencilfft, fwd_name) and hasattr(pencilfft, inv_name)):
        raise Skip(f"pencilfft.{fwd_name}/{inv_name} not available in this version")
    mesh = runner.mesh(runner.args.axis_type)
    fwd, inv = getattr(pencilfft, fwd_name), getattr(pencilfft, inv_name)
    if "exchange" in inspect.signature(fwd).parameters:
        fwd = functools.partial(fwd, exchange=exchange)
        inv = functools.partial(inv, exchange=exchange)
    elif exchange != "auto":
        raise Skip(f"pencilfft.{fwd_name} has no `exchange` option in this version")
    norm, lay, shape = runner.args.norm, v.layout, runner.case.shape
    x = runner.input(pencilfft.real_space_sharding(mesh), v.real_input)
    v.n_devices = mesh.size
    v.fns["forward"] = lambda a: fwd(a, norm, layout=lay, mesh=mesh)
    if v.real_input:  # pirfft3d(k, s, norm, *, layout, mesh)
        v.fns["inverse"] = lambda k: inv(k, shape, norm, layout=lay, mesh=mesh)
    elif "s" in inspect.signature(inv).parameters:  # s: crops a padded spectrum back
        v.fns["inverse"] = lambda k: inv(k, norm, s=shape, layout=lay, mesh=mesh)
    else:
        v.fns["inverse"] = lambda k: inv(k, norm, layout=lay, mesh=mesh)
    v.x = x


def build_pencilfft(runner: CaseRunner, v: Variant) -> None:
    _pencilfft(runner, v, "pfft3d", "pifft3d")


def build_pencilfft_jit(runner: CaseRunner, v: Variant) -> None:
    """No mesh= and no mesh in scope: the mesh comes from the input's sharding (Auto axes)."""
    from jax.sharding import NamedSharding, PartitionSpec as P

    import pencilfft

    mesh = runner.mesh("auto")
    norm, lay = runner.args.norm, v.layout
    v.n_devices = mesh.size
    v.fns["forward"] = lambda a: pencilfft.pfft3d(a, norm, layout=lay)
    v.fns["inverse"] = lambda k: pencilfft.pifft3d(k, norm, layout=lay)
    v.x = runner.input(NamedSharding(mesh, P(*mesh.axis_names)), False)


def build_pencilfft_a2a(runner: CaseRunner, v: Variant) -> None:
    _pencilfft(runner, v, "pfft3d", "pifft3d", exchange="alltoall")


def build_pencilfft_r2c(runner: CaseRunner, v: Variant) -> None:
    # Set before anything can Skip: a skipped record still names the real input dtype.
    v.real_input = True
    _pencilfft(runner, v, "prfft3d", "pirfft3d")


# --------------------------------------------------------------------------------------------
# Single-layout implementations on 2-axis meshes: naive pencil, jaxdecomp
# --------------------------------------------------------------------------------------------

def _require(runner: CaseRunner, v: Variant, impl: str, module: str, layout: str) -> ModuleType:
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
    if len(runner.case.pdims) != 2:
        n = runner.case.pdims[0]
        raise Skip(f"{impl} needs a 2-axis mesh (e.g. pdims {n}x1 instead of {n})")
    return mod


def build_naive_pencil(runner: CaseRunner, v: Variant) -> None:
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

    pencilfft = _require(runner, v, "naive-pencil", "pencilfft", "natural")
    (x_, y_, z_), (pa, pb) = runner.case.shape, runner.case.pdims
    bad = [f"{name}={n} by {axis} ({p})" for name, n, axis, p in
           (("X", x_, "x", pa), ("Y", y_, "y", pb), ("Z", z_, "y", pb), ("Y", y_, "x", pa)) if n % p]
    if bad:
        raise Skip("naive-pencil needs X, Y split by x and Y, Z split by y exactly; not divisible: "
                   + ", ".join(bad))
    mesh = runner.mesh(runner.args.axis_type)
    norm = runner.args.norm

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
    v.x = runner.input(pencilfft.real_space_sharding(mesh), False)


def _jaxdecomp(runner: CaseRunner, v: Variant, backend: str) -> None:
    from jax.sharding import NamedSharding, PartitionSpec as P

    jaxdecomp = _require(runner, v, "jaxdecomp", "jaxdecomp", "transposed")
    mesh = runner.mesh("auto")  # jaxdecomp 0.3.1 fails on Explicit axes
    norm = runner.args.norm
    v.n_devices = mesh.size
    v.fns["forward"] = lambda a: jaxdecomp.pfft3d(a, norm, backend=backend)
    v.fns["inverse"] = lambda k: jaxdecomp.pifft3d(k, norm, backend=backend)
    v.x = runner.input(NamedSharding(mesh, P("x", "y")), False)


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


def build_jaxdecomp(runner: CaseRunner, v: Variant) -> None:
    _jaxdecomp(runner, v, "jax")


def build_jaxdecomp_cudecomp(runner: CaseRunner, v: Variant) -> None:
    if not _cudecomp_available():
        raise Skip("needs a GPU and jaxdecomp built with cuDecomp")
    _jaxdecomp(runner, v, "cudecomp")


# --------------------------------------------------------------------------------------------
# jnp.fft.fftn baselines: sharded (XLA gathers) and on one device
# --------------------------------------------------------------------------------------------

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


def _global_nbytes(runner: CaseRunner) -> int:
    import numpy as np

    return math.prod(runner.case.shape) * np.dtype(runner.case.dtype).itemsize


def _fftn_fns(runner: CaseRunner, v: Variant) -> None:
    import jax.numpy as jnp

    norm = runner.args.norm
    v.fns["forward"] = lambda a: jnp.fft.fftn(a, norm=norm)
    v.fns["inverse"] = lambda k: jnp.fft.ifftn(k, norm=norm)


def build_fftn_sharded(runner: CaseRunner, v: Variant) -> None:
    import jax
    from jax.sharding import NamedSharding, PartitionSpec as P

    # Every device ends up holding the whole array (input gathered, output, temp).
    if not fits_on_one_device(_global_nbytes(runner), 3, jax.local_device_count()):
        raise Skip("the global array does not fit on one device (fftn gathers it)")
    mesh = runner.mesh("auto")
    v.n_devices = mesh.size
    _fftn_fns(runner, v)
    v.x = runner.input(NamedSharding(mesh, P(*mesh.axis_names)), False)


def build_fftn_1dev(runner: CaseRunner, v: Variant) -> None:
    import jax
    from jax.sharding import NamedSharding, PartitionSpec as P

    if not runner.single_process:
        raise Skip("one-device baseline skipped with several processes")
    if not fits_on_one_device(_global_nbytes(runner), 4):
        raise Skip("the global array does not fit on one device")
    mesh = runner.mesh("auto")
    # The same data as the sharded variants (same blocks), moved whole to one device.
    x = runner.input(NamedSharding(mesh, P(*mesh.axis_names)), False)
    v.n_devices = 1
    _fftn_fns(runner, v)
    v.x = jax.device_put(x, jax.devices()[0])


# Keys: harness.IMPLS's names, in its order (a test holds them equal).
IMPLEMENTATIONS: dict[str, Builder] = {
    "pencilfft": build_pencilfft,
    "pencilfft-jit": build_pencilfft_jit,
    "pencilfft-a2a": build_pencilfft_a2a,
    "pencilfft-r2c": build_pencilfft_r2c,
    "naive-pencil": build_naive_pencil,
    "jaxdecomp": build_jaxdecomp,
    "jaxdecomp-cudecomp": build_jaxdecomp_cudecomp,
    "fftn-sharded": build_fftn_sharded,
    "fftn-1dev": build_fftn_1dev,
}
