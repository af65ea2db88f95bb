"""Every public name of functrain is documented: a runnable example, type hints, and for
functions ``Args:``/``Returns:`` sections; optimizers and ``scale_by_*`` cite their paper.

The examples themselves run as doctests (``--doctest-modules`` over functrain/).
"""

import importlib
import inspect
import re
import types

import functrain
import registry
from functrain.declarations import OPTIMIZERS as DECLARED
from helpers import TYPE_ALIASES

# Type aliases cannot carry a docstring of their own; they are documented where defined.
ALIASES = TYPE_ALIASES | {"ShouldSkipUpdateFunction", "ConditionFn"}


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


# The one place functrain imports an optax the user installed (never required): its two
# protocol classes subclass optax's, behind find_spec and a fallback (tests/engine/
# test_protocol.py runs functrain with optax hidden).
OPTAX_INTEROP = {"engine/protocol.py": 1}


def test_optax_is_never_imported_by_functrain():
    """No module imports optax, but the interop hook of OPTAX_INTEROP (once, guarded)."""
    import pathlib
    root = pathlib.Path(functrain.__file__).parent
    offenders = {}
    for p in root.rglob("*.py"):
        text = p.read_text()
        count = text.count("import optax") + text.count("from optax")
        if count:
            offenders[p.relative_to(root).as_posix()] = count
    assert offenders == OPTAX_INTEROP, offenders
    hook = (root / "engine" / "protocol.py").read_text()
    assert 'find_spec("optax") is None' in hook and "except Exception" in hook


# --------------------------------------------------------------------------
# Args:/Returns: sections, and the paper's year
# --------------------------------------------------------------------------

# Modules whose public functions are part of the API beside functrain's top level.
SUBMODULES = ["functrain.tree", "functrain.numerics", "functrain.sharding",
              "functrain.compat", "functrain.grad", "functrain.projections",
              "functrain.microbatching", "functrain.linalg",
              "functrain.matrix.blocks", "functrain.matrix.kron_factors",
              "functrain.families.adam.adopt", "functrain.families.rms.madgrad", "functrain.families.adam.acprop",
              "functrain.families.adam.ademamix",
              "functrain.families.low_rank.galore",
              "functrain.families.modifiers.complex_valued", "functrain.families.modifiers.normalize",
              "functrain.families.muon.muon", "functrain.families.preconditioned.shampoo", "functrain.families.preconditioned.kron",
              "functrain.families.adam.mars", "functrain.families.rms.came",
              "functrain.families.second_order.sophia", "functrain.families.modifiers.sam", "functrain.families.parameter_free.momo",
              "functrain.families.modifiers.reduce_on_plateau", "functrain.families.modifiers.privacy",
              "functrain.families.preconditioned.soap", "functrain.losses", "functrain.losses.checks",
              "functrain.losses.primitives"]
# ... and every module that defines a declared optimizer (a new one is included by itself).
SUBMODULES += sorted({d.module for d in DECLARED.values()} - set(SUBMODULES))


def public_functions():
    """(qualified name, function) for every public function of functrain and SUBMODULES."""
    seen = {}
    for name, obj in public_names():
        if inspect.isfunction(obj):
            seen.setdefault(obj, f"functrain.{name}")
    for module_name in SUBMODULES:
        module = importlib.import_module(module_name)
        names = getattr(module, "__all__", None) or [n for n in dir(module)
                                                      if not n.startswith("_")]
        for name in names:
            obj = getattr(module, name)
            if inspect.isfunction(obj):
                seen.setdefault(obj, f"{module_name}.{name}")
    return sorted((qualified, fn) for fn, qualified in seen.items())


def test_public_functions_are_found():
    found = {fn for _, fn in public_functions()}
    for module_name, name in [("functrain", "adam"), ("functrain", "chain"),
                              ("functrain.tree", "get_path"), ("functrain.tree", "check_shapes"),
                              ("functrain.numerics", "trust_ratio"),
                              ("functrain.sharding", "zero_shardings"),
                              ("functrain.compat", "lamb_update"),
                              ("functrain.grad", "value_and_grad")]:
        assert getattr(importlib.import_module(module_name), name) in found, (module_name, name)
    assert len(found) >= 100, len(found)


def test_every_public_function_documents_args_and_returns():
    missing = []
    for qualified, fn in public_functions():
        doc = inspect.getdoc(fn) or ""
        needs_args = bool(inspect.signature(fn).parameters)
        lacks = [section for section, needed in (("Args:", needs_args), ("Returns:", True))
                 if needed and not re.search(rf"^\s*{section}", doc, re.MULTILINE)]
        if lacks:
            missing.append(f"{qualified} (no {' / '.join(lacks)})")
    assert not missing, (f"{len(missing)} public functions without the Google-style "
                         f"sections:\n  " + "\n  ".join(missing))


# Building blocks that do not come from a paper: no reference year required.
NOT_FROM_A_PAPER = {
    "scale", "scale_by_schedule", "scale_by_learning_rate", "scale_by_param_block_norm",
    "clip", "clip_by_global_norm", "clip_by_block_rms", "add_decayed_weights", "identity",
    "set_to_zero", "trace", "ema", "zero_nans", "keep_params_nonnegative",
    "normalize", "split_real_and_imaginary",  # functrain.contrib's
}
YEAR = re.compile(r"\b(19|20)\d\d\b")


def test_every_optimizer_and_scale_by_cites_a_reference_year():
    objects = {n: getattr(functrain.contrib if r.contrib else functrain, n)
               for n, r in registry.REGISTRY.items()}  # every optimizer, contrib's too
    objects.update((n, obj) for n, obj in public_names() if n.startswith("scale_by_"))
    checked = [n for n in sorted(objects) if n not in NOT_FROM_A_PAPER]
    assert len(checked) >= 70, checked
    missing = [n for n in checked if not YEAR.search(inspect.getdoc(objects[n]) or "")]
    assert not missing, (f"{len(missing)} optimizers/scale_by_* whose docstring cites no "
                         f"reference year (19xx/20xx): {missing}")
