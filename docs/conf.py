"""Sphinx configuration of functrain's documentation site (``make docs``).

Sphinx, as optax, JAX and Flax use: autodoc reads the docstrings, napoleon their Google-style
``Args:``/``Returns:`` sections, MyST-NB the Markdown pages under ``docs/`` and the notebooks
in ``colabs/`` (copied to ``docs/notebooks/``). The build is strict: ``make docs`` passes
``-W --keep-going -n`` (every warning is an error, every cross-reference must resolve).

Environment:
  FUNCTRAIN_DOCS_EXECUTE: ``1`` (the default) executes the notebooks at build time, cached
    under ``docs/_build/.jupyter_cache`` until a notebook changes; ``0`` renders them as stored
    (no outputs). The test suite builds with ``0``: ``tests/test_notebooks.py`` already
    executes every notebook and checks its outputs.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(DOCS / "_ext"))

import functrain  # noqa: E402

# The notebooks live in colabs/ (where Colab and the tests open them); the site renders
# copies under docs/notebooks/ (not in git), refreshed only when a notebook changed.
NOTEBOOKS = DOCS / "notebooks"
NOTEBOOKS.mkdir(exist_ok=True)
for _nb in sorted((ROOT / "colabs").glob("*.ipynb")):
    _copy = NOTEBOOKS / _nb.name
    if not _copy.exists() or _copy.read_bytes() != _nb.read_bytes():
        _copy.write_bytes(_nb.read_bytes())
for _stale in NOTEBOOKS.glob("*.ipynb"):
    if not (ROOT / "colabs" / _stale.name).exists():
        _stale.unlink()

project = "functrain"
author = "the functrain authors"
copyright = "2026, the functrain authors"
version = release = getattr(functrain, "__version__", "")

extensions = [
    "myst_nb",
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
    "repo_links",
    "api_refs",
    "declared_modules",
]

exclude_patterns = ["_build", "_ext", "**.ipynb_checkpoints", "README.md"]
source_suffix = {".rst": "restructuredtext", ".md": "myst-nb", ".ipynb": "myst-nb"}
root_doc = "index"

# --- the API reference -------------------------------------------------------------------
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_preserve_defaults = True
autosummary_generate = False
autodoc_type_aliases = {name: f"functrain.{name}" for name in (
    "Schedule", "MaskOrFn", "OptState", "Params", "ScalarOrSchedule", "Updates",
    "TransformInitFn", "TransformUpdateFn", "TransformUpdateExtraArgsFn")}
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False
napoleon_attr_annotations = False  # the Attributes sections say what a field holds
add_module_names = True
python_display_short_literal_types = True
# One parameter per line once a signature is longer than this (optimizers have many).
python_maximum_signature_line_length = 88

# Strict cross-references (-n): every reference to a functrain name must resolve. Names of
# other libraries cannot (no intersphinx: the build runs offline), so they are listed here.
nitpicky = True
nitpick_ignore_regex = [
    (r"py:.*", r"(jax|jaxlib|chex|numpy|np|jnp|optax|typing|typing_extensions|collections"
               r"|enum|types|abc|builtins|functools)(\..*)?"),
    (r"py:.*", r"(Any|Callable|Optional|Union|NamedTuple|Sequence|Mapping|Iterable|Hashable"
               r"|Protocol|TypeVar|Literal|Array|ArrayTree|PyTree|Numeric|Shape|DType|PRNGKey"
               r"|ArrayLike|DTypeLike|KeyArray|Mesh|NamedSharding|PartitionSpec|Sharding"
               r"|int|float|bool|str|complex|tuple|list|dict|object|None|NoneType|ellipsis)"),
]

# --- Markdown and notebooks --------------------------------------------------------------
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3
nb_execution_mode = "cache" if os.environ.get("FUNCTRAIN_DOCS_EXECUTE", "1") != "0" else "off"
nb_execution_cache_path = str(DOCS / "_build" / ".jupyter_cache")
nb_execution_timeout = 600
nb_execution_raise_on_error = True
nb_execution_show_tb = True
# Notebook 05 reads the benchmark results of this checkout wherever the kernel runs.
os.environ.setdefault("FUNCTRAIN_BENCH_JSON",
                      str(ROOT / "benchmarks" / "results" / "latest.json"))

# --- the HTML ----------------------------------------------------------------------------
html_theme = "furo"
html_title = "functrain"
html_static_path: list[str] = []
html_show_sourcelink = False
