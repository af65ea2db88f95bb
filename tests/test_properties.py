"""Property-based tests (hypothesis) over every named optimizer and every wrapper.

The subjects: every optimizer declared in ``tests/registry.py`` (core, contrib
and beyond optax: ``tests/test_registry.py`` checks that none of the package's is
missing), built with its record's arguments, and every wrapper found by
introspection (:func:`wrapper_names`: the public transformations of
``functrain/wrappers/*.py``, and those of ``functrain/engine/program.py``
that take a transformation), built by ``WRAPPER_RECIPES``;
:func:`test_recipes_cover_every_optimizer_and_wrapper` fails, naming it, when
one has no recipe. A record's ``skip`` (each with its reason) narrows the trees
it is run on (:func:`adapt`: one dtype per tree, no bfloat16 beside float16, no
zero-size leaf, no zero gradient entry, no all-equal gradient) or leaves a test
out (``properties``, ``float64``).

Hypothesis draws trees: nested dicts, lists and tuples (depth <= 3, empty ones
too) of leaves shaped ``()``, ``(0,)``, ``(2, 0)``, ``(1,)``, ``(3,)`` or
``(2, 3)``, each leaf float32, bfloat16, float16 or complex64 (a tree mixes
them), with finite params and gradients in [-10, 10]. For every subject:

1. finite inputs give finite updates;
2. each update leaf has its gradient's shape and dtype;
3. the state keeps its structure, shapes and dtypes over two steps, and a
   jitted step is traced once for two calls (the state it returns is the
   state it takes, weak types and static data included);
4. a jitted step gives the eager numbers (for a step that runs a decomposition, a QR,
   an eigh or a matrix iteration, on the tree's float64 twin: :func:`check_properties`);
5. ``jax.eval_shape(opt.init, params)`` is ``opt.init(params)``'s structure,
   shapes and dtypes;

and (a warning filter made an error, file-wide) no real leaf is computed
through a complex dtype and cast back: JAX warns that casting complex to real
"will soon raise a ValueError". Each subject also runs on one hand-made tree
with every shape and dtype (an explicit example: hypothesis' first drawn
example is always the simplest tree, a float32 scalar 0.0).

:func:`test_properties_float64` repeats them with float64 trees under
``enable_x64(True)``. Subjects whose math has no complex version
(``real_only``, with the reason: sm3, rprop, anything with ``clip``) draw real
trees only; :func:`test_complex_rejected_with_clear_error` checks that they refuse
complex leaves, naming the leaf, and :func:`test_complex_matches_optax` that every
other core optimizer gives optax's numbers on a complex tree.

Hypothesis settings come from a profile registered here: ``functrain-ci`` (the
default: few examples, derandomized, no example database, so every run draws
the same trees) or ``functrain-heavy`` (many random examples), picked with
``HYPOTHESIS_PROFILE=ci`` / ``HYPOTHESIS_PROFILE=heavy``. They are applied to
these tests only (hypothesis' built-in ``ci`` profile, and the profile loaded
for other test files, are left alone).
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import os
import pathlib
from typing import Any, Callable, Optional

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import functrain as ft
from functrain.jax_compat import enable_x64
import registry
from helpers import FAST_COMPILE, fast_jit

PACKAGE = pathlib.Path(ft.__file__).resolve().parent

# A real leaf's update must never pass through a complex dtype: JAX warns that
# dropping the imaginary part "will soon raise a ValueError".
pytestmark = pytest.mark.filterwarnings(
    "error:Casting from complex to real dtypes:DeprecationWarning")

# --------------------------------------------------------------------------
# Hypothesis profiles
# --------------------------------------------------------------------------

_COMMON = dict(deadline=None, print_blob=True,
               suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                      HealthCheck.filter_too_much])
settings.register_profile("functrain-ci", max_examples=2, derandomize=True, database=None,
                          **_COMMON)
settings.register_profile("functrain-heavy", max_examples=60, database=None, **_COMMON)


def _no_local_constants() -> None:
    """Make the drawn trees independent of which modules the process has imported.

    Hypothesis (6.131 on) also draws "local constants": numbers found in the source of every
    non-test module in ``sys.modules``, a pool that grows as other tests import modules. Under
    pytest-xdist the tests a worker ran before decide which modules are loaded, so the same
    subject drew other trees in other runs (prodigy met a float16 leaf in one full run only).
    The pool is emptied here (a private hook, absent from versions without the feature), so
    a derandomized run draws the same trees whatever ran before it.
    """
    try:
        from hypothesis.internal.conjecture import providers
        from hypothesis.internal.constants_ast import Constants
    except ImportError:  # a Hypothesis without local constants: nothing to pin
        return
    if hasattr(providers, "_get_local_constants"):
        providers._get_local_constants = Constants


_no_local_constants()


def _profile(scale: float = 1.0) -> settings:
    """The selected profile, with ``max_examples`` scaled by ``scale`` (at least 1)."""
    name = os.environ.get("HYPOTHESIS_PROFILE", "ci")
    name = name if name.startswith("functrain-") else f"functrain-{name}"
    if name not in ("functrain-ci", "functrain-heavy"):
        name = "functrain-ci"
    base = settings.get_profile(name)
    return settings(base, max_examples=max(1, int(base.max_examples * scale)))


# --------------------------------------------------------------------------
# What exists: wrappers, by introspection (optimizers: tests/registry.py)
# --------------------------------------------------------------------------

_TRANSFORMATION_PARAMS = {"tx", "inner", "opt", "transforms", "inner_factory"}


def _takes_transformation(fn: Callable) -> bool:
    """Whether ``fn`` has a parameter that is a transformation (by annotation or name)."""
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    return any("GradientTransformation" in str(p.annotation) or p.name in _TRANSFORMATION_PARAMS
               for p in parameters)


# Public names of functrain/wrappers/*.py that are not transformations (or whose
# updates are not shaped like the gradients), each with where it is tested instead.
NOT_TRANSFORMATIONS = {
    "ConditionFn": "a Protocol (the type of should_transform_fn), not a wrapper",
    "ShouldSkipUpdateFunction": "a Protocol (the type of should_skip_update_fn)",
    "StatefulSchedule": "a Protocol for schedules; used by the inject_stateful_hyperparams "
                        "recipe",
    "WrappedSchedule": "a schedule, not a transformation; used by the "
                       "inject_stateful_hyperparams recipe",
    "init_empty_state": "an init function, not a transformation (tests/wrappers/"
                        "test_stateless.py)",
    "tree_map_params": "maps over a state, not a transformation (tests/wrappers/"
                       "test_stateless.py)",
    "lookahead": "its params and updates are LookaheadParams (fast, slow) pairs, not trees "
                 "like the gradients; against optax in tests/wrappers/test_lookahead.py",
    "compensated_master": "reads a state's master values, not a transformation (tests/"
                          "wrappers/test_compensated.py)",
}


def wrapper_functions() -> dict:
    """name -> object for every wrapper the package exports.

    All public functions and classes defined in ``functrain/wrappers/*.py``
    (found on disk, so a new file counts), except the state types (tuples and
    dicts); and the functions of ``functrain/engine/program.py``
    that functrain exports and that take a transformation (``chain``, ``named_chain``). An alias (``partition`` is
    ``multi_transform``) appears under each of its names.
    """
    found = {}
    for path in sorted((PACKAGE / "wrappers").glob("*.py")):
        if path.stem == "__init__":
            continue
        mod = importlib.import_module(f"functrain.wrappers.{path.stem}")
        for name, obj in vars(mod).items():
            if name.startswith("_") or getattr(obj, "__module__", None) != mod.__name__:
                continue
            if inspect.isclass(obj) and issubclass(obj, (tuple, dict)):
                continue  # MaskedState, MultiStepsState, HyperparamsDict, ...
            if name in NOT_TRANSFORMATIONS:
                continue
            if inspect.isfunction(obj) or inspect.isclass(obj):
                found[name] = obj
    for modname in ("functrain.engine.program",):
        mod = importlib.import_module(modname)
        for name, obj in vars(mod).items():
            if (inspect.isfunction(obj) and obj.__module__ == modname
                    and not name.startswith("_") and getattr(ft, name, None) is obj
                    and _takes_transformation(obj)):
                found[name] = obj
    return found


def wrapper_names() -> set:
    """The names of :func:`wrapper_functions`."""
    return set(wrapper_functions())


# --------------------------------------------------------------------------
# Recipes: how to build each subject
# --------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Recipe:
    """How to build one test subject.

    Attributes:
      covers: the optimizer or wrapper name it exercises.
      make: ``make(module) -> transformation``; ``module`` is ``functrain``
        (or ``optax``, for the optimizers' complex parity).
      extra: ``extra(loss_fn, params) -> dict``, the keyword arguments ``update``
        needs besides the gradients (``value=`` for Polyak; see tests/registry.py).
      real_only: documented to reject complex leaves (sign flips or clipping
        by value have no complex version): drawn on real trees only.
      min_leaves: trees with fewer (but at least one) leaves are not drawn
        (multi_transform needs every label to be used).
      skip: property test (``properties``, ``float64``) -> why it does not apply.
      decomposed: the decomposition its step runs (tests/registry.py): property 4 on
        the float64 twin of the tree.
    """

    covers: str
    make: Callable[[Any], Any]
    extra: Optional[Callable[[Callable, Any], dict]] = None
    real_only: bool = False
    min_leaves: int = 0
    skip: Any = dataclasses.field(default_factory=dict)
    decomposed: str = ""


LR = 1e-2


def from_record(record: registry.Optimizer) -> Recipe:
    """The recipe of an optimizer of tests/registry.py: its record's arguments."""
    return Recipe(record.name, record.make, record.extra, bool(record.real_only),
                  skip=record.skip, decomposed=record.decomposed)


def alternating(tree: Any) -> Any:
    """A mask function: True on the leaves of even index, False on the others."""
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    return treedef.unflatten([i % 2 == 0 for i in range(len(leaves))])


def two_labels(tree: Any) -> Any:
    """A label function: 'adam' on the leaves of even index, 'sgd' on the others."""
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    return treedef.unflatten(["adam" if i % 2 == 0 else "sgd" for i in range(len(leaves))])


OPTIMIZER_RECIPES = {name: from_record(r) for name, r in registry.REGISTRY.items()}

WRAPPER_RECIPES = {
    "masked(adam)": Recipe("masked", lambda m: m.masked(m.adam(LR), alternating)),
    "chain(masked(add_decayed_weights), sgd)": Recipe(  # a single-stage inner: fused path
        "masked", lambda m: m.chain(m.masked(m.add_decayed_weights(1e-2), alternating),
                                    m.sgd(LR, momentum=0.9))),
    "multi_transform(adam, sgd)": Recipe(
        "multi_transform", lambda m: m.multi_transform(
            {"adam": m.adam(LR), "sgd": m.sgd(LR, momentum=0.9)}, two_labels), min_leaves=2),
    "chain(freeze, adam)": Recipe("freeze", lambda m: m.chain(m.freeze(alternating),
                                                              m.adam(LR))),
    "MultiSteps(adam)": Recipe("MultiSteps", lambda m: m.MultiSteps(m.adam(LR),
                                                                    every_k_schedule=2)),
    "apply_if_finite(adam)": Recipe("apply_if_finite",
                                    lambda m: m.apply_if_finite(m.adam(LR), 2)),
    "inject_hyperparams(adam)": Recipe(
        "inject_hyperparams", lambda m: m.inject_hyperparams(m.adam)(learning_rate=LR)),
    "named_chain(clip_by_block_rms, sgd)": Recipe(
        "named_chain", lambda m: m.named_chain(("clip", m.clip_by_block_rms(1.0)),
                                               ("sgd", m.sgd(LR, momentum=0.9)))),
    "chain(clip_by_global_norm, adam)": Recipe(
        "chain", lambda m: m.chain(m.clip_by_global_norm(1.0), m.adam(LR))),
    "chain(clip, sgd)": Recipe(
        "chain", lambda m: m.chain(m.clip(0.5), m.sgd(LR, momentum=0.9)), real_only=True),
    "chain(adam, apply_every)": Recipe(
        "apply_every", lambda m: m.chain(m.adam(LR), m.apply_every(2))),
    "conditionally_transform(adam)": Recipe(
        "conditionally_transform",
        lambda m: m.conditionally_transform(m.adam(LR), lambda step: step % 2 == 0)),
    "conditionally_mask(sgd)": Recipe(
        "conditionally_mask",
        lambda m: m.conditionally_mask(m.sgd(LR, momentum=0.9), lambda step: step >= 1)),
    "flatten(adam)": Recipe("flatten", lambda m: m.flatten(m.adam(LR))),
    "selective_transform(adam)": Recipe(
        "selective_transform",
        lambda m: m.selective_transform(m.adam(LR), freeze_mask=False)),
    "MultiSteps(adam, skip_not_finite)": Recipe(
        "skip_not_finite", lambda m: m.MultiSteps(m.adam(LR), 2,
                                                  should_skip_update_fn=m.skip_not_finite)),
    "MultiSteps(sgd, skip_large_updates)": Recipe(
        "skip_large_updates", lambda m: m.MultiSteps(
            m.sgd(LR), 2, should_skip_update_fn=lambda u, step, p: m.skip_large_updates(
                u, step, p, max_squared_norm=50.0))),
    "chain(monitor, adam)": Recipe(
        "monitor", lambda m: m.chain(m.monitor({"norm": m.tree.norm}), m.adam(LR))),
    "chain(monitor(measure_with_ema), sgd)": Recipe(
        "measure_with_ema", lambda m: m.chain(
            m.monitor({"ema": m.measure_with_ema(m.tree.norm, decay=0.9)}), m.sgd(LR))),
    "chain(snapshot, adam)": Recipe(
        "snapshot", lambda m: m.chain(m.snapshot("norm", m.tree.norm), m.adam(LR))),
    "chain(stateless, sgd)": Recipe(
        "stateless", lambda m: m.chain(
            m.stateless(lambda u, p: jax.tree_util.tree_map(lambda g: 0.5 * g, u)),
            m.sgd(LR, momentum=0.9))),
    "chain(stateless_with_tree_map, adam)": Recipe(
        "stateless_with_tree_map",
        lambda m: m.chain(m.stateless_with_tree_map(lambda g, p: g - 0.01 * p), m.adam(LR))),
    "compensated_params(adam)": Recipe(
        "compensated_params", lambda m: m.compensated_params(m.adam(LR))),
    "inject_stateful_hyperparams(adam)": Recipe(
        "inject_stateful_hyperparams",
        lambda m: m.inject_stateful_hyperparams(m.adam)(
            learning_rate=m.WrappedSchedule(m.linear_schedule(LR, 0.0, 10)))),
}

RECIPES = {**OPTIMIZER_RECIPES, **WRAPPER_RECIPES}


def test_recipes_cover_every_optimizer_and_wrapper():
    """Every optimizer and wrapper has a recipe here, and every recipe names one.

    An alias is covered by a recipe under any of its names (``partition`` by
    ``multi_transform``'s): the same object needs no second run.
    """
    optimizers, wrappers = set(registry.REGISTRY), wrapper_functions()
    expected_wrappers = {"masked", "multi_transform", "partition", "freeze", "MultiSteps",
                         "apply_if_finite", "inject_hyperparams", "named_chain", "chain"}
    assert expected_wrappers <= set(wrappers), (
        f"the introspection lost wrappers: {sorted(expected_wrappers - set(wrappers))}")
    covered = {r.covers for r in RECIPES.values()}
    covered_objects = [wrappers[n] for n in covered if n in wrappers]
    missing = sorted(optimizers - covered) + sorted(
        n for n, obj in wrappers.items() if not any(obj is c for c in covered_objects))
    assert not missing, f"no recipe in tests/test_properties.py RECIPES for: {missing}"
    unknown = sorted(covered - optimizers - set(wrappers))
    assert not unknown, f"recipes for names that are neither optimizer nor wrapper: {unknown}"
    for name, recipe in RECIPES.items():
        for test, reason in recipe.skip.items():
            assert test not in ("properties", "float64") or len(reason) > 10, (name, test)


# --------------------------------------------------------------------------
# Strategies: trees of leaves of varied shapes and dtypes
# --------------------------------------------------------------------------

SHAPES = [(), (0,), (2, 0), (1,), (3,), (2, 3)]
REAL_DTYPES = ["float32", "bfloat16", "float16"]
COMPLEX_DTYPES = ["complex64"]
KEYS = ["w", "b", "scale", "emb", "x"]


class Leaf:
    """One drawn leaf: its shape, dtype and the values of params and both gradients.

    ``data[2k]`` / ``data[2k + 1]`` are the real / imaginary parts of array
    ``k`` (0: params, 1: first gradient, 2: second gradient); the imaginary
    parts are ignored for real dtypes. Not a pytree node, so ``tree_map``
    sees it as a leaf.
    """

    def __init__(self, shape: tuple, dtype: str, data: np.ndarray):
        self.shape, self.dtype, self.data = shape, dtype, data

    def array(self, k: int) -> jax.Array:
        x = self.data[2 * k].astype(np.float64)
        if "complex" in self.dtype:
            x = x + 1j * self.data[2 * k + 1].astype(np.float64)
        return jnp.asarray(x, jnp.dtype(self.dtype))

    def __repr__(self) -> str:
        vals = [self.data[2 * k].tolist() if "complex" not in self.dtype else
                (self.data[2 * k] + 1j * self.data[2 * k + 1]).tolist() for k in range(3)]
        return f"Leaf({self.shape}, {self.dtype}, p={vals[0]}, g1={vals[1]}, g2={vals[2]})"


def leaves(dtypes: list) -> st.SearchStrategy:
    """One leaf: a shape from ``SHAPES``, a dtype from ``dtypes``, values in [-10, 10]."""
    values = st.floats(-10, 10, width=32, allow_subnormal=False)

    def with_values(shape_dtype: tuple) -> st.SearchStrategy:
        shape, dtype = shape_dtype
        return hnp.arrays(np.float32, (6,) + shape, elements=values).map(
            lambda data: Leaf(shape, dtype, data))

    return st.tuples(st.sampled_from(SHAPES), st.sampled_from(dtypes)).flatmap(with_values)


def nested(leaf: st.SearchStrategy, depth: int = 3) -> st.SearchStrategy:
    """A bare leaf, or dicts / lists / tuples (possibly empty) nested at most ``depth`` deep."""
    if depth == 0:
        return leaf
    sub = nested(leaf, depth - 1)
    return st.one_of(
        leaf,
        st.dictionaries(st.sampled_from(KEYS), sub, max_size=3),
        st.lists(sub, max_size=3),
        st.lists(sub, max_size=3).map(tuple),
    )


def trees(dtypes: list) -> st.SearchStrategy:
    """A tree of :class:`Leaf`, its leaves' dtypes drawn from a sub-list of ``dtypes``."""
    pools = st.lists(st.sampled_from(dtypes), min_size=1, max_size=len(dtypes), unique=True)
    return pools.flatmap(lambda pool: nested(leaves(pool)))


def materialize(spec: Any) -> tuple:
    """``(params, grads1, grads2)``: the arrays of a drawn tree."""
    return tuple(jax.tree_util.tree_map(lambda leaf, k=k: leaf.array(k), spec) for k in range(3))


# --------------------------------------------------------------------------
# The properties
# --------------------------------------------------------------------------

def loss(params: Any) -> jax.Array:
    """A real loss of (possibly complex) params, for Polyak's ``value``."""
    return 0.5 * sum(jnp.sum(jnp.abs(x.astype(jnp.promote_types(x.dtype, jnp.float32))) ** 2)
                     for x in jax.tree_util.tree_leaves(params))


def tolerance(dtype: Any) -> dict:
    """How closely jit and eager must agree on a leaf of ``dtype``."""
    dtype = jnp.dtype(dtype)
    if dtype in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)):
        return dict(rtol=2e-2, atol=1e-4)  # one or two 16-bit roundings apart
    if dtype in (jnp.dtype(jnp.float64), jnp.dtype(jnp.complex128)):
        return dict(rtol=1e-10, atol=1e-12)
    return dict(rtol=1e-5, atol=1e-6)


def as_numpy(x: Any) -> np.ndarray:
    """A numpy copy: 16-bit floats as float32, typed PRNG keys as their key data."""
    if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
        x = jax.random.key_data(x)
    x = np.asarray(x)
    if x.dtype in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)):
        return x.astype(np.float32)
    return x


def coupling_dtype(params: Any) -> Any:
    """The precision whole-tree quantities (global norms) of ``params`` are summed in.

    Each leaf's sum of squares is at least float32, so a float64 leaf's update
    can carry float32 rounding when the tree also holds a narrower leaf
    (``clip_by_global_norm``, Polyak): float64 only if every leaf is.
    """
    wide = all(jnp.finfo(x.dtype).bits >= 64 for x in jax.tree_util.tree_leaves(params))
    return jnp.float64 if wide else jnp.float32


def assert_close_leafwise(eager: Any, jitted: Any, what: str, coupling: Any) -> None:
    """Same structure, and every leaf within its dtype's tolerance (at most ``coupling``'s)."""
    assert jax.tree_util.tree_structure(eager) == jax.tree_util.tree_structure(jitted), what
    for (path, a), b in zip(jax.tree_util.tree_flatten_with_path(eager)[0],
                            jax.tree_util.tree_leaves(jitted)):
        where = f"{what} {jax.tree_util.keystr(path)}"
        assert a.dtype == b.dtype, (where, a.dtype, b.dtype)
        tol = None
        if jnp.issubdtype(a.dtype, jnp.inexact):
            own, shared = tolerance(a.dtype), tolerance(coupling)
            tol = {k: max(own[k], shared[k]) for k in own}
        a, b = as_numpy(a), as_numpy(b)
        if tol is not None:
            np.testing.assert_allclose(b, a, err_msg=f"{where}: jit != eager", **tol)
        else:  # counts, PRNG keys: exact
            np.testing.assert_array_equal(b, a, err_msg=f"{where}: jit != eager")


def avals(tree: Any) -> list:
    """(path, shape, dtype, weak_type) of every leaf: what a jit cache key sees of them."""
    return [(jax.tree_util.keystr(path), jnp.shape(x), getattr(x, "dtype", type(x)),
             getattr(x, "weak_type", False))
            for path, x in jax.tree_util.tree_flatten_with_path(tree)[0]]


def adapt(recipe: Recipe, spec: Any) -> Any:
    """``spec`` as far as ``recipe`` applies (the registry's ``skip``, with the reasons):

    * ``mixed_dtypes``: every leaf given the first leaf's dtype;
    * ``mixed_16bit``: float16 leaves made bfloat16 where the tree mixes the two;
    * ``float16``: float16 leaves made bfloat16;
    * ``zero_size``: zero-size leaves given one entry;
    * ``zero_gradient``: gradient entries 0 made 1 (an all-zero gradient has no direction);
    * ``degenerate``: a distinct offset added to each gradient entry (all-equal entries make
      a rank-1 matrix, whose eigenbasis is not unique).
    """
    dtypes = [leaf.dtype for leaf in jax.tree_util.tree_leaves(spec)]
    to_bf16 = "float16" in recipe.skip or (
        "mixed_16bit" in recipe.skip and {"bfloat16", "float16"} <= set(dtypes))
    one_dtype = dtypes[0] if dtypes and "mixed_dtypes" in recipe.skip else None
    no_empty = "zero_size" in recipe.skip

    def fix(leaf: Leaf) -> Leaf:
        dtype = "bfloat16" if to_bf16 and leaf.dtype == "float16" else leaf.dtype
        dtype = one_dtype or dtype
        if no_empty and 0 in leaf.shape:
            return fixed_leaf((1,), dtype, 7)
        data = leaf.data.copy()
        if "zero_gradient" in recipe.skip:
            data[2:] = np.where(data[2:] == 0, np.float32(1), data[2:])
        if "degenerate" in recipe.skip:
            data[2:] += (0.1 * np.sin(np.arange(1, data[0].size + 1))).reshape(
                data.shape[1:]).astype(np.float32)
        return Leaf(leaf.shape, dtype, data)

    return jax.tree_util.tree_map(fix, spec)


WIDE = {"float32": "float64", "bfloat16": "float64", "float16": "float64",
        "float64": "float64", "complex64": "complex128", "complex128": "complex128"}


def float64_twin(spec: Any) -> Any:
    """``spec`` with every leaf in float64 (complex128 for complex leaves), from the same drawn
    values (16-bit leaves too: helpers.widen widens float32/complex64 arrays only)."""
    return jax.tree_util.tree_map(lambda leaf: Leaf(leaf.shape, WIDE[leaf.dtype], leaf.data),
                                  spec)


def step_of(opt: Any, extra: Callable) -> Callable:
    """``step(params, state, grads) -> (updates, state, new params)``: one eager step."""
    def step(p, s, g):
        u, s = opt.update(g, s, p, **extra(p))
        return u, s, ft.apply_updates(p, u)
    return step


def counted_jit(opt: Any, extra: Callable) -> tuple:
    """:func:`step_of` jitted, and the list it appends to per trace."""
    traces, eager = [], step_of(opt, extra)

    @fast_jit
    def step(p, s, g):
        traces.append(1)
        return eager(p, s, g)

    return step, traces


def two_steps(step: Callable, params: Any, state0: Any, g1: Any, g2: Any) -> tuple:
    """``(u1, state1, u2, state2)`` of two steps of ``step`` from ``state0``."""
    u1, state1, p1 = step(params, state0, g1)
    u2, state2, _ = step(p1, state1, g2)
    return u1, state1, u2, state2


def assert_steps_close(eager: tuple, jitted: tuple, coupling: Any) -> None:
    """Property 4: the two steps' updates and states, jit against eager, leaf by leaf."""
    for what, a, b in zip(("step 1 updates", "step 1 state", "step 2 updates", "step 2 state"),
                          eager, jitted):
        assert_close_leafwise(a, b, what, coupling)


def check_properties(recipe: Recipe, spec: Any) -> None:
    """Properties 1-5 for one subject on one drawn tree (as far as it applies: :func:`adapt`).

    Property 4 compares a decomposed subject (``recipe.decomposed``: a QR, an eigh, an SVD,
    a triangular solve or a matrix iteration in its step) on the tree's float64 twin
    (:func:`float64_twin`). Two programs round differently; a decomposition amplifies that by its
    conditioning, which the drawn trees do not bound: in float32 Dion's Q differed by 1.8e-5
    relative between jit and eager (about 150 float32 roundings), above the 1e-5 tolerance.
    In float64 the same amplification is 3e-14, and the float64 tolerance (1e-10) allows an
    amplification of 1e6 roundings, where float32's allows 1e2.
    """
    n = len(jax.tree_util.tree_leaves(spec))
    assume(n == 0 or n >= recipe.min_leaves)
    spec = adapt(recipe, spec)
    params, g1, g2 = materialize(spec)
    opt = recipe.make(ft)
    extra = (lambda p: recipe.extra(loss, p)) if recipe.extra else (lambda p: {})

    # 5. eval_shape of init is init's structure, shapes and dtypes.
    state0 = opt.init(params)
    abstract = jax.eval_shape(opt.init, params)
    assert jax.tree_util.tree_structure(abstract) == jax.tree_util.tree_structure(state0)
    chex.assert_trees_all_equal_shapes_and_dtypes(abstract, state0)

    # Eager: two steps.
    eager = two_steps(step_of(opt, extra), params, state0, g1, g2)
    u1, state1, u2, state2 = eager

    # 1. finite updates (16-bit updates may round to 0, but are finite).
    for t, u in ((1, u1), (2, u2)):
        for path, x in jax.tree_util.tree_flatten_with_path(u)[0]:
            assert bool(jnp.all(jnp.isfinite(x))), (
                f"step {t}: update {jax.tree_util.keystr(path)} ({x.dtype}) is not finite: {x}")

    # 2. updates keep the gradients' shapes and dtypes.
    chex.assert_trees_all_equal_shapes_and_dtypes(u1, g1)
    chex.assert_trees_all_equal_shapes_and_dtypes(u2, g2)

    # 3. the state keeps its structure, shapes and dtypes ...
    chex.assert_trees_all_equal_shapes_and_dtypes(state0, state1)
    chex.assert_trees_all_equal_shapes_and_dtypes(state0, state2)

    # ... and a jitted step is traced once for two calls.
    step, traces = counted_jit(opt, extra)
    jitted = two_steps(step, params, state0, g1, g2)
    if len(traces) != 1:
        first = (params, state0, g1)
        second = (ft.apply_updates(params, jitted[0]), jitted[1], g2)
        changed = [(a, b) for a, b in zip(avals(first), avals(second)) if a != b]
        same_def = jax.tree_util.tree_structure(first) == jax.tree_util.tree_structure(second)
        raise AssertionError(
            f"the jitted step was traced {len(traces)} times for 2 calls. (params, state, "
            f"grads) avals that changed between the calls: {changed}; same tree structure "
            f"and static data: {same_def}")
    chex.assert_trees_all_equal_shapes_and_dtypes(state0, jitted[3])

    # 4. jit and eager give the same numbers (a decomposed subject's on the float64 twin).
    if not recipe.decomposed:
        assert_steps_close(eager, jitted, coupling_dtype(params))
        return
    with enable_x64(True):
        params, g1, g2 = materialize(float64_twin(spec))
        opt = recipe.make(ft)
        state0 = opt.init(params)
        eager = two_steps(step_of(opt, extra), params, state0, g1, g2)
        jitted = two_steps(counted_jit(opt, extra)[0], params, state0, g1, g2)
        assert_steps_close(eager, jitted, coupling_dtype(params))


def fixed_leaf(shape: tuple, dtype: str, seed: int) -> Leaf:
    rng = np.random.default_rng(seed)
    return Leaf(shape, dtype, rng.uniform(-10, 10, (6,) + shape).astype(np.float32))


# Explicit examples run for every subject before the drawn ones (hypothesis'
# first drawn example is always the simplest tree, one float32 scalar 0.0):
# every shape and dtype, and empty containers, in one tree.
MIXED = {"w": fixed_leaf((2, 3), "float32", 1),
         "b": [fixed_leaf((3,), "bfloat16", 2), fixed_leaf((), "float16", 3)],
         "x": (fixed_leaf((0,), "complex64", 4), fixed_leaf((2, 0), "float32", 5),
               fixed_leaf((2, 3), "complex64", 6)),
         "empty": [], "none": {}}
MIXED_REAL = {**MIXED, "x": (fixed_leaf((0,), "float32", 4), fixed_leaf((2, 0), "float32", 5),
                             fixed_leaf((2, 3), "float16", 6))}
MIXED_F64 = {"w": fixed_leaf((2, 3), "float64", 1),
             "b": [fixed_leaf((3,), "float64", 2), fixed_leaf((), "float64", 3)]}

TREES = trees(REAL_DTYPES + COMPLEX_DTYPES)
REAL_TREES = trees(REAL_DTYPES)
F64_TREES = trees(["float64", "float32"])

COMPLEX_SUBJECTS = sorted(n for n, r in RECIPES.items()
                          if not r.real_only and "properties" not in r.skip)
REAL_ONLY_SUBJECTS = sorted(n for n, r in RECIPES.items()
                            if r.real_only and "properties" not in r.skip)
F64_SUBJECTS = sorted(n for n, r in RECIPES.items() if "float64" not in r.skip)


@pytest.mark.parametrize("subject", COMPLEX_SUBJECTS)
@given(spec=TREES)
@example(spec=MIXED)
@_profile()
def test_properties(subject, spec):
    """Properties 1-5 on trees mixing float32, bfloat16, float16 and complex64 leaves."""
    check_properties(RECIPES[subject], spec)


@pytest.mark.parametrize("subject", REAL_ONLY_SUBJECTS)
@given(spec=REAL_TREES)
@example(spec=MIXED_REAL)
@_profile()
def test_properties_real_only(subject, spec):
    """Properties 1-5 for the subjects without complex support, on real trees."""
    check_properties(RECIPES[subject], spec)


@pytest.mark.parametrize("subject", F64_SUBJECTS)
@given(spec=F64_TREES)
@example(spec=MIXED_F64)
@_profile(scale=0.5)
@pytest.mark.long
def test_properties_float64(subject, spec):
    """The same properties on float64 (and mixed float64/float32) trees, with x64 on."""
    with enable_x64(True):
        check_properties(RECIPES[subject], spec)
    assert not jax.config.jax_enable_x64


# --------------------------------------------------------------------------
# Complex: optax's numbers, or a clear error
# --------------------------------------------------------------------------

COMPLEX_PARAMS = {
    "w": np.array([[1 + 0.5j, -0.3 + 2j, 0.2], [0.7 - 1j, 0.1 + 0.1j, -2j]]),
    "b": np.array([0.5 - 0.25j, -1 + 1j, 0.0]),
    "nested": [(np.array(0.3 - 0.7j),)],
}
TARGET = 1 + 1j


def complex_loss(params: Any) -> jax.Array:
    return sum(jnp.sum(jnp.abs(x - TARGET) ** 2) for x in jax.tree_util.tree_leaves(params))


def complex_trajectories(recipe: Recipe, steps: int = 20) -> tuple:
    """functrain's and optax's params after each of ``steps`` steps, stacked, in one jit.

    The gradients are conj(grad) of a real loss (the steepest-descent
    direction for complex params, optax's convention).
    """
    def run(module: Any, params: Any) -> Any:
        opt = recipe.make(module)

        def step(carry, _):
            p, s = carry
            g = jax.tree_util.tree_map(jnp.conj, jax.grad(complex_loss)(p))
            extra = recipe.extra(complex_loss, p) if recipe.extra else {}
            u, s = opt.update(g, s, p, **extra)
            p = module.apply_updates(p, u)
            return (p, s), p

        return jax.lax.scan(step, (params, opt.init(params)), None, length=steps)[1]

    params = jax.tree_util.tree_map(lambda x: jnp.asarray(x, jnp.complex64), COMPLEX_PARAMS)
    both = jax.jit(lambda p: (run(ft, p), run(optax, p)), compiler_options=FAST_COMPILE)
    return both(params)


COMPLEX_OPTIMIZERS = sorted(n for n, r in OPTIMIZER_RECIPES.items()
                            if not r.real_only and not registry.REGISTRY[n].contrib)


@pytest.mark.parametrize("name", COMPLEX_OPTIMIZERS)
def test_complex_matches_optax(name):
    """Every optimizer that accepts complex params gives optax's numbers for 20 jitted steps."""
    ours, theirs = complex_trajectories(OPTIMIZER_RECIPES[name])
    assert jax.tree_util.tree_structure(ours) == jax.tree_util.tree_structure(theirs)
    start = jax.tree_util.tree_leaves(COMPLEX_PARAMS)
    for (path, x), y, p0 in zip(jax.tree_util.tree_flatten_with_path(ours)[0],
                                jax.tree_util.tree_leaves(theirs), start):
        where = f"{name} {jax.tree_util.keystr(path)}"
        assert x.dtype == y.dtype == jnp.complex64, (where, x.dtype, y.dtype)
        x, y = np.asarray(x), np.asarray(y)
        bad = ~np.isclose(x, y, rtol=2e-5, atol=1e-6)
        first = int(np.argmax(bad.reshape(len(bad), -1).any(axis=1))) if bad.any() else None
        np.testing.assert_allclose(x, y, rtol=2e-5, atol=1e-6,
                                   err_msg=f"{where}: first differs at step {first}")
    assert any(np.any(np.imag(np.asarray(x[-1])) != np.imag(p0))
               for x, p0 in zip(jax.tree_util.tree_leaves(ours), start)), (
        f"{name} never moved the imaginary parts: the comparison would be vacuous")


# Every subject marked real_only (the registry's records, with their reasons), and clip.
REJECTS_COMPLEX = {n: r for n, r in RECIPES.items()
                   if r.real_only and "complex_error" not in r.skip}
REJECTS_COMPLEX["clip"] = Recipe("clip", lambda m: m.clip(0.5), real_only=True)


@pytest.mark.parametrize("name", sorted(REJECTS_COMPLEX))
def test_complex_rejected_with_clear_error(name):
    """What has no complex version refuses complex leaves: a TypeError/ValueError naming
    the leaf (so a ``real_only`` mark cannot go stale)."""
    recipe = REJECTS_COMPLEX[name]
    opt = recipe.make(ft)
    params = {"b": jnp.ones(3, jnp.float32),
              "w": jnp.asarray([[1 + 1j, 2 - 1j], [0.5j, -1.0]], jnp.complex64)}
    grads = jax.tree_util.tree_map(lambda x: x * 0.5, params)
    extra = recipe.extra(loss, params) if recipe.extra else {}
    with pytest.raises((TypeError, ValueError)) as info:
        state = opt.init(params)
        opt.update(grads, state, params, **extra)
    message = str(info.value)
    assert "['w']" in message, f"{name}: the error does not name the leaf ['w']: {message}"
    assert "complex" in message.lower(), f"{name}: the error does not say 'complex': {message}"
