"""functrain.families.layerwise.optimizers: LARS and NovoGrad by hand (numpy), and for each optimizer of the file: unknown update
keywords, inject_hyperparams, float64.

Every step against optax: tests/parity/test_optax_parity.py.
"""

import jax.numpy as jnp
import numpy as np
import pytest

import functrain as ft
from functrain.families.layerwise import optimizers as layerwise
from helpers import FORMULA_GRADS, FORMULA_P0, check_against_formula
from optimizer_checks import (check_extra_args_ignored_and_inject_hyperparams,
                              check_float64_params_stay_float64)
from registry import optimizer_names

NAMES = optimizer_names(layerwise)


def ref_lars(lr, wd, tc, momentum):
    p, t, out = FORMULA_P0.copy(), np.zeros_like(FORMULA_P0), []
    for g in FORMULA_GRADS:
        u = g + wd * p
        pn, un = np.linalg.norm(p), np.linalg.norm(u)
        u = u * (tc * pn / un if pn > 0 and un > 0 else 1.0)
        t = -lr * u + momentum * t
        p = p + t
        out.append(p)
    return out


@pytest.mark.parametrize("opt,reference", [
    (ft.lars(0.1), ref_lars(0.1, 0.0, 0.001, 0.9)),
    (ft.lars(0.1, weight_decay=0.1, trust_coefficient=0.5, momentum=0.5),
     ref_lars(0.1, 0.1, 0.5, 0.5)),
], ids=["lars", "lars_settings"])
def test_against_hand_formula(opt, reference):
    check_against_formula(opt, reference)


def test_novograd_by_hand():
    opt = ft.novograd(0.1, b1=0.5, b2=0.5, eps=0.0, weight_decay=0.1)
    p = [jnp.array([1., 1.])]
    state = opt.init(p)
    u1, state = opt.update([jnp.array([3., 4.])], state, p)
    m1 = np.array([3., 4.]) / 5.0 + 0.1
    np.testing.assert_allclose(u1[0], -0.1 * m1, rtol=1e-6)
    u2, state = opt.update([jnp.array([0., 1.])], state, p)
    nu2 = 0.5 * 25.0 + 0.5 * 1.0
    m2 = 0.5 * m1 + np.array([0., 1.]) / np.sqrt(nu2) + 0.1
    np.testing.assert_allclose(u2[0], -0.1 * m2, rtol=1e-6)
    assert state[0].nu[0].shape == ()


# --------------------------------------------------------------------------
# Every optimizer of this file
# --------------------------------------------------------------------------

@pytest.mark.parametrize("name", NAMES)
def test_extra_args_ignored_and_inject_hyperparams(name):
    check_extra_args_ignored_and_inject_hyperparams(name)


@pytest.mark.parametrize("name", NAMES)
def test_float64_params_stay_float64(name):
    check_float64_params_stay_float64(name)
