"""Factored second moments (Adafactor; Shazeer & Stern, 2018).

How the factored second moment fits the per-leaf engine: a matrix-like leaf
keeps a *row* and a *column* average of the squared gradients instead of a
full second moment. Those are still one leaf's state and one leaf's math (a
mean over an axis, then a rank-1 rescale), so ``scale_by_factored_rms`` is an
ordinary :class:`~functrain.engine.stage.LeafStage`; only its state arrays
are not params-shaped: ``v_row`` / ``v_col`` have one axis removed, and the
field a leaf does not use is a ``(1,)`` placeholder (as optax's). The stage
therefore declares ``shaped_fields=()`` and the engine skips the
params-shape check for it. Which leaves are factored depends only on static
shapes, so the choice is made in Python when the leaf function is traced.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from functrain.arg_checks import check_range
from functrain.declarations import hyperparameters
from functrain import tree as ft
from functrain.numerics import abs_sq
from functrain.engine.protocol import GradientTransformation
from functrain.engine.stage import LeafChecks, LeafStage
from functrain.engine.counts import safe_increment, zero_count
from functrain.engine.program import stage_transform

Array = jax.Array


@hyperparameters(exponent="number")
def decay_rate_pow(i: Array, exponent: float = 0.8) -> Array:
    """Adafactor's second-moment decay ``1 - (i + 1) ** -exponent`` at step ``i``.

    It starts at 0 (the first average is just the first observation) and rises
    towards 1. Reference: Shazeer & Stern, 2018, "Adafactor: Adaptive Learning
    Rates with Sublinear Memory Cost", section 7.

    Args:
      i: the step index, counted from 0 (a number or an integer scalar array).
      exponent: how fast the decay approaches 1, in ``(0, 1]``; default 0.8 (the
        paper's).

    Returns:
      The decay, a float32 scalar array.

    >>> decay_rate_pow(0)
    Array(0., dtype=float32)
    """
    t = jnp.asarray(i + 1, jnp.float32)
    return 1.0 - t ** (-exponent)


def _factored_dims(shape: tuple, factored: bool, min_dim_size_to_factor: int
                   ) -> Optional[tuple[int, int]]:
    """(second-largest axis, largest axis) if both are big enough to factor, else None."""
    if not factored or len(shape) < 2:
        return None
    order = np.argsort(shape)
    if shape[order[-2]] < min_dim_size_to_factor:
        return None
    return int(order[-2]), int(order[-1])


class FactoredState(NamedTuple):
    """State of :func:`scale_by_factored_rms`.

    Per leaf: ``v_row`` / ``v_col`` (factored leaves: the squared-gradient
    averages with the largest / second-largest axis removed), ``v`` (other
    leaves: the full second moment); unused fields hold ``zeros((1,))``.

    Attributes:
      count: the number of steps taken (int32), fed to the decay schedule.
      v_row: per factored leaf, the moving average of ``g**2 + epsilon`` averaged
        over the largest axis (that axis removed); ``zeros((1,))`` otherwise.
      v_col: per factored leaf, the same averaged over the second-largest axis;
        ``zeros((1,))`` otherwise.
      v: per unfactored leaf, the full moving average of ``g**2 + epsilon``
        (params-shaped); ``zeros((1,))`` for factored leaves.

    >>> import jax.numpy as jnp, functrain
    >>> tx = functrain.scale_by_factored_rms(min_dim_size_to_factor=2)
    >>> state = tx.init({'w': jnp.ones((3, 4)), 'b': jnp.ones(4)})
    >>> state.v_row['w'].shape, state.v_col['w'].shape, state.v['b'].shape
    ((3,), (4,), (4,))
    """

    count: Array
    v_row: Any
    v_col: Any
    v: Any


@hyperparameters(decay_rate="number", step_offset="number", min_dim_size_to_factor="number",
                 epsilon="number")
def scale_by_factored_rms(factored: bool = True, decay_rate: float = 0.8,
                          step_offset: int = 0, min_dim_size_to_factor: int = 128,
                          epsilon: float = 1e-30,
                          decay_rate_fn: Callable[[Any, Any], Any] = decay_rate_pow
                          ) -> GradientTransformation:
    """Rescale by a factored estimate of the gradients' RMS (Adafactor's core).

    A leaf whose two largest dimensions are at least ``min_dim_size_to_factor``
    keeps row and column averages of ``g**2 + epsilon``; others keep a full
    average. The decay at step ``t`` is ``decay_rate_fn(t - step_offset,
    decay_rate)``. Params are not needed (beyond optax, which asks for them).

    Unfactored: ``v = d v + (1-d)(g**2 + epsilon)``, update ``g / sqrt(v)``.
    Factored: ``v_row``, ``v_col`` the same with means over one axis; the update
    is ``g / sqrt(v_row v_col / mean(v_row))`` (a rank-1 estimate of ``v``).
    Reference: Shazeer & Stern, 2018, "Adafactor: Adaptive Learning Rates with
    Sublinear Memory Cost".

    Args:
      factored: factor the second moment of leaves of rank >= 2 (default
        ``True``); ``False`` keeps a full second moment for every leaf.
      decay_rate: the second argument of ``decay_rate_fn``; for the default
        :func:`decay_rate_pow` its exponent (default 0.8).
      step_offset: subtracted from the step count (counted from 0) before it is
        passed to ``decay_rate_fn``, e.g. to restart the decay schedule when
        fine-tuning. Default 0.
      min_dim_size_to_factor: a leaf is factored only if its second-largest
        dimension is at least this (default 128); smaller leaves keep a full
        second moment.
      epsilon: added to ``g**2`` before averaging (the paper's ``eps1``), ``>= 0``;
        keeps the root away from 0.
      decay_rate_fn: ``(step, decay_rate) -> decay`` in ``[0, 1]``, the weight of
        the old average at each step; default :func:`decay_rate_pow`.

    Returns:
      A ``GradientTransformation`` whose state is :class:`FactoredState`.

    >>> import jax.numpy as jnp, functrain
    >>> tx = functrain.scale_by_factored_rms()
    >>> tx.update([jnp.array([2., -3.])], tx.init([jnp.zeros(2)]))[0]
    [Array([ 1., -1.], dtype=float32)]
    """
    check_range("epsilon", epsilon, 0.0, owner="scale_by_factored_rms")

    def init_leaf(p: Array) -> tuple:
        one = jnp.zeros((1,), p.dtype)
        dims = _factored_dims(p.shape, factored, min_dim_size_to_factor)
        if dims is None:
            return (one, one, ft.zeros_like(p))
        d1, d0 = dims
        row = tuple(n for i, n in enumerate(p.shape) if i != d0)
        col = tuple(n for i, n in enumerate(p.shape) if i != d1)
        return (jnp.zeros(row, p.dtype), jnp.zeros(col, p.dtype), one)

    def prepare(glob: dict, _: Any) -> tuple:
        count = glob["count"]
        return decay_rate_fn(count - step_offset, decay_rate), {"count": safe_increment(count)}

    def leaf(g: Array, s: tuple, p: Any, decay: Array) -> tuple:
        v_row, v_col, v = s.v_row, s.v_col, s.v
        sq = abs_sq(g) + epsilon
        dims = _factored_dims(g.shape, factored, min_dim_size_to_factor)
        if dims is None:
            v = decay * v + (1.0 - decay) * sq
            return g * v ** -0.5, s._replace(v_row=v_row, v_col=v_col, v=v)
        d1, d0 = dims
        v_row = decay * v_row + (1.0 - decay) * jnp.mean(sq, axis=d0)
        v_col = decay * v_col + (1.0 - decay) * jnp.mean(sq, axis=d1)
        row_axis = d1 - 1 if d1 > d0 else d1
        row_factor = (v_row / jnp.mean(v_row, axis=row_axis, keepdims=True)) ** -0.5
        u = g * jnp.expand_dims(row_factor, d0) * jnp.expand_dims(v_col ** -0.5, d1)
        return u, s._replace(v_row=v_row, v_col=v_col, v=v)

    return stage_transform(LeafStage(
        name="scale_by_factored_rms", update_leaf=leaf, state_cls=FactoredState,
        leaf_fields=("v_row", "v_col", "v"), init_leaf=init_leaf,
        init_global=zero_count, prepare=prepare, checks=LeafChecks(shaped_fields=())))
