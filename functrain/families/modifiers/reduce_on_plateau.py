"""Reduce the learning rate on a plateau: ``reduce_on_plateau``, optax.contrib's callback.

It watches a loss (or metric) passed to ``update`` as ``value=``: averaged over
``accumulation_size`` calls, it must improve on the best average so far by the
tolerances ``rtol``/``atol``; after ``patience`` averages without improvement the
scale falls by ``factor`` (not below ``min_scale``), then ``cooldown`` averages
pass before counting starts again. The updates are multiplied by the scale.

The bookkeeping is scalar, so it runs in the stage's ``prepare`` once per step;
the per-array math (``scale * g``) is a :class:`~functrain.engine.stage.LeafStage`
on functrain's engine, fused with the stages around it in a ``chain``. Names,
arguments, state and numbers are optax 0.2.8's.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp

from functrain.arg_checks import MissingArgumentError, check_range
from functrain.declarations import declare_optimizer, hyperparameters
from functrain import tree as ft
from functrain.engine.protocol import GradientTransformationExtraArgs, OptState, Params
from functrain.engine.stage import LeafStage
from functrain.engine.counts import safe_increment
from functrain.engine.program import stage_transform, with_guard
from functrain.engine.dtypes import params_float_dtype

Array = jax.Array

__all__ = ["ReduceLROnPlateauState", "reduce_on_plateau"]


class ReduceLROnPlateauState(NamedTuple):
    """State of :func:`reduce_on_plateau` (optax's fields, in optax's order).

    Attributes:
      scale: the factor the updates are multiplied by (starts at 1; the
        parameters' lowest float dtype).
      best_value: the best averaged value so far (starts at ``inf``).
      plateau_count: averages in a row without improvement (int32).
      cooldown_count: averages left in the cooldown after a reduction (int32).
      count: values accumulated into the current average (int32).
      avg_value: the running average of the current accumulation.

    >>> import jax.numpy as jnp, functrain
    >>> functrain.contrib.reduce_on_plateau().init({'w': jnp.ones(2)}).scale
    Array(1., dtype=float32)
    """

    scale: Array
    best_value: Array
    plateau_count: Array
    cooldown_count: Array
    count: Array
    avg_value: Array


_GLOBALS = ReduceLROnPlateauState._fields


@declare_optimizer("contrib", "PyTorch's ReduceLROnPlateau", optax="contrib", stressed=True,
    summary="Scales updates down when the `value=` passed to `update` stops improving.",
    signature="reduce_on_plateau(factor=0.1, patience=10, ...)")
@hyperparameters(factor="number", patience="number", rtol="number", atol="number",
                 cooldown="number", accumulation_size="number", min_scale="number")
def reduce_on_plateau(factor: float = 0.1, patience: int = 10, rtol: float = 1e-4,
                      atol: float = 0.0, cooldown: int = 0, accumulation_size: int = 1,
                      min_scale: float = 0.0) -> GradientTransformationExtraArgs:
    """Scale the updates down by ``factor`` when the loss stops improving.

    Call ``update(updates, state, params, value=loss)``. With ``v`` the average
    of the last ``accumulation_size`` values: ``v`` improves if ``v < (1 -
    rtol) * best - atol`` (then ``best = v``); after ``patience`` averages in a
    row without improvement, ``scale = max(scale * factor, min_scale)`` and the
    next ``cooldown`` averages are not counted. The update is ``scale * g``.
    Chain it after an optimizer to reduce that optimizer's learning rate.
    Reference: the ReduceLROnPlateau callback of Keras and PyTorch (2015-2017),
    as in optax.contrib.

    Args:
      factor: the factor the scale is multiplied by at a plateau, in ``(0, 1)``.
      patience: averages without improvement before the scale is reduced.
      rtol: the relative improvement required, in ``[0, 1]``.
      atol: the absolute improvement required, ``>= 0`` (``rtol`` and ``atol``
        may not both be 0).
      cooldown: averages to skip after a reduction before counting again.
      accumulation_size: how many values are averaged before each decision (1
        for a validation loss; more for noisy minibatch losses).
      min_scale: the scale never falls below this.

    Returns:
      A ``GradientTransformationExtraArgs`` whose state is
      :class:`ReduceLROnPlateauState`; ``update`` raises ``ValueError``
      without ``value``.

    >>> import jax.numpy as jnp, functrain
    >>> tx = functrain.contrib.reduce_on_plateau(factor=0.5, patience=1)
    >>> params = {'w': jnp.ones(1)}
    >>> state = tx.init(params)
    >>> for loss in [1.0, 1.0]:   # no improvement at the second: halved
    ...     updates, state = tx.update({'w': jnp.ones(1)}, state, params, value=loss)
    >>> updates
    {'w': Array([0.5], dtype=float32)}
    """
    owner = "reduce_on_plateau"
    check_range("factor", factor, 0.0, 1.0, owner=owner)
    if not isinstance(factor, jax.core.Tracer) and factor == 0.0:
        raise ValueError(f"{owner}: factor must be in (0, 1), got {factor}.")
    check_range("rtol", rtol, 0.0, 1.0, high_inclusive=True, owner=owner)
    check_range("atol", atol, 0.0, owner=owner)
    if (not isinstance(rtol, jax.core.Tracer) and not isinstance(atol, jax.core.Tracer)
            and rtol == 0.0 and atol == 0.0):
        raise ValueError(f"{owner}: at least one of rtol and atol must be positive, got "
                         f"rtol = {rtol} and atol = {atol}.")
    for name, value in (("patience", patience), ("cooldown", cooldown),
                        ("min_scale", min_scale)):
        check_range(name, value, 0.0, owner=owner)
    check_range("accumulation_size", accumulation_size, 1.0, owner=owner)

    def decide(s: dict) -> dict:
        """One decision on the finished average ``s['avg_value']`` (optax's rules)."""
        improved = s["avg_value"] < (1 - rtol) * s["best_value"] - atol
        best = jnp.where(improved, s["avg_value"].astype(s["best_value"].dtype),
                         s["best_value"])
        plateau = jnp.where(improved, 0, safe_increment(s["plateau_count"]))
        at_patience = plateau == patience
        cooling = s["cooldown_count"] > 0
        reduced = jnp.maximum(jnp.where(at_patience, s["scale"] * factor, s["scale"]),
                              min_scale).astype(s["scale"].dtype)
        zero = jnp.zeros([], jnp.int32)
        return dict(
            scale=jnp.where(cooling, s["scale"], reduced),
            best_value=best,
            plateau_count=jnp.where(cooling | at_patience, zero, plateau).astype(jnp.int32),
            cooldown_count=jnp.where(
                cooling, s["cooldown_count"] - 1,
                jnp.where(at_patience, cooldown, 0)).astype(jnp.int32),
            count=zero,
            avg_value=jnp.zeros_like(s["avg_value"]))

    def prepare(glob: dict, updates: Any, value: Any) -> tuple:
        if value is None:
            raise MissingArgumentError(f"{owner} needs the loss value: call update(updates, state, "
                                       f"params, value=loss).")
        count = safe_increment(glob["count"])
        avg_dtype = glob["avg_value"].dtype
        avg = ((glob["count"] * glob["avg_value"] + jnp.asarray(value).astype(avg_dtype))
               / count).astype(avg_dtype)
        s = dict(glob, count=count, avg_value=avg)
        decided = decide(s)
        done = count == accumulation_size
        new = {k: jnp.where(done, decided[k], s[k]).astype(s[k].dtype) for k in _GLOBALS}
        return new["scale"], new

    def leaf(g: Array, s: Any, p: Any, scale: Array) -> tuple:
        return scale.astype(g.dtype) * g, ()

    stage = LeafStage(name=owner, update_leaf=leaf, state_cls=ReduceLROnPlateauState,
                      init_global=lambda: _initial(None), prepare=prepare,
                      extra_args=("value",))
    tx = stage_transform(stage)

    def init_fn(params: Params) -> OptState:
        tx.init(params)  # checks the leaves' dtypes, naming a bad one
        return ReduceLROnPlateauState(**_initial(params))

    def optax_state(run: Any, updates: Any, state: OptState, params: Optional[Params],
                    extra_args: dict) -> tuple[Any, OptState]:
        if getattr(state, "_fields", None) == _GLOBALS:  # ours, or optax's (the same fields)
            state = ReduceLROnPlateauState(*state)
        return run(updates, state, params, extra_args)

    # A guard of the stage's program, so a chain still fuses this stage.
    return GradientTransformationExtraArgs(init_fn, with_guard(tx.update, optax_state))


def _initial(params: Optional[Params]) -> dict:
    """The initial fields: scale in the params' lowest dtype, values in their highest."""
    lowest = params_float_dtype(params, "lowest") if params is not None else jnp.float32
    highest = params_float_dtype(params, "highest") if params is not None else jnp.float32
    if not jax.tree_util.tree_leaves(params):
        lowest = highest = jnp.float32
    return dict(scale=jnp.ones([], lowest), best_value=jnp.full([], jnp.inf, highest),
                plateau_count=jnp.zeros([], jnp.int32),
                cooldown_count=jnp.zeros([], jnp.int32), count=jnp.zeros([], jnp.int32),
                avg_value=jnp.zeros([], highest))
