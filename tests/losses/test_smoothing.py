"""functrain.losses.smooth_labels against optax.losses: values and gradients on the same
one-hot labels (float32 jitted and eager, float64, bfloat16), ``axis`` and ``where``, and the
errors (a ``where`` that optax would broadcast against the wrong axis).

Rounding bound (``helpers.rounding_bound``): ``(1 - alpha) * labels + alpha / n`` rounds four
times values at most 1.
"""

import numpy as np
import jax.numpy as jnp
import optax.losses as ol
import pytest

from functrain import losses
from functrain.jax_compat import enable_x64
from functrain.losses.checks import LossInputError
from helpers import assert_losses_like_optax, loss_case

PAIR = (losses.smooth_labels, ol.smooth_labels)


def inputs(dtype=np.float32):
    rng = np.random.default_rng(4)
    labels = np.eye(4, dtype=dtype)[rng.integers(0, 4, (3, 2))]
    return labels, rng.random(labels.shape) < 0.7


def cases(labels, where, grads=True):
    g = dict(grad_argnums=(0,)) if grads else {}
    alpha = np.array([[[0.1]], [[0.2]], [[0.3]]], labels.dtype)
    return [loss_case(*PAIR, labels, 0.1, steps=4, **g),
            loss_case(*PAIR, labels, 0.2, steps=4, axis=0),
            loss_case(*PAIR, labels, 0.2, steps=4, axis=(0, 2)),
            loss_case(*PAIR, labels, 0.1, steps=4, where=where, **g),
            loss_case(*PAIR, labels, 0.1, steps=4, where=where, axis=1),
            loss_case(*PAIR, labels, 0.1, steps=4, where=where[:, :1]),   # a row: inf
            loss_case(*PAIR, labels, alpha, steps=4, **g)]


def test_float32_values_and_gradients_are_optaxs():
    assert_losses_like_optax(*cases(*inputs()))


def test_float64_and_bfloat16_values_are_optaxs():
    with enable_x64():
        assert_losses_like_optax(*cases(*inputs(np.float64)))
    assert_losses_like_optax(*cases(*inputs(jnp.bfloat16), grads=False))


def test_eager_values_are_optaxs():
    labels, where = inputs()
    assert_losses_like_optax(loss_case(*PAIR, labels, 0.1, steps=4, where=where), jit=False)


@pytest.mark.parametrize("call, error, words", [
    (lambda: losses.smooth_labels(np.eye(3, dtype=np.int32), 0.1), TypeError,
     "smooth_labels: labels must be a floating-point array"),
    (lambda: losses.smooth_labels(np.eye(3)[:2], 0.1, where=np.array([True, False])),
     LossInputError, "where of shape (2,) does not broadcast to the input's shape (2, 3)"),
    (lambda: losses.smooth_labels(np.eye(3)[:2], np.array([0.1, 0.2])), LossInputError,
     "alpha of shape (2,) does not broadcast to the shape of labels, (2, 3)"),
])
def test_bad_input_is_named_before_any_math(call, error, words):
    with pytest.raises(error) as info:
        call()
    assert words in str(info.value)


def test_optax_would_count_a_per_example_mask_along_the_class_axis():
    """optax sums a ``(batch,)`` mask over its own last axis (1 class counted for every
    example); functrain refuses it."""
    labels = jnp.asarray(np.eye(3, dtype=np.float32)[:2])
    mask = jnp.asarray(np.array([True, False]))
    np.testing.assert_allclose(ol.smooth_labels(labels, 0.1, where=mask)[0], [1.0, 0.1, 0.1])
    with pytest.raises(ValueError):
        losses.smooth_labels(labels, 0.1, where=mask)
