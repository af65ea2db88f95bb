"""Scaling by numbers: a constant, a schedule, the learning rate, decayed weights, Polyak's step.

Per-leaf stages whose per-step scalar (a schedule's value, the Polyak step)
is computed once by ``prepare``; the engine lifts them over the tree.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from functrain.arg_checks import check_bools, check_range, check_state_type, missing_argument_error
from functrain.declarations import hyperparameters
from functrain import tree as ft
from functrain.engine.protocol import (EmptyState, GradientTransformation, MaskOrFn, OptState,
                                       Params, ScalarOrSchedule, Updates)
from functrain.engine.stage import LeafChecks, LeafStage
from functrain.engine.counts import safe_increment, zero_count
from functrain.engine.program import identity, in_masked_state, stage_transform, with_guard

Array = jax.Array


class ScaleByScheduleState(NamedTuple):
    """State of :func:`scale_by_schedule`: the step count fed to the schedule.

    Attributes:
      count: the number of steps taken (int32); the schedule is evaluated at it.

    >>> import jax.numpy as jnp
    >>> scale_by_schedule(lambda c: 0.1).init([jnp.zeros(1)])
    ScaleByScheduleState(count=Array(0, dtype=int32))
    """

    count: Array


class WeightDecayScheduleState(NamedTuple):
    """State of :func:`add_decayed_weights` with a scheduled decay: the step count.

    Attributes:
      count: the number of steps taken (int32); the decay schedule is evaluated
        at it.

    >>> import jax.numpy as jnp
    >>> add_decayed_weights(lambda c: 1e-4).init([jnp.ones(2)])
    WeightDecayScheduleState(count=Array(0, dtype=int32))
    """

    count: Array


ScaleState = EmptyState
AddDecayedWeightsState = EmptyState
ScaleByPolyakState = EmptyState
SetToZeroState = EmptyState


def scale(step_size: Any) -> GradientTransformation:
    """Multiply every update by a fixed ``step_size``.

    The update is ``step_size * g``.

    Args:
      step_size: the factor, a number or a scalar array (negative to turn a
        gradient into a descent direction, e.g. ``-learning_rate``).

    Returns:
      A ``GradientTransformation`` that keeps no state (``ScaleState``, i.e.
      ``EmptyState``).

    >>> import jax.numpy as jnp
    >>> tx = scale(-0.5)
    >>> tx.update({'w': jnp.array([2.])}, tx.init({'w': jnp.array([0.])}))[0]
    {'w': Array([-1.], dtype=float32)}
    """
    return stage_transform(LeafStage(name="scale", update_leaf=lambda g, s, p, c: (g * step_size,
    ())))


def scale_by_schedule(step_size_fn: Callable[[Array], Array]) -> GradientTransformation:
    """Multiply updates by ``step_size_fn(count)``, counting steps from 0.

    The update at step ``t`` (from 0) is ``step_size_fn(t) * g``.

    Args:
      step_size_fn: a function of the step count (an int32 scalar array)
        returning the scalar factor, e.g. a :mod:`functrain.schedules` schedule.
        Anything not callable raises ``TypeError``.

    Returns:
      A ``GradientTransformation`` whose state is :class:`ScaleByScheduleState`.

    >>> import jax.numpy as jnp
    >>> tx = scale_by_schedule(lambda count: 1.0 / (count + 1))
    >>> state = tx.init([jnp.zeros(1)])
    >>> _, state = tx.update([jnp.ones(1)], state)
    >>> tx.update([jnp.ones(1)], state)[0]
    [Array([0.5], dtype=float32)]
    """
    if not callable(step_size_fn):
        raise TypeError(f"scale_by_schedule: step_size_fn must be a function of the step "
                        f"count, got {type(step_size_fn).__name__}.")

    def prepare(glob: dict, _: Any) -> tuple:
        return step_size_fn(glob["count"]), {"count": safe_increment(glob["count"])}

    return stage_transform(LeafStage(
        name="scale_by_schedule", update_leaf=lambda g, s, p, step: (g * step, ()),
        state_cls=ScaleByScheduleState,
        leaf_fields=(), init_leaf=lambda p: (), init_global=zero_count, prepare=prepare))


@hyperparameters(learning_rate="schedule or None")
def scale_by_learning_rate(learning_rate: Optional[ScalarOrSchedule] = None, *,
                           flip_sign: bool = True) -> GradientTransformation:
    """Scale by ``-learning_rate`` (or ``+`` with ``flip_sign=False``); accepts schedules.

    The update is ``-learning_rate * g``, the last stage of most optimizers.

    Args:
      learning_rate: a number, a scalar array, or a schedule (a function of the
        step count, counted from 0); ``None`` (the default, as optax) leaves
        the updates unscaled: the result is :func:`identity`, whatever
        ``flip_sign``.
      flip_sign: multiply by ``-learning_rate`` (default ``True``, gradient
        descent); ``False`` multiplies by ``+learning_rate``.

    Returns:
      A ``GradientTransformation``: :func:`scale` (no state) for a fixed rate,
      :func:`scale_by_schedule` (state :class:`ScaleByScheduleState`) for a
      schedule, or ``identity()`` for ``None``.

    >>> import jax.numpy as jnp
    >>> tx = scale_by_learning_rate(0.1)
    >>> tx.update([jnp.array(2.)], tx.init([jnp.array(0.)]))[0]
    [Array(-0.2, dtype=float32)]
    >>> unscaled = scale_by_learning_rate()
    >>> unscaled.update([jnp.array(2.)], unscaled.init([jnp.array(0.)]))[0]
    [Array(2., dtype=float32)]
    """
    if learning_rate is None:
        return identity()
    sign = -1 if flip_sign else 1
    if callable(learning_rate):
        return scale_by_schedule(lambda count: sign * learning_rate(count))
    return scale(sign * learning_rate)


@hyperparameters(learning_rate="schedule or None")
def learning_rate_stage(learning_rate: Optional[ScalarOrSchedule]) -> GradientTransformation:
    """``scale_by_learning_rate``, or ``identity()`` for ``None`` (as optax does).

    Args:
      learning_rate: a number, scalar array or schedule; or ``None`` to leave the
        updates unscaled (for optimizers whose learning rate is applied later).

    Returns:
      :func:`scale_by_learning_rate` of ``learning_rate`` (with the sign flipped),
      or ``identity()`` when it is ``None``.

    >>> import jax.numpy as jnp
    >>> tx = learning_rate_stage(None)
    >>> tx.update([jnp.array(2.)], tx.init([jnp.array(0.)]))[0]
    [Array(2., dtype=float32)]
    """
    return identity() if learning_rate is None else scale_by_learning_rate(learning_rate)


@hyperparameters(weight_decay="schedule")
def add_decayed_weights(weight_decay: ScalarOrSchedule = 0.0,
                        mask: Optional[MaskOrFn] = None, *,
                        cautious: bool = False) -> GradientTransformation:
    """Add ``weight_decay * params`` to the updates, where ``mask`` is True.

    ``weight_decay`` is a number, a scalar array, or a schedule of the step
    count. ``mask`` is a tree (or prefix) of bools, or a function of the params
    returning one; masked-out leaves pass through unchanged.

    The update is ``g + weight_decay * p`` (decoupled weight decay when placed
    before the learning rate, as in AdamW: Loshchilov & Hutter, 2019, "Decoupled
    Weight Decay Regularization"). ``update`` needs the params.

    With ``cautious=True`` (beyond optax) the decay is Cautious Weight Decay (Chen et al.,
    2025, "Cautious Weight Decay", arXiv 2510.12402): ``g + weight_decay * I(g * p >= 0) *
    p``, the decay kept only on the entries where the update ``g`` (the descent direction
    the learning rate then scales, so this stage goes between an optimizer's direction and
    its learning rate) has the param's sign, i.e. where the step already shrinks the
    weight (``Re(g * conj(p)) >= 0`` for complex leaves). No state, no new hyperparameter.

    Args:
      weight_decay: the decay rate, ``>= 0`` (default 0: no decay); a number, a
        scalar array, or a schedule of the step count (counted from 0).
      mask: where to add the decay: ``None`` (default) for every leaf, a tree of
        Python bools shaped like the params or a prefix of it (a bool at a node
        covers its whole subtree), or a function of the params returning one.
        Leaves where it is False pass through unchanged and hold no state.
      cautious: decay only where the update and the param agree in sign (Cautious
        Weight Decay); default ``False``, optax's decay.

    Returns:
      A ``GradientTransformation``: with a fixed decay it keeps no state
      (``AddDecayedWeightsState``, i.e. ``EmptyState``); with a schedule its
      state is :class:`WeightDecayScheduleState`. With a ``mask`` that state is
      inside ``MaskedState(inner_state=...)``, as optax's.

    >>> import jax.numpy as jnp
    >>> tx = add_decayed_weights(0.1, mask={'w': True, 'b': False})
    >>> params = {'w': jnp.array([1.]), 'b': jnp.array([1.])}
    >>> tx.update({'w': jnp.zeros(1), 'b': jnp.zeros(1)}, tx.init(params), params)[0]
    {'b': Array([0.], dtype=float32), 'w': Array([0.1], dtype=float32)}
    """
    check_range("weight_decay", weight_decay, 0.0, owner="add_decayed_weights")
    return decayed_weights_stage(weight_decay, mask, cautious=cautious)


def _decayed(g: Array, p: Array, weight_decay: Any, cautious: bool) -> Array:
    """``g + weight_decay * p``; cautious: only where ``Re(g * conj(p)) >= 0``."""
    if cautious:
        p = jnp.where(jnp.real(g * jnp.conj(p)) >= 0, p, jnp.zeros_like(p))
    return g + weight_decay * p


@hyperparameters(weight_decay="schedule")
def decayed_weights_stage(weight_decay: ScalarOrSchedule,
                          mask: Optional[MaskOrFn] = None, *,
                          cautious: bool = False) -> GradientTransformation:
    """:func:`add_decayed_weights` without the sign check (Fromage shrinks with ``< 0``).

    The update is ``g + weight_decay * p`` (``cautious``: only where ``g`` and ``p`` agree
    in sign, as :func:`add_decayed_weights`); ``update`` needs the params.

    Args:
      weight_decay: the decay rate, of any sign; a number, a scalar array, or a
        schedule of the step count (counted from 0).
      mask: where to add the decay: ``None`` (default) for every leaf, a tree of
        Python bools shaped like the params or a prefix of it (a bool at a node
        covers its whole subtree), or a function of the params returning one.
        Leaves where it is False pass through unchanged and hold no state.
      cautious: decay only where the update and the param agree in sign.

    Returns:
      A ``GradientTransformation``, stateless for a fixed decay, with state
      :class:`WeightDecayScheduleState` for a schedule (inside ``MaskedState`` with a
      ``mask``).

    >>> import jax.numpy as jnp
    >>> tx = decayed_weights_stage(lambda count: -0.5 * (count + 1))
    >>> params = [jnp.array([2.])]
    >>> _, state = tx.update([jnp.zeros(1)], tx.init(params), params)
    >>> tx.update([jnp.zeros(1)], state, params)[0]
    [Array([-2.], dtype=float32)]
    """
    check_bools("add_decayed_weights", cautious=cautious)
    if not callable(weight_decay):
        # A decay that is the number 0 adds nothing, as optax skips it: no read of the params
        # (which would also keep the compiler from fusing the update into a matmul's
        # epilogue), and a non-finite param does not turn 0 * p into NaN.
        zero = isinstance(weight_decay, (int, float)) and weight_decay == 0
        tx = _none_updates_pass(stage_transform(LeafStage(
            name="add_decayed_weights",
            update_leaf=(lambda g, s, p, c: (g, ())) if zero else
            (lambda g, s, p, c: (_decayed(g, p, weight_decay, cautious), ())), mask=mask,
            checks=LeafChecks(needs_params=True))), scheduled=False)
    else:
        def prepare(glob: dict, _: Any) -> tuple:
            return weight_decay(glob["count"]), {"count": safe_increment(glob["count"])}

        tx = _none_updates_pass(stage_transform(LeafStage(
            name="add_decayed_weights",
            update_leaf=lambda g, s, p, wd: (_decayed(g, p, wd, cautious), ()),
            state_cls=WeightDecayScheduleState,
            leaf_fields=(), init_leaf=lambda p: (), init_global=zero_count, prepare=prepare, mask=mask,
            checks=LeafChecks(needs_params=True))), scheduled=True)
    # optax's layout: a masked decay keeps its state in MaskedState (still one fused stage).
    return tx if mask is None else in_masked_state(tx, "add_decayed_weights")


def _none_updates_pass(tx: GradientTransformation, scheduled: bool) -> GradientTransformation:
    """``update(None, state, params)`` gives ``None`` updates (and counts the step), as optax.

    A guard of the stage's program, so ``chain`` still fuses the stage (a chain's updates
    are never None).
    """
    def none_updates(run: Any, updates: Updates, state: OptState, params: Optional[Params],
                     extra_args: dict) -> tuple[Updates, OptState]:
        if updates is not None:
            return run(updates, state, params, extra_args)
        if not scheduled:  # optax returns the (empty) state as given
            return None, state
        check_state_type(state, WeightDecayScheduleState, "add_decayed_weights")
        return None, WeightDecayScheduleState(count=safe_increment(state.count))

    return GradientTransformation(tx.init, with_guard(tx.update, none_updates))


@hyperparameters(weight_decay="schedule")
def weight_decay_stage(weight_decay: ScalarOrSchedule, mask: Optional[MaskOrFn] = None, *,
                       signed: bool = False, cautious: bool = False) -> GradientTransformation:
    """``updates + weight_decay * params`` where ``mask`` is True; the decay may be a schedule.

    A Python ``0`` needs no params (an ``identity``); a schedule is evaluated
    at the step count; ``signed=True`` allows negative values (Fromage).

    Args:
      weight_decay: the decay rate: a number, a scalar array, or a schedule of
        the step count. A Python ``0`` gives ``identity()``.
      mask: where to add the decay: ``None`` (default) for every leaf, a tree of
        Python bools shaped like the params or a prefix of it (a bool at a node
        covers its whole subtree), or a function of the params returning one.
        Leaves where it is False pass through unchanged and hold no state.
      signed: allow a negative ``weight_decay`` (:func:`decayed_weights_stage`);
        the default ``False`` checks it is ``>= 0`` (:func:`add_decayed_weights`).
      cautious: decay only where the update and the param agree in sign (Cautious
        Weight Decay, :func:`add_decayed_weights`).

    Returns:
      ``identity()`` for a Python zero decay, else the
      :func:`add_decayed_weights` / :func:`decayed_weights_stage` transformation.

    >>> import jax.numpy as jnp
    >>> tx = weight_decay_stage(lambda count: 0.5 * (count + 1))
    >>> params = [jnp.array([2.])]
    >>> state = tx.init(params)
    >>> u, state = tx.update([jnp.zeros(1)], state, params)
    >>> tx.update([jnp.zeros(1)], state, params)[0]
    [Array([2.], dtype=float32)]
    """
    check_bools("add_decayed_weights", cautious=cautious)
    if not callable(weight_decay) and isinstance(weight_decay, (int, float)) \
            and weight_decay == 0:
        return identity()
    if not signed:
        return add_decayed_weights(weight_decay, mask, cautious=cautious)
    return decayed_weights_stage(weight_decay, mask, cautious=cautious)


@hyperparameters(f_min="bound", max_learning_rate="bound", eps="number")
def scale_by_polyak(f_min: float = 0.0, max_learning_rate: float = 1.0, eps: float = 0.0,
                    variant: str = "sps") -> GradientTransformation:
    """Scale updates by the Polyak step ``min((f - f_min) / (||u||^2 + eps), max_lr)``.

    ``update`` needs the loss: ``update(updates, state, params, value=loss)``.
    ``variant='sps+'`` uses only the positive part of ``f - f_min``. The step
    is zero where ``||u||^2 + eps`` is at most float64's machine epsilon.

    The update is ``step * u`` with ``step = min((f - f_min) / (||u||^2 + eps),
    max_learning_rate)``, ``||u||`` the global norm of the whole update tree.
    Reference: Loizou et al., 2021, "Stochastic Polyak Step-size for SGD: An
    Adaptive Learning Rate for Fast Convergence".

    Args:
      f_min: a lower bound on (an estimate of) the loss's minimum value; default 0,
        exact for interpolating models.
      max_learning_rate: the largest step allowed (the bound of SPS_max).
      eps: added to ``||u||^2`` in the denominator, ``>= 0``.
      variant: ``'sps'`` (default) or ``'sps+'`` (uses ``max(f - f_min, 0)``, so
        the step is never negative). Other values raise ``ValueError``.

    Returns:
      A ``GradientTransformation`` that keeps no state (``ScaleByPolyakState``,
      i.e. ``EmptyState``); its ``update`` raises a ``TypeError`` (a
      ``MissingArgumentError``, a ``ValueError`` too) without ``value``.

    >>> import jax.numpy as jnp, functrain
    >>> tx = functrain.scale_by_polyak()
    >>> tx.update([jnp.array([2.])], tx.init([jnp.zeros(1)]), value=jnp.array(1.))[0]
    [Array([0.5], dtype=float32)]
    """
    if variant not in ("sps", "sps+"):
        raise ValueError(f"scale_by_polyak: variant must be 'sps' or 'sps+', got {variant!r}.")
    check_range("eps", eps, 0.0, owner="scale_by_polyak")

    def prepare(glob: dict, updates: Any, value: Any) -> tuple:
        if value is None:
            raise missing_argument_error("scale_by_polyak", "value")
        sq = ft.norm(updates, squared=True)
        gap = jnp.asarray(value - f_min).astype(sq.dtype)
        if variant == "sps+":
            gap = jnp.maximum(gap, 0.0)
        tiny = sq + eps <= np.finfo(float).eps
        step = jnp.where(tiny, 0.0, jnp.minimum(gap / (sq + eps), max_learning_rate))
        return step, glob

    return stage_transform(LeafStage(
        name="scale_by_polyak", update_leaf=lambda g, s, p, step: (step * g, ()),
        prepare=prepare, needs_updates=True, extra_args=("value",)))


def set_to_zero() -> GradientTransformation:
    """Replace every update by zeros (keeps no state).

    Useful to freeze parameters, e.g. with a partition or mask wrapper.

    Returns:
      A ``GradientTransformation`` that keeps no state (``SetToZeroState``, i.e.
      ``EmptyState``).

    >>> import jax.numpy as jnp, functrain
    >>> tx = functrain.set_to_zero()
    >>> tx.update([jnp.array([3.])], tx.init([jnp.zeros(1)]))[0]
    [Array([0.], dtype=float32)]
    """
    return stage_transform(LeafStage(name="set_to_zero",
                                     update_leaf=lambda g, s, p, c: (jnp.zeros_like(g), ()),
                                     checks=LeafChecks(any_dtype=True)))
