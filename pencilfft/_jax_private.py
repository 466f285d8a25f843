"""The private jax names pencilfft relies on, in one place: what to check on a new jax release.

Each has a fallback or fails loudly at import, never silently.
"""
from __future__ import annotations

from typing import Any


def needs_devices_when_lowered(prim: Any) -> None:
    """jit only hands the device assignment to lowering rules of primitives in this set, and
    custom_partitioning's and io_callback's lowerings need it (jaxdecomp relies on it too)."""
    from jax._src import dispatch

    dispatch.prim_requires_devices_during_lowering.add(prim)


def legacy_mesh() -> Any:
    """The mesh of an enclosing `with mesh:` block (the pre-`jax.set_mesh` idiom many codes
    use), or None."""
    try:
        from jax._src.mesh import thread_resources
    except ImportError:  # a jax without it: nothing to find
        return None
    mesh = thread_resources.env.physical_mesh
    return None if mesh.empty else mesh


def concrete_mesh() -> Any:
    """The concrete mesh set with `jax.set_mesh` (readable under jit, unlike
    `jax.sharding.get_mesh`), or None."""
    try:
        from jax._src.mesh import get_concrete_mesh
    except ImportError:  # a jax without it: nothing to find
        return None
    mesh = get_concrete_mesh()
    return None if mesh is None or mesh.empty else mesh
