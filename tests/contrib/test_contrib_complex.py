"""functrain.contrib.split_real_and_imaginary and normalize, against optax.contrib 0.2.8.

split_real_and_imaginary: a real optimizer (Adam, Lion, sign SGD) wrapped around
complex parameters gives optax's numbers step by step (30 jitted steps on a mixed
complex/real tree), and the same numbers as the unwrapped optimizer run by hand on
the real and imaginary parts as separate real parameters. normalize: optax's
numbers on real and complex trees, and a unit global norm.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import optax.contrib  # noqa: F401
import pytest

import functrain
from helpers import assert_same_trajectory, make_params

STEPS = 30


def _complex_tree(steps: int = STEPS):
    rng = np.random.default_rng(4)

    def c(*shape):
        mag = 10.0 ** rng.uniform(-2, 2, shape)
        return jnp.asarray(mag * (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)),
                           jnp.complex64)

    params = {"w": c(4, 3), "b": jnp.zeros(3, jnp.complex64), "r": jnp.ones((2, 2)),
              "s": jnp.asarray(0.5 - 0.5j, jnp.complex64)}
    grads = {"w": c(steps, 4, 3), "b": c(steps, 3),
             "r": jnp.asarray(rng.standard_normal((steps, 2, 2)), jnp.float32),
             "s": c(steps)}
    return params, grads


INNER = {
    "adam": lambda lib: lib.adam(1e-2),
    "lion": lambda lib: lib.lion(1e-3),
    "sign_sgd with clip": lambda lib: lib.chain(lib.clip(0.5), lib.sign_sgd(1e-2)),
}


@pytest.mark.parametrize("name", sorted(INNER))
def test_split_real_and_imaginary_matches_optax(name):
    params, grads = _complex_tree()
    assert_same_trajectory(
        functrain.contrib.split_real_and_imaginary(INNER[name](functrain)),
        optax.contrib.split_real_and_imaginary(INNER[name](optax)),
        params=params, grads=grads, name=name)


def test_split_equals_the_inner_optimizer_on_two_real_parameters():
    params, grads = _complex_tree(steps=5)
    tx = functrain.contrib.split_real_and_imaginary(functrain.adam(1e-2))
    real = functrain.adam(1e-2)
    as_pairs = lambda t: {k: (jnp.real(v), jnp.imag(v)) if jnp.iscomplexobj(v) else v  # noqa
                          for k, v in t.items()}
    state, real_state = tx.init(params), real.init(as_pairs(params))
    for t in range(5):
        g = {k: v[t] for k, v in grads.items()}
        u, state = tx.update(g, state, params)
        ur, real_state = real.update(as_pairs(g), real_state, as_pairs(params))
        for k in ("w", "b", "s"):
            np.testing.assert_array_equal(np.real(u[k]), ur[k][0])
            np.testing.assert_array_equal(np.imag(u[k]), ur[k][1])
        np.testing.assert_array_equal(u["r"], ur["r"])
    assert u["w"].dtype == jnp.complex64 and u["r"].dtype == jnp.float32


def test_split_state_holds_real_pairs():
    params, _ = _complex_tree()
    state = functrain.contrib.split_real_and_imaginary(functrain.scale_by_adam()).init(params)
    theirs = optax.contrib.split_real_and_imaginary(optax.scale_by_adam()).init(params)
    assert type(state).__name__ == "SplitRealAndImaginaryState"
    mu = state.inner_state.mu
    assert mu["w"].real.dtype == jnp.float32 and mu["w"].imaginary.shape == (4, 3)
    assert mu["r"].dtype == jnp.float32
    shapes = lambda s: [(x.shape, x.dtype) for x in jax.tree_util.tree_leaves(s)]  # noqa
    assert shapes(state) == shapes(theirs)


def test_split_passes_extra_args_and_checks_its_state():
    params = {"z": jnp.ones(2, jnp.complex64)}
    tx = functrain.contrib.split_real_and_imaginary(functrain.polyak_sgd(max_learning_rate=1.0))
    u, _ = tx.update({"z": jnp.array([1 + 1j, 0j], jnp.complex64)}, tx.init(params), params,
                     value=jnp.asarray(2.0))
    # Polyak: step = value / ||g||^2 = 2 / 2 = 1 over the real and imaginary parts together.
    np.testing.assert_allclose(np.asarray(u["z"]), [-1 - 1j, 0], rtol=1e-6)
    with pytest.raises(TypeError, match="expected its state as SplitRealAndImaginaryState"):
        tx.update(params, (), params)
    with pytest.raises(TypeError, match="not a GradientTransformation|GradientTransformation"):
        functrain.contrib.split_real_and_imaginary(lambda x: x)


# --------------------------------------------------------------------------
# normalize
# --------------------------------------------------------------------------

def test_normalize_matches_optax_and_has_unit_norm():
    for params in (make_params(), _complex_tree()[0]):
        grads = jax.tree_util.tree_map(lambda x: x + 1.5, params)
        ours, _ = jax.jit(functrain.contrib.normalize().update)(grads, functrain.EmptyState())
        theirs, _ = optax.contrib.normalize().update(grads, optax.EmptyState())
        for a, b in zip(jax.tree_util.tree_leaves(ours), jax.tree_util.tree_leaves(theirs)):
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(functrain.global_norm(ours), 1.0, rtol=1e-6)


def test_normalized_sgd_matches_optax_step_by_step():
    # SAM's adversarial optimizer: normalized gradient steps.
    assert_same_trajectory(
        functrain.chain(functrain.contrib.normalize(), functrain.sgd(0.05, momentum=0.5)),
        optax.chain(optax.contrib.normalize(), optax.sgd(0.05, momentum=0.5)),
        steps=STEPS, name="normalize + sgd")


def test_normalize_state_and_integer_leaves():
    tx = functrain.contrib.normalize()
    assert tx.init({"w": jnp.ones(2)}) == functrain.contrib.NormalizeState()
    with pytest.raises(TypeError, match=r"\['n'\] has dtype bool"):
        tx.update({"n": jnp.ones(2, jnp.bool_)}, tx.init(None))
    # Integer gradients are normalized as the floats they equal, in float32, as optax's.
    g = {"n": jnp.asarray([3, -4], jnp.int32)}
    ours = tx.update(g, tx.init(None))[0]["n"]
    theirs = optax.contrib.normalize().update(g, optax.contrib.normalize().init(None))[0]["n"]
    assert ours.dtype == theirs.dtype == jnp.float32
    np.testing.assert_allclose(ours, [0.6, -0.8], rtol=1e-6)
    np.testing.assert_allclose(ours, theirs, rtol=1e-6)
