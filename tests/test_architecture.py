"""The package's shape, read from the source with ``ast`` (nothing is imported).

* (a) No module uses another functrain module's private names (``_name``): neither
  ``from functrain.x import _y`` nor ``x._y`` on an imported functrain module.
* (b) Imports point only down the layers of docs/design.md. Every module of functrain/ is
  in exactly one layer of ``LAYERS`` (a module in none, or in two, fails
  ``test_every_module_is_in_exactly_one_layer``, named), and imports only from the layers
  its entry lists, all of them below it; never from its own layer (no sideways imports),
  except a package's ``__init__.py``, which re-exports its own package's modules:

  ==================  ==========================================  ============================
  layer               modules                                     may import from functrain
  ==================  ==========================================  ============================
  L0_checks           tree/checks, arg_checks, jax_compat,        nothing
                      docstrings (shared argument text)
  L0_declarations     declarations (@declare_optimizer,           L0_checks
                      @hyperparameters, @state_value_kinds)
  L0_tree_moments     tree/moments (optax.tree's moments,         nothing
                      abs_sq, ema_update)
  L0_tree_parts       tree/ops, tree/state (optax.tree's          L0_checks, L0_tree_moments
                      arithmetic, its state helpers)
  L0_tree_basics      tree/basics                                 L0_checks, L0_tree_moments,
                                                                  L0_tree_parts
  L0_tree             tree (the package: re-exports)              the L0 layers above
  L0_numerics         numerics                                    the L0 layers above
  L0_codes            code_arithmetic (the dynamic codes by       nothing
                      arithmetic, quantization's TPU path)
  L0_beside           grad, compat, sharding, schedules,          L0_checks .. L0_numerics
                      projections, microbatching, linalg,         (the "L0 core"; not each
                      param_updates, tree_utils, quantization     other), L0_codes
  L0_matrix           matrix/*.py (blocks, kron_factors,          L0 core, L0_beside
                      shape_groups, dimension_numbers, ...)
  L0_loss_parts       losses/checks, losses/primitives (the       L0 core
                      losses' input checks and shared math)
  L0_losses           every other losses/*.py (optax.losses'      L0 core, L0_beside,
                      functions, by kind)                         L0_loss_parts
  L1_dtypes           engine/dtypes.py (the dtype policy)         L0 core
  L1_counts           engine/counts.py (step counts, bias         L0 core
                      corrections)
  L1_protocol         engine/protocol.py (GradientTransformation) L0 core
                      and engine/recompute.py
  L1_stage            engine/stage.py (LeafStage, LeafChecks)     L0 core, L1_dtypes,
                                                                  L1_protocol
  L1_state_io         engine/state_io.py (StateIO)                L0 core, L1_protocol
  L1_engine           engine/program.py (Program, run_block,      L0 core, L1 below it
                      chain)
  L2_shared_stages    transforms/*.py (stages every family uses)  L0 core, L1
  L2_family_stages    families/<family>/stages.py, rms/factored,  L0 core, L1,
                      quasi_newton's lbfgs and line searches      L2_shared_stages
  L3_wrappers         wrappers/*.py                               L0 core, L1
  L3_readers          hyperparams_reader (reads any optimizer's   L0 core, L1
                      recorded hyperparameters from its state)
  L3_steps            gradient_release, flat_layout               L0, L1
  L4_families         every other module of families/<family>/:   L0, L1, L2, L3_wrappers,
                      the named optimizers and each algorithm's   L4_families of its own
                      own modules                                 family or an earlier one
  L4_quantized_state  quantized_state.py (a wrapper whose         L0 - L4_families
                      presets name optimizers)
  L5_faces            transforms, contrib (packages: optax's      L0 - L4_families
                      module names, re-exported)
  L5_packages         every other __init__.py                     its own package's modules
                                                                  (functrain/ itself: any)
  ==================  ==========================================  ============================

The modules "beside the stack" (L0_beside) use only the L0 core (and ``code_arithmetic``); the
  matrix helpers (L0_matrix) that and ``linalg``; the engine stack (L1 - L3) uses neither, the
  families above it may (``sam`` takes its ascent step with ``param_updates.apply_updates``,
  Shampoo calls ``linalg``, ``schedule_free`` ``schedules``, Kron ``matrix``). The losses
  (L0_losses) use the L0 core, their own checks and math (L0_loss_parts) and
  ``projections`` (the multiclass sparsemax loss), never each other; nothing but
  ``functrain/__init__.py`` uses them.
* (c) The families form no ring: ``FAMILY_ORDER`` lists every folder of ``functrain/families/``
  and a module imports from another family only if that one comes earlier; a family's stage
  modules import no other family; no module imports itself back through others (a cycle).
* (d) No file is over 650 lines, except those in ``LONG_FILES`` with a reason.
* (e) docs/design.md's seven concepts name seven files, each defining what its concept names.

Each failure names the file and the offending import or name.
"""

from __future__ import annotations

import ast
import dataclasses
import pathlib
import re
from typing import Callable

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "functrain"
MAX_LINES = 650
# path relative to functrain/ -> why it may be longer than MAX_LINES.
LONG_FILES: dict[str, str] = {}

BASE, ENGINE = "functrain.engine.protocol", "functrain.engine.program"
RECOMPUTE = "functrain.engine.recompute"
DTYPES = "functrain.engine.dtypes"
COUNTS = "functrain.engine.counts"
STAGE, STATE_IO = "functrain.engine.stage", "functrain.engine.state_io"
# The optimizer families, one folder each under functrain/families/, in the order they may
# build on each other: a module of a family imports from another family only if that one
# comes earlier (so the families form no ring). A new family needs its place there. Read
# from functrain/families/__init__.py's ORDER with ast, as everything here.
FAMILY_ORDER = ast.literal_eval(next(
    node.value for node in ast.parse((PACKAGE / "families" / "__init__.py").read_text()).body
    if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "ORDER"))
# A family's stage modules (per-array or whole-tree math that names no optimizer): its
# stages.py and these; they import only the core, the engine and the shared stages
# (transforms/*.py), never another family. Every other module of a family is on the
# optimizers' layer.
FAMILY_STAGE_MODULES = {"functrain.families.rms.factored", "functrain.families.quasi_newton.lbfgs",
                        "functrain.families.quasi_newton.linesearch",
                        "functrain.families.quasi_newton.value_and_grad_reuse"}
# Packages whose __init__ is a public face over modules of lower layers (optax's module
# names), not a re-export of its own modules only.
FACES = {"functrain.tree", "functrain.transforms", "functrain.contrib"}
# The losses' input checks and shared math, below the loss modules that use them.
LOSS_PARTS = {"functrain.losses.checks", "functrain.losses.primitives"}
BESIDE = {f"functrain.{name}" for name in (
    "grad", "compat", "sharding", "schedules", "projections", "microbatching", "linalg",
    "param_updates", "tree_utils", "quantization")}


def module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


FILES = sorted(PACKAGE.rglob("*.py"))
MODULES = {module_name(p): p for p in FILES}


def is_package(module: str) -> bool:
    return MODULES[module].name == "__init__.py"


def is_plain_package(module: str) -> bool:
    return is_package(module) and module not in FACES


def in_package(package: str) -> Callable[[str], bool]:
    """The modules (not the ``__init__``) of the sub-package ``functrain.<package>``."""
    return lambda m: m.startswith(f"functrain.{package}.") and not is_package(m)


def family_of(module: str) -> "str | None":
    """The family folder of a module of ``functrain/families/<family>/`` (else None)."""
    parts = module.split(".")
    return parts[2] if len(parts) > 3 and parts[1] == "families" else None


def is_family_stages(module: str) -> bool:
    return (family_of(module) is not None and not is_package(module)
            and (module.endswith(".stages") or module in FAMILY_STAGE_MODULES))


def is_family_optimizers(module: str) -> bool:
    return family_of(module) is not None and not is_package(module) \
        and not is_family_stages(module)


@dataclasses.dataclass(frozen=True)
class Layer:
    """One layer: which modules are in it, and the (lower) layers they may import from."""

    name: str
    members: Callable[[str], bool]
    imports: tuple[str, ...]


L0_CORE = ("L0_checks", "L0_declarations", "L0_tree_moments", "L0_tree_parts",
           "L0_tree_basics", "L0_tree", "L0_numerics")
L0 = L0_CORE + ("L0_codes", "L0_beside", "L0_matrix")
L1 = ("L1_dtypes", "L1_counts", "L1_protocol", "L1_stage", "L1_state_io", "L1_engine")
L2 = ("L2_shared_stages", "L2_family_stages")

# Bottom to top; a layer's ``imports`` name only layers listed before it (checked below).
LAYERS = [
    Layer("L0_checks", lambda m: m in {"functrain.tree.checks", "functrain.arg_checks",
                                       "functrain.jax_compat", "functrain.docstrings"}, ()),
    # What builders, optimizers and state classes declare (over one argument's checks).
    Layer("L0_declarations", lambda m: m == "functrain.declarations", ("L0_checks",)),
    Layer("L0_tree_moments", lambda m: m == "functrain.tree.moments", ()),
    Layer("L0_tree_parts", lambda m: m in {"functrain.tree.ops", "functrain.tree.state"},
          ("L0_checks", "L0_tree_moments")),
    Layer("L0_tree_basics", lambda m: m == "functrain.tree.basics",
          ("L0_checks", "L0_tree_moments", "L0_tree_parts")),
    Layer("L0_tree", lambda m: m == "functrain.tree", L0_CORE[:5]),
    Layer("L0_numerics", lambda m: m == "functrain.numerics", L0_CORE[:6]),
    Layer("L0_codes", lambda m: m == "functrain.code_arithmetic", ()),
    Layer("L0_beside", lambda m: m in BESIDE, L0_CORE + ("L0_codes",)),
    Layer("L0_matrix", in_package("matrix"), L0_CORE + ("L0_beside",)),
    Layer("L0_loss_parts", lambda m: m in LOSS_PARTS, L0_CORE),
    Layer("L0_losses", lambda m: in_package("losses")(m) and m not in LOSS_PARTS,
          L0_CORE + ("L0_beside", "L0_loss_parts")),
    Layer("L1_dtypes", lambda m: m == DTYPES, L0_CORE),
    Layer("L1_counts", lambda m: m == COUNTS, L0_CORE),
    Layer("L1_protocol", lambda m: m in {BASE, RECOMPUTE}, L0_CORE),
    Layer("L1_stage", lambda m: m == STAGE, L0_CORE + ("L1_dtypes", "L1_protocol")),
    Layer("L1_state_io", lambda m: m == STATE_IO, L0_CORE + ("L1_protocol",)),
    Layer("L1_engine", lambda m: m == ENGINE, L0_CORE + L1[:-1]),
    # Stages every family uses (optax.transforms' scaling, clipping, accumulation, ...).
    Layer("L2_shared_stages", in_package("transforms"), L0_CORE + L1),
    # A family's own stages.
    Layer("L2_family_stages", is_family_stages, L0_CORE + L1 + ("L2_shared_stages",)),
    Layer("L3_wrappers", in_package("wrappers"), L0_CORE + L1),
    Layer("L3_readers", lambda m: m == "functrain.hyperparams_reader", L0_CORE + L1),
    # Training steps built around any optimizer (gradient release, the flat layout).
    Layer("L3_steps", lambda m: m in {"functrain.gradient_release", "functrain.flat_layout"},
          L0 + L1),
    # The named optimizers and each algorithm's own modules, by family; a module here may
    # also import this layer's modules of its own family or of an earlier one in
    # FAMILY_ORDER (allowed_imports), never in a cycle (test_family_modules_form_no_cycle).
    Layer("L4_families", is_family_optimizers, L0 + L1 + L2 + ("L3_wrappers",)),
    Layer("L4_quantized_state", lambda m: m == "functrain.quantized_state",
          L0 + L1 + L2 + ("L3_wrappers", "L4_families")),
    # optax's module names over the families: functrain.transforms (optax.transforms),
    # functrain.contrib (optax.contrib and every optimizer optax lacks), functrain.tree.
    Layer("L5_faces", lambda m: m in FACES - {"functrain.tree"},
          L0 + L1 + L2 + ("L3_wrappers", "L4_families")),
    # Re-exports only: a sub-package's own modules; functrain/ itself anything.
    Layer("L5_packages", is_plain_package, ()),
]
LAYER = {layer.name: layer for layer in LAYERS}


def layers_of(module: str) -> list[str]:
    return [layer.name for layer in LAYERS if layer.members(module)]


def layer_of(module: str) -> "str | None":
    """The one layer of ``module`` (None: none, or several; a test below fails on those)."""
    found = layers_of(module) if module in MODULES else []
    return found[0] if len(found) == 1 else None


def allowed_imports(module: str) -> Callable[[str], bool]:
    """Whether ``module`` may import the functrain module ``target``: a predicate."""
    layer = layer_of(module)
    if layer is None:
        return lambda target: False
    if layer == "L5_packages":
        if module == "functrain":
            return lambda target: True  # the public surface: re-exports only
        return lambda target: target.startswith(module + ".")
    family = family_of(module)

    def ok(target: str) -> bool:
        other = family_of(target)
        if family and other and other != family and (
                other not in FAMILY_ORDER or family not in FAMILY_ORDER
                or FAMILY_ORDER.index(other) > FAMILY_ORDER.index(family)):
            return False  # a later family (or one not in FAMILY_ORDER): a ring could close
        if layer == "L4_families" and layer_of(target) == "L4_families":
            return True   # an earlier family's optimizers, or its own family's (no cycle)
        return layer_of(target) in LAYER[layer].imports
    return ok


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
              "from functrain.engine.protocol import _concrete, check_range\n"
              "from . import program as engine\n"
              "import functrain.numerics\n"
              "def f():\n"
              "    from functrain.engine import recompute\n"
              "    return (ft._fmt_paths, ft.norm, engine._x, recompute.applies,\n"
              "            functrain.numerics._y, ft.MaskedNode.__name__)\n")
    found = Imports("functrain.engine.recompute", source)
    assert {e[0] for e in found.edges} == {"functrain.tree", BASE, ENGINE, RECOMPUTE,
                                          "functrain.numerics"}
    private = sorted(text for _, text in found.private)
    assert private == ["engine._x (private name of functrain.engine.program)",
                       "from functrain.engine.protocol import _concrete",
                       "ft._fmt_paths (private name of functrain.tree)",
                       "functrain.numerics._y (private name of functrain.numerics)"], private


def test_the_real_import_graph_is_read():
    edges = {(m, e[0]) for m, a in ANALYSED.items() for e in a.edges}
    for edge in [(ENGINE, RECOMPUTE), (ENGINE, BASE), ("functrain.numerics", "functrain.tree"),
                 ("functrain.families.adam.optimizers", "functrain.families.adam.stages"),
                 ("functrain.wrappers.masking", ENGINE), ("functrain", "functrain.grad")]:
        assert edge in edges, edge
    assert len(FILES) >= 30


def allows(module: str, target: str) -> bool:
    return allowed_imports(module)(target)


def test_the_rules_reject_upward_and_sideways_imports():
    assert not allows("functrain.tree", "functrain.numerics")
    assert not allows("functrain.tree.ops", "functrain.tree")
    assert not allows("functrain.numerics", BASE)
    assert not allows(BASE, ENGINE)
    assert not allows(BASE, "functrain.linalg")
    assert not allows("functrain.families.adam.stages", "functrain.families.rms.stages")
    assert not allows("functrain.families.adam.stages", "functrain.wrappers.masking")
    assert not allows("functrain.families.adam.stages", "functrain")
    assert not allows("functrain.families.adam.stages", "functrain.families.adam.optimizers")
    assert allows("functrain.families.adam.stages", "functrain.transforms.accumulation")
    assert not allows("functrain.transforms.scaling", "functrain.families.adam.stages")
    assert not allows("functrain.families.quasi_newton.lbfgs",
                      "functrain.families.adam.stages")
    assert not allows("functrain.wrappers.masking", "functrain.wrappers.accumulation")
    assert not allows("functrain.wrappers.masking", "functrain.families.adam.stages")
    # families: only back in FAMILY_ORDER, whatever the layer
    assert allows("functrain.families.layerwise.optimizers",
                  "functrain.families.adam.stages")
    assert not allows("functrain.families.adam.optimizers",
                      "functrain.families.layerwise.stages")
    assert not allows("functrain.families.momentum.optimizers",
                      "functrain.families.adam.stages")
    assert allows("functrain.families.muon.dion", "functrain.families.sign.optimizers")
    assert not allows("functrain.families.muon.soap_muon",
                      "functrain.families.preconditioned.soap")
    assert allows("functrain.families.muon.normuon", "functrain.families.muon.muon")
    assert allows("functrain.families.low_rank.apollo", "functrain.families.muon.muon")
    assert not allows("functrain.families.second_order.sophia",
                      "functrain.families.modifiers.sam")
    assert not allows("functrain.families.modifiers.sam", "functrain.quantized_state")
    assert not allows("functrain.families.adam.optimizers", "functrain.gradient_release")
    assert not allows("functrain.linalg", "functrain.schedules")
    assert not allows("functrain.param_updates", BASE)
    assert not allows("functrain.matrix.blocks", "functrain.families.preconditioned.kron")
    assert not allows("functrain.matrix.blocks", "functrain.matrix.kron_factors")
    assert not allows("functrain.matrix", "functrain.families.preconditioned.kron")
    assert allows("functrain.families.preconditioned.kron", "functrain.matrix.blocks")
    assert allows("functrain.families.preconditioned.kron",
                  "functrain.families.preconditioned.kron_steps")
    assert allows("functrain.families.modifiers.sam", "functrain.param_updates")
    assert allows("functrain.matrix.blocks", "functrain.linalg")
    assert allows("functrain.families.adam.optimizers", "functrain.families.adam.stages")
    assert allows("functrain.families.adam.stages", ENGINE)
    assert not allows("functrain.losses.regression", "functrain.losses.classification")
    assert not allows("functrain.losses.primitives", "functrain.losses.checks")
    assert not allows("functrain.losses.checks", "functrain.projections")
    assert not allows("functrain.losses.classification", BASE)
    assert allows("functrain.losses.margin", "functrain.projections")
    assert allows("functrain.losses.classification", "functrain.losses.primitives")
    assert allows("functrain.contrib", "functrain.families.preconditioned.kron")
    assert not allows("functrain.contrib", "functrain")
    assert allows("functrain.transforms", "functrain.transforms.accumulation")
    assert not allows("functrain.transforms", "functrain.quantized_state")
    assert allows("functrain", "functrain.families.preconditioned.kron")


def test_the_layer_table_points_down():
    order = [layer.name for layer in LAYERS]
    assert len(set(order)) == len(order), order
    for i, layer in enumerate(LAYERS):
        upward = [name for name in layer.imports if name not in order[:i]]
        assert not upward, f"{layer.name} may import {upward}: not below it"


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

def test_every_module_is_in_exactly_one_layer():
    unplaced = [str(MODULES[m].relative_to(ROOT)) for m in sorted(MODULES) if not layers_of(m)]
    assert not unplaced, (f"modules in no layer: {unplaced}; add each to a layer of LAYERS in "
                          f"tests/test_architecture.py")
    twice = [f"{MODULES[m].relative_to(ROOT)}: {layers_of(m)}" for m in sorted(MODULES)
             if len(layers_of(m)) > 1]
    assert not twice, "modules in more than one layer:\n  " + "\n  ".join(twice)


@pytest.mark.parametrize("layer", [layer.name for layer in LAYERS])
def test_imports_point_only_down(layer):
    modules = [m for m in sorted(ANALYSED) if LAYER[layer].members(m)]
    assert modules, f"layer {layer} has no module"
    offences = []
    for m in modules:
        ok = allowed_imports(m)
        for target, line, text in ANALYSED[m].edges:
            if target != m and not ok(target):
                offences.append(f"{where(m, line)}: {text} (from {layer} into "
                                f"{layer_of(target) if target in MODULES else 'no module'})")
    assert not offences, f"imports against the layering ({layer}):\n  " + "\n  ".join(offences)


def test_family_stages_import_no_other_family():
    stages = {m for m in MODULES if is_family_stages(m)}
    offences = [f"{where(m, line)}: {text}" for m in sorted(stages)
                for target, line, text in ANALYSED[m].edges
                if family_of(target) not in (None, family_of(m))]
    assert not offences, "stage modules import another family:\n  " + "\n  ".join(offences)
    assert {"functrain.families.adam.stages", "functrain.families.rms.factored"} <= stages


def test_every_family_has_its_place_in_the_order():
    folders = {p.name for p in (PACKAGE / "families").iterdir()
               if p.is_dir() and (p / "__init__.py").is_file()}
    assert folders == set(FAMILY_ORDER), (
        f"families not in FAMILY_ORDER: {sorted(folders - set(FAMILY_ORDER))}; "
        f"in it but gone: {sorted(set(FAMILY_ORDER) - folders)}")
    loose = [str(p.relative_to(ROOT)) for p in (PACKAGE / "families").glob("*/")
             if p.is_dir() and p.name != "__pycache__" and not (p / "__init__.py").is_file()]
    assert not loose, f"family folders without an __init__.py: {loose}"


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every cycle's nodes (Tarjan's strongly connected components of more than one node,
    or one node with an edge to itself)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                component.append(top)
                if top == node:
                    break
            if len(component) > 1 or node in graph.get(node, ()):
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def module_graph() -> dict[str, set[str]]:
    return {m: {t for t, _, _ in a.edges if t in MODULES and t != m}
            for m, a in ANALYSED.items()}


def test_cycles_finds_rings():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"a"}}) == [["a"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_modules_form_no_cycle():
    """No module imports itself back through others (package __init__s, which re-export
    their own modules, left out)."""
    graph = {m: {t for t in targets if not is_package(t)}
             for m, targets in module_graph().items() if not is_package(m)}
    assert not cycles(graph), f"import cycles: {cycles(graph)}"


def test_families_form_no_ring():
    """The families' folder graph (an edge where a module of one imports a module of
    another) is acyclic, and points only back in FAMILY_ORDER."""
    graph: dict[str, set[str]] = {}
    for m, targets in module_graph().items():
        if family_of(m):
            graph.setdefault(family_of(m), set()).update(
                family_of(t) for t in targets if family_of(t) not in (None, family_of(m)))
    assert not cycles(graph), f"families import each other in a ring: {cycles(graph)}"
    backwards = sorted(f"{a} -> {b}" for a, bs in graph.items() for b in bs
                       if FAMILY_ORDER.index(b) > FAMILY_ORDER.index(a))
    assert not backwards, f"families import later ones in FAMILY_ORDER: {backwards}"


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


# --------------------------------------------------------------------------
# (e) docs/design.md's concepts are the code's: one file each, holding what it names
# --------------------------------------------------------------------------

CONCEPT = re.compile(r"^\d+\. \*\*(.+?)\*\* \(\[`(.+?)`\]", re.MULTILINE)
# What each concept's file must define (besides the names the list itself puts in backticks).
CONCEPT_NAMES = {"engine/counts.py": {"corrections", "safe_increment", "zero_count"},
                 "engine/dtypes.py": {"leaf_compute_dtype", "state_compute_dtype"},
                 "declarations.py": {"declare_optimizer", "hyperparameters",
                                     "state_value_kinds", "builder_record"}}


def defined_names(path: pathlib.Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))} | {
        t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets
        if isinstance(t, ast.Name)}


def concept_problems(text: str) -> list[str]:
    """Where design.md's numbered concept list and the package disagree."""
    section = text[text.index("## Seven concepts"):text.index("## The layers")]
    concepts = CONCEPT.findall(section)
    problems = [] if len(concepts) == 7 else [f"{len(concepts)} concepts listed, not 7"]
    files = [f for _, f in concepts]
    if len(set(files)) != len(files):
        problems.append(f"two concepts share a file: {files}")
    for title, file in concepts:
        path = PACKAGE / file
        if not path.is_file():
            problems.append(f"{title}: no file functrain/{file}")
            continue
        wanted = set(re.findall(r"`(\w+)`", title)) | CONCEPT_NAMES.get(file, set())
        missing = wanted - defined_names(path)
        if missing:
            problems.append(f"{title}: functrain/{file} does not define {sorted(missing)}")
    return problems


def test_design_md_concepts_are_the_packages_files():
    text = (ROOT / "docs" / "design.md").read_text()
    problems = concept_problems(text)
    assert not problems, "docs/design.md's concept list is stale:\n  " + "\n  ".join(problems)
    planted = text.replace("[`engine/stage.py`]", "[`engine/protocol.py`]", 1)
    assert any("share a file" in p for p in concept_problems(planted))
    planted = text.replace("**`StateIO`**", "**`StateReader`**", 1)
    assert any("StateReader" in p for p in concept_problems(planted))
