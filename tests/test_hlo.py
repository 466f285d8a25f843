"""The compiled programs have the structure the design promises (a cheap guard, not a timing).

Per transform: no all-gather (every device holds 1/P of the grid at every step); one
all-to-all per exchange (2 for pencils, 1 for slabs); every FFT over the contiguous axis (3 FFT
ops for pencils, 2 for slabs: one of them 2-D); and no stand-alone copy or transpose: each
exchange's local reordering is fused into the slicing before the all-to-all and one pass after it.
"""
from __future__ import annotations

import collections
import re

import jax
import numpy as np
import pytest

import pencilfft
from conftest import make_mesh

OPS = ("all-gather", "all-to-all", "all-reduce", "collective-permute", "reduce-scatter", "fft",
       "fusion", "copy", "transpose")


def entry_ops(compiled_text: str) -> collections.Counter:
    """Op counts of the ENTRY computation (what runs per device, fusions counted once)."""
    entry = compiled_text[compiled_text.index("\nENTRY"):]
    entry = entry[: entry.index("\n}")]
    counts = collections.Counter()
    for line in entry.splitlines()[1:]:
        m = re.search(r" (" + "|".join(OPS) + r")\(", line)
        if m:
            counts[m.group(1)] += 1
    return counts


def compiled(fn, arg):
    return entry_ops(jax.jit(fn).lower(arg).compile().as_text())


def expected(pdims, layout, real):
    pa, pb = pdims[0], (pdims[1] if len(pdims) == 2 else 1)
    slab = pb == 1 or pa == 1
    n_fft = 2 if pb == 1 else 3
    n_a2a = 1 if slab else 2
    # slicing fusions (one per peer) + one after each all-to-all; +1 for a pure local
    # transpose (slab over Y), +1 for the natural layout's final move, +1 for r2c's padding.
    fusions = (pa if pa > 1 else 0) + (pb if pb > 1 else 0) + n_a2a + (pa == 1) + 1 + real
    return n_fft, n_a2a, fusions


@pytest.mark.parametrize("real", [False, True], ids=["c2c", "r2c"])
@pytest.mark.parametrize("layout", ["transposed", "natural"])
def test_structure_of_compiled_transforms(pdims, layout, real):
    mesh = make_mesh(pdims)
    shape = (32, 32, 32)
    x = jax.ShapeDtypeStruct(shape, np.float32 if real else np.complex64,
                             sharding=pencilfft.real_space_sharding(mesh))
    if real:
        fwd = lambda a: pencilfft.prfft3d(a, layout=layout)  # noqa: E731
        bwd = lambda k: pencilfft.pirfft3d(k, shape, layout=layout)  # noqa: E731
    else:
        fwd = lambda a: pencilfft.pfft3d(a, layout=layout)  # noqa: E731
        bwd = lambda k: pencilfft.pifft3d(k, layout=layout)  # noqa: E731
    k = jax.eval_shape(fwd, x)
    k = jax.ShapeDtypeStruct(k.shape, k.dtype, sharding=pencilfft.k_space_sharding(mesh, layout))
    n_fft, n_a2a, max_fusions = expected(pdims, layout, real)
    for direction, ops in (("forward", compiled(fwd, x)), ("backward", compiled(bwd, k))):
        where = f"{direction} {pdims} {layout}: {dict(ops)}"
        for op in ("all-gather", "all-reduce", "collective-permute", "reduce-scatter", "copy",
                   "transpose"):
            assert ops[op] == 0, f"unexpected {op} in {where}"
        assert ops["all-to-all"] == n_a2a, where
        assert ops["fft"] == n_fft, where
        assert ops["fusion"] <= max_fusions, where
