"""functrain.wrappers.stateless against optax 0.2.8: stateless, stateless_with_tree_map,
init_empty_state, tree_map_params (every step, or the mapped state, compared)."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import functrain as ft
from helpers import assert_same_trajectory, make_params

STEPS = 30


def centre(updates, params):
    """Whole-tree: subtract the global mean of the updates, add 1% of the params."""
    leaves = jax.tree_util.tree_leaves(updates)
    mean = sum(jnp.sum(x) for x in leaves) / sum(x.size for x in leaves)
    return jax.tree_util.tree_map(lambda u, p: u - mean + 0.01 * p, updates, params)


def soft_sign(g, p):
    return g / (1.0 + jnp.abs(g)) + (0.0 if p is None else 0.05 * p)


CASES = {
    "stateless_then_sgd": lambda m: m.chain(m.stateless(centre), m.sgd(0.05, momentum=0.9)),
    "adam_then_tree_map": lambda m: m.chain(m.adam(0.05), m.stateless_with_tree_map(soft_sign)),
    "tree_map_then_sgd": lambda m: m.chain(m.stateless_with_tree_map(soft_sign), m.sgd(0.1)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_matches_optax(case):
    assert_same_trajectory(CASES[case](ft), CASES[case](optax), steps=STEPS, name=case)


def test_without_params_the_function_gets_none():
    seen = []
    tx = ft.stateless_with_tree_map(lambda g, p: seen.append(p) or 2 * g)
    u, state = tx.update({"a": jnp.ones(2), "b": jnp.ones(())}, tx.init({}))
    assert seen == [None, None] and state == ft.EmptyState()
    np.testing.assert_array_equal(u["a"], [2.0, 2.0])
    tx = ft.stateless(lambda u, p: (u, p))
    assert tx.update(jnp.ones(1), tx.init(None))[0][1] is None


def test_init_empty_state():
    assert ft.init_empty_state(make_params()) == ft.EmptyState() == optax.EmptyState()


MAPPED = {
    "adam": lambda m: m.adam(0.1),
    "chain_clip_adamw": lambda m: m.chain(m.clip_by_global_norm(1.0), m.adamw(0.1)),
    "sgd_momentum": lambda m: m.sgd(0.1, momentum=0.9),
    "multisteps_lion": lambda m: m.MultiSteps(m.lion(0.1), 2),
    "inject_adam": lambda m: m.inject_hyperparams(m.adam)(learning_rate=0.1),
    "conditionally_mask_sgd": lambda m: m.conditionally_mask(m.sgd(0.1, momentum=0.5),
                                                             lambda step: step > 0),
}


@pytest.mark.parametrize("case", sorted(MAPPED))
def test_tree_map_params_matches_optax(case):
    params = make_params()
    specs = jax.tree_util.tree_map(lambda p: p.ndim, params)
    results = []
    for m, opt in ((ft, MAPPED[case](ft)), (optax, MAPPED[case](optax))):
        state = opt.init(params)
        # Two steps, so the moments are not zeros.
        for g in (params, jax.tree_util.tree_map(jnp.sin, params)):
            _, state = opt.update(g, state, params)
        mapped = m.tree_map_params(opt, lambda x, spec: (x.shape, spec, float(jnp.sum(x))),
                                   state, specs, transform_non_params=lambda x: "other")
        results.append(jax.tree_util.tree_leaves(
            mapped, is_leaf=lambda x: isinstance(x, tuple) and len(x) == 3 and
            isinstance(x[1], int)))
    ours, theirs = results
    assert len(ours) == len(theirs) > 0
    found = 0
    for a, b in zip(ours, theirs):
        if isinstance(b, tuple):
            found += 1
            assert a[:2] == b[:2]
            np.testing.assert_allclose(a[2], b[2], rtol=2e-5, atol=1e-6)
        else:
            assert a == b
    assert found >= len(jax.tree_util.tree_leaves(params))


def test_tree_map_params_with_init_function_and_is_leaf():
    params = {"a": jnp.ones(2), "b": jnp.ones(3)}
    opt = ft.masked(ft.adam(0.1), {"a": True, "b": False})
    state = opt.init(params)
    mapped = ft.tree_map_params(opt.init, lambda x: "param", state,
                                is_leaf=lambda x: isinstance(x, ft.MaskedNode))
    assert mapped.inner_state[0].mu == {"a": "param", "b": "param"}  # MaskedNode mapped too
    assert mapped.inner_state[0].count is state.inner_state[0].count


def test_errors_name_the_argument():
    with pytest.raises(TypeError, match="stateless: f must be a function"):
        ft.stateless(1.0)
    with pytest.raises(TypeError, match="stateless_with_tree_map: f must be a function"):
        ft.stateless_with_tree_map("abs")
    tx = ft.stateless_with_tree_map(soft_sign)
    with pytest.raises(ValueError, match="different tree structures"):
        tx.update({"a": jnp.ones(1)}, tx.init({}), {"b": jnp.ones(1)})
    with pytest.raises(TypeError, match="tree_map_params: initable must be"):
        ft.tree_map_params(3, lambda x: x, ())
    with pytest.raises(TypeError, match="tree_map_params: f must be a function"):
        ft.tree_map_params(ft.sgd(0.1), None, ())
