"""functrain.contrib's hyperball optimizers: scale_by_hyperball, muonh, adamh (Wen et al.,
2025; no optax counterpart).

Compared with: the rule written out in numpy float64, ``W <- Norm(W - lr ||W|| Norm(u)) ||W||``
per matrix (each layer of a stacked leaf apart), with ``u`` Muon's orthogonalized Nesterov
momentum (MuonH) or Adam's bias-corrected direction (AdamH), AdamW on the other leaves; and
what the method promises: every matrix keeps its norm over many steps, and the step moves it
by ``lr`` of its norm on the sphere.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import functrain
from functrain.contrib import (MuonDimensionNumbers, ScaleByHyperballState, adamh, muonh,
                               scale_by_hyperball)
from functrain.jax_compat import enable_x64
from muon_family_reference import MUON_COEFFS, SPEC, STEPS, problem, run_jitted


def np_hyperball(w, u, lr):
    r = np.linalg.norm(w)
    moved = w - lr * r * u / np.linalg.norm(u)
    return moved / np.linalg.norm(moved) * r


def np_newton_schulz(m, eps, steps=5):
    a, b, c = MUON_COEFFS
    x = m.T if m.shape[0] > m.shape[1] else m
    x = x / (np.linalg.norm(x) + eps)
    for _ in range(steps):
        s = x @ x.T
        x = a * x + (b * s + c * s @ s) @ x
    return x.T if m.shape[0] > m.shape[1] else x


def np_adamw_bias(p, grads, lr, b1=0.9, b2=0.999, eps=1e-8, nesterov=False):
    """AdamW (no decay) on one leaf; with ``nesterov``, NAdam's look-ahead moment."""
    m, v, out = np.zeros_like(p), np.zeros_like(p), []
    for t, g in enumerate(grads, start=1):
        m, v = b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g * g
        mh = (b1 * m / (1 - b1 ** (t + 1)) + (1 - b1) * g / (1 - b1 ** t) if nesterov
              else m / (1 - b1 ** t))
        p = p - lr * mh / (np.sqrt(v / (1 - b2 ** t)) + eps)
        out.append(p)
    return out


def _matrices(tree):
    """'w' and each layer of 'stack' (the SPEC's matrices), as (name, getter, setter)."""
    yield "w", (lambda p: p["w"]), (lambda p, x: p.__setitem__("w", x))
    for i in range(3):
        yield (f"stack{i}", (lambda p, i=i: p["stack"][i]),
               (lambda p, x, i=i: p["stack"].__setitem__(i, x)))


def ref_muonh(params, grads, lr, adam_lr, beta=0.95, eps=1e-8):
    p = {k: np.array(v, np.float64) for k, v in params.items()}
    mom = {name: np.zeros_like(get(p)) for name, get, _ in _matrices(p)}
    out = []
    for t, g in enumerate(grads, start=1):
        gn = {k: np.asarray(v, np.float64) for k, v in g.items()}
        for name, get, put in _matrices(p):
            gm = get(gn)
            mom[name] = beta * mom[name] + (1 - beta) * gm
            m = beta * mom[name] / (1 - beta ** (t + 1)) + (1 - beta) * gm / (1 - beta ** t)
            put(p, np_hyperball(get(p), np_newton_schulz(m, eps), lr))
        out.append({k: v.copy() for k, v in p.items()})
    bias = np_adamw_bias(np.asarray(params["b"], np.float64), [np.asarray(g["b"]) for g in grads],
                         adam_lr, eps=eps, nesterov=True)
    for o, b in zip(out, bias):
        o["b"] = b
    return out


def ref_adamh(params, grads, lr, adam_lr, b1=0.9, b2=0.999, eps=1e-8):
    p = {k: np.array(v, np.float64) for k, v in params.items()}
    m = {name: np.zeros_like(get(p)) for name, get, _ in _matrices(p)}
    v = {name: np.zeros_like(get(p)) for name, get, _ in _matrices(p)}
    out = []
    for t, g in enumerate(grads, start=1):
        gn = {k: np.asarray(x, np.float64) for k, x in g.items()}
        for name, get, put in _matrices(p):
            gm = get(gn)
            m[name] = b1 * m[name] + (1 - b1) * gm
            v[name] = b2 * v[name] + (1 - b2) * gm * gm
            u = (m[name] / (1 - b1 ** t)) / (np.sqrt(v[name] / (1 - b2 ** t)) + eps)
            put(p, np_hyperball(get(p), u, lr))
        out.append({k: x.copy() for k, x in p.items()})
    bias = np_adamw_bias(np.asarray(params["b"], np.float64), [np.asarray(g["b"]) for g in grads],
                         adam_lr, b1, b2, eps)
    for o, b in zip(out, bias):
        o["b"] = b
    return out


@pytest.mark.parametrize("name", ["muonh", "adamh"])
def test_matches_the_rule_in_numpy(name):
    with enable_x64(True):
        params, grads = problem()
        if name == "muonh":
            opt = muonh(0.05, adam_learning_rate=1e-2, muon_weight_dimension_numbers=SPEC)
            ref = ref_muonh(params, grads, 0.05, 1e-2)
        else:
            opt = adamh(0.05, adam_learning_rate=1e-2, weight_dimension_numbers=SPEC)
            ref = ref_adamh(params, grads, 0.05, 1e-2)
        ours, _ = run_jitted(opt, params, grads)
        for t in range(STEPS):
            for k in params:
                np.testing.assert_allclose(np.asarray(ours[t][k]), ref[t][k], rtol=1e-9,
                                           atol=1e-12, err_msg=f"{name} step {t} {k}")


@pytest.mark.parametrize("make", [lambda: muonh(0.1), lambda: adamh(0.1)])
def test_every_matrix_keeps_its_norm_and_moves_lr_of_it(make):
    """float32, 200 steps: each matrix's norm stays its initial norm ``R`` (to float32
    rounding times the number of steps), and no step turns it by more than the angle
    ``asin(lr)`` (the step ``lr R`` from a point at distance ``R`` from the center, then
    projected back): a chord of at most ``2 R sin(asin(lr) / 2)``."""
    rng = np.random.default_rng(1)
    params = {"w": jnp.asarray(rng.standard_normal((8, 5)), jnp.float32),
              "b": jnp.asarray(rng.standard_normal(5), jnp.float32)}
    opt = make()
    state = opt.init(params)
    radius = float(jnp.linalg.norm(params["w"]))
    step = jax.jit(opt.update)
    for _ in range(200):
        g = {k: jnp.asarray(rng.standard_normal(v.shape), jnp.float32) for k, v in params.items()}
        u, state = step(g, state, params)
        chord = float(jnp.linalg.norm(u["w"]))
        assert chord <= 2 * radius * np.sin(np.arcsin(0.1) / 2) * (1 + 1e-5)
        params = functrain.apply_updates(params, u)
    np.testing.assert_allclose(float(jnp.linalg.norm(params["w"])), radius, rtol=200 * 1e-6)


def test_scale_by_hyperball_with_a_schedule_stacked_and_zero_cases():
    """A schedule is evaluated at the step count (state ScaleByHyperballState); a stacked
    leaf keeps each layer's norm apart; a zero direction leaves the weight; a zero weight
    stays zero (no NaN)."""
    sched = lambda c: 0.1 * (c + 1)
    tx = scale_by_hyperball(sched, {"s": MuonDimensionNumbers(-2, -1), "z": MuonDimensionNumbers()})
    rng = np.random.default_rng(2)
    params = {"s": jnp.asarray(rng.standard_normal((3, 4, 2)), jnp.float32) * jnp.array(
        [1.0, 10.0, 100.0])[:, None, None], "z": jnp.zeros((2, 2))}
    state = tx.init(params)
    assert isinstance(state, ScaleByHyperballState)
    g = {"s": jnp.asarray(rng.standard_normal((3, 4, 2)), jnp.float32), "z": jnp.ones((2, 2))}
    _, state = tx.update(g, state, params)
    u, state = tx.update(g, state, params)
    assert int(state.count) == 2
    moved = params["s"] + u["s"]
    for i in range(3):
        w = np.asarray(params["s"][i], np.float64)
        want = np_hyperball(w, np.asarray(g["s"][i], np.float64), 0.2)
        np.testing.assert_allclose(np.asarray(moved[i]), want, rtol=1e-5, atol=1e-6 * np.abs(
            want).max())
    np.testing.assert_array_equal(u["z"], 0.0)
    zero_dir = tx.update({"s": jnp.zeros((3, 4, 2)), "z": jnp.zeros((2, 2))}, state, params)[0]
    np.testing.assert_array_equal(zero_dir["s"], 0.0)


def test_inject_hyperparams_and_bad_arguments():
    params = {"w": jnp.ones((4, 3)) + jnp.eye(4, 3), "b": jnp.zeros(3)}
    grads = {"w": jnp.eye(4, 3), "b": jnp.ones(3)}
    for factory in (muonh, adamh):
        plain = factory(0.1)
        injected = functrain.inject_hyperparams(factory)(learning_rate=0.1)
        want = plain.update(grads, plain.init(params), params)[0]
        got = injected.update(grads, injected.init(params), params)[0]
        for k in params:  # as muon's: the AdamW side's bias corrections round differently
            np.testing.assert_allclose(got[k], want[k], rtol=2e-5)  # for a traced rate
    with pytest.raises(ValueError, match="muonh: beta"):
        muonh(0.1, beta=1.5)
    with pytest.raises(ValueError, match="adamh: b2"):
        adamh(0.1, b2=-0.1)
    with pytest.raises(ValueError, match=r"scale_by_hyperball: leaf \['b'\] has shape \(3,\)"):
        tx = scale_by_hyperball(0.1)
        tx.update({"b": jnp.ones(3)}, tx.init({"b": jnp.ones(3)}), {"b": jnp.ones(3)})
