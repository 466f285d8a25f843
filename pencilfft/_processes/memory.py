"""Memory before work: how much a device has, and autotune's check of a grid against it.

A grid too big for the devices used to end deep inside XLA: on CPUs a failed allocation in one
process left the others waiting in a collective until XLA's "Termination timeout" aborted the
job (SIGABRT) minutes later.  What a device has:

* GPUs and other accelerators: `device.memory_stats()`, bytes_limit - bytes_in_use (the check
  is skipped where a backend reports no memory);
* CPUs: what the host has left, the least of the available RAM (/proc/meminfo), the address
  space under RLIMIT_AS (`ulimit -v`) and a cgroup v2 memory limit (batch systems, containers),
  shared by this process's devices of the mesh.

`PENCILFFT_MEMORY_LIMIT` overrides the detected amount (bytes per device, e.g. `2GiB`) or turns
the checks off (`off`).  A transform's own estimate and its chunk count are decided from this
by `pencilfft._transforms.budget`, the loaders' by `blocks.Layout.check_memory`; `autotune`'s
grid is checked here (`check_grid`).
Every shape here is a per-device block unless it says global.
"""
from __future__ import annotations

import dataclasses
import math
import os
import re
import resource
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from . import agree as _agree

__all__ = ["MemoryLimitError", "ENV", "HOW_TO_SET", "Available", "available", "block_bytes",
           "check_grid", "gib", "grid_text", "host_free", "local_devices", "mesh_text",
           "setting"]

ENV = "PENCILFFT_MEMORY_LIMIT"
_OFF = ("0", "off", "no", "false", "none")
_AUTO = ("", "auto")
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
HOW_TO_SET = (f"{ENV}=<bytes per device> (e.g. 8GiB) sets the limit, {ENV}=off turns this "
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
class Available:
    """Free bytes per device, and where the number comes from (for the message)."""

    per_device: int
    source: str



def block_bytes(elements: int, devices: int, dtype: Any) -> int:
    """Bytes of one device's share of `elements` (ceil) of `dtype`."""
    return -(-elements // devices) * np.dtype(dtype).itemsize


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
    A detected amount is the least over the job's processes (`agree`): every process then
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


def mesh_text(pdims: Sequence[int]) -> str:
    return "x".join(map(str, pdims))


def grid_text(shape: Sequence[int], batch: Sequence[int], dtype: Any) -> str:
    lead = f" (batch {mesh_text(batch)})" if batch else ""
    return f"{mesh_text(shape)} {np.dtype(dtype).name} grid{lead}"


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
    grid = block_bytes(math.prod(shape), n, dtype)
    k = block_bytes(k_elements, n, cdtype)
    # input, spectrum, the inverse's output and the two buffers of an exchange
    need = 2 * grid + k + (2 if n > 1 else 1) * k
    if need <= free.per_device:
        return
    name = "prfft3d/pirfft3d" if real else "pfft3d/pifft3d"
    ways = ["more devices"] + ([] if real else ["float32/float64 (the real transforms) if the "
                                                "data are real"])
    raise MemoryLimitError(
        f"autotune: {name} of a {grid_text(shape[-3:], batch, dtype)} on {n} devices needs "
        f"about {gib(need)} per device (input, spectrum, output and 2 exchange buffers), but "
        f"a device has about {gib(free.per_device)} ({free.source}). Use "
        f"{' or '.join(ways)}. {HOW_TO_SET}."
    )
