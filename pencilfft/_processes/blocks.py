"""Where the loaders put an array, and which process holds, reads, sends or writes each block.

`scatter`, `gather`, `save` and `load` (`io`) move a global array block by block.  A block is
the part of the global array that one device holds, a `Key` of (start, stop) per global axis;
devices that hold the same part (a replicated mesh axis) hold the same block, which moves once
to each process that needs it and is written to a file once, by one process (`owners`).

What `scatter` and `load` build is a `Layout`, from the argument they are given:

* a `Mesh`: the real-space sharding of a field (..., X, Y, Z) on it
  (`real_space_sharding(mesh, ndim)`), arrays of 3 dimensions or more, as before;
* a `NamedSharding`: that sharding, for an array of any rank: any split of any axis by any
  mesh axes, mesh axes left out (replicated), a mesh over some of the devices only.  jax splits
  an array evenly, so each axis must be divisible by the devices that split it (as for the
  input and the result of `fftn`); a spec that does not divide is a ValueError naming
  `sharding`.

Everything here is static (global shapes, shardings and meshes), but for the free memory the
memory check asks `memory` for; no MPI, no files.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np
from jax.sharding import AbstractMesh, Mesh, NamedSharding, PartitionSpec as P, Sharding

from .._decomposition.rules import check_batch, check_mesh, mesh_axes, split_problem
from .._decomposition.sharding import real_space_sharding
from .memory import HOW_TO_SET, MemoryLimitError, available, gib, local_devices, mesh_text
from .transport import digest

__all__ = ["Key", "Layout", "array_description", "block_key", "block_shape", "block_size",
           "block_slices", "local_shards", "needs", "owners", "resolve", "sorted_index_map"]

Key = tuple[tuple[int, int], ...]  # a block: (start, stop) per global axis


# ---------------------------------------------------------------------------------- layouts


@dataclass(frozen=True)
class Layout:
    """Where `scatter` and `load` put an array: the Mesh or NamedSharding they were given.

    `argname` is the argument the errors name: `mesh` for a Mesh (the messages of before),
    `sharding` for a NamedSharding.
    """

    given: Mesh | NamedSharding
    argname: str

    @property
    def mesh(self) -> Mesh:
        return self.given if isinstance(self.given, Mesh) else self.given.mesh

    def description(self) -> str:
        """What must agree between ranks for the layout to be one layout (a short string)."""
        text = _mesh_description(self.mesh)
        return text if isinstance(self.given, Mesh) else f"{text}, spec {self.given.spec}"

    def sharding(self, shape: tuple[int, ...]) -> NamedSharding:
        """The sharding of the array of global `shape` (checked with `check` first)."""
        if isinstance(self.given, Mesh):
            return real_space_sharding(self.given, len(shape))
        return self.given

    def check(self, shape: tuple[int, ...], what: str) -> None:
        """ValueError naming `what` unless an array of global `shape` splits in this layout."""
        if isinstance(self.given, Mesh):
            _check_real_space(shape, self.given, what)
        else:
            _check_split(shape, self.given, what)

    def check_memory(self, what: str, shape: tuple[int, ...], dtype: Any, *,
                     verb: str = "loading", into: str = "read into") -> None:
        """MemoryLimitError if this process's devices cannot hold their blocks of an array of
        global `shape` (`verb` "scattering", `into` "received into" for `scatter`).

        Each device receives its block; on CPU devices the block is first read (received) into
        host memory, so it counts twice.  Only this process's devices are asked: the loaders
        agree on the outcome themselves (`transport.Session.agree`).
        """
        devices = local_devices(self.mesh)
        free = available(devices, agree=False)
        if free is None:
            return
        sharding = self.sharding(shape)
        block = math.prod(sharding.shard_shape(tuple(shape))) * np.dtype(dtype).itemsize
        copies = 2 if devices and devices[0].platform == "cpu" else 1
        need = copies * block
        if need <= free.per_device:
            return
        how = f" (its block, and the host copy it is {into})" if copies == 2 else ""
        split = "" if isinstance(self.given, Mesh) else f" split {sharding.spec}"
        whole = _replicated_axes(sharding)
        advice = "Use a mesh with more devices (or more processes, nodes)."
        if whole:
            advice = (f"Split the array over every mesh axis (`sharding` {sharding.spec} keeps "
                      f"it whole along mesh axes {whole}: each of their devices holds a copy of "
                      f"its block), or use a mesh with more devices (or more processes, nodes).")
        raise MemoryLimitError(
            f"{verb} {what} (global shape {tuple(shape)}, {np.dtype(dtype).name}){split} on a "
            f"{mesh_text(self.mesh.devices.shape)} mesh needs about {gib(need)} per device"
            f"{how}, but a device has about {gib(free.per_device)} ({free.source}). {advice} "
            f"{HOW_TO_SET}."
        )


def resolve(sharding: Any, mesh: Any) -> Layout:
    """The Layout of the `sharding` argument of `scatter` and `load`, or of `mesh`, its former
    name (still taken as a keyword).  TypeError/ValueError naming the argument."""
    if mesh is not None:
        if sharding is not None:
            raise TypeError(
                f"pass `sharding` or `mesh` (its former name), not both; got `sharding` "
                f"{_type_name(sharding)} and `mesh` {_type_name(mesh)}"
            )
        return Layout(check_mesh(mesh, concrete=True), "mesh")
    if isinstance(sharding, (Mesh, AbstractMesh)):
        return Layout(check_mesh(sharding, concrete=True), "mesh")
    if isinstance(sharding, NamedSharding):
        if not isinstance(sharding.mesh, Mesh):
            raise TypeError(
                f"`sharding` must be a NamedSharding over a jax.sharding.Mesh, whose devices "
                f"hold the blocks; got one over {_type_name(sharding.mesh)} "
                f"{sharding.mesh} (make it with the concrete mesh, e.g. jax.make_mesh)"
            )
        return Layout(sharding, "sharding")
    raise TypeError(
        f"`sharding` must be a jax.sharding.NamedSharding (an array of any rank, split as its "
        f"PartitionSpec says, e.g. NamedSharding(mesh, P('x', 'y')) for a 2-D array) or a "
        f"jax.sharding.Mesh (the real-space sharding of a field (..., X, Y, Z) on it); got "
        f"{_type_name(sharding)}"
    )


def _type_name(v: Any) -> str:
    return "None" if v is None else f"a {type(v).__name__}"


def _check_real_space(shape: tuple[int, ...], mesh: Mesh, what: str) -> None:
    """Real-space arrays (..., X, Y, Z): X divisible by the pencil axis a, Y by b, and each
    leading axis the mesh's batch axes split by its batch axis."""
    if len(shape) < 3:
        raise ValueError(
            f"{what} must have at least 3 dimensions (..., X, Y, Z); got shape {tuple(shape)}: "
            f"a mesh stands for the real-space sharding of a field (..., X, Y, Z); for an array "
            f"of {len(shape)} dimension{'s' if len(shape) != 1 else ''} pass a NamedSharding, "
            f"e.g. NamedSharding(mesh, {_example_spec(len(shape), mesh)})"
        )
    axes, pdims = mesh_axes(mesh)
    problem = split_problem(shape, pdims, axes)
    if problem is not None:
        index, why = problem
        raise ValueError(f"{what} has shape {tuple(shape)}: axis {index} {why}")
    try:
        check_batch(shape, mesh, "data")
    except ValueError as e:
        raise ValueError(f"{what} has shape {tuple(shape)}, which the mesh's batch axes cannot "
                         f"split: {e}") from None


def _example_spec(ndim: int, mesh: Mesh) -> P:
    """A spec for the way out of a too-small rank: mesh axis k over array axis k, the mesh
    axes left over on the last array axis (where fftn puts a numpy array on a mesh)."""
    if ndim == 0:
        return P()
    entries: list[tuple[str, ...]] = [() for _ in range(ndim)]
    for k, name in enumerate(mesh.axis_names):
        entries[min(k, ndim - 1)] += (name,)
    return P(*(None if not e else e[0] if len(e) == 1 else e for e in entries))


def _check_split(shape: tuple[int, ...], sharding: NamedSharding, what: str) -> None:
    """ValueError naming `sharding` unless its spec fits an array of global `shape`: no more
    entries than axes, mesh axes of its mesh each named once, and each split axis divisible
    by the devices splitting it (jax splits arrays evenly)."""
    spec = tuple(sharding.spec)
    sizes = dict(sharding.mesh.shape)
    if len(spec) > len(shape):
        raise ValueError(
            f"`sharding` {sharding.spec} has {len(spec)} entries, but {what} has {len(shape)} "
            f"dimension{'s' if len(shape) != 1 else ''} (shape {tuple(shape)}): give one entry "
            f"per array axis at most (None keeps an axis whole)"
        )
    seen: set[str] = set()
    for axis, entry in enumerate(spec):
        if entry is None:
            continue
        if entry is P.UNCONSTRAINED:
            raise ValueError(
                f"`sharding` {sharding.spec} leaves axis {axis} unconstrained: the loaders place "
                f"every block themselves; name the mesh axes that split it, or None"
            )
        names = (entry,) if isinstance(entry, str) else tuple(entry)
        for name in names:
            if name not in sizes:
                raise ValueError(f"`sharding` {sharding.spec} names {name!r}, which is not an "
                                 f"axis of its mesh {tuple(sizes)}")
            if name in seen:
                raise ValueError(f"`sharding` {sharding.spec} names mesh axis {name!r} twice")
            seen.add(name)
        n = math.prod(sizes[m] for m in names)
        if shape[axis] % n:
            by = (f"mesh axis {names[0]!r}" if len(names) == 1 else f"mesh axes {names}")
            raise ValueError(
                f"{what} has shape {tuple(shape)}: axis {axis} (={shape[axis]}) must be "
                f"divisible by {by} (={n}), which `sharding` {sharding.spec} splits it over: "
                f"jax splits an array evenly (as fftn's input and result); split it by mesh "
                f"axes whose sizes divide it, keep it whole (None), or pad the array"
            )


def _replicated_axes(sharding: NamedSharding) -> tuple[str, ...]:
    """The mesh axes of size > 1 the sharding's spec does not name (each of their devices
    holds a copy)."""
    named = {m for e in sharding.spec if e is not None and e is not P.UNCONSTRAINED
             for m in ((e,) if isinstance(e, str) else e)}
    return tuple(m for m, n in sharding.mesh.shape.items() if n > 1 and m not in named)


def _mesh_description(mesh: Mesh) -> str:
    """What must agree between ranks for a mesh to be one mesh (a short string at any size)."""
    ids = [int(d.id) for d in mesh.devices.flat]
    devices = str(ids) if len(ids) <= 16 else digest(ids)
    types = tuple(str(t).rsplit(".", 1)[-1] for t in getattr(mesh, "axis_types", ()))
    return (
        f"axes {tuple(mesh.axis_names)} of sizes {tuple(mesh.axis_sizes)} ({', '.join(types)}), "
        f"devices {devices}"
    )


def array_description(x: jax.Array) -> str:
    """What must agree between ranks for x to be one global array: shape, dtype, block map."""
    blocks = [(d.id, block_key(i, x.shape)) for d, i in sorted_index_map(x.sharding, x.shape)]
    return f"shape {tuple(x.shape)}, dtype {x.dtype}, blocks by device {digest(blocks)}"


# ----------------------------------------------------------------------------------- blocks


def block_key(index: tuple[slice, ...], shape: tuple[int, ...]) -> Key:
    """A hashable, normalized form of a device's index (slices with None filled in)."""
    return tuple(s.indices(n)[:2] for s, n in zip(index, shape))


def block_slices(block: Key) -> tuple[slice, ...]:
    return tuple(slice(a, b) for a, b in block)


def block_shape(block: Key) -> tuple[int, ...]:
    return tuple(b - a for a, b in block)


def block_size(block: Key) -> int:
    return int(np.prod(block_shape(block), dtype=np.int64))


def sorted_index_map(sharding: Sharding, shape: tuple[int, ...]):
    """(device, index) for all devices, by device id: an order every process agrees on."""
    return sorted(sharding.devices_indices_map(tuple(shape)).items(), key=lambda kv: kv[0].id)


def needs(sharding: Sharding, shape: tuple[int, ...], rank_of_process: dict[int, int],
          size: int) -> dict[int, list[Key]]:
    """Rank -> the distinct blocks its devices hold (none for a rank without a device of the
    sharding), in one order every rank computes alike."""
    out: dict[int, list[Key]] = {r: [] for r in range(size)}
    for device, index in sorted_index_map(sharding, shape):
        r, block = rank_of_process[device.process_index], block_key(index, shape)
        if block not in out[r]:
            out[r].append(block)
    return out


def owners(sharding: Sharding, shape: tuple[int, ...], rank_of_process: dict[int, int], *,
           prefer: int) -> dict[Key, int]:
    """Each distinct block -> the one rank that sends or writes it: `prefer` if one of its
    devices holds the block, else the lowest rank that does.

    Identical on every rank, in the same order (by the lowest device id holding the block).
    """
    holders: dict[Key, list[int]] = {}
    for device, index in sorted_index_map(sharding, shape):
        rank = rank_of_process[device.process_index]
        holders.setdefault(block_key(index, shape), []).append(rank)
    return {k: prefer if prefer in ranks else min(ranks) for k, ranks in holders.items()}


def local_shards(x: jax.Array) -> dict[Key, Any]:
    """This process's shards of x by block (one per distinct block)."""
    out: dict[Key, Any] = {}
    for shard in x.addressable_shards:
        out.setdefault(block_key(shard.index, x.shape), shard)
    return out
