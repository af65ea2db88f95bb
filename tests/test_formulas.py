"""Each optimizer against its formula written out by hand in numpy (not optax)."""

import jax.numpy as jnp
import numpy as np
import pytest

import functrain as ft

P0 = np.array([0.5, -1.5, 2.0, 0.0], np.float64)
GRADS = [np.array([0.1, -2.0, 0.3, 1.0]), np.array([-0.4, 0.5, 0.0, 2.0]),
         np.array([1.0, 1.0, -1.0, -0.5])]


def run(opt, steps=len(GRADS)):
    p = jnp.asarray(P0, jnp.float32)
    state = opt.init(p)
    out = []
    for g in GRADS[:steps]:
        u, state = opt.update(jnp.asarray(g, jnp.float32), state, p)
        p = ft.apply_updates(p, u)
        out.append(np.asarray(p, np.float64))
    return out


def check(opt, reference):
    for ours, theirs in zip(run(opt), reference):
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-7)


def ref_sgd(lr, momentum=0.0, nesterov=False):
    p, t, out = P0.copy(), np.zeros_like(P0), []
    for g in GRADS:
        t = g + momentum * t
        p = p - lr * ((g + momentum * t) if nesterov else t)
        out.append(p)
    return out


def ref_adam(lr, b1=0.9, b2=0.999, eps=1e-8, wd=0.0, trust=False):
    p, m, v, out = P0.copy(), np.zeros_like(P0), np.zeros_like(P0), []
    for k, g in enumerate(GRADS, start=1):
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        u = (m / (1 - b1 ** k)) / (np.sqrt(v / (1 - b2 ** k)) + eps) + wd * p
        if trust:
            pn, un = np.linalg.norm(p), np.linalg.norm(u)
            u = u * (pn / un if pn > 0 and un > 0 else 1.0)
        p = p - lr * u
        out.append(p)
    return out


def ref_lars(lr, wd, tc, momentum):
    p, t, out = P0.copy(), np.zeros_like(P0), []
    for g in GRADS:
        u = g + wd * p
        pn, un = np.linalg.norm(p), np.linalg.norm(u)
        u = u * (tc * pn / un if pn > 0 and un > 0 else 1.0)
        t = -lr * u + momentum * t
        p = p + t
        out.append(p)
    return out


def ref_rmsprop(lr, decay, eps):
    p, v, out = P0.copy(), np.zeros_like(P0), []
    for g in GRADS:
        v = decay * v + (1 - decay) * g * g
        p = p - lr * g / np.sqrt(v + eps)
        out.append(p)
    return out


def ref_adagrad(lr, init, eps):
    p, s, out = P0.copy(), np.full_like(P0, init), []
    for g in GRADS:
        s = s + g * g
        p = p - lr * np.where(s > 0, g / np.sqrt(s + eps), 0.0)
        out.append(p)
    return out


def ref_lion(lr, b1, b2, wd):
    p, m, out = P0.copy(), np.zeros_like(P0), []
    for g in GRADS:
        u = np.sign((1 - b1) * g + b1 * m) + wd * p
        m = b2 * m + (1 - b2) * g
        p = p - lr * u
        out.append(p)
    return out


@pytest.mark.parametrize("opt,reference", [
    (ft.sgd(0.1), ref_sgd(0.1)),
    (ft.sgd(0.1, momentum=0.9), ref_sgd(0.1, 0.9)),
    (ft.sgd(0.1, momentum=0.9, nesterov=True), ref_sgd(0.1, 0.9, True)),
    (ft.adam(0.01), ref_adam(0.01)),
    (ft.adam(0.01, b1=0.5, b2=0.9, eps=1e-3), ref_adam(0.01, 0.5, 0.9, 1e-3)),
    (ft.adamw(0.01, weight_decay=0.1), ref_adam(0.01, wd=0.1)),
    (ft.lamb(0.01), ref_adam(0.01, eps=1e-6, trust=True)),
    (ft.lamb(0.01, weight_decay=0.1), ref_adam(0.01, eps=1e-6, wd=0.1, trust=True)),
    (ft.lars(0.1), ref_lars(0.1, 0.0, 0.001, 0.9)),
    (ft.lars(0.1, weight_decay=0.1, trust_coefficient=0.5, momentum=0.5),
     ref_lars(0.1, 0.1, 0.5, 0.5)),
    (ft.rmsprop(0.01), ref_rmsprop(0.01, 0.9, 1e-8)),
    (ft.adagrad(0.1), ref_adagrad(0.1, 0.1, 1e-7)),
    (ft.lion(0.01), ref_lion(0.01, 0.9, 0.99, 1e-3)),
], ids=["sgd", "momentum", "nesterov", "adam", "adam_settings", "adamw", "lamb", "lamb_wd",
        "lars", "lars_settings", "rmsprop", "adagrad", "lion"])
def test_against_hand_formula(opt, reference):
    check(opt, reference)


def test_lamb_max_trust_ratio_caps_the_ratio():
    """lamb(max_trust_ratio=c): the first step is lr * min(||p|| / ||u||, c) * u."""
    p = jnp.array([30.0, 40.0])
    g = jnp.array([1.0, -1.0])
    opt = ft.lamb(0.1, max_trust_ratio=2.0)
    u, _ = opt.update(g, opt.init(p), p)
    adam_u = np.sign(np.asarray(g)) / (1 + 1e-6)  # first Adam step is g / (|g| + eps)
    ratio = min(50.0 / np.linalg.norm(adam_u), 2.0)
    np.testing.assert_allclose(u, -0.1 * ratio * adam_u, rtol=2e-5)


def test_lamb_trust_ratio_mask_skips_adaptation():
    """Leaves where trust_ratio_mask is False take the plain Adam(W) step."""
    params = {"w": jnp.array([3.0, 4.0]), "b": jnp.array([3.0, 4.0])}
    grads = {"w": jnp.array([1.0, 1.0]), "b": jnp.array([1.0, 1.0])}
    opt = ft.lamb(0.1, trust_ratio_mask={"w": True, "b": False})
    u, _ = opt.update(grads, opt.init(params), params)
    adam_u = 1.0 / (1 + 1e-6)
    np.testing.assert_allclose(u["b"], [-0.1 * adam_u] * 2, rtol=2e-5)
    np.testing.assert_allclose(u["w"], [-0.1 * adam_u * 5 / np.sqrt(2 * adam_u ** 2)] * 2,
                               rtol=2e-5)
