"""The compiled programs have the structure the design promises (a cheap guard, not a timing),
and every XLA fft op has the layout XLA:CPU's FFT thunk demands.

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
import jax.numpy as jnp
import numpy as np
import pytest

import pencilfft
from conftest import MPIRUN, make_mesh, put_global, to_numpy
from hlo_text import assert_ffts_dim0_major, fft_layout_problems, replica_groups
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


# Every mesh class but the one-axis (8,), which is planned as (8, 1) (tests/conftest.py).
@pytest.mark.parametrize("pdims", [(1, 8), (8, 1), (4, 2), (2, 4)],
                         ids=lambda p: "x".join(map(str, p)))
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


# ----------------------------------------------------------------------------------------------
# Every XLA fft reads and writes the default layout (what XLA:CPU's FFT thunk demands)


@pytest.mark.parametrize("mesh_shape", [(8,), (4, 2), (2, 4), (1, 8), None],
                         ids=["8", "4x2", "2x4", "1x8", "one-device"])
def test_every_xla_fft_is_dim0_major(mesh_shape, monkeypatch):
    """With XLA's FFTs (PENCILFFT_FFT_KERNEL=xla, as without the fftw extra), one program of
    every kind of transform (both layouts, r2c, chunks, a DCT, forward and inverse) beside
    `jnp.fft.fftn` of the same field: every fft op's operand and result are dim0-major, which
    XLA:CPU's FFT thunk checks at run time (jax 0.11.2 aborted `pencilfft check` there)."""
    monkeypatch.setenv("PENCILFFT_FFT_KERNEL", "xla")
    shape = (16, 16, 16)
    sharding = (pencilfft.real_space_sharding(make_mesh(mesh_shape)) if mesh_shape else None)
    x = jax.ShapeDtypeStruct(shape, np.complex64, sharding=sharding)

    def program(a):
        k1 = pencilfft.pfft3d(a)
        k2 = pencilfft.pfft3d(a, layout="natural", chunks=2)
        r = pencilfft.prfft3d(a.real)
        c = pencilfft.ptransform3d(a.real, kinds=("dct2", "fft", "fft"))
        return (pencilfft.pifft3d(k1), pencilfft.pifft3d(k2, layout="natural", chunks=2),
                pencilfft.pirfft3d(r, shape), pencilfft.pitransform3d(c, kinds=("dct2", "fft", "fft")),
                jnp.fft.fftn(a))

    text = jax.jit(program).lower(x).compile().as_text()
    # at least one fft op per transform and direction, and jnp.fft's: the reader found them
    assert assert_ffts_dim0_major(text) >= 9


def test_a_layout_demand_after_an_fft_stays_off_it():
    """What jax 0.11's layout assignment did to our programs, made on purpose: a user of the
    FFT's result asks for another layout.  On jnp.fft's FFT the demand lands on the fft op (the
    reader flags it: XLA:CPU would refuse it at run time); on ours (`xla_fft`, every local FFT
    that is not FFTW's) it lands after the FFT, as a copy, and the program runs."""
    from jax.experimental.layout import Layout, with_layout_constraint

    from pencilfft._transforms import xla_fft

    data = np.random.default_rng(0).standard_normal((8, 16)).astype(np.complex64)
    column_major = Layout((1, 0))
    theirs = jax.jit(lambda v: with_layout_constraint(jnp.fft.fft(v), column_major))
    assert fft_layout_problems(theirs.lower(data).compile().as_text())
    ours = jax.jit(lambda v: with_layout_constraint(xla_fft.fftn(v, "fft", (-1,)), column_major))
    compiled_ours = ours.lower(data).compile()
    assert fft_layout_problems(compiled_ours.as_text()) == []
    np.testing.assert_allclose(np.asarray(compiled_ours(data)), np.fft.fft(data), atol=1e-5)


def test_the_fft_layout_reader():
    """Both print styles, a bad operand and a bad result (hand-written HLO)."""
    good = """
ENTRY %main (p: c64[4,8]) -> c64[4,8] {
  %p = c64[4,8]{1,0} parameter(0)
  ROOT %fft.1 = c64[4,8]{1,0} fft(%p), fft_type=FFT, fft_length={8}
}"""
    bad = """
%body (q: c64[2,4,8]) -> c64[2,4,8] {
  %q = c64[2,4,8]{1,2,0} parameter(0)
  ROOT %fft.2 = c64[2,4,8]{2,1,0} fft(c64[2,4,8]{1,2,0} %q), fft_type=FFT, fft_length={8}
}
ENTRY %main (p: c64[2,4,8]) -> c64[2,4,8] {
  %p = c64[2,4,8]{2,1,0} parameter(0)
  %t = c64[2,4,8]{0,2,1} transpose(%p), dimensions={0,1,2}
  ROOT %fft.3 = c64[2,4,8]{0,2,1} fft(%t), fft_type=FFT, fft_length={8}
}"""
    assert fft_layout_problems(good) == []
    problems = fft_layout_problems(bad)
    assert len(problems) == 3, problems
    assert "fft %fft.2: operand %q c64[2,4,8]{1,2,0} is not dim0-major" in problems[0]


@pytest.mark.parametrize("text, groups", [
    ("{{0,1},{2,3}}", [[0, 1], [2, 3]]),
    ("[2,2]<=[2,2]T(1,0)", [[0, 2], [1, 3]]),
    ("[2,4]<=[8]", [[0, 1, 2, 3], [4, 5, 6, 7]]),
    ("mesh['x'=2,'y'=2] {'x'}", [[0, 2], [1, 3]]),
    ("mesh['c'=2,'x'=2,'y'=2] {'y'}", [[0, 1], [2, 3], [4, 5], [6, 7]]),
    ("mesh['c'=2,'x'=2,'y'=2] {'x'}", [[0, 2], [1, 3], [4, 6], [5, 7]]),
    ("mesh['a'=8] {'a':(1)2}", [[0, 4], [1, 5], [2, 6], [3, 7]]),
    ("mesh['x'=2,'y'=2], device_ids=(0,2,1,3) {'x'}", [[0, 1], [2, 3]]),
])
def test_the_replica_group_reader(text, groups):
    """Every format XLA prints replica groups in: explicit (jax 0.10), iota, and the mesh form
    of jax 0.11's shard_map (expectations from XLA's own replica_group tests)."""
    line = f"%a = c64[8] all-to-all(%p), replica_groups={text}, dimensions={{0}}"
    assert replica_groups(line) == groups
    assert replica_groups("%p = f32[2] parameter(0)") is None


# ----------------------------------------------------------------------------------------------
# pfft3d & co. lower to the programs they lowered to before the N-D planner (issue 54)


def test_pfft3d_programs_are_unchanged():
    """The StableHLO of pfft3d/pifft3d/prfft3d/pirfft3d/ptransform3d/pitransform3d, for CPU and
    for CUDA, on one device, slabs, pencils both ways, a padded grid and a batch mesh, in both
    layouts: identical to the texts recorded from the code before the N-D planner, lowered on
    this jax (tests/stablehlo_programs.py wrote them, one file per tested jax release)."""
    import difflib

    import stablehlo_programs

    recorded = stablehlo_programs.recorded()
    if jax.__version__ not in recorded:
        pytest.skip(f"no reference programs lowered on jax {jax.__version__} (recorded on "
                    f"{', '.join(recorded)}): `python tests/stablehlo_programs.py` records them "
                    f"(docs/development.md, \"A new jax release\")")
    if _kernel.kernel() != "fftw":
        pytest.skip("the CPU programs call the FFTW kernel: pip install -e \".[mpi,fftw,test]\" "
                    "(the README's test command) runs this test")
    reference = stablehlo_programs.load(jax.__version__)
    texts = stablehlo_programs.programs()
    assert sorted(texts) == sorted(reference)
    changed = [name for name in texts if texts[name] != reference[name]]
    if changed:
        name = changed[0]
        diff = "\n".join(list(difflib.unified_diff(reference[name].splitlines(),
                                                   texts[name].splitlines(), lineterm=""))[:60])
        raise AssertionError(f"{len(changed)} programs changed: {changed}; the first:\n{diff}")
