"""`pencilfft._native.build`: one compiler rule for every handler, a cache keyed by the machine, a
cached library checked against its build's size and sha256 before it is loaded and rebuilt once
when it is damaged or does not load (not left to crash the process or disable the kernels for
good), also by several processes at once, and a cache folder that cannot be used reported as
a `BuildError` (which every caller turns into its fallback), also under mpirun."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import clean_env

from pencilfft._native import build as _native

# A handler of our own, fast to build, with 256 KiB of data: the library is larger than every
# length the tests cut it to, and what dlopen reads (its data segment) lies past the cuts.
TINY = ('extern "C" {\n'
        'char pencilfft_tiny_blob[1 << 18] = {1};\n'
        'int pencilfft_tiny() { return 41 + pencilfft_tiny_blob[0]; }\n'
        '}\n')


@pytest.fixture
def tiny(tmp_path, monkeypatch):
    """A handler source of our own (fast to build) in a fresh cache."""
    (tmp_path / "tiny.cc").write_text(TINY)
    monkeypatch.setenv("PENCILFFT_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path


def test_one_compiler_rule(tiny, monkeypatch):
    monkeypatch.delenv("PENCILFFT_CXX", raising=False)
    monkeypatch.setenv("CXX", "g++ -m64")
    assert _native.compiler() == ("g++", "-m64")
    monkeypatch.setenv("PENCILFFT_CXX", "clang++")
    assert _native.compiler() == ("clang++",)
    monkeypatch.setenv("PENCILFFT_MPICXX", "/opt/mpi/bin/mpicxx")
    assert _native.compiler(mpi=True) == ("/opt/mpi/bin/mpicxx",)
    monkeypatch.setenv("PENCILFFT_CXX", "no-such-compiler-here")
    assert "'no-such-compiler-here' not found; set PENCILFFT_CXX" in _native.missing_compiler()
    with pytest.raises(_native.BuildError, match="no C\\+\\+ compiler"):
        _native.load(tiny / "tiny.cc")


def test_the_cache_key_covers_the_machine(tiny, monkeypatch):
    here = _native.load(tiny / "tiny.cc")
    assert here.pencilfft_tiny() == 42
    monkeypatch.setattr(_native.platform, "machine", lambda: "aarch64")
    monkeypatch.setattr(_native.platform, "libc_ver", lambda: ("musl", "1.2"))
    other = _native.load(tiny / "tiny.cc")  # built again: a library of its own for that machine
    assert other.pencilfft_tiny() == 42
    assert len(list((tiny / "cache").glob("tiny-*.so"))) == 2


def _load_in_a_fresh_process(tiny) -> subprocess.CompletedProcess:
    """`load` of the tiny handler in a process of its own (this one has the library mapped
    already, and dlopen would reuse it)."""
    code = ("from pencilfft._native import build; "
            "print(build.load(%r).pencilfft_tiny())" % str(tiny / "tiny.cc"))
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, env=env)


def _rebuild_warnings(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "rebuilding it" in line]


# Cut where dlopen crashed (SIGBUS from 1000 bytes on): the check reads only the size and the
# hash, the same for any length (100 to 200000 bytes gave the same rebuild).
@pytest.mark.parametrize("length", [1000])
def test_a_cached_library_cut_short_is_rebuilt(tiny, length):
    """Cut short as a full disk, a killed build or a copy in progress leave it: dlopen crashed
    the process with SIGBUS (rc 135) from 1000 bytes on, with no message (issue 51); now the
    library is checked against its build's size and sha256 first, and rebuilt with one line."""
    _native.load(tiny / "tiny.cc")
    built = _native.library_path(tiny / "tiny.cc")
    size = os.path.getsize(built)
    assert size > 200000
    with open(built, "r+b") as f:
        f.truncate(length)
    done = _load_in_a_fresh_process(tiny)
    assert done.returncode == 0, (done.returncode, done.stderr)
    assert done.stdout.strip() == "42"
    (line,) = _rebuild_warnings(done.stderr)
    assert (f"RuntimeWarning: pencilfft: the cached library {built} is {length} bytes where its "
            f"build wrote {size} (cut short") in line
    assert os.path.getsize(built) == size
    again = _load_in_a_fresh_process(tiny)  # rebuilt once: sound from now on
    assert again.returncode == 0 and not _rebuild_warnings(again.stderr), again.stderr


def test_a_cached_library_without_its_record_is_rebuilt(tiny):
    """A library with no record of its build (a build killed between the two moves, a cache
    written by an older pencilfft) is not trusted: rebuilt once, and recorded."""
    _native.load(tiny / "tiny.cc")
    built = _native.library_path(tiny / "tiny.cc")
    record = built.with_name(built.name + ".sha256")
    assert record.read_text().split()[0] == str(built.stat().st_size)
    record.unlink()
    with pytest.warns(RuntimeWarning, match=rf"{built.name} has no record of its size and "
                                            rf"sha256 .*; rebuilding it"):
        _native.load(tiny / "tiny.cc")
    assert record.read_text().split()[0] == str(built.stat().st_size)


def test_a_sound_library_that_does_not_load_is_rebuilt(tiny):
    """A library whose size and sha256 are its build's but that does not load (built for
    another machine under the same key, say): rebuilt once, as before the records."""
    _native.load(tiny / "tiny.cc")
    built = _native.library_path(tiny / "tiny.cc")
    built.write_bytes(b"not a library" * 100)
    built.with_name(built.name + ".sha256").write_text(_native._fingerprint_of(built.read_bytes()))
    done = _load_in_a_fresh_process(tiny)
    assert done.returncode == 0 and done.stdout.strip() == "42", done.stderr
    (line,) = _rebuild_warnings(done.stderr)
    assert f"the cached library {built} does not load (" in line


RACER = """
import os, sys, time
from pencilfft._native import build
folder = sys.argv[1]
open(os.path.join(folder, "ready-%s" % sys.argv[2]), "w").close()
while not os.path.exists(os.path.join(folder, "go")):  # imported: start at the same moment
    time.sleep(0.01)
print(build.load(os.path.join(folder, "tiny.cc")).pencilfft_tiny())
"""


def test_processes_starting_together_rebuild_a_damaged_library_once(tiny, monkeypatch):
    """Two processes meet a library cut short at the same moment (the ranks of an mpirun job
    do): both load a sound one, the compiler runs once, one of them says so."""
    log = tiny / "builds.log"
    wrapper = tiny / "cxx.sh"
    wrapper.write_text(f'#!/bin/sh\necho build >> "{log}"\nexec c++ "$@"\n')
    wrapper.chmod(0o755)
    monkeypatch.setenv("PENCILFFT_CXX", str(wrapper))
    _native.load(tiny / "tiny.cc")
    built = _native.library_path(tiny / "tiny.cc")
    assert log.read_text().count("build") == 1
    with open(built, "r+b") as f:
        f.truncate(60000)
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    racers = [subprocess.Popen([sys.executable, "-c", RACER, str(tiny), str(i)], env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
              for i in range(2)]
    try:
        deadline = time.monotonic() + 120
        while not all((tiny / f"ready-{i}").exists() for i in range(2)):
            assert time.monotonic() < deadline and all(r.poll() is None for r in racers), \
                [r.communicate() for r in racers]
            time.sleep(0.01)
        (tiny / "go").touch()
        outs = [r.communicate(timeout=120) for r in racers]
    finally:
        for r in racers:
            r.kill()
    assert [r.returncode for r in racers] == [0, 0], outs
    assert [out.strip() for out, _ in outs] == ["42", "42"], outs
    assert log.read_text().count("build") == 2, outs  # one rebuild between the two
    assert sum(len(_rebuild_warnings(err)) for _, err in outs) == 1, outs


def _block(path: Path) -> None:
    """Make `path` a folder, where the cache wants a file."""
    path.mkdir(parents=True)
    (path / "inside").touch()


@pytest.mark.filterwarnings("ignore:pencilfft. the cached library")  # "library": no record
@pytest.mark.parametrize("where", ["folder", "lock", "library"])
def test_a_cache_folder_that_cannot_be_used_is_a_build_error(tiny, monkeypatch, where):
    """Every OSError of the cache is the BuildError `load` promises, naming the folder and
    PENCILFFT_CACHE_DIR: the lock's escaped (issue 51), and the MPI exchange, which catches
    only BuildError, aborted the job."""
    folder = tiny / "cache"
    library = _native.library_path(tiny / "tiny.cc")
    assert library.parent == folder
    if where == "folder":  # a path under a regular file (chmod does not stop root)
        (tiny / "file.txt").write_text("a file")
        folder = tiny / "file.txt" / "cache"
        monkeypatch.setenv("PENCILFFT_CACHE_DIR", str(folder))
    elif where == "lock":
        _block(library.with_name(library.name + ".lock"))
    else:  # the move of the built library into place
        _block(library)
    with pytest.raises(_native.BuildError) as info:
        _native.load(tiny / "tiny.cc")
    message = str(info.value)
    assert (f"the cache folder of pencilfft's compiled handlers, {folder} "
            f"(PENCILFFT_CACHE_DIR={str(folder)!r}), cannot be used: ") in message
    assert message.endswith("; set PENCILFFT_CACHE_DIR to a folder this process can write")


def test_blank_compiler_variables_count_as_unset(monkeypatch):
    """PENCILFFT_CXX=" " was an empty command (an IndexError deep inside)."""
    monkeypatch.setenv("PENCILFFT_CXX", "  ")
    monkeypatch.setenv("CXX", "g++")
    assert _native.compiler() == ("g++",)
    monkeypatch.setenv("CXX", " ")
    assert _native.compiler() == ("c++",)
    monkeypatch.setenv("PENCILFFT_MPICXX", " ")
    assert _native.compiler(mpi=True) != ()
    monkeypatch.setenv("CXX", "no-such-cxx -m64")
    assert _native.missing_compiler() == (
        "no C++ compiler ('no-such-cxx' not found; set PENCILFFT_CXX to a C++ compiler; the "
        "command came from CXX='no-such-cxx -m64')")


@pytest.mark.parametrize("command, says", [
    ("true", "succeeded but wrote no"),  # exits 0, writes nothing
    ("false", "failed (1; the command came from PENCILFFT_CXX='false')"),
])
def test_a_compiler_that_is_not_one_is_a_build_error(tiny, monkeypatch, command, says):
    """PENCILFFT_CXX naming a program that does not compile: a BuildError naming the variable
    (`true` was taken for a successful build, and the move of the missing output into place
    raised FileNotFoundError)."""
    monkeypatch.setenv("PENCILFFT_CXX", command)
    tmp = _native.library_path(tiny / "tiny.cc").with_suffix(".tmp")
    tmp.parent.mkdir(parents=True)
    tmp.write_bytes(b"half a library, left by a killed build")
    with pytest.raises(_native.BuildError) as info:
        _native.load(tiny / "tiny.cc")
    assert says in str(info.value) and "PENCILFFT_CXX='" in str(info.value)
    assert not tmp.with_suffix(".so").exists()  # the leftover was not taken for a build


MPI_CHILD = """
import sys
import numpy as np
import pencilfft
pencilfft.initialize()
import jax
from jax.experimental import multihost_utils
from jax.sharding import AxisType
mesh = jax.make_mesh((2, 1), ("x", "y"), axis_types=(AxisType.Explicit,) * 2)
g = np.random.default_rng(0).standard_normal((8, 6, 4)).astype(np.complex64)
x = jax.make_array_from_callback(g.shape, pencilfft.real_space_sharding(mesh), lambda i: g[i])
k = np.asarray(multihost_utils.process_allgather(pencilfft.pfft3d(x, layout="natural"),
                                                 tiled=True))
ref = np.fft.fftn(g.astype(np.complex128))
# one write per line: print's pieces from two ranks interleave in mpirun's output
sys.stdout.write(f"ERROR {jax.process_index()} {float(np.abs(k - ref).max() / np.abs(ref).max())}\\n")
"""


def test_unusable_cache_under_mpirun_falls_back(tmp_path):
    """mpirun -np 2, one device each (the MPI exchange's case), and the MPI exchange's lock
    cannot be created: the job aborted with the lock's FileNotFoundError (issue 51); now every
    rank warns, uses jax's collectives and gets the right spectrum."""
    mpirun = Path(sys.executable).parent / "mpirun"
    if not mpirun.exists():
        pytest.skip(f"no mpirun next to {sys.executable}")
    import pencilfft._exchange.mpi as _mpi_exchange

    folder = tmp_path / "cache"
    env = clean_env(1, PENCILFFT_CACHE_DIR=str(folder), PENCILFFT_FFT_KERNEL="xla")
    library = _native.library_path(Path(_mpi_exchange.__file__).with_name("mpi.cc"), mpi=True)
    _block(folder / (library.name + ".lock"))
    try:
        done = subprocess.run([str(mpirun), "-np", "2", sys.executable, "-c", MPI_CHILD],
                              env=env, capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"mpirun -np 2 still running after 300 s:\n{e.stdout}\n{e.stderr}")
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
    errors = sorted(line.split()[1:] for line in done.stdout.splitlines()
                    if line.startswith("ERROR"))
    assert [rank for rank, _ in errors] == ["0", "1"], done.stdout
    assert all(float(err) < 1e-5 for _, err in errors), errors
    warned = [line for line in done.stderr.splitlines()
              if "the MPI exchange could not be built" in line]
    assert len(warned) == 2, done.stderr[-3000:]
    assert all(f"{folder} (PENCILFFT_CACHE_DIR=" in line for line in warned), warned
