"""How pencilfft measures itself: one timing rule and one error rule.

`pencilfft check`, `autotune` and the benchmarks all time and compare through these, so that a
number in one report means the same thing as in another.
"""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["time_once", "median_time", "max_rel_err"]


def time_once(fn: Callable, *args) -> tuple[float, Any]:
    """Seconds of one call, from dispatch until its result exists on every local device, and
    the result (jax dispatches asynchronously: without the wait we would time the dispatch)."""
    t0 = time.perf_counter()
    out = jax.block_until_ready(fn(*args))
    return time.perf_counter() - t0, out


def median_time(fn: Callable, *args, repeats: int, warmup: int = 1) -> float:
    """Median seconds of `repeats` calls after `warmup` untimed ones (compilation, caches)."""
    if repeats < 1:  # statistics.median of nothing: a StatisticsError far from the cause
        raise ValueError(f"`repeats` must be at least 1; got {repeats}")
    for _ in range(warmup):
        jax.block_until_ready(fn(*args))
    return statistics.median(time_once(fn, *args)[0] for _ in range(repeats))


@jax.jit
def _rel_err_jax(got, ref):
    return jnp.max(jnp.abs(got - ref)) / jnp.max(jnp.abs(ref))


def max_rel_err(got, ref) -> float:
    """max|got - ref| / max|ref| (the scale of the whole field, not per entry: FFT errors are
    relative to the field's largest value).  numpy inputs stay in numpy (float64 references);
    a jax.Array (sharded, possibly over several processes) is reduced where it lives."""
    if isinstance(got, jax.Array) or isinstance(ref, jax.Array):
        return float(_rel_err_jax(got, ref))
    ref = np.asarray(ref)
    scale = float(np.max(np.abs(ref))) if ref.size else 0.0
    return float(np.max(np.abs(np.asarray(got) - ref))) / (scale or 1.0)
