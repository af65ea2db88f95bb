"""functrain.wrappers.control: apply_every, conditionally_transform/mask, flatten.

Every step against optax 0.2.8 on the same inputs (30 jitted steps, the states
too), plus hand-checked edge cases and the errors.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import functrain as ft
from helpers import (assert_empty_params_step, assert_same_trajectory, assert_state_donatable,
                     loss_value, make_params, trajectory)

STEPS = 30


def assert_same_states(ours, theirs, steps=7, params=None, with_value=False):
    """The states after ``steps`` eager steps have the same leaves (and the same type names)."""
    params = make_params() if params is None else params
    rng = np.random.default_rng(3)
    s1, s2 = ours.init(params), theirs.init(params)
    for _ in range(steps):
        g = jax.tree_util.tree_map(lambda p: jnp.asarray(rng.standard_normal(p.shape),
                                                         p.dtype), params)
        extra = {"value": jnp.asarray(rng.uniform())} if with_value else {}
        _, s1 = ours.update(g, s1, params, **extra)
        _, s2 = theirs.update(g, s2, params, **extra)
    assert type(s1).__name__ == type(s2).__name__
    a, b = jax.tree_util.tree_leaves(s1), jax.tree_util.tree_leaves(s2)
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.dtype == y.dtype
        np.testing.assert_allclose(x, y, rtol=2e-5, atol=1e-6)


APPLY_EVERY = {
    "k1_then_sgd": lambda m: m.chain(m.apply_every(1), m.sgd(0.1, momentum=0.9)),
    "adam_then_k3": lambda m: m.chain(m.adam(0.05), m.apply_every(k=3)),
    "k4_then_sgd": lambda m: m.chain(m.apply_every(4), m.sgd(0.01)),
}


@pytest.mark.parametrize("case", sorted(APPLY_EVERY))
def test_apply_every_matches_optax(case):
    make = APPLY_EVERY[case]
    assert_same_trajectory(make(ft), make(optax), steps=STEPS, name=case)
    assert_same_states(make(ft), make(optax))


def test_apply_every_by_hand():
    tx = ft.apply_every(3)
    state = tx.init(jnp.zeros(2))
    outs = []
    for g in ([1.0, 2.0], [3.0, 0.0], [0.5, 0.5], [1.0, 1.0]):
        u, state = tx.update(jnp.asarray(g), state)
        outs.append(np.asarray(u))
    np.testing.assert_allclose(outs, [[0, 0], [0, 0], [4.5, 2.5], [0, 0]])
    assert int(state.count) == 1
    np.testing.assert_allclose(state.grad_acc, [1.0, 1.0])


def every_third(step):
    return step % 3 == 0


def after_five(step):
    return step >= 5


def loss_above(step, value):
    return value > 14.0  # the loss of make_params() is 15.4


CONDITIONAL = {
    "transform_adam_every_third": lambda m: m.conditionally_transform(m.adam(0.05),
                                                                      every_third),
    "transform_sgd_after_five": lambda m: m.chain(
        m.conditionally_transform(m.scale(0.5), after_five), m.sgd(0.01, momentum=0.9)),
    "mask_sgd_after_five": lambda m: m.conditionally_mask(m.sgd(0.01, momentum=0.9),
                                                          after_five),
    "mask_adam_every_third": lambda m: m.conditionally_mask(m.adam(0.05), every_third),
}


@pytest.mark.parametrize("case", sorted(CONDITIONAL))
def test_conditionally_matches_optax(case):
    make = CONDITIONAL[case]
    assert_same_trajectory(make(ft), make(optax), steps=STEPS, name=case)
    assert_same_states(make(ft), make(optax))


@pytest.mark.parametrize("wrapper", ["conditionally_transform", "conditionally_mask"])
def test_conditionally_forwards_extra_args_like_optax(wrapper):
    make = lambda m: getattr(m, wrapper)(m.adam(0.05), loss_above,  # noqa: E731
                                         forward_extra_args=True)
    ours, theirs = make(ft), make(optax)
    # A loss function of the params: the condition flips as the params move.
    grads = lambda p: jax.tree_util.tree_map(lambda x: x, p)  # noqa: E731
    a = trajectory(ours, ft.apply_updates, make_params(), grads, STEPS, with_value=True)
    b = trajectory(theirs, optax.apply_updates, make_params(), grads, STEPS, with_value=True)
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
        np.testing.assert_allclose(x, y, rtol=2e-5, atol=1e-6)
    # The condition held at some steps only (the loss before each step).
    before = [make_params()] + [jax.tree_util.tree_map(lambda x, t=t: x[t], a)
                                for t in range(STEPS - 1)]
    met = [loss_above(0, float(loss_value(p))) for p in before]
    assert any(met) and not all(met), met


def test_conditionally_transform_skipped_steps_pass_updates_and_keep_state():
    tx = ft.conditionally_transform(ft.sgd(1.0, momentum=0.5), after_five)
    state = tx.init(jnp.zeros(1))
    u, state = tx.update(jnp.array([3.0]), state)
    np.testing.assert_array_equal(u, [3.0])  # passed through, not negated
    np.testing.assert_array_equal(state.inner_state[0].trace, [0.0])
    assert int(state.step) == 1


def test_conditionally_mask_under_jit_traces_once():
    tx = ft.conditionally_mask(ft.adam(0.1), every_third)
    params = {"w": jnp.ones(3, jnp.bfloat16)}
    traces = []

    @jax.jit
    def step(s, g):
        traces.append(1)
        return tx.update(g, s, params)

    state = tx.init(params)
    for t in range(4):
        u, state = step(state, {"w": jnp.ones(3, jnp.bfloat16)})
        assert u["w"].dtype == jnp.bfloat16
        assert bool(jnp.all(u["w"] == 0)) == (t % 3 != 0)
    assert len(traces) == 1


FLATTEN = {
    "adam": lambda m: m.flatten(m.adam(0.05)),
    "clip_then_sgd": lambda m: m.flatten(m.chain(m.clip_by_global_norm(1.0),
                                                 m.sgd(0.1, momentum=0.9))),
    "block_rms": lambda m: m.chain(m.flatten(m.clip_by_block_rms(0.5)), m.sgd(0.1)),
}


@pytest.mark.parametrize("case", sorted(FLATTEN))
def test_flatten_matches_optax(case):
    make = FLATTEN[case]
    assert_same_trajectory(make(ft), make(optax), steps=STEPS, name=case)
    assert_same_states(make(ft), make(optax))


def test_flatten_keeps_each_leaf_dtype():
    # optax returns the promoted dtype for a bfloat16 leaf in a float32 tree; the
    # values are the same.
    params = {"a": jnp.ones(3, jnp.bfloat16), "b": jnp.full((2, 2), 0.5, jnp.float32)}
    grads = {"a": jnp.asarray([1.0, -2.0, 0.5], jnp.bfloat16),
             "b": jnp.asarray([[0.1, 0.2], [0.3, 0.4]], jnp.float32)}
    ours, theirs = ft.flatten(ft.adam(0.1)), optax.flatten(optax.adam(0.1))
    u, _ = ours.update(grads, ours.init(params), params)
    v, _ = theirs.update(grads, theirs.init(params), params)
    assert u["a"].dtype == jnp.bfloat16 and u["b"].dtype == jnp.float32
    assert v["a"].dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(u["a"], np.float32), np.asarray(v["a"]), rtol=1e-2)
    np.testing.assert_allclose(u["b"], v["b"], rtol=1e-6)


def test_flatten_complex_and_real_leaves_like_optax():
    params = {"c": jnp.asarray([1 + 1j, -0.5j], jnp.complex64), "r": jnp.ones(2)}
    grads = {"c": jnp.asarray([0.3 - 1j, 2.0], jnp.complex64), "r": jnp.asarray([1.0, -1.0])}
    ours, theirs = ft.flatten(ft.adam(0.1)), optax.flatten(optax.adam(0.1))
    s1, s2 = ours.init(params), theirs.init(params)
    for _ in range(3):
        u, s1 = ours.update(grads, s1, params)
        v, s2 = theirs.update(grads, s2, params)
        np.testing.assert_allclose(u["c"], v["c"], rtol=2e-5, atol=1e-6)
        np.testing.assert_allclose(u["r"], np.real(v["r"]), rtol=2e-5, atol=1e-6)
    assert u["r"].dtype == jnp.float32


def test_errors_name_the_argument():
    with pytest.raises(ValueError, match="apply_every: k must be >= 1"):
        ft.apply_every(0)
    with pytest.raises(TypeError, match="apply_every: k must be a real number"):
        ft.apply_every("2")
    with pytest.raises(TypeError, match="conditionally_mask: inner is a int"):
        ft.conditionally_mask(3, every_third)
    with pytest.raises(TypeError, match="conditionally_transform: should_transform_fn"):
        ft.conditionally_transform(ft.sgd(0.1), 0.5)
    tx = ft.conditionally_transform(ft.sgd(0.1), lambda step: jnp.ones(2, bool))
    with pytest.raises(ValueError, match="should_transform_fn must return a scalar bool"):
        tx.update(jnp.ones(1), tx.init(jnp.ones(1)))
    with pytest.raises(TypeError, match="flatten: inner is a str"):
        ft.flatten("adam")
    tx = ft.apply_every(2)
    with pytest.raises(ValueError, match="different tree structures"):
        tx.update({"x": jnp.ones(1)}, tx.init({"w": jnp.ones(1)}))


MAKERS = {
    "apply_every": lambda: ft.chain(ft.adam(0.1), ft.apply_every(2)),
    "conditionally_transform": lambda: ft.conditionally_transform(ft.adam(0.1), every_third),
    "conditionally_mask": lambda: ft.conditionally_mask(ft.adam(0.1), every_third),
    "flatten": lambda: ft.flatten(ft.adam(0.1)),
}


@pytest.mark.parametrize("name", sorted(MAKERS))
def test_empty_params_and_donatable_state(name):
    assert_empty_params_step(MAKERS[name]())
    assert_state_donatable(MAKERS[name]())
