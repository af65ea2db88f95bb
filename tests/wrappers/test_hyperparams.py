"""functrain.wrappers.hyperparams: inject_hyperparams by hand (every optimizer through it:
tests/optimizers/; every step against optax: tests/parity/test_optax_parity.py)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import functrain as ft
from helpers import assert_empty_params_step, assert_state_donatable


def test_inject_hyperparams_lr_change_by_hand():
    opt = ft.inject_hyperparams(ft.sgd)(learning_rate=0.1, momentum=0.9)
    params = [jnp.array([0.0])]
    state = opt.init(params)
    step = jax.jit(opt.update)
    trace, expected, got = 0.0, [], []
    for t, g in enumerate([1.0, 2.0, -1.0, 0.5]):
        if t == 2:
            state.hyperparams["learning_rate"] = 0.01
        lr = 0.1 if t < 2 else 0.01
        trace = g + 0.9 * trace
        expected.append(-lr * trace)
        u, state = step([jnp.array([g])], state)
        got.append(float(u[0][0]))
    np.testing.assert_allclose(got, expected, rtol=1e-6)
    assert step._cache_size() == 1


def test_inject_hyperparams_compiles_once_for_three_learning_rates():
    opt = ft.inject_hyperparams(ft.adam)(learning_rate=0.1)
    params = {"w": jnp.ones(3)}
    state = opt.init(params)

    @jax.jit
    def train_step(params, state, grads):
        updates, state = opt.update(grads, state, params)
        return ft.apply_updates(params, updates), state

    seen = []
    for lr in (0.1, np.float32(0.05), jnp.asarray(0.01, jnp.float32)):
        state.hyperparams["learning_rate"] = lr
        new_params, state = train_step(params, state, {"w": jnp.ones(3)})
        seen.append(float(params["w"][0] - new_params["w"][0]))
        params = new_params
    np.testing.assert_allclose(seen, [0.1, 0.05, 0.01], rtol=1e-4)
    assert train_step._cache_size() == 1


def test_inject_hyperparams_schedule_and_static_args():
    opt = ft.inject_hyperparams(ft.sgd, static_args="nesterov")(
        learning_rate=lambda count: 0.1 * (count + 1), nesterov=False)
    state = opt.init([jnp.zeros(1)])
    us = []
    for _ in range(3):
        u, state = opt.update([jnp.ones(1)], state)
        us.append(float(u[0][0]))
    np.testing.assert_allclose(us, [-0.1, -0.2, -0.3], rtol=1e-6)
    np.testing.assert_allclose(state.hyperparams["learning_rate"], 0.3, rtol=1e-6)
    assert "nesterov" not in state.hyperparams
    with pytest.raises(ValueError, match="static_args"):
        ft.inject_hyperparams(ft.sgd, static_args=("not_an_argument",))


@pytest.mark.parametrize("make", [lambda: ft.inject_hyperparams(ft.adam)(0.1)],
                         ids=["inject_hyperparams"])
def test_empty_params(make):
    assert_empty_params_step(make())


@pytest.mark.parametrize("make", [lambda: ft.inject_hyperparams(ft.adamw)(0.1, b1=0.9, b2=0.9)],
                         ids=["inject_hyperparams"])
def test_state_can_be_donated_and_abstractly_initialised(make):
    assert_state_donatable(make())
