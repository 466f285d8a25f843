"""A transform's memory, planned before XLA allocates it: its per-device estimate and the
chunk count that fits (`fit_chunks`, the `fft` runner's hook).

The per-device working set is estimated from the plan alone (shapes, dtypes, mesh: nothing is
traced or allocated) and compared with what a device has (`_processes.memory.available`, the
least over the job's processes).  The estimate (see `transform_estimate`) is what
docs/howto/memory.md's paragraph states: about 4 local blocks per device; XLA's memory analysis
gives 3.75-4.9 (benchmarks/RESULTS.md), so the check refuses what clearly cannot fit, not what
is close.  Every shape here is a per-device block unless it says global.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence
from typing import Any

import jax

from .._jax_private import is_traced_argument
from .._processes.memory import (HOW_TO_SET, MemoryLimitError, available, block_bytes, gib,
                                 grid_text, local_devices, mesh_text, setting)
from . import kernel as _kernel
from .chunks import in_place, stages_of
from .stages import Move

__all__ = ["Estimate", "transform_estimate", "transform_name", "fit_chunks", "AUTO_CHUNKS",
           "check_route"]


@dataclasses.dataclass(frozen=True)
class Estimate:
    """Per-device bytes of one transform: its input and output blocks and the buffers alive
    while it runs (the send and receive buffers of an exchange, or the FFT's work buffer on
    one device)."""

    in_bytes: int
    out_bytes: int
    buffer_bytes: int
    buffers: int
    between_bytes: int = 0  # a block between two chunked stages (one that is not in place)

    @property
    def total(self) -> int:
        """The working set: input + output + buffers (what `benchmarks.memory` measures)."""
        return self.in_bytes + self.out_bytes + self.buffers * self.buffer_bytes + self.between_bytes

    def new_bytes(self, *, resident: bool, donated: bool) -> int:
        """What the transform adds to memory: not the input when it is already there, nor the
        output when it takes the donated input's place."""
        new = self.total - (self.in_bytes if resident else 0)
        return new - (self.out_bytes if donated else 0)


def transform_estimate(plan: Any, forward: bool) -> Estimate:
    """The per-device working set of one transform of `plan` (a `plan.Plan`).

    Blocks: the real-space one (..., X/Pa, Y/Pb, Z) of `plan.real_dtype` and the k-space one
    (`plan.k_shape`, padded, over the mesh's devices) of `plan.k_dtype`.  Unchunked, every
    exchange holds a send and a receive buffer of k-space size (the data in flight are complex
    spectra), so a mesh of several devices counts 2 buffers and one device 1 (the FFT's output
    before the reordering): 4 blocks for a c2c transform, the docs' figure; the local
    exchange, writing straight from its input, 1 where no move follows (`_one_pass`).

    In `plan.chunks` pieces (`chunks.py`) the buffers are pieces, 1/chunks of a k-space block:
    2 where every stage writes in place (XLA's analysis: exactly 2 + 2/chunks blocks kept,
    1 + 2/chunks donated), 3 where the first stage cannot (real-to-complex: the real piece, its
    spectrum and its exchanged copy), plus one k-space block where a later stage cannot (its
    new output beside its input); pipelined (`plan.pipeline`), one piece more where the FFTW
    kernel reads and writes the pieces in the block (`pipeline._Windows`), else 4.
    """
    devices = plan.mesh.size if plan.mesh is not None else 1  # batch axes split it too
    batch = math.prod(plan.batch)
    real = block_bytes(batch * math.prod(plan.real_shape), devices, plan.real_dtype)
    k = block_bytes(batch * math.prod(plan.k_shape), devices, plan.k_dtype)
    inp, out = (real, k) if forward else (k, real)
    if plan.chunks == 1:
        return Estimate(inp, out, k, 2 if devices > 1 and not _one_pass(plan) else 1)
    stages = in_place(plan)
    first, later = (stages[0], stages[1:]) if forward else (stages[2], stages[:2])
    # Pipelined, the third slot (XLA's analysis: +1.00-1.03 pieces) where the stages write in
    # place and the FFTW kernel works in the block; else up to 4 pieces more (XLA's analysis:
    # 2-4): the FFTs either side of the exchange each write a piece of their own.
    extra = 0
    if plan.pipeline:
        extra = 1 if all(later) and _kernel.windows_usable(plan.k_dtype) else 4
    return Estimate(inp, out, -(-k // plan.chunks), (2 if first and all(later) else 3) + extra,
                    0 if all(later) else k)


def _one_pass(plan: Any) -> bool:
    """Whether every exchange is the local one (it writes its output straight from its
    input: no send buffer) and no stage moves axes after it (XLA's analysis: 3 blocks for a
    c2c transform, against 4 with a move or XLA's collectives)."""
    return (set(plan.exchanges) == {"local"}
            and not any(isinstance(s, Move) for s in stages_of(plan)))


def _where(pdims: Sequence[int], mesh: Any) -> str:
    return "on one device (no mesh)" if mesh is None else f"on a {mesh_text(pdims)} mesh"


def transform_name(plan: Any, forward: bool) -> str:
    """The public function a plan is run by in that direction (for messages)."""
    named = {("fft",) * 3: ("pfft3d", "pifft3d"), ("fft", "fft", "rfft"): ("prfft3d", "pirfft3d")}
    fwd, inv = named.get(tuple(plan.kinds), ("ptransform3d", "pitransform3d"))
    return fwd if forward else inv


# The counts `chunks="auto"` tries, fewest pieces first: past 64 a piece saves under 2/64 of
# a block more and costs a loop step per piece.
AUTO_CHUNKS = (1, 2, 4, 8, 16, 32, 64)


def fit_chunks(plan: Any, forward: bool, x: Any) -> Any:
    """`plan` with its chunk count decided (the `fft._run` hook, before XLA allocates):
    chunks="auto" takes the fewest pieces (`AUTO_CHUNKS`) whose working set fits the devices
    (under jit: fits even if the input is not donated, else fits if it is), 1 where nothing is
    known; MemoryLimitError when the count asked (or, for "auto", every count) cannot fit
    either way, saying what chunking would need.

    Cached per (plan, direction, kind of input, setting).  Under jax.jit with no mesh known
    (the compiler-partitioned path) the devices are not known yet: nothing to check, and
    "auto" is 1.
    """
    traced = isinstance(x, jax.core.Tracer)
    if plan.mesh is None and traced:
        return plan
    limit = setting()
    if limit == "off":
        return plan
    chunks = _fit(plan, forward, traced, _resident(x, traced), limit)
    return dataclasses.replace(plan, chunks=chunks) if chunks != plan.chunks else plan


def _resident(x: Any, traced: bool) -> bool:
    """Whether x's block is in memory before the transform runs, so that the free memory read
    from the devices already leaves it out and the transform adds only what it makes.

    A concrete jax.Array is; a numpy array is not (it is copied onto the devices).  Under jit a
    Tracer is a jax.Array too, but only an argument of the traced function is resident: a
    field the same program makes (`jax.jit(lambda: pfft3d(jnp.zeros(...)))`) is allocated by
    the program and counts like the output.  Counting every traced input would count a resident
    argument twice and refuse `jax.jit(pfft3d)(x)` that fits; counting none let a grid that
    cannot fit compile and abort in a collective (issue 38).
    """
    if traced:
        return is_traced_argument(x)
    return isinstance(x, jax.Array)


def _need(plan: Any, forward: bool, traced: bool, resident: bool,
          hope_donated: bool = True) -> tuple[int, Estimate, bool]:
    est = transform_estimate(plan, forward)
    # Under jit the caller may donate the input (invisible here): with `hope_donated`, assume
    # the output takes its place where it can (a c2c transform whose blocks have the same size).
    donated = hope_donated and traced and not plan.real and est.in_bytes == est.out_bytes
    return est.new_bytes(resident=resident, donated=donated), est, donated


@functools.lru_cache(maxsize=256)
def _fit(plan: Any, forward: bool, traced: bool, resident: bool, limit: Any) -> int:
    free = available(local_devices(plan.mesh))
    auto = plan.chunks_asked == "auto"
    # (pipelined, "auto" starts at the plan's count, `plan.pipeline_pieces`, which may pass
    # the last of AUTO_CHUNKS)
    if auto:
        counts = tuple(c for c in AUTO_CHUNKS if c >= plan.chunks) or (plan.chunks,)
    else:
        counts = (plan.chunks,)
    if free is None:
        return counts[0]
    plans = {c: dataclasses.replace(plan, chunks=c) for c in dict.fromkeys(counts + AUTO_CHUNKS)}
    needs = {c: _need(p, forward, traced, resident)[0] for c, p in plans.items()}
    if auto and traced:
        # "auto" picks a count that fits whether or not the caller donates under jit: the
        # hopeful reading (the output in the input's place) would run chunks=1 undonated into
        # XLA's allocator, and XLA on CPUs does not always reuse a donated block (8x1
        # transposed: 3.88 blocks donated against 3 hoped for; benchmarks/RESULTS.md).  Only
        # where no count fits undonated does the hopeful reading choose.
        sure = [c for c in counts if _need(plans[c], forward, traced, resident,
                                           hope_donated=False)[0] <= free.per_device]
        if sure:
            return sure[0]
    fit = [c for c in counts if needs[c] <= free.per_device]
    if fit:
        return fit[0]
    first = plans[counts[0]]
    need, est, donated = _need(first, forward, traced, resident)
    name = transform_name(plan, forward)
    pieces = (f"{est.buffers} {'exchange buffers' if est.buffers > 1 else 'work buffer'}"
              if first.chunks == 1 else f"{est.buffers} pieces in flight")
    parts = [f"output {gib(est.out_bytes)}" if not donated else "",
             f"{pieces} of {gib(est.buffer_bytes)}",
             f"a block between stages of {gib(est.between_bytes)}" if est.between_bytes else ""]
    if not resident:
        parts.insert(0, f"input {gib(est.in_bytes)}")
    kept = []
    if resident:
        kept.append(f"the {gib(est.in_bytes)} input block already in memory")
    if donated:
        kept.append("the output taking the input's place if it is donated" if resident else
                    "the output taking the place of the input this program makes")
    ways = []
    most = AUTO_CHUNKS[-1]
    fitting = [c for c in AUTO_CHUNKS if c > first.chunks and needs[c] <= free.per_device]
    if fitting:
        ways.append(f"`chunks`={fitting[0]} (each stage in {fitting[0]} pieces: about "
                    f"{gib(needs[fitting[0]])}) or `chunks`='auto'")
    if tuple(plan.kinds) == ("fft",) * 3:
        ways.append("the real-to-complex transforms if the data are real (prfft3d/pirfft3d: "
                    "half the memory)")
    ways.append("a mesh with more devices (each holds 1/P of the grid)")
    if not plan.real and not traced:
        ways.append(f"donating the input (jax.jit({name}, donate_argnums=0): the output takes "
                    "its place)")
    how = (f" in {first.chunks} pieces per stage (`chunks`={first.chunks})"
           if first.chunks > 1 else "")
    least = ""
    if auto or not fitting:
        least = (f"; in {most} pieces per stage (`chunks`={most}, the least chunking can "
                 f"reach) it would still need about {gib(needs[most])}")
    raise MemoryLimitError(
        f"{name} of a {grid_text(plan.real_shape, plan.batch, plan.real_dtype)} "
        f"{_where(plan.pdims, plan.mesh)} needs about {gib(need)} more per device{how} "
        f"({', '.join(p for p in parts if p)}"
        f"{'; not counting ' + ' or '.join(kept) if kept else ''}){least}, but a device has "
        f"about {gib(free.per_device)} ({free.source}). Use {'; or '.join(ways)}. {HOW_TO_SET}."
    )



def check_route(name: str, shape: Sequence[int], dtype: Any, mesh: Any, in_bytes: int,
                out_bytes: int, largest: int, resident: bool, chunks: int | str = 1,
                cut: bool = True, in_place: bool = True) -> int:
    """The chunk count a transform of jnp.fft's names runs with (`chunks`, "auto": the fewest
    of `AUTO_CHUNKS` that fit, 1 where nothing is known), after checking that it fits:
    MemoryLimitError, before XLA allocates, where it cannot.  Counted: its input block (unless
    already in memory), its output block and the two buffers of an exchange of the largest
    array on its route (global bytes here, per device below); in pieces, the buffers are pieces
    (where every step that exchanges can be cut, `cut`) and a step whose pieces change shape
    (`in_place` False) writes them into a new block beside its input."""
    auto = chunks == "auto"
    counts = AUTO_CHUNKS if auto else (chunks,)
    limit = setting()
    if limit == "off":
        return counts[0]
    devices = mesh.size if mesh is not None else 1

    def estimate(c: int) -> Estimate:
        pieces = c if cut else 1
        return Estimate(-(-in_bytes // devices), -(-out_bytes // devices),
                        -(-largest // (devices * pieces)), 2 if devices > 1 else 1,
                        0 if c == 1 or in_place else -(-largest // devices))

    free = available(local_devices(mesh))
    if free is None:
        return counts[0]
    needs = {c: estimate(c).new_bytes(resident=resident, donated=False)
             for c in dict.fromkeys(counts + AUTO_CHUNKS)}
    fit = [c for c in counts if needs[c] <= free.per_device]
    if fit:
        return fit[0]
    first = counts[0]
    est, need = estimate(first), needs[first]
    fitting = [c for c in AUTO_CHUNKS if c > first and needs[c] <= free.per_device]
    pieces = (f", in {first} pieces per step (`chunks`={first}, buffers of "
              f"{gib(est.buffer_bytes)})" if first > 1 else "")
    hint = (f"`chunks`={fitting[0]} (about {gib(needs[fitting[0]])}) or `chunks`='auto'; "
            if fitting and not auto else "")
    raise MemoryLimitError(
        f"{name} of a {grid_text(shape, (), dtype)} on {devices} device(s) needs about "
        f"{gib(need)} more per device (output {gib(est.out_bytes)}, {est.buffers} exchange "
        f"buffers of {gib(est.buffer_bytes)}"
        f"{'' if resident else f', input {gib(est.in_bytes)}'}{pieces}), but a device has about "
        f"{gib(free.per_device)} ({free.source}). Use {hint}a mesh with more devices, or the "
        f"real-to-complex transforms if the data are real. {HOW_TO_SET}."
    )
