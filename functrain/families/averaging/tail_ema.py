"""A tail EMA of the weights for any optimizer: an average over the last part of training,
read out at evaluation (modded-nanogpt's optimizer track, records #45 and #46).

Late in training, with the learning rate cooling, the weights oscillate around the floor of
the loss's valley; an exponential moving average of them over that tail sits nearer the floor.
The record's readout keeps ``ema <- ema + (w - ema) / tau`` from step ``start_step`` (where
``ema`` starts as the weights) until ``end_step``, and evaluates at ``(1 - blend) w + blend
ema`` (``tau = 150``, ``blend = 0.6``, the token embedding left out). Training itself is
unchanged: the optimizer's updates pass through, bit for bit. optax has no such wrapper.

What it costs: one float32 copy of the included params (the leaves ``mask`` selects); one
``jnp.where`` per leaf per step.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp

from functrain import tree as ft
from functrain.arg_checks import (check_range, check_state_type, check_transformation,
                                  needs_params_error)
from functrain.declarations import declare_optimizer, hyperparameters
from functrain.engine.protocol import (GradientTransformation, GradientTransformationExtraArgs,
                                       MaskOrFn, OptState, Params, Updates, call_update)
from functrain.engine.counts import safe_increment
from functrain.tree.checks import MaskedNode, resolve_mask

Array = jax.Array

__all__ = ["TailEmaState", "tail_ema", "tail_ema_eval_params"]


class TailEmaState(NamedTuple):
    """State of :func:`tail_ema`.

    Attributes:
      count: the number of steps taken (int32).
      ema: the moving average of the weights after each step of the tail (float32, or the
        params' dtype if wider; ``MaskedNode()`` for leaves the mask leaves out); the weights
        themselves until the tail starts.
      start_step: the first step (counted from 1) of the tail: the readout blends from
        there on.
      blend: the weight of ``ema`` in the readout.
      inner_state: the wrapped optimizer's state.

    >>> import jax.numpy as jnp, functrain
    >>> opt = functrain.contrib.tail_ema(functrain.sgd(0.1), start_step=10)
    >>> opt.init({'w': jnp.ones(2)}).ema
    {'w': Array([1., 1.], dtype=float32)}
    """

    count: Array
    ema: Any
    start_step: Array
    blend: Array
    inner_state: OptState


def _wide(x: Array) -> Array:
    """``x`` in the dtype leaf math runs in (float32 for 16-bit floats)."""
    x = jnp.asarray(x)
    return x.astype(ft.compute_dtype(x.dtype))


@declare_optimizer("beyond optax", "modded-nanogpt, 2026", optax=None, summary=(
    "A tail EMA of the weights for any optimizer (modded-nanogpt's optimizer-track records): "
    "`ema <- ema + (w - ema) / tau` from `start_step`, read out as `(1 - blend) w + blend ema` "
    "by `tail_ema_eval_params`; the updates pass through."),
    signature="tail_ema(optimizer, tau=150.0, start_step=0, end_step=None, blend=0.6, mask=None)")
@hyperparameters(tau="number", blend="number")
def tail_ema(optimizer: GradientTransformation, tau: float = 150.0, start_step: int = 0,
             end_step: Optional[int] = None, blend: float = 0.6,
             mask: Optional[MaskOrFn] = None) -> GradientTransformationExtraArgs:
    """Keep a tail EMA of the weights beside ``optimizer`` (modded-nanogpt record #45).

    Rule, with ``w_s`` the weights after step ``s`` (counted from 1): at ``s = start_step``,
    ``ema = w_s``; for ``start_step < s < end_step``, ``ema <- ema + (w_s - ema) / tau``;
    after ``end_step`` (exclusive) the average stays. :func:`tail_ema_eval_params` reads
    ``(1 - blend) w + blend ema`` (the weights alone before the tail starts). The updates
    are the optimizer's, untouched. ``update`` needs the params (the weights after a step
    are ``params + updates``). Reference: modded-nanogpt, 2026, the optimizer track's
    results #45 and #46 (Tail-EMA readout: ``tau = 150``, ``blend = 0.6``, from step 2400
    of 2690).

    Args:
      optimizer: any transformation (its updates pass through).
      tau: the average's horizon in steps, ``>= 1`` (``1``: the last weights).
      start_step: the step the tail starts at (counted from 1), ``>= 0``.
      end_step: the step it stops at (exclusive), or ``None`` for never.
      blend: the average's weight in the readout, in ``[0, 1]``.
      mask: which leaves to average (a tree of bools or a function of the params, as
        :func:`functrain.masked`); ``None``: all. The others read out as the weights
        (the record leaves out the token embedding).

    Returns:
      A ``GradientTransformationExtraArgs`` whose state is :class:`TailEmaState`.

    >>> import jax.numpy as jnp, functrain
    >>> opt = functrain.contrib.tail_ema(functrain.sgd(1.0), tau=2.0, start_step=1)
    >>> params = jnp.array([0.0])
    >>> state = opt.init(params)
    >>> for g in (1.0, 1.0):  # weights -1 then -2; ema -1 then -1.5
    ...     u, state = opt.update(jnp.array([g]), state, params)
    ...     params = functrain.apply_updates(params, u)
    >>> functrain.contrib.tail_ema_eval_params(state, params)  # 0.4 * -2 + 0.6 * -1.5
    Array([-1.7], dtype=float32)
    """
    owner = "tail_ema"
    check_transformation(optimizer, owner, "optimizer")
    check_range("tau", tau, 1.0, owner=owner)
    check_range("start_step", start_step, 0.0, owner=owner)
    check_range("blend", blend, 0.0, 1.0, high_inclusive=True, owner=owner)
    for name, value in (("start_step", start_step), ("end_step", end_step)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
            raise TypeError(f"{owner}: {name} must be an int, got {type(value).__name__} "
                            f"{value!r:.40}.")

    def included(params: Params) -> list:
        return resolve_mask(mask, params, owner)

    def init_fn(params: Params) -> TailEmaState:
        leaves, treedef = jax.tree_util.tree_flatten(params)
        ema = [_wide(jnp.asarray(p)) if keep else MaskedNode()
               for p, keep in zip(leaves, included(params))]
        return TailEmaState(count=jnp.zeros([], jnp.int32), ema=treedef.unflatten(ema),
                            start_step=jnp.asarray(start_step, jnp.int32),
                            blend=jnp.asarray(blend, jnp.result_type(float)),
                            inner_state=optimizer.init(params))

    def update_fn(updates: Updates, state: TailEmaState, params: Optional[Params] = None,
                  **extra_args: Any) -> tuple[Updates, TailEmaState]:
        check_state_type(state, TailEmaState, owner)
        if params is None:
            raise needs_params_error(owner)
        updates, inner = call_update(optimizer, updates, state.inner_state, params, extra_args)
        step = state.count + 1
        first = step == start_step
        active = step >= start_step
        if end_step is not None:
            active = active & (step < end_step)

        def average(e: Any, p: Array, u: Array) -> Any:
            if isinstance(e, MaskedNode):
                return e
            w = _wide(p) + _wide(u)
            moved = jnp.where(first, w, e + (w - e) / tau)
            return jnp.where(active, moved, e).astype(e.dtype)

        ema = jax.tree_util.tree_map(average, state.ema, params, updates,
                                     is_leaf=lambda x: isinstance(x, MaskedNode))
        return updates, state._replace(count=safe_increment(state.count), ema=ema,
                                       inner_state=inner)

    return GradientTransformationExtraArgs(init_fn, update_fn)


def tail_ema_eval_params(state: TailEmaState, params: Params) -> Params:
    """The readout of :func:`tail_ema`: ``(1 - blend) params + blend ema`` once the tail has
    started (``count >= start_step``), the params before; leaves the mask left out read as
    the params.

    Args:
      state: a :class:`TailEmaState` (``tail_ema``'s state, or one nested inside a chain:
        pass that element).
      params: the current training weights.

    Returns:
      A tree like ``params``, in each leaf's dtype.

    Raises:
      ValueError: ``state`` is not a :class:`TailEmaState`, or its ``ema`` does not fit
        ``params`` (named by key path).

    >>> import jax.numpy as jnp, functrain
    >>> opt = functrain.contrib.tail_ema(functrain.sgd(1.0), start_step=5)
    >>> params = jnp.array([1.0])
    >>> functrain.contrib.tail_ema_eval_params(opt.init(params), params)  # before the tail
    Array([1.], dtype=float32)
    """
    if not isinstance(state, TailEmaState):
        raise ValueError(f"tail_ema_eval_params needs a TailEmaState (the state of a tail_ema "
                         f"wrapper), got {type(state).__name__}.")
    masked_node = lambda x: isinstance(x, MaskedNode)  # noqa: E731
    if (jax.tree_util.tree_structure(state.ema, is_leaf=masked_node)
            != jax.tree_util.tree_structure(params)):
        ft.check_structure(params, state.ema, "state.ema", "params")  # names the paths
    started = state.count >= state.start_step

    def read(p: Array, e: Any) -> Array:
        if isinstance(e, MaskedNode):
            return p
        mixed = (1 - state.blend) * _wide(p) + state.blend * e
        return jnp.where(started & (state.count > 0), mixed, _wide(p)).astype(jnp.result_type(p))

    return jax.tree_util.tree_map(read, params, state.ema, is_leaf=masked_node)
