"""functrain.contrib.came / scale_by_came (no optax counterpart).

Compared with: a float64 numpy transcription of CAME (the paper's Algorithm 1 in the
form of the authors' reference code: factored over the last two axes of every leaf of
rank >= 2, the momentum alone for vectors and scalars) over 20 steps; the state's size
measured on a (128, 64) weight (the momentum plus O(m + n)); a convergence bar on an
ill-conditioned least-squares problem; and the common contrib checks.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import functrain
from functrain.contrib import CameState, came, scale_by_came
from functrain.jax_compat import enable_x64
from helpers import run_jitted

STEPS = 20


def _tree(dtype=np.float64):
    rng = np.random.default_rng(0)
    return {"w": rng.standard_normal((6, 4)).astype(dtype),
            "k": rng.standard_normal((2, 3, 4)).astype(dtype),  # a batch of two 3x4 matrices
            "v": rng.standard_normal(5).astype(dtype), "s": np.asarray(0.7, dtype)}


def _grads(scale=1.0, seed=1, steps=STEPS, dtype=np.float64):
    rng = np.random.default_rng(seed)
    return [{k: (rng.standard_normal(np.shape(v)) * scale
                 * 10.0 ** rng.uniform(-1, 1, np.shape(v))).astype(dtype)
             for k, v in _tree().items()} for _ in range(steps)]


def _rank_one_inverse_root(row, col):
    approx = row[..., :, None] * col[..., None, :] / row.mean(axis=-1)[..., None, None]
    return 1.0 / np.sqrt(approx)


def ref_came(params, grads, lr, b1=0.9, b2=0.999, b3=0.9999, eps1=1e-30, eps2=1e-16,
             d=1.0, wd=0.0):
    """CAME in numpy float64; returns the params after each step and how many clips."""
    p = {k: np.array(v, np.float64) for k, v in params.items()}
    st = {k: dict(m=np.zeros_like(v), v=np.zeros_like(v),
                  R=np.zeros(v.shape[:-1]), C=np.zeros(v.shape[:-2] + v.shape[-1:]),
                  Rr=np.zeros(v.shape[:-1]), Cr=np.zeros(v.shape[:-2] + v.shape[-1:]))
          for k, v in p.items()}
    out, clips = [], 0
    for grad in grads:
        for k in p:
            g, s = grad[k], st[k]
            factored = g.ndim >= 2
            sq = g * g + eps1
            if factored:
                s["R"] = b2 * s["R"] + (1 - b2) * sq.mean(axis=-1)
                s["C"] = b2 * s["C"] + (1 - b2) * sq.mean(axis=-2)
                u = g * _rank_one_inverse_root(s["R"], s["C"])
            else:
                s["v"] = b2 * s["v"] + (1 - b2) * sq
                u = g / np.sqrt(s["v"])
            if d is not None:
                rms = np.sqrt(np.mean(u * u))
                clips += rms > d
                u = u / max(1.0, rms / d)
            s["m"] = b1 * s["m"] + (1 - b1) * u
            if factored:
                inst = (u - s["m"]) ** 2 + eps2
                s["Rr"] = b3 * s["Rr"] + (1 - b3) * inst.mean(axis=-1)
                s["Cr"] = b3 * s["Cr"] + (1 - b3) * inst.mean(axis=-2)
                update = s["m"] * _rank_one_inverse_root(s["Rr"], s["Cr"])
            else:
                update = s["m"]
            p[k] = p[k] - lr * wd * p[k] - lr * update
        out.append({k: v.copy() for k, v in p.items()})
    return out, clips


@pytest.mark.parametrize("kwargs", [
    dict(lr=1e-3),
    dict(lr=1e-2, b1=0.8, b2=0.99, b3=0.999, eps1=1e-3, eps2=1e-4, wd=0.1),
    dict(lr=1e-3, d=None),
    dict(lr=3e-3, d=0.5, b3=0.99),
])
def test_matches_numpy_pseudo_code_float64(kwargs):
    grads = _grads()
    want, clips = ref_came(_tree(), grads, **kwargs)
    assert clips > 0 or kwargs.get("d", 1.0) is None
    names = dict(learning_rate=kwargs["lr"], weight_decay=kwargs.get("wd", 0.0),
                 clip_threshold=kwargs.get("d", 1.0))
    names.update({k: v for k, v in kwargs.items() if k not in ("lr", "wd", "d")})
    with enable_x64(True):
        params = jax.tree_util.tree_map(jnp.asarray, _tree())
        got, state = run_jitted(came(**names), params,
                          [jax.tree_util.tree_map(jnp.asarray, g) for g in grads])
        for t, (a, b) in enumerate(zip(got, want)):
            for k in b:
                assert a[k].dtype == jnp.float64
                np.testing.assert_allclose(np.asarray(a[k]), b[k], rtol=1e-6, atol=1e-12,
                                           err_msg=f"step {t} leaf {k}")
        assert isinstance(state[0], CameState) and int(state[0].count) == STEPS
    assert not jax.config.jax_enable_x64
    assert np.abs(want[-1]["w"] - _tree()["w"]).max() > 1e-2  # the params moved


def test_state_is_momentum_plus_row_and_column_statistics():
    # A (128, 64) weight: the momentum (128 * 64) and four vectors of 128 or 64 (two per
    # factored moment) and a (1,) placeholder for the unused full moment; a (64,) bias:
    # the momentum and a full second moment (plus four placeholders).
    params = {"w": jnp.zeros((128, 64)), "b": jnp.zeros(64)}
    state = came().init(params)[0]
    sizes = {f: {k: getattr(state, f)[k].size for k in params} for f in CameState._fields[1:]}
    w_total = sum(s["w"] for s in sizes.values())
    assert sizes["mu"]["w"] == 128 * 64
    assert w_total - 128 * 64 == 2 * (128 + 64) + 1, sizes
    assert (state.v_row["w"].shape, state.v_col["w"].shape) == ((128,), (64,))
    assert (state.r_row["w"].shape, state.r_col["w"].shape) == ((128,), (64,))
    assert sum(s["b"] for s in sizes.values()) == 2 * 64 + 4
    # Stacked matrices (L, m, n): per matrix, (L, m) and (L, n).
    stacked = came().init({"k": jnp.zeros((3, 128, 64))})[0]
    assert stacked.v_row["k"].shape == (3, 128) and stacked.r_col["k"].shape == (3, 64)


def test_converges_on_ill_conditioned_least_squares():
    # min 0.5 ||A x - b||^2, x a (4, 2) weight flattened, cond(A) = 10 (the Hessian's
    # is 100) in a random rotated basis. Measured (1000 steps, gap to the optimum from
    # 5.5): came(1e-2) 1e-6, came(3e-2) float32's floor; adafactor(1e-2) 1.5,
    # adam's best of 3e-3..1e-1 (1e-1) 1e-6.
    rng = np.random.default_rng(3)
    u, _ = np.linalg.qr(rng.standard_normal((20, 20)))
    v, _ = np.linalg.qr(rng.standard_normal((8, 8)))
    a = (u[:, :8] * np.logspace(0, -1, 8)) @ v.T
    b = rng.standard_normal(20)
    best = 0.5 * np.sum((a @ np.linalg.lstsq(a, b, rcond=None)[0] - b) ** 2)
    a, b = jnp.asarray(a, jnp.float32), jnp.asarray(b, jnp.float32)

    def loss(x):
        return 0.5 * jnp.sum((a @ x["x"].ravel() - b) ** 2)

    opt = came(1e-2)

    @jax.jit
    def run(x):
        def body(carry, _):
            x, s = carry
            u, s = opt.update(jax.grad(loss)(x), s, x)
            return (functrain.apply_updates(x, u), s), None
        (x, _), _ = jax.lax.scan(body, (x, opt.init(x)), None, length=1000)
        return x

    x0 = {"x": jnp.zeros((4, 2))}
    start, end = float(loss(x0)), float(loss(run(x0)))
    assert end - best < 1e-5 * (start - best), (start, end, best)


def test_state_from_shapes_alone():
    params = jax.tree_util.tree_map(lambda x: jnp.asarray(x, jnp.float32), _tree())
    abstract = jax.tree_util.tree_map(lambda p: jax.ShapeDtypeStruct(p.shape, p.dtype), params)
    opt = came()
    shapes, real = jax.eval_shape(opt.init, abstract), opt.init(params)
    assert jax.tree_util.tree_structure(shapes) == jax.tree_util.tree_structure(real)
    assert [(x.shape, x.dtype) for x in jax.tree_util.tree_leaves(shapes)] == [
        (x.shape, x.dtype) for x in jax.tree_util.tree_leaves(real)]


def test_inject_hyperparams_bf16_and_multisteps():
    params = jax.tree_util.tree_map(lambda x: jnp.asarray(x, jnp.float32), _tree())
    grads = _grads(steps=6, dtype=np.float32)
    # Values exact in float32 (injected hyperparameters are float32 arrays: with 0.999,
    # 1 - float32(0.999) would be 6e-5 off in relative terms, amplified by 1/sqrt(r)).
    kw = dict(learning_rate=2.0 ** -7, b1=0.75, b2=1 - 2.0 ** -7, b3=1 - 2.0 ** -9,
              clip_threshold=0.5, weight_decay=2.0 ** -7)
    opt = came(**kw)
    plain, _ = run_jitted(opt, params, grads)
    injected, state = run_jitted(functrain.inject_hyperparams(came)(**kw), params, grads)
    for a, b in zip(jax.tree_util.tree_leaves(plain), jax.tree_util.tree_leaves(injected)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
    assert float(state.hyperparams["b3"]) == 1 - 2.0 ** -9

    # bfloat16 params: bfloat16 updates and statistics (computed in float32).
    bf = jax.tree_util.tree_map(lambda x: x.astype(jnp.bfloat16), params)
    g_bf = jax.tree_util.tree_map(lambda x: jnp.asarray(x, jnp.bfloat16), grads[0])
    update = jax.jit(opt.update)
    u, s = update(g_bf, opt.init(bf), bf)
    assert all(x.dtype == jnp.bfloat16 for x in jax.tree_util.tree_leaves((u, s[0].mu,
                                                                            s[0].v_row)))
    u32 = update(jax.tree_util.tree_map(lambda x: x.astype(jnp.float32), g_bf),
                 opt.init(params), params)[0]
    np.testing.assert_allclose(np.asarray(u["w"], np.float32), np.asarray(u32["w"]),
                               rtol=3e-2, atol=1e-4)

    # MultiSteps(k=2): one CAME step per two micro-steps, on the mean gradient.
    multi, _ = run_jitted(functrain.MultiSteps(came(**kw), every_k_schedule=2), params, grads)
    means = [jax.tree_util.tree_map(lambda a, b: (a + b) / 2, grads[i], grads[i + 1])
             for i in range(0, 6, 2)]
    every_other, _ = run_jitted(opt, params, means)
    for i, want in enumerate(every_other):
        for a, b in zip(jax.tree_util.tree_leaves(multi[2 * i + 1]),
                        jax.tree_util.tree_leaves(want)):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


def test_first_step_by_hand():
    # Vector: v = (1 - b2)(g^2 + eps1), u = g / sqrt(v) = +-1/sqrt(1 - b2), rms > 1 so
    # u is clipped to +-1; the update is mu = (1 - b1) u.
    tx = scale_by_came()
    u, state = tx.update(jnp.array([2.0, -3.0]), tx.init(jnp.zeros(2)))
    np.testing.assert_allclose(u, [0.1, -0.1], rtol=1e-5)
    # Matrix with constant |g|: the rank-1 estimate is exact, u = sign(g) (clipped to rms 1),
    # mu = 0.1 u, instability (0.9 u)^2 + eps2 is constant 0.81, so the update is
    # mu / sqrt((1 - b3) 0.81) = 0.1 sign(g) / (0.9 sqrt(1e-4)).
    g = jnp.array([[1.0, -1.0], [-1.0, 1.0]]) * 5.0
    u, _ = tx.update(g, tx.init(jnp.zeros((2, 2))))
    np.testing.assert_allclose(u, np.sign(g) * 0.1 / (0.9 * math.sqrt(1e-4)), rtol=1e-5)


def test_errors_name_the_argument_or_leaf():
    with pytest.raises(ValueError, match="scale_by_came: b3 must be in"):
        came(b3=1.0)
    with pytest.raises(ValueError, match="scale_by_came: eps1 must be >= 0"):
        came(eps1=-1.0)
    with pytest.raises(ValueError, match="clip_threshold must be > 0"):
        came(clip_threshold=0.0)
    with pytest.raises(TypeError, match="came: b1 must be a real number"):
        came(b1="0.9")
    opt = came()
    params = {"w": jnp.ones((3, 2)), "b": jnp.ones(2)}
    state = opt.init(params)
    bad = {"w": jnp.ones((2, 3)), "b": jnp.ones(2)}
    with pytest.raises(ValueError, match=r"\['w'\]"):
        opt.update(bad, state, bad)
    with pytest.raises(TypeError, match=r"\['i'\]"):
        opt.init({"i": jnp.ones((2, 2), jnp.bool_)})  # (integer params train, as floats)


def test_zero_size_leaves_pass_through_and_keep_finite_state():
    """Empty leaves (0-row, 0-column, 0-length) beside a normal one: empty updates, the
    normal leaf's numbers unchanged, and no NaN in the state (a mean over nothing)."""
    params = {"w": jnp.ones((4, 3)), "z": jnp.zeros((0, 3)), "y": jnp.zeros((3, 0)),
              "e": jnp.zeros((0,))}
    opt = came(1e-2)
    u, state = jax.jit(opt.update)(params, opt.init(params), params)
    assert {k: v.shape for k, v in u.items()} == {k: v.shape for k, v in params.items()}
    assert all(np.all(np.isfinite(np.asarray(x))) for x in jax.tree.leaves(state))
    alone = came(1e-2)
    w_only = {"w": params["w"]}
    want = jax.jit(alone.update)(w_only, alone.init(w_only), w_only)[0]["w"]
    np.testing.assert_array_equal(u["w"], want)
