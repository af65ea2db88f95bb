"""functrain.families.momentum.stages: trace, ema and scale_by_optimistic_gradient by hand."""

import jax.numpy as jnp
import numpy as np
import pytest

import functrain as ft
from helpers import FORMULA_GRADS, assert_updates, updates_of


@pytest.mark.parametrize("nesterov", [False, True])
def test_trace_by_hand(nesterov):
    t, ref = np.zeros(4), []
    for g in FORMULA_GRADS:
        t = g + 0.5 * t
        ref.append(g + 0.5 * t if nesterov else t)
    assert_updates(updates_of(ft.trace(0.5, nesterov=nesterov)), ref)


def test_trace_accumulator_dtype():
    state = ft.trace(0.9, accumulator_dtype=jnp.bfloat16).init({"w": jnp.ones(3)})
    assert state.trace["w"].dtype == jnp.bfloat16


@pytest.mark.parametrize("debias", [True, False])
def test_ema_by_hand(debias):
    m, ref = np.zeros(4), []
    for t, g in enumerate(FORMULA_GRADS, start=1):
        m = 0.8 * m + 0.2 * g
        ref.append(m / (1 - 0.8 ** t) if debias else m)
    ours = updates_of(ft.ema(0.8, debias=debias))
    assert_updates(ours, ref)
    if debias:  # the first debiased average is the first update itself
        np.testing.assert_allclose(ours[0], FORMULA_GRADS[0], rtol=1e-6)


def test_scale_by_optimistic_gradient_by_hand():
    alpha, beta = 0.5, 2.0
    prev, ref = FORMULA_GRADS[0], []  # the first step has no previous gradient: g itself
    for g in FORMULA_GRADS:
        ref.append((alpha + beta) * g - beta * prev)
        prev = g
    ours = updates_of(ft.scale_by_optimistic_gradient(alpha, beta))
    assert_updates(ours, ref)
    np.testing.assert_allclose(ours[0], alpha * FORMULA_GRADS[0], rtol=1e-6)
