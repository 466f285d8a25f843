"""What the custom-call exchanges share: the mesh they are traced in, where a device sits in it,
which processes hold a group's devices, and the linear rules of their primitives.

The exchanges of ours (`local`, `mpi`, `mixed`) are primitives bound inside a per-device body
(shard_map's, or the one XLA's partitioner asks for).  Their peers are decided when that body is
traced, from the mesh pencilfft traces it on (`in_mesh`): every process traces the same body on
the same mesh, so every process makes the same decisions and compiles the same program.
"""
from __future__ import annotations

import contextlib
import contextvars
import os

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend.core import Primitive
from jax.interpreters import ad

from .._jax_private import concrete_mesh

__all__ = ["check_number_setting", "concrete", "coordinates", "def_linear", "in_mesh",
           "process_groups", "traced_mesh", "within_processes"]


def check_number_setting(name: str, *, whole: bool, meaning: str) -> None:
    """Refuses an environment variable the exchanges' C++ reads (when their library loads) that
    is set but not a number >= 0 (`whole`: a whole one): the C++ would take its default in
    silence.  `meaning`: what the number is, for the message."""
    text = os.environ.get(name, "").strip()
    if not text:
        return
    try:
        value = int(text) if whole else float(text)
    except ValueError:
        value = -1
    if not value >= 0:
        raise ValueError(f"environment variable {name} must be {meaning} "
                         f"({'a whole number' if whole else 'a number'} >= 0); got {text!r}")


# The mesh of the per-device body being traced (`in_mesh`).
_mesh: contextvars.ContextVar = contextvars.ContextVar("pencilfft_exchange_mesh", default=None)


def traced_mesh():
    """The mesh of the per-device body being traced (`in_mesh`; concrete or abstract)."""
    mesh = _mesh.get()
    if mesh is None:
        raise ValueError("internal: an exchange of ours was traced outside `_exchange.in_mesh`")
    return mesh


@contextlib.contextmanager
def in_mesh(mesh):
    """While the per-device body on `mesh` is traced: the exchanges read their peers from it."""
    token = _mesh.set(mesh)
    try:
        yield
    finally:
        _mesh.reset(token)


def coordinates(mesh, axes: str | tuple[str, ...]) -> jax.Array:
    """This device's coordinate along mesh axis `axes` (along a tuple of them: its row-major
    index over them, in the mesh's order) and the index of its group (the devices with the same
    coordinates on the other mesh axes, in their flat order): the handlers check that their
    tables put this device there (a wrong guess of the devices fails, never mixes)."""
    axes = (axes,) if isinstance(axes, str) else tuple(axes)
    sizes = tuple(zip(mesh.axis_names, mesh.axis_sizes))
    group = 0
    for name, size in sizes:
        if name not in axes:
            group = group * size + jax.lax.axis_index(name)
    pos = None  # (after the group's: the order every exchange's program has always had)
    for name, size in sizes:
        if name in axes:
            index = jax.lax.axis_index(name)
            pos = index if pos is None else pos * size + index
    return jnp.stack([jnp.asarray(pos, jnp.int32), jnp.asarray(group, jnp.int32)])


def concrete(mesh):
    """The devices of the mesh being traced.  Known where pencilfft traced the body on a
    concrete mesh; for an abstract one (an Explicit-typed array under jit) the mesh set with
    `jax.set_mesh`, else the devices in `jax.make_mesh`'s order on CPUs (jax.devices()): the
    handlers refuse at run time a table that does not match."""
    if isinstance(mesh, jax.sharding.Mesh):
        return mesh
    current = concrete_mesh()
    if (isinstance(current, jax.sharding.Mesh) and current.axis_names == mesh.axis_names
            and current.axis_sizes == mesh.axis_sizes):
        return current
    devices = jax.devices()
    if len(devices) != mesh.size:
        raise ValueError(f"pencilfft's exchange cannot tell the devices of this mesh "
                         f"({mesh.size} of {len(devices)}): pass `mesh=` or call the transform "
                         f"under `jax.set_mesh(mesh)`")
    return jax.sharding.Mesh(np.asarray(devices, object).reshape(mesh.axis_sizes),
                             mesh.axis_names, axis_types=mesh.axis_types)


def process_groups(mesh, axis_name: str) -> tuple[tuple[int, ...], ...]:
    """The process (= MPI rank) of every device of every group that exchanges along
    `axis_name`, a row per group (in their flat order), in order of the devices' coordinate
    along the axis (the chunk index jax's axis_index gives): hashable, a primitive parameter."""
    mesh = concrete(mesh)
    devices = mesh.devices
    axis = mesh.axis_names.index(axis_name)
    along = np.moveaxis(devices, axis, -1).reshape(-1, devices.shape[axis])
    return tuple(tuple(int(d.process_index) for d in row) for row in along)


def within_processes(mesh, axis_name: str) -> bool:
    """Whether every group along `axis_name` has all its devices in one process (then the
    devices exchange through shared memory, `local`)."""
    return all(len(set(row)) == 1 for row in process_groups(mesh, axis_name))


def def_linear(prim: Primitive, transpose) -> None:
    """jvp and transpose of a linear primitive of (block, coordinates): the tangent goes through
    the same map, the cotangent through `transpose(ct, where, **params)`."""
    def jvp(primals, tangents, **params):
        (y, where), (dy, _) = primals, tangents
        out = prim.bind(y, where, **params)
        if type(dy) is ad.Zero:
            return out, ad.Zero.from_primal_value(out)
        return out, prim.bind(dy, where, **params)

    def transpose_rule(ct, y, where, **params):
        if type(ct) is ad.Zero:
            return ad.Zero(y.aval), None
        return transpose(ct, where, **params), None

    ad.primitive_jvps[prim] = jvp
    ad.primitive_transposes[prim] = transpose_rule
