"""functrain.families.layerwise.stages: trust ratio, NovoGrad's moment, param-block scales, DoG."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import functrain as ft
from helpers import (FORMULA_GRADS, FORMULA_P0, assert_same_trajectory, assert_updates,
                     make_grads, make_params, updates_of)


@pytest.mark.parametrize("kwargs", [
    dict(),
    dict(trust_coefficient=0.5, eps=0.1),
    dict(min_norm=5.0),
    dict(max_trust_ratio=0.9),
], ids=["default", "coefficient_eps", "min_norm", "max_trust_ratio"])
def test_scale_by_trust_ratio_by_hand(kwargs):
    tc, eps = kwargs.get("trust_coefficient", 1.0), kwargs.get("eps", 0.0)
    floor, cap = kwargs.get("min_norm", 0.0), kwargs.get("max_trust_ratio", np.inf)
    ref = []
    for g in FORMULA_GRADS:
        pn, un = max(np.linalg.norm(FORMULA_P0), floor), max(np.linalg.norm(g), floor)
        ref.append(g * min(tc * pn / (un + eps), cap))
    assert_updates(updates_of(ft.scale_by_trust_ratio(**kwargs)), ref)


@pytest.mark.parametrize("make", [lambda: ft.lamb(0.1), lambda: ft.lars(0.1),
                                  lambda: ft.scale_by_trust_ratio()])
def test_trust_ratio_with_zero_params_or_zero_updates_is_one(make):
    opt = make()
    params = {"zero_p": jnp.zeros(3), "zero_g": jnp.ones(3)}
    grads = {"zero_p": jnp.array([1.0, -2.0, 0.5]), "zero_g": jnp.zeros(3)}
    updates, _ = opt.update(grads, opt.init(params), params)
    leaves = jax.tree_util.tree_leaves(updates)
    assert all(bool(jnp.all(jnp.isfinite(u))) for u in leaves)
    # Ratio 1: the update of the zero-param leaf is the un-adapted one.
    plain = ft.scale_by_trust_ratio().update(grads, (), params)[0]
    np.testing.assert_allclose(plain["zero_p"], grads["zero_p"])
    np.testing.assert_array_equal(updates["zero_g"], 0.0)


def test_trust_ratio_is_per_leaf_and_mask_leaves_pass_through():
    params = {"a": jnp.array([3.0, 4.0]), "b": jnp.array([6.0, 8.0])}
    grads = {"a": jnp.array([0.0, 1.0]), "b": jnp.array([0.0, 1.0])}
    tx = ft.scale_by_trust_ratio(mask={"a": True, "b": False})
    u, _ = tx.update(grads, tx.init(params), params)
    np.testing.assert_allclose(u["a"], [0.0, 5.0])   # ||a|| / ||g|| = 5
    np.testing.assert_array_equal(u["b"], [0.0, 1.0])
    u, _ = ft.scale_by_trust_ratio().update(grads, (), params)
    np.testing.assert_allclose(u["b"], [0.0, 10.0])  # its own leaf's norm, not the tree's


def test_scale_by_novograd_by_hand():
    b1, b2, eps, wd = 0.5, 0.8, 1e-6, 0.1
    mu, nu, ref = np.zeros(4), 0.0, []
    for t, g in enumerate(FORMULA_GRADS):
        sq = np.sum(g * g)
        nu = sq if t == 0 else b2 * nu + (1 - b2) * sq
        step = g / (np.sqrt(nu) + eps) + wd * FORMULA_P0
        mu = step if t == 0 else b1 * mu + step
        ref.append(mu)
    tx = ft.scale_by_novograd(b1, b2, eps, weight_decay=wd)
    assert_updates(updates_of(tx), ref)
    assert tx.init(jnp.zeros(4)).nu.shape == ()  # one second moment per leaf


def test_shape_check_still_applies_to_params_shaped_fields():
    opt = ft.novograd(0.1)
    state = opt.init([jnp.zeros(3)])
    with pytest.raises(ValueError, match=r"\(3,\)"):
        opt.update([jnp.zeros(4)], state, [jnp.zeros(4)])


def test_scale_by_param_block_rms_and_norm_by_hand():
    rms = np.sqrt(np.mean(FORMULA_P0 ** 2))
    assert_updates(updates_of(ft.scale_by_param_block_rms(1e-3)),
                   [g * rms for g in FORMULA_GRADS])
    assert_updates(updates_of(ft.scale_by_param_block_norm(1e-3)),
                   [g * np.linalg.norm(FORMULA_P0) for g in FORMULA_GRADS])
    # Zero parameters: the floor min_scale.
    for tx in (ft.scale_by_param_block_rms(0.25), ft.scale_by_param_block_norm(0.25)):
        u, _ = tx.update([jnp.ones(2)], (), [jnp.zeros(2)])
        np.testing.assert_allclose(u[0], [0.25, 0.25])


# --------------------------------------------------------------------------
# Distance over gradients (against optax, and by hand)
# --------------------------------------------------------------------------

DOG_CASES = {
    "dog": lambda m: m.chain(m.scale_by_distance_over_gradients(), m.scale(-1.0)),
    "dog_settings": lambda m: m.chain(
        m.scale_by_distance_over_gradients(reps_rel=1e-4, eps=1e-6, global_scale=-0.5),
        m.trace(0.5)),
}


@pytest.mark.parametrize("name", sorted(DOG_CASES))
def test_distance_over_gradients_matches_optax_every_step(name):
    params = make_params(scalar=False)  # optax turns a scalar leaf's update into shape (1,)
    assert_same_trajectory(DOG_CASES[name](ft), DOG_CASES[name](optax), params=params,
                           grads=make_grads(params, 40), name=name)


def test_distance_over_gradients_by_hand():
    """r = max(r, ||p - p0||) from r_0 = reps (1 + ||p0||); G += ||g||^2;
    u = scale * r * g / sqrt(G + eps)."""
    reps, eps, scale = 1e-3, 1e-8, -1.0
    p0 = FORMULA_P0.astype(np.float32).astype(np.float64)
    r, G = reps * (1 + np.linalg.norm(p0)), 0.0
    tx = ft.scale_by_distance_over_gradients(reps_rel=reps, eps=eps, global_scale=scale)
    p = jnp.asarray(p0, jnp.float32)
    state = tx.init(p)
    for g in FORMULA_GRADS:
        # the distance is taken from the params given to update (float32 here)
        r, G = max(r, np.linalg.norm(np.asarray(p, np.float64) - p0)), G + np.sum(g * g)
        u, state = tx.update(jnp.asarray(g, jnp.float32), state, p)
        np.testing.assert_allclose(u, scale * r / np.sqrt(G + eps) * g, rtol=2e-6)
        p = p + u
    assert state.grad_sum_of_squares.shape == (1,) and state.max_dist.shape == ()


def test_distance_over_gradients_state_scalar_leaf_and_errors():
    params = {"w": jnp.ones((2, 3)), "s": jnp.asarray(2.0)}
    ours = ft.scale_by_distance_over_gradients().init(params)
    theirs = optax.scale_by_distance_over_gradients().init(params)
    for a, b in zip(jax.tree_util.tree_leaves(ours), jax.tree_util.tree_leaves(theirs)):
        assert a.shape == b.shape and a.dtype == b.dtype
        np.testing.assert_allclose(a, b)
    assert type(ours).__name__ == "ScaleByDistanceOverGradientsState"
    tx = ft.scale_by_distance_over_gradients()
    u, _ = tx.update(params, ours, params)
    assert u["s"].shape == ()                          # a scalar leaf keeps its shape
    with pytest.raises(ValueError, match="scale_by_distance_over_gradients needs the current"):
        tx.update(params, ours)
    complex_params = {"z": jnp.ones(2, jnp.complex64)}
    with pytest.raises(TypeError, match=r"\['z'\].*complex"):
        tx.init(complex_params)
    with pytest.raises(ValueError, match="scale_by_distance_over_gradients: reps_rel must be"):
        ft.scale_by_distance_over_gradients(reps_rel=-1.0)
