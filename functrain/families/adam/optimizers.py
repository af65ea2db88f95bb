"""The Adam family of named optimizers.

Adam(W), NAdam(W), AMSGrad, AdaMax(W), RAdam, Yogi, AdaBelief and Adan (LAMB, Adam under a
trust ratio, is in :mod:`functrain.families.layerwise.optimizers`; optimistic Adam in
:mod:`functrain.families.adam.optimistic`).

Each is a short ``chain`` of building blocks from :mod:`functrain.transforms`;
``chain`` fuses the stages, so e.g. ``adamw`` walks the pytree once per step.

Notation in the docstrings: ``g`` is the gradient, ``p`` the parameter, ``t``
the step number counted from 1, ``lr`` the learning rate (its value at the
step count, counted from 0, when it is a schedule), ``m_hat = m / (1 -
b1**t)`` and ``v_hat = v / (1 - b2**t)`` the bias-corrected moments.
"""

from __future__ import annotations

from typing import Any, Optional

from functrain.declarations import declare_optimizer, hyperparameters
from functrain.families.adam.stages import (scale_by_adam, scale_by_adamax, scale_by_adan,
                                            scale_by_amsgrad, scale_by_belief, scale_by_radam,
                                            scale_by_yogi)
from functrain.engine.protocol import GradientTransformation, MaskOrFn, ScalarOrSchedule
from functrain.engine.program import chain
from functrain.transforms.scaling import (add_decayed_weights, scale_by_learning_rate,
                                          weight_decay_stage)
from functrain.docstrings import shared_args


@declare_optimizer("optimizers", "Kingma & Ba, 2014", optax="core", summary=(
    "Adam (Kingma & Ba, 2014); `nesterov=True` is NAdam; `mu_dtype`/`nu_dtype` set moment "
    "storage."), signature="adam(learning_rate, b1=0.9, b2=0.999, eps=1e-8, ...)")
@hyperparameters(learning_rate="schedule", b1="number", b2="decay", eps="number",
                 eps_root="number")
@shared_args()
def adam(learning_rate: ScalarOrSchedule, b1: float = 0.9, b2: float = 0.999,
         eps: float = 1e-8, eps_root: float = 0.0, mu_dtype: Optional[Any] = None, *,
         nesterov: bool = False, nu_dtype: Optional[Any] = None) -> GradientTransformation:
    """Adam (Kingma & Ba, 2014); ``nesterov=True`` gives NAdam.

    Update rule: ``m = b1 m + (1-b1) g; v = b2 v + (1-b2) g**2;
    p -= lr * m_hat / (sqrt(v_hat + eps_root) + eps)``.

    ``nu_dtype`` (beyond optax) sets the storage dtype of the second moment.

    Reference: Kingma & Ba, 2014, "Adam: A Method for Stochastic Optimization".

    Args:
      <shared: learning_rate>
      b1: decay rate of the first moment ``m`` (the moving average of the
        gradients), in ``[0, 1)``; 0 means no momentum.
      b2: decay rate of the second moment ``v`` (the moving average of the
        squared gradients), in ``[0, 1)``.
      eps: added to ``sqrt(v_hat)`` in the denominator for numerical
        stability; ``>= 0``.
      eps_root: added to ``v_hat`` inside the square root, ``>= 0``. The
        default 0 is Adam as published; a small positive value keeps the
        gradient of the update finite when differentiating through it (e.g.
        meta-learning).
      mu_dtype: storage dtype of ``m`` (e.g. ``jnp.bfloat16`` to save memory);
        ``None`` stores it in each parameter's dtype. The arithmetic runs in
        at least float32 either way.
      nesterov: use Nesterov momentum (NAdam): the first moment looks one
        step ahead, ``m_hat = b1 m / (1 - b1**(t+1)) + (1-b1) g / (1 - b1**t)``.
      nu_dtype: storage dtype of ``v``, like ``mu_dtype``; ``None`` stores it
        in each parameter's dtype.

    Returns:
      A ``GradientTransformation``; its state is the tuple of the chained
      transforms' states, as optax's: ``(ScaleByAdamState(count, mu, nu),
      EmptyState())``, with ``ScaleByScheduleState(count)`` in place of
      ``EmptyState()`` when ``learning_rate`` is a schedule.

    >>> import jax.numpy as jnp, functrain
    >>> opt = functrain.adam(1e-2)
    >>> params = {'w': jnp.array([1., -1.])}
    >>> updates, state = opt.update({'w': jnp.array([0.5, -3.])}, opt.init(params))
    >>> updates
    {'w': Array([-0.01,  0.01], dtype=float32)}
    """
    return chain(
        scale_by_adam(b1, b2, eps, eps_root, mu_dtype, nesterov=nesterov, nu_dtype=nu_dtype),
        scale_by_learning_rate(learning_rate))


@declare_optimizer("optimizers", "Loshchilov & Hutter, 2019", optax="core",
    summary="Adam with decoupled weight decay (Loshchilov & Hutter, 2019).",
    signature="adamw(learning_rate, ..., weight_decay=1e-4, mask=None)")
@hyperparameters(learning_rate="schedule", b1="number", b2="decay", eps="number",
                 eps_root="number", weight_decay="schedule")
@shared_args()
def adamw(learning_rate: ScalarOrSchedule, b1: float = 0.9, b2: float = 0.999,
          eps: float = 1e-8, eps_root: float = 0.0, mu_dtype: Optional[Any] = None,
          weight_decay: ScalarOrSchedule = 1e-4, mask: Optional[MaskOrFn] = None, *,
          nesterov: bool = False, nu_dtype: Optional[Any] = None,
          cautious_weight_decay: bool = False) -> GradientTransformation:
    """Adam with decoupled weight decay (Loshchilov & Hutter, 2019).

    Update rule: ``m, v`` as in :func:`adam`;
    ``p -= lr * (m_hat / (sqrt(v_hat + eps_root) + eps) + weight_decay * p)``.
    The decay is added to Adam's direction (not to the gradient), so it is not
    rescaled by ``v``.

    Reference: Loshchilov & Hutter, 2019, "Decoupled Weight Decay
    Regularization".

    Args:
      learning_rate: the step size: a number or a schedule (a function of the
        step count, counted from 0, returning the step size to use). It also
        multiplies the weight decay.
      <shared: b1, b2>
      eps: added to ``sqrt(v_hat)`` in the denominator; ``>= 0``.
      <shared: eps_root, mu_dtype>
      weight_decay: the decoupled weight-decay coefficient, ``>= 0`` (0
        disables it); a number, or a schedule of the step count.
      mask: where to apply the weight decay: a tree of bools shaped like the
        params (or a prefix of it), or a function of the params returning one.
        Leaves where it is False are not decayed (e.g. biases and norm
        scales); ``None`` decays every leaf.
      nesterov: use Nesterov momentum (NAdamW), see :func:`adam`.
      <shared: nu_dtype, cautious_weight_decay>

    Returns:
      A ``GradientTransformation``; its state is the tuple of the chained
      transforms' states, as optax's: ``(ScaleByAdamState(count, mu, nu),
      EmptyState(), EmptyState())`` (a ``count`` state in place of an
      ``EmptyState()`` for each argument given as a schedule).

    >>> import jax.numpy as jnp, functrain
    >>> opt = functrain.adamw(0.1, weight_decay=0.5)
    >>> params = {'w': jnp.array([2.])}
    >>> updates, _ = opt.update({'w': jnp.array([1.])}, opt.init(params), params)
    >>> updates
    {'w': Array([-0.2], dtype=float32)}
    """
    return chain(
        scale_by_adam(b1, b2, eps, eps_root, mu_dtype, nesterov=nesterov, nu_dtype=nu_dtype),
        add_decayed_weights(weight_decay, mask, cautious=cautious_weight_decay),
        scale_by_learning_rate(learning_rate))


@declare_optimizer("optimizers", "Dozat, 2016", optax="core",
    summary="NAdam (Dozat, 2016): Adam with Nesterov momentum.",
    signature="nadam(learning_rate, ...)")
@hyperparameters(learning_rate="schedule", b1="number", b2="decay", eps="number",
                 eps_root="number")
@shared_args()
def nadam(learning_rate: ScalarOrSchedule, b1: float = 0.9, b2: float = 0.999,
          eps: float = 1e-8, eps_root: float = 0.0, mu_dtype: Optional[Any] = None, *,
          nesterov: bool = True, nu_dtype: Optional[Any] = None) -> GradientTransformation:
    """NAdam (Dozat, 2016): Adam with Nesterov momentum; ``adam(..., nesterov=True)``.

    Update rule: ``m = b1 m + (1-b1) g; v = b2 v + (1-b2) g**2;
    m_hat = b1 m / (1 - b1**(t+1)) + (1-b1) g / (1 - b1**t);
    p -= lr * m_hat / (sqrt(v_hat + eps_root) + eps)``.

    Reference: Dozat, 2016, "Incorporating Nesterov Momentum into Adam".

    Args:
      <shared: learning_rate, b1, b2>
      eps: added to ``sqrt(v_hat)`` in the denominator; ``>= 0``.
      <shared: eps_root, mu_dtype>
      nesterov: the Nesterov look-ahead; True by default (False gives plain
        Adam).
      <shared: nu_dtype>

    Returns:
      A ``GradientTransformation``, the same as :func:`adam`'s; its state is
      ``(ScaleByAdamState(count, mu, nu), EmptyState())`` (a
      ``ScaleByScheduleState(count)`` last for a scheduled learning rate).

    >>> import jax.numpy as jnp, functrain
    >>> opt = functrain.nadam(0.1)
    >>> opt.update([jnp.array([2.])], opt.init([jnp.zeros(1)]))[0]
    [Array([-0.1], dtype=float32)]
    """
    return adam(learning_rate, b1, b2, eps, eps_root, mu_dtype, nesterov=nesterov,
                nu_dtype=nu_dtype)


@declare_optimizer("optimizers", "Dozat, 2016; Loshchilov & Hutter, 2019", optax="core",
    summary="NAdam with decoupled weight decay.",
    signature="nadamw(learning_rate, ..., weight_decay=1e-4, mask=None)")
@hyperparameters(learning_rate="schedule", b1="number", b2="decay", eps="number",
                 eps_root="number", weight_decay="schedule")
@shared_args()
def nadamw(learning_rate: ScalarOrSchedule, b1: float = 0.9, b2: float = 0.999,
           eps: float = 1e-8, eps_root: float = 0.0, mu_dtype: Optional[Any] = None,
           weight_decay: ScalarOrSchedule = 1e-4, mask: Optional[MaskOrFn] = None, *,
           nesterov: bool = True, nu_dtype: Optional[Any] = None,
           cautious_weight_decay: bool = False) -> GradientTransformation:
    """NAdamW: NAdam with decoupled weight decay; ``adamw(..., nesterov=True)``.

    Update rule: ``m_hat`` as in :func:`nadam`;
    ``p -= lr * (m_hat / (sqrt(v_hat + eps_root) + eps) + weight_decay * p)``.

    Reference: Dozat, 2016, "Incorporating Nesterov Momentum into Adam";
    Loshchilov & Hutter, 2019, "Decoupled Weight Decay Regularization".

    Args:
      <shared: learning_rate, b1, b2>
      eps: added to ``sqrt(v_hat)`` in the denominator; ``>= 0``.
      <shared: eps_root, mu_dtype>
      weight_decay: the decoupled weight-decay coefficient, ``>= 0``; a
        number, or a schedule of the step count.
      mask: where to apply the weight decay: a tree (or prefix) of bools, or
        a function of the params returning one; ``None`` decays every leaf.
      nesterov: the Nesterov look-ahead; True by default (False gives AdamW).
      <shared: nu_dtype, cautious_weight_decay>

    Returns:
      A ``GradientTransformation``, the same as :func:`adamw`'s; its state is
      ``(ScaleByAdamState(count, mu, nu), EmptyState(), EmptyState())``, as
      optax's.

    >>> import jax.numpy as jnp, functrain
    >>> opt = functrain.nadamw(0.1, weight_decay=0.5)
    >>> params = [jnp.array([2.])]
    >>> opt.update([jnp.array([2.])], opt.init(params), params)[0]
    [Array([-0.2], dtype=float32)]
    """
    return adamw(learning_rate, b1, b2, eps, eps_root, mu_dtype, weight_decay, mask,
                 nesterov=nesterov, nu_dtype=nu_dtype,
                 cautious_weight_decay=cautious_weight_decay)


@declare_optimizer("optimizers", "Reddi et al., 2018", optax="core",
    summary="AMSGrad (Reddi et al., 2018): Adam with a non-decreasing second moment.",
    signature="amsgrad(learning_rate, b1=0.9, b2=0.999, eps=1e-8, ...)")
@hyperparameters(learning_rate="schedule", b1="number", b2="decay", eps="number",
                 eps_root="number")
@shared_args()
def amsgrad(learning_rate: ScalarOrSchedule, b1: float = 0.9, b2: float = 0.999,
            eps: float = 1e-8, eps_root: float = 0.0, mu_dtype: Optional[Any] = None,
            bias_correction_mu: bool = True, bias_correction_nu: bool = True
            ) -> GradientTransformation:
    """AMSGrad (Reddi et al., 2018).

    Update rule: ``m, v`` as in :func:`adam`; ``v_max = max(v_max, v_hat);
    p -= lr * m_hat / (sqrt(v_max + eps_root) + eps)``: Adam with a
    non-decreasing second moment.

    Reference: Reddi et al., 2018, "On the Convergence of Adam and Beyond".

    Args:
      <shared: learning_rate, b1, b2>
      eps: added to ``sqrt(v_max)`` in the denominator; ``>= 0``.
      eps_root: added to ``v_max`` inside the square root; ``>= 0`` (see
        :func:`adam`).
      <shared: mu_dtype>
      bias_correction_mu: divide ``m`` by ``1 - b1**t`` (True, the default);
        False uses the raw ``m``.
      bias_correction_nu: divide ``v`` by ``1 - b2**t`` before taking the
        running maximum (True, the default); False uses the raw ``v``.

    Returns:
      A ``GradientTransformation``; its state is the tuple of the chained
      transforms' states, as optax's: ``(ScaleByAmsgradState(count, mu, nu,
      nu_max), EmptyState())`` (``ScaleByScheduleState(count)`` last for a
      scheduled learning rate).

    >>> import jax.numpy as jnp, functrain
    >>> opt = functrain.amsgrad(0.1)
    >>> opt.update([jnp.array([-4.])], opt.init([jnp.zeros(1)]))[0]
    [Array([0.1], dtype=float32)]
    """
    return chain(scale_by_amsgrad(b1, b2, eps, eps_root, mu_dtype, bias_correction_mu,
                                  bias_correction_nu),
                 scale_by_learning_rate(learning_rate))


@declare_optimizer("optimizers", "Kingma & Ba, 2014", optax="core",
    summary="AdaMax: Adam with an infinity-norm second moment.",
    signature="adamax(learning_rate, b1=0.9, b2=0.999, eps=1e-8)")
@hyperparameters(learning_rate="schedule", b1="number", b2="number", eps="number")
@shared_args()
def adamax(learning_rate: ScalarOrSchedule, b1: float = 0.9, b2: float = 0.999,
           eps: float = 1e-8) -> GradientTransformation:
    """AdaMax: Adam with the infinity norm in place of the second moment.

    Update rule: ``m = b1 m + (1-b1) g; u = max(|g| + eps, b2 u);
    p -= lr * m_hat / u`` (only ``m`` is bias-corrected).

    Reference: Kingma & Ba, 2014, "Adam: A Method for Stochastic
    Optimization" (section 7.1).

    Args:
      <shared: learning_rate, b1>
      b2: decay rate of the infinity-norm moment ``u``, in ``[0, 1)``.
      eps: added to ``|g|`` before the maximum, so ``u >= eps`` and the
        division is safe; ``>= 0``.

    Returns:
      A ``GradientTransformation``; its state is the tuple of the chained
      transforms' states, as optax's: ``(ScaleByAdamState(count, mu, nu),
      EmptyState())``, where ``nu`` holds ``u`` (``ScaleByScheduleState(count)``
      last for a scheduled learning rate).

    >>> import jax.numpy as jnp, functrain
    >>> opt = functrain.adamax(0.1)
    >>> opt.update([jnp.array([-2.])], opt.init([jnp.zeros(1)]))[0]
    [Array([0.1], dtype=float32)]
    """
    return chain(scale_by_adamax(b1, b2, eps), scale_by_learning_rate(learning_rate))


@declare_optimizer("optimizers", "Kingma & Ba, 2014; Loshchilov & Hutter, 2019", optax="core",
    summary="AdaMax with decoupled weight decay.",
    signature="adamaxw(learning_rate, ..., weight_decay=1e-4, mask=None)")
@hyperparameters(learning_rate="schedule", b1="number", b2="number", eps="number",
                 weight_decay="schedule")
@shared_args()
def adamaxw(learning_rate: ScalarOrSchedule, b1: float = 0.9, b2: float = 0.999,
            eps: float = 1e-8, weight_decay: ScalarOrSchedule = 1e-4,
            mask: Optional[MaskOrFn] = None, *,
            cautious_weight_decay: bool = False) -> GradientTransformation:
    """AdaMax with decoupled weight decay (which may be a schedule).

    Update rule: ``m, u`` as in :func:`adamax`;
    ``p -= lr * (m_hat / u + weight_decay * p)``.

    Reference: Kingma & Ba, 2014, "Adam: A Method for Stochastic Optimization"
    (section 7.1); Loshchilov & Hutter, 2019, "Decoupled Weight Decay
    Regularization".

    Args:
      <shared: learning_rate, b1>
      b2: decay rate of the infinity-norm moment, in ``[0, 1)``.
      eps: added to ``|g|`` before the maximum; ``>= 0``.
      weight_decay: the decoupled weight-decay coefficient, ``>= 0``; a number
        or a schedule of the step count. A Python ``0`` adds no decay stage
        at all (then ``update`` needs no params).
      mask: where to apply the weight decay: a tree (or prefix) of bools, or
        a function of the params returning one; ``None`` decays every leaf.
      <shared: cautious_weight_decay>

    Returns:
      A ``GradientTransformation``; its state is the tuple of the chained
      transforms' states, as optax's: ``(ScaleByAdamState(count, mu, nu),
      EmptyState(), EmptyState())`` (a ``count`` state in place of an
      ``EmptyState()`` for each argument given as a schedule).

    >>> import jax.numpy as jnp, functrain
    >>> opt = functrain.adamaxw(0.1, weight_decay=0.5)
    >>> params = [jnp.array([2.])]
    >>> opt.update([jnp.array([-2.])], opt.init(params), params)[0]
    [Array([0.], dtype=float32)]
    """
    return chain(scale_by_adamax(b1, b2, eps),
                 weight_decay_stage(weight_decay, mask, cautious=cautious_weight_decay),
                 scale_by_learning_rate(learning_rate))


@declare_optimizer("optimizers", "Liu et al., 2020", optax="core",
    summary="RAdam (Liu et al., 2020): Adam with a rectified adaptive rate.",
    signature="radam(learning_rate, b1=0.9, b2=0.999, eps=1e-8, threshold=5.0)")
@hyperparameters(learning_rate="schedule", b1="number", b2="number", eps="number",
                 eps_root="number", threshold="bound")
@shared_args()
def radam(learning_rate: ScalarOrSchedule, b1: float = 0.9, b2: float = 0.999,
          eps: float = 1e-8, eps_root: float = 0.0, threshold: float = 5.0, *,
          nesterov: bool = False) -> GradientTransformation:
    """RAdam (Liu et al., 2020): Adam with a rectified warm-up of the adaptive rate.

    Update rule: ``m, v`` as in :func:`adam`; with ``rho_inf = 2/(1-b2) - 1``
    and ``rho_t = rho_inf - 2 t b2**t / (1 - b2**t)``: if ``rho_t >= threshold``,
    ``p -= lr * r_t m_hat / (sqrt(v_hat + eps_root) + eps)`` with
    ``r_t = sqrt((rho_t-4)(rho_t-2) rho_inf / ((rho_inf-4)(rho_inf-2) rho_t))``,
    else ``p -= lr * m_hat`` (SGD with momentum while ``v`` is unreliable).

    Reference: Liu et al., 2020, "On the Variance of the Adaptive Learning
    Rate and Beyond".

    Args:
      <shared: learning_rate, b1, b2>
      eps: added to ``sqrt(v_hat)`` in the denominator; ``>= 0``.
      <shared: eps_root>
      threshold: the length ``rho_t`` of the approximated simple moving
        average from which on the adaptive (rectified) update is used; the
        default 5 is optax's (the paper uses 4).
      nesterov: use Nesterov momentum for ``m_hat``, as in :func:`adam`.

    Returns:
      A ``GradientTransformation``; its state is the tuple of the chained
      transforms' states, as optax's: ``(ScaleByAdamState(count, mu, nu),
      EmptyState())`` (``ScaleByScheduleState(count)`` last for a scheduled
      learning rate).

    >>> import jax.numpy as jnp, functrain
    >>> opt = functrain.radam(0.1)
    >>> opt.update([jnp.array([3.])], opt.init([jnp.zeros(1)]))[0]
    [Array([-0.3], dtype=float32)]
    """
    return chain(scale_by_radam(b1, b2, eps, eps_root, threshold, nesterov=nesterov),
                 scale_by_learning_rate(learning_rate))


@declare_optimizer("optimizers", "Zaheer et al., 2018", optax="core",
    summary="Yogi (Zaheer et al., 2018): additive, sign-controlled second moment.",
    signature="yogi(learning_rate, b1=0.9, b2=0.999, eps=1e-3)")
@hyperparameters(learning_rate="schedule", b1="number", b2="number", eps="number")
@shared_args()
def yogi(learning_rate: ScalarOrSchedule, b1: float = 0.9, b2: float = 0.999,
         eps: float = 1e-3) -> GradientTransformation:
    """Yogi (Zaheer et al., 2018).

    Update rule: ``m = b1 m + (1-b1) g; v = v - (1-b2) sign(v - g**2) g**2;
    p -= lr * m_hat / (sqrt(v_hat) + eps)``: an additive, sign-controlled
    second moment. ``m`` and ``v`` start at ``1e-6``, as in optax.

    Reference: Zaheer et al., 2018, "Adaptive Methods for Nonconvex
    Optimization".

    Args:
      <shared: learning_rate, b1>
      b2: rate of the second moment's additive update, in ``[0, 1)``.
      eps: added to ``sqrt(v_hat)`` in the denominator, ``>= 0``; larger than
        Adam's by default (1e-3, as optax), which bounds the step where ``v``
        is tiny.

    Returns:
      A ``GradientTransformation``; its state is the tuple of the chained
      transforms' states, as optax's: ``(ScaleByAdamState(count, mu, nu),
      EmptyState())`` (``ScaleByScheduleState(count)`` last for a scheduled
      learning rate).

    >>> import jax.numpy as jnp, functrain
    >>> opt = functrain.yogi(0.1)
    >>> u, _ = opt.update([jnp.array([2.])], opt.init([jnp.zeros(1)]))
    >>> print(round(float(u[0][0]), 4))
    -0.0999
    """
    return chain(scale_by_yogi(b1, b2, eps), scale_by_learning_rate(learning_rate))


@declare_optimizer("optimizers", "Zhuang et al., 2020", optax="core",
    summary="AdaBelief (Zhuang et al., 2020): Adam scaled by the belief in the gradient.",
    signature="adabelief(learning_rate, b1=0.9, b2=0.999, eps=1e-16, eps_root=1e-16)")
@hyperparameters(learning_rate="schedule", b1="number", b2="decay", eps="number",
                 eps_root="number")
@shared_args()
def adabelief(learning_rate: ScalarOrSchedule, b1: float = 0.9, b2: float = 0.999,
              eps: float = 1e-16, eps_root: float = 1e-16, *,
              nesterov: bool = False) -> GradientTransformation:
    """AdaBelief (Zhuang et al., 2020): Adam scaled by the belief in the gradient.

    Update rule: ``m = b1 m + (1-b1) g; s = b2 s + (1-b2) (g - m)**2 + eps_root;
    p -= lr * m_hat / (sqrt(s_hat) + eps)``: the second moment is the
    variance of the gradient around its moving average.

    Reference: Zhuang et al., 2020, "AdaBelief Optimizer: Adapting Stepsizes
    by the Belief in Observed Gradients".

    Args:
      <shared: learning_rate, b1>
      b2: decay rate of the belief moment ``s``, in ``[0, 1)``.
      eps: added to ``sqrt(s_hat)`` in the denominator; ``>= 0``.
      eps_root: added to ``s`` at every step (stored in the state, as in the
        paper and optax); ``>= 0``.
      nesterov: use Nesterov momentum for ``m_hat``, as in :func:`adam`.

    Returns:
      A ``GradientTransformation``; its state is the tuple of the chained
      transforms' states, as optax's: ``(ScaleByBeliefState(count, mu, nu),
      EmptyState())``, where ``nu`` holds ``s`` (``ScaleByScheduleState(count)``
      last for a scheduled learning rate).

    >>> import jax.numpy as jnp, functrain
    >>> opt = functrain.adabelief(0.1)
    >>> u, _ = opt.update([jnp.array([1.])], opt.init([jnp.zeros(1)]))
    >>> print(round(float(u[0][0]), 5))
    -0.11111
    """
    return chain(scale_by_belief(b1, b2, eps, eps_root, nesterov=nesterov),
                 scale_by_learning_rate(learning_rate))


@declare_optimizer("optimizers", "Xie et al., 2022", optax="core",
    summary="Adan (Xie et al., 2022): adaptive Nesterov momentum from gradient differences.",
    signature=(
    "adan(learning_rate, b1=0.98, b2=0.92, b3=0.99, eps=1e-8, eps_root=1e-8, weight_decay=0.0, "
    "mask=None)"))
@hyperparameters(learning_rate="schedule", b1="number", b2="number", b3="number", eps="number",
                 eps_root="number", weight_decay="schedule")
@shared_args()
def adan(learning_rate: ScalarOrSchedule, b1: float = 0.98, b2: float = 0.92,
         b3: float = 0.99, eps: float = 1e-8, eps_root: float = 1e-8,
         weight_decay: ScalarOrSchedule = 0.0, mask: Optional[MaskOrFn] = None, *,
         cautious_weight_decay: bool = False) -> GradientTransformation:
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
      <shared: cautious_weight_decay>

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
                 add_decayed_weights(weight_decay, mask, cautious=cautious_weight_decay),
                 scale_by_learning_rate(learning_rate))
