"""functrain.families.sign.stages: scale_by_sign, scale_by_lion and scale_by_rprop by hand."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import functrain as ft
from helpers import FORMULA_GRADS, assert_updates, updates_of


def test_scale_by_sign_by_hand():
    assert_updates(updates_of(ft.scale_by_sign()), [np.sign(g) for g in FORMULA_GRADS])


@pytest.mark.parametrize("mode,shape", [
    ("hard", np.sign),
    ("smooth", lambda x: np.tanh(2.0 * x)),
    ("refined", lambda x: np.where(np.abs(x) < 1.0, x, np.sign(x))),
])
def test_scale_by_lion_by_hand(mode, shape):
    b1, b2 = 0.8, 0.9
    mu, ref = np.zeros(4), []
    for g in FORMULA_GRADS:
        ref.append(shape((1 - b1) * g + b1 * mu))
        mu = b2 * mu + (1 - b2) * g
    tx = ft.scale_by_lion(b1, b2, mode=mode, smooth_beta=2.0)
    assert_updates(updates_of(tx), ref)


def test_scale_by_rprop_by_hand():
    """The step grows where the sign held, shrinks (and skips) where it flipped, one step late."""
    lr, minus, plus, lo, hi = 0.1, 0.5, 1.2, 0.04, 0.11
    grads = FORMULA_GRADS + [np.array([1.0, 1.0, -1.0, -0.5])]
    steps, prev, ref = np.full(4, lr), np.zeros(4), []
    for g in grads:
        signed = np.zeros(4)
        update = np.zeros(4)
        for i in range(4):
            agree = g[i] * prev[i]
            if agree > 0:
                steps[i] = min(max(steps[i] * plus, lo), hi)
            elif agree < 0:
                steps[i] = min(max(steps[i] * minus, lo), hi)
            if agree < 0:               # flipped: no step now, and none remembered
                signed[i], update[i] = 0.0, 0.0
            else:
                signed[i], update[i] = steps[i] * np.sign(g[i]), prev[i]
        ref.append(update)
        prev = signed
    tx = ft.scale_by_rprop(lr, eta_minus=minus, eta_plus=plus, min_step_size=lo,
                           max_step_size=hi)
    ours = updates_of(tx, grads)
    assert_updates(ours, ref)
    np.testing.assert_array_equal(ours[0], 0.0)  # the first update is always zero
    assert any(np.any(u != 0) for u in ours[1:])



def test_scale_by_lion_invalid_mode_raises_in_update_as_optax():
    """optax's test_lion_invalid_mode_raises: build and init pass, update raises ValueError
    (functrain's names the allowed modes) when traced, before any array math."""
    updates = jnp.array([0.1, -0.2])
    for lib in (ft, optax):
        tx = lib.scale_by_lion(mode="invalid_mode")
        with pytest.raises(ValueError):
            tx.update(updates, tx.init(updates))
    tx = ft.scale_by_lion(mode="invalid_mode")
    with pytest.raises(ValueError, match="mode must be 'hard', 'smooth' or 'refined', got "
                                         "'invalid_mode'"):
        jax.eval_shape(tx.update, updates, tx.init(updates))
