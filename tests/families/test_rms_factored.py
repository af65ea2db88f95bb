"""functrain.families.rms.factored: Adafactor's factored second moments by hand."""

import jax.numpy as jnp
import numpy as np

import functrain as ft
from functrain.families.rms.factored import decay_rate_pow


def test_decay_rate_pow_by_hand():
    for i in (0, 1, 5, 99):
        np.testing.assert_allclose(decay_rate_pow(i), 1.0 - (i + 1) ** -0.8, rtol=1e-6)
        np.testing.assert_allclose(decay_rate_pow(jnp.asarray(i), 0.5), 1.0 - (i + 1) ** -0.5,
                                   rtol=1e-6)
    assert decay_rate_pow(0).dtype == jnp.float32


def test_adafactor_factored_by_hand():
    g = jnp.array([[1., 2., 3.], [4., 5., 6.]])
    opt = ft.scale_by_factored_rms(min_dim_size_to_factor=2, decay_rate=0.8, epsilon=0.0)
    u, state = opt.update([g], opt.init([jnp.zeros((2, 3))]))
    # Step 0: decay 1 - 1**-0.8 = 0, so the averages are this step's g**2 means.
    row = np.mean(np.asarray(g) ** 2, axis=1)      # largest axis (1) removed
    col = np.mean(np.asarray(g) ** 2, axis=0)
    expected = np.asarray(g) / np.sqrt(np.outer(row / row.mean(), col))
    np.testing.assert_allclose(u[0], expected, rtol=1e-6)
    assert state.v_row[0].shape == (2,) and state.v_col[0].shape == (3,)
    assert state.v[0].shape == (1,)


def test_adafactor_unfactored_small_leaves_by_hand():
    """Leaves below min_dim_size_to_factor keep a full second moment: g / sqrt(v)."""
    g = jnp.array([2.0, -1.0, 0.5])
    opt = ft.scale_by_factored_rms(min_dim_size_to_factor=128, epsilon=1e-30)
    state = opt.init([jnp.zeros(3)])
    u, state = opt.update([g], state)
    # decay 0 at step 0: v = g**2 (+ eps), so the update is sign(g)
    np.testing.assert_allclose(u[0], np.sign(np.asarray(g)), rtol=1e-6)
    assert state.v[0].shape == (3,)
    u, state = opt.update([2 * g], state)
    decay = 1.0 - 2.0 ** -0.8
    v = decay * np.asarray(g) ** 2 + (1 - decay) * (2 * np.asarray(g)) ** 2
    np.testing.assert_allclose(u[0], 2 * np.asarray(g) / np.sqrt(v), rtol=1e-5)
