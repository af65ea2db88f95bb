"""Optimizers that scale each layer's step by a norm: ``lars``, ``fromage``, ``novograd``
and ``lamb`` (Adam's direction, from :mod:`functrain.families.adam.stages`, under a
trust ratio).

Each is a short ``chain`` of building blocks from :mod:`functrain.transforms`.

Notation in the docstrings: ``g`` is the gradient, ``p`` the parameter, ``t``
the step number counted from 1, ``lr`` the learning rate (its value at the
step count, counted from 0, when it is a schedule).
"""

from __future__ import annotations

from typing import Any, Optional

from functrain.arg_checks import check_momentum
from functrain.declarations import declare_optimizer, hyperparameters
from functrain.engine.protocol import GradientTransformation, MaskOrFn, ScalarOrSchedule
from functrain.engine.program import chain, in_masked_state
from functrain.families.adam.stages import scale_by_adam
from functrain.families.layerwise.stages import scale_by_novograd, scale_by_trust_ratio
from functrain.transforms.accumulation import trace
from functrain.transforms.scaling import (add_decayed_weights, scale_by_learning_rate,
                                          weight_decay_stage)
from functrain.docstrings import shared_args


@declare_optimizer("optimizers", "You et al., 2017", optax="core",
    summary="LARS (You et al., 2017): momentum SGD with a per-layer trust ratio.",
    signature="lars(learning_rate, weight_decay=0.0, ..., momentum=0.9)")
@hyperparameters(learning_rate="schedule", weight_decay="schedule", trust_coefficient="number",
                 eps="number", momentum="number")
@shared_args()
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
      <shared: learning_rate>
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
      transforms' states, as optax's: ``(MaskedState(EmptyState()),
      MaskedState(EmptyState()), EmptyState(), TraceState(trace))`` (the
      decay and the trust ratio are masked, by default everywhere;
      ``ScaleByScheduleState(count)`` third for a scheduled learning rate).

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
        in_masked_state(scale_by_trust_ratio(trust_coefficient=trust_coefficient, eps=eps,
                                             mask=trust_ratio_mask), "lars"),
        scale_by_learning_rate(learning_rate),
        trace(decay=momentum, nesterov=nesterov))


@declare_optimizer("optimizers", "Bernstein et al., 2020", optax="core", summary=(
    "Fromage (Bernstein et al., 2020): per-layer trust ratio with a norm-preserving shrink."),
    signature="fromage(learning_rate, min_norm=1e-6)")
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


@declare_optimizer("optimizers", "Ginsburg et al., 2019", optax="core",
    summary="NovoGrad (Ginsburg et al., 2019): layer-wise normalised momentum.",
    signature="novograd(learning_rate, b1=0.9, b2=0.25, eps=1e-6, weight_decay=0.0)")
@hyperparameters(learning_rate="schedule", b1="number", b2="number", eps="number",
                 eps_root="number", weight_decay="number")
@shared_args()
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
      <shared: learning_rate>
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


@declare_optimizer("optimizers", "You et al., 2019", optax="core", summary=(
    "LAMB (You et al., 2019): Adam with a per-layer trust ratio; adds `trust_ratio_mask`, "
    "`max_trust_ratio`."), signature="lamb(learning_rate, ..., weight_decay=0.0, mask=None)")
@hyperparameters(learning_rate="schedule", b1="number", b2="decay", eps="number",
                 eps_root="number", weight_decay="schedule", max_trust_ratio="bound or None")
@shared_args()
def lamb(learning_rate: ScalarOrSchedule, b1: float = 0.9, b2: float = 0.999,
         eps: float = 1e-6, eps_root: float = 0.0, weight_decay: ScalarOrSchedule = 0.0,
         mask: Optional[MaskOrFn] = None, *, trust_ratio_mask: MaskOrFn = True,
         max_trust_ratio: Optional[float] = None, mu_dtype: Optional[Any] = None,
         nu_dtype: Optional[Any] = None,
         cautious_weight_decay: bool = False) -> GradientTransformation:
    """LAMB: Adam with weight decay and a per-leaf trust ratio (You et al., 2019).

    Update rule: ``m, v`` as in :func:`adam`; per leaf,
    ``u = m_hat / (sqrt(v_hat + eps_root) + eps) + weight_decay * p;
    p -= lr * (||p|| / ||u||) * u`` (the ratio is 1 where either norm is 0;
    the norms are of each array, never of the whole tree).

    Beyond optax: ``trust_ratio_mask`` (leaves where it is False, e.g. biases
    and norm scales, skip layer adaptation), ``max_trust_ratio`` (a cap on the
    ratio; None = no cap), ``mu_dtype`` / ``nu_dtype``. Defaults keep optax's
    numbers.

    Reference: You et al., 2020, "Large Batch Optimization for Deep Learning:
    Training BERT in 76 minutes" (arXiv 2019).

    Args:
      <shared: learning_rate, b1, b2>
      eps: added to ``sqrt(v_hat)`` in the denominator; ``>= 0``.
      <shared: eps_root>
      weight_decay: the weight-decay coefficient added to Adam's direction
        before the trust ratio, ``>= 0``; the default 0 disables it. A number,
        or a schedule of the step count.
      mask: where to apply the weight decay: a tree of bools shaped like the
        params (or a prefix of it), or a function of the params returning one;
        ``None`` decays every leaf.
      trust_ratio_mask: where to apply the trust ratio, in the same forms as
        ``mask``; leaves where it is False take the plain (AdamW-like) step
        ``-lr * u``. The default True applies it to every leaf (as optax).
      max_trust_ratio: an upper bound on the trust ratio, ``>= 0``; ``None``
        (the default) means no cap.
      <shared: mu_dtype, nu_dtype, cautious_weight_decay>

    Returns:
      A ``GradientTransformation``; its state is the tuple of the chained
      transforms' states, as optax's: ``(ScaleByAdamState(count, mu, nu),
      EmptyState(), EmptyState(), EmptyState())`` (a ``count`` state in place
      of an ``EmptyState()`` for each argument given as a schedule).

    >>> import jax.numpy as jnp, functrain
    >>> opt = functrain.lamb(0.1)
    >>> params = {'w': jnp.array([3., 4.])}
    >>> updates, _ = opt.update({'w': jnp.array([1., 1.])}, opt.init(params), params)
    >>> print(updates['w'].round(5))
    [-0.35355 -0.35355]
    """
    return chain(
        scale_by_adam(b1, b2, eps, eps_root, mu_dtype, nu_dtype=nu_dtype),
        add_decayed_weights(weight_decay, mask, cautious=cautious_weight_decay),
        scale_by_trust_ratio(max_trust_ratio=max_trust_ratio, mask=trust_ratio_mask),
        scale_by_learning_rate(learning_rate))
