"""Same inputs, same numbers as optax: every trajectory compared at every one of 50 jitted steps.

* Every named optimizer (``OPTIMIZER_CASES``, ``MORE_OPTIMIZER_CASES``), and a check
  that no optimizer defined in ``functrain/optimizers/*.py`` is missing from them.
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
from functrain.transforms import recompute
from helpers import (assert_same_trajectory, make_grads, make_params, matrices_only,
                     optimizer_functions, OPTIMIZER_ARGS)


def schedules(m):
    """The schedules module that goes with ``m`` (functrain or optax)."""
    return ft if m is ft else optax


# --------------------------------------------------------------------------
# Named optimizers and combinations, on the full test tree
# --------------------------------------------------------------------------

# name -> constructor of a module m (functrain or optax)
OPTIMIZER_CASES = {
    "sgd": lambda m: m.sgd(1e-3),
    "sgd_momentum": lambda m: m.sgd(1e-3, momentum=0.9),
    "sgd_nesterov": lambda m: m.sgd(1e-3, momentum=0.5, nesterov=True),
    "adam": lambda m: m.adam(1e-2),
    "adam_settings": lambda m: m.adam(3e-3, b1=0.8, b2=0.99, eps=1e-6, eps_root=1e-8),
    "adam_nesterov": lambda m: m.adam(1e-2, nesterov=True),
    "adamw": lambda m: m.adamw(1e-2),
    "adamw_masked": lambda m: m.adamw(1e-2, weight_decay=0.1, mask=matrices_only),
    "adamw_nesterov": lambda m: m.adamw(1e-2, b1=0.7, weight_decay=0.05, nesterov=True),
    "lamb": lambda m: m.lamb(1e-2),
    "lamb_decay": lambda m: m.lamb(1e-2, b1=0.8, eps=1e-8, weight_decay=0.01),
    "lamb_masked": lambda m: m.lamb(1e-2, weight_decay=0.1, mask=matrices_only),
    "lars": lambda m: m.lars(0.1),
    "lars_settings": lambda m: m.lars(0.5, weight_decay=1e-3, trust_coefficient=0.01,
                                      eps=1e-6, momentum=0.8, nesterov=True),
    "lars_masks": lambda m: m.lars(0.5, weight_decay=1e-2, weight_decay_mask=matrices_only,
                                   trust_ratio_mask=matrices_only),
    "rmsprop": lambda m: m.rmsprop(1e-3),
    "rmsprop_centered": lambda m: m.rmsprop(1e-3, decay=0.8, centered=True, momentum=0.9,
                                            initial_scale=0.5),
    "rmsprop_bias": lambda m: m.rmsprop(1e-3, eps_in_sqrt=False, bias_correction=True,
                                        momentum=0.5, nesterov=True),
    "adagrad": lambda m: m.adagrad(1e-2),
    "adagrad_settings": lambda m: m.adagrad(0.1, initial_accumulator_value=0.5, eps=1e-5),
    "lion": lambda m: m.lion(1e-3),
    "lion_settings": lambda m: m.lion(1e-4, b1=0.8, b2=0.9, weight_decay=0.1,
                                      mask=matrices_only),
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
    "adan": lambda m: m.adan(1e-2),
    "optimistic_adam": lambda m: m.optimistic_adam(1e-2),  # deprecated in both: warns
    "optimistic_adam_v2": lambda m: m.optimistic_adam_v2(1e-2),
}


@pytest.mark.parametrize("name", sorted(OPTIMIZER_CASES))
def test_matches_optax(name):
    assert_same_trajectory(OPTIMIZER_CASES[name](ft), OPTIMIZER_CASES[name](optax), name=name)


# --------------------------------------------------------------------------
# The issue-4 optimizers, on the tree without the (5,) leaf
# --------------------------------------------------------------------------

# name -> (constructor of a module m, whether the scalar leaf is in the tree, value kw)
MORE_OPTIMIZER_CASES = {
    "adafactor": (lambda m: m.adafactor(), True, False),
    "adafactor_factored": (lambda m: m.adafactor(1e-2, min_dim_size_to_factor=2, momentum=0.9,
                                                  weight_decay_rate=1e-3, decay_offset=3,
                                                  clipping_threshold=None), True, False),
    "adafactor_unfactored": (lambda m: m.adafactor(
        lambda c: 1e-2 / (1.0 + c), factored=False, multiply_by_parameter_scale=False,
        decay_rate=0.5, eps=1e-20, weight_decay_rate=1e-2, weight_decay_mask=matrices_only),
        True, False),
    "nadam": (lambda m: m.nadam(1e-2, b2=0.99, eps_root=1e-8), True, False),
    "nadamw": (lambda m: m.nadamw(1e-2, b1=0.8, weight_decay=0.1, mask=matrices_only),
               True, False),
    "adabelief": (lambda m: m.adabelief(1e-2, b1=0.8, eps=1e-10), True, False),
    "adabelief_nesterov": (lambda m: m.adabelief(1e-2, nesterov=True), True, False),
    "adamax": (lambda m: m.adamax(1e-2, b1=0.8, eps=1e-6), True, False),
    "adamaxw": (lambda m: m.adamaxw(1e-2, b2=0.99, weight_decay=lambda c: 1e-2 * c,
                                    mask=matrices_only), True, False),
    "novograd": (lambda m: m.novograd(1e-2, b1=0.8, b2=0.5, eps=1e-4, eps_root=1e-8,
                                      weight_decay=0.01), True, False),
    "radam": (lambda m: m.radam(1e-2), True, False),
    "radam_nesterov": (lambda m: m.radam(1e-2, b2=0.99, threshold=4.0, eps_root=1e-8,
                                         nesterov=True), True, False),
    "sm3": (lambda m: m.sm3(0.1, momentum=0.5), False, False),
    "sign_sgd": (lambda m: m.sign_sgd(1e-3), True, False),
    "signum": (lambda m: m.signum(1e-3, beta=0.8), True, False),
    "amsgrad": (lambda m: m.amsgrad(1e-2, b1=0.8, eps_root=1e-8, bias_correction_nu=False),
                True, False),
    "yogi": (lambda m: m.yogi(1e-2, b1=0.8, b2=0.99, eps=1e-4), True, False),
    "fromage": (lambda m: m.fromage(1e-2), True, False),
    "fromage_schedule": (lambda m: m.fromage(lambda c: 1e-2 / (1.0 + c)), True, False),
    "noisy_sgd": (lambda m: m.noisy_sgd(1e-3, eta=0.1, gamma=0.3, key=jax.random.key(3)),
                  True, False),
    "adadelta": (lambda m: m.adadelta(), True, False),
    "adadelta_decay": (lambda m: m.adadelta(1.0, rho=0.8, eps=1e-4, weight_decay=0.01,
                                            weight_decay_mask=matrices_only), True, False),
    "rprop": (lambda m: m.rprop(1e-2, eta_minus=0.3, eta_plus=1.5, min_step_size=1e-4,
                                max_step_size=0.05), True, False),
    "polyak_sgd": (lambda m: m.polyak_sgd(), True, True),
    "polyak_sgd_plus": (lambda m: m.polyak_sgd(max_learning_rate=0.1, scaling=0.5,
                                               f_min=-1.0, eps=1e-3, variant="sps+"),
                        True, True),
    "optimistic_gradient_descent": (lambda m: m.optimistic_gradient_descent(
        1e-2, alpha=0.5, beta=2.0), True, False),
    # A fixed step (no line search: these cases have no objective to give value_fn);
    # lbfgs with its line searches: tests/optimizers/test_quasi_newton.py.
    "lbfgs": (lambda m: m.lbfgs(1e-3, memory_size=4, linesearch=None), True, False),
}


@pytest.mark.parametrize("name", sorted(MORE_OPTIMIZER_CASES))
def test_matches_optax_every_step(name):
    make, scalar, with_value = MORE_OPTIMIZER_CASES[name]
    assert_same_trajectory(make(ft), make(optax), params=make_params(scalar, vector=False),
                           with_value=with_value, name=name)


class _Recorder:
    """Stands in for the functrain module and records which names a case constructor reads."""

    def __init__(self):
        self.names = set()

    def __getattr__(self, name):
        self.names.add(name)
        return getattr(ft, name)


def covered_by_parity_tables() -> set:
    recorder = _Recorder()
    for make in OPTIMIZER_CASES.values():
        make(recorder)
    for make, _, _ in MORE_OPTIMIZER_CASES.values():
        make(recorder)
    return recorder.names


def test_all_optimizers_listed():
    """Every public function of functrain/optimizers/*.py has an optax parity case, arguments
    for the per-family checks (OPTIMIZER_ARGS), and is exported by functrain."""
    defined = optimizer_functions()
    assert len(defined) >= 27, sorted(defined)  # the introspection itself works
    missing = sorted(set(defined) - covered_by_parity_tables())
    assert not missing, f"optimizers without an optax parity case here: {missing}"
    no_args = sorted(set(defined) - set(OPTIMIZER_ARGS))
    assert not no_args, f"optimizers missing from helpers.OPTIMIZER_ARGS: {no_args}"
    unknown = sorted(set(OPTIMIZER_ARGS) - set(defined))
    assert not unknown, f"helpers.OPTIMIZER_ARGS names no optimizer file's function: {unknown}"
    not_exported = sorted(n for n, fn in defined.items() if getattr(ft, n, None) is not fn)
    assert not not_exported, f"optimizers not exported as functrain.<name>: {not_exported}"


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
# The trust-ratio recompute (see tests/transforms/test_recompute.py), forced on
# --------------------------------------------------------------------------

TRUST_RATIO_CASES = ["lamb", "lamb_decay", "lamb_masked", "lars", "lars_settings", "lars_masks",
                     "clip_lamb_schedule"]


@pytest.mark.parametrize("name", TRUST_RATIO_CASES)
def test_trust_ratio_recompute_matches_optax(name, monkeypatch):
    """The engine's trust-ratio recompute, forced on for small trees, keeps optax's numbers."""
    monkeypatch.setattr(recompute, "MIN_BYTES", 0)
    assert recompute.enabled()
    assert_same_trajectory(OPTIMIZER_CASES[name](ft), OPTIMIZER_CASES[name](optax), name=name)


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
