"""The distributed transforms: shard_map bodies that alternate local FFTs and exchanges.

Data path of the forward pencil transform on a mesh (a, b) of sizes (Pa, Pb), per device, with
B the flattened batch and lower-case sizes the local ones (x = X/Pa, y = Y/Pb, z = Zp/Pb,
y' = Yp/Pa):

    (B, x, y, Z)  --FFT Z-->  pad Z  --exchange over b-->  (B, x, z, Y)
                  --FFT Y-->  pad Y  --exchange over a-->  (B, y', z, X)  --FFT X-->  transposed
                                                          (B, X, y', z)   natural (one more move)

Every FFT runs over the last, contiguous axis.  A slab (Pb == 1) does one 2-D FFT over (Y, Z)
and a single exchange.  The path is the plan's stage list (`stages.py`), which also runs it:
forward in order, backward reversed with each stage's inverse; `partitioned.run` places it
in shard_map, on one device or in the compiler-partitioned primitive.
"""
from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np

from .._decomposition.mesh import is_tracer, typed_mesh
from .._exchange import ALGORITHMS
from .._processes import agree
from .._processes.memory import ENV as MEMORY_ENV, grid_text, setting as memory_setting
from .budget import fit_chunks, transform_name
from .partitioned import Transform, run
from .plan import Plan, plan_backward, plan_forward

CHUNKS_DEFAULT = "auto"

__all__ = ["pfft3d", "pifft3d", "prfft3d", "pirfft3d", "ptransform3d", "pitransform3d"]


def _run(plan: Plan, forward: bool, x) -> jax.Array:
    """The transform of `plan` on x: one runner (`partitioned.run`) for the three paths (one
    device, mesh known, mesh left to the compiler), each running the plan's stages."""
    plan = fit_chunks(plan, forward, x)  # too big for the devices? before XLA
    if plan.mesh is None:
        if is_tracer(x):  # under jit with an Auto mesh: the partitioner will tell the mesh
            _check_traced_without_mesh(plan.exchanges)
        else:
            _check_one_device(x)
    return run(Transform(plan, forward, tuple(np.shape(x))), x, plan.mesh)


def agree_on(mesh, what: str, arguments: dict, decisions: dict) -> None:
    """Where `mesh` holds the devices of several processes, the same `decisions` on every
    process, else one `DifferentPlansError` on every process (`agree.same`: one exchange),
    before anything else is asked of them.  The memory limit each process was given
    (`PENCILFFT_MEMORY_LIMIT`, as read) is compared too: the chunk count follows from it, the
    detected free memory (the least over the processes, `agree.least`) and the plan; so does
    a refusal (`MemoryLimitError`).  `arguments`: what the user gave, by the names the user
    knows (`x.shape`, `norm`, `chunks`), which the message leads with where they differ."""
    if not agree.spans_processes(mesh):
        return
    try:
        limit = memory_setting()
    except ValueError as e:  # raised by the memory check after, once every process has compared
        limit = f"invalid: {e}"
    agree.same({MEMORY_ENV: limit, **decisions}, what,
               settings={MEMORY_ENV: os.environ.get(MEMORY_ENV, "(not set)")},
               arguments=arguments)


def array_arguments(x, argname: str) -> dict:
    """An array argument as the user knows it: its global shape, dtype, kind and split."""
    if is_tracer(x):
        sharding = getattr(jax.typeof(x), "sharding", None)
    else:
        sharding = getattr(x, "sharding", None)
    spec = sharding.spec if isinstance(sharding, jax.sharding.NamedSharding) else None
    return {f"{argname}.shape": tuple(np.shape(x)), f"{argname}.dtype": np.dtype(x.dtype),
            f"type({argname})": type(x).__name__, f"{argname}.sharding": spec}


def _agreed(plan: Plan, forward: bool, x, argname: str, given: dict) -> None:
    """`agree_on` for a plan of the 3-D transforms: compared, the transform and all of its plan
    (`agree.plan_decisions`: shapes, dtypes, mesh, kinds, norm, layout, padding, chunks, the
    exchanges chosen from the handlers each process could build), before the input is cast
    or padded.  Left out: the FFT kernel and the threads, which change no exchange (FFTW's
    and XLA's FFTs, on any number of threads, take part in the same ones)."""
    mesh = plan.mesh if plan.mesh is not None else typed_mesh(x)
    if not agree.spans_processes(mesh):
        return
    name = transform_name(plan, forward)
    agree_on(mesh, f"{name} of a {grid_text(plan.real_shape, plan.batch, plan.real_dtype)}",
             {"function": f"pencilfft.{name}", **array_arguments(x, argname),
              **{k: v for k, v in given.items() if v is not None}, "mesh": mesh},
             {"transform": name, **agree.plan_decisions(plan, x)})


def _check_traced_without_mesh(exchanges) -> None:
    """Refuse, at the call, an exchange that cannot run in the compiler-partitioned transform
    (rather than from inside XLA's partitioner, which reports it as an internal error)."""
    for name in dict.fromkeys(exchanges):
        why = ALGORITHMS[name].unavailable(None, jax.default_backend())
        if why is not None:
            raise ValueError(f"`exchange`={name!r} cannot run here: {why}")


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
    return x.astype(dtype) if isinstance(x, jax.Array) or is_tracer(x) else np.asarray(x, dtype)


def _forward(x, kinds, norm, padding, layout, mesh, exchange, chunks, pipeline) -> jax.Array:
    _refuse_placeholder(x, "x")
    plan = plan_forward(x, norm=norm, layout=layout, mesh=mesh, kinds=kinds, padding=padding,
                        exchange=exchange, chunks=chunks, pipeline=pipeline)
    _agreed(plan, True, x, "x", {"kinds": kinds, "norm": norm, "layout": layout,
                                 "padding": padding, "exchange": exchange, "chunks": chunks,
                                 "pipeline": pipeline})
    return _run(plan, True, _cast(x, plan.real_dtype))


def _backward(k, kinds, s, norm, padding, layout, mesh, exchange, chunks, pipeline,
              caller) -> jax.Array:
    _refuse_placeholder(k, "k")
    plan = plan_backward(k, s, norm=norm, layout=layout, mesh=mesh, kinds=kinds,
                         padding=padding, exchange=exchange, caller=caller, chunks=chunks,
                         pipeline=pipeline)
    _agreed(plan, False, k, "k", {"kinds": kinds, "s": s, "norm": norm, "layout": layout,
                                  "padding": padding, "exchange": exchange, "chunks": chunks,
                                  "pipeline": pipeline})
    k = _cast(k, plan.k_dtype)
    if tuple(np.shape(k)[-3:]) != plan.k_shape:  # an exact (unpadded) spectrum: pad it here
        pads = [(0, 0)] * (np.ndim(k) - 3) + [(0, p - n) for p, n in zip(plan.k_shape, np.shape(k)[-3:])]
        k = jnp.pad(jnp.asarray(k), pads)
    return _run(plan, False, k)


_PADDING_DOC = """padding: dealiasing (mpi4py-fft's `padding`): one factor or one per axis (X, Y, Z),
        e.g. 1.5 for the 3/2 rule; only on Fourier axes.  The forward transform takes the
        padded grid (padding x N points per axis) and returns the N-mode spectrum (the
        highest frequencies dropped, scaled so that it is what an N-point transform of a
        band-limited field gives); the inverse takes the N-mode spectrum (`s` = N) and returns
        the field on the padded grid.  The padding happens between the stages: no device
        holds more than its block of the padded grid."""


def pfft3d(x, norm: str | None = "backward", *, layout: str = "transposed", mesh=None,
           exchange: str = "auto", padding=1, chunks=CHUNKS_DEFAULT,
           pipeline="auto") -> jax.Array:
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
      exchange: "auto" (default), "alltoall", "pairwise", "mpi", "local" or "mixed": how
        blocks move between devices (same result; `_exchange.ALGORITHMS` says what "auto"
        picks).  "mpi": MPI inside XLA, CPU processes under mpirun or srun; "local": the CPU
        devices of one process, through shared memory; "mixed": several processes of several
        CPU devices each, "local" inside processes and "mpi" between them (docs: Choosing a
        CPU layout).
      %s
      %s

    Returns:
      The k-space array, global shape (..., Y', Z', X) or (..., X, Y', Z') where Y' = Y and
      Z' = Z unless the mesh does not divide them: then they are zero-padded at their end to
      the next multiple of Pa (Y) and Pb (Z), and slicing them back gives exactly `fftn(x)`.

    Raises:
      ValueError: a grid the mesh cannot split in real space (X by Pa, Y by Pb), a bad `norm`,
        `layout`, `padding` or `chunks`, an `exchange` that cannot run here; each names the
        argument and what was expected.
      TypeError: `x` is not an array (a `jax.ShapeDtypeStruct` too: use `jax.eval_shape`).
      MemoryLimitError: the transform cannot fit in the devices' memory.

    Example:
      On a 4x2 mesh a (64, 64, 64) grid is held as (16, 32, 64) blocks; its spectrum, in the
      transposed layout, as (16, 32, 64) blocks of the global (Y, Z, X) array:

      >>> mesh = jax.make_mesh((4, 2), ("x", "y"))
      >>> with jax.set_mesh(mesh):
      ...     x = jax.random.normal(jax.random.key(0), (64, 64, 64),
      ...                           out_sharding=pencilfft.real_space_sharding(mesh))
      >>> k = pencilfft.pfft3d(x)
      >>> k.shape, k.sharding.spec, k.addressable_shards[0].data.shape
      ((64, 64, 64), P('x', 'y', None), (16, 32, 64))
      >>> bool(np.allclose(k, np.fft.fftn(np.asarray(x)).transpose(1, 2, 0), atol=1e-3))
      True
    """
    return _forward(x, None, norm, padding, layout, mesh, exchange, chunks, pipeline)


def prfft3d(x, norm: str | None = "backward", *, layout: str = "transposed", mesh=None,
            exchange: str = "auto", padding=1, chunks=CHUNKS_DEFAULT,
           pipeline="auto") -> jax.Array:
    """Distributed real-to-complex 3D FFT: the half spectrum Z//2+1 along Z.

    As `pfft3d`, for real `x`; the halved Z axis has length Z//2+1, zero-padded at its end to a
    multiple of Pb where needed.  Slicing it to Z//2+1 gives exactly `jnp.fft.rfftn(x)`
    (transposed to (..., Y, Z//2+1, X) in the transposed layout).  `chunks` and `pipeline` as in
    `pfft3d`.

    Example:
      >>> mesh = jax.make_mesh((4, 2), ("x", "y"))
      >>> x = jax.device_put(np.ones((32, 32, 32), np.float32), pencilfft.real_space_sharding(mesh))
      >>> k = pencilfft.prfft3d(x)     # Z//2+1 = 17 padded to 18, a multiple of Pb = 2
      >>> k.shape, k.dtype
      ((32, 18, 32), dtype('complex64'))
      >>> pencilfft.pirfft3d(k, s=(32, 32, 32)).shape
      (32, 32, 32)
    """
    return _forward(x, ("fft", "fft", "rfft"), norm, padding, layout, mesh, exchange, chunks,
                    pipeline)


def pifft3d(k, norm: str | None = "backward", *, s=None, layout: str = "transposed",
            mesh=None, exchange: str = "auto", padding=1, chunks=CHUNKS_DEFAULT,
            pipeline="auto") -> jax.Array:
    """Inverse of `pfft3d`: k-space array in `layout` -> real-space (..., X, Y, Z).

    Args:
      k: global k-space array, (..., Y, Z, X) for "transposed" or (..., X, Y, Z) for "natural",
        in any sharding (resharded to pencilfft's k-space sharding first).
      s: the real-space shape (X, Y, Z) of the spectrum.  Required when `k` is zero-padded (see
        `pfft3d`); None means `k` is the exact spectrum.
      padding: as in `pfft3d`: the output is the padded grid, padding x `s` points.
      chunks, pipeline: as in `pfft3d`.
    Returns a complex array of global shape (..., X, Y, Z) split P(a, b) over (X, Y).

    Raises:
      ValueError: `k`'s shape fits neither the exact nor the padded spectrum of `s` on this mesh,
        or an argument as in `pfft3d`.

    Example:
      >>> mesh = jax.make_mesh((4, 2), ("x", "y"))
      >>> x = jax.device_put(np.ones((32, 32, 32), np.complex64), pencilfft.real_space_sharding(mesh))
      >>> y = pencilfft.pifft3d(pencilfft.pfft3d(x))
      >>> y.shape, y.sharding.spec, bool(jnp.allclose(y, x))
      ((32, 32, 32), P('x', 'y', None), True)
    """
    return _backward(k, None, s, norm, padding, layout, mesh, exchange, chunks, pipeline,
                     "pifft3d")


def pirfft3d(k, s, norm: str | None = "backward", *, layout: str = "transposed",
             mesh=None, exchange: str = "auto", padding=1, chunks=CHUNKS_DEFAULT,
             pipeline="auto") -> jax.Array:
    """Inverse of `prfft3d`: half spectrum -> real array of global shape (..., X, Y, Z) = s.

    `s` (required) is the real-space shape (X, Y, Z): Z cannot be recovered from Z//2+1.
    Padded entries of `k` are ignored.  With `padding`, the output is padding x `s` points;
    `chunks` and `pipeline` as in `pfft3d`.

    Raises:
      ValueError: `s` missing or not fitting `k`'s shape on this mesh.

    Example:
      >>> mesh = jax.make_mesh((4, 2), ("x", "y"))
      >>> x = jax.device_put(np.ones((32, 32, 30), np.float32), pencilfft.real_space_sharding(mesh))
      >>> y = pencilfft.pirfft3d(pencilfft.prfft3d(x), s=x.shape)   # Z = 30 even: 16 planes
      >>> y.shape, y.dtype, bool(jnp.allclose(y, x))
      ((32, 32, 30), dtype('float32'), True)
    """
    return _backward(k, ("fft", "fft", "rfft"), s, norm, padding, layout, mesh, exchange,
                     chunks, pipeline, "pirfft3d")


def ptransform3d(x, kinds, norm: str | None = "backward", *, padding=1,
                 layout: str = "transposed", mesh=None, exchange: str = "auto",
                 chunks=CHUNKS_DEFAULT, pipeline="auto") -> jax.Array:
    """Distributed 3D transform with a kind per axis: FFTs, DCTs and DSTs in any combination.

    Args:
      x: as in `pfft3d` (global (..., X, Y, Z), the same splits).
      kinds: the transform along (X, Y, Z), each one of "fft", "rfft" (Z only, real input: the
        half spectrum, as `prfft3d`), "dct1".."dct4", "dst1".."dst4" (scipy.fft's
        definitions), e.g. ("dct2", "fft", "fft") for a channel with walls along X.
      norm: "backward" (default), "ortho" or "forward", as scipy.fft's, applied per axis.
      %s
      layout, mesh, exchange, chunks, pipeline: as in `pfft3d`.

    Returns:
      The spectrum in the layouts, shardings and mesh padding of `pfft3d`.  Real input stays
      real when every kind is a DCT or DST; with an "fft" the input is taken as complex.

    Raises:
      ValueError: a kind that is not in the list, "rfft" along X or Y, `padding` on a cosine or
        sine axis, an axis too short for its kind, or an argument as in `pfft3d`.
      TypeError: `kinds` not a sequence of 3 strings; complex input to "rfft".

    Example:
      A channel with walls along X (DCT-II) and periodic Y, Z; real input stays real only when
      every kind is a DCT or DST:

      >>> mesh = jax.make_mesh((4, 2), ("x", "y"))
      >>> x = jax.device_put(np.ones((32, 32, 32), np.float32), pencilfft.real_space_sharding(mesh))
      >>> k = pencilfft.ptransform3d(x, ("dct2", "fft", "fft"))
      >>> k.shape, k.dtype
      ((32, 32, 32), dtype('complex64'))
      >>> pencilfft.ptransform3d(x, ("dst1",) * 3).dtype
      dtype('float32')
    """
    return _forward(x, kinds, norm, padding, layout, mesh, exchange, chunks, pipeline)


def pitransform3d(k, kinds, norm: str | None = "backward", *, s=None, padding=1,
                  layout: str = "transposed", mesh=None, exchange: str = "auto",
                  chunks=CHUNKS_DEFAULT, pipeline="auto") -> jax.Array:
    """Inverse of `ptransform3d` with the same `kinds` and `norm`: spectrum -> real space.

    `s` is the real-space shape (X, Y, Z) of the spectrum: required with "rfft" or when `k`
    is zero-padded for the mesh.  With `padding` the output is padding x `s` points.  This is
    the inverse, not the adjoint (they differ for unnormalized DCTs and DSTs; `jax.grad` uses
    the adjoint).  `layout`, `mesh`, `exchange`, `chunks`, `pipeline`: as in `pfft3d`.

    Example:
      >>> mesh = jax.make_mesh((4, 2), ("x", "y"))
      >>> x = jax.device_put(np.ones((32, 32, 32), np.float32), pencilfft.real_space_sharding(mesh))
      >>> kinds = ("dct2", "dct2", "dct2")
      >>> y = pencilfft.pitransform3d(pencilfft.ptransform3d(x, kinds), kinds)
      >>> y.shape, bool(jnp.allclose(y, x, atol=1e-5))
      ((32, 32, 32), True)
    """
    return _backward(k, kinds, s, norm, padding, layout, mesh, exchange, chunks, pipeline,
                     "pitransform3d")


_CHUNKS_DOC = """chunks: an int >= 1 or "auto" (default): each stage (FFT, exchange, local moves)
        runs in this many pieces, each written back in place, so that a device holds about
        1 + 2/chunks blocks (donated input) or 2 + 2/chunks (input kept) instead of 3-4
        (`chunks.py`; docs/howto/memory.md: the time it costs or saves).  The same values.
        "auto" is 1 unless the memory check finds that the unchunked transform does not fit
        (then the fewest pieces of 2, 4, ..., 64 that fit, under jax.jit even if the input
        is not donated); 1 under jax.jit with no mesh in scope.
      pipeline: "auto" (default), True or False: run the pieces of a stage whose exchange
        crosses processes (or, on GPUs, devices) pipelined, one piece's exchange in flight
        while the next piece's FFT and the last one's unpack run, for one more piece in
        memory than the chunked stage (with the FFTW kernel; 4 with XLA's FFT); the same
        values.  "auto" takes it on CPU processes that exchange through MPI
        between nodes (`exchange` "mpi", or "mixed" along a mesh axis spanning processes on
        several hosts) with blocks of at least 8 MiB, in pieces of about 512 KiB (16 to 128
        of them; docs/howto/pipelining.md); True also with XLA's collectives (GPUs), where XLA
        can then overlap them; False: never."""

pfft3d.__doc__ %= (_PADDING_DOC, _CHUNKS_DOC)
ptransform3d.__doc__ %= _PADDING_DOC
