"""functrain.contrib.normuon / scale_by_normuon (no optax counterpart).

Compared with: the official code's ``normuon_update`` (github.com/zichongli5/NorMuon, read
for its rule and defaults) written out in numpy float64 for a weight in torch's
``(out, in)`` layout (the test transposes functrain's ``(in, out)`` weights into it, so the
neuron axis is checked, not assumed), with Keller Jordan's Newton-Schulz, Muon's width
factor and decoupled weight decay, and AdamW for the leaves NorMuon does not take; 20 steps
on a tree with a 2-D weight, a stacked ``(layers, in, out)`` leaf and a bias. Plus
hand-derived properties (after one step every neuron's update has the same norm; the
normalization keeps the Newton-Schulz output's norm), training on least squares, and the
argument errors.
"""

from __future__ import annotations

import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import functrain
from functrain.contrib import (MuonDimensionNumbers, NorMuonState, normuon,
                               scale_by_normuon)
from functrain.jax_compat import enable_x64
from muon_family_reference import (SPEC, STEPS, check_gram_gives_the_reference,
                                    ns_reference, problem as _problem,
                                    run_jitted as _run)


def normuon_update(g, mom, v, beta, beta2, eps, nesterov=True):
    """The official normuon_update on one torch-layout (out, in) matrix; returns (u, v)."""
    mom[...] = beta * mom + (1 - beta) * g
    m = beta * mom + (1 - beta) * g if nesterov else mom
    o = ns_reference(m)
    vnorm = np.linalg.norm(o)
    v[...] = beta2 * v + (1 - beta2) * np.mean(o * o, axis=-1, keepdims=True)
    o = o / (np.sqrt(v) + eps)
    o = o * vnorm / (np.linalg.norm(o) + eps)
    return o * max(1.0, g.shape[-2] / g.shape[-1]) ** 0.5


def ref_normuon(params, grads, lr, beta=0.95, beta2=0.95, eps=1e-10, wd=0.0, adam_lr=None,
                b1=0.9, b2=0.95, adam_eps=1e-10, adam_wd=0.0, nesterov=True):
    """NorMuon on 'w' and each layer of 'stack' (functrain's (in, out) weights, transposed
    to torch's (out, in)), AdamW on 'b'; the params after every step."""
    p = {k: np.array(v, np.float64) for k, v in params.items()}
    mats = {"w": [p["w"].T]} | {f"stack{i}": [p["stack"][i].T] for i in range(len(p["stack"]))}
    mom = {k: np.zeros_like(m[0]) for k, m in mats.items()}
    sec = {k: np.zeros((m[0].shape[0], 1)) for k, m in mats.items()}
    m1, m2 = np.zeros_like(p["b"]), np.zeros_like(p["b"])
    out = []
    for t, g in enumerate(grads, start=1):
        u = normuon_update(np.asarray(g["w"]).T, mom["w"], sec["w"], beta, beta2, eps, nesterov)
        p["w"] = p["w"] * (1 - lr * wd) - lr * u.T
        for i in range(len(p["stack"])):
            k = f"stack{i}"
            u = normuon_update(np.asarray(g["stack"][i]).T, mom[k], sec[k], beta, beta2, eps,
                               nesterov)
            p["stack"][i] = p["stack"][i] * (1 - lr * wd) - lr * u.T
        gb = np.asarray(g["b"])
        m1, m2 = b1 * m1 + (1 - b1) * gb, b2 * m2 + (1 - b2) * gb ** 2
        step = (m1 / (1 - b1 ** t)) / (np.sqrt(m2 / (1 - b2 ** t)) + adam_eps)
        p["b"] = p["b"] - (adam_lr or lr) * (step + adam_wd * p["b"])
        out.append({k: v.copy() for k, v in p.items()})
    return out


@pytest.mark.parametrize("nesterov", [True, False])
def test_matches_the_official_update_rule(nesterov):
    with enable_x64(True):
        params, grads = _problem()
        opt = normuon(2e-2, weight_decay=0.1, adam_learning_rate=1e-2, adam_weight_decay=0.05,
                      nesterov=nesterov, muon_weight_dimension_numbers=SPEC)
        ours, state = _run(opt, params, grads)
        ref = ref_normuon(params, grads, 2e-2, wd=0.1, adam_lr=1e-2, adam_wd=0.05,
                          nesterov=nesterov)
        for t in range(STEPS):
            for k in params:
                np.testing.assert_allclose(np.asarray(ours[t][k]), ref[t][k], rtol=1e-9,
                                           atol=1e-12, err_msg=f"step {t} {k}")
        inner = state.inner_states["muon"].inner_state[0]
        assert isinstance(inner, NorMuonState)
        # One second-moment entry per neuron: the reduction axis kept with size 1.
        assert inner.nu["w"].shape == (1, 4) and inner.nu["stack"].shape == (3, 1, 5)


def test_gram_newton_schulz_gives_the_official_numbers():
    # ns_method='gram' runs the same Newton-Schulz steps through M M^H, equal up to rounding.
    check_gram_gives_the_reference(
        lambda method: normuon(2e-2, weight_decay=0.1, adam_learning_rate=1e-2,
                                muon_weight_dimension_numbers=SPEC, ns_method=method),
        lambda params, grads: ref_normuon(params, grads, 2e-2, wd=0.1, adam_lr=1e-2))


def test_two_d_rule_and_float32():
    # The default split (muon's): 2-D leaves to NorMuon, the stacked 3-D leaf and the bias to
    # AdamW. float32 against the float64 reference over 5 steps.
    params, grads = _problem(np.float32)
    ours, state = _run(normuon(2e-2), params, grads[:5])
    with enable_x64(True):
        ref64 = ref_normuon({k: np.asarray(v) for k, v in params.items()},
                            [{k: np.asarray(v, np.float64) for k, v in g.items()}
                             for g in grads[:5]], 2e-2)
    np.testing.assert_allclose(ours[-1]["w"], ref64[-1]["w"], rtol=1e-4, atol=1e-5)
    assert ours[-1]["w"].dtype == np.float32
    muon_state = state.inner_states["muon"].inner_state[0]
    assert isinstance(muon_state.nu["stack"], functrain.MaskedNode)
    assert state.inner_states["adam"].inner_state[0].mu["stack"].shape == (3, 4, 5)


def test_one_step_equalizes_the_neurons_and_keeps_the_norm():
    # Hand-derived: at step 1, nu = (1 - beta2) mean_in(O**2) per neuron, so with eps = 0
    # every neuron's column of O / sqrt(nu) has norm sqrt(fan_in / (1 - beta2)): equal; the
    # rescaling then restores ||O||_F, and ||O||_F**2 = sum of NS's squared singular values.
    rng = np.random.default_rng(1)
    g = jnp.asarray(rng.standard_normal((6, 4)) * np.array([1, 10, 0.1, 3]), jnp.float32)
    tx = scale_by_normuon(eps=0.0)
    u, _ = tx.update({"w": g}, tx.init({"w": g}))
    cols = np.linalg.norm(np.asarray(u["w"]), axis=0)
    np.testing.assert_allclose(cols, cols[0], rtol=1e-5)
    with enable_x64(True):
        o = ns_reference(np.asarray(g, np.float64) * 0.05)  # nesterov m = 0.05 g at step 1
    np.testing.assert_allclose(np.linalg.norm(np.asarray(u["w"])), np.linalg.norm(o),
                               rtol=1e-5)


def test_trains_a_least_squares_problem():
    rng = np.random.default_rng(2)
    x = jnp.asarray(rng.standard_normal((64, 8)), jnp.float32)
    y = x @ jnp.asarray(rng.standard_normal((8, 4)), jnp.float32)
    loss = lambda p: jnp.mean((x @ p["w"] + p["b"] - y) ** 2)
    params = {"w": jnp.zeros((8, 4)), "b": jnp.zeros(4)}
    opt = normuon(5e-2, adam_learning_rate=1e-2)
    state = opt.init(params)

    @jax.jit
    def step(p, s):
        u, s = opt.update(jax.grad(loss)(p), s, p)
        return functrain.apply_updates(p, u), s

    first = float(loss(params))
    for _ in range(100):
        params, state = step(params, state)
    assert float(loss(params)) < 0.05 * first


def test_coefficients_pass_through_to_newton_schulz():
    params, grads = _problem(np.float32)
    by_name = _run(normuon(1e-2, ns_coeffs="dion", ns_steps=5), params, grads[:3])[0]
    dion = ((4.0848, -6.8946, 2.9270), (3.9505, -6.3029, 2.6377), (3.7418, -5.5913, 2.3037),
            (2.8769, -3.1427, 1.2046), (2.8366, -3.0525, 1.2012))
    by_value = _run(normuon(1e-2, ns_coeffs=dion, ns_steps=5), params, grads[:3])[0]
    standard = _run(normuon(1e-2), params, grads[:3])[0]
    np.testing.assert_array_equal(by_name[-1]["w"], by_value[-1]["w"])
    assert not np.allclose(by_name[-1]["w"], standard[-1]["w"])


def test_defaults_are_the_authors():
    sig = inspect.signature(normuon).parameters
    assert (sig["beta"].default, sig["beta2"].default, sig["eps"].default,
            sig["weight_decay"].default, sig["ns_steps"].default, sig["nesterov"].default,
            sig["adam_b1"].default, sig["adam_b2"].default, sig["adam_eps"].default) == (
        0.95, 0.95, 1e-10, 0.0, 5, True, 0.9, 0.95, 1e-10)


def test_init_from_shapes_alone():
    params = {"w": jax.ShapeDtypeStruct((6, 4), jnp.float32),
              "stack": jax.ShapeDtypeStruct((3, 4, 5), jnp.float32),
              "b": jax.ShapeDtypeStruct((5,), jnp.float32)}
    state = jax.eval_shape(normuon(1e-2, muon_weight_dimension_numbers=SPEC).init, params)
    assert state.inner_states["muon"].inner_state[0].nu["stack"].shape == (3, 1, 5)


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="normuon: beta2 must be in"):
        normuon(1e-2, beta2=1.0)
    for steps in (2.5, 5.0):  # a float fails in Newton-Schulz's fori_loop: refused at build
        with pytest.raises(TypeError, match=f"normuon: ns_steps must be an int .* {steps}"):
            normuon(1e-2, ns_steps=steps)
    with pytest.raises(ValueError, match="normuon: ns_coeffs preset 'nope' is unknown"):
        normuon(1e-2, ns_coeffs="nope")
    with pytest.raises(ValueError, match="normuon: ns_method must be one of"):
        normuon(1e-2, ns_method="nope")
    tx = scale_by_normuon(weight_dimension_numbers={"w": MuonDimensionNumbers(0, 1),
                                                    "b": None})
    params = {"w": jnp.ones((3, 2)), "b": jnp.ones((2, 2))}
    with pytest.raises(ValueError, match=r"no MuonDimensionNumbers for leaf \['b'\]"):
        tx.update(params, tx.init(params))
    # nu's shape depends on the leaf's axes: init checks each leaf, naming it.
    with pytest.raises(ValueError, match=r"scale_by_normuon: leaf \['v'\] has shape \(3,\), "
                                         r"but Muon orthogonalizes matrices"):
        scale_by_normuon().init({"v": jnp.ones(3)})
    with pytest.raises(TypeError, match="scale_by_normuon"):
        scale_by_normuon().update(params, ())
