"""Divergences between distributions: Kullback-Leibler (with targets as probabilities or
log-probabilities) and its generalization to unnormalized measures.

optax.losses' functions with their signatures, defaults and numbers. Predictions are given as
log-probabilities (to avoid underflow); both inputs must be floats, and the targets must
broadcast to the predictions' shape (checked before any array math).
"""

from __future__ import annotations

import warnings
from typing import Any, Optional

import jax
import jax.numpy as jnp

from functrain.losses import checks
from functrain.losses.checks import Axis
from functrain.losses.primitives import masked_sum

Array = jax.Array

__all__ = ["kl_divergence", "kl_divergence_with_log_targets", "generalized_kl_divergence",
           "convex_kl_divergence"]


def _inputs(owner: str, log_predictions: Any, targets: Any, targets_name: str, axis: Axis,
            where: Optional[Any]) -> tuple:
    log_predictions = checks.floats(owner, "log_predictions", log_predictions)
    targets = checks.floats(owner, targets_name, targets)
    checks.fits_shape(owner, targets_name, targets, "log_predictions", log_predictions.shape)
    reduced = checks.axes(owner, axis, log_predictions.ndim)
    where = checks.where_mask(owner, where, log_predictions.shape, reduced)
    targets = jnp.broadcast_to(targets, log_predictions.shape)
    return log_predictions, targets, reduced, where


def kl_divergence(log_predictions: Any, targets: Any, axis: Axis = -1,
                  where: Optional[Any] = None) -> Array:
    """The Kullback-Leibler divergence ``KL(targets || predictions)`` (Kullback and Leibler,
    1951).

    ``sum(targets * (log(targets) - log_predictions))`` over ``axis`` (and ``where``), with
    ``0 * log(0) = 0``: the information lost when the predicted distribution stands in for
    the target one. A negative target gives NaN.

    Args:
      log_predictions: the predicted distribution as log-probabilities, shape
        ``[..., dim]``.
      targets: the target probabilities (non-negative floats), broadcastable to
        ``log_predictions``'s shape.
      axis: the axis or axes of a distribution.
      where: a boolean mask broadcastable to ``log_predictions``: the entries that count.

    Returns:
      The divergences, ``log_predictions``'s shape without ``axis``.

    Raises:
      TypeError: an input is not floats.
      LossInputError: the shapes, ``axis`` or ``where`` do not fit.

    >>> import jax.numpy as jnp
    >>> from functrain.losses import kl_divergence
    >>> kl_divergence(jnp.log(jnp.array([0.5, 0.5])), jnp.array([0.9, 0.1]))
    Array(0.3680641, dtype=float32)
    """
    log_predictions, targets, reduced, where = _inputs(
        "kl_divergence", log_predictions, targets, "targets", axis, where)
    return masked_sum(_kl_terms(log_predictions, targets), reduced, where)


def kl_divergence_with_log_targets(log_predictions: Any, log_targets: Any, axis: Axis = -1,
                                   where: Optional[Any] = None) -> Array:
    """The Kullback-Leibler divergence, with the targets as log-probabilities too.

    ``sum(exp(log_targets) * (log_targets - log_predictions))`` over ``axis`` (and
    ``where``). A ``-inf`` log-target (a zero probability) gives NaN (``0 * -inf``), as
    optax's.

    Args:
      log_predictions: the predicted distribution as log-probabilities, shape
        ``[..., dim]``.
      log_targets: the target distribution as log-probabilities, broadcastable to
        ``log_predictions``'s shape.
      axis: the axis or axes of a distribution.
      where: a boolean mask broadcastable to ``log_predictions``: the entries that count.

    Returns:
      The divergences, ``log_predictions``'s shape without ``axis``.

    Raises:
      TypeError: an input is not floats.
      LossInputError: the shapes, ``axis`` or ``where`` do not fit.

    >>> import jax.numpy as jnp
    >>> from functrain.losses import kl_divergence_with_log_targets
    >>> kl_divergence_with_log_targets(jnp.log(jnp.array([0.5, 0.5])),
    ...                                jnp.log(jnp.array([0.9, 0.1])))
    Array(0.3680641, dtype=float32)
    """
    log_predictions, log_targets, reduced, where = _inputs(
        "kl_divergence_with_log_targets", log_predictions, log_targets, "log_targets", axis,
        where)
    terms = jnp.exp(log_targets) * (log_targets - log_predictions)
    return masked_sum(terms, reduced, where)


def generalized_kl_divergence(log_predictions: Any, targets: Any, axis: Axis = -1,
                              where: Optional[Any] = None) -> Array:
    """The generalized Kullback-Leibler divergence, for unnormalized measures.

    ``sum(targets * (log(targets) - log_predictions) - targets + exp(log_predictions))``
    over ``axis`` (and ``where``), with ``0 * log(0) = 0``: the Bregman divergence of
    ``x log x - x`` (Bregman, 1967; Boyd and Vandenberghe, Convex Optimization, p. 90). On
    probability distributions it equals :func:`kl_divergence`.

    Args:
      log_predictions: the predicted measure in log space, shape ``[..., dim]``.
      targets: the target measure (non-negative floats), broadcastable to
        ``log_predictions``'s shape.
      axis: the axis or axes of a measure.
      where: a boolean mask broadcastable to ``log_predictions``: the entries that count.

    Returns:
      The divergences, ``log_predictions``'s shape without ``axis``.

    Raises:
      TypeError: an input is not floats.
      LossInputError: the shapes, ``axis`` or ``where`` do not fit.

    >>> import jax.numpy as jnp
    >>> from functrain.losses import generalized_kl_divergence
    >>> generalized_kl_divergence(jnp.log(jnp.array([1.0, 2.0])), jnp.array([1.0, 1.0]))
    Array(0.30685282, dtype=float32)
    """
    return _generalized("generalized_kl_divergence", log_predictions, targets, axis, where)


def convex_kl_divergence(log_predictions: Any, targets: Any, axis: Axis = -1,
                         where: Optional[Any] = None) -> Array:
    """Deprecated (as in optax): :func:`generalized_kl_divergence` under its older name.

    Emits a ``DeprecationWarning``, then returns
    ``generalized_kl_divergence(log_predictions, targets, axis, where)``:
    ``sum(targets * (log(targets) - log_predictions) - targets + exp(log_predictions))``.

    Args:
      log_predictions: the predicted measure in log space, shape ``[..., dim]``.
      targets: the target measure, broadcastable to ``log_predictions``'s shape.
      axis: the axis or axes of a measure.
      where: a boolean mask broadcastable to ``log_predictions``: the entries that count.

    Returns:
      The divergences, ``log_predictions``'s shape without ``axis``.

    Raises:
      TypeError: an input is not floats.
      LossInputError: the shapes, ``axis`` or ``where`` do not fit.

    >>> import warnings, jax.numpy as jnp
    >>> from functrain.losses import convex_kl_divergence
    >>> with warnings.catch_warnings():
    ...     warnings.simplefilter("ignore", DeprecationWarning)
    ...     convex_kl_divergence(jnp.log(jnp.array([1.0, 2.0])), jnp.array([1.0, 1.0]))
    Array(0.30685282, dtype=float32)
    """
    warnings.warn("convex_kl_divergence is deprecated (as in optax): use "
                  "generalized_kl_divergence, the same function.", DeprecationWarning,
                  stacklevel=2)
    return _generalized("convex_kl_divergence", log_predictions, targets, axis, where)


def _generalized(owner: str, log_predictions: Any, targets: Any, axis: Axis,
                 where: Optional[Any]) -> Array:
    log_predictions, targets, reduced, where = _inputs(
        owner, log_predictions, targets, "targets", axis, where)
    # KL(targets || predictions) + sum(predictions - targets): the Bregman divergence.
    return (masked_sum(_kl_terms(log_predictions, targets), reduced, where)
            + masked_sum(jnp.exp(log_predictions) - targets, reduced, where))


def _kl_terms(log_predictions: Array, targets: Array) -> Array:
    """``targets * (log(targets) - log_predictions)``, 0 where a target is 0."""
    terms = targets * (jnp.log(targets) - log_predictions)
    return jnp.where(targets == 0, jnp.zeros_like(terms), terms)
