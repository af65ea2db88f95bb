"""Segmentation losses: the (Tversky-weighted) Dice loss, its binary form, and the generalized
Dice loss with automatic class weights.

optax.losses' functions with their signatures, defaults and numbers. The class (channel) axis
is the last; the shapes, ``axis``, ``class_weights`` and ``reduction`` are checked before any
array math. Where optax's check of ``apply_softmax=False`` / ``apply_sigmoid=False`` inputs
fails under ``jax.jit`` and rejects every single-channel probability map, functrain checks
concrete inputs only (sums to 1 for several classes, values in ``[0, 1]`` for one channel).
"""

from __future__ import annotations

from typing import Any, Optional

import jax
import jax.numpy as jnp

from functrain.losses import checks

Array = jax.Array

__all__ = ["dice_loss", "binary_dice_loss", "multiclass_generalized_dice_loss"]

_REDUCTIONS = ("mean", "sum", "none")
# The floor of a class's squared target volume in the generalized Dice weights
# 1 / (volume**2 + _VOLUME_FLOOR): a class absent from the targets gets a large finite weight.
_VOLUME_FLOOR = 1e-7


def _probabilities(owner: str, predictions: Array, apply: bool, flag: str) -> Array:
    """Softmax over the last axis (sigmoid for one channel), or a check of given ones."""
    if apply:
        if not jnp.issubdtype(predictions.dtype, jnp.floating):   # integer logits
            predictions = predictions.astype(jnp.result_type(float))
        if predictions.shape[-1] == 1:
            return jax.nn.sigmoid(predictions)
        return jax.nn.softmax(predictions, axis=-1)
    checks.check_probabilities(owner, "predictions", predictions, flag)
    return predictions


def _per_class_dice(owner: str, predictions: Any, targets: Any, smooth: Any, alpha: Any,
                    beta: Any, apply_softmax: bool, axis: Any, flag: str,
                    add_channel: bool = False) -> Array:
    """``[..., num_classes]`` Dice losses, one per example and class. With ``add_channel``,
    an input with one axis fewer than the other gets a channel axis ``[..., 1]``."""
    predictions = checks.numbers(owner, "predictions", predictions)
    targets = checks.numbers(owner, "targets", targets)
    if add_channel and predictions.ndim + 1 == targets.ndim:
        predictions = predictions[..., None]
    elif add_channel and targets.ndim + 1 == predictions.ndim:
        targets = targets[..., None]
    checks.has_last_axis(owner, "predictions", predictions)
    checks.same_shape(owner, "predictions", predictions, "targets", targets)
    ndim = predictions.ndim
    if axis is None:
        summed = tuple(range(1, ndim - 1))
    else:
        summed = checks.axes(owner, axis, ndim)
        if ndim - 1 in summed:
            raise checks.LossInputError(
                f"{owner}: axis={axis!r} includes the class axis (the last); name the "
                f"spatial axes to sum over.")
    p = _probabilities(owner, predictions, apply_softmax, flag)
    intersection = jnp.sum(p * targets, axis=summed)
    predicted = jnp.sum(p, axis=summed)
    actual = jnp.sum(targets, axis=summed)
    false_positives = predicted - intersection
    false_negatives = actual - intersection
    return 1 - (intersection + smooth) / (
        intersection + alpha * false_positives + beta * false_negatives + smooth)


def dice_loss(predictions: Any, targets: Any, *, class_weights: Optional[Any] = None,
              smooth: Any = 1.0, alpha: Any = 0.5, beta: Any = 0.5, apply_softmax: bool = True,
              reduction: str = "mean", ignore_background: bool = False,
              axis: Optional[Any] = None) -> Array:
    """The soft Dice loss of segmentation (Milletari et al., 2016), with Tversky weights.

    Per class ``c``, with ``I`` the sum of ``p * t`` (the soft intersection), ``P`` of the
    predicted probabilities ``p`` and ``T`` of the targets ``t`` over the spatial axes:
    ``1 - (I + smooth) / (I + alpha * (P - I) + beta * (T - I) + smooth)``. ``alpha`` weighs
    the false positives ``P - I``, ``beta`` the false negatives ``T - I``; the default 0.5 and
    0.5 give the Dice coefficient, other values the Tversky loss. The per-class losses are
    weighted by ``class_weights`` and reduced over the classes by ``reduction``.

    Args:
      predictions: logits of shape ``[..., num_classes]`` (a softmax over the last axis
        gives ``p``; a sigmoid for a single channel ``[..., 1]``), or probabilities with
        ``apply_softmax=False``.
      targets: one-hot (or soft) targets of the same shape (binary maps: one of the two
        may be ``[...]`` and the other ``[..., 1]``).
      class_weights: ``None`` or a weight per class, shape ``[num_classes]``.
      smooth: added to the numerator and denominator (no division by zero, smoother
        gradients).
      alpha: the weight of false positives.
      beta: the weight of false negatives.
      apply_softmax: whether ``predictions`` are logits (``True``) or probabilities.
      reduction: ``'mean'`` or ``'sum'`` over the classes, or ``'none'``.
      ignore_background: leave out class 0 (when there are several classes).
      axis: the axes summed over; ``None``: all but the first (batch) and the last
        (classes).

    Returns:
      The losses: shape ``[batch...]`` for ``'mean'``/``'sum'``, ``[batch..., num_classes]``
      for ``'none'``.

    Raises:
      LossInputError: the shapes, ``axis`` (which may not include the class axis),
        ``class_weights`` or ``reduction`` do not fit, or concrete ``predictions`` given
        with ``apply_softmax=False`` are not probabilities.

    >>> import jax.numpy as jnp
    >>> from functrain.losses import dice_loss
    >>> logits = jnp.array([[[2.0, -1.0], [0.5, 0.5]]])         # 1 image, 2 pixels, 2 classes
    >>> targets = jnp.array([[[1.0, 0.0], [1.0, 0.0]]])
    >>> dice_loss(logits, targets)
    Array([0.15764567], dtype=float32)
    """
    owner = "dice_loss"
    if reduction not in _REDUCTIONS:
        raise checks.LossInputError(f"{owner}: reduction must be one of {_REDUCTIONS}, got "
                                    f"{reduction!r}.")
    dice = _per_class_dice(owner, predictions, targets, smooth, alpha, beta, apply_softmax,
                           axis, "apply_softmax=False", add_channel=True)
    num_classes = dice.shape[-1]
    if class_weights is not None:
        class_weights = checks.numbers(owner, "class_weights", class_weights)
        if class_weights.shape != (num_classes,):
            raise checks.LossInputError(
                f"{owner}: class_weights must have shape ({num_classes},), one weight per "
                f"class; got {class_weights.shape}.")
    if ignore_background and num_classes > 1:
        dice = dice[..., 1:]
        class_weights = None if class_weights is None else class_weights[1:]
    if class_weights is not None:
        dice = dice * class_weights
    if reduction == "mean":
        return jnp.mean(dice, axis=-1)
    if reduction == "sum":
        return jnp.sum(dice, axis=-1)
    return dice


def binary_dice_loss(predictions: Any, targets: Any, *, smooth: Any = 1.0,
                     apply_sigmoid: bool = True) -> Array:
    """The soft Dice loss of binary segmentation: :func:`dice_loss` of one channel.

    ``1 - (2 * I + smooth) / (P + T + smooth)`` with ``p = sigmoid(predictions)``,
    ``I = sum(p * t)``, ``P = sum(p)``, ``T = sum(t)`` over all axes but the first (batch).
    Predictions of shape ``[...]`` get a channel axis ``[..., 1]``; a last axis of length 1
    is that channel.

    Args:
      predictions: logits of shape ``[...]`` or ``[..., 1]`` (floats), or probabilities in
        ``[0, 1]`` with ``apply_sigmoid=False``.
      targets: 0/1 (or soft) targets of shape ``[...]`` or ``[..., 1]``.
      smooth: added to the numerator and denominator.
      apply_sigmoid: whether ``predictions`` are logits.

    Returns:
      The losses, one per entry of the first (batch) axis.

    Raises:
      TypeError: ``predictions`` are not floats.
      LossInputError: the shapes do not fit, or concrete probabilities given with
        ``apply_sigmoid=False`` are outside ``[0, 1]``.

    >>> import jax.numpy as jnp
    >>> from functrain.losses import binary_dice_loss
    >>> binary_dice_loss(jnp.array([[3.0, -3.0, 2.0]]), jnp.array([[1.0, 0.0, 1.0]]))
    Array([0.03639889], dtype=float32)
    """
    owner = "binary_dice_loss"
    predictions = checks.floats(owner, "predictions", predictions)
    targets = checks.numbers(owner, "targets", targets)
    checks.has_last_axis(owner, "predictions", predictions, "batch or channel")
    checks.has_last_axis(owner, "targets", targets, "batch or channel")
    if predictions.shape[-1] != 1:
        predictions = predictions[..., None]
    if targets.shape[-1] != 1:
        targets = targets[..., None]
    dice = _per_class_dice(owner, predictions, targets, smooth, 0.5, 0.5, apply_sigmoid, None,
                           "apply_sigmoid=False")
    return dice[..., 0]


def multiclass_generalized_dice_loss(predictions: Any, targets: Any, *, smooth: Any = 1.0,
                                     apply_softmax: bool = True,
                                     ignore_background: bool = False) -> Array:
    """The generalized Dice loss (Sudre et al., 2017): Dice weighted against class imbalance.

    Each class gets the weight ``w_c = 1 / (V_c**2 + 1e-7)``, ``V_c`` its volume in the
    targets (their sum over everything but the class axis), so rare classes count as much
    as frequent ones; the weights are scaled to sum to the number of classes, the per-class
    Dice losses of :func:`dice_loss` are averaged with them over the classes kept, and the
    result averaged over the batch.

    Args:
      predictions: logits of shape ``[..., num_classes]``, or probabilities with
        ``apply_softmax=False``.
      targets: one-hot (or soft) targets of the same shape.
      smooth: added to each class's Dice numerator and denominator.
      apply_softmax: whether ``predictions`` are logits.
      ignore_background: leave out class 0 (its weight still counts in the scaling).

    Returns:
      The loss, a scalar.

    Raises:
      LossInputError: the shapes do not fit, or concrete ``predictions`` given with
        ``apply_softmax=False`` are not probabilities.

    >>> import jax.numpy as jnp
    >>> from functrain.losses import multiclass_generalized_dice_loss
    >>> logits = jnp.array([[[2.0, -1.0], [0.5, 0.5], [-1.0, 1.0]]])
    >>> targets = jnp.array([[[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]]])
    >>> multiclass_generalized_dice_loss(logits, targets)
    Array(0.14436156, dtype=float32)
    """
    owner = "multiclass_generalized_dice_loss"
    dice = _per_class_dice(owner, predictions, targets, smooth, 0.5, 0.5, apply_softmax, None,
                           "apply_softmax=False")
    targets = jnp.asarray(targets)
    num_classes = targets.shape[-1]
    volumes = jnp.sum(targets, axis=tuple(range(targets.ndim - 1)))
    weights = 1.0 / (volumes ** 2 + _VOLUME_FLOOR)
    weights = num_classes * weights / jnp.sum(weights)
    if ignore_background and num_classes > 1:
        dice, weights = dice[..., 1:], weights[1:]
    return jnp.mean(jnp.mean(dice * weights, axis=-1))
