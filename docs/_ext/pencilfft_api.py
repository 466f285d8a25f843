"""The API pages, generated from the package's `__all__` while the site builds.

docs/api/pencilfft.rst and docs/api/compat.rst each end with a line `.. pencilfft-api:: MODULE`;
this extension replaces it (Sphinx's `source-read` event) with one autodoc entry per name of
`MODULE.__all__`, in that order.  A name added to `__all__` gets its entry without editing any
page, and tests/test_docs.py fails, naming it, if its docstring lacks the parts every entry has.
"""
from __future__ import annotations

import importlib
import inspect
import re
from enum import Enum
from types import ModuleType
from typing import Any

MARKER = re.compile(r"^\.\. pencilfft-api:: ([\w.]+)[ \t]*$", re.M)


def public_names(modname: str) -> list[str]:
    """`__all__` of `modname`, in its order (the order of the page)."""
    return list(importlib.import_module(modname).__all__)


def _entry(modname: str, name: str, obj: Any) -> str:
    """The reST of one entry (autodoc for what has a docstring of its own)."""
    full = f"{modname}.{name}"
    if isinstance(obj, ModuleType):
        # A submodule: its docstring, and the names it holds (each documented on this page).
        held = [n for n in getattr(obj, "__all__", ()) if not n.startswith("_")]
        text = f".. automodule:: {obj.__name__}\n   :no-members:\n"
        if held:
            text += "\n   Holds: " + ", ".join(f"`{n}`" for n in held) + ".\n"
        return text
    if inspect.isclass(obj) and issubclass(obj, BaseException):
        return f".. autoexception:: {full}\n   :members:\n"
    if inspect.isclass(obj) and issubclass(obj, Enum):
        members = ", ".join(f"`{m.name}` (= {m.value!r})" for m in obj)
        return f".. autoclass:: {full}\n   :no-members:\n\n   Members: {members}.\n"
    if inspect.isclass(obj):
        return f".. autoclass:: {full}\n   :members:\n"
    if callable(obj):
        return f".. autofunction:: {full}\n"
    # A value (an enum member, a settings object): its class's docstring says what it is.
    if isinstance(obj, Enum):
        doc = (f"`{type(obj).__name__}.{obj.name}` (value {obj.value!r}): "
               f"the constant of that name in jaxdecomp.  See `{type(obj).__name__}`.")
    else:  # its class's docstring, Google style as the functions' (napoleon turns it into reST)
        from sphinx.ext.napoleon import Config
        from sphinx.ext.napoleon.docstring import GoogleDocstring

        doc = str(GoogleDocstring(inspect.getdoc(type(obj)) or "", Config()))
    body = "\n".join("   " + line if line else "" for line in doc.splitlines())
    return f".. py:data:: {name}\n   :module: {modname}\n\n{body}\n"


def api_rst(modname: str) -> str:
    """Every public name of `modname` as an autodoc entry, under a heading of its own."""
    mod = importlib.import_module(modname)
    parts = []
    for name in public_names(modname):
        title = f"{name}"
        parts.append(f"{title}\n{'-' * len(title)}\n\n{_entry(modname, name, getattr(mod, name))}")
    return "\n".join(parts)


def _source_read(app, docname: str, source: list[str]) -> None:
    def block(match: re.Match) -> str:
        return api_rst(match.group(1))

    source[0] = MARKER.sub(block, source[0])


def setup(app) -> dict[str, Any]:
    app.connect("source-read", _source_read)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
