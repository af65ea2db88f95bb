"""Clipping: by value, by each leaf's RMS, by the global norm, unit-wise, per example.

``clip``, ``clip_by_block_rms`` and ``adaptive_grad_clip`` are per-leaf stages;
``clip_by_global_norm`` needs the norm of the whole tree, which its ``prepare``
computes once per step before the leaf pass (so it starts a new fused block).
``unitwise_norm`` / ``unitwise_clip`` are the per-array formulas of adaptive
clipping, and ``per_example_global_norm_clip`` / ``per_example_layer_norm_clip``
are functions (not transformations) on per-example gradients, as in optax.
"""

from __future__ import annotations

from typing import Any, Optional, Union

import jax
import jax.numpy as jnp

from functrain.arg_checks import check_range
from functrain.declarations import hyperparameters
from functrain import tree as ft
from functrain.numerics import abs_sq
from functrain.engine.protocol import EmptyState, GradientTransformation
from functrain.engine.stage import LeafChecks, LeafStage
from functrain.engine.program import stage_transform

Array = jax.Array

ClipState = EmptyState
ClipByGlobalNormState = EmptyState


def clip(max_delta: Any) -> GradientTransformation:
    """Clip every update entry to ``[-max_delta, max_delta]``.

    The update is ``clip(g, -max_delta, max_delta)``, entry by entry.

    Args:
      max_delta: the largest absolute value an entry may keep, ``>= 0``; a number
        or a scalar array.

    Returns:
      A ``GradientTransformation`` that keeps no state (``ClipState``, i.e.
      ``EmptyState``).

    >>> import jax.numpy as jnp
    >>> tx = clip(1.0)
    >>> tx.update([jnp.array([-3., 0.5])], tx.init([jnp.zeros(2)]))[0]
    [Array([-1. ,  0.5], dtype=float32)]
    """
    check_range("max_delta", max_delta, 0.0, owner="clip")
    return stage_transform(LeafStage(
        name="clip", update_leaf=lambda g, s, p, c: (jnp.clip(g, -max_delta, max_delta), ()),
        checks=LeafChecks(real_only=True)))


def clip_by_global_norm(max_norm: Any) -> GradientTransformation:
    """Rescale all updates together so their global L2 norm is at most ``max_norm``.

    Zero updates stay zero even with ``max_norm=0`` (no NaN).

    With ``n = ||g||`` the L2 norm of all leaves together, the update is ``g``
    if ``n < max_norm``, else ``g * max_norm / n``. Reference: Pascanu et al.,
    2013, "On the difficulty of training Recurrent Neural Networks".

    Args:
      max_norm: the largest global norm the updates may have, ``>= 0``; a number
        or a scalar array.

    Returns:
      A ``GradientTransformation`` that keeps no state (``ClipByGlobalNormState``,
      i.e. ``EmptyState``).

    >>> import jax.numpy as jnp
    >>> tx = clip_by_global_norm(1.0)
    >>> tx.update({'a': jnp.array([3.]), 'b': jnp.array([4.])}, tx.init({}))[0]
    {'a': Array([0.6], dtype=float32), 'b': Array([0.8], dtype=float32)}
    """
    check_range("max_norm", max_norm, 0.0, owner="clip_by_global_norm")

    def prepare(glob: dict, updates: Any) -> tuple:
        g_norm = ft.norm(updates)
        keep = g_norm < max_norm
        return (keep, jnp.where(g_norm == 0, 1.0, g_norm)), glob

    def leaf(g: Array, s: tuple, p: Any, ctx: tuple) -> tuple:
        keep, g_norm = ctx
        return jnp.where(keep, g, (g / g_norm.astype(g.dtype)) * max_norm), ()

    return stage_transform(LeafStage(name="clip_by_global_norm", update_leaf=leaf, prepare=prepare,
                                     needs_updates=True))


ClipByBlockRmsState = EmptyState


@hyperparameters(threshold="bound")
def clip_by_block_rms(threshold: float) -> GradientTransformation:
    """Scale each leaf down so its RMS is at most ``threshold``.

    Per leaf: ``g / max(1, rms(g) / threshold)`` with ``rms(g) = sqrt(mean(g**2))``
    (Adafactor's update clipping, Shazeer & Stern, 2018).

    Args:
      threshold: the largest RMS a leaf's update may have, ``> 0`` in practice
        (0 would divide by zero).

    Returns:
      A ``GradientTransformation`` that keeps no state (``ClipByBlockRmsState``,
      i.e. ``EmptyState``).

    >>> import jax.numpy as jnp, functrain
    >>> tx = functrain.clip_by_block_rms(1.0)
    >>> tx.update([jnp.array([3., -3.])], tx.init([jnp.zeros(2)]))[0]
    [Array([ 1., -1.], dtype=float32)]
    """
    check_range("threshold", threshold, 0.0, owner="clip_by_block_rms")

    def leaf(g: Array, s: tuple, p: Any, c: Any) -> tuple:
        return g / jnp.maximum(1.0, jnp.sqrt(jnp.mean(abs_sq(g))) / threshold), ()

    return stage_transform(LeafStage(name="clip_by_block_rms", update_leaf=leaf))


# --------------------------------------------------------------------------
# Unit-wise (adaptive) clipping
# --------------------------------------------------------------------------

AdaptiveGradClipState = EmptyState

Axis = Optional[Union[int, tuple[int, ...]]]


def _default_unit_axes(shape: tuple) -> Optional[tuple[int, ...]]:
    """The axes a unit's norm sums over by default; ``None`` for ranks with no default."""
    if sum(d != 1 for d in shape) <= 1:  # scalars and vectors (after squeezing): all of it
        return tuple(range(len(shape)))
    if len(shape) in (2, 3):  # linear (in, out) and multi-head linear kernels
        return (0,)
    if len(shape) == 4:  # convolution kernels (H, W, in, out)
        return (0, 1, 2)
    if len(shape) == 5:  # 3-d convolution kernels (D, H, W, in, out)
        return (0, 1, 2, 3)
    return None


def unitwise_norm(x: Any, axis: Axis = None) -> Array:
    """The L2 norm of each unit of ``x``, broadcast back to ``x``'s shape.

    A unit is a slice of ``x`` summed over ``axis``. By default (``axis=None``),
    as optax: all of a scalar or a vector (after squeezing out size-1
    dimensions); axis 0 of a rank-2 or rank-3 array (a linear kernel's inputs);
    axes ``(0, 1, 2)`` of a rank-4 one (convolution kernels, HWIO) and
    ``(0, 1, 2, 3)`` of a rank-5 one (3-d convolutions). Complex entries count
    ``|x|``. Reference: Brock et al., 2021, "High-Performance Large-Scale Image
    Recognition Without Normalization".

    Args:
      x: an array.
      axis: the axis or axes to sum over; ``None`` for the defaults above.

    Returns:
      A real array shaped like ``x``: each entry the norm of its unit.

    Raises:
      ValueError: ``axis`` is ``None`` and ``x`` has rank 6 or more (no default).

    >>> import jax.numpy as jnp, functrain
    >>> functrain.unitwise_norm(jnp.array([[3., 1.], [4., 0.]]))
    Array([[5., 1.],
           [5., 1.]], dtype=float32)
    """
    x = jnp.asarray(x)
    if axis is None:
        axis = _default_unit_axes(x.shape)
        if axis is None:
            raise ValueError(f"unitwise_norm: no default unit axes for an array of shape "
                             f"{x.shape} (rank {x.ndim}); pass axis= to say which axes a "
                             f"unit's norm sums over.")
    squared = jnp.sum(abs_sq(x), axis=axis, keepdims=True)
    return jnp.broadcast_to(jnp.sqrt(squared), x.shape)


def unitwise_clip(g_norm: Any, max_norm: Any, grad: Any, div_eps: float = 1e-6) -> Array:
    """``grad`` where ``g_norm < max_norm``, else ``grad`` rescaled to norm ``max_norm``.

    Entry by entry: ``grad`` if ``g_norm < max_norm``, else
    ``grad * max_norm / max(g_norm, div_eps)``. Reference: Brock et al., 2021,
    "High-Performance Large-Scale Image Recognition Without Normalization".

    Args:
      g_norm: the unit-wise norms of ``grad`` (from :func:`unitwise_norm`),
        shaped like ``grad``.
      max_norm: the largest norm each unit may keep, shaped like ``grad``.
      grad: the array to clip.
      div_eps: the smallest ``g_norm`` divided by (avoids dividing by 0).

    Returns:
      The clipped array, shaped like ``grad``.

    Raises:
      ValueError: naming the argument whose shape differs from ``grad``'s.

    >>> import jax.numpy as jnp, functrain
    >>> g = jnp.array([3., 4.])
    >>> functrain.unitwise_clip(jnp.full(2, 5.), jnp.full(2, 1.), g)
    Array([0.6, 0.8], dtype=float32)
    """
    for name, value in (("g_norm", g_norm), ("max_norm", max_norm)):
        if jnp.shape(value) != jnp.shape(grad):
            raise ValueError(f"unitwise_clip: {name} has shape {jnp.shape(value)} but grad "
                             f"has shape {jnp.shape(grad)}; they must be equal.")
    clipped = grad * (max_norm / jnp.maximum(g_norm, div_eps))
    return jnp.where(g_norm < max_norm, grad, clipped)


@hyperparameters(clipping="number", eps="number")
def adaptive_grad_clip(clipping: float, eps: float = 1e-3, axis: Axis = None
                       ) -> GradientTransformation:
    """Clip each unit of the updates to at most ``clipping`` times its parameters' norm.

    Unit-wise (see :func:`unitwise_norm`): with ``n_g`` the norm of a unit of
    ``g`` and ``n_p`` that of the same unit of the parameters, the update is
    ``g`` where ``n_g < clipping * max(n_p, eps)``, else
    ``g * clipping * max(n_p, eps) / n_g``. Adaptive gradient clipping (AGC) of
    Brock et al., 2021, "High-Performance Large-Scale Image Recognition Without
    Normalization".

    Args:
      clipping: the largest allowed ratio of a unit's update norm to its
        parameters' norm, ``>= 0``.
      eps: the smallest parameter norm used, ``>= 0``, so zero-initialised
        parameters can still move.
      axis: the axis or axes a unit's norm sums over; ``None`` uses
        :func:`unitwise_norm`'s defaults (which exist up to rank 5).

    Returns:
      A ``GradientTransformation`` that keeps no state (``AdaptiveGradClipState``,
      i.e. ``EmptyState``); its ``update`` needs the params. A leaf of rank 6 or
      more with ``axis=None`` raises a ``ValueError`` naming its key path.

    >>> import jax.numpy as jnp, functrain
    >>> tx = functrain.adaptive_grad_clip(0.5)
    >>> params = {'w': jnp.array([3., 4.])}
    >>> tx.update({'w': jnp.array([30., 40.])}, tx.init(params), params)[0]
    {'w': Array([1.5, 2. ], dtype=float32)}
    """
    check_range("clipping", clipping, 0.0, owner="adaptive_grad_clip")
    check_range("eps", eps, 0.0, owner="adaptive_grad_clip")

    def prepare(glob: dict, updates: Any) -> tuple:
        if axis is None:
            paths, leaves, _ = ft.flatten_with_paths(updates)
            for path, x in zip(paths, leaves):
                if not ft.is_placeholder(x) and _default_unit_axes(jnp.shape(x)) is None:
                    raise ValueError(
                        f"adaptive_grad_clip: updates leaf {path} has shape {jnp.shape(x)}: "
                        f"no default unit axes for rank {len(jnp.shape(x))}; pass axis= "
                        f"to say which axes a unit's norm sums over.")
        return None, glob

    def leaf(g: Array, s: tuple, p: Array, c: Any) -> tuple:
        max_norm = clipping * jnp.maximum(unitwise_norm(p, axis), eps)
        return unitwise_clip(unitwise_norm(g, axis), max_norm, g), ()

    return stage_transform(LeafStage(name="adaptive_grad_clip", update_leaf=leaf,
                                     prepare=prepare,
                                     needs_updates=axis is None,
                                     checks=LeafChecks(needs_params=True)))


# --------------------------------------------------------------------------
# Per-example clipping (functions on per-example gradients)
# --------------------------------------------------------------------------

def _check_batch_axis(grads: Any, owner: str) -> tuple[list[str], list[Array], Any]:
    """Raise ``ValueError`` naming the leaf unless every leaf has the same axis-0 size."""
    paths, leaves, treedef = ft.flatten_with_paths(grads)
    leaves = [jnp.asarray(x) for x in leaves]
    if not leaves:
        raise ValueError(f"{owner}: grads has no leaves; it expects per-example gradients "
                         f"with the batch on axis 0.")
    batch = leaves[0].shape[0] if leaves[0].ndim else None
    for path, x in zip(paths, leaves):
        if x.ndim == 0 or x.shape[0] != batch:
            raise ValueError(
                f"{owner}: expects every leaf of grads to have the batch on axis 0 (of "
                f"size {batch}, from leaf {paths[0]}), but leaf {path} has shape {x.shape}.")
    return paths, leaves, treedef


def _clip_and_sum(leaves: list[Array], clip_norm: Any) -> tuple[list[Array], Array]:
    """Each example's gradient rescaled to global norm at most ``clip_norm``, summed."""
    norms = jax.vmap(ft.norm)(leaves)
    factors = jnp.nan_to_num(jnp.minimum(clip_norm / norms, 1.0), nan=1.0)
    return ([jnp.tensordot(factors, x, axes=1) for x in leaves],
            jnp.sum(factors < 1.0).astype(jnp.int32))


def per_example_global_norm_clip(grads: Any, l2_norm_clip: Any) -> tuple[Any, Array]:
    """Clip each example's gradient to global norm ``l2_norm_clip``, then sum over the batch.

    ``grads`` holds per-example gradients: every leaf has the batch on axis 0.
    With ``n_i`` the global L2 norm of example ``i`` (over all leaves), the
    result is ``sum_i g_i * min(1, l2_norm_clip / n_i)`` (factor 1 where that
    is ``0/0`` or ``inf/inf``), the aggregation of DP-SGD. Reference: Abadi et
    al., 2016, "Deep Learning with Differential Privacy".

    Args:
      grads: a tree of per-example gradients, batch on axis 0 of every leaf.
      l2_norm_clip: the largest global norm each example keeps, ``>= 0`` (may
        be ``inf``).

    Returns:
      ``(summed, num_clipped)``: a tree like one example's gradients holding
      the sum of the clipped examples, and the int32 number of examples that
      were scaled down.

    Raises:
      ValueError: naming the leaf that lacks the batch axis (or whose axis-0
        size differs from the first leaf's).

    >>> import jax.numpy as jnp, functrain
    >>> grads = [jnp.array([[0., 0.], [3., 4.], [6., 8.]])]
    >>> functrain.per_example_global_norm_clip(grads, 5.0)
    ([Array([6., 8.], dtype=float32)], Array(1, dtype=int32))
    """
    check_range("l2_norm_clip", l2_norm_clip, 0.0, owner="per_example_global_norm_clip")
    _, leaves, treedef = _check_batch_axis(grads, "per_example_global_norm_clip")
    summed, num_clipped = _clip_and_sum(leaves, l2_norm_clip)
    return treedef.unflatten(summed), num_clipped


def per_example_layer_norm_clip(grads: Any, global_l2_norm_clip: Any, uniform: bool = True
                                ) -> tuple[Any, Any]:
    """Clip each example's gradient leaf by leaf (per layer), then sum over the batch.

    Each of the ``K`` leaves is clipped on its own (as
    :func:`per_example_global_norm_clip` on that leaf alone) to ``C_k``: with
    ``C = global_l2_norm_clip``, ``C_k = C / sqrt(K)`` if ``uniform``, else
    ``C * sqrt(D_k / D)`` with ``D_k`` the size of one example of leaf ``k`` and
    ``D`` their total; so the clipped examples' global norm stays at most ``C``.
    Reference: McMahan et al., 2017, "Learning Differentially Private Recurrent
    Language Models".

    Args:
      grads: a tree of per-example gradients, batch on axis 0 of every leaf.
      global_l2_norm_clip: the overall clip norm ``C``, ``>= 0``.
      uniform: split ``C`` equally between the leaves (default), or in
        proportion to the square root of their sizes.

    Returns:
      ``(summed, num_clipped)``: trees like one example's gradients: the sum of
      each leaf's clipped examples, and per leaf the int32 number of examples
      scaled down.

    Raises:
      ValueError: naming the leaf that lacks the batch axis.

    >>> import jax.numpy as jnp, functrain
    >>> grads = {'a': jnp.array([[3., 4.], [0., 1.]]), 'b': jnp.array([[2.], [1.]])}
    >>> summed, clipped = functrain.per_example_layer_norm_clip(grads, 2 ** 0.5)
    >>> summed['a'], clipped['a'], clipped['b']
    (Array([0.6, 1.8], dtype=float32), Array(1, dtype=int32), Array(1, dtype=int32))
    """
    check_range("global_l2_norm_clip", global_l2_norm_clip, 0.0,
                owner="per_example_layer_norm_clip")
    _, leaves, treedef = _check_batch_axis(grads, "per_example_layer_norm_clip")
    sizes = [x[0].size for x in leaves]
    summed, counts = [], []
    for x, size in zip(leaves, sizes):
        share = 1.0 / len(leaves) if uniform else size / sum(sizes)
        (total,), count = _clip_and_sum([x], global_l2_norm_clip * share ** 0.5)
        summed.append(total)
        counts.append(count)
    return treedef.unflatten(summed), treedef.unflatten(counts)
