"""Same inputs, same numbers as optax: every trajectory compared at every one of 50 jitted steps.

* Every setting of every core optimizer declared in ``tests/registry.py`` (which
  ``tests/test_registry.py`` checks against the package: none is missing).
* Combinations of building blocks, schedules and clipping.
* The wrappers and per-leaf transforms (``WRAPPER_CASES``).
* The trust-ratio recompute forced on for small trees.
* optax interop: functrain transforms in ``optax.chain`` and optax's wrappers,
  optax transforms in ``functrain.chain`` and functrain's wrappers.

The helpers (``trajectory``, ``assert_same_trajectory``) are in ``tests/helpers.py``.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import functrain as ft
from functrain.engine import recompute
import registry
from helpers import assert_same_trajectory, make_grads, make_params, matrices_only


def schedules(m):
    """The schedules module that goes with ``m`` (functrain or optax)."""
    return ft if m is ft else optax


# --------------------------------------------------------------------------
# Named optimizers (every setting of every core record in tests/registry.py)
# --------------------------------------------------------------------------

CORE_SETTINGS = registry.settings(contrib=False)


@pytest.mark.parametrize("label", sorted(CORE_SETTINGS))
def test_matches_optax(label):
    record, setting = CORE_SETTINGS[label]
    assert record.reference == f"optax.{record.name}", record.reference
    scalar = "scalar_leaf" not in setting.skip
    assert_same_trajectory(record.make(ft, **setting.kwargs), record.make(optax, **setting.kwargs),
                           params=make_params(scalar), name=label,
                           with_value=record.extra is not None)


# --------------------------------------------------------------------------
# Combinations of building blocks, schedules and clipping
# --------------------------------------------------------------------------

# name -> constructor of a module m (functrain or optax)
COMBINATION_CASES = {
    "clip_lamb_schedule": lambda m: m.chain(
        m.clip_by_global_norm(1.0),
        m.lamb(schedules(m).warmup_cosine_decay_schedule(0.0, 1e-2, 10, 50, end_value=1e-4))),
    "clip_adam_schedule": lambda m: m.chain(
        m.clip(2.0), m.adam(schedules(m).exponential_decay(1e-2, 5, 0.9))),
    "clip_sgd": lambda m: m.chain(m.clip_by_global_norm(10.0), m.sgd(1e-3, momentum=0.9)),
    "decay_schedule": lambda m: m.chain(
        m.scale_by_adam(), m.add_decayed_weights(lambda c: 1e-2 / (1.0 + c), mask=matrices_only),
        m.scale(-1e-2)),
    "building_blocks": lambda m: m.chain(
        m.scale_by_adam(), m.add_decayed_weights(1e-3), m.scale_by_trust_ratio(),
        m.trace(0.5), m.scale_by_schedule(lambda c: 1e-3 / (1 + c)), m.scale(-1.0)),
}


@pytest.mark.parametrize("name", sorted(COMBINATION_CASES))
def test_combination_matches_optax(name):
    assert_same_trajectory(COMBINATION_CASES[name](ft), COMBINATION_CASES[name](optax),
                           name=name)


# --------------------------------------------------------------------------
# Wrappers and per-leaf transforms
# --------------------------------------------------------------------------

PREFIX_MASK = {"dense": True, "layers": False, "scalar": True}
LABELS = {"dense": {"w": "a", "b": "b"}, "layers": "a", "scalar": "c"}


def labels_fn(params):
    return jax.tree_util.tree_map(lambda p: "matrix" if p.ndim > 1 else "vector", params)


def nested(m):
    inner = m.multi_transform(
        {"a": m.masked(m.lamb(1e-2, weight_decay=0.1, mask=matrices_only), PREFIX_MASK),
         "b": m.chain(m.clip_by_global_norm(0.5), m.sgd(1e-2, momentum=0.9)),
         "c": m.set_to_zero()}, LABELS)
    return m.MultiSteps(inner, every_k_schedule=3).gradient_transformation()


def hyper(m):
    return m.inject_hyperparams(m.adamw)(
        learning_rate=m.linear_schedule(1e-2, 1e-3, 30), b1=0.8, weight_decay=0.05)


WRAPPER_CASES = {
    "masked_stage": lambda m: m.chain(m.scale_by_adam(), m.masked(
        m.add_decayed_weights(0.1), matrices_only), m.scale(-1e-2)),
    "masked_chain_prefix": lambda m: m.masked(m.adam(1e-2), PREFIX_MASK),
    "masked_optimizer_with_own_mask": lambda m: m.masked(
        m.adamw(1e-2, weight_decay=0.5, mask=matrices_only),
        {"dense": {"w": True, "b": True}, "layers": [False], "scalar": True}),
    "masked_global_norm": lambda m: m.masked(
        m.chain(m.clip_by_global_norm(1.0), m.sgd(1e-2)), matrices_only),
    "masked_optax_inner": lambda m: m.masked(optax.rmsprop(1e-3, momentum=0.5), matrices_only),
    "multi_transform": lambda m: m.multi_transform(
        {"matrix": m.adam(1e-2), "vector": m.sgd(1e-3, momentum=0.9)}, labels_fn),
    "partition_tree_labels": lambda m: m.partition(
        {"a": m.lion(1e-3), "b": m.adamw(1e-2, weight_decay=0.5), "c": m.set_to_zero()},
        LABELS),
    "multisteps_mean": lambda m: m.MultiSteps(m.adam(1e-2), 4).gradient_transformation(),
    "multisteps_sum_schedule": lambda m: m.MultiSteps(
        m.sgd(1e-3, momentum=0.9), lambda step: 2 + step % 3,
        use_grad_mean=False).gradient_transformation(),
    "nested": nested,
    "inject_hyperparams": hyper,
    "freeze": lambda m: m.chain(m.freeze(matrices_only), m.adam(1e-2)),
    "zero_nans_ema": lambda m: m.chain(m.zero_nans(), m.ema(0.9), m.scale(-1e-2)),
    "ema_no_debias": lambda m: m.chain(m.ema(0.8, debias=False), m.sgd(1e-2)),
    "add_noise": lambda m: m.chain(m.add_noise(0.1, 0.55, jax.random.key(5)), m.sgd(1e-3)),
    "keep_params_nonnegative": lambda m: m.chain(m.sgd(1e-3), m.keep_params_nonnegative()),
    "named_chain": lambda m: m.named_chain(("clip", m.clip(1.0)), ("adam", m.adam(1e-2))),
    "apply_if_finite": lambda m: m.apply_if_finite(m.adam(1e-2), 3),
}


def with_bad_steps(grads):
    """NaN in the scalar's gradient at steps 5, 6 and 20, an Inf at step 30."""
    s = np.array(grads["scalar"])
    s[[5, 6, 20]] = np.nan
    s[30] = np.inf
    return dict(grads, scalar=jnp.asarray(s))


@pytest.mark.parametrize("name", sorted(WRAPPER_CASES))
def test_wrapper_matches_optax_every_step(name):
    params = make_params(vector=False)
    grads = make_grads(params)
    if name in ("apply_if_finite", "zero_nans_ema"):
        grads = with_bad_steps(grads)
    assert_same_trajectory(WRAPPER_CASES[name](ft), WRAPPER_CASES[name](optax), params=params,
                           grads=grads, name=name)


# --------------------------------------------------------------------------
# The trust-ratio recompute (see tests/engine/test_recompute.py), forced on
# --------------------------------------------------------------------------

def trust_ratio_cases() -> dict:
    """label -> constructor of a module m: every lamb and lars setting, and clip + lamb."""
    found = {label: (lambda m, r=r, s=s: r.make(m, **s.kwargs))
             for label, (r, s) in CORE_SETTINGS.items() if r.name in ("lamb", "lars")}
    found["clip_lamb_schedule"] = COMBINATION_CASES["clip_lamb_schedule"]
    return found


TRUST_RATIO_CASES = trust_ratio_cases()


@pytest.mark.parametrize("name", sorted(TRUST_RATIO_CASES))
def test_trust_ratio_recompute_matches_optax(name, monkeypatch):
    """The engine's trust-ratio recompute, forced on for small trees (and on any JAX), keeps
    optax's numbers (on whatever backend the tests run on)."""
    monkeypatch.setattr(recompute, "MIN_BYTES", 0)
    monkeypatch.setattr(recompute, "MIN_JAX", "0.0.0")
    monkeypatch.setattr(recompute, "BACKENDS", (jax.default_backend(),))
    assert recompute.applies(0)
    assert_same_trajectory(TRUST_RATIO_CASES[name](ft), TRUST_RATIO_CASES[name](optax), name=name)


# --------------------------------------------------------------------------
# optax interop
# --------------------------------------------------------------------------

def interop_params():
    k1, k2 = jax.random.split(jax.random.PRNGKey(7))
    return {"w": jax.random.normal(k1, (5, 4)), "b": jnp.zeros(4), "scale": jnp.array(2.0),
            "emb": jax.random.normal(k2, (3, 6)) * 10.0}


def interop_grads(params):
    """Gradients of a fixed quadratic (a function of the params), spanning 1e-3..1e3."""
    weights = {"w": 1e3, "b": 1.0, "scale": 1e-3, "emb": 3.0}
    return {k: weights[k] * (v - 0.5) for k, v in params.items()}


def assert_same_interop_trajectory(mixed, reference, steps=30):
    """30 steps on the quadratic, both sides applied with optax.apply_updates."""
    assert_same_trajectory(mixed, reference, params=interop_params(), grads=interop_grads,
                           steps=steps, apply_ours=optax.apply_updates)


def test_optax_inside_functrain_chain_and_back():
    """functrain stages and optax transforms compose in both libraries' chain."""
    mixed_ours = ft.chain(optax.clip_by_global_norm(1.0), ft.adam(1e-2))
    mixed_theirs = optax.chain(ft.clip_by_global_norm(1.0), optax.adam(1e-2))
    reference = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(1e-2))
    assert_same_trajectory(mixed_ours, reference)
    assert_same_trajectory(mixed_theirs, reference, apply_ours=optax.apply_updates)


def test_functrain_transforms_inside_optax_chain():
    schedule = optax.warmup_cosine_decay_schedule(0.0, 1e-2, 5, 30)
    mixed = optax.chain(ft.clip_by_global_norm(1.0), ft.scale_by_adam(),
                        ft.add_decayed_weights(1e-2, mask=matrices_only),
                        ft.scale_by_trust_ratio(),
                        optax.scale_by_learning_rate(schedule))
    pure = optax.chain(optax.clip_by_global_norm(1.0), optax.scale_by_adam(),
                       optax.add_decayed_weights(1e-2, mask=matrices_only),
                       optax.scale_by_trust_ratio(), optax.scale_by_learning_rate(schedule))
    assert_same_interop_trajectory(mixed, pure)


def test_optax_transforms_inside_functrain_chain():
    schedule = ft.warmup_cosine_decay_schedule(0.0, 1e-2, 5, 30)
    # eps=1e-6: lamb's default, so the chain equals clip + lamb below.
    mixed = ft.chain(optax.clip_by_global_norm(1.0), optax.scale_by_adam(eps=1e-6),
                     ft.add_decayed_weights(1e-2, mask=matrices_only),
                     optax.scale_by_trust_ratio(),
                     ft.scale_by_learning_rate(schedule))
    pure = ft.chain(ft.clip_by_global_norm(1.0), ft.scale_by_adam(eps=1e-6),
                    ft.add_decayed_weights(1e-2, mask=matrices_only),
                    ft.scale_by_trust_ratio(),
                    ft.scale_by_learning_rate(schedule))
    reference = optax.lamb(schedule, weight_decay=1e-2, mask=matrices_only)
    assert_same_interop_trajectory(mixed, pure)
    # clip(1.0) + lamb's pieces == clip(1.0) then optax.lamb
    assert_same_interop_trajectory(mixed, optax.chain(optax.clip_by_global_norm(1.0), reference))


def test_optax_wrappers_around_functrain_optimizers():
    pairs = [
        (optax.MultiSteps(ft.adam(1e-2), every_k_schedule=3).gradient_transformation(),
         optax.MultiSteps(optax.adam(1e-2), every_k_schedule=3).gradient_transformation()),
        (optax.masked(ft.lamb(1e-2, weight_decay=1e-2), matrices_only),
         optax.masked(optax.lamb(1e-2, weight_decay=1e-2), matrices_only)),
        (optax.inject_hyperparams(ft.adamw)(learning_rate=1e-2, weight_decay=1e-3),
         optax.inject_hyperparams(optax.adamw)(learning_rate=1e-2, weight_decay=1e-3)),
        (optax.apply_if_finite(ft.lars(0.5), max_consecutive_errors=2),
         optax.apply_if_finite(optax.lars(0.5), max_consecutive_errors=2)),
    ]
    for ours, theirs in pairs:
        assert_same_interop_trajectory(ours, theirs, steps=12)


def test_functrain_wrappers_accept_optax_and_optax_chain_accepts_them():
    opt = optax.chain(ft.masked(optax.adam(0.1), {"w": True, "b": False}),
                      ft.apply_if_finite(optax.scale(1.0), 1))
    params = {"w": jnp.ones(2), "b": jnp.ones(2)}
    u, _ = opt.update({"w": jnp.ones(2), "b": jnp.ones(2)}, opt.init(params), params)
    np.testing.assert_allclose(u["w"], -0.1, rtol=1e-5)
    np.testing.assert_allclose(u["b"], 1.0)
