"""The planner: the cheapest route from any sharding to any other, transforming on the way.

The one planner of every transform: jnp.fft's names (`numpy_fft.py`) and the 3-D ones (pfft3d &
co., `stages.pencil_problem`) ask it for their route; `stages.py` emits a route's stages. Static
(shapes, specs and mesh sizes only; nothing is traced, nothing here imports jax). A layout is a
spec: for each array axis, the tuple of mesh axes that split it, major to minor ("whole": none).
One step of a route is one of

* a transform of the wanted axes that are whole on every device (one `stages.Fft`, several
  axes at once);
* an exchange of one mesh axis m (one `jax.lax.all_to_all` over m, `stages.Exchange` with no
  reordering): m leaves array axis i, where it is the minor-most splitter (the blocks of i are
  gathered), and becomes the minor-most splitter of axis j (the blocks of j are cut |m| ways);
* a take of one mesh axis m over which the input is replicated: each device keeps its 1/|m| of
  axis j (no communication; `Take`);
* a swap of the two minor-most splitters (u, v) of an axis into (v, u): one collective permute
  over (u, v) (`Swap`), the only way to reach some orders (P(x, y) -> P(y, x)).

The search (Dijkstra over (spec, stored lengths, axes done)) minimises the bytes moved, then the
number of exchanges, then the number of stages (`Problem.exchanges_first`: the exchanges first);
each exchange moves the whole array as it is at that step. Each axis's transform is then placed
among the route's FFT steps (`_merged`): fewest FFT calls, jnp.fft's order (the last axis
first), earliest. A real-to-complex axis is transformed first (with whatever else is whole
then), a complex-to-real one last. Where an axis the mesh does not divide is cut, it is
zero-padded at its end while it is whole (`Fit`): to a multiple of the mesh axes that will split
it, so that the last layout is XLA's tiling of the exact length (each block ceil(n / P) long),
which the caller slices globally without moving data. Whole axes are cropped back before their
transform and at the end. Nothing is gathered: every device holds 1/P of the (padded) array at
every step.

Without a target the route ends in the cheapest layout that splits over every mesh axis of size
> 1; among equally cheap ones, the input's own layout, else one that keeps the mesh axes in the
input's order, else the one whose splits sit on the lowest array axes.
"""
from __future__ import annotations

import dataclasses
import heapq
import itertools
import math

__all__ = ["Problem", "Route", "find_route", "exact_length", "out_stored", "largest_bytes",
           "route_text", "spec_text"]

Spec = tuple[tuple[str, ...], ...]

# Dijkstra visits at most this many states (a 4-axis mesh on a 5-D array stays far below).
MAX_STATES = 50_000


def spec_text(spec: Spec) -> str:
    """P('a', ('b', 'c'), None)-style text of a spec."""
    parts = ["None" if not s else repr(s[0]) if len(s) == 1 else repr(tuple(s)) for s in spec]
    return f"P({', '.join(parts)})"


def route_text(route: "Route") -> str:
    """'a: 0->1; FFT 0; ...': a route's steps as docs/howto/any-layout.md writes them."""
    steps = []
    for step in route.steps:
        if step[0] == "fft":
            steps.append("FFT " + ",".join(map(str, step[1])))
        elif step[0] == "move":
            steps.append(f"{step[1]}: {step[2]}->{step[3]}")
        elif step[0] == "swap":
            steps.append(f"swap on {step[1]}")
        else:
            steps.append(f"take {step[1]} on {step[2]}")
    return "; ".join(steps)


@dataclasses.dataclass(frozen=True)
class Problem:
    """What the search needs: mesh axis sizes (those > 1), global lengths, the transform.

    `lengths`: each axis's length before its transform (the input's, exact); `fit`: the length
    it is cropped or zero-padded to right before its transform (jnp.fft's `s`; the half length
    for a complex-to-real axis); `after`: its length after it.  `half`: the real-to-complex or
    complex-to-real axis (last of `axes`), or None.  `stored`: the input's stored lengths (the
    exact ones, or padded to the tiling where the input's split does not divide)."""

    sizes: tuple[tuple[str, int], ...]
    lengths: tuple[int, ...]
    stored: tuple[int, ...]
    in_spec: Spec
    axes: tuple[int, ...]
    kind: str  # "c2c", "r2c" or "c2r"
    fit: tuple[int, ...]
    after: tuple[int, ...]
    itemsizes: tuple[int, int]  # (real, complex) bytes
    target: Spec | None
    # Every split of the last layout even (an Explicit mesh: jax types no uneven split).
    even: bool = False
    # The fewest exchanges first, then the fewest bytes: where every exchange is a pass over the
    # whole block whatever it moves (the chunked 3-D chain, whose mesh axes of one device
    # exchange nothing but are a loop of pieces all the same: `stages.pencil_problem`).
    exchanges_first: bool = False

    @property
    def half(self) -> int | None:
        return self.axes[-1] if self.kind != "c2c" else None

    def size(self, name: str) -> int:
        return dict(self.sizes)[name]


@dataclasses.dataclass(frozen=True)
class Route:
    """The steps chosen: ("fft", axes) | ("move", m, i, j, new length of j) | ("take", m, j,
    new length of j), and the end layout (spec, stored lengths, exact lengths)."""

    steps: tuple
    spec: Spec
    stored: tuple[int, ...]
    lengths: tuple[int, ...]
    exchanges: int
    bytes_moved: int


def _round_up(n: int, m: int) -> int:
    return -(-n // m) * m


def _splits(spec_i: tuple[str, ...], p: Problem) -> int:
    return math.prod(p.size(m) for m in spec_i)


def exact_length(p: Problem, done: frozenset, i: int) -> int:
    """Axis i's exact length once the axes `done` are transformed."""
    return p.after[i] if i in done else p.lengths[i]


def _itemsize(p: Problem, done: frozenset) -> int:
    real = (p.kind == "r2c" and p.half not in done) or (p.kind == "c2r" and p.half in done)
    return p.itemsizes[0] if real else p.itemsizes[1]


def _transforms(p: Problem, spec: Spec, done: frozenset) -> list[tuple[int, ...]]:
    """The sets of axes one Fft stage may transform now (all that can, in jnp's order)."""
    whole = [i for i in p.axes if i not in done and not spec[i]]
    if not whole:
        return []
    if p.kind == "r2c" and p.half not in done:
        return [tuple(whole)] if p.half in whole else []  # the real axis first
    if p.kind == "c2r":
        others = [i for i in whole if i != p.half]
        rest = [i for i in p.axes if i != p.half and i not in done and i not in others]
        options = [tuple(others)] if others else []
        if p.half in whole and not rest:
            options.append(tuple(others) + (p.half,))  # the complex-to-real axis last
        return options
    return [tuple(whole)]


def _pad_options(p: Problem, spec: Spec, stored: tuple, done, j: int, m: str) -> list[int]:
    """Stored lengths axis j may take to be cut by m: where j is whole, its exact length padded
    to a multiple of |m| times any product of the other mesh axes (what may split it later);
    where it is split, its length as it is, if that divides."""
    q = _splits(spec[j], p) * p.size(m)
    if spec[j]:
        return [stored[j]] if stored[j] % q == 0 else []
    n = exact_length(p, done, j)
    others = [s for name, s in p.sizes if name != m]
    options = {_round_up(n, p.size(m) * math.prod(c))
               for r in range(len(others) + 1) for c in itertools.combinations(others, r)}
    if stored[j] % q == 0 and stored[j] >= n:
        options.add(stored[j])
    return sorted(options)


def _goal(p: Problem, spec: Spec, stored: tuple, done: frozenset) -> bool:
    if len(done) != len(p.axes):
        return False
    for i, s in enumerate(spec):
        n = exact_length(p, done, i)
        if s and stored[i] != _round_up(n, _splits(s, p)):
            return False  # not XLA's tiling of the exact length
        if s and p.even and n % _splits(s, p):
            return False
    if p.target is not None:
        return spec == p.target
    used = {m for s in spec for m in s}
    return used == {name for name, _ in p.sizes}


def _order(spec: Spec) -> list[str]:
    return [m for s in spec for m in s]


def _preference(p: Problem, spec: Spec) -> tuple:
    """Among equally cheap ends: the input's layout, then the input's order of mesh axes, then
    the splits on the lowest array axes."""
    positions = tuple(sorted((i, k) for i, s in enumerate(spec) for k, _ in enumerate(s)))
    return (spec != p.in_spec, _order(spec) != _order(p.in_spec), positions, repr(spec))


def find_route(p: Problem) -> Route:
    """The cheapest route for `p` (see the module docstring); ValueError if there is none."""
    if p.target is not None and p.even:
        for i, s in enumerate(p.target):
            n = p.after[i] if i in p.axes else p.lengths[i]
            if s and n % _splits(s, p):
                raise ValueError(f"axis {i} of the result has {n} entries, which the mesh axes "
                                 f"{s} of the target do not divide")
    start = (p.in_spec, p.stored, frozenset())
    counter = itertools.count()
    heap = [((0, 0, 0), next(counter), start, ())]
    best: dict = {start: (0, 0, 0)}
    goals = []
    visited = 0
    while heap:
        cost, _, state, steps = heapq.heappop(heap)
        if best.get(state, cost) < cost:
            continue
        if goals and cost[:2] > goals[0][0][:2]:
            break
        visited += 1
        if visited > MAX_STATES:
            raise ValueError(f"no route found among the first {MAX_STATES} layouts")
        spec, stored, done = state
        if _goal(p, spec, stored, done):
            goals.append((cost, state, steps))
            continue
        for nxt, step, add in _moves(p, spec, stored, done):
            if p.exchanges_first:
                add = add[::-1]
            c = (cost[0] + add[0], cost[1] + add[1], cost[2] + 1)
            if c < best.get(nxt, (math.inf,)):
                best[nxt] = c
                heapq.heappush(heap, (c, next(counter), nxt, steps + (step,)))
    if not goals:
        raise ValueError("no route")
    cost, (spec, stored, done), steps = min(goals, key=lambda g: (g[0][:2], _preference(p, g[1][0]),
                                                                 g[0][2]))
    lengths = tuple(exact_length(p, done, i) for i in range(len(spec)))
    moved, exchanges = cost[1::-1] if p.exchanges_first else cost[:2]
    return Route(_merged(p, steps), spec, stored, lengths, exchanges, moved)


def _touched(step) -> set[int]:
    """The array axes a step splits, gathers or reorders."""
    if step[0] == "move":
        return {step[2], step[3]}
    if step[0] in ("take", "swap"):
        return {step[2] if step[0] == "take" else step[1]}
    return set()


def _merged(p: Problem, steps: tuple) -> tuple:
    """The steps with each axis's transform placed among the route's FFT steps: an axis may run
    in any FFT step from the one the search gave it (the first where it is whole) to the last
    before an exchange touches it (a transform along an axis commutes with exchanges of the
    others).  Chosen: the fewest FFT calls (one multi-axis FFT instead of two); then jnp.fft's
    order, the last axis first (the real-to-complex one must be first, and it is the last; on a
    slab over the second of three axes the third runs before the exchange and the first with
    the second after it, not the first and the third before it); then each as early as it can.
    The real-to-complex axis stays first and the complex-to-real one last.  The search counted
    each transform where it put it: one placed later moves the same bytes unless it changes its
    axis's length, which only the 3-D transforms' dealiasing does (a truncated X on a slab over
    Y then crosses its exchange untruncated, as pfft3d's stages always had it)."""
    steps = list(steps)
    ffts = [k for k, step in enumerate(steps) if step[0] == "fft"]
    first: dict[int, int] = {}
    for g, k in enumerate(ffts):
        for i in steps[k][1]:
            first[i] = g
    span = {}
    for i, g in first.items():
        last = g
        if i != p.half:
            while last + 1 < len(ffts) and not any(
                    i in _touched(steps[t]) for t in range(ffts[g] + 1, ffts[last + 1])):
                last += 1
        span[i] = range(g, last + 1)
    axes = sorted(first, key=p.axes.index)

    def score(groups: tuple[int, ...]) -> tuple:
        at = dict(zip(axes, groups))
        inversions = sum(1 for u in axes for v in axes
                         if p.axes.index(u) < p.axes.index(v) and at[u] < at[v])
        return (len(set(groups)), inversions, sum(groups))

    best = min(itertools.product(*(span[i] for i in axes)), key=score)
    placed = dict(zip(axes, best))
    out = []
    for k, step in enumerate(steps):
        if step[0] != "fft":
            out.append(step)
            continue
        g = ffts.index(k)
        group = tuple(i for i in axes if placed[i] == g)  # jnp's order: the half axis last
        if group:
            out.append(("fft", group))
    return tuple(out)


def _moves(p: Problem, spec: Spec, stored: tuple, done: frozenset):
    """(next state, step, (bytes, exchanges)) of every step from a state.

    A transform that can run runs before any exchange (it moves nothing, and the real-to-complex
    one halves what follows; `_merged` then lets it wait for the next transform where the
    exchanges between leave its axes alone), except the complex-to-real one, which doubles what
    follows: it may wait for the exchanges after it."""
    options = _transforms(p, spec, done)
    for axes in options:
        new = list(stored)
        for i in axes:
            new[i] = p.after[i]
        yield (spec, tuple(new), done | set(axes)), ("fft", axes), (0, 0)
    if options and options[0] != (p.half,):
        return
    nbytes = math.prod(stored) * _itemsize(p, done)
    used = {m for s in spec for m in s}
    for name, size in p.sizes:
        if name not in used:  # replicated over m: each device keeps its share, no messages
            for j in range(len(spec)):
                for length in _pad_options(p, spec, stored, done, j, name):
                    yield _cut(spec, stored, done, j, name, length), ("take", name, j, length), \
                        (0, 0)
    for i, s in enumerate(spec):
        if not s:
            continue
        m = s[-1]
        for j in range(len(spec)):
            if j == i:
                continue
            for length in _pad_options(p, spec, stored, done, j, m):
                new_spec = list(spec)
                new_spec[i] = s[:-1]
                nxt = _cut(tuple(new_spec), stored, done, j, m, length)
                moved = nbytes * length // stored[j] * (p.size(m) - 1) // p.size(m)
                if not new_spec[i]:  # whole again: cropped to its exact length (`Fit`)
                    cropped = list(nxt[1])
                    cropped[i] = exact_length(p, done, i)
                    nxt = (nxt[0], tuple(cropped), done)
                yield nxt, ("move", m, i, j, length), (moved, 1)

    for j, s in enumerate(spec):
        if len(s) >= 2:
            new_spec = list(spec)
            new_spec[j] = s[:-2] + (s[-1], s[-2])
            q = p.size(s[-1]) * p.size(s[-2])
            yield (tuple(new_spec), stored, done), ("swap", j), (nbytes * (q - 1) // q, 1)


def _cut(spec: Spec, stored: tuple, done, j: int, m: str, length: int):
    new_spec = list(spec)
    new_spec[j] = spec[j] + (m,)
    new = list(stored)
    new[j] = length
    return tuple(new_spec), tuple(new), done


def largest_bytes(p: Problem, route: Route) -> int:
    """The global bytes of the largest array along the route (padding included): what one
    exchange's buffers hold, over the devices."""
    stored, done = list(p.stored), frozenset()
    most = math.prod(stored) * _itemsize(p, done)
    for step in route.steps:
        if step[0] == "fft":
            for i in step[1]:
                stored[i] = p.after[i]
            done = done | set(step[1])
        elif step[0] in ("move", "take"):
            stored[step[-2]] = step[-1]
        most = max(most, math.prod(stored) * _itemsize(p, done))
    return most


def out_stored(p: Problem, route: Route) -> tuple[int, ...]:
    """The global shape the route's last stage leaves: each axis's exact length, padded to
    a multiple of the mesh axes that split it (XLA's tiling of the exact length)."""
    return tuple(_round_up(n, _splits(s, p)) for n, s in zip(route.lengths, route.spec))
