"""LaProp: momentum over the adaptively normalised gradient (Ziyin, Wang & Ueda, 2020).

Adam divides its momentum by the root of the second moment; LaProp divides each
gradient first and takes the momentum of the quotients, so the momentum and the
adaptivity are separate: ``b1`` and ``b2`` can be set independently (the paper shows
stable training for ``b1 > b2``, where Adam diverges). optax does not have it; it is
one :class:`~functrain.engine.stage.LeafStage` on functrain's engine, the worked
example of ``docs/design.md``.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

import jax

from functrain import tree as ft
from functrain.arg_checks import check_betas, check_nonnegative
from functrain.declarations import declare_optimizer, hyperparameters, state_value_kinds
from functrain.numerics import abs_sq, adam_direction, ema_update
from functrain.engine.counts import BiasCorrections, corrections, zero_count
from functrain.engine.protocol import GradientTransformation, MaskOrFn, ScalarOrSchedule
from functrain.engine.stage import LeafStage
from functrain.engine.program import chain, stage_transform
from functrain.transforms.scaling import add_decayed_weights, scale_by_learning_rate
from functrain.docstrings import shared_args

Array = jax.Array

__all__ = ["ScaleByLapropState", "scale_by_laprop", "laprop"]


@state_value_kinds(mu="signed", nu="unsigned")
class ScaleByLapropState(NamedTuple):
    """State of :func:`scale_by_laprop` (the fields of optax's Adam state).

    Attributes:
      count: the number of steps taken (int32).
      mu: the momentum of the normalised gradients (params-shaped).
      nu: the moving average of the squared gradients (params-shaped).

    >>> import jax.numpy as jnp
    >>> scale_by_laprop().init({'w': jnp.zeros(2)}).nu
    {'w': Array([0., 0.], dtype=float32)}
    """
    count: Array
    mu: Any
    nu: Any


@hyperparameters(b1="number", b2="decay", eps="number")
@shared_args()
def scale_by_laprop(b1: float = 0.9, b2: float = 0.999, eps: float = 1e-15,
                    mu_dtype: Optional[Any] = None) -> GradientTransformation:
    """Rescale updates by LaProp's rule (Ziyin, Wang & Ueda, 2020, Algorithm 1).

    ``nu = b2 nu + (1-b2) |g|**2``, ``mu = b1 mu + (1-b1) g / (sqrt(nu / (1-b2**t)) + eps)``,
    and the update is ``mu / (1 - b1**t)``. Reference: Ziyin, Wang & Ueda, 2020, "LaProp:
    Separating Momentum and Adaptivity in Adam" (arXiv:2002.04839). The defaults are the
    authors' reference code's.

    Args:
      b1: decay rate of the momentum ``mu``, in ``[0, 1)``.
      b2: decay rate of the second moment ``nu``, in ``[0, 1)``.
      eps: added to the root of the bias-corrected ``nu`` before dividing; ``>= 0``.
      <shared: mu_dtype>

    Returns:
      A ``GradientTransformation`` whose state is :class:`ScaleByLapropState`.

    >>> import jax.numpy as jnp
    >>> tx = scale_by_laprop()
    >>> params = {'w': jnp.array([3., -0.5])}
    >>> updates, state = tx.update(params, tx.init(params))
    >>> updates['w']
    Array([ 1., -1.], dtype=float32)
    """
    check_betas("scale_by_laprop", b1=b1, b2=b2)
    check_nonnegative("scale_by_laprop", eps=eps)

    def leaf(g: Array, state: Any, p: Any, ctx: BiasCorrections) -> tuple:
        nu = ema_update(abs_sq(g), state.nu, ctx.b2)
        mu = ema_update(adam_direction(g, nu, None, ctx.nu, eps), state.mu, b1)
        return mu / ctx.mu, state._replace(mu=mu, nu=nu)

    return stage_transform(LeafStage(
        name="scale_by_laprop", update_leaf=leaf, state_cls=ScaleByLapropState,
        leaf_fields=("mu", "nu"), init_leaf=lambda p: (ft.zeros_like(p, mu_dtype),
                                                       ft.zeros_like(p)),
        init_global=zero_count, prepare=corrections(b1, b2)))


@declare_optimizer("beyond optax", "Ziyin et al., 2020", optax=None, summary=(
    "LaProp (Ziyin et al., 2020): the momentum of `g / sqrt(nu_hat)`, so momentum and adaptivity "
    "are separate (`b1 > b2` is stable)."),
    signature="laprop(learning_rate=4e-4, b1=0.9, b2=0.999, eps=1e-15, ...)")
@hyperparameters(learning_rate="schedule", b1="number", b2="decay", eps="number",
                 weight_decay="schedule")
@shared_args()
def laprop(learning_rate: ScalarOrSchedule = 4e-4, b1: float = 0.9, b2: float = 0.999,
           eps: float = 1e-15, weight_decay: ScalarOrSchedule = 0.0,
           mask: Optional[MaskOrFn] = None, mu_dtype: Optional[Any] = None, *,
           cautious_weight_decay: bool = False) -> GradientTransformation:
    """LaProp (Ziyin, Wang & Ueda, 2020) with decoupled weight decay.

    The update is ``-learning_rate (mu / (1 - b1**t) + weight_decay p)`` with ``mu`` the
    momentum of the gradients divided by the root of their bias-corrected second moment
    (:func:`scale_by_laprop`). The authors' code scales ``mu`` by the learning rate as it
    accumulates; with a constant learning rate the two are the same.

    Args:
      <shared: learning_rate>
      b1: decay rate of the momentum, in ``[0, 1)``.
      <shared: b2>
      eps: added to the root of the second moment; ``>= 0``.
      <shared: weight_decay>
      mask: which leaves get weight decay (a tree of bools or a function of params).
      mu_dtype: storage dtype of the momentum.
      <shared: cautious_weight_decay>

    Returns:
      A ``GradientTransformation``: ``chain(scale_by_laprop, add_decayed_weights,
      scale_by_learning_rate)``.

    >>> import jax.numpy as jnp
    >>> from functrain.contrib import laprop
    >>> opt = laprop(0.1)
    >>> params = [jnp.zeros(1)]
    >>> u, _ = opt.update([jnp.array([2.])], opt.init(params), params)
    >>> print(round(float(u[0][0]), 4))
    -0.1
    """
    return chain(scale_by_laprop(b1, b2, eps, mu_dtype),
                 add_decayed_weights(weight_decay, mask, cautious=cautious_weight_decay),
                 scale_by_learning_rate(learning_rate))
