"""Optimistic Adam (Daskalakis et al., 2017): optimistic gradient descent on Adam's
direction, in optax's two interfaces (``optimistic_adam``, deprecated, and
``optimistic_adam_v2``, which takes schedules): Adam's stage (:mod:`.stages`) chained with
the momentum family's optimistic-gradient stage.

Notation in the docstrings: ``g`` is the gradient, ``p`` the parameter, ``t``
the step number counted from 1, ``lr`` the learning rate (its value at the
step count, counted from 0, when it is a schedule).
"""

from __future__ import annotations

import warnings
from typing import Any, Optional

from functrain.declarations import declare_optimizer, hyperparameters
from functrain.engine.protocol import GradientTransformation, ScalarOrSchedule
from functrain.engine.program import chain
from functrain.families.adam.stages import scale_by_adam
from functrain.families.momentum.stages import scale_by_optimistic_gradient
from functrain.transforms.scaling import scale_by_learning_rate
from functrain.docstrings import shared_args


@declare_optimizer("optimizers", "Daskalakis et al., 2017", optax="core",
    summary="optax's older, deprecated interface of optimistic Adam (no schedules; warns).",
    signature="optimistic_adam(learning_rate, optimism=None, ...)")
@hyperparameters(learning_rate="number", optimism="number or None", b1="number", b2="number",
                 eps="number", eps_root="number")
@shared_args()
def optimistic_adam(learning_rate: float, optimism: Optional[float] = None, b1: float = 0.9,
                    b2: float = 0.999, eps: float = 1e-8, eps_root: float = 0.0,
                    mu_dtype: Optional[Any] = None, *, nesterov: bool = True
                    ) -> GradientTransformation:
    """Optimistic Adam (Daskalakis et al., 2017); deprecated (as in optax) for the v2.

    Update rule: ``r_t`` is Adam's direction ``m_hat / (sqrt(v_hat + eps_root)
    + eps)`` (NAdam's with ``nesterov``, the default), and
    ``p -= lr * r_t + optimism * (r_t - r_{t-1})`` with ``r_0 = r_1`` (no
    optimism at the first step). This interface takes no schedule: use
    :func:`optimistic_adam_v2` for one. Building it emits a
    ``DeprecationWarning``, as optax's does.

    Reference: Daskalakis et al., 2017, "Training GANs with Optimism".

    Args:
      learning_rate: the step size, a number (not a schedule).
      optimism: the weight ``o`` of the correction ``r_t - r_{t-1}``; ``None``
        (the default) uses ``learning_rate``, as in the paper.
      <shared: b1, b2>
      eps: added to ``sqrt(v_hat)`` in the denominator, ``>= 0``.
      <shared: eps_root, mu_dtype>
      nesterov: use Nesterov momentum (NAdam's first moment); default ``True``.

    Returns:
      A ``GradientTransformation``; its state is optax's layout:
      ``(ScaleByAdamState, ScaleByOptimisticGradientState, EmptyState())``.

    >>> import warnings, jax.numpy as jnp, functrain
    >>> with warnings.catch_warnings():
    ...     warnings.simplefilter('ignore', DeprecationWarning)
    ...     opt = functrain.optimistic_adam(0.1, optimism=1.0, nesterov=False)
    >>> u, _ = opt.update([jnp.array([3.])], opt.init([jnp.zeros(1)]))
    >>> print(round(float(u[0][0]), 4))
    -0.1
    """
    warnings.warn("optimistic_adam is deprecated (as in optax): use `optimistic_adam_v2` "
                  "instead, which also takes a learning-rate schedule.", DeprecationWarning,
                  stacklevel=3)
    return chain(
        scale_by_adam(b1, b2, eps, eps_root, mu_dtype, nesterov=nesterov),
        scale_by_optimistic_gradient(
            alpha=learning_rate, beta=learning_rate if optimism is None else optimism),
        scale_by_learning_rate(1.0))


@declare_optimizer("optimizers", "Daskalakis et al., 2017", optax="core", summary=(
    "Optimistic Adam (Daskalakis et al., 2017): optimistic gradient descent on Adam's (NAdam's) "
    "direction; takes schedules."),
    signature="optimistic_adam_v2(learning_rate, *, alpha=1.0, beta=1.0, b1=0.9, b2=0.999, ...)")
@hyperparameters(learning_rate="schedule", alpha="number", beta="number", b1="number",
                 b2="number", eps="number", eps_root="number")
@shared_args()
def optimistic_adam_v2(learning_rate: ScalarOrSchedule, *, alpha: float = 1.0,
                       beta: float = 1.0, b1: float = 0.9, b2: float = 0.999,
                       eps: float = 1e-8, eps_root: float = 0.0,
                       mu_dtype: Optional[Any] = None, nesterov: bool = True
                       ) -> GradientTransformation:
    """Optimistic Adam (Daskalakis et al., 2017), optax's v2 interface: takes schedules.

    Update rule: ``r_t`` is Adam's direction ``m_hat / (sqrt(v_hat + eps_root)
    + eps)`` (NAdam's with ``nesterov``, the default), and
    ``p -= lr * ((alpha + beta) r_t - beta r_{t-1})`` with ``r_0 = r_1`` (so the
    first step is ``lr * alpha * r_1``). ``learning_rate`` may be a schedule.

    Reference: Daskalakis et al., 2017, "Training GANs with Optimism".

    Args:
      learning_rate: the step size: a number or a schedule (a function of the
        step count, counted from 0).
      alpha: the weight of the current direction in optimistic gradient
        descent (keyword only).
      beta: the weight of the correction ``r_t - r_{t-1}`` (keyword only).
      <shared: b1, b2>
      eps: added to ``sqrt(v_hat)`` in the denominator, ``>= 0``.
      <shared: eps_root, mu_dtype>
      nesterov: use Nesterov momentum (NAdam's first moment); default ``True``.

    Returns:
      A ``GradientTransformation``; its state is optax's layout:
      ``(ScaleByAdamState, ScaleByOptimisticGradientState, EmptyState())``
      (``ScaleByScheduleState`` last for a schedule).

    >>> import jax.numpy as jnp, functrain
    >>> opt = functrain.optimistic_adam_v2(lambda count: 0.1 / (1 + count), alpha=0.5,
    ...                                    nesterov=False)
    >>> u, _ = opt.update([jnp.array([3.])], opt.init([jnp.zeros(1)]))
    >>> print(round(float(u[0][0]), 4))
    -0.05
    """
    return chain(
        scale_by_adam(b1, b2, eps, eps_root, mu_dtype, nesterov=nesterov),
        scale_by_optimistic_gradient(alpha=alpha, beta=beta),
        scale_by_learning_rate(learning_rate))
