"""The checks each ``tests/families/`` family file runs on every optimizer it defines,
built with the arguments of its record in ``tests/registry.py``: unknown ``update``
keywords ignored and ``inject_hyperparams`` (:func:`check_extra_args_ignored_and_inject_hyperparams`),
float64 kept with optax's float64 numbers (:func:`check_float64_params_stay_float64`), and
optax's Rosenbrock convergence bar (:func:`assert_reaches_rosenbrock_minimum`).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

import functrain as ft
from functrain.jax_compat import enable_x64
from helpers import loss_value
from registry import REGISTRY


def small_tree(dtype: Any = jnp.float32, scalar: bool = True) -> dict:
    tree = {"w": jnp.arange(6, dtype=dtype).reshape(2, 3) / 7 - 0.3, "b": jnp.zeros(3, dtype)}
    if scalar:
        tree["s"] = jnp.asarray(0.5, dtype)
    return tree


def small_grads(dtype: Any = jnp.float32, steps: int = 3, scalar: bool = True) -> list:
    rng = np.random.default_rng(2)
    return [jax.tree_util.tree_map(
        lambda p: jnp.asarray(rng.standard_normal(p.shape), dtype), small_tree(dtype, scalar))
        for _ in range(steps)]


def run_steps(opt: Any, params: Any, grads: list, **extra: Any) -> tuple:
    """Eager steps (cheap once the primitives are compiled): [(params, updates)], state."""
    state, out = opt.init(params), []
    for g in grads:
        u, state = opt.update(g, state, params, value=loss_value(params), **extra)
        params = ft.apply_updates(params, u)
        out.append((params, u))
    return out, state


def check_extra_args_ignored_and_inject_hyperparams(name: str) -> None:
    """Unknown ``update`` keywords are ignored; ``inject_hyperparams`` gives the same numbers."""
    factory, kwargs = getattr(ft, name), dict(REGISTRY[name].args)
    params, grads = small_tree(), small_grads(steps=2)
    plain, _ = run_steps(factory(**kwargs), params, grads)
    noisy, _ = run_steps(factory(**kwargs), params, grads,
                         unknown_argument=jnp.ones(()), another="text")
    injected_opt = ft.inject_hyperparams(factory)(**kwargs)
    injected, state = run_steps(injected_opt, params, grads, unknown_argument=1.0)
    rate = "max_learning_rate" if name == "polyak_sgd" else "learning_rate"
    assert rate in state.hyperparams
    for (_, u1), (_, u2), (_, u3) in zip(plain, noisy, injected):
        for a, b, c in zip(*map(jax.tree_util.tree_leaves, (u1, u2, u3))):
            np.testing.assert_array_equal(a, b)
            np.testing.assert_allclose(c, a, rtol=2e-5, atol=1e-6, err_msg=name)
    assert any(np.any(np.asarray(u) != 0) for u in jax.tree_util.tree_leaves(plain[-1][1]))
    # Under jit the hyperparameters are traced: every factory must accept that.
    # (Lowering traces the whole step; compiling would add nothing but time.)
    jax.jit(lambda p, s, g: injected_opt.update(g, s, p, value=loss_value(p))).lower(
        params, state, grads[0])


def check_float64_params_stay_float64(name: str) -> None:
    """float64 params give float64 updates and states, with optax's float64 numbers."""
    factory, kwargs = getattr(ft, name), dict(REGISTRY[name].args)
    if name == "adafactor":  # its momentum is float32 unless told otherwise (as optax)
        kwargs = dict(kwargs, dtype_momentum=jnp.float64)
    with enable_x64(True):
        scalar = name != "sm3"  # optax's sm3 fails on scalar leaves
        params = small_tree(jnp.float64, scalar)
        grads = small_grads(jnp.float64, steps=2, scalar=scalar)
        out, state = run_steps(factory(**kwargs), params, grads)
        for p, u in out:
            for x in jax.tree_util.tree_leaves((p, u)):
                assert x.dtype == jnp.float64, name
        for x in jax.tree_util.tree_leaves(state):
            if jnp.issubdtype(x.dtype, jnp.floating):
                assert x.dtype == jnp.float64, (name, x.dtype)
        # The arithmetic is float64 as well: optax under x64 agrees far below
        # float32 rounding (any float32 step in between would show at ~1e-7).
        theirs, _ = run_steps(getattr(optax, name)(**kwargs), params, grads)
        for (p1, _), (p2, _) in zip(out, theirs):
            for a, b in zip(jax.tree_util.tree_leaves(p1), jax.tree_util.tree_leaves(p2)):
                np.testing.assert_allclose(a, b, rtol=1e-11, atol=1e-13, err_msg=name)
    assert not jax.config.jax_enable_x64


def rosenbrock(p: jax.Array) -> jax.Array:
    x, y = p[0], p[1]
    return (1.0 - x) ** 2 + 100.0 * (y - x ** 2) ** 2


def assert_reaches_rosenbrock_minimum(opt: Any) -> None:
    """optax's convergence bar: Rosenbrock (a=1, b=100) from (0, 0) to (1, 1) in 10,000 steps."""
    params = jnp.zeros(2)  # one leaf, as optax's test: the trust ratio sees the vector

    @jax.jit
    def run(params):
        def step(carry, _):
            p, s = carry
            u, s = opt.update(jax.grad(rosenbrock)(p), s, p)
            return (ft.apply_updates(p, u), s), None
        return jax.lax.scan(step, (params, opt.init(params)), None, length=10_000)[0][0]

    final = run(params)
    np.testing.assert_allclose(final, [1.0, 1.0], atol=3e-2)


