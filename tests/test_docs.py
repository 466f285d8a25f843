"""The documentation site builds with no warnings (warnings are errors, every cross-reference
must resolve), documents every public name with an example, shows its figures, and includes
every script of examples/.

The build runs once per session (`sphinx-build -W --keep-going`, as docs/conf.py and
.readthedocs.yaml say); it draws its figures but executes no transform (tests/test_examples.py
runs the examples).
"""
from __future__ import annotations

import enum
import html
import html.parser
import inspect
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

import pencilfft
import pencilfft.compat

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
API_PAGES = {"pencilfft": "api/pencilfft.html", "pencilfft.compat": "api/compat.html"}
# Figures each page must show (drawn while the site builds, docs/_ext/pencilfft_figures.py).
FIGURES = {
    "concepts.html": {"stages.png", "layouts.png", "batch.png"},
    "benchmarks.html": {"stored_cpu8_grid.png", "stored_gpu_h100.png", "stored_mpi.png",
                        "stored_memory.png", "stored_cpu8_bars_256x256x256_complex64.png"},
    "howto/memory.html": {"stored_memory.png"},
    "howto/any-layout.html": {"any_layout_routes.png"},
}


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The built site (HTML), built once for this module."""
    out = tmp_path_factory.mktemp("site")
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html",
             str(DOCS), str(out)], capture_output=True, text=True, timeout=600, env=env, cwd=ROOT)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"the docs build still ran after 600 s:\n{e.stdout}\n{e.stderr}")
    assert proc.returncode == 0, (
        "the docs build failed or warned (pip install -e \".[docs]\", then run "
        "sphinx-build -W --keep-going -b html docs docs/_build/html):\n" + proc.stdout + proc.stderr)
    return out


class _Page(html.parser.HTMLParser):
    """The ids and the <img> sources of one HTML page."""

    def __init__(self, text: str):
        super().__init__()
        self.ids: set[str] = set()
        self.images: list[str] = []
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if "id" in attrs:
            self.ids.add(attrs["id"])
        if tag == "img" and attrs.get("src"):
            self.images.append(attrs["src"])


def _public(module: ModuleType) -> dict[str, object]:
    return {name: getattr(module, name) for name in module.__all__}


def _needs_example(obj) -> bool:
    """Functions and classes (not enums, constants, settings objects or submodules)."""
    if isinstance(obj, ModuleType) or isinstance(obj, enum.Enum):
        return False
    if inspect.isclass(obj):
        return not issubclass(obj, enum.Enum)
    return callable(obj)


@pytest.mark.parametrize("module", [pencilfft, pencilfft.compat], ids=lambda m: m.__name__)
def test_every_public_name_has_an_api_entry(module, site):
    page = _Page((site / API_PAGES[module.__name__]).read_text())
    missing = []
    for name, obj in _public(module).items():
        target = (f"module-{obj.__name__}" if isinstance(obj, ModuleType)
                  else f"{module.__name__}.{name}")
        if target not in page.ids:
            missing.append(name)
    assert not missing, (f"{API_PAGES[module.__name__]} has no entry for {module.__name__}."
                         f"{', '.join(missing)} (docs/_ext/pencilfft_api.py makes one per name "
                         "of __all__: is the name in __all__?)")


@pytest.mark.parametrize("module", [pencilfft, pencilfft.compat], ids=lambda m: m.__name__)
def test_every_public_function_has_an_example(module):
    """Each entry shows a call: an `Example:` section with a doctest in its docstring."""
    missing = [name for name, obj in _public(module).items() if _needs_example(obj)
               and not ("Example" in (doc := inspect.getdoc(obj) or "") and ">>> " in doc)]
    assert not missing, (f"these public names of {module.__name__} have no `Example:` section "
                         f"with a `>>>` call in their docstring: {', '.join(missing)}")


def test_pages_show_their_figures(site):
    """Every <img> of every page names a file of the build, and each page has its figures."""
    for path in site.rglob("*.html"):
        for src in _Page(path.read_text()).images:
            if src.startswith(("http:", "https:", "data:")):
                continue
            assert (path.parent / src).resolve().is_file(), f"{path.name}: <img src={src!r}> is missing"
    for page, figures in FIGURES.items():
        shown = {Path(src).name for src in _Page((site / page).read_text()).images}
        assert figures <= shown, f"{page} lacks {sorted(figures - shown)}"
        for name in figures:
            assert (site / "_images" / name).stat().st_size > 10_000, name  # a drawn figure


def test_every_example_is_in_the_docs(site):
    """Each script of examples/ is included (literalinclude) in a page, whole."""
    pages = "\n".join(p.read_text() for p in DOCS.rglob("*.md"))
    # the text of the pages, without the highlighter's tags
    built = html.unescape(re.sub(r"<[^>]+>", "", "\n".join(p.read_text() for p in site.rglob("*.html"))))
    scripts = sorted((ROOT / "examples").glob("*.py"))
    assert scripts
    for script in scripts:
        assert f"../../examples/{script.name}" in pages, f"no page includes examples/{script.name}"
        defs = [line for line in script.read_text().splitlines() if line.startswith("def ")]
        assert all(d in built for d in defs), f"examples/{script.name} is not in the built site"


def test_troubleshooting_lists_every_module_that_raises(site):
    """The generated list of messages covers the package (one section per module that raises)."""
    text = (site / "troubleshooting.html").read_text()
    for module in ("_transforms/plan.py", "_processes/io.py", "_processes/memory.py",
                   "_processes/launch.py", "compat/_config.py"):
        assert f"pencilfft/{module}" in text, module


# Runs every public name's doctests in one fresh process with 8 simulated CPU devices (the
# examples assume a 4x2 mesh and jax's default 32-bit types).
DOCTESTS = """
import doctest, sys
import jax, jax.numpy as jnp, numpy as np
import pencilfft, pencilfft.compat
failed = tried = 0
for module in (pencilfft, pencilfft.compat):
    for name in module.__all__:
        globs = dict(jax=jax, jnp=jnp, np=np, pencilfft=pencilfft)
        runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
        for test in doctest.DocTestFinder(recurse=False).find(getattr(module, name),
                                                              f"{module.__name__}.{name}",
                                                              globs=globs):
            runner.run(test)
        failed += runner.failures
        tried += runner.tries
print(f"doctests: {tried} examples, {failed} failed")
sys.exit(1 if failed or not tried else 0)
"""


def test_docstring_examples_run(tmp_path):
    """The API pages' examples (the docstrings' `>>>` lines) give what they show."""
    from conftest import clean_env

    proc = subprocess.run([sys.executable, "-c", DOCTESTS], capture_output=True, text=True,
                          timeout=600, env=clean_env(8), cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-20000:] + proc.stderr[-5000:]
    assert " 0 failed" in proc.stdout, proc.stdout
