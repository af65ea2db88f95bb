"""functrain.families.adam.stages: each scale_by_* of the Adam family by hand (numpy, not optax)."""

import jax.numpy as jnp
import numpy as np
import pytest

import functrain as ft
from helpers import FORMULA_GRADS, assert_updates, updates_of


def adam_moments(b1, b2):
    """(t, g, mu, nu) per step: Adam's zero-initialised moving averages."""
    mu, nu = np.zeros(4), np.zeros(4)
    for t, g in enumerate(FORMULA_GRADS, start=1):
        mu, nu = b1 * mu + (1 - b1) * g, b2 * nu + (1 - b2) * g * g
        yield t, g, mu, nu


@pytest.mark.parametrize("nesterov", [False, True])
def test_scale_by_adam_by_hand(nesterov):
    b1, b2, eps, eps_root = 0.8, 0.9, 1e-3, 1e-4
    ref = []
    for t, g, mu, nu in adam_moments(b1, b2):
        if nesterov:
            mu_hat = b1 * mu / (1 - b1 ** (t + 1)) + (1 - b1) * g / (1 - b1 ** t)
        else:
            mu_hat = mu / (1 - b1 ** t)
        ref.append(mu_hat / (np.sqrt(nu / (1 - b2 ** t) + eps_root) + eps))
    tx = ft.scale_by_adam(b1, b2, eps, eps_root, nesterov=nesterov)
    assert_updates(updates_of(tx), ref)
    assert int(tx.init(jnp.zeros(4)).count) == 0


def test_scale_by_adam_mu_dtype():
    state = ft.scale_by_adam(mu_dtype=jnp.bfloat16).init({"w": jnp.ones(3)})
    assert state.mu["w"].dtype == jnp.bfloat16 and state.nu["w"].dtype == jnp.float32


def test_scale_by_amsgrad_by_hand():
    b1, b2, eps = 0.8, 0.9, 1e-3
    nu_max, ref = np.zeros(4), []
    for t, g, mu, nu in adam_moments(b1, b2):
        nu_max = np.maximum(nu_max, nu / (1 - b2 ** t))
        ref.append(mu / (1 - b1 ** t) / (np.sqrt(nu_max) + eps))
    assert_updates(updates_of(ft.scale_by_amsgrad(b1, b2, eps)), ref)


def test_scale_by_adamax_by_hand():
    b1, b2, eps = 0.8, 0.9, 1e-3
    mu, nu, ref = np.zeros(4), np.zeros(4), []
    for t, g in enumerate(FORMULA_GRADS, start=1):
        mu = b1 * mu + (1 - b1) * g
        nu = np.maximum(b2 * nu, np.abs(g) + eps)   # the infinity norm
        ref.append(mu / (1 - b1 ** t) / nu)
    assert_updates(updates_of(ft.scale_by_adamax(b1, b2, eps)), ref)


def test_scale_by_yogi_by_hand():
    b1, b2, eps, init = 0.8, 0.9, 1e-3, 1e-6
    mu, nu, ref = np.full(4, init), np.full(4, init), []
    for t, g in enumerate(FORMULA_GRADS, start=1):
        mu = b1 * mu + (1 - b1) * g
        nu = nu - (1 - b2) * np.sign(nu - g * g) * g * g   # additive, sign-controlled
        ref.append(mu / (1 - b1 ** t) / (np.sqrt(nu / (1 - b2 ** t)) + eps))
    assert_updates(updates_of(ft.scale_by_yogi(b1, b2, eps, initial_accumulator_value=init)),
                   ref)


def test_scale_by_belief_by_hand():
    b1, b2, eps, eps_root = 0.8, 0.9, 1e-3, 1e-6
    mu, s, ref = np.zeros(4), np.zeros(4), []
    for t, g in enumerate(FORMULA_GRADS, start=1):
        mu = b1 * mu + (1 - b1) * g
        s = b2 * s + (1 - b2) * (g - mu) ** 2 + eps_root   # belief: deviation from the new mu
        ref.append(mu / (1 - b1 ** t) / (np.sqrt(s / (1 - b2 ** t)) + eps))
    assert_updates(updates_of(ft.scale_by_belief(b1, b2, eps, eps_root)), ref)


def test_scale_by_radam_before_and_after_rectification():
    tx = ft.scale_by_radam(b1=0.0, b2=0.5, eps=0.0, threshold=2.5)
    state = tx.init([jnp.zeros(1)])
    # rho_inf = 3; rho_1 = 3 - 2*0.5/0.5 = 1 < 2.5: the first moment alone.
    u, state = tx.update([jnp.array([2.])], state)
    np.testing.assert_allclose(u[0], [2.0])
    # rho_2 = 3 - 4*0.25/0.75 = 5/3 < 2.5 still; rho_3 = 3 - 6*0.125/0.875 = 15/7 < 2.5;
    # rho_4 = 3 - 8/15 = 37/15 < 2.5; rho_5 = 3 - 10/31 = 83/31 > 2.5: rectified Adam.
    for _ in range(3):
        u, state = tx.update([jnp.array([2.])], state)
        np.testing.assert_allclose(u[0], [2.0])
    u, state = tx.update([jnp.array([2.])], state)
    rho, rho_inf = 83 / 31, 3.0
    r = np.sqrt((rho - 4) * (rho - 2) * rho_inf / ((rho_inf - 4) * (rho_inf - 2) * rho))
    np.testing.assert_allclose(u[0], [r * 2.0 / 2.0], rtol=1e-5)


def test_scale_by_adan_by_hand():
    """Algorithm 1 of Xie et al. (2022): no gradient difference at the first step."""
    b1, b2, b3, eps, eps_root = 0.5, 0.7, 0.9, 1e-3, 1e-4
    m, v, n, prev, ref = np.zeros(4), np.zeros(4), np.zeros(4), None, []
    for t, g in enumerate(FORMULA_GRADS, start=1):
        d = np.zeros(4) if prev is None else g - prev
        m, v = b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * d
        n = b3 * n + (1 - b3) * (g + (1 - b2) * d) ** 2
        ref.append((m / (1 - b1 ** t) + (1 - b2) * v / (1 - b2 ** t))
                   / (np.sqrt(n / (1 - b3 ** t) + eps_root) + eps))
        prev = g
    assert_updates(updates_of(ft.scale_by_adan(b1, b2, b3, eps, eps_root)), ref)
    state = ft.scale_by_adan().init(jnp.zeros(4))
    assert state._fields == ("m", "v", "n", "g", "t") and state.t.dtype == jnp.int32


def test_scale_by_adan_complex_uses_the_squared_magnitude():
    """n averages |g + (1 - b2) d|**2 (real), so a complex gradient's update is g / |g| first."""
    tx = ft.scale_by_adan(eps=0.0)
    g = jnp.array([3 + 4j, -1j], jnp.complex64)
    u, state = tx.update(g, tx.init(jnp.zeros(2, jnp.complex64)))
    np.testing.assert_allclose(u, [0.6 + 0.8j, -1j], rtol=1e-6)
    assert state.n.dtype == jnp.complex64 and np.all(np.imag(state.n) == 0)


def test_scale_by_adan_bad_hyperparameters_name_the_argument():
    with pytest.raises(ValueError, match=r"scale_by_adan: b3 must be in \[0.0, 1.0\), got 1.5."):
        ft.scale_by_adan(b3=1.5)
    with pytest.raises(ValueError, match="scale_by_adan: eps must be >= 0.0"):
        ft.scale_by_adan(eps=-1.0)
