"""MADGRAD (Defazio & Jelassi, 2021): momentumized, adaptive, dual-averaged gradients.

``scale_by_madgrad`` is one :class:`~functrain.engine.stage.LeafStage` (it keeps the
initial parameters ``x0`` in its state); ``madgrad`` adds functrain's weight decay. Its cube
root has no complex version: a complex leaf raises a ``TypeError`` naming it.

Names, arguments, defaults, states and numbers are optax.contrib 0.2.8's. Notation in the
docstrings: ``g`` is the gradient, ``p`` the parameter, ``t`` the step number counted from 1,
``lr`` the learning rate (its value at the step count, counted from 0, when it is a
schedule), ``ema(x, b)`` the moving average ``b avg + (1 - b) x``.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from functrain.arg_checks import check_momentum, check_nonnegative
from functrain.declarations import declare_optimizer, hyperparameters
from functrain import tree as ft
from functrain.numerics import abs_sq
from functrain.engine.protocol import GradientTransformation, ScalarOrSchedule
from functrain.engine.stage import LeafChecks, LeafStage
from functrain.engine.counts import safe_increment, value_at, zero_count
from functrain.engine.program import chain, stage_transform
from functrain.transforms.scaling import add_decayed_weights
from functrain.docstrings import shared_args

Array = jax.Array

__all__ = ["MadgradState", "scale_by_madgrad", "madgrad"]


class MadgradState(NamedTuple):
    """State of :func:`scale_by_madgrad` (optax's fields and order).

    Attributes:
      count: the number of steps taken (int32).
      grad_sum_sq: the weighted sum of squared gradients ``G``.
      s: the weighted sum of gradients.
      x0: the initial parameters (a copy made at ``init``).

    >>> import jax.numpy as jnp, functrain
    >>> functrain.contrib.scale_by_madgrad(0.1).init([jnp.ones(2)]).x0
    [Array([1., 1.], dtype=float32)]
    """

    count: Array
    grad_sum_sq: Any
    s: Any
    x0: Any


@hyperparameters(learning_rate="schedule", momentum="number", eps="number")
@shared_args()
def scale_by_madgrad(learning_rate: ScalarOrSchedule, momentum: float = 0.9,
                     eps: float = 1e-6) -> GradientTransformation:
    """MADGRAD's dual-averaged step (Defazio & Jelassi, 2021), as an update.

    With ``k`` the step count (from 0) and ``lam = (lr + eps) sqrt(k + 1)``:
    ``G = G + lam g**2``, ``s = s + lam g``, ``z = x0 - s / (cbrt(G) + eps)``;
    the new point is ``(1 - momentum) z + momentum p`` and the update is that
    minus ``p``. The learning rate is inside the update (the stage comes last);
    ``update`` needs the params. Reference: Defazio & Jelassi, 2021,
    "Adaptivity without Compromise: A Momentumized, Adaptive, Dual Averaged
    Gradient Method for Stochastic Optimization".

    Args:
      <shared: learning_rate>
      momentum: the weight of the current point, in ``[0, 1)``.
      eps: added to the learning rate and to the cube root, ``>= 0``.

    Returns:
      A ``GradientTransformation`` whose state is :class:`MadgradState`
      (real parameters only: the cube root has no complex version).

    >>> import jax.numpy as jnp, functrain
    >>> tx = functrain.contrib.scale_by_madgrad(1.0, momentum=0.0, eps=0.0)
    >>> params = [jnp.zeros(1)]
    >>> tx.update([jnp.array([8.])], tx.init(params), params)[0]
    [Array([-2.], dtype=float32)]
    """
    check_momentum("scale_by_madgrad", momentum)
    check_nonnegative("scale_by_madgrad", eps=eps)

    def prepare(glob: dict, _: Any) -> tuple:
        count = glob["count"]
        lam = (value_at(learning_rate, count) + eps) * jnp.sqrt(count + 1)
        return lam, {"count": safe_increment(count)}

    def leaf(g: Array, s: Any, p: Array, lam: Array) -> tuple:
        grad_sum_sq = s.grad_sum_sq + lam * abs_sq(g)
        sums = s.s + lam * g
        z = s.x0 - sums / (jnp.cbrt(grad_sum_sq) + eps)
        new_p = (1 - momentum) * z + momentum * p
        return new_p - p, s._replace(grad_sum_sq=grad_sum_sq, s=sums)

    return stage_transform(LeafStage(
        name="scale_by_madgrad", update_leaf=leaf, state_cls=MadgradState,
        leaf_fields=("grad_sum_sq", "s", "x0"),
        init_leaf=lambda p: (ft.zeros_like(p), ft.zeros_like(p), jnp.array(p, copy=True)),
        init_global=zero_count, prepare=prepare,
        checks=LeafChecks(needs_params=True, real_only=True)))


@declare_optimizer("contrib", "Defazio & Jelassi, 2021", optax="contrib",
    summary="MADGRAD (Defazio & Jelassi, 2021); ACProp (Zhuang et al., 2021).",
    signature="madgrad(...)")
@hyperparameters(learning_rate="schedule", momentum="number", weight_decay="number",
                 eps="number")
@shared_args()
def madgrad(learning_rate: ScalarOrSchedule, momentum: float = 0.9, weight_decay: float = 0.0,
            eps: float = 1e-6) -> GradientTransformation:
    """MADGRAD (Defazio & Jelassi, 2021): momentumized, adaptive dual averaging.

    Update rule, with ``g`` including the L2 term ``weight_decay * p`` and
    ``lam = (lr + eps) sqrt(k + 1)``: ``G += lam g**2``, ``s += lam g``,
    ``z = x0 - s / (cbrt(G) + eps)``, ``p = (1 - momentum) z + momentum p``.
    Reference: Defazio & Jelassi, 2021, "Adaptivity without Compromise: A
    Momentumized, Adaptive, Dual Averaged Gradient Method for Stochastic
    Optimization".

    Args:
      <shared: learning_rate>
      momentum: the weight of the current point, in ``[0, 1)``.
      weight_decay: the L2 weight decay, added to the gradient (coupled).
      eps: added to the learning rate and to the cube root, ``>= 0``.

    Returns:
      A ``GradientTransformation``; its state is ``(EmptyState, MadgradState)``.
      ``update`` needs the params.

    >>> import jax, jax.numpy as jnp, functrain
    >>> f = lambda x: jnp.sum(jnp.square(x))
    >>> opt = functrain.contrib.madgrad(learning_rate=0.1)
    >>> params = jnp.array([1., 2., 3.])
    >>> state = opt.init(params)
    >>> for _ in range(5):
    ...     updates, state = opt.update(jax.grad(f)(params), state, params)
    ...     params = functrain.apply_updates(params, updates)
    >>> print(f"{f(params):.2f}")
    9.71
    """
    return chain(add_decayed_weights(weight_decay),
                 scale_by_madgrad(learning_rate, momentum, eps))
