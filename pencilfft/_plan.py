"""Static planning: which mesh, which axes are split at each stage, padding, shapes and specs.

Nothing here traces jax code: a `Plan` is built from shapes, dtypes and the mesh alone, and the
traced transform (`_fft.py`) only follows it.  All user-input validation lives here so that bad
input fails at the call with a message naming the argument, never inside XLA.

Naming: a real-space array has global shape (..., X, Y, Z) and is split P(a, b) over (X, Y)
for a mesh with axes (a, b) (b absent on a 1-axis mesh; a mesh (c, ..., a, b) also splits the
leading axes by its batch axes c, ...: P(c, ..., a, b), which no stage ever crosses).  The
k-space array is split over (Y, Z) by the same (a, b): global order (..., Y, Z, X) in the
"transposed" layout and (..., X, Y, Z) in the "natural" one.  Z (or Z//2+1 for real transforms) is padded at its end to a
multiple of Pb and Y to a multiple of Pa where they do not divide.
"""
from __future__ import annotations

import dataclasses
import operator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

from . import _transpose
from ._decomposition import (batch_axes, check_batch, check_mesh, check_split, mesh_axes,
                             round_up, split_problem)
from ._jax_private import legacy_mesh
from ._sharding import LAYOUTS, k_space_spec, real_space_spec
from ._stages import Stage, forward_stages

NORMS = ("backward", "ortho", "forward")
EXCHANGES, PAIRWISE_MIN_BYTES = _transpose.EXCHANGES, _transpose.PAIRWISE_MIN_BYTES


@dataclasses.dataclass(frozen=True)
class Plan:
    """Everything static about one distributed 3D transform (both directions share it).

    Global shapes: `real_shape` = (X, Y, Z) of the real-space array (last three axes),
    `k_shape` = the k-space array's last three axes in `layout` order, padded.
    """

    mesh: Any  # Mesh or AbstractMesh, or None for a purely local transform
    axes: tuple[str | None, str | None]  # mesh axis names splitting (X, Y) in real space
    pdims: tuple[int, int]  # (Pa, Pb): sizes of those axes (1 where absent)
    batch: tuple[int, ...]  # leading unsharded axes
    real_shape: tuple[int, int, int]  # (X, Y, Z)
    real: bool  # real-to-complex (Z halved to Z//2+1)
    layout: str
    norm: str
    real_dtype: Any  # dtype in real space (complex for c2c, float for r2c)
    k_dtype: Any  # complex dtype in k space
    exchanges: tuple[str, str] = ("alltoall", "alltoall")  # algorithm over (a, b)
    # The mesh, when its batch axes are left to the partitioner (`batch_mesh`): mesh is None
    # then, and this one is checked when the transform is compiled for one device.
    deferred: Any = None

    @property
    def zc(self) -> int:
        """Length of the k-space Z axis before padding."""
        z = self.real_shape[2]
        return z // 2 + 1 if self.real else z

    @property
    def zp(self) -> int:
        """Length of the k-space Z axis, padded to a multiple of Pb."""
        return round_up(self.zc, self.pdims[1])

    @property
    def yp(self) -> int:
        """Length of the k-space Y axis, padded to a multiple of Pa."""
        return round_up(self.real_shape[1], self.pdims[0])

    @property
    def padded(self) -> bool:
        return self.yp != self.real_shape[1] or self.zp != self.zc

    @property
    def k_shape(self) -> tuple[int, int, int]:
        x = self.real_shape[0]
        if self.layout == "transposed":
            return (self.yp, self.zp, x)
        return (x, self.yp, self.zp)

    @property
    def exact_k_shape(self) -> tuple[int, int, int]:
        """The k-space shape without padding, in `layout` order."""
        x, y, _ = self.real_shape
        return (y, self.zc, x) if self.layout == "transposed" else (x, y, self.zc)

    @property
    def ndim(self) -> int:
        return len(self.batch) + 3

    @property
    def stages(self) -> tuple[Stage, ...]:
        """The forward transform's stages on a per-device block; backward walks them reversed."""
        return forward_stages(self.real_shape, self.pdims, self.real, self.layout,
                              self.zc, self.zp, self.yp)

    @property
    def real_spec(self) -> P:
        return _spec_for(self, real_space_spec)

    @property
    def k_spec(self) -> P:
        return _spec_for(self, lambda m, n: k_space_spec(m, self.layout, n))


def _spec_for(plan: Plan, make) -> P:
    if plan.mesh is None:
        return P()
    return make(plan.mesh, plan.ndim)


# ----------------------------------------------------------------------------------------------
# Mesh discovery


def _is_tracer(x) -> bool:
    return isinstance(x, jax.core.Tracer)


def has_explicit_axes(mesh) -> bool:
    return any(t == AxisType.Explicit for t in mesh.axis_types)


def find_mesh(x, mesh):
    """The mesh to run on, in order: `mesh`, x's NamedSharding, x's type (Explicit axes under
    jit), the ambient mesh (`jax.set_mesh`).  None when there is none (a local transform)."""
    if mesh is not None:
        return check_mesh(mesh)
    if not _is_tracer(x):
        sharding = getattr(x, "sharding", None)
        if isinstance(sharding, NamedSharding) and not sharding.mesh.empty:
            return check_mesh(sharding.mesh)
    else:
        sharding = getattr(jax.typeof(x), "sharding", None)
        # Auto axes leave no trace in a tracer's type; Explicit ones carry the mesh.
        if isinstance(sharding, NamedSharding) and not sharding.mesh.empty:
            if has_explicit_axes(sharding.mesh):
                return check_mesh(sharding.mesh)
    ambient = jax.sharding.get_abstract_mesh()
    if ambient is not None and not ambient.empty:
        return check_mesh(ambient)
    legacy = legacy_mesh()
    if legacy is not None:
        return check_mesh(legacy)
    return None


def _current_spec(x):
    """x's PartitionSpec if known statically (concrete array or Explicit type), else None."""
    if not _is_tracer(x):
        sharding = getattr(x, "sharding", None)
    else:
        sharding = getattr(jax.typeof(x), "sharding", None)
    if isinstance(sharding, NamedSharding):
        return tuple(sharding.spec) + (None,) * (np.ndim(x) - len(sharding.spec))
    return None


# ----------------------------------------------------------------------------------------------
# Validation and plan construction


def check_norm_layout(norm: str, layout: str) -> None:
    if norm is None:
        norm = "backward"
    if norm not in NORMS:
        raise ValueError(f"`norm` must be one of {NORMS}; got {norm!r}")
    if layout not in LAYOUTS:
        raise ValueError(f"`layout` must be one of {LAYOUTS}; got {layout!r}")


def _fft_dtype(dtype, argname: str):
    """The complex dtype jnp.fft.fftn would return for this input dtype."""
    dtype = np.dtype(dtype)
    # Kinds jnp.fft accepts: bools, integers, floats, complex (timedelta64 is an integer to
    # numpy, and long double has no XLA type: jnp refuses both, and so do we).
    numeric = dtype.kind in "biufc" or dtype == jnp.bfloat16
    if not numeric or dtype.itemsize > (16 if dtype.kind == "c" else 8):
        raise TypeError(
            f"`{argname}` must have a numeric dtype (bool, integer, float or complex) that jax "
            f"supports; got {dtype}"
        )
    return jax.eval_shape(lambda a: jnp.fft.fft(a), jax.ShapeDtypeStruct((2,), dtype)).dtype


def _float_dtype(cdtype):
    return np.dtype(np.float64 if np.dtype(cdtype) == np.complex128 else np.float32)


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
    if _is_tracer(x) and len(shape) - 3 < len(batch_axes(mesh)[0]):
        return None, mesh
    check_batch(shape, mesh, argname)
    return mesh, None


def _check_array(x, argname: str) -> tuple[int, ...]:
    """x's shape, for an array (jax, numpy or a tracer) with at least 3 non-empty axes."""
    if not (hasattr(x, "shape") and hasattr(x, "dtype")):
        raise TypeError(
            f"`{argname}` must be an array (jax.Array or numpy.ndarray), as for jnp.fft.fftn; "
            f"got {type(x).__name__}"
        )
    if isinstance(x, jax.Array) and not _is_tracer(x) and x.is_deleted():
        raise ValueError(
            f"`{argname}` has been deleted (was it donated to an earlier call, e.g. "
            f"jax.jit(pfft3d, donate_argnums=0)?); pass a live array"
        )
    shape = tuple(x.shape)
    if len(shape) < 3:
        raise ValueError(
            f"`{argname}` must have at least 3 dimensions (..., X, Y, Z); got shape {shape}"
        )
    if 0 in shape:
        raise ValueError(f"`{argname}` has a zero-length axis (shape {shape}); the transforms "
                         f"need at least one point along every axis")
    return shape


def _exchanges(exchange: str, mesh, pdims, block_bytes: int) -> tuple[str, str]:
    """The exchange algorithm for each mesh axis (`_transpose.ALGORITHMS`, whose table says what
    "auto" picks): all_to_all, except pairwise on CPU axes of 2-4 devices with large blocks."""
    return _transpose.choose(exchange, mesh.size if mesh is not None else None,
                             _platform(mesh), pdims, block_bytes)


def _block_bytes(shape, mesh, dtype) -> int:
    """Bytes of one device's k-space block (complex, global real-space `shape`), the larger
    side of every exchange."""
    n = int(np.prod(shape, dtype=np.int64))
    return n * np.dtype(dtype).itemsize // (mesh.size if mesh is not None else 1)


def _platform(mesh) -> str:
    if isinstance(mesh, Mesh) and mesh.devices.size:
        return mesh.devices.flat[0].platform
    return jax.default_backend()  # an AbstractMesh (from a traced type) names no devices


def plan_forward(x, *, norm, layout, mesh, real: bool, exchange: str = "auto",
                 argname: str = "x") -> Plan:
    """Plan for pfft3d/prfft3d of x (global shape (..., X, Y, Z))."""
    check_norm_layout(norm, layout)
    shape = _check_array(x, argname)
    dtype = x.dtype
    if real:
        if np.issubdtype(dtype, np.complexfloating):
            raise TypeError(
                f"`{argname}` must be real for a real-to-complex transform; got dtype {dtype} "
                f"(use pfft3d for complex input)"
            )
        k_dtype = _fft_dtype(dtype, argname)
        real_dtype = _float_dtype(k_dtype)
    else:
        k_dtype = real_dtype = _fft_dtype(dtype, argname)
    mesh, deferred = batch_mesh(x, shape, find_mesh(x, mesh), argname)
    axes, pdims = mesh_axes(mesh)
    check_split(shape, pdims, axes, argname)  # any other placement is resharded
    block_bytes = _block_bytes(shape, mesh, k_dtype)
    return Plan(mesh, axes, pdims, shape[:-3], shape[-3:], real, layout, norm or "backward",
                real_dtype, k_dtype, _exchanges(exchange, mesh, pdims, block_bytes), deferred)


def plan_backward(k, s, *, norm, layout, mesh, real: bool, exchange: str = "auto",
                  argname: str = "k", caller: str = "pirfft3d") -> Plan:
    """Plan for pifft3d/pirfft3d of k (k-space, global last axes in `layout` order).

    `s` is the real-space (X, Y, Z); None means k is not padded (complex transforms only).
    Also validates `s` against k for the frequency helpers.
    """
    check_norm_layout(norm, layout)
    shape = _check_array(k, argname)
    dtype = k.dtype
    k_dtype = _fft_dtype(dtype, argname)
    mesh, deferred = batch_mesh(k, shape, find_mesh(k, mesh), argname)
    axes, pdims = mesh_axes(mesh)
    kx, ky, kz = _xyz(shape[-3:], layout)
    if s is None:
        if real:
            raise ValueError(f"`s` (the real-space shape (X, Y, Z)) is required for {caller}")
        s = (kx, ky, kz)
    else:
        s = _check_s(s)
    block_bytes = _block_bytes(shape[:-3] + s, mesh, k_dtype)
    plan = Plan(mesh, axes, pdims, shape[:-3], s, real, layout, norm or "backward",
                _float_dtype(k_dtype) if real else k_dtype, k_dtype,
                _exchanges(exchange, mesh, pdims, block_bytes), deferred)
    if (kx, ky, kz) not in {_xyz(plan.k_shape, layout), _xyz(plan.exact_k_shape, layout)}:
        raise ValueError(
            f"`{argname}.shape[-3:]` = {shape[-3:]} does not fit the real-space shape `s` = {s} "
            f"on this mesh: expected {plan.exact_k_shape} (exact) or {plan.k_shape} (padded) in "
            f"the {layout} layout"
        )
    problem = split_problem(s, pdims, axes)
    if problem is not None:
        index, why = problem
        raise ValueError(f"`s[{index}]` {why}; `s` = {s}")
    return plan


def _xyz(k_last3, layout):
    """(X, Y, Z) sizes of a k-space shape given in `layout` order."""
    if layout == "transposed":
        y, z, x = k_last3
        return x, y, z
    return tuple(k_last3)


def _check_s(s) -> tuple[int, int, int]:
    """`s` as 3 positive Python ints; floats, strings and bools are refused, not truncated."""
    try:
        dims = tuple(operator.index(n) for n in s)
        bad = any(isinstance(n, (bool, np.bool_)) for n in s)
    except TypeError:
        dims, bad = (), True
    if bad:
        raise TypeError(f"`s` must be a sequence of 3 ints (X, Y, Z); got {s!r}")
    if len(dims) != 3 or any(n < 1 for n in dims):
        raise ValueError(f"`s` must be 3 positive ints (X, Y, Z); got {dims}")
    return dims
