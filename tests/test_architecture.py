"""The package's shape, read from the source with ``ast`` (nothing is imported).

* (a) No module uses another functrain module's private names (``_name``): neither
  ``from functrain.x import _y`` nor ``x._y`` on an imported functrain module.
* (b) Imports point only down the layers of docs/design.md:

  ========================================  ==========================================
  file                                      may import from functrain only
  ========================================  ==========================================
  tree_checks.py, arg_checks.py,            nothing
  jax_compat.py
  tree_ops.py, tree_state.py                tree_checks (optax.tree's functions: math,
                                            state helpers)
  tree.py                                   tree_checks, tree_ops, tree_state (L0)
  numerics.py                               tree
  grad, ivy_updates, sharding, schedules,  tree, numerics (beside the stack, L0 only)
  projections, microbatching, linalg,
  param_updates, tree_utils
  transforms/base.py                        tree, numerics
  transforms/recompute.py                   tree, numerics
  transforms/engine.py                      tree, numerics, base, recompute
  transforms/<family>.py                    tree, numerics, base, engine (no other family;
                                            any other file of transforms/ is a family)
  wrappers/*.py, whole_tree/*.py            tree, numerics, base, engine
  optimizers/*.py                           tree, numerics, transforms.*, whole_tree.* (no
                                            wrappers, no other optimizers file)
  contrib/*.py                              tree, numerics, schedules, linalg, transforms.*,
                                            whole_tree.*, wrappers.*, optimizers.* (no other contrib
                                            module)
  <package>/__init__.py                     its own package's modules (functrain/ itself:
                                            anything: it only re-exports)
  ========================================  ==========================================

  "tree" includes tree_checks (the key-path checks tree.py re-exports), arg_checks
  (the hyperparameter, transformation and state checks) and jax_compat (the JAX APIs that
  differ between the supported versions). A new
  file fails until it is given a rule here.
* (c) No file is over 650 lines, except those in ``LONG_FILES`` with a reason.

Each failure names the file and the offending import or name.
"""

from __future__ import annotations

import ast
import pathlib
from typing import Optional

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "functrain"
MAX_LINES = 650
# path relative to functrain/ -> why it may be longer than MAX_LINES.
LONG_FILES: dict[str, str] = {}

# L0: the tree modules and the argument checks every layer above may use.
TREE = {"functrain.tree", "functrain.tree_checks", "functrain.tree_ops", "functrain.tree_state",
        "functrain.arg_checks", "functrain.jax_compat"}
NUMERICS = {"functrain.numerics"}
BASE, ENGINE = "functrain.transforms.base", "functrain.transforms.engine"
RECOMPUTE = "functrain.transforms.recompute"
# Every other module of transforms/ is a stage family (found on disk, so a new family
# needs no entry here).
FAMILIES = {f"functrain.transforms.{p.stem}"
            for p in (pathlib.Path(__file__).resolve().parent.parent / "functrain"
                      / "transforms").glob("*.py")
            if p.stem not in ("__init__", "base", "engine", "recompute")}


def module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


FILES = sorted(PACKAGE.rglob("*.py"))
MODULES = {module_name(p): p for p in FILES}


def allowed_imports(module: str) -> Optional[object]:
    """The functrain modules ``module`` may import: a set, a predicate, or None (no rule)."""
    path = MODULES[module]
    if module == "functrain":
        return lambda target: True  # the public surface: re-exports only
    if path.name == "__init__.py":  # a sub-package: its own modules
        return lambda target: target.startswith(module + ".")
    if module in ("functrain.tree_checks", "functrain.arg_checks", "functrain.jax_compat"):
        return set()
    if module in ("functrain.tree_ops", "functrain.tree_state"):
        return {"functrain.tree_checks"}
    if module == "functrain.tree":
        return {"functrain.tree_checks", "functrain.tree_ops", "functrain.tree_state"}
    if module == "functrain.numerics":
        return TREE
    if module in {"functrain.grad", "functrain.ivy_updates", "functrain.sharding",
                  "functrain.schedules", "functrain.projections", "functrain.microbatching",
                  "functrain.linalg", "functrain.param_updates", "functrain.tree_utils",
                  "functrain.quantization"}:
        return TREE | NUMERICS
    if module == BASE:
        return TREE | NUMERICS
    if module == RECOMPUTE:
        return TREE | NUMERICS
    if module == ENGINE:
        return TREE | NUMERICS | {BASE, RECOMPUTE}
    if module in FAMILIES:
        return TREE | NUMERICS | {BASE, ENGINE}
    if module.startswith("functrain.wrappers.") or module.startswith("functrain.whole_tree."):
        return TREE | NUMERICS | {BASE, ENGINE}
    if module.startswith("functrain.contrib."):
        return lambda target: (target in TREE | NUMERICS | {"functrain.schedules",
                                                            "functrain.linalg"}
                               or target.startswith(("functrain.transforms.",
                                                     "functrain.whole_tree.",
                                                     "functrain.wrappers.",
                                                     "functrain.optimizers.")))
    if module.startswith("functrain.optimizers."):
        return lambda target: (target in TREE | NUMERICS
                               or target.startswith(("functrain.transforms.",
                                                     "functrain.whole_tree.")))
    if module == "functrain.quantized_state":  # a wrapper whose presets name optimizers
        return lambda target: (target in TREE | NUMERICS | {BASE, ENGINE,
                                                            "functrain.quantization"}
                               or target.startswith("functrain.optimizers."))
    return None


def is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


class Imports:
    """The functrain imports of one file: edges (module, line, text) and private-name uses."""

    def __init__(self, module: str, source: str, is_package: bool = False):
        self.module = module
        self.package = module if is_package else module.rpartition(".")[0]
        self.edges: list[tuple[str, int, str]] = []
        self.private: list[tuple[int, str]] = []
        self.bound: dict[str, str] = {}  # local name -> functrain module it is bound to
        tree = ast.parse(source)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                self._import(node)
            elif isinstance(node, ast.ImportFrom):
                self._import_from(node)
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute):
                self._attribute(node)

    def _import(self, node: ast.Import) -> None:
        for alias in node.names:
            if alias.name != "functrain" and not alias.name.startswith("functrain."):
                continue
            self.edges.append((alias.name, node.lineno, f"import {alias.name}"))
            self._check_path(alias.name, node.lineno)
            if alias.asname:
                self.bound[alias.asname] = alias.name
            else:
                self.bound["functrain"] = "functrain"

    def _import_from(self, node: ast.ImportFrom) -> None:
        if node.level:
            parts = self.package.split(".")
            base = ".".join(parts[:len(parts) - node.level + 1])
            source = f"{base}.{node.module}" if node.module else base
        else:
            source = node.module or ""
        if source != "functrain" and not source.startswith("functrain."):
            return
        self._check_path(source, node.lineno)
        for alias in node.names:
            text = f"from {source} import {alias.name}"
            submodule = f"{source}.{alias.name}"
            if submodule in MODULES:
                self.edges.append((submodule, node.lineno, text))
                self.bound[alias.asname or alias.name] = submodule
            else:
                self.edges.append((source, node.lineno, text))
            if is_private(alias.name):
                self.private.append((node.lineno, text))

    def _check_path(self, dotted: str, line: int) -> None:
        if any(is_private(part) for part in dotted.split(".")):
            self.private.append((line, f"import of the private module {dotted}"))

    def _attribute(self, node: ast.Attribute) -> None:
        chain = []
        current: ast.AST = node
        while isinstance(current, ast.Attribute):
            chain.append(current.attr)
            current = current.value
        if not isinstance(current, ast.Name) or current.id not in self.bound:
            return
        chain.reverse()
        target = self.bound[current.id]
        for i, attr in enumerate(chain):
            if f"{target}.{attr}" in MODULES:
                target = f"{target}.{attr}"
                continue
            # Only the outermost Attribute node reports (inner ones are its prefixes).
            if i == len(chain) - 1 and is_private(attr) and target != self.module:
                written = ".".join([current.id] + chain)
                self.private.append((node.lineno, f"{written} (private name of {target})"))
            return


def analyse(path: pathlib.Path) -> Imports:
    return Imports(module_name(path), path.read_text(), is_package=path.name == "__init__.py")


ANALYSED = {module_name(p): analyse(p) for p in FILES}


def where(module: str, line: int) -> str:
    return f"{MODULES[module].relative_to(ROOT)}:{line}"


# --------------------------------------------------------------------------
# The analysis itself finds what it should (so the checks below can fail)
# --------------------------------------------------------------------------

def test_the_analysis_sees_imports_and_private_uses():
    source = ("from functrain import tree as ft\n"
              "from functrain.transforms.base import _concrete, check_range\n"
              "from . import engine\n"
              "import functrain.numerics\n"
              "def f():\n"
              "    from functrain.transforms import recompute\n"
              "    return (ft._fmt_paths, ft.norm, engine._x, recompute.applies,\n"
              "            functrain.numerics._y, ft.MaskedNode.__name__)\n")
    found = Imports("functrain.transforms.adam", source)
    assert {e[0] for e in found.edges} == {"functrain.tree", BASE, ENGINE, RECOMPUTE,
                                          "functrain.numerics"}
    private = sorted(text for _, text in found.private)
    assert private == ["engine._x (private name of functrain.transforms.engine)",
                       "from functrain.transforms.base import _concrete",
                       "ft._fmt_paths (private name of functrain.tree)",
                       "functrain.numerics._y (private name of functrain.numerics)"], private


def test_the_real_import_graph_is_read():
    edges = {(m, e[0]) for m, a in ANALYSED.items() for e in a.edges}
    for edge in [(ENGINE, RECOMPUTE), (ENGINE, BASE), ("functrain.numerics", "functrain.tree"),
                 ("functrain.optimizers.adam_family", "functrain.transforms.adam"),
                 ("functrain.wrappers.masking", ENGINE), ("functrain", "functrain.grad")]:
        assert edge in edges, edge
    assert len(FILES) >= 30


def test_the_rules_reject_upward_and_sideways_imports():
    def allows(module, target):
        rule = allowed_imports(module)
        return rule(target) if callable(rule) else target in rule

    assert not allows("functrain.tree", "functrain.numerics")
    assert not allows("functrain.numerics", BASE)
    assert not allows(BASE, ENGINE)
    assert not allows("functrain.transforms.adam", "functrain.transforms.rms")
    assert not allows("functrain.transforms.adam", "functrain.wrappers.masking")
    assert not allows("functrain.transforms.adam", "functrain")
    assert not allows("functrain.wrappers.masking", "functrain.wrappers.accumulation")
    assert not allows("functrain.wrappers.masking", "functrain.transforms.adam")
    assert not allows("functrain.optimizers.adam_family", "functrain.wrappers.masking")
    assert not allows("functrain.optimizers.adam_family", "functrain.optimizers.sgd")
    assert allows("functrain.optimizers.adam_family", "functrain.transforms.adam")
    assert allows("functrain.transforms.adam", ENGINE)


# --------------------------------------------------------------------------
# (a) private names stay in their module
# --------------------------------------------------------------------------

def test_no_module_uses_another_modules_private_names():
    offences = [f"{where(m, line)}: {text}"
                for m, a in sorted(ANALYSED.items()) for line, text in sorted(a.private)]
    assert not offences, (
        "functrain modules use other modules' private (_name) helpers; make the helper "
        "public (no underscore, with a docstring) in its module or move it:\n  "
        + "\n  ".join(offences))


# --------------------------------------------------------------------------
# (b) imports point only down
# --------------------------------------------------------------------------

def test_every_file_has_a_layer_rule():
    missing = [str(MODULES[m].relative_to(ROOT)) for m in sorted(MODULES)
               if allowed_imports(m) is None]
    assert not missing, f"no import rule for {missing}: add one to tests/test_architecture.py"


@pytest.mark.parametrize("layer", ["tree", "numerics", "base", "families", "engine",
                                   "wrappers", "optimizers", "beside", "packages"])
def test_imports_point_only_down(layer):
    members = {
        "tree": lambda m: m in TREE,
        "numerics": lambda m: m in NUMERICS,
        "base": lambda m: m == BASE,
        "families": lambda m: m in FAMILIES,
        "engine": lambda m: m in {ENGINE, RECOMPUTE},
        "wrappers": lambda m: m.startswith("functrain.wrappers.") and m in MODULES
        and MODULES[m].name != "__init__.py",
        "optimizers": lambda m: m.startswith("functrain.optimizers.")
        and MODULES[m].name != "__init__.py",
        "beside": lambda m: m in {"functrain.grad", "functrain.ivy_updates",
                                  "functrain.sharding", "functrain.schedules"},
        "packages": lambda m: MODULES[m].name == "__init__.py",
    }[layer]
    modules = [m for m in sorted(ANALYSED) if members(m)]
    assert modules, layer
    offences = []
    for m in modules:
        rule = allowed_imports(m)
        ok = rule if callable(rule) else rule.__contains__
        for target, line, text in ANALYSED[m].edges:
            if target != m and not ok(target):
                offences.append(f"{where(m, line)}: {text}")
    assert not offences, f"imports against the layering ({layer}):\n  " + "\n  ".join(offences)


def test_no_family_imports_another_family():
    offences = [f"{where(m, line)}: {text}" for m in sorted(FAMILIES) if m in ANALYSED
                for target, line, text in ANALYSED[m].edges if target in FAMILIES - {m}]
    assert not offences, "stage families import each other:\n  " + "\n  ".join(offences)
    assert FAMILIES <= set(ANALYSED), sorted(FAMILIES - set(ANALYSED))


# --------------------------------------------------------------------------
# (c) file length
# --------------------------------------------------------------------------

def test_no_file_over_650_lines():
    long = {str(p.relative_to(PACKAGE)): len(p.read_text().splitlines()) for p in FILES}
    offences = [f"functrain/{name}: {n} lines" for name, n in sorted(long.items())
                if n > MAX_LINES and name not in LONG_FILES]
    assert not offences, (f"files over {MAX_LINES} lines (split them, or list them in "
                          f"LONG_FILES with a reason):\n  " + "\n  ".join(offences))
    stale = [name for name in LONG_FILES if long.get(name, 0) <= MAX_LINES]
    assert not stale, f"LONG_FILES lists files that are not long (any more): {stale}"
    assert all(reason.strip() for reason in LONG_FILES.values())
