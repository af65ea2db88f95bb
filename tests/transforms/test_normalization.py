"""functrain.transforms.normalization: centralize, normalize_by_update_norm, scale_gradient.

Against optax (40 jitted steps, complex leaves too) and by hand (numpy).
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import functrain as ft
from helpers import (FORMULA_GRADS, assert_same_trajectory, assert_updates, make_grads,
                     make_params, updates_of)

CASES = {
    "centralize": lambda m: m.chain(m.centralize(), m.sgd(1e-3, momentum=0.5)),
    "normalize": lambda m: m.normalize_by_update_norm(scale_factor=-1e-2),
    "normalize_settings": lambda m: m.chain(
        m.normalize_by_update_norm(scale_factor=-0.1, eps=1e-3), m.trace(0.5)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_matches_optax_every_step(name):
    params = make_params()
    assert_same_trajectory(CASES[name](ft), CASES[name](optax), params=params,
                           grads=make_grads(params, 40), name=name)


@pytest.mark.parametrize("name", sorted(CASES))
def test_complex_matches_optax(name):
    rng = np.random.default_rng(3)
    params = {"w": jnp.asarray(rng.standard_normal((3, 4)) + 1j * rng.standard_normal((3, 4)),
                               jnp.complex64),
              "b": jnp.asarray(rng.standard_normal(4) - 2j, jnp.complex64)}
    grads = jax.tree_util.tree_map(
        lambda p: jnp.stack([p * (k - 1.5) + 0.5j for k in range(4)]), params)
    assert_same_trajectory(CASES[name](ft), CASES[name](optax), params=params, grads=grads,
                           name=f"complex {name}")


def test_centralize_by_hand():
    g = np.arange(24.0).reshape(2, 3, 4) ** 2
    tree = {"t": jnp.asarray(g, jnp.float32), "v": jnp.array([1.0, 5.0]), "s": jnp.array(2.0)}
    tx = ft.centralize()
    u, state = tx.update(tree, tx.init(tree))
    np.testing.assert_allclose(u["t"], g - g.mean(axis=(1, 2), keepdims=True), atol=1e-4)
    np.testing.assert_array_equal(u["v"], [1.0, 5.0])        # rank 1 and 0: unchanged
    np.testing.assert_array_equal(u["s"], 2.0)
    assert state == ft.EmptyState()


def test_normalize_by_update_norm_by_hand():
    scale, eps = -0.3, 1e-2
    ref = [g * scale / (np.linalg.norm(g) + eps) for g in FORMULA_GRADS]
    assert_updates(updates_of(ft.normalize_by_update_norm(scale, eps), params=None), ref)
    tx = ft.normalize_by_update_norm()            # zero updates stay zero (eps > 0)
    u, _ = tx.update({"a": jnp.zeros(3)}, tx.init({"a": jnp.zeros(3)}))
    np.testing.assert_array_equal(u["a"], 0.0)
    with pytest.raises(ValueError, match="normalize_by_update_norm: eps must be >= 0.0"):
        ft.normalize_by_update_norm(eps=-1.0)
    with pytest.raises(TypeError, match="normalize_by_update_norm: scale_factor must be a real"):
        ft.normalize_by_update_norm(scale_factor="1")


# --------------------------------------------------------------------------
# scale_gradient
# --------------------------------------------------------------------------

def loss_with(scale_gradient, scale):
    def loss(tree):
        scaled = scale_gradient(tree, scale)
        return jnp.sum(scaled["a"] ** 2) + jnp.sum(jnp.sin(scaled["b"]))
    return loss


@pytest.mark.parametrize("scale", [0.0, 1.0, 0.5, -2.0])
def test_scale_gradient_matches_optax(scale):
    tree = {"a": jnp.array([1.0, -2.0]), "b": jnp.array(0.3)}
    ours_value, ours = jax.value_and_grad(loss_with(ft.scale_gradient, scale))(tree)
    theirs_value, theirs = jax.value_and_grad(loss_with(optax.scale_gradient, scale))(tree)
    plain = jax.grad(loss_with(lambda t, s: t, None))(tree)
    assert float(ours_value) == float(theirs_value)      # the identity going forward
    for a, b, c in zip(*map(jax.tree_util.tree_leaves, (ours, theirs, plain))):
        np.testing.assert_allclose(a, b, rtol=1e-6)
        np.testing.assert_allclose(a, scale * np.asarray(c), rtol=1e-6)


def test_scale_gradient_traced_scale_and_dtypes():
    """A traced scale works (optax's needs a concrete one); the cotangent keeps its dtype."""
    x = jnp.array([1.0, 2.0], jnp.bfloat16)

    @jax.jit
    def grad_at(scale):
        return jax.grad(lambda v: jnp.sum(ft.scale_gradient(v, scale).astype(jnp.float32) ** 2))(x)

    g = grad_at(jnp.float32(-3.0))
    assert g.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(g, np.float32), [-6.0, -12.0])
    assert ft.scale_gradient(x, 1.0) is x
