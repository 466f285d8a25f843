"""Readers of compiled HLO text, for the tests that check what XLA really does.

* `fft_layout_problems(text)`: every XLA `fft` whose operand or result is not dim0-major.
  XLA:CPU's FftThunk refuses those at run time (xla/backends/cpu/runtime/fft_thunk.cc:168-169,
  the same in the XLA of jax 0.10.2 and 0.11: `RET_CHECK IsMonotonicWithDim0Major`, seen on
  jax 0.11.2's CPU), so reading `compiled.as_text()` catches such a program before it runs.
  Operands are printed by name only (`fft(%bitcast.3)`) in recent XLA and with their shape
  (`fft(c64[4,8]{1,0} %bitcast.3)`) in older ones: both are read, a name looked up among the
  definitions of the same computation.
* `replica_groups(line)`: the device groups of a collective, in each format XLA prints:
  explicit `{{0,1},{2,3}}` (jax 0.10.2), iota `[4,2]<=[8]` / `[2,4]<=[4,2]T(1,0)`, and the mesh
  form jax 0.11 emits from shard_map (`mesh['c'=2,'x'=2,'y'=2] {'y'}`, with sub-axes
  `{'a':(1)2}` and `device_ids=`).
"""
from __future__ import annotations

import math
import re

import numpy as np

# `%name = <shape> opcode(` ; the shape is an array type or a (nested) tuple of them.
_DEF = re.compile(r"^\s*(?:ROOT\s+)?%?(?P<name>[\w.\-]+)\s*=\s*(?P<shape>.+?)\s+"
                  r"(?P<op>[a-z][\w\-]*)\((?P<args>.*)$")
_ARRAY = re.compile(r"(?P<dtype>[a-z]+\d*)\[(?P<dims>[^\]]*)\](?:\{(?P<layout>[^}]*)\})?")
_COMP = re.compile(r"^\s*(?:ENTRY\s+)?%?(?P<name>[\w.\-]+)\s*(?:\(.*\))?\s*->.*\{\s*$")


def _minor_to_major(layout: str | None) -> tuple[int, ...] | None:
    """`3,2,1,0` or `3,2,1,0:T(8,128)S(1)` -> (3, 2, 1, 0); None when no layout is printed."""
    if layout is None:
        return None
    head = layout.split(":", 1)[0].strip()
    return tuple(int(t) for t in head.split(",") if t.strip()) if head else ()


def _dim0_major(m2m: tuple[int, ...]) -> bool:
    return all(a > b for a, b in zip(m2m, m2m[1:]))  # XLA: is_sorted(..., greater)


def _first_operand(args: str) -> tuple[str | None, str]:
    """(inline shape or None, operand name) of the first operand of `args` (text after '(')."""
    depth, end = 0, len(args)
    for i, ch in enumerate(args):
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            if depth == 0:
                end = i
                break
            depth -= 1
        elif ch == "," and depth == 0:
            end = i
            break
    text = args[:end].strip()
    m = re.match(r"^(?P<shape>.*?)\s*%(?P<name>[\w.\-]+)$", text)
    if m:
        return (m.group("shape") or None), m.group("name")
    return None, text.lstrip("%")


def fft_layout_problems(hlo_text: str) -> list[str]:
    """One line per fft whose operand or result layout is not dim0-major ({n-1,...,0}), or
    whose layout cannot be read.  Empty: every fft is fine (also when there is no fft)."""
    problems: list[str] = []
    shapes: dict[str, str] = {}  # name -> printed shape, within the current computation
    ffts: list[tuple[str, str, str | None, str, str]] = []
    comp = "?"

    def flush():
        for comp_name, name, inline, operand, result in ffts:
            op_shape = inline or shapes.get(operand)
            for what, shape in (("operand %" + operand, op_shape), ("result", result)):
                m = _ARRAY.search(shape or "")
                m2m = _minor_to_major(m.group("layout")) if m else None
                if m2m is None:
                    problems.append(f"{comp_name}: fft %{name}: {what} layout unreadable "
                                    f"({shape!r})")
                elif not _dim0_major(m2m):
                    problems.append(f"{comp_name}: fft %{name}: {what} {m.group(0)} is not "
                                    f"dim0-major")
        ffts.clear()
        shapes.clear()

    for line in hlo_text.splitlines():
        c = _COMP.match(line)
        if c and "=" not in line.split("->")[0]:
            flush()
            comp = c.group("name")
            # parameters of the computation as declared in its signature are also definitions
            continue
        d = _DEF.match(line)
        if not d:
            continue
        shapes[d.group("name")] = d.group("shape")
        if d.group("op") == "fft":
            inline, operand = _first_operand(d.group("args"))
            ffts.append((comp, d.group("name"), inline, operand, d.group("shape")))
    flush()
    return problems


def fft_layouts(hlo_text: str) -> list[tuple[str, str, str]]:
    """(fft name, operand shape, result shape) for every fft: what the report prints."""
    out, shapes, pending = [], {}, []
    for line in hlo_text.splitlines():
        if _COMP.match(line) and "=" not in line.split("->")[0]:
            out += [(n, i or shapes.get(o, "?"), r) for n, i, o, r in pending]
            shapes, pending = {}, []
            continue
        d = _DEF.match(line)
        if d:
            shapes[d.group("name")] = d.group("shape")
            if d.group("op") == "fft":
                inline, operand = _first_operand(d.group("args"))
                pending.append((d.group("name"), inline, operand, d.group("shape")))
    out += [(n, i or shapes.get(o, "?"), r) for n, i, o, r in pending]
    return out


def assert_ffts_dim0_major(compiled_or_text) -> int:
    """Raise AssertionError naming each bad fft; return the number of ffts checked."""
    text = compiled_or_text if isinstance(compiled_or_text, str) else compiled_or_text.as_text()
    problems = fft_layout_problems(text)
    if problems:
        raise AssertionError("fft ops XLA:CPU's FftThunk would refuse (RET_CHECK "
                             "IsMonotonicWithDim0Major):\n  " + "\n  ".join(problems))
    return len(fft_layouts(text))


_EXPLICIT = re.compile(r"replica_groups=\{((?:\{[\d,]*\},?)*)\}")
_IOTA = re.compile(r"replica_groups=\[(?P<dims>[\d,]+)\]<=\[(?P<reshape>[\d,]+)\]"
                   r"(?:T\((?P<perm>[\d,]+)\))?")
_MESH = re.compile(r"replica_groups=mesh\[(?P<axes>[^\]]*)\]"
                   r"(?:,\s*device_ids=\((?P<ids>[^)]*\)?)\))?\s*\{(?P<refs>[^}]*)\}")


def _ints(s: str) -> list[int]:
    return [int(t) for t in s.split(",") if t.strip()]


def _iota(reshape: list[int], perm: list[int] | None) -> np.ndarray:
    a = np.arange(math.prod(reshape)).reshape(reshape)
    return a.transpose(perm) if perm else a


def _mesh_groups(axes_text: str, ids_text: str | None, refs_text: str) -> list[list[int]]:
    # mesh['c'=2,'x'=2,'y'=2]   (a device_ids=(...) may also sit inside the brackets)
    m_ids = re.search(r",?\s*device_ids=\((.*)\)\s*$", axes_text)
    if m_ids:
        ids_text, axes_text = m_ids.group(1), axes_text[:m_ids.start()]
    names, sizes = [], []
    for name, size in re.findall(r"'([^']*)'\s*=\s*(\d+)", axes_text):
        names.append(name)
        sizes.append(int(size))
    n = math.prod(sizes)
    if ids_text is None or not ids_text.strip():
        devices = np.arange(n)
    else:
        t = ids_text.strip()
        m = re.fullmatch(r"\[([\d,]+)\](?:T\(([\d,]+)\))?", t)
        devices = (_iota(_ints(m.group(1)), _ints(m.group(2)) if m.group(2) else None)
                   if m else np.array(_ints(t)))
    devices = devices.reshape(sizes)
    # axis refs: 'y'  or  'b':(1)2  (pre-size 1, size 2: the major-most factor 2 of 'b')
    refs = []
    for name, pre, size in re.findall(r"'([^']*)'(?::\((\d+)\)(\d+))?", refs_text):
        i = names.index(name)
        refs.append((i, int(pre) if pre else None, int(size) if size else None))
    # split each mesh axis at the sub-axis boundaries, major to minor
    bounds = {i: {1, sizes[i]} for i in range(len(sizes))}
    for i, pre, size in refs:
        if pre is not None:
            bounds[i] |= {pre, pre * size}
    factors, where = [], {}  # where[(axis, boundary)] = factor index starting there
    for i in range(len(sizes)):
        b = sorted(bounds[i])
        for lo, hi in zip(b, b[1:]):
            where[(i, lo)] = len(factors)
            factors.append((i, lo, hi // lo))
    devices = devices.reshape([f[2] for f in factors])
    grouped = []
    for i, pre, size in refs:
        lo, hi = (1, sizes[i]) if pre is None else (pre, pre * size)
        grouped += [k for k, (ax, flo, fs) in enumerate(factors)
                    if ax == i and lo <= flo and flo * fs <= hi]
    rest = [k for k in range(len(factors)) if k not in grouped]
    per_group = math.prod(factors[k][2] for k in grouped)
    return devices.transpose(rest + grouped).reshape(-1, per_group).tolist()


def replica_groups(line: str) -> list[list[int]] | None:
    """The device (partition) ids of each group of the collective on `line`, in any of XLA's
    formats; None when the line has no replica_groups attribute."""
    m = _MESH.search(line)
    if m:
        return _mesh_groups(m.group("axes"), m.group("ids"), m.group("refs"))
    m = _IOTA.search(line)
    if m:
        dims = _ints(m.group("dims"))
        perm = _ints(m.group("perm")) if m.group("perm") else None
        return _iota(_ints(m.group("reshape")), perm).reshape(dims).tolist()
    m = _EXPLICIT.search(line)
    if m:
        return [_ints(g) for g in re.findall(r"\{([\d,]*)\}", m.group(1))]
    return None
