"""What fills glibc's main heap after a loop of round trips (issue 55): its large chunks and what
sits between them.

    python -m benchmarks.heapmap --shapes 256 --calls 30 > benchmarks/data/heapmap-glibc236.txt
    python -m benchmarks.heapmap --shapes 256 --calls 30 --interleaved

Runs `--calls` one-device forward + inverse round trips of an N^3 complex64 grid (with
`--interleaved`, jnp.fft's round trip before each), then walks the main heap chunk by chunk
(glibc's chunk headers, read in this process) and prints every chunk of 1 MiB or more, free or
in use, and a summary of the small chunks between two of them.  A small chunk that glibc's
per-thread cache (tcache) holds is free to glibc's eye but cannot merge with its neighbours:
it is told apart by the tcache's key, read from a chunk this tool frees itself.

Why: XLA takes its buffers with `posix_memalign(64, n)`.  Before glibc 2.38 that asks
`_int_malloc` for n + 64 + 32 bytes and hands the spare ends back as small free chunks, which the
tcache keeps and later small allocations take; a freed block then leaves a hole of n plus a few
bytes, too small for the next `posix_memalign(64, n)`, and the heap grows instead.  Linux and
glibc only (x86-64 chunk layout); a diagnostic, not a timing.
"""
from __future__ import annotations

import argparse
import ctypes
import sys

import jax
import jax.numpy as jnp

from benchmarks import private, steady

_BIG = 1 << 20


def _heap_range() -> tuple[int, int]:
    """The main heap's address range: the [heap] mappings, which madvise may have split."""
    lo = hi = None
    with open("/proc/self/maps") as f:
        for line in f:
            if line.rstrip().endswith("[heap]"):
                a, b = (int(v, 16) for v in line.split()[0].split("-"))
                lo, hi = (a if lo is None else lo), b
    if lo is None:
        raise SystemExit("no [heap] mapping in /proc/self/maps")
    return lo, hi


def _tcache_key(libc: ctypes.CDLL) -> int:
    """The process's tcache key: the second word of any chunk the tcache holds (glibc >= 2.34)."""
    p = libc.malloc(40)
    libc.free(p)
    return ctypes.c_size_t.from_address(p + 8).value  # freed, still mapped: read only


def chunks(lo: int, hi: int) -> tuple[list[tuple[int, int, bool]], str]:
    """(address, size, in use) of every chunk from the heap's start on, and how the walk ended."""
    out, p = [], (lo + 15) & ~15
    while p < hi - 32:
        size = ctypes.c_size_t.from_address(p + 8).value & ~7
        if size < 32:  # glibc's fencepost: the heap went on in a mapping of its own
            return out, (f"a fencepost at {(p - lo) / 2**20:.2f} MiB: the main heap continues "
                         "in mappings of its own, not walked")
        if p + size > hi:
            return out, f"a size past the heap's end at {(p - lo) / 2**20:.2f} MiB (changed meanwhile?)"
        nxt = p + size
        used = nxt < hi - 16 and bool(ctypes.c_size_t.from_address(nxt + 8).value & 1)
        out.append((p, size, used))
        p = nxt
    return out, "the heap's end"


def describe(lo: int, found: list[tuple[int, int, bool]], key: int) -> list[str]:
    lines, run = [], []

    def flush() -> None:
        if run:
            cached = sum(1 for a, s, u in run if u and ctypes.c_size_t.from_address(a + 24).value == key)
            sizes = sorted({s for _, s, _ in run})[:6]
            lines.append(f"    {len(run)} small chunk(s), {sum(s for _, s, _ in run)} B, "
                         f"{sum(u for _, _, u in run) - cached} in use, {cached} in the tcache, "
                         f"sizes {sizes}{' ...' if len(run) > 6 else ''}")
            run.clear()

    for i, (a, size, used) in enumerate(found):
        if size >= _BIG or i == len(found) - 1:
            flush()
            state = "top" if i == len(found) - 1 and not used else "in use" if used else "free"
            lines.append(f"{(a - lo) / 2**20:9.2f} MiB  {state:6s} {size} B ({size / 2**20:.4f} MiB)")
        else:
            run.append((a, size, used))
    flush()
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", type=int, default=256, help="N of the N^3 grid (default 256)")
    p.add_argument("--calls", type=int, default=30, help="round trips before the walk")
    p.add_argument("--interleaved", action="store_true", help="jnp.fft's round trip before each")
    args = p.parse_args(argv)
    version = private.malloc.glibc_version()
    if version is None:
        raise SystemExit("benchmarks.heapmap walks glibc's heap on Linux: no glibc here")
    libc = ctypes.CDLL("libc.so.6")
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    x = jax.device_put(steady._grid(args.shapes))
    ours = steady._pencilfft_pair(x)
    fwd_j, inv_j = jax.jit(jnp.fft.fftn), jax.jit(jnp.fft.ifftn)
    print(f"glibc {version}; {args.calls} round trips of {args.shapes}^3 complex64 on one CPU "
          f"device{', each after jnp.fft' if args.interleaved else ''}")
    grew = []
    for i in range(args.calls):
        if args.interleaved:
            inv_j(fwd_j(x)).block_until_ready()
        before = steady._heap_mib()[0]
        seconds, _ = steady._measure(ours)
        after = steady._heap_mib()[0]
        if after > before:
            grew.append(f"{i} (+{after - before:.1f} MiB, {seconds * 1e3:.0f} ms)")
    heap, free = steady._heap_mib()
    print(f"heap grew in rounds: {', '.join(grew) or 'none'}")
    print(f"heap {heap:.0f} MiB, of it free {free:.0f} MiB (mallinfo2)")
    lo, hi = _heap_range()
    found, end = chunks(lo, hi)
    print("\n".join(describe(lo, found, _tcache_key(libc))))
    print(f"walk ended at {end}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
