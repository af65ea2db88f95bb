"""Sign-based rescaling: signSGD's sign, Lion's interpolated momentum, Rprop's step sizes.

Each is the per-array math of one leaf; the engine lifts it over the tree.
"""

from __future__ import annotations

from typing import Any, Literal, NamedTuple, Optional

import jax
import jax.numpy as jnp

from functrain.arg_checks import check_betas, check_range
from functrain.declarations import hyperparameters, state_value_kinds
from functrain import tree as ft
from functrain.numerics import ema_update
from functrain.engine.protocol import EmptyState, GradientTransformation
from functrain.engine.stage import LeafChecks, LeafStage
from functrain.engine.counts import count_only, zero_count
from functrain.engine.program import stage_transform
from functrain.docstrings import shared_args

Array = jax.Array


ScaleBySignState = EmptyState


def scale_by_sign() -> GradientTransformation:
    """Replace every update by its sign.

    The update is ``sign(g)``: -1, 0 or 1 per entry, keeping the dtype (signSGD).
    Reference: Bernstein et al., 2018, "signSGD: Compressed Optimisation for
    Non-Convex Problems".

    Returns:
      A ``GradientTransformation`` that keeps no state (``ScaleBySignState``,
      i.e. ``EmptyState``).

    >>> import jax.numpy as jnp, functrain
    >>> tx = functrain.scale_by_sign()
    >>> tx.update([jnp.array([-3., 0., 2.])], tx.init([jnp.zeros(3)]))[0]
    [Array([-1.,  0.,  1.], dtype=float32)]
    """
    return stage_transform(LeafStage(name="scale_by_sign", update_leaf=lambda g, s, p,
    c: (jnp.sign(g), ())))


@state_value_kinds(mu="signed")
class ScaleByLionState(NamedTuple):
    """State of :func:`scale_by_lion`: step count and momentum.

    Attributes:
      count: the number of steps taken (int32).
      mu: the momentum, the ``b2`` moving average of the gradients, a tree like
        the params (in ``mu_dtype`` if given).

    >>> import jax.numpy as jnp
    >>> scale_by_lion().init([jnp.zeros(2)]).mu
    [Array([0., 0.], dtype=float32)]
    """

    count: Array
    mu: Any


class ScaleByRpropState(NamedTuple):
    """State of :func:`scale_by_rprop`: per-entry step sizes and the last signed step.

    Attributes:
      step_sizes: the current step size of every entry, a tree like the params
        (starts at ``learning_rate``).
      prev_updates: the signed step ``step_size * sign(g)`` computed at the last
        step (0 where the gradient's sign flipped); returned as the next update.

    >>> import jax.numpy as jnp, functrain
    >>> functrain.scale_by_rprop(0.1).init([jnp.ones(2)]).step_sizes
    [Array([0.1, 0.1], dtype=float32)]
    """

    step_sizes: Any
    prev_updates: Any


@hyperparameters(b1="number", b2="number", smooth_beta="number")
@shared_args()
def scale_by_lion(b1: float = 0.9, b2: float = 0.99, mu_dtype: Optional[Any] = None, *,
                  mode: Literal["hard", "smooth", "refined"] = "hard",
                  smooth_beta: float = 1.0) -> GradientTransformation:
    """Rescale updates with the Lion rule (Chen et al., 2023).

    The update is ``sign((1-b1) g + b1 mu)`` (``tanh`` of it in ``'smooth'``
    mode, sign only outside [-1, 1] in ``'refined'`` mode); then
    ``mu = b2 mu + (1-b2) g``. Reference: Chen et al., 2023, "Symbolic Discovery
    of Optimization Algorithms".

    Args:
      b1: weight of the momentum in the interpolation whose sign is the update,
        in ``[0, 1)``.
      b2: decay rate of the momentum ``mu``, in ``[0, 1)``.
      <shared: mu_dtype>
      mode: (keyword only, as optax) how the interpolation ``x = (1-b1) g + b1 mu``
        becomes the update: ``'hard'`` (default, the paper's rule) ``sign(x)``; ``'smooth'``
        ``tanh(smooth_beta x)``; ``'refined'`` ``x`` where ``|x| < 1`` and
        ``sign(x)`` elsewhere. Any other value makes ``update`` raise ``ValueError``
        (as optax's, whose tests build and init it first).
      smooth_beta: the sharpness of ``tanh`` in ``'smooth'`` mode (larger is closer
        to ``sign``); unused in the other modes. Default 1.

    Returns:
      A ``GradientTransformation`` whose state is :class:`ScaleByLionState`.

    >>> import jax.numpy as jnp
    >>> tx = scale_by_lion()
    >>> updates, _ = tx.update([jnp.array([0.3, -2.])], tx.init([jnp.zeros(2)]))
    >>> updates
    [Array([ 1., -1.], dtype=float32)]
    """
    check_betas("scale_by_lion", b1=b1, b2=b2)

    def prepare(glob: dict, updates: Any) -> tuple:
        # checked when update is traced, before any array math, as optax checks it (its
        # test builds and inits an invalid mode, and expects update to raise)
        if mode not in ("hard", "smooth", "refined"):
            raise ValueError(f"scale_by_lion: mode must be 'hard', 'smooth' or 'refined', "
                             f"got {mode!r}.")
        return count_only(glob, updates)

    def leaf(g: Array, state: tuple, p: Any, ctx: Any) -> tuple:
        x = ema_update(g, state.mu, b1)
        if mode == "hard":
            u = jnp.sign(x)
        elif mode == "smooth":
            u = jnp.tanh(smooth_beta * x)
        else:
            u = jnp.where(jnp.abs(x) < 1.0, x, jnp.sign(x))
        return u, state._replace(mu=ema_update(g, state.mu, b2))

    return stage_transform(LeafStage(
        name="scale_by_lion", update_leaf=leaf, state_cls=ScaleByLionState, leaf_fields=("mu",),
        init_leaf=lambda p: (ft.zeros_like(p, mu_dtype),), init_global=zero_count,
        prepare=prepare))


@hyperparameters(learning_rate="number", eta_minus="number", eta_plus="number",
                 min_step_size="number", max_step_size="bound")
def scale_by_rprop(learning_rate: float, eta_minus: float = 0.5, eta_plus: float = 1.2,
                   min_step_size: float = 1e-6, max_step_size: float = 50.0
                   ) -> GradientTransformation:
    """Rescale with Rprop (Riedmiller & Braun, 1993): sign-driven per-entry step sizes.

    Where the gradient kept its sign the step grows by ``eta_plus``, where it
    flipped it shrinks by ``eta_minus`` (clipped to the bounds) and that
    entry does not move. As in optax, the update returned at step ``t`` is
    the signed step computed at step ``t - 1`` (zero at the first step).

    Per entry, with ``prev`` the last signed step: ``s = clip(s * eta_plus,
    min_step_size, max_step_size)`` if ``g prev > 0``, ``s = clip(s * eta_minus,
    ...)`` if ``g prev < 0`` (and the new signed step is 0), ``s`` unchanged if
    ``g prev == 0``; the new signed step is ``s sign(g)``. Reference: Riedmiller &
    Braun, 1993, "A Direct Adaptive Method for Faster Backpropagation Learning:
    The RPROP Algorithm".

    Args:
      learning_rate: the initial step size of every entry, ``>= 0``.
      eta_minus: factor the step size is multiplied by where the gradient's sign
        flipped; typically in ``(0, 1)``.
      eta_plus: factor the step size is multiplied by where the gradient kept its
        sign; typically ``> 1``.
      min_step_size: the smallest step size, ``>= 0``.
      max_step_size: the largest step size.

    Returns:
      A ``GradientTransformation`` whose state is :class:`ScaleByRpropState`.

    >>> import jax.numpy as jnp, functrain
    >>> tx = functrain.scale_by_rprop(0.1)
    >>> state = tx.init([jnp.zeros(1)])
    >>> u, state = tx.update([jnp.array([2.])], state)
    >>> tx.update([jnp.array([2.])], state)[0]
    [Array([0.1], dtype=float32)]
    """
    check_range("learning_rate", learning_rate, 0.0, owner="scale_by_rprop")
    check_range("min_step_size", min_step_size, 0.0, owner="scale_by_rprop")

    def leaf(g: Array, s: tuple, p: Any, ctx: Any) -> tuple:
        steps, prev = s.step_sizes, s.prev_updates
        agree = g * prev
        grown = jnp.clip(steps * jnp.where(agree > 0, eta_plus, eta_minus),
                         min_step_size, max_step_size)
        steps = jnp.where(agree == 0, steps, grown)
        flipped = agree < 0
        signed = jnp.where(flipped, jnp.zeros_like(g), steps * jnp.sign(g))
        return (jnp.where(flipped, jnp.zeros_like(prev), prev),
                s._replace(step_sizes=steps, prev_updates=signed))

    return stage_transform(LeafStage(
        name="scale_by_rprop", update_leaf=leaf, state_cls=ScaleByRpropState,
        leaf_fields=("step_sizes", "prev_updates"),
        init_leaf=lambda p: (ft.full_like(p, learning_rate), ft.zeros_like(p)),
        checks=LeafChecks(real_only=True)))
