"""The collectives a traced function names, read from its jaxpr: for the tests that check that
every tuple of mesh axes comes in the mesh's order (jax 0.12 refuses any other)."""
from __future__ import annotations

import jax

# A collective primitive -> the parameter that holds its mesh axis names.
COLLECTIVES = {"ppermute": "axis_name", "all_to_all": "axis_name", "psum": "axes",
               "psum2": "axes", "psum_invariant": "axes", "pmax": "axes", "pmin": "axes",
               "all_gather": "axis_name", "reduce_scatter": "axis_name",
               "psum_scatter": "axis_name", "axis_index": "axis_name", "pbroadcast": "axes",
               "pvary": "axes"}


def collectives(jaxpr, found: list | None = None) -> list:
    """Every collective equation of a (closed) jaxpr and of the jaxprs inside it (shard_map,
    jit, scan, cond, custom_vjp, ...): (primitive name, its axis names)."""
    found = [] if found is None else found
    for eqn in getattr(jaxpr, "jaxpr", jaxpr).eqns:
        param = COLLECTIVES.get(eqn.primitive.name)
        if param is not None and param in eqn.params:
            found.append((eqn.primitive.name, eqn.params[param]))
        for value in eqn.params.values():
            for sub in (value if isinstance(value, (tuple, list)) else (value,)):
                if isinstance(sub, (jax.extend.core.Jaxpr, jax.extend.core.ClosedJaxpr)):
                    collectives(sub, found)
    return found
