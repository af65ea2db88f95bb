"""functrain.contrib.adamuon / scale_by_adamuon (no optax counterpart).

Compared with: AdaMuon's Algorithm 1 (Si, Zhang & Shen, 2025, arXiv:2507.11005 v2+) as the
official code runs it (github.com/Chongjie-Si/AdaMuon, gpt2/models/optimizers/adamuon.py,
read for its rule and defaults), written out in numpy float64 on torch-layout ``(out, in)``
weights: Nesterov momentum, Newton-Schulz of the momentum's sign, the element-wise second
moment at the momentum's decay, the RMS-aligned rescaling ``0.2 sqrt(m n) / ||O'||``,
decoupled weight decay; AdamW for the leaves AdaMuon does not take; 20 steps on a tree
with a 2-D weight, a stacked ``(layers, in, out)`` leaf and a bias. Plus hand-derived
properties (every matrix's update has RMS 0.2; the first step is ``0.2 sign(O)``),
training on least squares, and the argument errors.
"""

from __future__ import annotations

import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import functrain
from functrain.contrib import AdaMuonState, adamuon, scale_by_adamuon
from functrain.jax_compat import enable_x64
from muon_family_reference import (SPEC, STEPS, check_gram_gives_the_reference,
                                    ns_reference, problem as _problem,
                                    run_jitted as _run)


def adamuon_update(g, mom, v, beta, beta2, eps, nesterov=True):
    """The official AdaMuon step on one (out, in) matrix (without lr and weight decay)."""
    mom[...] = beta * mom + (1 - beta) * g
    m = beta * mom + (1 - beta) * g if nesterov else mom
    o = ns_reference(np.sign(m))
    v[...] = beta2 * v + (1 - beta2) * o * o
    o = o / (np.sqrt(v) + eps)
    return o * 0.2 * np.sqrt(o.size) / (np.linalg.norm(o) + eps)


def ref_adamuon(params, grads, lr, beta=0.95, beta2=None, eps=1e-8, wd=0.01, adam_lr=None,
                b1=0.9, b2=0.95, adam_eps=1e-8, adam_wd=0.0, nesterov=True):
    """AdaMuon on 'w' and each layer of 'stack' (transposed to torch's (out, in)), AdamW on
    'b'; the params after every step."""
    beta2 = beta if beta2 is None else beta2
    p = {k: np.array(v, np.float64) for k, v in params.items()}
    keys = ["w"] + [i for i in range(len(p["stack"]))]
    mats = lambda t, k: t["w"] if k == "w" else t["stack"][k]
    mom = {k: np.zeros_like(mats(p, k).T) for k in keys}
    sec = {k: np.zeros_like(mats(p, k).T) for k in keys}
    m1, m2 = np.zeros_like(p["b"]), np.zeros_like(p["b"])
    out = []
    for t, g in enumerate(grads, start=1):
        for k in keys:
            u = adamuon_update(np.asarray(mats(g, k)).T, mom[k], sec[k], beta, beta2, eps,
                               nesterov)
            mats(p, k)[...] = mats(p, k) * (1 - lr * wd) - lr * u.T
        gb = np.asarray(g["b"])
        m1, m2 = b1 * m1 + (1 - b1) * gb, b2 * m2 + (1 - b2) * gb ** 2
        step = (m1 / (1 - b1 ** t)) / (np.sqrt(m2 / (1 - b2 ** t)) + adam_eps)
        p["b"] = p["b"] - (adam_lr or lr) * (step + adam_wd * p["b"])
        out.append({k: v.copy() for k, v in p.items()})
    return out


@pytest.mark.parametrize("nesterov,beta2", [(True, None), (False, 0.99)])
def test_matches_the_official_update_rule(nesterov, beta2):
    with enable_x64(True):
        params, grads = _problem()
        opt = adamuon(3e-3, weight_decay=0.1, beta2=beta2, adam_learning_rate=1e-2,
                      adam_weight_decay=0.05, nesterov=nesterov,
                      muon_weight_dimension_numbers=SPEC)
        ours, state = _run(opt, params, grads)
        ref = ref_adamuon(params, grads, 3e-3, beta2=beta2, wd=0.1, adam_lr=1e-2,
                          adam_wd=0.05, nesterov=nesterov)
        for t in range(STEPS):
            for k in params:
                np.testing.assert_allclose(np.asarray(ours[t][k]), ref[t][k], rtol=1e-9,
                                           atol=1e-12, err_msg=f"step {t} {k}")
        inner = state.inner_states["muon"].inner_state[0]
        assert isinstance(inner, AdaMuonState)
        assert inner.nu["stack"].shape == (3, 4, 5)


def test_gram_newton_schulz_gives_the_official_numbers():
    # ns_method='gram' runs the same Newton-Schulz steps through M M^H, equal up to rounding.
    check_gram_gives_the_reference(
        lambda method: adamuon(3e-3, weight_decay=0.1, adam_learning_rate=1e-2,
                                muon_weight_dimension_numbers=SPEC, ns_method=method),
        lambda params, grads: ref_adamuon(params, grads, 3e-3, wd=0.1, adam_lr=1e-2))


def test_two_d_rule_and_float32():
    # The default split (muon's): 2-D leaves to AdaMuon, the stacked leaf and the bias to
    # AdamW. float32 against the float64 reference over 5 steps.
    params, grads = _problem(np.float32)
    ours, state = _run(adamuon(3e-3), params, grads[:5])
    with enable_x64(True):
        ref64 = ref_adamuon({k: np.asarray(v) for k, v in params.items()},
                            [{k: np.asarray(v, np.float64) for k, v in g.items()}
                             for g in grads[:5]], 3e-3)
    np.testing.assert_allclose(ours[-1]["w"], ref64[-1]["w"], rtol=1e-5, atol=1e-6)
    assert ours[-1]["w"].dtype == np.float32
    assert isinstance(state.inner_states["muon"].inner_state[0].nu["stack"],
                      functrain.MaskedNode)


def test_update_rms_is_adams_and_the_first_step_is_a_sign():
    # Hand-derived: the rescaling makes each matrix's RMS 0.2 (eps = 0), at every step and
    # for each layer of a stacked leaf apart; at step 1, nu = (1 - beta2) O**2, so
    # O / sqrt(nu) = sign(O) / sqrt(1 - beta2) and the update is 0.2 sign(O).
    rng = np.random.default_rng(1)
    tx = scale_by_adamuon(eps=0.0)
    g = {"stack": jnp.asarray(rng.standard_normal((2, 5, 3)) * [[[1.0]], [[1e3]]],
                              jnp.float32)}
    state = tx.init(g)
    for t in range(4):
        u, state = tx.update(g, state)
        rms = np.sqrt(np.mean(np.asarray(u["stack"]) ** 2, axis=(1, 2)))
        np.testing.assert_allclose(rms, 0.2, rtol=1e-5)
        if t == 0:
            with enable_x64(True):
                o = [ns_reference(np.sign(np.asarray(x, np.float64))) for x in g["stack"]]
            np.testing.assert_allclose(u["stack"], 0.2 * np.sign(o), rtol=1e-5)
        g = {"stack": g["stack"] + jnp.asarray(rng.standard_normal((2, 5, 3)), jnp.float32)}


def test_trains_a_least_squares_problem():
    rng = np.random.default_rng(2)
    x = jnp.asarray(rng.standard_normal((64, 8)), jnp.float32)
    y = x @ jnp.asarray(rng.standard_normal((8, 4)), jnp.float32)
    loss = lambda p: jnp.mean((x @ p["w"] + p["b"] - y) ** 2)
    params = {"w": jnp.zeros((8, 4)), "b": jnp.zeros(4)}
    # A sign-like step of RMS 0.2 * lr needs a decaying learning rate to settle (the
    # authors train with a cosine schedule).
    opt = adamuon(lambda t: 0.4 * (1 - t / 100), weight_decay=0.0, adam_learning_rate=1e-2)
    state = opt.init(params)

    @jax.jit
    def step(p, s):
        u, s = opt.update(jax.grad(loss)(p), s, p)
        return functrain.apply_updates(p, u), s

    first = float(loss(params))
    for _ in range(100):
        params, state = step(params, state)
    assert float(loss(params)) < 0.01 * first


def test_coefficients_pass_through_to_newton_schulz():
    params, grads = _problem(np.float32)
    coeffs = ((3.0, -3.2, 1.2), (3.4445, -4.7750, 2.0315))
    ours = _run(adamuon(1e-2, ns_coeffs=coeffs, ns_steps=2), params, grads[:2])[0]
    with enable_x64(True):
        g = np.asarray(grads[0]["w"], np.float64)
        x = np.sign(0.05 * g)  # Nesterov at step 1: 0.05 g
        x = x.T / (np.linalg.norm(x) + 1e-7)  # (6, 4): transposed, rows <= cols
        for a, b, c in coeffs:
            s = x @ x.T
            x = a * x + (b * s + c * s @ s) @ x
        x = x.T
    u = 0.2 * np.sign(x)  # the first step (see the test above), weight decay 0.01
    first = np.asarray(params["w"]) * (1 - 1e-2 * 0.01) - 1e-2 * u
    np.testing.assert_allclose(ours[0]["w"], first, rtol=1e-6)


def test_defaults_are_the_authors():
    sig = inspect.signature(adamuon).parameters
    assert (sig["beta"].default, sig["beta2"].default, sig["eps"].default,
            sig["weight_decay"].default, sig["ns_steps"].default, sig["nesterov"].default,
            sig["adam_b1"].default, sig["adam_b2"].default) == (
        0.95, None, 1e-8, 0.01, 5, True, 0.9, 0.95)


def test_init_from_shapes_alone():
    params = {"w": jax.ShapeDtypeStruct((6, 4), jnp.float32),
              "b": jax.ShapeDtypeStruct((5,), jnp.float32)}
    state = jax.eval_shape(adamuon(1e-2).init, params)
    assert state.inner_states["muon"].inner_state[0].nu["w"].shape == (6, 4)


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="adamuon: beta2 must be in"):
        adamuon(1e-2, beta2=1.0)
    with pytest.raises(ValueError, match="adamuon: weight_decay must be >= 0"):
        adamuon(1e-2, weight_decay=-1.0)
    with pytest.raises(TypeError, match="scale_by_adamuon: ns_steps must be an int .* 5.0"):
        scale_by_adamuon(ns_steps=5.0)  # a float fails in Newton-Schulz's fori_loop
    with pytest.raises(ValueError, match="adamuon: ns_method must be one of"):
        adamuon(1e-2, ns_method="nope")
    with pytest.raises(ValueError, match="scale_by_adamuon: eps must be >= 0"):
        scale_by_adamuon(eps=-1.0)
    tx = scale_by_adamuon()
    with pytest.raises(ValueError, match=r"updates leaf \['v'\] has shape \(3,\) but "
                                         r"scale_by_adamuon state .mu has shape \(3, 1\)"):
        tx.update({"v": jnp.ones(3)}, tx.init({"v": jnp.ones((3, 1))}))
    with pytest.raises(ValueError, match=r"scale_by_adamuon: leaf \['v'\] has shape \(3,\), "
                                         r"but Muon orthogonalizes matrices"):
        tx.update({"v": jnp.ones(3)}, tx.init({"v": jnp.ones(3)}))
