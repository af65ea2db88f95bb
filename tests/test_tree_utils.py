"""functrain.tree_utils: optax.tree_utils' ``tree_*`` names, each functrain.tree's function.

Every name optax 0.2.8 exports from ``optax.tree_utils`` that has a functrain.tree
counterpart is here (the same object), and each one gives optax's numbers on a
small tree.
"""

import types
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
import optax.tree_utils as otu
import pytest

import functrain
import functrain.tree_utils as ftu


def counterpart(name):
    """functrain.tree's name for optax.tree_utils' ``name`` (``tree_add`` -> ``add``)."""
    return name[len("tree_"):] if name.startswith("tree_") else name


OPTAX_NAMES = sorted(n for n in dir(otu) if not n.startswith("_")
                     and not isinstance(getattr(otu, n), types.ModuleType))


def test_every_optax_tree_utils_name_with_a_counterpart_is_an_alias():
    with_counterpart = [n for n in OPTAX_NAMES if hasattr(functrain.tree, counterpart(n))]
    assert len(with_counterpart) >= 36 and "tree_get" in with_counterpart
    for name in with_counterpart:
        assert getattr(ftu, name) is getattr(functrain.tree, counterpart(name)), name
    assert sorted(ftu.__all__) == with_counterpart
    assert [n for n in OPTAX_NAMES if n not in with_counterpart] == []


class State(NamedTuple):
    count: jax.Array
    mu: dict


X = {"a": jnp.array([1.0, -2.0, 3.0]), "b": [jnp.array([[0.5, -1.5]]), jnp.array(2.0)]}
Y = {"a": jnp.array([0.5, 4.0, -1.0]), "b": [jnp.array([[2.0, 1.0]]), jnp.array(-3.0)]}
Z = {"a": jnp.array([1.0 + 2j, -1j]), "b": jnp.array(3.0 - 1j)}
STATE = (State(jnp.asarray(3), X), {"count": jnp.asarray(7)})
KEY = jax.random.key(0)

# name -> a function of the module (optax.tree_utils or functrain.tree_utils) calling it.
CALLS = {
    "tree_add": lambda m: m.tree_add(X, Y, X),
    "tree_add_scale": lambda m: m.tree_add_scale(X, 0.5, Y),
    "tree_allclose": lambda m: (m.tree_allclose(X, X), m.tree_allclose(X, Y)),
    "tree_batch_shape": lambda m: m.tree_batch_shape(X, (4,)),
    "tree_bias_correction": lambda m: m.tree_bias_correction(X, 0.9, jnp.asarray(3)),
    "tree_cast": lambda m: m.tree_cast(X, jnp.bfloat16),
    "tree_cast_like": lambda m: m.tree_cast_like(X, m.tree_cast(Y, jnp.float16)),
    "tree_clip": lambda m: m.tree_clip(X, -1.0, 1.0),
    "tree_conj": lambda m: m.tree_conj(Z),
    "tree_div": lambda m: m.tree_div(X, Y),
    "tree_dtype": lambda m: str(m.tree_dtype(m.tree_cast(X, jnp.float16))),
    "tree_full_like": lambda m: m.tree_full_like(X, 2.5),
    "tree_get": lambda m: m.tree_get(STATE, "mu"),
    "tree_get_all_with_path": lambda m: [
        (jax.tree_util.keystr(p), v) for p, v in m.tree_get_all_with_path(STATE, "count")],
    "tree_map_params": lambda m: m.tree_map_params(
        lambda p: State(jnp.zeros([]), p), lambda v: 2 * v, State(jnp.asarray(1.0), X)),
    "tree_max": lambda m: m.tree_max(X),
    "tree_min": lambda m: m.tree_min(X),
    "tree_mul": lambda m: m.tree_mul(X, Y),
    "tree_norm": lambda m: (m.tree_norm(X), m.tree_norm(X, ord=1), m.tree_norm(X, ord="inf"),
                            m.tree_norm(X, squared=True)),
    "tree_ones_like": lambda m: m.tree_ones_like(X, jnp.int32),
    "tree_random_like": lambda m: m.tree_random_like(KEY, X),
    "tree_real": lambda m: m.tree_real(Z),
    "tree_scale": lambda m: m.tree_scale(-2.0, X),
    "tree_set": lambda m: m.tree_set(STATE, count=jnp.asarray(0)),
    "tree_size": lambda m: m.tree_size(X),
    "tree_split_key_like": lambda m: jax.random.key_data(
        jax.tree_util.tree_leaves(m.tree_split_key_like(KEY, X))[0]),
    "tree_sub": lambda m: m.tree_sub(X, Y),
    "tree_sum": lambda m: m.tree_sum(X),
    "tree_unwrap_random_key_data": lambda m: m.tree_unwrap_random_key_data({"k": KEY}),
    "tree_update_infinity_moment": lambda m: m.tree_update_infinity_moment(X, Y, 0.9, 1e-8),
    "tree_update_moment": lambda m: m.tree_update_moment(X, Y, 0.9, 2),
    "tree_update_moment_per_elem_norm": lambda m: m.tree_update_moment_per_elem_norm(
        X, Y, 0.99, 2),
    "tree_vdot": lambda m: m.tree_vdot(X, Y),
    "tree_where": lambda m: (m.tree_where(jnp.asarray(False), X, Y),
                             m.tree_where(jnp.asarray(True), X, Y)),
    "tree_zeros_like": lambda m: m.tree_zeros_like(X),
}


def test_every_alias_is_called():
    assert sorted(CALLS) == [n for n in ftu.__all__ if n.startswith("tree_")]


@pytest.mark.parametrize("name", sorted(CALLS))
def test_gives_optax_numbers_on_a_small_tree(name):
    ours, theirs = CALLS[name](ftu), CALLS[name](otu)
    a, b = jax.tree_util.tree_leaves(ours), jax.tree_util.tree_leaves(theirs)
    assert len(a) == len(b) > 0, name
    for x, y in zip(a, b):
        if isinstance(y, str):
            assert x == y, name
            continue
        assert np.shape(x) == np.shape(y) and np.asarray(x).dtype == np.asarray(y).dtype, name
        np.testing.assert_allclose(np.asarray(x, np.float64 if np.isrealobj(y) else None),
                                   np.asarray(y, np.float64 if np.isrealobj(y) else None),
                                   rtol=1e-6, err_msg=name)


DEPRECATED = {
    "tree_scalar_mul": lambda m: m.tree_scalar_mul(-2.0, X),
    "tree_add_scalar_mul": lambda m: m.tree_add_scalar_mul(X, 0.5, Y),
    "tree_l1_norm": lambda m: m.tree_l1_norm(X),
    "tree_l2_norm": lambda m: m.tree_l2_norm(X),
    "tree_linf_norm": lambda m: m.tree_linf_norm(X),
}


@pytest.mark.parametrize("name", sorted(DEPRECATED))
def test_deprecated_names_warn_and_give_optax_numbers(name):
    with pytest.warns(DeprecationWarning, match=f"{name} is deprecated"):
        ours = DEPRECATED[name](ftu)
    with pytest.warns(DeprecationWarning, match="is deprecated"):  # (optax's names another)
        theirs = DEPRECATED[name](otu)
    for x, y in zip(jax.tree_util.tree_leaves(ours), jax.tree_util.tree_leaves(theirs)):
        np.testing.assert_allclose(x, y, rtol=1e-6)
    with pytest.raises(AttributeError, match="has no attribute 'tree_nothing'"):
        ftu.tree_nothing  # noqa: B018
    assert getattr(optax.tree_utils, "tree_nothing", None) is None


# --------------------------------------------------------------------------
# Path keys: equal and hash-equal to optax's for the same state
# --------------------------------------------------------------------------

def _optax_states():
    params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
    return {
        "adamw": optax.adamw(1e-3).init(params),
        "chain": optax.chain(optax.clip_by_global_norm(1.0), optax.adam(1e-3),
                             optax.scale_by_schedule(lambda c: 1.0)).init(params),
        "inject_hyperparams": optax.inject_hyperparams(optax.adam)(1e-3).init(params),
        "functrain adam": functrain.adam(1e-3).init(params),
    }


@pytest.mark.parametrize("state_name", ["adamw", "chain", "inject_hyperparams",
                                        "functrain adam"])
@pytest.mark.parametrize("key", ["mu", "count", "ScaleByAdamState", "learning_rate", "w"])
def test_paths_compare_and_hash_equal_to_optaxs(state_name, key):
    state = _optax_states()[state_name]
    theirs = [path for path, _ in otu.tree_get_all_with_path(state, key)]
    ours = [path for path, _ in ftu.tree_get_all_with_path(state, key)]
    assert [[str(e) for e in p] for p in ours] == [[str(e) for e in p] for p in theirs]
    assert ours == theirs and theirs == ours            # both ways round
    assert not ours != theirs
    assert [hash(p) for p in ours] == [hash(p) for p in theirs]
    assert set(ours) == set(theirs) and {p: 1 for p in theirs}.keys() == set(ours)
    if key in ("mu", "count"):
        assert ours, (state_name, key)  # something was compared


def test_named_tuple_key_equals_optaxs_and_nothing_else():
    ours, theirs = ftu.NamedTupleKey("ScaleByAdamState", "mu"), otu.NamedTupleKey(
        "ScaleByAdamState", "mu")
    assert ftu.NamedTupleKey is functrain.tree.NamedTupleKey
    assert type(ours) is not type(theirs)  # optax's own class, not imported by functrain
    assert ours == theirs and theirs == ours and hash(ours) == hash(theirs)
    assert {theirs: "found"}[ours] == "found" and {ours: "found"}[theirs] == "found"
    assert repr(ours) == repr(theirs) and str(ours) == str(theirs)
    for other in (otu.NamedTupleKey("ScaleByAdamState", "nu"),
                  otu.NamedTupleKey("ScaleByLionState", "mu"),
                  ftu.NamedTupleKey("ScaleByAdamState", "nu")):
        assert ours != other and other != ours
    for other in ("ScaleByAdamState.mu", ("ScaleByAdamState", "mu"),
                  jax.tree_util.GetAttrKey("mu"), jax.tree_util.DictKey("mu")):
        assert ours != other and other != ours
    # A filtering function written with optax's key finds the entry in functrain's paths.
    state = functrain.adam(1e-3).init({"w": jnp.ones(2)})
    found = ftu.tree_get(state, "count", filtering=lambda path, _: theirs.tuple_name in str(
        path) and otu.NamedTupleKey("ScaleByAdamState", "count") in path)
    assert found is not None and int(found) == 0
