"""Which mesh an array runs on, found from the array and the call (nothing is traced here).

In order: the `mesh=` argument, the array's NamedSharding, its traced type (Explicit axes under
jit), the ambient mesh (`jax.set_mesh`), the mesh of an enclosing `with mesh:` block.  An
array traced under jit over an Auto mesh names its mesh in its type but not its split: that
mesh is the partitioner's (`typed_mesh`), and the transforms leave it to XLA
(`pencilfft._transforms.partitioned`).  Every transform, halo exchange and painter asks here.
"""
from __future__ import annotations

from typing import Any

import jax
import numpy as np
from jax.sharding import AxisType, NamedSharding

from .._jax_private import legacy_mesh
from .rules import batch_axes, check_batch, check_mesh

__all__ = ["batch_mesh", "current_spec", "find_mesh", "has_explicit_axes", "is_tracer",
           "typed_mesh"]


def is_tracer(x) -> bool:
    """Whether x is a value jax is tracing (under jit, grad, vmap, shard_map), not a concrete
    array whose sharding can be read."""
    return isinstance(x, jax.core.Tracer)


def has_explicit_axes(mesh) -> bool:
    """Whether any axis of `mesh` is Explicit (sharding in types: jax.make_mesh's default)."""
    return any(t == AxisType.Explicit for t in mesh.axis_types)


def find_mesh(x, mesh):
    """The mesh to run on, in order: `mesh`, x's NamedSharding, x's type (Explicit axes under
    jit), the ambient mesh (`jax.set_mesh`).  None when there is none (a local transform)."""
    if mesh is not None:
        return check_mesh(mesh)
    if not is_tracer(x):
        sharding = getattr(x, "sharding", None)
        if isinstance(sharding, NamedSharding) and not sharding.mesh.empty:
            return check_mesh(sharding.mesh)
    else:
        # A tracer's type names its mesh; only Explicit axes also name the split, so only then
        # is it the mesh to run on (an Auto one is the partitioner's: `typed_mesh`).
        typed = typed_mesh(x)
        if typed is not None and has_explicit_axes(typed):
            return check_mesh(typed)
    ambient = jax.sharding.get_abstract_mesh()
    if ambient is not None and not ambient.empty:
        return check_mesh(ambient)
    legacy = legacy_mesh()
    if legacy is not None:
        return check_mesh(legacy)
    return None


def typed_mesh(x):
    """The Auto mesh in a traced x's type (under jit with nothing in scope, an argument sharded
    over an Auto mesh carries its abstract mesh, axis names and sizes, with an empty spec), or
    None.  The transform is still left to the partitioner (the spec is unknown, and the
    concrete devices too), but its k-space padding can be planned for these sizes."""
    if not is_tracer(x):
        return None
    sharding = getattr(jax.typeof(x), "sharding", None)
    if isinstance(sharding, NamedSharding) and not sharding.mesh.empty:
        return sharding.mesh
    return None


def current_spec(x):
    """x's PartitionSpec if known statically (concrete array or Explicit type), else None."""
    if not is_tracer(x):
        sharding = getattr(x, "sharding", None)
    else:
        sharding = getattr(jax.typeof(x), "sharding", None)
    if isinstance(sharding, NamedSharding):
        return tuple(sharding.spec) + (None,) * (np.ndim(x) - len(sharding.spec))
    return None


def batch_mesh(x, shape, mesh, argname: str) -> tuple[Any, Any]:
    """(mesh, None), or (None, mesh) where its batch axes must be left to XLA's partitioner.

    A mesh (c, ..., a, b) splits one leading axis of the array per batch axis c, ....  Under
    `jax.vmap` the transform sees each field without the batch axis that vmap maps (and that
    the mesh splits); planning on the mesh there would let shard_map gather that axis.  So a
    traced array with too few leading axes takes the compiler-partitioned path, which sees the
    batched array and its sharding when XLA partitions it (and says so if it cannot carry them);
    a concrete one is refused here.
    """
    if mesh is None or not batch_axes(mesh)[0]:
        return mesh, None
    if is_tracer(x) and len(shape) - 3 < len(batch_axes(mesh)[0]):
        return None, mesh
    check_batch(shape, mesh, argname)
    return mesh, None
