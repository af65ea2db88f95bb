"""functrain.losses.regression against optax.losses: values and gradients on the same random
inputs (float32 jitted and eager, float64, bfloat16), the ``axis``/``where``/``epsilon``
arguments, and the errors optax does not raise (or raises obscurely).

Rounding bounds (``helpers.rounding_bound``): the elementwise losses round a handful of times
(the difference, a square or absolute value, a ``logaddexp``, a constant: 4 steps) values at
most ``max e**2``; the cosine sums ``d`` squares and ``d`` products, takes a square root and
two divisions (``2 * d + 4`` steps) of values at most 1 once normalized.
"""

import jax.numpy as jnp
import numpy as np
import optax.losses as ol
import pytest

from functrain import losses
from functrain.jax_compat import enable_x64
from functrain.losses.checks import LossInputError
from helpers import assert_losses_like_optax, loss_case

ELEMENTWISE = ["squared_error", "l2_loss", "huber_loss", "log_cosh"]
COSINE = ["cosine_similarity", "cosine_distance"]


def inputs(dtype=jnp.float32, shape=(5, 7)):
    """Predictions, targets (numpy: no compilation) and a mask."""
    rng = np.random.default_rng(0)
    p = (3 * rng.standard_normal(shape)).astype(dtype)
    t = (3 * rng.standard_normal(shape)).astype(dtype)
    return p, t, rng.random(shape) < 0.7


def pair(name):
    return getattr(losses, name), getattr(ol, name)


def base_cases(p, t, grads=True):
    """Each regression loss on its defaults (gradients in both inputs)."""
    g = dict(grad_argnums=(0, 1)) if grads else {}
    big = float(np.max((p.astype(np.float64) - t) ** 2)) + 1
    return ([loss_case(*pair(name), p, t, steps=4, magnitude=big, **g) for name in ELEMENTWISE]
            + [loss_case(*pair(name), p, t, steps=2 * p.shape[-1] + 4, **g) for name in COSINE])


def test_float32_and_bfloat16_values_and_gradients_are_optaxs():
    p, t, w = inputs()
    big = float(np.max((p - t) ** 2)) + 1
    d, n = p.shape[-1], p.size
    zero, empty = p.copy(), w.copy()
    zero[0], empty[1] = 0.0, False
    variants = (
        [loss_case(*pair(name), p, steps=4, magnitude=big) for name in ELEMENTWISE]
        + [loss_case(*pair(name), p, np.round(t).astype(np.int32), steps=4, magnitude=big)
           for name in ELEMENTWISE]                                 # integer targets
        + [loss_case(*pair("huber_loss"), p, t[0], steps=4, magnitude=big, delta=delta)
           for delta in (0.3, 5.0)]                                 # targets broadcast
        + [loss_case(*pair("log_cosh"), p, t[:1], steps=4, magnitude=big)]
        + [loss_case(*pair(name), p, t, steps=2 * d + 4, epsilon=10.0) for name in COSINE]
        + [loss_case(*pair("cosine_similarity"), p, t, steps=2 * p.shape[0] + 4, axis=0),
           loss_case(*pair("cosine_distance"), p, t, steps=2 * n + 4, axis=(0, 1)),
           loss_case(*pair("cosine_similarity"), p, t, steps=2 * d + 4, where=w,
                     grad_argnums=(0, 1)),
           loss_case(*pair("cosine_distance"), p, t, steps=2 * p.shape[0] + 4, where=w,
                     epsilon=5.0, axis=0)]
        # a zero vector (NaN, 0 / 0) and a vector with nothing in `where` (0)
        + [loss_case(*pair(name), zero, t, steps=2 * d + 4, where=empty) for name in COSINE])
    bf16 = base_cases(*inputs(jnp.bfloat16, (3, 4))[:2], grads=False)
    out = assert_losses_like_optax(*base_cases(p, t), *variants, *bf16)
    similarity = out[-2 - len(bf16)]
    assert np.isnan(similarity[0]) and similarity[1] == 0.0


def test_float64_values_and_gradients_are_optaxs():
    with enable_x64():
        assert_losses_like_optax(*base_cases(*inputs(jnp.float64, (3, 4))[:2]))


def test_eager_values_are_optaxs():
    p, t, w = inputs(jnp.float32, (2, 3))
    assert_losses_like_optax(
        loss_case(*pair("huber_loss"), p, t, steps=4, magnitude=40.0, delta=0.5),
        loss_case(*pair("cosine_distance"), p, t, steps=10, where=w), jit=False)


def test_log_cosh_of_large_errors_does_not_overflow():
    got = losses.log_cosh(jnp.array([-100.0, 1e4, 1e30]))
    np.testing.assert_allclose(got, [100 - np.log(2), 1e4 - np.log(2), 1e30], rtol=1e-6)


def test_cosine_epsilon_floors_the_squared_norm():
    # |p|^2 = 5, |t|^2 = 3, epsilon 10: the cosine is <p, t> / (sqrt(10) * sqrt(10))
    got = losses.cosine_similarity(jnp.array([0.0, -1.0, 2.0]), jnp.array([1.0, 1.0, 1.0]),
                                   epsilon=10.0)
    np.testing.assert_allclose(got, 0.1, rtol=1e-6)


@pytest.mark.parametrize("call, error, words", [
    (lambda: losses.squared_error(np.ones((2, 3)), np.ones(3)), LossInputError,
     "squared_error: predictions and targets must have the same shape, got (2, 3) and (3,)"),
    (lambda: losses.l2_loss(jnp.array([1, 2])), TypeError,
     "l2_loss: predictions must be a floating-point array"),
    (lambda: losses.huber_loss(np.ones(3), np.ones((2, 3))), LossInputError,
     "targets of shape (2, 3) does not broadcast to the shape of predictions, (3,)"),
    (lambda: losses.log_cosh(np.ones(3), np.ones(3, np.complex64)), TypeError,
     "log_cosh: targets must hold real numbers"),
    (lambda: losses.cosine_similarity(np.ones((2, 3)), np.ones((2, 3)), axis=2),
     LossInputError, "axis=2 is out of range for an input with 2 dimensions"),
    (lambda: losses.cosine_similarity(np.ones((2, 3)), np.ones((2, 3)),
                                      where=jnp.array([True, False])),
     LossInputError, "where of shape (2,) does not broadcast to the input's shape (2, 3)"),
    (lambda: losses.cosine_similarity(np.ones((2, 3)), np.ones((2, 3)),
                                      where=np.ones((2, 3))),
     LossInputError, "where must be a boolean array, got float32"),
    (lambda: losses.cosine_distance(np.ones((2, 3)), np.ones((2, 3), np.int32)), TypeError,
     "cosine_distance: targets must be a floating-point array"),
])
def test_bad_input_is_named_before_any_math(call, error, words):
    with pytest.raises(error) as info:
        call()
    assert words in str(info.value)


def test_errors_have_optaxs_exception_types():
    """optax raises a ValueError for unequal shapes and a TypeError for integer predictions;
    a LossInputError is a ValueError (and a TypeError)."""
    for lib in (ol, losses):
        with pytest.raises(ValueError):
            lib.squared_error(np.ones((2, 3)), np.ones(3))
        with pytest.raises(TypeError):
            lib.l2_loss(jnp.array([1, 2]))
