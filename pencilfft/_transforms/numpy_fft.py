"""jax.numpy.fft's n-dimensional transforms on arrays of any rank in any sharding.

`fftn`, `ifftn`, `rfftn`, `irfftn` and the 2-D forms take jnp.fft's arguments `(a, s, axes,
norm)` and return what jnp.fft returns (values, shape, dtype, axis order), computed where the
data are: the route between the input's sharding and the output's (`routes.py`) is run in
`shard_map` as a list of stages (`stages.Fft`, `stages.Exchange`, `stages.Fit`, `stages.Take`,
`stages.Swap`), so that no device ever holds more than its share.  Under `jax.jit` where the
input's split is not in its type (an Auto mesh, or an Explicit one with a mesh axis the type
leaves out, as under `jax.vmap` over a split axis) the route is planned when XLA's partitioner
tells the input's sharding (`partitioned.py`, `RouteOp`); without `out_sharding` it ends in
the input's own sharding there (what the sharding rule can say before the partitioner runs).

The input's and the output's splits divide their axes (jax's arrays are split evenly); between
the stages any length works (`stages.Fit` pads while an axis is whole).  The memory check
(`budget.check_route`) runs before anything else where the mesh is known; where the mesh spans
processes they first agree on the stages (`_processes.agree`).
"""
from __future__ import annotations

import dataclasses
import functools
import operator
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from .. import _exchange
from .._jax_private import is_traced_argument
from .._processes import agree
from .._decomposition.mesh import find_mesh, has_explicit_axes, is_tracer, typed_mesh
from .partitioned import LinearOp, apply, place, with_mesh
from .fft import agree_on, array_arguments
from .plan import NORMS, fft_dtype, float_dtype, platform_of, check_chunks
from .budget import check_route
from .routes import Problem, find_route, largest_bytes, out_stored, spec_text
from .chunks import route_groups, route_in_pieces
from .stages import Exchange, Fit, Reshard, route_stages, run_route

__all__ = ["fftn", "ifftn", "rfftn", "irfftn", "fft2", "ifft2", "rfft2", "irfft2"]

Spec = tuple[tuple[str, ...], ...]


# ----------------------------------------------------------------------------------------------
# Arguments, as jnp.fft reads them


def _array(a, caller: str):
    if isinstance(a, jax.ShapeDtypeStruct) or not (hasattr(a, "shape") and hasattr(a, "dtype")):
        if isinstance(a, (list, tuple, int, float, complex)):
            return np.asarray(a)
        raise TypeError(f"`a` must be an array (jax.Array or numpy.ndarray), as for "
                        f"jnp.fft.{caller}; got {type(a).__name__}")
    if isinstance(a, jax.Array) and not is_tracer(a) and a.is_deleted():
        raise ValueError("`a` has been deleted (donated to an earlier call?); pass a live array")
    return a


def int_tuple(v, argname: str) -> tuple[int, ...]:
    try:
        values = tuple(v) if np.ndim(v) else (v,)
        if any(isinstance(n, (bool, np.bool_)) for n in values):
            raise TypeError
        return tuple(operator.index(n) for n in values)
    except TypeError:
        raise TypeError(f"`{argname}` must be an int or a sequence of ints; got {v!r}") from None


def _axes_and_s(shape, s, axes, default_axes, caller: str):
    """(axes, s) as jnp.fft.fftn reads them: `axes` defaults to the last len(s) axes with `s`,
    else `default_axes` (all axes; the last two for the 2-D forms)."""
    ndim = len(shape)
    if s is not None:
        s = int_tuple(s, "s")
    if axes is None:
        if s is None:
            axes = default_axes(ndim)
        else:
            axes = tuple(range(ndim - len(s), ndim))
    axes = int_tuple(axes, "axes")
    for ax in axes:
        if not -ndim <= ax < ndim:
            raise ValueError(f"`axes` = {axes} names axis {ax}, but `a` has {ndim} dimensions "
                             f"(shape {tuple(shape)})")
    axes = tuple(ax % ndim for ax in axes)
    if len(set(axes)) != len(axes):
        raise ValueError(f"`axes` = {axes} repeats an axis; jnp.fft.{caller} does not support "
                         f"repeated axes")
    if s is not None:
        if len(s) != len(axes):
            raise ValueError(f"`s` = {s} and `axes` = {axes} must have the same length")
        if any(n < 1 for n in s):
            raise ValueError(f"`s` = {s} must hold lengths >= 1")
    return axes, s


def _check_norm(norm) -> str:
    if norm is None:
        return "backward"
    if norm not in NORMS:
        raise ValueError(f"`norm` must be None or one of {NORMS}; got {norm!r}")
    return norm


_HALF = (np.dtype(np.float16), np.dtype(jnp.bfloat16))


def _untransformed(shape, s, inverse, caller, norm, dtype, exchange) -> Call:
    """The call of a transform over no axes (`axes` = ()): jnp.fft's result, which transforms
    nothing but casts (fftn, ifftn, irfftn: to complex; rfftn: to a real inexact dtype, half
    precision kept) and, for irfftn with `s` = (), crops the last axis to n // 2 + 1 as if it
    were the half axis.  Its dtype and shape are jnp's own (`jax.eval_shape` of the jnp call);
    the data are moved as a transform of no axes moves them (`Call` "c2c")."""
    jnp_fft = getattr(jnp.fft, caller)
    out = jax.eval_shape(lambda v: jnp_fft(v, s=s, axes=(), norm=norm),
                         jax.ShapeDtypeStruct(shape, dtype))
    if 0 in shape:
        raise ValueError(f"`a` has a zero-length axis (shape {shape})")
    if out.shape != shape:  # the crop of irfftn's `s` = (): the input is sliced first
        shape = tuple(out.shape)
    return Call(shape, (), "c2c", inverse, shape, shape, norm, np.dtype(out.dtype),
                np.dtype(out.dtype), exchange)


# ----------------------------------------------------------------------------------------------
# The input's layout


def _spec_tuple(spec, ndim: int, sizes: dict, argname: str) -> Spec:
    """A PartitionSpec as one tuple of mesh axis names per array axis."""
    spec = tuple(spec)
    if len(spec) > ndim:
        raise ValueError(f"`{argname}` {P(*spec)} has {len(spec)} entries for an array of "
                         f"{ndim} dimensions")
    out = []
    for entry in spec + (None,) * (ndim - len(spec)):
        names = () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)
        for name in names:
            if not isinstance(name, str) or name not in sizes:
                raise ValueError(f"`{argname}` {P(*spec)} names {name!r}, which is not an axis "
                                 f"of the mesh {tuple(sizes)}")
        out.append(names)
    seen = [m for s in out for m in s]
    if len(seen) != len(set(seen)):
        raise ValueError(f"`{argname}` {P(*spec)} names a mesh axis twice")
    return tuple(out)


def _without_ones(spec: Spec, sizes: dict) -> Spec:
    return tuple(tuple(m for m in s if sizes[m] > 1) for s in spec)


def spec_entries(spec, ndim: int, sizes: dict, argname: str) -> Spec:
    """A PartitionSpec as the planner's spec: per array axis, the mesh axes of size > 1 that
    split it (`_spec_tuple`'s checks, naming `argname`)."""
    return _without_ones(_spec_tuple(spec, ndim, sizes, argname), sizes)


def _default_spec(shape, mesh) -> P:
    """Where a numpy input goes on a mesh: mesh axis k over array axis k (the last array axis
    takes the mesh axes left over)."""
    n = len(shape)
    entries = [() for _ in range(n)]
    for k, name in enumerate(mesh.axis_names):
        entries[min(k, n - 1)] += (name,)
    return P(*(None if not e else e[0] if len(e) == 1 else e for e in entries))


def _input_layout(a, mesh_arg):
    """(mesh, input spec or None, compiler path?) of `a`: a NamedSharding's (concrete), the
    traced type's (Explicit axes), or the partitioner's (an Auto mesh under jit: None)."""
    if not is_tracer(a):
        sharding = getattr(a, "sharding", None)
        if isinstance(sharding, NamedSharding) and not sharding.mesh.empty:
            if mesh_arg is not None and sharding.mesh.shape != mesh_arg.shape:
                raise ValueError(f"`mesh` {dict(mesh_arg.shape)} is not the mesh of `a`'s "
                                 f"sharding {dict(sharding.mesh.shape)}")
            return sharding.mesh, sharding.spec, False
        if sharding is not None and len(sharding.device_set) > 1:
            raise ValueError(f"`a` is spread over {len(sharding.device_set)} devices by a "
                             f"{type(sharding).__name__} that names no mesh; place it with a "
                             f"NamedSharding")
        mesh = find_mesh(a, mesh_arg)
        if mesh is None or sharding is not None and mesh_arg is None:
            return None, None, False  # on one device
        return mesh, _default_spec(np.shape(a), mesh), False
    typed = jax.typeof(a).sharding if hasattr(jax.typeof(a), "sharding") else None
    if isinstance(typed, NamedSharding) and not typed.mesh.empty and has_explicit_axes(typed.mesh):
        used = {m for e in typed.spec if e is not None for m in ((e,) if isinstance(e, str) else e)}
        if all(n == 1 or m in used for m, n in typed.mesh.shape.items()):
            return typed.mesh, typed.spec, False
        # A mesh axis the type does not name: under jax.vmap it may split the mapped axis,
        # which only XLA's partitioner sees (the primitive's batching rule adds it).
        return typed.mesh, None, True
    mesh = find_mesh(a, mesh_arg)
    if mesh_arg is not None and has_explicit_axes(mesh_arg):
        return mesh_arg, None, True
    if mesh is None and typed_mesh(a) is None:
        return None, None, True
    return mesh, None, True


# ----------------------------------------------------------------------------------------------
# The plan of one call


@dataclasses.dataclass(frozen=True)
class Call:
    """Everything static about one call but the input's layout: shapes, kinds, lengths, dtypes."""

    shape: tuple[int, ...]  # the input's global shape
    axes: tuple[int, ...]
    kind: str  # "c2c", "r2c", "c2r"
    inverse: bool
    fit: tuple[int, ...]
    after: tuple[int, ...]
    norm: str
    in_dtype: np.dtype
    out_dtype: np.dtype
    exchange: str

    @property
    def out_shape(self) -> tuple[int, ...]:
        return tuple(self.after[i] if i in self.axes else n for i, n in enumerate(self.shape))

    def problem(self, sizes: dict, in_spec: Spec, target: Spec | None,
                even: bool = False) -> Problem:
        splits = [int(np.prod([sizes[m] for m in s])) for s in in_spec]
        stored = tuple(-(-n // q) * q for n, q in zip(self.shape, splits))
        real = np.dtype(float_dtype(self.out_dtype if self.kind != "c2r" else self.in_dtype))
        cplx = np.dtype(self.in_dtype if self.kind == "c2r" else self.out_dtype)
        return Problem(tuple((m, n) for m, n in sizes.items() if n > 1), self.shape, stored,
                       in_spec, self.axes, self.kind, self.fit, self.after,
                       (real.itemsize, cplx.itemsize), target, even)


def _call(a, s, axes, norm, kind, inverse, caller, default_axes, exchange) -> Call:
    shape = tuple(np.shape(a))
    axes, s = _axes_and_s(shape, s, axes, default_axes, caller)
    if default_axes is _last_two and len(axes) != 2:
        raise ValueError(f"`axes` = {axes}: {caller} transforms 2 axes, as jnp.fft.{caller} "
                         f"(which only supports 2 axes); use {caller[:-1]}n for any other number")
    norm = _check_norm(norm)
    dtype = np.dtype(a.dtype)
    cdtype = fft_dtype(dtype, "a")
    if kind == "r2c" and np.issubdtype(dtype, np.complexfloating):
        raise TypeError(f"`a` must be real for {caller} (jnp.fft.{caller} takes real input); "
                        f"got dtype {dtype}")
    if exchange not in _exchange.EXCHANGES:
        raise ValueError(f"`exchange` must be one of {_exchange.EXCHANGES}; got {exchange!r}")
    if not axes:
        return _untransformed(shape, s, inverse, caller, norm, dtype, exchange)
    if kind == "r2c" and dtype in _HALF:
        # jnp's own words first (its ValueError, from XLA's real-to-complex FFT); integers and
        # bools are cast to float32 as jnp casts them, half precision is not.
        raise ValueError(f"RFFT input must be float32 or float64, got {dtype}: `a` of "
                         f"{caller}, as jnp.fft.{caller} refuses it; cast it first, e.g. "
                         f"a.astype(np.float32)")
    fit = list(shape)
    after = list(shape)
    for k, i in enumerate(axes):
        n = s[k] if s is not None else shape[i]
        if kind == "c2r" and k == len(axes) - 1:
            out = s[k] if s is not None else 2 * (shape[i] - 1)
            if out < 1:
                raise ValueError(f"`a.shape[{i}]` = {shape[i]}: the real output of {caller} "
                                 f"would have {out} points; pass `s`")
            fit[i], after[i] = out // 2 + 1, out
        elif kind == "r2c" and k == len(axes) - 1:
            fit[i], after[i] = n, n // 2 + 1
        else:
            fit[i], after[i] = n, n
    if 0 in shape:
        raise ValueError(f"`a` has a zero-length axis (shape {shape})")
    in_dtype = float_dtype(cdtype) if kind == "r2c" else cdtype
    out_dtype = float_dtype(cdtype) if kind == "c2r" else cdtype
    return Call(shape, axes, kind, inverse, tuple(fit), tuple(after), norm, np.dtype(in_dtype),
                np.dtype(out_dtype), exchange)


def _target(out_sharding, mesh, ndim: int, sizes: dict) -> tuple[Spec | None, P | None]:
    """(spec without size-1 axes, the spec as given) of `out_sharding` on `mesh`."""
    if out_sharding is None:
        return None, None
    if isinstance(out_sharding, NamedSharding):
        if mesh is not None and out_sharding.mesh.shape != mesh.shape:
            raise ValueError(f"`out_sharding` is on mesh {dict(out_sharding.mesh.shape)}, not "
                             f"on the input's mesh {dict(mesh.shape)}")
        spec = out_sharding.spec
    elif isinstance(out_sharding, P):
        spec = out_sharding
    else:
        raise TypeError(f"`out_sharding` must be a NamedSharding or a PartitionSpec on the "
                        f"input's mesh; got {type(out_sharding).__name__}")
    if mesh is None:
        if any(e is not None for e in spec):
            raise ValueError(f"`out_sharding` {spec} splits the output, but `a` is on one "
                             f"device (no mesh): pass `mesh=` or place `a` with a NamedSharding")
        return None, spec
    target = spec_entries(spec, ndim, sizes, "out_sharding")
    missing = [m for m, n in sizes.items() if n > 1 and not any(m in t for t in target)]
    if missing:
        raise ValueError(f"`out_sharding` {spec} leaves the output replicated over mesh axes "
                         f"{tuple(missing)}: every device must hold only its share (nothing is "
                         f"gathered); name every mesh axis of size > 1 in it")
    return target, spec


@functools.lru_cache(maxsize=512)
def _planned(call: Call, sizes: tuple, in_spec: Spec, target: Spec | None, platform: str,
             even: bool):
    """(route, stages, problem) of a call on a mesh of `sizes` from `in_spec` (size-1 axes
    left out) to `target` (None: the cheapest fully distributed layout)."""
    sizes = dict(sizes)
    problem = call.problem(sizes, in_spec, target, even)
    try:
        route = find_route(problem)
    except ValueError:
        where = f" to `out_sharding` {spec_text(target)}" if target is not None else ""
        advice = ("choose another `out_sharding`" if target is not None else
                  "pass an `out_sharding` that splits axes the mesh divides")
        raise ValueError(
            f"no route of exchanges takes `a` (shape {call.shape}, split {spec_text(in_spec)} "
            f"over mesh axes {sizes}){where} to a result of shape {call.out_shape} split over "
            f"every mesh axis: each transformed axis must be whole on every device when it is "
            f"transformed (its mesh axes moved onto other axes, which they must divide unless "
            f"those are whole then), and each split of the result must divide its axis (jax's "
            f"arrays are split evenly). Nothing is gathered: {advice}, or use a mesh with fewer "
            f"devices"
        ) from None
    pdims = tuple(n for _, n in problem.sizes)
    block = int(np.prod(call.shape)) * call.out_dtype.itemsize // max(int(np.prod(pdims)), 1)
    algorithms = dict(zip((m for m, _ in problem.sizes),
                          _exchange.choose(call.exchange, int(np.prod(pdims)) or 1, platform,
                                           pdims, block)))
    stages = route_stages(problem, route, call.norm, call.inverse, algorithms)
    return route, stages, problem


# ----------------------------------------------------------------------------------------------
# Running it


def _local_plan(call: Call):
    """(route, stages, problem) of the whole transform on one device."""
    problem = call.problem({}, ((),) * len(call.shape), None)
    route = find_route(problem)
    return route, route_stages(problem, route, call.norm, call.inverse, {}), problem


def _local_body(call: Call, chunks: int = 1):
    """The whole transform on one device (jnp.fft's call on the block)."""
    stages = _local_plan(call)[1]
    return functools.partial(run_route, route_in_pieces(stages, len(call.shape), chunks))


def partition_spec(spec: Spec) -> P:
    """The PartitionSpec of a planner's spec (per axis, the tuple of mesh axes splitting it)."""
    return P(*(None if not s else s[0] if len(s) == 1 else s for s in spec))


def _on_mesh(call: Call, mesh, in_spec_given: P, target: Spec | None, target_given: P | None,
             chunks: int = 1, even: bool = True):
    """(body in shard_map, input spec, output spec, stored input shape, stored output shape).
    `even`: every split of the result divides its axis (jax's arrays, shard_map); else the
    result may be XLA's tiling of an uneven split (blocks of ceil(n / P), the last padded),
    which the partitioner takes as it is."""
    sizes = dict(mesh.shape)
    in_spec = _spec_tuple(in_spec_given, len(call.shape), sizes, "a.sharding")
    route, stages, problem = _planned(call, tuple(sizes.items()), _without_ones(in_spec, sizes),
                                      target, platform_of(mesh), even)
    out_spec = target_given if target_given is not None else partition_spec(route.spec)
    stages = route_in_pieces(stages, len(call.shape), chunks)
    body = with_mesh(functools.partial(run_route, stages), mesh)
    return body, P(*in_spec_given), out_spec, problem.stored, out_stored(problem, route)


@functools.partial(jax.jit, static_argnames=("call", "mesh", "in_spec", "target", "target_given",
                                           "chunks"))
def _shard_mapped(a, *, call, mesh, in_spec, target, target_given, chunks):
    body, in_p, out_p, stored_in, stored_out = _on_mesh(call, mesh, in_spec, target,
                                                        target_given, chunks)
    del stored_in, stored_out  # the input's and the result's splits divide (jax's arrays)
    # A mesh axis of size 1 named on one side only: the same data, which shard_map's check of
    # what varies over which axis cannot tell.
    ones = {m for m, n in mesh.shape.items() if n == 1}
    check = not ones & (_names(in_p) ^ _names(out_p))
    return jax.shard_map(body, mesh=mesh, in_specs=in_p, out_specs=out_p,
                         check_vma=check)(a.astype(call.in_dtype))


def _names(spec: P) -> set[str]:
    return {m for e in spec if e is not None for m in ((e,) if isinstance(e, str) else e)}


@functools.partial(jax.jit, static_argnames=("call", "chunks"))
def _one_device(a, *, call, chunks):
    return _local_body(call, chunks)(a.astype(call.in_dtype))


@dataclasses.dataclass(frozen=True)
class RouteOp(LinearOp):
    """The transform of `call` as a linear op whose mesh and input layout XLA's partitioner
    tells (jit with an Auto mesh and nothing in scope): its route is planned then, from the
    input's sharding to `target` (None: the input's own sharding, which is what the sharding
    rule can say before the partitioner runs)."""

    call: Call
    target_given: P | None = None
    transposed: bool = False
    chunks: int = 1  # pieces per stage ("auto" is 1 here: the devices are not known yet)
    reads_in_spec = True

    @property
    def primal_in(self):
        return jax.ShapeDtypeStruct(self.call.shape, self.call.in_dtype)

    @property
    def primal_out(self):
        return jax.ShapeDtypeStruct(self.call.out_shape, self.call.out_dtype)

    def primal_local(self, x):
        return _local_body(self.call, self.chunks)(x)

    def batched(self, n: int):
        c = self.call
        shift = lambda t: (n,) + t  # noqa: E731
        call = dataclasses.replace(c, shape=shift(c.shape), axes=tuple(a + 1 for a in c.axes),
                                   fit=shift(c.fit), after=shift(c.after))
        given = None if self.target_given is None else P(None, *self.target_given)
        return dataclasses.replace(self, call=call, target_given=given)

    def primal_on_mesh(self, mesh, in_spec=None):
        sizes = dict(mesh.shape)
        in_spec = P() if in_spec is None else in_spec
        ndim = len(self.call.shape)
        if self.target_given is not None:
            target, given = _target(self.target_given, mesh, ndim, sizes)
        else:  # the rule keeps every dimension's sharding: end where the input started
            given = P(*tuple(in_spec) + (None,) * (ndim - len(tuple(in_spec))))
            target = spec_entries(given, ndim, sizes, "a.sharding")
        # XLA's partitioner tiles an uneven split itself (blocks of ceil(n / P), the last one
        # padded), on the way in and out: the half axis of an rfftn that keeps the input's split
        # (Z // 2 + 1 over a mesh axis that splits Z), and the input of its irfftn.
        body, in_p, out_p, _, _ = _on_mesh(self.call, mesh, in_spec, target, given, self.chunks,
                                           even=False)
        return body, in_p, out_p

    def primal_rule(self):
        letters = [f"d{i}" for i in range(len(self.call.shape))]
        if self.target_given is not None:
            out = " ".join(f"o{i}" for i in range(len(self.call.shape)))
            # The transpose (a gradient's) starts from the asked layout, where the primal's
            # input layout is unknown to it: it keeps the layout it is given (with letters of
            # its own, XLA would replicate its result: a gather).
            return (out, out) if self.transposed else (" ".join(letters), out)
        return " ".join(letters), " ".join(letters)


def _transform(a, s, axes, norm, out_sharding, mesh, exchange, chunks, *, kind, inverse,
               caller, default_axes):
    a = _array(a, caller)
    given = {"s": s, "axes": axes, "norm": norm, "out_sharding": out_sharding,
             "exchange": exchange, "chunks": chunks}
    chunks = check_chunks(chunks)
    if mesh is not None and not hasattr(mesh, "axis_names"):
        raise TypeError(f"`mesh` must be a jax.sharding.Mesh; got {type(mesh).__name__}")
    call = _call(a, s, axes, norm, kind, inverse, caller, default_axes, exchange)
    found, in_spec, compiler = _input_layout(a, mesh)
    user_a = a

    def arguments(where) -> dict:
        """What the user gave, by the names the user knows (where processes differ)."""
        return {"function": f"pencilfft.{caller}", **array_arguments(user_a, "a"), **given,
                "mesh": where}

    if call.shape != tuple(np.shape(a)):  # irfftn's `s` = () over no axes: jnp's crop
        a = a[..., :call.shape[-1]]
    if compiler:
        if out_sharding is not None and not isinstance(out_sharding, (P, NamedSharding)):
            _target(out_sharding, None, len(call.shape), {})
        given_spec = out_sharding.spec if isinstance(out_sharding, NamedSharding) else out_sharding
        typed = typed_mesh(a)
        where = found if found is not None else typed
        if agree.spans_processes(where):  # once per trace: the partitioner plans the route
            agree_on(where, f"{caller} of a {call.shape} array", arguments(where),
                     {**agree.plan_decisions(call, a), "mesh": where,
                      "out_sharding": out_sharding, "chunks": chunks})
        y = apply(RouteOp(call, given_spec, chunks=1 if chunks == "auto" else chunks),
                  a.astype(call.in_dtype))
        if given_spec is not None:  # the partitioner hands this sharding to the op's result
            if isinstance(out_sharding, NamedSharding) or typed is None:
                return _to_out_sharding(y, out_sharding)
            return _to_out_sharding(y, NamedSharding(typed, given_spec))
        return y
    if found is None:
        _target(out_sharding, None, len(call.shape), {})
        chunks = _check_memory(call, None, None, None, a, caller, chunks)
        y = _one_device(jnp.asarray(a), call=call, chunks=chunks)
        return y if out_sharding is None else _to_out_sharding(y, out_sharding)
    mesh = found
    sizes = dict(mesh.shape)
    target, target_given = _target(out_sharding, mesh, len(call.shape), sizes)
    if in_spec is None:
        raise ValueError("internal: no input layout")
    _spec_tuple(in_spec, len(call.shape), sizes, "a.sharding")
    in_spec = P(*tuple(in_spec))
    # Validate at the call (the route, the sizes, the memory), not inside XLA.
    _on_mesh(call, mesh, in_spec, target, target_given)
    if agree.spans_processes(mesh):  # one program on every process, or one error on each
        spec = spec_entries(in_spec, len(call.shape), sizes, "a.sharding")
        stages = _planned(call, tuple(sizes.items()), spec, target, platform_of(mesh), True)[1]
        agree_on(mesh, f"{caller} of a {call.shape} array split {in_spec}", arguments(mesh),
                 {**agree.plan_decisions(call, a), "mesh": mesh, "in_spec": in_spec,
                  "out_sharding": out_sharding, "chunks": chunks, "stages": stages})
    if not is_tracer(a) and not isinstance(getattr(a, "sharding", None), NamedSharding):
        a = place(a, NamedSharding(mesh, in_spec))
    chunks = _check_memory(call, mesh, in_spec, target, a, caller, chunks)
    y = _shard_mapped(a, call=call, mesh=mesh, in_spec=in_spec, target=target,
                      target_given=target_given, chunks=chunks)
    if isinstance(out_sharding, NamedSharding) and isinstance(out_sharding.mesh, Mesh):
        return _to_out_sharding(y, out_sharding)
    return y


def _to_out_sharding(y, out_sharding):
    """y (computed on the input's devices) on `out_sharding`, which may name other devices
    than the input's, or the same in another order (a mesh of the same axis names and sizes):
    a concrete array is moved there by `jax.device_put`, block by block (each device's block
    to the device that holds it in `out_sharding`: nothing is gathered); on the same devices
    nothing moves.  Under jax.jit a program runs on one set of devices: the result is
    constrained to `out_sharding`, and jax refuses, when it compiles the program, one on other
    devices than the input's ("Received incompatible devices for jitted computation ... at
    ... (_to_out_sharding)"), as it refuses jax.device_put onto them there; outside jit the
    move works.  A PartitionSpec is on the input's mesh: under jit the result is constrained
    to it (the partitioner's path), else it is there already."""
    if not isinstance(out_sharding, NamedSharding):  # a PartitionSpec: on the input's mesh
        return jax.lax.with_sharding_constraint(y, out_sharding) if is_tracer(y) else y
    if is_tracer(y):
        if not has_explicit_axes(out_sharding.mesh):
            return jax.lax.with_sharding_constraint(y, out_sharding)
        if isinstance(out_sharding.mesh, Mesh):
            # Not `reshard`: under jit it keeps the input's devices whatever the mesh says.
            return jax.device_put(y, out_sharding)
        return jax.sharding.reshard(y, out_sharding)
    try:
        return place(y, out_sharding)
    except ValueError as e:  # jax cannot move it there (devices of other processes, say)
        raise ValueError(f"`out_sharding` names devices {_device_ids(out_sharding)} where the "
                         f"result is on {_device_ids(y.sharding)}, and jax cannot move it "
                         f"there: {e}") from None


def _device_ids(sharding) -> list[int]:
    """The ids of a sharding's devices, in its mesh's order where it has one."""
    mesh = getattr(sharding, "mesh", None)
    if isinstance(mesh, Mesh):
        return [d.id for d in mesh.devices.flat]
    return sorted(d.id for d in sharding.device_set)


def _check_memory(call: Call, mesh, in_spec, target, a, caller: str, chunks) -> int:
    """The memory check (`budget.check_route`) of the route this call takes; the chunk count
    it runs with ("auto": the fewest pieces that fit)."""
    if mesh is None:
        route, stages, problem = _local_plan(call)
    else:
        sizes = dict(mesh.shape)
        spec = spec_entries(in_spec, len(call.shape), sizes, "a.sharding")
        route, stages, problem = _planned(call, tuple(sizes.items()), spec, target,
                                          platform_of(mesh), True)
    n_in, n_out = int(np.prod(call.shape)), int(np.prod(call.out_shape))
    resident = is_traced_argument(a) if is_tracer(a) else isinstance(a, jax.Array)
    groups = route_groups(stages, len(call.shape))
    # Pieces shrink the exchanges' buffers only where every group that exchanges can be cut;
    # a piece that changes its shape or dtype is written into a new block beside the old.
    cut = all(free for g, free in groups if any(isinstance(s, (Exchange, Reshard)) for s in g))
    in_place = call.kind == "c2c" and not any(isinstance(s, Fit) for s in stages)
    return check_route(caller, call.shape, call.in_dtype, mesh, n_in * call.in_dtype.itemsize,
                       n_out * call.out_dtype.itemsize, largest_bytes(problem, route), resident,
                       chunks, cut, in_place)


def _all_axes(ndim: int) -> tuple[int, ...]:
    return tuple(range(ndim))


def _last_two(ndim: int) -> tuple[int, ...]:
    if ndim < 2:
        raise ValueError(f"the 2-D transforms need at least 2 dimensions; `a` has {ndim}")
    return (ndim - 2, ndim - 1)


_DOC = """
    Args:
      a: the global array, in any NamedSharding on any mesh (any axis split by any mesh axis
        or tuple of them; an axis the mesh does not divide is padded inside and sliced back),
        a numpy array, or a tracer under jax.jit.
      s, axes, norm: as jnp.fft's (`axes=()`: jnp's result, the input cast; the 2-D forms
        take exactly 2 axes, as jnp's).
      out_sharding: the result's sharding, a NamedSharding or a PartitionSpec on the input's
        mesh that names every mesh axis of size > 1; None: the cheapest layout that splits over
        every mesh axis (docs/howto/any-layout.md lists them; under jax.jit with no mesh in
        scope, the input's own sharding).  A NamedSharding on a mesh of the same axis names
        and sizes over other devices (or the same devices in another order): the result is
        moved there, block by block; under jax.jit jax refuses it when it compiles (a program
        runs on one set of devices, as for jax.device_put inside jit).
      mesh: the mesh of a numpy input (default: the ambient mesh); a sharded input's own.
      exchange: as pfft3d's.
      chunks: an int >= 1 or "auto" (default), as `pfft3d`'s: each step of the route (a
        transform and the exchanges up to the next) runs in that many pieces along an axis it
        leaves alone, written back in place where the piece keeps its shape (a step that
        touches every axis runs whole); "auto" is 1 unless the memory check finds that the
        transform does not fit, then the fewest pieces (2, 4, ..., 64) that do.  The same
        values.

    Returns:
      jnp.fft's result (the same values, shape, dtype and axis order), split as `out_sharding`.

    Raises:
      ValueError: bad `axes`, `s`, `norm`, `exchange` or `chunks`; an `out_sharding` that leaves
        the result replicated over a mesh axis or that no route of exchanges reaches; rfftn of
        float16 or bfloat16 (as jnp: "RFFT input must be float32 or float64").
      RuntimeError: the processes of a job whose mesh spans them called it differently (an
        argument, a dtype, jax_enable_x64): one DifferentPlansError on every process, before
        any exchange.
      TypeError: `a` is not an array; `out_sharding` is neither a NamedSharding nor a
        PartitionSpec; `chunks` is neither an int nor "auto".
      MemoryLimitError: the transform cannot fit the devices with `chunks` pieces (with
        "auto": in any number of them).
"""


def fftn(a, s=None, axes=None, norm=None, *, out_sharding=None, mesh=None, exchange="auto",
         chunks="auto"):
    """jnp.fft.fftn on a sharded array, without gathering it.
    %s
    Example:
      A 2-D field split over 8 devices along its rows comes back split along its columns
      (one exchange):

      >>> from jax.sharding import NamedSharding, PartitionSpec as P
      >>> mesh = jax.make_mesh((8,), ("x",))
      >>> a = jax.device_put(np.ones((16, 32), np.complex64), NamedSharding(mesh, P("x")))
      >>> k = pencilfft.fftn(a)
      >>> k.shape, k.sharding.spec
      ((16, 32), P(None, 'x'))
      >>> bool(np.allclose(k, np.fft.fftn(np.asarray(a)), atol=1e-3))
      True
    """
    return _transform(a, s, axes, norm, out_sharding, mesh, exchange, chunks, kind="c2c",
                      inverse=False, caller="fftn", default_axes=_all_axes)


def ifftn(a, s=None, axes=None, norm=None, *, out_sharding=None, mesh=None, exchange="auto",
          chunks="auto"):
    """jnp.fft.ifftn on a sharded array, without gathering it.
    %s
    Example:
      >>> from jax.sharding import NamedSharding, PartitionSpec as P
      >>> mesh = jax.make_mesh((4, 2), ("x", "y"))
      >>> a = jax.device_put(np.ones((8, 8, 8), np.complex64), NamedSharding(mesh, P("x", "y")))
      >>> y = pencilfft.ifftn(pencilfft.fftn(a), out_sharding=P("x", "y"))
      >>> y.sharding.spec, bool(jnp.allclose(y, a))
      (P('x', 'y', None), True)
    """
    return _transform(a, s, axes, norm, out_sharding, mesh, exchange, chunks, kind="c2c",
                      inverse=True, caller="ifftn", default_axes=_all_axes)


def rfftn(a, s=None, axes=None, norm=None, *, out_sharding=None, mesh=None, exchange="auto",
          chunks="auto"):
    """jnp.fft.rfftn on a sharded array, without gathering it: the last of `axes` is halved
    to n//2+1 (odd or even n), exactly jnp's shape.
    %s
    Example:
      >>> from jax.sharding import NamedSharding, PartitionSpec as P
      >>> mesh = jax.make_mesh((2, 2, 2), ("a", "b", "c"))
      >>> a = jax.device_put(np.ones((8, 8, 14), np.float32), NamedSharding(mesh, P("a", "b", "c")))
      >>> k = pencilfft.rfftn(a)
      >>> k.shape, k.dtype
      ((8, 8, 8), dtype('complex64'))
    """
    return _transform(a, s, axes, norm, out_sharding, mesh, exchange, chunks, kind="r2c",
                      inverse=False, caller="rfftn", default_axes=_all_axes)


def irfftn(a, s=None, axes=None, norm=None, *, out_sharding=None, mesh=None, exchange="auto",
           chunks="auto"):
    """jnp.fft.irfftn on a sharded array, without gathering it: the last of `axes` becomes
    real of length s[-1] (default 2 (n - 1): pass `s` for an odd length).
    %s
    Example:
      >>> from jax.sharding import NamedSharding, PartitionSpec as P
      >>> mesh = jax.make_mesh((2, 2, 2), ("a", "b", "c"))
      >>> a = jax.device_put(np.ones((8, 8, 14), np.float32), NamedSharding(mesh, P("a", "b", "c")))
      >>> y = pencilfft.irfftn(pencilfft.rfftn(a), s=(8, 8, 14), out_sharding=a.sharding)
      >>> y.shape, y.sharding.spec, bool(jnp.allclose(y, a, atol=1e-5))
      ((8, 8, 14), P('a', 'b', 'c'), True)
    """
    return _transform(a, s, axes, norm, out_sharding, mesh, exchange, chunks, kind="c2r",
                      inverse=True, caller="irfftn", default_axes=_all_axes)


def fft2(a, s=None, axes=(-2, -1), norm=None, *, out_sharding=None, mesh=None,
         exchange="auto", chunks="auto"):
    """jnp.fft.fft2 on a sharded array: `fftn` over the last two axes (`axes`).

    Example:
      >>> from jax.sharding import NamedSharding, PartitionSpec as P
      >>> mesh = jax.make_mesh((4, 2), ("x", "y"))
      >>> a = jax.device_put(np.ones((8, 16), np.complex64), NamedSharding(mesh, P("x", "y")))
      >>> pencilfft.fft2(a, out_sharding=P("x", "y")).sharding.spec
      P('x', 'y')
    """
    return _transform(a, s, axes, norm, out_sharding, mesh, exchange, chunks, kind="c2c",
                      inverse=False, caller="fft2", default_axes=_last_two)


def ifft2(a, s=None, axes=(-2, -1), norm=None, *, out_sharding=None, mesh=None,
          exchange="auto", chunks="auto"):
    """jnp.fft.ifft2 on a sharded array: `ifftn` over the last two axes (`axes`).

    Example:
      >>> from jax.sharding import NamedSharding, PartitionSpec as P
      >>> mesh = jax.make_mesh((8,), ("x",))
      >>> a = jax.device_put(np.ones((8, 16), np.complex64), NamedSharding(mesh, P("x")))
      >>> pencilfft.ifft2(a).shape
      (8, 16)
    """
    return _transform(a, s, axes, norm, out_sharding, mesh, exchange, chunks, kind="c2c",
                      inverse=True, caller="ifft2", default_axes=_last_two)


def rfft2(a, s=None, axes=(-2, -1), norm=None, *, out_sharding=None, mesh=None,
          exchange="auto", chunks="auto"):
    """jnp.fft.rfft2 on a sharded array: `rfftn` over the last two axes (`axes`).

    Example:
      >>> from jax.sharding import NamedSharding, PartitionSpec as P
      >>> mesh = jax.make_mesh((8,), ("x",))
      >>> a = jax.device_put(np.ones((8, 15), np.float32), NamedSharding(mesh, P("x")))
      >>> pencilfft.rfft2(a).shape
      (8, 8)
    """
    return _transform(a, s, axes, norm, out_sharding, mesh, exchange, chunks, kind="r2c",
                      inverse=False, caller="rfft2", default_axes=_last_two)


def irfft2(a, s=None, axes=(-2, -1), norm=None, *, out_sharding=None, mesh=None,
           exchange="auto", chunks="auto"):
    """jnp.fft.irfft2 on a sharded array: `irfftn` over the last two axes (`axes`).

    Example:
      >>> from jax.sharding import NamedSharding, PartitionSpec as P
      >>> mesh = jax.make_mesh((8,), ("x",))
      >>> a = jax.device_put(np.ones((8, 8), np.complex64), NamedSharding(mesh, P("x")))
      >>> pencilfft.irfft2(a, s=(8, 15)).shape
      (8, 15)
    """
    return _transform(a, s, axes, norm, out_sharding, mesh, exchange, chunks, kind="c2r",
                      inverse=True, caller="irfft2", default_axes=_last_two)


def _with_args(doc: str) -> str:
    """`doc` with `_DOC` in place of its `%s` line, indented as that line is: Python 3.13
    strips a docstring's common indentation when it compiles it, 3.11 and 3.12 do not."""
    indent = next(line[:len(line) - len(line.lstrip())] for line in doc.splitlines()
                  if line.strip() == "%s")
    return doc.replace("%s", "\n" + textwrap.indent(textwrap.dedent(_DOC).strip("\n"), indent)
                       + "\n", 1)


for _f in (fftn, ifftn, rfftn, irfftn):
    _f.__doc__ = _with_args(_f.__doc__)
