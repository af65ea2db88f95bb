"""functrain.contrib's Scion: scion, scale_by_scion, scion_direction (Pethick et al., 2025; no
optax counterpart).

Compared with: the official code's rule (github.com/LIONS-EPFL/scion, ``scion.py``) written
out in numpy float64 on weights in its PyTorch layout ``(d_out, d_in)`` (ours are the
transposes, ``x @ W``), step by step: ``d <- (1 - momentum) d + momentum g``, then
``x <- (1 - lr) x - lr rho lmo(d)`` (constrained) or ``x <- x - lr rho lmo(d)``, with each
layer's norm (Spectral through Keller Jordan's Newton-Schulz, ColNorm, RowNorm, Sign, BiasRMS,
and Sign on a vector); and what each LMO is: ``s(d)`` has norm 1 in its norm and ``<d, s(d)>``
is the largest ``<d, x>`` over that unit ball (the spectral one against an exact SVD), and the
constrained method keeps every leaf in its ball.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import functrain
from functrain.contrib import (MuonDimensionNumbers, ScaleByScionState, scale_by_scion, scion,
                               scion_direction)
from functrain.jax_compat import enable_x64
from muon_family_reference import MUON_COEFFS

STEPS = 20
EPS = 1e-8
NORMS = {"embed": "colnorm", "hidden": "spectral", "stack": "spectral", "proj": "rownorm",
         "out": "sign", "bias": "rms", "gain": "sign"}
SCALE = {"embed": 1.0, "hidden": 3.0, "stack": 2.0, "proj": 0.5, "out": 10.0, "bias": 0.5,
         "gain": 1.5}
SHAPES = {"embed": (7, 4), "hidden": (4, 6), "stack": (3, 6, 5), "proj": (6, 3),
          "out": (5, 7), "bias": (6,), "gain": (5,)}


def np_newton_schulz(g, eps=EPS, coeffs=MUON_COEFFS, steps=5):
    a, b, c = coeffs
    x = g.T if g.shape[0] > g.shape[1] else g
    x = x / (np.linalg.norm(x) + eps)
    for _ in range(steps):
        s = x @ x.T
        x = a * x + (b * s + c * s @ s) @ x
    return x.T if g.shape[0] > g.shape[1] else x


def official_lmo(g, norm, eps=EPS):
    """The official ``Norm.lmo`` of a PyTorch-layout weight ``(d_out, d_in)``, or of a
    vector (``'rms'``: ``BiasRMS``; ``'sign'``: ``Sign`` without the 1/d_in of a matrix)."""
    if g.ndim == 1:
        return g / (np.sqrt(np.mean(g ** 2)) + eps) if norm == "rms" else np.sign(g)
    d_out, d_in = g.shape
    if norm == "spectral":
        return np_newton_schulz(g, eps) * np.sqrt(d_out / d_in)
    if norm == "colnorm":
        return g / (np.sqrt(np.sum(g ** 2, axis=0, keepdims=True)) / np.sqrt(d_out) + eps)
    if norm == "rownorm":
        return g / (np.sqrt(np.sum(g ** 2, axis=-1, keepdims=True)) * np.sqrt(d_in) + eps)
    assert norm == "sign"
    return np.sign(g) / d_in


def our_layout_lmo(w, norm):
    """``official_lmo`` of our ``x @ W`` leaf (its transpose), each stacked matrix apart."""
    if w.ndim == 3:
        return np.stack([our_layout_lmo(m, norm) for m in w])
    return official_lmo(w.T, norm).T if w.ndim == 2 else official_lmo(w, norm)


def problem(dtype=np.float64):
    rng = np.random.default_rng(0)
    params = {k: rng.standard_normal(s) * 0.3 for k, s in SHAPES.items()}
    grads = [{k: rng.standard_normal(s) * 10.0 ** rng.uniform(-1, 1) for k, s in SHAPES.items()}
             for _ in range(STEPS)]
    cast = lambda t: {k: jnp.asarray(v, dtype) for k, v in t.items()}
    return cast(params), [cast(g) for g in grads]


def reference(params, grads, lr, momentum, constrained):
    x = {k: np.array(v, np.float64) for k, v in params.items()}
    d = {k: np.zeros_like(v) for k, v in x.items()}
    out = []
    for g in grads:
        for k in x:
            d[k] = (1 - momentum) * d[k] + momentum * np.asarray(g[k], np.float64)
            step = SCALE[k] * our_layout_lmo(d[k], NORMS[k])
            x[k] = (1 - lr) * x[k] - lr * step if constrained else x[k] - lr * step
        out.append({k: v.copy() for k, v in x.items()})
    return out


@pytest.mark.parametrize("constrained", [True, False])
@pytest.mark.parametrize("momentum", [0.1, 0.5, 1.0])
def test_matches_the_official_rule_in_numpy(constrained, momentum):
    with enable_x64(True):
        params, grads = problem()
        opt = scion(0.05, momentum, norms=NORMS, scale=SCALE, constrained=constrained)

        @jax.jit
        def step(p, s, g):
            u, s = opt.update(g, s, p)
            return functrain.apply_updates(p, u), s

        state, p = opt.init(params), params
        ref = reference(params, grads, 0.05, momentum, constrained)
        for t, g in enumerate(grads):
            p, state = step(p, state, g)
            for k in params:
                np.testing.assert_allclose(np.asarray(p[k]), ref[t][k], rtol=1e-9, atol=1e-12,
                                           err_msg=f"step {t} {k}")


def test_default_norms_are_the_official_auto_and_the_state_one_momentum():
    """``norms=None``: spectral on leaves of rank >= 2 (the last two axes), rms on the
    others; the state is the momentum alone, ``(1 - momentum) d + momentum g``."""
    with enable_x64(True):
        params, grads = problem()
        tx = scale_by_scion(0.25)
        state = tx.init(params)
        assert isinstance(state, ScaleByScionState)
        u, state = tx.update(grads[0], state)
        for k, v in params.items():
            norm = "spectral" if v.ndim >= 2 else "rms"
            np.testing.assert_allclose(u[k], our_layout_lmo(0.25 * np.asarray(grads[0][k]), norm),
                                       rtol=1e-9, atol=1e-12, err_msg=k)
            np.testing.assert_allclose(state.mu[k], 0.25 * np.asarray(grads[0][k]), rtol=1e-15)
        scalar = scale_by_scion()
        out, _ = scalar.update({"s": jnp.array(-3.0)}, scalar.init({"s": jnp.array(1.0)}))
        np.testing.assert_allclose(out["s"], -1.0, rtol=1e-6)  # rms of a scalar: its sign


def dual_pairing_and_norm(norm, fan_in, fan_out):
    """``(norm of x, sup of <d, x> over the unit ball)`` for a ``(fan_in, fan_out)`` matrix."""
    if norm == "spectral":
        return (lambda x: np.sqrt(fan_in / fan_out) * np.linalg.norm(x, 2),
                lambda d: np.sqrt(fan_out / fan_in) * np.linalg.norm(d, "nuc"))
    if norm == "colnorm":  # each input's slice (a row here) over the outputs
        return (lambda x: np.max(np.linalg.norm(x, axis=1)) / np.sqrt(fan_out),
                lambda d: np.sqrt(fan_out) * np.sum(np.linalg.norm(d, axis=1)))
    if norm == "rownorm":  # each output's slice (a column here) over the inputs
        return (lambda x: np.max(np.linalg.norm(x, axis=0)) * np.sqrt(fan_in),
                lambda d: np.sum(np.linalg.norm(d, axis=0)) / np.sqrt(fan_in))
    if norm == "sign":
        return (lambda x: fan_in * np.max(np.abs(x)), lambda d: np.sum(np.abs(d)) / fan_in)
    return (lambda x: np.sqrt(np.mean(x ** 2)), lambda d: np.linalg.norm(d) * np.sqrt(d.size))


@pytest.mark.parametrize("norm", ["spectral", "colnorm", "rownorm", "sign", "rms"])
def test_each_direction_is_the_lmo_of_its_norm(norm):
    """``s(d)`` has norm 1, ``<d, s(d)>`` is the dual norm of ``d`` (the largest ``<d, x>``
    over the unit ball), and no random point of the ball does better. The spectral one with a
    converging Newton-Schulz (cubic, 40 steps) is ``sqrt(fan_out / fan_in) U V^T`` of the SVD,
    every singular value equal."""
    rng = np.random.default_rng(3)
    with enable_x64(True):
        for shape in [(6, 4), (3, 8)]:
            d = rng.standard_normal(shape)
            norm_of, dual = dual_pairing_and_norm(norm, *shape)
            kw = dict(ns_coeffs=(1.5, -0.5, 0.0), ns_steps=40) if norm == "spectral" else {}
            s = np.asarray(scion_direction(jnp.asarray(d), norm, **kw))
            np.testing.assert_allclose(norm_of(s), 1.0, rtol=1e-7)
            np.testing.assert_allclose(np.sum(d * s), dual(d), rtol=1e-7)
            for _ in range(200):
                x = rng.standard_normal(shape) * (rng.random(shape) < 0.5)
                x = x / norm_of(x)
                assert np.sum(d * x) <= dual(d) * (1 + 1e-12)
            if norm == "spectral":
                u, sv, vt = np.linalg.svd(d, full_matrices=False)
                np.testing.assert_allclose(s, np.sqrt(shape[1] / shape[0]) * u @ vt, atol=1e-10)
                np.testing.assert_allclose(np.linalg.svd(s, compute_uv=False),
                                           np.sqrt(shape[1] / shape[0]), rtol=1e-10)
            if norm == "colnorm":
                np.testing.assert_allclose(np.linalg.norm(s, axis=1), np.sqrt(shape[1]))
            if norm == "sign":
                np.testing.assert_array_equal(np.abs(s), 1.0 / shape[0])


def test_stacked_layers_and_conv_kernels_are_separate_matrices():
    """A stacked leaf's layers (the default, the last two axes) and a conv kernel with
    ``MuonDimensionNumbers((0, 1, 2), 3)``: each matrix's own direction, with its fans."""
    rng = np.random.default_rng(4)
    with enable_x64(True):
        stack = rng.standard_normal((3, 4, 5))
        for norm in ("spectral", "colnorm", "rownorm", "sign", "rms"):
            got = np.asarray(scion_direction(jnp.asarray(stack), norm))
            for i in range(3):
                want = (np.asarray(scion_direction(jnp.asarray(stack[i]), norm)) if norm != "rms"
                        else stack[i] / (np.sqrt(np.mean(stack[i] ** 2)) + EPS))
                np.testing.assert_allclose(got[i], want, rtol=1e-12, err_msg=norm)
        kernel = rng.standard_normal((3, 3, 2, 4))
        conv = scion_direction(jnp.asarray(kernel), "spectral", MuonDimensionNumbers((0, 1, 2), 3))
        np.testing.assert_allclose(np.asarray(conv).reshape(18, 4),
                                   our_layout_lmo(kernel.reshape(18, 4), "spectral"), rtol=1e-10)


def test_the_constrained_method_keeps_every_leaf_in_its_ball():
    """SCG's ``x <- (1 - lr) x + lr lmo(d)`` is a convex combination: started inside the
    ``rho``-ball of each leaf's norm, the iterates stay inside (float32, 100 steps), where the
    unconstrained method leaves it. Newton-Schulz made exact (cubic, 30 steps)."""
    rng = np.random.default_rng(5)
    shapes = {"embed": (7, 4), "hidden": (4, 6), "out": (5, 7), "proj": (6, 3), "bias": (6,)}
    norms = {"embed": "colnorm", "hidden": "spectral", "out": "sign", "proj": "rownorm",
             "bias": "rms"}
    scale = {"embed": 1.0, "hidden": 3.0, "out": 10.0, "proj": 0.5, "bias": 0.5}
    measure = {k: dual_pairing_and_norm(n, *shapes[k])[0] if len(shapes[k]) == 2 else
               (lambda x: np.sqrt(np.mean(x ** 2))) for k, n in norms.items()}
    params = {k: jnp.zeros(s) for k, s in shapes.items()}
    peak = {}
    for constrained in (True, False):
        opt = scion(0.1, 0.5, norms=norms, scale=scale, constrained=constrained,
                    ns_coeffs=(1.5, -0.5, 0.0), ns_steps=30)
        p, state, step = params, opt.init(params), jax.jit(opt.update)
        peak[constrained] = {k: 0.0 for k in shapes}
        for _ in range(100):
            g = {k: jnp.asarray(rng.standard_normal(s) + 1.0, jnp.float32)
                 for k, s in shapes.items()}
            u, state = step(g, state, p)
            p = functrain.apply_updates(p, u)
            for k in shapes:
                peak[constrained][k] = max(peak[constrained][k],
                                           measure[k](np.asarray(p[k], np.float64)) / scale[k])
    assert all(v <= 1 + 1e-5 for v in peak[True].values()), peak[True]
    assert all(v > 2 for v in peak[False].values()), peak[False]


def test_inject_hyperparams_jit_and_a_norms_function():
    params, grads = problem(np.float32)
    by_rank = lambda tree: {k: ("sign" if np.ndim(v) < 2 else "colnorm") for k, v in tree.items()}
    for norms in (NORMS, by_rank):
        plain = scion(0.05, 0.2, norms=norms, scale=SCALE)
        injected = functrain.inject_hyperparams(scion)(learning_rate=0.05, momentum=0.2,
                                                       norms=norms, scale=SCALE)
        want = plain.update(grads[0], plain.init(params), params)[0]
        got = jax.jit(injected.update)(grads[0], injected.init(params), params)[0]
        for k in params:
            np.testing.assert_allclose(got[k], want[k], rtol=2e-6, atol=1e-7, err_msg=k)
    u = scion(0.05, norms=by_rank).update(grads[0], scion(0.05).init(params), params)[0]
    np.testing.assert_allclose(u["gain"], -0.05 * (np.sign(grads[0]["gain"]) + params["gain"]),
                               rtol=1e-6)
    state = scale_by_scion(mu_dtype=jnp.bfloat16).init(params)
    assert state.mu["hidden"].dtype == jnp.bfloat16


def test_bad_arguments_are_named():
    params = {"w": jnp.ones((3, 2)), "b": jnp.ones(2)}
    with pytest.raises(ValueError, match=r"^scion: momentum must be > 0"):
        scion(0.1, 0.0)
    with pytest.raises(ValueError, match=r"^scion: momentum must be in \[0.0, 1.0\]"):
        scion(0.1, 1.5)
    with pytest.raises(ValueError, match=r"^scion: norms\['b'\] is 'sgn', not a norm"):
        scion(0.1, norms={"w": "spectral", "b": "sgn"})
    with pytest.raises(TypeError, match=r"norms\['w'\] must be a norm's name or None"):
        scion(0.1, norms={"w": 3, "b": None})
    with pytest.raises(ValueError, match=r"^scion: scale\['b'\] must be >= 0"):
        scion(0.1, scale={"w": 1.0, "b": -1.0})
    with pytest.raises(TypeError, match=r"scion: constrained must be a bool"):
        scion(0.1, constrained="yes")
    with pytest.raises(ValueError, match=r"leaf \['b'\] of shape \(2,\) is given the norm "
                                         r"'spectral', which needs a matrix"):
        scion(0.1, norms="spectral").init(params)
    with pytest.raises(ValueError, match=r"leaf \['w'\] of shape \(3, 2\) is given the norm "
                                         r"'colnorm', which needs a matrix"):
        scion(0.1, norms={"w": "colnorm", "b": "rms"},
              weight_dimension_numbers={"w": None, "b": None}).init(params)
    with pytest.raises(ValueError, match=r"norms\['b'\] is 'bad'"):  # a function's, when called
        opt = scion(0.1, norms=lambda t: {"w": "sign", "b": "bad"})
        opt.init(params)
    with pytest.raises(ValueError, match=r"scale does not fit|different tree structures"):
        scion(0.1, scale={"x": 1.0}).init(params)
    with pytest.raises(ValueError, match=r"names axis 2, but leaf \['w'\] has shape \(3, 2\)"):
        scion(0.1, weight_dimension_numbers=MuonDimensionNumbers(0, 2)).init(params)
    tx = scale_by_scion()
    with pytest.raises(TypeError, match="scale_by_scion"):
        tx.update(params, (), params)
