"""Accumulation: the heavy-ball/Nesterov trace and the moving average of updates
(``optax.transforms``' ``trace`` and ``ema``), stages every family uses.

Each keeps one params-shaped buffer per leaf and is the per-array math of one leaf; the
engine lifts it over the tree.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

import jax

from functrain.arg_checks import check_range
from functrain.declarations import hyperparameters, state_value_kinds
from functrain import tree as ft
from functrain.numerics import bias_correction_factor, ema_update
from functrain.engine.protocol import GradientTransformation
from functrain.engine.stage import LeafStage
from functrain.engine.counts import safe_increment, zero_count
from functrain.engine.program import stage_transform

Array = jax.Array


@state_value_kinds(trace="signed")
class TraceState(NamedTuple):
    """State of :func:`trace`: the momentum buffer.

    Attributes:
      trace: the momentum buffer ``t``, a tree like the params (in
        ``accumulator_dtype`` if given).

    >>> import jax.numpy as jnp
    >>> trace(0.9).init([jnp.ones(2)])
    TraceState(trace=[Array([0., 0.], dtype=float32)])
    """

    trace: Any


@state_value_kinds(ema="signed")
class EmaState(NamedTuple):
    """State of :func:`ema`: the step count and the moving average.

    Attributes:
      count: the number of steps taken (int32), for the debiasing.
      ema: the (not debiased) moving average ``m``, a tree like the params.

    >>> import jax.numpy as jnp, functrain
    >>> functrain.ema(0.9).init([jnp.ones(1)]).ema
    [Array([0.], dtype=float32)]
    """

    count: Array
    ema: Any


@hyperparameters(decay="number")
def trace(decay: float, nesterov: bool = False,
          accumulator_dtype: Optional[Any] = None) -> GradientTransformation:
    """Momentum: ``t = g + decay t``; the update is ``t`` (or ``g + decay t``, Nesterov).

    Heavy-ball momentum (Polyak, 1964, "Some methods of speeding up the
    convergence of iteration methods"); with ``nesterov`` the look-ahead form of
    Sutskever et al., 2013, "On the importance of initialization and momentum in
    deep learning".

    Args:
      decay: the momentum coefficient, in ``[0, 1]`` (0: the update is ``g``).
      nesterov: return ``g + decay t`` (with the new ``t``) instead of ``t``.
        Default ``False``.
      accumulator_dtype: storage dtype of the buffer ``t``; ``None`` keeps each
        parameter's dtype.

    Returns:
      A ``GradientTransformation`` whose state is :class:`TraceState`.

    >>> import jax.numpy as jnp
    >>> tx = trace(decay=0.9)
    >>> state = tx.init([jnp.zeros(1)])
    >>> u, state = tx.update([jnp.ones(1)], state)
    >>> tx.update([jnp.ones(1)], state)[0]
    [Array([1.9], dtype=float32)]
    """
    check_range("decay", decay, 0.0, 1.0, high_inclusive=True, owner="trace")

    def leaf(g: Array, state: tuple, p: Any, ctx: Any) -> tuple:
        t = g + decay * state.trace
        return (g + decay * t if nesterov else t), state._replace(trace=t)

    return stage_transform(LeafStage(
        name="trace", update_leaf=leaf, state_cls=TraceState, leaf_fields=("trace",),
        init_leaf=lambda p: (ft.zeros_like(p, accumulator_dtype),)))


@hyperparameters(decay="number")
def ema(decay: float, debias: bool = True,
        accumulator_dtype: Optional[Any] = None) -> GradientTransformation:
    """Exponential moving average of the updates: ``m = decay m + (1 - decay) u``.

    The update is ``m``, divided by ``1 - decay**t`` when ``debias``.

    Args:
      decay: the weight of the old average, in ``[0, 1]``.
      debias: divide by ``1 - decay**t`` (``t`` the step count), correcting the
        bias of the zero start as Adam does. Default ``True``.
      accumulator_dtype: storage dtype of ``m``; ``None`` keeps each parameter's
        dtype.

    Returns:
      A ``GradientTransformation`` whose state is :class:`EmaState`.

    >>> import jax.numpy as jnp, functrain
    >>> tx = functrain.ema(0.5, debias=False)
    >>> u, state = tx.update([jnp.array([2.])], tx.init([jnp.zeros(1)]))
    >>> u
    [Array([1.], dtype=float32)]
    """
    check_range("decay", decay, 0.0, 1.0, high_inclusive=True, owner="ema")

    def prepare(glob: dict, _: Any) -> tuple:
        count = safe_increment(glob["count"])
        return bias_correction_factor(decay, count), {"count": count}

    def leaf(g: Array, s: tuple, p: Any, correction: Any) -> tuple:
        m = ema_update(g, s.ema, decay)
        return (m / correction if debias else m), s._replace(ema=m)

    return stage_transform(LeafStage(
        name="ema", update_leaf=leaf, state_cls=EmaState, leaf_fields=("ema",),
        init_leaf=lambda p: (ft.zeros_like(p, accumulator_dtype),),
        init_global=zero_count, prepare=prepare))
