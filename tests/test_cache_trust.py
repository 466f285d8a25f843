"""The cache of compiled handlers trusts only its owner (issue 57, `pencilfft._native.trust`).

A library in a cache folder that another user can write (mode 777, owned by another user, in a
folder others can write without the sticky bit), or a library or record that another user owns
or can write, is never loaded: its constructor (which writes a marker file here) never runs, one
warning names the folder and why, and the handler is built in a private folder and works.  The
lock never follows a planted symbolic link (it truncated the root-owned file it pointed at).  A
library cut or replaced after its check is not what is loaded: the checked bytes are (no
SIGBUS).  The default folder is this user's, made 0700, and what a build writes is not left
writable by the group under a umask of 002.  An ACL that lets another user write the folder,
the library or a folder above counts as the mode does, and so does the folder's default ACL
(issue 68); a compiler's output swapped for a link is never followed; folders made for the
cache are 0700 under any umask."""
from __future__ import annotations

import errno
import json
import os
import pathlib
import shutil
import stat
import struct
import subprocess
import sys
import tempfile
import warnings

import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

import pencilfft
from conftest import MULTI_PROCESS, make_mesh, put_global, random_field, reference, rel_err, tol
from pencilfft._exchange import local as _local_exchange
from pencilfft._native import build as _native, trust
from pencilfft._transforms import kernel as _fft_kernel

pytestmark = [
    pytest.mark.skipif(MULTI_PROCESS, reason="files of one machine, tested once"),
    pytest.mark.skipif(_native.missing_compiler() is not None, reason="no C++ compiler"),
]

ROOT = os.geteuid() == 0
NOBODY = 65534  # the second user: `nobody` on Linux
NOT_ROOT = "not running as root: no file of another user can be made (and root's are trusted)"

# A handler of our own, fast to build (as tests/test_native.py's).
TINY = ('extern "C" {\n'
        'char pencilfft_tiny_blob[1 << 18] = {VALUE};\n'
        'int pencilfft_tiny() { return 41 + pencilfft_tiny_blob[0]; }\n'
        '}\n')

# What another user plants under the tiny handler's name: it runs as soon as it is loaded.
PLANTED = ('#include <cstdio>\n'
           '__attribute__((constructor)) static void planted() {\n'
           '  if (FILE* f = std::fopen(MARKER, "w")) { std::fputs("ran", f); std::fclose(f); }\n'
           '}\n'
           'extern "C" int pencilfft_tiny() { return 666; }\n')


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    """The planted library's bytes (built once) and the marker file its constructor writes."""
    folder = tmp_path_factory.mktemp("planted")
    marker = folder / "marker"
    (folder / "planted.cc").write_text(PLANTED.replace("MARKER", json.dumps(str(marker))))
    subprocess.run([*_native.compiler(), "-shared", "-fPIC", "-o", str(folder / "planted.so"),
                    str(folder / "planted.cc")], check=True, timeout=300, capture_output=True)
    return (folder / "planted.so").read_bytes(), marker


@pytest.fixture
def tiny(tmp_path, monkeypatch):
    """The tiny handler's source in `tmp_path`, a cache folder `tmp_path/cache` (not created),
    and the temporary folder (where the private folder goes) `tmp_path/tmp`."""
    (tmp_path / "tiny.cc").write_text(TINY.replace("VALUE", "1"))
    monkeypatch.setenv("PENCILFFT_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    return tmp_path


def _private(tmp_path) -> pathlib.Path:
    return tmp_path / "tmp" / f"pencilfft-{os.geteuid()}"


def _plant(library: pathlib.Path, data: bytes) -> None:
    """`data` as the cached library, with the record that its size and sha256 are right."""
    library.write_bytes(data)
    record = library.with_name(library.name + ".sha256")
    record.write_text(_native._fingerprint_of(library.read_bytes()))


def _untrusted_warnings(caught) -> list[str]:
    return [str(w.message) for w in caught if "is not used:" in str(w.message)]


# how the folder is made untrusted -> what the warning says
CASES = {
    "folder mode 777": "its group or others can write the folder (owner ",
    "folder of a group of another user": "its group or others can write the folder (owner ",
    "folder of another user": f"the folder is owned by nobody (uid {NOBODY}), not by this user",
    "library writable by others": "its group or others can write the library: ",
    "record of another user": f"its record is owned by nobody (uid {NOBODY}), not by this user",
    "in a folder others can write, no sticky bit": "which its group or others can write without "
                                                   "the sticky bit (owner ",
}


@pytest.mark.parametrize("case", CASES)
def test_a_planted_library_never_runs(tiny, planted, monkeypatch, case):
    """Issue 57, finding 1: root's pencilfft ran the constructor of a library that another
    user planted, with its record, in a cache folder of mode 777 or of their own."""
    data, marker = planted
    if "another user" in case and not ROOT:  # chown: only root gives files away
        pytest.skip(NOT_ROOT)
    folder = tiny / "cache"
    if case.startswith("in a folder"):
        (tiny / "open").mkdir()
        (tiny / "open").chmod(0o777)
        folder = tiny / "open" / "cache"
        monkeypatch.setenv("PENCILFFT_CACHE_DIR", str(folder))
    folder.mkdir(mode=0o700)
    library = _native.library_path(tiny / "tiny.cc")
    _plant(library, data)
    record = library.with_name(library.name + ".sha256")
    if case == "folder mode 777":
        folder.chmod(0o777)
    elif case == "folder of a group of another user":  # group write: only the user's own group
        os.chown(folder, os.geteuid(), NOBODY)
        folder.chmod(0o770)
    elif case == "folder of another user":
        for path in (folder, library, record):
            os.chown(path, NOBODY, NOBODY)
    elif case == "library writable by others":
        library.chmod(0o666)
    elif case == "record of another user":
        os.chown(record, NOBODY, NOBODY)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        lib = _native.load(tiny / "tiny.cc")
        assert lib.pencilfft_tiny() == 42
        assert not marker.exists(), "the planted library ran"
        (message,) = _untrusted_warnings(caught)
        assert f"the cache folder of pencilfft's compiled handlers, {folder} (" in message
        assert CASES[case] in message, message
        assert f"are built and kept in {_private(tiny)} instead" in message
        assert (_private(tiny) / library.name).is_file()
        assert stat.S_IMODE(_private(tiny).stat().st_mode) == 0o700
        caught.clear()
        assert _native.load(tiny / "tiny.cc").pencilfft_tiny() == 42
        assert not _untrusted_warnings(caught)  # warned once
    assert library.read_bytes() == data  # nothing was written where it is not ours


def _grant_write(path: pathlib.Path, uid: int, default: bool = False) -> None:
    """Give user `uid` rwx on `path` through its POSIX ACL, as `setfacl -m u:UID:rwx` (or its
    default ACL, `setfacl -d -m ...`), written as the extended attribute the kernel keeps it in
    (linux/posix_acl_xattr.h): no setfacl needed.  Skips where the file system has no ACLs."""
    if not hasattr(os, "setxattr"):
        pytest.skip("no extended attributes here (not Linux): no POSIX ACLs to try")
    mode, anyone = stat.S_IMODE(path.stat().st_mode), 0xFFFFFFFF  # ACL_UNDEFINED_ID
    entries = [(0x01, mode >> 6 & 7, anyone), (0x02, 7, uid), (0x04, mode >> 3 & 7, anyone),
               (0x10, 7, anyone), (0x20, mode & 7, anyone)]  # owner, user, group, mask, others
    acl = struct.pack("<I", 2) + b"".join(struct.pack("<HHI", *e) for e in entries)
    try:
        os.setxattr(path, "system.posix_acl_default" if default else "system.posix_acl_access",
                    acl)
    except OSError as e:
        if e.errno in (errno.ENOTSUP, errno.EOPNOTSUPP):
            pytest.skip(f"the file system of {path} has no POSIX ACLs ({e})")
        raise


# where user nobody gets write through an ACL -> what the warning says
ACL_CASES = {
    "folder": "its ACL lets user {nobody} write the folder (owner ",
    "default of the folder": "its default ACL lets user {nobody} write what is made in the "
                             "folder (owner ",
    "library": "its ACL lets user {nobody} write the library: ",
    "folder above": "whose ACL lets user {nobody} write it without the sticky bit (owner ",
}


@pytest.mark.parametrize("case", ACL_CASES)
def test_an_acl_that_lets_another_user_write_counts(tiny, planted, monkeypatch, case):
    """Issue 68: a 0700 cache folder of root's whose ACL gave user nobody rwx (`drwxrwx---+`:
    the ACL's mask reads as group write, and root's group passed as a private group) was used
    without a warning, and nobody could plant a library.  Now the ACL counts as the mode does,
    for the folder, its default ACL (what is made in it), the library and the folders above."""
    data, marker = planted
    folder = tiny / "cache"
    if case == "folder above":
        (tiny / "shared").mkdir(mode=0o700)
        folder = tiny / "shared" / "cache"
        monkeypatch.setenv("PENCILFFT_CACHE_DIR", str(folder))
    folder.mkdir(mode=0o700)
    library = _native.library_path(tiny / "tiny.cc")
    _plant(library, data)
    target = {"folder": folder, "default of the folder": folder, "library": library,
              "folder above": tiny / "shared"}[case]
    _grant_write(target, NOBODY, default=case.startswith("default"))
    if case == "folder":  # the mode of issue 68's folder: the mask shows as the group's
        assert stat.filemode(folder.stat().st_mode) == "drwxrwx---"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert _native.load(tiny / "tiny.cc").pencilfft_tiny() == 42
        assert not marker.exists(), "the planted library ran"
    (message,) = _untrusted_warnings(caught)
    assert ACL_CASES[case].format(nobody=trust._user(NOBODY)) in message, message
    assert f"are built and kept in {_private(tiny)} instead" in message
    assert library.read_bytes() == data  # nothing was written where it is not ours


def test_a_compiler_output_swapped_for_a_link_is_not_followed(tiny, monkeypatch):
    """Issue 68: another user who could write the cache folder swapped the rebuild's temporary
    output for a link to a root-only file, and the build's os.chmod followed it and made that
    file 755.  A compiler that leaves a link to such a file stands for the swap: the link is
    never followed (the mode is set through the descriptor of the output, opened without
    following links), the file keeps its mode, and the build fails with the reason."""
    victim = tiny / "victim"
    victim.write_text("secret\n")
    victim.chmod(0o600)
    swapper = tiny / "swapper"
    swapper.write_text(f"#!{sys.executable}\n"
                       "import os, sys\n"
                       f"os.symlink({str(victim)!r}, sys.argv[sys.argv.index('-o') + 1])\n")
    swapper.chmod(0o700)
    monkeypatch.setenv("PENCILFFT_CXX", str(swapper))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(_native.BuildError, match=r"the compiler's output .*\.tmp became a "
                                                     r"symbolic link"):
            _native.load(tiny / "tiny.cc")
    assert "became a symbolic link" in _untrusted_warnings(caught)[0]
    assert stat.S_IMODE(victim.stat().st_mode) == 0o600
    assert victim.read_text() == "secret\n"


def test_missing_folders_above_are_made_private_under_any_umask(tiny, monkeypatch):
    """Issue 68: under a umask of 000 the cache made a missing $XDG_CACHE_HOME (the folder
    above its own) mode 777 and left it so.  Now each folder made for the cache is 0700 less
    the umask; one that exists keeps its mode."""
    monkeypatch.delenv("PENCILFFT_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tiny / "home" / "xdg"))
    (tiny / "home").mkdir(mode=0o755)
    old = os.umask(0)
    try:
        assert _native.load(tiny / "tiny.cc").pencilfft_tiny() == 42
    finally:
        os.umask(old)
    for folder, mode in ((tiny / "home", 0o755), (tiny / "home" / "xdg", 0o700),
                         (tiny / "home" / "xdg" / "pencilfft", 0o700)):
        assert stat.S_IMODE(folder.stat().st_mode) == mode, folder


@pytest.mark.skipif(MULTI_PROCESS, reason="one process holds every device")
def test_the_transform_works_beside_a_planted_exchange(tiny, planted, monkeypatch):
    """The planted library under the local exchange's name, in a folder of mode 777: the
    exchange is had from the private folder (seeded with this machine's build, not to compile
    it again here), and the transform is right."""
    data, marker = planted
    source = pathlib.Path(_local_exchange.__file__).with_name("local.cc")
    monkeypatch.undo()  # this process's own cache, where the suite built the exchange
    _native.load(source)
    _fft_kernel.kernel()  # the FFT kernel too (from there, not compiled again in the private one)
    built = _native.library_path(source)
    if not built.is_file():
        pytest.skip(f"this process's cache folder {built.parent} is not used (see its warning)")
    monkeypatch.setenv("PENCILFFT_CACHE_DIR", str(tiny / "cache"))
    monkeypatch.setattr(tempfile, "tempdir", str(tiny / "tmp"))
    (tiny / "cache").mkdir()
    (tiny / "cache").chmod(0o777)
    _plant(_native.library_path(source), data)
    _private(tiny).mkdir(mode=0o700)
    for name in (built.name, built.name + ".sha256"):
        shutil.copy(built.with_name(name), _private(tiny) / name)
    _local_exchange._library.cache_clear()
    try:
        with pytest.warns(RuntimeWarning, match=r"is not used: its group or others can write "
                                                r"the folder"):
            assert _local_exchange.unavailable_reason(None, "cpu") is None
        mesh = make_mesh((4, 2))
        g = random_field((8, 8, 4), np.complex64)
        x = put_global(g, NamedSharding(mesh, P("x", "y")))
        k = pencilfft.pfft3d(x, layout="natural", exchange="local")
        assert rel_err(k, reference(g, "natural")) < tol(np.complex64)
    finally:
        monkeypatch.undo()
        _local_exchange._library.cache_clear()
    assert not marker.exists(), "the planted library ran"


@pytest.mark.parametrize("target", ["a file", "nothing"])
def test_a_planted_lock_link_is_not_followed(tiny, target):
    """Issue 57: the lock was opened with open(..., "w"), which followed a planted symbolic link
    and truncated the root-owned 0600 file it pointed at (or would create one where it points
    to nothing).  Now it is never followed: the folder is not used, the target is intact."""
    victim = tiny / "victim"
    if target == "a file":
        victim.write_text("secret\n")
        victim.chmod(0o600)
    (tiny / "cache").mkdir(mode=0o700)
    library = _native.library_path(tiny / "tiny.cc")
    lock = library.with_name(library.name + ".lock")
    lock.symlink_to(victim)
    with pytest.warns(RuntimeWarning, match=rf"is not used: its lock {lock} is a symbolic link"):
        assert _native.load(tiny / "tiny.cc").pencilfft_tiny() == 42
    if target == "a file":
        assert victim.read_text() == "secret\n"
        assert stat.S_IMODE(victim.stat().st_mode) == 0o600
    else:
        assert not victim.exists()
    assert lock.is_symlink() and (_private(tiny) / library.name).is_file()


# Between the check of the cached library and its load, another process cuts it short (which
# crashed the process with SIGBUS when dlopen read the cached file) or replaces it, record and
# all, with the planted library.
RACE = """
import sys
from pencilfft._native import build
source, how, planted = sys.argv[1:]
library = build.library_path(source)
load_copy = build._load_copy
def meddle_then_load(*args):
    if how == "cut":
        with open(library, "r+b") as f:
            f.truncate(1000)
    else:
        library.write_bytes(open(planted, "rb").read())
        build._record(library).write_text(build._fingerprint_of(library.read_bytes()))
    return load_copy(*args)
build._load_copy = meddle_then_load
print(build.load(source).pencilfft_tiny())
"""


@pytest.mark.parametrize("how", ["cut", "replaced"])
def test_what_is_loaded_is_what_was_checked(tiny, planted, how):
    """Issue 57, finding 6: a library cut short after its check gave SIGBUS (the check and
    dlopen's read were two openings of the file); now the checked bytes are loaded, from a
    private copy, whatever happens to the file."""
    data, marker = planted
    (tiny / "planted.so").write_bytes(data)
    _native.load(tiny / "tiny.cc")  # built and sound
    done = subprocess.run([sys.executable, "-c", RACE, str(tiny / "tiny.cc"), how,
                           str(tiny / "planted.so")], capture_output=True, text=True,
                          timeout=120, env=dict(os.environ, JAX_PLATFORMS="cpu"))
    assert done.returncode == 0, (done.returncode, done.stderr[-3000:])
    assert done.stdout.strip() == "42", done.stderr[-3000:]
    assert "Warning" not in done.stderr, done.stderr[-3000:]
    assert not marker.exists(), "the planted library ran"


def test_the_default_folder_is_the_users_own(tiny, monkeypatch):
    """$XDG_CACHE_HOME/pencilfft, else ~/.cache/pencilfft, made 0700; with no home folder of
    this user's, pencilfft-<uid> in the temporary folder; and a build under a umask of 002
    leaves nothing the group can write (the next process would refuse it)."""
    monkeypatch.delenv("PENCILFFT_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tiny / "xdg"))
    (tiny / "xdg").mkdir(mode=0o755)
    assert _native.cache_dir() == tiny / "xdg" / "pencilfft"
    old = os.umask(0o002)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert _native.load(tiny / "tiny.cc").pencilfft_tiny() == 42
            assert _native.load(tiny / "tiny.cc").pencilfft_tiny() == 42
    finally:
        os.umask(old)
    assert not [str(w.message) for w in caught if "pencilfft" in str(w.message)]
    library = _native.library_path(tiny / "tiny.cc")
    assert stat.S_IMODE(library.parent.stat().st_mode) == 0o700
    for path in (library, library.with_name(library.name + ".sha256")):
        assert not path.stat().st_mode & 0o022, path
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tiny / "no-such-home"))
    assert _native.cache_dir() == tiny / "tmp" / f"pencilfft-{os.geteuid()}"
    if ROOT:  # a home folder of another user's is not ours to use either
        (tiny / "home").mkdir()
        os.chown(tiny / "home", NOBODY, NOBODY)
        monkeypatch.setenv("HOME", str(tiny / "home"))
        assert _native.cache_dir() == tiny / "tmp" / f"pencilfft-{os.geteuid()}"
    monkeypatch.setenv("HOME", str(tiny))
    assert _native.cache_dir() == tiny / ".cache" / "pencilfft"


def test_a_folder_in_a_sticky_folder_is_used(tiny, monkeypatch):
    """A 0700 folder of ours in a folder anyone can write with the sticky bit (/tmp) is ours."""
    (tiny / "sticky").mkdir()
    (tiny / "sticky").chmod(0o1777)
    monkeypatch.setenv("PENCILFFT_CACHE_DIR", str(tiny / "sticky" / "cache"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert _native.load(tiny / "tiny.cc").pencilfft_tiny() == 42
    assert not _untrusted_warnings(caught)
    assert _native.library_path(tiny / "tiny.cc").is_file()


def test_without_memfd_the_copy_is_a_file_removed_once_loaded(tiny, monkeypatch):
    """Where memfd_create is refused (an old kernel, vm.memfd_noexec=2), the private copy is a
    file in a fresh 0700 folder, removed as soon as it is loaded; `register` still finds it."""
    (tiny / "tiny.cc").write_text(TINY.replace("VALUE", "2"))  # bytes no other test loaded

    def refused(*args):
        raise PermissionError(13, "memfd_create refused")

    monkeypatch.setattr(os, "memfd_create", refused)
    lib = _native.load(tiny / "tiny.cc")
    assert lib.pencilfft_tiny() == 43 and f"{tiny / 'cache'}/.load-" in lib._name
    assert _native.register(lib, {}).pencilfft_tiny() == 43  # dlopen by name finds it
    assert not list((tiny / "cache").glob(".load-*"))
