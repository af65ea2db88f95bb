"""The array math several losses share, one copy of each.

* :func:`log_softmax`: the log-softmax over one or more axes, restricted to a ``where`` mask
  (masked-out entries are ``-inf`` and take no part in the normalization).
* :func:`times_log`: ``a * log_b`` with ``0 * log(0) = 0`` (the safe cross-entropy's terms).
* :func:`masked_sum`: a sum over axes that skips masked-out entries, even NaN or infinite
  ones (the product of a zero label and a ``-inf`` log-probability there).
* :func:`unit_vectors`: vectors divided by their Euclidean norm, with the squared norm
  floored at ``epsilon`` (the cosine similarity's and NT-Xent's normalization).
* :func:`class_values`: the entry of each example's class, picked by integer labels.
* :func:`sparse_plus`: the smooth ReLU ``0 / (x + 1)^2 / 4 / x`` of the sparsemax losses.

Each works on arrays, after :mod:`functrain.losses.checks` has checked them.
"""

from __future__ import annotations

from typing import Any, Optional

import jax
import jax.numpy as jnp

Array = jax.Array

__all__ = ["log_softmax", "times_log", "masked_sum", "unit_vectors", "class_values", "sparse_plus"]


def log_softmax(x: Array, axis: tuple, where: Optional[Array] = None) -> Array:
    """``x - log(sum(exp(x)))`` over ``axis``, the sum over the entries where ``where`` holds.

    Masked-out entries come out as ``-inf``; the maximum is subtracted before the
    exponentials, so large logits do not overflow.

    Args:
      x: the logits (floats).
      axis: the axes normalized over (a tuple of ints).
      where: ``None`` or a boolean mask broadcastable to ``x``.

    Returns:
      An array like ``x``.

    >>> import jax.numpy as jnp
    >>> log_softmax(jnp.array([0.0, 0.0, 5.0]), (0,), jnp.array([True, True, False]))
    Array([-0.6931472, -0.6931472,       -inf], dtype=float32)
    """
    return jax.nn.log_softmax(x, axis=axis, where=where)


@jax.custom_jvp
def times_log(a: Array, log_b: Array) -> Array:
    """``a * log_b``, but 0 where ``a`` is 0 (even where ``log_b`` is ``-inf``).

    The convention ``0 * log(0) = 0`` of entropies. The derivative is the product's,
    ``da * log_b + a * dlog_b``: with respect to ``a`` it is ``log_b`` (``-inf`` where
    ``log_b`` is), with respect to ``log_b`` it is ``a`` (0 where ``a`` is).

    Args:
      a: the weights (e.g. labels).
      log_b: the log-probabilities.

    Returns:
      The products, broadcast.

    >>> import jax.numpy as jnp
    >>> times_log(jnp.array([0.0, 0.5]), jnp.array([-jnp.inf, -2.0]))
    Array([ 0., -1.], dtype=float32)
    """
    product = a * log_b
    return jnp.where(a == 0, jnp.zeros_like(product), product)


@times_log.defjvp
def _times_log_jvp(primals: tuple, tangents: tuple) -> tuple:
    (a, log_b), (da, dlog_b) = primals, tangents
    return times_log(a, log_b), da * log_b + a * dlog_b


def masked_sum(x: Array, axis: Any, where: Optional[Array] = None) -> Array:
    """The sum of ``x`` over ``axis``, of the entries where ``where`` holds (all without it).

    Entries outside the mask do not enter the sum, even NaN or infinite ones, and send no
    gradient back.

    Args:
      x: an array.
      axis: the axes summed over (an int, a tuple, or ``None`` for all).
      where: ``None`` or a boolean mask broadcastable to ``x``.

    Returns:
      ``x`` summed over ``axis``.

    >>> import jax.numpy as jnp
    >>> masked_sum(jnp.array([1.0, jnp.nan, 2.0]), 0, jnp.array([True, False, True]))
    Array(3., dtype=float32)
    """
    return jnp.sum(x, axis=axis, where=where)


def unit_vectors(x: Array, axis: Any, epsilon: Any = 0.0,
                 where: Optional[Array] = None) -> Array:
    """``x / sqrt(max(sum(x**2), epsilon))``, the sum over ``axis`` (and ``where``).

    With ``epsilon = 0`` an all-zero vector gives NaN (0 / 0), as the cosine of a zero
    vector is undefined; ``epsilon > 0`` floors the *squared* norm at ``epsilon``.

    Args:
      x: the vectors (floats).
      axis: the axes that hold a vector's entries.
      epsilon: the floor of the squared norm.
      where: ``None`` or a boolean mask: the entries that count in the norm.

    Returns:
      An array like ``x``.

    >>> import jax.numpy as jnp
    >>> unit_vectors(jnp.array([3.0, 4.0]), -1)
    Array([0.6, 0.8], dtype=float32)
    """
    squared = jnp.sum(x * x, axis=axis, where=where, keepdims=True)
    return x / jnp.sqrt(jnp.maximum(squared, epsilon))


def class_values(x: Array, labels: Array, axis: tuple) -> Array:
    """``x[..., labels, ...]``: each example's entry at its integer label.

    The class axes ``axis`` are moved to the end in the order given and flattened, so with
    several axes a label is a flat index into a slice of shape ``x.shape[axis]``
    (C order). A negative label counts from the end; one out of range gives NaN.

    Args:
      x: the values, e.g. logits.
      labels: integer labels of shape ``x.shape`` without ``axis``.
      axis: the class axes (a tuple of ints).

    Returns:
      An array of ``labels``'s shape.

    >>> import jax.numpy as jnp
    >>> class_values(jnp.array([[1.0, 2.0], [3.0, 4.0]]), jnp.array([1, 0]), (1,))
    Array([2., 3.], dtype=float32)
    """
    moved = jnp.moveaxis(x, axis, tuple(range(x.ndim - len(axis), x.ndim)))
    flat = moved.reshape(moved.shape[:x.ndim - len(axis)] + (-1,))
    picked = jnp.take_along_axis(flat, labels[..., None], axis=-1)
    return picked[..., 0]


def sparse_plus(x: Array) -> Array:
    """``0`` for ``x <= -1``, ``(x + 1)**2 / 4`` for ``-1 < x < 1``, ``x`` for ``x >= 1``.

    The convex conjugate behind the sparsemax losses (a ReLU smoothed over ``[-1, 1]``); its
    derivative is the sparse sigmoid ``clip((x + 1) / 2, 0, 1)``, taken as 0 at ``x = -1``
    and 1 at ``x = 1`` (the branch each point belongs to).

    Args:
      x: an array.

    Returns:
      An array like ``x`` (integers give floats).

    >>> import jax.numpy as jnp
    >>> sparse_plus(jnp.array([-2.0, 0.0, 0.5, 3.0]))
    Array([0.    , 0.25  , 0.5625, 3.    ], dtype=float32)
    """
    x = x if jnp.issubdtype(x.dtype, jnp.inexact) else x.astype(jnp.result_type(float))
    return jnp.where(x <= -1, jnp.zeros_like(x), jnp.where(x >= 1, x, (x + 1) ** 2 / 4))
