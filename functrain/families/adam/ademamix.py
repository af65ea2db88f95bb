"""AdEMAMix and Simplified AdEMAMix (optax.contrib): Adam with a slow momentum mixed in.

Each ``scale_by_*`` is one :class:`~functrain.engine.stage.LeafStage` (per-array
math plus a ``prepare`` that advances the counts, evaluates the ``b3``/``alpha``
schedules and computes the bias corrections once per step); the named optimizers
chain it with functrain's weight decay and learning-rate stages (one fused pass).
Names, arguments, defaults, states and numbers are optax.contrib 0.2.8's.

Notation in the docstrings: ``g`` is the gradient, ``p`` the parameter, ``t``
the step number counted from 1, ``lr`` the learning rate, ``ema(x, b)`` the
moving average ``b avg + (1 - b) x``. Second moments take ``|g|**2``
(``numerics.abs_sq``): AdEMAMix gives optax's numbers on complex leaves.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp

from functrain.arg_checks import check_betas, check_nonnegative
from functrain.declarations import declare_optimizer, hyperparameters, state_value_kinds
from functrain import tree as ft
from functrain.numerics import abs_sq, adam_direction, bias_correction_factor, ema_update
from functrain.engine.protocol import GradientTransformation, MaskOrFn, ScalarOrSchedule
from functrain.engine.stage import LeafStage
from functrain.engine.counts import safe_increment, value_at
from functrain.engine.program import chain, stage_transform
from functrain.transforms.scaling import add_decayed_weights, scale_by_learning_rate
from functrain.docstrings import shared_args

Array = jax.Array

__all__ = ["ScaleByAdemamixState", "scale_by_ademamix", "ademamix",
           "ScaleBySimplifiedAdEMAMixState", "scale_by_simplified_ademamix",
           "simplified_ademamix"]


# --------------------------------------------------------------------------
# AdEMAMix
# --------------------------------------------------------------------------

@state_value_kinds(m1="signed", m2="signed", nu="unsigned")
class ScaleByAdemamixState(NamedTuple):
    """State of :func:`scale_by_ademamix` (optax's fields and order).

    Attributes:
      count: the steps taken, for the fast moment and the second moment (int32).
      count_m2: the steps taken, at which the ``b3`` and ``alpha`` schedules are
        evaluated (int32).
      m1: the fast moving average of the gradients.
      m2: the slow moving average of the gradients.
      nu: the moving average of the squared gradients.

    >>> import jax.numpy as jnp, functrain
    >>> functrain.contrib.scale_by_ademamix().init([jnp.ones(2)]).count_m2
    Array(0, dtype=int32)
    """

    count: Array
    count_m2: Array
    m1: Any
    m2: Any
    nu: Any


class _AdemamixContext(NamedTuple):
    b3: Any       # this step's b3 (a schedule's value)
    alpha: Any    # this step's alpha
    m1: Any       # 1 - b1**t
    nu: Any       # 1 - b2**t


@hyperparameters(b1="number", b2="number", b3="schedule", alpha="schedule", eps="number",
                 eps_root="number")
@shared_args()
def scale_by_ademamix(b1: float = 0.9, b2: float = 0.999, b3: ScalarOrSchedule = 0.9999,
                      alpha: ScalarOrSchedule = 6.0, eps: float = 1e-8, eps_root: float = 0.0,
                      mu_dtype: Optional[Any] = None) -> GradientTransformation:
    """Rescale by AdEMAMix's mixture of a fast and a slow EMA (Pagliardini et al., 2024).

    ``m1 = ema(g, b1)``, ``m2 = ema(g, b3)``, ``nu = ema(|g|**2, b2)``; the update
    is ``(m1_hat + alpha m2) / (sqrt(nu_hat + eps_root) + eps)`` with
    ``m1_hat = m1 / (1 - b1**t)`` and ``nu_hat = nu / (1 - b2**t)``; the slow
    EMA ``m2`` is not bias-corrected (it fills slowly on purpose). ``b3`` and
    ``alpha`` may be schedules of ``count_m2`` (the paper warms them up).
    Reference: Pagliardini et al., 2024, "The AdEMAMix Optimizer: Better,
    Faster, Older".

    Args:
      b1: decay rate of the fast EMA, in ``[0, 1)``.
      <shared: b2>
      b3: decay rate of the slow EMA, in ``[0, 1)``; a number or a schedule of
        the step count.
      alpha: the weight of the slow EMA; a number or a schedule.
      eps: added to the denominator outside the square root, ``>= 0``.
      eps_root: added inside the square root, ``>= 0``.
      mu_dtype: storage dtype of ``m1``, ``m2`` and ``nu`` (as optax); ``None``
        keeps each parameter's dtype.

    Returns:
      A ``GradientTransformation`` whose state is :class:`ScaleByAdemamixState`.

    >>> import jax.numpy as jnp, functrain
    >>> tx = functrain.contrib.scale_by_ademamix(alpha=0.0, eps=0.0)
    >>> tx.update([jnp.array([-2.])], tx.init([jnp.zeros(1)]))[0]
    [Array([-1.], dtype=float32)]
    """
    check_betas("scale_by_ademamix", b1=b1, b2=b2, b3=b3)
    check_nonnegative("scale_by_ademamix", eps=eps, eps_root=eps_root)

    def prepare(glob: dict, _: Any) -> tuple:
        count = safe_increment(glob["count"])
        ctx = _AdemamixContext(value_at(b3, glob["count_m2"]),
                               value_at(alpha, glob["count_m2"]),
                               bias_correction_factor(b1, count),
                               bias_correction_factor(b2, count))
        return ctx, {"count": count, "count_m2": safe_increment(glob["count_m2"])}

    def leaf(g: Array, s: Any, p: Any, ctx: _AdemamixContext) -> tuple:
        m1, m2 = ema_update(g, s.m1, b1), ema_update(g, s.m2, ctx.b3)
        nu = ema_update(abs_sq(g), s.nu, b2)
        mixed = m1 / ctx.m1 + ctx.alpha * m2
        return (adam_direction(mixed, nu, None, ctx.nu, eps, eps_root),
                s._replace(m1=m1, m2=m2, nu=nu))

    return stage_transform(LeafStage(
        name="scale_by_ademamix", update_leaf=leaf, state_cls=ScaleByAdemamixState,
        leaf_fields=("m1", "m2", "nu"),
        init_leaf=lambda p: tuple(ft.zeros_like(p, mu_dtype) for _ in range(3)),
        init_global=lambda: {"count": jnp.zeros([], jnp.int32),
                             "count_m2": jnp.zeros([], jnp.int32)},
        prepare=prepare))


@declare_optimizer("contrib", "Pagliardini et al., 2024", optax="contrib",
    summary="AdEMAMix (Pagliardini et al., 2024): a fast and a slow momentum.",
    signature="ademamix(learning_rate, b1=0.9, b2=0.999, b3=0.9999, alpha=5.0, ...)")
@hyperparameters(learning_rate="schedule", b1="number", b2="number", b3="schedule",
                 alpha="schedule", eps="number", eps_root="number", weight_decay="schedule")
@shared_args()
def ademamix(learning_rate: ScalarOrSchedule, b1: float = 0.9, b2: float = 0.999,
             b3: ScalarOrSchedule = 0.9999, alpha: ScalarOrSchedule = 5.0, eps: float = 1e-8,
             eps_root: float = 0.0, mu_dtype: Optional[Any] = None,
             weight_decay: ScalarOrSchedule = 0.0, mask: Optional[MaskOrFn] = None, *,
             cautious_weight_decay: bool = False) -> GradientTransformation:
    """AdEMAMix (Pagliardini et al., 2024): AdamW with a fast and a slow momentum.

    Update rule: ``m1 = ema(g, b1)``, ``m2 = ema(g, b3)``, ``nu = ema(|g|**2, b2)``,
    ``p -= lr * ((m1 / (1 - b1**t) + alpha m2) / (sqrt(nu / (1 - b2**t) +
    eps_root) + eps) + weight_decay * p)``. Old gradients keep weight through
    ``m2``: best for long runs (a smaller ``b3``, e.g. 0.999, suits short ones).
    Reference: Pagliardini et al., 2024, "The AdEMAMix Optimizer: Better,
    Faster, Older".

    Args:
      <shared: learning_rate>
      b1: decay rate of the fast EMA, in ``[0, 1)``.
      <shared: b2>
      b3: decay rate of the slow EMA, in ``[0, 1)``; a number or a schedule.
      alpha: the weight of the slow EMA (default 5.0, as optax's ``ademamix``;
        ``scale_by_ademamix`` defaults to 6.0); a number or a schedule.
      eps: added to the denominator outside the square root, ``>= 0``.
      eps_root: added inside the square root, ``>= 0``.
      mu_dtype: storage dtype of the moments; ``None`` keeps the params' dtypes.
      weight_decay: the decoupled weight decay, ``>= 0``; a number or a schedule.
      mask: where to apply the weight decay: a tree of bools (or a prefix), or
        a function of the params returning one; ``None`` decays every leaf.
      <shared: cautious_weight_decay>

    Returns:
      A ``GradientTransformation``; its state is ``(ScaleByAdemamixState,
      <weight decay state>, <learning rate state>)``.

    >>> import jax, jax.numpy as jnp, functrain
    >>> f = lambda x: jnp.sum(jnp.square(x))
    >>> opt = functrain.contrib.ademamix(learning_rate=0.01)
    >>> params = jnp.array([1., 2., 3.])
    >>> state = opt.init(params)
    >>> for _ in range(5):
    ...     updates, state = opt.update(jax.grad(f)(params), state, params)
    ...     params = functrain.apply_updates(params, updates)
    >>> print(f"{f(params):.2E}")
    1.34E+01
    """
    return chain(scale_by_ademamix(b1, b2, b3, alpha, eps, eps_root, mu_dtype),
                 add_decayed_weights(weight_decay, mask, cautious=cautious_weight_decay),
                 scale_by_learning_rate(learning_rate))


@state_value_kinds(m="signed", n="unsigned")
class ScaleBySimplifiedAdEMAMixState(NamedTuple):
    """State of :func:`scale_by_simplified_ademamix` (optax's fields and order).

    Attributes:
      t: the number of steps taken (int32).
      m: the (unnormalised) accumulation of the gradients, ``g + b1 m``.
      n: the moving average of the squared gradients.

    >>> import jax.numpy as jnp, functrain
    >>> functrain.contrib.scale_by_simplified_ademamix().init([jnp.ones(2)]).t
    Array(0, dtype=int32)
    """

    t: Array
    m: Any
    n: Any


@hyperparameters(b1="number", b2="number", alpha="schedule", eps="number", eps_root="number")
@shared_args()
def scale_by_simplified_ademamix(b1: float = 0.99, b2: float = 0.95,
                                 alpha: ScalarOrSchedule = 0.0, eps: float = 1e-8,
                                 eps_root: float = 0.0) -> GradientTransformation:
    """Rescale by Simplified AdEMAMix (Morwani et al., 2025): one momentum buffer.

    ``m = g + b1 m`` (no ``1 - b1`` factor), ``n = ema(|g|**2, b2)``; the update
    is ``(m + alpha g) / (sqrt(n / (1 - b2**t) + eps_root) + eps)``. ``alpha``
    may be a schedule of the step count. Reference: Morwani et al., 2025,
    "Connections between Schedule-Free Optimizers, AdEMAMix, and Accelerated
    SGD Variants". On complex leaves the second moment is ``|g|**2`` (real),
    where optax 0.2.8 squares ``g`` itself (a complex square): there the
    numbers are not optax's.

    Args:
      b1: decay of the gradient accumulation, in ``[0, 1)``.
      <shared: b2>
      alpha: the weight of the current gradient; a number or a schedule.
      eps: added to the denominator outside the square root, ``>= 0``.
      eps_root: added inside the square root, ``>= 0``.

    Returns:
      A ``GradientTransformation`` whose state is
      :class:`ScaleBySimplifiedAdEMAMixState`.

    >>> import jax.numpy as jnp, functrain
    >>> tx = functrain.contrib.scale_by_simplified_ademamix(alpha=1.0, eps=0.0)
    >>> tx.update([jnp.array([-2.])], tx.init([jnp.zeros(1)]))[0]
    [Array([-2.], dtype=float32)]
    """
    check_betas("scale_by_simplified_ademamix", b1=b1, b2=b2)
    check_nonnegative("scale_by_simplified_ademamix", eps=eps, eps_root=eps_root)

    def prepare(glob: dict, _: Any) -> tuple:
        t = safe_increment(glob["t"])
        return (value_at(alpha, glob["t"]), bias_correction_factor(b2, t)), {"t": t}

    def leaf(g: Array, s: Any, p: Any, ctx: tuple) -> tuple:
        alpha_now, n_correction = ctx
        m = g + b1 * s.m
        # the average as optax forms it here, g2 + b2 (n - g2) (a lerp; equal to
        # ema_update's (1 - b2) g2 + b2 n, rounded otherwise: up to 104 ulps in the steps)
        g2 = abs_sq(g)
        n = g2 + b2 * (s.n - g2)
        return (adam_direction(m + alpha_now * g, n, None, n_correction, eps, eps_root),
                s._replace(m=m, n=n))

    return stage_transform(LeafStage(
        name="scale_by_simplified_ademamix", update_leaf=leaf,
        state_cls=ScaleBySimplifiedAdEMAMixState, leaf_fields=("m", "n"),
        init_leaf=lambda p: (ft.zeros_like(p), ft.zeros_like(p)),
        init_global=lambda: {"t": jnp.zeros([], jnp.int32)}, prepare=prepare))


@declare_optimizer("contrib", "Morwani et al., 2025", optax="contrib", listed_with="ademamix",
    signature="simplified_ademamix")
@hyperparameters(learning_rate="schedule", b1="number", b2="number", alpha="schedule",
                 eps="number", eps_root="number", weight_decay="schedule")
@shared_args()
def simplified_ademamix(learning_rate: ScalarOrSchedule, b1: float = 0.99, b2: float = 0.95,
                        alpha: ScalarOrSchedule = 0.0, eps: float = 1e-8, eps_root: float = 0.0,
                        weight_decay: ScalarOrSchedule = 0.0, mask: Optional[MaskOrFn] = None,
                        *, cautious_weight_decay: bool = False) -> GradientTransformation:
    """Simplified AdEMAMix (Morwani et al., 2025): AdEMAMix with a single momentum.

    Update rule: ``m = g + b1 m``, ``n = ema(|g|**2, b2)``,
    ``p -= lr * ((m + alpha g) / (sqrt(n / (1 - b2**t) + eps_root) + eps)
    + weight_decay * p)``. ``alpha = 0`` is Adam up to a rescaling of ``lr`` and
    ``b1``. Reference: Morwani et al., 2025, "Connections between Schedule-Free
    Optimizers, AdEMAMix, and Accelerated SGD Variants".

    Args:
      <shared: learning_rate>
      b1: decay of the gradient accumulation, in ``[0, 1)``.
      <shared: b2>
      alpha: the weight of the current gradient; a number or a schedule.
      eps: added to the denominator outside the square root, ``>= 0``.
      eps_root: added inside the square root, ``>= 0``.
      weight_decay: the decoupled weight decay, ``>= 0``; a number or a schedule.
      mask: where to apply the weight decay: a tree of bools (or a prefix), or
        a function of the params returning one; ``None`` decays every leaf.
      <shared: cautious_weight_decay>

    Returns:
      A ``GradientTransformation``; its state is
      ``(ScaleBySimplifiedAdEMAMixState, <weight decay state>, <learning rate state>)``.

    >>> import jax, jax.numpy as jnp, functrain
    >>> f = lambda x: jnp.sum(jnp.square(x))
    >>> opt = functrain.contrib.simplified_ademamix(learning_rate=0.01)
    >>> params = jnp.array([1., 2., 3.])
    >>> state = opt.init(params)
    >>> for _ in range(5):
    ...     updates, state = opt.update(jax.grad(f)(params), state, params)
    ...     params = functrain.apply_updates(params, updates)
    >>> print(f"{f(params):.2E}")
    1.23E+01
    """
    return chain(scale_by_simplified_ademamix(b1, b2, alpha, eps, eps_root),
                 add_decayed_weights(weight_decay, mask, cautious=cautious_weight_decay),
                 scale_by_learning_rate(learning_rate))
