"""The distributed transforms: shard_map bodies that alternate local FFTs and exchanges.

Data path of the forward pencil transform on a mesh (a, b) of sizes (Pa, Pb), per device, with
B the flattened batch and lower-case sizes the local ones (x = X/Pa, y = Y/Pb, z = Zp/Pb,
y' = Yp/Pa):

    (B, x, y, Z)  --FFT Z-->  pad Z  --exchange over b-->  (B, x, z, Y)
                  --FFT Y-->  pad Y  --exchange over a-->  (B, y', z, X)  --FFT X-->  transposed
                                                          (B, X, y', z)   natural (one more move)

Every FFT runs over the last, contiguous axis.  A slab (Pb == 1) does one 2-D FFT over (Y, Z)
and a single exchange.  The path is the plan's stage list (`_stages.py`): `_forward_block` runs
it in order, `_backward_block` runs it reversed with each stage's inverse.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding

from ._plan import Plan, _is_tracer, plan_backward, plan_forward
from ._partitioned import Transform, apply, place
from ._memory import check_transform
from ._stages import Exchange, Fft, Pad, Stage
from ._transpose import transpose_blocks

__all__ = ["pfft3d", "pifft3d", "prfft3d", "pirfft3d"]


# ----------------------------------------------------------------------------------------------
# Per-device bodies (traced inside shard_map; all shapes here are local blocks)


def _pad_axis(k: jax.Array, axis: int, n: int) -> jax.Array:
    extra = n - k.shape[axis]
    if extra == 0:
        return k
    widths = [(0, 0)] * k.ndim
    widths[axis] = (0, extra)
    return jnp.pad(k, widths)


def _crop(k: jax.Array, axis: int, n: int) -> jax.Array:
    return k if k.shape[axis] == n else jax.lax.slice_in_dim(k, 0, n, axis=axis)


def forward_stage(plan: Plan, stage: Stage, k: jax.Array) -> jax.Array:
    """One forward stage on a (B, ...) block."""
    if isinstance(stage, Fft):
        fft = jnp.fft.rfftn if stage.real else jnp.fft.fftn
        return fft(k, axes=stage.axes, norm=plan.norm)
    if isinstance(stage, Pad):
        return _pad_axis(k, stage.axis, stage.padded)
    if isinstance(stage, Exchange):
        return transpose_blocks(k, plan.axes[stage.mesh_axis], stage.n, stage.split, stage.gather,
                                stage.order, algorithm=plan.exchanges[stage.mesh_axis])
    return jnp.moveaxis(k, stage.source, stage.destination)


def backward_stage(plan: Plan, stage: Stage, k: jax.Array) -> jax.Array:
    """The inverse of one forward stage on a (B, ...) block."""
    if isinstance(stage, Fft):
        if stage.real:
            return jnp.fft.irfftn(k, s=stage.sizes, axes=stage.axes, norm=plan.norm)
        return jnp.fft.ifftn(k, axes=stage.axes, norm=plan.norm)
    if isinstance(stage, Pad):
        return _crop(k, stage.axis, stage.length)
    if isinstance(stage, Exchange):
        return forward_stage(plan, stage.inverse(), k)
    return jnp.moveaxis(k, stage.destination, stage.source)


def _forward_block(plan: Plan, x: jax.Array) -> jax.Array:
    """Real-space block (..., x, y, Z) -> k-space block in plan.layout."""
    batch = x.shape[:-3]
    k = x.reshape((-1,) + x.shape[-3:])
    for stage in plan.stages:
        k = forward_stage(plan, stage, k)
    return k.reshape(batch + k.shape[1:])


def _backward_block(plan: Plan, k: jax.Array) -> jax.Array:
    """k-space block in plan.layout -> real-space block (..., x, y, Z)."""
    batch = k.shape[:-3]
    x = k.reshape((-1,) + k.shape[-3:])
    for stage in reversed(plan.stages):
        x = backward_stage(plan, stage, x)
    return x.reshape(batch + x.shape[1:])


# ----------------------------------------------------------------------------------------------
# Global wrappers


def _run(plan: Plan, block_fn, x, in_spec, out_spec, exchange: str):
    check_transform(plan, block_fn is _forward_block, x)  # too big for the devices? before XLA
    if plan.mesh is None:
        if _is_tracer(x):  # under jit with an Auto mesh: the partitioner will tell the mesh
            if exchange == "mpi":
                raise ValueError(
                    "`exchange`='mpi' needs the mesh when the transform is traced (its ordered "
                    "host callback cannot live inside the compiler-partitioned transform): pass "
                    "`mesh=`, call it under `jax.set_mesh(mesh)`, or use an Explicit mesh"
                )
            t = Transform(plan, block_fn, block_fn is _forward_block, exchange, tuple(x.shape))
            return apply(t, x)
        _check_one_device(x)
        return _local(jnp.asarray(x), plan=plan, block_fn=block_fn)
    return _on_mesh(place(x, NamedSharding(plan.mesh, in_spec)), plan=plan, block_fn=block_fn,
                    in_spec=in_spec, out_spec=out_spec)


# jit with the plan static: jax's own cache then compiles each (plan, direction) once, instead of
# retracing a fresh shard_map closure on every eager call.
@functools.partial(jax.jit, static_argnames=("plan", "block_fn"))
def _local(x, *, plan, block_fn):
    return block_fn(plan, x)


@functools.partial(jax.jit, static_argnames=("plan", "block_fn", "in_spec", "out_spec"))
def _on_mesh(x, *, plan, block_fn, in_spec, out_spec):
    f = jax.shard_map(functools.partial(block_fn, plan), mesh=plan.mesh,
                      in_specs=in_spec, out_specs=out_spec)
    return f(x)


def _check_one_device(x) -> None:
    """A concrete array on several devices with no mesh to read is refused, never gathered."""
    sharding = getattr(x, "sharding", None)
    if sharding is not None and len(sharding.device_set) > 1:
        raise ValueError(
            f"`x` is spread over {len(sharding.device_set)} devices by a {type(sharding).__name__} "
            "that names no mesh; pass `mesh=` or place it with a NamedSharding"
        )


def _refuse_placeholder(x, argname: str) -> None:
    """The planner takes ShapeDtypeStructs (the partitioned path plans on them); users pass data."""
    if isinstance(x, jax.ShapeDtypeStruct):
        raise TypeError(
            f"`{argname}` is a jax.ShapeDtypeStruct (a shape and dtype, no data); the transforms "
            f"take arrays: for the result's shape, dtype and sharding without computing it, "
            f"use jax.eval_shape, e.g. jax.eval_shape(pencilfft.pfft3d, {argname})"
        )


def _cast(x, dtype):
    return x.astype(dtype) if isinstance(x, jax.Array) or _is_tracer(x) else np.asarray(x, dtype)


def pfft3d(x, norm: str | None = "backward", *, layout: str = "transposed", mesh=None,
           exchange: str = "auto") -> jax.Array:
    """Distributed 3D FFT of the last three axes of `x`.

    Args:
      x: global array of shape (..., X, Y, Z), split P(a, b) over (X, Y) on a mesh (a, b) or
        P(a) on a 1-axis mesh; leading axes are a batch, split P(c, ..., a, b) by the batch
        axes of a mesh (c, ..., a, b).  Any other placement is resharded first.  X must be
        divisible by Pa, Y by Pb and each split leading axis by its batch axis.
      norm: "backward" (default), "ortho" or "forward", as in numpy.
      layout: "transposed" (default): global k-space order (..., Y, Z, X), as jaxdecomp;
        "natural": (..., X, Y, Z).  Either way Y is split by a and Z by b.
      mesh: the mesh; by default x's sharding, x's type under jit, then the ambient mesh.
      exchange: "auto" (default), "alltoall", "pairwise" or "mpi": how blocks move between
        devices (same result; see `_plan._exchanges` for what "auto" picks).  "mpi" sends them
        with mpi4py from the host: CPU processes under mpirun with one device each, the mesh
        known when traced (README "Several processes").

    Returns:
      The k-space array, global shape (..., Y', Z', X) or (..., X, Y', Z') where Y' = Y and
      Z' = Z unless the mesh does not divide them: then they are zero-padded at their end to
      the next multiple of Pa (Y) and Pb (Z), and slicing them back gives exactly `fftn(x)`.
    """
    _refuse_placeholder(x, "x")
    plan = plan_forward(x, norm=norm, layout=layout, mesh=mesh, real=False, exchange=exchange)
    return _run(plan, _forward_block, _cast(x, plan.real_dtype), plan.real_spec, plan.k_spec,
                exchange)


def prfft3d(x, norm: str | None = "backward", *, layout: str = "transposed", mesh=None,
            exchange: str = "auto") -> jax.Array:
    """Distributed real-to-complex 3D FFT: the half spectrum Z//2+1 along Z.

    As `pfft3d`, for real `x`; the halved Z axis has length Z//2+1, zero-padded at its end to a
    multiple of Pb where needed.  Slicing it to Z//2+1 gives exactly `jnp.fft.rfftn(x)`
    (transposed to (..., Y, Z//2+1, X) in the transposed layout).
    """
    _refuse_placeholder(x, "x")
    plan = plan_forward(x, norm=norm, layout=layout, mesh=mesh, real=True, exchange=exchange)
    return _run(plan, _forward_block, _cast(x, plan.real_dtype), plan.real_spec, plan.k_spec,
                exchange)


def _backward(k, s, norm, layout, mesh, real, exchange):
    _refuse_placeholder(k, "k")
    plan = plan_backward(k, s, norm=norm, layout=layout, mesh=mesh, real=real, exchange=exchange)
    k = _cast(k, plan.k_dtype)
    if tuple(np.shape(k)[-3:]) != plan.k_shape:  # an exact (unpadded) spectrum: pad it here
        pads = [(0, 0)] * (np.ndim(k) - 3) + [(0, p - n) for p, n in zip(plan.k_shape, np.shape(k)[-3:])]
        k = jnp.pad(jnp.asarray(k), pads)
    return _run(plan, _backward_block, k, plan.k_spec, plan.real_spec, exchange)


def pifft3d(k, norm: str | None = "backward", *, s=None, layout: str = "transposed",
            mesh=None, exchange: str = "auto") -> jax.Array:
    """Inverse of `pfft3d`: k-space array in `layout` -> real-space (..., X, Y, Z).

    Args:
      k: global k-space array, (..., Y, Z, X) for "transposed" or (..., X, Y, Z) for "natural",
        in any sharding (resharded to pencilfft's k-space sharding first).
      s: the real-space shape (X, Y, Z).  Required when `k` is zero-padded (see `pfft3d`);
        None means `k` is the exact spectrum.
    Returns a complex array of global shape (..., X, Y, Z) split P(a, b) over (X, Y).
    """
    return _backward(k, s, norm, layout, mesh, real=False, exchange=exchange)


def pirfft3d(k, s, norm: str | None = "backward", *, layout: str = "transposed",
             mesh=None, exchange: str = "auto") -> jax.Array:
    """Inverse of `prfft3d`: half spectrum -> real array of global shape (..., X, Y, Z) = s.

    `s` (required) is the real-space shape (X, Y, Z): Z cannot be recovered from Z//2+1.
    Padded entries of `k` are ignored.
    """
    return _backward(k, s, norm, layout, mesh, real=True, exchange=exchange)
