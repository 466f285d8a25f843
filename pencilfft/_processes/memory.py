"""Memory before work: refuse a transform (or a load) that cannot fit, before XLA allocates it.

A grid too big for the devices used to end deep inside XLA: on CPUs a failed allocation in one
process left the others waiting in a collective until XLA's "Termination timeout" aborted the
job (SIGABRT) minutes later.  Here the per-device working set is estimated from the plan alone
(shapes, dtypes, mesh: nothing is traced or allocated) and compared with what a device has:

* GPUs and other accelerators: `device.memory_stats()`, bytes_limit - bytes_in_use (the check
  is skipped where a backend reports no memory);
* CPUs: what the host has left, the least of the available RAM (/proc/meminfo), the address
  space under RLIMIT_AS (`ulimit -v`) and a cgroup v2 memory limit (batch systems, containers),
  shared by this process's devices of the mesh.

`PENCILFFT_MEMORY_LIMIT` overrides the detected amount (bytes per device, e.g. `2GiB`) or turns
the check off (`off`).  The estimate (see `transform_estimate`) is what docs/howto/memory.md's
paragraph states: about 4 local blocks per device; XLA's memory analysis gives 3.75-4.9
(benchmarks/RESULTS.md), so the check refuses what clearly cannot fit, not what is close.
Every shape here is a per-device block unless it says global.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import os
import re
import resource
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from . import _agree
from ._chunks import in_place
from ._stages import Move
from ._jax_private import is_traced_argument

__all__ = ["MemoryLimitError", "ENV", "Estimate", "transform_estimate", "available", "gib",
           "fit_chunks", "check_load", "check_grid", "AUTO_CHUNKS"]

ENV = "PENCILFFT_MEMORY_LIMIT"
_OFF = ("0", "off", "no", "false", "none")
_AUTO = ("", "auto")
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_HOW_TO_SET = (f"{ENV}=<bytes per device> (e.g. 8GiB) sets the limit, {ENV}=off turns this "
               "check off")


class MemoryLimitError(MemoryError):
    """A transform or a load needs more memory per device than a device has (an estimate made
    before anything is allocated; the message names the grid, the mesh, both numbers and the
    ways out).

    A `MemoryError`: code that handles running out of memory catches it too.
    `PENCILFFT_MEMORY_LIMIT` sets the limit per device (`8GiB`, `off`).

    Example:
      >>> try:
      ...     k = pencilfft.pfft3d(x, chunks=1)
      ... except pencilfft.MemoryLimitError as e:   # doctest: +SKIP
      ...     print(e)      # names the grid, the mesh, both numbers and the ways out
    """


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


@dataclasses.dataclass(frozen=True)
class Available:
    """Free bytes per device, and where the number comes from (for the message)."""

    per_device: int
    source: str


# ------------------------------------------------------------------------------ estimates


def _block_bytes(elements: int, devices: int, dtype: Any) -> int:
    return -(-elements // devices) * np.dtype(dtype).itemsize


def transform_estimate(plan: Any, forward: bool) -> Estimate:
    """The per-device working set of one transform of `plan` (a `_plan.Plan`).

    Blocks: the real-space one (..., X/Pa, Y/Pb, Z) of `plan.real_dtype` and the k-space one
    (`plan.k_shape`, padded, over the mesh's devices) of `plan.k_dtype`.  Unchunked, every
    exchange holds a send and a receive buffer of k-space size (the data in flight are complex
    spectra), so a mesh of several devices counts 2 buffers and one device 1 (the FFT's output
    before the reordering): 4 blocks for a c2c transform, the docs' figure; the local
    exchange, writing straight from its input, 1 where no move follows (`_one_pass`).

    In `plan.chunks` pieces (`_chunks.py`) the buffers are pieces, 1/chunks of a k-space block:
    2 where every stage writes in place (XLA's analysis: exactly 2 + 2/chunks blocks kept,
    1 + 2/chunks donated), 3 where the first stage cannot (real-to-complex: the real piece, its
    spectrum and its exchanged copy), plus one k-space block where a later stage cannot (its
    new output beside its input).
    """
    devices = plan.mesh.size if plan.mesh is not None else 1  # batch axes split it too
    batch = math.prod(plan.batch)
    real = _block_bytes(batch * math.prod(plan.real_shape), devices, plan.real_dtype)
    k = _block_bytes(batch * math.prod(plan.k_shape), devices, plan.k_dtype)
    inp, out = (real, k) if forward else (k, real)
    if plan.chunks == 1:
        return Estimate(inp, out, k, 2 if devices > 1 and not _one_pass(plan) else 1)
    stages = in_place(plan)
    first, later = (stages[0], stages[1:]) if forward else (stages[2], stages[:2])
    return Estimate(inp, out, -(-k // plan.chunks), 2 if first and all(later) else 3,
                    0 if all(later) else k)


def _one_pass(plan: Any) -> bool:
    """Whether every exchange is the local one (it writes its output straight from its
    input: no send buffer) and no stage moves axes after it (XLA's analysis: 3 blocks for a
    c2c transform, against 4 with a move or XLA's collectives)."""
    return (set(plan.exchanges) == {"local"}
            and not any(isinstance(s, Move) for s in plan.stages))


# ------------------------------------------------------------------------------ the limit


def _parse_size(text: str) -> int:
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*", text, re.IGNORECASE)
    if m is None:
        raise ValueError(
            f"environment variable {ENV} must be a size in bytes per device (e.g. 2000000000, "
            f"512MiB, 8GiB; K, M, G, T are powers of 1024), 'auto' or 'off'; got {text!r}"
        )
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def setting() -> int | str | None:
    """PENCILFFT_MEMORY_LIMIT: None (detect), "off", or bytes per device."""
    text = os.environ.get(ENV, "").strip()
    if text.lower() in _AUTO:
        return None
    if text.lower() in _OFF:
        return "off"
    return _parse_size(text)


def gib(n: float) -> str:
    """Bytes for a message: 3 significant digits in MiB or GiB (whole GiB from 1000 up)."""
    if n >= 1000 * 2**30:
        return f"{n / 2**30:,.0f} GiB"
    return f"{n / 2**30:.3g} GiB" if n >= 2**30 else f"{n / 2**20:.3g} MiB"


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            return f.read()
    except OSError:
        return None


def _kib_field(text: str | None, name: str) -> int | None:
    """A "Name:  123 kB" field of /proc/meminfo or /proc/self/status, in bytes."""
    m = re.search(rf"^{name}:\s+(\d+) kB", text or "", re.MULTILINE)
    return int(m.group(1)) * 1024 if m else None


def _cgroup_free() -> int | None:
    """memory.max - memory.current of this process's cgroup (v2), if it has a limit."""
    own = _read("/proc/self/cgroup") or ""
    m = re.search(r"^0::(\S*)$", own, re.MULTILINE)
    if m is None:
        return None
    base = "/sys/fs/cgroup" + m.group(1).rstrip("/")
    limit, current = _read(base + "/memory.max"), _read(base + "/memory.current")
    if limit is None or current is None or limit.strip() == "max":
        return None
    try:
        return int(limit) - int(current)
    except ValueError:
        return None


def host_free() -> tuple[int, str] | None:
    """(bytes this process can still allocate on the host, what limits it), or None if the
    OS does not say.  The least of: available RAM, the address space left under RLIMIT_AS
    (virtual memory: every mapping counts, not only what is resident), a cgroup limit."""
    found: list[tuple[int, str]] = []
    ram = _kib_field(_read("/proc/meminfo"), "MemAvailable")
    if ram is None:
        try:
            ram = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (AttributeError, ValueError, OSError):
            ram = None
    if ram is not None:
        found.append((ram, f"{gib(ram)} of RAM available"))
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft != resource.RLIM_INFINITY:
        used = _kib_field(_read("/proc/self/status"), "VmSize") or 0
        left = max(soft - used, 0)
        found.append((left, f"{gib(left)} of address space left under RLIMIT_AS "
                            f"(ulimit -v {soft // 1024}), {gib(used)} in use"))
    cgroup = _cgroup_free()
    if cgroup is not None:
        found.append((max(cgroup, 0), f"{gib(max(cgroup, 0))} left under the cgroup's "
                                      "memory limit"))
    return min(found) if found else None


def local_devices(mesh: Any) -> list[jax.Device]:
    """This process's devices of `mesh` (a Mesh, an AbstractMesh or None: one device)."""
    if mesh is None:
        return jax.local_devices()[:1]
    if isinstance(mesh, jax.sharding.Mesh):
        me = jax.process_index()
        return [d for d in mesh.devices.flat if d.process_index == me]
    # An AbstractMesh (a traced array's type) names no devices: this process's share of it.
    return jax.local_devices()[:max(1, min(mesh.size, jax.local_device_count()))]


def available(devices: Sequence[jax.Device], agree: bool = True) -> Available | None:
    """Free bytes per device for `devices` (this process's), None if unknown.

    Accelerators report their allocator's limit and use; CPU devices share the host's memory.
    A detected amount is the least over the job's processes (`_agree`): every process then
    decides the same chunk count and compiles the same program.  `agree=False` for a caller
    that agrees on its outcome itself (the loaders pass every process's error to all): there
    the processes may not all get this far.
    """
    limit = setting()
    if limit == "off":
        return None
    if limit is not None:
        return Available(int(limit), f"{ENV}={os.environ[ENV].strip()}")
    free = _detected(devices)
    if jax.process_count() == 1 or not agree:
        return free
    least = _agree.least(free.per_device if free is not None else _UNKNOWN,
                         "free memory per device")
    if least == _UNKNOWN:
        return None
    source = free.source if free is not None else "another process's devices"
    return Available(least, f"{source}; the least over the {jax.process_count()} processes")


# What a process that cannot tell its free memory says when the processes agree on it: the
# least, so that one process that cannot tell leaves the check off everywhere, as it does there.
_UNKNOWN = -1


def _detected(devices: Sequence[jax.Device]) -> Available | None:
    """This process's own reading (`available` without the setting or the agreement)."""
    if not devices:
        return None
    if devices[0].platform == "cpu":
        free = host_free()
        if free is None:
            return None
        n = len(devices)
        shared = f", shared by this process's {n} devices" if n > 1 else ""
        return Available(free[0] // n, f"CPU: {free[1]}{shared}")
    frees = []
    for d in devices:
        try:
            stats = d.memory_stats()
        except Exception:  # noqa: BLE001 - a backend without memory statistics
            stats = None
        if not stats or not stats.get("bytes_limit"):
            return None
        frees.append((int(stats["bytes_limit"]) - int(stats.get("bytes_in_use", 0)), d))
    free, device = min(frees, key=lambda t: t[0])
    return Available(free, f"{device.platform.upper()} {device.id}: memory_stats() bytes_limit "
                           "- bytes_in_use")


# ------------------------------------------------------------------------------ the checks


def _mesh_text(pdims: Sequence[int]) -> str:
    return "x".join(map(str, pdims))


def _grid_text(shape: Sequence[int], batch: Sequence[int], dtype: Any) -> str:
    lead = f" (batch {_mesh_text(batch)})" if batch else ""
    return f"{_mesh_text(shape)} {np.dtype(dtype).name} grid{lead}"


def _where(pdims: Sequence[int], mesh: Any) -> str:
    return "on one device (no mesh)" if mesh is None else f"on a {_mesh_text(pdims)} mesh"


def _transform_name(plan: Any, forward: bool) -> str:
    named = {("fft",) * 3: ("pfft3d", "pifft3d"), ("fft", "fft", "rfft"): ("prfft3d", "pirfft3d")}
    fwd, inv = named.get(tuple(plan.kinds), ("ptransform3d", "pitransform3d"))
    return fwd if forward else inv


# The counts `chunks="auto"` tries, fewest pieces first: past 64 a piece saves under 2/64 of
# a block more and costs a loop step per piece.
AUTO_CHUNKS = (1, 2, 4, 8, 16, 32, 64)


def fit_chunks(plan: Any, forward: bool, x: Any) -> Any:
    """`plan` with its chunk count decided (the `_fft._run` hook, before XLA allocates):
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
    counts = AUTO_CHUNKS if auto else (plan.chunks,)
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
    name = _transform_name(plan, forward)
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
        f"{name} of a {_grid_text(plan.real_shape, plan.batch, plan.real_dtype)} "
        f"{_where(plan.pdims, plan.mesh)} needs about {gib(need)} more per device{how} "
        f"({', '.join(p for p in parts if p)}"
        f"{'; not counting ' + ' or '.join(kept) if kept else ''}){least}, but a device has "
        f"about {gib(free.per_device)} ({free.source}). Use {'; or '.join(ways)}. {_HOW_TO_SET}."
    )


def check_load(what: str, shape: Sequence[int], dtype: Any, mesh: Any) -> None:
    """Raise MemoryLimitError if `load` cannot hold its blocks of a global array of `shape`.

    Each device receives its block; on CPU devices the block is first read into host memory,
    so it counts twice.
    """
    devices = local_devices(mesh)
    free = available(devices, agree=False)  # the loaders agree on the error (`_io._session`)
    if free is None:
        return
    n = int(np.prod(mesh.devices.shape))
    block = _block_bytes(math.prod(shape), n, dtype)
    copies = 2 if devices and devices[0].platform == "cpu" else 1
    need = copies * block
    if need <= free.per_device:
        return
    how = " (its block, and the host copy it is read into)" if copies == 2 else ""
    raise MemoryLimitError(
        f"loading {what} (global shape {tuple(shape)}, {np.dtype(dtype).name}) on a "
        f"{_mesh_text(mesh.devices.shape)} mesh needs about {gib(need)} per device{how}, but a "
        f"device has about {gib(free.per_device)} ({free.source}). Use a mesh with more "
        f"devices (or more processes, nodes). {_HOW_TO_SET}."
    )


def check_grid(shape: Sequence[int], dtype: Any, devices: Sequence[jax.Device]) -> None:
    """Raise MemoryLimitError if a forward + inverse pair on a global (..., X, Y, Z) grid of
    `dtype` (complex: pfft3d, float: prfft3d) cannot fit on `devices` (autotune's check, made
    before it allocates its input).  Padding is ignored (it depends on the mesh)."""
    me = jax.process_index()
    local = [d for d in devices if d.process_index == me]
    free = available(local)
    if free is None:
        return
    dtype = np.dtype(dtype)
    real = dtype.kind == "f"
    cdtype = np.result_type(dtype, np.complex64)
    *batch, x, y, z = shape
    k_elements = math.prod(batch) * x * y * (z // 2 + 1 if real else z)
    n = len(devices)
    grid = _block_bytes(math.prod(shape), n, dtype)
    k = _block_bytes(k_elements, n, cdtype)
    # input, spectrum, the inverse's output and the two buffers of an exchange
    need = 2 * grid + k + (2 if n > 1 else 1) * k
    if need <= free.per_device:
        return
    name = "prfft3d/pirfft3d" if real else "pfft3d/pifft3d"
    ways = ["more devices"] + ([] if real else ["float32/float64 (the real transforms) if the "
                                                "data are real"])
    raise MemoryLimitError(
        f"autotune: {name} of a {_grid_text(shape[-3:], batch, dtype)} on {n} devices needs "
        f"about {gib(need)} per device (input, spectrum, output and 2 exchange buffers), but "
        f"a device has about {gib(free.per_device)} ({free.source}). Use "
        f"{' or '.join(ways)}. {_HOW_TO_SET}."
    )
