"""COCOB-Backprop (Orabona & Tommasi, 2017): learning-rate-free training by coin betting.

Every parameter entry bets on the sign of its negative gradient, with a wealth
earned from past bets; all of it is per entry, so :func:`scale_by_cocob` is a
``LeafStage`` run by functrain's engine (fused with the weight decay and the
learning-rate stages of :func:`cocob`).

Names, arguments, defaults, state and numbers are optax.contrib 0.2.8's.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp

from functrain.arg_checks import check_nonnegative, check_range
from functrain.declarations import declare_optimizer, hyperparameters
from functrain import tree as ft
from functrain.engine.protocol import GradientTransformation, MaskOrFn, ScalarOrSchedule
from functrain.engine.stage import LeafChecks, LeafStage
from functrain.engine.program import chain, stage_transform
from functrain.transforms.scaling import add_decayed_weights, scale_by_learning_rate

Array = jax.Array


class COCOBState(NamedTuple):
    """State of :func:`scale_by_cocob` (optax's fields and order; every field is a tree like the params).

    Attributes:
      init_particles: the initial parameters ``x_0``.
      cumulative_gradients: ``-sum_k g_k``.
      scale: ``L``, the largest ``|g|`` so far (from ``eps``).
      subgradients: ``G = sum_k |g_k|``.
      reward: ``R``, the wealth won so far (``>= 0``).

    >>> import jax.numpy as jnp, functrain
    >>> functrain.contrib.scale_by_cocob().init(jnp.ones(2)).scale
    Array([1.e-08, 1.e-08], dtype=float32)
    """

    init_particles: Any
    cumulative_gradients: Any
    scale: Any
    subgradients: Any
    reward: Any


@hyperparameters(alpha="number", eps="number")
def scale_by_cocob(alpha: float = 100.0, eps: float = 1e-8) -> GradientTransformation:
    """COCOB-Backprop's bet (Orabona & Tommasi, 2017), entry by entry.

    Per entry, with ``g`` the incoming update::

        L = max(L, |g|);   G = G + |g|;   R = max(R - g (x - x_0), 0);   C = C - g
        x_new = x_0 + C / (L max(G + L, alpha L)) (L + R)

    and the update is ``x_new - x``. Paper: Orabona and Tommasi, "Training
    Deep Networks without Learning Rates Through Coin Betting" (2017),
    Algorithm 2. Real parameters only (complex leaves raise a ``TypeError``
    naming the leaf).

    Args:
      alpha: bounds the fraction of the wealth bet at the start, ``>= 0``.
      eps: the initial ``L`` (avoids dividing by zero), ``> 0``.

    Returns:
      A ``GradientTransformation`` whose ``update`` needs the params and whose
      state is :class:`COCOBState`.

    >>> import jax.numpy as jnp, functrain
    >>> tx = functrain.contrib.scale_by_cocob(alpha=1.0)
    >>> params = jnp.array([0.0])
    >>> tx.update(jnp.array([2.0]), tx.init(params), params)[0]
    Array([-0.5], dtype=float32)
    """
    check_nonnegative("scale_by_cocob", alpha=alpha)
    check_range("eps", eps, 1e-45, owner="scale_by_cocob")

    def init_leaf(p: Array) -> tuple:
        zeros = jnp.zeros_like(p)
        return jnp.array(p, copy=True), zeros, ft.full_like(p, eps), zeros, zeros

    def leaf(g: Array, s: Any, p: Array, ctx: Any) -> tuple:
        scale = jnp.maximum(s.scale, jnp.abs(g))
        subgradients = s.subgradients + jnp.abs(g)
        reward = jnp.maximum(s.reward - g * (p - s.init_particles), 0)
        cumulative = s.cumulative_gradients - g
        bet = cumulative / (scale * jnp.maximum(subgradients + scale, alpha * scale))
        new_p = s.init_particles + bet * (scale + reward)
        return new_p - p, s._replace(cumulative_gradients=cumulative, scale=scale,
                                     subgradients=subgradients, reward=reward)

    return stage_transform(LeafStage(
        name="scale_by_cocob", update_leaf=leaf, state_cls=COCOBState,
        leaf_fields=COCOBState._fields, init_leaf=init_leaf,
        checks=LeafChecks(needs_params=True, real_only=True)))


@declare_optimizer("contrib", "Orabona & Tommasi, 2017", optax="contrib", listed_with="mechanize",
    signature="cocob(...)")
@hyperparameters(learning_rate="schedule", alpha="number", eps="number", weight_decay="number")
def cocob(learning_rate: ScalarOrSchedule = 1.0, alpha: float = 100.0, eps: float = 1e-8,
          weight_decay: float = 0.0, mask: Optional[MaskOrFn] = None) -> GradientTransformation:
    """COCOB-Backprop (Orabona & Tommasi, 2017): stochastic gradient descent by coin betting.

    The gradients plus ``weight_decay x`` (where ``mask``), times
    ``learning_rate`` (not negated), go through :func:`scale_by_cocob`: each
    entry moves to ``x_0 + C / (L max(G + L, alpha L)) (L + R)`` with ``C`` the
    negated sum of its gradients, ``G`` the sum of their moduli, ``L`` the
    largest and ``R`` the wealth won. Learning-rate free (``learning_rate``
    only injects a schedule). Paper: Orabona and Tommasi, "Training Deep
    Networks without Learning Rates Through Coin Betting" (2017).

    Args:
      learning_rate: multiplies the gradients before the bet (number or
        schedule; default 1).
      alpha: bounds the fraction of the wealth bet at the start, ``>= 0``.
      eps: the initial ``L``, ``> 0``.
      weight_decay: L2 penalty added to the gradients, ``>= 0``.
      mask: where to add the weight decay, as :func:`functrain.add_decayed_weights`.

    Returns:
      A ``GradientTransformation`` (a chain of three fused stages: the decay,
      the learning rate and :class:`COCOBState`) whose ``update`` needs the
      params.

    >>> import jax, jax.numpy as jnp, functrain
    >>> opt = functrain.contrib.cocob()
    >>> params = jnp.array([1., 2., 3.])
    >>> state = opt.init(params)
    >>> updates, state = opt.update(jax.grad(lambda x: jnp.sum(x ** 2))(params), state, params)
    >>> functrain.apply_updates(params, updates)
    Array([0.99, 1.99, 2.99], dtype=float32)
    """
    return chain(add_decayed_weights(weight_decay, mask),
                 scale_by_learning_rate(learning_rate, flip_sign=False),
                 scale_by_cocob(alpha, eps))


__all__ = ["COCOBState", "cocob", "scale_by_cocob"]
