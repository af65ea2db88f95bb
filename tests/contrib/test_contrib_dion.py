"""functrain.contrib.dion / scale_by_dion (no optax counterpart).

Compared with: the paper's Algorithm 1 (Ahn et al., 2025) written out in numpy float64 in
the authors' code's conventions (``dion/dion.py`` of github.com/microsoft/dion): the torch
weight ``X = W^T`` of ``(d_out, d_in)``, its transpose used when ``d_out < d_in``, Cholesky
QR (the code's ``cqr``; equal to their default randomized Cholesky QR up to column signs),
``eps`` in the column normalization, ``X *= 1 - lr wd`` and the ``sqrt(d_out / d_in)``
scale, and AdamW / Lion (the code's ``scalar_opts.py``) for the other leaves: 20 steps on
a square, a wide and a tall matrix, a stacked leaf and a bias. Hand-derived facts: with
``B != 0`` and no weight decay ``||u||_F = lr sqrt(d_out / d_in) sqrt(r)`` (``P``
orthonormal, ``Q``'s columns of norm 1) and ``rank(u) <= r``; at full rank the error
feedback is heavy-ball momentum, ``M = mu (M + G)``; a rank-1 gradient's update is
``G / ||G||_F``. It trains a small least-squares problem. The 8-device and two-process
runs of ``mesh=`` are in ``tests/contrib/test_contrib_dion_devices.py``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import functrain
from functrain.contrib import ScaleByDionState, dion, scale_by_dion
from functrain.jax_compat import enable_x64
from helpers import run_jitted

STEPS = 20
SHAPES = {"square": (6, 6), "wide": (4, 9), "tall": (10, 5), "stack": (3, 7, 4), "b": (5,)}


# --------------------------------------------------------------------------
# The reference: Algorithm 1 in numpy float64, in the authors' code's conventions
# --------------------------------------------------------------------------

def cholesky_qr(p):
    """The orthonormal basis ``p T^{-1}`` with ``T^T T = p^T p`` (Cholesky): the QR ``Q``
    whose ``R`` has a positive diagonal."""
    t = np.linalg.cholesky(p.T @ p).T
    return np.linalg.solve(t.T, p.T).T


def ref_dion_matrix(w, grads, q0, lr, mu, wd, eps):
    """One weight ``w`` (``(d_in, d_out)``, used as ``x @ w``) over the gradients: the
    weights after each step, the final momentum and ``Q``. Written on the torch weight
    ``X = w^T`` as the authors' ``dion_update_ddp``."""
    x = w.T.copy()
    d_out, d_in = x.shape
    transposed = d_out < d_in  # their rule: work on X^T when it is wide
    m, q, out = np.zeros_like(x), q0.copy(), []
    for g in grads:
        m = m + g.T
        b = m.T if transposed else m
        p = cholesky_qr(b @ q)
        r = b.T @ p
        b = b - (1 - mu) * p @ r.T
        m = b.T if transposed else b
        q = r / (np.linalg.norm(r, axis=0, keepdims=True) + eps)
        pq = p @ q.T
        x = (1 - lr * wd) * x - lr * np.sqrt(d_out / d_in) * (pq.T if transposed else pq)
        out.append(x.T.copy())
    return out, m.T, q


def ref_adamw(w, grads, lr, b1, b2, wd, eps):
    """The authors' ``adamw_update``: bias-corrected, ``eps`` outside the root."""
    m, v, out = np.zeros_like(w), np.zeros_like(w), []
    for t, g in enumerate(grads, 1):
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        denom = np.sqrt(v) / np.sqrt(1 - b2 ** t) + eps
        w = w * (1 - lr * wd) - lr / (1 - b1 ** t) * m / denom
        out.append(w.copy())
    return out


def ref_lion(w, grads, lr, b1, b2, wd):
    """The authors' ``lion_update``."""
    m, out = np.zeros_like(w), []
    for g in grads:
        u = np.sign(b1 * m + (1 - b1) * g)
        m = b2 * m + (1 - b2) * g
        w = w * (1 - lr * wd) - lr * u
        out.append(w.copy())
    return out


def problem(dtype, shapes=SHAPES, steps=STEPS, seed=0):
    rng = np.random.default_rng(seed)
    params = {k: rng.standard_normal(s) for k, s in shapes.items()}
    grads = [{k: rng.standard_normal(s) * 10.0 ** rng.uniform(-1, 1) for k, s in shapes.items()}
             for _ in range(steps)]
    cast = lambda t: {k: jnp.asarray(v, dtype) for k, v in t.items()}  # noqa: E731
    return params, grads, cast(params), [cast(g) for g in grads]


def dion_state(state) -> ScaleByDionState:
    return state.inner_states["dion"].inner_state[0]


def reference(params, grads, q0, kw, scalar="adamw"):
    """Per leaf, the weights after each step (a stacked leaf: each of its matrices apart)."""
    lr, mu, wd, eps = kw["learning_rate"], kw["mu"], kw["weight_decay"], kw["eps"]
    out, finals = {}, {}
    for k, w in params.items():
        gs = [g[k] for g in grads]
        if w.ndim == 1:
            b1, b2 = kw.get("scalar_b1", 0.9), kw.get("scalar_b2", 0.95)
            out[k] = (ref_adamw(w, gs, lr, b1, b2, wd, eps) if scalar == "adamw"
                      else ref_lion(w, gs, lr, b1, b2, wd))
            continue
        ws, ms, qs = [], [], []
        for j in np.ndindex(w.shape[:-2]):
            traj, m, q = ref_dion_matrix(w[j], [g[j] for g in gs], np.asarray(q0[k][j]),
                                         lr, mu, wd, eps)
            ws.append(traj)
            ms.append(m)
            qs.append(q)
        out[k] = [np.stack([t[s] for t in ws]).reshape(w.shape) for s in range(len(gs))]
        finals[k] = (np.stack(ms).reshape(w.shape), np.stack(qs).reshape(np.shape(q0[k])))
    return out, finals


KW = dict(learning_rate=2e-2, mu=0.9, weight_decay=0.1, eps=1e-8)


@pytest.mark.parametrize("rank", [0.5, 1.0, 2])
def test_matches_the_papers_algorithm_float64(rank):
    """20 steps: the square (6, 6), wide (4, 9) and tall (10, 5) matrices, a (3, 7, 4) stack
    (``dion_mask``) and a bias (AdamW), every step's weights and the final momentum and
    ``Q`` equal the numpy reference (Q from the state's init: a fixed normal draw)."""
    with enable_x64(True):
        params, grads, jparams, jgrads = problem(jnp.float64)
        opt = dion(rank=rank, dion_mask=lambda p: {k: k != "b" for k in p}, **KW)
        q0 = dion_state(opt.init(jparams)).q
        ours, state = run_jitted(opt, jparams, jgrads)
        want, finals = reference(params, grads, q0, KW)
        for t in range(STEPS):
            for k in params:
                np.testing.assert_allclose(ours[t][k], want[k][t], rtol=1e-9, atol=1e-11,
                                           err_msg=f"{k}, step {t + 1}")
        for k, (m, q) in finals.items():
            np.testing.assert_allclose(dion_state(state).mu[k], m, rtol=1e-9, atol=1e-11)
            np.testing.assert_allclose(dion_state(state).q[k], q, rtol=1e-9, atol=1e-11)


def test_float32_follows_the_float64_reference():
    params, grads, jparams, jgrads = problem(jnp.float32)
    opt = dion(rank=0.5, **KW)
    q0 = {k: np.asarray(v, np.float64) for k, v in dion_state(opt.init(jparams)).q.items()}
    ours, _ = run_jitted(opt, jparams, jgrads)
    shapes = {k: s for k, s in SHAPES.items() if len(s) != 3}  # 3-D: AdamW without a mask
    want, _ = reference({k: params[k] for k in shapes},
                        [{k: g[k] for k in shapes} for g in grads], q0, KW)
    for k in shapes:
        np.testing.assert_allclose(ours[-1][k], want[k][-1], rtol=1e-4, atol=1e-5, err_msg=k)


def test_lion_for_the_other_leaves():
    with enable_x64(True):
        params, grads, jparams, jgrads = problem(jnp.float64, {"w": (5, 3), "b": (4,)})
        kw = dict(KW, scalar_b1=0.8, scalar_b2=0.9)
        opt = dion(scalar_optimizer="lion", scalar_weight_decay=0.05, **kw)
        ours, _ = run_jitted(opt, jparams, jgrads)
        want = ref_lion(params["b"], [g["b"] for g in grads], KW["learning_rate"], 0.8, 0.9,
                        0.05)
        np.testing.assert_allclose(ours[-1]["b"], want[-1], rtol=1e-12)


# --------------------------------------------------------------------------
# Hand-derived facts
# --------------------------------------------------------------------------

@pytest.mark.parametrize("shape,rank,r", [((12, 8), 3, 3), ((5, 16), 0.5, 3),
                                          ((9, 9), 1.0, 9), ((6, 7), 4, 4)])
def test_update_norm_and_rank(shape, rank, r):
    """No weight decay, lr 1, eps 0: ``||u||_F = sqrt(d_out / d_in) sqrt(r)``, ``rank(u) = r``."""
    with enable_x64(True):
        rng = np.random.default_rng(1)
        opt = dion(1.0, rank=rank, weight_decay=0.0, eps=0.0)
        p = {"w": jnp.asarray(rng.standard_normal(shape))}
        state = opt.init(p)
        assert dion_state(state).q["w"].shape == (min(shape), r)
        for _ in range(3):
            u, state = opt.update({"w": jnp.asarray(rng.standard_normal(shape))}, state, p)
            s = np.linalg.svd(np.asarray(u["w"]), compute_uv=False)
            np.testing.assert_allclose(np.sqrt(np.sum(s ** 2)),
                                       np.sqrt(shape[1] / shape[0] * r), rtol=1e-10)
            assert np.sum(s > 1e-9 * s[0]) == r


def test_full_rank_error_feedback_is_heavy_ball_momentum():
    """At full rank ``P P^H B = B``, so ``M <- B - (1 - mu) B = mu (M + G)``."""
    with enable_x64(True):
        rng = np.random.default_rng(2)
        tx = scale_by_dion(rank=1.0, mu=0.7)
        p = {"w": jnp.zeros((7, 4)), "v": jnp.zeros((3, 5))}
        state, m = tx.init(p), {k: np.zeros(np.shape(v)) for k, v in p.items()}
        for _ in range(4):
            g = {k: rng.standard_normal(np.shape(v)) for k, v in p.items()}
            _, state = tx.update(jax.tree.map(jnp.asarray, g), state)
            m = {k: 0.7 * (m[k] + g[k]) for k in m}
            for k in m:
                np.testing.assert_allclose(state.mu[k], m[k], rtol=1e-10, atol=1e-12)


def test_rank_one_gradient_gives_its_polar_factor():
    g = np.outer([1.0, -2.0, 2.0], [3.0, 0.0, 4.0, 0.0, 0.0])
    tx = scale_by_dion(rank=2)
    u, _ = tx.update({"w": jnp.asarray(g, jnp.float32)}, tx.init({"w": jnp.zeros((3, 5))}))
    np.testing.assert_allclose(u["w"], np.sqrt(5 / 3) * g / np.linalg.norm(g), rtol=1e-5,
                               atol=1e-6)


def test_zero_gradient_gives_zero_update_and_keeps_q_direction():
    tx = scale_by_dion(rank=2)
    p = {"w": jnp.zeros((4, 6))}
    state = tx.init(p)
    u, new = tx.update({"w": jnp.zeros((4, 6))}, state)
    assert np.all(np.asarray(u["w"]) == 0) and np.all(np.asarray(new.mu["w"]) == 0)
    q = np.asarray(state.q["w"])
    np.testing.assert_allclose(new.q["w"], q / (np.linalg.norm(q, axis=0) + 1e-8), rtol=1e-6)


def test_trains_least_squares():
    """min ||A W + b - Y||^2 over W (16, 8) and a bias (AdamW), the step size falling
    linearly from 0.1 to 0 over 300 steps: Dion at half rank takes the loss below 1e-3 of
    its start (measured: 2.3e-4), and at full rank lower still (measured: 1.2e-6), as the
    paper's rank ablations (a higher rank gains more per step)."""
    rng = np.random.default_rng(3)
    a = jnp.asarray(rng.standard_normal((64, 16)), jnp.float32)
    y = jnp.asarray(a @ rng.standard_normal((16, 8)) + 0.5, jnp.float32)

    def loss(p):
        return jnp.mean((a @ p["w"] + p["b"] - y) ** 2)

    finals = {}
    for rank in (0.5, 1.0):
        params = {"w": jnp.zeros((16, 8)), "b": jnp.zeros(8)}
        opt = dion(functrain.linear_schedule(0.1, 0.0, 300), rank=rank, weight_decay=0.0)
        state = opt.init(params)

        @jax.jit
        def step(p, s, opt=opt):
            u, s = opt.update(jax.grad(loss)(p), s, p)
            return functrain.apply_updates(p, u), s

        for _ in range(300):
            params, state = step(params, state)
        finals[rank] = float(loss(params))
    start = float(loss({"w": jnp.zeros((16, 8)), "b": jnp.zeros(8)}))
    assert finals[0.5] < 1e-3 * start and finals[1.0] < finals[0.5], (finals, start)


# --------------------------------------------------------------------------
# Layout, dtypes, errors
# --------------------------------------------------------------------------

def test_state_from_shapes_alone_and_deterministic():
    params = {"w": jnp.ones((6, 4)), "v": jnp.ones((2, 8, 3)), "b": jnp.ones(3)}
    opt = dion(1e-2, rank=0.5, dion_mask=lambda p: {k: k != "b" for k in p})
    state = opt.init(params)
    abstract = jax.eval_shape(opt.init, params)
    assert jax.tree.structure(abstract) == jax.tree.structure(state)
    assert jax.tree.map(lambda x: (x.shape, x.dtype), abstract) == jax.tree.map(
        lambda x: (x.shape, x.dtype), state)
    q = dion_state(state).q
    assert q["w"].shape == (4, 2) and q["v"].shape == (2, 3, 2)
    np.testing.assert_array_equal(q["w"], jax.random.normal(jax.random.PRNGKey(0), (4, 2)))
    np.testing.assert_array_equal(q["w"], dion_state(jax.jit(opt.init)(params)).q["w"])
    other = dion_state(dion(1e-2, rank=0.5, seed=1).init({"w": params["w"]})).q["w"]
    assert not np.allclose(other, q["w"])


def test_stack_equals_separate_leaves():
    rng = np.random.default_rng(4)
    stack = rng.standard_normal((3, 5, 4)).astype(np.float32)
    grads = [rng.standard_normal((3, 5, 4)).astype(np.float32) for _ in range(3)]
    tx = scale_by_dion(rank=0.5)
    s1 = tx.init({"s": jnp.asarray(stack)})
    s2 = tx.init({str(i): jnp.asarray(stack[i]) for i in range(3)})
    s2 = s2._replace(q={str(i): s1.q["s"][i] for i in range(3)})  # the same initial Q
    for g in grads:
        u1, s1 = tx.update({"s": jnp.asarray(g)}, s1)
        u2, s2 = tx.update({str(i): jnp.asarray(g[i]) for i in range(3)}, s2)
        for i in range(3):
            np.testing.assert_allclose(u1["s"][i], u2[str(i)], rtol=1e-6, atol=1e-7)


def test_bfloat16_params_keep_bfloat16_updates_and_state():
    params = {"w": jnp.ones((6, 4), jnp.bfloat16), "b": jnp.ones(4, jnp.bfloat16)}
    opt = dion(1e-2, rank=0.5)
    state = opt.init(params)
    assert dion_state(state).q["w"].dtype == jnp.bfloat16
    grads = jax.tree.map(lambda x: jnp.sin(jnp.arange(x.size, dtype=x.dtype).reshape(x.shape)),
                         params)
    u, new = jax.jit(opt.update)(grads, state, params)
    assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(u))
    assert jax.tree.map(lambda x: x.dtype, new) == jax.tree.map(lambda x: x.dtype, state)
    assert all(np.all(np.isfinite(np.asarray(x, np.float32))) for x in jax.tree.leaves(u))


def test_complex_matrix_matches_the_reference_with_conjugate_transposes():
    rng = np.random.default_rng(5)
    w = rng.standard_normal((5, 3)) + 1j * rng.standard_normal((5, 3))
    gs = [rng.standard_normal((5, 3)) + 1j * rng.standard_normal((5, 3)) for _ in range(4)]
    with enable_x64(True):
        tx = scale_by_dion(rank=2, mu=0.8)
        state = tx.init({"w": jnp.asarray(w)})
        q, m = np.asarray(state.q["w"]), np.zeros_like(w)
        for g in gs:
            u, state = tx.update({"w": jnp.asarray(g)}, state)
            m = m + g  # (5, 3): d_out = 3 < d_in = 5, not transposed in our layout
            pc = m @ q
            t = np.linalg.cholesky(pc.conj().T @ pc).conj().T
            p = np.linalg.solve(t.conj().T, pc.conj().T).conj().T
            r = m.conj().T @ p
            m = m - 0.2 * p @ r.conj().T
            q = r / (np.linalg.norm(r, axis=0) + 1e-8)
            np.testing.assert_allclose(u["w"], np.sqrt(3 / 5) * p @ q.conj().T, rtol=1e-9)


def test_zero_size_and_empty_trees():
    tx = dion(1e-2)
    params = {"e": jnp.zeros((2, 0)), "w": jnp.ones((3, 2))}
    state = tx.init(params)
    u, _ = jax.jit(tx.update)({"e": jnp.zeros((2, 0)), "w": jnp.ones((3, 2))}, state, params)
    assert u["e"].shape == (2, 0) and np.all(np.isfinite(u["w"]))
    assert tx.update({}, tx.init({}), {})[0] == {}


@pytest.mark.parametrize("kwargs,error,match", [
    (dict(rank=0), ValueError, "rank must be an int >= 1"),
    (dict(rank=1.5), ValueError, r"rank as a float .* \(0, 1\]"),
    (dict(rank=True), TypeError, "rank must be an int"),
    (dict(rank_multiple_of=0), ValueError, "rank_multiple_of must be an integer >= 1"),
    (dict(mu=1.5), ValueError, r"mu must be in \[0.0, 1.0\]"),
    (dict(eps=-1.0), ValueError, "eps must be >= 0"),
    (dict(scalar_b2=1.0), ValueError, "scalar_b2 must be in"),
    (dict(scalar_optimizer="sgd"), ValueError, "scalar_optimizer must be 'adamw' or 'lion'"),
    (dict(learning_rate=float("nan")), ValueError, "learning_rate must be finite"),
])
def test_bad_hyperparameters_name_the_argument(kwargs, error, match):
    with pytest.raises(error, match=match):
        dion(**{"learning_rate": 1e-2, **kwargs})


def test_bad_inputs_name_the_leaf():
    tx = scale_by_dion(rank=2)
    with pytest.raises(ValueError, match=r"params leaf \['b'\] has shape \(3,\).*matrices"):
        tx.init({"b": jnp.ones(3)})
    with pytest.raises(ValueError, match=r"leaf \[.b.\] has shape \(3,\)"):
        dion(1e-2, dion_mask={"b": True, "w": True}).init({"b": jnp.ones(3),
                                                            "w": jnp.ones((2, 2))})
    state = tx.init({"w": jnp.ones((4, 3))})
    with pytest.raises(ValueError, match=r"updates leaf \['w'\] has shape \(4, 4\) but "
                                         r"scale_by_dion state .mu has shape \(4, 3\)"):
        tx.update({"w": jnp.ones((4, 4))}, state)
    bad = state._replace(q={"w": jnp.ones((3, 3))})
    with pytest.raises(ValueError, match=r"leaf \['w'\] of shape \(4, 3\) needs a state .q "
                                         r"of shape \(3, 2\)"):
        tx.update({"w": jnp.ones((4, 3))}, bad)
    with pytest.raises(TypeError, match=r"\['w'\] has dtype int32"):
        tx.update({"w": jnp.ones((4, 3), jnp.int32)}, state)
