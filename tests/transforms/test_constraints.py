"""functrain.transforms.constraints: zero_nans and keep_params_nonnegative by hand."""

import jax.numpy as jnp
import numpy as np
import pytest

import functrain as ft


def test_zero_nans_replaces_nans_and_records_them_per_leaf():
    tx = ft.zero_nans()
    params = {"a": jnp.zeros(3), "b": jnp.zeros(2)}
    state = tx.init(params)
    assert not bool(state.found_nan["a"]) and state.found_nan["a"].shape == ()
    grads = {"a": jnp.array([1.0, jnp.nan, -2.0]), "b": jnp.array([jnp.inf, 3.0])}
    u, state = tx.update(grads, state)
    np.testing.assert_array_equal(u["a"], [1.0, 0.0, -2.0])
    np.testing.assert_array_equal(u["b"], [np.inf, 3.0])  # only NaN is replaced
    assert bool(state.found_nan["a"]) and not bool(state.found_nan["b"])
    _, state = tx.update({"a": jnp.ones(3), "b": jnp.ones(2)}, state)
    assert not bool(state.found_nan["a"])                 # it is the last update's flag


def test_keep_params_nonnegative_by_hand():
    tx = ft.keep_params_nonnegative()
    params = jnp.array([1.0, 2.0, 0.5, 0.0])
    u, _ = tx.update(jnp.array([-3.0, -1.0, 0.5, -0.1]), tx.init(params), params)
    np.testing.assert_array_equal(u, [-1.0, -1.0, 0.5, 0.0])  # p + u < 0 gives u = -p
    assert float(jnp.min(ft.apply_updates(params, u))) == 0.0
    with pytest.raises(ValueError, match="needs the current parameters: call update"):
        tx.update(params, ())
