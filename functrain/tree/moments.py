"""optax.tree's moments, and the per-array pieces every moment of functrain is made of.

* ``update_moment``, ``update_moment_per_elem_norm``, ``update_infinity_moment`` and
  ``bias_correction``: optax.tree's (0.2.8's names, signatures and numbers, written for
  functrain); :mod:`functrain.tree` re-exports them.
* ``abs_sq`` (``|x|**2``, real for complex ``x``), ``ema_update`` and
  ``bias_correction_factor``: of one array; :mod:`functrain.numerics` re-exports them
  (``functrain.tree`` does not).
"""

from __future__ import annotations

import functools
import math
from typing import Any, Callable

import jax
import jax.numpy as jnp

PyTree = Any
Array = jax.Array

__all__ = ["abs_sq", "ema_update", "bias_correction_factor", "update_moment",
           "update_moment_per_elem_norm", "update_infinity_moment", "bias_correction"]


# --------------------------------------------------------------------------
# Per-array pieces (functrain.numerics re-exports these three)
# --------------------------------------------------------------------------

def abs_sq(x: Array) -> Array:
    """``|x|**2`` entrywise: ``x * x`` for real ``x``, ``real(x * conj(x))`` for complex.

    This is the rule every second moment, sum of squares and RMS of functrain
    follows, so complex parameters get optax's numbers: the squared modulus,
    real, never ``x**2`` (which would rotate the phase).

    Args:
      x: an array, real or complex.

    Returns:
      A real array shaped like ``x`` (``x``'s real precision).

    >>> import jax.numpy as jnp
    >>> abs_sq(jnp.array([1 + 1j, 3.0]))
    Array([2., 9.], dtype=float32)
    """
    if jnp.iscomplexobj(x):
        return jnp.real(x * jnp.conj(x))
    return x * x


def ema_update(x: Array, average: Array, decay: Any) -> Array:
    """One step of an exponential moving average: ``(1 - decay) x + decay average``.

    Args:
      x: the new observation (a gradient, a squared gradient, ...).
      average: the average so far.
      decay: the weight of the old average, in ``[0, 1]``.

    Returns:
      The updated average.

    >>> import jax.numpy as jnp
    >>> ema_update(jnp.array(1.), jnp.array(0.), 0.9)
    Array(0.1, dtype=float32, weak_type=True)
    """
    return (1 - decay) * x + decay * average


def bias_correction_factor(decay: Any, count: Any, *, precise: bool = False) -> Array:
    """``1 - decay**count``: what a zero-initialised moving average is divided by.

    Args:
      decay: the moving average's decay.
      count: the number of steps taken, counted from 1 (may be traced).
      precise: compute ``-expm1(count * log(decay))`` with the logarithm in
        double precision, which avoids the cancellation of ``1 - decay**count``
        in float32 when ``decay`` is close to 1. Only for a Python-number
        ``decay`` in (0, 1]; otherwise the plain formula is used. optax (and
        functrain's transforms) use the plain formula; Ivy's one-shot
        functions use the precise one.

    Returns:
      The factor, a scalar (or an array broadcasting like ``count``).

    >>> import jax.numpy as jnp
    >>> print(bias_correction_factor(0.9, jnp.asarray(2)))
    0.19000006
    >>> print(bias_correction_factor(0.9, jnp.asarray(2.0), precise=True))
    0.19
    """
    if not precise:
        return 1 - decay ** count
    if isinstance(decay, (int, float)) and not isinstance(decay, bool) and 0 < decay <= 1:
        return -jnp.expm1(count * math.log(decay))
    return 1 - jnp.power(decay, count)


# --------------------------------------------------------------------------
# Moments (optax's update_moment & co.)
# --------------------------------------------------------------------------

def _none_kept(fn: Callable[[Any, Any], Any], updates: PyTree, moments: PyTree) -> PyTree:
    return jax.tree_util.tree_map(lambda g, t: None if g is None else fn(g, t),
                                  updates, moments, is_leaf=lambda x: x is None)


def update_moment(updates: PyTree, moments: PyTree, decay: Any, order: Any) -> PyTree:
    """The moving average of the ``order``-th power: ``(1 - decay) g**order + decay m``.

    Args:
      updates: the new values ``g`` (``None`` leaves stay ``None``).
      moments: the averages so far.
      decay: the weight of the old average.
      order: the power of ``g``.

    Returns:
      The new moments.

    >>> import jax.numpy as jnp
    >>> update_moment([jnp.array([2.])], [jnp.array([0.])], 0.9, 2)
    [Array([0.4], dtype=float32)]
    """
    return _none_kept(lambda g, t: ema_update(g ** order, t, decay), updates, moments)


def update_moment_per_elem_norm(updates: PyTree, moments: PyTree, decay: Any,
                                order: Any) -> PyTree:
    """``update_moment`` of ``|g|**order``: the modulus for complex ``g``.

    Args:
      updates: the new values (``None`` leaves stay ``None``).
      moments: the averages so far.
      decay: the weight of the old average.
      order: the power of ``|g|``.

    Returns:
      The new moments (real for complex updates).

    >>> import jax.numpy as jnp
    >>> update_moment_per_elem_norm([jnp.array([3j])], [jnp.array([0.])], 0.5, 2)
    [Array([4.5], dtype=float32)]
    """
    def powered(g: Array) -> Array:
        if jnp.isrealobj(g):
            return g ** order
        half = order / 2
        return abs_sq(g) ** (int(half) if float(half).is_integer() else half)

    return _none_kept(lambda g, t: ema_update(powered(g), t, decay), updates, moments)


def update_infinity_moment(updates: PyTree, moments: PyTree, decay: Any, eps: Any) -> PyTree:
    """The infinity-norm moment of Adamax: ``max(|g| + eps, decay m)``.

    Args:
      updates: the new values (``None`` leaves stay ``None``).
      moments: the moments so far.
      decay: the decay of the old moment.
      eps: added to ``|g|``.

    Returns:
      The new moments.

    >>> import jax.numpy as jnp
    >>> update_infinity_moment([jnp.array([-2.])], [jnp.array([3.])], 0.5, 0.0)
    [Array([2.], dtype=float32)]
    """
    return _none_kept(lambda g, t: jnp.maximum(jnp.abs(g) + eps, decay * t), updates, moments)


@functools.partial(jax.jit, inline=True)
def bias_correction(moment: PyTree, decay: Any, count: Any) -> PyTree:
    """``moment / (1 - decay**count)``, the factor computed in full precision, divided in each leaf's.

    Args:
      moment: a tree of moving averages.
      decay: their decay.
      count: the number of steps, from 1.

    Returns:
      The bias-corrected tree, each leaf in its own dtype.

    >>> import jax.numpy as jnp
    >>> bias_correction({'m': jnp.array([0.1])}, 0.9, jnp.asarray(1))
    {'m': Array([0.99999976], dtype=float32)}
    """
    factor = jnp.asarray(bias_correction_factor(decay, count))
    return jax.tree_util.tree_map(lambda t: t / factor.astype(t.dtype), moment)
