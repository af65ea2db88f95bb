"""functrain.families.momentum.optimizers: by hand (numpy), convergence, and for each optimizer of the file: unknown update
keywords, inject_hyperparams, float64.

Every step against optax: tests/parity/test_optax_parity.py.
"""

import jax.numpy as jnp
import numpy as np
import pytest

import functrain as ft
from functrain.families.momentum import optimizers as momentum
from helpers import FORMULA_GRADS, FORMULA_P0, check_against_formula
from optimizer_checks import (assert_reaches_rosenbrock_minimum,
                              check_extra_args_ignored_and_inject_hyperparams,
                              check_float64_params_stay_float64)
from registry import optimizer_names

NAMES = [n for n in optimizer_names(momentum) if not n.startswith("optimistic")]


def ref_sgd(lr, momentum=0.0, nesterov=False):
    p, t, out = FORMULA_P0.copy(), np.zeros_like(FORMULA_P0), []
    for g in FORMULA_GRADS:
        t = g + momentum * t
        p = p - lr * ((g + momentum * t) if nesterov else t)
        out.append(p)
    return out


@pytest.mark.parametrize("opt,reference", [
    (ft.sgd(0.1), ref_sgd(0.1)),
    (ft.sgd(0.1, momentum=0.9), ref_sgd(0.1, 0.9)),
    (ft.sgd(0.1, momentum=0.9, nesterov=True), ref_sgd(0.1, 0.9, True)),
], ids=["sgd", "momentum", "nesterov"])
def test_against_hand_formula(opt, reference):
    check_against_formula(opt, reference)


def test_polyak_needs_value():
    opt = ft.polyak_sgd()
    with pytest.raises(ValueError, match="value="):
        opt.update([jnp.ones(1)], opt.init([jnp.ones(1)]), [jnp.ones(1)])


@pytest.mark.parametrize("opt", [ft.sgd(1e-3, momentum=0.9)], ids=["sgd_momentum"])
def test_reaches_the_minimum(opt):
    assert_reaches_rosenbrock_minimum(opt)


# --------------------------------------------------------------------------
# Every optimizer of this file
# --------------------------------------------------------------------------

@pytest.mark.parametrize("name", NAMES)
def test_extra_args_ignored_and_inject_hyperparams(name):
    check_extra_args_ignored_and_inject_hyperparams(name)


@pytest.mark.parametrize("name", NAMES)
def test_float64_params_stay_float64(name):
    check_float64_params_stay_float64(name)
