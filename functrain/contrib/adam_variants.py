"""optax.contrib's Adam variants: ADOPT, MADGRAD and ACProp (AdEMAMix is in ``ademamix.py``).

Each ``scale_by_*`` is one :class:`~functrain.transforms.base.LeafStage`: the
per-array math of one leaf, plus a ``prepare`` that advances the step count and
computes the step's scalars (bias corrections, schedule values) once per step.
The engine lifts it over the tree, and the named optimizers are short ``chain`` s
of it with functrain's weight decay and learning-rate stages (fused into one
pass). Names, arguments, defaults, states and numbers are optax.contrib 0.2.8's.

Notation in the docstrings: ``g`` is the gradient, ``p`` the parameter, ``t``
the step number counted from 1, ``lr`` the learning rate (its value at the
step count, counted from 0, when it is a schedule), ``ema(x, b)`` the moving
average ``b avg + (1 - b) x``.

Complex parameters: the second moments take ``|g|**2`` (``numerics.abs_sq``), so
ADOPT without clipping and ACProp give optax's numbers on complex leaves; ADOPT's clipping and MADGRAD's cube root have no complex version (a
complex leaf raises a ``TypeError`` naming it, where optax fails inside jnp).
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp

from functrain.arg_checks import check_betas, check_momentum, check_nonnegative, hyperparameters
from functrain import tree as ft
from functrain.numerics import abs_sq, bias_correction_factor, ema_update
from functrain.transforms.adam import ScaleByAdamState, ScaleByBeliefState
from functrain.transforms.base import (GradientTransformation, LeafStage, MaskOrFn,
                                       ScalarOrSchedule, safe_increment, value_at, zero_count)
from functrain.transforms.engine import chain, stage_transform
from functrain.transforms.scaling import add_decayed_weights, scale_by_learning_rate

Array = jax.Array

__all__ = ["scale_by_adopt", "adopt", "MadgradState", "scale_by_madgrad", "madgrad",
           "scale_by_acprop", "acprop"]


# --------------------------------------------------------------------------
# ADOPT
# --------------------------------------------------------------------------

def _fourth_root(count: Array) -> Array:
    """optax's default clipping value of ADOPT: ``count ** 0.25``."""
    return count ** 0.25


@hyperparameters(b1="number", b2="number", eps="number")
def scale_by_adopt(b1: float = 0.9, b2: float = 0.9999, eps: float = 1e-6,
                   mu_dtype: Optional[Any] = None, *, nesterov: bool = False,
                   use_clipping: bool = True,
                   clip_value_fn: Callable[[Array], Array] = _fourth_root
                   ) -> GradientTransformation:
    """Rescale updates by ADOPT's moments (Taniguchi et al., 2024).

    Unlike Adam, the gradient is normalised by the *previous* second moment,
    and the first moment averages the normalised gradients. With ``k`` the
    step count (0 at the first step): ``n = g / max(sqrt(nu), eps)`` (``nu``
    before this step), clipped to ``[-c, c]`` with ``c = clip_value_fn(k)``
    when ``use_clipping``; ``mu = ema(n, b1)`` and ``nu = ema(|g|**2, b2)``,
    except that the first step sets ``nu = |g|**2`` and keeps ``mu = 0`` (so
    its update is 0). The update is ``mu``, or ``ema(n, b1)`` applied once
    more to the new ``mu`` with ``nesterov``. Reference: Taniguchi et al.,
    2024, "ADOPT: Modified Adam Can Converge with Any beta2 with the Optimal
    Rate" (NeurIPS 2024).

    Args:
      b1: decay rate of the first moment, in ``[0, 1)``.
      b2: decay rate of the second moment, in ``[0, 1)``.
      eps: the floor of ``sqrt(nu)`` in the denominator, ``>= 0``.
      mu_dtype: storage dtype of ``mu``; ``None`` keeps each parameter's dtype.
      nesterov: use Nesterov momentum (see above). Default ``False``.
      use_clipping: clip the normalised gradient (default ``True``, as optax);
        clipping has no complex version, so complex leaves need ``False``.
      clip_value_fn: the clipping bound as a function of the step count
        (counted from 0); default ``count ** 0.25``.

    Returns:
      A ``GradientTransformation`` whose state is
      :class:`~functrain.transforms.adam.ScaleByAdamState` (as optax's).

    >>> import jax.numpy as jnp, functrain
    >>> tx = functrain.contrib.scale_by_adopt()
    >>> params = [jnp.zeros(2)]
    >>> u, state = tx.update([jnp.array([2., -1.])], tx.init(params))
    >>> u, state.nu
    ([Array([0., 0.], dtype=float32)], [Array([4., 1.], dtype=float32)])
    >>> print(tx.update([jnp.array([2., -1.])], state)[0][0].round(4))
    [ 0.1 -0.1]
    """
    check_betas("scale_by_adopt", b1=b1, b2=b2)
    check_nonnegative("scale_by_adopt", eps=eps)
    if use_clipping and not callable(clip_value_fn):
        raise TypeError(f"scale_by_adopt: clip_value_fn must be a function of the step "
                        f"count, got {type(clip_value_fn).__name__}.")

    def prepare(glob: dict, _: Any) -> tuple:
        count = glob["count"]
        started = count > 0
        ctx = (jnp.where(started, b1, 1.0), jnp.where(started, b2, 0.0),
               clip_value_fn(count) if use_clipping else None)
        return ctx, {"count": safe_increment(count)}

    def leaf(g: Array, s: Any, p: Any, ctx: tuple) -> tuple:
        b1_now, b2_now, clip_value = ctx
        normalized = g / jnp.maximum(jnp.sqrt(jnp.real(s.nu)), eps)
        if use_clipping:
            normalized = jnp.clip(normalized, -clip_value, clip_value)
        mu = ema_update(normalized, s.mu, b1_now)
        nu = ema_update(abs_sq(g), s.nu, b2_now)
        update = ema_update(normalized, mu, b1_now) if nesterov else mu
        return update, (mu, nu)

    return stage_transform(LeafStage(
        name="scale_by_adopt", update_leaf=leaf, state_cls=ScaleByAdamState,
        leaf_fields=("mu", "nu"), init_leaf=lambda p: (ft.zeros_like(p, mu_dtype),
                                                       ft.zeros_like(p)),
        init_global=zero_count, prepare=prepare, real_only=use_clipping))


@hyperparameters(learning_rate="schedule", b1="number", b2="number", eps="number")
def adopt(learning_rate: ScalarOrSchedule, b1: float = 0.9, b2: float = 0.9999,
          eps: float = 1e-6, mu_dtype: Optional[Any] = None, *, nesterov: bool = False,
          use_clipping: bool = True, clip_value_fn: Callable[[Array], Array] = _fourth_root
          ) -> GradientTransformation:
    """ADOPT (Taniguchi et al., 2024): Adam that converges with any ``b2``.

    Update rule (:func:`scale_by_adopt`, ``k`` the step count from 0):
    ``n = clip(g / max(sqrt(nu), eps), -c_k, c_k)`` with the previous ``nu``;
    ``mu = b1 mu + (1 - b1) n``; ``nu = b2 nu + (1 - b2) |g|**2``;
    ``p -= lr * mu``. At the first step ``nu = |g|**2`` and ``mu`` stays 0.
    Reference: Taniguchi et al., 2024, "ADOPT: Modified Adam Can Converge with
    Any beta2 with the Optimal Rate" (NeurIPS 2024).

    Args:
      learning_rate: the step size: a number or a schedule of the step count.
      b1: decay rate of the first moment, in ``[0, 1)``.
      b2: decay rate of the second moment, in ``[0, 1)``.
      eps: the floor of ``sqrt(nu)`` in the denominator, ``>= 0``.
      mu_dtype: storage dtype of ``mu``; ``None`` keeps each parameter's dtype.
      nesterov: use Nesterov momentum. Default ``False``.
      use_clipping: clip the normalised gradient to ``[-c_k, c_k]`` (default
        ``True``, recommended when training from scratch).
      clip_value_fn: ``c_k`` as a function of the step count; default
        ``count ** 0.25``.

    Returns:
      A ``GradientTransformation``; its state is ``(ScaleByAdamState, <learning
      rate state>)``.

    >>> import jax, jax.numpy as jnp, functrain
    >>> f = lambda x: jnp.sum(x ** 2)
    >>> opt = functrain.contrib.adopt(learning_rate=0.1)
    >>> params = jnp.array([1., 2., 3.])
    >>> state = opt.init(params)
    >>> for _ in range(3):
    ...     updates, state = opt.update(jax.grad(f)(params), state, params)
    ...     params = functrain.apply_updates(params, updates)
    >>> print(f"{f(params):.3f}")
    13.655
    """
    return chain(scale_by_adopt(b1, b2, eps, mu_dtype, nesterov=nesterov,
                                use_clipping=use_clipping, clip_value_fn=clip_value_fn),
                 scale_by_learning_rate(learning_rate))


# --------------------------------------------------------------------------
# MADGRAD
# --------------------------------------------------------------------------

class MadgradState(NamedTuple):
    """State of :func:`scale_by_madgrad` (optax's fields and order).

    Attributes:
      count: the number of steps taken (int32).
      grad_sum_sq: the weighted sum of squared gradients ``G``.
      s: the weighted sum of gradients.
      x0: the initial parameters (a copy made at ``init``).

    >>> import jax.numpy as jnp, functrain
    >>> functrain.contrib.scale_by_madgrad(0.1).init([jnp.ones(2)]).x0
    [Array([1., 1.], dtype=float32)]
    """

    count: Array
    grad_sum_sq: Any
    s: Any
    x0: Any


@hyperparameters(learning_rate="schedule", momentum="number", eps="number")
def scale_by_madgrad(learning_rate: ScalarOrSchedule, momentum: float = 0.9,
                     eps: float = 1e-6) -> GradientTransformation:
    """MADGRAD's dual-averaged step (Defazio & Jelassi, 2021), as an update.

    With ``k`` the step count (from 0) and ``lam = (lr + eps) sqrt(k + 1)``:
    ``G = G + lam g**2``, ``s = s + lam g``, ``z = x0 - s / (cbrt(G) + eps)``;
    the new point is ``(1 - momentum) z + momentum p`` and the update is that
    minus ``p``. The learning rate is inside the update (the stage comes last);
    ``update`` needs the params. Reference: Defazio & Jelassi, 2021,
    "Adaptivity without Compromise: A Momentumized, Adaptive, Dual Averaged
    Gradient Method for Stochastic Optimization".

    Args:
      learning_rate: the step size: a number or a schedule of the step count.
      momentum: the weight of the current point, in ``[0, 1)``.
      eps: added to the learning rate and to the cube root, ``>= 0``.

    Returns:
      A ``GradientTransformation`` whose state is :class:`MadgradState`
      (real parameters only: the cube root has no complex version).

    >>> import jax.numpy as jnp, functrain
    >>> tx = functrain.contrib.scale_by_madgrad(1.0, momentum=0.0, eps=0.0)
    >>> params = [jnp.zeros(1)]
    >>> tx.update([jnp.array([8.])], tx.init(params), params)[0]
    [Array([-2.], dtype=float32)]
    """
    check_momentum("scale_by_madgrad", momentum)
    check_nonnegative("scale_by_madgrad", eps=eps)

    def prepare(glob: dict, _: Any) -> tuple:
        count = glob["count"]
        lam = (value_at(learning_rate, count) + eps) * jnp.sqrt(count + 1)
        return lam, {"count": safe_increment(count)}

    def leaf(g: Array, s: Any, p: Array, lam: Array) -> tuple:
        grad_sum_sq = s.grad_sum_sq + lam * abs_sq(g)
        sums = s.s + lam * g
        z = s.x0 - sums / (jnp.cbrt(grad_sum_sq) + eps)
        new_p = (1 - momentum) * z + momentum * p
        return new_p - p, (grad_sum_sq, sums, s.x0)

    return stage_transform(LeafStage(
        name="scale_by_madgrad", update_leaf=leaf, state_cls=MadgradState,
        leaf_fields=("grad_sum_sq", "s", "x0"),
        init_leaf=lambda p: (ft.zeros_like(p), ft.zeros_like(p), jnp.array(p, copy=True)),
        init_global=zero_count, prepare=prepare, needs_params=True, real_only=True))


@hyperparameters(learning_rate="schedule", momentum="number", weight_decay="number",
                 eps="number")
def madgrad(learning_rate: ScalarOrSchedule, momentum: float = 0.9, weight_decay: float = 0.0,
            eps: float = 1e-6) -> GradientTransformation:
    """MADGRAD (Defazio & Jelassi, 2021): momentumized, adaptive dual averaging.

    Update rule, with ``g`` including the L2 term ``weight_decay * p`` and
    ``lam = (lr + eps) sqrt(k + 1)``: ``G += lam g**2``, ``s += lam g``,
    ``z = x0 - s / (cbrt(G) + eps)``, ``p = (1 - momentum) z + momentum p``.
    Reference: Defazio & Jelassi, 2021, "Adaptivity without Compromise: A
    Momentumized, Adaptive, Dual Averaged Gradient Method for Stochastic
    Optimization".

    Args:
      learning_rate: the step size: a number or a schedule of the step count.
      momentum: the weight of the current point, in ``[0, 1)``.
      weight_decay: the L2 weight decay, added to the gradient (coupled).
      eps: added to the learning rate and to the cube root, ``>= 0``.

    Returns:
      A ``GradientTransformation``; its state is ``(EmptyState, MadgradState)``.
      ``update`` needs the params.

    >>> import jax, jax.numpy as jnp, functrain
    >>> f = lambda x: jnp.sum(jnp.square(x))
    >>> opt = functrain.contrib.madgrad(learning_rate=0.1)
    >>> params = jnp.array([1., 2., 3.])
    >>> state = opt.init(params)
    >>> for _ in range(5):
    ...     updates, state = opt.update(jax.grad(f)(params), state, params)
    ...     params = functrain.apply_updates(params, updates)
    >>> print(f"{f(params):.2f}")
    9.71
    """
    return chain(add_decayed_weights(weight_decay),
                 scale_by_madgrad(learning_rate, momentum, eps))


# --------------------------------------------------------------------------
# ACProp
# --------------------------------------------------------------------------

@hyperparameters(b1="number", b2="number", eps="number", eps_root="number")
def scale_by_acprop(b1: float = 0.9, b2: float = 0.999, eps: float = 1e-16,
                    eps_root: float = 1e-16) -> GradientTransformation:
    """Rescale by ACProp (Zhuang et al., 2021): AdaBelief with an asynchronous denominator.

    The gradient is divided by the *previous* step's centred second moment:
    ``u = g / (sqrt(s_hat) + eps)`` with ``s_hat = s / (1 - b2**(t-1))`` before
    this step's update (1 at the first step); then ``mu = ema(g, b1)`` and
    ``s = ema(|g - mu_prev|**2, b2) + eps_root``. Reference: Zhuang et al.,
    2021, "Momentum Centering and Asynchronous Update for Adaptive Gradient
    Methods".

    Args:
      b1: decay rate of the first moment ``mu``, in ``[0, 1)``.
      b2: decay rate of the centred second moment ``s``, in ``[0, 1)``.
      eps: added to the denominator outside the square root, ``>= 0``.
      eps_root: added to ``s`` at every step (it accumulates in the state),
        ``>= 0``.

    Returns:
      A ``GradientTransformation`` whose state is
      :class:`~functrain.transforms.adam.ScaleByBeliefState` (as optax's).

    >>> import jax.numpy as jnp, functrain
    >>> tx = functrain.contrib.scale_by_acprop()
    >>> tx.update([jnp.array([2.])], tx.init([jnp.zeros(1)]))[0]
    [Array([2.], dtype=float32)]
    """
    check_betas("scale_by_acprop", b1=b1, b2=b2)
    check_nonnegative("scale_by_acprop", eps=eps, eps_root=eps_root)

    def prepare(glob: dict, _: Any) -> tuple:
        count = glob["count"]
        count_inc = safe_increment(count)
        initial = count == 0
        t = jnp.where(initial, count_inc, count)
        return (initial, bias_correction_factor(b2, t)), {"count": count_inc}

    def leaf(g: Array, s: Any, p: Any, ctx: tuple) -> tuple:
        initial, correction = ctx
        mu = ema_update(g, s.mu, b1)
        nu = ema_update(abs_sq(g - s.mu), s.nu, b2) + eps_root
        nu_hat = jnp.where(initial, 1.0, jnp.real(s.nu) / correction)
        return g / (jnp.sqrt(nu_hat) + eps), (mu, nu)

    return stage_transform(LeafStage(
        name="scale_by_acprop", update_leaf=leaf, state_cls=ScaleByBeliefState,
        leaf_fields=("mu", "nu"), init_leaf=lambda p: (ft.zeros_like(p), ft.zeros_like(p)),
        init_global=zero_count, prepare=prepare))


@hyperparameters(learning_rate="schedule", b1="number", b2="number", eps="number",
                 eps_root="number", weight_decay="schedule")
def acprop(learning_rate: ScalarOrSchedule, b1: float = 0.9, b2: float = 0.999,
           eps: float = 1e-16, eps_root: float = 1e-16, weight_decay: ScalarOrSchedule = 0.0,
           mask: Optional[MaskOrFn] = None) -> GradientTransformation:
    """ACProp (Zhuang et al., 2021): momentum centring and an asynchronous update.

    Update rule: ``p -= lr * (g / (sqrt(s_hat_prev) + eps) + weight_decay * p)``
    where ``s_hat_prev`` is the bias-corrected ``s`` of the previous step (1 at
    the first), and then ``mu = ema(g, b1)``, ``s = ema(|g - mu_prev|**2, b2) +
    eps_root``. Reference: Zhuang et al., 2021, "Momentum Centering and
    Asynchronous Update for Adaptive Gradient Methods".

    Args:
      learning_rate: the step size: a number or a schedule of the step count.
      b1: decay rate of the first moment, in ``[0, 1)``.
      b2: decay rate of the centred second moment, in ``[0, 1)``.
      eps: added to the denominator outside the square root, ``>= 0``.
      eps_root: added to ``s`` at every step, ``>= 0``.
      weight_decay: the decoupled weight decay (multiplied by the learning
        rate), ``>= 0``; a number or a schedule.
      mask: where to apply the weight decay: a tree of bools (or a prefix), or
        a function of the params returning one; ``None`` decays every leaf.

    Returns:
      A ``GradientTransformation``; its state is ``(ScaleByBeliefState,
      <weight decay state>, <learning rate state>)``.

    >>> import jax, jax.numpy as jnp, functrain
    >>> f = lambda x: jnp.sum(jnp.square(x))
    >>> opt = functrain.contrib.acprop(learning_rate=0.01)
    >>> params = jnp.array([1., 2., 3.])
    >>> state = opt.init(params)
    >>> for _ in range(5):
    ...     updates, state = opt.update(jax.grad(f)(params), state, params)
    ...     params = functrain.apply_updates(params, updates)
    >>> print(f"{f(params):.2E}")
    1.30E+01
    """
    return chain(scale_by_acprop(b1, b2, eps, eps_root),
                 add_decayed_weights(weight_decay, mask),
                 scale_by_learning_rate(learning_rate))
