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


def is_traced_argument(x: Any) -> bool:
    """Whether traced `x` is an argument of the function jax is tracing (its buffer exists before
    the program runs), rather than a value the program makes.

    vmap's and grad's tracers are unwrapped to what they carry; a concrete value under them is
    in memory.  Read off jit's tracer: its variable is one of the traced frame's inputs.  On a
    jax whose tracers look otherwise the answer is True, the reading that never counts the
    input twice (the memory check of before).
    """
    try:
        from jax._src.interpreters.partial_eval import DynamicJaxprTracer
    except ImportError:
        return True
    import jax

    for _ in range(64):  # a chain of nested transformations, never a cycle
        if not isinstance(x, jax.core.Tracer):
            return True
        if isinstance(x, DynamicJaxprTracer):
            try:
                var, invars = x.val, x._trace.frame.invars
            except AttributeError:
                return True
            return any(var is v for v in invars)
        inner = getattr(x, "primal", None)
        if inner is None:
            inner = getattr(x, "val", None)
        if inner is None:
            return True
        x = inner
    return True


def concrete_mesh() -> Any:
    """The concrete mesh set with `jax.set_mesh` (readable under jit, unlike
    `jax.sharding.get_mesh`), or None."""
    try:
        from jax._src.mesh import get_concrete_mesh
    except ImportError:  # a jax without it: nothing to find
        return None
    mesh = get_concrete_mesh()
    return None if mesh is None or mesh.empty else mesh


def invariant_over(aval: Any, axis_name: str) -> Any:
    """`aval` (a value inside shard_map) made the same on every device of mesh axis `axis_name`,
    as a psum's result is: shard_map checks that outputs declared replicated are.  On a jax that
    keeps this elsewhere, `aval` unchanged (shard_map then refuses loudly where it matters)."""
    mat = getattr(aval, "manual_axis_type", None)
    if mat is None or not hasattr(mat, "varying"):
        return aval
    return aval.update(manual_axis_type=mat.update(
        varying=frozenset(a for a in mat.varying if a != axis_name)))


def distributed_client() -> Any:
    """jax.distributed's client (its key-value store), None in a one-process job."""
    try:
        from jax._src import distributed
    except ImportError:
        return None
    return getattr(distributed.global_state, "client", None)
