"""functrain.contrib.ademamix / simplified_ademamix against optax.contrib 0.2.8.

30 jitted steps on a tree of matrices, vectors, a scalar and a zero leaf, with
settings beyond the common registry's (b3/alpha schedules, weight decay with a mask
or a schedule, eps_root); complex parameters (AdEMAMix: optax's numbers; Simplified
AdEMAMix: a numpy formula, as optax squares complex gradients without the modulus);
alpha = 0 is Adam; errors for bad input.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import optax.contrib  # noqa: F401
import pytest

import functrain
from helpers import assert_same_trajectory, make_params

STEPS = 30


def _schedule(start: float, end: float, steps: int = 20):
    return lambda count: start + (end - start) * jnp.minimum(count / steps, 1.0)


SETTINGS = [
    ("ademamix", dict(learning_rate=1e-2, weight_decay=1e-2,
                      mask=lambda p: jax.tree_util.tree_map(lambda x: x.ndim > 1, p))),
    ("ademamix", dict(learning_rate=1e-2, b3=_schedule(0.9, 0.999), alpha=_schedule(0.0, 8.0),
                      eps_root=1e-8, b2=0.99)),
    ("simplified_ademamix", dict(learning_rate=1e-3, alpha=_schedule(0.0, 2.0), b1=0.9)),
    ("simplified_ademamix", dict(learning_rate=1e-3, weight_decay=_schedule(0.0, 0.1),
                                 eps=1e-4, eps_root=1e-6)),
]


@pytest.mark.parametrize("index", range(len(SETTINGS)),
                         ids=[f"{n}-{i}" for i, (n, _) in enumerate(SETTINGS)])
def test_matches_optax_contrib_step_by_step(index):
    name, kwargs = SETTINGS[index]
    assert_same_trajectory(getattr(functrain.contrib, name)(**kwargs),
                           getattr(optax.contrib, name)(**kwargs), steps=STEPS,
                           name=f"{name}{kwargs}")


def test_states_have_optax_fields_and_mu_dtype():
    params = make_params()
    for name in ("ademamix", "simplified_ademamix"):
        ours = getattr(functrain.contrib, name)(0.1).init(params)[0]
        theirs = getattr(optax.contrib, name)(0.1).init(params)[0]
        assert type(ours).__name__ == type(theirs).__name__ and ours._fields == theirs._fields
    tx = functrain.contrib.ademamix(0.1, mu_dtype=jnp.bfloat16)
    _, state = jax.jit(tx.update)(params, tx.init(params), params)
    for field in ("m1", "m2", "nu"):  # optax stores all three in mu_dtype
        assert {x.dtype for x in jax.tree_util.tree_leaves(getattr(state[0], field))} == \
            {jnp.dtype(jnp.bfloat16)}


def test_ademamix_on_complex_parameters_matches_optax():
    rng = np.random.default_rng(3)
    c = lambda *s: jnp.asarray(rng.standard_normal(s) + 1j * rng.standard_normal(s),  # noqa
                               jnp.complex64)
    params = {"w": c(3, 2), "b": jnp.zeros(2, jnp.complex64), "r": jnp.ones(3)}
    grads = {"w": c(STEPS, 3, 2), "b": c(STEPS, 2),
             "r": jnp.asarray(rng.standard_normal((STEPS, 3)), jnp.float32)}
    kwargs = dict(learning_rate=1e-2, weight_decay=1e-2, b3=_schedule(0.9, 0.99))
    assert_same_trajectory(functrain.contrib.ademamix(**kwargs),
                           optax.contrib.ademamix(**kwargs), params=params, grads=grads,
                           name="ademamix complex")


def test_simplified_ademamix_on_complex_uses_the_squared_modulus():
    # optax 0.2.8 squares g itself (a complex square); functrain takes |g|**2 as every
    # second moment does. The numbers against a numpy formula of that rule:
    g = [np.array([1 + 2j, -0.5j]), np.array([0.3 - 1j, 2.0 + 0j])]
    b1, b2, lr = 0.9, 0.95, 0.1
    tx = functrain.contrib.simplified_ademamix(lr, b1=b1, b2=b2, alpha=0.5, eps=0.0)
    p = jnp.zeros(2, jnp.complex64)
    state, m, n = tx.init(p), 0, 0
    for t, gt in enumerate(g, start=1):
        u, state = tx.update(jnp.asarray(gt, jnp.complex64), state, p)
        m = gt + b1 * m
        n = b2 * n + (1 - b2) * np.abs(gt) ** 2
        expected = -lr * (m + 0.5 * gt) / np.sqrt(n / (1 - b2 ** t))
        np.testing.assert_allclose(np.asarray(u), expected, rtol=1e-5)


def test_ademamix_with_alpha_zero_is_adam():
    assert_same_trajectory(functrain.contrib.ademamix(1e-2, alpha=0.0),
                           optax.adam(1e-2), steps=10, name="ademamix alpha=0")


@pytest.mark.parametrize("build, message", [
    (lambda: functrain.contrib.ademamix(0.1, b3=1.0), "scale_by_ademamix: b3 must be in"),
    (lambda: functrain.contrib.ademamix(0.1, alpha="5"), "ademamix: alpha must be a real number"),
    (lambda: functrain.contrib.simplified_ademamix(0.1, eps=-1.0),
     "scale_by_simplified_ademamix: eps must be >= 0"),
    (lambda: functrain.contrib.simplified_ademamix(0.1, b2=-0.5),
     "scale_by_simplified_ademamix: b2 must be in"),
])
def test_bad_hyperparameters_are_named(build, message):
    with pytest.raises((ValueError, TypeError), match=message):
        build()


def test_shapes_and_state_are_checked_naming_the_leaf():
    params = {"w": jnp.ones((2, 2))}
    tx = functrain.contrib.scale_by_ademamix()
    with pytest.raises(ValueError, match=r"\['w'\]"):
        tx.update({"w": jnp.ones((3,))}, tx.init(params))
    with pytest.raises(TypeError, match="expected its state as ScaleBySimplifiedAdEMAMixState"):
        functrain.contrib.scale_by_simplified_ademamix().update(params, tx.init(params))
