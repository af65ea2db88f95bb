"""Equinox sees functrain's hyperparameters as it sees optax's.

optax's transformations are closures; ``equinox.internal.closure_to_pytree`` (which
optimistix's ``OptaxMinimiser`` applies to the optimizer it is given) turns each closure's
cells into pytree leaves, so that under ``eqx.filter_jit`` a new optimizer with equal
hyperparameters hits the compilation cache and an array hyperparameter is traced. functrain's
transformations are made of stages and programs; these are pytrees of their functions, so
the same conversion reaches the same hyperparameters. Checked here over the registry, the
wrappers, and the compilation counts of a filter_jit step (optimistix's own check, written
out with Equinox alone).
"""

from __future__ import annotations

import equinox as eqx
import equinox.internal as eqxi
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import functrain
from tests.registry import REGISTRY


def static_part(tx):
    """What ``eqx.filter_jit`` compares between calls: the non-array part of the converted
    optimizer, flattened (it must be hashable, as the cache key is)."""
    converted = eqxi.closure_to_pytree(tx)
    _, static = eqx.partition(converted, eqx.is_array)
    leaves, treedef = jax.tree_util.tree_flatten(static)
    key = (treedef, tuple(leaves))
    hash(key)
    return key


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_equal_hyperparameters_give_equal_static_parts(name):
    record = REGISTRY[name]
    assert static_part(record.make(functrain)) == static_part(record.make(functrain))
    # A different learning rate is seen (a Python float is part of the static key).
    lr = record.args.get("learning_rate")
    if isinstance(lr, float) and lr:
        other = record.make(functrain, **{**record.args, "learning_rate": 2 * lr})
        assert static_part(other) != static_part(record.make(functrain))


def wrapper_cases(m):
    """Transformations built by wrappers and combinators, from module ``m``."""
    params_mask = {"w": True, "b": False}
    return {
        "chain+schedule": lambda: m.chain(
            m.adam(1e-3), m.scale_by_schedule(m.piecewise_constant_schedule(1, {200: 0.1}))),
        "masked": lambda: m.masked(m.sgd(0.1, momentum=0.9), params_mask),
        "multi_transform": lambda: m.multi_transform(
            {"a": m.adam(1e-3), "b": m.set_to_zero()}, {"w": "a", "b": "b"}),
        "inject_hyperparams": lambda: m.inject_hyperparams(m.adamw)(learning_rate=1e-3),
        "apply_if_finite": lambda: m.apply_if_finite(m.adam(1e-3), 3),
        "MultiSteps": lambda: m.MultiSteps(m.adam(1e-3), 4),
        "lookahead": lambda: m.lookahead(m.sgd(0.1), 5, 0.5),
        "clip_by_global_norm": lambda: m.chain(m.clip_by_global_norm(1.0), m.adamw(1e-3)),
        "add_decayed_weights masked": lambda: m.chain(
            m.scale_by_adam(), m.add_decayed_weights(1e-4, params_mask), m.scale(-1e-3)),
        "warmup_cosine": lambda: m.adamw(m.warmup_cosine_decay_schedule(0.0, 1e-3, 10, 100)),
    }


@pytest.mark.parametrize("case", sorted(wrapper_cases(functrain)))
def test_wrappers_compare_equal_as_optax_does(case):
    make = wrapper_cases(functrain)[case]
    make_optax = wrapper_cases(optax)[case]
    optax_equal = static_part(make_optax()) == static_part(make_optax())
    assert (static_part(make()) == static_part(make())) == optax_equal


def test_quantized_state_compares_equal():
    make = lambda: functrain.quantized_state(functrain.adamw(1e-3), bits=8)
    assert static_part(make()) == static_part(make())


def count_compilations(m, learning_rates, convert):
    """Run one ``eqx.filter_jit`` step per learning rate, each with a new optimizer
    ``m.chain(m.adam(lr), scale_by_schedule(...))`` (optimistix's check); returns the number
    of traces and the updated params of each run."""
    traces = []

    @eqx.filter_jit
    def step(tx, params, grads):
        traces.append(None)
        updates, _ = tx.update(grads, tx.init(params), params)
        return m.apply_updates(params, updates)

    params = {"w": jnp.array([1.0, -2.0, 3.0]), "b": jnp.array(0.5)}
    grads = {"w": jnp.array([0.3, 0.1, -0.2]), "b": jnp.array(-1.0)}
    results = []
    for lr in learning_rates:
        tx = m.chain(m.adam(lr), m.scale_by_schedule(m.piecewise_constant_schedule(1, {2: 0.1})))
        results.append(step(convert(tx), params, grads))
    return len(traces), results


@pytest.mark.parametrize("converted", [True, False], ids=["closure_to_pytree", "as_given"])
def test_new_optimizer_with_array_learning_rate_compiles_as_optax_does(converted):
    convert = eqxi.closure_to_pytree if converted else (lambda tx: tx)
    rates = [jnp.array(1e-3), jnp.array(1e-2), jnp.array(1e-2)]
    ours, our_params = count_compilations(functrain, rates, convert)
    theirs, their_params = count_compilations(optax, rates, convert)
    assert ours == theirs
    assert ours == (1 if converted else 3)
    for mine, reference in zip(our_params, their_params):
        jax.tree_util.tree_map(lambda a, b: np.testing.assert_array_equal(a, b), mine,
                               reference)


def three_steps(tx, params, grads):
    state = tx.init(params)
    for _ in range(3):
        updates, state = tx.update(grads, state, params)
        params = functrain.apply_updates(params, updates)
    return params


@pytest.mark.parametrize("builder", ["lamb", "contrib.adam_mini", "contrib.muon"])
def test_converted_optimizer_steps_as_one_built_with_a_traced_rate(builder):
    make = functrain
    for part in builder.split("."):
        make = getattr(make, part)
    params = {"w": jnp.linspace(-1.0, 1.0, 6).reshape(2, 3), "b": jnp.zeros(3)}
    grads = jax.tree_util.tree_map(lambda p: jnp.cos(3 * p) + 0.1, params)
    lr = jnp.array(1e-2)
    got = eqx.filter_jit(three_steps)(eqxi.closure_to_pytree(make(lr)), params, grads)
    expected = jax.jit(lambda lr, p, g: three_steps(make(lr), p, g))(lr, params, grads)
    jax.tree_util.tree_map(lambda a, b: np.testing.assert_array_equal(a, b), got, expected)
