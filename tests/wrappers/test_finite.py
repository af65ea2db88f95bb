"""functrain.wrappers.finite: apply_if_finite by hand (every step against optax in
tests/parity/test_optax_parity.py)."""

import jax.numpy as jnp
import numpy as np
import pytest

import functrain as ft
from helpers import assert_empty_params_step, assert_state_donatable


def test_apply_if_finite_nan_step_by_hand():
    opt = ft.apply_if_finite(ft.sgd(0.1, momentum=0.9), max_consecutive_errors=2)
    params = [jnp.array([1.0])]
    state = opt.init(params)
    u, state = opt.update([jnp.array([2.0])], state)
    np.testing.assert_allclose(u[0], [-0.2])
    u, state = opt.update([jnp.array([jnp.nan])], state)
    np.testing.assert_array_equal(u[0], [0.0])
    np.testing.assert_allclose(state.inner_state[0].trace[0], [2.0])  # untouched
    assert int(state.notfinite_count) == 1 and not bool(state.last_finite)
    u, state = opt.update([jnp.array([1.0])], state)
    np.testing.assert_allclose(u[0], [-0.1 * (1.0 + 0.9 * 2.0)], rtol=1e-6)
    assert int(state.notfinite_count) == 0 and int(state.total_notfinite) == 1


def test_apply_if_finite_counter_resets_after_forced_update():
    # optax keeps counting after giving up, so every later bad step is applied;
    # here the counter restarts and the next bad steps are skipped again.
    opt = ft.apply_if_finite(ft.sgd(1.0), max_consecutive_errors=2)
    state = opt.init([jnp.zeros(1)])
    bad = [jnp.array([jnp.inf])]
    applied = []
    for _ in range(6):
        u, state = opt.update(bad, state)
        applied.append(bool(np.all(np.asarray(u[0]) != 0)))
    assert applied == [False, False, True, False, False, True]
    assert int(state.total_notfinite) == 6 and int(state.notfinite_count) == 0


@pytest.mark.parametrize("make", [lambda: ft.apply_if_finite(ft.adam(0.1), 2)],
                         ids=["apply_if_finite"])
def test_empty_params(make):
    assert_empty_params_step(make())


@pytest.mark.parametrize("make", [lambda: ft.apply_if_finite(ft.adam(0.1), 2)],
                         ids=["apply_if_finite"])
def test_state_can_be_donated_and_abstractly_initialised(make):
    assert_state_donatable(make())


# --------------------------------------------------------------------------
# skip_not_finite / skip_large_updates: MultiSteps against optax 0.2.8
# --------------------------------------------------------------------------

import functools  # noqa: E402

import jax  # noqa: E402
import optax  # noqa: E402

from helpers import assert_same_trajectory, make_grads, make_params  # noqa: E402


def grads_with_bad_steps(steps=30):
    """make_grads with NaN/Inf entries at some steps (a leaf or two at a time)."""
    params = make_params()
    grads = make_grads(params, steps)
    w = np.array(grads["dense"]["w"])
    w[[2, 3, 9], 0, 1] = [np.nan, np.inf, -np.inf]
    b = np.array(grads["dense"]["b"])
    b[[3, 17], 2] = np.nan
    grads["dense"]["w"], grads["dense"]["b"] = jnp.asarray(w), jnp.asarray(b)
    return params, grads


SKIPS = {
    "not_finite": lambda m: m.skip_not_finite,
    "large": lambda m: functools.partial(m.skip_large_updates, max_squared_norm=6e5),  # about half the steps
}


@pytest.mark.parametrize("skip", sorted(SKIPS))
def test_multisteps_skip_matches_optax(skip):
    def make(m):
        return m.MultiSteps(m.adam(0.05), every_k_schedule=3,
                            should_skip_update_fn=SKIPS[skip](m)).gradient_transformation()

    params, grads = grads_with_bad_steps()
    if skip == "large":  # the non-finite steps would poison the norm: finite here
        grads = jax.tree_util.tree_map(lambda g: jnp.nan_to_num(g, posinf=1e3, neginf=-1e3),
                                       grads)
    assert_same_trajectory(make(ft), make(optax), params=params, grads=grads, name=skip)
    # The recorded skip_state agrees too, step by step.
    ours, theirs = make(ft), make(optax)
    s1, s2 = ours.init(params), theirs.init(params)
    step1, step2 = jax.jit(ours.update), jax.jit(theirs.update)
    skipped = []
    for t in range(12):
        g = jax.tree_util.tree_map(lambda x: x[t], grads)
        _, s1 = step1(g, s1, params)
        _, s2 = step2(g, s2, params)
        assert set(s1.skip_state) == set(s2.skip_state)
        for key in s2.skip_state:
            np.testing.assert_allclose(s1.skip_state[key], s2.skip_state[key], rtol=1e-5)
        np.testing.assert_array_equal(s1.mini_step, s2.mini_step)
        skipped.append(bool(s1.skip_state["should_skip"]))
    assert any(skipped) and not all(skipped)


def test_skip_functions_match_optax_directly():
    trees = [{"a": jnp.ones(3), "b": jnp.asarray([[2.0, jnp.nan]])},
             {"a": jnp.asarray([jnp.inf, -jnp.inf, 1.0]), "b": jnp.zeros((1, 2))},
             {"a": jnp.asarray([3.0, 4.0, 0.0]), "b": jnp.asarray([[1.0, 1e3]])}]
    step = jnp.asarray(0)
    for tree in trees:
        for ours, theirs in [
            (ft.skip_not_finite(tree, step, None), optax.skip_not_finite(tree, step, None)),
            (ft.skip_large_updates(tree, step, None, 26.5),
             optax.skip_large_updates(tree, step, None, 26.5)),
        ]:
            assert bool(ours[0]) == bool(theirs[0])
            assert set(ours[1]) == set(theirs[1])
            for key in theirs[1]:
                np.testing.assert_allclose(ours[1][key], theirs[1][key], rtol=1e-6)


def test_skip_large_updates_complex_counts_magnitudes():
    skip, info = ft.skip_large_updates([jnp.asarray([3j, 4.0])], jnp.asarray(0), None, 26.0)
    assert float(info["norm_squared"]) == 25.0 and not bool(skip)


def test_skip_large_updates_rejects_a_bad_threshold():
    with pytest.raises(ValueError, match="skip_large_updates: max_squared_norm must be >= 0"):
        ft.skip_large_updates([jnp.ones(1)], jnp.asarray(0), None, -1.0)
