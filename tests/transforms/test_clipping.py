"""functrain.transforms.clipping: clip, clip_by_global_norm and clip_by_block_rms by hand."""

import jax
import jax.numpy as jnp
import numpy as np

import functrain as ft
from helpers import FORMULA_GRADS, assert_updates, updates_of


def test_clip_by_hand():
    assert_updates(updates_of(ft.clip(0.5)), [np.clip(g, -0.5, 0.5) for g in FORMULA_GRADS])


def test_clip_by_global_norm_by_hand():
    tree = {"a": jnp.array([3.0, 0.0]), "b": [jnp.array(4.0)]}       # global norm 5
    tx = ft.clip_by_global_norm(2.0)
    u, _ = tx.update(tree, tx.init(tree))
    np.testing.assert_allclose(u["a"], [1.2, 0.0], rtol=1e-6)        # * 2 / 5
    np.testing.assert_allclose(u["b"][0], 1.6, rtol=1e-6)
    kept, _ = ft.clip_by_global_norm(5.5).update(tree, ())
    for x, y in zip(jax.tree_util.tree_leaves(kept), jax.tree_util.tree_leaves(tree)):
        np.testing.assert_array_equal(x, y)


def test_clip_by_global_norm_zero_max_norm_zero_grads():
    tx = ft.clip_by_global_norm(0.0)
    grads = {"a": jnp.zeros(3), "b": jnp.zeros(())}
    updates, _ = tx.update(grads, tx.init(grads))
    for u in jax.tree_util.tree_leaves(updates):
        np.testing.assert_array_equal(u, 0.0)


def test_clip_by_global_norm_zero_max_norm_nonzero_grads_gives_zeros():
    tx = ft.clip_by_global_norm(0.0)
    updates, _ = tx.update([jnp.array([3.0, 4.0])], tx.init([jnp.zeros(2)]))
    np.testing.assert_array_equal(updates[0], [0.0, 0.0])


def test_clip_by_block_rms_by_hand():
    ref = []
    for g in FORMULA_GRADS:
        ref.append(g / max(1.0, np.sqrt(np.mean(g * g)) / 0.5))
    assert_updates(updates_of(ft.clip_by_block_rms(0.5)), ref)
    small = [np.array([0.1, -0.1, 0.1, 0.0])]       # RMS under the threshold: unchanged
    assert_updates(updates_of(ft.clip_by_block_rms(0.5), small), small)
