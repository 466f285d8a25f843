"""glibc keeps the memory XLA frees, so that fresh large buffers do not page-fault on every call.

XLA's CPU client takes each buffer from glibc's malloc.  glibc serves a block over its mmap
threshold (at most 32 MiB) with a fresh mmap and unmaps it when freed, so every call of a
transform touches its large output and temporaries for the first time again: a 64 MiB block is
16384 page faults, measured as long as the FFT itself (benchmarks/RESULTS.md, issues 36, 37, 43).
The cure was two environment variables the user had to export before Python started
(MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=100000000000); `configure()` makes the same two
settings with `mallopt` when pencilfft first lowers a CPU program:

* M_MMAP_MAX = 0: large blocks come from the heap, not from mmaps of their own;
* M_TRIM_THRESHOLD = -1 ("disables trimming completely", mallopt(3)): freed memory stays in the
  process for the next call instead of going back to the system.

The cost: the process keeps what it freed (its resident memory stays near its peak until it
exits) and a heap may fragment; benchmarks/RESULTS.md (issue 43) measures the peak.  Before
glibc 2.38 it does fragment: XLA's `posix_memalign(64, n)` leaves spare ends that the per-thread
cache keeps, a freed block cannot take the next one of its size, and the heap grows in steps
(issue 55).  Only an environment set before the process starts changes that
(docs/howto/cpu-threads-and-allocator.md); `describe` says so on such a glibc.

PENCILFFT_MALLOC = "pencilfft" (default: the settings above) or "glibc" (leave glibc's
defaults), read when a CPU program is lowered; the settings, once made, last for the process.
Nothing is changed where the user already chose (MALLOC_MMAP_MAX_, MALLOC_TRIM_THRESHOLD_,
MALLOC_MMAP_THRESHOLD_ or GLIBC_TUNABLES with glibc.malloc settings in the environment), nor
where the C library is not glibc.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import re

__all__ = ["configure", "describe", "fragments_aligned_blocks", "glibc_version", "SETTINGS"]

SETTINGS = ("pencilfft", "glibc")
# mallopt(3)'s parameters (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
_USER_VARIABLES = ("MALLOC_MMAP_MAX_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_")


def setting() -> str:
    given = os.environ.get("PENCILFFT_MALLOC", "")
    value = given.strip().lower() or "pencilfft"
    if value not in SETTINGS:
        raise ValueError(f"environment variable PENCILFFT_MALLOC must be one of "
                         f"{', '.join(SETTINGS)} (pencilfft: glibc keeps freed memory, glibc: "
                         f"glibc's defaults); got {given!r}")
    return value


def _user_choice() -> str | None:
    """The user's own malloc settings in the environment, if any."""
    for name in _USER_VARIABLES:
        if name in os.environ:
            return name
    if "glibc.malloc." in os.environ.get("GLIBC_TUNABLES", ""):
        return "GLIBC_TUNABLES"
    return None


@functools.cache
def _apply() -> str:
    """Make the settings (once per process); what was done, in words."""
    user = _user_choice()
    if user is not None:
        return f"the environment's ({user} is set; pencilfft changes nothing)"
    libc, version = _glibc(), glibc_version()
    if libc is None or version is None:
        return "the C library's defaults (not glibc: nothing to set)"
    mallopt = libc.mallopt
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    ok = mallopt(_M_MMAP_MAX, 0) == 1 and mallopt(_M_TRIM_THRESHOLD, -1) == 1
    if not ok:
        return f"glibc {version}'s defaults (mallopt refused the settings)"
    return (f"freed memory kept (glibc {version}: mallopt M_MMAP_MAX=0, M_TRIM_THRESHOLD=-1; "
            f"PENCILFFT_MALLOC=glibc leaves glibc's defaults{_note(version)})")


@functools.cache
def _glibc() -> ctypes.CDLL | None:
    """The process's glibc, or None where the C library is another (or has no mallopt)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.gnu_get_libc_version.restype = ctypes.c_char_p
        libc.mallopt  # noqa: B018 (glibc's; looked up here so that a lack of it says "not glibc")
    except (OSError, AttributeError):
        return None
    return libc


def glibc_version() -> str | None:
    """The running glibc's version ("2.36"), None where the C library is not glibc."""
    libc = _glibc()
    return libc.gnu_get_libc_version().decode() if libc is not None else None


def _note(version: str) -> str:
    return ("; glibc before 2.38 reuses a freed block for XLA's next aligned block of its size "
            "only by chance, so the heap may grow in steps over a loop's first calls: "
            "docs/howto/cpu-threads-and-allocator.md" if fragments_aligned_blocks(version) else "")


def fragments_aligned_blocks(version: str) -> bool:
    """Whether this glibc (its version string, "2.36") serves `posix_memalign` the old way.

    Before 2.38, `posix_memalign(64, n)` (how XLA takes every buffer) asks for n + 96 bytes and
    frees the spare ends into the per-thread cache, where small allocations take them; a freed
    block's hole is then too small for the next block of the same size (issue 55)."""
    m = re.match(r"(\d+)\.(\d+)", version)
    return bool(m) and (int(m.group(1)), int(m.group(2))) < (2, 38)


def configure() -> str:
    """Apply PENCILFFT_MALLOC (see the module's text); what holds now, in words."""
    if setting() == "glibc":
        if _apply.cache_info().currsize:
            return f"{_apply()} (set before PENCILFFT_MALLOC=glibc was read)"
        return "glibc's defaults (PENCILFFT_MALLOC=glibc)"
    return _apply()


def describe() -> str:
    """One line for `pencilfft check`, without changing anything."""
    # Read first, even once the settings are made: a bad value fails every CPU program lowered
    # from now on (`configure`), and the check must say so.
    value = setting()
    if _apply.cache_info().currsize:
        return _apply()
    if value == "glibc":
        return "glibc's defaults (PENCILFFT_MALLOC=glibc)"
    user = _user_choice()
    if user is not None:
        return f"the environment's ({user} is set; pencilfft changes nothing)"
    version = glibc_version()
    note = _note(version) if version is not None else ""
    return ("freed memory kept once pencilfft lowers a CPU program "
            f"(PENCILFFT_MALLOC=pencilfft{note})")
