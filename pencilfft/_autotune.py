"""Pick the mesh shape and exchange algorithm by timing them (as cuDecomp's autotuner does).

Which decomposition is fastest depends on the machine (interconnect, GPUs per node), the grid
and the device count, so it is measured rather than modelled: every candidate runs a forward
and an inverse transform a few times and the fastest median wins.
"""
from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType

from ._fft import pfft3d, pifft3d, pirfft3d, prfft3d
from ._sharding import real_space_sharding

__all__ = ["autotune", "Tuning"]


@dataclasses.dataclass(frozen=True)
class Tuning:
    """The result of `autotune`: the fastest candidate and every measurement.

    `mesh` is ready to use (axes ("x", "y"), Explicit); pass `exchange` to the transforms.
    `timings` maps (pdims, exchange) to the median seconds of one forward + inverse pair.
    """

    pdims: tuple[int, int]
    exchange: str
    mesh: jax.sharding.Mesh
    seconds: float
    timings: dict[tuple[tuple[int, int], str], float]


def _candidates(shape, n_devices, pdims) -> list[tuple[int, int]]:
    X, Y = shape[-3], shape[-2]
    if pdims is None:
        pdims = [(p, n_devices // p) for p in range(1, n_devices + 1) if n_devices % p == 0]
    valid = [tuple(p) for p in pdims if X % p[0] == 0 and Y % p[1] == 0 and p[0] * p[1] == n_devices]
    if not valid:
        raise ValueError(
            f"`shape` {tuple(shape)} fits no candidate mesh of {n_devices} devices: X must be "
            f"divisible by P and Y by Q for some P x Q = {n_devices} (candidates: {list(pdims)})"
        )
    return valid


def autotune(shape: Sequence[int], *, dtype=np.complex64, layout: str = "transposed",
             devices: Sequence[jax.Device] | None = None, pdims=None,
             exchanges: Sequence[str] = ("alltoall", "pairwise"), repeats: int = 3) -> Tuning:
    """Time every mesh shape P x Q of `devices` and every exchange on a grid of global `shape`.

    Args:
      shape: global real-space shape (..., X, Y, Z).
      dtype: complex dtype for pfft3d, or a float dtype for the real transforms.
      devices: default all devices (every process must call autotune, with the same arguments).
      pdims: candidate (P, Q) pairs; default every factorisation of the device count.
      exchanges: candidate exchange algorithms.
      repeats: timed forward + inverse pairs per candidate (after one warm-up).
    Returns a `Tuning`; every process gets the same answer (process 0's timings decide).
    """
    if len(shape) < 3:
        raise ValueError(f"`shape` must have at least 3 dimensions; got {tuple(shape)}")
    if repeats < 1:
        raise ValueError(f"`repeats` must be at least 1; got {repeats}")
    devices = list(jax.devices() if devices is None else devices)
    real = not np.issubdtype(np.dtype(dtype), np.complexfloating)
    fwd, inv = (prfft3d, pirfft3d) if real else (pfft3d, pifft3d)
    timings: dict[tuple[tuple[int, int], str], float] = {}
    for p in _candidates(shape, len(devices), pdims):
        mesh = jax.make_mesh(p, ("x", "y"), axis_types=(AxisType.Explicit,) * 2, devices=devices)
        x = jax.jit(lambda: jnp.zeros(shape, dtype),
                    out_shardings=real_space_sharding(mesh, len(shape)))()
        for exchange in exchanges:
            if real:
                run = jax.jit(lambda a, e=exchange: inv(fwd(a, layout=layout, exchange=e),
                                                        tuple(shape[-3:]), layout=layout, exchange=e))
            else:
                run = jax.jit(lambda a, e=exchange: inv(fwd(a, layout=layout, exchange=e),
                                                        layout=layout, exchange=e))
            run(x).block_until_ready()
            times = []
            for _ in range(repeats):
                t = time.perf_counter()
                run(x).block_until_ready()
                times.append(time.perf_counter() - t)
            timings[(p, exchange)] = statistics.median(times)
    timings = _agree(timings)
    (best_pdims, best_exchange), seconds = min(timings.items(), key=lambda kv: kv[1])
    mesh = jax.make_mesh(best_pdims, ("x", "y"), axis_types=(AxisType.Explicit,) * 2,
                         devices=devices)
    return Tuning(best_pdims, best_exchange, mesh, seconds, timings)


def _agree(timings: dict) -> dict:
    """Process 0's timings on every process, so all of them choose the same mesh."""
    if jax.process_count() == 1:
        return timings
    from jax.experimental import multihost_utils

    keys = list(timings)
    values = multihost_utils.broadcast_one_to_all(np.asarray([timings[k] for k in keys]))
    return dict(zip(keys, (float(v) for v in values)))
