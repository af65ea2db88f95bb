"""Every setting of every contrib optimizer (tests/registry.py) against optax.contrib, and
optax's contrib conformance properties.

For each setting (``label``, the record's name for its default arguments):

* ``parity``: 30 jitted steps on a tree of a matrix, a vector, a scalar and a zero
  leaf give optax.contrib's parameters at every step.
* ``converges``: the parabola, Rosenbrock, matrix-parabola and mixed-tensor targets of
  optax's own contrib tests are reached within 3e-2 after 30000 steps (schedule-free
  optimizers: at their evaluation params), as optax asks of its contrib optimizers.
* ``inject``: ``inject_hyperparams(factory)(**kwargs)`` gives the same numbers.
* ``dtypes``: bfloat16 parameters get bfloat16 updates; an unexpected extra keyword to
  ``update`` is ignored; the jitted step does not recompile on its second call.
* ``multisteps``: ``MultiSteps(opt, k)`` fed k micro-batch gradients equals ``opt`` fed
  their mean, and ``functrain.tree_map_params`` maps the state.
* ``eval_shape``: ``jax.eval_shape(opt.init, abstract_params)`` gives the shapes and
  dtypes of the real ``init`` (state from shapes alone).
* ``donation``: no buffer shared in ``init``'s state, two donated jitted steps run.

A setting leaves a check out only with a written reason (``skip`` in the registry); the
optimizers optax lacks (shampoo, soap, kron, ...) skip ``parity`` and ``inject``.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
import optax.contrib  # noqa: F401  (the reference)
import pytest

import functrain
import registry
from registry import Optimizer

SETTINGS = registry.settings(contrib=True)


def _params(case_name: str) -> tuple:
    rng = np.random.default_rng(0)
    params = {"w": jnp.asarray(rng.standard_normal((4, 3)), jnp.float32),
              "v": jnp.asarray(rng.standard_normal(5), jnp.float32),
              "s": jnp.asarray(0.7, jnp.float32),
              "z": jnp.zeros((2, 2), jnp.float32)}
    target = jax.tree_util.tree_map(
        lambda p: jnp.asarray(rng.standard_normal(p.shape), jnp.float32), params)
    curvature = jax.tree_util.tree_map(
        lambda p: jnp.asarray(rng.uniform(0.5, 2.0, p.shape), jnp.float32), params)

    def loss(p):
        terms = jax.tree_util.tree_map(lambda x, t, c: jnp.sum(0.5 * c * (x - t) ** 2),
                                       p, target, curvature)
        return sum(jax.tree_util.tree_leaves(terms))

    return params, loss


def _step_fn(opt: Any, loss: Callable, record: Optimizer, lib: Any) -> Callable:
    def step(params, state):
        grads = jax.grad(loss)(params)
        extra = record.update_kwargs(loss, params)
        updates, state = opt.update(grads, state, params, **extra)
        return lib.apply_updates(params, updates), state
    return step


def _trajectory(label: str, lib: Any, params: Any, loss: Callable, steps: int) -> Any:
    record, setting = SETTINGS[label]
    opt = record.make(lib, **setting.kwargs)
    step = _step_fn(opt, loss, record, lib)

    def body(carry, _):
        carry = step(*carry)
        return carry, carry[0]

    _, path = jax.jit(lambda p, s: jax.lax.scan(body, (p, s), length=steps))(
        params, opt.init(params))
    return path


def _cases_for(check: str) -> list[str]:
    return sorted(registry.settings(contrib=True, without=check))


def _make(label: str, lib: Any = functrain) -> Any:
    record, setting = SETTINGS[label]
    return record.make(lib, **setting.kwargs)


@pytest.mark.parametrize("name", _cases_for("parity"))
def test_matches_optax_contrib(name):
    params, loss = _params(name)
    ours = _trajectory(name, functrain, params, loss, 30)
    theirs = _trajectory(name, optax, params, loss, 30)
    for key in params:
        np.testing.assert_allclose(np.asarray(ours[key]), np.asarray(theirs[key]),
                                   rtol=2e-5, atol=2e-6, err_msg=f"{name}: leaf {key}")


def _parabola():
    final = jnp.array([1.0, -1.0, 1.0])
    return jnp.array([-1.0, 10.0, 1.0]), final, lambda p: jnp.sum((p - final) ** 2)


def _rosenbrock():
    return (jnp.zeros(2), jnp.array([1.0, 1.0]),
            lambda p: (1.0 - p[0]) ** 2 + 100.0 * (p[1] - p[0] ** 2) ** 2)


def _matrix_parabola():
    final = jnp.array([[3.0, -2.0], [1.0, 4.0]])
    return jnp.zeros((2, 2)), final, lambda p: jnp.sum((p - final) ** 2)


def _mixed():
    f1, f2 = jnp.array([1.0, -1.0, 2.0]), jnp.array([[1.0, 0.0], [-1.0, 1.0]])
    return ((jnp.zeros(3), jnp.zeros((2, 2))), (f1, f2),
            lambda p: jnp.sum((p[0] - f1) ** 2) + jnp.sum((p[1] - f2) ** 2))


TARGETS = {"parabola": _parabola, "rosenbrock": _rosenbrock,
           "matrix_parabola": _matrix_parabola, "mixed": _mixed}


@pytest.mark.parametrize("name", _cases_for("converges"))
def test_converges_on_optax_targets(name):
    record, _ = SETTINGS[name]
    failures = []
    for target_name, setup in TARGETS.items():
        init, final, loss = setup()
        opt = _make(name)
        step = _step_fn(opt, loss, record, functrain)

        def body(carry, _):
            return step(*carry), None

        params, state = jax.jit(lambda p, s: jax.lax.scan(body, (p, s), length=30_000)[0])(
            init, opt.init(init))
        if record.name.startswith("schedule_free"):
            params = functrain.contrib.schedule_free_eval_params(state, params)
        for got, want in zip(jax.tree_util.tree_leaves(params), jax.tree_util.tree_leaves(final)):
            if not np.allclose(got, want, rtol=3e-2, atol=3e-2):
                failures.append(f"{target_name}: {np.asarray(got)} vs {np.asarray(want)}")
    assert not failures, f"{name} did not converge: {failures}"


# optax's contrib tests keep these hyperparameters static under inject_hyperparams.
STATIC = ("warmup_steps", "num_betas", "clip_value_fn", "ns_steps", "rank", "update_proj_gap")


@pytest.mark.parametrize("name", _cases_for("inject"))
def test_inject_hyperparams(name):
    """``inject_hyperparams(factory)(**kwargs)``: optax's numbers (its own injected
    optimizer, to the parity tolerance), and the plain optimizer's up to the rounding of
    hyperparameters stored as float32 arrays (``1 - b2`` of a float32 0.999 is off by
    1e-5 relative: optax's injected optimizers differ from its plain ones as much)."""
    record, setting = SETTINGS[name]
    params, loss = _params(name)
    results = {}
    for lib in (functrain, optax):
        factory = record.factory(lib)
        static = tuple(a for a in STATIC if a in inspect.signature(factory).parameters)
        for label, opt in (("plain", factory(**setting.kwargs)),
                           ("injected", lib.inject_hyperparams(
                               factory, static_args=static)(**setting.kwargs))):
            step = jax.jit(_step_fn(opt, loss, record, lib))
            p, s = params, opt.init(params)
            for _ in range(5):
                p, s = step(p, s)
            results[lib.__name__, label] = p
    for key in params:
        np.testing.assert_allclose(results["functrain", "injected"][key],
                                   results["optax", "injected"][key], rtol=2e-5, atol=2e-6,
                                   err_msg=f"{name}: leaf {key}, injected, vs optax")
        np.testing.assert_allclose(results["functrain", "injected"][key],
                                   results["functrain", "plain"][key], rtol=1e-4, atol=1e-6,
                                   err_msg=f"{name}: leaf {key}, injected vs plain")


def _compiles(fn: Callable, *args: Any) -> int:
    before = fn._cache_size()
    fn(*args)
    return fn._cache_size() - before


@pytest.mark.parametrize("name", _cases_for("dtypes"))
def test_dtypes_kept_extra_args_ignored_no_recompile(name):
    record, _ = SETTINGS[name]
    params, loss = _params(name)
    params16 = jax.tree_util.tree_map(lambda p: p.astype(jnp.bfloat16), params)
    opt = _make(name)

    @jax.jit
    def step(p, s):
        grads = jax.grad(lambda q: loss(jax.tree_util.tree_map(
            lambda x: x.astype(jnp.float32), q)))(p)
        extra = record.update_kwargs(loss, p)
        updates, s = opt.update(grads, s, p, unexpected_extra_args_your_optimizer_ignores=1,
                                **extra)
        return functrain.apply_updates(p, updates), s, updates

    state = opt.init(params16)
    p, state, updates = step(params16, state)
    for key in params:
        assert updates[key].dtype == jnp.bfloat16, (name, key, updates[key].dtype)
        assert p[key].dtype == jnp.bfloat16, (name, key)
    assert _compiles(step, p, state) == 0, f"{name}: the step recompiled on its second call"


@pytest.mark.parametrize("name", _cases_for("multisteps"))
def test_multisteps_equals_large_batch(name):
    record, _ = SETTINGS[name]
    params, loss = _params(name)
    k = 3
    rng = np.random.default_rng(5)
    micro = [jax.tree_util.tree_map(
        lambda p: jnp.asarray(rng.standard_normal(p.shape), jnp.float32), params)
        for _ in range(k)]
    mean = jax.tree_util.tree_map(lambda *g: sum(g) / k, *micro)
    opt = _make(name)
    extra = record.update_kwargs(loss, params)

    big, _ = jax.jit(lambda g, s: opt.update(g, s, params, **extra))(mean, opt.init(params))
    multi = functrain.MultiSteps(_make(name), every_k_schedule=k)
    state = multi.init(params)
    update = jax.jit(lambda g, s: multi.update(g, s, params, **extra))
    for g in micro:
        updates, state = update(g, state)
    for key in params:
        np.testing.assert_allclose(updates[key], big[key], rtol=1e-5, atol=1e-6,
                                   err_msg=f"{name}: leaf {key}")
    mapped = functrain.tree_map_params(opt, lambda v: v * 0, opt.init(params))
    assert jax.tree_util.tree_structure(mapped) == jax.tree_util.tree_structure(
        opt.init(params))


@pytest.mark.parametrize("name", _cases_for("eval_shape"))
def test_state_from_shapes_alone(name):
    params, _ = _params(name)
    opt = _make(name)
    abstract = jax.tree_util.tree_map(lambda p: jax.ShapeDtypeStruct(p.shape, p.dtype), params)
    shapes = jax.eval_shape(opt.init, abstract)
    real = opt.init(params)
    got = jax.tree_util.tree_map(lambda x: (x.shape, x.dtype), shapes)
    want = jax.tree_util.tree_map(lambda x: (jnp.shape(x), jnp.result_type(x)), real)
    assert got == want, name


@pytest.mark.parametrize("name", _cases_for("donation"))
def test_state_has_distinct_buffers_and_donates(name):
    """No array sits in two places of the eager ``init``'s state (a donated step would
    refuse it), and two steps jitted with the state donated run."""
    record, _ = SETTINGS[name]
    params, loss = _params(name)
    opt = _make(name)
    state = opt.init(params)
    leaves = [x for x in jax.tree_util.tree_leaves(state) if hasattr(x, "shape")]
    assert len({id(x) for x in leaves}) == len(leaves), f"{name}: a buffer is shared in init"

    def step(p, s):
        grads = jax.grad(loss)(p)
        updates, s = opt.update(grads, s, p, **record.update_kwargs(loss, p))
        return functrain.apply_updates(p, updates), s

    run = jax.jit(step, donate_argnums=(0, 1))
    p = jax.tree_util.tree_map(jnp.copy, params)
    for _ in range(2):
        p, state = run(p, state)
    jax.block_until_ready(p)
