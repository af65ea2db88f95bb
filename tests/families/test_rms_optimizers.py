"""functrain.families.rms.optimizers: by hand (numpy), and for each optimizer of the file:
unknown update keywords, inject_hyperparams, float64.

Every step against optax: tests/parity/test_optax_parity.py.
"""

import jax.numpy as jnp
import numpy as np
import pytest

import functrain as ft
from functrain.families.rms import optimizers as rms_family
from helpers import FORMULA_GRADS, FORMULA_P0, check_against_formula
from optimizer_checks import (check_extra_args_ignored_and_inject_hyperparams,
                              check_float64_params_stay_float64)
from registry import optimizer_names

NAMES = optimizer_names(rms_family)


def ref_rmsprop(lr, decay, eps):
    p, v, out = FORMULA_P0.copy(), np.zeros_like(FORMULA_P0), []
    for g in FORMULA_GRADS:
        v = decay * v + (1 - decay) * g * g
        p = p - lr * g / np.sqrt(v + eps)
        out.append(p)
    return out


def ref_adagrad(lr, init, eps):
    p, s, out = FORMULA_P0.copy(), np.full_like(FORMULA_P0, init), []
    for g in FORMULA_GRADS:
        s = s + g * g
        p = p - lr * np.where(s > 0, g / np.sqrt(s + eps), 0.0)
        out.append(p)
    return out


@pytest.mark.parametrize("opt,reference", [
    (ft.rmsprop(0.01), ref_rmsprop(0.01, 0.9, 1e-8)),
    (ft.adagrad(0.1), ref_adagrad(0.1, 0.1, 1e-7)),
], ids=["rmsprop", "adagrad"])
def test_against_hand_formula(opt, reference):
    check_against_formula(opt, reference)


def test_sm3_by_hand_with_scalar_leaf():
    # Beyond optax (which fails on scalars): a scalar leaf keeps a full accumulator.
    opt = ft.sm3(1.0, momentum=0.0)
    params = {"s": jnp.array(1.0), "m": jnp.zeros((2, 2))}
    state = opt.init(params)
    g1 = {"s": jnp.array(2.0), "m": jnp.array([[1., 2.], [3., 4.]])}
    u, state = opt.update(g1, state, params)
    np.testing.assert_allclose(u["s"], -1.0, rtol=1e-6)
    np.testing.assert_allclose(u["m"], -np.ones((2, 2)), rtol=1e-6)
    g2 = {"s": jnp.array(1.0), "m": jnp.ones((2, 2))}
    u, state = opt.update(g2, state, params)
    np.testing.assert_allclose(u["s"], -1.0 / np.sqrt(5.0), rtol=1e-6)
    # Row maxima of g1**2: [4, 16]; column maxima: [9, 16]; cover = min(row_i, col_j).
    cover = np.minimum(np.array([[4.], [16.]]), np.array([[9., 16.]]))
    np.testing.assert_allclose(u["m"], -1.0 / np.sqrt(cover + 1.0), rtol=1e-6)


# --------------------------------------------------------------------------
# Every optimizer of this file
# --------------------------------------------------------------------------

@pytest.mark.parametrize("name", NAMES)
def test_extra_args_ignored_and_inject_hyperparams(name):
    check_extra_args_ignored_and_inject_hyperparams(name)


@pytest.mark.parametrize("name", NAMES)
def test_float64_params_stay_float64(name):
    check_float64_params_stay_float64(name)
