"""functrain.families.adam.optimizers: by hand (numpy), low-precision moments, convergence,
and for each optimizer of the file: unknown update keywords, inject_hyperparams, float64.

Every step against optax: tests/parity/test_optax_parity.py.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import functrain as ft
from functrain.families.adam import optimizers as adam_family
from helpers import FORMULA_GRADS, FORMULA_P0, check_against_formula
from optimizer_checks import (assert_reaches_rosenbrock_minimum,
                              check_extra_args_ignored_and_inject_hyperparams,
                              check_float64_params_stay_float64)
from registry import optimizer_names

NAMES = optimizer_names(adam_family)


def ref_adam(lr, b1=0.9, b2=0.999, eps=1e-8, wd=0.0, trust=False):
    p, m, v, out = FORMULA_P0.copy(), np.zeros_like(FORMULA_P0), np.zeros_like(FORMULA_P0), []
    for k, g in enumerate(FORMULA_GRADS, start=1):
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        u = (m / (1 - b1 ** k)) / (np.sqrt(v / (1 - b2 ** k)) + eps) + wd * p
        if trust:
            pn, un = np.linalg.norm(p), np.linalg.norm(u)
            u = u * (pn / un if pn > 0 and un > 0 else 1.0)
        p = p - lr * u
        out.append(p)
    return out


@pytest.mark.parametrize("opt,reference", [
    (ft.adam(0.01), ref_adam(0.01)),
    (ft.adam(0.01, b1=0.5, b2=0.9, eps=1e-3), ref_adam(0.01, 0.5, 0.9, 1e-3)),
    (ft.adamw(0.01, weight_decay=0.1), ref_adam(0.01, wd=0.1)),
    (ft.lamb(0.01), ref_adam(0.01, eps=1e-6, trust=True)),
    (ft.lamb(0.01, weight_decay=0.1), ref_adam(0.01, eps=1e-6, wd=0.1, trust=True)),
], ids=["adam", "adam_settings", "adamw", "lamb", "lamb_wd"])
def test_against_hand_formula(opt, reference):
    check_against_formula(opt, reference)


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


# --------------------------------------------------------------------------
# Beyond optax: low precision
# --------------------------------------------------------------------------

def test_optax_adam_float16_zero_gradients_is_nan_and_ours_is_zero():
    """The case the feature exists for: optax's eps underflows in float16."""
    params = jnp.ones(3, jnp.float16)
    grads = jnp.zeros(3, jnp.float16)
    theirs = optax.adam(1e-3)
    u_theirs, _ = theirs.update(grads, theirs.init(params))
    assert bool(jnp.all(jnp.isnan(u_theirs)))
    ours = ft.adam(1e-3)
    u_ours, _ = ours.update(grads, ours.init(params))
    np.testing.assert_array_equal(u_ours, np.zeros(3, np.float16))


@pytest.mark.parametrize("make", [
    lambda **k: ft.adam(1e-2, **k), lambda **k: ft.adamw(1e-2, **k),
    lambda **k: ft.lamb(1e-2, **k)])
def test_nu_dtype_stores_bf16_second_moment_and_stays_close(make):
    params = {"w": jnp.linspace(-1.0, 1.0, 12).reshape(3, 4)}
    grads = [jax.tree_util.tree_map(lambda p: jnp.sin(p * (k + 1)), params) for k in range(20)]

    def run(opt):
        state, p = opt.init(params), params
        for g in grads:
            u, state = opt.update(g, state, p)
            p = ft.apply_updates(p, u)
        return p, state

    low, state = run(make(mu_dtype=jnp.bfloat16, nu_dtype=jnp.bfloat16))
    full, _ = run(make())
    assert state[0].mu["w"].dtype == jnp.bfloat16
    assert state[0].nu["w"].dtype == jnp.bfloat16
    assert low["w"].dtype == jnp.float32
    np.testing.assert_allclose(low["w"], full["w"], rtol=0, atol=5e-3)


def test_bf16_moments_lose_precision_only_in_storage():
    """With bf16 mu, functrain's trajectory is closer to float32 Adam than optax's."""
    rng = np.random.default_rng(0)
    params = jnp.asarray(rng.standard_normal(256), jnp.float32)
    grads = jnp.asarray(rng.standard_normal((50, 256)) * 10.0 ** rng.uniform(-3, 3, (50, 256)),
                        jnp.float32)

    def run(opt, apply):
        @jax.jit
        def go(p):
            def step(c, g):
                p, s = c
                u, s = opt.update(g, s, p)
                return (apply(p, u), s), None
            return jax.lax.scan(step, (p, opt.init(p)), grads)[0][0]
        return np.asarray(go(params))

    exact = run(ft.adam(1e-2), ft.apply_updates)
    ours = run(ft.adam(1e-2, mu_dtype=jnp.bfloat16), ft.apply_updates)
    theirs = run(optax.adam(1e-2, mu_dtype=jnp.bfloat16), optax.apply_updates)
    assert np.abs(ours - exact).max() < np.abs(theirs - exact).max()


# --------------------------------------------------------------------------
# Convergence
# --------------------------------------------------------------------------

@pytest.mark.parametrize("opt", [ft.adam(1e-2), ft.lamb(1e-3)], ids=["adam", "lamb"])
def test_reaches_the_minimum(opt):
    assert_reaches_rosenbrock_minimum(opt)


def test_the_canonical_usage():
    """The README's quickstart, verbatim in spirit: loss falls under lamb + clip + schedule."""
    opt = ft.chain(ft.clip_by_global_norm(1.0),
                   ft.lamb(ft.warmup_cosine_decay_schedule(0.0, 0.1, 10, 300)))
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((64, 5)), jnp.float32)
    y = x @ jnp.arange(1.0, 6.0) + 0.5
    params = {"w": jnp.ones(5), "b": jnp.zeros(())}

    def loss(params, batch):
        x, y = batch
        return jnp.mean((x @ params["w"] + params["b"] - y) ** 2)

    state = opt.init(params)

    @jax.jit
    def train_step(params, state, batch):
        grads = jax.grad(loss)(params, batch)
        updates, state = opt.update(grads, state, params)
        return ft.apply_updates(params, updates), state

    first = float(loss(params, (x, y)))
    for _ in range(300):
        params, state = train_step(params, state, (x, y))
    assert float(loss(params, (x, y))) < 0.05 * first


# --------------------------------------------------------------------------
# Every optimizer of this file
# --------------------------------------------------------------------------

@pytest.mark.parametrize("name", NAMES)
def test_extra_args_ignored_and_inject_hyperparams(name):
    check_extra_args_ignored_and_inject_hyperparams(name)


@pytest.mark.parametrize("name", NAMES)
def test_float64_params_stay_float64(name):
    check_float64_params_stay_float64(name)
