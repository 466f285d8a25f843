"""`pencilfft._native.build`: one compiler rule for every handler, a cache keyed by the machine, and a
cached library that does not load rebuilt once (not left to disable the kernels for good)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from pencilfft._native import build as _native

TINY = 'extern "C" int pencilfft_tiny() { return 42; }\n'


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
    assert other._name != here._name
    assert len(list((tiny / "cache").glob("tiny-*.so"))) == 2


def test_a_cached_library_that_does_not_load_is_rebuilt(tiny):
    built = _native.load(tiny / "tiny.cc")._name
    with open(built, "r+b") as f:  # as a full disk or a killed build could leave it
        f.truncate(100)
    # A fresh process (this one has the library mapped already, and dlopen would reuse it).
    code = ("from pencilfft._native import build; "
            "print(build.load(%r).pencilfft_tiny())" % str(tiny / "tiny.cc"))
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "42"
    assert os.path.getsize(built) > 100
