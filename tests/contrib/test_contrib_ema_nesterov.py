"""functrain.contrib.ema_nesterov and ema_nesterov_eval_params (no optax counterpart).

Compared with: modded-nanogpt record #46's EMA_Nesterov wrapper written out in numpy float64 as
its training loop runs it (in place on the weights: the look-ahead ``p += s L`` before the
forward pass, the gradient there, the inner step from there, then ``look = p - prev``, ``L <-
e L + (1 - e) look``, ``prev <- p``), with plain SGD and with Adam as the inner optimizer and
the record's schedule shape (look-ahead on from a prefill step to a rest step); functrain's
params are the look-ahead points, its eval params the weights.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import functrain
from functrain.contrib import EmaNesterovState, ema_nesterov, ema_nesterov_eval_params
from functrain.jax_compat import enable_x64

A = np.array([[3.0, 0.5], [0.5, 1.0]])


def grad(w):
    return A @ w - np.array([1.0, -2.0])


def np_sgd(lr):
    return (lambda w: None), (lambda g, state, w: (-lr * g, state))


def np_adam(lr, b1=0.9, b2=0.999, eps=1e-8):
    def init(w):
        return (0, np.zeros_like(w), np.zeros_like(w))

    def step(g, state, w):
        t, m, v = state
        t, m, v = t + 1, b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g * g
        return -lr * (m / (1 - b1 ** t)) / (np.sqrt(v / (1 - b2 ** t)) + eps), (t, m, v)
    return init, step


def record_run(inner, w0, steps, stepsize, ema):
    """The record's loop: nesterov_step, forward/backward, step (inner, then accum)."""
    init, step = inner
    p, prev, look, state = w0.copy(), w0.copy(), np.zeros_like(w0), init(w0)
    held, weights = [], []
    for it in range(steps):
        p = p + stepsize(it) * look        # nesterov_step (s = 0 outside the window)
        held.append(p.copy())              # where the gradient is taken
        d, state = step(grad(p), state, p)
        p = p + d                          # the inner optimizer's step from there
        look = ema * look + (1 - ema) * (p - prev)
        prev = p.copy()
        weights.append(p.copy())
    return held, weights


@pytest.mark.parametrize("inner", ["sgd", "adam"])
def test_matches_the_records_wrapper(inner):
    prefill, rest, steps = 3, 14, 20
    sched = lambda t: jnp.where((t >= prefill) & (t < rest),
                                0.3 * (1 - jnp.asarray(t, jnp.float64) / 40), 0.0)
    np_sched = lambda t: 0.3 * (1 - t / 40) if prefill <= t < rest else 0.0
    with enable_x64(True):
        w0 = np.array([0.5, -0.5])
        held, weights = record_run(np_sgd(0.1) if inner == "sgd" else np_adam(0.05), w0, steps,
                                   np_sched, 0.9)
        base = functrain.sgd(0.1) if inner == "sgd" else functrain.adam(0.05)
        opt = ema_nesterov(base, sched, lookahead_ema=0.9)
        y, state = jnp.asarray(w0), opt.init(jnp.asarray(w0))
        step = jax.jit(opt.update)
        for t in range(steps):
            np.testing.assert_allclose(np.asarray(y), held[t], rtol=1e-12, atol=1e-14,
                                       err_msg=f"look-ahead point, step {t}")
            u, state = step(jnp.asarray(grad(np.asarray(y))), state, y)
            y = functrain.apply_updates(y, u)
            np.testing.assert_allclose(np.asarray(ema_nesterov_eval_params(state, y)),
                                       weights[t], rtol=1e-12, atol=1e-14,
                                       err_msg=f"weights, step {t}")
        assert isinstance(state, EmaNesterovState) and int(state.count) == steps
        # the look-ahead moved the points off the weights inside the window
        assert not np.allclose(held[prefill + 2], weights[prefill + 1])


def test_a_zero_stepsize_is_the_inner_optimizer_and_errors_are_named():
    params = {"w": jnp.array([1.0, -1.0], jnp.bfloat16)}
    grads = {"w": jnp.array([0.5, 0.25], jnp.bfloat16)}
    opt, base = ema_nesterov(functrain.adam(1e-2), 0.0), functrain.adam(1e-2)
    u, state = opt.update(grads, opt.init(params), params)
    v, _ = base.update(grads, base.init(params), params)
    np.testing.assert_array_equal(u["w"], v["w"])
    assert u["w"].dtype == jnp.bfloat16 and state.lookahead["w"].dtype == jnp.float32
    with pytest.raises(ValueError, match="params"):
        opt.update(grads, state)
    with pytest.raises(ValueError, match="ema_nesterov: lookahead_ema"):
        ema_nesterov(functrain.sgd(0.1), 0.3, lookahead_ema=1.0)
    with pytest.raises(ValueError, match="needs an EmaNesterovState"):
        ema_nesterov_eval_params(base.init(params), params)
