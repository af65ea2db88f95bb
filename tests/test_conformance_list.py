"""The list of deliberate differences that ``make conformance`` accepts is well-formed.

``tests/conformance/known_differences.toml`` names the optax tests (from the installed
optax wheel) that fail with functrain swapped in, each with a category and a reason
(docs/conformance.md). This checks, without running optax's tests: every entry has
exactly the keys ``test``, ``category`` and ``reason``; the category is one of the
runner's; the reason says something (``BUG`` entries start with ``BUG:``); the pattern
names a test file the runner runs, a test class in it and a test method of that class
(a glob may cover parameterized variants, never a whole file or class); and no pattern
is listed twice.
"""

from __future__ import annotations

import ast
import os
import pathlib
import sys

import optax
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "conformance"))
from run_conformance import (CATEGORIES, LIST_FILE, load_differences,  # noqa: E402
                             optax_test_files)

OPTAX = pathlib.Path(optax.__file__).parent
DIFFERENCES = load_differences()
FILES = set(optax_test_files(OPTAX))


def methods_by_class(relpath: str) -> dict[str, set[str]]:
    """class name -> test method names, for one optax test file (inherited ones too)."""
    tree = ast.parse((OPTAX / relpath).read_text())
    classes = {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}

    def methods(name: str, seen=()) -> set[str]:
        node = classes.get(name)
        if node is None or name in seen:
            return set()
        own = {f.name for f in node.body
               if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
               and f.name.startswith("test")}
        for base in node.bases:
            if isinstance(base, ast.Name):
                own |= methods(base.id, (*seen, name))
        return own

    return {name: methods(name) for name in classes}


def test_the_list_is_not_empty_and_loads():
    assert LIST_FILE.exists()
    assert DIFFERENCES, "an empty list: every optax test would have to pass"


@pytest.mark.parametrize("entry", DIFFERENCES, ids=lambda d: d.get("test", "?"))
def test_entry_is_well_formed(entry):
    assert set(entry) == {"test", "category", "reason"}, entry
    assert entry["category"] in CATEGORIES, entry["category"]
    reason = entry["reason"].strip()
    assert len(reason) >= 30, f"say why, in a sentence: {reason!r}"
    assert (entry["category"] == "BUG") == reason.startswith("BUG:"), \
        "BUG entries, and only they, have category BUG and a reason starting 'BUG:'"


@pytest.mark.parametrize("entry", DIFFERENCES, ids=lambda d: d.get("test", "?"))
def test_entry_names_an_existing_optax_test(entry):
    parts = entry["test"].split("::")
    assert len(parts) == 3, "file::Class::test_method[glob], never a whole file or class"
    relpath, cls, method = parts
    assert relpath in FILES, f"{relpath} is not one of the optax test files the run covers"
    assert not any(c in cls for c in "*?["), "the class is named exactly"
    classes = methods_by_class(relpath)
    assert cls in classes, f"no class {cls} in optax/{relpath}"
    # A parameterized method's ids extend its name (test_x0, test_x_adam): the part of the
    # pattern before its first wildcard must extend a real method's name, or begin one.
    stem = method.split("*")[0].split("?")[0].split("[")[0]
    assert stem.startswith("test") and len(stem) > len("test"), method
    assert any(stem.startswith(m) or m.startswith(stem) for m in classes[cls]), \
        f"no test method of {cls} in optax/{relpath} matches {method}"


def test_no_pattern_is_listed_twice():
    patterns = [d["test"] for d in DIFFERENCES]
    assert len(patterns) == len(set(patterns))
