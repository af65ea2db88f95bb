"""MoMo (Schaipp et al., 2023): momentum with a Polyak-type adaptive step size.

``momo`` (SGD with momentum) and ``momo_adam`` (Adam) take the loss at the
current parameters as ``update(..., value=loss)`` and choose the step size
``min(learning_rate, t)``, where ``t`` comes from a model of the loss built from
the momentum, the loss values and a lower bound on the loss.

The step size needs inner products over the whole tree of the *new* momentum
(``<d, x>``, ``||d||^2``), so both are whole-tree transformations: one pass
updates the moments leaf by leaf, the step size is computed from their global
reductions, and a second pass forms each leaf's update. Names, arguments,
states and numbers are optax 0.2.8's ``optax.contrib.momo``/``momo_adam``.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from functrain.arg_checks import (MissingArgumentError, check_betas, check_nonnegative,
                                  check_state_type, needs_params_error)
from functrain.declarations import declare_optimizer, hyperparameters
from functrain import tree as ft
from functrain.numerics import bias_correction_factor, ema_update
from functrain.engine.protocol import (GradientTransformationExtraArgs, OptState, Params,
                                       ScalarOrSchedule, Updates)
from functrain.engine.counts import safe_increment, value_at

Array = jax.Array

__all__ = ["MomoAdamState", "MomoState", "momo", "momo_adam"]

_TINY = float(np.finfo(float).eps)  # below this squared norm, no step (as optax)


class MomoState(NamedTuple):
    """State of :func:`momo` (optax's fields, in optax's order).

    Attributes:
      exp_avg: the momentum, an EMA of the gradients (a tree like the params).
      barf: the EMA of the loss values.
      gamma: the EMA of ``<g_t, x_t>``.
      lb: the current lower bound on the loss.
      count: the number of steps taken (int32).

    >>> import jax.numpy as jnp, functrain
    >>> functrain.contrib.momo().init({'w': jnp.ones(2)}).lb
    Array(0., dtype=float32)
    """

    exp_avg: Updates
    barf: Array
    gamma: Array
    lb: Array
    count: Array


class MomoAdamState(NamedTuple):
    """State of :func:`momo_adam` (optax's fields, in optax's order).

    Attributes:
      exp_avg: the EMA of the gradients (a tree like the params).
      exp_avg_sq: the EMA of their squared magnitudes (a tree like the params).
      barf: the EMA of the loss values.
      gamma: the EMA of ``<g_t, x_t>``.
      lb: the current lower bound on the loss.
      count: the number of steps taken (int32).

    >>> import jax.numpy as jnp, functrain
    >>> functrain.contrib.momo_adam().init({'w': jnp.ones(2)}).count
    Array(0, dtype=int32)
    """

    exp_avg: Updates
    exp_avg_sq: Updates
    barf: Array
    gamma: Array
    lb: Array
    count: Array


def _momo(owner: str, learning_rate: ScalarOrSchedule, b1: Any, b2: Optional[Any], eps: Any,
          lower_bound: Any, weight_decay: Any, adapt_lower_bound: bool
          ) -> GradientTransformationExtraArgs:
    """MoMo (``b2 is None``) or MoMo-Adam: the two share everything but the preconditioner."""
    adam = b2 is not None
    state_cls = MomoAdamState if adam else MomoState
    moments = ("exp_avg", "exp_avg_sq") if adam else ("exp_avg",)

    def init_fn(params: Params) -> OptState:
        paths, leaves, _ = ft.flatten_with_paths(params)
        ft.check_leaf_dtypes(paths, leaves, [True] * len(leaves), owner, "params",
                             real_only=True)
        dtype = ft.dtype(params, "lowest") if leaves else jnp.float32
        zero = jnp.zeros([], dtype)
        trees = [ft.zeros_like(params) for _ in moments]
        return ft.distinct_buffers(state_cls(*trees, zero, zero,
                                             jnp.asarray(lower_bound, dtype),
                                             jnp.zeros([], jnp.int32)))

    def update_fn(updates: Updates, state: OptState, params: Optional[Params] = None, *,
                  value: Any = None, **extra_args: Any) -> tuple[Updates, OptState]:
        del extra_args
        check_state_type(state, state_cls, owner)
        if params is None:
            raise needs_params_error(owner, "update(updates, state, params, value=loss)")
        if value is None:
            raise MissingArgumentError(f"{owner} needs the loss at params: call update(updates, "
                                       f"state, params, value=loss), e.g. with "
                                       f"jax.value_and_grad.")
        paths, gs, treedef = ft.flatten_with_paths(updates)
        ft.check_structure(updates, params, "params", "updates")
        ps = treedef.flatten_up_to(params)
        ft.check_shapes(paths, ps, gs, "updates", "params")
        ft.check_leaf_dtypes(paths, gs, [True] * len(gs), owner, "updates", real_only=True)
        olds = []
        for name in moments:
            leaves = ft.flatten_like(treedef, getattr(state, name), f"{owner} state .{name}",
                                     updates, "updates")
            ft.check_shapes(paths, leaves, gs, "updates", f"{owner} state .{name}")
            olds.append(leaves)

        count = state.count
        count_inc = safe_increment(count)
        sdtype = jnp.promote_types(ft.compute_dtype(state.barf.dtype), jnp.float32)
        # Python-number hyperparameters stay Python numbers (optax's rounding).
        alpha = value_at(learning_rate, count)
        wd, b1_, b2_, eps_, lbound = weight_decay, b1, b2, eps, lower_bound
        if adam:
            bt = b1_
            bc1 = jnp.asarray(bias_correction_factor(b1_, count_inc)).astype(sdtype)
            bc2 = jnp.asarray(bias_correction_factor(b2_, count_inc)).astype(sdtype)
        else:  # the first step starts the averages at the first values
            bt = jnp.where(count == 0, 0.0, b1_)
            bc1 = jnp.ones([], sdtype)

        # Pass 1: the new moments and each leaf's direction, in the leaf's compute dtype.
        cds = [ft.compute_dtype(jnp.promote_types(g.dtype, p.dtype)) for g, p in zip(gs, ps)]
        gc = [g.astype(cd) for g, cd in zip(gs, cds)]
        pc = [p.astype(cd) for p, cd in zip(ps, cds)]
        m = [ema_update(g, o.astype(cd), bt) for g, o, cd in zip(gc, olds[0], cds)]
        if adam:
            # (1 - b2) g g associated as optax does (optax's bits); real leaves only
            v = [b2_ * o.astype(cd) + (1 - b2_) * g * g for g, o, cd in zip(gc, olds[1], cds)]
            precond = [eps_ + jnp.sqrt(x / bc2.astype(x.dtype)) for x in v]
            direction = [a / c for a, c in zip(m, precond)]
            m_norm = ft.vdot(m, direction)
        else:
            direction = m
            m_norm = ft.norm(m, squared=True)

        # The step size, from whole-tree reductions.
        m_norm = m_norm.astype(sdtype)
        barf = ema_update(jnp.asarray(value).astype(sdtype), state.barf.astype(sdtype), bt)
        gamma = ema_update(ft.vdot(gc, pc).astype(sdtype), state.gamma.astype(sdtype), bt)
        iprod = ft.vdot(m, pc).astype(sdtype)
        decay = 1 + alpha * wd
        lb = state.lb.astype(sdtype)
        if adapt_lower_bound:
            cap = decay * (barf - gamma) + iprod
            lb = jnp.where(cap < decay * bc1 * lb,
                           jnp.maximum(cap / (2 * bc1 * decay), lbound), lb)
        t1 = jnp.maximum(decay * (barf - bc1 * lb - gamma) + iprod, 0.0) / m_norm
        t1 = jnp.where(m_norm <= _TINY, 0.0, t1)
        tau = jnp.minimum(alpha / bc1, t1)
        shrink = alpha * wd / decay

        # Pass 2: each leaf's update (MoMo-Adam's tau * m / D associated as optax does).
        steps = ([tau * a / c for a, c in zip(m, precond)] if adam
                 else [tau * d for d in direction])
        out = [(-shrink * p - st).astype(g.dtype) for p, st, g in zip(pc, steps, gs)]
        new_lb = state.lb
        if adapt_lower_bound:
            new_lb = jnp.maximum(((barf + iprod - gamma) - 0.5 * tau * m_norm) / bc1,
                                 lbound)
        news = [m] + ([v] if adam else [])
        trees = [treedef.unflatten([x.astype(o.dtype) for x, o in zip(new, old)])
                 for new, old in zip(news, olds)]
        dt = state.barf.dtype
        return treedef.unflatten(out), state_cls(
            *trees, barf.astype(dt), gamma.astype(dt), jnp.asarray(new_lb).astype(dt),
            count_inc)

    return GradientTransformationExtraArgs(init_fn, update_fn)


@declare_optimizer("contrib", "Schaipp et al., 2023", optax="contrib",
    summary="MoMo (Schaipp et al., 2023): model-based Polyak steps; `update(..., value=)`.",
    signature="momo(...)")
@hyperparameters(learning_rate="schedule", beta="number", lower_bound="number",
                 weight_decay="number")
def momo(learning_rate: ScalarOrSchedule = 1.0, beta: float = 0.9, lower_bound: float = 0.0,
         weight_decay: float = 0.0, adapt_lower_bound: bool = False
         ) -> GradientTransformationExtraArgs:
    """MoMo (Schaipp et al., 2023): SGD with momentum and a Polyak-type step size.

    Call ``update(grads, state, params, value=loss)`` with the loss at ``params``.
    With ``b_t = 0`` at the first step and ``beta`` after, the averages are
    ``d = b_t d + (1 - b_t) g``, ``f = b_t f + (1 - b_t) loss`` and ``gamma =
    b_t gamma + (1 - b_t) <g, x>``. With ``a`` the learning rate, ``l`` the lower
    bound and ``w`` the weight decay, the step size is ``tau = min(a, max((1 + a
    w)(f - l - gamma) + <d, x>, 0) / ||d||^2)`` (0 when ``||d||^2`` is below
    machine epsilon) and the update ``-(a w / (1 + a w)) x - tau d``. With
    ``adapt_lower_bound`` the bound is re-estimated every step (the paper's
    MoMo*). Reference: Schaipp, Ohana, Eickenberg, Defazio and Gower, "MoMo:
    Momentum Models for Adaptive Learning Rates" (2023).

    Args:
      learning_rate: the largest step size ``a`` (a number or a schedule); large
        values (the default 1.0) are fine, the adaptive term caps the step.
      beta: the momentum ``beta``, in ``[0, 1)``.
      lower_bound: a lower bound ``l`` on the loss (0 for most losses).
      weight_decay: the weight decay ``w``, ``>= 0``.
      adapt_lower_bound: estimate the lower bound on the fly (when no good
        ``lower_bound`` is known).

    Returns:
      A ``GradientTransformationExtraArgs`` whose state is :class:`MomoState`;
      ``update`` raises ``ValueError`` without ``params`` or ``value``.

    >>> import jax, jax.numpy as jnp, functrain
    >>> f = lambda x: jnp.sum(x ** 2)
    >>> opt = functrain.contrib.momo()
    >>> params = jnp.array([1., 2., 3.])
    >>> state = opt.init(params)
    >>> value, grad = jax.value_and_grad(f)(params)
    >>> updates, state = opt.update(grad, state, params, value=value)
    >>> print(f(functrain.apply_updates(params, updates)))
    3.5
    """
    check_betas("momo", beta=beta)
    check_nonnegative("momo", weight_decay=weight_decay)
    return _momo("momo", learning_rate, beta, None, 0.0, lower_bound, weight_decay,
                 adapt_lower_bound)


@declare_optimizer("contrib", "Schaipp et al., 2023", optax="contrib", listed_with="momo",
    signature="momo_adam(...)")
@hyperparameters(learning_rate="schedule", b1="number", b2="number", eps="number",
                 lower_bound="number", weight_decay="number")
def momo_adam(learning_rate: ScalarOrSchedule = 1e-2, b1: float = 0.9, b2: float = 0.999,
              eps: float = 1e-8, lower_bound: float = 0.0, weight_decay: float = 0.0,
              adapt_lower_bound: bool = False) -> GradientTransformationExtraArgs:
    """MoMo-Adam (Schaipp et al., 2023): Adam(W) with a Polyak-type step size.

    Call ``update(grads, state, params, value=loss)`` with the loss at ``params``.
    With ``t`` the step (from 1) and ``c1 = 1 - b1**t``: ``m = b1 m + (1 - b1)
    g``, ``v = b2 v + (1 - b2) g^2``, ``D = eps + sqrt(v / (1 - b2**t))``, ``f``
    and ``gamma`` the ``b1``-EMAs of the loss and of ``<g, x>``. The step size is
    ``tau = min(a / c1, max((1 + a w)(f - c1 l - gamma) + <m, x>, 0) / <m,
    m / D>)`` and the update ``-(a w / (1 + a w)) x - tau m / D`` (``a`` the
    learning rate, ``l`` the lower bound, ``w`` the decoupled weight decay).
    Reference: Schaipp, Ohana, Eickenberg, Defazio and Gower, "MoMo: Momentum
    Models for Adaptive Learning Rates" (2023).

    Args:
      learning_rate: the largest step size ``a`` (a number or a schedule).
      b1: the decay of the first moment and of the loss averages, in ``[0, 1)``.
      b2: the decay of the second moment, in ``[0, 1)``.
      eps: added to the preconditioner ``D``, ``>= 0``.
      lower_bound: a lower bound ``l`` on the loss (0 for most losses).
      weight_decay: the decoupled weight decay ``w``, ``>= 0``.
      adapt_lower_bound: estimate the lower bound on the fly.

    Returns:
      A ``GradientTransformationExtraArgs`` whose state is
      :class:`MomoAdamState`; ``update`` raises ``ValueError`` without
      ``params`` or ``value``.

    >>> import jax, jax.numpy as jnp, functrain
    >>> f = lambda x: jnp.sum(x ** 2)
    >>> opt = functrain.contrib.momo_adam()
    >>> params = jnp.array([1., 2., 3.])
    >>> state = opt.init(params)
    >>> value, grad = jax.value_and_grad(f)(params)
    >>> updates, state = opt.update(grad, state, params, value=value)
    >>> print(round(float(f(functrain.apply_updates(params, updates))), 3))
    13.88
    """
    check_betas("momo_adam", b1=b1, b2=b2)
    check_nonnegative("momo_adam", eps=eps, weight_decay=weight_decay)
    return _momo("momo_adam", learning_rate, b1, b2, eps, lower_bound, weight_decay,
                 adapt_lower_bound)
