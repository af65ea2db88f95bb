"""functrain.tree's optax.tree functions (functrain/tree/ops.py) against optax.tree on the same inputs.

Each function runs on the same trees in both libraries; results, dtypes and
(for the state helpers) the paths found must agree, and the same bad inputs
must raise in both.
"""

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import functrain
from functrain import tree as ft
from functrain.jax_compat import enable_x64
from helpers import make_params

P = make_params()
Q = jax.tree_util.tree_map(lambda x: x * 0.5 - 1.0, P)
R = jax.tree_util.tree_map(lambda x: x + 2.0, P)
RNG = np.random.default_rng(3)
C = {"a": jnp.asarray(RNG.standard_normal(3) + 1j * RNG.standard_normal(3), jnp.complex64),
     "b": jnp.asarray(RNG.standard_normal((2, 2)), jnp.float32)}
C2 = jax.tree_util.tree_map(lambda x: x * (1 - 2j) if jnp.iscomplexobj(x) else x + 1, C)


def same(ours, theirs, rtol=1e-6, atol=1e-7, structure=True):
    """Same structure (unless ``structure=False``: the libraries' state classes differ),
    dtypes and values."""
    if structure:
        assert jax.tree_util.tree_structure(ours) == jax.tree_util.tree_structure(theirs)
    assert len(jax.tree_util.tree_leaves(ours)) == len(jax.tree_util.tree_leaves(theirs))
    for a, b in zip(jax.tree_util.tree_leaves(ours), jax.tree_util.tree_leaves(theirs)):
        assert jnp.asarray(a).dtype == jnp.asarray(b).dtype, (a, b)
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=rtol, atol=atol)


def test_arithmetic_matches_optax():
    same(ft.add(P, Q), optax.tree.add(P, Q))
    same(ft.add(P, Q, R), optax.tree.add(P, Q, R))
    same(ft.sub(P, Q), optax.tree.sub(P, Q))
    same(ft.mul(P, Q), optax.tree.mul(P, Q))
    same(ft.div(P, R), optax.tree.div(P, R))
    for s in (0.5, jnp.asarray(-2.0)):
        same(ft.scale(s, P), optax.tree.scale(s, P))
        same(ft.add_scale(P, s, Q), optax.tree.add_scale(P, s, Q))
    with_none = {"a": None, "b": jnp.ones(2)}
    same(ft.add_scale(with_none, 2.0, {"a": None, "b": jnp.ones(2)}),
         optax.tree.add_scale(with_none, 2.0, {"a": None, "b": jnp.ones(2)}))
    same(ft.conj(C), optax.tree.conj(C))
    same(ft.real(C), optax.tree.real(C))
    for lo, hi in ((-0.5, 0.5), (None, 0.0), (0.1, None)):
        same(ft.clip(P, lo, hi), optax.tree.clip(P, lo, hi))
    same(ft.batch_shape(P, (2, 3)), optax.tree.batch_shape(P, (2, 3)))
    same(ft.where(jnp.asarray(False), P, Q), optax.tree.where(jnp.asarray(False), P, Q))
    same(ft.where(True, C, C2), optax.tree.where(True, C, C2))
    # Integer trees keep optax's dtype promotion.
    ints = {"i": jnp.arange(4)}
    same(ft.scale(0.5, ints), optax.tree.scale(0.5, ints))
    same(ft.div(ints, ints), optax.tree.div(ints, ints))


def test_reductions_match_optax():
    for a, b in ((P, Q), (C, C2), ({"i": jnp.arange(3)}, {"i": jnp.arange(3) + 1})):
        same(ft.vdot(a, b), optax.tree.vdot(a, b), rtol=1e-5)
    same(ft.sum(P), optax.tree.sum(P), rtol=1e-6)
    # optax's associative sum needs jax.tree.reduce_associative (JAX 0.6); functrain's runs
    # on every JAX, so before 0.6 it is compared with optax's sequential sum.
    associative = hasattr(jax.tree, "reduce_associative")
    same(ft.sum(P, associative_reduction=True),
         optax.tree.sum(P, associative_reduction=associative), rtol=1e-6)
    with_empty = {"e": jnp.zeros((0,)), "x": jnp.array([3.0, -7.0])}
    for t in (P, with_empty):
        same(ft.max(t), optax.tree.max(t))
        same(ft.min(t), optax.tree.min(t))
    assert ft.size(P) == optax.tree.size(P) == 12 + 3 + 5 + 8 + 1
    for t in (P, C):
        for ord_ in (None, 2, 1, jnp.inf, "inf", "infinity"):
            for squared in (False, True):
                same(ft.norm(t, ord=ord_, squared=squared),
                     optax.tree.norm(t, ord=ord_, squared=squared), rtol=1e-5)
    # optax's positional order: norm(tree, ord, squared).
    same(ft.norm(P, 1, True), optax.tree.norm(P, 1, True), rtol=1e-5)
    near = jax.tree_util.tree_map(lambda x: x + 1e-7, P)
    far = jax.tree_util.tree_map(lambda x: x + 1e-2, P)
    for other in (near, far):
        for kw in ({}, {"atol": 0.1}, {"rtol": 0.0, "atol": 0.0}):
            assert bool(ft.allclose(P, other, **kw)) == bool(optax.tree.allclose(P, other, **kw))
    nan = {"n": jnp.array([jnp.nan])}
    for eq in (False, True):
        assert (bool(ft.allclose(nan, nan, equal_nan=eq))
                == bool(optax.tree.allclose(nan, nan, equal_nan=eq)))


VDOT_DTYPES = [("complex64", "float32"), ("complex64", "complex64"), ("float32", "complex64"),
               ("float32", "float32"), ("bfloat16", "bfloat16"), ("bfloat16", "float32")]
VDOT_DTYPES_X64 = [("complex128", "complex128"), ("complex128", "float64"),
                   ("float64", "float64")]


@pytest.mark.parametrize("x64", [False, True], ids=["x32", "x64"])
@pytest.mark.long
def test_vdot_gives_optax_bits_eagerly_and_jitted(x64):
    """optax.tree.vdot calls jnp.vdot (on JAX 0.10.2 too: it compares version strings, and
    '0.10.2' < '0.7.2'). Complex results computed op by op differ from it in the last bit
    (XLA fuses the conjugate into the dot only in one program); functrain's per-leaf vdot is
    jitted, so it gives the same bits eagerly as well as under jit."""
    rng = np.random.default_rng(7)

    def draw(shape, dtype):
        x = rng.standard_normal(shape)
        if np.issubdtype(np.dtype(dtype), np.complexfloating):
            x = x + 1j * rng.standard_normal(shape)
        return jnp.asarray(x, dtype)

    with enable_x64(x64):
        for da, db in VDOT_DTYPES + (VDOT_DTYPES_X64 if x64 else []):
            for shape in ((20,), (20, 10), (3, 5, 7)):
                a = {"x": draw(shape, da), "y": draw((4,), da)}
                b = {"x": draw(shape, db), "y": draw((4,), db)}
                for run in (lambda f: f(a, b), lambda f: jax.jit(f)(a, b)):
                    ours, theirs = np.asarray(run(ft.vdot)), np.asarray(run(optax.tree.vdot))
                    assert ours.dtype == theirs.dtype, (da, db, shape)
                    assert ours.tobytes() == theirs.tobytes(), (da, db, shape, ours, theirs)


def test_16bit_norm_accumulates_in_float32_where_optax_overflows():
    big = {"h": jnp.full((4096,), 300.0, jnp.float16)}
    np.testing.assert_allclose(ft.norm(big), 300.0 * 64.0, rtol=1e-3)
    assert not np.isfinite(float(optax.tree.norm(big)))


def test_casts_and_dtype_match_optax():
    mixed = {"f": jnp.ones(2), "i": jnp.arange(3), "h": jnp.ones(1, jnp.float16)}
    for dt in (jnp.bfloat16, jnp.int32, None):
        same(ft.cast(mixed, dt), optax.tree.cast(mixed, dt))
    other = {"f": jnp.zeros(2, jnp.bfloat16), "i": jnp.zeros(3), "h": 1.0}
    same(ft.cast_like(mixed, other), optax.tree.cast_like(mixed, other))
    for handler in ("promote", "highest", "lowest"):
        assert ft.dtype(mixed, handler) == optax.tree.dtype(mixed, handler)
    assert ft.dtype(P) == optax.tree.dtype(P)
    assert ft.dtype({}) == optax.tree.dtype({})
    with pytest.raises(ValueError, match=r"\['i'\]"):
        ft.dtype(mixed)
    with pytest.raises(ValueError):
        optax.tree.dtype(mixed)
    unordered = {"a": jnp.ones(1, jnp.int8), "b": jnp.ones(1, jnp.uint8)}  # promote to int16
    for lib in (ft, optax.tree):
        with pytest.raises(ValueError):
            lib.dtype(unordered, "highest")
        with pytest.raises(ValueError, match="mixed_dtype_handler"):
            lib.dtype(P, "largest")


def test_constructors_match_optax():
    for dt in (None, jnp.int32):
        same(ft.zeros_like(P, dt), optax.tree.zeros_like(P, dt))
        same(ft.ones_like(P, dt), optax.tree.ones_like(P, dt))
        same(ft.full_like(P, 3, dt), optax.tree.full_like(P, 3, dt))
    same(ft.zeros_like({"s": 1.5}), optax.tree.zeros_like({"s": 1.5}))


def test_random_trees_match_optax():
    key = jax.random.key(7)
    old_key = jax.random.PRNGKey(7)
    for k in (key, old_key):
        same(ft.unwrap_random_key_data(ft.split_key_like(k, P)),
             optax.tree.unwrap_random_key_data(optax.tree.split_key_like(k, P)))
        for sampler, dt in ((jax.random.normal, None), (jax.random.uniform, jnp.float16),
                            (jax.random.rademacher, jnp.int32)):
            same(ft.random_like(k, P, sampler, dt), optax.tree.random_like(k, P, sampler, dt))
    keys = {"k": key, "x": jnp.ones(2)}
    same(ft.unwrap_random_key_data(keys), optax.tree.unwrap_random_key_data(keys))


def test_moment_updates_match_optax():
    g = {"a": C["a"], "b": C["b"], "none": None}
    m = {"a": jnp.abs(C2["a"]), "b": C2["b"], "none": None}
    for order in (1, 2, 3):
        same(ft.update_moment_per_elem_norm(g, m, 0.9, order),
             optax.tree.update_moment_per_elem_norm(g, m, 0.9, order))
        same(ft.update_moment(g, m, 0.9, order), optax.tree.update_moment(g, m, 0.9, order))
    same(ft.update_infinity_moment(g, m, 0.9, 1e-3),
         optax.tree.update_infinity_moment(g, m, 0.9, 1e-3))
    low = {"h": jnp.full(3, 0.3, jnp.bfloat16), "f": jnp.full(2, 0.1)}
    for count in (1, 7, 1000):
        c = jnp.asarray(count, jnp.int32)
        same(ft.bias_correction(low, 0.999, c), optax.tree.bias_correction(low, 0.999, c))
        same(jax.jit(ft.bias_correction)(P, 0.9, c), optax.tree.bias_correction(P, 0.9, c))
    # The top-level names are these functions.
    assert functrain.update_moment is ft.update_moment
    assert functrain.bias_correction is ft.bias_correction


def test_mismatched_trees_raise_naming_the_path():
    bad = {"dense": P["dense"], "layers": P["layers"][:1], "scalar": P["scalar"]}
    for name in ("sub", "mul", "div", "vdot", "allclose", "cast_like"):
        with pytest.raises(ValueError, match=r"\['layers'\]\[1\]"):
            getattr(ft, name)(P, bad)
        with pytest.raises(ValueError):
            getattr(optax.tree, name)(P, bad)
    with pytest.raises(ValueError, match=r"\['layers'\]\[1\]"):
        ft.add(P, P, bad)
    for lib in (ft, optax.tree):
        with pytest.raises(ValueError, match="Unsupported ord: 3"):
            lib.norm(P, ord=3)


# --------------------------------------------------------------------------
# State helpers: get, set, get_all_with_path, map_params
# --------------------------------------------------------------------------

class Inner(NamedTuple):
    count: Any
    mu: Any


class Outer(NamedTuple):
    count: Any
    hyperparams: Any
    inner: Any


STATE = (Outer(count=jnp.asarray(3), hyperparams={"learning_rate": jnp.asarray(0.1), "b1": 0.9},
               inner=(Inner(count=jnp.asarray(5), mu={"w": jnp.ones(2)}), {"count": 7})),
         Inner(count=jnp.asarray(1), mu=jnp.zeros(3)))


def readable(found):
    return [([str(e) for e in path], jax.tree_util.tree_leaves(v)) for path, v in found]


def test_get_all_with_path_matches_optax():
    def arrays_only(path, value):
        return isinstance(value, jax.Array)

    def in_inner(path, value):
        return "Inner" in str(path[-1])

    for key in ("count", "learning_rate", "mu", "Inner", "hyperparams", "missing", "w"):
        for filtering in (None, arrays_only, in_inner):
            ours = ft.get_all_with_path(STATE, key, filtering)
            theirs = optax.tree.get_all_with_path(STATE, key, filtering)
            assert readable(ours) == readable(theirs), (key, filtering)


def test_get_matches_optax_and_raises_on_several():
    for key in ("learning_rate", "hyperparams", "missing"):
        assert readable([((), ft.get(STATE, key, default=-1))]) == readable(
            [((), optax.tree.get(STATE, key, default=-1))])
    one = ft.get(STATE, "count", filtering=lambda p, v: str(p[-1]) == "Outer.count")
    assert int(one) == 3 == int(optax.tree.get(STATE, "count", filtering=lambda p, v:
                                               str(p[-1]) == "Outer.count"))
    for lib in (ft, optax.tree):
        with pytest.raises(KeyError, match="multiple values for 'count'"):
            lib.get(STATE, "count")


def test_set_matches_optax():
    cases = [((), {"count": 0}), ((), {"learning_rate": jnp.asarray(0.5), "mu": 1.0}),
             ((), {"Inner": jnp.asarray(9.0)}), ((), {"b1": 0.5}),
             ((lambda p, v: isinstance(v, jax.Array),), {"count": -1})]
    for filtering, kwargs in cases:
        ours = ft.set(STATE, *filtering, **kwargs)
        theirs = optax.tree.set(STATE, *filtering, **kwargs)
        assert jax.tree_util.tree_structure(ours) == jax.tree_util.tree_structure(theirs)
        same(ours, theirs)
    for lib in (ft, optax.tree):
        with pytest.raises(KeyError, match="Found no values matching 'nope'"):
            lib.set(STATE, nope=1)
        with pytest.raises(KeyError, match="given the filtering"):
            lib.set(STATE, lambda p, v: False, count=1)


def test_set_and_get_on_a_functrain_optimizer_state():
    opt = functrain.adam(0.1)
    state = opt.init(P)
    assert int(ft.get(state, "count")) == 0
    new = ft.set(state, count=jnp.asarray(4, jnp.int32))
    assert int(ft.get(new, "count")) == 4
    same(ft.get(new, "mu"), ft.get(state, "mu"))


def test_map_params_matches_optax():
    ours_opt = functrain.chain(functrain.add_noise(0.1, 0.5, 0), functrain.adam(0.1))
    theirs_opt = optax.chain(optax.add_noise(0.1, 0.5, 0), optax.adam(0.1))
    s_ours, s_theirs = ours_opt.init(P), theirs_opt.init(P)

    def f(x, y):
        return x + 2 * y

    for kw in ({}, {"transform_non_params": lambda v: None}):
        ours = ft.map_params(ours_opt, f, s_ours, Q, **kw)
        theirs = optax.tree.map_params(theirs_opt, f, s_theirs, Q, **kw)
        same(optax.tree.unwrap_random_key_data(ours),
             optax.tree.unwrap_random_key_data(theirs), structure=False)
        assert str(jax.tree_util.tree_structure(ours)) == str(
            jax.tree_util.tree_structure(theirs))
    # An init function works as well as an object with `.init`.
    shapes = ft.map_params(ours_opt.init, lambda x: x.shape, s_ours,
                           transform_non_params=lambda v: "other")
    assert ft.get(shapes, "mu")["dense"]["w"] == (4, 3)
    assert ft.get(shapes, "count", filtering=lambda p, v: "Adam" in str(p[-1])) == "other"
