"""functrain.contrib.schedule_free*: against optax.contrib step by step, the paper's
recursions in numpy, evaluation params, state from shapes alone, and named errors."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import optax.contrib  # noqa: F401
import pytest

import functrain as ft
from functrain.contrib import schedule_free as sf
from helpers import assert_same_trajectory, loss_value, make_grads, make_params, trajectory

STEPS = 30


def _schedule(c):
    return 0.1 * jnp.minimum(1.0, (c + 1) / 10)


SETTINGS = {
    "adamw warmup, decay, b1, power": lambda lib: lib.contrib.schedule_free_adamw(
        0.05, warmup_steps=10, b1=0.95, b2=0.99, weight_decay=0.01, weight_lr_power=1.0),
    "sgd decay": lambda lib: lib.contrib.schedule_free_sgd(0.01, b1=0.8, weight_decay=1e-3),
    "wrapper of adam, schedule": lambda lib: lib.contrib.schedule_free(
        lib.adam(_schedule, b1=0.0), learning_rate=_schedule, b1=0.9),
    "state_dtype bfloat16": lambda lib: lib.contrib.schedule_free_sgd(
        0.01, warmup_steps=3, state_dtype=jnp.bfloat16),
}


@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_matches_optax_and_eval_params_too(name):
    make = SETTINGS[name]
    params = make_params()
    grads = make_grads(params, STEPS)
    # bfloat16 z: optax rounds (1 - b1) z to bfloat16 before using it; functrain computes
    # 16-bit state in float32 (the engine's rule), so only the stored z agrees exactly.
    tol = dict(rtol=1e-2, atol=3e-3) if "bfloat16" in name else dict(rtol=2e-5, atol=1e-6)
    assert_same_trajectory(make(ft), make(optax), params=params, grads=grads, name=name, **tol)
    # the evaluation params after the last step, from each library's state
    evals, zs = [], []
    for lib in (ft, optax):
        opt = make(lib)
        state, p = opt.init(params), params
        step = jax.jit(opt.update)
        for t in range(STEPS):
            u, state = step(jax.tree_util.tree_map(lambda g: g[t], grads), state, p)
            p = lib.apply_updates(p, u)
        evals.append(lib.contrib.schedule_free_eval_params(state, p))
        zs.append(jax.tree_util.tree_leaves(state.z))
    want = jnp.bfloat16 if "bfloat16" in name else jnp.float32
    for a, b in zip(*zs):
        assert a.dtype == b.dtype == want
        np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32),
                                   err_msg=name, **tol)
    for a, b in zip(jax.tree_util.tree_leaves(evals[0]), jax.tree_util.tree_leaves(evals[1])):
        np.testing.assert_allclose(a, b, err_msg=name, **tol)


def test_extra_args_reach_the_base_optimizer():
    """schedule_free(polyak_sgd) passes ``value=`` on to the base optimizer, as optax."""
    make = lambda lib: lib.contrib.schedule_free(  # noqa: E731
        lib.polyak_sgd(max_learning_rate=0.1), learning_rate=0.1)
    assert_same_trajectory(make(ft), make(optax), steps=20, with_value=True, name="polyak")


def test_complex_params_match_optax():
    rng = np.random.default_rng(3)
    params = {"w": jnp.asarray(rng.standard_normal((3, 2)) + 1j * rng.standard_normal((3, 2)),
                               jnp.complex64),
              "b": jnp.zeros(2, jnp.complex64)}
    grads = lambda p: jax.grad(  # noqa: E731
        lambda q: sum(jnp.sum(jnp.abs(x - 1 + 2j) ** 2) for x in jax.tree_util.tree_leaves(q))
    )(p)
    grads_conj = lambda p: jax.tree_util.tree_map(jnp.conj, grads(p))  # noqa: E731
    for make in (lambda lib: lib.contrib.schedule_free_adamw(0.05, weight_decay=0.01),
                 lambda lib: lib.contrib.schedule_free_sgd(0.05)):
        assert_same_trajectory(make(ft), make(optax), params=params, grads=grads_conj,
                               steps=20, name="complex")


def _paper_sgd(y0, grads, lr, b1, power, warmup=None):
    """The paper's Schedule-Free SGD (Defazio et al., 2024, Algorithm 1), in float64."""
    z, x, y, wsum, max_lr, out = y0.copy(), y0.copy(), y0.copy(), 0.0, 0.0, []
    for t, g in enumerate(grads, start=1):
        lr_t = lr if warmup is None else lr * min(1.0, t / warmup)
        lr_sched = lr if warmup is None else lr * min(1.0, (t - 1) / warmup)
        max_lr = max(max_lr, lr_t)
        w = max_lr ** power
        wsum += w
        c = w / wsum if wsum > 0 else 0.0
        z = z - lr_sched * g(y)
        x = (1 - c) * x + c * z
        y = b1 * x + (1 - b1) * z
        out.append((y, x))
    return out


@pytest.mark.parametrize("warmup", [None, 3])
def test_sgd_follows_the_paper_recursion(warmup):
    """y, z, x of Algorithm 1 (lr schedule at t for the weights, at t - 1 for the step)."""
    target = np.array([1.0, -2.0, 0.5])
    grad = lambda y: 2 * (y - target)  # noqa: E731
    y0 = np.array([0.3, 0.0, -1.0])
    ref = _paper_sgd(y0, [grad] * 6, 0.2, 0.9, 2.0, warmup)
    opt = ft.contrib.schedule_free_sgd(0.2, warmup_steps=warmup)
    y = jnp.asarray(y0, jnp.float32)
    state = opt.init(y)
    for want_y, want_x in ref:
        u, state = opt.update(jnp.asarray(grad(np.asarray(y))), state, y)
        y = ft.apply_updates(y, u)
        np.testing.assert_allclose(y, want_y, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(ft.contrib.schedule_free_eval_params(state, y), want_x,
                                   rtol=1e-5, atol=1e-6)


def test_state_layout_copies_and_shapes_alone():
    params = make_params()
    opt = ft.contrib.schedule_free_adamw(1e-2)
    state = opt.init(params)
    ref = optax.contrib.schedule_free_adamw(1e-2).init(params)
    assert isinstance(state, ft.contrib.ScheduleFreeState)
    assert state._fields == ref._fields
    assert [type(x).__name__ for x in state.base_optimizer_state] == [
        type(x).__name__ for x in ref.base_optimizer_state]
    for a, b in zip(jax.tree_util.tree_leaves(state), jax.tree_util.tree_leaves(ref)):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(a, b)
    # z is a copy, not the params' own buffers (so both can be donated)
    ids = {id(x) for x in jax.tree_util.tree_leaves(params)}
    assert not ids & {id(x) for x in jax.tree_util.tree_leaves(state.z)}
    abstract = jax.tree_util.tree_map(lambda p: jax.ShapeDtypeStruct(p.shape, p.dtype), params)
    shapes = jax.eval_shape(opt.init, abstract)
    assert (jax.tree_util.tree_map(lambda x: (x.shape, x.dtype), shapes)
            == jax.tree_util.tree_map(lambda x: (x.shape, x.dtype), state))


def test_inject_hyperparams_of_the_wrapper_changes_no_number():
    params = make_params()
    grads = make_grads(params, 8)
    plain = ft.contrib.schedule_free(ft.sgd(0.05), learning_rate=0.05, b1=0.8)
    injected = ft.inject_hyperparams(ft.contrib.schedule_free)(
        ft.sgd(0.05), learning_rate=0.05, b1=0.8)
    a = trajectory(plain, ft.apply_updates, params, grads)
    b = trajectory(injected, ft.apply_updates, params, grads)
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
        np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-7)


def test_bad_input_errors_name_the_argument_or_leaf():
    with pytest.raises(ValueError, match="schedule_free: b1 must be > 0"):
        ft.contrib.schedule_free_sgd(b1=0.0)
    with pytest.raises(ValueError, match="b1 must be in"):
        ft.contrib.schedule_free_adamw(b1=1.5)
    with pytest.raises(ValueError, match="warmup_steps must be >= 1"):
        ft.contrib.schedule_free_adamw(warmup_steps=0)
    with pytest.raises(ValueError, match="b2 must be in"):
        ft.contrib.schedule_free_adamw(b2=1.0)
    with pytest.raises(ValueError, match="learning_rate must be finite"):
        ft.contrib.schedule_free_sgd(float("nan"))
    with pytest.raises(TypeError, match="schedule_free: base_optimizer is a int"):
        ft.contrib.schedule_free(3, learning_rate=0.1)
    opt = ft.contrib.schedule_free_sgd(0.1)
    params = {"w": jnp.ones(3), "b": jnp.ones(2)}
    state = opt.init(params)
    with pytest.raises(ValueError, match="needs the current parameters"):
        opt.update(params, state)
    with pytest.raises(ValueError, match=r"\['b'\]"):
        opt.update({"w": jnp.ones(3), "b": jnp.ones(4)}, state,
                   {"w": jnp.ones(3), "b": jnp.ones(4)})
    with pytest.raises(TypeError, match="ScheduleFreeState"):
        opt.update(params, (), params)
    with pytest.raises(ValueError, match="needs a ScheduleFreeState"):
        ft.contrib.schedule_free_eval_params((), params)
    # Integer params: z and the scalars (b1 = 0.9, not optax's int32 0) in float32.
    int_state = opt.init({"n": jnp.asarray([1, 2], jnp.int32)})
    float_state = opt.init({"n": jnp.asarray([1.0, 2.0], jnp.float32)})
    for a, b in zip(jax.tree_util.tree_leaves(int_state), jax.tree_util.tree_leaves(float_state)):
        assert a.dtype == b.dtype and np.array_equal(a, b)
    assert loss_value(params) > 0  # (helpers import kept honest)
