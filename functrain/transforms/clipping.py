"""Clipping: by value, by each leaf's RMS, and by the global norm of all updates.

``clip`` and ``clip_by_block_rms`` are per-leaf stages; ``clip_by_global_norm``
needs the norm of the whole tree, which its ``prepare`` computes once per step
before the leaf pass (so it starts a new fused block).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from functrain import tree as ft
from functrain.numerics import abs_sq
from functrain.transforms.base import (EmptyState, GradientTransformation, LeafStage, check_range,
                                       validate_hyperparams)
from functrain.transforms.engine import stage_transform

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
        real_only=True))


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


@validate_hyperparams
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
