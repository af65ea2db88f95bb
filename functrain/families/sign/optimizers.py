"""Optimizers that step by the sign of a direction: ``sign_sgd``, ``signum``, ``lion``
and ``rprop``.

Each is a short ``chain`` of building blocks from :mod:`functrain.transforms`.

Notation in the docstrings: ``g`` is the gradient, ``p`` the parameter, ``t``
the step number counted from 1, ``lr`` the learning rate (its value at the
step count, counted from 0, when it is a schedule).
"""

from __future__ import annotations

from typing import Any, Optional

from functrain.declarations import declare_optimizer, hyperparameters
from functrain.engine.protocol import GradientTransformation, MaskOrFn, ScalarOrSchedule
from functrain.engine.program import chain
from functrain.transforms.accumulation import ema
from functrain.transforms.scaling import (add_decayed_weights, scale, scale_by_learning_rate)
from functrain.families.sign.stages import scale_by_lion, scale_by_rprop, scale_by_sign
from functrain.docstrings import shared_args


@declare_optimizer("optimizers", "Bernstein et al., 2018", optax="core",
    summary="signSGD (Bernstein et al., 2018): step by the sign of the gradient.")
@hyperparameters(learning_rate="schedule")
@shared_args()
def sign_sgd(learning_rate: ScalarOrSchedule) -> GradientTransformation:
    """signSGD (Bernstein et al., 2018): step by the sign of the gradient.

    Update rule: ``p -= lr * sign(g)``.

    Reference: Bernstein et al., 2018, "signSGD: Compressed Optimisation for
    Non-Convex Problems".

    Args:
      <shared: learning_rate>

    Returns:
      A ``GradientTransformation``; its state is ``(EmptyState(),
      EmptyState())`` (``ScaleByScheduleState(count)`` last for a scheduled
      learning rate).

    >>> import jax.numpy as jnp, functrain
    >>> opt = functrain.sign_sgd(0.1)
    >>> opt.update([jnp.array([-3., 2.])], opt.init([jnp.zeros(2)]))[0]
    [Array([ 0.1, -0.1], dtype=float32)]
    """
    return chain(scale_by_sign(), scale_by_learning_rate(learning_rate))


@declare_optimizer("optimizers", "Bernstein et al., 2018", optax="core",
    summary="Signum: the sign of a momentum.", signature="signum(learning_rate, beta=0.9)")
@hyperparameters(learning_rate="schedule", beta="number")
@shared_args()
def signum(learning_rate: ScalarOrSchedule, beta: float = 0.9,
           accumulator_dtype: Optional[Any] = None) -> GradientTransformation:
    """Signum (Bernstein et al., 2018): the sign of a (non-debiased) momentum.

    Update rule: ``m = beta m + (1-beta) g; p -= lr * sign(m)``.

    Reference: Bernstein et al., 2018, "signSGD: Compressed Optimisation for
    Non-Convex Problems".

    Args:
      <shared: learning_rate>
      beta: the decay of the momentum ``m``, in ``[0, 1]``; 0 gives
        signSGD.
      accumulator_dtype: storage dtype of ``m``; ``None`` stores it in each
        parameter's dtype.

    Returns:
      A ``GradientTransformation``; its state is ``(EmaState(count, ema),
      EmptyState(), EmptyState())`` (``ScaleByScheduleState(count)`` last for
      a scheduled learning rate).

    >>> import jax.numpy as jnp, functrain
    >>> opt = functrain.signum(0.1)
    >>> opt.update([jnp.array([-3., 2.])], opt.init([jnp.zeros(2)]))[0]
    [Array([ 0.1, -0.1], dtype=float32)]
    """
    return chain(ema(beta, debias=False, accumulator_dtype=accumulator_dtype),
                 scale_by_sign(), scale_by_learning_rate(learning_rate))


@declare_optimizer("optimizers", "Chen et al., 2023", optax="core",
    summary="Lion (Chen et al., 2023): sign of an interpolated momentum.",
    signature="lion(learning_rate, b1=0.9, b2=0.99, weight_decay=1e-3)")
@hyperparameters(learning_rate="schedule", b1="number", b2="number", weight_decay="schedule")
@shared_args()
def lion(learning_rate: ScalarOrSchedule, b1: float = 0.9, b2: float = 0.99,
         mu_dtype: Optional[Any] = None, weight_decay: ScalarOrSchedule = 1e-3,
         mask: Optional[MaskOrFn] = None, *,
         cautious_weight_decay: bool = False) -> GradientTransformation:
    """Lion (Chen et al., 2023): sign of an interpolated momentum, decoupled decay.

    Update rule: ``u = sign(b1 m + (1-b1) g); m = b2 m + (1-b2) g;
    p -= lr * (u + weight_decay * p)``.

    Reference: Chen et al., 2023, "Symbolic Discovery of Optimization
    Algorithms".

    Args:
      learning_rate: the step size: a number or a schedule (a function of the
        step count, counted from 0, returning the step size to use). Every
        entry moves by ``lr`` (plus the decay), so it is typically 3-10 times
        smaller than AdamW's.
      b1: the interpolation weight of the momentum in the update direction, in
        ``[0, 1)``.
      b2: the decay of the momentum ``m``, in ``[0, 1)``.
      mu_dtype: storage dtype of ``m``; ``None`` stores it in each
        parameter's dtype.
      weight_decay: the decoupled weight-decay coefficient, ``>= 0`` (0
        disables it); a number, or a schedule of the step count.
      mask: where to apply the weight decay: a tree of bools shaped like the
        params (or a prefix of it), or a function of the params returning one;
        ``None`` decays every leaf.
      <shared: cautious_weight_decay>

    Returns:
      A ``GradientTransformation``; its state is the tuple of the chained
      transforms' states, as optax's: ``(ScaleByLionState(count, mu),
      EmptyState(), EmptyState())`` (a ``count`` state in place of an
      ``EmptyState()`` for each argument given as a schedule).

    >>> import jax.numpy as jnp, functrain
    >>> opt = functrain.lion(0.1, weight_decay=0.0)
    >>> params = [jnp.zeros(2)]
    >>> opt.update([jnp.array([2., -0.1])], opt.init(params), params)[0]
    [Array([-0.1,  0.1], dtype=float32)]
    """
    return chain(scale_by_lion(b1, b2, mu_dtype),
                 add_decayed_weights(weight_decay, mask, cautious=cautious_weight_decay),
                 scale_by_learning_rate(learning_rate))


@declare_optimizer("optimizers", "Riedmiller & Braun, 1993", optax="core",
    summary="Rprop (Riedmiller & Braun, 1993): sign-driven per-entry step sizes.",
    signature="rprop(learning_rate, eta_minus=0.5, eta_plus=1.2, ...)")
@hyperparameters(learning_rate="number", eta_minus="number", eta_plus="number",
                 min_step_size="number", max_step_size="bound")
def rprop(learning_rate: float, eta_minus: float = 0.5, eta_plus: float = 1.2,
          min_step_size: float = 1e-6, max_step_size: float = 50.0
          ) -> GradientTransformation:
    """Rprop (Riedmiller & Braun, 1993), full-batch sign-based descent.

    Update rule, per entry, with step size ``s`` and last signed step ``d``:
    ``s = clip(s * (eta_plus if g d > 0 else eta_minus), min_step_size,
    max_step_size)`` (unchanged where ``g d == 0``); ``p -= d``; then
    ``d = s sign(g)``, or 0 where the sign flipped. As in optax, the step
    applied at step ``t`` is the one computed at step ``t - 1`` (zero at the
    first step, and where the sign just flipped).

    Reference: Riedmiller & Braun, 1993, "A Direct Adaptive Method for Faster
    Backpropagation Learning: The RPROP Algorithm".

    Args:
      learning_rate: the initial step size of every entry (a number, not a
        schedule), ``>= 0``.
      eta_minus: the factor that shrinks a step size where the gradient's
        sign flipped, in ``(0, 1)``.
      eta_plus: the factor that grows a step size where the sign held,
        ``> 1``.
      min_step_size: the smallest step size, ``>= 0``.
      max_step_size: the largest step size.

    Returns:
      A ``GradientTransformation``; its state is the tuple of the chained
      transforms' states, as optax's: ``(ScaleByRpropState(step_sizes,
      prev_updates), EmptyState())``.

    >>> import jax.numpy as jnp, functrain
    >>> opt = functrain.rprop(0.1)
    >>> state = opt.init([jnp.zeros(1)])
    >>> u, state = opt.update([jnp.array([2.])], state)
    >>> opt.update([jnp.array([2.])], state)[0]
    [Array([-0.1], dtype=float32)]
    """
    return chain(scale_by_rprop(learning_rate, eta_minus, eta_plus, min_step_size,
                                max_step_size), scale(-1.0))
