"""Same inputs, same numbers as optax: 50 jitted steps, every step compared."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import functrain as ft
from conftest import make_grads, make_params

STEPS = 50


def trajectory(opt, apply_updates, params, grads):
    """Params after each of ``STEPS`` jitted steps (one compiled scan)."""

    @jax.jit
    def run(params, grads):
        def step(carry, g):
            p, s = carry
            u, s = opt.update(g, s, p)
            p = apply_updates(p, u)
            return (p, s), p

        return jax.lax.scan(step, (params, opt.init(params)), grads)[1]

    return run(params, grads)


def assert_same_trajectory(ours, theirs, rtol=2e-5, atol=1e-6):
    params = make_params()
    grads = make_grads(params, STEPS)
    a = trajectory(ours, ft.apply_updates, params, grads)
    b = trajectory(theirs, optax.apply_updates, params, grads)
    for (path, x), y in zip(jax.tree_util.tree_flatten_with_path(a)[0], jax.tree_util.tree_leaves(b)):
        assert x.dtype == y.dtype
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=rtol, atol=atol,
                                   err_msg=jax.tree_util.keystr(path))


def mask_fn(params):
    return jax.tree_util.tree_map(lambda p: p.ndim > 1, params)


CASES = {
    "sgd": lambda m: m.sgd(1e-3),
    "sgd_momentum": lambda m: m.sgd(1e-3, momentum=0.9),
    "sgd_nesterov": lambda m: m.sgd(1e-3, momentum=0.5, nesterov=True),
    "adam": lambda m: m.adam(1e-2),
    "adam_settings": lambda m: m.adam(3e-3, b1=0.8, b2=0.99, eps=1e-6, eps_root=1e-8),
    "adam_nesterov": lambda m: m.adam(1e-2, nesterov=True),
    "adamw": lambda m: m.adamw(1e-2),
    "adamw_masked": lambda m: m.adamw(1e-2, weight_decay=0.1, mask=mask_fn),
    "adamw_nesterov": lambda m: m.adamw(1e-2, b1=0.7, weight_decay=0.05, nesterov=True),
    "lamb": lambda m: m.lamb(1e-2),
    "lamb_decay": lambda m: m.lamb(1e-2, b1=0.8, eps=1e-8, weight_decay=0.01),
    "lamb_masked": lambda m: m.lamb(1e-2, weight_decay=0.1, mask=mask_fn),
    "lars": lambda m: m.lars(0.1),
    "lars_settings": lambda m: m.lars(0.5, weight_decay=1e-3, trust_coefficient=0.01,
                                      eps=1e-6, momentum=0.8, nesterov=True),
    "lars_masks": lambda m: m.lars(0.5, weight_decay=1e-2, weight_decay_mask=mask_fn,
                                   trust_ratio_mask=mask_fn),
    "rmsprop": lambda m: m.rmsprop(1e-3),
    "rmsprop_centered": lambda m: m.rmsprop(1e-3, decay=0.8, centered=True, momentum=0.9,
                                            initial_scale=0.5),
    "rmsprop_bias": lambda m: m.rmsprop(1e-3, eps_in_sqrt=False, bias_correction=True,
                                        momentum=0.5, nesterov=True),
    "adagrad": lambda m: m.adagrad(1e-2),
    "adagrad_settings": lambda m: m.adagrad(0.1, initial_accumulator_value=0.5, eps=1e-5),
    "lion": lambda m: m.lion(1e-3),
    "lion_settings": lambda m: m.lion(1e-4, b1=0.8, b2=0.9, weight_decay=0.1, mask=mask_fn),
    "clip_lamb_schedule": lambda m: m.chain(
        m.clip_by_global_norm(1.0),
        m.lamb((ft if m is ft else optax).warmup_cosine_decay_schedule(
            0.0, 1e-2, 10, 50, end_value=1e-4))),
    "clip_adam_schedule": lambda m: m.chain(
        m.clip(2.0), m.adam((ft if m is ft else optax).exponential_decay(1e-2, 5, 0.9))),
    "clip_sgd": lambda m: m.chain(m.clip_by_global_norm(10.0), m.sgd(1e-3, momentum=0.9)),
    "decay_schedule": lambda m: m.chain(
        m.scale_by_adam(), m.add_decayed_weights(lambda c: 1e-2 / (1.0 + c), mask=mask_fn),
        m.scale(-1e-2)),
    "building_blocks": lambda m: m.chain(
        m.scale_by_adam(), m.add_decayed_weights(1e-3), m.scale_by_trust_ratio(),
        m.trace(0.5), m.scale_by_schedule(lambda c: 1e-3 / (1 + c)), m.scale(-1.0)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_matches_optax(name):
    assert_same_trajectory(CASES[name](ft), CASES[name](optax))


def test_optax_inside_functrain_chain_and_back():
    """functrain stages and optax transforms compose in both libraries' chain."""
    mixed_ours = ft.chain(optax.clip_by_global_norm(1.0), ft.adam(1e-2))
    mixed_theirs = optax.chain(ft.clip_by_global_norm(1.0), optax.adam(1e-2))
    reference = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(1e-2))
    assert_same_trajectory(mixed_ours, reference)
    params = make_params()
    grads = make_grads(params, STEPS)
    a = trajectory(mixed_theirs, optax.apply_updates, params, grads)
    b = trajectory(reference, optax.apply_updates, params, grads)
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
        np.testing.assert_allclose(x, y, rtol=2e-5, atol=1e-6)


TRUST_RATIO_CASES = ["lamb", "lamb_decay", "lamb_masked", "lars", "lars_settings", "lars_masks",
                     "clip_lamb_schedule"]


@pytest.mark.parametrize("name", TRUST_RATIO_CASES)
def test_trust_ratio_recompute_matches_optax(name, monkeypatch):
    """The engine's trust-ratio recompute, forced on for these small trees, keeps optax's numbers."""
    from functrain.transforms import engine, recompute
    monkeypatch.setattr(recompute, "MIN_BYTES", 0)
    assert_same_trajectory(CASES[name](ft), CASES[name](optax))
