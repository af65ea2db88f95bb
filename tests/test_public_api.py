"""Every public name of functrain has a docstring with a runnable example and type hints.

The examples themselves run as doctests (``--doctest-modules`` over functrain/).
"""

import inspect
import types
import typing

import functrain

# Type aliases cannot carry a docstring of their own; they are documented where defined.
ALIASES = {"Schedule"}


def public_names():
    for name in sorted(dir(functrain)):
        obj = getattr(functrain, name)
        if name.startswith("_") or name in ALIASES:
            continue
        if isinstance(obj, types.ModuleType) and name != "grad":
            continue
        yield name, obj


def test_every_public_name_has_an_example():
    missing = [n for n, obj in public_names() if ">>>" not in (obj.__doc__ or "")]
    assert not missing, f"public names without a docstring example: {missing}"


def test_every_public_function_has_type_hints():
    missing = []
    for name, obj in public_names():
        if isinstance(obj, type) or not callable(obj):
            continue
        try:
            sig = inspect.signature(obj)
        except (TypeError, ValueError):
            continue
        hints_missing = [p.name for p in sig.parameters.values()
                         if p.annotation is inspect.Parameter.empty
                         and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        if sig.return_annotation is inspect.Signature.empty or hints_missing:
            missing.append(name)
    assert not missing, f"public functions without full type hints: {missing}"


def test_optax_is_never_imported_by_functrain():
    import pathlib
    root = pathlib.Path(functrain.__file__).parent
    offenders = [str(p) for p in root.rglob("*.py")
                 if "import optax" in p.read_text() or "from optax" in p.read_text()]
    assert not offenders
