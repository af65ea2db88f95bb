"""Regression losses: squared error, L2, Huber, log-cosh, cosine similarity and distance.

optax.losses' regression functions with their signatures, defaults and numbers. Each checks
its inputs first (:mod:`functrain.losses.checks`): predictions must be floats, and targets
must have the predictions' shape (``squared_error``, ``l2_loss``, as optax) or broadcast to it
(the others; optax would also let targets of a larger shape grow the result).
"""

from __future__ import annotations

from typing import Any, Optional

import jax
import jax.numpy as jnp

from functrain.losses import checks
from functrain.losses.checks import Axis
from functrain.losses.primitives import masked_sum, unit_vectors

Array = jax.Array

__all__ = ["squared_error", "l2_loss", "huber_loss", "log_cosh", "cosine_similarity",
           "cosine_distance"]


def _errors(owner: str, predictions: Any, targets: Any, same: bool) -> Array:
    """``predictions - targets`` (``predictions`` alone when targets are None), checked."""
    predictions = checks.floats(owner, "predictions", predictions)
    if targets is None:
        return predictions
    targets = checks.numbers(owner, "targets", targets)
    if same:
        checks.same_shape(owner, "predictions", predictions, "targets", targets)
    else:
        checks.fits_shape(owner, "targets", targets, "predictions", predictions.shape)
    return predictions - targets


def squared_error(predictions: Any, targets: Optional[Any] = None) -> Array:
    """The elementwise squared error ``(predictions - targets)**2``.

    The mean squared error is ``squared_error(predictions, targets).mean()``.

    Args:
      predictions: floats of any shape.
      targets: an array of the same shape (integers and booleans count as numbers), or
        ``None`` for zeros.

    Returns:
      The squared differences, shaped like ``predictions``.

    Raises:
      TypeError: ``predictions`` are not floats.
      LossInputError: ``targets`` has another shape.

    >>> import jax.numpy as jnp
    >>> from functrain.losses import squared_error
    >>> squared_error(jnp.array([1.0, 2.0, 3.0]), jnp.array([1.0, 0.0, 1.5]))
    Array([0.  , 4.  , 2.25], dtype=float32)
    """
    errors = _errors("squared_error", predictions, targets, same=True)
    return errors ** 2


def l2_loss(predictions: Any, targets: Optional[Any] = None) -> Array:
    """Half the squared error, ``0.5 * (predictions - targets)**2``, elementwise.

    The 0.5 is Bishop's convention (Pattern Recognition and Machine Learning, 2006): the
    gradient is the plain difference ``predictions - targets``.

    Args:
      predictions: floats of any shape.
      targets: an array of the same shape, or ``None`` for zeros.

    Returns:
      The halved squared differences, shaped like ``predictions``.

    Raises:
      TypeError: ``predictions`` are not floats.
      LossInputError: ``targets`` has another shape.

    >>> import jax.numpy as jnp
    >>> from functrain.losses import l2_loss
    >>> l2_loss(jnp.array([1.0, 2.0, 3.0]), jnp.array([1.0, 0.0, 1.5]))
    Array([0.   , 2.   , 1.125], dtype=float32)
    """
    errors = _errors("l2_loss", predictions, targets, same=True)
    return 0.5 * errors ** 2


def huber_loss(predictions: Any, targets: Optional[Any] = None, *,
               delta: Any = 1.0) -> Array:
    """The Huber loss (Huber, 1964): quadratic near zero, linear beyond ``delta``.

    With ``e = predictions - targets``: ``0.5 * e**2`` where ``|e| <= delta``, and
    ``delta * (|e| - 0.5 * delta)`` beyond. Gradient descent on it is gradient descent on
    ``l2_loss`` with the gradient clipped to ``[-delta, delta]``.

    Args:
      predictions: floats of any shape.
      targets: an array broadcastable to ``predictions``'s shape, or ``None`` for zeros.
      delta: where the loss turns from quadratic to linear (a scalar, or an array
        broadcastable to ``predictions``).

    Returns:
      The elementwise losses, shaped like ``predictions``.

    Raises:
      TypeError: ``predictions`` are not floats.
      LossInputError: ``targets`` does not broadcast to ``predictions``'s shape.

    >>> import jax.numpy as jnp
    >>> from functrain.losses import huber_loss
    >>> huber_loss(jnp.array([0.5, 3.0]), jnp.array([0.0, 0.0]))
    Array([0.125, 2.5  ], dtype=float32)
    """
    errors = _errors("huber_loss", predictions, targets, same=False)
    magnitude = jnp.abs(errors)
    quadratic = jnp.minimum(magnitude, delta)
    return 0.5 * quadratic ** 2 + delta * (magnitude - quadratic)


def log_cosh(predictions: Any, targets: Optional[Any] = None) -> Array:
    """The log-cosh loss ``log(cosh(predictions - targets))`` (Chen et al., 2019).

    About ``e**2 / 2`` for small errors ``e`` and ``|e| - log(2)`` for large ones: a twice
    differentiable alternative to the Huber loss. Computed as
    ``logaddexp(e, -e) - log(2)``, which does not overflow for large ``|e|``.

    Args:
      predictions: floats of any shape.
      targets: an array broadcastable to ``predictions``'s shape, or ``None`` for zeros.

    Returns:
      The elementwise losses, shaped like ``predictions``.

    Raises:
      TypeError: ``predictions`` are not floats.
      LossInputError: ``targets`` does not broadcast to ``predictions``'s shape.

    >>> import jax.numpy as jnp
    >>> from functrain.losses import log_cosh
    >>> log_cosh(jnp.array([0.0, 1.0, 100.0]))
    Array([ 0.      ,  0.433781, 99.30685 ], dtype=float32)
    """
    errors = _errors("log_cosh", predictions, targets, same=False)
    return jnp.logaddexp(errors, -errors) - jnp.log(2.0).astype(errors.dtype)


def cosine_similarity(predictions: Any, targets: Any, *, epsilon: Any = 0.0,
                      axis: Axis = -1, where: Optional[Any] = None) -> Array:
    """The cosine of the angle between predictions and targets, vector by vector.

    ``sum(p * t) / (sqrt(max(sum(p**2), epsilon)) * sqrt(max(sum(t**2), epsilon)))``, the
    sums over ``axis`` and the entries where ``where`` holds. With the default
    ``epsilon = 0`` a zero vector gives NaN; a vector with no entry in ``where`` gives 0.

    Args:
      predictions: float vectors, shape ``[..., dim]`` (or the vector axes named by
        ``axis``).
      targets: float vectors broadcastable to ``predictions``'s shape.
      epsilon: the floor of each squared norm in the denominator.
      axis: the axis or axes that hold a vector.
      where: a boolean mask broadcastable to ``predictions``: the entries that count.

    Returns:
      The cosine similarities, ``predictions``'s shape without ``axis``.

    Raises:
      TypeError: an input is not floats.
      LossInputError: the shapes, ``axis`` or ``where`` do not fit.

    >>> import jax.numpy as jnp
    >>> from functrain.losses import cosine_similarity
    >>> cosine_similarity(jnp.array([[1.0, 0.0], [1.0, 1.0]]), jnp.array([[1.0, 0.0], [1.0, 0.0]]))
    Array([1.       , 0.7071067], dtype=float32)
    """
    return _cosine("cosine_similarity", predictions, targets, epsilon, axis, where)


def cosine_distance(predictions: Any, targets: Any, *, epsilon: Any = 0.0,
                    axis: Axis = -1, where: Optional[Any] = None) -> Array:
    """One minus the cosine similarity: ``1 - cos(angle)``, vector by vector.

    Zero for vectors pointing the same way, 1 for orthogonal ones, 2 for opposite ones; see
    :func:`cosine_similarity` for ``epsilon``, ``axis`` and ``where``.

    Args:
      predictions: float vectors, shape ``[..., dim]``.
      targets: float vectors broadcastable to ``predictions``'s shape.
      epsilon: the floor of each squared norm in the cosine's denominator.
      axis: the axis or axes that hold a vector.
      where: a boolean mask broadcastable to ``predictions``: the entries that count.

    Returns:
      The cosine distances, ``predictions``'s shape without ``axis``.

    Raises:
      TypeError: an input is not floats.
      LossInputError: the shapes, ``axis`` or ``where`` do not fit.

    >>> import jax.numpy as jnp
    >>> from functrain.losses import cosine_distance
    >>> cosine_distance(jnp.array([[1.0, 0.0], [0.0, 1.0]]), jnp.array([[1.0, 0.0], [1.0, 0.0]]))
    Array([0., 1.], dtype=float32)
    """
    return 1.0 - _cosine("cosine_distance", predictions, targets, epsilon, axis, where)


def _cosine(owner: str, predictions: Any, targets: Any, epsilon: Any, axis: Axis,
            where: Optional[Any]) -> Array:
    predictions = checks.floats(owner, "predictions", predictions)
    targets = checks.floats(owner, "targets", targets)
    checks.fits_shape(owner, "targets", targets, "predictions", predictions.shape)
    targets = jnp.broadcast_to(targets, predictions.shape)
    reduced = checks.axes(owner, axis, predictions.ndim)
    where = checks.where_mask(owner, where, predictions.shape, reduced)
    unit_p = unit_vectors(predictions, reduced, epsilon, where)
    unit_t = unit_vectors(targets, reduced, epsilon, where)
    return masked_sum(unit_p * unit_t, reduced, where)
