"""Constraints on updates: zero out NaNs, keep parameters non-negative.

Both are engine stages, so ``chain`` fuses them with their neighbours.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from functrain.engine.protocol import EmptyState, GradientTransformation
from functrain.engine.stage import LeafChecks, LeafStage
from functrain.engine.program import stage_transform

Array = jax.Array


NonNegativeParamsState = EmptyState


class ZeroNansState(NamedTuple):
    """State of :func:`zero_nans`: per leaf, whether the last update held a NaN.

    Attributes:
      found_nan: one bool scalar per leaf, ``True`` if that leaf's last update
        held at least one NaN.

    >>> import jax.numpy as jnp, functrain
    >>> functrain.zero_nans().init({'w': jnp.ones(2)})
    ZeroNansState(found_nan={'w': Array(False, dtype=bool)})
    """

    found_nan: Any


def zero_nans() -> GradientTransformation:
    """Replace NaNs in the updates by zeros, recording per leaf whether any was found.

    The update is ``where(isnan(g), 0, g)``; infinities are kept.

    Returns:
      A ``GradientTransformation`` whose state is :class:`ZeroNansState`.

    >>> import jax.numpy as jnp, functrain
    >>> tx = functrain.zero_nans()
    >>> u, state = tx.update([jnp.array([1., jnp.nan])], tx.init([jnp.zeros(2)]))
    >>> u, state.found_nan
    ([Array([1., 0.], dtype=float32)], [Array(True, dtype=bool)])
    """
    def leaf(g: Array, s: tuple, p: Any, c: Any) -> tuple:
        nan = jnp.isnan(g)
        return jnp.where(nan, jnp.zeros_like(g), g), s._replace(found_nan=jnp.any(nan))

    # ``found_nan`` is one bool per leaf, not params-shaped.
    return stage_transform(LeafStage(
        name="zero_nans", update_leaf=leaf, state_cls=ZeroNansState, leaf_fields=("found_nan",),
        init_leaf=lambda p: (jnp.zeros([], jnp.bool_),), checks=LeafChecks(shaped_fields=())))


def keep_params_nonnegative() -> GradientTransformation:
    """Shrink updates so no parameter becomes negative (``p + u < 0`` gives ``u = -p``).

    The update is ``where(p + u < 0, -p, u)``, a projection onto ``p >= 0`` for
    updates applied as ``p + u`` (place it last in a chain). ``update`` needs the
    params.

    Returns:
      A ``GradientTransformation`` that keeps no state (``NonNegativeParamsState``,
      i.e. ``EmptyState``).

    >>> import jax.numpy as jnp, functrain
    >>> tx = functrain.keep_params_nonnegative()
    >>> params = [jnp.array([1., 1.])]
    >>> tx.update([jnp.array([-3., 0.5])], tx.init(params), params)[0]
    [Array([-1. ,  0.5], dtype=float32)]
    """
    return stage_transform(LeafStage(
        name="keep_params_nonnegative", update_leaf=lambda g, s, p, c: (jnp.where(p + g < 0, -p,
        g), ()), checks=LeafChecks(needs_params=True)))
