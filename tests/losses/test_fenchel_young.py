"""functrain.losses.make_fenchel_young_loss against optax.losses: the loss of ``logsumexp``
(the softmax cross-entropy) and of ``max``, with leading batch axes and broadcast targets
(float32 jitted and eager, float64, bfloat16), gradients in scores and targets; keyword
arguments reach ``max_fun`` (optax drops them); the errors.

Rounding bound (``helpers.rounding_bound``): a log-sum-exp over ``d`` entries (``d + 3``
roundings) and an inner product (``d``): ``2 * d + 3`` steps of ``max|scores| + log(d) + 1``.
"""

import numpy as np
import jax.numpy as jnp
import optax.losses as ol
import pytest
from jax.scipy.special import logsumexp

from functrain import losses
from functrain.jax_compat import enable_x64
from functrain.losses.checks import LossInputError
from helpers import assert_losses_like_optax, loss_case

LSE = (losses.make_fenchel_young_loss(logsumexp), ol.make_fenchel_young_loss(logsumexp))


def inputs(dtype=np.float32, shape=(3, 4, 5)):
    rng = np.random.default_rng(9)
    scores = rng.standard_normal(shape).astype(dtype)
    y = rng.random(shape)
    return scores, (y / y.sum(-1, keepdims=True)).astype(dtype)


def bound(scores):
    d = scores.shape[-1]
    return dict(steps=2 * d + 3,
                magnitude=float(np.abs(np.asarray(scores, np.float64)).max()) + np.log(d) + 1)


def test_float32_values_and_gradients_are_optaxs():
    scores, y = inputs()
    b = bound(scores)
    top = (losses.make_fenchel_young_loss(jnp.max), ol.make_fenchel_young_loss(jnp.max))
    g = dict(grad_argnums=(0, 1))
    got = assert_losses_like_optax(
        loss_case(*LSE, scores, y, **b, **g),
        loss_case(*LSE, scores, y[0, 0], **b, **g),
        loss_case(*LSE, scores[0, 0], y[0, 0], **b),
        loss_case(*top, scores, y, **b, **g),
        loss_case(*LSE, np.round(scores).astype(np.int32), y, **b))
    # with logsumexp it is the softmax cross-entropy
    np.testing.assert_allclose(got[0], losses.softmax_cross_entropy(scores, y), rtol=1e-6)


def test_float64_and_bfloat16_values_are_optaxs():
    with enable_x64():
        scores, y = inputs(np.float64)
        assert_losses_like_optax(loss_case(*LSE, scores, y, **bound(scores),
                                           grad_argnums=(0, 1)))
    scores, y = inputs(jnp.bfloat16)
    assert_losses_like_optax(loss_case(*LSE, scores, y, **bound(scores)))


def test_eager_values_are_optaxs():
    scores, y = inputs(np.float32, (2, 3))
    assert_losses_like_optax(loss_case(*LSE, scores, y, **bound(scores)), jit=False)


def test_keyword_arguments_reach_max_fun():
    """``loss(scores, targets, scale=2.0)`` is ``max_fun(scores, scale=2.0) - <scores, y>``;
    optax 0.2.8 calls ``max_fun(scores)`` and drops the keyword."""
    def smooth_max(s, scale=1.0):
        return logsumexp(s * scale) / scale

    scores, y = inputs(np.float32, (2, 3))
    got = losses.make_fenchel_young_loss(smooth_max)(scores, y, scale=2.0)
    want = logsumexp(2 * scores, axis=-1) / 2 - (scores * y).sum(-1)
    np.testing.assert_allclose(got, want, rtol=1e-6)
    dropped = ol.make_fenchel_young_loss(smooth_max)(scores, y, scale=2.0)
    np.testing.assert_allclose(dropped, losses.make_fenchel_young_loss(smooth_max)(scores, y),
                               rtol=1e-6)


def test_bad_input_is_named():
    loss = LSE[0]
    with pytest.raises(TypeError, match="max_fun must be a function of a vector, got 3"):
        losses.make_fenchel_young_loss(3)
    with pytest.raises(TypeError, match="max_fun's other arguments by keyword"):
        loss(np.ones(3), np.ones(3), 1.0)
    with pytest.raises(LossInputError, match="targets of shape .2, 3. does not broadcast"):
        loss(np.ones(3), np.ones((2, 3)))
    with pytest.raises(TypeError):        # optax: extra positional arguments
        LSE[1](np.ones(3), np.ones(3), 1.0)
