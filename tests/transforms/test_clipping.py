"""functrain.transforms.clipping: by hand, and the unit-wise and per-example clips against optax."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import functrain as ft
from helpers import (FORMULA_GRADS, assert_same_trajectory, assert_updates, make_grads,
                     make_params, matrices_only, updates_of)


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


# --------------------------------------------------------------------------
# Unit-wise norms and adaptive gradient clipping (against optax and by hand)
# --------------------------------------------------------------------------

RNG = np.random.default_rng(7)


def complex_or_real(shape, complex_):
    x = RNG.standard_normal(shape)
    if complex_:
        x = x + 1j * RNG.standard_normal(shape)
    return jnp.asarray(x, jnp.complex64 if complex_ else jnp.float32)


@pytest.mark.parametrize("complex_", [False, True], ids=["real", "complex"])
@pytest.mark.parametrize("shape,axis", [
    ((), None), ((5,), None), ((1, 4), None), ((3, 1, 1), None), ((4, 3), None),
    ((2, 3, 4), None), ((2, 2, 3, 4), None), ((2, 2, 2, 3, 2), None), ((4, 3), 1),
    ((2, 3, 4), (0, 2)), ((1, 1, 2, 1, 1, 1, 3), 6)])
def test_unitwise_norm_matches_optax(shape, axis, complex_):
    x = complex_or_real(shape, complex_)
    ours = ft.unitwise_norm(x, axis=axis)
    theirs = optax.transforms.unitwise_norm(x, axis=axis)
    assert ours.shape == x.shape and ours.dtype == theirs.dtype
    np.testing.assert_allclose(ours, theirs, rtol=1e-6)


def test_unitwise_norm_by_hand_and_rank_6_error():
    w = np.arange(12.0).reshape(4, 3)                      # a linear kernel: norms per column
    np.testing.assert_allclose(ft.unitwise_norm(jnp.asarray(w, jnp.float32)),
                               np.broadcast_to(np.linalg.norm(w, axis=0), (4, 3)), rtol=1e-6)
    with pytest.raises(ValueError, match=r"no default unit axes.*\(2, 2, 2, 2, 2, 2\)"):
        ft.unitwise_norm(jnp.ones((2,) * 6))


def test_unitwise_clip_by_hand_and_shape_errors():
    g = jnp.array([3.0, 4.0, 1.0])
    g_norm = jnp.array([5.0, 5.0, 1.0])
    max_norm = jnp.array([1.0, 10.0, 0.5])
    # kept where g_norm < max_norm, else g * max_norm / g_norm
    np.testing.assert_allclose(ft.unitwise_clip(g_norm, max_norm, g), [0.6, 4.0, 0.5], rtol=1e-6)
    np.testing.assert_allclose(ft.unitwise_clip(jnp.zeros(3), jnp.zeros(3), g, div_eps=0.5),
                               [0.0, 0.0, 0.0])
    with pytest.raises(ValueError, match=r"unitwise_clip: max_norm has shape \(2,\)"):
        ft.unitwise_clip(g_norm, jnp.ones(2), g)


AGC_CASES = {
    "default": (lambda m: m.chain(m.adaptive_grad_clip(0.1), m.sgd(1e-2)), True),
    "eps_axis": (lambda m: m.chain(m.adaptive_grad_clip(0.05, eps=1e-2, axis=0),
                                   m.adam(1e-2)), False),
    "masked": (lambda m: m.chain(m.masked(m.adaptive_grad_clip(0.05), matrices_only),
                                 m.adam(1e-2)), True),
}


@pytest.mark.parametrize("name", sorted(AGC_CASES))
def test_adaptive_grad_clip_matches_optax_every_step(name):
    make, scalar = AGC_CASES[name]
    params = make_params(scalar=scalar)
    assert_same_trajectory(make(ft), make(optax), params=params, grads=make_grads(params, 40),
                           name=name)


def test_adaptive_grad_clip_complex_matches_optax():
    params = {"w": complex_or_real((4, 3), True), "b": complex_or_real((3,), True)}
    grads = [jax.tree_util.tree_map(lambda p: p * (3.0 * k - 4.0) + 0.1j, params)
             for k in range(3)]
    ours, theirs = ft.adaptive_grad_clip(0.2), optax.adaptive_grad_clip(0.2)
    s1, s2 = ours.init(params), theirs.init(params)
    for g in grads:
        u1, s1 = ours.update(g, s1, params)
        u2, s2 = theirs.update(g, s2, params)
        for a, b in zip(jax.tree_util.tree_leaves(u1), jax.tree_util.tree_leaves(u2)):
            assert a.dtype == jnp.complex64
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def test_adaptive_grad_clip_by_hand():
    """A vector is one unit: clipped to clipping * max(||p||, eps) when larger."""
    tx = ft.adaptive_grad_clip(0.5, eps=2.0)
    params = {"small": jnp.array([0.3, 0.4]), "big": jnp.array([3.0, 4.0])}
    grads = {"small": jnp.array([3.0, 4.0]), "big": jnp.array([0.3, 0.4])}
    u, state = tx.update(grads, tx.init(params), params)
    np.testing.assert_allclose(u["small"], [0.6, 0.8], rtol=1e-6)   # norm 5 -> 0.5 * max(.5, 2)
    np.testing.assert_allclose(u["big"], [0.3, 0.4], rtol=1e-6)     # norm .5 < 0.5 * 5: kept
    assert state == ft.AdaptiveGradClipState() == ft.EmptyState()


def test_adaptive_grad_clip_errors_name_the_leaf_or_argument():
    tx = ft.adaptive_grad_clip(0.1)
    params = {"ok": jnp.ones(3), "deep": jnp.ones((2,) * 6)}
    with pytest.raises(ValueError, match=r"adaptive_grad_clip: updates leaf \['deep'\] has shape"):
        tx.update(params, tx.init(params), params)
    with pytest.raises(ValueError, match="adaptive_grad_clip needs the current parameters"):
        tx.update({"ok": jnp.ones(3)}, tx.init({"ok": jnp.ones(3)}))
    with pytest.raises(ValueError, match="adaptive_grad_clip: clipping must be >= 0.0"):
        ft.adaptive_grad_clip(-1.0)
    # With axis given, the rank-6 leaf is fine.
    deep = {"deep": params["deep"]}
    tx6 = ft.adaptive_grad_clip(0.1, axis=(0, 1))
    assert tx6.update(deep, tx6.init(deep), deep)[0]["deep"].shape == (2,) * 6


# --------------------------------------------------------------------------
# Per-example clipping (against optax and by hand)
# --------------------------------------------------------------------------

def per_example_grads(complex_=False, batch=6):
    tree = {"w": complex_or_real((batch, 4, 3), complex_), "b": complex_or_real((batch, 3),
                                                                                 complex_),
            "s": [complex_or_real((batch,), complex_)]}
    return jax.tree_util.tree_map(lambda x: x * jnp.arange(1.0, batch + 1.0).reshape(
        (batch,) + (1,) * (x.ndim - 1)), tree)    # examples of growing norms


def assert_trees_close(ours, theirs):
    assert jax.tree_util.tree_structure(ours) == jax.tree_util.tree_structure(theirs)
    for a, b in zip(jax.tree_util.tree_leaves(ours), jax.tree_util.tree_leaves(theirs)):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_allclose(a, b, rtol=2e-6, atol=1e-6)


@pytest.mark.parametrize("complex_", [False, True], ids=["real", "complex"])
@pytest.mark.parametrize("clip_norm", [0.0, 3.0, 8.0, 1e3, np.inf])
def test_per_example_global_norm_clip_matches_optax(clip_norm, complex_):
    grads = per_example_grads(complex_)
    assert_trees_close(ft.per_example_global_norm_clip(grads, clip_norm),
                       optax.per_example_global_norm_clip(grads, clip_norm))


@pytest.mark.parametrize("uniform", [True, False])
@pytest.mark.parametrize("clip_norm", [0.0, 5.0, 20.0])
def test_per_example_layer_norm_clip_matches_optax(clip_norm, uniform):
    grads = per_example_grads()
    assert_trees_close(ft.per_example_layer_norm_clip(grads, clip_norm, uniform),
                       optax.per_example_layer_norm_clip(grads, clip_norm, uniform))


def test_per_example_clips_by_hand():
    grads = [jnp.array([[0, 0, 0], [0, 3, 4], [4, 0, 3], [3, 4, 0]])]   # integer inputs
    summed, clipped = ft.per_example_global_norm_clip(grads, 1.25)       # norms 0, 5, 5, 5
    np.testing.assert_allclose(summed[0], [1.75, 1.75, 1.75])
    assert int(clipped) == 3 and summed[0].dtype == jnp.float32
    tree = {"a": jnp.array([[3.0, 4.0]]), "b": jnp.array([[0.0, 0.0, 0.0, 0.0, 0.0, 0.0]])}
    # non-uniform: C_a = 10 sqrt(2/8) = 5 keeps a; uniform: C_a = 10 / sqrt(2) > 5 keeps it too
    for uniform in (False, True):
        summed, counts = ft.per_example_layer_norm_clip(tree, 10.0, uniform)
        np.testing.assert_allclose(summed["a"], [3.0, 4.0], rtol=1e-6)
        assert int(counts["a"]) == 0 and int(counts["b"]) == 0
    summed, counts = ft.per_example_layer_norm_clip(tree, 4.0, uniform=False)   # C_a = 2
    np.testing.assert_allclose(summed["a"], [1.2, 1.6], rtol=1e-6)
    assert int(counts["a"]) == 1


@pytest.mark.parametrize("fn", [ft.per_example_global_norm_clip, ft.per_example_layer_norm_clip])
def test_per_example_clips_name_the_leaf_without_the_batch_axis(fn):
    grads = {"a": jnp.ones((4, 2)), "b": jnp.ones((3, 2)), "c": jnp.ones(())}
    with pytest.raises(ValueError, match=r"\['b'\] has shape \(3, 2\)"):
        fn(grads, 1.0)
    with pytest.raises(ValueError, match=r"\['c'\] has shape \(\)"):
        fn({"a": jnp.ones((4, 2)), "c": jnp.ones(())}, 1.0)
    with pytest.raises(ValueError, match="must be >= 0.0"):
        fn({"a": jnp.ones((4, 2))}, -1.0)


def test_clip_by_block_rms_matches_optax_including_complex():
    """clip_by_block_rms behaves as optax's (|g|**2 for complex): kept unchanged."""
    for complex_ in (False, True):
        g = [complex_or_real((4, 3), complex_) * 3.0, complex_or_real((5,), complex_) * 0.1]
        ours, _ = ft.clip_by_block_rms(0.5).update(g, ft.EmptyState())
        theirs, _ = optax.clip_by_block_rms(0.5).update(g, optax.EmptyState())
        assert_trees_close(ours, theirs)
