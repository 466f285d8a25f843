"""Static planning: which mesh, which axes are split at each stage, padding, shapes and specs.

Nothing here traces jax code: a `Plan` is built from shapes, dtypes and the mesh alone, and the
traced transform (`fft.py`, `partitioned.py`) only follows it.  All user-input validation lives here so that bad
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
from jax.sharding import Mesh, PartitionSpec as P

from .. import _exchange
from .._processes.launch import process_hosts
from .._decomposition.mesh import batch_mesh, find_mesh, is_tracer, typed_mesh
from .._decomposition.rules import (check_batch, check_mesh, check_split, mesh_axes, round_up,
                                    split_problem)
from .._decomposition.sharding import LAYOUTS, k_space_spec, real_space_spec
from . import r2r as _r2r

NORMS = ("backward", "ortho", "forward")
FFT_KINDS = ("fft", "rfft")  # Fourier kinds: complex output, padding (dealiasing) allowed
KINDS = FFT_KINDS + _r2r.KINDS  # every per-axis transform kind (`stages.Fft`)
EXCHANGES, PAIRWISE_MIN_BYTES = _exchange.EXCHANGES, _exchange.PAIRWISE_MIN_BYTES


@dataclasses.dataclass(frozen=True)
class Plan:
    """Everything static about one distributed 3D transform (both directions share it).

    Global shapes: `real_shape` = (X, Y, Z) of the real-space array (last three axes; the
    padded grid when dealiasing), `modes` = the spectrum's lengths per axis before halving and
    mesh padding (`real_shape` unless padded), `k_shape` = the k-space array's last three axes
    in `layout` order, padded for the mesh.
    """

    mesh: Any  # Mesh or AbstractMesh, or None for a purely local transform (or one left to XLA)
    axes: tuple[str | None, str | None]  # mesh axis names splitting (X, Y) in real space
    pdims: tuple[int, int]  # (Pa, Pb): sizes of those axes (1 where absent)
    batch: tuple[int, ...]  # leading axes
    real_shape: tuple[int, int, int]  # (X, Y, Z)
    kinds: tuple[str, str, str]  # the transform along X, Y, Z (`KINDS`)
    modes: tuple[int, int, int]
    layout: str
    norm: str
    real_dtype: Any  # dtype in real space
    k_dtype: Any  # dtype in k space
    exchange: str = "auto"  # as asked; `exchanges` is what it means on this mesh
    exchanges: tuple[str, str] = ("alltoall", "alltoall")  # algorithm over (a, b)
    # The mesh, when its batch axes are left to the partitioner (`batch_mesh`): mesh is None
    # then, and this one is checked when the transform is compiled for one device.
    deferred: Any = None
    # (Pa, Pb) the k-space padding is planned for while the mesh is left to the partitioner
    # (mesh None): the sizes of the mesh in the traced input's type (an Auto mesh under jit
    # with nothing in scope, `typed_mesh`), so that the spectrum has the same padded global
    # shape, evenly split, as where the mesh is known.  `bind` checks the partitioner's mesh
    # against it.  None: the plan's own `pdims`.
    padded_for: tuple[int, int] | None = None
    # Pieces each stage runs in (`chunks.py`); 1: the unchunked chain.  `chunks_asked` is the
    # argument ("auto" is resolved to a count by the memory check, `budget.fit_chunks`).
    chunks: int = 1
    chunks_asked: int | str = 1
    # Whether the chunked stages run pipelined (`pipeline.py`): `pipeline_asked` is the argument
    # ("auto" resolved from the mesh, the exchanges and the block size, `_with_chunks`).
    pipeline: bool = False
    pipeline_asked: bool | str = "auto"

    @property
    def real(self) -> bool:
        """Real-to-complex along Z (its spectrum halved to Z//2+1)."""
        return self.kinds[2] == "rfft"

    @property
    def zc(self) -> int:
        """Length of the k-space Z axis before padding."""
        z = self.modes[2]
        return z // 2 + 1 if self.real else z

    @property
    def k_pdims(self) -> tuple[int, int]:
        """(Pa, Pb) the k-space axes are padded for: `pdims`, or `padded_for` while the mesh is
        left to the partitioner."""
        return self.padded_for if self.padded_for is not None else self.pdims

    @property
    def zp(self) -> int:
        """Length of the k-space Z axis, padded to a multiple of Pb."""
        return round_up(self.zc, self.k_pdims[1])

    @property
    def yp(self) -> int:
        """Length of the k-space Y axis, padded to a multiple of Pa."""
        return round_up(self.modes[1], self.k_pdims[0])

    @property
    def padded(self) -> bool:
        return self.yp != self.modes[1] or self.zp != self.zc

    @property
    def k_shape(self) -> tuple[int, int, int]:
        x = self.modes[0]
        if self.layout == "transposed":
            return (self.yp, self.zp, x)
        return (x, self.yp, self.zp)

    @property
    def exact_k_shape(self) -> tuple[int, int, int]:
        """The k-space shape without padding, in `layout` order."""
        x, y, _ = self.modes
        return (y, self.zc, x) if self.layout == "transposed" else (x, y, self.zc)

    @property
    def ndim(self) -> int:
        return len(self.batch) + 3

    def truncation_scale(self, d: int) -> float:
        """The factor of the forward dealiasing along global axis d (0 X, 1 Y, 2 Z): N/M for
        norm "backward", sqrt(N/M) for "ortho", 1 for "forward", so that the N-mode spectrum
        of a band-limited field is what an N-point transform gives."""
        power = {"backward": 1.0, "ortho": 0.5, "forward": 0.0}[self.norm]
        return (self.modes[d] / self.real_shape[d]) ** power

    @property
    def real_spec(self) -> P:
        return _spec_for(self, real_space_spec)

    @property
    def k_spec(self) -> P:
        return _spec_for(self, lambda m, n: k_space_spec(m, self.layout, n))

    def bind(self, mesh, forward: bool) -> Plan:
        """This plan on `mesh` (the compiler-partitioned path learns it late): the mesh's axes,
        their sizes and exchanges, after checking that they split the arrays."""
        mesh = check_mesh(mesh)
        check_batch(self.batch + self.real_shape, mesh, "x" if forward else "k")
        bound = _placed(self, mesh, None, None, forward, "x")
        if self.padded_for is not None and bound.k_shape != self.k_shape:
            # The global shapes were fixed when traced, from the mesh in the input's type; a
            # program partitioned on a mesh of other sizes cannot keep them.
            raise ValueError(
                f"the spectrum's global shape {self.batch + self.k_shape} was planned when traced "
                f"for a mesh of (Pa, Pb) = {self.padded_for} (the mesh in the input's type), but "
                f"XLA partitioned the program on mesh {dict(zip(mesh.axis_names, mesh.axis_sizes))} "
                f"((Pa, Pb) = {bound.pdims}), which pads it to {self.batch + bound.k_shape}; pass "
                f"`mesh=` to the transform or call it under `jax.set_mesh(mesh)`"
            )
        return bound


def _spec_for(plan: Plan, make) -> P:
    if plan.mesh is None:
        return P()
    return make(plan.mesh, plan.ndim)


# ----------------------------------------------------------------------------------------------
# The mesh


def _padded_for(x, mesh, deferred) -> tuple[int, int] | None:
    """`Plan.padded_for` of a plan on `mesh` (None: left to the partitioner)."""
    if mesh is not None:
        return None
    typed = deferred if deferred is not None else typed_mesh(x)
    if typed is None or len(typed.axis_names) == 0:
        return None
    return mesh_axes(typed)[1]


# ----------------------------------------------------------------------------------------------
# Validation and plan construction


def check_norm_layout(norm: str, layout: str) -> None:
    if norm is None:
        norm = "backward"
    if norm not in NORMS:
        raise ValueError(f"`norm` must be one of {NORMS}; got {norm!r}")
    if layout not in LAYOUTS:
        raise ValueError(f"`layout` must be one of {LAYOUTS}; got {layout!r}")


def fft_dtype(dtype, argname: str):
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


def float_dtype(cdtype):
    return np.dtype(np.float64 if np.dtype(cdtype) == np.complex128 else np.float32)


def check_array(x, argname: str) -> tuple[int, ...]:
    """x's shape, for an array (jax, numpy or a tracer) with at least 3 non-empty axes."""
    if not (hasattr(x, "shape") and hasattr(x, "dtype")):
        raise TypeError(
            f"`{argname}` must be an array (jax.Array or numpy.ndarray), as for jnp.fft.fftn; "
            f"got {type(x).__name__}"
        )
    if isinstance(x, jax.Array) and not is_tracer(x) and x.is_deleted():
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
    """The exchange algorithm for each mesh axis (`_exchange.ALGORITHMS`, whose table says what
    "auto" picks): all_to_all, except pairwise on CPU axes of 2-4 devices with large blocks."""
    return _exchange.choose(exchange, mesh.size if mesh is not None else None,
                             platform_of(mesh), pdims, block_bytes)


def _block_bytes(shape, mesh, dtype) -> int:
    """Bytes of one device's k-space block (complex, global real-space `shape`), the larger
    side of every exchange."""
    n = int(np.prod(shape, dtype=np.int64))
    return n * np.dtype(dtype).itemsize // (mesh.size if mesh is not None else 1)


def platform_of(mesh) -> str:
    if isinstance(mesh, Mesh) and mesh.devices.size:
        return mesh.devices.flat[0].platform
    return jax.default_backend()  # an AbstractMesh (from a traced type) names no devices


def check_kinds(kinds, real: bool = False) -> tuple[str, str, str]:
    """`kinds` as a 3-tuple of `KINDS` names for (X, Y, Z); None: "fft" on every axis
    ("rfft" along Z for `real`)."""
    if kinds is None:
        return ("fft", "fft", "rfft" if real else "fft")
    if isinstance(kinds, str) or not all(isinstance(k, str) for k in _as_tuple(kinds)):
        raise TypeError(f"`kinds` must be 3 strings, the transform along (X, Y, Z), e.g. "
                        f"('dct2', 'fft', 'fft'); got {kinds!r}")
    kinds = _as_tuple(kinds)
    if len(kinds) != 3:
        raise ValueError(f"`kinds` must name 3 transforms (X, Y, Z); got {len(kinds)}: {kinds!r}")
    for i, kind in enumerate(kinds):
        if kind not in KINDS:
            raise ValueError(f"`kinds[{i}]` = {kind!r} is not a transform kind; expected one of "
                             f"{KINDS}")
        if kind == "rfft" and i != 2:
            raise ValueError(f"`kinds[{i}]` = 'rfft': the real-to-complex transform runs along Z "
                             f"only (kinds[2]), the first axis transformed, where the data are "
                             f"still real; use 'fft' here")
    return kinds


def check_chunks(chunks) -> int | str:
    """`chunks` as an int >= 1 or "auto"."""
    if isinstance(chunks, str):
        if chunks != "auto":
            raise ValueError(f"`chunks` must be an int >= 1 or 'auto'; got {chunks!r}")
        return chunks
    try:
        if isinstance(chunks, bool):  # operator.index(True) is 1
            raise TypeError
        chunks = operator.index(chunks)
    except TypeError:
        raise TypeError(f"`chunks` must be an int >= 1 or 'auto'; got {chunks!r}") from None
    if chunks < 1:
        raise ValueError(f"`chunks` must be an int >= 1 or 'auto'; got {chunks}")
    return chunks


# "auto" pipelines blocks of at least this many bytes per device (complex spectra): below, a
# piece's fixed costs (its message, its FFT call) outweigh the overlap.  It cuts them into
# pieces of about PIPELINE_PIECE_BYTES, PIPELINE_PIECES to PIPELINE_MAX_PIECES of them: a
# piece whose few buffers (read, transformed, packed) stay in the core's cache costs less than
# a large one, and short pieces fill and drain the pipeline quickly (256^3 on 2 nodes, link
# unlimited: 16 pieces of 4 MiB 246 ms, 128 of 512 KiB 226 ms; at the rate where the link
# takes as long as the cores 333 and 303 ms).  But no message to a peer under
# PIPELINE_MESSAGE_BYTES: over TCP smaller ones cost more than they hide (4 slabs on 4 nodes,
# 64 pieces, messages of 128 KiB: 0.95-1.21x the unpipelined time where the link was limited,
# in 16 pieces 0.77-0.89x; benchmarks/RESULTS.md, "The network hidden behind the FFT").
PIPELINE_MIN_BYTES = 8 << 20
PIPELINE_PIECE_BYTES = 512 << 10
PIPELINE_MESSAGE_BYTES = 256 << 10
PIPELINE_PIECES = 16
PIPELINE_MAX_PIECES = 128


def pipeline_pieces(block_bytes: int, peers: int = 2) -> int:
    """The pieces "auto" cuts a pipelined stage's block of `block_bytes` (per device) into,
    exchanged among `peers` devices: a power of two, pieces of about PIPELINE_PIECE_BYTES and
    messages of at least PIPELINE_MESSAGE_BYTES, PIPELINE_PIECES to PIPELINE_MAX_PIECES of them
    (a stage's cut axis shorter than that takes one entry a piece: `pipeline.run_pipelined`)."""
    count = PIPELINE_PIECES
    while (count < PIPELINE_MAX_PIECES and block_bytes // (2 * count) >= PIPELINE_PIECE_BYTES
           and block_bytes // (2 * count * max(peers, 1)) >= PIPELINE_MESSAGE_BYTES):
        count *= 2
    return count


def check_pipeline(pipeline) -> bool | str:
    """`pipeline` as True, False or "auto"."""
    if pipeline == "auto" and isinstance(pipeline, str) or isinstance(pipeline, bool):
        return pipeline
    raise (ValueError if isinstance(pipeline, str) else TypeError)(
        f"`pipeline` must be True, False or 'auto'; got {pipeline!r}")


def pipelined(asked: bool | str, mesh, axes, exchanges, block_bytes: int,
              hosts: tuple[str, ...] | None = None) -> bool:
    """Whether a transform runs its chunked stages pipelined: as `asked`, or for "auto" where
    it pays: on CPU processes whose exchange along some mesh axis goes through MPI ("mpi", or
    "mixed" along an axis spanning processes) between processes on different nodes (`hosts`:
    each process's host name, `process_hosts()`; unknown: not pipelined), with a large enough
    block.  Inside a node MPI moves the bytes through shared memory, faster than the
    pipeline's extra passes save (benchmarks/RESULTS.md); where nothing crosses processes
    (one process, one device) there is nothing to overlap."""
    if asked != "auto":
        return bool(asked)
    if (mesh is None or jax.process_count() == 1 or platform_of(mesh) != "cpu"
            or block_bytes < PIPELINE_MIN_BYTES):
        return False
    hosts = process_hosts() if hosts is None else hosts
    if hosts is None:
        return False
    concrete = _exchange.concrete(mesh)
    return any(algorithm in ("mpi", "mixed")
               and any(len({hosts[p] for p in row}) > 1
                       for row in _exchange.process_groups(concrete, name))
               for name, algorithm in zip(axes, exchanges) if name is not None)


def _as_tuple(v) -> tuple:
    try:
        return tuple(v)
    except TypeError:
        return (v,)


def three_numbers(value, argname: str, hint: str) -> tuple[float, float, float]:
    """One number or three (X, Y, Z) as 3 floats; strings and bools are refused (float("1")
    and float(True) would pass)."""
    values = np.ravel(np.asarray(value, dtype=object))
    try:
        if any(isinstance(v, (str, bytes, bool, np.bool_)) for v in values):
            raise TypeError
        numbers = tuple(float(v) for v in values)
    except (TypeError, ValueError):
        raise TypeError(f"`{argname}` must be a number or 3 numbers {hint}; got {value!r}") from None
    if len(numbers) == 1:
        numbers *= 3
    if len(numbers) != 3 or np.ndim(value) > 1:
        raise ValueError(f"`{argname}` must be a number or 3 numbers {hint}; got {value!r}")
    return numbers


def check_padding(padding, kinds: tuple[str, str, str]) -> tuple[float, float, float]:
    """`padding` as 3 factors >= 1 (one number: the same on every axis); only Fourier axes
    ("fft", "rfft") can be padded."""
    factors = three_numbers(padding, "padding", "(X, Y, Z), e.g. 1.5 for the 3/2 rule")
    if not all(np.isfinite(f) and f >= 1 for f in factors):
        raise ValueError(f"`padding` must be one factor >= 1 or 3 of them (X, Y, Z); got "
                         f"{padding!r}")
    for i, (f, kind) in enumerate(zip(factors, kinds)):
        if f != 1 and kind not in FFT_KINDS:
            raise ValueError(f"`padding[{i}]` = {f:g} on a {kind!r} axis: only Fourier axes "
                             f"('fft', 'rfft') are padded (dealiased)")
    return factors


def _modes_of(grid: tuple[int, ...], padding, argname: str) -> tuple[int, int, int]:
    """The spectrum's lengths N = M / padding of a padded grid M (each must come out whole)."""
    modes = []
    for i, (m, f) in enumerate(zip(grid, padding)):
        n = round(m / f)
        if f != 1 and (n < 1 or abs(n * f - m) > 1e-9 * m):
            raise ValueError(f"`{argname}.shape[{i - 3}]` = {m} is not `padding[{i}]` = {f:g} "
                             f"times a whole number of modes (the padded grid is padding x N "
                             f"points)")
        modes.append(n)
    return tuple(modes)


def _grid_of(modes: tuple[int, int, int], padding) -> tuple[int, int, int]:
    """The padded grid M = padding x N of a spectrum's lengths N (each must come out whole)."""
    grid = []
    for i, (n, f) in enumerate(zip(modes, padding)):
        m = round(n * f)
        if abs(m - n * f) > 1e-9 * m:
            raise ValueError(f"`s[{i}]` = {n} times `padding[{i}]` = {f:g} is not a whole number "
                             f"of points for the padded grid")
        grid.append(m)
    return tuple(grid)


def _check_lengths(modes, kinds, argname: str) -> None:
    for i, (n, kind) in enumerate(zip(modes, kinds)):
        if kind in _r2r.KINDS and n < _r2r.min_length(kind):
            raise ValueError(f"{kind} needs at least {_r2r.min_length(kind)} points; "
                             f"`{argname}` has {n} along axis {'XYZ'[i]}")


def _dtypes(dtype, kinds, argname: str) -> tuple[Any, Any]:
    """(real-space dtype, k-space dtype) of a transform of `kinds` whose input has `dtype`."""
    c = fft_dtype(dtype, argname)  # validates: numeric, supported by jax
    if "rfft" in kinds:
        if np.issubdtype(dtype, np.complexfloating):
            raise TypeError(
                f"`{argname}` must be real for a real-to-complex transform; got dtype {dtype} "
                f"(use pfft3d, or 'fft' along Z, for complex input)"
            )
        return float_dtype(c), c
    if "fft" in kinds:  # complex from the first FFT on: the input is cast, as fftn does
        return c, c
    same = c if np.issubdtype(dtype, np.complexfloating) else float_dtype(c)
    return same, same  # DCTs and DSTs keep real data real


def _k_dtypes(dtype, kinds, argname: str) -> tuple[Any, Any]:
    """(real-space dtype, k-space dtype) for the inverse transform of a spectrum of `dtype`."""
    if "rfft" in kinds or "fft" in kinds:
        c = fft_dtype(dtype, argname)
        return (float_dtype(c) if "rfft" in kinds else c), c
    return _dtypes(dtype, kinds, argname)


def _checked_args(x, argname: str, *, norm, layout, kinds, real, padding, chunks, pipeline):
    """The argument rules both directions share, each named once, in the order their messages
    are met: (kinds, padding factors, chunks, x's global shape)."""
    check_norm_layout(norm, layout)
    kinds = check_kinds(kinds, real)
    padding = check_padding(padding, kinds)
    chunks = check_chunks(chunks)
    if check_pipeline(pipeline) is True and chunks == 1:
        raise ValueError("`pipeline`=True runs a stage's pieces overlapped, and `chunks`=1 makes "
                         "one piece: pass `chunks` >= 2 or 'auto' "
                         f"({PIPELINE_PIECES} to {PIPELINE_MAX_PIECES} pieces then), or "
                         "`pipeline`=False")
    return kinds, padding, chunks, check_array(x, argname)


def _placed(plan: Plan, mesh, deferred, padded_for, forward: bool, argname: str) -> Plan:
    """`plan` (built with no mesh) on `mesh`: the mesh's pencil axes, their sizes and exchanges,
    after checking that they split the grid.  One rule for planning and for `Plan.bind`."""
    axes, pdims = mesh_axes(mesh)
    if forward:
        check_split(plan.batch + plan.real_shape, pdims, axes, argname)  # other placements are resharded
    else:
        _check_s_split(plan.real_shape, pdims, axes, plan.modes)
    block_bytes = _block_bytes(plan.batch + plan.real_shape, mesh, plan.k_dtype)
    return dataclasses.replace(plan, mesh=mesh, axes=axes, pdims=pdims, deferred=deferred,
                               padded_for=padded_for,
                               exchanges=_exchanges(plan.exchange, mesh, pdims, block_bytes))


def plan_forward(x, *, norm, layout, mesh, real: bool = False, kinds=None, padding=1,
                 exchange: str = "auto", argname: str = "x", chunks=1,
                 pipeline: bool | str = False) -> Plan:
    """Plan for a forward transform of x (global shape (..., X, Y, Z): the padded grid when
    `padding` is not 1), along `kinds` (None: c2c, or r2c along Z for `real`)."""
    kinds, padding, chunks, shape = _checked_args(x, argname, norm=norm, layout=layout,
                                                  kinds=kinds, real=real, padding=padding,
                                                  chunks=chunks, pipeline=pipeline)
    real_dtype, k_dtype = _dtypes(x.dtype, kinds, argname)
    modes = _modes_of(shape[-3:], padding, argname)
    _check_lengths(modes, kinds, argname)
    mesh, deferred = batch_mesh(x, shape, find_mesh(x, mesh), argname)
    plan = Plan(None, (None, None), (1, 1), shape[:-3], shape[-3:], kinds, modes, layout,
                norm or "backward", real_dtype, k_dtype, exchange)
    plan = _placed(plan, mesh, deferred, _padded_for(x, mesh, deferred), True, argname)
    return _with_chunks(plan, chunks, pipeline)


def _with_chunks(plan: Plan, chunks: int | str, pipeline: bool | str = False) -> Plan:
    """`plan` cut into `chunks` pieces per stage ("auto": 1 until the memory check says
    otherwise, `budget.fit_chunks`; `pipeline_pieces` or more pipelined), run pipelined as
    `pipeline` says (`pipelined`; never with one piece)."""
    block = _block_bytes(plan.batch + plan.real_shape, plan.mesh, plan.k_dtype)
    piped = chunks != 1 and pipelined(pipeline, plan.mesh, plan.axes, plan.exchanges, block)
    if chunks != "auto":
        count = chunks
    elif piped:  # (the most devices an exchange is among: the smallest messages)
        peers = max((_exchange.concrete(plan.mesh).shape[a] for a in plan.axes if a is not None),
                    default=1)
        count = pipeline_pieces(block, peers)
    else:
        count = 1
    return dataclasses.replace(plan, chunks=count, chunks_asked=chunks, pipeline=piped,
                               pipeline_asked=pipeline)


def plan_backward(k, s, *, norm, layout, mesh, real: bool = False, kinds=None, padding=1,
                  exchange: str = "auto", argname: str = "k", caller: str = "pirfft3d",
                  chunks=1, pipeline: bool | str = False) -> Plan:
    """Plan for the inverse transform of k (k-space, global last axes in `layout` order).

    `s` is the spectrum's real-space shape N = (X, Y, Z) (the output is padding x N); None
    means k is not padded for the mesh (not with "rfft").  Also validates `s` against k for the
    frequency helpers.
    """
    kinds, padding, chunks, shape = _checked_args(k, argname, norm=norm, layout=layout,
                                                  kinds=kinds, real=real, padding=padding,
                                                  chunks=chunks, pipeline=pipeline)
    real_dtype, k_dtype = _k_dtypes(k.dtype, kinds, argname)
    mesh, deferred = batch_mesh(k, shape, find_mesh(k, mesh), argname)
    if s is None:
        if kinds[2] == "rfft":
            raise ValueError(f"`s` (the real-space shape (X, Y, Z)) is required for {caller}")
        modes = _xyz(shape[-3:], layout)
    else:
        modes = _check_s(s)
    _check_lengths(modes, kinds, "s")
    plan = Plan(None, (None, None), (1, 1), shape[:-3], _grid_of(modes, padding), kinds, modes,
                layout, norm or "backward", real_dtype, k_dtype, exchange)
    plan = _placed(plan, mesh, deferred, _padded_for(k, mesh, deferred), False, argname)
    check_k_shape(plan, shape[-3:], argname)
    return _with_chunks(plan, chunks, pipeline)


def check_k_shape(plan: Plan, k_last3, argname: str = "k") -> None:
    """A spectrum's last three axes must be the plan's, exact or padded for the mesh."""
    if tuple(k_last3) not in {plan.k_shape, plan.exact_k_shape}:
        raise ValueError(
            f"`{argname}.shape[-3:]` = {tuple(k_last3)} does not fit the real-space shape `s` = "
            f"{plan.modes} on this mesh: expected {plan.exact_k_shape} (exact) or "
            f"{plan.k_shape} (padded) in the {plan.layout} layout"
        )


def _check_s_split(grid, pdims, axes, modes) -> None:
    problem = split_problem(grid, pdims, axes)
    if problem is None:
        return
    index, why = problem
    if tuple(grid) == tuple(modes):
        raise ValueError(f"`s[{index}]` {why}; `s` = {tuple(modes)}")
    raise ValueError(f"the padded grid {tuple(grid)} (`s` = {tuple(modes)} times `padding`): "
                     f"axis {index} {why}")


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
