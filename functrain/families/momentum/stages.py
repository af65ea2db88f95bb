"""Momentum: optimistic gradients (the trace and the moving average every family uses are
:mod:`functrain.transforms.accumulation`).

It keeps one params-shaped buffer per leaf and is the per-array math of one leaf; the
engine lifts it over the tree.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from functrain.declarations import hyperparameters
from functrain import tree as ft
from functrain.engine.protocol import GradientTransformation
from functrain.engine.stage import LeafStage
from functrain.engine.program import stage_transform

Array = jax.Array


class ScaleByOptimisticGradientState(NamedTuple):
    """State of :func:`scale_by_optimistic_gradient`.

    Attributes:
      is_initial_step: a bool scalar, ``True`` until the first update.
      previous_gradient: the gradient of the last step, a tree like the params.

    >>> import jax.numpy as jnp, functrain
    >>> functrain.scale_by_optimistic_gradient().init([jnp.ones(1)]).is_initial_step
    Array(True, dtype=bool)
    """

    is_initial_step: Array
    previous_gradient: Any


@hyperparameters(alpha="number", beta="number")
def scale_by_optimistic_gradient(alpha: float = 1.0, beta: float = 1.0
                                 ) -> GradientTransformation:
    """Optimistic update ``(alpha + beta) g_t - beta g_{t-1}`` (``g_0`` stands in for ``g_{-1}``).

    At the first step the update is therefore ``alpha g_0``. Reference: Mokhtari
    et al., 2019, "A Unified Analysis of Extra-gradient and Optimistic Gradient
    Methods for Saddle Point Problems: Proximal Point Approach".

    Args:
      alpha: the coefficient of the current gradient beyond the optimistic term
        (the generalized method's step ratio). Default 1.
      beta: the weight of the optimistic correction ``g_t - g_{t-1}`` (a negative
        momentum). Default 1.

    Returns:
      A ``GradientTransformation`` whose state is
      :class:`ScaleByOptimisticGradientState`.

    >>> import jax.numpy as jnp, functrain
    >>> tx = functrain.scale_by_optimistic_gradient()
    >>> state = tx.init([jnp.zeros(1)])
    >>> u, state = tx.update([jnp.array([1.])], state)
    >>> tx.update([jnp.array([3.])], state)[0]
    [Array([5.], dtype=float32)]
    """
    def prepare(glob: dict, _: Any) -> tuple:
        return glob["is_initial_step"], {"is_initial_step": jnp.array(False)}

    def leaf(g: Array, s: tuple, p: Any, first: Array) -> tuple:
        prev = jnp.where(first, g, s.previous_gradient)
        return (alpha + beta) * g - beta * prev, s._replace(previous_gradient=g)

    return stage_transform(LeafStage(
        name="scale_by_optimistic_gradient", update_leaf=leaf,
        state_cls=ScaleByOptimisticGradientState,
        leaf_fields=("previous_gradient",), init_leaf=lambda p: (ft.zeros_like(p),),
        init_global=lambda: {"is_initial_step": jnp.array(True)}, prepare=prepare))
