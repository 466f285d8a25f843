"""Pick the mesh shape and exchange algorithm by timing them (as cuDecomp's autotuner does).

Which decomposition is fastest depends on the machine (interconnect, GPUs per node), the grid
and the device count, so it is measured rather than modelled: every candidate runs a forward
and an inverse transform a few times and the fastest median wins.
"""
from __future__ import annotations

import dataclasses
import math
import operator
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType

from .._decomposition.rules import fits, process_grids
from .._decomposition.sharding import LAYOUTS, real_space_sharding
from .._exchange import local as _local_exchange, mixed as _mixed_exchange, mpi as _mpi_exchange
from .._measure import median_time
from .._processes import memory as _memory
from .fft import pfft3d, pifft3d, pirfft3d, prfft3d
from .plan import EXCHANGES

__all__ = ["autotune", "Tuning"]


@dataclasses.dataclass(frozen=True)
class Tuning:
    """The result of `autotune`: the fastest candidate and every measurement.

    `mesh` is ready to use (axes ("x", "y"), after the batch axes ("batch",) or ("batch0",
    "batch1", ...) when `batch` was given; Explicit); pass `exchange` to the transforms.
    `timings` maps (pdims, exchange) to the median seconds of one forward + inverse pair.

    Example:
      >>> tuning = pencilfft.autotune((32, 32, 32), repeats=1)
      >>> tuning.mesh.size, tuning.exchange in ("alltoall", "pairwise", "local", "mpi")
      (8, True)
    """

    pdims: tuple[int, int]
    exchange: str
    mesh: jax.sharding.Mesh
    seconds: float
    timings: dict[tuple[tuple[int, int], str], float]


# Complex dtypes time pfft3d/pifft3d, float dtypes prfft3d/pirfft3d.
_DTYPES = tuple(np.dtype(t) for t in (np.complex64, np.complex128, np.float32, np.float64))


def _int(v) -> int | None:
    """v as an int, or None for anything else (bools, floats, strings ...)."""
    if isinstance(v, bool):
        return None
    try:
        return operator.index(v)
    except TypeError:
        return None


def _check_shape(shape) -> tuple[int, ...]:
    if isinstance(shape, (str, bytes)) or not isinstance(shape, Sequence):
        raise TypeError(
            f"`shape` must be a sequence of at least 3 positive integers (..., X, Y, Z); got "
            f"{shape!r}"
        )
    if len(shape) < 3:
        raise ValueError(f"`shape` must have at least 3 dimensions; got {tuple(shape)}")
    sizes = [_int(n) for n in shape]
    if any(n is None for n in sizes):
        raise TypeError(f"`shape` must hold integers; got {tuple(shape)}")
    if any(n < 1 for n in sizes):
        raise ValueError(f"`shape` must hold positive sizes; got {tuple(sizes)}")
    return tuple(sizes)


def _check_dtype(dtype) -> np.dtype:
    try:
        dt = None if dtype is None else np.dtype(dtype)  # np.dtype(None) would be float64
    except TypeError:
        dt = None
    names = ", ".join(d.name for d in _DTYPES)
    if dt is None or dt not in _DTYPES:
        raise TypeError(
            f"`dtype` must be one of {names} (complex: pfft3d; float: prfft3d); got {dtype!r}"
        )
    if dt.itemsize != jax.dtypes.canonicalize_dtype(dt).itemsize:
        raise ValueError(
            f"`dtype` {dt.name} needs 64-bit types: call jax.config.update('jax_enable_x64', "
            f"True) first, or tune with {jax.dtypes.canonicalize_dtype(dt).name}"
        )
    return dt


def _check_repeats(repeats) -> int:
    n = _int(repeats)
    if n is None:
        raise TypeError(f"`repeats` must be an integer >= 1; got {repeats!r}")
    if n < 1:
        raise ValueError(f"`repeats` must be at least 1; got {n}")
    return n


def _check_exchanges(exchanges) -> list[str]:
    if isinstance(exchanges, (str, bytes)) or not isinstance(exchanges, Sequence):
        raise TypeError(
            f"`exchanges` must be a sequence of exchange names, e.g. ('alltoall', 'pairwise'); "
            f"got {exchanges!r}"
        )
    if not exchanges:
        raise ValueError(
            f"`exchanges` must name at least one of {EXCHANGES}; got {tuple(exchanges)!r}"
        )
    bad = [e for e in exchanges if not isinstance(e, str) or e not in EXCHANGES]
    if bad:
        raise ValueError(f"`exchanges` entries must be in {EXCHANGES}; got {bad[0]!r}")
    return list(dict.fromkeys(exchanges))


def _check_devices(devices) -> list:
    if devices is None:
        return list(jax.devices())
    if isinstance(devices, (str, bytes)) or not isinstance(devices, Sequence):
        raise TypeError(f"`devices` must be a sequence of jax devices; got {devices!r}")
    devices = list(devices)
    if not devices:
        raise ValueError("`devices` must hold at least one jax device; got an empty sequence")
    bad = [d for d in devices if not isinstance(d, jax.Device)]
    if bad:
        raise TypeError(f"`devices` must hold jax devices (jax.devices()); got {bad[0]!r}")
    if len(set(devices)) != len(devices):
        raise ValueError(f"`devices` holds a device more than once: {devices}")
    return devices


def _check_pdims(pdims, n_devices: int) -> list[tuple[int, int]] | None:
    if pdims is None:
        return None
    usage = f"`pdims` must be a sequence of (P, Q) pairs with P * Q = {n_devices}, e.g. [(4, 2)]"
    if isinstance(pdims, (str, bytes)) or not isinstance(pdims, Sequence) or not pdims:
        raise TypeError(f"{usage}; got {pdims!r}")
    out = []
    for p in pdims:
        pair = None
        if isinstance(p, Sequence) and not isinstance(p, (str, bytes)) and len(p) == 2:
            pair = tuple(_int(n) for n in p)
        if pair is None or None in pair:
            raise TypeError(f"{usage}; got the entry {p!r} in {pdims!r}")
        if min(pair) < 1 or pair[0] * pair[1] != n_devices:
            raise ValueError(f"{usage}; got the entry {p!r} (P * Q = {pair[0] * pair[1]})")
        out.append(pair)
    return out


def _check_batch(batch, shape, n_devices: int) -> tuple[int, ...]:
    """The sizes of the batch mesh axes: each splits one leading axis of `shape`."""
    if isinstance(batch, (str, bytes)) or not isinstance(batch, Sequence):
        raise TypeError(f"`batch` must be a sequence of batch mesh axis sizes, e.g. (2,); got "
                        f"{batch!r}")
    sizes = tuple(_int(n) for n in batch)
    if None in sizes or any(n < 1 for n in sizes):
        raise ValueError(f"`batch` must hold positive integers; got {tuple(batch)!r}")
    if len(sizes) > len(shape) - 3:
        raise ValueError(f"`batch` {sizes} splits {len(sizes)} leading axes, but `shape` "
                         f"{tuple(shape)} has {len(shape) - 3} before (X, Y, Z)")
    for i, n in enumerate(sizes):
        if shape[i] % n:
            raise ValueError(f"`shape[{i}]` (={shape[i]}) must be divisible by `batch[{i}]` "
                             f"(={n}), the batch mesh axis that splits it")
    if n_devices % math.prod(sizes):
        raise ValueError(f"`batch` {sizes} (product {math.prod(sizes)}) must divide the number "
                         f"of devices ({n_devices})")
    return sizes


def _mesh(batch: tuple[int, ...], p: tuple[int, int], devices) -> jax.sharding.Mesh:
    names = ("batch",) if len(batch) == 1 else tuple(f"batch{i}" for i in range(len(batch)))
    axes = names[: len(batch)] + ("x", "y")
    return jax.make_mesh(batch + tuple(p), axes, axis_types=(AxisType.Explicit,) * len(axes),
                         devices=devices)


def _candidates(shape, n_devices, pdims) -> list[tuple[int, int]]:
    if pdims is None:
        pdims = process_grids(n_devices)
    valid = [tuple(p) for p in pdims if fits(shape, p) and p[0] * p[1] == n_devices]
    if not valid:
        raise ValueError(
            f"`shape` {tuple(shape)} fits no candidate mesh of {n_devices} devices: X must be "
            f"divisible by P and Y by Q for some P x Q = {n_devices} (candidates: {list(pdims)})"
        )
    return valid


def _default_exchanges(devices: Sequence[jax.Device]) -> tuple[str, ...]:
    platform = devices[0].platform
    offered = {"mpi": _mpi_exchange.available(len(devices), platform),
               "local": _local_exchange.auto(platform), "mixed": _mixed_exchange.auto(platform)}
    return ("alltoall", "pairwise") + tuple(name for name, ok in offered.items() if ok)


def autotune(shape: Sequence[int], *, dtype=np.complex64, layout: str = "transposed",
             devices: Sequence[jax.Device] | None = None, pdims=None,
             exchanges: Sequence[str] | None = None, repeats: int = 3,
             batch: Sequence[int] = ()) -> Tuning:
    """Time every mesh shape P x Q of `devices` and every exchange on a grid of global `shape`.

    Args:
      shape: global real-space shape (..., X, Y, Z), positive integers.
      dtype: complex64/complex128 for pfft3d, or float32/float64 for the real transforms.
      devices: default all devices (every process must call autotune, with the same arguments).
      pdims: candidate (P, Q) pairs with P * Q = len(devices); default every factorisation of
        the device count.  Those the grid does not fit (X % P or Y % Q) are skipped.
      exchanges: candidate exchange algorithms (a non-empty sequence of names); default
        ("alltoall", "pairwise"), "mpi" where it can run (CPU processes under mpirun,
        `devices` all of them), "local" where "auto" takes it (CPU devices of one process) and
        "mixed" where "auto" takes it (several processes of several CPU devices each).
      repeats: timed forward + inverse pairs per candidate (after one warm-up).
      batch: sizes of batch mesh axes that split the leading axes of `shape` (an ensemble of
        fields), kept as given: the pencil axes P x Q = len(devices) / prod(batch) are tuned.
    Returns a `Tuning`; every process gets the same answer (process 0's timings decide).
    A grid that cannot fit in the devices' memory (input, spectrum, output and the exchange
    buffers per device) is refused with a `MemoryLimitError` before anything is allocated.

    Raises:
      TypeError: an argument of the wrong type (the message names it).
      ValueError: an argument out of its range (the message names it).
      MemoryLimitError: the grid cannot fit in the devices' memory.

    Example:
      >>> tuning = pencilfft.autotune((64, 64, 64), repeats=1)
      >>> sorted(tuning.timings)[:2]                         # doctest: +SKIP
      [((1, 8), 'alltoall'), ((1, 8), 'local')]
      >>> k = pencilfft.pfft3d(x, mesh=tuning.mesh, exchange=tuning.exchange)  # doctest: +SKIP
    """
    shape = _check_shape(shape)
    dtype = _check_dtype(dtype)
    if layout not in LAYOUTS:
        raise ValueError(f"`layout` must be one of {LAYOUTS}; got {layout!r}")
    repeats = _check_repeats(repeats)
    devices = _check_devices(devices)
    batch = _check_batch(batch, shape, len(devices))
    exchanges = _check_exchanges(_default_exchanges(devices) if exchanges is None else exchanges)
    n_pencil = len(devices) // math.prod(batch)
    candidates = _candidates(shape, n_pencil, _check_pdims(pdims, n_pencil))
    _memory.check_grid(shape, dtype, devices)  # the limit the transforms check too
    real = dtype.kind == "f"
    fwd, inv = (prfft3d, pirfft3d) if real else (pfft3d, pifft3d)
    timings: dict[tuple[tuple[int, int], str], float] = {}
    for p in candidates:
        mesh = _mesh(batch, p, devices)
        x = jax.jit(lambda: jnp.zeros(shape, dtype),
                    out_shardings=real_space_sharding(mesh, len(shape)))()
        for exchange in exchanges:
            if real:
                run = jax.jit(lambda a, e=exchange: inv(fwd(a, layout=layout, exchange=e),
                                                        tuple(shape[-3:]), layout=layout, exchange=e))
            else:
                run = jax.jit(lambda a, e=exchange: inv(fwd(a, layout=layout, exchange=e),
                                                        layout=layout, exchange=e))
            timings[(p, exchange)] = median_time(run, x, repeats=repeats)
    timings = _agree(timings)
    (best_pdims, best_exchange), seconds = min(timings.items(), key=lambda kv: kv[1])
    return Tuning(best_pdims, best_exchange, _mesh(batch, best_pdims, devices), seconds, timings)


def _agree(timings: dict) -> dict:
    """Process 0's timings on every process, so all of them choose the same mesh."""
    if jax.process_count() == 1:
        return timings
    from jax.experimental import multihost_utils

    keys = list(timings)
    values = multihost_utils.broadcast_one_to_all(np.asarray([timings[k] for k in keys]))
    return dict(zip(keys, (float(v) for v in values)))
