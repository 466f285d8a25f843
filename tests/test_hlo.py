"""The compiled programs have the structure the design promises (a cheap guard, not a timing).

Per transform: no all-gather (every device holds 1/P of the grid at every step); one
all-to-all per exchange (2 for pencils, 1 for slabs), or n-1 collective permutes with the
pairwise exchange; every FFT over the contiguous axis (3 FFT ops for pencils, 2 for slabs: one
of them 2-D; an op is XLA's fft or the FFTW kernel's custom call); and no stand-alone copy or
transpose: each exchange's local reordering is fused into the slicing before the communication
and one pass after it.
"""
from __future__ import annotations

import collections
import re

import jax
import numpy as np
import pytest

import pencilfft
from conftest import MPIRUN, make_mesh, put_global, to_numpy
from pencilfft._transforms import kernel as _kernel
from pencilfft._transforms.plan import plan_forward
from pencilfft._transforms.chunks import stages_of
from pencilfft._transforms.stages import Exchange, Fft, Move

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
        elif f'custom_call_target="{_kernel.TARGET}"' in line:  # the FFTW kernel's FFT
            counts["fft"] += 1
    return counts


def compiled(fn, arg):
    return entry_ops(jax.jit(fn).lower(arg).compile().as_text())


def expected(plan):
    """(FFT ops, all-to-alls, collective permutes, most fusions) of one transform, from its
    stages: one FFT op per Fft stage, and per Exchange stage one all_to_all or n-1 permutes."""
    exchanges = [s for s in stages_of(plan) if isinstance(s, Exchange) and s.n > 1]
    n_fft = sum(isinstance(s, Fft) for s in stages_of(plan))
    n_a2a = sum(s.algorithm == "alltoall" for s in exchanges)
    n_permutes = sum(s.n - 1 for s in exchanges if s.algorithm == "pairwise")
    # slicing fusions (one per peer) + one after each exchange; one per local move (the
    # natural layout's, the slab over Y's; at least one: XLA may fuse the last reordering
    # apart), +1 for r2c's padding.
    moves = sum(isinstance(s, Move) or isinstance(s, Exchange) and s.n == 1 for s in stages_of(plan))
    fusions = sum(s.n for s in exchanges) + len(exchanges) + max(moves, 1) + plan.real
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
    plan = plan_forward(x, norm="backward", layout=layout, mesh=mesh, real=bool(real),
                        exchange=exchange)
    n_fft, n_a2a, n_permutes, max_fusions = expected(plan)
    # The stages themselves: 3 FFTs for pencils, 2 for slabs over X or Y (one of them 2-D);
    # one exchange per mesh axis of size > 1, over b first, and nothing over a size-1 axis.
    pa, pb = plan.pdims
    assert n_fft == (2 if 1 in (pa, pb) else 3)
    assert not any(isinstance(s, Exchange) and s.n == 1 for s in stages_of(plan))
    assert [s.n for s in stages_of(plan) if isinstance(s, Exchange) and s.n > 1] == \
        [n for n in (pb, pa) if n > 1]
    for direction, ops in (("forward", compiled(fwd, x)), ("backward", compiled(bwd, k))):
        where = f"{direction} {pdims} {layout} {exchange}: {dict(ops)}"
        for op in ("all-gather", "all-reduce", "reduce-scatter", "copy", "transpose"):
            assert ops[op] == 0, f"unexpected {op} in {where}"
        assert ops["all-to-all"] == n_a2a, where
        assert ops["collective-permute"] == n_permutes, where
        assert ops["fft"] == n_fft, where
        assert ops["fusion"] <= max_fusions, where


def peak_blocks(fn, arg, donate: bool) -> tuple[float, float]:
    """(arguments + outputs + temporaries - aliased, aliased) of the compiled program, in units
    of the per-device input block."""
    ma = jax.jit(fn, donate_argnums=(0,) if donate else ()).lower(arg).compile().memory_analysis()
    block = ma.argument_size_in_bytes
    total = ma.argument_size_in_bytes + ma.output_size_in_bytes + ma.temp_size_in_bytes
    return (total - ma.alias_size_in_bytes) / block, ma.alias_size_in_bytes / block


@pytest.mark.parametrize("layout", ["transposed", "natural"])
def test_memory_of_compiled_transforms(pdims, layout):
    """A regression guard on the per-device memory of the compiled program, in input blocks:
    input + output + the two buffers of an exchange = 4, plus up to (n-1)/n of a block that
    XLA's buffer packing loses around the per-peer buffers of a CPU all-to-all (measured
    4.0-4.75 here, see benchmarks/RESULTS.md); donating the input
    (`jax.jit(pfft3d, donate_argnums=0)`) puts the output in its place."""
    mesh = make_mesh(pdims)
    x = jax.ShapeDtypeStruct((64, 64, 64), np.complex64,
                             sharding=pencilfft.real_space_sharding(mesh))
    fwd = lambda a: pencilfft.pfft3d(a, layout=layout)  # noqa: E731
    kept, alias = peak_blocks(fwd, x, donate=False)
    assert alias == 0 and kept <= 4.8, (kept, alias)
    donated, alias = peak_blocks(fwd, x, donate=True)
    assert alias == 1.0 and donated <= kept, (donated, kept)


@MPIRUN  # donation of a multi-process array
def test_donated_transform_is_correct_and_consumes_its_input():
    mesh = make_mesh((4, 2))
    data = np.random.default_rng(3).standard_normal((16, 16, 16)).astype(np.complex64)
    x = put_global(data, pencilfft.real_space_sharding(mesh))
    k = jax.jit(pencilfft.pfft3d, donate_argnums=0)(x)
    assert x.is_deleted()
    ref = np.fft.fftn(data.astype(np.complex128)).transpose(1, 2, 0)
    np.testing.assert_allclose(to_numpy(k), ref, rtol=0, atol=1e-4 * np.abs(ref).max())
    back = jax.jit(pencilfft.pifft3d, donate_argnums=0)(k)
    assert k.is_deleted()
    np.testing.assert_allclose(to_numpy(back), data, rtol=0, atol=1e-5)
