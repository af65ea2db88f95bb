"""functrain.contrib.adopt, madgrad and acprop: ADOPT, MADGRAD and ACProp.

Compared against optax.contrib 0.2.8 step by step (30 jitted steps on a tree of
matrices, vectors, a scalar and a zero leaf; settings beyond the common registry's:
learning-rate schedules, weight decay with masks, nesterov, clipping off, a custom
clip_value_fn), on complex parameters where optax supports them, and
against hand-written numpy formulas; plus the errors for bad input.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import optax.contrib  # noqa: F401
import pytest

import functrain
from helpers import assert_same_trajectory, assert_updates, make_params, updates_of

STEPS = 30


def _schedule(start: float, end: float, steps: int = 20):
    return lambda count: start + (end - start) * jnp.minimum(count / steps, 1.0)


# (name, kwargs): each built from functrain.contrib and optax.contrib alike.
SETTINGS = [
    ("adopt", dict(learning_rate=1e-2)),
    ("adopt", dict(learning_rate=1e-2, nesterov=True, use_clipping=False, b2=0.99)),
    ("adopt", dict(learning_rate=_schedule(1e-2, 1e-3), clip_value_fn=lambda c: 0.5 + c / 10,
                   b1=0.5, eps=1e-3)),
    ("madgrad", dict(learning_rate=1e-2)),
    ("madgrad", dict(learning_rate=_schedule(1e-2, 1e-1), momentum=0.5, weight_decay=1e-2,
                     eps=1e-4)),
    ("acprop", dict(learning_rate=1e-2)),
    ("acprop", dict(learning_rate=1e-2, b1=0.5, b2=0.9, eps=1e-8, eps_root=1e-10,
                    weight_decay=0.1, mask={"dense": True, "layers": False, "scalar": False})),
]


@pytest.mark.parametrize("index", range(len(SETTINGS)),
                         ids=[f"{n}-{i}" for i, (n, _) in enumerate(SETTINGS)])
def test_matches_optax_contrib_step_by_step(index):
    name, kwargs = SETTINGS[index]
    assert_same_trajectory(getattr(functrain.contrib, name)(**kwargs),
                           getattr(optax.contrib, name)(**kwargs), steps=STEPS,
                           name=f"{name}{kwargs}")


def test_states_have_optax_classes_and_fields():
    params = make_params()
    for ours, theirs in [(functrain.contrib.adopt(0.1), optax.contrib.adopt(0.1)),
                         (functrain.contrib.acprop(0.1), optax.contrib.acprop(0.1)),
                         (functrain.contrib.madgrad(0.1), optax.contrib.madgrad(0.1))]:
        a, b = ours.init(params), theirs.init(params)
        inner_a = [s for s in a if type(s).__name__ != "EmptyState"][0]
        inner_b = [s for s in b if type(s).__name__ != "EmptyState"][0]
        assert type(inner_a).__name__ == type(inner_b).__name__
        assert inner_a._fields == inner_b._fields
        assert (jax.tree_util.tree_map(lambda x: (x.shape, x.dtype), inner_a)._asdict()
                == jax.tree_util.tree_map(lambda x: (x.shape, x.dtype), inner_b)._asdict())


def test_mu_dtype_is_kept_in_the_state():
    params = make_params()
    for tx in (functrain.contrib.adopt(0.1, mu_dtype=jnp.bfloat16),):
        state = tx.init(params)
        _, state = jax.jit(tx.update)(params, state, params)
        dtypes = {x.dtype for x in jax.tree_util.tree_leaves(state[0])
                  if x.ndim or x.dtype != jnp.int32}
        assert jnp.dtype(jnp.bfloat16) in dtypes


# --------------------------------------------------------------------------
# Complex parameters
# --------------------------------------------------------------------------

def _complex_tree():
    rng = np.random.default_rng(3)
    c = lambda *s: jnp.asarray(rng.standard_normal(s) + 1j * rng.standard_normal(s),
                               jnp.complex64)
    params = {"w": c(3, 2), "b": jnp.zeros(2, jnp.complex64), "r": jnp.ones(3)}
    grads = {"w": c(STEPS, 3, 2), "b": c(STEPS, 2),
             "r": jnp.asarray(rng.standard_normal((STEPS, 3)), jnp.float32)}
    return params, grads


@pytest.mark.parametrize("name, kwargs", [
    ("adopt", dict(learning_rate=1e-2, use_clipping=False)),
    ("acprop", dict(learning_rate=1e-2)),
])
def test_complex_parameters_match_optax(name, kwargs):
    params, grads = _complex_tree()
    assert_same_trajectory(getattr(functrain.contrib, name)(**kwargs),
                           getattr(optax.contrib, name)(**kwargs), params=params, grads=grads,
                           name=name)


def test_no_complex_version_raises_naming_the_leaf():
    params = {"a": jnp.ones(2), "z": jnp.ones(2, jnp.complex64)}
    for tx in (functrain.contrib.adopt(0.1), functrain.contrib.madgrad(0.1)):
        with pytest.raises(TypeError, match=r"\['z'\]"):
            tx.update(params, tx.init(params), params)


# --------------------------------------------------------------------------
# Hand-derived formulas
# --------------------------------------------------------------------------

def test_adopt_normalizes_by_the_previous_second_moment():
    b1, b2, eps = 0.9, 0.99, 1e-6
    grads = [np.array([0.1, -2.0, 0.3, 1.0]), np.array([-0.4, 0.5, 0.0, 2.0]),
             np.array([1.0, 1.0, -1.0, -0.5])]
    mu, nu, expected = np.zeros(4), np.zeros(4), []
    for k, g in enumerate(grads):
        if k == 0:
            nu = g ** 2
            expected.append(np.zeros(4))
            continue
        n = np.clip(g / np.maximum(np.sqrt(nu), eps), -k ** 0.25, k ** 0.25)
        mu = b1 * mu + (1 - b1) * n
        nu = b2 * nu + (1 - b2) * g ** 2
        expected.append(mu)
    ours = updates_of(functrain.contrib.scale_by_adopt(b1, b2, eps), grads, params=None)
    assert_updates(ours, expected)


def test_acprop_uses_the_previous_belief_moment():
    b1, b2, eps, eps_root = 0.9, 0.999, 1e-16, 1e-16
    grads = [np.array([0.1, -2.0, 0.3, 1.0]), np.array([-0.4, 0.5, 0.0, 2.0]),
             np.array([1.0, 1.0, -1.0, -0.5])]
    mu, s, expected = np.zeros(4), np.zeros(4), []
    for t, g in enumerate(grads, start=1):
        s_hat = np.ones(4) if t == 1 else s / (1 - b2 ** (t - 1))
        expected.append(g / (np.sqrt(s_hat) + eps))
        s = b2 * s + (1 - b2) * (g - mu) ** 2 + eps_root
        mu = b1 * mu + (1 - b1) * g
    assert_updates(updates_of(functrain.contrib.scale_by_acprop(), grads, params=None),
                   expected)


def test_madgrad_dual_averaging_formula():
    lr, momentum, eps = 0.1, 0.9, 1e-6
    x0 = np.array([0.5, -1.5, 2.0, 0.0])
    grads = [np.array([0.1, -2.0, 0.3, 1.0]), np.array([-0.4, 0.5, 0.0, 2.0])]
    tx = functrain.contrib.madgrad(lr, momentum=momentum, eps=eps)
    p = jnp.asarray(x0, jnp.float32)
    state, x, big_g, s = tx.init(p), x0.copy(), np.zeros(4), np.zeros(4)
    for k, g in enumerate(grads):
        u, state = tx.update(jnp.asarray(g, jnp.float32), state, p)
        p = functrain.apply_updates(p, u)
        lam = (lr + eps) * np.sqrt(k + 1)
        big_g, s = big_g + lam * g ** 2, s + lam * g
        x = (1 - momentum) * (x0 - s / (np.cbrt(big_g) + eps)) + momentum * x
        np.testing.assert_allclose(np.asarray(p), x, rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------------
# State from shapes alone, errors
# --------------------------------------------------------------------------

def test_madgrad_state_from_shapes_alone_keeps_x0():
    params = make_params()
    tx = functrain.contrib.madgrad(0.1)
    abstract = jax.tree_util.tree_map(lambda p: jax.ShapeDtypeStruct(p.shape, p.dtype), params)
    shapes = jax.eval_shape(tx.init, abstract)
    assert jax.tree_util.tree_map(lambda x: x.shape, shapes[1].x0) == \
        jax.tree_util.tree_map(lambda x: x.shape, params)
    real = tx.init(params)
    for a, b in zip(jax.tree_util.tree_leaves(real[1].x0), jax.tree_util.tree_leaves(params)):
        np.testing.assert_array_equal(a, b)
        assert a is not b


@pytest.mark.parametrize("build, message", [
    (lambda: functrain.contrib.adopt(0.1, b1=1.5), "scale_by_adopt: b1 must be in"),
    (lambda: functrain.contrib.adopt(0.1, clip_value_fn=2.0), "clip_value_fn must be a function"),
    (lambda: functrain.contrib.madgrad(0.1, momentum=1.0), "scale_by_madgrad: momentum must be"),
    (lambda: functrain.contrib.acprop(float("nan")), "acprop: learning_rate must be finite"),
])
def test_bad_hyperparameters_are_named(build, message):
    with pytest.raises((ValueError, TypeError), match=message):
        build()


def test_madgrad_needs_params_and_shapes_are_checked():
    params = {"w": jnp.ones((2, 2))}
    tx = functrain.contrib.madgrad(0.1)
    with pytest.raises(ValueError, match="needs the current parameters"):
        tx.update(params, tx.init(params))
    tx = functrain.contrib.scale_by_acprop()
    with pytest.raises(ValueError, match=r"\['w'\]"):
        tx.update({"w": jnp.ones((3,))}, tx.init(params))
