"""SGD-like named optimizers.

SGD, LARS, noisy/Polyak/optimistic SGD, signSGD, Signum, Lion, Fromage,
Rprop and NovoGrad. Each is a short ``chain`` of building blocks from
:mod:`functrain.transforms`.

Notation in the docstrings: ``g`` is the gradient, ``p`` the parameter, ``t``
the step number counted from 1, ``lr`` the learning rate (its value at the
step count, counted from 0, when it is a schedule).
"""

from __future__ import annotations

from typing import Any, Optional

from functrain.arg_checks import check_momentum, hyperparameters
from functrain.transforms.base import GradientTransformation, MaskOrFn, ScalarOrSchedule
from functrain.transforms.engine import chain, identity
from functrain.transforms.layerwise import scale_by_novograd, scale_by_trust_ratio
from functrain.transforms.momentum import ema, scale_by_optimistic_gradient, trace
from functrain.transforms.noise import add_noise
from functrain.transforms.scaling import (add_decayed_weights, scale, scale_by_learning_rate,
                                          scale_by_polyak, weight_decay_stage)
from functrain.transforms.sign import scale_by_lion, scale_by_rprop, scale_by_sign


@hyperparameters(learning_rate="schedule", momentum="number or None")
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
      learning_rate: the step size: a number or a schedule (a function of the
        step count, counted from 0, returning the step size to use).
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


@hyperparameters(learning_rate="schedule", weight_decay="schedule", trust_coefficient="number",
                 eps="number", momentum="number")
def lars(learning_rate: ScalarOrSchedule, weight_decay: ScalarOrSchedule = 0.0,
         weight_decay_mask: MaskOrFn = True, trust_coefficient: float = 0.001,
         eps: float = 0.0, trust_ratio_mask: MaskOrFn = True, momentum: float = 0.9,
         nesterov: bool = False) -> GradientTransformation:
    """LARS: SGD with momentum and a per-leaf trust ratio (You et al., 2017).

    Update rule, per leaf: ``u = g + weight_decay * p;
    u *= trust_coefficient ||p|| / (||u|| + eps); t = momentum t - lr * u;
    p += t`` (Nesterov: ``p += momentum t - lr * u`` with the new ``t``). The
    ratio is 1 where either norm is 0; the norms are of each array, never of
    the whole tree. As in optax, the momentum acts after the learning rate.

    Reference: You et al., 2017, "Large Batch Training of Convolutional
    Networks".

    Args:
      learning_rate: the step size: a number or a schedule (a function of the
        step count, counted from 0, returning the step size to use).
      weight_decay: the weight-decay coefficient added to the gradient before
        the trust ratio, ``>= 0``; the default 0 disables it.
      weight_decay_mask: where to apply the weight decay: a tree of bools
        shaped like the params (or a prefix of it), or a function of the
        params returning one; the default True decays every leaf.
      trust_coefficient: multiplies the trust ratio (the paper's ``eta``);
        the default 0.001 is optax's.
      eps: added to ``||u||`` in the ratio's denominator; ``>= 0``.
      trust_ratio_mask: where to apply the trust ratio, in the same forms as
        ``weight_decay_mask``; leaves where it is False take the unscaled
        step. The default True applies it to every leaf.
      momentum: the decay of the momentum buffer, in ``[0, 1)``; 0 disables
        momentum (the buffer is still kept).
      nesterov: use Nesterov momentum.

    Returns:
      A ``GradientTransformation``; its state is the tuple of the chained
      transforms' states, as optax's: ``(EmptyState(), EmptyState(),
      EmptyState(), TraceState(trace))`` (``ScaleByScheduleState(count)``
      third for a scheduled learning rate).

    >>> import jax.numpy as jnp, functrain
    >>> opt = functrain.lars(1.0)
    >>> params = {'w': jnp.array([3., 4.])}
    >>> updates, _ = opt.update({'w': jnp.array([0., 2.])}, opt.init(params), params)
    >>> updates
    {'w': Array([ 0.    , -0.005], dtype=float32)}
    """
    check_momentum("lars", momentum)
    return chain(
        add_decayed_weights(weight_decay, mask=weight_decay_mask),
        scale_by_trust_ratio(trust_coefficient=trust_coefficient, eps=eps,
                             mask=trust_ratio_mask),
        scale_by_learning_rate(learning_rate),
        trace(decay=momentum, nesterov=nesterov))


@hyperparameters(learning_rate="schedule", eta="number", gamma="number", seed="number or None")
def noisy_sgd(learning_rate: ScalarOrSchedule, eta: float = 0.01, gamma: float = 0.55,
              key: Any = None, *, seed: Optional[int] = None) -> GradientTransformation:
    """SGD with annealed Gaussian gradient noise (Neelakantan et al., 2015).

    Update rule: ``g += N(0, eta / t**gamma); p -= lr * g``: the noise's
    variance decays with the step number ``t``.

    ``key`` (or the older ``seed``) defaults to 0, as optax's does.

    Reference: Neelakantan et al., 2015, "Adding Gradient Noise Improves
    Learning for Very Deep Networks".

    Args:
      learning_rate: the step size: a number or a schedule (a function of the
        step count, counted from 0, returning the step size to use).
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


@hyperparameters(learning_rate="schedule", alpha="number", beta="number")
def optimistic_gradient_descent(learning_rate: ScalarOrSchedule, alpha: float = 1.0,
                                beta: float = 1.0) -> GradientTransformation:
    """Optimistic gradient descent (Mokhtari et al., 2019), for min-max games.

    Update rule: ``p -= lr * ((alpha + beta) g_t - beta g_{t-1})``, with
    ``g_{-1} = g_0`` at the first step.

    Reference: Mokhtari et al., 2019, "A Unified Analysis of Extra-gradient and
    Optimistic Gradient Methods for Saddle Point Problems: Proximal Point
    Approach".

    Args:
      learning_rate: the step size: a number or a schedule (a function of the
        step count, counted from 0, returning the step size to use).
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


@hyperparameters(learning_rate="schedule")
def sign_sgd(learning_rate: ScalarOrSchedule) -> GradientTransformation:
    """signSGD (Bernstein et al., 2018): step by the sign of the gradient.

    Update rule: ``p -= lr * sign(g)``.

    Reference: Bernstein et al., 2018, "signSGD: Compressed Optimisation for
    Non-Convex Problems".

    Args:
      learning_rate: the step size: a number or a schedule (a function of the
        step count, counted from 0, returning the step size to use).

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


@hyperparameters(learning_rate="schedule", beta="number")
def signum(learning_rate: ScalarOrSchedule, beta: float = 0.9,
           accumulator_dtype: Optional[Any] = None) -> GradientTransformation:
    """Signum (Bernstein et al., 2018): the sign of a (non-debiased) momentum.

    Update rule: ``m = beta m + (1-beta) g; p -= lr * sign(m)``.

    Reference: Bernstein et al., 2018, "signSGD: Compressed Optimisation for
    Non-Convex Problems".

    Args:
      learning_rate: the step size: a number or a schedule (a function of the
        step count, counted from 0, returning the step size to use).
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


@hyperparameters(learning_rate="schedule", b1="number", b2="number", weight_decay="schedule")
def lion(learning_rate: ScalarOrSchedule, b1: float = 0.9, b2: float = 0.99,
         mu_dtype: Optional[Any] = None, weight_decay: ScalarOrSchedule = 1e-3,
         mask: Optional[MaskOrFn] = None) -> GradientTransformation:
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
    return chain(scale_by_lion(b1, b2, mu_dtype), add_decayed_weights(weight_decay, mask),
                 scale_by_learning_rate(learning_rate))


@hyperparameters(learning_rate="schedule", min_norm="number")
def fromage(learning_rate: ScalarOrSchedule, min_norm: float = 1e-6
            ) -> GradientTransformation:
    """Fromage (Bernstein et al., 2020): per-leaf trust ratio with a norm-preserving shrink.

    Update rule, per leaf: ``p <- (p - lr * (||p|| / ||g||) g) / sqrt(1 + lr**2)``.

    Reference: Bernstein et al., 2020, "On the distance between two neural
    networks and the stability of learning".

    Args:
      learning_rate: the relative step size: a number or a schedule (a
        function of the step count, counted from 0, returning it): each step
        moves a leaf by about ``lr`` times its norm.
      min_norm: a floor for both ``||p||`` and ``||g||`` in the ratio,
        ``>= 0``; it bounds the ratio where a norm is tiny (where a norm is
        still 0 the ratio is 1).

    Returns:
      A ``GradientTransformation`` (``update`` needs params); its state is the
      tuple of the chained transforms' states, as optax's: three
      ``EmptyState()`` for a constant learning rate (the second and third
      hold a ``count`` for a schedule).

    >>> import jax.numpy as jnp, functrain
    >>> opt = functrain.fromage(1.0)
    >>> params = [jnp.array([3., 4.])]
    >>> u, _ = opt.update([jnp.array([0., 5.])], opt.init(params), params)
    >>> functrain.apply_updates(params, u)
    [Array([ 2.1213202, -0.7071067], dtype=float32)]
    """
    if callable(learning_rate):
        def shrink(count: Any) -> Any:
            return 1 / (1 + learning_rate(count) ** 2) ** 0.5
        return chain(scale_by_trust_ratio(min_norm),
                     scale_by_learning_rate(lambda c: shrink(c) * learning_rate(c)),
                     weight_decay_stage(lambda c: shrink(c) - 1, signed=True))
    mult = 1 / (1 + learning_rate ** 2) ** 0.5
    return chain(scale_by_trust_ratio(min_norm), scale_by_learning_rate(learning_rate * mult),
                 weight_decay_stage(mult - 1, signed=True))


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


@hyperparameters(learning_rate="schedule", b1="number", b2="number", eps="number",
                 eps_root="number", weight_decay="number")
def novograd(learning_rate: ScalarOrSchedule, b1: float = 0.9, b2: float = 0.25,
             eps: float = 1e-6, eps_root: float = 0.0, weight_decay: float = 0.0
             ) -> GradientTransformation:
    """NovoGrad (Ginsburg et al., 2019): SGD with layer-wise normalised momentum.

    Update rule, per leaf: ``v = b2 v + (1-b2) ||g||**2`` (``v = ||g||**2`` at
    the first step); ``m = b1 m + g / (sqrt(v + eps_root) + eps) +
    weight_decay * p`` (no ``b1 m`` at the first step); ``p -= lr * m``. ``v``
    is one scalar per leaf.

    Reference: Ginsburg et al., 2019, "Stochastic Gradient Methods with
    Layer-wise Adaptive Moments for Training of Deep Networks".

    Args:
      learning_rate: the step size: a number or a schedule (a function of the
        step count, counted from 0, returning the step size to use).
      b1: the decay of the momentum ``m``, in ``[0, 1)``.
      b2: the decay of the per-leaf second moment ``v``, in ``[0, 1)``.
      eps: added to ``sqrt(v)`` in the denominator; ``>= 0``.
      eps_root: added to ``v`` inside the square root; ``>= 0``.
      weight_decay: the weight-decay coefficient added to the normalised
        gradient, before the momentum; the default 0 disables it (then
        ``update`` needs no params).

    Returns:
      A ``GradientTransformation``; its state is the tuple of the chained
      transforms' states, as optax's: ``(ScaleByNovogradState(count, mu, nu),
      EmptyState())`` (``ScaleByScheduleState(count)`` last for a scheduled
      learning rate).

    >>> import jax.numpy as jnp, functrain
    >>> opt = functrain.novograd(0.1, eps=0.0)
    >>> params = [jnp.zeros(2)]
    >>> u, _ = opt.update([jnp.array([3., 4.])], opt.init(params), params)
    >>> print(u[0].round(4))
    [-0.06 -0.08]
    """
    return chain(scale_by_novograd(b1, b2, eps, eps_root, weight_decay),
                 scale_by_learning_rate(learning_rate))
