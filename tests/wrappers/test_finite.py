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
