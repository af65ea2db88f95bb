"""functrain.contrib.splus / scale_by_splus / splus_get_eval_params (no optax counterpart).

Compared with: the authors' official optax implementation (github.com/kvfrans/splus,
``optax/splus.py``: momentum, statistics of the raw gradient, the sign taken in the eigenbasis
of the bases from before the refresh, ``eigh`` on step 1 and every ``inverse_every`` steps,
the parameters' EMA, weight decay, learning rate, then the shape factor ``2 / (m + n)`` or
``nonstandard_constant`` by shape and key path) written out below in numpy float64, 20
steps with refreshes at steps 1, 7 and 14, on a tree with a matrix rotated on both sides,
one rotated on its rows only and one on its columns only (``max_dim``), an embedding (by
its key path), a bias, a 3-D tensor and a scalar; the evaluation parameters against the
official helper's ``ema / (1 - ema_rate^t)``. Hand-derived: the update's Frobenius norm is
exactly ``sqrt(m n)`` (rotations of a matrix of signs). And: training a least-squares
problem, the refresh schedule, errors, dtypes, no batched LAPACK call on CPU. The 8-device
checks (state sharding, ``mesh=``) are ``check_splus_*`` in tests/matrix_sharding_checks.py.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import functrain
from functrain.contrib import SplusState, scale_by_splus, splus, splus_get_eval_params
from functrain.jax_compat import enable_x64
from helpers import lapack_calls

STEPS = 20
KW = dict(learning_rate=0.1, b1=0.8, b2=0.9, ema_rate=0.9, eps=1e-30, inverse_every=7,
          nonstandard_constant=0.01, nonstandard_strings=("embed", "layernorm"),
          weight_decay=0.1, max_dim=5)
SHAPES = {"w": (4, 4), "wide": (3, 5), "tall": (6, 3), "enc": {"Embed": (3, 3)}, "b": (4,),
          "conv": (2, 3, 2), "s": ()}
MASK = {"w": True, "wide": False, "tall": True, "enc": {"Embed": False}, "b": False,
        "conv": True, "s": True}


def _flat(tree):
    """``{'enc/Embed': leaf, ...}``: the official code's key-path names."""
    flat = jax.tree_util.tree_flatten_with_path(tree, is_leaf=lambda x: isinstance(x, tuple))[0]
    return {"/".join(k.key for k in path): x for path, x in flat}


def ref_splus(params, grads, learning_rate, b1, b2, ema_rate, eps, inverse_every,
              nonstandard_constant, nonstandard_strings, weight_decay, max_dim, mask):
    """The official optax SPlus in numpy float64, on flat ``{path: array}`` dicts.

    Returns per step ``(params, eval_params, sides, margin)``; ``margin`` is the smallest
    ``|x| / max|x|`` over the entries whose sign was taken (how far from a sign flip).
    """
    p = {k: np.array(v, np.float64) for k, v in params.items()}
    mom = {k: np.zeros_like(v) for k, v in p.items()}
    ema = {k: np.zeros_like(v) for k, v in p.items()}
    sides = {k: [np.zeros((d, d)) if d < max_dim else None for d in v.shape]
             for k, v in p.items() if v.ndim == 2}
    qs = {k: [None if s is None else np.eye(len(s)) for s in v] for k, v in sides.items()}
    out = []
    for step, g in enumerate(grads, start=1):
        margin = np.inf
        for k in p:
            mom[k] = b1 * mom[k] + (1 - b1) * g[k]
            m = mom[k]
            if k in qs:
                m = qs[k][0].T @ m if qs[k][0] is not None else m
                m = m @ qs[k][1] if qs[k][1] is not None else m
            margin = min(margin, np.min(np.abs(m)) / np.max(np.abs(m)))
            u = np.sign(m)
            if k in qs:
                u = qs[k][0] @ u if qs[k][0] is not None else u
                u = u @ qs[k][1].T if qs[k][1] is not None else u
                gk = g[k]
                sides[k] = [None if s is None else b2 * s + (1 - b2) * x
                            for s, x in zip(sides[k], (gk @ gk.T, gk.T @ gk))]
            ema[k] = ema_rate * ema[k] + (1 - ema_rate) * p[k]
            if mask[k]:
                u = u + weight_decay * p[k]
            u = -learning_rate * u
            if (p[k].ndim == 2 and max(p[k].shape) < max_dim
                    and not any(s in k.lower() for s in nonstandard_strings)):
                u = u * 2 / sum(p[k].shape)
            else:
                u = u * nonstandard_constant
            p[k] = p[k] + u
        if step == 1 or step % inverse_every == 0:
            qs = {k: [None if s is None else np.linalg.eigh(s + eps * np.eye(len(s)))[1]
                      for s in v] for k, v in sides.items()}
        evals = {k: e / (1 - ema_rate ** step) for k, e in ema.items()}
        out.append(({k: v.copy() for k, v in p.items()}, evals,
                    {k: [None if s is None else s.copy() for s in v] for k, v in sides.items()},
                    margin))
    return out


def _problem(dtype, steps=STEPS):
    rng = np.random.default_rng(0)
    shapes = _flat(SHAPES)
    params = {k: rng.standard_normal(s) for k, s in shapes.items()}
    grads = [{k: rng.standard_normal(s) * 10.0 ** rng.uniform(-2, 1) for k, s in shapes.items()}
             for _ in range(steps)]

    def nest(flat):
        tree = {k: v for k, v in flat.items() if "/" not in k}
        tree["enc"] = {"Embed": flat["enc/Embed"]}
        return jax.tree.map(lambda x: jnp.asarray(x, dtype), tree)

    return params, grads, nest


def _run(opt, params, grads):
    @jax.jit
    def step(p, s, g):
        u, s = opt.update(g, s, p)
        return functrain.apply_updates(p, u), s

    state, p, out = opt.init(params), params, []
    for g in grads:
        p, state = step(p, state, g)
        out.append((p, state))
    return out


def test_matches_the_official_code_in_float64():
    with enable_x64(True):
        params, grads, nest = _problem(jnp.float64)
        ours = _run(splus(**KW, mask=MASK), nest(params), [nest(g) for g in grads])
        ref = ref_splus(params, grads, **KW, mask=_flat(MASK))
        for t, ((p, state), (rp, reval, rsides, _)) in enumerate(zip(ours, ref)):
            evals = _flat(splus_get_eval_params(state))
            for k, v in _flat(p).items():
                np.testing.assert_allclose(v, rp[k], rtol=1e-10, atol=1e-12,
                                           err_msg=f"params {k} after step {t + 1}")
                np.testing.assert_allclose(evals[k], reval[k], rtol=1e-10, atol=1e-12,
                                           err_msg=f"eval params {k} after step {t + 1}")
            for k, (sl, sr) in rsides.items():
                for got, want in ((_flat(state[0].stats_l)[k], sl),
                                  (_flat(state[0].stats_r)[k], sr)):
                    if want is None:
                        assert got.shape == (1,), (k, got.shape)
                    else:
                        np.testing.assert_allclose(got[0], want, rtol=1e-10, atol=1e-14)


def test_float32_follows_the_float64_reference():
    """float32 differs from float64 by the rounding of the rotations: an eigenvector of a
    float32 eigh is off by about eps32 / g (g: the smallest eigenvalue gap relative to the
    largest eigenvalue), so each rotated entry by a few eps32 / g of the largest. No sign
    flips while every sign argument is farther from zero than that (checked below on the
    reference, with 10x slack); then each update entry is off by about sqrt(m n) eps32 / g
    (1e-5 here), and 20 steps of lr * 0.5 at most move the parameters 1e-4 apart."""
    params, grads, nest = _problem(jnp.float32)
    ref = ref_splus(params, grads, **KW, mask=_flat(MASK))
    gap = min(np.min(np.diff(w)) / w[-1] for t, r in enumerate(ref, start=1)
              if t == 1 or t % KW["inverse_every"] == 0
              for sides in r[2].values() for w in (np.linalg.eigvalsh(s) for s in sides
                                                   if s is not None))
    eps32 = float(np.finfo(np.float32).eps)
    assert min(r[3] for r in ref) > 10 * 2 * eps32 / gap, "a sign too close to a flip"
    ours = _run(splus(**KW, mask=MASK), nest(params), [nest(g) for g in grads])
    for k, v in _flat(ours[-1][0]).items():
        np.testing.assert_allclose(np.asarray(v, np.float64), ref[-1][0][k], rtol=0, atol=1e-4,
                                   err_msg=k)


def test_refreshes_on_step_one_and_every_inverse_every_steps():
    params, grads, nest = _problem(jnp.float32, steps=15)
    ours = _run(splus(**KW), nest(params), [nest(g) for g in grads])
    bases = [np.asarray(state[0].bases_l["w"]) for _, state in ours]
    changed = [t + 1 for t in range(len(bases)) if t == 0 and not np.array_equal(
        bases[0][0], np.eye(4)) or t > 0 and not np.array_equal(bases[t], bases[t - 1])]
    assert changed == [1, 7, 14], changed


def test_update_is_rotated_signs_of_norm_sqrt_mn():
    """``||Q_L S Q_R^T||_F = ||S||_F = sqrt(m n)`` for orthogonal bases and a matrix of signs
    with no zero: the bounded update of the paper, whatever the statistics."""
    with enable_x64(True):
        rng = np.random.default_rng(3)
        tx = scale_by_splus(inverse_every=1)
        params = {"w": jnp.zeros((5, 3)), "v": jnp.zeros(4)}
        state = tx.init(params)
        for t in range(4):
            g = {"w": jnp.asarray(rng.standard_normal((5, 3)) * (t + 1)),
                 "v": jnp.asarray(rng.standard_normal(4))}
            u, state = tx.update(g, state, params)
            assert abs(float(jnp.linalg.norm(u["w"])) - np.sqrt(15)) < 1e-12
            np.testing.assert_array_equal(np.abs(u["v"]), 1.0)  # vectors: sign(M)


def test_trains_least_squares_and_the_average_is_better():
    """min ||A W - B||^2 from W = 0: the averaged parameters end far below the start, and
    below the last iterate (the sign steps keep it bouncing at the learning rate's scale)."""
    rng = np.random.default_rng(1)
    a = jnp.asarray(rng.standard_normal((32, 8)), jnp.float32)
    target = jnp.asarray(rng.standard_normal((8, 6)), jnp.float32)
    b = a @ target

    def loss(p):
        return jnp.mean((a @ p["w"] - b) ** 2)

    opt = splus(0.2, ema_rate=0.95, weight_decay=0.0, inverse_every=10)

    @jax.jit
    def step(p, s):
        u, s = opt.update(jax.grad(loss)(p), s, p)
        return functrain.apply_updates(p, u), s

    params = {"w": jnp.zeros((8, 6))}
    state = opt.init(params)
    for _ in range(300):
        params, state = step(params, state)
    start, last = float(loss({"w": jnp.zeros((8, 6))})), float(loss(params))
    averaged = float(loss(splus_get_eval_params(state)))
    assert averaged < 1e-3 * start and averaged < last, (start, last, averaged)


def test_eval_params_of_a_constant_parameter_are_that_parameter():
    """With a zero learning rate and no decay the parameters stay put, and the EMA divided by
    its running weight returns them: each of 50 steps rounds the EMA and the weight once,
    so 50 * 2 float32 ulps (1.2e-5) at most."""
    opt = splus(0.0, weight_decay=0.0, ema_rate=0.9)
    params = {"w": jnp.asarray([[1.5, -2.0], [0.25, 3.0]]), "b": jnp.asarray([7.0, -1e-3])}
    state = opt.init(params)
    step = jax.jit(lambda s: opt.update(jax.tree.map(jnp.ones_like, params), s, params)[1])
    for _ in range(50):
        state = step(state)
    got = splus_get_eval_params(state)
    for k in params:
        np.testing.assert_allclose(got[k], params[k], rtol=1.2e-5)
    assert jnp.all(jnp.isnan(splus_get_eval_params(opt.init(params))["w"]))  # before any step


def test_no_batched_decomposition_on_cpu():
    """Same-size statistics share one map_matrices call: one eigh per matrix on CPU."""
    params = {f"w{i}": jnp.ones((6, 6)) * (i + 1) for i in range(3)} | {"e": jnp.ones((6, 4))}
    opt = splus(1e-2)
    state = opt.init(params)
    step = jax.jit(lambda g, s: opt.update(g, s, params))
    unbatched, batched = lapack_calls(step.lower(params, state).compile().as_text())
    assert unbatched and not batched, batched


def test_low_precision_params_keep_their_dtype_and_a_float32_average():
    params = {"w": jnp.ones((3, 2), jnp.bfloat16), "b": jnp.ones(2, jnp.float16)}
    opt = splus(1e-2)
    state = opt.init(params)
    u, state = jax.jit(opt.update)(jax.tree.map(lambda x: x * 0.5, params), state, params)
    assert u["w"].dtype == jnp.bfloat16 and u["b"].dtype == jnp.float16
    s = state[0]
    assert s.mu["w"].dtype == jnp.bfloat16
    assert {s.ema["w"].dtype, s.stats_l["w"].dtype, s.bases_r["w"].dtype} == {np.dtype(np.float32)}


def test_state_from_shapes_alone():
    params = {"w": jax.ShapeDtypeStruct((3, 12000), jnp.float32),
              "b": jax.ShapeDtypeStruct((3,), jnp.float32)}
    state = jax.eval_shape(splus(1e-2).init, params)[0]
    assert state.stats_l["w"].shape == (1, 3, 3)
    assert state.stats_r["w"].shape == (1,)  # 12000 >= max_dim: not rotated
    assert state.bases_l["b"].shape == (1,)


def test_errors_name_the_argument_or_the_leaf():
    params = {"w": jnp.ones((3, 2))}
    opt = splus(1e-2)
    state = opt.init(params)
    with pytest.raises(ValueError, match="params"):
        opt.update(params, state)
    with pytest.raises(ValueError, match="b1"):
        splus(1e-2, b1=1.0)
    with pytest.raises(ValueError, match="inverse_every"):
        splus(1e-2, inverse_every=0)
    with pytest.raises(TypeError, match="max_dim"):
        splus(1e-2, max_dim=2.5)
    with pytest.raises(TypeError, match="nonstandard_strings"):
        splus(1e-2, nonstandard_strings="embed")
    with pytest.raises(ValueError, match=r"stats_l.*\['w'\].*max_dim"):
        splus(1e-2, max_dim=3).update(params, state, params)
    with pytest.raises(TypeError, match=r"complex.*\['z'\]"):
        splus(1e-2).init({"z": jnp.ones((2, 2), jnp.complex64)})
    with pytest.raises(ValueError, match="SplusState"):
        splus_get_eval_params(functrain.adam(1e-2).init(params))
    assert isinstance(state[0], SplusState)
