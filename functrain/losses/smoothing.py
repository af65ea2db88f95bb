"""Label smoothing: one-hot labels mixed with the uniform distribution.

optax.losses.smooth_labels with its signature and numbers; a ``where`` that does not fit the
labels' shape is an error here (optax would broadcast it against the wrong axis).
"""

from __future__ import annotations

from typing import Any, Optional

import jax
import jax.numpy as jnp

from functrain.losses import checks
from functrain.losses.checks import Axis

Array = jax.Array

__all__ = ["smooth_labels"]


def smooth_labels(labels: Any, alpha: Any, *, axis: Axis = -1,
                  where: Optional[Any] = None) -> Array:
    """Label smoothing (Szegedy et al., 2016; Muller et al., 2019).

    ``(1 - alpha) * labels + alpha / num_classes``, where ``num_classes`` is the size of the
    class axes, or the number of entries where ``where`` holds along them (every entry gets
    the formula; use the same ``where`` in the loss to leave the others out). Smoothed
    labels favour small logit gaps, which improves calibration.

    Args:
      labels: one-hot labels (floats), shape ``[..., num_classes]``.
      alpha: the smoothing factor (a scalar, or an array broadcastable to ``labels``).
      axis: the class axis or axes.
      where: a boolean mask broadcastable to ``labels``'s shape: the classes that count.

    Returns:
      The smoothed labels, shaped like ``labels``.

    Raises:
      TypeError: ``labels`` are not floats.
      LossInputError: ``axis``, ``where`` or ``alpha`` do not fit ``labels``.

    >>> import jax.numpy as jnp
    >>> from functrain.losses import smooth_labels
    >>> smooth_labels(jnp.array([1.0, 0.0, 0.0, 0.0]), 0.2)
    Array([0.85, 0.05, 0.05, 0.05], dtype=float32)
    """
    owner = "smooth_labels"
    labels = checks.floats(owner, "labels", labels)
    reduced = checks.axes(owner, axis, labels.ndim)
    where = checks.where_mask(owner, where, labels.shape, reduced)
    if not isinstance(alpha, (int, float)):
        checks.fits_shape(owner, "alpha", jnp.asarray(alpha), "labels", labels.shape)
    if where is None:
        num_classes = 1
        for a in reduced:
            num_classes *= labels.shape[a]
    else:
        num_classes = jnp.sum(where, axis=reduced, keepdims=True)
    return (1.0 - alpha) * labels + alpha / num_classes
