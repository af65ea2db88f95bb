"""Classification losses on logits: softmax cross-entropies, PolyLoss, sigmoid cross-entropy
and the focal loss.

optax.losses' functions with their signatures, defaults and numbers. Logits must be floats;
labels must broadcast to the logits' shape (class probabilities) or have the logits' shape
without the class axes (integer labels), checked before any array math, where optax would let
a label array of a larger shape grow the result, or fail inside ``jnp``.
"""

from __future__ import annotations

from typing import Any, Optional

import jax
import jax.numpy as jnp

from functrain.arg_checks import check_range
from functrain.losses import checks
from functrain.losses.checks import Axis
from functrain.losses.primitives import class_values, log_softmax, masked_sum, times_log

Array = jax.Array

__all__ = ["softmax_cross_entropy", "softmax_cross_entropy_with_integer_labels",
           "safe_softmax_cross_entropy", "poly_loss_cross_entropy",
           "sigmoid_binary_cross_entropy", "sigmoid_focal_loss"]


def _logits_and_labels(owner: str, logits: Any, labels: Any, float_labels: bool = False
                       ) -> tuple:
    logits = checks.floats(owner, "logits", logits)
    labels = (checks.floats if float_labels else checks.numbers)(owner, "labels", labels)
    checks.fits_shape(owner, "labels", labels, "logits", logits.shape)
    return logits, labels


def softmax_cross_entropy(logits: Any, labels: Any, axis: Axis = -1,
                          where: Optional[Any] = None) -> Array:
    """The cross-entropy of class probabilities ``labels`` and ``softmax(logits)``.

    ``-sum(labels * log_softmax(logits))`` over the class axis (or axes), the softmax and
    the sum restricted to the entries where ``where`` holds. A ``-inf`` logit with a zero
    label gives NaN (``0 * -inf``); :func:`safe_softmax_cross_entropy` gives 0 there.

    Args:
      logits: unnormalized log-probabilities (floats), shape ``[..., num_classes]``.
      labels: class probabilities (e.g. one-hot), broadcastable to ``logits``'s shape.
      axis: the class axis or axes.
      where: a boolean mask of ``logits``'s shape (or broadcastable to it): the classes
        that count. A mask of the output's shape (one entry per example) masks whole
        examples, whose loss is 0.

    Returns:
      The cross-entropies, ``logits``'s shape without ``axis``.

    Raises:
      TypeError: ``logits`` are not floats.
      LossInputError: the shapes, ``axis`` or ``where`` do not fit.

    >>> import jax.numpy as jnp
    >>> from functrain.losses import softmax_cross_entropy
    >>> logits = jnp.array([[1.2, -0.8, -0.5], [0.9, -1.2, 1.1]])
    >>> labels = jnp.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
    >>> softmax_cross_entropy(logits, labels)
    Array([0.2761297, 2.951799 ], dtype=float32)
    """
    owner = "softmax_cross_entropy"
    logits, labels = _logits_and_labels(owner, logits, labels)
    reduced = checks.axes(owner, axis, logits.ndim)
    where = checks.where_mask(owner, where, logits.shape, reduced, per_example=True)
    return -masked_sum(labels * log_softmax(logits, reduced, where), reduced, where)


def softmax_cross_entropy_with_integer_labels(logits: Any, labels: Any, axis: Axis = -1,
                                              where: Optional[Any] = None) -> Array:
    """The cross-entropy of integer class labels and ``softmax(logits)``.

    ``logsumexp(logits) - logits[label]`` for each example, the ``logsumexp`` over the
    classes where ``where`` holds; an example with no class in ``where`` has loss 0. With
    several class axes, a label is a flat (C order) index into the slice
    ``logits.shape[axis]``, the axes taken in the order given. A label out of
    ``[-num_classes, num_classes)`` gives NaN.

    Args:
      logits: unnormalized log-probabilities (floats), shape ``[..., num_classes]``.
      labels: integer class indices, shape ``logits.shape`` without ``axis``.
      axis: the class axis or axes.
      where: a boolean mask of ``logits``'s shape (or broadcastable to it), or of the
        output's shape (masking whole examples).

    Returns:
      The cross-entropies, of ``labels``'s shape.

    Raises:
      TypeError: ``logits`` are not floats or ``labels`` not integers.
      LossInputError: the shapes, ``axis`` or ``where`` do not fit.

    >>> import jax.numpy as jnp
    >>> from functrain.losses import softmax_cross_entropy_with_integer_labels
    >>> logits = jnp.array([[1.2, -0.8, -0.5], [0.9, -1.2, 1.1]])
    >>> softmax_cross_entropy_with_integer_labels(logits, jnp.array([0, 1]))
    Array([0.2761297, 2.951799 ], dtype=float32)
    """
    owner = "softmax_cross_entropy_with_integer_labels"
    logits = checks.floats(owner, "logits", logits)
    labels = checks.integers(owner, "labels", labels)
    reduced = checks.axes(owner, axis, logits.ndim)
    expected = checks.batch_shape(logits.shape, reduced)
    if labels.shape != expected:
        raise checks.LossInputError(
            f"{owner}: labels must have the shape of logits without the class axes "
            f"{reduced}, {expected}; got {labels.shape}.")
    where = checks.where_mask(owner, where, logits.shape, reduced, per_example=True)
    label_logits = class_values(logits, labels, reduced)
    if where is None:
        return jax.nn.logsumexp(logits, axis=reduced) - label_logits
    where = jnp.broadcast_to(where, logits.shape)
    present = jnp.any(where, axis=reduced)
    # An example with nothing in `where` gets 0, and no NaN gradient: its logsumexp (of
    # nothing: -inf) is taken over all its classes instead and then dropped.
    rows = jnp.logical_or(where, ~jnp.expand_dims(present, reduced))
    loss = jax.nn.logsumexp(logits, axis=reduced, where=rows) - label_logits
    return jnp.where(present, loss, jnp.zeros_like(loss))


def safe_softmax_cross_entropy(logits: Any, labels: Any) -> Array:
    """The softmax cross-entropy, with ``0 * log(0)`` taken as 0.

    ``-sum(labels * log_softmax(logits))`` over the last axis, where a zero label times the
    ``-inf`` log-probability of a ``-inf`` logit counts 0 (not NaN, as in
    :func:`softmax_cross_entropy`). The gradient with respect to the logits is finite
    there; with respect to the labels it is ``-log_softmax(logits)`` (``inf`` there), as the
    product's derivative. All logits ``-inf`` still give NaN.

    Args:
      logits: unnormalized log-probabilities (floats), shape ``[..., num_classes]``.
      labels: class probabilities, broadcastable to ``logits``'s shape.

    Returns:
      The cross-entropies, shape ``[...]``.

    Raises:
      TypeError: ``logits`` are not floats.
      LossInputError: ``labels`` does not broadcast to ``logits``'s shape.

    >>> import jax.numpy as jnp
    >>> from functrain.losses import safe_softmax_cross_entropy
    >>> safe_softmax_cross_entropy(jnp.array([0.0, -jnp.inf]), jnp.array([1.0, 0.0]))
    Array(0., dtype=float32)
    """
    logits, labels = _logits_and_labels("safe_softmax_cross_entropy", logits, labels)
    return -jnp.sum(times_log(labels, log_softmax(logits, (logits.ndim - 1,))), axis=-1)


def poly_loss_cross_entropy(logits: Any, labels: Any, *, epsilon: Any = 2.0,
                            axis: Axis = -1, where: Optional[Any] = None) -> Array:
    """PolyLoss (Leng et al., 2022): the cross-entropy plus ``epsilon`` times ``1 - p_t``.

    ``softmax_cross_entropy(logits, labels) + epsilon * sum(labels * (1 - softmax(logits)))``
    over the class axes (and ``where``); for probability labels the second sum is ``1 - p_t``,
    ``p_t`` the probability the model gives the labels. The paper recommends
    ``epsilon = 2`` for ImageNet classification, ``-1`` for detection.

    Args:
      logits: unnormalized log-probabilities (floats), shape ``[..., num_classes]``.
      labels: class probabilities (floats), broadcastable to ``logits``'s shape.
      epsilon: the coefficient of the first polynomial term ``1 - p_t``.
      axis: the class axis or axes.
      where: a boolean mask broadcastable to ``logits``'s shape: the classes that count.

    Returns:
      The losses, ``logits``'s shape without ``axis``.

    Raises:
      TypeError: ``logits`` or ``labels`` are not floats.
      LossInputError: the shapes, ``axis`` or ``where`` do not fit.

    >>> import jax.numpy as jnp
    >>> from functrain.losses import poly_loss_cross_entropy
    >>> poly_loss_cross_entropy(jnp.array([0.0, 0.0]), jnp.array([1.0, 0.0]))
    Array(1.6931472, dtype=float32)
    """
    owner = "poly_loss_cross_entropy"
    logits, labels = _logits_and_labels(owner, logits, labels, float_labels=True)
    reduced = checks.axes(owner, axis, logits.ndim)
    where = checks.where_mask(owner, where, logits.shape, reduced)
    log_p = log_softmax(logits, reduced, where)
    cross_entropy = -masked_sum(labels * log_p, reduced, where)
    one_minus_pt = masked_sum(labels * (1 - jax.nn.softmax(logits, axis=reduced, where=where)),
                              reduced, where)
    return cross_entropy + epsilon * one_minus_pt


def _as_label_numbers(labels: Array, logits: Array) -> Array:
    """Integer or boolean labels as the logits' float dtype (what jnp's promotion gives)."""
    return labels if jnp.issubdtype(labels.dtype, jnp.floating) else labels.astype(logits.dtype)


def sigmoid_binary_cross_entropy(logits: Any, labels: Any) -> Array:
    """The cross-entropy of independent binary predictions, elementwise.

    ``-labels * log(sigmoid(logits)) - (1 - labels) * log(1 - sigmoid(logits))``, with
    ``log(sigmoid(x))`` computed stably (``-softplus(-x)``). For binary or multi-label
    classification (each class an independent yes/no); ``labels`` may also be
    probabilities in ``[0, 1]``.

    Args:
      logits: the log-odds of each prediction (floats).
      labels: 0/1 labels or probabilities (booleans and integers count as numbers),
        broadcastable to ``logits``'s shape.

    Returns:
      The elementwise losses, shaped like ``logits``.

    Raises:
      TypeError: ``logits`` are not floats.
      LossInputError: ``labels`` does not broadcast to ``logits``'s shape.

    >>> import jax.numpy as jnp
    >>> from functrain.losses import sigmoid_binary_cross_entropy
    >>> sigmoid_binary_cross_entropy(jnp.array([0.0, 2.0]), jnp.array([1.0, 0.0]))
    Array([0.6931472, 2.126928 ], dtype=float32)
    """
    logits, labels = _logits_and_labels("sigmoid_binary_cross_entropy", logits, labels)
    labels = _as_label_numbers(labels, logits)
    log_p, log_not_p = _log_sigmoids(logits)
    return -labels * log_p - (1.0 - labels) * log_not_p


def _log_sigmoids(logits: Array) -> tuple:
    """``(log(p), log(1 - p))`` for ``p = sigmoid(logits)``, each without overflow."""
    return jax.nn.log_sigmoid(logits), jax.nn.log_sigmoid(-logits)


def sigmoid_focal_loss(logits: Any, labels: Any, *, alpha: Optional[Any] = None,
                       gamma: Any = 2.0) -> Array:
    """The focal loss (Lin et al., 2017): the sigmoid cross-entropy scaled by
    ``(1 - p_t)**gamma``, elementwise.

    ``p_t = p * labels + (1 - p) * (1 - labels)`` is the probability of the correct outcome
    (``p = sigmoid(logits)``), so confident correct predictions count little. The factor
    is computed in log space, ``exp(gamma * log(1 - p_t))`` with
    ``log(1 - p_t) = log((1 - labels) * exp(log(p)) + labels * exp(log(1 - p)))`` taken as
    one weighted log-sum-exp, which stays accurate for extreme logits and any ``gamma``. With ``alpha``, the loss is
    also weighted by ``alpha`` for positives and ``1 - alpha`` for negatives
    (``alpha * labels + (1 - alpha) * (1 - labels)``). Labels may be soft, in ``[0, 1]``.

    Args:
      logits: the log-odds of each prediction (floats).
      labels: 0/1 labels or probabilities in ``[0, 1]``, broadcastable to ``logits``'s
        shape.
      alpha: ``None`` (no weighting) or the weight of positives, in ``[0, 1]``.
      gamma: the focusing exponent, ``>= 0``; 0 gives the sigmoid cross-entropy.

    Returns:
      The elementwise losses, shaped like ``logits``.

    Raises:
      TypeError: ``logits`` are not floats.
      LossInputError: ``labels`` does not broadcast to ``logits``'s shape.
      ValueError: a concrete ``alpha`` outside ``[0, 1]`` or ``gamma < 0`` (optax accepts
        them, giving negative weights or a factor that grows with confidence).

    >>> import jax.numpy as jnp
    >>> from functrain.losses import sigmoid_focal_loss
    >>> sigmoid_focal_loss(jnp.array([0.0, 3.0]), jnp.array([1.0, 1.0]))
    Array([1.7328680e-01, 1.0928333e-04], dtype=float32)
    """
    owner = "sigmoid_focal_loss"
    logits, labels = _logits_and_labels(owner, logits, labels)
    if alpha is not None:
        check_range("alpha", alpha, 0.0, 1.0, high_inclusive=True, owner=owner)
    check_range("gamma", gamma, 0.0, owner=owner)
    labels = _as_label_numbers(labels, logits)
    log_p, log_not_p = _log_sigmoids(logits)
    cross_entropy = -labels * log_p - (1.0 - labels) * log_not_p
    # log(1 - p_t) = log((1 - labels) * p + labels * (1 - p)), as one weighted logsumexp.
    log_one_minus_pt = jax.nn.logsumexp(jnp.stack([log_p, log_not_p]), axis=0,
                                        b=jnp.stack([1.0 - labels, labels]))
    loss = jnp.exp(gamma * log_one_minus_pt) * cross_entropy
    if alpha is None:
        return loss
    weight = alpha * labels + (1.0 - alpha) * (1.0 - labels)
    return weight * loss
