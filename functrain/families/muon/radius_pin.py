"""The optimizer track's norm control: radial brake, row floor, radius pin and post-pin decay.

modded-nanogpt's optimizer-track record #46 (SOAP-Muon, 2,690 steps) does not apply its
orthogonalized step ``u`` to a hidden matrix ``W`` as ``W - lr u``. It first shapes the step
against the weight, then holds the weight's norm to where the step's radial part alone would
have taken it:

1. **Radial brake.** ``u = t + c W`` with ``c = <u, W> / ||W||^2`` (``t`` tangential to the
   sphere through ``W``). The radial part is scaled by ``radial_outward_scale`` when the step
   grows the norm (``c < 0``: the step is ``-lr u``) and by ``radial_inward_scale`` otherwise.
2. **Update floor** (the "u/w floor"). If ``||u|| < target_uw ||W||`` the step is lifted to
   ``target_uw ||W||``. The row floor (``row_floor=True``, the record's RowUpdateFloor) does
   it per output row first: each row ``i`` (one output unit, its norm over the reduction
   axes) is scaled by ``max(1, target_uw ||W_i|| / ||u_i||)``, then the whole step is
   rescaled to the scalar floor's Frobenius norm, ``max(||u||, target_uw ||W||)``, so only
   the rows' shares change.
3. **Radius pin.** The target norm is the first-order effect of the radial part,
   ``r = ||W|| - lr <u, W> / ||W||``; after ``W' = W - lr u`` the weight is rescaled to
   ``r``: the tangential part's finite-step drift of the norm is removed.
4. **Post-pin cautious decay.** With ``cautious_weight_decay = wd > 0``, the pinned weight
   is multiplied by ``1 - lr wd`` where ``u W > 0`` (where the step already shrinks the
   coordinate; ``u`` after the floor), after the pin, so the decay changes the matrix's
   shape and the pin does not undo it.

Norms are Frobenius norms per matrix (the reduction and output axes of its dimension numbers;
other axes index a stack of matrices). What the params must be: nonzero matrices (a zero
matrix has no radius; its step is the floor's ``0`` and it stays zero, as in the record).
The record runs it with ``target_uw = 0.3825``, ``radial_outward_scale = 0.5``, the row floor
and ``cautious_weight_decay = 0.025``, at Muon's learning rate ``0.0375`` on steps that carry
Muon's shape scale. optax has none of this.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from functrain.arg_checks import check_bools, check_range
from functrain.declarations import hyperparameters
from functrain.families.muon.hyperball import matrix_step_stage
from functrain.engine.protocol import GradientTransformation, ScalarOrSchedule

Array = jax.Array

__all__ = ["ScaleByRadiusPinState", "scale_by_radius_pin", "radius_pin_step"]


class ScaleByRadiusPinState(NamedTuple):
    """State of :func:`scale_by_radius_pin` with a learning-rate schedule: the step count.

    Attributes:
      count: the number of steps taken (int32); the schedule is evaluated at it.

    >>> import jax.numpy as jnp
    >>> scale_by_radius_pin(lambda c: 0.02).init({'w': jnp.ones((2, 2))})
    ScaleByRadiusPinState(count=Array(0, dtype=int32))
    """

    count: Array


def radius_pin_step(p: Array, u: Array, learning_rate: Any, reduction_axes: tuple,
                    output_axes: tuple, target_uw: float = 0.3825, row_floor: bool = True,
                    radial_outward_scale: float = 0.5, radial_inward_scale: float = 1.0,
                    cautious_weight_decay: float = 0.0) -> Array:
    """The record's update of ``p`` for the step direction ``u`` (module docstring, 1-4).

    Args:
      p: the params (a matrix, or a stack of them).
      u: the direction, shaped like ``p`` (the step is ``-learning_rate * u`` before the
        norm control).
      learning_rate: the step size (a number or a traced scalar).
      reduction_axes: the matrix's reduction (input) axes: a row norm is taken over them.
      output_axes: the matrix's output axes.
      target_uw: the floor on ``||u|| / ||p||``, ``>= 0`` (``0``: no floor).
      row_floor: floor each output row first (the record's RowUpdateFloor).
      radial_outward_scale: the factor on a radial part that grows the norm.
      radial_inward_scale: the factor on a radial part that shrinks it.
      cautious_weight_decay: the post-pin decay rate (times ``learning_rate``).

    Returns:
      The update (the new params minus ``p``), in the dtype of the computation.

    >>> import jax.numpy as jnp
    >>> p = jnp.array([[3.0, 4.0]])
    >>> u = radius_pin_step(p, jnp.array([[0.0, 0.0]]), 0.1, (1,), (0,))
    >>> [round(float(x), 4) for x in (p + u)[0]]  # a zero direction: no step
    [3.0, 4.0]
    """
    dtype = jnp.result_type(p, u, jnp.float32)
    p, u = p.astype(dtype), u.astype(dtype)
    axes = tuple(sorted(reduction_axes + output_axes))

    def dot(x: Array, y: Array, over: tuple = axes) -> Array:
        return jnp.sum(x * y, axis=over, keepdims=True)

    p_sq = dot(p, p)
    coeff = dot(u, p) / jnp.maximum(p_sq, 1e-12)
    radial = coeff * p
    u = (u - radial) + jnp.where(coeff < 0, radial_outward_scale, radial_inward_scale) * radial
    p_norm = jnp.maximum(jnp.sqrt(p_sq), 1e-8)
    u_norm = jnp.maximum(jnp.sqrt(dot(u, u)), 1e-8)
    below = u_norm < target_uw * p_norm
    if row_floor:
        row_p = jnp.maximum(jnp.sqrt(dot(p, p, reduction_axes)), 1e-8)
        row_u = jnp.maximum(jnp.sqrt(dot(u, u, reduction_axes)), 1e-8)
        lifted = u * jnp.maximum(1.0, target_uw * row_p / row_u)
        size = jnp.where(below, target_uw * p_norm, u_norm)
        u = lifted * (size / jnp.maximum(jnp.sqrt(dot(lifted, lifted)), 1e-8))
    else:
        u = u * jnp.where(below, target_uw * p_norm / u_norm, 1.0)
    radius = jnp.maximum(p_norm - learning_rate * dot(u, p) / p_norm, 1e-8)
    moved = p - learning_rate * u
    pinned = moved * (radius / jnp.maximum(jnp.sqrt(dot(moved, moved)), 1e-8))
    if cautious_weight_decay:
        pinned = pinned * (1 - learning_rate * cautious_weight_decay
                           * (u * p > 0).astype(dtype))
    return pinned - p


@hyperparameters(learning_rate="schedule", target_uw="number",
                 radial_outward_scale="number", radial_inward_scale="number",
                 cautious_weight_decay="number")
def scale_by_radius_pin(learning_rate: ScalarOrSchedule, target_uw: float = 0.3825,
                        row_floor: bool = True, radial_outward_scale: float = 0.5,
                        radial_inward_scale: float = 1.0, cautious_weight_decay: float = 0.0,
                        weight_dimension_numbers: Any = None) -> GradientTransformation:
    """The optimizer track's norm control as the last stage of a matrix optimizer's chain.

    The update of each matrix ``W`` with incoming direction ``u`` is
    :func:`radius_pin_step`: radial brake, update floor (per row, then overall), a step of
    ``learning_rate`` pinned to the radius its radial part sets, then the post-pin cautious
    decay (module docstring). It replaces ``scale_by_learning_rate`` at the end of a chain
    (``u`` is the descent direction, e.g. Muon's or SOAP-Muon's scaled orthogonalized
    momentum); ``update`` needs the params. The defaults are record #46's, but for the decay
    (``0``; the record's is ``0.025``). Reference: modded-nanogpt's optimizer track, records
    #9 (the u/w floor), #29 (radial brake and radius pin) and #46 (row floor, post-pin CWD).

    Args:
      learning_rate: the step size, a number or a schedule of the step count.
      target_uw: the floor on ``||u|| / ||W||`` per matrix, ``>= 0``.
      row_floor: lift each output row to ``target_uw`` of its weight row first (then
        rescale to the overall floor's norm); ``False``: the scalar floor only.
      radial_outward_scale: the factor on a radial part that grows ``||W||``, ``>= 0``.
      radial_inward_scale: the factor on a radial part that shrinks it, ``>= 0``.
      cautious_weight_decay: the post-pin decay rate, ``>= 0`` (``0``: none).
      weight_dimension_numbers: which axes form each matrix, as Muon's
        (:class:`~functrain.contrib.MuonDimensionNumbers`: one for all leaves, a tree of
        them, or a function of the params); ``None``: ``MuonDimensionNumbers()``.

    Returns:
      A ``GradientTransformation``: stateless (``EmptyState``) for a fixed rate,
      :class:`ScaleByRadiusPinState` for a schedule.

    >>> import jax.numpy as jnp
    >>> tx = scale_by_radius_pin(0.1, target_uw=0.0, radial_outward_scale=1.0)
    >>> params = {'w': jnp.array([[3.0], [4.0]])}
    >>> u, _ = tx.update({'w': jnp.array([[1.0], [0.0]])}, tx.init(params), params)
    >>> round(float(jnp.linalg.norm(params['w'] + u['w'])), 5)  # 5 - 0.1 * <u, W> / 5
    4.94
    """
    owner = "scale_by_radius_pin"
    check_range("target_uw", target_uw, 0.0, owner=owner)
    check_range("radial_outward_scale", radial_outward_scale, 0.0, owner=owner)
    check_range("radial_inward_scale", radial_inward_scale, 0.0, owner=owner)
    check_range("cautious_weight_decay", cautious_weight_decay, 0.0, owner=owner)
    check_bools(owner, row_floor=row_floor)

    def step(p: Array, u: Array, lr: Any, red: tuple, out: tuple) -> Array:
        if jnp.iscomplexobj(u) or jnp.iscomplexobj(p):
            raise TypeError(f"{owner}: a leaf of shape {u.shape} is complex; the radial "
                            f"brake and the cautious mask are defined for real weights: "
                            f"wrap the optimizer in split_real_and_imaginary.")
        return radius_pin_step(p, u, lr, red, out, target_uw, row_floor, radial_outward_scale,
                               radial_inward_scale, cautious_weight_decay)

    return matrix_step_stage(owner, learning_rate, weight_dimension_numbers,
                             ScaleByRadiusPinState, step)
