"""functrain.current_hyperparams: every registry optimizer's learning rate read from its state.

The sweep builds each optimizer of tests/registry.py with its record's arguments, the
learning rate (where the builder takes one) replaced by a schedule ``lr / (1 + t)``, runs
``STEPS`` updates, and checks the reading against that schedule evaluated by hand at
``t = STEPS`` (the number of updates made), and, built again with the constant, against
the constant. Builders without a learning rate: every numeric argument the record passes
is read back as given. Also: chains, MultiSteps, jit, name clashes, errors.
"""

import dataclasses
import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import functrain
import registry
from helpers import loss_value

STEPS = 3


def params_tree():
    rng = np.random.default_rng(0)
    return {"w": jnp.asarray(rng.standard_normal((4, 3)), jnp.float32),
            "b": jnp.asarray(rng.standard_normal((3,)), jnp.float32)}


def run(record, kwargs, steps=STEPS):
    """The optimizer built from ``kwargs`` and its state after ``steps`` updates."""
    opt = record.make(functrain, **kwargs)
    params = params_tree()
    state = opt.init(params)
    for t in range(steps):
        grads = jax.tree_util.tree_map(lambda p: jnp.cos(p + t), params)
        extra = record.extra(loss_value, params) if record.extra else {}
        updates, state = opt.update(grads, state, params, **extra)
        params = functrain.apply_updates(params, updates)
    return opt, state


def takes_schedule(record):
    """Whether the builder the record calls declares ``learning_rate`` a schedule."""
    if record.build is not None:  # a recipe: the learning rate goes to an inner optax-core one
        return "learning_rate" in record.args
    builder = getattr(functrain.contrib if record.contrib else functrain, record.name)
    kind = getattr(builder, "hyperparameter_kinds", {}).get("learning_rate", "")
    return kind.startswith("schedule")


# Schedule-Free evaluates its schedule at step_count, counted from 1 (optax's
# convention): after STEPS updates the next one uses schedule(STEPS + 1).
# adam_accumulation evaluates it at its optimizer step count: its record takes 2
# micro-batches per step, so after STEPS calls the next one uses schedule(STEPS // 2).
NEXT_STEP = {"schedule_free": STEPS + 1, "adam_accumulation": STEPS // 2}


def declared(record):
    """The numeric arguments the record's builder declares (empty for a recipe)."""
    if record.build is not None:
        return {}
    builder = getattr(functrain.contrib if record.contrib else functrain, record.name)
    return builder.hyperparameter_kinds


@pytest.mark.parametrize("name", sorted(registry.REGISTRY))
def test_every_registry_optimizer_reports_its_learning_rate(name):
    record = registry.REGISTRY[name]
    kwargs = dict(record.args)
    opt, state = run(record, kwargs)
    got = functrain.current_hyperparams(opt, state)
    numeric = {k: v for k, v in kwargs.items()
               if isinstance(v, (int, float)) and not isinstance(v, bool)}
    assert set(numeric) & set(declared(record)) <= set(got), (name, sorted(got))
    for key, value in numeric.items():
        if key in got:
            np.testing.assert_allclose(got[key], value, rtol=1e-6, err_msg=f"{name}.{key}")
    if "learning_rate" not in kwargs:
        return
    assert "learning_rate" in got, (name, sorted(got))
    lr = float(kwargs["learning_rate"])
    if takes_schedule(record):
        kwargs["learning_rate"] = lambda count: lr / (1.0 + count)
        opt, state = run(record, kwargs)
        got = functrain.current_hyperparams(opt, state)["learning_rate"]
        np.testing.assert_allclose(got, lr / (1.0 + NEXT_STEP.get(name, STEPS)), rtol=1e-6)


INJECTABLE = sorted(n for n, r in registry.REGISTRY.items() if r.factory(functrain) is not None)


@pytest.mark.parametrize("name", INJECTABLE)
def test_inject_hyperparams_of_every_factory_reports_its_values(name):
    """``inject_hyperparams(factory)(**args)`` with the learning rate a schedule: the
    reading, alone and inside a ``chain``, is the schedule at the number of updates made
    (the injected count) and every other numeric argument as given."""
    record = registry.REGISTRY[name]
    kwargs = dict(record.args)
    if "learning_rate" in kwargs:
        lr = float(kwargs["learning_rate"])
        kwargs["learning_rate"] = lambda count: lr / (1.0 + count)
    factory = functrain.inject_hyperparams(record.factory(functrain))
    for build in (lambda m, **kw: factory(**kw),
                  lambda m, **kw: m.chain(m.clip(1e3), factory(**kw))):
        injected = dataclasses.replace(record, build=build)
        opt, state = run(injected, kwargs, steps=2)
        got = functrain.current_hyperparams(opt, state)
        for key, value in record.args.items():
            if key == "learning_rate":
                np.testing.assert_allclose(got[key], value / 3.0, rtol=1e-6, err_msg=name)
            elif key in declared(record) and isinstance(value, (int, float)) and not (
                    isinstance(value, bool)):
                np.testing.assert_allclose(got[key], value, rtol=1e-6,
                                           err_msg=f"{name}.{key}")


def test_chains_wrappers_clashes_and_jit():
    schedule = functrain.schedules.linear_schedule(1.0, 0.0, transition_steps=10)
    opt = functrain.chain(functrain.clip(0.5), functrain.adamw(schedule, weight_decay=0.25),
                          functrain.sgd(0.125))
    params = params_tree()

    @jax.jit
    def step(state):
        updates, state = opt.update(params, state, params)
        return state, functrain.current_hyperparams(opt, state)  # inside jit too

    state = opt.init(params)
    for t in range(1, 5):
        state, inside = step(state)
        got = functrain.current_hyperparams(opt, state)
        np.testing.assert_allclose(got["learning_rate"], 1.0 - t / 10, rtol=1e-6)
        np.testing.assert_allclose(inside["learning_rate"], 1.0 - t / 10, rtol=1e-6)
    assert float(got["weight_decay"]) == 0.25 and float(got["sgd.learning_rate"]) == 0.125
    # MultiSteps: the inner optimizer counts real updates only (7 micro-steps, k = 2: 3).
    multi = functrain.MultiSteps(functrain.adam(lambda t: 1.0 / (1.0 + t)), 2)
    state = multi.init(params)
    for _ in range(7):
        _, state = multi.update(params, state, params)
    np.testing.assert_allclose(functrain.current_hyperparams(multi, state)["learning_rate"],
                               1.0 / 4.0, rtol=1e-6)


def test_decay_rate_schedule_is_read_at_the_step_the_adam_family_uses():
    b2 = functrain.contrib.palm_beta2_schedule()
    opt = functrain.adam(1e-2, b2=b2)
    params = params_tree()
    state = opt.init(params)
    for _ in range(2):
        _, state = opt.update(params, state, params)
    # PaLM: b2(t) = 1 - t**-0.8, t counted from 1: the third update uses t = 3.
    np.testing.assert_allclose(functrain.current_hyperparams(opt, state)["b2"],
                               1.0 - 3.0 ** -0.8, rtol=1e-6)


def test_errors_name_the_argument():
    with pytest.raises(TypeError, match="opt must be an optimizer"):
        functrain.current_hyperparams(0.1, ())
    plain = functrain.GradientTransformation(lambda p: (), lambda u, s, p=None: (u, s))
    with pytest.raises(ValueError, match="was not built by functrain's builders"):
        functrain.current_hyperparams(plain, ())


def test_masked_and_multi_transform_report_their_inner_transforms():
    """masked: the inner names as they are; multi_transform: '<label>/<name>', each read from
    its own label's state (checked against the schedules evaluated by hand at t updates)."""
    params = params_tree()
    sched = functrain.schedules.linear_schedule(1.0, 0.0, transition_steps=10)
    masked = functrain.masked(functrain.adamw(sched, weight_decay=0.25),
                              {"w": True, "b": False})
    multi = functrain.multi_transform(
        {"a": functrain.adam(sched, b1=0.8), "b": functrain.sgd(0.1),
         "c": functrain.sgd(lambda t: 0.5 / (1.0 + t))},
        {"w": "a", "b": "b"})  # label 'c' has no leaves: its schedule still counts updates
    in_chain = functrain.chain(functrain.sgd(0.375), multi)
    for opt in (masked, multi, in_chain):
        state = opt.init(params)
        step = jax.jit(lambda s: opt.update(params, s, params)[1])
        for t in range(1, 4):
            state = step(state)
            got = functrain.current_hyperparams(opt, state)
            if opt is masked:
                assert sorted(got) == ["b1", "b2", "eps", "eps_root", "learning_rate",
                                       "weight_decay"]
                np.testing.assert_allclose(got["learning_rate"], 1.0 - t / 10, rtol=1e-6)
                assert float(got["weight_decay"]) == 0.25
            else:
                assert sorted(k for k in got if "/" in k) == [
                    "a/b1", "a/b2", "a/eps", "a/eps_root", "a/learning_rate",
                    "b/learning_rate", "c/learning_rate"]
                np.testing.assert_allclose(got["a/learning_rate"], 1.0 - t / 10, rtol=1e-6)
                np.testing.assert_allclose(got["a/b1"], 0.8, rtol=1e-7)
                np.testing.assert_allclose(got["b/learning_rate"], 0.1, rtol=1e-7)
                np.testing.assert_allclose(got["c/learning_rate"], 0.5 / (1.0 + t), rtol=1e-6)
    outside = {k: v for k, v in got.items() if "/" not in k}  # in_chain's sgd, unprefixed
    assert list(outside) == ["learning_rate"] and float(outside["learning_rate"]) == 0.375
