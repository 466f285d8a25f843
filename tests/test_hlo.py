"""The compiled programs have the structure the design promises (a cheap guard, not a timing).

Per transform: no all-gather (every device holds 1/P of the grid at every step); one
all-to-all per exchange (2 for pencils, 1 for slabs), or n-1 collective permutes with the
pairwise exchange; every FFT over the contiguous axis (3 FFT ops for pencils, 2 for slabs: one
of them 2-D); and no stand-alone copy or transpose: each exchange's local reordering is fused
into the slicing before the communication and one pass after it.
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


def expected(pdims, real, exchange):
    """(FFT ops, all-to-alls, collective permutes, most fusions) of one transform."""
    sizes = [n for n in (pdims[0], pdims[1] if len(pdims) == 2 else 1) if n > 1]
    n_fft = 2 if len(pdims) == 1 or pdims[1] == 1 else 3
    n_a2a = len(sizes) if exchange == "alltoall" else 0
    n_permutes = sum(n - 1 for n in sizes) if exchange == "pairwise" else 0
    # slicing fusions (one per peer) + one after each exchange; +1 for a pure local
    # transpose (slab over Y), +1 for the natural layout's final move, +1 for r2c's padding.
    fusions = sum(sizes) + len(sizes) + (pdims[0] == 1) + 1 + real
    return n_fft, n_a2a, n_permutes, fusions


CASES = [(layout, real, "alltoall") for layout in ("transposed", "natural") for real in (0, 1)]
CASES += [("transposed", 0, "pairwise"), ("natural", 1, "pairwise")]


@pytest.mark.parametrize("layout,real,exchange", CASES,
                         ids=[f"{lay}-{'r2c' if r else 'c2c'}-{e}" for lay, r, e in CASES])
def test_structure_of_compiled_transforms(pdims, layout, real, exchange):
    mesh = make_mesh(pdims)
    shape = (32, 32, 32)
    x = jax.ShapeDtypeStruct(shape, np.float32 if real else np.complex64,
                             sharding=pencilfft.real_space_sharding(mesh))
    opts = dict(layout=layout, exchange=exchange)
    if real:
        fwd = lambda a: pencilfft.prfft3d(a, **opts)  # noqa: E731
        bwd = lambda k: pencilfft.pirfft3d(k, shape, **opts)  # noqa: E731
    else:
        fwd = lambda a: pencilfft.pfft3d(a, **opts)  # noqa: E731
        bwd = lambda k: pencilfft.pifft3d(k, **opts)  # noqa: E731
    k = jax.eval_shape(fwd, x)
    k = jax.ShapeDtypeStruct(k.shape, k.dtype, sharding=pencilfft.k_space_sharding(mesh, layout))
    n_fft, n_a2a, n_permutes, max_fusions = expected(pdims, real, exchange)
    for direction, ops in (("forward", compiled(fwd, x)), ("backward", compiled(bwd, k))):
        where = f"{direction} {pdims} {layout} {exchange}: {dict(ops)}"
        for op in ("all-gather", "all-reduce", "reduce-scatter", "copy", "transpose"):
            assert ops[op] == 0, f"unexpected {op} in {where}"
        assert ops["all-to-all"] == n_a2a, where
        assert ops["collective-permute"] == n_permutes, where
        assert ops["fft"] == n_fft, where
        assert ops["fusion"] <= max_fusions, where
