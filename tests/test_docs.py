"""The documentation site: a strict build, every public name in the API reference, and the
guides' code runs.

* ``test_site_builds_strictly`` runs ``make docs``'s Sphinx command (``-W``: warnings are
  errors, ``-n``: every cross-reference must resolve) into a temporary directory, with the
  notebooks rendered as stored (``FUNCTRAIN_DOCS_EXECUTE=0``): ``tests/test_notebooks.py``
  executes them and checks their outputs; ``make docs`` renders them executed.
* ``test_every_public_name_has_a_reference_entry`` enumerates functrain's public names from
  the package (the top level, ``functrain.contrib`` and its family modules' ``__all__``, and
  the public sub-modules) and fails on any object that no ``auto*`` / ``py:*`` directive of
  ``docs/api/`` documents; the strict build makes sure those directives render.
* ``test_guide_code_runs`` executes every ``python`` code block of the guides that carry
  runnable code (the home page, getting started, coming from optax) as a script.
"""

from __future__ import annotations

import importlib
import inspect
import os
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest

import functrain
import functrain.contrib

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
sys.path.insert(0, str(DOCS / "_ext"))

import api_refs  # noqa: E402
import declared_modules  # noqa: E402
import repo_links  # noqa: E402
from helpers import TYPE_ALIASES, api_pages  # noqa: E402

# Namespaces users import from, besides the family modules behind functrain.contrib.
NAMESPACES = ["functrain", "functrain.contrib", "functrain.tree", "functrain.schedules",
              "functrain.numerics", "functrain.linalg", "functrain.projections",
              "functrain.microbatching", "functrain.sharding", "functrain.grad",
              "functrain.compat", "functrain.matrix.blocks",
              "functrain.matrix.kron_factors", "functrain.losses"]
DIRECTIVE = re.compile(r"^\s*\.\. (?:auto(?:function|class|data)|py:(?:function|class|data))"
                       r"::\s+([\w.]+)", re.MULTILINE)


def public_names() -> dict[str, object]:
    """Every public name (dotted path -> object) of the namespaces and of the family modules
    whose names functrain.contrib re-exports."""
    behind_contrib = {getattr(obj, "__module__", "") for obj in vars(functrain.contrib).values()}
    modules = list(NAMESPACES) + sorted(m for m in behind_contrib
                                        if m.startswith("functrain.families."))
    found = {}
    for module_name in modules:
        module = importlib.import_module(module_name)
        names = getattr(module, "__all__", None)
        if names is None:  # no __all__: the names this package defines (not its imports)
            names = [n for n in dir(module) if not n.startswith("_")
                     and (n in TYPE_ALIASES
                          or (getattr(getattr(module, n), "__module__", "") or "")
                          .startswith("functrain"))]
        for name in names:
            obj = getattr(module, name)
            if not isinstance(obj, types.ModuleType):
                found[f"{module_name}.{name}"] = obj
    return found


def documented(pages: dict[str, str] | None = None) -> dict[str, object]:
    """dotted path -> object for every name a directive of docs/api/ documents."""
    out = {}
    for text in (api_pages() if pages is None else pages).values():
        for path in DIRECTIVE.findall(text):
            module_name, _, attr = path.rpartition(".")
            out[path] = getattr(importlib.import_module(module_name), attr)
    return out


def test_public_names_are_found():
    names = public_names()
    for path in ["functrain.lamb", "functrain.contrib.muon", "functrain.tree.add",
                 "functrain.schedules.cosine_decay_schedule", "functrain.sharding.zero_shardings",
                 "functrain.families.parameter_free.parameter_free.scale_by_dog",
                 "functrain.families.muon.radius_pin.radius_pin_step",
                 "functrain.ScalarOrSchedule"]:
        assert path in names, path
    assert len({id(o) for o in names.values()}) >= 340


def undocumented(pages: dict[str, str] | None = None) -> list[str]:
    """The public names (dotted paths) that no directive of ``pages`` documents."""
    docs = documented(pages)
    documented_objects = {id(obj) for path, obj in docs.items()
                          if path.rsplit(".", 1)[1] not in TYPE_ALIASES}
    missing = []
    for path, obj in sorted(public_names().items()):
        short = path.rsplit(".", 1)[1]
        if short in TYPE_ALIASES:
            ok = f"functrain.{short}" in docs
        else:
            ok = id(obj) in documented_objects
        if not ok:
            missing.append(path)
    return missing


def test_every_public_name_has_a_reference_entry():
    missing = undocumented()
    assert not missing, (f"{len(missing)} public names have no entry in docs/api/*.rst "
                         f"(add an autofunction/autoclass line in the right group, or the "
                         f"name to its module's __all__ where a '.. declared-modules::' "
                         f"generates the module's entries):\n  "
                         + "\n  ".join(missing))


def test_reference_entries_are_not_repeated():
    seen = {}
    for name, text in api_pages().items():
        for path in re.findall(r"^\.\. auto(?:function|class)::\s+([\w.]+)", text, re.MULTILINE):
            assert path not in seen, f"{path} documented in {name} and {seen[path]}"
            seen[path] = name


@pytest.mark.long
def test_site_builds_strictly(tmp_path):
    env = dict(os.environ, FUNCTRAIN_DOCS_EXECUTE="0")
    result = subprocess.run(
        [sys.executable, "-m", "sphinx", "-b", "html", "-n", "-W", "--keep-going", "-q",
         str(DOCS), str(tmp_path / "html")],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert result.returncode == 0, f"strict build failed:\n{result.stderr[-6000:]}"
    site = tmp_path / "html"
    page = (site / "api" / "optimizers.html").read_text()
    start = page.index('id="functrain.lamb"')
    signature = re.sub(r"<[^>]+>|\s", "", page[start:page.index("</dt>", start)])
    for parameter in inspect.signature(functrain.lamb).parameters:
        assert f"{parameter}:" in signature, (parameter, signature)
    for page in ["getting_started", "coming_from_optax", "migration", "scaling", "performance",
                 "design", "notebooks/01_quickstart", "api/contrib", "search"]:
        assert (site / f"{page}.html").exists(), page
    assert "functrain.lamb" in (site / "searchindex.js").read_text()
    broken = broken_links(site)
    assert not broken, f"{len(broken)} broken links in the built site:\n  " + "\n  ".join(broken[:40])


HREF = re.compile(r'(?:href|src)="([^"]+)"')


def broken_links(site: Path) -> list[str]:
    """Every relative href/src of the built pages whose file, or #anchor in it, is missing."""
    ids: dict[Path, set[str]] = {}

    def anchors(page: Path) -> set[str]:
        if page not in ids:
            ids[page] = set(re.findall(r'\bid="([^"]+)"', page.read_text(errors="replace")))
        return ids[page]

    broken = []
    for page in sorted(site.rglob("*.html")):
        if "_modules" in page.parts:  # viewcode's source pages
            continue
        for target in set(HREF.findall(page.read_text(errors="replace"))):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("//"):
                continue  # http(s):, mailto:, data:, javascript: (not checkable offline)
            path_part, _, fragment = target.partition("#")
            path_part = path_part.split("?", 1)[0]
            file = (page.parent / path_part).resolve() if path_part else page
            if file.is_dir():
                file = file / "index.html"
            where = f"{page.relative_to(site)} -> {target}"
            if not file.exists():
                broken.append(where)
            elif fragment and file.suffix == ".html" and fragment not in anchors(file):
                broken.append(where)
    return broken


def code_blocks(page: Path) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", page.read_text(), re.MULTILINE | re.DOTALL)


@pytest.mark.parametrize("page", ["index.md", "getting_started.md", "coming_from_optax.md"])
def test_guide_code_runs(page):
    blocks = code_blocks(DOCS / page)
    assert blocks, f"{page} has no python code block"
    namespace: dict = {}
    for block in blocks:
        exec(compile(block, f"docs/{page}", "exec"), namespace)


SOURCED = re.compile(r"^<!-- from (\S+) -->\n```python\n(.*?)^```", re.MULTILINE | re.DOTALL)


def test_design_guide_code_is_the_packages_and_runs():
    """docs/design.md's worked example: each block marked ``<!-- from PATH -->`` must appear
    verbatim in PATH (so the guide cannot drift from the code), and the other blocks run."""
    text = (DOCS / "design.md").read_text()
    sourced = SOURCED.findall(text)
    assert len(sourced) >= 3, "design.md's worked example lost its sourced blocks"
    root = DOCS.parent
    for path, block in sourced:
        assert block in (root / path).read_text(), (
            f"docs/design.md quotes {path}, but this block is no longer in it:\n{block}")
    quoted = {block for _, block in sourced}
    runnable = [b for b in code_blocks(DOCS / "design.md") if b not in quoted]
    assert runnable, "design.md has no runnable block"
    namespace: dict = {}
    for block in runnable:
        exec(compile(block, "docs/design.md", "exec"), namespace)


# --- the build extensions ----------------------------------------------------------------

def test_repo_links_rewrite_links_that_leave_docs():
    page = DOCS / "design.md"
    text = ("[Home](../README.md) [nb](../colabs/01_quickstart.ipynb) "
            "[`base.py`](../functrain/engine/protocol.py) [dir](../functrain/families/) "
            "[p](performance.md#tips) [web](https://example.org/x.md) [gone](../nothing.py) "
            "![plot](../benchmarks/results/latest.png)")
    out = repo_links.rewrite(text, page, DOCS)
    assert "[Home](index.md)" in out
    assert "[nb](notebooks/01_quickstart.ipynb)" in out
    assert "{download}`base.py <../functrain/engine/protocol.py>`" in out
    assert " dir " in out and "(../functrain/families/)" not in out
    for unchanged in ["[p](performance.md#tips)", "[web](https://example.org/x.md)",
                      "[gone](../nothing.py)", "![plot](../benchmarks/results/latest.png)"]:
        assert unchanged in out
    nested = repo_links.rewrite("[Home](../../README.md)", DOCS / "api" / "index.md", DOCS)
    assert nested == "[Home](../index.md)"


def test_api_refs_find_prefers_the_public_names():
    objects = {"functrain.adam": 1, "functrain.families.muon.muon": 2, "functrain.tree.add": 3,
               "functrain.families.parameter_free.parameter_free.scale_by_dog": 4, "functrain.scale": 5,
               "functrain.tree.scale": 6}
    assert api_refs.find(objects, "adam") == "functrain.adam"
    assert api_refs.find(objects, "functrain.families.adam.optimizers.adam") == "functrain.adam"
    assert api_refs.find(objects, "'functrain.families.muon.muon'") == "functrain.families.muon.muon"
    assert api_refs.find(objects, "add") == "functrain.tree.add"
    assert api_refs.find(objects, "scale_by_dog") == "functrain.families.parameter_free.parameter_free.scale_by_dog"
    assert api_refs.find(objects, "scale") == "functrain.scale"
    assert api_refs.find(objects, "nothing") is None


def test_declared_modules_generate_each_modules_entries(monkeypatch):
    """``.. declared-modules:: beyond optax`` gives every module of the group its section, the
    known ones in the page's order and a new one after them (before the sections kept last),
    titled from its docstring."""
    from functrain.declarations import OPTIMIZERS, Declared

    text = declared_modules.expand(".. declared-modules:: beyond optax\n")
    titles = re.findall(r"^(.+)\n-+$", text, re.MULTILINE)
    assert titles[:3] == ["Beyond optax: Shampoo", "Beyond optax: SOAP",
                          "Beyond optax: Kron (PSGD)"], titles
    assert titles[-1] == "Beyond optax: modifiers for any optimizer", titles
    assert ".. autofunction:: functrain.contrib.laprop\n" in text
    assert ".. autoclass:: functrain.contrib.DecaySchedule\n   :members: bias_correction\n" in text
    text = declared_modules.expand(".. declared-modules:: contrib\n")  # modules of one title
    section = text[text.index("Mechanic and COCOB\n"):text.index("Adam variants")]  # share it
    assert "functrain.contrib.mechanize\n" in section and "functrain.contrib.cocob\n" in section
    assert "NormalizeState" not in text  # EmptyState's other name: on building_blocks.rst

    module = types.ModuleType("functrain.families.zz.zz_planted", "Zed (Z et al., 2031): a plant.")
    def zz(learning_rate): """A planted optimizer."""
    class ZzState: """Its state."""
    zz.__module__ = ZzState.__module__ = module.__name__
    module.zz, module.ZzState, module.__all__ = zz, ZzState, ["zz", "ZzState"]
    monkeypatch.setitem(sys.modules, module.__name__, module)
    monkeypatch.setitem(OPTIMIZERS, "zz", Declared("zz", module.__name__, zz, "beyond optax",
                                                   "Z et al., 2031", None, False))
    text = declared_modules.expand(".. declared-modules:: beyond optax\n")
    zed = ("Beyond optax: Zed\n-----------------\n\n.. autosummary::\n\n"
           "   functrain.families.zz.zz_planted.zz\n"
           "   functrain.families.zz.zz_planted.ZzState\n\n"
           ".. autofunction:: functrain.families.zz.zz_planted.zz\n\n"
           ".. autoclass:: functrain.families.zz.zz_planted.ZzState\n")
    titles = re.findall(r"^(.+)\n-+$", text, re.MULTILINE)  # the new one before the modifiers
    assert titles[-2:] == ["Beyond optax: Zed", "Beyond optax: modifiers for any optimizer"]
    assert zed + "\n" in text, text[-1200:]
    with pytest.raises(ValueError, match="group"):
        declared_modules.expand(".. declared-modules:: beyond optx\n")


def test_a_public_name_left_out_of_its_modules_all_is_reported(monkeypatch):
    """The generated entries are a module's ``__all__``: a name functrain.contrib exports but
    its module's ``__all__`` leaves out has no entry, and the coverage check names it."""
    laprop = importlib.import_module("functrain.families.adam.laprop")
    monkeypatch.setattr(laprop, "__all__", ["ScaleByLapropState", "laprop"])
    assert undocumented() == ["functrain.contrib.scale_by_laprop"]


def test_readme_stays_short():
    """The README is the front door: it stays short enough to read through; details live
    in docs/, reached by its links."""
    lines = (DOCS.parent / "README.md").read_text().splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines; move details into docs/"
