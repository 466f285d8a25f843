"""Sphinx configuration of pencilfft's documentation.

Build (from the repository root, after `pip install -e ".[docs]"`):

    sphinx-build -W --keep-going -b html docs docs/_build/html

The toolchain is the JAX ecosystem's: Sphinx, MyST Markdown pages, autodoc for the API, and
sphinx-book-theme.  The API pages are generated from `pencilfft.__all__` and
`pencilfft.compat.__all__` (docs/_ext/pencilfft_api.py), and the figures are drawn while the
site builds (docs/_ext/pencilfft_figures.py, and the package's picture from its imports,
docs/_ext/pencilfft_package.py): nothing generated is committed.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
sys.path[:0] = [str(ROOT), str(DOCS / "_ext")]  # the checkout's pencilfft and benchmarks
# Importing pencilfft imports jax: keep it on the CPU, whatever the machine building the docs has.
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import pencilfft  # noqa: E402

project = "pencilfft"
author = "pencilfft developers"
copyright = "2026, pencilfft developers"
release = version = pencilfft.__version__

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "pencilfft_api",
    "pencilfft_figures",
    "pencilfft_package",
    "pencilfft_errors",
]
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
root_doc = "index"
exclude_patterns = ["_build", "_generated/*.md", "Thumbs.db", ".DS_Store"]
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3  # [text](page.md#a-heading) links are checked like references

# In the docstrings, `name` is code (as in the README and the error messages).
default_role = "code"
# Every cross-reference must resolve: a renamed function breaks the build, not a link.
nitpicky = True
# Types named in signatures that live in other projects (no intersphinx: the build works offline).
nitpick_ignore_regex = [
    (r"py:.*", r"(jax|jaxlib|numpy|np|jnp|mpi4py|types|enum|collections|typing)(\..*)?"),
    (r"py:.*", r"(Any|Array|ArrayLike|Mesh|NamedSharding|PartitionSpec|Sequence|Callable|DTypeLike|ModuleType)"),
]
autodoc_member_order = "bysource"
autodoc_typehints = "none"  # shapes and types are in each docstring's words; signatures stay short
autodoc_preserve_defaults = True
napoleon_google_docstring = True
napoleon_numpy_docstring = False

html_theme = "sphinx_book_theme"
html_title = f"pencilfft {release}"
html_theme_options = {"show_toc_level": 2}
html_static_path: list[str] = []
