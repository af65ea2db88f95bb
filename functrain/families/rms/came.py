"""CAME: confidence-guided adaptive memory-efficient optimization (Luo et al., 2023).

CAME is Adafactor with momentum whose update is rescaled by a *confidence*: the
factored moving average of the squared deviation of each normalised update
from the momentum. Both second-moment statistics are factored (a row and a
column average per matrix), so beyond the momentum a ``(m, n)`` weight costs
``2 (m + n)`` numbers, not ``m n``. All of it is one array's math, so
``scale_by_came`` is one :class:`~functrain.engine.stage.LeafStage` on
functrain's engine; its row and column statistics are not params-shaped, so the
stage lists only ``mu`` in ``shaped_fields`` (as Adafactor does).

Which leaves are factored follows the authors' reference code
(github.com/yangluo7/CAME): every leaf of rank >= 2, over its last two axes
(leading axes are batch axes: one factored pair per matrix). Leaves of rank 0
and 1 keep a full second moment and use the momentum itself as the update (the
reference skips the confidence there). Fields a leaf does not use hold a
``(1,)`` placeholder, as Adafactor's state does.

Sharding: under ``jax.jit(opt.init)`` the momentum follows its parameter's
sharding, and the row statistics (shape ``p.shape[:-1]``) and column
statistics (``p.shape[:-2] + p.shape[-1:]``) are made from slices of the
parameter, so each keeps the sharding of the parameter's axes it still has
(a weight split over rows has its row statistics split the same way, its
column statistics replicated); placeholders are replicated.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp

from functrain.arg_checks import check_betas, check_nonnegative, check_range
from functrain.declarations import declare_optimizer, hyperparameters
from functrain import tree as ft
from functrain.numerics import abs_sq, ema_update
from functrain.engine.protocol import GradientTransformation, MaskOrFn, ScalarOrSchedule
from functrain.engine.stage import LeafChecks, LeafStage
from functrain.engine.counts import count_only, zero_count
from functrain.engine.program import chain, stage_transform
from functrain.transforms.scaling import add_decayed_weights, scale_by_learning_rate
from functrain.docstrings import shared_args

Array = jax.Array

__all__ = ["CameState", "scale_by_came", "came"]


class CameState(NamedTuple):
    """State of :func:`scale_by_came`.

    Per leaf of rank >= 2 (factored over its last two axes): ``v_row`` /
    ``v_col`` and ``r_row`` / ``r_col``; per other leaf: ``v``. Unused fields
    hold ``zeros((1,))``.

    Attributes:
      count: the number of steps taken (int32).
      mu: the momentum of the normalised, clipped updates (params-shaped).
      v_row: moving average of ``g**2 + eps1`` averaged over the last axis
        (shape ``p.shape[:-1]``).
      v_col: the same averaged over the second-to-last axis (shape
        ``p.shape[:-2] + p.shape[-1:]``).
      v: unfactored leaves: the full moving average of ``g**2 + eps1``.
      r_row: moving average of the instability ``(u - mu)**2 + eps2``
        averaged over the last axis.
      r_col: the same averaged over the second-to-last axis.

    >>> import jax.numpy as jnp, functrain
    >>> state = functrain.contrib.scale_by_came().init({'w': jnp.ones((3, 4)), 'b': jnp.ones(4)})
    >>> state.v_row['w'].shape, state.r_col['w'].shape, state.v['b'].shape
    ((3,), (4,), (4,))
    """

    count: Array
    mu: Any
    v_row: Any
    v_col: Any
    v: Any
    r_row: Any
    r_col: Any


def _factored_rsqrt(row: Array, col: Array) -> Array:
    """``1 / sqrt(row col / mean(row))``: the rank-1 estimate's inverse root, matrix-shaped."""
    row_factor = (row / jnp.mean(row, axis=-1, keepdims=True)) ** -0.5
    return jnp.expand_dims(row_factor, -1) * jnp.expand_dims(col ** -0.5, -2)


def _zeros_without_axis(p: Array, axis: int) -> Array:
    """Zeros shaped like ``p`` with ``axis`` removed, placed like that slice of ``p``."""
    if isinstance(p, jax.ShapeDtypeStruct) or p.shape[axis] == 0:  # nothing to take from
        shape = p.shape[:axis % p.ndim] + p.shape[axis % p.ndim + 1:]
        return jnp.zeros(shape, p.dtype)
    return ft.zeros_like(jnp.take(p, 0, axis=axis))


@hyperparameters(b1="number", b2="number", b3="number", eps1="number", eps2="number",
                 clip_threshold="number or None")
def scale_by_came(b1: float = 0.9, b2: float = 0.999, b3: float = 0.9999,
                  eps1: float = 1e-30, eps2: float = 1e-16,
                  clip_threshold: Optional[float] = 1.0) -> GradientTransformation:
    """Rescale updates by CAME's factored moments and confidence (Luo et al., 2023).

    For a matrix leaf ``g`` of shape ``(m, n)`` (leading axes are batches),
    with ``ema(x, b) = b avg + (1 - b) x``:

    - ``v_row = ema(mean_n(g**2 + eps1), b2)``, ``v_col = ema(mean_m(g**2 + eps1), b2)``;
    - ``u = g / sqrt(v_row v_col / mean(v_row))`` (Adafactor's rank-1 estimate);
    - ``u = u / max(1, rms(u) / clip_threshold)``;
    - ``mu = ema(u, b1)``;
    - ``U = (u - mu)**2 + eps2``, ``r_row = ema(mean_n(U), b3)``, ``r_col = ema(mean_m(U), b3)``;
    - the update is ``mu / sqrt(r_row r_col / mean(r_row))``.

    Leaves of rank 0 or 1: ``v = ema(g**2 + eps1, b2)``, ``u = g / sqrt(v)``,
    clipped, ``mu = ema(u, b1)``, and the update is ``mu``. No bias correction
    (as the paper and the reference). Reference: Luo, Ren, Zheng, Jiang, Jiang
    & You, 2023, "CAME: Confidence-guided Adaptive Memory Efficient
    Optimization" (ACL 2023), Algorithm 1.

    Args:
      b1: decay of the momentum, in ``[0, 1)``. Default 0.9.
      b2: decay of the factored second moment, in ``[0, 1)``. Default 0.999.
      b3: decay of the factored instability, in ``[0, 1)``. Default 0.9999.
      eps1: added to ``g**2``, ``>= 0``. Default 1e-30.
      eps2: added to the instability, ``>= 0``. Default 1e-16.
      clip_threshold: the largest root mean square of ``u`` (``d`` in the
        paper), ``> 0``; ``None`` turns the clipping off. Default 1.

    Returns:
      A ``GradientTransformation`` whose state is :class:`CameState`.

    >>> import jax.numpy as jnp, functrain
    >>> tx = functrain.contrib.scale_by_came()
    >>> params = [jnp.zeros(2)]
    >>> u, state = tx.update([jnp.array([2., -3.])], tx.init(params))
    >>> print(u[0].round(3))
    [ 0.1 -0.1]
    """
    check_betas("scale_by_came", b1=b1, b2=b2, b3=b3)
    check_nonnegative("scale_by_came", eps1=eps1, eps2=eps2)
    if clip_threshold is not None:
        check_range("clip_threshold", clip_threshold, 0.0, owner="scale_by_came")
        if not isinstance(clip_threshold, jax.core.Tracer) and clip_threshold == 0:
            raise ValueError("scale_by_came: clip_threshold must be > 0 (None turns the "
                             "clipping off), got 0.")

    def init_leaf(p: Array) -> tuple:
        one = jnp.zeros((1,), p.dtype)
        if p.ndim < 2:
            return (ft.zeros_like(p), one, one, ft.zeros_like(p), one, one)
        row, col = _zeros_without_axis(p, -1), _zeros_without_axis(p, -2)
        return (ft.zeros_like(p), row, col, one, row, col)

    def leaf(g: Array, s: Any, p: Any, ctx: Any) -> tuple:
        if g.size == 0:  # no entries: nothing to average (a mean would be NaN), state kept
            return g, tuple(s)
        sq = abs_sq(g) + eps1
        factored = g.ndim >= 2
        if factored:
            v_row = ema_update(jnp.mean(sq, axis=-1), s.v_row, b2)
            v_col = ema_update(jnp.mean(sq, axis=-2), s.v_col, b2)
            v = s.v
            u = g * _factored_rsqrt(v_row, v_col)
        else:
            v_row, v_col = s.v_row, s.v_col
            v = ema_update(sq, s.v, b2)
            u = g * v ** -0.5
        if clip_threshold is not None:
            rms = jnp.sqrt(jnp.mean(abs_sq(u)))
            u = u / jnp.maximum(rms / clip_threshold, 1.0)
        mu = ema_update(u, s.mu, b1)
        if not factored:
            return mu, s._replace(mu=mu, v_row=v_row, v_col=v_col, v=v)
        instability = abs_sq(u - mu) + eps2
        r_row = ema_update(jnp.mean(instability, axis=-1), s.r_row, b3)
        r_col = ema_update(jnp.mean(instability, axis=-2), s.r_col, b3)
        return (mu * _factored_rsqrt(r_row, r_col),
                s._replace(mu=mu, v_row=v_row, v_col=v_col, v=v, r_row=r_row, r_col=r_col))

    return stage_transform(LeafStage(
        name="scale_by_came", update_leaf=leaf, state_cls=CameState,
        leaf_fields=("mu", "v_row", "v_col", "v", "r_row", "r_col"), init_leaf=init_leaf,
        init_global=zero_count, prepare=count_only, checks=LeafChecks(shaped_fields=("mu",))))


@declare_optimizer("beyond optax", "Luo et al., 2023", optax=None, summary=(
    "CAME (Luo et al., 2023): Adafactor's factored second moment plus a factored confidence "
    "term."), signature="came(learning_rate=2e-4, b1=0.9, b2=0.999, b3=0.9999, ...)")
@hyperparameters(learning_rate="schedule", b1="number", b2="number", b3="number",
                 eps1="number", eps2="number", clip_threshold="number or None",
                 weight_decay="schedule")
@shared_args()
def came(learning_rate: ScalarOrSchedule = 2e-4, b1: float = 0.9, b2: float = 0.999,
         b3: float = 0.9999, eps1: float = 1e-30, eps2: float = 1e-16,
         clip_threshold: Optional[float] = 1.0, weight_decay: ScalarOrSchedule = 0.0,
         mask: Optional[MaskOrFn] = None, *,
         cautious_weight_decay: bool = False) -> GradientTransformation:
    """CAME (Luo et al., 2023): Adafactor-like memory with a confidence-scaled momentum.

    Update rule, for a matrix leaf (:func:`scale_by_came`): factored
    ``v ~ v_row v_col / mean(v_row)`` of ``g**2 + eps1`` (decay ``b2``);
    ``u = g / sqrt(v)`` clipped to RMS ``clip_threshold``; ``mu = b1 mu +
    (1 - b1) u``; factored ``r ~`` EMA (decay ``b3``) of ``(u - mu)**2 + eps2``;
    ``p -= lr * (mu / sqrt(r) + wd * p)``. Vectors and scalars use ``p -= lr *
    (mu + wd * p)`` with a full ``v``. Reference: Luo, Ren, Zheng, Jiang, Jiang &
    You, 2023, "CAME: Confidence-guided Adaptive Memory Efficient Optimization"
    (ACL 2023).

    Defaults: the betas ``(0.9, 0.999, 0.9999)``, ``eps = (1e-30, 1e-16)`` and
    ``clip_threshold = 1`` are the paper's and the reference's; ``b3`` close
    to 1 makes the confidence a slow, stable average. The reference has no
    default learning rate; 2e-4 is the paper's for BERT pre-training (CAME's
    steps are RMS-normalised like Adam's, so Adam-like rates apply). Weight
    decay is decoupled and multiplied by the learning rate, as the reference.

    Args:
      learning_rate: the step size: a number or a schedule of the step count.
        Default 2e-4.
      b1: decay of the momentum, in ``[0, 1)``.
      b2: decay of the factored second moment, in ``[0, 1)``.
      b3: decay of the factored instability, in ``[0, 1)``.
      eps1: added to ``g**2``.
      eps2: added to the instability.
      clip_threshold: the largest RMS of the normalised update; ``None``
        turns the clipping off.
      weight_decay: decoupled weight decay (times the learning rate).
        Default 0.
      mask: which leaves get weight decay (a tree of bools or a function of
        the params).
      <shared: cautious_weight_decay>

    Returns:
      A ``GradientTransformation``; its state is ``(CameState, EmptyState,
      EmptyState)``.

    >>> import jax, jax.numpy as jnp, functrain
    >>> f = lambda p: jnp.sum((p['w'] - 1.0) ** 2) + jnp.sum(p['b'] ** 2)
    >>> opt = functrain.contrib.came(learning_rate=0.05)
    >>> params = {'w': jnp.zeros((3, 2)), 'b': jnp.ones(2)}
    >>> state = opt.init(params)
    >>> for _ in range(50):
    ...     updates, state = opt.update(jax.grad(f)(params), state, params)
    ...     params = functrain.apply_updates(params, updates)
    >>> bool(f(params) < 1.0)
    True
    """
    return chain(scale_by_came(b1, b2, b3, eps1, eps2, clip_threshold),
                 add_decayed_weights(weight_decay, mask, cautious=cautious_weight_decay),
                 scale_by_learning_rate(learning_rate))
