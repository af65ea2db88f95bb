"""functrain.docstrings: shared argument text, composed into the builders' docstrings.

Checked: every function of the package that asks for shared text gets it (no ``<shared:``
line survives in any docstring a user reads), every shared entry is used, the composed
entry is the table's text, and a name the table lacks is an error naming the function.
"""

from __future__ import annotations

import importlib
import inspect
import pathlib
import pkgutil
import re

import pytest

import functrain
from functrain import docstrings

ROOT = pathlib.Path(functrain.__file__).resolve().parent


def all_functions() -> dict[str, object]:
    """qualified name -> every function defined in a module of the package."""
    found = {}
    for info in pkgutil.walk_packages(functrain.__path__, "functrain."):
        module = importlib.import_module(info.name)
        for name, obj in vars(module).items():
            if inspect.isfunction(obj) and obj.__module__ == module.__name__:
                found[f"{module.__name__}.{name}"] = obj
    return found


def test_no_docstring_keeps_a_placeholder():
    left = [name for name, fn in all_functions().items() if "<shared:" in (fn.__doc__ or "")
            and fn.__module__ != "functrain.docstrings"]  # which documents the syntax
    assert not left, f"docstrings with an uncomposed <shared: ...> line (add @shared_args()): {left}"


def test_every_shared_entry_is_used_and_composed_as_written():
    sources = "\n".join(p.read_text() for p in ROOT.rglob("*.py") if p.name != "docstrings.py")
    asked = {n.strip() for names in re.findall(r"<shared: ([\w, ]+)>", sources)
             for n in names.split(",")}
    assert asked == set(docstrings.ARGS), (sorted(set(docstrings.ARGS) - asked),
                                          sorted(asked - set(docstrings.ARGS)))
    doc = " ".join(inspect.getdoc(functrain.adamw).split())
    for name in ("learning_rate", "b1", "cautious_weight_decay"):
        assert f"{name}: {docstrings.ARGS[name]}" in doc, name


def test_an_unknown_shared_name_is_an_error_naming_the_function():
    with pytest.raises(KeyError, match="my_opt: no shared text for argument 'bogus'"):
        docstrings.compose("Args:\n  <shared: b1, bogus>\n", docstrings.ARGS, "my_opt")
    assert docstrings.compose(None, docstrings.ARGS, "f") is None
    composed = docstrings.compose("Args:\n      <shared: b1, b2>\n    Returns:", {"b1": "x.",
                                                                               "b2": "y."}, "f")
    assert composed == "Args:\n      b1: x.\n      b2: y.\n    Returns:"
