"""SPAM and Stable-SPAM: Adam with spike-aware gradient clipping and momentum resets.

SPAM (Huang et al., 2025) clips the gradient entries whose square exceeds ``threshold``
times Adam's second moment, zeroes both moments every ``reset_interval`` steps, and warms
the step back up after each reset. Stable-SPAM (Huang et al., 2025) replaces the fixed
threshold by an adaptive one (a moving average of each leaf's largest ``|g|``, AdaClip),
rescales each leaf's gradient by a moving average of its norm (AdaGN), and resets the
moments as SPAM. Both are one :class:`~functrain.engine.stage.LeafStage` each, chained
with functrain's decoupled weight decay and learning rate (as ``adamw``), branch-free: the
step conditions (reset, clip, warm-up) are computed once per step from the count, so a
jitted step holds no conditional. optax has neither.

Notation in the docstrings: ``g`` is the gradient, ``p`` the parameter, ``lr`` the learning
rate, ``|g|`` the modulus (complex leaves work: squares are ``|g|**2``, signs ``g / |g|``).
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp

from functrain import tree as ft
from functrain.arg_checks import (check_betas, check_nonnegative, check_positive, check_range,
                                  concrete_real)
from functrain.declarations import declare_optimizer, hyperparameters, state_value_kinds
from functrain.numerics import abs_sq, adam_direction, ema_update
from functrain.engine.protocol import GradientTransformation, MaskOrFn, ScalarOrSchedule
from functrain.engine.stage import LeafChecks, LeafStage
from functrain.engine.counts import safe_increment, zero_count
from functrain.engine.program import chain, stage_transform
from functrain.transforms.scaling import add_decayed_weights, scale_by_learning_rate
from functrain.docstrings import shared_args

Array = jax.Array

__all__ = ["ScaleBySpamState", "scale_by_spam", "spam",
           "ScaleByStableSpamState", "scale_by_stable_spam", "stable_spam"]


# --------------------------------------------------------------------------
# SPAM
# --------------------------------------------------------------------------

@state_value_kinds(mu="signed", nu="unsigned")
class ScaleBySpamState(NamedTuple):
    """State of :func:`scale_by_spam`.

    Attributes:
      count: the number of steps taken (int32); it decides the resets, the clipping
        window and the warm-up.
      mu: Adam's first moment (params-shaped), zeroed at each reset.
      nu: Adam's second moment (params-shaped), zeroed at each reset.

    >>> import jax.numpy as jnp
    >>> scale_by_spam().init({'w': jnp.zeros(2)}).nu
    {'w': Array([0., 0.], dtype=float32)}
    """
    count: Array
    mu: Any
    nu: Any


class _SpamStep(NamedTuple):
    reset: Array   # zero the moments before this step
    clip: Array    # clip spikes this step
    factor: Array  # sqrt(1 - b2**t) / (1 - b1**t) times the warm-up scale


@hyperparameters(static=("reset_interval", "warmup_steps", "clip_start"), b1="number", b2="number",
                 eps="number", threshold="number", reset_interval="int", warmup_steps="int",
                 clip_start="int")
@shared_args()
def scale_by_spam(b1: float = 0.9, b2: float = 0.999, eps: float = 1e-6,
                  mu_dtype: Optional[Any] = None, *, threshold: float = 5000.0,
                  reset_interval: int = 500, warmup_steps: int = 150,
                  clip_start: int = 20) -> GradientTransformation:
    """Rescale updates by SPAM's rule (Huang et al., 2025, Algorithm 1 and the authors' code).

    With ``k`` the number of steps taken before this one and ``t = k + 1`` (Adam's step,
    never restarted): (1) if ``reset_interval > 0`` and ``t % reset_interval == 0``,
    ``mu = nu = 0`` (momentum reset); (2) if ``threshold > 0``, ``t >= clip_start`` and
    (``reset_interval == 0`` or ``t % reset_interval >= clip_start``), each entry with
    ``|g|**2 > threshold nu`` (``nu`` before this step's update) becomes
    ``sign(g) sqrt(threshold nu)``; (3) ``mu = b1 mu + (1-b1) g``,
    ``nu = b2 nu + (1-b2) |g|**2``, and the update is
    ``scale * mu / (sqrt(nu) + eps) * sqrt(1 - b2**t) / (1 - b1**t)`` (``eps`` added to the
    uncorrected root, as the authors' code). ``scale`` is the warm-up after a reset:
    ``1 - 0.99 (1 + cos(pi j / (warmup_steps + 1))) / 2`` where ``j = t % reset_interval``
    counts the steps since the last reset (``j = 0`` at the reset step), and ``1`` once
    ``j >= warmup_steps`` or before the first reset (the code's counter starts at
    ``warmup_steps + 1``; with ``reset_interval == 1`` its first warm-up starts at the
    second step). The official names are ``DeltaT`` (``reset_interval``) and
    ``grad_accu_steps`` (``clip_start``). With ``clip_start <= 1`` the first step clips
    against ``nu = 0``, zeroing the gradient (as the code). Reference: Huang et al., 2025,
    "SPAM: Spike-Aware Adam with Momentum Reset for Stable LLM Training" (ICLR 2025,
    arXiv:2501.06842).

    Args:
      <shared: b1, b2>
      eps: added to ``sqrt(nu)``; ``>= 0``.
      <shared: mu_dtype>
      threshold: the spike threshold ``theta`` (``>= 0``; ``0`` disables clipping).
      reset_interval: steps between momentum resets (an int ``>= 0``; ``0`` disables the
        resets and their warm-up).
      warmup_steps: steps of cosine warm-up after each reset (an int ``>= 0``).
      clip_start: the first step (counted from 1, and from each reset) that clips (an int
        ``>= 0``).

    Returns:
      A ``GradientTransformation`` whose state is :class:`ScaleBySpamState`.

    >>> import jax.numpy as jnp
    >>> tx = scale_by_spam(threshold=50.0, clip_start=2)
    >>> u, state = tx.update([jnp.array([1., 1.])], tx.init([jnp.zeros(2)]))
    >>> _, state = tx.update([jnp.array([1e3, 0.1])], state)
    >>> print(state.nu[0].round(6))  # the spike 1e3 entered as sqrt(50 * 0.001) = 0.2236
    [0.001049 0.001009]
    """
    check_betas("scale_by_spam", b1=b1, b2=b2)
    check_nonnegative("scale_by_spam", eps=eps, threshold=threshold,
                      reset_interval=reset_interval, warmup_steps=warmup_steps,
                      clip_start=clip_start)
    interval, warmup, start = int(reset_interval), int(warmup_steps), int(clip_start)
    clipping = concrete_real(threshold) != 0.0  # a traced threshold may be 0: jnp.where

    def prepare(glob: dict, _: Any) -> tuple:
        k = glob["count"]
        t = safe_increment(k)
        factor = jnp.sqrt(1 - b2 ** t) / (1 - b1 ** t)
        clip = (jnp.asarray(threshold) != 0) & (t >= start)
        if interval:
            j = t % interval
            reset = j == 0
            clip = clip & (j >= start)
            if warmup:
                warming = (t >= interval) & (k >= 1) & (j < warmup)
                cosine = 0.99 * (1 + jnp.cos(math.pi * j / (warmup + 1))) / 2
                factor = factor * jnp.where(warming, 1 - cosine, 1.0)
        else:
            reset = jnp.zeros([], bool)
        return _SpamStep(reset, clip, factor), {"count": t}

    def leaf(g: Array, s: Any, p: Any, ctx: _SpamStep) -> tuple:
        mu = jnp.where(ctx.reset, jnp.zeros_like(s.mu), s.mu)
        nu = jnp.where(ctx.reset, jnp.zeros_like(s.nu), s.nu)
        if clipping:
            bound_sq = threshold * jnp.real(nu)
            spike = ctx.clip & (abs_sq(g) > bound_sq)
            g = jnp.where(spike, jnp.sign(g) * jnp.sqrt(bound_sq), g)
        mu = ema_update(g, mu, b1)
        nu = ema_update(abs_sq(g), nu, b2)
        return adam_direction(mu, nu, None, None, eps) * ctx.factor, s._replace(mu=mu, nu=nu)

    return stage_transform(LeafStage(
        name="scale_by_spam", update_leaf=leaf, state_cls=ScaleBySpamState,
        leaf_fields=("mu", "nu"), init_leaf=lambda p: (ft.zeros_like(p, mu_dtype),
                                                       ft.zeros_like(p)),
        init_global=zero_count, prepare=prepare))


@declare_optimizer("beyond optax", "Huang et al., 2025", optax=None, summary=(
    "SPAM (Huang et al., 2025): Adam that clips gradient spikes (`g**2 > threshold * nu`) and "
    "resets its moments every `reset_interval` steps, with a cosine warm-up after each reset."),
    signature="spam(learning_rate=1e-3, b1=0.9, b2=0.999, eps=1e-6, ..., threshold=5000.0, "
              "reset_interval=500, ...)")
@hyperparameters(static=("reset_interval", "warmup_steps", "clip_start"), learning_rate="schedule",
                 b1="number", b2="number", eps="number", weight_decay="schedule",
                 threshold="number", reset_interval="int", warmup_steps="int", clip_start="int")
@shared_args()
def spam(learning_rate: ScalarOrSchedule = 1e-3, b1: float = 0.9, b2: float = 0.999,
         eps: float = 1e-6, weight_decay: ScalarOrSchedule = 0.0,
         mask: Optional[MaskOrFn] = None, *, threshold: float = 5000.0,
         reset_interval: int = 500, warmup_steps: int = 150, clip_start: int = 20,
         mu_dtype: Optional[Any] = None, cautious_weight_decay: bool = False
         ) -> GradientTransformation:
    """SPAM (Huang et al., 2025): spike-aware Adam with momentum reset, decoupled decay.

    The update is ``-lr (u + weight_decay p)`` with ``u`` :func:`scale_by_spam`'s: spikes
    (``|g|**2 > threshold nu``) clipped to ``sqrt(threshold nu)``, Adam's moments zeroed
    every ``reset_interval`` steps and the step warmed up over ``warmup_steps`` steps after
    each reset. Differences from the authors' code: the weight decay is applied, as in
    ``adamw`` (and optax), to the params before the step, where the code decays the params
    already stepped (``p -= lr wd p`` after ``p -= step``): a difference of order
    ``lr**2 wd`` per step; and the code's per-parameter-group ``density`` (sparse momentum
    on a random mask of a matrix, re-drawn at each reset) is left out: every entry has its
    moments. The defaults are the code's (its ``DeltaT`` is ``reset_interval``, its
    ``grad_accu_steps`` is ``clip_start``). Reference: Huang et al., 2025, "SPAM:
    Spike-Aware Adam with Momentum Reset for Stable LLM Training" (ICLR 2025,
    arXiv:2501.06842).

    Args:
      <shared: learning_rate, b1, b2>
      eps: added to ``sqrt(nu)``; ``>= 0``.
      <shared: weight_decay>
      mask: which leaves get weight decay (a tree of bools or a function of params).
      threshold: the spike threshold (``>= 0``; ``0`` disables clipping).
      reset_interval: steps between momentum resets (an int ``>= 0``; ``0``: none).
      warmup_steps: steps of cosine warm-up after each reset (an int ``>= 0``).
      clip_start: no clipping before this step, counted from 1 and from each reset (an
        int ``>= 0``).
      mu_dtype: storage dtype of the first moment.
      <shared: cautious_weight_decay>

    Returns:
      A ``GradientTransformation``: ``chain(scale_by_spam, add_decayed_weights,
      scale_by_learning_rate)``.

    >>> import jax.numpy as jnp
    >>> from functrain.contrib import spam
    >>> opt = spam(0.1)
    >>> params = [jnp.zeros(1)]
    >>> u, _ = opt.update([jnp.array([2.])], opt.init(params), params)
    >>> print(round(float(u[0][0]), 4))
    -0.1
    """
    return chain(scale_by_spam(b1, b2, eps, mu_dtype, threshold=threshold,
                               reset_interval=reset_interval, warmup_steps=warmup_steps,
                               clip_start=clip_start),
                 add_decayed_weights(weight_decay, mask, cautious=cautious_weight_decay),
                 scale_by_learning_rate(learning_rate))


# The step's control flow (which steps reset, clip and warm up) is decided by these ints at
# build time; inject_hyperparams keeps them as Python values.


# --------------------------------------------------------------------------
# Stable-SPAM
# --------------------------------------------------------------------------

@state_value_kinds(mu="signed", nu="unsigned", max_ema="keep", norm_mean="keep",
                   norm_sq_mean="keep")
class ScaleByStableSpamState(NamedTuple):
    """State of :func:`scale_by_stable_spam`.

    Attributes:
      count: the number of steps taken (int32); with ``reset_interval`` it gives each
        step's bias-correction counts.
      mu: Adam's first moment (params-shaped), zeroed at each reset.
      nu: Adam's second moment (params-shaped), zeroed at each reset.
      max_ema: per leaf, the moving average of the largest ``|g|`` (a scalar, at least
        float32), AdaClip's threshold before its bias correction.
      norm_mean: per leaf, the moving average of the gradient's norm (a scalar).
      norm_sq_mean: per leaf, the moving average of the squared norm (a scalar).

    >>> import jax.numpy as jnp
    >>> scale_by_stable_spam().init({'w': jnp.zeros(2)}).max_ema
    {'w': Array(0., dtype=float32)}
    """
    count: Array
    mu: Any
    nu: Any
    max_ema: Any
    norm_mean: Any
    norm_sq_mean: Any


class _StableSpamStep(NamedTuple):
    reset: Array       # zero mu and nu before this step
    max_corr: Array    # 1 - theta**t_stats
    g1: Array          # gamma1 * s
    mean_corr: Array   # 1 - (gamma1 s)**t_stats
    sq_corr: Array     # 1 - gamma2**t_stats
    b1: Array          # b1 * s
    mu_corr: Array     # 1 - (b1 s)**t
    nu_corr: Array     # 1 - b2**t


def _statistic_zero(p: Any) -> Array:
    """A per-leaf scalar statistic: the param's real precision, at least float32 (a
    bfloat16 EMA with decay 0.999 would never move)."""
    return jnp.zeros([], jnp.promote_types(jnp.finfo(p.dtype).dtype, jnp.float32))


@hyperparameters(static=("total_steps", "reset_interval"), b1="number", b2="number", eps="number",
                 gamma1="number", gamma2="number", theta="number", total_steps="int or None",
                 eta_min="number", reset_interval="int")
@shared_args()
def scale_by_stable_spam(b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8,
                         mu_dtype: Optional[Any] = None, *, gamma1: float = 0.7,
                         gamma2: float = 0.9, theta: float = 0.999,
                         total_steps: Optional[int] = None, eta_min: float = 0.5,
                         reset_interval: int = 1000) -> GradientTransformation:
    """Rescale updates by Stable-SPAM's rule (Huang et al., 2025, Algorithm 1).

    With ``k`` the step (1 at the first), ``s = eta_min + (1 - eta_min) (1 + cos(pi k /
    (total_steps + 1))) / 2`` (``1`` without ``total_steps``; as the code, the cosine is
    not held at ``eta_min`` past ``total_steps + 1``), and per leaf: AdaClip,
    ``max_ema = theta max_ema + (1-theta) max|g|``, entries with ``|g| > max_ema / (1 -
    theta**t')`` scaled by ``max_ema / (1 - theta**t') / max|g|``; AdaGN, with ``n`` the
    leaf's norm after clipping, ``norm_mean = gamma1 s norm_mean + (1 - gamma1 s) n``,
    ``norm_sq_mean = gamma2 norm_sq_mean + (1-gamma2) n**2`` and, if ``n > 0``,
    ``g = g / n * (norm_mean / (1 - (gamma1 s)**t')) / (sqrt(norm_sq_mean / (1 -
    gamma2**t')) + eps)``; then Adam with ``b1 s``: ``mu = b1 s mu + (1 - b1 s) g``,
    ``nu = b2 nu + (1-b2) |g|**2``, update ``(mu / (1 - (b1 s)**t)) / (sqrt(nu / (1 -
    b2**t)) + eps)``.

    Momentum reset (``reset_interval > 0``): at each step with ``k % reset_interval == 0``,
    ``mu = nu = 0`` before the step and Adam's count restarts, ``t = 1`` (the paper's
    reset). The authors' code zeroes the stored moments but updates and uses, for that one
    step, the old ones it already holds (with ``t = 1``), and stores zeros after it; here
    the step uses the zeroed moments, so the step's gradient is kept (the paper's
    definition). The statistics' count ``t'`` shares the code's counter: it is
    incremented before the reset, so ``t'`` is ``t`` except at a reset step, where it
    counts on (``k`` at the first reset, ``reset_interval + 1`` at the later ones); the
    statistics themselves are never zeroed. Reference: Huang et al., 2025,
    "Stable-SPAM: How to Train in 4-Bit More Stably than 16-Bit Adam" (arXiv:2502.17055).

    Args:
      b1: decay rate of the first moment (before the scale ``s``), in ``[0, 1)``.
      <shared: b2>
      eps: added to the roots of the second moment and of AdaGN's ``norm_sq_mean``.
      <shared: mu_dtype>
      gamma1: decay of AdaGN's norm average (before ``s``), in ``[0, 1)``.
      gamma2: decay of AdaGN's squared-norm average, in ``[0, 1)``.
      theta: decay of AdaClip's max average (the paper's ``gamma3``), in ``[0, 1)``.
      total_steps: the length of ``s``'s cosine (the code's ``total_T``; an int ``>= 1``),
        or ``None`` for ``s = 1``.
      eta_min: the scale ``s`` at the end of the cosine, in ``[0, 1]``.
      reset_interval: steps between momentum resets (the code's ``update_proj_gap``; an
        int ``>= 0``, ``0`` for none).

    Returns:
      A ``GradientTransformation`` whose state is :class:`ScaleByStableSpamState`.

    >>> import jax.numpy as jnp
    >>> tx = scale_by_stable_spam()
    >>> u, state = tx.update([jnp.array([3., -4.])], tx.init([jnp.zeros(2)]))
    >>> print(u[0].round(4), state.norm_mean[0])
    [ 1. -1.] 1.5
    """
    owner = "scale_by_stable_spam"
    check_betas(owner, b1=b1, b2=b2, gamma1=gamma1, gamma2=gamma2, theta=theta)
    check_nonnegative(owner, eps=eps, reset_interval=reset_interval)
    check_range("eta_min", eta_min, 0.0, 1.0, high_inclusive=True, owner=owner)
    if total_steps is not None:
        check_positive(owner, total_steps=total_steps)
    interval = int(reset_interval)
    length = None if total_steps is None else int(total_steps)

    def prepare(glob: dict, _: Any) -> tuple:
        k = safe_increment(glob["count"])
        if length is None:
            s = 1.0
        else:
            s = eta_min + (1 - eta_min) * (1 + jnp.cos(math.pi * k / (length + 1))) / 2
        if interval:
            reset = k % interval == 0
            last = interval * ((k - 1) // interval)   # the last reset before this step
            t_stats = k - last + (last > 0)
            t = jnp.where(reset, 1, t_stats)
        else:
            reset, t_stats, t = jnp.zeros([], bool), k, k
        g1, b1_now = gamma1 * s, b1 * s
        return _StableSpamStep(reset, 1 - theta ** t_stats, g1, 1 - g1 ** t_stats,
                               1 - gamma2 ** t_stats, b1_now, 1 - b1_now ** t,
                               1 - b2 ** t), {"count": k}

    def leaf(g: Array, s: Any, p: Any, ctx: _StableSpamStep) -> tuple:
        size = jnp.abs(g)
        largest = jnp.max(size, initial=0.0)
        max_ema = ema_update(largest, jnp.real(s.max_ema), theta)  # read in g's dtype
        bound = max_ema / ctx.max_corr
        over = size > bound
        g = jnp.where(over, g / jnp.where(largest > 0, largest, 1.0) * bound, g)
        n = ft.leaf_norm(g)
        norm_mean = ema_update(n, jnp.real(s.norm_mean), ctx.g1)
        norm_sq_mean = ema_update(n * n, jnp.real(s.norm_sq_mean), gamma2)
        target = (norm_mean / ctx.mean_corr) / (jnp.sqrt(norm_sq_mean / ctx.sq_corr) + eps)
        g = jnp.where(n > 0, g / jnp.where(n > 0, n, 1.0) * target, g)
        mu = ema_update(g, jnp.where(ctx.reset, jnp.zeros_like(s.mu), s.mu), ctx.b1)
        nu = ema_update(abs_sq(g), jnp.where(ctx.reset, jnp.zeros_like(s.nu), s.nu), b2)
        return adam_direction(mu, nu, ctx.mu_corr, ctx.nu_corr, eps), s._replace(
            mu=mu, nu=nu, max_ema=max_ema, norm_mean=norm_mean, norm_sq_mean=norm_sq_mean)

    return stage_transform(LeafStage(
        name="scale_by_stable_spam", update_leaf=leaf, state_cls=ScaleByStableSpamState,
        leaf_fields=("mu", "nu", "max_ema", "norm_mean", "norm_sq_mean"),
        init_leaf=lambda p: (ft.zeros_like(p, mu_dtype), ft.zeros_like(p),
                             _statistic_zero(p), _statistic_zero(p), _statistic_zero(p)),
        init_global=zero_count, prepare=prepare, checks=LeafChecks(shaped_fields=("mu", "nu"))))


@declare_optimizer("beyond optax", "Huang et al., 2025", optax=None, summary=(
    "Stable-SPAM (Huang et al., 2025): SPAM with an adaptive spike threshold (a moving "
    "average of each leaf's max `|g|`), each leaf's gradient norm rescaled to a moving "
    "average of its norms, and momentum resets; made for low-bit training."),
    signature="stable_spam(learning_rate=1e-3, b1=0.9, b2=0.999, eps=1e-8, ..., "
              "reset_interval=1000, ...)")
@hyperparameters(static=("total_steps", "reset_interval"), learning_rate="schedule", b1="number",
                 b2="number", eps="number", weight_decay="schedule", gamma1="number",
                 gamma2="number", theta="number", total_steps="int or None", eta_min="number",
                 reset_interval="int")
@shared_args()
def stable_spam(learning_rate: ScalarOrSchedule = 1e-3, b1: float = 0.9, b2: float = 0.999,
                eps: float = 1e-8, weight_decay: ScalarOrSchedule = 0.0,
                mask: Optional[MaskOrFn] = None, *, gamma1: float = 0.7, gamma2: float = 0.9,
                theta: float = 0.999, total_steps: Optional[int] = None,
                eta_min: float = 0.5, reset_interval: int = 1000,
                mu_dtype: Optional[Any] = None, cautious_weight_decay: bool = False
                ) -> GradientTransformation:
    """Stable-SPAM (Huang et al., 2025): SPAM with adaptive clipping and norm, decoupled decay.

    The update is ``-lr (u + weight_decay p)`` with ``u`` :func:`scale_by_stable_spam`'s:
    AdaClip (spikes clipped to a moving average of each leaf's largest ``|g|``), AdaGN
    (each leaf's gradient rescaled to a moving average of its norms), Adam whose ``b1`` is
    scaled by a cosine from 1 down to ``eta_min`` over ``total_steps``, and momentum
    resets every ``reset_interval`` steps, as the paper defines them (see
    :func:`scale_by_stable_spam` for how the authors' code differs at a reset step). The
    weight decay is the code's: ``p *= 1 - lr wd`` before the step, as ``adamw``. The
    defaults are the code's (its ``gamma3`` is ``theta``, ``total_T`` is ``total_steps``,
    ``update_proj_gap`` is ``reset_interval``; its ``amsgrad`` option is left out).
    Reference: Huang et al., 2025, "Stable-SPAM: How to Train in 4-Bit More Stably than
    16-Bit Adam" (arXiv:2502.17055).

    Args:
      <shared: learning_rate>
      b1: decay rate of the first moment (before the scale), in ``[0, 1)``.
      <shared: b2>
      eps: added to the roots of the second moments; ``>= 0``.
      <shared: weight_decay>
      mask: which leaves get weight decay (a tree of bools or a function of params).
      gamma1: decay of AdaGN's norm average, in ``[0, 1)``.
      gamma2: decay of AdaGN's squared-norm average, in ``[0, 1)``.
      theta: decay of AdaClip's max average, in ``[0, 1)``.
      total_steps: the length of the cosine scaling ``b1`` and ``gamma1`` (an int
        ``>= 1``), or ``None`` for no scaling.
      eta_min: the scale at the end of that cosine, in ``[0, 1]``.
      reset_interval: steps between momentum resets (an int ``>= 0``; ``0``: none).
      mu_dtype: storage dtype of the first moment.
      <shared: cautious_weight_decay>

    Returns:
      A ``GradientTransformation``: ``chain(scale_by_stable_spam, add_decayed_weights,
      scale_by_learning_rate)``.

    >>> import jax.numpy as jnp
    >>> from functrain.contrib import stable_spam
    >>> opt = stable_spam(0.1)
    >>> params = [jnp.zeros(1)]
    >>> u, _ = opt.update([jnp.array([2.])], opt.init(params), params)
    >>> print(round(float(u[0][0]), 4))
    -0.1
    """
    return chain(scale_by_stable_spam(b1, b2, eps, mu_dtype, gamma1=gamma1, gamma2=gamma2,
                                      theta=theta, total_steps=total_steps, eta_min=eta_min,
                                      reset_interval=reset_interval),
                 add_decayed_weights(weight_decay, mask, cautious=cautious_weight_decay),
                 scale_by_learning_rate(learning_rate))
