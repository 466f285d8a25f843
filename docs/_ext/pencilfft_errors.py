"""The troubleshooting page's list of every message the package raises or warns, from its source.

A line `.. pencilfft-errors::` in a Markdown page is replaced (Sphinx's `source-read` event) by
one `text` block per module of pencilfft/, each line `ErrorType: message`, with the f-strings'
fields shown as `{expression}`.  Read with `ast`: nothing is imported or run.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

PACKAGE = Path(__file__).resolve().parents[2] / "pencilfft"
MARKER = re.compile(r"^\.\. pencilfft-errors::[ \t]*$", re.M)
ERRORS = {"ValueError", "TypeError", "RuntimeError", "MemoryLimitError", "OSError",
          "ImportError", "FileNotFoundError", "NotImplementedError", "BuildError",
          "DifferentPlansError"}


def _text(node: ast.expr) -> str | None:
    """A message expression as readable text: constants as they are, fields as {expr}."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        out = []
        for part in node.values:
            if isinstance(part, ast.Constant):
                out.append(str(part.value))
            else:
                out.append("{" + ast.unparse(part.value) + "}")
        return "".join(out)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _text(node.left), _text(node.right)
        if left is not None and right is not None:
            return left + right
    if isinstance(node, ast.Name):
        return "{" + node.id + "}"
    return None


def _name(func: ast.expr) -> str:
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")


def messages(path: Path) -> list[str]:
    """`Type: message` for every raise and warning with a message in one module."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        call = None
        if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call):
            call, kind = node.exc, _name(node.exc.func)
            if kind not in ERRORS:
                continue
        elif (isinstance(node, ast.Call) and _name(node.func) == "warn"
              and isinstance(node.func, ast.Attribute)):
            call = node
            kind = _name(node.args[1]) if len(node.args) > 1 else "UserWarning"
        if call is None or not call.args:
            continue
        text = _text(call.args[0])
        if text:
            found.append((node.lineno, f"{kind}: {' '.join(text.split())}"))
    return [m for _, m in sorted(found)]


def errors_markdown() -> str:
    parts = []
    for path in sorted(PACKAGE.rglob("*.py")):
        found = messages(path)
        if found:
            parts.append(f"### `{path.relative_to(PACKAGE.parent)}`\n\n```text\n"
                         + "\n".join(found) + "\n```\n")
    return "\n".join(parts)


def _source_read(app, docname: str, source: list[str]) -> None:
    if MARKER.search(source[0]):
        source[0] = MARKER.sub(lambda m: errors_markdown(), source[0])


def setup(app) -> dict[str, Any]:
    app.connect("source-read", _source_read)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
