"""Compiled XLA FFI handlers, built on first use and cached: the CPU kernels behind the extras.

The plain install never needs a compiler: a handler is compiled only when an extra that needs it
is used (`pencilfft[fftw]`'s FFT kernel, `pencilfft[mpi]`'s exchange), with the compiler found
then, against `jax.ffi.include_dir()` and the libraries the extra installed.  The shared library
lands in a cache keyed by everything that changes the binary (the source, the command line, jax's
version), so it is built once per machine and environment, not once per process: the ranks of an
mpirun job that start together build it once under a file lock, and the others wait for it.

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
import shlex
import subprocess
import sys
from collections.abc import Mapping, Sequence

import jax

__all__ = ["BuildError", "cache_dir", "load", "register"]

SOURCE_DIR = pathlib.Path(__file__).parent / "csrc"


class BuildError(RuntimeError):
    """A handler could not be compiled or loaded (no compiler, missing library, ...)."""


def cache_dir() -> pathlib.Path:
    if os.environ.get("PENCILFFT_CACHE_DIR"):
        return pathlib.Path(os.environ["PENCILFFT_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return pathlib.Path(base) / "pencilfft"


def _command(compiler: Sequence[str], source: pathlib.Path, output: pathlib.Path,
             include_dirs: Sequence[str], library_dirs: Sequence[str],
             link: Sequence[str]) -> list[str]:
    # -fPIC -shared: a library for ctypes; rpath: the libraries are found where they were found
    # at build time (a wheel's bundled libfftw3f, the virtualenv's libmpi) without LD_LIBRARY_PATH.
    return [*compiler, "-O3", "-std=c++17", "-fPIC", "-shared",
            *(f"-I{d}" for d in [jax.ffi.include_dir(), *include_dirs]),
            str(source), "-o", str(output),
            *(f"-L{d}" for d in library_dirs), *(f"-Wl,-rpath,{d}" for d in library_dirs),
            *link]


def load(name: str, *, compiler: Sequence[str] = ("c++",), include_dirs: Sequence[str] = (),
         library_dirs: Sequence[str] = (), link: Sequence[str] = ()) -> ctypes.CDLL:
    """The handler library built from `csrc/<name>.cc`, compiled now if not cached.

    `compiler`: the command (e.g. ("c++",) or an MPI wrapper such as ("mpicxx",)); `link`: extra
    link arguments (libraries as full paths or -l names).  Raises `BuildError`.
    """
    source = SOURCE_DIR / f"{name}.cc"
    if not source.is_file():
        raise BuildError(f"no source {source}")
    key_cmd = _command(compiler, source, pathlib.Path("OUT"), include_dirs, library_dirs, link)
    digest = hashlib.sha256()
    digest.update(source.read_bytes())
    for part in (*key_cmd, jax.__version__, sys.version, sys.platform):
        digest.update(part.encode() + b"\0")
    folder = cache_dir()
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise BuildError(f"cannot create the cache folder {folder}: {e}") from e
    output = folder / f"{name}-{digest.hexdigest()[:16]}.so"
    if not output.exists():
        with open(folder / f"{output.name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # the other ranks wait here for the first build
            if not output.exists():
                _build(_command(compiler, source, output.with_suffix(".tmp"), include_dirs,
                                library_dirs, link), output)
    try:
        return ctypes.CDLL(str(output))
    except OSError as e:
        raise BuildError(f"built {output} but could not load it: {e}") from e


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
