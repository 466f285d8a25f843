"""Every local FFT as one primitive, run by FFTW on CPU devices (the `fftw` extra), else by XLA.

`fft(x, fft_type, axes, norm, sizes)` and `r2r(x, kind, axis, norm, forward)` are what the
stages (`stages.Fft`) call on their per-device blocks.  They bind `local_fft_p`
("pencilfft_local_fft"), whose params say everything about the transform:

* on CPU it lowers to a custom call of `fftw.cc` (FFTW's guru interface: transformed axes
  anywhere, the others "howmany" dimensions, so no transposes; the norm is applied inside);
* on every other platform, and on CPU when the kernel is unavailable, it lowers to exactly the
  jnp.fft (or `r2r`) code the stages ran before, so programs for GPUs are today's;
* it is linear: its jvp is itself and its transpose is another `local_fft_p` (jax's lax.fft
  rules, with the norm carried along), its batching rule adds a leading howmany axis, and its
  abstract value keeps the input's sharding and varying axes (Explicit meshes, shard_map).

`window(x, offset, ...)` (`fftw_window_p`) is the pipelined stages' own: a complex FFT or a
transposed copy of one piece of a block, read from it and written into it in place at an offset
the program computes (fftw.cc `ImplWindow`), so that a piece needs no buffer of its own; not
differentiable (the pipelined stages differentiate as the plain ones), batched with a leading
axis, and lowered to XLA's slice, FFT and update where the kernel is not chosen.

Configuration, in one place (read at every use, so a test may change it between traces):
PENCILFFT_FFT_KERNEL = "auto" (default: FFTW where the `fftw` extra is installed, silently XLA
where it is not), "fftw" (FFTW, and a warning when it cannot be had) or "xla" (the primitive is
not even bound: the programs are exactly those without the kernel); PENCILFFT_FFTW_DIR = a site's
FFTW (a folder, or a prefix with lib/ or lib64/, holding libfftw3, libfftw3f and their _omp
libraries; default: pyFFTW's wheel's, whose FFTW 3.3.5 has SSE2 and AVX codelets only): the
kernel is built against it, and one that lacks a library is a warning and XLA's FFT, never a
silent fallback; PENCILFFT_FFTW_PLANNER =
"measure" (default, see `PLANNERS`) or "estimate"; PENCILFFT_FFTW_HUGE_PAGES = "1" (default: the
kernel asks for transparent huge pages on its large output buffers, fftw.cc `HugePages`)
or "0"; PENCILFFT_THREADS (`_native.threads`: the cores of the process, default its affinity, shared
by its CPU devices: each call runs FFTW's threaded plans on `_threads.threads_per_device()`
threads, baked into the program when it is lowered); PENCILFFT_MALLOC (`_native.malloc`, applied when
the first CPU program is lowered).  A kernel that fails to build or load falls
back to XLA's FFT with one warning per process, never an error.

Global state: the built library and its registration (`_library`, cached once per process), and
in the C++ handler FFTW's plans (cached per shape, axes, kind, dtype, alignment and threads).
"""
from __future__ import annotations

import ctypes
import functools
import glob
import math
import os
import pathlib
import re
import warnings

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir

from .._native import build as _native, malloc as _malloc, threads as _threads
from . import r2r as _r2r, xla_fft

__all__ = ["fft", "permute", "r2r", "kernel", "describe", "plan_count", "local_fft_p", "TARGET"]

TARGET = "pencilfft_fftw"  # the FFI target name: what a CPU program's custom call names
WINDOW_TARGET = "pencilfft_fftw_window"  # a piece of a block, in place (`window`)
KERNELS = ("auto", "fftw", "xla")
FFTW_DIR = "PENCILFFT_FFTW_DIR"  # a site's FFTW (a folder holding its four shared libraries)
# FFTW planner flags.  MEASURE is the default: ESTIMATE's plans for a transform along a strided
# axis (a 2-D FFT's first axis, the pencils' middle one) ran 3-4x slower than MEASURE's on
# (128, 256, 256) complex64 (193 vs 44 ms for axes (1, 2), 136 vs 38 ms for axis 1; pyFFTW, one
# core), while along the contiguous axis both are equal.  MEASURE costs up to a few seconds per
# new shape, once per process (per shape, axes, dtype and alignment); blocks over 2 GiB are
# estimated (MEASURE plans on stand-in arrays of the block's size).
PLANNERS = {"measure": 0, "estimate": 1 << 6}
FFT_TYPES = ("fft", "ifft", "rfft", "irfft", "r2r")

# FFTW's r2r kinds (fftw3.h's fftw_r2r_kind): DCT-I..IV = REDFT00, 10, 01, 11; DST = RODFT...
_FFTW_R2R = {"dct1": 3, "dct2": 5, "dct3": 4, "dct4": 6,
             "dst1": 7, "dst2": 9, "dst3": 8, "dst4": 10}
_SWAP_NORM = {"backward": "forward", "ortho": "ortho", "forward": "backward"}


# ----------------------------------------------------------------------------------------------
# Configuration and the library


def _setting(name: str, choices, default: str) -> str:
    value = os.environ.get(name, "").strip().lower() or default
    if value not in choices:
        raise ValueError(f"environment variable {name} must be one of {', '.join(choices)}; "
                         f"got {value!r}")
    return value


def kernel() -> str:
    """The kernel local FFTs on CPU devices use now: "fftw" or "xla" (builds it on first call)."""
    setting = _setting("PENCILFFT_FFT_KERNEL", KERNELS, "auto")
    if setting == "xla":
        return "xla"
    if setting == "auto" and _found() is None:
        return "xla"  # the plain install: XLA's FFT, as documented, no warning
    lib = _library(_dir_setting())
    if isinstance(lib, str):
        _warn_once(lib)
        return "xla"
    return "fftw"


def planner() -> str:
    return _setting("PENCILFFT_FFTW_PLANNER", tuple(PLANNERS), "measure")


def describe() -> str:
    """One line for `pencilfft check` and the benchmarks: which kernel runs local FFTs on CPU."""
    if kernel() == "fftw":
        folder, libs = fftw_libraries()
        version = _version_of(libs[1])
        unused = _unused_simd(version)
        hint = (f"; this CPU's {' and '.join(u.upper() for u in unused)} are not in this "
                f"FFTW's codelets: {FFTW_DIR} takes a build that has them" if unused else "")
        return (f"fftw ({version} from {folder}, planner {planner()}, "
                f"{_threads.threads_per_device()} thread(s) per call{hint})")
    setting = _setting("PENCILFFT_FFT_KERNEL", KERNELS, "auto")
    why = ("PENCILFFT_FFT_KERNEL=xla" if setting == "xla" else
           "the fftw extra is not installed" if _found() is None else
           "the FFTW kernel failed to build, see the warning")
    return f"xla ({why})"


_STEMS = ("libfftw3", "libfftw3f", "libfftw3_omp", "libfftw3f_omp")


def _libraries_in(folder: pathlib.Path) -> list[str] | None:
    """[libfftw3, libfftw3f, libfftw3_omp, libfftw3f_omp] in `folder`, or None where one lacks."""
    libs = [sorted(glob.glob(str(folder / f"{stem}-*.so*"))
                   + glob.glob(str(folder / f"{stem}.so*"))) for stem in _STEMS]
    return [found[0] for found in libs] if all(libs) else None


def _site_libraries(setting: str) -> tuple[str, list[str]] | str:
    """The FFTW that PENCILFFT_FFTW_DIR names (its folder, its lib/ or lib64/), or why not."""
    root = pathlib.Path(setting).expanduser()
    for folder in (root, root / "lib", root / "lib64"):
        libs = _libraries_in(folder)
        if libs is not None:
            return str(folder), libs
    return (f"{FFTW_DIR}={setting!r} holds no complete FFTW (nor its lib/ or lib64/): the "
            f"kernel needs {', '.join(s + '.so' for s in _STEMS)}, which FFTW builds with "
            f"--enable-shared --enable-openmp, once with and once without --enable-float")


@functools.cache
def _find_libraries(setting: str = "") -> tuple[str, list[str]] | str | None:
    """(folder, [libfftw3, libfftw3f, libfftw3_omp, libfftw3f_omp]): the FFTW that
    PENCILFFT_FFTW_DIR names (`setting`; why not, as a string, where it holds none), else the
    one bundled with pyFFTW's wheel, else None (a pyFFTW built against a system FFTW, without
    the wheel's pyfftw.libs/, is not looked into).  The _omp libraries are FFTW's threaded
    planner (OpenMP): the kernel's plans use `_threads.threads_per_device()` threads."""
    if setting:
        return _site_libraries(setting)
    try:
        import pyfftw
    except ImportError:
        return None
    site = pathlib.Path(pyfftw.__file__).resolve().parent.parent
    # auditwheel names the folder after the distribution: pyfftw.libs or pyFFTW.libs by wheel
    folder = next((site / name for name in ("pyfftw.libs", "pyFFTW.libs")
                   if (site / name).is_dir()), site / "pyfftw.libs")
    libs = _libraries_in(folder)
    return None if libs is None else (str(folder), libs)


def _dir_setting() -> str:
    return os.environ.get(FFTW_DIR, "").strip()


def _found() -> tuple[str, list[str]] | str | None:
    return _find_libraries(_dir_setting())


def fftw_libraries(setting: str | None = None) -> tuple[str, list[str]]:
    """(folder, libraries) of the FFTW the kernel links: `setting`'s (PENCILFFT_FFTW_DIR's when
    None), or the BuildError that says why there is none."""
    found = _found() if setting is None else _find_libraries(setting)
    if found is None:
        raise _native.BuildError("no FFTW libraries: pyfftw's wheel (pip install "
                                 "'pencilfft[fftw]') bundles them in pyfftw.libs/, or name a "
                                 f"site's FFTW with {FFTW_DIR}")
    if isinstance(found, str):
        raise _native.BuildError(found)
    return found


@functools.cache
def _version_of(libfftw3f: str) -> str:
    """FFTW's own version string, which names its SIMD codelets ("fftw-3.3.5-sse2-avx")."""
    try:
        lib = ctypes.CDLL(libfftw3f)
        return ctypes.cast(ctypes.addressof(ctypes.c_char.in_dll(lib, "fftwf_version")),
                           ctypes.c_char_p).value.decode()
    except (OSError, ValueError, AttributeError):
        return "FFTW of unknown version"


def _unused_simd(version: str) -> list[str]:
    """The SIMD sets this CPU has and FFTW's codelets do not use (from its version string)."""
    try:
        flags = set(re.search(r"^flags\s*:(.*)$", pathlib.Path("/proc/cpuinfo").read_text(),
                              re.M).group(1).split())
    except (OSError, AttributeError):
        return []
    built = set(version.split("-")[2:])
    return [name for flag, name in (("avx2", "avx2"), ("avx512f", "avx512"))
            if flag in flags and name not in built]


@functools.cache
def _library(setting: str = ""):
    """The built, registered kernel library (of the FFTW that `setting`, PENCILFFT_FFTW_DIR,
    names), or why it cannot be had (a string)."""
    try:
        folder, libs = fftw_libraries(setting)
        lib = _native.register(_native.load(pathlib.Path(__file__).with_name("fftw.cc"), library_dirs=[folder], link=libs),
                               {TARGET: "PencilfftFftw", WINDOW_TARGET: "PencilfftFftwWindow"})
    except (_native.BuildError, AttributeError, OSError) as e:
        return str(e)
    return lib


def plan_count() -> int:
    """How many FFTW plans the kernel holds in this process (0 without the kernel)."""
    lib = _library(_dir_setting()) if _found() is not None else None
    if lib is None or isinstance(lib, str):
        return 0
    lib.PencilfftFftwPlanCount.restype = ctypes.c_int64
    return int(lib.PencilfftFftwPlanCount())


@functools.cache
def _warn_once(why: str) -> None:
    warnings.warn(f"pencilfft: the FFTW kernel is unavailable, local FFTs use XLA's (slower "
                  f"on CPU; PENCILFFT_FFT_KERNEL=xla silences this): {why}", RuntimeWarning,
                  stacklevel=3)


# ----------------------------------------------------------------------------------------------
# What the stages call


def _scale(norm: str, n: int, forward: bool) -> float:
    """jnp.fft's normalisation factor for a transform of n points in that direction."""
    if norm == "ortho":
        return 1 / math.sqrt(n)
    return 1 / n if (norm == "forward") == forward else 1.0


def _extra_factor(fft_type: str, norm: str, sizes: tuple[int, ...], extra: int) -> float:
    """What `extra` more points change in the normalisation (1.0 where they change nothing)."""
    if extra == 1 or fft_type == "r2r":
        return 1.0
    n, forward = math.prod(sizes), fft_type in ("fft", "rfft")
    return _scale(norm, n * extra, forward) / _scale(norm, n, forward)


def _xla_fft(x, *, fft_type: str, axes: tuple[int, ...], norm: str, sizes: tuple[int, ...],
             kind: str | None = None, order: tuple[int, ...] | None = None, extra: int = 1):
    """What the stages ran before the kernel: jnp.fft's n-dimensional calls (`xla_fft`: with
    the FFT's layouts pinned on CPUs), `r2r`'s forward, then the output's axes in `order`
    (None: as they are)."""
    y = _xla_fft_only(x, fft_type=fft_type, axes=axes, norm=norm, sizes=sizes, kind=kind)
    factor = _extra_factor(fft_type, norm, sizes, extra)
    if factor != 1.0:
        y = y * jnp.asarray(factor, y.real.dtype)
    return y if order is None else jnp.transpose(y, order)


def _xla_fft_only(x, *, fft_type, axes, norm, sizes, kind):
    if not axes:  # (`permute`'s c2c over no axes: jnp.fft.fftn would read () as every axis)
        return x
    if fft_type in xla_fft.FFT_TYPES:  # jnp.fft's, its layouts pinned on CPUs (`xla_fft`)
        return xla_fft.fftn(x, fft_type, axes, norm, sizes if fft_type == "irfft" else None)
    return _r2r.forward(x, kind, axes[0], norm)


def _configure_malloc_on_cpu() -> None:
    """The allocator settings (`_native.malloc`) where the primitive, whose CPU lowering makes them,
    is not bound: with XLA's kernel, the fresh buffers fault just the same."""
    if jax.default_backend() == "cpu":
        _malloc.configure()


def fft(x: jax.Array, fft_type: str, axes: tuple[int, ...], norm: str,
        sizes: tuple[int, ...], order: tuple[int, ...] | None = None,
        extra: int = 1) -> jax.Array:
    """jnp.fft.{fftn, ifftn, rfftn, irfftn}(x, axes=axes, norm=norm) of a per-device block,
    then jnp.transpose(., order) if `order` is given: FFTW writes the output transposed
    through its strides, no pass of its own (the one-device transform's layout).

    `sizes`: the real-space lengths of `axes` (irfft's output, the others' input).  The half
    axis of rfft/irfft is `axes[-1]`.  `extra`: more points the normalisation counts, those
    of the other call of a transform split in two (which runs unscaled): one scaling instead
    of two."""
    x = jnp.asarray(x)
    axes = tuple(a % x.ndim for a in axes)
    if order is not None:
        order = tuple(int(a) % x.ndim for a in order)
        if sorted(order) != list(range(x.ndim)):
            raise ValueError(f"order {order} is not a permutation of the {x.ndim} axes")
        if order == tuple(range(x.ndim)):
            order = None
    if _setting("PENCILFFT_FFT_KERNEL", KERNELS, "auto") == "xla":
        _configure_malloc_on_cpu()
        return _xla_fft(x, fft_type=fft_type, axes=axes, norm=norm, sizes=tuple(sizes),
                        order=order, extra=extra)
    if fft_type != "irfft":  # the input's lengths (what the normalisation counts)
        sizes = tuple(x.shape[a] for a in axes)
    if fft_type in ("fft", "ifft"):
        x = x.astype(jnp.result_type(x.dtype, jnp.complex64))
    elif fft_type == "rfft":
        x = x.astype(jnp.result_type(x.dtype, jnp.float32))
    else:
        x = x.astype(jnp.result_type(x.dtype, jnp.complex64))
        if x.shape[axes[-1]] != sizes[-1] // 2 + 1:  # irfftn would crop or pad: not ours
            return _xla_fft(x, fft_type=fft_type, axes=axes, norm=norm, sizes=tuple(sizes),
                            order=order, extra=extra)
    return local_fft_p.bind(x, fft_type=fft_type, axes=axes, norm=norm, sizes=tuple(sizes),
                            kind=None, order=order, extra=int(extra))


def permute(x: jax.Array, order: tuple[int, ...]) -> jax.Array:
    """jnp.transpose(x, order); a complex block on CPUs through FFTW's rank-0 plan, a copy
    that FFTW tiles for the cache.  XLA's CPU transpose of a (128, 32768) complex64 slab
    took 41 ms where FFTW's took 14 and a plain copy 6 (one core; the MPI exchange's pack,
    benchmarks/RESULTS.md, issue 55).  Elsewhere (real data, other platforms, the kernel
    unavailable) the transpose itself."""
    x = jnp.asarray(x)
    order = tuple(int(a) % x.ndim for a in order)
    if order == tuple(range(x.ndim)):
        return x
    if not jnp.issubdtype(x.dtype, jnp.complexfloating) or kernel() != "fftw":
        return jnp.transpose(x, order)
    return fft(x, "fft", (), "backward", (), order)


def r2r(x: jax.Array, kind: str, axis: int, norm: str, forward: bool) -> jax.Array:
    """scipy.fft.dct/dst (forward) or idct/idst of kind 'dct<t>'/'dst<t>' along `axis`."""
    if not forward:  # scipy: the inverse is the inverse type with the opposite norm
        kind, norm = _r2r.INVERSE_KIND[kind], _r2r.INVERSE_NORM[norm]
    _r2r.check(kind, norm)
    x = jnp.asarray(x)
    if not jnp.issubdtype(x.dtype, jnp.inexact):
        x = x.astype(float)
    axis = axis % x.ndim
    if (_setting("PENCILFFT_FFT_KERNEL", KERNELS, "auto") == "xla"
            or x.shape[axis] < _r2r.min_length(kind)):
        _configure_malloc_on_cpu()
        return _r2r.forward(x, kind, axis, norm)  # (and its error for too short an axis)
    return local_fft_p.bind(x, fft_type="r2r", axes=(axis,), norm=norm,
                            sizes=(x.shape[axis],), kind=kind, order=None, extra=1)


# ----------------------------------------------------------------------------------------------
# The primitive


local_fft_p = Primitive("pencilfft_local_fft")


def _out_shape_dtype(shape, dtype, fft_type, axes, sizes, order=None):
    shape = list(shape)
    if fft_type == "rfft":
        shape[axes[-1]] = shape[axes[-1]] // 2 + 1
        dtype = jnp.result_type(dtype, jnp.complex64)
    elif fft_type == "irfft":
        for a, n in zip(axes, sizes):
            shape[a] = n
        dtype = jnp.finfo(dtype).dtype
    if order is not None:
        shape = [shape[a] for a in order]
    return tuple(shape), np.dtype(dtype)


def _abstract_eval(x, *, fft_type, axes, norm, sizes, kind, order, extra):
    shape, dtype = _out_shape_dtype(x.shape, x.dtype, fft_type, axes, sizes, order)
    # update() keeps the input's sharding (Explicit meshes) and varying manual axes (shard_map)
    return x.update(shape=shape, dtype=dtype, weak_type=False)


def _eager(primitive: Primitive):
    """The impl rule of a primitive reached eagerly (outside jit): run the one-primitive
    program."""
    def impl(*args, **params):
        return jax.jit(functools.partial(primitive.bind, **params))(*args)
    return impl


def _mask(t, axis: int, n: int, dtype):
    """jax's Hermitian weights along the half axis: 1 at DC (and Nyquist for even n), else 2."""
    m = t.shape[axis]
    w = np.full(m, 2.0)
    w[0] = 1.0
    if n % 2 == 0:
        w[-1] = 1.0
    shape = [1] * t.ndim
    shape[axis] = m
    return jnp.asarray(w.reshape(shape), dtype)


def _transpose(ct, x, *, fft_type, axes, norm, sizes, kind, order, extra):
    """jax's lax.fft transposes (jax/_src/lax/fft.py), normalisation carried in `norm`; an
    output written in `order` has its cotangent put back in the computed order first."""
    if type(ct) is ad.Zero:
        return (ad.Zero(x.aval),)
    if order is not None:
        ct = jnp.transpose(ct, tuple(int(i) for i in np.argsort(order)))
    params = dict(axes=axes, sizes=sizes, kind=None, order=None, extra=extra)
    if fft_type in ("fft", "ifft"):  # the DFT matrix is symmetric: the same transform
        return (local_fft_p.bind(ct, fft_type=fft_type, norm=norm, **params),)
    if fft_type == "rfft":  # an irfft of conj(ct) / mask, scaled as the rfft was
        ct = jnp.conj(ct) / _mask(ct, axes[-1], sizes[-1], ct.real.dtype)
        return (local_fft_p.bind(ct, fft_type="irfft", norm=_SWAP_NORM[norm], **params),)
    if fft_type == "irfft":
        out = local_fft_p.bind(ct, fft_type="rfft", norm=_SWAP_NORM[norm], **params)
        return (jnp.conj(out * _mask(out, axes[-1], sizes[-1], out.real.dtype)),)
    # r2r, D = (c/co) diag(g/go) O diag(h/ho) with O the orthogonal ("ortho") kind, whose
    # transpose is its inverse: D^T = (c/co) diag(h/ho) O^-1 diag(g/go).
    axis, n = axes[0], sizes[0]
    c, h, g = _r2r.weights(kind, n, norm)
    co, ho, go = _r2r.weights(kind, n, "ortho")
    shape = [1] * ct.ndim
    shape[axis] = n
    real = ct.real.dtype
    if not np.allclose(g, go):
        ct = ct * jnp.asarray((g / go).reshape(shape), real)
    out = local_fft_p.bind(ct, fft_type="r2r", axes=axes, norm="ortho", sizes=sizes,
                           kind=_r2r.INVERSE_KIND[kind], order=None, extra=1)
    return (out * jnp.asarray((c / co * h / ho).reshape(shape), real),)


def _batch(args, dims, *, axes, order, **params):
    (x,), (d,) = args, dims
    x = jnp.moveaxis(x, d, 0)
    order = None if order is None else (0, *(a + 1 for a in order))
    return local_fft_p.bind(x, axes=tuple(a + 1 for a in axes), order=order, **params), 0


def _default_lowering(ctx, x, **params):
    return mlir.lower_fun(functools.partial(_xla_fft, **params), multiple_results=False)(ctx, x)


def _fftw_usable(aval) -> bool:
    if 0 in aval.shape or aval.ndim == 0:
        return False
    dtype = np.dtype(aval.dtype)
    return dtype in (np.float32, np.float64, np.complex64, np.complex128) and kernel() == "fftw"


def _cpu_lowering(ctx, x, *, fft_type, axes, norm, sizes, kind, order, extra):
    _malloc.configure()  # a CPU program of pencilfft's: glibc keeps freed memory (`_malloc`)
    params = dict(fft_type=fft_type, axes=axes, norm=norm, sizes=sizes, kind=kind, order=order,
                  extra=extra)
    if not _fftw_usable(ctx.avals_in[0]):
        return _default_lowering(ctx, x, **params)
    return mlir.lower_fun(functools.partial(_fftw, **params), multiple_results=False)(ctx, x)


def _fftw(x, *, fft_type, axes, norm, sizes, kind, order, extra):
    """The CPU computation: weights (ortho DCT/DST ends only) around one FFTW call."""
    n = math.prod(sizes) * extra
    if fft_type != "r2r":
        code = {"fft": 0, "ifft": 0, "rfft": 1, "irfft": 2}[fft_type]
        return fftw_p.bind(x, code=code, sign=1 if fft_type == "ifft" else -1, axes=axes,
                           r2r_kinds=(0,), scale=_scale(norm, n, fft_type in ("fft", "rfft")),
                           sizes=sizes, order=order)
    assert order is None  # (r2r is never bound with an order)
    # FFTW's REDFT/RODFT are scipy's kinds under norm="backward" (2 sum h_n x_n trig, h the
    # half-weighted ends); other norms: y = c g_k sum h_n x_n trig = (c g_k / 2) FFTW(x h / h_b).
    axis = axes[0]
    c, h, g = _r2r.weights(kind, sizes[0], norm)
    _, hb, _ = _r2r.weights(kind, sizes[0], "backward")
    shape = [1] * x.ndim
    shape[axis] = sizes[0]
    real = x.real.dtype
    if not np.allclose(h, hb):
        x = x * jnp.asarray((h / hb).reshape(shape), real)
    y = fftw_p.bind(x, code=3, sign=0, axes=axes, r2r_kinds=(_FFTW_R2R[kind],), scale=c / 2,
                    sizes=sizes, order=None)
    if not np.allclose(g, 1.0):
        y = y * jnp.asarray(g.reshape(shape), real)
    return y


local_fft_p.def_abstract_eval(_abstract_eval)
local_fft_p.def_impl(_eager(local_fft_p))
ad.deflinear2(local_fft_p, _transpose)
batching.primitive_batchers[local_fft_p] = _batch
mlir.register_lowering(local_fft_p, _default_lowering)
mlir.register_lowering(local_fft_p, _cpu_lowering, platform="cpu")


# The FFI call itself: only ever bound inside `_cpu_lowering` (so never differentiated or
# batched), with the custom call's attributes as params.
fftw_p = Primitive("pencilfft_fftw")


def _fftw_abstract_eval(x, *, code, sign, axes, r2r_kinds, scale, sizes, order):
    fft_type = {0: "fft", 1: "rfft", 2: "irfft", 3: "r2r"}[code]
    shape, dtype = _out_shape_dtype(x.shape, x.dtype, fft_type, axes, sizes, order)
    return x.update(shape=shape, dtype=dtype, weak_type=False)


def _fftw_lowering(ctx, x, *, code, sign, axes, r2r_kinds, scale, sizes, order):
    # Out of place.  Aliasing the c2c/r2r output to the input (in place, no fresh output
    # buffer) was tried: XLA then adds copies where the input lives on, and tests/test_hlo.py
    # and test_memory_floor.py measured one more fusion and up to 0.9 blocks more at the peak.
    return jax.ffi.ffi_lowering(TARGET)(
        ctx, x, kind=np.int32(code), sign=np.int32(sign), axes=np.asarray(axes, np.int64),
        r2r_kinds=np.asarray(r2r_kinds, np.int64), scale=np.float64(scale),
        planner=np.int32(PLANNERS[planner()]),
        huge_pages=_setting("PENCILFFT_FFTW_HUGE_PAGES", ("1", "0"), "1") == "1",
        threads=np.int32(_threads.threads_per_device()),
        # the output buffer's axes as logical axes (identity: as computed)
        out_order=np.asarray(order if order is not None else range(len(ctx.avals_in[0].shape)),
                             np.int64))


fftw_p.def_abstract_eval(_fftw_abstract_eval)
mlir.register_lowering(fftw_p, _fftw_lowering, platform="cpu")


# A piece of a block, read or written in place at an offset the program computes (fftw.cc
# `ImplWindow`): the pipelined stages' pieces without a buffer of their own (pipeline.py).
fftw_window_p = Primitive("pencilfft_fftw_window")


def windows_usable(dtype) -> bool:
    """Whether `window` runs here: the FFTW kernel in use (CPUs), complex data."""
    return np.dtype(dtype) in (np.complex64, np.complex128) and kernel() == "fftw"


def window(x: jax.Array, offset: jax.Array, *, fft: tuple[str, str, tuple[int, ...]] | None,
           order: tuple[int, ...] | None, in_dims: tuple[int, ...], out_dims: tuple[int, ...],
           in_cut: int, out_cut: int, m: int, into: jax.Array | None = None) -> jax.Array:
    """A complex FFT of one piece (`fft`: its type, "fft" or "ifft", norm and axes; None:
    a copy), or its copy transposed (`order`, jnp.transpose's).  Shapes per device.

    x is read as `in_dims` (its own size); `in_cut` >= 0: the piece is the `m` entries of that
    axis from `offset` (an int32 scalar), else x whole.  The result is laid out as `out_dims`;
    `out_cut` >= 0: written at the same entries of that axis of `into` (or of x, in place) and
    returned as that buffer, with every other entry as it was; else a new array of `out_dims`.
    CPUs with the FFTW kernel only (`windows_usable`); not differentiable (the pipelined
    stages differentiate as the plain ones)."""
    if fft is None:
        sign, scale, axes = 1, 1.0, ()
    else:
        fft_type, norm, axes = fft
        n = math.prod(in_dims[a] for a in axes)
        sign, scale = (-1 if fft_type == "fft" else 1), _scale(norm, n, fft_type == "fft")
    rank = len(out_dims)
    order = tuple(range(rank)) if order is None else tuple(order)
    operands = (x, offset) if into is None else (x, offset, into)
    return fftw_window_p.bind(*operands, sign=sign, axes=tuple(axes), scale=float(scale),
                              order=order, in_dims=tuple(in_dims), out_dims=tuple(out_dims),
                              in_cut=in_cut, out_cut=out_cut, m=m)


def _window_abstract_eval(x, offset, *into, out_dims, out_cut, **params):
    if out_cut >= 0:
        return (into[0] if into else x).update(weak_type=False)
    return x.update(shape=tuple(out_dims), weak_type=False)


def _window_xla(x, offset, *into, sign, axes, scale, order, in_dims, out_dims, in_cut,
                out_cut, m):
    """`window` in XLA's operations: the piece sliced out, transformed and written back (the
    program traced while the FFTW kernel was chosen, lowered once it no longer is)."""
    piece = x.reshape(in_dims)
    if in_cut >= 0:
        piece = jax.lax.dynamic_slice_in_dim(piece, offset, m, axis=in_cut)
    if axes:
        piece = (jnp.fft.fftn(piece, axes=axes) if sign < 0
                 else jnp.fft.ifftn(piece, axes=axes, norm="forward"))
        piece = piece * jnp.asarray(scale, piece.real.dtype)
    piece = jnp.transpose(piece, order).astype(x.dtype)
    if out_cut < 0:
        return piece
    dest = into[0] if into else x
    out = jax.lax.dynamic_update_slice_in_dim(dest.reshape(out_dims), piece, offset, axis=out_cut)
    return out.reshape(dest.shape)


def _window_lowering(ctx, x, offset, *into, sign, axes, scale, order, in_dims, out_dims,
                     in_cut, out_cut, m):
    params = dict(sign=sign, axes=axes, scale=scale, order=order, in_dims=in_dims,
                  out_dims=out_dims, in_cut=in_cut, out_cut=out_cut, m=m)
    if not windows_usable(ctx.avals_in[0].dtype):
        return mlir.lower_fun(functools.partial(_window_xla, **params),
                              multiple_results=False)(ctx, x, offset, *into)
    _malloc.configure()
    aliases = None if out_cut < 0 else {2 if into else 0: 0}
    return jax.ffi.ffi_lowering(WINDOW_TARGET, operand_output_aliases=aliases)(
        ctx, x, offset, *into, sign=np.int32(sign), axes=np.asarray(axes, np.int64),
        scale=np.float64(scale), planner=np.int32(PLANNERS[planner()]),
        threads=np.int32(_threads.threads_per_device()), out_order=np.asarray(order, np.int64),
        in_dims=np.asarray(in_dims, np.int64), out_dims=np.asarray(out_dims, np.int64),
        in_cut=np.int64(in_cut), out_cut=np.int64(out_cut), m=np.int64(m))


def _window_batch(args, dims, *, sign, axes, scale, order, in_dims, out_dims, in_cut,
                  out_cut, m):
    """A batch axis leads every view (the offset is the same for every member: the pipeline's
    own counter, never batched)."""
    x, offset, *into = args
    dx, doff, *dinto = dims
    if doff is not None:
        raise NotImplementedError("internal: a batched offset of pencilfft_fftw_window")
    size = next(a.shape[d] for a, d in zip(args, dims) if d is not None)
    x = batching.bdim_at_front(x, dx, size)
    into = [batching.bdim_at_front(v, d, size) for v, d in zip(into, dinto)]
    shift = lambda c: c + 1 if c >= 0 else c  # noqa: E731
    y = fftw_window_p.bind(x, offset, *into, sign=sign, axes=tuple(a + 1 for a in axes),
                           scale=scale, order=(0, *(o + 1 for o in order)),
                           in_dims=(size, *in_dims), out_dims=(size, *out_dims),
                           in_cut=shift(in_cut), out_cut=shift(out_cut), m=m)
    return y, 0


fftw_window_p.def_abstract_eval(_window_abstract_eval)
fftw_window_p.def_impl(_eager(fftw_window_p))
batching.primitive_batchers[fftw_window_p] = _window_batch
mlir.register_lowering(fftw_window_p, _window_lowering, platform="cpu")
