"""Coverage of optax's public surface: every name has a functrain counterpart or a reason.

The names are enumerated from the installed optax (its top level and the sub-modules
``tree``, ``projections``, ``microbatching``, ``transforms``, ``schedules``, ``contrib``,
``losses``), so a new
optax release's additions show up here as failures. Each name must either exist at
functrain's corresponding place (``MODULES``) or be listed in ``EXCLUDED`` with the
reason. Exclusions must stay true: an excluded name that optax dropped, or that
functrain gained, fails too.

For functions present in both, the keyword names and defaults must be optax's (so
switching is a changed import); the few deliberate differences are in
``SIGNATURE_DIFFERENCES`` with their reasons.
"""

from __future__ import annotations

import enum
import importlib
import inspect
import types

import optax

import functrain

# optax module -> the functrain module where its names live.  optax.transforms and
# optax.schedules re-export names optax also has at its top level; functrain has
# them at the top level only (its `transforms` package holds the stage families).
MODULES = {
    "optax": "functrain",
    "optax.tree": "functrain.tree",
    "optax.projections": "functrain.projections",
    "optax.microbatching": "functrain.microbatching",
    "optax.transforms": "functrain",
    "optax.schedules": "functrain",
    "optax.contrib": "functrain.contrib",
    "optax.losses": "functrain.losses",
}

EXCLUDED: dict[str, str] = {
    # Sub-modules outside an optimizer library's scope, or deprecated.
    "optax.assignment": "the Hungarian algorithm, not an optimizer: use optax.assignment",
    "optax.perturbations": "perturbed smoothing of functions, not an optimizer: use "
                           "optax.perturbations",
    "optax.second_order": "deprecated in optax (hvp, hessian_diag, fisher_diag): use jax's "
                          "jvp/vjp or optax.second_order",
    "optax.experimental": "optax's experimental aggregating API, not stable: not mirrored",
    "optax.multi_normal": "a Gaussian log-density helper, not an optimizer: use optax's",
    "optax.nnls": "a non-negative least-squares solver, not an optimizer: use optax's",
}

# "module.name" -> why functrain's signature deliberately differs from optax's.
SIGNATURE_DIFFERENCES: dict[str, str] = {}


def public_names(module: types.ModuleType) -> list[str]:
    return sorted(n for n in dir(module) if not n.startswith("_"))


def optax_names() -> list[tuple[str, str, object]]:
    """(optax module, name, object) for every public name the coverage covers."""
    found = []
    for module_name in MODULES:
        module = importlib.import_module(module_name)
        for name in public_names(module):
            obj = getattr(module, name)
            if isinstance(obj, types.ModuleType) and module_name != "optax":
                continue  # e.g. optax.tree's own imports of other modules
            found.append((module_name, name, obj))
    return found


def test_the_enumeration_sees_optax():
    names = {f"{m}.{n}" for m, n, _ in optax_names()}
    assert len(names) >= 300, len(names)
    assert {"optax.adam", "optax.tree.get", "optax.projections.projection_simplex",
            "optax.schedules.sgdr_schedule", "optax.contrib.muon", "optax.l2_loss",
            "optax.losses.ctc_loss", "optax.losses.dice_loss"} <= names


def test_losses_at_the_top_level_are_optaxs():
    """The losses optax also has at its top level are functrain's top-level names too (the
    same functions as functrain.losses'); the ones optax keeps in optax.losses only are in
    functrain.losses only."""
    import optax.losses
    theirs = {n for n in public_names(optax.losses)
              if getattr(optax, n, None) is getattr(optax.losses, n)}
    ours = {n for n in functrain.losses.__all__ if hasattr(functrain, n)}
    assert ours == theirs, (sorted(ours - theirs), sorted(theirs - ours))
    assert len(theirs) >= 15 and "l2_loss" in theirs and "dice_loss" not in theirs
    assert all(getattr(functrain, n) is getattr(functrain.losses, n) for n in ours)
    assert set(functrain.losses.__all__) == set(public_names(optax.losses))


def test_every_optax_name_has_a_functrain_counterpart():
    missing = []
    for module_name, name, _ in optax_names():
        qualified = f"{module_name}.{name}"
        if qualified in EXCLUDED:
            continue
        try:
            target = importlib.import_module(MODULES[module_name])
        except ImportError:
            missing.append(f"{qualified} (no module {MODULES[module_name]})")
            continue
        if not hasattr(target, name):
            missing.append(f"{qualified} -> {MODULES[module_name]}.{name}")
    assert not missing, (f"{len(missing)} optax names without a functrain counterpart or an "
                         f"EXCLUDED reason:\n  " + "\n  ".join(missing))


def test_excluded_modules_say_where_to_get_them():
    """``functrain.assignment`` (any module left to optax) raises an AttributeError that
    names optax's module, not a bare one."""
    import pytest
    for qualified in EXCLUDED:
        name = qualified.rpartition(".")[2]
        with pytest.raises(AttributeError, match=rf"optax\.{name} .*use optax\.{name} itself"):
            getattr(functrain, name)
    with pytest.raises(AttributeError, match="has no attribute 'no_such_name'$"):
        functrain.no_such_name  # noqa: B018


def test_exclusions_are_still_true():
    listed = {f"{m}.{n}" for m, n, _ in optax_names()}
    stale = sorted(q for q in EXCLUDED if q not in listed)
    assert not stale, f"excluded names optax no longer has: {stale}"
    gained = []
    for qualified in EXCLUDED:
        module_name, _, name = qualified.rpartition(".")
        target = importlib.import_module(MODULES[module_name])
        if hasattr(target, name):
            gained.append(qualified)
    assert not gained, f"excluded names functrain now has (drop the exclusion): {gained}"


def _parameters(fn) -> dict:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return {}
    return {p.name: p.default for p in sig.parameters.values()
            if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}


def _same_default(a, b) -> bool:
    if a is inspect.Parameter.empty or b is inspect.Parameter.empty:
        return a is b
    if callable(a) or callable(b) or (hasattr(a, "update") and hasattr(b, "update")):
        # default functions (a mask) and default transformations (lbfgs's line search)
        # are compared by behaviour in their own parity tests
        return True
    if isinstance(a, enum.Enum) or isinstance(b, enum.Enum):  # each library's own enum
        return (type(a).__name__, getattr(a, "name", None)) == (
            type(b).__name__, getattr(b, "name", None))
    try:
        return bool(a == b) and type(a) is type(b) or (a is None and b is None) or (
            isinstance(a, (int, float)) and isinstance(b, (int, float)) and a == b)
    except Exception:  # arrays, dtypes
        return str(a) == str(b)


def signature_pairs():
    for module_name, name, obj in optax_names():
        qualified = f"{module_name}.{name}"
        if qualified in EXCLUDED or not inspect.isfunction(obj):
            continue
        try:
            target = importlib.import_module(MODULES[module_name])
        except ImportError:
            continue  # reported by test_every_optax_name_has_a_functrain_counterpart
        ours = getattr(target, name, None)
        if ours is None or not callable(ours):
            continue
        yield qualified, obj, ours


def test_keyword_names_and_defaults_match_optax():
    """Every optax argument exists in functrain with the same default (functrain may add
    keyword arguments of its own after them)."""
    wrong = []
    for qualified, theirs, ours in signature_pairs():
        if qualified in SIGNATURE_DIFFERENCES:
            continue
        ref, got = _parameters(theirs), _parameters(ours)
        if not ref or not got:
            continue
        lost = [n for n in ref if n not in got]
        changed = [f"{n}={got[n]!r} (optax {ref[n]!r})" for n in ref
                   if n in got and not _same_default(ref[n], got[n])]
        order = [n for n in got if n in ref] != list(ref)
        if lost or changed or order:
            wrong.append(f"{qualified}: missing {lost}, defaults {changed}"
                         + (", positional order differs" if order else ""))
    assert not wrong, (f"{len(wrong)} signatures differ from optax's:\n  "
                       + "\n  ".join(wrong))


def test_signature_differences_are_still_real():
    pairs = {q: (t, o) for q, t, o in signature_pairs()}
    for qualified in SIGNATURE_DIFFERENCES:
        assert qualified in pairs, f"{qualified}: no longer a function in both libraries"
        theirs, ours = pairs[qualified]
        assert _parameters(theirs) != _parameters(ours), f"{qualified} now matches optax"
