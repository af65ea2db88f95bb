"""functrain.families.rms.stages: each scale_by_* against its formula written out in numpy."""

import jax.numpy as jnp
import numpy as np
import pytest

import functrain as ft
from helpers import FORMULA_GRADS, assert_updates, updates_of


def ref_rms(decay, eps, initial_scale=0.0, eps_in_sqrt=True, bias_correction=False):
    nu, out = np.full(4, initial_scale), []
    for t, g in enumerate(FORMULA_GRADS, start=1):
        nu = decay * nu + (1 - decay) * g * g
        nu_hat = nu / (1 - decay ** t) if bias_correction else nu
        out.append(g / np.sqrt(nu_hat + eps) if eps_in_sqrt else g / (np.sqrt(nu_hat) + eps))
    return out


@pytest.mark.parametrize("kwargs", [
    dict(decay=0.8, eps=1e-3, initial_scale=0.5),
    dict(decay=0.9, eps=1e-3, eps_in_sqrt=False, bias_correction=True),
], ids=["in_sqrt", "bias_correction"])
def test_scale_by_rms_by_hand(kwargs):
    assert_updates(updates_of(ft.scale_by_rms(**kwargs)), ref_rms(**kwargs))
    state = ft.scale_by_rms(**kwargs).init(jnp.zeros(4))
    assert isinstance(state, ft.ScaleByRmsWithCountState if kwargs.get("bias_correction")
                      else ft.ScaleByRmsState)


def test_scale_by_stddev_by_hand():
    decay, eps = 0.8, 1e-3
    mu, nu, ref = np.zeros(4), np.zeros(4), []
    for g in FORMULA_GRADS:
        mu, nu = decay * mu + (1 - decay) * g, decay * nu + (1 - decay) * g * g
        ref.append(g / np.sqrt(nu - mu * mu + eps))
    assert_updates(updates_of(ft.scale_by_stddev(decay, eps)), ref)


def test_scale_by_rss_by_hand():
    s, ref = np.full(4, 0.1), []
    for g in FORMULA_GRADS:
        s = s + g * g
        ref.append(g / np.sqrt(s + 1e-7))
    assert_updates(updates_of(ft.scale_by_rss(0.1, 1e-7)), ref)
    # A zero accumulator gives a zero update, not NaN.
    zero = updates_of(ft.scale_by_rss(0.0, 0.0), [np.array([0.0, 2.0, 0.0, -3.0])])
    np.testing.assert_array_equal(zero[0], [0.0, 1.0, 0.0, -1.0])


def test_scale_by_adadelta_by_hand():
    rho, eps = 0.8, 1e-4
    e_g, e_x, ref = np.zeros(4), np.zeros(4), []
    for g in FORMULA_GRADS:
        e_g = rho * e_g + (1 - rho) * g * g
        u = np.sqrt(e_x + eps) / np.sqrt(e_g + eps) * g
        e_x = rho * e_x + (1 - rho) * u * u
        ref.append(u)
    assert_updates(updates_of(ft.scale_by_adadelta(rho, eps)), ref)


def test_scale_by_sm3_by_hand_on_a_vector():
    # A vector has one accumulator per entry: v = v + g**2 (b2=1), u = g / sqrt(v + eps),
    # then momentum: nu = b1 nu + (1-b1) u.
    b1, eps = 0.5, 1e-8
    v, nu, ref = np.zeros(4), np.zeros(4), []
    for g in FORMULA_GRADS:
        v = v + g * g
        scaled = np.where(v > 0, g / np.sqrt(v + eps), 0.0)
        nu = b1 * nu + (1 - b1) * scaled
        ref.append(nu)
    assert_updates(updates_of(ft.scale_by_sm3(b1=b1, eps=eps)), ref)
