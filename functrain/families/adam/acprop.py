"""ACProp (Zhuang et al., 2021): AdaBelief's belief moment, applied asynchronously.

``scale_by_acprop`` is one :class:`~functrain.engine.stage.LeafStage` whose state is
optax's ``ScaleByBeliefState``; ``acprop`` chains it with functrain's weight-decay and
learning-rate stages. Its squares are squared moduli (``numerics.abs_sq``), so complex
leaves give optax's numbers.

Names, arguments, defaults, states and numbers are optax.contrib 0.2.8's. Notation in the
docstrings: ``g`` is the gradient, ``p`` the parameter, ``t`` the step number counted from 1,
``lr`` the learning rate (its value at the step count, counted from 0, when it is a
schedule), ``ema(x, b)`` the moving average ``b avg + (1 - b) x``.
"""

from __future__ import annotations

from typing import Any, Optional

import jax
import jax.numpy as jnp

from functrain.arg_checks import check_betas, check_nonnegative
from functrain.declarations import declare_optimizer, hyperparameters
from functrain import tree as ft
from functrain.numerics import abs_sq, bias_correction_factor, ema_update
from functrain.families.adam.stages import ScaleByBeliefState
from functrain.engine.protocol import GradientTransformation, MaskOrFn, ScalarOrSchedule
from functrain.engine.stage import LeafStage
from functrain.engine.counts import safe_increment, zero_count
from functrain.engine.program import chain, stage_transform
from functrain.transforms.scaling import add_decayed_weights, scale_by_learning_rate
from functrain.docstrings import shared_args

Array = jax.Array

__all__ = ["scale_by_acprop", "acprop"]


@hyperparameters(b1="number", b2="number", eps="number", eps_root="number")
def scale_by_acprop(b1: float = 0.9, b2: float = 0.999, eps: float = 1e-16,
                    eps_root: float = 1e-16) -> GradientTransformation:
    """Rescale by ACProp (Zhuang et al., 2021): AdaBelief with an asynchronous denominator.

    The gradient is divided by the *previous* step's centred second moment:
    ``u = g / (sqrt(s_hat) + eps)`` with ``s_hat = s / (1 - b2**(t-1))`` before
    this step's update (1 at the first step); then ``mu = ema(g, b1)`` and
    ``s = ema(|g - mu_prev|**2, b2) + eps_root``. Reference: Zhuang et al.,
    2021, "Momentum Centering and Asynchronous Update for Adaptive Gradient
    Methods".

    Args:
      b1: decay rate of the first moment ``mu``, in ``[0, 1)``.
      b2: decay rate of the centred second moment ``s``, in ``[0, 1)``.
      eps: added to the denominator outside the square root, ``>= 0``.
      eps_root: added to ``s`` at every step (it accumulates in the state),
        ``>= 0``.

    Returns:
      A ``GradientTransformation`` whose state is
      :class:`~functrain.families.adam.stages.ScaleByBeliefState` (as optax's).

    >>> import jax.numpy as jnp, functrain
    >>> tx = functrain.contrib.scale_by_acprop()
    >>> tx.update([jnp.array([2.])], tx.init([jnp.zeros(1)]))[0]
    [Array([2.], dtype=float32)]
    """
    check_betas("scale_by_acprop", b1=b1, b2=b2)
    check_nonnegative("scale_by_acprop", eps=eps, eps_root=eps_root)

    def prepare(glob: dict, _: Any) -> tuple:
        count = glob["count"]
        count_inc = safe_increment(count)
        initial = count == 0
        t = jnp.where(initial, count_inc, count)
        return (initial, bias_correction_factor(b2, t)), {"count": count_inc}

    def leaf(g: Array, s: Any, p: Any, ctx: tuple) -> tuple:
        initial, correction = ctx
        mu = ema_update(g, s.mu, b1)
        nu = ema_update(abs_sq(g - s.mu), s.nu, b2) + eps_root
        nu_hat = jnp.where(initial, 1.0, jnp.real(s.nu) / correction)
        return g / (jnp.sqrt(nu_hat) + eps), s._replace(mu=mu, nu=nu)

    return stage_transform(LeafStage(
        name="scale_by_acprop", update_leaf=leaf, state_cls=ScaleByBeliefState,
        leaf_fields=("mu", "nu"), init_leaf=lambda p: (ft.zeros_like(p), ft.zeros_like(p)),
        init_global=zero_count, prepare=prepare))


@declare_optimizer("contrib", "Zhuang et al., 2021", optax="contrib", listed_with="madgrad",
    signature="acprop(...)")
@hyperparameters(learning_rate="schedule", b1="number", b2="number", eps="number",
                 eps_root="number", weight_decay="schedule")
@shared_args()
def acprop(learning_rate: ScalarOrSchedule, b1: float = 0.9, b2: float = 0.999,
           eps: float = 1e-16, eps_root: float = 1e-16, weight_decay: ScalarOrSchedule = 0.0,
           mask: Optional[MaskOrFn] = None, *,
           cautious_weight_decay: bool = False) -> GradientTransformation:
    """ACProp (Zhuang et al., 2021): momentum centring and an asynchronous update.

    Update rule: ``p -= lr * (g / (sqrt(s_hat_prev) + eps) + weight_decay * p)``
    where ``s_hat_prev`` is the bias-corrected ``s`` of the previous step (1 at
    the first), and then ``mu = ema(g, b1)``, ``s = ema(|g - mu_prev|**2, b2) +
    eps_root``. Reference: Zhuang et al., 2021, "Momentum Centering and
    Asynchronous Update for Adaptive Gradient Methods".

    Args:
      <shared: learning_rate, b1>
      b2: decay rate of the centred second moment, in ``[0, 1)``.
      eps: added to the denominator outside the square root, ``>= 0``.
      eps_root: added to ``s`` at every step, ``>= 0``.
      weight_decay: the decoupled weight decay (multiplied by the learning
        rate), ``>= 0``; a number or a schedule.
      mask: where to apply the weight decay: a tree of bools (or a prefix), or
        a function of the params returning one; ``None`` decays every leaf.
      <shared: cautious_weight_decay>

    Returns:
      A ``GradientTransformation``; its state is ``(ScaleByBeliefState,
      <weight decay state>, <learning rate state>)``.

    >>> import jax, jax.numpy as jnp, functrain
    >>> f = lambda x: jnp.sum(jnp.square(x))
    >>> opt = functrain.contrib.acprop(learning_rate=0.01)
    >>> params = jnp.array([1., 2., 3.])
    >>> state = opt.init(params)
    >>> for _ in range(5):
    ...     updates, state = opt.update(jax.grad(f)(params), state, params)
    ...     params = functrain.apply_updates(params, updates)
    >>> print(f"{f(params):.2E}")
    1.30E+01
    """
    return chain(scale_by_acprop(b1, b2, eps, eps_root),
                 add_decayed_weights(weight_decay, mask, cautious=cautious_weight_decay),
                 scale_by_learning_rate(learning_rate))
