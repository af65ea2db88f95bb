"""The momentum family's named optimizers: stochastic gradient descent (``sgd`` with
momentum, ``noisy_sgd``, ``polyak_sgd``) and optimistic gradient descent for games and
min-max problems (``optimistic_gradient_descent``; optimistic Adam is in
:mod:`functrain.families.adam.optimistic`).

Each is a short ``chain`` of building blocks from :mod:`functrain.transforms`.

Notation in the docstrings: ``g`` is the gradient, ``p`` the parameter, ``t``
the step number counted from 1, ``lr`` the learning rate (its value at the
step count, counted from 0, when it is a schedule).
"""

from __future__ import annotations

from typing import Any, Optional

from functrain.arg_checks import check_momentum
from functrain.declarations import declare_optimizer, hyperparameters
from functrain.engine.protocol import GradientTransformation, ScalarOrSchedule
from functrain.engine.program import chain, identity
from functrain.families.momentum.stages import scale_by_optimistic_gradient
from functrain.transforms.accumulation import trace
from functrain.transforms.noise import add_noise
from functrain.transforms.scaling import (scale_by_learning_rate, scale_by_polyak)
from functrain.docstrings import shared_args


@declare_optimizer("optimizers", "Polyak, 1964; Sutskever et al., 2013", optax="core",
    summary="Stochastic gradient descent, optionally with (Nesterov) momentum.",
    signature="sgd(learning_rate, momentum=None, nesterov=False)")
@hyperparameters(learning_rate="schedule", momentum="number or None")
@shared_args()
def sgd(learning_rate: ScalarOrSchedule, momentum: Optional[float] = None,
        nesterov: bool = False, accumulator_dtype: Optional[Any] = None
        ) -> GradientTransformation:
    """Stochastic gradient descent, with optional (Nesterov) momentum.

    Update rule: ``p -= lr * g``; with momentum, ``t = g + momentum t;
    p -= lr * t`` (Nesterov: ``p -= lr * (g + momentum t)`` with the new ``t``).

    Reference: Polyak, 1964, "Some methods of speeding up the convergence of
    iteration methods"; Sutskever et al., 2013, "On the importance of
    initialization and momentum in deep learning" (Nesterov momentum).

    Args:
      <shared: learning_rate>
      momentum: the decay of the momentum buffer ``t``, in ``[0, 1)``;
        ``None`` (the default) is plain SGD and keeps no state.
      nesterov: use Nesterov momentum (ignored when ``momentum`` is ``None``).
      accumulator_dtype: storage dtype of the momentum buffer; ``None``
        stores it in each parameter's dtype.

    Returns:
      A ``GradientTransformation``; its state is the tuple of the chained
      transforms' states, as optax's: ``(TraceState(trace), EmptyState())``
      with momentum, ``(EmptyState(), EmptyState())`` without
      (``ScaleByScheduleState(count)`` last for a scheduled learning rate).

    >>> import jax, jax.numpy as jnp, functrain
    >>> opt = functrain.sgd(0.1, momentum=0.9)
    >>> params = {'w': jnp.array([1., 2.])}
    >>> state = opt.init(params)
    >>> grads = jax.grad(lambda p: jnp.sum(p['w'] ** 2))(params)
    >>> updates, state = opt.update(grads, state)
    >>> functrain.apply_updates(params, updates)
    {'w': Array([0.8, 1.6], dtype=float32)}
    """
    check_momentum("sgd", momentum)
    return chain(
        trace(momentum, nesterov, accumulator_dtype) if momentum is not None else identity(),
        scale_by_learning_rate(learning_rate))


@declare_optimizer("optimizers", "Neelakantan et al., 2015", optax="core",
    summary="SGD with annealed Gaussian gradient noise (Neelakantan et al., 2015).",
    signature="noisy_sgd(learning_rate, eta=0.01, gamma=0.55, key=None)")
@hyperparameters(learning_rate="schedule", eta="number", gamma="number", seed="int or None")
@shared_args()
def noisy_sgd(learning_rate: ScalarOrSchedule, eta: float = 0.01, gamma: float = 0.55,
              key: Any = None, *, seed: Optional[int] = None) -> GradientTransformation:
    """SGD with annealed Gaussian gradient noise (Neelakantan et al., 2015).

    Update rule: ``g += N(0, eta / t**gamma); p -= lr * g``: the noise's
    variance decays with the step number ``t``.

    ``key`` (or the older ``seed``) defaults to 0, as optax's does.

    Reference: Neelakantan et al., 2015, "Adding Gradient Noise Improves
    Learning for Very Deep Networks".

    Args:
      <shared: learning_rate>
      eta: the noise variance at the first step, ``>= 0`` (0: no noise).
      gamma: the exponent of the variance's decay ``eta / t**gamma``; the
        default 0.55 is the paper's.
      key: the random key the noise is drawn from: a ``jax.random.key`` or an
        int seed. ``None`` (the default) means seed 0; the noise equals
        optax's for the same key.
      seed: the older name of ``key`` (an int); give ``key`` or ``seed``, not
        both (``ValueError``).

    Returns:
      A ``GradientTransformation``; its state is the tuple of the chained
      transforms' states, as optax's: ``(AddNoiseState(count, rng_key),
      EmptyState())`` (``ScaleByScheduleState(count)`` last for a scheduled
      learning rate).

    >>> import jax.numpy as jnp, functrain
    >>> opt = functrain.noisy_sgd(0.1, eta=0.0, key=0)
    >>> opt.update([jnp.array([2.])], opt.init([jnp.zeros(1)]))[0]
    [Array([-0.2], dtype=float32)]
    """
    if seed is not None and key is not None:
        raise ValueError("noisy_sgd: give key or seed, not both.")
    key = seed if key is None else key
    return chain(add_noise(eta, gamma, 0 if key is None else key),
                 scale_by_learning_rate(learning_rate))


@declare_optimizer("optimizers", "Loizou et al., 2021", optax="core",
    summary="SGD with the Polyak step size; pass `value=loss` to `update`.",
    signature="polyak_sgd(max_learning_rate=1.0, scaling=1.0, f_min=0.0, ...)")
@hyperparameters(max_learning_rate="bound", scaling="schedule", f_min="bound", eps="number")
def polyak_sgd(max_learning_rate: float = 1.0, scaling: ScalarOrSchedule = 1.0,
               f_min: float = 0.0, eps: float = 0.0, variant: str = "sps"
               ) -> GradientTransformation:
    """SGD with the Polyak step size (Loizou et al., 2021); pass ``value=loss`` to update.

    Update rule: ``u = scaling * g;
    p -= min((f - f_min) / (||u||**2 + eps), max_learning_rate) * u``, with
    ``f`` the loss at ``p`` (``update(..., value=f)``) and ``||u||`` the norm
    of the whole update tree. The step is 0 where ``||u||**2 + eps`` is at
    most float64's machine epsilon.

    Reference: Loizou et al., 2021, "Stochastic Polyak Step-size for SGD: An
    Adaptive Learning Rate for Fast Convergence".

    Args:
      max_learning_rate: an upper bound on the Polyak step size.
      scaling: multiplies the gradient before the step size is computed (a
        number or a schedule of the step count); the default 1 leaves it
        unchanged.
      f_min: a lower bound on the loss (its optimal value; 0 for models that
        can fit the data exactly).
      eps: added to ``||u||**2`` in the denominator; ``>= 0``.
      variant: ``'sps'`` (the default) or ``'sps+'``, which uses
        ``max(f - f_min, 0)``; anything else is a ``ValueError``.

    Returns:
      A ``GradientTransformation`` whose ``update`` needs ``value=loss`` (a
      ``ValueError`` without it); its state is the tuple of the chained
      transforms' states, as optax's: ``((EmptyState(), EmptyState()),
      EmptyState())``, the first entry being the inner ``sgd``'s state.

    >>> import jax, jax.numpy as jnp, functrain
    >>> f = lambda x: jnp.sum(x ** 2)
    >>> opt = functrain.polyak_sgd()
    >>> params = jnp.array([1., 2., 3.])
    >>> value, grad = jax.value_and_grad(f)(params)
    >>> u, _ = opt.update(grad, opt.init(params), params, value=value)
    >>> f(functrain.apply_updates(params, u))
    Array(3.5, dtype=float32)
    """
    return chain(sgd(learning_rate=scaling),
                 scale_by_polyak(f_min, max_learning_rate, eps, variant))


@declare_optimizer("optimizers", "Mokhtari et al., 2019", optax="core",
    summary="Optimistic gradient descent (Mokhtari et al., 2019), for min-max games.")
@hyperparameters(learning_rate="schedule", alpha="number", beta="number")
@shared_args()
def optimistic_gradient_descent(learning_rate: ScalarOrSchedule, alpha: float = 1.0,
                                beta: float = 1.0) -> GradientTransformation:
    """Optimistic gradient descent (Mokhtari et al., 2019), for min-max games.

    Update rule: ``p -= lr * ((alpha + beta) g_t - beta g_{t-1})``, with
    ``g_{-1} = g_0`` at the first step.

    Reference: Mokhtari et al., 2019, "A Unified Analysis of Extra-gradient and
    Optimistic Gradient Methods for Saddle Point Problems: Proximal Point
    Approach".

    Args:
      <shared: learning_rate>
      alpha: the weight of the current gradient beyond ``beta`` (the
        coefficient of generalized OGD); the default 1.
      beta: the weight of the negative momentum, the change of the gradient
        ``g_t - g_{t-1}``; 0 gives plain gradient descent with step
        ``alpha * lr``.

    Returns:
      A ``GradientTransformation``; its state is the tuple of the chained
      transforms' states, as optax's:
      ``(ScaleByOptimisticGradientState(is_initial_step, previous_gradient),
      EmptyState())`` (``ScaleByScheduleState(count)`` last for a scheduled
      learning rate).

    >>> import jax.numpy as jnp, functrain
    >>> opt = functrain.optimistic_gradient_descent(0.1)
    >>> opt.update([jnp.array([1.])], opt.init([jnp.zeros(1)]))[0]
    [Array([-0.1], dtype=float32)]
    """
    return chain(scale_by_optimistic_gradient(alpha, beta),
                 scale_by_learning_rate(learning_rate))
