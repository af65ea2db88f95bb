"""functrain.losses.classification against optax.losses: the softmax cross-entropies (with
``axis``, ``where``, integer labels, ``-inf`` logits), PolyLoss, the sigmoid cross-entropy and
the focal loss; values and gradients on the same random inputs (float32 jitted and eager,
float64, bfloat16), and the errors.

Rounding bounds (``helpers.rounding_bound``): a log-softmax over ``C`` classes rounds ``C + 3``
times (the maximum's subtraction, ``C`` exponentials summed, a ``log``) values of the size of
the logits, and the labels' weighted sum ``C + 1`` times more: ``2 * C + 4`` steps of
``max|logits| + log(C) + 1``. The sigmoid losses take two log-sigmoids, a weighted
log-sum-exp, an ``exp`` and products: 12 steps of the largest cross-entropy.
"""

import numpy as np
import jax.numpy as jnp
import optax.losses as ol
import pytest

from functrain import losses
from functrain.jax_compat import enable_x64
from functrain.losses.checks import LossInputError
from helpers import assert_losses_like_optax, loss_case

SHAPE = (4, 3, 5)
CE = ["softmax_cross_entropy", "poly_loss_cross_entropy"]


def pair(name):
    return getattr(losses, name), getattr(ol, name)


def inputs(dtype=np.float32, shape=SHAPE):
    """Logits, probability labels with zeros, a mask, a per-example mask, integer labels."""
    rng = np.random.default_rng(1)
    logits = (3 * rng.standard_normal(shape)).astype(dtype)
    labels = rng.random(shape) * (rng.random(shape) < 0.6)
    labels = (labels / np.maximum(labels.sum(-1, keepdims=True), 1e-3)).astype(dtype)
    where = rng.random(shape) < 0.7
    rows = rng.random(shape[:-1]) < 0.7
    classes = rng.integers(0, shape[-1], shape[:-1]).astype(np.int32)
    return logits, labels, where, rows, classes


def ce_steps(logits, classes):
    return dict(steps=2 * classes + 4, magnitude=float(np.abs(logits).max()) + np.log(classes) + 1)


def base_cases(logits, labels, classes, grads=True):
    g = dict(grad_argnums=(0, 1)) if grads else {}
    gl = dict(grad_argnums=(0,)) if grads else {}
    c = ce_steps(logits, logits.shape[-1])
    sigmoid = dict(steps=12, magnitude=float(np.abs(logits).max()) + 1)
    binary = (labels > 0).astype(labels.dtype)
    return [loss_case(*pair("softmax_cross_entropy"), logits, labels, **c, **g),
            loss_case(*pair("softmax_cross_entropy_with_integer_labels"), logits, classes,
                      **c, **gl),
            loss_case(*pair("safe_softmax_cross_entropy"), logits, labels, **c, **g),
            loss_case(*pair("poly_loss_cross_entropy"), logits, labels, **c, **g),
            loss_case(*pair("sigmoid_binary_cross_entropy"), logits, labels, **sigmoid, **g),
            loss_case(*pair("sigmoid_focal_loss"), logits, binary, **sigmoid, **gl)]


def test_float32_and_bfloat16_values_and_gradients_are_optaxs():
    logits, labels, where, rows, classes = inputs()
    n = logits.shape[0] * logits.shape[-1]
    c5, c3, c4, c15 = (ce_steps(logits, k) for k in (5, 3, 4, n))
    flat = classes[:, 0] * 3                    # flat indices into a (3, 5) slice
    by_rows = classes[0, :, None] % 4 + np.zeros((1, 5), np.int32)  # (3, 5) labels, axis 0
    wild = classes.copy()
    wild[0, 0], wild[1, 1], wild[2, 2] = -2, 7, -9    # negative, and out of range: NaN
    nothing = where.copy()
    nothing[0, 0] = False
    nothing[1, 1] = False
    g = dict(grad_argnums=(0, 1))
    # -inf logits: NaN (0 * -inf) in softmax_cross_entropy, 0 in the safe one; finite
    # gradients in the logits, -log_softmax (inf there) in the labels
    masked = logits.copy()
    masked[0, 0, 1] = masked[1, 1, 2] = -np.inf
    masked[2, 0] = -np.inf                               # every logit: NaN in both
    lab = labels.copy()
    lab[0, 0, 1] = lab[1, 1, 2] = 0.0
    infinite = [loss_case(*pair("safe_softmax_cross_entropy"), masked, lab, **c5, **g),
                loss_case(*pair("softmax_cross_entropy"), masked, lab, **c5, **g)]
    cases = [
        loss_case(*pair("softmax_cross_entropy"), logits, labels, **c4, axis=0),
        loss_case(*pair("poly_loss_cross_entropy"), logits, labels, **c15, axis=(0, 2)),
        loss_case(*pair("poly_loss_cross_entropy"), logits, labels, **c5, where=where,
                  epsilon=-1.0),
        loss_case(*pair("softmax_cross_entropy"), logits, labels, **c3, where=where, axis=1),
        loss_case(*pair("softmax_cross_entropy"), logits, labels, **c5, where=rows),
        loss_case(*pair("softmax_cross_entropy"), logits, labels, **c5, where=nothing, **g),
    ]
    integer = pair("softmax_cross_entropy_with_integer_labels")
    cases += [
        loss_case(*integer, logits, classes, **c5, where=where),
        loss_case(*integer, logits, classes, **c5, where=nothing, grad_argnums=(0,)),
        loss_case(*integer, logits, flat, **c15, axis=(2, 1)),
        loss_case(*integer, logits, by_rows, **c4, axis=0, where=where[0]),
        loss_case(*integer, logits, wild, **c5),
    ]
    # extreme logits, soft labels, alpha and gamma
    extreme = logits.copy()
    extreme[0, 0] = [100.0, -100.0, 30.0, -30.0, 1e4]
    binary = (labels > 0).astype(np.float32)
    sigmoid = dict(steps=12, magnitude=1e4)
    cases += [loss_case(*pair("sigmoid_binary_cross_entropy"), extreme, labels, **sigmoid,
                        grad_argnums=(0, 1)),
              loss_case(*pair("sigmoid_focal_loss"), extreme, labels, **sigmoid,
                        grad_argnums=(0,), alpha=0.7, gamma=3.0)]
    cases += [loss_case(*pair("sigmoid_focal_loss"), extreme, y, **sigmoid, **kw)
              for y, kw in ((binary, dict(alpha=0.25, gamma=0.5)), (binary, dict(gamma=0.0)))]
    cases += [loss_case(*pair("sigmoid_binary_cross_entropy"), logits, labels > 0, **sigmoid),
              loss_case(*pair("softmax_cross_entropy"), logits, labels[0, 0], **c5)]
    b16 = inputs(jnp.bfloat16, (3, 4))
    safe, plain = assert_losses_like_optax(*infinite, *base_cases(logits, labels, classes),
                                           *cases, *base_cases(b16[0], b16[1], b16[4],
                                                               grads=False))[:2]
    assert np.isfinite(safe[0, 0]) and np.isnan(plain[0, 0]) and np.isnan(safe[2, 0])


def test_float64_values_and_gradients_are_optaxs():
    with enable_x64():
        logits, labels, _, _, classes = inputs(np.float64, (3, 4))
        assert_losses_like_optax(*base_cases(logits, labels, classes))


def test_eager_values_are_optaxs():
    logits, labels, where, _, _ = inputs(np.float32, (2, 3))
    assert_losses_like_optax(loss_case(*pair("softmax_cross_entropy"), logits, labels,
                                       **ce_steps(logits, 3), where=where), jit=False)


@pytest.mark.parametrize("call, error, words", [
    (lambda: losses.softmax_cross_entropy(np.ones((2, 3), np.int32), np.ones((2, 3))),
     TypeError, "softmax_cross_entropy: logits must be a floating-point array"),
    (lambda: losses.softmax_cross_entropy(np.ones(3), np.ones((2, 3))), LossInputError,
     "labels of shape (2, 3) does not broadcast to the shape of logits, (3,)"),
    (lambda: losses.softmax_cross_entropy(np.ones((2, 3)), np.ones((2, 3)),
                                          where=np.array([1, 0])),
     LossInputError, "where must be a boolean array, got int32"),
    (lambda: losses.softmax_cross_entropy(np.ones((2, 3)), np.ones((2, 3)),
                                          where=np.ones((3, 3), bool)),
     LossInputError, "does not broadcast to the input's shape (2, 3) or to the loss's shape"),
    (lambda: losses.softmax_cross_entropy_with_integer_labels(np.ones((2, 3)),
                                                              np.array([0, 1, 1])),
     LossInputError, "labels must have the shape of logits without the class axes (1,), (2,);"
                     " got (3,)"),
    (lambda: losses.softmax_cross_entropy_with_integer_labels(np.ones((2, 3)),
                                                              np.array([0.0, 1.0])),
     TypeError, "labels must be an integer array of class indices, got float32"),
    (lambda: losses.softmax_cross_entropy_with_integer_labels(np.ones((2, 3)), np.array([1]),
                                                              axis=(1, 1)),
     LossInputError, "axis=(1, 1) names an axis twice"),
    (lambda: losses.poly_loss_cross_entropy(np.ones((2, 3)), np.ones((2, 3), np.int32)),
     TypeError, "poly_loss_cross_entropy: labels must be a floating-point array"),
    (lambda: losses.poly_loss_cross_entropy(np.ones((2, 3)), np.ones((2, 3)),
                                            where=np.array([True, False])),
     LossInputError, "where of shape (2,) does not broadcast to the input's shape (2, 3)."),
    (lambda: losses.sigmoid_binary_cross_entropy(np.ones(3), np.ones((2, 3))),
     LossInputError, "labels of shape (2, 3) does not broadcast to the shape of logits, (3,)"),
    (lambda: losses.safe_softmax_cross_entropy(np.ones(3, np.int32), np.ones(3)), TypeError,
     "safe_softmax_cross_entropy: logits must be a floating-point array"),
    (lambda: losses.sigmoid_focal_loss(np.ones(3), np.ones(3), alpha=1.5), ValueError,
     "sigmoid_focal_loss: alpha must be in [0.0, 1.0], got 1.5."),
    (lambda: losses.sigmoid_focal_loss(np.ones(3), np.ones(3), gamma=-1.0), ValueError,
     "sigmoid_focal_loss: gamma must be >= 0.0, got -1.0."),
])
def test_bad_input_is_named_before_any_math(call, error, words):
    with pytest.raises(error) as info:
        call()
    assert words in str(info.value)


def test_errors_have_optaxs_exception_types():
    for lib in (ol, losses):
        with pytest.raises(TypeError):   # integer logits
            lib.softmax_cross_entropy(np.ones((2, 3), np.int32), np.ones((2, 3)))
        with pytest.raises(TypeError):   # float class labels
            lib.softmax_cross_entropy_with_integer_labels(np.ones((2, 3)), np.ones(2))
        with pytest.raises(ValueError):  # a mask that does not broadcast
            lib.poly_loss_cross_entropy(np.ones((2, 3)), np.ones((2, 3)),
                                        where=np.array([True, False]))
