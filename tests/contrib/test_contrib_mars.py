"""functrain.contrib.mars / scale_by_mars (no optax counterpart).

Compared with: a float64 numpy transcription of MARS-AdamW (the paper's Algorithm 1,
approximate gradient difference, written in the form of the authors' reference:
denominator ``(sqrt(v) / sqrt(1 - b2^t) + eps) (1 - b1^t)``) over 20 steps; functrain's
``adamw`` (``gamma = 0`` and an inactive clip: the same numbers exactly); a convergence
bar on an ill-conditioned least-squares problem; and the common contrib checks.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import functrain
from functrain.contrib import MarsState, mars, scale_by_mars
from functrain.jax_compat import enable_x64
from helpers import run_jitted, trajectory

STEPS = 20


def _tree(dtype=np.float64):
    rng = np.random.default_rng(0)
    return {"w": rng.standard_normal((4, 3)).astype(dtype),
            "v": rng.standard_normal(5).astype(dtype), "s": np.asarray(0.7, dtype)}


def _grads(scale, seed=1, steps=STEPS):
    """``steps`` gradients per leaf; entries ~ N(0, 1) * scale (per-leaf norms ~ 2-3 scale)."""
    rng = np.random.default_rng(seed)
    return [{k: rng.standard_normal(np.shape(v)) * scale for k, v in _tree().items()}
            for _ in range(steps)]


def ref_mars(params, grads, lr, b1=0.95, b2=0.99, eps=1e-8, gamma=0.025, wd=0.0,
             max_norm=1.0):
    """MARS-AdamW in numpy float64; returns the params after each step and how many clips."""
    p = {k: np.array(v, np.float64) for k, v in params.items()}
    m = {k: np.zeros_like(v) for k, v in p.items()}
    v2 = {k: np.zeros_like(v) for k, v in p.items()}
    last = {k: np.zeros_like(v) for k, v in p.items()}
    out, clips = [], 0
    for t, g in enumerate(grads, start=1):
        for k in p:
            c = g[k] + gamma * (b1 / (1.0 - b1)) * (g[k] - last[k])
            n = np.sqrt(np.sum(c * c))
            if max_norm is not None and n > max_norm:
                c = c / n * max_norm
                clips += 1
            m[k] = b1 * m[k] + (1 - b1) * c
            v2[k] = b2 * v2[k] + (1 - b2) * c * c
            denom = (np.sqrt(v2[k]) / np.sqrt(1 - b2 ** t) + eps) * (1 - b1 ** t)
            p[k] = p[k] - lr * (wd * p[k] + m[k] / denom)
            last[k] = g[k]
        out.append({k: v.copy() for k, v in p.items()})
    return out, clips


@pytest.mark.parametrize("kwargs, scale, clipping", [
    (dict(lr=1e-2), 1.0, True),  # defaults: every leaf's ||c|| > 1 at times
    (dict(lr=3e-2, b1=0.9, b2=0.95, gamma=0.1, wd=0.05), 0.2, True),
    (dict(lr=1e-2, gamma=0.05, max_norm=None), 3.0, False),
    (dict(lr=1e-2, gamma=0.02, wd=0.1), 0.03, False),  # small gradients: the clip never acts
])
def test_matches_numpy_pseudo_code_float64(kwargs, scale, clipping):
    grads = _grads(scale)
    want, clips = ref_mars(_tree(), grads, **kwargs)
    assert (clips > 0) == clipping, clips
    names = dict(learning_rate=kwargs["lr"], weight_decay=kwargs.get("wd", 0.0))
    names.update({k: v for k, v in kwargs.items() if k not in ("lr", "wd")})
    with enable_x64(True):
        params = jax.tree_util.tree_map(jnp.asarray, _tree())
        got, state = run_jitted(mars(**names), params, [jax.tree_util.tree_map(jnp.asarray, g)
                                                  for g in grads])
        for t, (a, b) in enumerate(zip(got, want)):
            for k in b:
                assert a[k].dtype == jnp.float64
                np.testing.assert_allclose(np.asarray(a[k]), b[k], rtol=1e-6, atol=1e-12,
                                           err_msg=f"step {t} leaf {k}")
        assert isinstance(state[0], MarsState) and int(state[0].count) == STEPS
        for k in grads[-1]:  # the state holds the last gradient
            np.testing.assert_array_equal(np.asarray(state[0].prev_grad[k]), grads[-1][k])
    assert not jax.config.jax_enable_x64
    assert np.abs(want[-1]["w"] - _tree()["w"]).max() > 1e-2  # the params moved


def test_gamma_zero_without_clipping_is_adamw_exactly():
    params = jax.tree_util.tree_map(lambda x: jnp.asarray(x, jnp.float32), _tree())
    grads = jax.tree_util.tree_map(lambda *xs: jnp.asarray(np.stack(xs), jnp.float32),
                                   *_grads(0.05, steps=30))
    assert max(float(jnp.linalg.norm(g[t])) for g in jax.tree_util.tree_leaves(grads)
               for t in range(30)) < 1.0  # ||c|| = ||g|| <= 1: the clip is inactive
    for kw in (dict(weight_decay=0.0), dict(weight_decay=0.1, mask={"w": True, "v": False,
                                                                      "s": False})):
        ours = trajectory(mars(1e-2, gamma=0.0, **kw), functrain.apply_updates, params, grads)
        theirs = trajectory(functrain.adamw(1e-2, b1=0.95, b2=0.99, eps=1e-8, **kw),
                            functrain.apply_updates, params, grads)
        for a, b in zip(jax.tree_util.tree_leaves(ours), jax.tree_util.tree_leaves(theirs)):
            np.testing.assert_array_equal(a, b)
        assert float(jnp.abs(ours["w"][-1] - params["w"]).max()) > 0.1


def test_first_step_by_hand():
    # g_0 = 0, so c_1 = (1 + gamma b1 / (1 - b1)) g; with ||c|| > 1 it is normalised,
    # and Adam's first step is c / (|c| + eps): the sign, per entry.
    tx = scale_by_mars(gamma=0.025)
    g = jnp.array([3.0, -4.0])
    u, state = tx.update(g, tx.init(jnp.zeros(2)))
    np.testing.assert_allclose(u, [1.0, -1.0], rtol=1e-6)
    c = 1.475 * np.array([3.0, -4.0]) / (1.475 * 5.0)
    np.testing.assert_allclose(state.mu, 0.05 * c, rtol=1e-6)
    np.testing.assert_allclose(state.nu, 0.01 * c * c, rtol=1e-6)
    np.testing.assert_array_equal(state.prev_grad, g)


def test_converges_on_ill_conditioned_least_squares():
    # min 0.5 ||A x - b||^2 with cond(A) = 10, so the Hessian's is 100 (A = U diag(s) V^T,
    # V a random rotation: not axis-aligned); the optimum from lstsq. Measured (1000
    # steps, gap to the optimum from 5.5): mars(3e-2) 2e-7 (float32's floor), adam's best
    # of 3e-3..1e-1 (1e-1) 1e-6, adam(3e-2) 2e-2.
    rng = np.random.default_rng(3)
    u, _ = np.linalg.qr(rng.standard_normal((20, 20)))
    v, _ = np.linalg.qr(rng.standard_normal((8, 8)))
    a = (u[:, :8] * np.logspace(0, -1, 8)) @ v.T
    b = rng.standard_normal(20)
    x_star = np.linalg.lstsq(a, b, rcond=None)[0]
    best = 0.5 * np.sum((a @ x_star - b) ** 2)
    a, b = jnp.asarray(a, jnp.float32), jnp.asarray(b, jnp.float32)

    def loss(x):
        return 0.5 * jnp.sum((a @ x["x"] - b) ** 2)

    opt = mars(3e-2)

    @jax.jit
    def run(x):
        def body(carry, _):
            x, s = carry
            u, s = opt.update(jax.grad(loss)(x), s, x)
            return (functrain.apply_updates(x, u), s), None
        (x, _), _ = jax.lax.scan(body, (x, opt.init(x)), None, length=1000)
        return x

    x0 = {"x": jnp.zeros(8)}
    start = float(loss(x0))
    end = float(loss(run(x0)))
    assert end - best < 1e-5 * (start - best), (start, end, best)


def test_state_from_shapes_alone():
    params = jax.tree_util.tree_map(lambda x: jnp.asarray(x, jnp.float32), _tree())
    abstract = jax.tree_util.tree_map(lambda p: jax.ShapeDtypeStruct(p.shape, p.dtype), params)
    opt = mars(1e-2, mu_dtype=jnp.bfloat16)
    shapes, real = jax.eval_shape(opt.init, abstract), opt.init(params)
    assert jax.tree_util.tree_structure(shapes) == jax.tree_util.tree_structure(real)
    assert [(x.shape, x.dtype) for x in jax.tree_util.tree_leaves(shapes)] == [
        (x.shape, x.dtype) for x in jax.tree_util.tree_leaves(real)]
    assert real[0].mu["w"].dtype == jnp.bfloat16


def test_inject_hyperparams_bf16_and_multisteps():
    params = jax.tree_util.tree_map(lambda x: jnp.asarray(x, jnp.float32), _tree())
    grads = [jax.tree_util.tree_map(lambda x: jnp.asarray(x, jnp.float32), g)
             for g in _grads(0.5, steps=6)]
    kw = dict(learning_rate=1e-2, b1=0.9, b2=0.95, gamma=0.05, weight_decay=0.01)
    opt = mars(**kw)
    plain, _ = run_jitted(opt, params, grads)
    injected, state = run_jitted(functrain.inject_hyperparams(mars)(**kw), params, grads)
    for a, b in zip(jax.tree_util.tree_leaves(plain), jax.tree_util.tree_leaves(injected)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
    assert float(state.hyperparams["gamma"]) == pytest.approx(0.05)

    # bfloat16 params: bfloat16 updates and state (computed in float32).
    bf = jax.tree_util.tree_map(lambda x: x.astype(jnp.bfloat16), params)
    update = jax.jit(opt.update)
    u, s = update(jax.tree_util.tree_map(lambda x: jnp.asarray(x, jnp.bfloat16), grads[0]),
                  opt.init(bf), bf)
    assert all(x.dtype == jnp.bfloat16 for x in jax.tree_util.tree_leaves(u))
    assert all(x.dtype == jnp.bfloat16 for x in jax.tree_util.tree_leaves(s[0].prev_grad))
    np.testing.assert_allclose(np.asarray(u["w"], np.float32),
                               np.asarray(update(grads[0], opt.init(params), params)[0]["w"]),
                               rtol=2e-2, atol=1e-4)

    # MultiSteps(k=2): one MARS step per two micro-steps, on the mean gradient.
    multi, _ = run_jitted(functrain.MultiSteps(mars(**kw), every_k_schedule=2), params, grads)
    means = [jax.tree_util.tree_map(lambda a, b: (a + b) / 2, grads[i], grads[i + 1])
             for i in range(0, 6, 2)]
    every_other, _ = run_jitted(opt, params, means)
    for i, want in enumerate(every_other):
        for a, b in zip(jax.tree_util.tree_leaves(multi[2 * i + 1]),
                        jax.tree_util.tree_leaves(want)):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


def test_errors_name_the_argument_or_leaf():
    with pytest.raises(ValueError, match="scale_by_mars: b1 must be in"):
        mars(1e-2, b1=1.0)
    with pytest.raises(ValueError, match="scale_by_mars: gamma must be >= 0"):
        mars(1e-2, gamma=-0.1)
    with pytest.raises(ValueError, match="max_norm must be > 0"):
        mars(1e-2, max_norm=0.0)
    with pytest.raises(ValueError, match="mars: eps must be finite"):
        mars(1e-2, eps=float("nan"))
    opt = mars(1e-2)
    state = opt.init({"w": jnp.ones((2, 2)), "b": jnp.ones(2)})
    with pytest.raises(ValueError, match=r"\['b'\]"):
        opt.update({"w": jnp.ones((2, 2)), "b": jnp.ones(3)}, state,
                   {"w": jnp.ones((2, 2)), "b": jnp.ones(3)})
    with pytest.raises(TypeError, match=r"\['i'\]"):
        opt.init({"i": jnp.ones(2, jnp.bool_)})  # (integer params train, as floats)
