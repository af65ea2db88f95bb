"""A pytest plugin that swaps functrain's objects in for optax's before optax's tests import.

Loaded with ``-p swap_plugin`` (``tests/conformance`` on ``PYTHONPATH``) by
``run_conformance.py``. In ``pytest_configure``, before pytest collects (imports) any optax
test module, it walks every optax module that the conformance run covers (the top level,
``optax._src.*``, ``optax.transforms``, ``optax.schedules``, ``optax.contrib``,
``optax.projections``, ``optax.microbatching``, ``optax.tree``, ``optax.tree_utils``,
``optax.losses`` and their private sub-modules) and replaces each public function or class that optax defines
(and each public string constant, such as the line search's ``FLAG_*`` messages, that
functrain also defines) by functrain's object of the same name, looked up in the functrain namespace(s) that
mirror that optax module (``NAMESPACES``). Names functrain does not have stay optax's,
so a test may run partly or wholly on optax's code; the plugin records which.

What it records, for the runner:

* the swap table (optax module, name, functrain object or ``None``) in
  ``$FUNCTRAIN_CONFORMANCE_OUT/swaps.json`` (written once, by the controller);
* per test, whether any functrain code ran during its setup or call (a trace
  function that looks only at Python ``call`` events and switches itself off at the
  first frame whose code lives under ``functrain/``), as the user property
  ``functrain_reached``;
* per test module, the optax names its source refers to (``alias.adam``,
  ``optax.tree.add``, ``from optax.x import y``), split into swapped and optax-only, in
  ``$FUNCTRAIN_CONFORMANCE_OUT/names-<worker>.json``.

optax's test helpers (``optax._src.test_utils``) and deprecation shims are not
swapped, and neither are the functions and classes of the sub-packages functrain does
not mirror (assignment, perturbations, experimental, second_order).
"""

from __future__ import annotations

import ast
import functools
import importlib
import inspect
import json
import os
import pathlib
import sys
import threading
import types

import pytest

import functrain
import optax

OPTAX_DIR = pathlib.Path(optax.__file__).parent
FUNCTRAIN_DIR = str(pathlib.Path(functrain.__file__).parent) + os.sep

# optax module (or module prefix) -> functrain modules searched, in order, for a name.
# The longest matching prefix wins.
NAMESPACES: dict[str, tuple[str, ...]] = {
    "optax": ("functrain",),
    "optax._src": ("functrain",),
    "optax._src.numerics": ("functrain.numerics", "functrain"),
    "optax._src.linear_algebra": ("functrain.linalg", "functrain"),
    "optax._src.linesearch": ("functrain.families.quasi_newton.linesearch", "functrain"),
    "optax.transforms": ("functrain",),
    "optax.schedules": ("functrain",),
    "optax.contrib": ("functrain.contrib",),
    "optax.projections": ("functrain.projections",),
    "optax.microbatching": ("functrain.microbatching",),
    "optax.tree": ("functrain.tree",),
    "optax.tree_utils": ("functrain.tree_utils", "functrain.tree"),
    "optax.losses": ("functrain.losses",),
}

# optax modules left alone: test helpers, deprecation shims, and sub-packages outside
# functrain's scope (tests/test_optax_coverage.py's EXCLUDED says why for each).
NOT_SWAPPED_PREFIXES = (
    "optax._src.test_utils", "optax._src.deprecations", "optax.assignment",
    "optax.perturbations", "optax.experimental", "optax.second_order",
)


def _namespaces(module_name: str) -> tuple[str, ...]:
    best = ""
    for prefix in NAMESPACES:
        if (module_name == prefix or module_name.startswith(prefix + ".")) and \
                len(prefix) > len(best):
            best = prefix
    return NAMESPACES[best]


def optax_modules() -> list[str]:
    """Every importable non-test optax module the swap covers, by file."""
    names = []
    for path in sorted(OPTAX_DIR.rglob("*.py")):
        rel = path.relative_to(OPTAX_DIR).with_suffix("")
        if rel.name.endswith("_test") or "__pycache__" in rel.parts:
            continue
        parts = ["optax", *rel.parts]
        if parts[-1] == "__init__":
            parts = parts[:-1]
        name = ".".join(parts)
        if not name.startswith(NOT_SWAPPED_PREFIXES):
            names.append(name)
    return names


def _is_optax_defined(value: object) -> bool:
    if isinstance(value, functools.partial):
        value = value.func
    if not (inspect.isfunction(value) or inspect.isclass(value)):
        return False
    return str(getattr(value, "__module__", "")).startswith("optax")


def _functrain_object(module_name: str, name: str):
    for ns in _namespaces(module_name):
        module = importlib.import_module(ns)
        if name in vars(module) and not isinstance(vars(module)[name], types.ModuleType):
            return ns, vars(module)[name]
    return None, None


class _SameAnnotation:
    """optax's ``ScalarOrSchedule`` alias, equal also to functrain's spelling of it.

    Two optax tests (contrib/_common_test.py, schedules/_schedule_test.py) skip an
    optimizer unless ``inspect.signature(opt).parameters['learning_rate'].annotation``
    is ``optax._src.base.ScalarOrSchedule``. functrain annotates the same argument with
    its own ``ScalarOrSchedule``, which ``inspect`` shows as the string
    ``'ScalarOrSchedule'`` (functrain's modules use postponed annotations); without this
    those tests would skip every functrain optimizer.
    """

    def __init__(self, original: object, *spellings: str):
        self.original, self.spellings = original, spellings

    def __eq__(self, other: object) -> bool:
        return other is self.original or other == self.original or other in self.spellings

    def __hash__(self) -> int:
        return hash(self.original)

    def __repr__(self) -> str:
        return f"{self.original!r} (or {', '.join(map(repr, self.spellings))})"


def swap() -> list[dict]:
    """Replace optax's public objects by functrain's; returns the table of what was done."""
    table = []
    if not NO_SWAP:
        from optax._src import base
        base.ScalarOrSchedule = _SameAnnotation(base.ScalarOrSchedule, "ScalarOrSchedule")
    for module_name in optax_modules():
        try:
            module = importlib.import_module(module_name)
        except ImportError:  # an optional dependency optax guards itself
            continue
        for name, value in sorted(vars(module).items()):
            if name.startswith("_"):
                continue
            if isinstance(value, str):  # a message constant (linesearch's FLAG_*):
                ns, replacement = _functrain_object(module_name, name)  # functrain's own
                if not isinstance(replacement, str):                     # words, if any
                    continue
            elif not _is_optax_defined(value):
                continue
            ns, replacement = _functrain_object(module_name, name)
            table.append({"module": module_name, "name": name,
                          "functrain": f"{ns}.{name}" if ns else None})
            if replacement is not None and not NO_SWAP:
                setattr(module, name, replacement)
    return table


# Filled by pytest_configure (importing this module swaps nothing: `make test`'s
# --doctest-modules imports every module under tests/).
SWAPS: list[dict] = []
SWAPPED: set[tuple[str, str]] = set()
OPTAX_ONLY: set[tuple[str, str]] = set()
OUT = os.environ.get("FUNCTRAIN_CONFORMANCE_OUT")
# The baseline: the same run and records with nothing swapped (pure optax).
NO_SWAP = os.environ.get("FUNCTRAIN_CONFORMANCE_NO_SWAP") == "1"
WORKER = os.environ.get("PYTEST_XDIST_WORKER", "main")


# --- per-test: did functrain code run? ------------------------------------------------

class _Reach:
    """A trace function that notes the first call into functrain's code, then stops."""
    reached = False
    first = None

    def tracer(self, frame, event, arg):
        code = frame.f_code
        # A module body running is an import, not a use of functrain.
        if event == "call" and code.co_filename.startswith(FUNCTRAIN_DIR) and \
                code.co_name != "<module>":
            self.reached = True
            self.first = f"{code.co_filename[len(FUNCTRAIN_DIR):]}:{code.co_qualname}"
            sys.settrace(None)
            threading.settrace(None)
        return None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    reach = _Reach()
    item._functrain_reach = reach
    sys.settrace(reach.tracer)
    threading.settrace(reach.tracer)
    try:
        yield
    finally:
        sys.settrace(None)
        threading.settrace(None)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    reach = getattr(item, "_functrain_reach", None)
    if reach is not None and call.when in ("setup", "call"):
        report.user_properties.append(("functrain_reached", reach.reached))
        report.user_properties.append(("functrain_first", reach.first))


# --- per-module: which optax names does the test file refer to? -----------------------

def _module_aliases(module: types.ModuleType) -> dict[str, str]:
    """Global name -> optax module name, for the optax modules a test module imported."""
    return {name: value.__name__ for name, value in vars(module).items()
            if isinstance(value, types.ModuleType) and value.__name__.startswith("optax")}


def _dotted(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        inner = _dotted(node.value)
        return f"{inner}.{node.attr}" if inner else None
    return None


def referenced_names(module: types.ModuleType) -> set[tuple[str, str]]:
    """(optax module, name) pairs the test module's source refers to."""
    tree = ast.parse(pathlib.Path(module.__file__).read_text())
    aliases = _module_aliases(module)
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            base = _dotted(node.value)
            if base is None:
                continue
            head, _, rest = base.partition(".")
            if head not in aliases:
                continue
            target = aliases[head] + (f".{rest}" if rest else "")
            found.add((target, node.attr))
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("optax"):
            for alias in node.names:
                found.add((node.module, alias.name))
    return found


def _write(name: str, data) -> None:
    """Write OUT/name atomically (workers may write the same file)."""
    if not OUT:
        return
    out = pathlib.Path(OUT)
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / f".{name}.{WORKER}.tmp"
    tmp.write_text(json.dumps(data, indent=1))
    tmp.replace(out / name)


def pytest_collection_finish(session):
    names = {}
    for item in session.items:
        module = getattr(item, "module", None)
        key = str(item.path)
        if module is None or key in names:
            continue
        refs = referenced_names(module)
        names[key] = {"swapped": sorted(f"{m}.{n}" for m, n in refs if (m, n) in SWAPPED),
                      "optax_only": sorted(f"{m}.{n}" for m, n in refs
                                           if (m, n) in OPTAX_ONLY)}
    _write(f"names-{WORKER}.json", names)
    _write("swaps.json", SWAPS)


# --- per-test outcomes, written by the process that reports (xdist's controller) --------

_CONFIG = {}


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    """Swap before pytest collects (imports) any optax test module."""
    _CONFIG["controller"] = not hasattr(config, "workerinput")
    if not SWAPS:
        SWAPS.extend(swap())
        SWAPPED.update((r["module"], r["name"]) for r in SWAPS if r["functrain"])
        OPTAX_ONLY.update((r["module"], r["name"]) for r in SWAPS if not r["functrain"])


def pytest_runtest_logreport(report):
    if not OUT or not _CONFIG.get("controller"):
        return
    message = None
    if report.failed:
        crash = getattr(report.longrepr, "reprcrash", None)
        message = crash.message if crash is not None else str(report.longrepr)[-2000:]
    elif report.skipped and isinstance(report.longrepr, tuple):
        message = str(report.longrepr[2])
    reached = [v for k, v in report.user_properties if k == "functrain_reached"]
    first = [v for k, v in report.user_properties if k == "functrain_first" and v]
    row = {"nodeid": report.nodeid, "when": report.when, "outcome": report.outcome,
           "subtest": type(report).__name__ != "TestReport",
           "reached": reached[-1] if reached else None, "message": message,
           "duration": round(report.duration, 3), "first": first[0] if first else None}
    with open(pathlib.Path(OUT) / "reports.jsonl", "a") as f:
        f.write(json.dumps(row) + "\n")
