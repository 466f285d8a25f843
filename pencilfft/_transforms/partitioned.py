"""Transforms whose mesh is decided by the compiler (jit on Auto meshes, no mesh in scope).

Under `jax.jit`, an array sharded over a mesh with `AxisType.Auto` axes carries no mesh in its
traced type, so the planner (`_decomposition.mesh.find_mesh`) finds none.  Tracing the one-device transform
would then let XLA's partitioner gather the whole grid onto every device.  Instead the transform
is staged out as one primitive whose lowering is a `custom_partitioning` call: when XLA
partitions the program it hands us the input's sharding (and so the mesh), and we return the
per-device body of the same slab/pencil algorithm that `shard_map` runs when the mesh is known.
When the program runs on one device the lowering uses the one-device transform itself.

The primitive is linear, so its JVP is itself and its transpose is the same op marked
`transposed`: both the one-device function and the per-device body are transposed by
`jax.linear_transpose` (all_to_all and collective permutes transpose into their reverses).
vmap adds a leading batch axis, which the planner supports (split by a batch axis of the
mesh when it has one: how `vmap(pfft3d)` over an ensemble keeps its sharding).

What the compiler path cannot know at trace time is the mesh's devices and the input's split;
the mesh's axis names and sizes it does know where the traced type carries them (an argument
sharded over an Auto mesh does), and the zero-padding of a k-space axis the mesh does not divide
depends on those alone (`Plan.padded_for`): the spectrum then has the same padded global shape,
evenly split, as where the mesh is known, and `Plan.bind` refuses a partitioner's mesh of other
sizes.  Where the type names no mesh, the k-space arrays have the exact global shape, and the
per-device blocks are the padded ones (XLA's uneven tiling: every block is ceil(n / P) long, the
last one padded), which is exactly the padded pencil layout.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental.custom_partitioning import custom_partitioning
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir
from jax.sharding import Mesh, NamedSharding

from .. import _exchange
from .._decomposition.mesh import has_explicit_axes, is_tracer
from .._decomposition.rules import check_batch
from .._jax_private import needs_devices_when_lowered, traced_input_meshes
from .chunks import stages_of
from .plan import Plan, check_k_shape
from .stages import run_backward, run_forward

__all__ = ["LinearOp", "Transform", "apply", "place", "run", "tile", "with_mesh"]


class LinearOp:
    """A linear map of one global array whose mesh the partitioner decides.

    Subclasses are frozen dataclasses (hashable: they are static primitive parameters) whose
    last field is `transposed: bool = False`, and that define the primal direction:
    `primal_in` / `primal_out` (global avals), `primal_local(x)` (the whole map on one device),
    `primal_on_mesh(mesh)` -> (per-device body, input spec, output spec), `primal_rule()` ->
    (input, output) factor strings of the Shardy rule without batch axes, `batched(n)`.
    The transposed direction is derived here, by `jax.linear_transpose`.
    """

    transposed: bool

    # The primal's avals, by default from fields `in_shape` and `dtype` and a property
    # `out_shape` (a map that keeps the dtype); `Transform` defines its own.
    @property
    def primal_in(self) -> jax.ShapeDtypeStruct:
        return jax.ShapeDtypeStruct(self.in_shape, self.dtype)

    @property
    def primal_out(self) -> jax.ShapeDtypeStruct:
        return jax.ShapeDtypeStruct(self.out_shape, self.dtype)

    @property
    def out_aval(self) -> jax.ShapeDtypeStruct:
        return self.primal_in if self.transposed else self.primal_out

    @property
    def T(self):
        return dataclasses.replace(self, transposed=not self.transposed)

    def local(self, x: jax.Array) -> jax.Array:
        """The whole map on one device (global arrays)."""
        self.check_local()
        if self.transposed:
            return jax.linear_transpose(self.primal_local, self.primal_in)(x)[0]
        return self.primal_local(x)

    # A mesh with batch axes that the caller named (mesh=, jax.set_mesh, an Explicit type) while
    # the traced input had too few leading axes for them (`_decomposition.mesh.batch_mesh`): under vmap the
    # batching rule adds the axis before anything runs; otherwise running it on one device
    # would ignore that mesh, so `check_local` refuses it.
    deferred: Any = None
    argname: str = "x"

    def check_local(self) -> None:
        """Raise if the map cannot run on one device (a mesh the caller named forbids it)."""
        if self.deferred is not None:
            check_batch(self.primal_in.shape, self.deferred, self.argname)

    # Whether `primal_on_mesh` takes the input's spec as the partitioner gives it (`in_spec=`):
    # a map whose route depends on where its input is (`numpy_fft.RouteOp`).
    reads_in_spec = False

    def on_mesh(self, mesh, in_spec=None) -> tuple[Callable, NamedSharding, NamedSharding]:
        """(per-device body, input sharding, output sharding) on `mesh`; validates the sizes.
        `in_spec`: the spec of the argument as XLA's partitioner holds it (None: unknown)."""
        if self.reads_in_spec:
            body, in_spec, out_spec = self.primal_on_mesh(mesh, in_spec=in_spec)
        else:
            body, in_spec, out_spec = self.primal_on_mesh(mesh)
        in_sharding, out_sharding = NamedSharding(mesh, in_spec), NamedSharding(mesh, out_spec)
        if self.transposed:
            block = jax.ShapeDtypeStruct(tile(self.primal_in.shape, in_spec, mesh),
                                         self.primal_in.dtype)
            body = _transposed(body, block)
            in_sharding, out_sharding = out_sharding, in_sharding
        return body, in_sharding, out_sharding

    def sharding_rule(self) -> str:
        """Shardy's einsum-like rule: which input dimension's sharding each output one takes
        (letters shared by an input and an output dimension carry it across; sizes may differ).
        Leading axes beyond the rule's are a batch that keeps its sharding (counted on the
        primal's input: a map may change the rank)."""
        src, dst = self.primal_rule()
        n_batch = len(self.primal_in.shape) - len(src.split())
        if self.transposed:
            src, dst = dst, src
        batch = " ".join(f"b{i}" for i in range(n_batch))
        return f"{batch} {src} -> {batch} {dst}".strip()


@dataclasses.dataclass(frozen=True)
class Transform(LinearOp):
    """One distributed 3D transform (forward or backward) of `plan`.

    The plan is made once, at the call: with its mesh when the mesh is known, without one when
    the partitioner decides it (`Plan.bind` then fits it to the mesh XLA gives, without
    planning again).  `in_shape` is the global input shape (a spectrum may be exact or padded
    for the mesh).
    """

    plan: Plan
    forward: bool
    in_shape: tuple[int, ...]
    transposed: bool = False

    @property
    def primal_in(self) -> jax.ShapeDtypeStruct:
        dtype = self.plan.real_dtype if self.forward else self.plan.k_dtype
        return jax.ShapeDtypeStruct(self.in_shape, dtype)

    @property
    def primal_out(self) -> jax.ShapeDtypeStruct:
        if self.forward:
            plan = self.plan
            known = plan.mesh is not None or plan.padded_for is not None
            shape = plan.k_shape if known else plan.exact_k_shape
            return jax.ShapeDtypeStruct(plan.batch + shape, plan.k_dtype)
        return jax.ShapeDtypeStruct(self.plan.batch + self.plan.real_shape, self.plan.real_dtype)

    def batched(self, n: int) -> Transform:
        plan = dataclasses.replace(self.plan, batch=(n,) + self.plan.batch)
        return dataclasses.replace(self, plan=plan, in_shape=(n,) + self.in_shape)

    @property
    def deferred(self):
        return self.plan.deferred

    @property
    def argname(self) -> str:
        return "x" if self.forward else "k"

    def body(self, plan: Plan) -> Callable:
        """The per-device map of `plan`'s stages in this direction (global on one device)."""
        run = run_forward if self.forward else run_backward
        return functools.partial(run, stages_of(plan))

    def primal_local(self, x: jax.Array) -> jax.Array:
        return self.body(self.plan)(x)

    def primal_on_mesh(self, mesh):
        plan = self.plan if self.plan.mesh is mesh else self.plan.bind(mesh, self.forward)
        body = with_mesh(self.body(plan), mesh)  # our custom-call exchanges find peers there
        if self.forward:
            return body, plan.real_spec, plan.k_spec
        check_k_shape(plan, self.in_shape[-3:])
        return body, plan.k_spec, plan.real_spec

    def primal_rule(self) -> tuple[str, str]:
        # Real space (X, Y, Z) is split (a, b, -); k space (Y, Z, X) also (a, b, -) in the
        # transposed layout, (X, Y, Z) as (-, a, b) in the natural one.
        real, k = "i j k", ("i j k" if self.plan.layout == "transposed" else "l i j")
        return (real, k) if self.forward else (k, real)


def with_mesh(f: Callable, mesh) -> Callable:
    """f, traced with `mesh` as the mesh of our custom-call exchanges (`_exchange.in_mesh`)."""
    def traced_in_mesh(*args):
        with _exchange.in_mesh(mesh):
            return f(*args)
    return traced_in_mesh


def _transposed(f: Callable, primal: jax.ShapeDtypeStruct) -> Callable:
    return lambda ct: jax.linear_transpose(f, primal)(ct)[0]


def tile(shape, spec, mesh) -> tuple[int, ...]:
    """Per-device block shape of a global shape under `spec` (ceil, as XLA tiles uneven axes)."""
    spec = tuple(spec) + (None,) * (len(shape) - len(spec))

    def parts(entry) -> int:  # an entry: None, a mesh axis, or a tuple of them (major first)
        names = () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)
        return math.prod(mesh.shape[name] for name in names)

    return tuple(-(-n // parts(entry)) for n, entry in zip(shape, spec))


# ----------------------------------------------------------------------------------------------
# custom_partitioning: what XLA's partitioner calls back


def _mesh_of(mesh, arg_infos) -> Mesh:
    sharding = getattr(arg_infos[0], "sharding", None)
    if isinstance(sharding, NamedSharding) and not sharding.mesh.empty:
        mesh = sharding.mesh
    if mesh is None or getattr(mesh, "empty", True):
        raise ValueError(
            "pencilfft could not tell the device mesh of this jit-compiled transform (its "
            f"input's sharding is {sharding}); pass `mesh=` to the transform or call it under "
            "`jax.set_mesh(mesh)`"
        )
    return mesh


def _checked_on_mesh(t: LinearOp, mesh, arg_infos):
    """t.on_mesh on the input's mesh.  A bad size can only be found here, inside XLA's
    partitioner, which reports it as an INTERNAL error carrying the exception's traceback:
    re-raised from here, that traceback is two frames and the last line pencilfft's message."""
    sharding = getattr(arg_infos[0], "sharding", None)
    in_spec = sharding.spec if isinstance(sharding, NamedSharding) else None
    try:
        return t.on_mesh(_mesh_of(mesh, arg_infos), in_spec)
    except (ValueError, TypeError) as e:
        raise type(e)(f"pencilfft (when XLA partitioned the jit-compiled program): {e}") from None


def _partition(t: LinearOp, mesh, arg_infos, result_infos):
    del result_infos  # we say what the output sharding is; XLA reshards downstream if it must
    body, in_sharding, out_sharding = _checked_on_mesh(t, mesh, arg_infos)
    return in_sharding.mesh, body, out_sharding, (in_sharding,)


def _infer_sharding(t: LinearOp, mesh, arg_infos, result_infos):
    del result_infos  # GSPMD (jax_use_shardy_partitioner=False) asks this instead of the rule
    return _checked_on_mesh(t, mesh, arg_infos)[2]


def _rule(t: LinearOp, mesh, value_types, result_types) -> str:
    del mesh, value_types, result_types
    return t.sharding_rule()


def _local_call(x, t: LinearOp):
    # custom_partitioning traces this one-device implementation on the global value, whose type
    # on an Explicit mesh names the mesh axes; slicing a split axis there is a typing error, so
    # the whole map is traced with those axes made Auto (the partitioner replaces it anyway).
    # It must also close over no array constants (custom_partitioning asserts so), which the
    # DCTs' twiddle factors would be: inside a jit they stay with the inner program.
    local = jax.jit(t.local)
    sharding = getattr(jax.typeof(x), "sharding", None)
    mesh = getattr(sharding, "mesh", None)
    if mesh is not None and not mesh.empty and has_explicit_axes(mesh):
        with jax.sharding.use_abstract_mesh(mesh):
            return jax.sharding.auto_axes(local, out_sharding=NamedSharding(
                mesh, jax.sharding.PartitionSpec()))(x)
    return local(x)


_partitioned = custom_partitioning(_local_call, static_argnums=(1,))
_partitioned.def_partition(partition=_partition, infer_sharding_from_operands=_infer_sharding,
                           sharding_rule=_rule)


# ----------------------------------------------------------------------------------------------
# The primitive: what jit, grad, vmap and scan see


transform_p = Primitive("pencilfft_linear")


def _abstract_eval(x, *, t: LinearOp):
    aval = t.out_aval
    sharding = getattr(x, "sharding", None)
    mesh = getattr(sharding, "mesh", None)
    if mesh is None or mesh.empty:
        return jax.core.ShapedArray(aval.shape, aval.dtype)
    if has_explicit_axes(mesh):
        # An Explicit type must name the output's split too (under vmap the batch axis's mesh
        # axis is added to it): Shardy's rule for this map applied to the input's spec.
        return jax.core.ShapedArray(aval.shape, aval.dtype,
                                    sharding=NamedSharding(mesh, _spec_by_rule(t, sharding.spec)))
    # The output lives on the input's Auto mesh (its spec is the partitioner's to choose):
    # keeping the mesh in the type lets a transform of the output plan the same padding.
    return jax.core.ShapedArray(aval.shape, aval.dtype,
                                sharding=NamedSharding(mesh, jax.sharding.PartitionSpec()))


def _spec_by_rule(t: LinearOp, spec) -> jax.sharding.PartitionSpec:
    """The output spec that `t.sharding_rule()` gives an input split as `spec`."""
    src, dst = (side.split() for side in t.sharding_rule().split("->"))
    spec = tuple(spec) + (None,) * (len(src) - len(spec))
    by_factor = dict(zip(src, spec))
    return jax.sharding.PartitionSpec(*(by_factor.get(f) for f in dst))


def _impl(x, *, t: LinearOp):
    # Reached only eagerly under a transformation (vmap or grad of a concrete array).
    return jax.jit(functools.partial(transform_p.bind, t=t))(x)


def _jvp(primals, tangents, *, t: LinearOp):
    (x,), (dx,) = primals, tangents
    y = transform_p.bind(x, t=t)
    if type(dx) is ad.Zero:
        return y, ad.Zero.from_primal_value(y)
    return y, transform_p.bind(dx, t=t)


def _transpose(ct, x, *, t: LinearOp):
    if type(ct) is ad.Zero:
        return (ad.Zero(x.aval),)
    return (transform_p.bind(ct, t=t.T),)


def _batch(args, dims, *, t: LinearOp):
    (x,), (d,) = args, dims
    x = jnp.moveaxis(x, d, 0)
    return transform_p.bind(x, t=t.batched(x.shape[0])), 0


def _lower(x, *, t: LinearOp):
    return _partitioned(x, t)


transform_p.def_abstract_eval(_abstract_eval)
transform_p.def_impl(_impl)
ad.primitive_jvps[transform_p] = _jvp
ad.primitive_transposes[transform_p] = _transpose
batching.primitive_batchers[transform_p] = _batch
mlir.register_lowering(transform_p, mlir.lower_fun(_lower, multiple_results=False))


needs_devices_when_lowered(transform_p)


def apply(t: LinearOp, x: Any) -> jax.Array:
    """Apply `t` to the global array x (usually a tracer whose mesh is unknown)."""
    _check_one_mesh(x)
    return transform_p.bind(x, t=t)


def _check_one_mesh(x: Any) -> None:
    """Refuse, at the call, a program whose arguments are on several meshes: jax lowers this
    primitive (custom_partitioning, which needs the devices) on one mesh per program, and would
    refuse the whole program later with "mesh should be the same across the entire program",
    which names neither pencilfft nor a way out."""
    meshes = traced_input_meshes(x)
    if len(meshes) > 1:
        shown = ", ".join(str(dict(zip(m.axis_names, m.axis_sizes))) for m in meshes)
        raise ValueError(
            f"the arguments of this jax.jit are on {len(meshes)} meshes ({shown}); pencilfft's "
            "transforms of an array on an Auto mesh run through jax's custom_partitioning, "
            "which jax lowers on one mesh per program: use meshes with Explicit axes "
            "(jax.make_mesh's default: each transform then runs in shard_map on its own mesh), "
            "or one jax.jit per mesh (docs/howto/any-layout.md)")


# ----------------------------------------------------------------------------------------------
# Running a LinearOp where its mesh is known, or leaving it to the partitioner


def place(x, sharding: NamedSharding):
    """x (a global array, numpy or jax, concrete or traced) in `sharding`."""
    if not is_tracer(x):
        if isinstance(x, jax.Array) and x.sharding.is_equivalent_to(sharding, x.ndim):
            return x
        return jax.device_put(x, sharding)
    if has_explicit_axes(sharding.mesh):
        return jax.sharding.reshard(x, sharding)
    return jax.lax.with_sharding_constraint(x, sharding)


def run(t: LinearOp, x, mesh) -> jax.Array:
    """t(x): in shard_map on `mesh`, or, with no mesh (None), through the compiler-partitioned
    primitive for a traced x and on its one device for a concrete one (the caller refuses a
    concrete array spread over several devices with no mesh to read)."""
    if mesh is None:
        return apply(t, x) if is_tracer(x) else _local(jnp.asarray(x), t=t)
    _, in_sharding, _ = t.on_mesh(mesh)  # validates the sizes at the call
    x = place(x, in_sharding)
    return _on_mesh(x, t=t, mesh=mesh)


@functools.partial(jax.jit, static_argnames=("t",))
def _local(x, *, t: LinearOp):
    return t.local(x)


def _shard_mapped(x, *, t: LinearOp, mesh):
    body, in_sharding, out_sharding = t.on_mesh(mesh)
    return jax.shard_map(body, mesh=mesh, in_specs=in_sharding.spec,
                         out_specs=out_sharding.spec)(x)


_on_mesh = jax.jit(_shard_mapped, static_argnames=("t", "mesh"))
