"""More of the Adam family: Adan and optimistic Adam.

Split from :mod:`functrain.optimizers.adam_family` to keep each file short;
both are the Adam family's named optimizers, each a short ``chain`` of
building blocks from :mod:`functrain.transforms` (fused into one pass).

Notation in the docstrings: ``g`` is the gradient, ``p`` the parameter, ``t``
the step number counted from 1, ``lr`` the learning rate (its value at the
step count, counted from 0, when it is a schedule).
"""

from __future__ import annotations

import warnings
from typing import Any, Optional

from functrain.arg_checks import hyperparameters
from functrain.transforms.adam import scale_by_adam, scale_by_adan
from functrain.transforms.base import GradientTransformation, MaskOrFn, ScalarOrSchedule
from functrain.transforms.engine import chain
from functrain.transforms.momentum import scale_by_optimistic_gradient
from functrain.transforms.scaling import add_decayed_weights, scale_by_learning_rate


@hyperparameters(learning_rate="schedule", b1="number", b2="number", b3="number", eps="number",
                 eps_root="number", weight_decay="schedule")
def adan(learning_rate: ScalarOrSchedule, b1: float = 0.98, b2: float = 0.92,
         b3: float = 0.99, eps: float = 1e-8, eps_root: float = 1e-8,
         weight_decay: ScalarOrSchedule = 0.0, mask: Optional[MaskOrFn] = None
         ) -> GradientTransformation:
    """Adan (Xie et al., 2022): adaptive Nesterov momentum estimation.

    Update rule, with ``d = g - g_prev`` (0 at the first step):
    ``m = b1 m + (1-b1) g; v = b2 v + (1-b2) d;
    n = b3 n + (1-b3) |g + (1-b2) d|**2;
    p -= lr * ((m_hat + (1-b2) v_hat) / (sqrt(n_hat + eps_root) + eps)
    + weight_decay * p)``, where ``m_hat = m / (1 - b1**t)`` and likewise
    ``v_hat`` (``b2``) and ``n_hat`` (``b3``). The weight decay is decoupled
    (added after the rescaling, as AdamW), as in optax.

    Reference: Xie et al., 2022, "Adan: Adaptive Nesterov Momentum Algorithm
    for Faster Optimizing Deep Models".

    Args:
      learning_rate: the step size: a number or a schedule (a function of the
        step count, counted from 0). It also multiplies the weight decay.
      b1: decay rate of the moving average of the gradients, in ``[0, 1)``.
      b2: decay rate of the moving average of the gradient differences, in
        ``[0, 1)``.
      b3: decay rate of the moving average of the squared Nesterov term, in
        ``[0, 1)``.
      eps: added to the denominator outside the square root, ``>= 0``.
      eps_root: added to ``n_hat`` inside the square root, ``>= 0`` (default
        1e-8, as optax).
      weight_decay: the decoupled weight-decay coefficient, ``>= 0`` (default 0:
        none); a number or a schedule of the step count.
      mask: where to apply the weight decay: a tree of bools (or a prefix of
        the params' tree), or a function of the params returning one; ``None``
        decays every leaf.

    Returns:
      A ``GradientTransformation``; its state is optax's layout:
      ``(ScaleByAdanState(m, v, n, g, t), EmptyState(), EmptyState())`` (a
      count state in place of an ``EmptyState()`` for each argument given as a
      schedule).

    >>> import jax.numpy as jnp, functrain
    >>> opt = functrain.adan(0.1)
    >>> params = [jnp.zeros(1)]
    >>> u, _ = opt.update([jnp.array([2.])], opt.init(params), params)
    >>> print(round(float(u[0][0]), 4))
    -0.1
    """
    return chain(scale_by_adan(b1, b2, b3, eps, eps_root),
                 add_decayed_weights(weight_decay, mask),
                 scale_by_learning_rate(learning_rate))


@hyperparameters(learning_rate="number", optimism="number or None", b1="number", b2="number",
                 eps="number", eps_root="number")
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
      b1: decay rate of Adam's first moment, in ``[0, 1)``.
      b2: decay rate of Adam's second moment, in ``[0, 1)``.
      eps: added to ``sqrt(v_hat)`` in the denominator, ``>= 0``.
      eps_root: added to ``v_hat`` inside the square root, ``>= 0``.
      mu_dtype: storage dtype of the first moment; ``None``: each parameter's
        dtype.
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


@hyperparameters(learning_rate="schedule", alpha="number", beta="number", b1="number",
                 b2="number", eps="number", eps_root="number")
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
      b1: decay rate of Adam's first moment, in ``[0, 1)``.
      b2: decay rate of Adam's second moment, in ``[0, 1)``.
      eps: added to ``sqrt(v_hat)`` in the denominator, ``>= 0``.
      eps_root: added to ``v_hat`` inside the square root, ``>= 0``.
      mu_dtype: storage dtype of the first moment; ``None``: each parameter's
        dtype.
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
