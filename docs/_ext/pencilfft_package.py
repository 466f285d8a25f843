"""The package's picture, read from its imports: which module imports which, and what that makes
of its parts (the subpackages and the few loose modules).

Read with `ast`, nothing is imported or run: every `import` and `from ... import` statement of
every module of pencilfft/, at any depth of the module (a function's lazy import counts too).
`tests/test_package.py` asserts on the same reading (no import circle, no private name taken
across modules, each part importing only the parts below it), and the Sphinx hook below draws
it into docs/_generated/package.png for docs/development.md while the site builds.
"""
from __future__ import annotations

import ast
import textwrap
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

PACKAGE = Path(__file__).resolve().parents[2] / "pencilfft"
NAME = "pencilfft"


def modules(package: Path = PACKAGE) -> dict[str, Path]:
    """Every module of the package: dotted name -> file (a package is its __init__.py)."""
    found = {}
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _base(module: str, path: Path, node: ast.ImportFrom) -> str:
    """The absolute name a `from` statement imports from."""
    if node.level == 0:
        return node.module or ""
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    package = package[:len(package) - (node.level - 1)]
    return ".".join(package + ([node.module] if node.module else []))


def imports(package: Path = PACKAGE) -> Iterator[tuple[str, str, str | None, int]]:
    """(importing module, imported module, name taken from it or None, line) for every import
    of a module of the package by another; `from m import x` imports module m.x where that is
    a module, else the name x of m."""
    mods = modules(package)
    for module, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name in mods:
                        yield module, alias.name, None, node.lineno
            elif isinstance(node, ast.ImportFrom):
                base = _base(module, path, node)
                if base not in mods:
                    continue
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    if sub in mods:
                        yield module, sub, None, node.lineno
                    else:
                        yield module, base, alias.name, node.lineno


def graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    """module -> the modules of the package it imports (itself excluded)."""
    edges: dict[str, set[str]] = {m: set() for m in modules(package)}
    for src, dst, _, _ in imports(package):
        if src != dst:
            edges[src].add(dst)
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The import circles: every strongly connected set of two or more modules (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def private_names(package: Path = PACKAGE) -> list[str]:
    """Private names one module takes from another: `from m import _x` (where _x is not a
    module), and `alias._x` where alias is a module of the package bound by an import."""
    mods = modules(package)
    found = [f"{src}:{line} imports {name} from {dst}"
             for src, dst, name, line in imports(package)
             if name is not None and name.startswith("_") and not name.startswith("__")
             and src != dst]
    for module, path in mods.items():
        tree = ast.parse(path.read_text(), str(path))
        bound = {}  # local name -> module, for names imports bind to modules
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                base = _base(module, path, node)
                for alias in node.names:
                    if f"{base}.{alias.name}" in mods:
                        bound[alias.asname or alias.name] = f"{base}.{alias.name}"
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name in mods and alias.asname:
                        bound[alias.asname] = alias.name
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.value.id in bound and node.attr.startswith("_")
                    and not node.attr.startswith("__")
                    and f"{bound[node.value.id]}.{node.attr}" not in mods):
                found.append(f"{module}:{node.lineno} uses {node.value.id}.{node.attr} "
                             f"({bound[node.value.id]})")
    return found


FACADE, LOOSE = "pencilfft (facade)", "loose modules"


def part(module: str) -> str:
    """The part a module belongs to: its subpackage of pencilfft; the public facade
    (`__init__`, `__main__`); or the loose modules beside the subpackages."""
    names = module.split(".")
    if len(names) == 1 or names[1] == "__main__":
        return FACADE
    return names[1] if (PACKAGE / names[1]).is_dir() else LOOSE


def parts(edges: dict[str, set[str]]) -> dict[str, dict[str, int]]:
    """part -> {part it imports: how many module imports make that arrow}."""
    out: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for src, dsts in edges.items():
        out[part(src)]
        for dst in dsts:
            if part(src) != part(dst):
                out[part(src)][part(dst)] += 1
    return {k: dict(v) for k, v in out.items()}


def layers(arrows: dict[str, dict[str, int]]) -> list[list[str]]:
    """The parts in layers, each above every part it imports (the longest path below it)."""
    depth: dict[str, int] = {}

    def level(p: str, seen: tuple[str, ...] = ()) -> int:
        if p not in depth:
            below = [d for d in arrows.get(p, {}) if d not in seen]
            depth[p] = 1 + max((level(d, seen + (p,)) for d in below), default=-1)
        return depth[p]

    for p in arrows:
        level(p)
    out: list[list[str]] = [[] for _ in range(max(depth.values()) + 1)]
    for p in sorted(depth):
        out[depth[p]].append(p)
    return out


def draw(path: Path, package: Path = PACKAGE) -> None:
    """The parts as boxes in layers (what a part imports is below it), each box naming its
    modules, an arrow per imported part with how many imports make it."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyBboxPatch

    edges = graph(package)
    arrows = parts(edges)
    rows = layers(arrows)
    members: dict[str, list[str]] = defaultdict(list)
    for m in edges:
        names = m.split(".")
        members[part(m)].append(names[-1] if len(names) > 2 or part(m) == LOOSE else
                                "__init__" if len(names) == 2 and part(m) != FACADE else
                                ("__main__" if names[-1] == "__main__" else "__init__"))
    width, height = 13.0, 1.9 * len(rows) + 0.4
    fig, ax = plt.subplots(figsize=(width, height))
    ax.set_xlim(0, width)
    ax.set_ylim(0, height)
    ax.axis("off")
    centre: dict[str, tuple[float, float]] = {}
    for r, row in enumerate(rows):
        y = 0.3 + 1.9 * r
        box_w = min(3.0, (width - 0.4) / len(row) - 0.3)
        for i, p in enumerate(row):
            # alternate rows sideways, so that an arrow past a row misses its boxes
            shift = (r % 2 - 0.5) * 2.2 if len(row) == 1 else 0.0
            x = (width - len(row) * (box_w + 0.3)) / 2 + i * (box_w + 0.3) + 0.15 + shift
            label = p
            names = sorted(n for n in members[p] if n != "__init__" or p == FACADE)
            lines = textwrap.wrap(", ".join(names), 34)[:4]
            ax.add_patch(FancyBboxPatch((x, y), box_w, 1.2, boxstyle="round,pad=0.02",
                                        fc="#eef2f8", ec="#4c72b0"))
            ax.text(x + box_w / 2, y + 1.0, label, ha="center", va="center", fontsize=9,
                    weight="bold")
            ax.text(x + box_w / 2, y + 0.45, "\n".join(lines), ha="center", va="center",
                    fontsize=6.5, family="monospace")
            centre[p] = (x + box_w / 2, y)
    for src, dsts in arrows.items():
        for dst, n in dsts.items():
            (x0, y0), (x1, y1) = centre[src], centre[dst]
            ax.annotate("", xy=(x1, y1 + 1.2), xytext=(x0, y0),
                        arrowprops={"arrowstyle": "->", "color": "#888888",
                                    "lw": min(0.6 + 0.1 * n, 2.0), "shrinkA": 2, "shrinkB": 2,
                                    "connectionstyle": "arc3,rad=0.15"})
    fig.suptitle("pencilfft's parts: each imports only the parts below it (arrow: imports)",
                 fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _builder_inited(app: Any) -> None:
    out = Path(app.srcdir) / "_generated"
    out.mkdir(exist_ok=True)
    draw(out / "package.png")


def setup(app: Any) -> dict[str, Any]:
    app.connect("builder-inited", _builder_inited)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
