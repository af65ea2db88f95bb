"""Schedule-Free learning (Defazio et al., 2024): no decaying schedule, an averaged iterate.

:func:`schedule_free` wraps any base optimizer (run without momentum): the
base optimizer steps a sequence ``z``, the evaluation sequence ``x`` is a
running average of ``z``, and gradients are taken at the interpolation ``y``
of the two, which is what the caller holds as its parameters. The per-array
part (the new ``z``, ``x`` and ``y`` of one array) is a ``LeafStage`` run by
functrain's engine; only the averaging weight ``c_t`` is a per-step scalar.
:func:`schedule_free_eval_params` gives ``x`` back from ``y`` and the state.

Names, arguments, defaults, states and numbers are optax.contrib 0.2.8's.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp

from functrain.arg_checks import (check_betas, check_nonnegative, check_range, check_state_type,
                                  check_transformation, needs_params_error)
from functrain.declarations import declare_optimizer, hyperparameters
from functrain import tree as ft
from functrain.schedules import linear_schedule
from functrain.engine.protocol import (GradientTransformation, GradientTransformationExtraArgs,
                                       OptState, Params, ScalarOrSchedule, Updates, call_update)
from functrain.engine.stage import LeafChecks, LeafStage
from functrain.engine.counts import safe_increment
from functrain.engine.program import chain, run_block
from functrain.engine.dtypes import params_float_dtype
from functrain.families.rms.stages import scale_by_rms
from functrain.transforms.scaling import add_decayed_weights, scale_by_learning_rate
from functrain.families.momentum.optimizers import sgd
from functrain.docstrings import shared_args

Array = jax.Array


class ScheduleFreeState(NamedTuple):
    """State of :func:`schedule_free` (optax's fields, order and dtypes).

    Attributes:
      b1: the interpolation weight ``b1``, in the parameters' lowest dtype.
      weight_sum: the sum of the averaging weights ``max_lr**weight_lr_power``
        so far.
      step_count: the step number, counted from 1 (int32); the learning-rate
        schedule is evaluated at it.
      max_lr: the largest learning rate seen so far.
      base_optimizer_state: the wrapped optimizer's state.
      z: the base optimizer's iterate ``z`` (a tree like the parameters, in
        ``state_dtype`` if given).

    >>> import jax.numpy as jnp, functrain
    >>> opt = functrain.contrib.schedule_free_sgd(0.1)
    >>> opt.init({'w': jnp.ones(2)}).step_count
    Array(1, dtype=int32)
    """

    b1: Any
    weight_sum: Any
    step_count: Any
    max_lr: Any
    base_optimizer_state: OptState
    z: Params


class _Iterate(NamedTuple):
    """The per-leaf state the engine steps: the base optimizer's iterate ``z``."""

    z: Any


def schedule_free_eval_params(state: Any, params: Params) -> Params:
    """The evaluation parameters ``x`` of :func:`schedule_free` (Defazio et al., 2024).

    The parameters held during training are ``y = b1 x + (1 - b1) z``; this
    returns ``x = (y - (1 - b1) z) / b1``, where test and validation losses
    should be measured.

    Args:
      state: the :class:`ScheduleFreeState` of a :func:`schedule_free`
        optimizer (any object with fields ``b1`` and ``z``).
      params: the current (training) parameters ``y``.

    Returns:
      A tree like ``params``: the averaged iterate ``x``.

    Raises:
      ValueError: ``state`` has no ``b1`` or ``z`` (it is not a schedule-free
        state), or its ``z`` does not fit ``params`` (named by key path).

    >>> import jax.numpy as jnp, functrain
    >>> opt = functrain.contrib.schedule_free_sgd(0.5)
    >>> params = jnp.array([1.0])
    >>> state = opt.init(params)
    >>> updates, state = opt.update(jnp.array([1.0]), state, params)
    >>> params = functrain.apply_updates(params, updates)
    >>> functrain.contrib.schedule_free_eval_params(state, params)
    Array([0.5], dtype=float32)
    """
    b1 = getattr(state, "b1", None)
    z = getattr(state, "z", None)
    if b1 is None or z is None:
        raise ValueError(f"schedule_free_eval_params needs a ScheduleFreeState (the state of "
                         f"a schedule_free optimizer), got {type(state).__name__}.")
    ft.check_structure(params, z, "state.z", "params")
    return jax.tree_util.tree_map(lambda y, zi: (y - (1.0 - b1) * zi) / b1, params, z)


def _averaging_weight(weight: Array, total: Array) -> Array:
    """``weight / total``: 0 where both are 0 (a zero learning rate), NaN if either is NaN."""
    ratio = jnp.nan_to_num(weight / total, nan=0.0, posinf=jnp.inf)
    return jnp.where(jnp.isnan(weight) | jnp.isnan(total), jnp.nan, ratio)


@declare_optimizer("contrib", "Defazio et al., 2024", optax="contrib",
    listed_with="schedule_free_adamw", signature="schedule_free(base_optimizer, ...)")
@hyperparameters(learning_rate="schedule", b1="number", weight_lr_power="number")
def schedule_free(base_optimizer: GradientTransformation, learning_rate: ScalarOrSchedule,
                  b1: float = 0.9, weight_lr_power: float = 2.0,
                  state_dtype: Optional[Any] = None) -> GradientTransformationExtraArgs:
    """Schedule-Free (Defazio et al., 2024): interpolation and averaging instead of momentum.

    With the base optimizer's update ``u_t`` (for SGD ``-lr g_t``), the
    parameters held by the caller ``y_t``, and ``c_t = w_t / sum_{k<=t} w_k``
    where ``w_t = max_{k<=t}(lr_k)**weight_lr_power``::

        z_{t+1} = z_t + u_t                       (the base optimizer's step)
        x_t     = (y_t - (1 - b1) z_t) / b1       (recomputed, not stored)
        x_{t+1} = (1 - c_t) x_t + c_t z_{t+1}
        y_{t+1} = b1 x_{t+1} + (1 - b1) z_{t+1}

    and the update returned is ``y_{t+1} - y_t``. Evaluate at ``x``
    (:func:`schedule_free_eval_params`). Switch the base optimizer's momentum
    off (e.g. ``adam(lr, b1=0.0)``): the interpolation replaces it. The
    schedule ``learning_rate`` (used only for the averaging weights; give the
    same one to the base optimizer) is evaluated at the step count counted
    from 1. Paper: Defazio, Yang, Mehta, Mishchenko, Khaled and Cutkosky,
    "The Road Less Scheduled" (2024).

    Args:
      base_optimizer: the optimizer whose updates step ``z`` (functrain's,
        optax's, or any object with ``init`` and ``update``); it receives the
        extra ``update`` keywords it accepts.
      learning_rate: the learning rate (or schedule, with warmup but without
        decay) of the base optimizer.
      b1: the interpolation weight ``b1``, in ``(0, 1]``.
      weight_lr_power: the power of the largest learning rate so far in the
        averaging weights (down-weights the warmup steps).
      state_dtype: the dtype of ``z``; ``None`` keeps each parameter's dtype.

    Returns:
      A ``GradientTransformationExtraArgs`` whose ``update`` needs the params
      and whose state is :class:`ScheduleFreeState`.

    >>> import jax, jax.numpy as jnp, functrain
    >>> opt = functrain.contrib.schedule_free(functrain.sgd(0.1), learning_rate=0.1)
    >>> params = {'w': jnp.array([1.0, -2.0])}
    >>> state = opt.init(params)
    >>> for _ in range(3):
    ...     grads = jax.grad(lambda p: jnp.sum(p['w'] ** 2))(params)
    ...     updates, state = opt.update(grads, state, params)
    ...     params = functrain.apply_updates(params, updates)
    >>> functrain.contrib.schedule_free_eval_params(state, params)['w']
    Array([ 0.64586663, -1.2917333 ], dtype=float32)
    """
    check_transformation(base_optimizer, "schedule_free", "base_optimizer")
    check_range("b1", b1, 0.0, 1.0, high_inclusive=True, owner="schedule_free")
    if not isinstance(b1, jax.core.Tracer) and b1 == 0:
        raise ValueError("schedule_free: b1 must be > 0 (x is recovered by dividing by b1), "
                         "got 0.")

    def leaf(u: Array, s: Any, y: Array, ck: Array) -> tuple:
        z = s.z + u
        if state_dtype is not None:  # z as stored (optax's numbers with a low state_dtype)
            z = z.astype(state_dtype).astype(z.dtype)
        x = (y - (1.0 - b1) * s.z) / b1
        x = (1.0 - ck) * x + ck * z
        return b1 * x + (1.0 - b1) * z - y, s._replace(z=z)

    def copy_leaf(p: Array) -> tuple:
        return (jnp.array(p, dtype=state_dtype or p.dtype, copy=True),)

    stage = LeafStage(name="schedule_free", update_leaf=leaf, state_cls=_Iterate,
                      leaf_fields=("z",), init_leaf=copy_leaf,
                      prepare=lambda glob, _, ck: (ck, glob), extra_args=("ck",),
                      checks=LeafChecks(needs_params=True))

    def init_fn(params: Params) -> ScheduleFreeState:
        dtype = params_float_dtype(params, "lowest")
        return ScheduleFreeState(
            b1=jnp.asarray(b1, dtype), weight_sum=jnp.zeros([], dtype),
            step_count=jnp.ones([], jnp.int32), max_lr=jnp.zeros([], dtype),
            base_optimizer_state=base_optimizer.init(params), z=stage.init_state(params).z)

    def update_fn(updates: Updates, state: ScheduleFreeState, params: Optional[Params] = None,
                  **extra_args: Any) -> tuple[Updates, ScheduleFreeState]:
        check_state_type(state, ScheduleFreeState, "schedule_free")
        if params is None:
            raise needs_params_error("schedule_free")
        lr = learning_rate
        if callable(learning_rate):
            lr = jnp.asarray(learning_rate(state.step_count), state.max_lr.dtype)
        max_lr = jnp.maximum(state.max_lr, lr)
        weight = max_lr ** weight_lr_power
        weight_sum = state.weight_sum + weight
        base_updates, base_state = call_update(base_optimizer, updates,
                                               state.base_optimizer_state, params, extra_args)
        new_updates, (iterate,) = run_block(
            (stage,), base_updates, (_Iterate(state.z),), params,
            {"ck": _averaging_weight(weight, weight_sum)})
        return new_updates, ScheduleFreeState(
            b1=state.b1, weight_sum=weight_sum, step_count=safe_increment(state.step_count),
            max_lr=max_lr, base_optimizer_state=base_state, z=iterate.z)

    return GradientTransformationExtraArgs(init_fn, update_fn)


def _warmup(learning_rate: Any, warmup_steps: Optional[int], owner: str) -> Any:
    """``learning_rate``, or a linear warmup from 0 to it over ``warmup_steps`` steps."""
    if warmup_steps is None:
        return learning_rate
    check_range("warmup_steps", warmup_steps, 1.0, owner=owner)
    return linear_schedule(0.0, learning_rate, warmup_steps)


@declare_optimizer("contrib", "Defazio et al., 2024", optax="contrib",
    listed_with="schedule_free_adamw", signature="schedule_free_sgd(...)")
@hyperparameters(learning_rate="number", warmup_steps="number or None", b1="number",
                 weight_decay="number or None", weight_lr_power="number")
def schedule_free_sgd(learning_rate: float = 1.0, warmup_steps: Optional[int] = None,
                      b1: float = 0.9, weight_decay: Optional[float] = None,
                      weight_lr_power: float = 2.0, state_dtype: Optional[Any] = None
                      ) -> GradientTransformationExtraArgs:
    """Schedule-Free SGD (Defazio et al., 2024): :func:`schedule_free` around plain SGD.

    The base optimizer steps ``z_{t+1} = z_t - lr_t (g_t + weight_decay y_t)``
    (the decay is multiplied by the learning rate, as in PyTorch); see
    :func:`schedule_free` for the interpolation and averaging. Paper: Defazio
    et al., "The Road Less Scheduled" (2024).

    Args:
      learning_rate: the SGD learning rate (the peak value after warmup).
      warmup_steps: length of a linear warmup from 0, a positive int; ``None``
        for none.
      b1: the interpolation weight, in ``(0, 1]``.
      weight_decay: the weight decay added to the gradients, or ``None``.
      weight_lr_power: the power of the learning rate in the averaging weights.
      state_dtype: the dtype of ``z``; ``None`` keeps the parameters'.

    Returns:
      A ``GradientTransformationExtraArgs`` whose state is :class:`ScheduleFreeState`.

    >>> import jax, jax.numpy as jnp, functrain
    >>> opt = functrain.contrib.schedule_free_sgd()
    >>> params = jnp.array([1., 2., 3.])
    >>> state = opt.init(params)
    >>> grads = jax.grad(lambda x: jnp.sum(x ** 2))(params)
    >>> updates, state = opt.update(grads, state, params)
    >>> [round(float(v), 5) for v in
    ...  functrain.contrib.schedule_free_eval_params(state, params + updates)]
    [-1.0, -2.0, -3.0]
    """
    learning_rate = _warmup(learning_rate, warmup_steps, "schedule_free_sgd")
    base = sgd(learning_rate)
    if weight_decay is not None:
        base = chain(add_decayed_weights(weight_decay), base)
    return schedule_free(base, learning_rate=learning_rate, b1=b1,
                         weight_lr_power=weight_lr_power, state_dtype=state_dtype)


@declare_optimizer("contrib", "Defazio et al., 2024", optax="contrib", summary=(
    "Schedule-Free AdamW (Defazio et al., 2024): no schedule; evaluate at "
    "`schedule_free_eval_params(state, params)`. `schedule_free` wraps any optimizer; "
    "`schedule_free_sgd` is its SGD."), signature=(
    "schedule_free_adamw(learning_rate=0.0025, warmup_steps=None, b1=0.9, b2=0.999, ...)"))
@hyperparameters(learning_rate="number", warmup_steps="number or None", b1="number",
                 b2="number", eps="number", weight_decay="number", weight_lr_power="number")
@shared_args()
def schedule_free_adamw(learning_rate: float = 0.0025, warmup_steps: Optional[int] = None,
                        b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8,
                        weight_decay: float = 0.0, weight_lr_power: float = 2.0,
                        state_dtype: Optional[Any] = None) -> GradientTransformationExtraArgs:
    """Schedule-Free AdamW (Defazio et al., 2024): :func:`schedule_free` around AdamW without momentum.

    The base optimizer is AdamW with ``b1 = 0``: ``nu = b2 nu + (1 - b2) |g|^2``,
    ``z_{t+1} = z_t - lr_t (g / (sqrt(nu / (1 - b2^t)) + eps) + weight_decay
    y_t)`` (:func:`functrain.scale_by_rms` with bias correction, which keeps no
    first moment); ``b1`` is the schedule-free interpolation weight instead.
    See :func:`schedule_free`. Paper: Defazio et al., "The Road Less
    Scheduled" (2024).

    Args:
      learning_rate: the AdamW learning rate (the peak value after warmup).
      warmup_steps: length of a linear warmup from 0, a positive int; ``None``
        for none.
      b1: the interpolation weight, in ``(0, 1]``.
      <shared: b2>
      eps: added to the root of the second moment, ``>= 0``.
      weight_decay: the decoupled weight decay, ``>= 0``.
      weight_lr_power: the power of the learning rate in the averaging weights.
      state_dtype: the dtype of ``z``; ``None`` keeps the parameters'.

    Returns:
      A ``GradientTransformationExtraArgs`` whose state is
      :class:`ScheduleFreeState` (the base state: ``ScaleByRmsWithCountState``,
      and two ``EmptyState`` s).

    >>> import jax, jax.numpy as jnp, functrain
    >>> opt = functrain.contrib.schedule_free_adamw(1.0)
    >>> params = jnp.array([1., 2., 3.])
    >>> state = opt.init(params)
    >>> grads = jax.grad(lambda x: jnp.sum(x ** 2))(params)
    >>> updates, state = opt.update(grads, state, params)
    >>> functrain.contrib.schedule_free_eval_params(state, params + updates)
    Array([0., 1., 2.], dtype=float32)
    """
    check_betas("schedule_free_adamw", b2=b2)
    check_nonnegative("schedule_free_adamw", eps=eps, weight_decay=weight_decay)
    learning_rate = _warmup(learning_rate, warmup_steps, "schedule_free_adamw")
    base = chain(scale_by_rms(decay=b2, eps=eps, eps_in_sqrt=False, bias_correction=True),
                 add_decayed_weights(weight_decay), scale_by_learning_rate(learning_rate))
    return schedule_free(base, learning_rate=learning_rate, b1=b1,
                         weight_lr_power=weight_lr_power, state_dtype=state_dtype)


__all__ = ["ScheduleFreeState", "schedule_free", "schedule_free_adamw",
           "schedule_free_eval_params", "schedule_free_sgd"]
