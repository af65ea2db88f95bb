"""EMA-Nesterov: a Nesterov look-ahead along a moving average of the parameters' displacement,
around any optimizer (modded-nanogpt's optimizer track, records #39 to #46).

The wrapper keeps ``L``, an exponential moving average of how far the weights moved per step,
and takes each gradient at the look-ahead point ``y = x + s L`` instead of at the weights
``x``; the inner optimizer steps from ``y``. In optax's functional form the params you hold
(and differentiate at) are the look-ahead point ``y``, as schedule-free's are its ``y``; read
the weights ``x`` (for evaluation) with :func:`ema_nesterov_eval_params`. optax has nothing
like it.

What it costs: one float32 copy of the params (``L``) and a scalar.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp

from functrain.arg_checks import (check_range, check_state_type, check_transformation,
                                  needs_params_error)
from functrain.declarations import declare_optimizer, hyperparameters
from functrain.engine.protocol import (GradientTransformation, GradientTransformationExtraArgs,
                                       OptState, Params, ScalarOrSchedule, Updates, call_update)
from functrain.engine.counts import safe_increment
from functrain import tree as ft

Array = jax.Array

__all__ = ["EmaNesterovState", "ema_nesterov", "ema_nesterov_eval_params"]


class EmaNesterovState(NamedTuple):
    """State of :func:`ema_nesterov`.

    Attributes:
      count: the number of steps taken (int32).
      lookahead: ``L``, the moving average of the weights' displacement per step (float32,
        or the params' dtype if wider).
      shift: ``s``, the look-ahead step the current params hold (``y = x + s L``).
      inner_state: the wrapped optimizer's state.

    >>> import jax.numpy as jnp, functrain
    >>> opt = functrain.contrib.ema_nesterov(functrain.sgd(0.1), 0.3)
    >>> opt.init({'w': jnp.ones(2)}).lookahead
    {'w': Array([0., 0.], dtype=float32)}
    """

    count: Array
    lookahead: Any
    shift: Array
    inner_state: OptState


def _wide(x: Array) -> Array:
    """``x`` in the dtype leaf math runs in (float32 for 16-bit floats)."""
    x = jnp.asarray(x)
    return x.astype(ft.compute_dtype(x.dtype))


@declare_optimizer("beyond optax", "Yau et al., 2026", optax=None, summary=(
    "EMA-Nesterov (Yau et al., 2026) around any optimizer: gradients taken at `x + s L`, `L` "
    "an EMA of the weights' displacement; the params held are that look-ahead point, "
    "`ema_nesterov_eval_params` reads the weights."),
    signature="ema_nesterov(optimizer, lookahead_stepsize, lookahead_ema=0.99)")
@hyperparameters(lookahead_stepsize="schedule", lookahead_ema="number")
def ema_nesterov(optimizer: GradientTransformation, lookahead_stepsize: ScalarOrSchedule,
                 lookahead_ema: float = 0.99) -> GradientTransformationExtraArgs:
    """EMA-Nesterov around ``optimizer`` (Yau et al., 2026, arXiv 2605.25395).

    Rule, with ``x_t`` the weights, ``L_0 = 0`` and ``s_t = lookahead_stepsize(t)``: the
    gradient is taken at ``y_t = x_t + s_t L_t``; the inner optimizer steps from there,
    ``x_{t+1} = y_t + D_t``; then ``L_{t+1} = e L_t + (1 - e) (x_{t+1} - x_t)`` with ``e =
    lookahead_ema``. The params this wrapper's updates produce are the look-ahead points
    ``y`` (``update`` returns ``y_{t+1} - y_t``), so the usual loop differentiates at the
    right place; :func:`ema_nesterov_eval_params` gives ``x = y - s L``. ``update`` needs the
    params. As modded-nanogpt's record code: look-ahead ``.3 * lr / max_lr`` from step 300
    to 1950, ``e = .99``, which is ``lookahead_stepsize=lambda t: jnp.where((t >= 300) & (t <
    1950), .3 * lr(t) / max_lr, 0.)``.

    Args:
      optimizer: the inner optimizer (any transformation).
      lookahead_stepsize: ``s``: a number, or a schedule of the step count (counted from 0;
        ``s_0`` multiplies ``L_0 = 0``, so the first step is the inner optimizer's).
      lookahead_ema: ``e``, the displacement average's decay, in ``[0, 1)``.

    Returns:
      A ``GradientTransformationExtraArgs`` whose state is :class:`EmaNesterovState`.

    >>> import jax.numpy as jnp, functrain
    >>> opt = functrain.contrib.ema_nesterov(functrain.sgd(1.0), 1.0, lookahead_ema=0.5)
    >>> y = jnp.array([0.0])
    >>> state = opt.init(y)
    >>> u, state = opt.update(jnp.array([1.0]), state, y)  # x: -1; L: -0.5; y = x + L
    >>> y = functrain.apply_updates(y, u)
    >>> y, functrain.contrib.ema_nesterov_eval_params(state, y)
    (Array([-1.5], dtype=float32), Array([-1.], dtype=float32))
    """
    owner = "ema_nesterov"
    check_transformation(optimizer, owner, "optimizer")
    check_range("lookahead_ema", lookahead_ema, 0.0, 1.0, owner=owner)
    stepsize = lookahead_stepsize if callable(lookahead_stepsize) else (
        lambda count: lookahead_stepsize)

    def init_fn(params: Params) -> EmaNesterovState:
        return EmaNesterovState(
            count=jnp.zeros([], jnp.int32),
            lookahead=jax.tree_util.tree_map(lambda p: jnp.zeros_like(_wide(p)), params),
            shift=jnp.asarray(stepsize(jnp.zeros([], jnp.int32)), jnp.result_type(float)),
            inner_state=optimizer.init(params))

    def update_fn(updates: Updates, state: EmaNesterovState, params: Optional[Params] = None,
                  **extra_args: Any) -> tuple[Updates, EmaNesterovState]:
        check_state_type(state, EmaNesterovState, owner)
        if params is None:
            raise needs_params_error(owner)
        ft.check_structure(params, updates, "updates", "params")
        inner_updates, inner = call_update(optimizer, updates, state.inner_state, params,
                                           extra_args)
        count = safe_increment(state.count)
        shift = jnp.asarray(stepsize(count), state.shift.dtype)

        # x_{t+1} - x_t = D_t + s_t L_t; the params then move to the next look-ahead point
        lookahead = jax.tree_util.tree_map(
            lambda d, look: lookahead_ema * look + (1 - lookahead_ema) * (
                _wide(d) + state.shift * look), inner_updates, state.lookahead)
        moved = jax.tree_util.tree_map(
            lambda d, look: (_wide(d) + shift * look).astype(jnp.result_type(d)),
            inner_updates, lookahead)
        return moved, EmaNesterovState(count=count, lookahead=lookahead, shift=shift,
                                       inner_state=inner)

    return GradientTransformationExtraArgs(init_fn, update_fn)


def ema_nesterov_eval_params(state: EmaNesterovState, params: Params) -> Params:
    """The weights ``x = y - s L`` of :func:`ema_nesterov`, from the held look-ahead point ``y``.

    Args:
      state: an :class:`EmaNesterovState`.
      params: the params held in training (the look-ahead point ``y``).

    Returns:
      A tree like ``params``, in each leaf's dtype: where to evaluate.

    Raises:
      ValueError: ``state`` is not an :class:`EmaNesterovState`, or its ``lookahead`` does
        not fit ``params`` (named by key path).

    >>> import jax.numpy as jnp, functrain
    >>> opt = functrain.contrib.ema_nesterov(functrain.sgd(1.0), 0.5)
    >>> params = jnp.array([2.0])
    >>> functrain.contrib.ema_nesterov_eval_params(opt.init(params), params)
    Array([2.], dtype=float32)
    """
    if not isinstance(state, EmaNesterovState):
        raise ValueError(f"ema_nesterov_eval_params needs an EmaNesterovState (the state of an "
                         f"ema_nesterov wrapper), got {type(state).__name__}.")
    ft.check_structure(params, state.lookahead, "state.lookahead", "params")
    return jax.tree_util.tree_map(
        lambda y, look: (_wide(y) - state.shift * look).astype(jnp.result_type(y)),
        params, state.lookahead)
