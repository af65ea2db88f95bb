"""functrain.families.sign.optimizers: Lion by hand (numpy), and for each optimizer of the file: unknown update
keywords, inject_hyperparams, float64.

Every step against optax: tests/parity/test_optax_parity.py.
"""

import numpy as np
import pytest

import functrain as ft
from functrain.families.sign import optimizers as sign_based
from helpers import FORMULA_GRADS, FORMULA_P0, check_against_formula
from optimizer_checks import (check_extra_args_ignored_and_inject_hyperparams,
                              check_float64_params_stay_float64)
from registry import optimizer_names

NAMES = optimizer_names(sign_based)


def ref_lion(lr, b1, b2, wd):
    p, m, out = FORMULA_P0.copy(), np.zeros_like(FORMULA_P0), []
    for g in FORMULA_GRADS:
        u = np.sign((1 - b1) * g + b1 * m) + wd * p
        m = b2 * m + (1 - b2) * g
        p = p - lr * u
        out.append(p)
    return out


def test_against_hand_formula():
    check_against_formula(ft.lion(0.01), ref_lion(0.01, 0.9, 0.99, 1e-3))


# --------------------------------------------------------------------------
# Every optimizer of this file
# --------------------------------------------------------------------------

@pytest.mark.parametrize("name", NAMES)
def test_extra_args_ignored_and_inject_hyperparams(name):
    check_extra_args_ignored_and_inject_hyperparams(name)


@pytest.mark.parametrize("name", NAMES)
def test_float64_params_stay_float64(name):
    check_float64_params_stay_float64(name)
