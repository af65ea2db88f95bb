"""functrain.losses.ranking_softmax_loss against optax.losses: values and gradients on the same
random lists (float32 jitted and eager, float64, bfloat16), ``where``, ``weights`` and
``reduce_fn``, lists with no valid item, and the errors.

Rounding bound (``helpers.rounding_bound``): a log-softmax over ``L`` items (``L + 3``
roundings) and the labels' weighted sum (``2 * L + 1``), then the reduction over ``n`` lists:
``3 * L + 4 + n`` steps of ``(max|logits| + log(L) + 1) * max(labels * weights) * L``.
"""

import functools

import numpy as np
import jax.numpy as jnp
import optax.losses as ol
import pytest

from functrain import losses
from functrain.jax_compat import enable_x64
from functrain.losses.checks import LossInputError
from helpers import assert_losses_like_optax, loss_case

PAIR = (losses.ranking_softmax_loss, ol.ranking_softmax_loss)


def inputs(dtype=np.float32, shape=(3, 4, 6)):
    """Scores, relevance labels 0-2, a mask (the first list empty), weights."""
    rng = np.random.default_rng(5)
    logits = rng.standard_normal(shape).astype(dtype)
    labels = rng.integers(0, 3, shape).astype(dtype)
    where = rng.random(shape) < 0.6
    where.reshape(-1, shape[-1])[0] = False
    return logits, labels, where, rng.random(shape).astype(dtype)


def bound(logits):
    size, lists = logits.shape[-1], logits.size // logits.shape[-1]
    top = (float(np.abs(np.asarray(logits, np.float64)).max()) + np.log(size) + 1) * 2 * size
    return dict(steps=3 * size + 4 + lists, magnitude=top)


def cases(logits, labels, where, weights, grads=True):
    g = dict(grad_argnums=(0, 1)) if grads else {}
    b = bound(logits)
    return [loss_case(*PAIR, logits, labels, **b, **g),
            loss_case(*PAIR, logits, labels, **b, where=where, **g),
            loss_case(*PAIR, logits, labels, **b, where=where, weights=weights,
                      reduce_fn=None, **g)]


def test_float32_values_and_gradients_are_optaxs():
    """A list with nothing in ``where`` has loss 0 and no gradient; the mean leaves it out;
    with no list at all it is 0."""
    logits, labels, where, weights = inputs()
    b = bound(logits)
    assert_losses_like_optax(
        *cases(logits, labels, where, weights),
        loss_case(*PAIR, logits, labels, **b, reduce_fn=jnp.sum),
        loss_case(*PAIR, logits, labels, **b, reduce_fn=functools.partial(jnp.mean, axis=0)),
        loss_case(*PAIR, logits, labels, **b, weights=weights, grad_argnums=(0, 1)),
        loss_case(*PAIR, logits, labels, **b, where=where, reduce_fn=jnp.sum),
        loss_case(*PAIR, logits, labels, **b, where=np.zeros_like(where), grad_argnums=(0, 1)),
        loss_case(*PAIR, logits, labels[0, 0], **b, reduce_fn=None),
        loss_case(*PAIR, logits[0, 0], labels[0, 0], **b))


def test_float64_and_bfloat16_values_are_optaxs():
    with enable_x64():
        assert_losses_like_optax(*cases(*inputs(np.float64, (2, 5))))
    assert_losses_like_optax(*cases(*inputs(jnp.bfloat16, (2, 5)), grads=False))


def test_eager_values_are_optaxs():
    logits, labels, where, _ = inputs(np.float32, (2, 3))
    assert_losses_like_optax(loss_case(*PAIR, logits, labels, **bound(logits), where=where),
                             jit=False)


@pytest.mark.parametrize("call, error, words", [
    (lambda: losses.ranking_softmax_loss(np.ones((2, 3), np.int32), np.ones((2, 3))),
     TypeError, "ranking_softmax_loss: logits must be a floating-point array"),
    (lambda: losses.ranking_softmax_loss(np.ones(3), np.ones((2, 3))), LossInputError,
     "labels of shape (2, 3) does not broadcast to the shape of logits, (3,)"),
    (lambda: losses.ranking_softmax_loss(np.ones((2, 3)), np.ones((2, 3)),
                                         weights=np.ones((2, 2))),
     LossInputError, "weights of shape (2, 2) does not broadcast to the shape of logits"),
    (lambda: losses.ranking_softmax_loss(np.ones((2, 3)), np.ones((2, 3)),
                                         where=np.array([True, False])),
     LossInputError, "where of shape (2,) does not broadcast to the input's shape (2, 3)"),
    (lambda: losses.ranking_softmax_loss(np.ones((2, 3)), np.ones((2, 3)), reduce_fn="mean"),
     TypeError, "reduce_fn must be a function (jnp.mean, jnp.sum) or None, got 'mean'"),
    (lambda: losses.ranking_softmax_loss(np.array(1.0), np.array(1.0)), LossInputError,
     "logits must have a list axis (the last); got a scalar"),
])
def test_bad_input_is_named_before_any_math(call, error, words):
    with pytest.raises(error) as info:
        call()
    assert words in str(info.value)


def test_errors_have_optaxs_exception_types():
    for lib in (ol, losses):
        with pytest.raises(ValueError):      # a scalar: no list axis
            lib.ranking_softmax_loss(np.array(1.0), np.array(1.0))
        with pytest.raises(ValueError):      # jnp.max needs `initial` for a masked reduction
            lib.ranking_softmax_loss(np.ones((2, 3)), np.ones((2, 3)),
                                     where=np.ones((2, 3), bool), reduce_fn=jnp.max)
